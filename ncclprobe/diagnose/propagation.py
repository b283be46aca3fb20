"""Propagation rules: where in the process tree a value was lost or changed.

For each variable that matters (expected by the operator, or an NCCL variable some process of the job
had), each affected process is followed up its ancestry to the one edge where its value went another
way, and the finding names that edge with its evidence: the parent set it after the child (or the
intermediate that started it) had started; the parent had it and started the child with a curated
environment; a non-Python process had it and its children do not; the process changed it itself; a
shell assigned it to another command only; no ancestor ever had it. Every witness of the model feeds
the same rules (the boot probe's start environment and writes, /proc's exec-time environment from
`inspect` or `run`'s watch, the communicators' environment at creation); a process no witness can
tell about is a stated blind spot, never a guess.

The affected processes are the job's endpoints: the processes that use NCCL (a communicator, libnccl
mapped, a GPU) or, where none does, the ones that start no other process and did not retire before
the others (a recycled pool worker no scan of run's watch saw, gone before the job's workers came).
Intermediates (launchers, daemons, shells, servers) are named in the edge, not counted as affected;
so is the launcher around the edge, with its own remedy (model/launchers.py).
"""
from __future__ import annotations

import bisect
import weakref
from collections import defaultdict
from fnmatch import fnmatchcase
from dataclasses import dataclass, field
from typing import Any

from ncclprobe.diagnose.visibility import LIVE_VIEW, NOT_SHOWN
from ncclprobe.model.images import option_values, runs_forkserver, unwrap
from ncclprobe.diagnose.findings import Finding, at
from ncclprobe.model import (FORK_GONE, LIVE_NATIVE, LIVE_WHERE, LIVE_WHERES, LiveReading, LiveWrite, Model,
                             ProcessView, SpawnEdge)
from ncclprobe.model import launchers, wiring
from ncclprobe.model.launchers import FILTERS
from ncclprobe.model.tuning import NOT_READ_BY_NCCL
from ncclprobe.model.watched import is_watched, one_line, redact_assignments

TICK_S = 0.011  # /proc start times are floored to the clock tick (1/100 s)
RESTORE_WINDOW_S = 1.0   # an unset-and-restore (accelerate's clear_environment) nets out within this
# a process no scan of run's watch saw lived less than its interval plus one scan's time (bounded by this)
RETIRE_SLACK_S = 1.0
# launcher helpers that run no user code: never endpoints of the job (joblib's loky has its own tracker)
HELPER_MARKS = ("multiprocessing.resource_tracker", "multiprocessing.semaphore_tracker",
                "loky.backend.resource_tracker")
SHELLS = ("bash", "sh", "dash", "zsh", "ksh", "ash", "busybox")


# --------------------------------------------------------------------------------- what is known
@dataclass
class Timeline:
    """What the witnesses know of one process's environment over time: where it started, the writes
    after that (time order, net of unset-and-restore), and what that rests on."""
    start: dict[str, str]
    writes: list
    basis: str                 # in words, for the evidence
    witnesses: tuple[str, ...]
    complete: bool             # False: in-process writes were not witnessed (/proc alone)

    def at(self, t: float | None) -> dict[str, str]:
        """The environment at time t (None: now). Read-only: it may be the start environment itself."""
        if not self.writes or (t is not None and self.writes[0].t > t):
            return self.start
        env = dict(self.start)
        for w in self.writes:
            if t is not None and w.t > t:
                break
            if w.new is None:
                env.pop(w.var, None)
            else:
                env[w.var] = w.new
        return env

    @property
    def final(self) -> dict[str, str]:
        return self.at(None)


def with_live(p: ProcessView, tl: Timeline | None) -> Timeline:
    """The live witness over what the others show: the environment p started with (as they tell it,
    else /proc's block, else the first live reading itself), then, for each reading in turn (run
    --live records each change; inspect --live reads once), a write of each value that differs from
    what the timeline says p held at that reading, dated by the reading's bracket: made after its
    `since` (None: at any time before) and at or before its `t` (a LiveWrite at t). A later reading
    outranks an earlier record: where the boot probe recorded every os.environ write, a difference is
    native code's (a C setenv), and the writes stay in time order around it. Its past is complete only
    where the others' was and the live reads found nothing they missed (a fork child copies the past:
    the environment at the fork)."""
    readings = p.live_readings or [LiveReading(p.live_env, p.live_t if p.live_t is not None else 0.0, p.live_since)]
    start = tl.start if tl is not None else (
        p.proc_exec_env if p.proc_exec_env is not None and p.proc_stale != "clobbered" else readings[0].env)
    where = LIVE_NATIVE if tl is not None and "boot" in tl.witnesses else LIVE_WHERE
    merged = Timeline(start, sorted(tl.writes, key=lambda w: w.t) if tl is not None else [], "", (), True)
    found = 0
    for r in sorted(readings, key=lambda r: r.t):
        held = merged.at(r.t)
        for var in sorted(set(held) | set(r.env)):
            if held.get(var) != r.env.get(var):
                new = r.env.get(var)
                _insert(merged.writes, LiveWrite(var, held.get(var), new, where, "unset" if new is None else "set",
                                                 False, r.t, r.since))
                found += 1
    basis = (tl.basis if tl is not None else "/proc") + (" and its memory (run --live)" if p.live_readings
                                                         else " and its memory now (inspect --live)")
    complete = tl is not None and tl.complete and not found
    return Timeline(start, merged.writes, basis, (tl.witnesses if tl is not None else ()) + ("live",), complete)


def _insert(writes: list, w) -> None:
    """w into writes, kept in time order (after every write of the same time)."""
    i = len(writes)
    while i and writes[i - 1].t > w.t:
        i -= 1
    writes.insert(i, w)


def net_writes(p: ProcessView) -> list:
    """p's writes, less each change undone within RESTORE_WINDOW_S with no NCCL read between (a
    save/clear/restore of os.environ); a write a pin blocked stays (it changed nothing: Timeline skips it)."""
    if not p.writes:
        return []
    writes = sorted(p.writes, key=lambda w: w.t)
    reads = sorted(r.t for r in p.reads.values())
    undone: set[int] = set()
    for i, w in enumerate(writes):
        if i in undone or w.blocked:
            continue
        for j in range(i + 1, len(writes)):
            later = writes[j]
            if later.t - w.t > RESTORE_WINDOW_S:
                break
            if later.var == w.var and not later.blocked:
                k = bisect.bisect_left(reads, w.t)  # the first read at or after w: none up to later?
                if later.new == w.old and not (k < len(reads) and reads[k] <= later.t):
                    undone.update((i, j))
                break
    return [w for i, w in enumerate(writes) if i not in undone]


_PYTHON_NAMES: dict[tuple[str, str], bool] = {}


def is_python(p: ProcessView) -> bool:
    if "boot" in p.sources and not p.exec_after_boot:
        return True
    key = (p.exe or "", (p.argv or [""])[0])
    hit = _PYTHON_NAMES.get(key)
    if hit is None:
        if len(_PYTHON_NAMES) > 4096:
            _PYTHON_NAMES.clear()
        names = [x.rsplit("/", 1)[-1] for x in key]
        hit = _PYTHON_NAMES[key] = any(n.startswith(("python", "pypy")) for n in names)
    return hit


def is_forkserver(p: ProcessView | None) -> bool:
    return p is not None and runs_forkserver(p.argv)


def is_shell(p: ProcessView | None) -> bool:
    return p is not None and _shell_program(p.exe or (p.argv or [""])[0])


