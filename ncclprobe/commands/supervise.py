"""A command's whole process tree, kept under one supervisor (`ncclprobe run`, the demo).

The supervising process becomes a child subreaper, so a descendant that leaves CMD's process group or
session (start_new_session, setsid, a double-forking daemon) is reparented to it when its parent dies
(prctl(2) PR_SET_CHILD_SUBREAPER: orphans go to the nearest living subreaper ancestor, not to init),
and stays findable through /proc ppid links; each scan also records what it found, so a process that
left the tree anyway (no subreaper) is still known by pid and start time.

Signals: the first INT/TERM/HUP/QUIT goes to CMD's process group, as a terminal would send it; what
still runs after the grace gets SIGTERM, then SIGKILL after the grace again; each further signal takes
the next step at once. USR1/USR2 are passed on. After a normal exit of CMD the rest of its tree is left
running and listed; after a stop request, or when CMD was killed by a signal, all of it is ended.
Should this process be killed outright, its keeper (keeper.py) ends the tree instead, by the same
stop path (Group.ending), finding the tree's orphans by its Mark where no ppid link is left.
"""
from __future__ import annotations

import ctypes
import math
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field
from ncclprobe.witnesses.procs import ProcFS, Stat

PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37  # include/uapi/linux/prctl.h (Linux >= 3.4)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
PASSED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
GRACE_S = 5.0
GRACE_ENV = "NCCLPROBE_RUN_GRACE_S"  # seconds between the steps of a stop (tests make it short)
KILL_WAIT_MIN_S = 2.0  # after SIGKILL: a process releasing GPU memory can take seconds to go
POLL_S = 0.1
RECORD_S = 2.0  # how often a running tree is scanned; the subreaper, not this, keeps orphans found
NAMES_SHOWN = 6
MARK_VAR = "NCCLPROBE_DIR"  # run gives CMD its own log directory: the keeper's Mark of the tree
RUNNING, FORWARDED, TERMINATING, KILLING, GIVEN_UP = range(5)


def grace_from_env(environ) -> tuple[float, str | None]:
    """The grace in seconds, and a note when the variable held something else than 0..3600."""
    raw = environ.get(GRACE_ENV)
    if raw is None:
        return GRACE_S, None
    try:
        grace = float(raw)
    except ValueError:
        grace = math.nan
    if not 0 <= grace <= 3600:  # NaN fails both comparisons
        return GRACE_S, f"{GRACE_ENV}={printable(raw)} is not a number of seconds from 0 to 3600; using {GRACE_S:g}"
    return grace, None


def printable(text: str) -> str:
    """Control characters escaped (\\r, \\x1b): names and paths from elsewhere never drive the terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def set_subreaper(on: int) -> str | None:
    """None once this process's child-subreaper flag is `on`, else why it could not be set."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, on, 0, 0, 0) != 0:
            return os.strerror(ctypes.get_errno())
    except (OSError, AttributeError):  # no libc prctl: not Linux
        return "prctl is not available"
    return None


def get_subreaper() -> int:
    flag = ctypes.c_int(0)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    return flag.value


@dataclass(frozen=True)
class Member:
    """One process of the tree: a pid with its start time (pids are reused) and the kernel's short
    name (comm: never argv, which may hold secrets)."""
    pid: int
    start: int
    name: str

    def to_json(self) -> dict:
        return {"pid": self.pid, "name": self.name}

    def label(self) -> str:
        return f"pid {self.pid} ({self.name})"


@dataclass(frozen=True)
class Mark:
    """How the keeper knows the tree without ppid links (it is no subreaper ancestor of the tree: when
    run dies, an orphan goes to init, prctl(2) PR_SET_CHILD_SUBREAPER): a process started since `since`
    (run's start, in clock ticks), of euid `uid`, whose exec-time environment holds `entry`
    (NAME=value): a fork child's environ is its parent's (a copy of its memory), and an exec passes it
    on unless the caller clears it. Used only where that entry is the tree's alone (run's own
    environment does not hold it): NCCLPROBE_DIR naming run's log directory."""
    entry: bytes
    since: int
    uid: int

    def holds(self, fs: ProcFS, pid: int) -> bool:
        try:
            if fs.uid(pid) != self.uid:
                return False
            return (b"\0" + self.entry + b"\0") in b"\0" + fs.reader.read_bytes(fs.path(pid, "environ")) + b"\0"
        except OSError:  # gone, a kernel thread (empty), or not ours to read
            return False


