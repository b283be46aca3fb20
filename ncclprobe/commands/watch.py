"""`ncclprobe run`'s watch of CMD's tree from /proc, while CMD runs: every process that appears under
run (Python or not; orphans too, run being their child subreaper) is recorded once, when a scan first
sees it (witnesses/procwatch.py), as a `proc_seen` event in the run's log directory, and at the end a
`watch_summary` (witnesses/events.py has both).

The watch is a thread of its own, niced, with every signal blocked (they are the supervisor's, on the
main thread), that scans every NCCLPROBE_WATCH_S seconds (WATCH_S by default; 0 turns it off): CMD
never waits for it, and a /proc read that blocks (a process stuck with its mm locked) holds up only
the watch. It ends with one last scan when run is done with CMD's tree (stop), on every way
supervise.Group ends; a watch that does not end within JOIN_S is left behind (a daemon thread) and
the summary says it was stuck. A failure of a scan is counted, never raised; should run itself be
killed, what was written stays and the summary is missing.

With `run --live`, the watch also reads the environment each process of the tree holds now from its
memory (witnesses/livewatch.py: the watched names only) and records a `live_env` event where it
changed: every process it records is read in the scan that records it, and every process of the tree
at the first scan after the last read of the whole tree had cost its share (LIVE_SHARE: that read's CPU
time over LIVE_SHARE seconds later; a read of 256 processes costs ~15 ms, so about every 1.5 s, and a
small tree at every scan), or every NCCLPROBE_LIVE_S seconds where that is set, and at the last scan.

Its file is `<host>-<run's pid>.jsonl` under the log discipline (logdir.LogFile); each line names the
observed process in `pid`.
"""
from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path

from ncclprobe.commands import logdir
from ncclprobe.commands.supervise import printable
from ncclprobe.witnesses import kernelevents
from ncclprobe.witnesses.procwatch import Scanner, Sighting
from ncclprobe.witnesses.reaping import Reaping

WATCH_ENV = "NCCLPROBE_WATCH_S"
KERNEL_ENV = "NCCLPROBE_WATCH_KERNEL"  # "0": scans only, even where the kernel would give its process events
KERNEL_WAIT_S = 0.2  # how long the kernel-event thread waits for an event before it looks whether to stop
# While the kernel's events are followed, run's threads hand over the GIL this often (Python's default is 5 ms):
# a process that lives 10 ms must be read within that, and run's other threads (the scans, the supervisor) are
# not to hold it up. run computes nothing: the cost is a few more switches of threads that mostly wait.
SWITCH_S = 0.0005
LIVE_ENV = "NCCLPROBE_LIVE_S"
LIVE_SHARE = 0.01  # of one core, at most, for the live reads of the whole tree (unless NCCLPROBE_LIVE_S is set)
WATCH_S = 0.5  # benchmarks/bench_run_watch.py: about 1 % of a core on a 256-process tree, under 2 % on a loaded machine
MAX_WATCH_S = 60.0
JOIN_S = 3.0  # how long stop waits for the last scan
NICE = 10  # the watch yields to CMD on a busy machine (setpriority of its own thread only)
ARG_MAX_CHARS, ARGV_MAX_CHARS = 8192, 256 * 1024  # bounds on what a line holds (readers refuse lines over 1 MiB)
MISSED_SHOWN = 100
REAPED_SHOWN = 1000  # reaped_unseen: one entry per child counted (a lower bound however cut)


def interval_from_env(environ, name: str = WATCH_ENV, default: float = WATCH_S,
                      zero: str = "off") -> tuple[float, str | None]:
    """The interval in seconds (0: off) and a note when the variable held something else."""
    raw = environ.get(name)
    if raw is None:
        return default, None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_WATCH_S:  # NaN fails both
        return default, (f"{name}={printable(raw)} is not a number of seconds from 0 ({zero}) to "
                         f"{MAX_WATCH_S:g}; using {default:g}")
    return value, None


def live_from_env(environ) -> tuple[float | None, str | None]:
    """How often --live reads the whole tree (0: at every scan; None: as LIVE_SHARE allows), and a
    note on a bad value."""
    if environ.get(LIVE_ENV) is None:
        return None, None
    value, note = interval_from_env(environ, LIVE_ENV, math.nan, "every scan")
    if note:
        return None, note.replace("using nan", f"reading at most {LIVE_SHARE:.0%} of a core")
    return value, None