def _shell_program(path: str | None) -> bool:
    return (path or "").rsplit("/", 1)[-1] in SHELLS


def start_of(p: ProcessView) -> float | None:
    """When p started: /proc's start time (the fork) where known, else the boot probe's start."""
    return p.proc_start if p.proc_start is not None else p.t_start


class Knowledge:
    """The model's processes as the propagation rules read them, with each one's timeline (memoised)."""

    @classmethod
    def of(cls, m: Model) -> Knowledge:
        """The model's Knowledge, made once for every rule and the verdict over the same model (made again
        if processes or communicators were added since)."""
        stamp = (id(m.processes), len(m.processes), id(m.comms), len(m.comms))
        held = m._knowledge
        if held is None or held[0] != stamp:
            held = m._knowledge = (stamp, cls(m))
        return held[1]

    def __init__(self, m: Model):
        self._endpoints: list[ProcessView] | None = None
        self._model = weakref.ref(m)  # the model holds its Knowledge (of): no cycle, so a dropped model goes at once
        self._tl: dict[int, Timeline | None] = {}
        self._spawned: dict[int, tuple[Any, bool]] = {}
        self.refs: dict[tuple, tuple[bool, str | None]] = {}   # (parent key, var) -> _reference
        self._helpers: dict[tuple[int, int], tuple[Any, Any, bool]] = {}
        self._helper_of: dict[int, bool] = {}  # id(process) -> helper(process)
        self.children: dict[tuple[str, int], list[ProcessView]] = defaultdict(list)
        self._parents: dict[int, ProcessView | None] = {}  # id(process) -> m.parent(process), found once here
        for p in m.processes.values():
            parent = self._parents[id(p)] = m.parent(p)
            if parent is not None and parent is not p:
                self.children[parent.key].append(p)

    def parent(self, p: ProcessView) -> ProcessView | None:
        """m.parent(p), as made once for every process of the model (every rule asks it, many times)."""
        hit = self._parents.get(id(p), p)
        return self.m.parent(p) if hit is p else hit

    @property
    def m(self) -> Model:
        return self._model()

    def via(self, p: ProcessView) -> str:
        parent = self.parent(p)
        # a fork child that exec'd since runs with the environment it exec'd with, as any exec'd program
        forked = (bool(p.forked_from) and not p.exec_after_boot) or p.proc_stale in ("fork", "forkserver")
        if forked and (p.proc_stale == "forkserver" or is_forkserver(parent)):
            return "forkserver"
        if forked:
            return "fork"
        hit = self._spawned.get(id(p.argv))
        if hit is None:  # once per command line (processes started alike share theirs)
            hit = self._spawned[id(p.argv)] = (p.argv, any("multiprocessing.spawn" in a or "spawn_main" in a
                                                           for a in p.argv or ()))
        return "spawn" if hit[1] else "exec"

    def timeline(self, p: ProcessView) -> Timeline | None:
        key = id(p)  # the model's processes live as long as this
        if key in self._tl:
            return self._tl[key]
        self._tl[key] = None  # a cycle in a foreign log's ppids ends here
        tl = self._timeline(p)
        self._tl[key] = tl
        return tl

    def _timeline(self, p: ProcessView) -> Timeline | None:
        tl = self._witnessed(p)
        return with_live(p, tl) if p.live_env is not None else tl

    def _witnessed(self, p: ProcessView) -> Timeline | None:
        writes = [w for w in net_writes(p) if not w.blocked]
        if p.start_env is not None:
            return Timeline(p.start_env, writes, "boot probe (start environment and every write)", ("boot",), True)
        parent = self.parent(p)
        if self.via(p) in ("fork", "forkserver") or p.proc_stale == "clobbered":
            # a fork child's environment is its parent's at the fork; /proc shows only the parent's block
            ptl = self.timeline(parent) if parent is not None and p.proc_stale != "clobbered" else None
            server = self.via(p) == "forkserver"
            if ptl is None or not (ptl.complete or server):
                return None
            return Timeline(ptl.at(start_of(p)), writes, f"its parent's (pid {parent.pid}) at the fork",
                            ptl.witnesses, ptl.complete and not is_python(p))
        if p.proc_exec_env is not None:
            return Timeline(p.proc_exec_env, writes, "/proc (the environment it was started with)",
                            ("proc",), not is_python(p))
        edge = p.started_by
        if edge is not None and edge.env is not None:  # no witness of its own: what the call passed it
            return Timeline(edge.env, writes, f"the record of {edge.call or 'the call'} at {edge.site} (the "
                            "environment it passed)", ("edge",), not is_python(p))
        return None

    def value_env(self, p: ProcessView) -> dict[str, str] | None:
        """p's watched environment now, as far as the witnesses tell (None: they cannot)."""
        tl = self.timeline(p)
        return tl.final if tl is not None else None

    def value(self, p: ProcessView, var: str, t: float | None = None) -> tuple[bool, str | None]:
        """(known, value) of var in p at time t (None: now), as NCCL would read it (effective)."""
        return self.effective(p, var, t)[:2]

    def effective(self, p: ProcessView, var: str, t: float | None = None) -> tuple[bool, str | None, str | None]:
        """(known, value, conf "file:line") of var in p at time t (None: now): its environment (the boot
        probe's record, the live read, the exec-time block); where that has none and NCCL runs in p, what
        an nccl.conf file gives NCCL, which applies each line with setenv(..., 0) (src/misc/param.cc)."""
        tl = self.timeline(p)
        if tl is None:
            return False, None, None
        if not is_watched(var):  # the model keeps only watched names; /proc (or memory) read the expected ones
            seen = p.live_expected if p.live_expected is not None and p.start_env is None else p.proc_expected
            if seen is None:
                return False, None, None
            value = seen.get(var)
        else:
            value = tl.at(t).get(var)
        if value is None and p.loads_nccl:
            hit = p.conf_value(var)
            if hit is not None:
                return True, hit[0], hit[1]
        return True, value, None

    def endpoints(self) -> list[ProcessView]:
        """The processes the job's values matter in (see the module's docstring); with inspect's
        `--scope all`, also every process that starts no other. Where no process uses NCCL, the leaves
        that run an interpreter (the workers) if there are any: a shell's `dirname`, `sleep` or subshell
        is no worker; nor is one that retired while others stayed (see retired). Memoised."""
        if self._endpoints is None:
            self._endpoints = self._find_endpoints()
        return list(self._endpoints)

    def _find_endpoints(self) -> list[ProcessView]:
        with_comms = {(c.host, c.pid) for c in self.m.comms}
        # NCCL use any witness saw counts, whatever a /proc snapshot's --scope said before NCCL was loaded
        scoped = [p for p in self.m.processes.values() if not self.helper(p) and (
            p.in_scope is not False or p.key in with_comms or p.libs)]
        users = {p.key for p in scoped if p.key in with_comms or p.libs or p.nccl_user}
        leaves = [p for p in scoped if p.key not in users and (p.in_scope is True or not users)
                  and not [c for c in self.children[p.key] if not self.helper(c)]]
        if not users and any(is_python(p) for p in leaves):
            leaves = [p for p in leaves if is_python(p)]
        if not users:  # the workers are the ones that stayed, not those that retired before them (of its run:
            # a later run appended to the directory retires none of an earlier one's)
            run = {p.key: id(self.m.run_of(p)) for p in leaves} if len(self.m.runs) > 1 else {}
            stayed: dict = {}
            for q in leaves:
                if "proc" in q.sources:
                    stayed.setdefault(run.get(q.key), []).append(q)
            leaves = [p for p in leaves if not self.retired(p, stayed.get(run.get(p.key), []))]
        return [p for p in scoped if p.key in users] + leaves

    def retired(self, p: ProcessView, stayed: list[ProcessView]) -> bool:
        """p ended before a worker that stayed was started (a pool worker recycled by maxtasksperchild before
        the job's workers came; a quick helper): as the kernel said when it ended (run's watch in kernel
        mode), or, without that, no scan of run's /proc watch saw it, so it lived less than a scan interval
        (plus a scan's time, RETIRE_SLACK_S), and a process a scan did see started later than that."""
        if p.t_exit is not None:
            return any(q is not p and q.host == p.host and (t := start_of(q)) is not None and t > p.t_exit
                       for q in stayed)
        w = self.m.watch.get(p.host)
        s = start_of(p)
        if w is None or s is None or not self._boot_only(p, w):
            return False
        gone_by = s + float(w.get("interval_s") or 0) + RETIRE_SLACK_S
        return any(q.host == p.host and (t := start_of(q)) is not None and t > gone_by for q in stayed)

    def _boot_only(self, p: ProcessView, watch: dict) -> bool:
        """Only p's boot probe saw it, though the watch scanned throughout, and nothing saw it use NCCL."""
        sound = (watch.get("scans") or 0) >= 2 and not watch.get("stuck") and not watch.get("error")
        return (sound and p.t_start is not None and "proc" not in p.sources and not p.libs and not p.nccl_user
                and not self.m.comms_of(p.host, p.pid, p.retired))

    def helper(self, p: ProcessView) -> bool:
        """_helper, once per command line and parent (processes started alike share theirs); each process's
        answer is kept too (endpoints and the rules ask it of every process more than once)."""
        mine = self._helper_of.get(id(p))
        if mine is not None:
            return mine
        parent = self.parent(p)
        key = (id(p.argv), id(parent))
        hit = self._helpers.get(key)
        if hit is None:
            hit = self._helpers[key] = (p.argv, parent, _helper(p, parent))
        self._helper_of[id(p)] = hit[2]  # (the model's processes live as long as this)
        return hit[2]