def labels(members, limit: int = NAMES_SHOWN) -> str:
    members = sorted(members, key=lambda m: m.pid)
    shown = ", ".join(m.label() for m in members[:limit])
    return shown + (f" and {len(members) - limit} more" if len(members) > limit else "")


class Tree:
    """Every process started under this one since the Tree was made (children it already had are
    another caller's, left out with all under them)."""

    def __init__(self, fs: ProcFS | None = None, mark: Mark | None = None):
        self.fs = fs or ProcFS()
        self.me = os.getpid()
        self.popen_pid: int | None = None  # Popen reaps CMD itself; reaping it here would lose its code
        self.seen: dict[int, Member] = {}
        self.foreign = {(st.pid, st.start_ticks) for st in self._stats() if st.ppid == self.me}
        self.on_scan = None  # called with each scan's members (the keeper)
        self.reaped: list[tuple[int, int]] = []  # (pid, start) of the orphans reaped here (the watch counts those it missed)
        # (pid, start) -> (when, cminflt) of CMD and the orphans, read as zombies before they were reaped: the
        # children they reaped since the watch last read them (witnesses/reaping.py)
        self.last_reads: dict[tuple[int, int], tuple[float, int]] = {}
        self.mark = mark
        self._unmarked: set[tuple[int, int]] = set()  # (pid, start) read once and not marked

    def _stats(self) -> list[Stat]:
        out = []
        try:
            pids = self.fs.pids()
        except OSError:
            return out
        for pid in pids:
            try:
                out.append(self.fs.stat(pid))
            except OSError:
                continue  # exited between listdir and read
        return out

    def live(self) -> list[Member]:
        """The tree's running processes now; records them, and reaps the zombies it adopted."""
        stats = self._stats()
        by_pid = {st.pid: st for st in stats}
        kids: dict[int, list[Stat]] = {}
        for st in stats:
            kids.setdefault(st.ppid, []).append(st)
        found: dict[int, Stat] = {}
        # a process recorded earlier that is no longer linked to us (no subreaper) is still ours
        self._walk([self.me] + [m.pid for m in self.seen.values()
                                if m.pid in by_pid and by_pid[m.pid].start_ticks == m.start], by_pid, kids, found)
        if self.mark is not None:  # and, with no ppid link at all, one that carries the tree's mark
            self._walk([st.pid for st in stats if st.pid not in found and self._marked(st)], by_pid, kids, found)
        out = []
        for st in found.values():
            if st.state in ("Z", "X", "x"):
                if st.ppid == self.me and st.pid != self.popen_pid:
                    self.last_reads[(st.pid, st.start_ticks)] = (time.monotonic(), st.child_faults)
                    _reap(st.pid)
                    self.reaped.append((st.pid, st.start_ticks))
                continue
            out.append(Member(st.pid, st.start_ticks, printable(st.comm)))
        self.seen = {m.pid: m for m in out}
        if self.on_scan is not None:
            self.on_scan(out)
        return out

    def _walk(self, roots: list[int], by_pid: dict[int, Stat], kids: dict[int, list[Stat]],
              found: dict[int, Stat]) -> None:
        """Into found: the roots (but this process) and everything under them, less the foreign."""
        for root in roots:
            if root != self.me:
                found.setdefault(root, by_pid[root])
            stack = [root]
            while stack:
                for st in kids.get(stack.pop(), ()):
                    if (st.pid, st.start_ticks) in self.foreign or st.pid in found:
                        continue
                    found[st.pid] = st
                    stack.append(st.pid)

    def _marked(self, st: Stat) -> bool:
        """Whether a process this walk did not reach is the tree's by its mark (each read once)."""
        key = (st.pid, st.start_ticks)
        if st.pid == self.me or st.start_ticks < self.mark.since or key in self._unmarked or key in self.foreign:
            return False
        if self.mark.holds(self.fs, st.pid):
            return True
        self._unmarked.add(key)
        return False

    def read_last(self, pid: int) -> None:
        """A child of ours that has ended and is not reaped yet (CMD): its last read, as a zombie."""
        try:
            st = self.fs.stat(pid)
        except OSError:
            return
        if st.state in ("Z", "X", "x"):
            self.last_reads[(st.pid, st.start_ticks)] = (time.monotonic(), st.child_faults)

    def adopt_foreign(self, pid: int) -> None:
        """A child of ours that is not part of the tree (the keeper)."""
        try:
            self.foreign.add((pid, self.fs.stat(pid).start_ticks))
        except OSError:
            pass

    def send(self, m: Member, sig: int) -> bool:
        """sig to m if the pid still is m (through a pidfd where the kernel has them, so the pid
        cannot be reused between the check and the signal); False if m is gone or refuses."""
        try:
            fd = os.pidfd_open(m.pid)
        except ProcessLookupError:
            return False
        except (AttributeError, OSError):  # Python < 3.9 or Linux < 5.3: check, then kill by pid
            fd = None
        try:
            if self.fs.stat(m.pid).start_ticks != m.start:
                return False
            if fd is None:
                os.kill(m.pid, sig)
            else:
                signal.pidfd_send_signal(fd, sig)
            return True
        except OSError:  # gone (ESRCH, ENOENT) or not ours to signal (EPERM)
            return False
        finally:
            if fd is not None:
                os.close(fd)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Python < 3.9, Linux < 5.3 (or CMD gone and reaped: Popen knows)
        return None


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


