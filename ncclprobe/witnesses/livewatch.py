"""What `run --live`'s watch reads of the live environments of a watched tree (commands/watch.py):
at a read, the watched variables each process of the tree holds now, read from its memory
(livemem.Reading, natively in one call for the tree), and of those only the changes: a process's
first successful reading, then a reading each time its watched live environment differs from the
last one recorded for it, and one reason where it could not be read before any reading (permission,
a static binary without symbols, gone...).

A change carries `since`: the start of the latest read of that process that still showed the old
environment (None for the first reading), and `t`: the end of the read that showed the new one, so
a write it shows was made in (since, t]. A read of many processes is one call: the start of the call
is a bound below each process's snapshot, its end one above (livemem.LiveEnv.t is the end too).

A process is one image: its pid, start time and exec count (procwatch.Scanner's); an exec starts
over with a first reading. Only names of the watched set are read (livemem.Names with
model.watched.is_watched); nothing else of the target is decoded, let alone kept.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ncclprobe.witnesses import livemem

_KEPT_MAX = 1 << 16  # images whose last reading is kept; more (a tree that churns) starts over


@dataclass(frozen=True)
class Change:
    """One live_env event's own fields (witnesses/events.py)."""
    pid: int
    execs: int
    env: dict[str, str] | None   # the watched variables now; None: not read (reason)
    reason: str | None
    since: float | None          # the start of the latest read that showed the environment before
    t: float                     # the end of the read that showed this one

    def fields(self) -> dict:
        return {"env": self.env, "reason": self.reason, "since": None if self.since is None else round(self.since, 6),
                "execs": self.execs}


class Tracker:
    """The last watched live environment recorded per image, and the latest read that showed it."""

    def __init__(self, reading: livemem.Reading | None = None):
        self.reading = reading or livemem.Reading(livemem.is_watched)
        self._last: dict[tuple[int, int, int], tuple[dict[str, str] | None, float]] = {}  # image -> (env, since)
        self.reads = self.processes = self.bytes = self.retries = 0

    @property
    def native(self) -> bool:
        return self.reading.native

    def read(self, procs: list[tuple[int, int, int, str | None]]) -> list[Change]:
        """Read each (pid, start ticks, execs, exe) now; the changes to record, in order."""
        if not procs:
            return []
        begin = time.time()
        got = self.reading.read_many([p[0] for p in procs], [p[3] for p in procs])
        end = time.time()
        self.reads += 1
        self.processes += len(procs)
        out = []
        if len(self._last) > _KEPT_MAX:
            self._last.clear()
        for (pid, ticks, execs, _), live in zip(procs, got):
            self.bytes, self.retries = self.bytes + live.bytes_read, self.retries + live.retries
            key = (pid, ticks, execs)
            last = self._last.get(key)
            if live.env is None:
                if last is None:  # said once, and only before any reading (a process that ended is no news)
                    self._last[key] = (None, begin)
                    out.append(Change(pid, execs, None, live.reason, None, end))
                continue
            if last is not None and last[0] == live.env:
                self._last[key] = (live.env, begin)  # still the same: a later write comes after this read
                continue
            since = last[1] if last is not None and last[0] is not None else None
            self._last[key] = (live.env, begin)
            out.append(Change(pid, execs, live.env, None, since, end))
        return out

    def forget(self, alive: set[tuple[int, int]]) -> None:
        """Drop what is kept of the images whose process is no longer (pid, start ticks) in alive."""
        for key in [k for k in self._last if (k[0], k[1]) not in alive]:
            del self._last[key]
