"""`ncclprobe run`'s /proc watch (commands/watch.py, witnesses/procwatch.py) on real process trees:
every process of CMD's tree, Python or not, is in the log directory with its ppid and watched exec
environment; nothing outside the watched set is written; short-lived processes are seen or counted;
the watch ends with CMD on every path run handles.

The leaves wait on run's stdin (saved on fd 3 by the shell, which gives background jobs /dev/null):
the test releases them by closing it once the watch has recorded them. Synchronisation is on the
lines CMD prints and on the log directory, never on sleeps."""
from __future__ import annotations

import json
import os
import secrets
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rundirs import run_meta

from ncclprobe.witnesses import events
from ncclprobe import model

NCCLPROBE = [sys.executable, "-m", "ncclprobe"]
WAIT_S = 60  # generous: a loaded 2-core machine is slow; nothing waits for it to pass
# prints its pid and parent's, then holds until stdin ends
LEAF = "import os, sys; os.write(1, b'leaf %d %d\\n' % (os.getpid(), os.getppid())); sys.stdin.read()"


def records(d: Path) -> list[dict]:
    """Every event of the log directory, as the reader checks them."""
    return list(events.read_dirs([d]).events)


def seen(d: Path) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for e in records(d):
        if e["ev"] == "proc_seen":
            out.setdefault(e["pid"], []).append(e)
    return out


def summary(d: Path) -> dict | None:
    return next((e for e in records(d) if e["ev"] == "watch_summary"), None)


def wait_until(what, why):
    """what()'s first true value, polled until WAIT_S; why: the failure's message, or a function giving it."""
    deadline = time.monotonic() + WAIT_S
    while True:
        got = what()
        if got:
            return got
        assert time.monotonic() < deadline, why() if callable(why) else why
        time.sleep(0.02)  # polling a condition, not waiting for something to happen