@dataclass
class Outcome:
    """How the tree ended: what stopped it, whom this process signalled and with what, and what is
    still running (after a normal exit: left on purpose; after a stop: could not be ended)."""
    cause: str | None = None  # "SIGINT", "CMD was killed by SIGKILL", "cleaning up"; None: a normal exit
    signal: str | None = None  # the first stop signal this process received
    stopped: list[dict] = field(default_factory=list)  # {"pid", "name", "signal"}
    left_running: list[Member] = field(default_factory=list)
    subreaper: str | None = None  # why this process could not be a subreaper, if it could not

    def to_json(self) -> dict:
        return {"interrupted_by": self.signal, "stopped": self.stopped,
                "left_running": [m.to_json() for m in self.left_running], "subreaper_error": self.subreaper}


def _stderr(line: str) -> None:
    try:
        os.write(2, (line + "\n").encode("utf-8", "backslashreplace"))
    except OSError:  # stderr closed or a hung-up terminal: the report still says it all
        pass


class Group:
    """CMD in its own session, its whole tree under this process, signals handled as the module says."""

    def __init__(self, cmd: list[str], env: dict[str, str], stdout=None, cwd=None, grace: float = GRACE_S,
                 label: str = "ncclprobe"):
        self._stop_state(Tree(), grace, label)
        self._was_subreaper = get_subreaper()
        self.outcome.subreaper = set_subreaper(1)
        for sig in STOP_SIGNALS + PASSED_SIGNALS:
            if signal.getsignal(sig) is signal.SIG_IGN:  # nohup, `cmd &`: CMD inherits the ignoring, a handler would not survive exec
                continue
            try:
                self._old[sig] = signal.signal(sig, self._on_signal)
            except (ValueError, OSError):  # not the main thread
                pass
        try:
            self.proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=stdout, cwd=cwd)
        except BaseException:
            self._restore()
            raise
        self.tree.popen_pid = self.pgid = self.proc.pid
        self.keeper = _keeper(grace, label, env.get(MARK_VAR))
        if self.keeper is not None:
            self.tree.adopt_foreign(self.keeper.pid)
            self.tree.on_scan = self.keeper.update
        if self.requests:  # a signal came while CMD was being started
            self._killpg(self.requests[0])

    def _stop_state(self, tree: Tree, grace: float, label: str) -> None:
        self.grace, self.label = grace, label
        self.requests: list[int] = []  # stop signals received; the handler only records them
        self.handled = 0
        self.stage, self.deadline = RUNNING, math.inf
        self.signalled: dict[int, tuple[Member, str]] = {}
        self.outcome = Outcome()
        self.pgid: int | None = None
        self._old: dict[int, object] = {}
        self.tree = tree

    @classmethod
    def ending(cls, tree: Tree, grace: float, label: str, cause: str) -> Outcome:
        """The stop path alone, on a tree whose supervisor is gone (the keeper): no command started, no
        signal handled; every process of the tree, and each found at a later scan, ended as _end_all does."""
        group = cls.__new__(cls)
        group._stop_state(tree, grace, label)
        group.outcome.cause = cause
        group._end_all()
        return group.outcome

    def say(self, text: str) -> None:
        _stderr(f"{self.label}: {text}")

    def _on_signal(self, signum, frame):
        if signum in STOP_SIGNALS:
            self.requests.append(signum)
            if len(self.requests) > 1:
                return  # the loop in wait takes the next step
        self._killpg(signum)

    def _killpg(self, signum: int) -> None:
        if self.pgid is None:
            return
        try:
            os.killpg(self.pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self) -> int | None:
        """Until CMD has ended and, after a stop request, its whole tree. CMD's Popen returncode, or
        None when even SIGKILL did not end it."""
        pidfd = _pidfd(self.proc.pid)
        try:
            next_record = 0.0
            while self.proc.returncode is None and self.stage != GIVEN_UP:
                self._step()
                if self.stage >= TERMINATING:  # a process started during a stop gets its signal too
                    self._sweep(self.tree.live())
                elif time.monotonic() >= next_record:
                    self.tree.live()
                    next_record = time.monotonic() + RECORD_S
                self._wait_cmd(pidfd)
            self._step()  # a signal that came as CMD ended is announced too
            rc = self.proc.returncode
            if self.requests:
                self.outcome.cause = self.outcome.signal = signal.Signals(self.requests[0]).name
            elif rc is not None and rc < 0:
                self.outcome.cause = f"CMD was killed by {_signame(-rc)}"
            if self.outcome.cause is None:
                self.outcome.left_running = self.tree.live()
            else:
                self._end_all()
            return rc
        finally:
            if pidfd is not None:
                os.close(pidfd)
            self._restore()

    def _wait_cmd(self, pidfd: int | None) -> None:
        """Up to POLL_S for CMD to end; once it has, its last read as a zombie before Popen reaps it. Without a
        pidfd (Linux < 5.3), Popen's wait, which reaps at once: the zombie is not read."""
        if pidfd is None:
            try:
                self.proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
            return
        if select.select([pidfd], [], [], POLL_S)[0]:  # readable once CMD has ended (pidfd_open(2)); reaps nothing
            self.tree.read_last(self.proc.pid)
            self.proc.wait()

    def reap_group(self) -> None:
        """End the whole tree now (the caller failed before wait returned): SIGTERM, SIGKILL after the grace."""
        try:
            self.outcome.cause = self.outcome.cause or "cleaning up"
            self._end_all()
        finally:
            self._restore()

    def _end_all(self) -> None:
        left = self.tree.live()
        if self.stage < TERMINATING:
            if not left:
                return
            self._escalate(self.outcome.cause, left)
        empty_scans = 0
        while self.stage != GIVEN_UP and empty_scans < 2:  # two empty scans: none was missed mid-scan
            self._step()
            left = self.tree.live()
            empty_scans = empty_scans + 1 if not left else 0
            self._sweep(left)
            time.sleep(POLL_S)
        still = set(left)
        self.outcome.stopped = [{**m.to_json(), "signal": sig} for m, sig in self.signalled.values() if m not in still]

    def _step(self) -> None:
        """Act on the signals received since the last step, and on a deadline that has passed."""
        while self.handled < len(self.requests):
            name = signal.Signals(self.requests[self.handled]).name
            self.handled += 1
            if self.stage == RUNNING:
                self.stage, self.deadline = FORWARDED, time.monotonic() + self.grace
                self.say(f"{name}: forwarded to CMD; what still runs gets SIGTERM in {self.grace:g} s, "
                         f"SIGKILL {self.grace:g} s later ({name} again: sooner)")
            else:
                self._escalate(f"{name} again" if self.handled > 1 else name)
        if time.monotonic() >= self.deadline:
            waited = self._kill_wait() if self.stage == KILLING else self.grace
            after = {FORWARDED: signal.Signals(self.requests[0]).name if self.requests else "",
                     TERMINATING: "SIGTERM", KILLING: "SIGKILL"}[self.stage]
            self._escalate(f"still running {waited:g} s after {after}")

    def _kill_wait(self) -> float:
        return max(self.grace, KILL_WAIT_MIN_S)

    def _escalate(self, why: str, left: list[Member] | None = None) -> None:
        """The next step of a stop: SIGTERM to the whole tree, then SIGKILL, then giving up."""
        left = self.tree.live() if left is None else left
        if self.stage < TERMINATING:
            self.stage, self.deadline = TERMINATING, time.monotonic() + self.grace
            self.say(f"{why}: stopping {len(left)} process(es): SIGTERM now, SIGKILL in {self.grace:g} s")
        elif self.stage == TERMINATING:
            self.stage, self.deadline = KILLING, time.monotonic() + self._kill_wait()
            self.say(f"{why}: SIGKILL now to {len(left)} process(es): {labels(left)}")
        else:
            self.stage, self.deadline = GIVEN_UP, math.inf
            self.say(f"{why}: could not end {len(left)} process(es): {labels(left)}")
        self._sweep(left)

    def _sweep(self, left: list[Member]) -> None:
        """The stage's signal to each process that has not had it (SIGKILL: to every one, every time)."""
        if self.stage == TERMINATING:
            for m in left:
                if m.pid not in self.signalled and self.tree.send(m, signal.SIGTERM):
                    self.signalled[m.pid] = (m, "SIGTERM")
                    self.tree.send(m, signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
        elif self.stage == KILLING:
            for m in left:
                if self.tree.send(m, signal.SIGKILL):
                    self.signalled[m.pid] = (m, "SIGKILL")
        elif self.stage == GIVEN_UP:
            self.outcome.left_running = left

    def _restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}
        set_subreaper(self._was_subreaper)
        if getattr(self, "keeper", None) is not None:
            self.keeper.close()
            self.keeper = None


