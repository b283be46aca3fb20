"""The keeper (ncclprobe/commands/keeper.py) when `ncclprobe run` is SIGKILLed: it keeps ending what the
tree starts after the supervisor's last scan, as run's own stop path does — here a process whose SIGTERM
handler forks a child that leaves the session (setsid) and sleeps, the parent staying on or exiting at
once (then the child is an orphan of init before anyone could see its ppid link).

Real processes; every process of a test carries the test's tmp_path in its argv or environment (a fork
child keeps its parent's), so a /proc scan says what is left, and the test's `finally` SIGKILLs it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from test_run_watch import wait_until

WAIT_S = 60  # generous: a loaded 2-core machine is slow; nothing here waits for a timeout to pass
NCCLPROBE = [sys.executable, "-m", "ncclprobe"]

# CMD: on SIGTERM, fork a child that leaves the session and sleeps on (it ignores SIGTERM: the handler
# it inherits does nothing in it); then the parent stays (mode "stay") or exits at once ("exit"). In
# mode "double" a middle process forks the child and exits at once (the parent stays): the child's only
# ppid link to the tree lasts as long as that middle process, a millisecond or so.
SCRIPT = """
import os, pathlib, signal, sys, time
here, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
me = os.getpid()
def child():
    os.setsid()
    fd = os.open(os.devnull, os.O_RDWR)
    for i in (0, 1, 2):
        os.dup2(fd, i)
    (here / "child.tmp").write_text(str(os.getpid()))
    os.rename(here / "child.tmp", here / "child")
    while True:
        time.sleep(1)
def on_term(signum, frame):
    if os.getpid() != me:
        return
    pid = os.fork()
    if pid == 0:
        if mode == "double" and os.fork() != 0:
            os._exit(0)
        child()
    if mode == "double":
        os.waitpid(pid, 0)
    if mode == "exit":
        os._exit(0)
signal.signal(signal.SIGTERM, on_term)
(here / "ready").write_text(str(me))
while True:
    time.sleep(1)
"""


def marked(marker: str) -> list[int]:
    """Live (not zombie) processes whose argv or environment holds marker."""
    out, needle = [], marker.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
            with open(f"/proc/{name}/cmdline", "rb") as f:
                seen = needle in f.read()
            if not seen:
                with open(f"/proc/{name}/environ", "rb") as f:
                    seen = needle in f.read()
        except (OSError, IndexError):
            continue
        if seen and state not in (b"Z", b"X"):
            out.append(int(name))
    return out


def kill_marked(marker: str) -> None:
    for pid in marked(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.parametrize("mode", ["stay", "exit", "double"])
def test_a_child_forked_on_sigterm_after_run_is_killed_is_ended_too(tmp_path, mode):
    marker = str(tmp_path)  # in every argv of the test's processes: run's --dir, the script's path and arg
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    err = tmp_path / "run.err"
    env = {**os.environ, "NCCLPROBE_RUN_GRACE_S": "1"}
    with open(err, "wb") as errf:
        run = subprocess.Popen([*NCCLPROBE, "run", "--dir", str(tmp_path / "logs"), "--", sys.executable,
                                str(script), str(tmp_path), mode], env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=errf)
    try:
        wait_until(lambda: (tmp_path / "ready").exists() or run.poll() is not None, lambda: err.read_text())
        assert run.poll() is None, err.read_text()
        run.kill()
        run.wait(timeout=WAIT_S)
        # the handler ran (the keeper sent SIGTERM) and its child left the session ...
        child = int(wait_until(lambda: (tmp_path / "child").exists() and (tmp_path / "child").read_text(),
                               lambda: f"the keeper never sent SIGTERM: {err.read_text()}"))
        # ... and within the bound nothing of the tree is left, the child included
        wait_until(lambda: not marked(marker),
                   lambda: f"left running: {marked(marker)} (child {child}); run's stderr: {err.read_text()}")
        assert "the supervisor is gone" in err.read_text()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        kill_marked(marker)


from users import other_user  # noqa: E402,F401  (a fixture)

ORPHAN = ("import subprocess, sys; d = subprocess.DEVNULL; "
          "p = subprocess.Popen(['sleep', '600'], env={'NCCLPROBE_DIR': sys.argv[2], 'PATH': '/usr/bin:/bin'}, "
          "user=int(sys.argv[3]), start_new_session=True, stdin=d, stdout=d, stderr=d); print(p.pid)")


def orphan(marker: str, value: str, uid: int) -> int:
    """A sleeping process whose parent has exited (no ppid link to anyone here), environment NCCLPROBE_DIR=value."""
    out = subprocess.run([sys.executable, "-c", ORPHAN, marker, value, str(uid)], capture_output=True, text=True,
                         timeout=WAIT_S, check=True)
    return int(out.stdout)


def ticks(pid: int) -> int:
    from ncclprobe.witnesses.procs import ProcFS
    return ProcFS().stat(pid).start_ticks


def test_the_mark_finds_a_later_process_of_this_user_only(tmp_path, other_user):
    """supervise.Mark, as the keeper uses it: a process with no ppid link to the tree is the tree's only
    if it was started since the run began, runs as the run's euid and its environment holds the entry."""
    from ncclprobe.commands.supervise import Mark, Tree
    marker, value = str(tmp_path), str(tmp_path / "logs")
    try:
        before = orphan(marker, value, os.geteuid())
        wait_until(lambda: time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK") > ticks(before) + 1,
                   lambda: "the clock did not tick")
        ours = orphan(marker, value, os.geteuid())
        since = ticks(ours)
        other = orphan(marker, value, other_user)
        elsewhere = orphan(marker, value + "-another", os.geteuid())
        assert since > ticks(before)
        tree = Tree(mark=Mark(f"NCCLPROBE_DIR={value}".encode(), since, os.geteuid()))
        found = {m.pid for m in tree.live()}
        assert ours in found and not found & {before, other, elsewhere}, (found, ours, before, other, elsewhere)
    finally:
        kill_marked(marker)
