"""`ncclprobe run` under signals and closed pipes, on real process trees: every process CMD started is
ended on a stop request (those that left its session too), each step is announced and escalates,
a normal exit lists what CMD left running, and a closed stdout never changes the exit code.

Synchronisation is on files the processes write and on the lines run prints, never on sleeps."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from rundirs import run_meta

NCCLPROBE = [sys.executable, "-m", "ncclprobe"]
WAIT_S = 60  # generous: a loaded 2-core machine is slow, and nothing here waits for a timeout to pass

# A process that ignores SIGINT and SIGTERM, says so in a file, then waits to be killed.
STUBBORN = ("import signal, sys, time, pathlib; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); pathlib.Path(sys.argv[1]).write_text('ready'); "
            "time.sleep(600)")


def grandchild_cmd(how: str, ready: Path, pidfile: Path, stubborn: bool = False) -> list[str]:
    """CMD: starts a grandchild that leaves its session as daemons do (start_new_session, or a double
    fork with setsid whose middle process exits; stdio on /dev/null), writes the grandchild's pid once it runs (`sleep`, or
    STUBBORN once it ignores the signals), then sleeps (it ends on SIGINT, as Python does)."""
    child = [sys.executable, "-c", STUBBORN, str(ready)] if stubborn else ["sleep", "600"]
    if how == "new session":
        start = (f"g = subprocess.Popen({child!r}, start_new_session=True, stdin=subprocess.DEVNULL, "
                 f"stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); pid = g.pid")
    else:
        start = (f"r, w = os.pipe()\n"
                 f"if os.fork() == 0:\n    os.setsid()\n    pid = os.fork()\n"
                 f"    if pid == 0:\n        fd = os.open(os.devnull, os.O_RDWR)\n"
                 f"        for i in (0, 1, 2): os.dup2(fd, i)\n"
                 f"        os.execvp({child[0]!r}, {child!r})\n"
                 f"    os.write(w, str(pid).encode()); os._exit(0)\n"
                 f"os.wait(); pid = int(os.read(r, 32))")
    if stubborn:
        started = f"pathlib.Path({str(ready)!r}).exists()"
    else:  # exec'ed: the kernel's name is sleep's
        started = "pathlib.Path(f'/proc/{pid}/comm').read_text() == 'sleep\\n'"
    code = (f"import os, pathlib, subprocess, sys, time\n{start}\n"
            f"while not {started}: time.sleep(0.01)\n"
            f"pathlib.Path({str(pidfile)!r}).write_text(f'{{pid}} {{os.getsid(0)}}')\n"
            f"time.sleep(600)\n")
    return [sys.executable, "-c", code]


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_tree_outlives_a_test():
    """A failing test must not leave its run, CMD or their descendants behind: SIGKILL by pid."""
    yield
    while STARTED:
        proc = STARTED.pop()
        try:
            top = psutil.Process(proc.pid)
            tree = top.children(recursive=True) + [top] if proc.poll() is None else []
        except psutil.NoSuchProcess:
            tree = []
        for p in tree:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        proc.wait(timeout=WAIT_S)


class Run:
    """`ncclprobe run` in the background, its stderr read line by line as it comes."""

    def __init__(self, tmp_path: Path, *args: str, grace: float | None = None, stdout=subprocess.PIPE):
        env = dict(os.environ)
        if grace is not None:
            env["NCCLPROBE_RUN_GRACE_S"] = str(grace)
        self.dir = tmp_path / "logs"
        self.proc = subprocess.Popen([*NCCLPROBE, "run", "--dir", str(self.dir), *args], env=env, stdout=stdout,
                                     stderr=subprocess.PIPE, text=True)
        STARTED.append(self.proc)
        self.lines: queue.Queue[str | None] = queue.Queue()  # None: stderr closed
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def expect_line(self, text: str) -> str:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=deadline - time.monotonic())
            except queue.Empty:
                break
            if line is None:
                break
            self.stderr.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} on run's stderr: {''.join(self.stderr)}")

    def finish(self, read_stdout: bool = True) -> tuple[int, str]:
        out = self.proc.stdout.read() if read_stdout else ""
        rc = self.proc.wait(timeout=WAIT_S)
        while True:  # the reader has seen everything once stderr is at its end
            line = self.lines.get(timeout=WAIT_S)
            if line is None:
                return rc, out
            self.stderr.append(line)

    def meta(self) -> dict:
        return run_meta(self.dir)


def wait_for(path: Path) -> str:
    deadline = time.monotonic() + WAIT_S
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)
    return path.read_text()


def identity(pid: int) -> tuple[int, float]:
    return pid, psutil.Process(pid).create_time()


def running(ident: tuple[int, float]) -> bool:
    try:
        p = psutil.Process(ident[0])
        return p.create_time() == ident[1] and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_if_running(ident: tuple[int, float] | None) -> None:
    if ident is not None and running(ident):
        os.kill(ident[0], signal.SIGKILL)


@pytest.mark.parametrize("how", ["new session", "double fork"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_ends_a_grandchild_that_left_the_session(tmp_path, how, sig):
    ready, pidfile = tmp_path / "ready", tmp_path / "pid"
    run = Run(tmp_path, "--json", "--", *grandchild_cmd(how, ready, pidfile), grace=300)  # no step by the clock
    grandchild = None
    try:
        pid, cmd_session = map(int, wait_for(pidfile).split())
        grandchild = identity(pid)
        assert os.getsid(pid) != cmd_session  # it really left CMD's session
        run.proc.send_signal(sig)
        run.expect_line(f"{sig.name}: forwarded to CMD")
        run.expect_line(f"{sig.name}: stopping 1 process(es): SIGTERM now, SIGKILL in 300 s")
        rc, out = run.finish()
        assert not running(grandchild)
    finally:
        kill_if_running(grandchild)
    assert rc == 128 + sig, run.stderr  # CMD's own code: Python ends by the signal it got
    doc = json.loads(out)
    assert doc["interrupted_by"] == sig.name and doc["left_running"] == []
    assert {"pid": grandchild[0], "name": "sleep", "signal": "SIGTERM"} in doc["stopped"]
    meta = run.meta()
    assert meta["status"] == f"killed by {sig.name}" and meta["stopped"] == doc["stopped"]


def test_a_child_ignoring_sigint_and_sigterm_is_killed_after_the_grace(tmp_path):
    ready = tmp_path / "ready"
    run = Run(tmp_path, "--json", "--", sys.executable, "-c", STUBBORN, str(ready), grace=0.5)
    wait_for(ready)
    run.proc.send_signal(signal.SIGINT)
    run.expect_line("SIGINT: forwarded to CMD")
    run.expect_line("still running 0.5 s after SIGINT: stopping 1 process(es): SIGTERM now, SIGKILL in 0.5 s")
    run.expect_line("still running 0.5 s after SIGTERM: SIGKILL now to 1 process(es)")
    rc, out = run.finish()
    assert rc == 128 + signal.SIGKILL
    doc = json.loads(out)
    assert doc["exit_status"] == "killed by SIGKILL" and doc["stopped"][0]["signal"] == "SIGKILL"
    assert run.meta()["status"] == "killed by SIGKILL"


def test_each_further_sigint_takes_the_next_step_at_once(tmp_path):
    """Three Ctrl-C to a child that ignores them: forwarded, then SIGTERM, then SIGKILL, each said;
    the grace (10 minutes here) is never waited for."""
    ready = tmp_path / "ready"
    run = Run(tmp_path, "--", sys.executable, "-c", STUBBORN, str(ready), grace=600)
    wait_for(ready)
    run.proc.send_signal(signal.SIGINT)
    run.expect_line("SIGINT: forwarded to CMD")
    run.proc.send_signal(signal.SIGINT)
    run.expect_line("SIGINT again: stopping 1 process(es): SIGTERM now, SIGKILL in 600 s")
    run.proc.send_signal(signal.SIGINT)
    run.expect_line("SIGINT again: SIGKILL now to 1 process(es): pid")
    rc, out = run.finish()
    assert rc == 128 + signal.SIGKILL
    shown = " ".join(out.split())  # the report wraps long lines
    assert "killed by SIGKILL" in shown and "ended 1 process(es) of CMD's tree" in shown  # the report is printed


def test_a_second_sigint_during_cleanup_escalates_instead_of_aborting(tmp_path):
    """CMD ends on the first Ctrl-C but leaves a grandchild (own session) that ignores SIGTERM: the
    second Ctrl-C kills it at once; no "Aborted!", its run metadata has the status, the report is printed."""
    ready, pidfile = tmp_path / "ready", tmp_path / "pid"
    run = Run(tmp_path, "--", *grandchild_cmd("new session", ready, pidfile, stubborn=True), grace=600)
    grandchild = None
    try:
        grandchild = identity(int(wait_for(pidfile).split()[0]))
        run.proc.send_signal(signal.SIGINT)
        run.expect_line("SIGINT: stopping 1 process(es): SIGTERM now, SIGKILL in 600 s")
        run.proc.send_signal(signal.SIGINT)
        run.expect_line(f"SIGINT again: SIGKILL now to 1 process(es): pid {grandchild[0]} (python")
        rc, out = run.finish()
        assert not running(grandchild)
    finally:
        kill_if_running(grandchild)
    assert rc == 128 + signal.SIGINT  # CMD's own code
    assert "Aborted" not in "".join(run.stderr)
    shown = " ".join(out.split())  # the report wraps long lines
    assert "killed by SIGINT" in shown and f"pid {grandchild[0]} (python" in shown
    meta = run.meta()
    assert meta["status"] == "killed by SIGINT" and meta["interrupted_by"] == "SIGINT"
    assert [s["signal"] for s in meta["stopped"]] == ["SIGKILL"]


@pytest.mark.parametrize("how", ["new session", "double fork"])
def test_a_daemon_left_after_a_normal_exit_is_listed_and_left_running(tmp_path, how):
    pidfile = tmp_path / "pid"
    cmd = grandchild_cmd(how, tmp_path / "ready", pidfile)
    cmd[-1] = cmd[-1].replace("time.sleep(600)\n", "")  # CMD exits 0 as soon as its daemon runs
    daemon = None
    try:
        r = subprocess.run([*NCCLPROBE, "run", "--dir", str(tmp_path / "l"), "--json", "--", *cmd],
                           capture_output=True, text=True, timeout=WAIT_S)
        daemon = identity(int(pidfile.read_text().split()[0]))
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["left_running"] == [{"pid": daemon[0], "name": "sleep"}] and doc["stopped"] == []
        assert doc["interrupted_by"] is None and running(daemon)
        assert run_meta(tmp_path / "l")["left_running"] == doc["left_running"]
        kill_if_running(daemon)
        pidfile.unlink()
        r = subprocess.run([*NCCLPROBE, "run", "--dir", str(tmp_path / "t"), "--", *cmd],
                           capture_output=True, text=True, timeout=WAIT_S)
        daemon = identity(int(pidfile.read_text().split()[0]))
        assert r.returncode == 0, r.stderr
        shown = " ".join(r.stdout.split())  # the report wraps long lines
        assert f"still running; ncclprobe run left them running: pid {daemon[0]} (sleep)" in shown
    finally:
        kill_if_running(daemon)


@pytest.mark.parametrize("as_json", [False, True])
def test_a_closed_stdout_keeps_cmds_exit_code(tmp_path, as_json):
    """`ncclprobe run -- sh -c 'seq 1 100000; exit 3' | head -1`: CMD writes more than a pipe holds,
    so the reader has gone before run prints its report."""
    args = ["--json"] if as_json else []
    run = Run(tmp_path, *args, "--", "sh", "-c", "seq 1 100000; exit 3")
    if as_json:  # CMD's output goes to stderr then: close stdout before run writes the document
        run.proc.stdout.close()
    else:
        assert run.proc.stdout.readline() == "1\n"
        run.proc.stdout.close()
    rc, _ = run.finish(read_stdout=False)
    err = "".join(run.stderr)
    assert rc == 3, err
    assert "Traceback" not in err and "Exception ignored" not in err


def test_a_signal_ignored_when_run_starts_stays_ignored_in_cmd(tmp_path):
    """nohup (SIGHUP) and a shell's `cmd &` (SIGINT, SIGQUIT) ignore signals for what they start: a
    handler of run's own would be reset to the default at CMD's exec, so run leaves those alone."""
    code = "import signal; print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)"
    nohup = ("import signal, subprocess, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
             "sys.exit(subprocess.run(sys.argv[1:]).returncode)")
    r = subprocess.run([sys.executable, "-c", nohup, *NCCLPROBE, "run", "--dir", str(tmp_path / "l"), "--",
                        sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT_S)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "True"


def test_a_process_seen_once_is_still_found_after_it_left_the_tree(tmp_path):
    """Without a subreaper (this test process is none), a daemon whose parent exits goes to another
    parent; a Tree that recorded it still lists it (by pid and start time)."""
    from ncclprobe.commands.supervise import Tree
    tree = Tree()
    pidfile, go = tmp_path / "pid", tmp_path / "go"
    code = ("import os, pathlib, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n    os.setsid()\n    fd = os.open(os.devnull, os.O_RDWR)\n"
            "    for i in (0, 1, 2): os.dup2(fd, i)\n    os.execvp('sleep', ['sleep', '600'])\n"
            "while pathlib.Path(f'/proc/{pid}/comm').read_text() != 'sleep\\n': time.sleep(0.01)\n"
            f"pathlib.Path({str(pidfile)!r}).write_text(str(pid))\n"
            f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.01)\n")
    middle = subprocess.Popen([sys.executable, "-c", code])
    STARTED.append(middle)
    daemon = None
    try:
        daemon = identity(int(wait_for(pidfile)))
        assert daemon[0] in {m.pid for m in tree.live()}
        go.touch()
        middle.wait(timeout=WAIT_S)
        assert psutil.Process(daemon[0]).ppid() not in (middle.pid, os.getpid())  # no ppid link to us left
        assert [(m.pid, m.name) for m in tree.live()] == [(daemon[0], "sleep")]
    finally:
        kill_if_running(daemon)


def test_sigkill_of_run_itself_still_ends_its_tree(tmp_path):
    """The keeper (ncclprobe/commands/keeper.py) ends CMD and a grandchild in a session of its own when run
    is killed outright; SIGKILL leaves run no chance to do it."""
    ready, pidfile = tmp_path / "ready", tmp_path / "pid"
    run = Run(tmp_path, "--", *grandchild_cmd("new session", ready, pidfile), grace=1)
    deadline = time.monotonic() + WAIT_S
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline and run.proc.poll() is None, run.stderr
        time.sleep(0.02)
    grandchild = int(pidfile.read_text().split()[0])
    cmd = psutil.Process(run.proc.pid).children()
    tree = [psutil.Process(grandchild), *cmd]
    assert any(p.name() == "sleep" for p in tree) and psutil.Process(grandchild).ppid() != run.proc.pid
    run.proc.kill()
    run.expect_line("the supervisor is gone; ending the")
    gone, alive = psutil.wait_procs(tree, timeout=WAIT_S)
    assert not alive, [p.pid for p in alive]


def test_a_daemon_left_after_a_normal_exit_outlives_the_keeper(tmp_path):
    pidfile = tmp_path / "pid"
    code = (f"import subprocess, pathlib; d = subprocess.DEVNULL; "
            f"g = subprocess.Popen(['sleep', '600'], start_new_session=True, stdin=d, stdout=d, stderr=d); "
            f"pathlib.Path({str(pidfile)!r}).write_text(str(g.pid))")
    run = Run(tmp_path, "--", sys.executable, "-c", code, grace=1)
    rc, _ = run.finish()
    daemon = psutil.Process(int(pidfile.read_text()))
    try:
        # run waits for its keeper to go before it exits: a keeper that had missed "done" would have
        # signalled the daemon by now
        assert rc == 0 and daemon.is_running() and daemon.status() != psutil.STATUS_ZOMBIE
        assert not any("supervisor is gone" in line for line in run.stderr)
    finally:
        daemon.kill()