def _helper(p: ProcessView, parent: ProcessView | None = None) -> bool:
    """A process of the launcher's own machinery, never a worker: multiprocessing's trackers, and a
    shell's subshell (a fork of the shell, its command line the shell's)."""
    if parent is not None and p.argv and (p.argv == parent.argv and is_shell(parent) or any(
            p.argv == image and image[0].rsplit("/", 1)[-1] in SHELLS for image in parent.images)):
        return True  # (a subshell of the shell the parent was before it exec'd: `x=$(...); exec python`)
    if parent is not None and "boot" in parent.sources and parent.t_start is not None and not parent.forked_from:
        s = start_of(p)  # started surely before the parent's interpreter (its start is to the clock tick):
        if s is not None and s + TICK_S < parent.t_start:  # a child of the program that exec'd into it
            return True
    return any(mark in a for a in p.argv or () for mark in HELPER_MARKS)


# ------------------------------------------------------------------------------------ the edge
@dataclass
class Edge:
    kind: str
    var: str
    parent: ProcessView | None
    children: list[ProcessView] = field(default_factory=list)
    where: str | None = None
    written_at: float | None = None
    old: str | None = None
    new: str | None = None
    via: str | None = None
    launcher: str | None = None
    witnesses: tuple[str, ...] = ()
    pitfall: dict[str, Any] | None = None
    parent_label: str | None = None   # where the parent is no process of the model (ncclprobe run)
    parent_pid: int | None = None     # ... and its pid, where it has one (an ancestor shell outside the tree)
    written_after: float | None = None  # a write the live witness found: made in (written_after, written_at]
    spawn: SpawnEdge | None = None    # the parent's record of the call that started the child (curated_env)

    @property
    def key(self) -> tuple:
        return (self.kind, self.var, self.parent.key if self.parent else self.parent_label, self.where,
                self.pitfall["shell"] if self.pitfall else None)

    def to_json(self) -> dict[str, Any]:
        starts = [s for s in (start_of(c) for c in self.children) if s is not None]
        return {"kind": self.kind, "var": self.var, "parent": self.parent.pid if self.parent else self.parent_pid,
                "parent_command": self.parent_label or (_cmd(self.parent) if self.parent else None),
                "children": sorted({c.pid for c in self.children}), "where": self.where,
                "written_at": self.written_at, "started_at": min(starts) if starts else None,
                "via": self.via, "launcher": self.launcher, "witnesses": sorted(set(self.witnesses)),
                **({"written_after": self.written_after} if self.where in LIVE_WHERES else {}),
                **({"spawn": spawn_json(self.spawn)} if self.spawn is not None else {})}


def spawn_json(s: SpawnEdge) -> dict[str, Any]:
    """The edge's record of the call (JSON edge.spawn): no variable outside the watched set is named."""
    return {"call": s.call, "where": s.where, "pid": s.parent, "child": s.child, "argv": s.argv, "exe": s.exe,
            "exec": s.exec, "env_given": s.env_given, "env_count": s.env_count, "witnesses": sorted(s.witnesses)}


def _own_envp(m: Model, x: ProcessView, sp: SpawnEdge | None) -> bool:
    """Whether the call that started x (or that x exec'd) passed an environment its caller built itself. A
    shell always passes one (its exported variables; the native probe sees an envp that is not environ):
    that is a shell's inheritance, whose rules (export, prefixes, `env -i` in its script) are read from the
    script, not a curated environment."""
    if sp is None or not sp.env_given:
        return False
    if sp.where:  # Python: env= was given
        return True
    caller = x.images[-1] if sp.exec and x.images else None
    if caller is None:  # the fork child exec'd before any witness saw its image: its parent's
        parent = m.parent(x) if sp.exec else m.processes.get((x.host, sp.parent))
        caller = parent.argv if parent is not None else None
    return not (caller and _shell_program(caller[0]))


def _exec_caller(k: Knowledge, x: ProcessView, sp: SpawnEdge | None, var: str, target: str | None
                 ) -> ProcessView | None:
    """x, where x itself exec'd with an environment of its own that lacked var (os.execve, execve's envp)
    while the process it was forked from (else its parent) had the value when x started: a fork starts
    with its parent's environment, so else the loss is further up (supervisord's, a raylet's own
    environment). A fork child that exec'd at once (a C daemon's fork+execve, sudo's) is left to its
    parent's edge, which names the daemon's call, or the script line that ran the wrapper."""
    if sp is None or not sp.exec or sp.env is None or _get(sp.env, var) == target or not _own_envp(k.m, x, sp):
        return None
    if sp.forked_from is not None and not x.images:
        return None
    pid = x.forked_from or x.ppid
    parent = k.m.processes.get((x.host, pid)) if pid else None
    ptl = k.timeline(parent) if parent is not None else None
    s = start_of(x)
    if ptl is not None and s is not None and _get(ptl.at(s - TICK_S), var) != target:
        return None
    return x


def _spawn_of(parent: ProcessView, x: ProcessView) -> SpawnEdge | None:
    """The record of the call by which parent started x (or x exec'd), where a probe in it made one."""
    edge = x.started_by
    return edge if edge is not None and (edge.parent == parent.pid or edge.parent == x.pid) else None


