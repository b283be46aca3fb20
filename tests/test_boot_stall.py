"""The boot probe on a log filesystem that stalls or fills up, for real: an ext4 image on a loop device,
frozen with fsfreeze (what a hung NFS mount or a snapshot does to writers) or filled to the last block.

Linux makes every write to a frozen filesystem sleep uninterruptibly until it is thawed (write(),
pwritev2 with RWF_NOWAIT too, creating a file; SIGKILL does not end it), so no writer of the host's own
can avoid the first stall. What must hold: after one stall the probe stops touching that filesystem for
a while (a back-off), so the host's os.environ writes, forks and exit go on while it stays frozen; the
lines it drops are counted, and the first line written afterwards says "dropped": K. A full filesystem
drops lines the same way, and a torn line never glues to the next one.

Needs root, a free loop device, mkfs.ext4 and fsfreeze; skipped with the reason otherwise. Whatever
happens, the filesystem is thawed, unmounted and its loop device detached (a frozen filesystem left
behind would hang whatever touches it next), and a host is killed only after the thaw (a process
asleep in a frozen filesystem cannot die before)."""
from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ncclprobe.commands.inject import ephemeral_env
from ncclprobe.witnesses.events import read_dirs
from boot_support import PYTHON, clean_env

HOST = os.uname().nodename.replace("/", "_")
STALL_S = 2.5  # how long the test keeps the host asleep in the frozen filesystem (the probe's threshold: 2 s;
# it then leaves the filesystem alone for ten times the stall)
BOUND_S = 30   # what a host that no longer touches the frozen filesystem needs, at most, on a loaded machine


def _tool(name: str) -> str:
    path = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.path.exists(p)), None)
    if path is None:
        pytest.skip(f"{name} is not installed")
    return path


def _sh(*args, check=True, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=timeout, check=check)


class Loopfs:
    """A fresh ext4 filesystem on a loop device, mounted at `mnt`."""

    def __init__(self, tmp: Path):
        self.tmp, self.mnt, self.dev, self.mounted, self.frozen = tmp, tmp / "mnt", None, False, False
        self.fsfreeze = _tool("fsfreeze")

    def make(self, size_mb: int = 32) -> None:
        image = self.tmp / "fs.img"
        with open(image, "wb") as f:
            f.truncate(size_mb << 20)
        res = _sh(_tool("losetup"), "--find", "--show", image, check=False)
        if res.returncode != 0:
            pytest.skip(f"no loop device: {res.stderr.strip()}")
        self.dev = res.stdout.strip()
        _sh(_tool("mkfs.ext4"), "-q", "-F", "-m", "0", self.dev)
        self.mnt.mkdir()
        res = _sh("mount", "-t", "ext4", self.dev, self.mnt, check=False)
        if res.returncode != 0:
            pytest.skip(f"mounting is not permitted here: {res.stderr.strip()}")
        self.mounted = True

    def freeze(self) -> None:
        self.frozen = True
        _sh(self.fsfreeze, "--freeze", self.mnt)

    def thaw(self) -> None:
        if self.frozen:
            _sh(self.fsfreeze, "--unfreeze", self.mnt, check=False)
            self.frozen = False

    def cleanup(self) -> None:
        if self.mounted:
            _sh(self.fsfreeze, "--unfreeze", self.mnt, check=False)  # whatever the test believed
            if _sh("umount", self.mnt, check=False).returncode != 0:
                _sh("umount", "-l", self.mnt, check=False)
        if self.dev:
            _sh(_tool("losetup"), "-d", self.dev, check=False)


@pytest.fixture
def loopfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("a loop-mounted filesystem needs root")
    fs = Loopfs(tmp_path)
    try:
        fs.make()
        yield fs
    finally:
        fs.cleanup()


