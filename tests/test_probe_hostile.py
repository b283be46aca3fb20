"""libncclprobe.so never harms its host (issue 21), on real processes that do to themselves what real
hosts do: a daemon's close-all and dup2 before fork, stdio closed, a log filesystem that stalls (a real
frozen ext4 on a loop device), RLIMIT_FSIZE, a thread racing setenv/unsetenv against communicator
inits; and it bounds what it writes (line cap, per-process byte budget, per-directory file budget)."""
from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "c"))
import probe_support as ps  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe_hostile")
    quiet = d / "quiet"
    ps.build_fake_nccl(quiet / "nccl", no_getenv=True)
    return {"lib": ps.build_probe(d), "host": ps.build_hostile_host(d),
            "quiet_host": ps.build_hostile_host(quiet, quiet / "nccl"), "dir": d}


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700)
    return path


def host_env(built, log: Path, **extra: str) -> dict[str, str]:
    """Every role of the probe on: preloaded, and loaded by the simulated NCCL as its profiler and env plugin."""
    lib = str(built["lib"])
    return ps.probe_env(log, built["lib"], NCCL_PROFILER_PLUGIN=lib, NCCL_ENV_PLUGIN=lib, **extra)


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


# ---- descriptors: never one the probe cannot prove is its own ----------------------------------------

@pytest.mark.parametrize("kind", ["pipe", "socket", "file"])
def test_fork_child_keeps_the_descriptor_the_host_put_on_the_old_log_number(built, tmp_path, kind):
    """A host closes every fd >= 3 and dup2()s its own pipe / socket / file onto the number the probe's log
    had, then forks: the child must still write through it (the probe's fork handler closes only what
    fstat proves is its file)."""
    log = private_dir(tmp_path / "log")
    target = tmp_path / "hostfile"
    arg = f"file:{target}" if kind == "file" else kind
    r = ps.run([built["host"], "forkfd", arg], host_env(built, log), timeout=60)
    assert r.returncode == 0, r.stderr
    fields = dict(kv.split("=", 1) for kv in r.stdout.split())
    assert int(fields["logfd"]) >= 200  # the probe's log sat above the floor
    assert fields["child_write"] == "0"  # not EBADF: the child still had the host's descriptor
    if kind == "file":
        assert target.read_text() == "child-ok\n"
    else:
        assert fields["parent_got"] == "child-ok"


@pytest.mark.parametrize("nofile", [64, 3])
def test_host_started_with_stdio_closed_never_gets_the_log_on_0_to_2(built, tmp_path, nofile):
    """stdio closed and RLIMIT_NOFILE too low to move a descriptor to 200: the log goes above 2, or (no
    descriptor above 2 at all) the probe stays silent; what the host writes to fd 1 never reaches the log."""
    log = private_dir(tmp_path / "log")
    report = tmp_path / "report"
    r = ps.run([built["host"], "stdio", report, nofile], host_env(built, log), timeout=60)
    assert r.returncode == 0, r.stderr
    fds = {int(line.split()[1]): line.split(None, 2)[2] for line in report.read_text().splitlines()
           if line.startswith("fd ")}
    ours = {fd: target for fd, target in fds.items() if target.startswith(str(log))}
    assert all(fd >= 3 for fd in ours), fds
    files = list(log.glob("*.jsonl"))
    for f in files:
        assert b"HOSTOUT" not in f.read_bytes()
    if nofile == 64:  # room above 2: logged there
        assert len(files) == 1 and any(e["ev"] == "comm_init" for e in lines_of(files[0]))
    else:  # none: silent rather than on the host's stdio
        assert ours == {} and files == []


def test_failing_writes_neither_kill_nor_block_the_host_and_are_counted(built, tmp_path):
    """RLIMIT_FSIZE at the log's size: every write fails with EFBIG and raises SIGXFSZ, whose default
    action kills the process. The host lives on; the lines lost are said in the next line written."""
    log = private_dir(tmp_path / "log")
    r = ps.run([built["host"], "fsize", 20], host_env(built, log), timeout=60)
    assert (r.returncode, r.stdout.split()) == (0, ["alive"]), r.stderr
    f, = log.glob("*.jsonl")
    events = lines_of(f)
    said = [e for e in events if "dropped" in e]
    assert len(said) == 1 and said[0]["dropped"] >= 20, [(e["ev"], e.get("dropped")) for e in events]