def locate(k: Knowledge, e: ProcessView, var: str, target: str | None, t: float | None) -> Edge:
    """The edge on e's ancestry where var stopped being target (e checked at time t, None: now)."""
    m = k.m
    x, below, seen, path = e, None, set(), []
    while x.key not in seen:
        seen.add(x.key)
        path.append(x)
        tl = k.timeline(x)
        if tl is None and below is None:  # only its communicators are known (an NCCL log, the preload hook)
            return Edge("unseen", var, None, [x], parent_label="no witness of the process's own environment")
        if tl is None:  # a process on the way no witness can tell about
            return Edge("unseen", var, x, [below], via=k.via(below))
        upto = t if below is None else start_of(below)
        if _get(tl.start, var) == target:  # lost inside x: its own write
            w = _last_change(tl, var, target, upto)
            if w is None:
                return Edge("unseen", var, x, [below or x], via=k.via(below or x), witnesses=tl.witnesses)
            return Edge("overwritten_in_child", var, x, [x], w.where, w.t, w.old, w.new, k.via(x),
                        witnesses=tl.witnesses, written_after=getattr(w, "after", None))
        sp = x.started_by
        pit = _pitfall(m, x, e, var)
        if pit is not None and pit["kind"] in FILTERS:  # `env -i` (script.sh:3) started x: what it kept, x got
            by = pit.get("started_by", pit["shell"])
            shell = next((p for p in m.processes.values() if p.pid == by and p.host == x.host), None)
            return Edge("curated_env", var, shell, [x], pit.get("where"), via=k.via(x), launcher=pit["kind"],
                        witnesses=("proc",) + tl.witnesses, pitfall=pit, parent_label=pit.get("shell_command"),
                        parent_pid=by)
        caller = _exec_caller(k, x, sp, var, target)  # the record of the exec, where no script line names it
        if caller is not None:
            return Edge("curated_env", var, caller, [x], via="exec", launcher=_launcher(k, "curated_env", [x], var=var),
                        witnesses=tl.witnesses + ("edge",), spawn=sp)
        if pit is not None:
            by = pit.get("started_by", pit["shell"])
            shell = next((p for p in m.processes.values() if p.pid == by and p.host == x.host), None)
            return Edge("shell_prefix", var, shell, [x], via=k.via(x), launcher="shell", witnesses=("proc",),
                        pitfall=pit, parent_label=pit.get("shell_command"), parent_pid=by)
        parent = m.parent(x)
        if parent is None and x.node != x.host:  # started from outside its pid namespace, by what no witness placed
            return Edge("unseen", var, None, [x], via=k.via(x), witnesses=tl.witnesses,
                        parent_label=f"the process outside pid namespace {x.pidns} that started it")
        if parent is None:
            given = m.given_for(x)
            if given is not None and x.ppid == given.get("pid") and _get(given["env"], var) == target:
                return Edge("curated_env", var, None, [x], via="exec",
                            launcher=_launcher(k, "curated_env", [x], given, var), witnesses=tl.witnesses + ("run",),
                            parent_label="ncclprobe run (the environment it gave CMD)")
            # every process on the way lacked it: the launcher nearest the worker says where to give it
            return Edge("not_in_root", var, x, [x], via=k.via(x),
                        launcher=_launcher(k, "not_in_root", path, given, var),
                        witnesses=tl.witnesses + (("run",) if given is not None else ()))
        parent, ptl = _past_forks(k, parent)
        if ptl is None:
            return Edge("unseen", var, parent, [x], via=k.via(x))
        s = start_of(x)
        # a start is known to the clock tick, a write to the microsecond (on clocks that can drift apart
        # by as much): a write within a tick of the start may have come after it, and x lacking the
        # value says it did. A write the live witness found is known to its bracket (after, t]: one
        # read after x had started (by a tick) says it came after, one x started after t says before
        early = s - TICK_S if s is not None else None
        late = [w for w in ptl.writes if w.var == var and w.new == target and early is not None and w.t > early]
        if _get(ptl.at(early), var) == target:  # the parent had it when x started
            spawn = _spawn_of(parent, x)
            if spawn is not None and not _own_envp(m, x, spawn):
                spawn = None  # a shell's exported environment: its own rules say what it passed
            kind = ("curated_env" if is_python(parent) or is_shell(parent) or spawn is not None
                    else "dropped_by_intermediate")
            wrap = _pitfall(m, parent, e, var)  # the parent is a wrapper a script ran (sudo, su -): its line
            if wrap is not None and wrap["kind"] in FILTERS:
                return Edge(kind, var, parent, [x], wrap.get("where"), via=k.via(x), launcher=wrap["kind"],
                            witnesses=ptl.witnesses + tl.witnesses, pitfall=wrap, spawn=spawn)
            return Edge(kind, var, parent, [x], via=k.via(x), launcher=_launcher(k, kind, [x], var=var),
                        witnesses=ptl.witnesses + tl.witnesses, spawn=spawn)
        if late:  # ... and got it only after x had started
            w = late[0]
            return Edge("set_after_start", var, parent, [x], w.where, w.t, w.old, w.new, k.via(x),
                        launcher=_launcher(k, "set_after_start", [x], var=var), witnesses=ptl.witnesses + tl.witnesses,
                        written_after=getattr(w, "after", None))
        x, below = parent, x
    return Edge("unseen", var, x, [below or x])


def _past_forks(k: Knowledge, parent: ProcessView) -> tuple[ProcessView, Any]:
    """parent and its timeline; where no witness read parent, a fork child gone before a second look that exec'd
    nothing (a daemon's double fork: tmux's server), its own parent's: it ran that program with that environment."""
    ptl, seen = k.timeline(parent), set()
    while ptl is None and parent.proc_env_reason == FORK_GONE and not parent.images and parent.key not in seen:
        seen.add(parent.key)
        above = k.m.parent(parent)
        if above is None:
            break
        parent, ptl = above, k.timeline(above)
    return parent, ptl


def _get(env: dict[str, str] | None, var: str) -> str | None:
    return (env or {}).get(var)


def _last_change(tl: Timeline, var: str, target: str | None, t: float | None):
    hits = [w for w in tl.writes if w.var == var and (t is None or w.t <= t) and w.new != target]
    return hits[-1] if hits else None


def _pitfall(m: Model, x: ProcessView, e: ProcessView, var: str) -> dict[str, Any] | None:
    """The shell pitfall that explains var's loss on x's start: an assignment of var that did not reach
    x, or a wrapper of the command that became x that dropped it (`env -i`, sudo: "*", all but those
    it kept)."""
    for pit in m.shell_pitfalls:
        dropped = pit["var"] == var or (pit["var"] == "*" and not any(fnmatchcase(var, k) for k in pit.get("kept", ())))
        if dropped and (x.pid in pit["pids"] or e.pid in pit["pids"]) and \
                pit["shell"] == (x.pid if pit.get("exec") else x.ppid):
            return pit
    return None


# ------------------------------------------------------------------------------ launchers, hints
def _launcher(k: Knowledge, kind: str, path: list[ProcessView], given: dict | None = None,
              var: str | None = None) -> str | None:
    """The launcher around an edge of var (model/launchers.py's table): from the images of path (the edge's
    child, or for the root's edge every process from the worker up) and their ancestors, nearest
    first, then the command `run` was given (the root's first image); the shell, where the parent is
    one and nothing else is recognised. An `env -u` that unsets other names is no launcher of var's edge."""
    chain = _ancestry(k.m, path)
    levels, fixed = _levels(k, chain, given)
    if var is not None:
        levels = [[im for im in level if not _unsets_others(im[0], var)] for level in levels]
    if kind == "not_in_root":  # above the root: only a launcher that says where to give it is named
        chosen, _ = launchers.nearest(levels, kind, fixed, anywhere=True)
        return chosen.name if chosen else None
    chosen, seen = launchers.nearest(levels, kind, fixed)
    if chosen or seen:
        return (chosen or seen).name
    return "shell" if len(chain) > 1 and is_shell(chain[1]) else None