class Watch:
    """The watch of the tree under this process (less `exclude` and what is under it)."""

    def __init__(self, log_dir: Path, interval: float, exclude: frozenset[int] = frozenset(),
                 extra_roots: bool = False, scanner: Scanner | None = None, live: bool = False,
                 live_s: float | None = None, tracker=None, listener: kernelevents.Listener | None = None):
        self.host = os.uname().nodename
        self.exclude = frozenset(exclude)
        self.listener = listener if listener is not None and listener.sock is not None else None
        self.refused = listener.refused if listener is not None else None
        self._scan_lock = threading.Lock()  # the scans and the kernel-event thread's reads share the scanner
        self.kernel_reads, self._kernel_cpu = 0, 0.0
        self._kernel_whole = False  # the kernel thread ended at stop, having lost no event (_kernel)
        self.kthread = (threading.Thread(target=self._kernel, name="ncclprobe-kernel", daemon=True)
                        if self.listener is not None else None)
        self._wake = os.pipe() if self.kthread is not None else None  # stop() wakes the kernel thread at once
        self.interval = interval
        # scans only: what they missed is counted from what the tree reaped (the kernel's events miss no fork)
        self.scanner = scanner or Scanner(os.getpid(), os.urandom(16), exclude=exclude, extra_roots=extra_roots,
                                          reaping=Reaping() if self.listener is None else None)
        self.live_s = live_s  # the whole tree is read this often (None: as LIVE_SHARE allows); new processes at once
        self.tracker = tracker
        if live and tracker is None:
            from ncclprobe.witnesses.livewatch import Tracker
            self.tracker = Tracker()
        self._next_live = 0.0
        self._exes: dict[int, str | None] = {}
        self._live_cpu = 0.0
        self.file = logdir.LogFile(log_dir, f"{self.host.replace('/', '_')}-{os.getpid()}.jsonl")
        self.errors, self.error = 0, None
        self.summary: dict | None = None
        self._reaped: list[tuple[int, int]] = []
        self._started: list[int] = []
        self._last_reads: dict[tuple[int, int], tuple[float, int]] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._cpu: float | None = None
        self._t0 = time.monotonic()
        self.thread = threading.Thread(target=self._run, name="ncclprobe-watch", daemon=True)

    def start(self) -> None:
        self.follow()
        self.begin(self.exclude, self.scanner.extra_roots)

    def follow(self) -> None:
        """Start following the kernel's process events (before CMD starts: the first process run forks
        from then on is CMD, the root of what the events follow)."""
        self._t0 = time.monotonic()
        if self.kthread is not None and not self.kthread.is_alive():
            self._switch = sys.getswitchinterval()
            sys.setswitchinterval(min(self._switch, SWITCH_S))
            self.kthread.start()

    def begin(self, exclude: frozenset[int], extra_roots: bool) -> None:
        """Start the scans, once CMD runs (`exclude`: run's own children that are not CMD: the keeper)."""
        self.exclude = self.scanner.exclude = frozenset(exclude)
        self.scanner.extra_roots = extra_roots
        self.thread.start()

    @property
    def mode(self) -> str:
        return "kernel" if self.listener is not None else "scan"

    def _kernel_complete(self) -> bool:
        """Whether every exec of CMD's tree came as the kernel's event and was taken: then what no read saw
        and that exec'd nothing ran its parent's program with its parent's block (Scanner.missed)."""
        return self.kthread is not None and not self.kthread.is_alive() and self._kernel_whole

    def stop(self, reaped=(), started=(), last_reads=None) -> dict:
        """End the watch after one last scan; `reaped`: (pid, start ticks) of what run's subreaper
        reaped, `started`: the pids run started (CMD), to count those no scan saw; `last_reads`: (pid, start
        ticks) -> (when, cminflt) of what run read as zombies before it reaped them. The summary."""
        self._reaped, self._started, self._last_reads = list(reaped), list(started), dict(last_reads or {})
        self._stop.set()
        if self._wake is not None:
            os.write(self._wake[1], b"x")  # (a pipe of ours, open until here: nothing else has its number)
        if self.kthread is not None and self.kthread.ident is not None:
            self.kthread.join(JOIN_S)
            sys.setswitchinterval(self._switch)
        if self._wake is not None and not (self.kthread is not None and self.kthread.is_alive()):
            for fd in self._wake:  # closed here, after the thread: never while it may still select on it
                os.close(fd)
            self._wake = None
        if self.thread.ident is None:  # never begun (CMD did not start): the kernel's part alone
            self._finish(stuck=False)
            return self.summary or {}
        self.thread.join(JOIN_S)
        if self.thread.is_alive():
            self._finish(stuck=True)
        return self.summary or {}

    # -- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            try:
                tid = threading.get_native_id()
                os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + NICE))
            except (OSError, AttributeError):
                pass
            while not self._stop.is_set():
                self._scan()
                self._stop.wait(self.interval)
            if self.kthread is not None and self.kthread.ident is not None:
                self.kthread.join(JOIN_S)  # its reads before the last look, and its CPU in the summary
            self._scan(final=True)  # the last look, once run is done with CMD's tree
        except BaseException as exc:  # never out of the thread (threading would print it)
            self._failed(exc)
        finally:
            self._cpu = time.thread_time()
            self._finish(stuck=False)

    def _kernel(self) -> None:
        """The kernel's process events: each process of CMD's tree read at its exec. The tree is the first
        process this one (run) forks once following (CMD: run forks its keeper only after), and every
        process forked from one in the tree; orphans stay in it, whoever adopts them."""
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            sc, lst, wake = self.scanner, self.listener, self._wake[0]
            tree: set[int] = set()
            cmd = None
            while True:
                stopping = self._stop.is_set()
                # once stopping: what the kernel queued before run stopped the watch, read without waiting
                for e in lst.read(0, None) if stopping else lst.read(KERNEL_WAIT_S, wake):
                    if e.what == kernelevents.FORK:
                        if e.pid != e.tgid:
                            continue  # a thread
                        if cmd is None and e.ppid == sc.root:
                            cmd = e.tgid
                            tree.add(cmd)
                        elif e.ppid in tree:
                            tree.add(e.tgid)
                    elif e.what == kernelevents.EXEC:
                        if e.tgid in tree:
                            self._exec(e.tgid)
                    elif e.what == kernelevents.EXIT and e.pid == e.tgid and e.tgid in tree:
                        tree.discard(e.tgid)
                        self._exit(e)
                if stopping:
                    break
            self._kernel_whole = not lst.overruns  # every exec of the tree was taken (read, or vanished)
        except BaseException as exc:
            self._failed(exc)
        finally:
            self._kernel_cpu = time.thread_time()
            self.listener.close()

    def _exit(self, e: kernelevents.Event) -> None:
        """proc_exit of a process recorded (when it ended: a worker that retired before others started is no
        worker of the job's end)."""
        try:
            with self._scan_lock:
                start = self.scanner.start_of(e.tgid)
            if start is None:
                return
            t = time.time() - time.monotonic() + e.t_ns / 1e9 if e.t_ns else time.time()
            event = {"ev": "proc_exit", "t": round(t, 6), "host": self.host, "pid": e.tgid, "src": "proc", "start": start}
            self._write([(json.dumps(event, separators=(",", ":")) + "\n").encode("ascii")])
        except Exception as exc:
            self._failed(exc)

    def _exec(self, pid: int) -> None:
        try:
            with self._scan_lock:
                s = self.scanner.take_exec(pid)
            if s is None:
                return
            self.kernel_reads += 1
            self._write([self._line(s)])
        except Exception as exc:
            self._failed(exc)

    def _scan(self, final: bool = False) -> None:
        try:
            with self._scan_lock:
                found = self.scanner.scan(final)
            lines = [self._line(s) for s in found]
        except Exception as exc:
            self._failed(exc)
            return
        self._write(lines)
        if self.tracker is None:
            return
        try:  # after the sightings: a process's live_env lines follow its proc_seen
            lines = self._live(found, final)
        except Exception as exc:
            self._failed(exc)
            return
        self._write(lines)

    def _write(self, lines: list[bytes]) -> None:
        """Lines into the file, unless the summary (the file's last line) is already written."""
        with self._lock:
            if self.summary is None:
                self.file.write_lines(lines)

    def _live(self, found: list[Sighting], final: bool) -> list[bytes]:
        """The live_env lines of this scan: the processes it recorded, and, when a read of the whole
        tree is due, every process recorded that still runs (not a fork child held back, not a zombie)."""
        sc, t0 = self.scanner, time.thread_time()
        for s in found:
            self._exes[s.pid] = s.exe
        now = time.monotonic()
        targets = {s.pid: (s.pid, s.start_ticks, s.execs, s.exe) for s in found}
        whole = final or now >= self._next_live
        if whole:
            alive = set()
            for pid, (ticks, _, execs) in list(sc.known.items()):
                if (pid, ticks) in sc.seen and pid not in sc.pending and (pid, ticks) not in sc.zombies:
                    alive.add((pid, ticks))
                    targets.setdefault(pid, (pid, ticks, execs, self._exes.get(pid)))
            self.tracker.forget(alive | {(s.pid, s.start_ticks) for s in found})
            self._exes = {pid: exe for pid, exe in self._exes.items() if pid in targets}
        changes = self.tracker.read(list(targets.values()))
        if whole:  # the next read of the whole tree once this one's cost is within its share
            cost = time.thread_time() - t0
            self._next_live = now + (self.live_s if self.live_s is not None else cost / LIVE_SHARE)
        lines = []
        for c in changes:
            fields = c.fields()
            env, cut = _cut_env(fields["env"])
            event = {"ev": "live_env", "t": c.t, "host": self.host, "pid": c.pid, "src": "proc", **fields, "env": env}
            if cut:
                event["truncated"] = True
            lines.append((json.dumps(event, separators=(",", ":")) + "\n").encode("ascii"))
        self._live_cpu += time.thread_time() - t0
        return lines

    def _unseen_children(self) -> dict[int, int] | None:
        """Pid -> children, at least, that it reaped and no scan saw (witnesses/reaping.py); None with the
        kernel's events, which see every fork."""
        ledger = self.scanner.reaping
        if ledger is None:
            return None
        ledger.reaped(self._last_reads)
        return ledger.unseen()

    def _failed(self, exc: BaseException) -> None:
        self.errors += 1
        self.error = self.error or type(exc).__name__  # its name only: a message may quote what was read

    def _line(self, s: Sighting) -> bytes:
        fields, cut = s.fields(), False
        argv, used = [], 0
        for arg in fields["argv"]:
            if len(arg) > ARG_MAX_CHARS:
                arg, cut = arg[:ARG_MAX_CHARS] + "...[truncated]", True
            used += len(arg)
            if used > ARGV_MAX_CHARS:
                cut = True
                break
            argv.append(arg)
        fields["argv"] = argv
        fields["exec_env"], cut_env = _cut_env(fields["exec_env"])
        cut = cut or cut_env
        event = {"ev": "proc_seen", "t": s.t or time.time(), "host": self.host, "pid": s.pid, "src": "proc", **fields}
        if cut:
            event["truncated"] = True
        return (json.dumps(event, separators=(",", ":")) + "\n").encode("ascii")

    def _finish(self, stuck: bool) -> None:
        """The summary, written once (by the thread at its end, or by stop for a stuck thread)."""
        if not self._lock.acquire(timeout=JOIN_S):
            return
        try:
            if self.summary is not None:
                return
            cpu = self._cpu
            if cpu is None:  # stuck: its CPU clock is still there to read
                try:
                    cpu = time.clock_gettime(time.pthread_getcpuclockid(self.thread.ident))
                except (OSError, AttributeError, TypeError):
                    cpu = None
            sc = self.scanner
            try:
                missed = sc.missed(self._reaped, self._started, kernel=self._kernel_complete())
                seen = len(sc.seen)
                children = self._unseen_children()
            except RuntimeError:  # a stuck thread changed them meanwhile
                missed, seen, children = None, None, None
            self.summary = {
                "scans": sc.scans, "walks": sc.walks, "interval_s": self.interval, "seen": seen,
                "missed_known": None if missed is None else len(missed),
                "missed_pids": None if missed is None else missed[:MISSED_SHOWN],
                "reaped_unseen": None if children is None else [
                    pid for pid in sorted(children) for _ in range(children[pid])][:REAPED_SHOWN],
                "cpu_s": None if cpu is None else round(cpu, 4),
                "wall_s": round(time.monotonic() - self._t0, 3), "reader": sc.reader,
                "errors": self.errors, "error": self.error, "lost_lines": self.file.lost, "stuck": stuck,
                "mode": self.mode, "kernel_refused": self.refused}
            if self.listener is not None:
                self.summary.update(kernel_events=self.listener.events, kernel_reads=self.kernel_reads,
                                    kernel_vanished=len(sc.vanished), kernel_overruns=self.listener.overruns,
                                    kernel_cpu_s=round(self._kernel_cpu, 4), kernel_complete=self._kernel_complete())
            tr = self.tracker
            if tr is not None:
                self.summary.update(live_s=self.live_s, live_reads=tr.reads, live_processes=tr.processes,
                                    live_bytes=tr.bytes, live_cpu_s=round(self._live_cpu, 4),
                                    live_reader="native" if tr.native else "python")
            event = {"ev": "watch_summary", "t": time.time(), "host": self.host, "pid": os.getpid(), "src": "proc",
                     **self.summary}
            self.file.write_lines([(json.dumps(event, separators=(",", ":")) + "\n").encode("ascii")])
            self.file.close()
        finally:
            self._lock.release()