class Host:
    """A probed interpreter driven line by line through its stdin, reporting on its stdout. Ends with the
    test: the filesystem thawed first, then the process killed if it is still there."""

    def __init__(self, code: str, env: dict[str, str], fs: Loopfs):
        self.fs = fs
        self.proc = subprocess.Popen([PYTHON, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        self.pid = self.proc.pid
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def said(self, timeout: float) -> str | None:
        """The host's next line, or None if it said nothing within timeout."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def state(self) -> str:
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return "gone"

    def asleep_in_the_filesystem(self, seconds: float) -> None:
        """Wait until the host has slept uninterruptibly (D) for `seconds` in a row."""
        deadline, since = time.monotonic() + BOUND_S, None
        while time.monotonic() < deadline:
            if self.state() == "D":
                since = since or time.monotonic()
                if time.monotonic() - since >= seconds:
                    return
            else:
                since = None
            time.sleep(0.02)
        pytest.fail(f"the host never slept in the frozen filesystem (state {self.state()})")

    def thawed_out(self) -> None:
        """Thaw the filesystem and wait until the host has left it (no longer D): woken, it must still get a
        CPU to leave, and a freeze before that puts it back to sleep (the test's race on a loaded machine,
        not the probe's). Once out, the probe keeps off the filesystem: what follows tests that."""
        self.fs.thaw()
        deadline = time.monotonic() + BOUND_S
        while self.state() == "D" and time.monotonic() < deadline:
            time.sleep(0.005)

    def end(self) -> tuple[int, str]:
        self.fs.thaw()
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode, self.proc.stderr.read()


def wired(tmp_path: Path, log_dir: Path) -> dict[str, str]:
    env = clean_env()
    env.update(ephemeral_env(env, tmp_path / "boot", None))  # the probe's own files: not on the loop filesystem
    env["NCCLPROBE_DIR"] = str(log_dir)
    return env


def lines_of(log_dir: Path, pid: int) -> list[dict]:
    """The lines of one process's file that parse (a torn one is skipped, as readers do); none yet if
    the file is not made yet (its creation was what stalled)."""
    out = []
    path = log_dir / f"{HOST}-{pid}.jsonl"
    for raw in path.read_bytes().splitlines() if path.exists() else ():
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue
    return out


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


# ---------------------------------------------------------------------------- a frozen filesystem

STALLED_HOST = """\
import os, sys, time
print("started", flush=True)
sys.stdin.readline()  # "go": the test froze the log filesystem (or did so before this interpreter started)
t0 = time.monotonic()
for i in range(500):  # the first write sleeps in the frozen filesystem until the test thaws it
    os.environ["NCCL_PROTO"] = "loop-%d" % i
kids = []
for i in range(20):
    pid = os.fork()
    if pid == 0:
        os.environ["NCCL_ALGO"] = "child"
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print("looped %.3f %s" % (time.monotonic() - t0, " ".join(map(str, kids))), flush=True)
sys.stdin.readline()  # "thawed"
n = 0
while not select_ready():  # until the test says "stop": one write every 0.1 s
    n += 1
    os.environ["NCCL_PROTO"] = "after-%d" % n
print("stopped", flush=True)
"""
STALLED_HOST = STALLED_HOST.replace("import os, sys, time", "import os, select, sys, time\n"
                                    "def select_ready():\n"
                                    "    return select.select([sys.stdin], [], [], 0.1)[0]")


@pytest.mark.parametrize("frozen_at", ["start", "write", "start, stopped"])
def test_a_frozen_log_filesystem_stalls_the_host_once_then_never(tmp_path, loopfs, frozen_at):
    """Frozen before the interpreter starts (its log file cannot be created) or while it runs: the host
    sleeps once, until the test thaws the filesystem and freezes it again at once. From then on its
    500 os.environ writes and 20 forks go on while the filesystem stays frozen, and once it is thawed
    the next line written says how many were dropped. "start, stopped": the host is stopped (SIGSTOP) while
    it sleeps, so the thaw lets its stalled step return and no more; the filesystem is frozen again before it
    goes on. The step after it is the probe's own choice: a loaded machine gave the same order now and then
    (the file budget's count was created, then written: a second stall)."""
    log = loopfs.mnt / "log"
    log.mkdir(mode=0o700)
    if frozen_at.startswith("start"):
        loopfs.freeze()
    host = Host(STALLED_HOST, wired(tmp_path, log), loopfs)
    try:
        if frozen_at == "write":
            assert host.said(BOUND_S) == "started"
            loopfs.freeze()
        host.send("go")
        host.asleep_in_the_filesystem(STALL_S)  # the interpreter's start, or its first os.environ write
        if frozen_at == "start, stopped":
            os.kill(host.pid, signal.SIGSTOP)  # taken as the stalled step returns to Python
            loopfs.thaw()
            wait_for(lambda: host.state() == "T", BOUND_S, "the host stopped once its step returned")
            loopfs.freeze()
            os.kill(host.pid, signal.SIGCONT)
        else:
            host.thawed_out()
            loopfs.freeze()  # the filesystem stalls again: the probe must not touch it now
        if frozen_at.startswith("start"):
            assert host.said(BOUND_S) == "started"
        said = host.said(BOUND_S)
        assert said is not None and said.startswith("looped"), f"the host stalled again ({host.state()})"
        kids = list(map(int, said.split()[2:]))
        loopfs.thaw()
        host.send("thawed")
        dropped = wait_for(lambda: [e for e in lines_of(log, host.pid) if "dropped" in e], 120,
                           "a line that says how many were dropped")
        host.send("stop")
        assert host.said(BOUND_S) == "stopped"
    finally:
        rc, err = host.end()
    assert rc == 0 and err == "", err
    first = dropped[0]
    assert first["ev"] == "env_write" and first["new"].startswith("after-")
    assert first["dropped"] >= 499 + frozen_at.startswith("start")  # the start record too, when it could not be made
    values = [e.get("new") for e in lines_of(log, host.pid)]
    assert not [v for v in values if v and v.startswith("loop-") and v != "loop-0"]  # dropped, not written later
    assert not [p for p in kids if (log / f"{HOST}-{p}.jsonl").exists()]  # the children never touched it
    assert read_dirs([log]).skipped_total == 0


# ---------------------------------------------------------------------------- a full filesystem

FULL_HOST = """\
import os, sys
print("started", flush=True)
sys.stdin.readline()  # the test filled the filesystem
for i in range(300):
    os.environ["NCCL_FILL_%d" % i] = "y" * 150
print("filled", flush=True)
sys.stdin.readline()  # the test made room
os.environ["NCCL_PROTO"] = "after"
print("done", flush=True)
"""


def test_a_full_log_filesystem_drops_and_counts_lines(tmp_path, loopfs):
    log = loopfs.mnt / "log"
    log.mkdir(mode=0o700)
    host = Host(FULL_HOST, wired(tmp_path, log), loopfs)
    try:
        assert host.said(BOUND_S) == "started"
        filler = loopfs.mnt / "filler"
        with open(filler, "wb") as f:  # every free block, as root (no reserve: mkfs -m 0)
            chunk = b"\0" * (1 << 20)
            try:
                while True:
                    f.write(chunk)
                    f.flush()
            except OSError:
                pass
            try:
                while True:
                    os.write(f.fileno(), b"\0" * 512)
            except OSError:
                pass
        host.send("full")
        assert host.said(BOUND_S) == "filled"
        filler.unlink()
        os.sync()
        host.send("room")
        assert host.said(BOUND_S) == "done"
    finally:
        rc, err = host.end()
    assert rc == 0 and err == "", err
    lines = lines_of(log, host.pid)
    last = lines[-1]
    assert last["ev"] == "env_write" and last["var"] == "NCCL_PROTO" and last["dropped"] > 0
    written = [e["var"] for e in lines if e["ev"] == "env_write"][:-1]
    assert len(written) + last["dropped"] == 300  # each line is written or counted, once
    assert read_dirs([log]).skipped_total <= 1  # at most the one torn line, on a line of its own


# ---------------------------------------------------------------------------- exit, and other threads

EXIT_HOST = """\
import os, sys
print("started", flush=True)
sys.stdin.readline()  # the test froze the log filesystem
for i in range(100):  # the first write sleeps until the test thaws the filesystem (and freezes it again)
    os.environ["NCCL_PROTO"] = "loop-%d" % i
pid = os.fork()
if pid == 0:
    os.environ["NCCL_ALGO"] = "child"
    sys.exit(0)  # a child's interpreter ends normally too
os.waitpid(pid, 0)
print("exiting", flush=True)
sys.exit(7)
"""


def test_a_host_exits_while_its_log_filesystem_stays_frozen(tmp_path, loopfs):
    log = loopfs.mnt / "log"
    log.mkdir(mode=0o700)
    host = Host(EXIT_HOST, wired(tmp_path, log), loopfs)
    try:
        assert host.said(BOUND_S) == "started"
        loopfs.freeze()
        host.send("go")
        host.asleep_in_the_filesystem(STALL_S)
        host.thawed_out()
        loopfs.freeze()
        assert host.said(BOUND_S) == "exiting"
        host.proc.wait(timeout=BOUND_S)  # while the filesystem is still frozen
        assert loopfs.frozen
    finally:
        rc, err = host.end()
    assert rc == 7 and err == "", err


THREADS_HOST = """\
import os, sys, threading
print("started", flush=True)
sys.stdin.readline()  # the test froze the log filesystem
stuck = threading.Thread(target=lambda: os.environ.__setitem__("NCCL_PROTO", "thread"))
stuck.start()  # its write sleeps in the frozen filesystem
sys.stdin.readline()  # it has slept long enough to count as a stall
for i in range(100):  # the main thread's writes are counted, not attempted
    os.environ["NCCL_ALGO"] = "main-%d" % i
pid = os.fork()  # and its fork child does not touch the filesystem either
if pid == 0:
    os.environ["NCCL_ALGO"] = "child"
    os._exit(0)
os.waitpid(pid, 0)
print("main went on", flush=True)
stuck.join()
"""


def test_other_threads_go_on_while_one_is_stalled_in_the_log_filesystem(tmp_path, loopfs):
    log = loopfs.mnt / "log"
    log.mkdir(mode=0o700)
    host = Host(THREADS_HOST, wired(tmp_path, log), loopfs)
    try:
        assert host.said(BOUND_S) == "started"
        loopfs.freeze()
        host.send("go")
        deadline = time.monotonic() + BOUND_S  # the stalled thread (the main one is waiting on stdin)
        while time.monotonic() < deadline and not [t for t in os.listdir(f"/proc/{host.pid}/task")
                                                    if _task_state(host.pid, t) == "D"]:
            time.sleep(0.02)
        assert "D" in [_task_state(host.pid, t) for t in os.listdir(f"/proc/{host.pid}/task")], "no thread stalled"
        time.sleep(STALL_S)  # how long the stall has lasted is the point here: a duration, not a wait
        host.send("stalled")
        said = host.said(BOUND_S)
        assert said == "main went on", f"the main thread stalled too ({host.state()})"
        assert loopfs.frozen
    finally:
        rc, err = host.end()
    assert rc == 0 and err == "", err
    values = [e.get("new") for e in lines_of(log, host.pid)]  # (the stalled line itself: dropped)
    assert not [v for v in values if v and v.startswith("main-")]


def _task_state(pid: int, tid: str) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