def _levels(k: Knowledge, chain: list[ProcessView], given: dict | None) -> tuple[list, dict]:
    """Each process's images, nearest first, and the launcher a fork child that never exec'd stands
    for: it runs its parent's command line, so it is multiprocessing's child, or the worker of a
    launcher that forks its workers (celery's pool, gunicorn's)."""
    levels, fixed = [], {}
    for d, q in enumerate(chain):
        up = chain[d + 1] if d + 1 < len(chain) else k.m.parent(q)
        forked = k.via(q) in ("fork", "forkserver") and up is not None
        levels.append(_images(q, up.argv if forked else None))
        if forked and (not q.argv or q.argv == up.argv) and is_python(up):
            outer = launchers.identify(up.argv, up.exe)
            fixed[d] = outer if outer is not None and outer.forks else launchers.BY_VIA[k.via(q)]
    if given is not None and k.m.parent(chain[-1]) is None:
        levels[-1].append((given.get("command"), None))
    return levels, fixed


def _ancestry(m: Model, path: list[ProcessView]) -> list[ProcessView]:
    chain, seen = list(path), {id(q) for q in path}
    p = m.parent(chain[-1])
    while p is not None and len(chain) < 16 and id(p) not in seen:
        chain.append(p)
        seen.add(id(p))
        p = m.parent(p)
    return chain


def _images(p: ProcessView, fork_argv: list[str] | None) -> list[launchers.Image]:
    """p's programs, newest first; a fork child's copy of its parent's command line is not its own."""
    argvs = [p.argv, *reversed(p.images)]
    out = [(a, p.exe if i == 0 else None) for i, a in enumerate(argvs) if a and a != fork_argv]
    return out or ([(None, p.exe)] if p.exe and not fork_argv else [])


def _hint(edge: Edge, items: dict[str, tuple]) -> str:
    """What to change, for this edge and the launcher around it (its own remedy where the table has
    one; else the generic one). items: {var: (target, have)}."""
    names = list(items)
    var = ", ".join(names)
    value = " ".join(f"{v}={tg}" if is_watched(v) and tg is not None else v for v, (tg, _) in items.items())
    kind = edge.kind
    child = program(edge.children[0].argv) if edge.children else "the child"
    at_ = f" ({edge.where})" if edge.where and kind == "set_after_start" else ""
    fields = launchers.remedy_fields(items, is_watched, at=at_, who=program(edge.parent.argv if edge.parent else None))
    own = launchers.remedy(edge.launcher, kind, fields)
    at_line = f"{edge.pitfall['where']}: " if edge.pitfall and edge.pitfall.get("where") else ""
    if own is not None:
        return at_line + own
    if kind == "set_after_start":
        return (f"set {value} before `{child}` is started{at_}: a process copies its parent's environment when it "
                "starts, and later writes in the parent never reach it")
    if kind == "curated_env" and edge.spawn is not None and edge.spawn.env_given:
        sp = edge.spawn
        if sp.where:  # Python: the call's own env= mapping
            return (f"{sp.call or 'the call'} at {sp.site} passes its own environment ({sp.env_text()}) to "
                    f"`{child}`: add {value} to that env= mapping, or pass env={{**os.environ, ...}} so it "
                    "inherits the operator's settings")
        # native: the envp a C/C++ program built (its source or its configuration says which names it keeps)
        return (f"the program that called {sp.call or 'exec'} ({sp.site}) built the environment of `{child}` "
                f"itself ({sp.env_text()}): add {var} to the variables it passes on (its configuration or "
                f"source), or start it with a launcher option that forwards {var}")
    if kind == "curated_env":
        if edge.parent is None:
            return f"something in CMD's command line starts `{child}` without {var}: forward {value} there"
        return (f"the code in `{_cmd(edge.parent)}` that starts `{child}` passes its own environment "
                f"(subprocess env=, a launcher allow-list): forward {var} (e.g. env={{**os.environ, ...}})")
    if kind == "dropped_by_intermediate":
        return (f"{fields['who']} (not Python) filters the environment of the processes it starts: add {var} to its "
                "allow-list or configuration, or set it in the worker itself")
    if kind == "overwritten_in_child" and edge.where == LIVE_NATIVE:
        return (f"a library in pid {edge.parent.pid if edge.parent else '?'} set {edge.var} from C (setenv in its "
                "constructor or init, not os.environ, which --pin cannot block): configure that library, or set "
                f"{value} in the process after it is loaded, before the first communicator")
    if kind == "overwritten_in_child":
        return (f"remove or guard the write at {edge.where} (os.environ.setdefault), or pin it: "
                f"ncclprobe run --pin {edge.var}")
    if kind == "shell_prefix":
        pit = edge.pitfall or {}
        if pit.get("kind") == "prefix":
            return (f"{at_line}export it for the whole script: `export {edge.var}={pit.get('value')}`, or put the "
                    f"assignment right before the command: `{edge.var}={pit.get('value')} {pit.get('led_to_target')}`")
        return f"{at_line}write `export {edge.var}={pit.get('value')}` instead"
    if kind == "unseen":
        return f"set {value} where the job starts and see where it goes: {LIVE_VIEW}"
    # not_in_root
    return (f"export {value} in the environment that starts pid {edge.parent.pid if edge.parent else '?'} "
            f"({program(edge.parent.argv) if edge.parent else '?'}), or use `ncclprobe run --set {value} -- CMD`")


def _filtered_in(m: Model, edge: Edge, parent: ProcessView | None) -> str | None:
    """Where the filtering wrapper that names a curated edge (`env -i`, `env -u VAR`, sudo, su) was in each child's
    own images, in words: in CMD's command line, in the command its parent ran, or exec'd by an earlier image of
    CMD (which had run's environment); None where a child did not run it (a launcher further up is no culprit of
    this edge), where `env -u` unset other variables than this one, or where a child started by a parent exec'd
    it later (whether the image before it still held the variable, no read kept)."""
    if edge.launcher not in FILTERS or not edge.children:
        return None
    lines = set()
    for x in edge.children:
        images = [a for a in (*x.images, x.argv) if a]
        given = m.given_for(x) if parent is None else None
        if given and x.ppid == given.get("pid") and given.get("command") and images[:1] != [given["command"]]:
            images.insert(0, list(given["command"]))  # CMD as run started it (its exec of env no read may have seen)
        i = next((i for i, a in enumerate(images) if (la := launchers.identify(a)) and la.name == edge.launcher
                  and not _unsets_others(a, edge.var)), None)
        if i is None or i and parent is not None:  # (what the images before it held, no read kept: run gave CMD its
            return None  # own environment, a parent whatever it did)
        lines.add(f"exec'd by {program(images[i - 1])}" if i else
                  f"in the command {program(parent.argv)} ran" if parent else "in CMD's command line")
    return lines.pop() if len(lines) == 1 else None


def _unsets_others(argv: list[str] | None, var: str) -> bool:
    """An `env -u NAME …` command line whose names leave var alone."""
    la = launchers.identify(argv) if argv else None
    return la is not None and la.name == "env -u" and var not in option_values(unwrap("env", argv[1:])[0], "-u",
                                                                                "--unset")