def _cut_env(env: dict[str, str] | None) -> tuple[dict[str, str] | None, bool]:
    """env with each value cut at ARG_MAX_CHARS (a copy where one is: the callers share their dicts)."""
    if not env or not any(len(v) > ARG_MAX_CHARS for v in env.values()):
        return env, False
    return {k: v if len(v) <= ARG_MAX_CHARS else v[:ARG_MAX_CHARS] + "...[truncated]" for k, v in env.items()}, True


def listener(environ) -> kernelevents.Listener | None:
    """The kernel's process events for the watch, subscribed now (before CMD starts); None where the watch
    is off or NCCLPROBE_WATCH_KERNEL=0. A Listener the kernel refused says why (the watch then scans only)."""
    if interval_from_env(environ)[0] == 0 or environ.get(KERNEL_ENV) == "0":
        return None
    try:
        return kernelevents.Listener()
    except Exception:  # never fatal: the scans remain
        return None


def prepare(log_dir: Path, environ, live: bool = False) -> tuple[Watch | None, list[str]]:
    """The watch of the tree run is about to start (None when off or when it cannot be made), following the
    kernel's process events already where the kernel gives them (begin() starts its scans once CMD runs),
    and what to say about it in the report's header; `live`: it also reads the tree's live environments."""
    interval, note = interval_from_env(environ)
    notes = [note] if note else []
    live_s = None
    if live:
        live_s, live_note = live_from_env(environ)
        notes += [live_note] if live_note else []
    if interval == 0:
        return None, notes + [f"the /proc watch is off ({WATCH_ENV}=0): processes the probes do not see "
                              "(not Python, no boot probe) are not in the report"
                              + ("; --live reads through the watch, so it is off too" if live else "")]
    lst = None
    try:
        lst = listener(environ)
        watch = Watch(log_dir, interval, live=live, live_s=live_s, listener=lst)
        watch.follow()
    except Exception as exc:  # never fatal: CMD runs, the probes still report
        if lst is not None:
            lst.close()
        return None, notes + [f"the /proc watch did not start ({type(exc).__name__}: {exc})"]
    return watch, notes


def begin(watch: Watch | None, group) -> list[str]:
    """The prepared watch's scans, started on a supervise.Group's tree; what to say where they could not."""
    if watch is None:
        return []
    try:
        watch.begin(frozenset(pid for pid, _ in group.tree.foreign), group.outcome.subreaper is not None)
    except Exception as exc:  # never fatal: CMD runs, the probes still report
        return [f"the /proc watch did not start ({type(exc).__name__}: {exc})"]
    return []
