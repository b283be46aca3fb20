"""Whether an expectation was checked at all. "Not checked" is never "fine": when no process that the
rules check could be checked (every endpoint of the tree is a client whose workers run under another
daemon, or no witness could read any of them), the verdict says so first and the command exits 3. So it
does, beside the processes that were checked, for those known to have run that no witness read: a parent's
record of the call that started them holds none of the expected values, run's watch saw them only as they
ended, knows they ran (reaped, first seen as zombies) or that a process of the tree reaped children it never
saw (witnesses/reaping.py), or a probe lost lines (one may have been such a record)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ncclprobe.model import FORK_GONE, SPACE_MARK, Model
from ncclprobe.model.images import EXEC_WRAPPERS, wraps_a_program
from ncclprobe.model.launchers import client_of


@dataclass
class Unchecked:
    reason: str
    hint: str
    clients: list[dict[str, Any]] = field(default_factory=list)
    unread: list[int] = field(default_factory=list)  # processes known to have run whose environment no witness read
    partial: bool = False  # other processes were checked: an error-level finding on them decides the exit code

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "hint": self.hint, "clients": self.clients, "unread": self.unread}


def edge_only(p) -> bool:
    """Known only from its parent's record of the call that started it: no witness of its own saw it."""
    return p.started_by is not None and not (p.sources - {"edge"}) and p.live_env is None


def _unread(k, endpoints: list, expect: dict[str, str]) -> tuple[list, list[str]]:
    """The endpoints known to have run only from a spawn record on which some expected variable cannot be
    checked (the record holds only the watched variables, or none), and those variables."""
    unread, names = [], []
    for p in endpoints:
        if not edge_only(p):
            continue
        missed = [var for var in expect if not k.effective(p, var)[0]]
        if missed:
            unread.append(p)
            names += [v for v in missed if v not in names]
    return unread, names


# why /proc gave a process's environment to no read: it was ending, or not through its execve yet (procwatch)
GONE = ("vanished", "zombie", "inside execve", "not read")


def _gone_unread(k, p) -> bool:
    """A process that started none and that no witness read as itself: /proc showed it only as it ended (or inside
    execve), or only as a fork child that was gone before a second look (what it exec'd, if it did, no read saw;
    where the kernel's events gave every exec of the tree, it exec'd nothing: its parent's program and block)."""
    if p.started_by is not None or p.start_env is not None or p.live_env is not None or k.children.get(p.key):
        return False
    if p.proc_env_reason == FORK_GONE:
        return not k.helper(p) and not (k.m.watch.get(p.host) or {}).get("kernel_complete")
    return p.proc_exec_env is None and p.proc_env_reason in GONE and k.timeline(p) is None and not k.helper(p)


def unseen_execs(m: Model) -> list:
    """Processes last seen by the /proc watch alone as an exec wrapper (`env -i … python3 w.py`) with
    nothing seen after: what the wrapper exec'd ended before the next scan, unseen (the pid would
    show the new program, a boot probe's events, its own exec's record, or children)."""
    parents = {(q.host, q.ppid) for q in m.processes.values()}
    out = []
    for p in m.processes.values():
        argv = p.argv or []
        if (argv and os.path.basename(argv[0]) in EXEC_WRAPPERS and p.sources <= {"proc", "preload"}
                and (p.host, p.pid) not in parents and wraps_a_program(argv)):
            out.append(p)
    return sorted(out, key=lambda p: (p.host, p.pid))


# how a process known to have run was missed by every witness (_unseen), said of one and of several
_HOW = {
    "ended": ("/proc showed it only as it ended", "/proc showed them only as they ended"),
    "execve": ("/proc showed it only inside its execve", "/proc showed them only inside their execve"),
    "fork": ("seen once as a fork child or inside its execve, gone before a second look",
             "seen once as fork children or inside their execve, gone before a second look"),
    "unread": ("/proc showed it, but its environment was not read", "/proc showed them, but their environments "
               "were not read"),
    "wrapper": ("an exec wrapper whose program no witness saw", "exec wrappers whose programs no witness saw"),
    "watch": ("known to run's watch alone: no scan saw it running (first seen as a zombie, reaped by run, CMD gone "
              "before the first scan) or it exec'd and was gone before the kernel's read",) * 2,
}
_REASON_HOW = {FORK_GONE: "fork", "inside execve": "execve", "not read": "unread"}


def _unseen(m: Model, k) -> dict[tuple[str, int], str]:
    """The processes known to have run that no witness read, (host, pid) each with how (a key of _HOW): seen
    only as they ended, or known to run's watch alone (reaped, first seen as zombies, exec'd and gone before the
    kernel's read; a parent's record of the call that started one is _unread's)."""
    procs = {(p.node, p.pid): p for p in m.processes.values()}
    how = {(p.host, p.pid): _REASON_HOW.get(p.proc_env_reason, "ended")
           for p in m.processes.values() if _gone_unread(k, p)}
    how |= {(p.host, p.pid): "wrapper" for p in unseen_execs(m)}
    parents = {(p.node, p.ppid) for p in m.processes.values()}
    for host, w in m.watch.items():
        for pid in w.get("missed_pids") or []:
            if (host, pid) in parents:  # it started processes a witness knows: what it passed on reached them, as
                continue  # for a process seen as it ended (_gone_unread): a script's $(…) subshell, say
            p = procs.get((host, pid))
            if p is None or not edge_only(p) and k.timeline(p) is None:
                how.setdefault((host, pid), "watch")
    return dict(sorted(how.items()))