KEEPER_CAUSE = "the supervisor is gone; ending the tree it ran"


def take_over(members: dict[int, int], mark: tuple[bytes, int, int] | None, grace: float, label: str) -> None:
    """In the keeper, once the supervisor is gone: its stop path on the tree it last scanned (pid ->
    start time), re-scanned from those members and by the mark until it is empty or the steps run out."""
    tree = Tree(mark=Mark(*mark) if mark is not None else None)
    tree.seen = {pid: Member(pid, start, "") for pid, start in members.items()}
    Group.ending(tree, grace, label, KEEPER_CAUSE)


def _keeper(grace: float, label: str, mark_value: str | None):
    """The keeper that ends the tree should this process be killed (keeper.py); None where none can start.
    mark_value: CMD's MARK_VAR, the tree's mark (Mark) unless this process's environment holds it too."""
    from ncclprobe.commands.keeper import Keeper
    mark = None
    if mark_value and os.environ.get(MARK_VAR) != mark_value:
        try:
            mark = Mark(os.fsencode(f"{MARK_VAR}={mark_value}"), ProcFS().stat(os.getpid()).start_ticks, os.geteuid())
        except (OSError, UnicodeError):
            mark = None
    try:
        return Keeper(grace, label, mark)
    except OSError:
        return None


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