# ---- a stalled log filesystem: a real frozen ext4 ---------------------------------------------------

def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, timeout=60)


@contextmanager
def loop_ext4(tmp_path: Path):
    """A fresh ext4 on a loop device, mounted; skipped where that is not permitted. Always thawed,
    unmounted and detached afterwards: a frozen filesystem left behind would hang whatever touches it."""
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("losetup", "mkfs.ext4", "fsfreeze", "mount")):
        pytest.skip("needs root, losetup, mkfs.ext4, mount and fsfreeze")
    image, mnt = tmp_path / "ext4.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    loop = _sh("losetup", "-f", "--show", str(image), check=False)
    if loop.returncode != 0:
        pytest.skip(f"no loop device: {loop.stderr.strip()}")
    dev = loop.stdout.strip()
    mounted = False
    try:
        _sh("mkfs.ext4", "-q", "-F", dev)
        m = _sh("mount", dev, str(mnt), check=False)
        if m.returncode != 0:
            pytest.skip(f"mounting a loop device is not permitted: {m.stderr.strip()}")
        mounted = True
        yield mnt
    finally:
        if mounted:
            _sh("fsfreeze", "-u", str(mnt), check=False)
            deadline = time.monotonic() + 30  # a process may still hold a file there for a moment
            while _sh("umount", str(mnt), check=False).returncode != 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            _sh("umount", "-l", str(mnt), check=False)
        _sh("losetup", "-d", dev, check=False)


