"""Children a watched process must have had that no scan saw: the scan mode's count of what it missed.

When a process reaps a child, the kernel adds the child's minor faults (its own and those of the children it
reaped) to the reaper's cminflt (kernel/exit.c, wait_task_zombie; /proc/PID/stat field 11), and a process that
ran anything has faulted pages in (exec maps a new image; a fork child's first write copies a page). So a rise
of a process's cminflt between two reads says it reaped at least one child meanwhile. Where no child of it that
a scan saw (running or as a zombie) can have been reaped between those reads, at least one child ran that no scan
saw. Each such rise counts one: a lower bound, never a guess (two children reaped in one window count one).

Why not the pids allocated between two scans: every process of the machine takes from the same pid counter
(/proc/loadavg's last field, ns_last_pid), so a gap says nothing about CMD's tree on a machine others use.

What this cannot count: children of a process that ignores SIGCHLD (the kernel reaps them without the
accounting), and children of a process reaped between two reads of it by a parent in the tree (the parent's rise
is then that process's end). run reads what it reaps itself (CMD, the orphans it adopts) just before, as zombies,
so their last children are counted. A fork child a scan saw only before its exec is a child seen, whose reaping
explains its parent's rise: what it exec'd is procwatch's FORK_GONE, unread (diagnose/coverage.py).
An orphan adopted by a child subreaper inside the tree and reaped before a scan saw it under its new parent is
counted as a child of that subreaper, which it is.

Its cost: one read of /proc/PID/stat per process of the tree at each walk (procwatch.WALK_EVERY_S), beside the
reads the scans make anyway.
"""
from __future__ import annotations

import math

Key = tuple[int, int]  # (pid, start ticks)


class Reaping:
    """The reads of each process's cminflt and of which children each was seen with, over a watch."""

    def __init__(self):
        self._faults: dict[Key, tuple[float, int]] = {}  # last read: (when it began, cminflt)
        self._rises: list[tuple[Key, float, float]] = []  # (process, from, to): cminflt rose within
        self._kids: dict[Key, dict[Key, float]] = {}  # parent -> child -> when last seen not reaped
        self._gone: dict[Key, float] = {}  # child -> by when it was known reaped (gone from /proc)

    def look(self, t0: float, t1: float, procs: dict[Key, tuple[Key | None, int]], gone=(),
             ended: dict[Key, tuple[Key, float]] | None = None) -> None:
        """One read of `procs` (key -> (parent's key or None, cminflt)), begun at t0 and ended at t1 (monotonic);
        `gone`: processes known before that it found ended and reaped; `ended`: children a walk read (key ->
        (parent's key, when)) that were gone by this read of their parents (a subshell: a child seen all the same,
        whose reaping explains its parent's rise)."""
        for key, (parent, seen) in (ended or {}).items():
            self._kids.setdefault(parent, {})[key] = seen
            self._gone.setdefault(key, t1)
        for key, (parent, faults) in procs.items():
            if parent is not None:
                self._kids.setdefault(parent, {})[key] = t0  # not reaped yet at t0 (a zombie is not)
            self._gone.pop(key, None)  # seen again: the walk that missed it had lost its track, not it
            last = self._faults.get(key)
            if last is None and faults:
                self._rises.append((key, -math.inf, t1))  # it reaped before the first read of it
            elif last is not None and faults > last[1]:
                self._rises.append((key, last[0], t1))
            self._faults[key] = (t0, faults)
        for key in gone:
            self._gone.setdefault(key, t1)

    def reaped(self, reads: dict[Key, tuple[float, int]]) -> None:
        """The last reads ((when, cminflt) by process) of processes the caller read as zombies, then reaped."""
        for key, (t, faults) in reads.items():
            self.look(t, t, {key: (None, faults)})

    def unseen(self) -> dict[int, int]:
        """Pid -> how many children, at least, it reaped that no read saw: one per rise that no child seen with
        it can explain (one not known reaped before the rise's window began, nor seen alive after it ended)."""
        out: dict[int, int] = {}
        for key, t0, t1 in self._rises:
            kids = self._kids.get(key, {})
            if not any(alive < t1 and self._gone.get(kid, math.inf) > t0 for kid, alive in kids.items()):
                out[key[0]] = out.get(key[0], 0) + 1
        return out