def program(argv: list[str] | None) -> str:
    """What a command line runs, in a word: `python -m pkg.mod …` -> pkg.mod, `python x/serve.py` ->
    serve.py, `/usr/bin/raylet …` -> raylet."""
    argv = list(argv or [])
    if not argv:
        return "?"
    name = argv[0].rsplit("/", 1)[-1]
    if name.startswith("python"):
        rest = iter(argv[1:])
        for a in rest:
            if a == "-m":
                return next(rest, name)
            if a == "-c":
                code = next(rest, "")
                for mark, word in (("multiprocessing.forkserver", "multiprocessing forkserver"),
                                   ("spawn_main", "multiprocessing spawn worker"),
                                   ("resource_tracker", "multiprocessing resource tracker")):
                    if mark in code:
                        return word
                return f"{name} -c"
            if not a.startswith("-"):
                return a.rsplit("/", 1)[-1]
    return name


def _cmd(p: ProcessView | None) -> str:
    """A process's command line as a finding may show it: one line, at most 80 characters, and every
    NAME=VALUE word of a variable outside the watched set with its value redacted (a shell's command
    line is shell code: its assignments are environment values)."""
    argv = list((p.argv if p else None) or [(p.exe if p else None) or "?"])
    argv[0] = argv[0].rsplit("/", 1)[-1]
    text = one_line(" ".join(argv))
    text = redact_assignments(text)
    return text if len(text) <= 80 else text[:79] + "…"


def _short_where(where: str | None) -> str:
    return (where or "").split(" ")[0].rsplit("/", 1)[-1]


# -------------------------------------------------------------------------------------- the rules
def variables(m: Model, k: Knowledge, expect: dict[str, str]) -> list[str]:
    """The expected names, then every NCCL variable (not ncclprobe's wiring, not one NCCL never reads)
    that some process had at some time."""
    names: dict[str, None] = dict.fromkeys(expect)
    seen: set[int] = set()  # processes started alike share one environment (inspect's records)
    for p in m.processes.values():
        tl = k.timeline(p)
        if tl is None:
            continue
        envs = [tl.start] if id(tl.start) not in seen else []
        seen.add(id(tl.start))
        if tl.writes:
            envs += [{w.var: w.new or ""} for w in tl.writes]
        for env in envs:
            for v in wiring.job_env(env) or {}:
                if v.startswith("NCCL_") and v not in NOT_READ_BY_NCCL:
                    names.setdefault(v)
    return list(names)


def _reference(k: Knowledge, e: ProcessView, var: str) -> tuple[bool, str | None]:
    """(found, value): the value of var of e's nearest ancestor that had it (its latest value)."""
    parent = k.parent(e)
    key = (parent.key if parent else ("root", e.key), var)  # a root's reference is what its own run gave
    hit = k.refs.get(key)
    if hit is None:
        hit = k.refs[key] = _reference_above(k, parent, var, e)
    return hit


def _reference_above(k: Knowledge, p: ProcessView | None, var: str, below: ProcessView | None = None
                     ) -> tuple[bool, str | None]:
    given, seen = k.m.given_for(p or below), set()
    while p is not None and p.key not in seen:
        seen.add(p.key)
        tl = k.timeline(p)
        if tl is not None:
            values = [tl.start.get(var), *(w.new for w in tl.writes if w.var == var)]
            if any(v is not None for v in values):
                return True, tl.final.get(var) if tl.final.get(var) is not None else values[-1]
        p = k.parent(p)
    if given is not None and var in given["env"]:
        return True, given["env"][var]
    return False, None


def cause_of(edge: Edge, have: str | None) -> tuple:
    """What makes findings one cause: the write for a write, the launching process for a spawn, the shell
    line for a shell (every variable an edge lost is one finding)."""
    if edge.kind == "overwritten_in_child":
        return (edge.kind, edge.where, edge.var)
    if edge.kind == "set_after_start":
        return (edge.kind, edge.parent.key if edge.parent else None, edge.where)
    if edge.kind == "shell_prefix":  # a wrapper script that exec'd is one cause in every process it became
        return (edge.kind, (edge.pitfall or {}).get("script") or edge.parent_pid, edge.var)
    return (edge.kind, edge.parent.key if edge.parent else edge.parent_label, have is None)


def rules(m: Model, expect: dict[str, str] | None = None) -> list[Finding]:
    """ENV_MISSING / ENV_CHANGED / ENV_SET_AFTER_START / ENV_OVERRIDDEN / SHELL_PREFIX_SCOPE, one finding
    per edge, and EXEC_ENV_STALE for the endpoints no witness can tell about."""
    expect = dict(expect or {})
    k = Knowledge.of(m)
    names = variables(m, k, expect)
    groups: dict[tuple, dict[str, Any]] = {}
    blind: dict[tuple, list[ProcessView]] = defaultdict(list)
    endpoints = k.endpoints()
    if m.shell_pitfalls:  # (the workers a shell pitfall may reach: asked of every process, so only where one is)
        workers = {p.pid for p in endpoints} | {p.pid for p in m.processes.values() if is_python(p) and not k.helper(p)}
        _pitfall_groups(m, expect, groups, workers)
    for e in endpoints:
        comms = [c for c in m.comms_of(e.host, e.pid, e.retired) if c.env is not None]
        if k.timeline(e) is None and not comms:
            # a stated blind spot where /proc shows a block that is not the process's own (a fork child
            # of a parent whose writes no witness saw, a clobbered block); an unreadable environment is
            # ENV_UNREADABLE's, a zombie or a process gone during the scan has none left to check
            parent = m.parent(e)
            if e.proc_stale in ("fork", "clobbered") or (k.via(e) == "fork" and e.proc_env_reason is None):
                blind[(k.via(e), parent.pid if parent else None, e.proc_stale or e.proc_env_reason)].append(e)
            continue
        mine: dict[tuple, list] = {}  # this endpoint's losses, by cause
        for var in names:
            want = expect.get(var)
            if comms and is_watched(var):  # what each communicator was created with (or NCCL's nccl.conf gave it)
                conf = e.conf_value(var)
                checks = [(True, c.env.get(var, conf[0] if conf else None), c.t, c) for c in comms]
            else:
                known, value = k.value(e, var)
                checks = [(known, value, None, None)]
            for known, have, t, comm in checks:
                if not known:  # an expected name outside the watched set that no witness read here
                    continue
                if var in expect:
                    if have == want:
                        continue
                    target = want
                else:
                    found, target = _reference(k, e, var)
                    if not found or target is None or have == target:
                        continue
                edge = locate(k, e, var, target, t)
                mine.setdefault(cause_of(edge, have), []).append((var, target, have, edge, comm))
        for cause, losses in mine.items():
            # one finding per cause and set of values lost: processes that lost different sets differ
            key = cause if cause[0] == "shell_prefix" else (cause, tuple(sorted({(v, tg, h) for v, tg, h, _, _ in losses},
                                                                              key=str)))
            g = groups.setdefault(key, {"edge": losses[0][3], "items": {}, "pids": [], "instances": [],
                                        "children": [], "key": key})
            for var, target, have, edge, comm in losses:
                g["items"].setdefault(var, (target, have))
                known = g.setdefault("child_ids", set())  # by identity: comparing ProcessViews compares every field
                g["children"].extend(c for c in edge.children if id(c) not in known and not known.add(id(c)))
                g.setdefault("sources", set()).add(comm.env_source if comm else
                                                   "+".join(k.timeline(e).witnesses) if k.timeline(e) else "?")
                inst = at(e.host, e.pid, comm.rank, comm.group or comm.ident) if comm else at(e.host, e.pid)
                # a set beside each list: a cause seen on every host of a fleet would cost hosts^2 by list lookups
                if "instance_keys" not in g:
                    g["instance_keys"] = {tuple(i.values()) for i in g["instances"]}
                if tuple(inst.values()) not in g["instance_keys"]:
                    g["instance_keys"].add(tuple(inst.values()))
                    g["instances"].append(inst)
            if "pid_set" not in g:
                g["pid_set"] = set(g["pids"])
            pids = g["pid_set"]
            if e.pid not in pids:
                pids.add(e.pid)
                g["pids"].append(e.pid)
    out = [_finding(m, g, expect) for g in groups.values() if g["pids"]]
    out += _blind(m, k, blind)
    return out