class Host:
    """A hostile_host process driven line by line through stdin/stdout, with a deadline on every answer."""

    def __init__(self, cmd: list, env: dict[str, str]):
        self.p = subprocess.Popen([str(c) for c in cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.put(line.strip())

    def answer(self, timeout: float) -> str | None:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def say(self, text: str) -> None:
        self.p.stdin.write(text + "\n")
        self.p.stdin.flush()

    def leader_state(self) -> str:
        """The main thread's state: Z once its exit() has finished, even while another thread lingers."""
        return Path(f"/proc/{self.p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()


BOUND_MS = 1500  # per operation while frozen (the probe's own bounded waits are 50-100 ms); it used to be forever
PAD = "x" * 3000  # a watched variable that makes every comm init line large: the queue fills while frozen


@contextmanager
def frozen(mnt: Path):
    _sh("fsfreeze", "-f", str(mnt))
    try:
        yield
    finally:
        _sh("fsfreeze", "-u", str(mnt), check=False)


def start_stalled_host(built, mnt: Path, flush_s: str) -> tuple[Host, Path]:
    log = private_dir(mnt / "log")
    host = Host([built["host"], "stall", 400], host_env(built, log, NCCLPROBE_FLUSH_S=flush_s, NCCL_PAD=PAD))
    assert host.answer(60) == "ready"
    return host, log


def phase1_times(answer: str | None) -> dict[str, float]:
    assert answer is not None, "the host blocked on the frozen log filesystem"
    assert answer.startswith("phase1 "), answer
    return {k: float(v) for k, v in (kv.split("=") for kv in answer.split()[1:])}


def said_dropped(path: Path) -> list[int]:
    return [json.loads(line)["dropped"] for line in path.read_bytes().splitlines() if b'"dropped"' in line]


@pytest.mark.parametrize("flush_s", ["0", "0.02"])  # the collective path flushes; a flusher thread does
def test_frozen_log_filesystem_never_blocks_the_host(built, tmp_path, flush_s):
    """With the log directory's filesystem frozen: comm inits, setenv + NCCL's reads through the env plugin,
    collectives, fork() and the child's first communicator all return within a bound; after the thaw the
    lines lost meanwhile are said ("dropped": K), and the host goes on logging."""
    with loop_ext4(tmp_path) as mnt:
        host, log = start_stalled_host(built, mnt, flush_s)
        parent = log / f"{os.uname().nodename}-{host.p.pid}.jsonl"
        try:
            with frozen(mnt):
                host.say("go")
                times = phase1_times(host.answer(30))
            assert max(times.values()) < BOUND_MS, times
            deadline = time.monotonic() + 60  # the writer catches up on its own once the filesystem is back
            while not said_dropped(parent) and time.monotonic() < deadline:
                time.sleep(0.05)
            host.say("more")
            assert host.answer(60) == "done"
            assert host.p.wait(timeout=60) == 0
        finally:
            host.kill()
        events = lines_of(parent)
        said = said_dropped(parent)
        kinds = {k: sum(e["ev"] == k for e in events) for k in {e["ev"] for e in events}}
        assert said and all(k > 0 for k in said) and sum(said) >= 100, (said, kinds, times)
        assert events[-1]["ev"] in ("comm_destroy", "coll_summary", "comm_activity", "comm_plugin_finalize")
        assert kinds["comm_init"] > 2  # lines from after the thaw too


def test_exit_while_the_log_filesystem_is_frozen(built, tmp_path):
    """exit() finishes within a bound (the main thread is a zombie: all the host's code has run) while the
    probe's writer thread waits in the kernel for the thaw; then the process is reaped."""
    with loop_ext4(tmp_path) as mnt:
        host, _ = start_stalled_host(built, mnt, "0")
        try:
            with frozen(mnt):
                host.say("go")
                phase1_times(host.answer(30))
                host.say("exit")
                assert host.answer(30) == "exiting"
                deadline = time.monotonic() + BOUND_MS / 1000
                while host.leader_state() != "Z" and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert host.leader_state() == "Z", "exit() is still running"
            assert host.p.wait(timeout=60) == 0
        finally:
            host.kill()


# ---- the environment walk against a racing host -----------------------------------------------------

def test_environ_walk_survives_a_thread_racing_setenv_and_unsetenv(built, tmp_path):
    """A host thread sets and unsets 64 watched variables while the main thread creates communicators: the
    probe reads each environ entry once (a second read can be NULL after unsetenv shifted the entries). The
    NCCL here reads no variable itself: glibc's getenv re-reads entries too, and that race is the host's."""
    log = private_dir(tmp_path / "log")  # the walk that read entries twice crashed in 10 of 10 such runs
    r = ps.run([built["quiet_host"], "envrace", 20000, 64], ps.probe_env(log, built["lib"]), timeout=240)
    assert (r.returncode, r.stdout.split()) == (0, ["inits=20000"]), (r.returncode, r.stderr[-2000:])
    inits = [e for e in ps.read(log).events if e["ev"] == "comm_init"]
    assert len(inits) == 20000 and all(isinstance(e["env"], dict) for e in inits)


def test_the_probe_reads_its_own_settings_without_getenv(built, tmp_path):
    """The probe's settings (NCCLPROBE_DIR, _MAX_LINE, _MAX_FILES, _MAX_BYTES, _FLUSH_S, _GPU_TIMING) are read
    through its own environ walk, not glibc's getenv: a host thread racing setenv()/unsetenv() crashed getenv's
    walk in the probe's first read (np_log_setup), 3 runs in 1,500 of a host that races from its start. A spy
    preloaded ahead of the probe counts every getenv of a NCCLPROBE_ name: none, in each of the probe's roles,
    and the settings still hold (the log is where NCCLPROBE_DIR says, and no line is over NCCLPROBE_MAX_LINE)."""
    spy, log, out = ps.build_getenv_spy(tmp_path), private_dir(tmp_path / "log"), tmp_path / "spy.txt"
    env = host_env(built, log, NCCLPROBE_MAX_LINE="1024", NCCL_SOCKET_IFNAME="lo" * 600, NCCLPROBE_FLUSH_S="1",
                   NCCLPROBE_MAX_FILES="64", SPY_OUT=str(out))
    env["LD_PRELOAD"] = f"{spy} {env['LD_PRELOAD']}"
    r = ps.run([built["host"], "envrace", 5, 0], env, timeout=120)
    assert (r.returncode, r.stdout.split()) == (0, ["inits=5"]), (r.returncode, r.stderr[-2000:])
    assert out.read_text() == "probe_getenv=0\n"
    files = list(log.iterdir())
    assert files and all(len(line) <= 1024 for f in files for line in f.read_bytes().splitlines())
    evs = ps.read(log).events
    assert sum(e["ev"] == "comm_init" for e in evs) == 5 and any(e["ev"] == "nccl_getenv" for e in evs), \
        {e["ev"] for e in evs}


# ---- bounded output -----------------------------------------------------------------------------------

def test_every_line_keeps_within_the_line_cap_and_says_it_was_cut(built, tmp_path):
    """NCCLPROBE_MAX_LINE=1024 and a host whose records would be far longer (large watched values, a
    device list of 100): every line is valid JSON of at most 1024 bytes, and the cut ones say "truncated",
    with the members after the environment still there."""
    log = private_dir(tmp_path / "log")
    env = host_env(built, log, NCCLPROBE_MAX_LINE="1024", NCCL_PAD=PAD, NCCL_SOCKET_IFNAME="lo" * 600,
                   NCCL_NET="Socket" + "x" * 2000)
    for cmd in (["stall", 3], ["initall", 100]):
        host = subprocess.run([str(built["host"]), *map(str, cmd)], env=env, input="go\nmore\n", capture_output=True,
                              text=True, timeout=120)
        assert host.returncode == 0, host.stderr
    raw = [line for f in log.glob("*.jsonl") for line in f.read_bytes().splitlines(keepends=True)]
    assert all(len(line) <= 1024 for line in raw), max(map(len, raw))
    events = [json.loads(line) for line in raw]
    kinds = {e["ev"] for e in events}
    assert {"comm_init", "comm_plugin_init", "nccl_getenv", "coll_summary", "comm_destroy"} <= kinds, kinds
    inits = [e for e in events if e["ev"] in ("comm_init", "comm_plugin_init")]
    assert inits and all(e["truncated"] is True and "env" in e for e in inits)
    assert all("rc" in e for e in inits if e["ev"] == "comm_init")
    net = [e for e in events if e["ev"] == "nccl_getenv" and e["var"] == "NCCL_NET"]
    assert net and all(e["truncated"] is True for e in net)
    init_all = [e for e in events if e["ev"] == "comm_init" and e["api"] == "ncclCommInitAll"]
    assert len(init_all) == 100 and all(e["truncated"] is True for e in init_all)
    assert all(e.get("devlist", list(range(64)))[:64] == list(range(64)) for e in init_all)


def test_byte_budget_ends_the_file_with_one_budget_line(built, tmp_path):
    """NCCLPROBE_MAX_BYTES=20000 and a host writing far more: the file ends with exactly one log_budget
    line, stays under the limit, and stops growing while the host goes on."""
    log = private_dir(tmp_path / "log")
    host = Host([built["host"], "lines", 200, 200], host_env(built, log, NCCLPROBE_MAX_BYTES="20000"))
    try:
        assert host.answer(60) == "first"
        f, = log.glob("*.jsonl")
        size = f.stat().st_size
        host.say("on")
        assert host.answer(60) == "second"
        assert host.p.wait(timeout=60) == 0
    finally:
        host.kill()
    assert f.stat().st_size == size <= 20000
    events = lines_of(f)
    budget = [e for e in events if e["ev"] == "log_budget"]
    assert len(budget) == 1 and events[-1] is budget[0]
    assert (budget[0]["reached"], budget[0]["limit"], budget[0]["pid"]) == ("bytes", 20000, host.p.pid)
    assert budget[0]["src"] in ("preload", "profiler", "envplugin") and budget[0]["host"]
    assert len(events) > 10


def test_file_budget_counts_files_per_directory(built, tmp_path):
    """NCCLPROBE_MAX_FILES=3 and six fork children each logging: three log files, a fourth holding only the
    log_budget line, and nothing from the last two."""
    log = private_dir(tmp_path / "log")
    r = ps.run([built["host"], "forks", 6], host_env(built, log, NCCLPROBE_MAX_FILES="3"), timeout=120)
    assert r.returncode == 0, r.stderr
    children = [int(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("child ")]
    assert len(children) == 6
    host = os.uname().nodename
    files = {int(p.name[len(host) + 1:-len(".jsonl")]): p for p in log.glob("*.jsonl")}
    assert sorted(files) == sorted(children[:4])
    for pid in children[:3]:
        assert any(e["ev"] == "comm_init" for e in lines_of(files[pid]))
    only, = lines_of(files[children[3]])
    assert (only["ev"], only["reached"], only["limit"], only["pid"]) == ("log_budget", "files", 3, children[3])
    assert (log / f"{host}.files").stat().st_size == 4  # one byte per file created, none past the budget