class Run:
    """`ncclprobe run --dir DIR -- CMD` with a pipe on stdin; CMD's lines read as they come."""

    def __init__(self, tmp_path: Path, cmd: list[str], env: dict[str, str] | None = None, name: str = "logs",
                 opts: tuple[str, ...] = ()):
        self.dir = tmp_path / name
        self.proc = subprocess.Popen([*NCCLPROBE, "run", *opts, "--dir", str(self.dir), "--", *cmd], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cv:
                self.lines.append(line)
                self._cv.notify_all()

    def leaves(self, n: int) -> dict[int, int]:
        """pid -> ppid of the first n leaves, once they all printed."""
        with self._cv:
            ok = self._cv.wait_for(lambda: sum(line.startswith("leaf ") for line in self.lines) >= n, WAIT_S)
        assert ok, f"the leaves did not start: {self.lines}"
        return {int(w[1]): int(w[2]) for w in (line.split() for line in self.lines if line.startswith("leaf "))}

    def release(self) -> tuple[int, str]:
        self.proc.stdin.close()
        rc = self.proc.wait(timeout=WAIT_S)
        return rc, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def runs():
    started: list[Run] = []
    yield started
    for r in started:  # a failed test leaves no tree behind: run's keeper ends it when run is killed
        r.kill()


@pytest.mark.parametrize("reader", ["native", "python"])
def test_a_tree_through_a_shell_and_env_i_is_recorded_and_no_secret_is_written(tmp_path, runs, reader):
    secret, plain = "s3cr3t-" + secrets.token_hex(8), "unwatched-" + secrets.token_hex(8)
    env = {**os.environ, "NCCL_PROTO": "LL", "MY_API_TOKEN": secret, "PLAIN_VALUE": plain}
    if reader == "python":
        env["NCCLPROBE_NATIVE_PROC"] = "0"
    py = sys.executable
    script = (f"exec 3<&0; {py} -c \"$LEAF\" <&3 & "
              f"env -i NCCL_ALGO=Tree OTHER_SECRET={secret} {py} -S -c \"$LEAF\" <&3 & wait")
    env["LEAF"] = LEAF
    run = Run(tmp_path, ["sh", "-c", script], env)
    runs.append(run)
    leaves = run.leaves(2)
    # each leaf as what it exec'ed in the end (a first look may catch sh's fork child, or env before its exec)
    wait_until(lambda: (s := seen(run.dir)) and all(p in s and s[p][-1]["argv"][0] == py for p in leaves),
               "the watch never recorded the leaves")
    rc, err = run.release()
    assert rc == 0, err
    shell = {ppid for ppid in leaves.values()}
    assert len(shell) == 1
    sh = shell.pop()
    got = seen(run.dir)
    assert got[sh][0]["argv"][:2] == ["sh", "-c"] and got[sh][0]["ppid"] == run.proc.pid
    assert got[sh][0]["exec_env"]["NCCL_PROTO"] == "LL" and got[sh][0]["env_reason"] is None
    by_tool = {}
    for pid, ppid in leaves.items():
        first = got[pid][-1]
        assert first["ppid"] == ppid == sh and first["start"] > 0 and first["exe"]
        by_tool["env -i" if "-S" in first["argv"] else "python"] = first
    assert by_tool["python"]["exec_env"]["NCCL_PROTO"] == "LL"
    assert by_tool["env -i"]["exec_env"] == {"NCCL_ALGO": "Tree"}  # env -i: only what it set, and only the watched
    assert by_tool["env -i"]["env_hash"] != by_tool["python"]["env_hash"]
    s = summary(run.dir)
    assert s["reader"] == reader and s["seen"] >= 3 and s["errors"] == 0 and s["stuck"] is False
    # nothing outside the watched set, in any file of the log directory
    for f in run.dir.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert secret.encode() not in data and plain.encode() not in data, f
    # the log discipline: a private directory, private files
    assert stat.S_IMODE(run.dir.stat().st_mode) == 0o700
    for f in run.dir.glob("*.json*"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    # the model: /proc's view where no boot probe ran, the boot probe's where it did
    m = model.build(events.read_dirs([run.dir]))
    host = os.uname().nodename
    bare = m.processes[(host, by_tool["env -i"]["pid"])]
    # (preload: the native record `env` made of its exec into this image, the watched part of what it passed)
    assert bare.sources in ({"proc"}, {"proc", "preload"}) and bare.ppid == sh and bare.argv[-2:] == ["-c", LEAF]
    assert bare.proc_exec_env == {"NCCL_ALGO": "Tree"} and bare.proc_start == by_tool["env -i"]["start"]
    probed = m.processes[(host, by_tool["python"]["pid"])]
    assert probed.sources >= {"boot", "proc"} and probed.proc_exec_env["NCCL_PROTO"] == "LL"
    assert probed.proc_env_hash == by_tool["python"]["env_hash"]
    assert (run.proc.pid not in {p.pid for p in m.processes.values()})  # run itself is no process of the job
    assert m.watch[host]["seen"] == s["seen"] and m.watch[host]["missed_started"] == 0


def test_an_exec_after_the_first_look_is_recorded_again(tmp_path, runs):
    """A shell seen first, that then execs python (same pid, new image): recorded again, execs=1."""
    env = {**os.environ, "LEAF": LEAF, "NCCL_ALGO": "Ring"}
    run = Run(tmp_path, ["sh", "-c", f"echo shell $$; read line; exec {sys.executable} -S -c \"$LEAF\""], env)
    runs.append(run)
    with run._cv:
        assert run._cv.wait_for(lambda: any(line.startswith("shell ") for line in run.lines), WAIT_S)
    pid = int(next(line for line in run.lines if line.startswith("shell ")).split()[1])
    wait_until(lambda: pid in seen(run.dir), "the shell was never recorded")
    run.proc.stdin.write("go\n")
    run.proc.stdin.flush()
    assert run.leaves(1) == {pid: run.proc.pid}
    again = wait_until(lambda: [e for e in seen(run.dir).get(pid, []) if e["execs"] == 1], "the exec was never seen")
    rc, err = run.release()
    assert rc == 0, err
    first = seen(run.dir)[pid][0]
    assert first["argv"][:2] == ["sh", "-c"] and first["execs"] == 0
    assert again[0]["argv"][-2:] == ["-c", LEAF] and again[0]["exec_env"]["NCCL_ALGO"] == "Ring"
    m = model.build(events.read_dirs([run.dir]))
    assert m.processes[(os.uname().nodename, pid)].argv[-1] == LEAF  # the later image replaces the earlier


SHORT = r"""
import os, subprocess, sys
r, w = os.pipe()
if os.fork() == 0:  # a double fork: the grandchild, an orphan of run's (the subreaper), lives a moment
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.write(w, str(pid).encode())
    os._exit(0)
os.wait()
print("orphan", int(os.read(r, 32)), flush=True)
py = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
print("python", py.stdout.strip(), flush=True)
"""


def test_a_process_far_shorter_than_the_interval_is_seen_or_counted(tmp_path):
    env = {**os.environ, "NCCLPROBE_WATCH_S": "30"}  # one look at the start, one at the end
    r = subprocess.run([*NCCLPROBE, "run", "--dir", str(tmp_path / "l"), "--", sys.executable, "-c", SHORT],
                       env=env, capture_output=True, text=True, timeout=WAIT_S)
    assert r.returncode == 0, r.stderr
    words = dict(line.split() for line in r.stdout.splitlines() if line.startswith(("orphan ", "python ")))
    orphan, python = int(words["orphan"]), int(words["python"])
    s = summary(tmp_path / "l")
    assert s["interval_s"] == 30 and s["stuck"] is False
    got = seen(tmp_path / "l")
    m = model.build(events.read_dirs([tmp_path / "l"]))
    # the orphan went to run, which reaped it: seen, or counted among the known missed; where the kernel's
    # events gave every exec of the tree, it exec'd nothing (a copy of its parent, which its boot probe's fork
    # record names): nothing was missed
    if s.get("kernel_complete"):
        assert orphan not in s["missed_pids"] and any(p.pid == orphan and "boot" in p.sources
                                                      for p in m.processes.values()), s
    else:
        assert orphan in got or orphan in s["missed_pids"], (got.keys(), s)
    assert s["missed_known"] == len(s["missed_pids"])
    # the Python child: its boot probe says it ran, so the model counts it if no scan saw it
    w = m.watch[os.uname().nodename]
    assert python in got or python in w["missed_started_pids"], (got.keys(), w)


def test_cmd_gone_before_the_first_look_is_counted(tmp_path):
    r = subprocess.run([*NCCLPROBE, "run", "--dir", str(tmp_path / "l"), "--", "true"], capture_output=True,
                       text=True, timeout=WAIT_S)
    assert r.returncode == 0, r.stderr
    s, got = summary(tmp_path / "l"), seen(tmp_path / "l")
    assert len(got) == 1 or s["missed_known"] == 1 and s["seen"] == 0  # `true` seen, or known missed


@pytest.mark.parametrize("how", ["SIGINT to run", "SIGTERM to run", "CMD killed"])
def test_the_watch_ends_on_every_way_run_ends(tmp_path, runs, how):
    run = Run(tmp_path, [sys.executable, "-c", LEAF], {**os.environ, "NCCLPROBE_RUN_GRACE_S": "5"})
    runs.append(run)
    (pid, _), = run.leaves(1).items()
    wait_until(lambda: pid in seen(run.dir), "the watch never recorded CMD")
    if how == "CMD killed":
        os.kill(pid, signal.SIGKILL)
    else:
        run.proc.send_signal(signal.SIGINT if "SIGINT" in how else signal.SIGTERM)
    rc = run.proc.wait(timeout=WAIT_S)
    assert rc != 0
    s = summary(run.dir)
    assert s is not None and s["stuck"] is False and s["errors"] == 0 and s["seen"] >= 1
    assert events.read_dirs([run.dir]).skipped_total == 0


def test_run_killed_leaves_whole_lines_and_no_summary(tmp_path, runs):
    run = Run(tmp_path, [sys.executable, "-c", LEAF], {**os.environ, "NCCLPROBE_RUN_GRACE_S": "1"})
    runs.append(run)
    (pid, _), = run.leaves(1).items()
    wait_until(lambda: pid in seen(run.dir), "the watch never recorded CMD")
    run.proc.kill()
    run.proc.wait(timeout=WAIT_S)
    log = events.read_dirs([run.dir])
    assert log.skipped_total == 0 and not any(e["ev"] == "watch_summary" for e in log.events)
    assert model.build(events.read_dirs([run.dir])).watch == {}  # no summary: the model says none


def test_no_thread_is_left_and_the_summary_says_it_ended(tmp_path, monkeypatch):
    """In this process: run_command returns with the watch thread gone."""
    from ncclprobe.commands import launch
    monkeypatch.setenv("NCCLPROBE_WATCH_S", "0.05")
    before = {t.ident for t in threading.enumerate()}
    result = launch.run_command(["sh", "-c", "sh -c 'exit 0'; exit 0"], log_dir=tmp_path / "l")
    assert result.data["returncode"] == 0
    left = [t for t in threading.enumerate() if t.ident not in before]
    assert not [t.name for t in left if t.name == "ncclprobe-watch"], left
    s = summary(tmp_path / "l")
    assert s["stuck"] is False and s["interval_s"] == 0.05 and s["scans"] >= 1 and s["cpu_s"] >= 0


def test_watch_off_and_a_bad_interval_are_said(tmp_path):
    off = subprocess.run([*NCCLPROBE, "run", "--dir", str(tmp_path / "off"), "--json", "--", "true"],
                         env={**os.environ, "NCCLPROBE_WATCH_S": "0"}, capture_output=True, text=True, timeout=WAIT_S)
    assert off.returncode == 0, off.stderr
    assert not any(e["ev"] in ("proc_seen", "watch_summary") for e in records(tmp_path / "off"))
    meta = run_meta(tmp_path / "off")
    assert meta["watch_s"] == 0 and any("/proc watch is off" in n for n in meta["notes"])
    bad = subprocess.run([*NCCLPROBE, "run", "--dir", str(tmp_path / "bad"), "--", "true"],
                         env={**os.environ, "NCCLPROBE_WATCH_S": "fast"}, capture_output=True, text=True,
                         timeout=WAIT_S)
    assert bad.returncode == 0, bad.stderr
    assert "NCCLPROBE_WATCH_S=fast is not a number of seconds" in " ".join(bad.stdout.split())
    from ncclprobe.commands.watch import WATCH_S
    assert summary(tmp_path / "bad")["interval_s"] == WATCH_S


TREE = r"""
import os, subprocess, sys
leaf = "import sys; sys.stdout.write('x'); sys.stdout.flush(); sys.stdin.read()"
a = subprocess.Popen([sys.executable, "-S", "-c",
                      "import os, sys\n"
                      "r, w = os.pipe()\n"
                      "if os.fork() == 0:\n    os.close(r); os.write(w, b'x'); sys.stdin.read(); os._exit(0)\n"
                      "os.close(w); os.read(r, 1); sys.stdout.write('x'); sys.stdout.flush(); sys.stdin.read()"],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
b = subprocess.Popen(["env", "-i", "NCCL_ALGO=Tree", sys.executable, "-S", "-c", leaf], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE)
a.stdout.read(1); b.stdout.read(1)
print("ready", a.pid, b.pid, flush=True)
import time; time.sleep(600)  # holding the pipes the others read: the tree stays until it is killed
"""


def test_both_readers_see_the_same_and_a_fork_child_is_recorded_once_as_its_parents_block(tmp_path):
    """In this process, on a live tree: python A forks B (no exec), env -i starts C. Both readers give
    the same sightings; B is recorded once, with A's command line and block (its env_hash)."""
    from livetree import running
    from ncclprobe.witnesses.procwatch import Scanner
    with running(TREE, env={**os.environ, "NCCL_PROTO": "LL"}) as (root, words):
        a, c = int(words[1]), int(words[2])
        views = {}
        for reader in ("native", "python"):
            sc = Scanner(root, b"k" * 16, native=True if reader == "native" else None)
            assert sc.reader == reader
            t0 = time.time()
            first = sc.scan()
            between = time.time()
            got = first + sc.scan(final=True)  # a fork child is held for one walk
            # each is dated when it was read: B, held back, at the first scan (not when it was written:
            # a fork child that exec'ed Python since would look like an exec after its boot record)
            assert all(t0 <= s.t <= between for s in got if s.pid != root) and len(got) > len(first)
            views[reader] = sorted((s.pid, s.ppid, tuple(s.argv), s.exe, tuple(sorted((s.exec_env or {}).items())),
                                    s.env_reason, s.env_hash, s.execs) for s in got)
    assert views["native"] == views["python"]
    by_pid = {v[0]: v for v in views["native"]}
    b = next(pid for pid, v in by_pid.items() if v[1] == a)
    assert len(views["native"]) == len(by_pid) == 3  # each once
    assert by_pid[b][2] == by_pid[a][2] and by_pid[b][6] == by_pid[a][6]  # fork: A's image and block
    assert dict(by_pid[a][4])["NCCL_PROTO"] == "LL" and dict(by_pid[c][4]) == {"NCCL_ALGO": "Tree"}
    assert by_pid[c][6] != by_pid[a][6]


@pytest.mark.parametrize("reader", ["native", "python"])
def test_the_roots_own_fork_before_its_exec_is_no_process_of_the_tree(reader):
    """run's child between fork and the execve of CMD shows run's own image: a scan that catches it there and
    never again (CMD exec'd and ended between two scans: a client such as srun) must not record run as a
    process of the job. It is a process known to have run that no scan saw, and the watch says so."""
    from ncclprobe.witnesses.procwatch import Scanner
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # this test process's image until released, then what CMD would be: gone at once
        os.close(w)
        os.read(r, 1)
        os.execv("/bin/true", ["/bin/true"])
    os.close(r)
    try:
        sc = Scanner(os.getpid(), b"k" * 16, native=True if reader == "native" else None)
        assert sc.reader == reader
        first = sc.scan()
        assert child in sc.pending and not [s for s in first if s.pid == child]  # held: will it exec?
        os.write(w, b"x")
        os.waitpid(child, 0)
        later = sc.scan(final=True)
        assert not [s for s in first + later if s.pid == child], "run's own image recorded as a process of the job"
        assert child in sc.missed(started=[child])
    finally:
        os.close(w)
        try:
            os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            pass


def test_the_watch_line_counts_execs_apart_from_processes(tmp_path):
    """`env python3 …` is one process that exec'd twice: the kernel's reads are counted as execs, never as a
    share of the processes seen (it said '1 process(es) seen, 2 of them read at their exec')."""
    from ncclprobe.views.report import watch_line
    w = {"mode": "kernel", "seen": 1, "kernel_reads": 2, "scans": 2, "interval_s": 0.5}
    line = watch_line(w)
    assert line.startswith("/proc watch: 1 process(es) seen, 2 exec(s) read as they happened (the kernel's "), line
    assert "of them" not in line
    # a real run's summary says the same of itself (how many execs a read caught depends on the machine's timing)
    out = subprocess.run([*NCCLPROBE, "run", "--json", "--dir", str(tmp_path / "logs"), "--", "env",
                          sys.executable, "-S", "-c", "import time; time.sleep(1)"], capture_output=True, text=True,
                         timeout=120)
    (w,) = json.loads(out.stdout)["watch"].values()
    assert out.returncode == 0, out.stderr
    if w["mode"] == "kernel":  # (root, or CAP_NET_ADMIN)
        said = f"{w['seen']} process(es) seen, {w['kernel_reads']} exec(s) read as they happened"
        assert w["kernel_reads"] >= 1 and said in watch_line(w) and "of them" not in watch_line(w), w