def _missed(m: Model, unseen: dict[tuple[str, int], str]) -> str:
    """What ran that no witness read, in words: those processes and how each was missed (host:pid where they ran
    on more than one host), the children run's watch counted, the lines the probes could not write (empty:
    nothing)."""
    parts = []
    if unseen:
        nodes = {p.node for p in m.processes.values()} | {host.split(SPACE_MARK)[0] for host, _ in unseen}
        groups, hosts = [], len(nodes) > 1
        for key, (one, several) in _HOW.items():
            pids = [f"{host}:{pid}" if hosts else str(pid) for (host, pid), how in unseen.items() if how == key]
            if pids:
                listed = ", ".join(pids[:8]) + ("…" if len(pids) > 8 else "")
                groups.append(f"pid {listed} ({one})" if len(pids) == 1 else f"pids {listed} ({several})")
        n = len(unseen)
        parts.append(f"{n} process{'es' if n != 1 else ''} of the tree known to have run whose environment no "
                     f"witness read, and that ran no probe: {'; '.join(groups)}")
    children = sum(int(w.get("missed_children") or 0) for w in m.watch.values())
    if children:
        parents = sorted({pid for w in m.watch.values() for pid in w.get("missed_parents") or []})
        parts.append(f"at least {children} more that pid(s) {', '.join(map(str, parents[:8]))} started and reaped "
                     "between two scans (their reaped children's page faults say so), seen by no witness")
    dropped = sum(m.reading.dropped.values())
    if dropped:
        writers = sorted({pid for _, pid in m.reading.dropped})
        parts.append(f"{dropped} line(s) the probes of pid(s) {', '.join(map(str, writers[:8]))} could not write "
                     "(stalled writes): a record of a process they started may be among them")
    return "; ".join(parts)


def unchecked(m: Model, expect: dict[str, str], k=None) -> Unchecked | None:
    """Why the expectation was checked on no process, or None where one was checked. k: the model's
    propagation.Knowledge where the caller has one (its timelines are memoised)."""
    if not expect:
        return None
    if k is None:
        from ncclprobe.diagnose.propagation import Knowledge
        k = Knowledge.of(m)
    endpoints = k.endpoints()
    with_comm = {(c.host, c.pid) for c in m.comms if c.env is not None}
    def read(p) -> bool:
        return p.key in with_comm or (client_of(p.argv, p.exe) is None and k.timeline(p) is not None)

    checked = any(map(read, endpoints))  # (one checked process is enough to know: not every endpoint is asked)
    unread, names = _unread(k, endpoints, expect)
    how = _unseen(m, k)
    unseen, missed = sorted({pid for _, pid in how}), _missed(m, how)
    if checked and not unread and not missed:
        return None
    if checked and not unread:  # some were checked; others ran that no witness read: not checked on them
        return Unchecked(f"not checked: {missed}", _to_see_them(m), unread=unseen, partial=True)
    if checked:  # some were checked; these are known to have run, and not read
        pids = sorted(p.pid for p in unread)
        sites = sorted({p.started_by.site for p in unread})
        return Unchecked(f"not checked: {len(pids)} process(es) known to have run ({', '.join(map(str, pids[:8]))}"
                         f"{'…' if len(pids) > 8 else ''}; started by {', '.join(sites[:3])}) whose environment no "
                         f"witness read ({', '.join(names)}): only the call that started them was recorded, and it "
                         "holds the watched variables alone" + (f"; and {missed}" if missed else ""),
                         "let the boot probe into them (pass PYTHONPATH and NCCLPROBE_DIR in the environment the call "
                         "gives them), or read them while they run: `ncclprobe run --live --hold -- CMD`",
                         unread=sorted({*pids, *unseen}), partial=True)
    clients = [(p, client_of(p.argv, p.exe)) for p in endpoints]
    named = [{"pid": p.pid, "host": p.host, "program": c.program, "runs_under": c.runs_under, "reach": c.reach}
             for p, c in clients if c is not None]
    if named:
        first = named[0]
        what = ", ".join(sorted({f"{c['program']} (pid {c['pid']})" for c in named}))
        return Unchecked(f"not checked: the tree holds only {what}, a client; its workers run under "
                         f"{first['runs_under']}, outside this tree, and no witness read them",
                         first["reach"], named)
    if not endpoints:
        return Unchecked("not checked: the tree holds no process the expectation applies to",
                         "inspect the workers' PIDs, or run the job under `ncclprobe run -- CMD`")
    if missed and {(p.host, p.pid) for p in endpoints} <= set(how):  # each worker is one of those: say how
        return Unchecked(f"not checked: {missed}", _to_see_them(m), unread=unseen)
    return Unchecked("not checked: no witness could read the environment of any worker "
                     f"({len(endpoints)} process(es))" + (f"; and {missed}" if missed else ""),
                     "see them from inside: `ncclprobe run -- CMD` (the boot probe records each Python process), "
                     "or read their memory: `ncclprobe inspect --live PID`",
                     unread=sorted({*(p.pid for p in endpoints), *unseen}))


def _to_see_them(m: Model) -> str:
    """How to read, next time, what ran and no witness read (_missed): the kernel's process events read each
    process at its exec; where they did already, what ended first is seen only from inside."""
    keep = "keep the probes in the environment each call gives (PYTHONPATH, NCCLPROBE_DIR, LD_PRELOAD)"
    if not m.watch:  # (seen by a /proc read of inspect's, say)
        return (f"run the job under `ncclprobe run -- CMD` (its watch reads each process at its exec where the "
                f"kernel's process events allow), and {keep}")
    if all(w.get("mode") == "kernel" for w in m.watch.values()):
        return f"{keep}: the kernel's process events already had each read at its exec, and these ended first"
    return ("follow the tree through the kernel's process events (run as root or with CAP_NET_ADMIN: each process "
            f"is read at its exec), or {keep}")