def _pitfall_groups(m: Model, expect: dict[str, str], groups: dict, workers: set[int]) -> None:
    """Every shell pitfall that reaches a worker (an endpoint, or any interpreter that is no launcher
    helper) is a finding of its own (SHELL_PREFIX_SCOPE), naming those; the endpoints lost at that shell
    join it. One that reaches only the shell's own helpers (`dirname`, a subshell) is none."""
    for pit in m.shell_pitfalls:
        if pit["kind"] in FILTERS:  # a wrapper's filter is an edge only where a value was lost (locate)
            continue
        pit = {**pit, "pids": [p for p in pit["pids"] if p in workers]}
        if not pit["pids"]:
            continue
        shell = next((p for p in m.processes.values() if p.pid == pit.get("started_by", pit["shell"])), None)
        edge = Edge("shell_prefix", pit["var"], shell, [], launcher="shell", witnesses=("proc",), pitfall=pit,
                    parent_label=pit.get("shell_command"), parent_pid=pit.get("started_by", pit["shell"]))
        g = groups.setdefault(cause_of(edge, None), {"edge": edge, "items": {}, "pids": [], "instances": [],
                                                     "children": [], "key": cause_of(edge, None)})
        g["items"].setdefault(pit["var"], (expect.get(pit["var"], pit["value"]), None))
        g["pids"].extend(p for p in pit["pids"] if p not in g["pids"])


