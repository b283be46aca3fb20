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
import threading
import time
from pathlib import Path

from ncclprobe.commands import logdir
from ncclprobe.commands.supervise import printable
from ncclprobe.witnesses.procwatch import Scanner, Sighting

WATCH_ENV = "NCCLPROBE_WATCH_S"
LIVE_ENV = "NCCLPROBE_LIVE_S"
LIVE_SHARE = 0.01  # of one core, at most, for the live reads of the whole tree (unless NCCLPROBE_LIVE_S is set)
WATCH_S = 0.5  # benchmarks/bench_run_watch.py: about 1 % of a core on a 256-process tree, under 2 % on a loaded machine
MAX_WATCH_S = 60.0
JOIN_S = 3.0  # how long stop waits for the last scan
NICE = 10  # the watch yields to CMD on a busy machine (setpriority of its own thread only)
ARG_MAX_CHARS, ARGV_MAX_CHARS = 8192, 256 * 1024  # bounds on what a line holds (readers refuse lines over 1 MiB)
MISSED_SHOWN = 100


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
                 live_s: float | None = None, tracker=None):
        self.host = os.uname().nodename
        self.interval = interval
        self.scanner = scanner or Scanner(os.getpid(), os.urandom(16), exclude=exclude, extra_roots=extra_roots)
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
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._cpu: float | None = None
        self._t0 = time.monotonic()
        self.thread = threading.Thread(target=self._run, name="ncclprobe-watch", daemon=True)

    def start(self) -> None:
        self._t0 = time.monotonic()
        self.thread.start()

    def stop(self, reaped=(), started=()) -> dict:
        """End the watch after one last scan; `reaped`: (pid, start ticks) of what run's subreaper
        reaped, `started`: the pids run started (CMD), to count those no scan saw. The summary."""
        self._reaped, self._started = list(reaped), list(started)
        self._stop.set()
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
            self._scan(final=True)  # the last look, once run is done with CMD's tree
        except BaseException as exc:  # never out of the thread (threading would print it)
            self._failed(exc)
        finally:
            self._cpu = time.thread_time()
            self._finish(stuck=False)

    def _scan(self, final: bool = False) -> None:
        try:
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
                missed = sc.missed(self._reaped, self._started)
                seen = len(sc.seen)
            except RuntimeError:  # a stuck thread changed them meanwhile
                missed, seen = None, None
            self.summary = {
                "scans": sc.scans, "walks": sc.walks, "interval_s": self.interval, "seen": seen,
                "missed_known": None if missed is None else len(missed),
                "missed_pids": None if missed is None else missed[:MISSED_SHOWN],
                "cpu_s": None if cpu is None else round(cpu, 4),
                "wall_s": round(time.monotonic() - self._t0, 3), "reader": sc.reader,
                "errors": self.errors, "error": self.error, "lost_lines": self.file.lost, "stuck": stuck}
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


def start(log_dir: Path, group, environ, live: bool = False) -> tuple[Watch | None, list[str]]:
    """The watch of a supervise.Group's tree, started (None when off or when it cannot start), and
    what to say about it in the report's header; `live`: it also reads the tree's live environments."""
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
    try:
        watch = Watch(log_dir, interval, exclude=frozenset(pid for pid, _ in group.tree.foreign),
                      extra_roots=group.outcome.subreaper is not None, live=live, live_s=live_s)
        watch.start()
    except Exception as exc:  # never fatal: CMD runs, the probes still report
        return None, notes + [f"the /proc watch did not start ({type(exc).__name__}: {exc})"]
    return watch, notes