def _finding(m: Model, g: dict[str, Any], expect: dict[str, str]) -> Finding:
    edge: Edge = g["edge"]
    edge.children = g["children"] or edge.children
    items: dict[str, tuple] = g["items"]
    names = list(items)
    var = names[0]
    target, have = items[var]
    shown = all(is_watched(v) for v in names)
    expected = [v for v in names if v in expect]
    sev = "error" if expected else "warning"

    def sv(v):
        return "unset" if v is None else (repr(v) if shown else "<value>")
    plural = len(names) > 1
    values = ", ".join(f"{v}={sv(items[v][0])}" if items[v][0] is not None else f"{v} unset" for v in names)
    what = (f"{values} expected" if expected else values)
    lost = "; ".join(_lost(v, tg, h, v in expect) for v, (tg, h) in items.items())
    pids = sorted(set(g["pids"]))
    n = len(pids)
    pid_text = f"{n} process(es) ({', '.join(map(str, pids[:8]))}{'…' if n > 8 else ''})"
    ev: dict[str, Any] = {"vars": {v: {"expected" if v in expect else "reference": t if is_watched(v) else NOT_SHOWN,
                                       "value": h if is_watched(v) else NOT_SHOWN} for v, (t, h) in items.items()},
                          "affected": pids, "checked_at": "communicator creation" if any(
                              i.get("comm") for i in g["instances"]) else "the process's environment",
                          "sources": sorted(s for s in g.get("sources", ()) if s)}
    parent = edge.parent
    pdesc = f"pid {parent.pid} ({program(parent.argv)})" if parent else (edge.parent_label or "?")
    inter = [c for c in edge.children if c.pid not in pids]
    via_inter = f" through {', '.join(f'pid {c.pid} ({program(c.argv)})' for c in inter[:3])}" if inter else ""
    them = "them" if plural else "it"
    kind = edge.kind
    code = "ENV_MISSING" if all(h is None for _, h in items.values()) else "ENV_CHANGED"
    if kind == "shell_prefix":
        pit = edge.pitfall
        code = "SHELL_PREFIX_SCOPE"
        if pit.get("exec"):
            msg = (f"{pit['script']} (run by pid {pit['started_by']}, then exec'd) assigns {pit['var']}="
                   f"{pit['value']} only to `{pit['command']}`, not to `{pit['led_to_target']}`, which became "
                   f"{pid_text}")
        elif pit["kind"] == "prefix":
            msg = (f"shell pid {pit['shell']} assigns {pit['var']}={pit['value']} only to `{pit['command']}`, "
                   f"not to `{pit['led_to_target']}`, which started {pid_text}")
        else:
            msg = (f"shell pid {pit['shell']} sets {pit['var']}={pit['value']} as an unexported shell variable; "
                   f"`{pit['led_to_target']}` does not get it ({pid_text})")
        words = [w for w in (pit.get("command") or "").split() if "=" not in w]
        where = f"in {pit['script'].rsplit('/', 1)[-1]}" if pit.get("exec") else f"(shell pid {pit['shell']})"
        culprit = (f"prefix on `{words[0]}` only {where}" if pit["kind"] == "prefix" and words
                   else f"unexported in shell pid {pit['shell']}")
        ev.update({"shell": pit["shell"], "shell_command": pit.get("shell_command"),
                   "assigned_in": pit.get("command") or "(bare assignment)",
                   "command_that_led_here": pit.get("led_to_target")})
        sev = "error" if expected and expect.get(var) == pit["value"] else "warning"
        if not g["instances"]:  # the shell's findings come from /proc: the processes of that host
            host = shell.host if (shell := edge.parent) is not None else None
            g["instances"] = [at(q.host, q.pid) for q in m.processes.values() if q.pid in pids
                              and (host is None or q.host == host)] or [at(None, p) for p in pids]
    elif kind == "set_after_start":
        code = "ENV_SET_AFTER_START"
        ev.update(where=edge.where, written_at=edge.written_at, new=edge.new)
        started = [s for s in (start_of(c) for c in edge.children) if s is not None]
        dt = f" {edge.written_at - min(started):.2f} s" if started and edge.written_at else ""
        how = {"fork": "been forked", "forkserver": "been forked by the forkserver",
               "spawn": "been spawned"}.get(edge.via, "started")
        first = ", ".join(f"pid {c.pid} ({program(c.argv)})" for c in inter[:3]) if inter else "the processes"
        msg = (f"{edge.where or pdesc} set {var}={sv(edge.new)}{dt} after {first} had {how}: {pid_text} never "
               f"got it" + (f" ({what})" if expected and target != edge.new else ""))
        culprit = f"set after start at {_short_where(edge.where)}"
        if edge.where in LIVE_WHERES:  # memory reads date a value by their bracket (after, t], not at its write
            after, s0 = edge.written_after, min(started) if started else None
            ev["written_at"], ev["written_between"] = None, [after, edge.written_at]
            who = f"pid {parent.pid}" if parent else "the parent"
            if after is not None and started and all(
                    (x := start_of(c)) is not None and x + TICK_S <= after for c in edge.children):
                msg = (f"{pdesc} set {var}={sv(edge.new)} in-process after {first} had {how}: its memory did not hold "
                       f"it at a read {after - s0:.2f} s after that start and did at a read {edge.written_at - s0:.2f} "
                       f"s after: {pid_text} never got it" + (f" ({what})" if expected and target != edge.new else ""))
                culprit = f"set after start in {who} (between two reads of its memory)"
            else:
                when = "when is not known" if after is None else (
                    "between two reads of its memory" + (f", {after - s0:+.2f} s and {edge.written_at - s0:+.2f} s "
                                                         "from their start" if s0 is not None else ""))
                msg = (f"{pdesc} holds {var}={sv(edge.new)} now, set in-process (read from its memory; {when}), but "
                       f"{pid_text} it started{via_inter} do not have it: it was set after they had "
                       f"{how}, or they were started with an environment of their own"
                       + (f" ({what})" if expected and target != edge.new else ""))
                culprit = (f"set in-process in {who} (time unknown)" if after is None
                           else f"set in-process in {who} (around their start)")
    elif kind == "overwritten_in_child":
        code = "ENV_OVERRIDDEN"
        ev.update(where=edge.where, old=edge.old, new=edge.new, t=edge.written_at)
        msg = (f"{edge.where} changed {var} from {sv(edge.old)} to {sv(edge.new)} in {pid_text}"
               + (f" ({what})" if expected else ""))
        culprit = "set by native code (C setenv)" if edge.where == LIVE_NATIVE else _short_where(edge.where)
    elif kind == "curated_env" and edge.pitfall:  # a filtering wrapper the script names, at its line
        pit = edge.pitfall
        kept = [n for n in pit.get("kept") or () if n != "TERM" or pit["kind"] != "su"]
        child = program(edge.children[0].argv) if edge.children else "the command"
        passed = (f"with {len(kept)} variable{'s' if len(kept) != 1 else ''} ({', '.join(kept)})" if kept else
                  "with none of the caller's variables") if pit["var"] == "*" else f"without {pit['var']}"
        msg = (f"{pid_text}: {lost}; `{pit['kind']}` ({pit.get('where')}) started {child} {passed}: "
               f"`{pit.get('led_to_target')}`")
        ev.update({"wrapper": pit["kind"], "at": pit.get("where"), "kept": kept, "command": pit.get("led_to_target")})
        culprit = f"dropped by `{pit['kind']}` at {pit.get('where')}"
    elif kind == "curated_env" and edge.spawn is not None and edge.spawn.env_given:
        sp = edge.spawn
        started = program(sp.argv) if sp.argv else program(edge.children[0].argv if edge.children else None)
        missing = ", ".join(names)
        msg = (f"{sp.site} started `{started}` with {sp.env_text()}: {missing} not passed"
               f" ({pid_text}: {lost}; {pdesc} had {them}{via_inter})")
        culprit = f"curated env from {program(parent.argv) if parent else '?'}"
    elif kind == "curated_env" and (line := _filtered_in(m, edge, parent)) is not None:  # `env -i python3 w.py`
        msg = (f"{pid_text}: {lost}; {pdesc} had {them}, and `{edge.launcher}` {line} started them{via_inter} "
               "with an environment of its own")
        culprit = f"dropped by `{edge.launcher}` {line}"
    elif kind == "curated_env":
        msg = (f"{pid_text}: {lost}; {pdesc} had {them} when it started them{via_inter}, with an environment of "
               "its own")
        culprit = f"curated env from {program(parent.argv) if parent else 'ncclprobe run'}"
    elif kind == "dropped_by_intermediate":
        msg = (f"{pid_text}: {lost}; {pdesc}, not Python, had {them} in its environment and started"
               f"{via_inter or ' them'} without" + (f" (`{edge.pitfall['kind']}` at {edge.pitfall.get('where')})"
                                                    if edge.pitfall else ""))
        culprit = f"dropped by {program(parent.argv) if parent else '?'}"
    elif kind == "unseen" and parent is None and edge.parent_label and edge.parent_label.startswith("the process outside"):
        msg = (f"{pid_text}: {lost}; {pid_text} ran in a pid namespace of its own, and no witness saw it from "
               f"outside (it ended before run's /proc watch looked), so {edge.parent_label} is not known: the "
               "edge where it went is above it")
        culprit = "lost outside its pid namespace (edge unseen)"
    elif kind == "unseen" and parent is None:
        msg = (f"{pid_text}: {lost}, at communicator creation; no witness saw these processes' own environments, "
               "so where it was lost is not known")
        culprit = "at communicator creation"
    elif kind == "unseen":
        msg = (f"{pid_text}: {lost}; the edge where it went is above {pdesc}, whose environment no witness could "
               "read")
        culprit = f"lost above pid {parent.pid}" if parent else "lost (edge unseen)"
    else:  # not_in_root
        without = them if code == "ENV_MISSING" else ("those values" if plural else "that value")  # (it had another)
        msg = (f"{pid_text}: {lost}; the root {pdesc} was started without {without}"
               + (" (ncclprobe run did not give it to CMD)"
                  if m.given_for(parent or next(iter(edge.children), None)) else ""))
        if parent is not None and is_python(parent) and "boot" not in parent.sources:
            msg += (f"; /proc shows only what pid {parent.pid} was started with, so a write inside it (after it "
                    "started these) is not visible here")
        culprit = "not in the root's environment"
    return Finding(code, sev, msg, tuple(pids), None if plural else var, ev, _hint(edge, items),
                   instances=tuple(g["instances"]), vars=tuple(names) if plural else (), culprit=culprit,
                   cause=("edge", g["key"]), edge=edge.to_json())


def _lost(var: str, target: str | None, have: str | None, expected: bool) -> str:
    """One variable's loss in words; a value outside the watched set is never shown (it may be a secret)."""
    if not is_watched(var):
        return f"{var} is absent (expected)" if have is None else f"{var} differs from the expected value"
    want = f"expected {target!r}" if expected else f"{target!r} upstream"
    return f"{var} absent ({want})" if have is None else f"{var}={have!r} ({want})"


def _blind(m: Model, k: Knowledge, blind: dict[tuple, list[ProcessView]]) -> list[Finding]:
    """The endpoints no witness can tell about: stated, with what would show them."""
    out = []
    for key, members in blind.items():
        pids = tuple(sorted({p.pid for p in members}))
        via, ppid, reason = key
        if via == "fork" and reason in (None, "fork"):
            msg = (f"{len(pids)} fork child(ren) of pid {ppid} never exec'ed: their environment is pid {ppid}'s "
                   "at the fork, which /proc cannot show (it shows the parent's exec-time block): expectations "
                   "were not checked on them")
        elif reason == "clobbered":
            msg = (f"{len(pids)} process(es) overwrote their exec-time environment block (setproctitle or similar): "
                   "/proc no longer shows what they started with; expectations were not checked on them")
        else:
            msg = (f"the environment of {len(pids)} process(es) could not be read ({reason or 'no witness'}): "
                   "expectations were not checked on them")
        out.append(Finding("EXEC_ENV_STALE", "warning", msg, pids, None,
                           {"parent": ppid, "via": via, "reason": reason, "unchecked": list(pids)},
                           ("set SPT_NOENV=1 where they start (py-setproctitle then leaves environ alone), or "
                            if reason == "clobbered" else "") + "see the live values: " + LIVE_VIEW,
                           instances=tuple(at(p.host, p.pid) for p in members), cause=("blind",) + key))
    return out
