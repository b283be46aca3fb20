"""The answer first: for each NCCL variable the user set or expected (or a finding is about), what each
communicator ended up with — or each process, where none was created — grouped by value, with the
culprit of each deviation. Built from the model alone (report, run, inspect, demo); every
line says which witnesses it rests on."""
from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ncclprobe.model import wiring
from ncclprobe.diagnose.findings import Finding
from ncclprobe.diagnose.inprocess import process_cached
from ncclprobe.model import CommView, Model, NcclRead, ranges
from ncclprobe.model.watched import is_watched

MAX_VARS = 8
UNREAD = "?"  # the value of a holder no witness read (JSON "?", text `?`): a value like any other, never left out
UNREAD_WHY = "no witness read it"
SHORT_ID = 10  # "0x716f11d6": enough to tell a job's communicators apart on screen (JSON has the whole id)


@dataclass
class Group:
    """Holders of one value of one variable that share a culprit."""
    value: str | None
    culprit: str = ""
    comms: list[str] = field(default_factory=list)        # communicator ids (one per communicator, all ranks)
    names: list[str] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    nranks: set[int] = field(default_factory=set)
    processes: list[tuple[str, int]] = field(default_factory=list)  # (host, pid) of holders without a communicator
    pids: set[tuple[str, int]] = field(default_factory=set)
    conf: list[str] = field(default_factory=list)   # "file:line" of an nccl.conf file that supplies the value

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "culprit": self.culprit or None, "communicators": self.comms,
                "ranks": sorted(self.ranks), "processes": [{"host": h, "pid": p} for h, p in self.processes],
                "pids": sorted(p for _, p in self.pids), "hosts": sorted({h for h, _ in self.pids}),
                "conf_files": self.conf}


@dataclass
class Row:
    var: str
    reference: str | None          # the value the user expected or set (None: none given)
    basis: str                     # "expected" | "set by ncclprobe run" | "root process" | ""
    groups: list[Group]

    def to_json(self) -> dict[str, Any]:
        return {"var": self.var, "reference": self.reference, "basis": self.basis or None,
                "groups": [g.to_json() for g in self.groups]}


@dataclass
class Verdict:
    rows: list[Row]
    holders: str                   # "communicators" | "processes"
    witnesses: list[str]
    more_vars: int = 0
    note: str = ""
    time: list = field(default_factory=list)  # (line, model.timing.CommTime) per communicator the profiler counted
    unchecked: Any = None  # diagnose.coverage.Unchecked: the expectation was checked on no process (exit 3)
    exit: bool = True      # whether `unchecked` decides the exit code (not where errors were found beside it)

    def to_json(self) -> dict[str, Any]:
        return {"holders": self.holders, "witnesses": self.witnesses, "variables": [r.to_json() for r in self.rows],
                "more_variables": self.more_vars, "note": self.note or None,
                "time": [{"line": line, **t.to_json()} for line, t in self.time],
                "unchecked": self.unchecked.to_json() if self.unchecked is not None else None}

    @property
    def code(self) -> int | None:
        """The exit code the verdict itself calls for: 3 when the expectation was checked nowhere."""
        from ncclprobe.diagnose.findings import EXIT_UNEXAMINABLE
        return EXIT_UNEXAMINABLE if self.unchecked is not None and self.exit else None


# ---- what NCCL used -------------------------------------------------------------------------------

def nccl_read(m: Model, c: CommView, var: str) -> NcclRead | None:
    """What NCCL itself read of var for this communicator: for a variable NCCL re-reads per
    communicator, the first read after this communicator started (else the last one before it); for
    a cached one (NCCL_PARAM), the process's first read through the same library copy."""
    p = m.owner(c)
    if p is None:
        return None
    reads = [r for r in p.reads_by_var().get(var, ()) if c.lib is None or r.lib in (c.lib, "nccl-log")]
    return _pick(reads, var, c, _next_comm(m, c)) if reads else None


def _next_comm(m: Model, c: CommView) -> float:
    ordered = m.comms_by_time(c.host, c.pid, c.retired)
    i = bisect.bisect_right(ordered, c.t, key=lambda x: x.t)  # the first created after c, in log time
    return ordered[i].t if i < len(ordered) else float("inf")


def _pick(reads: list[NcclRead], var: str, c: CommView, end: float, cached: bool | None = None) -> NcclRead | None:
    """nccl_read's choice among the reads of var through c's library copy (in time order); end: when
    the process's next communicator was created; cached: process_cached(var, c.version) where known."""
    if process_cached(var, c.version) if cached is None else cached:
        return reads[0]
    inside = [r for r in reads if c.t <= r.t < end]
    if c.nranks == 1:
        # NCCL does not tune a one-rank communicator (observed.md): another one's read is not its read
        return inside[0] if inside else None
    before = [r for r in reads if r.t < c.t]
    return inside[0] if inside else (before[-1] if before else reads[0])


# Why a communicator's "NCCL read" has no value (JSON: nccl_read_reason) -> the words the report shows
NOT_READ = {
    "no_witness": "not seen (no env plugin, no NCCL log)",
    "one_rank": "not read (1 rank: NCCL does not tune a one-rank communicator)",
    "none_read": "not read (the env plugin saw NCCL read no tuning variable)",
    "log_silent": "none set by environment (NCCL's log; it does not print unset ones)",
}


@dataclass(frozen=True)
class CommReads:
    """What NCCL itself read of the tuning variables for one communicator, and why it says no more:
    values is None where no witness could see NCCL's reads (reason "no_witness"); a one-rank
    communicator's per-communicator variables are never read ("one_rank")."""
    values: dict[str, str | None] | None   # variable -> the value NCCL got (None: read, unset)
    reason: str | None = None              # a NOT_READ key, or None when values say it all

    def to_json(self) -> dict[str, Any]:
        return {"nccl_read": self.values, "nccl_read_reason": self.reason}


def _reads_witness(p, lib: str | None) -> str | None:
    """Which witness could see NCCL's reads through this library copy: "envplugin" (every read, set or
    not), "nccl-log" (only what it prints: the variables set by environment), or None."""
    plugin = any(r.source == "envplugin" and (lib is None or r.lib == lib) for r in p.reads.values()) or any(
        pl.get("src") == "envplugin" and (lib is None or pl.get("lib") in (lib, None)) for pl in p.plugins)
    if plugin:
        return "envplugin"
    return "nccl-log" if any(r.source == "nccl-log" for r in p.reads.values()) else None


def comm_reads(m: Model, c: CommView) -> CommReads:
    """The tuning variables NCCL read for c (nccl_read per variable); where it read none, the reason,
    never a default shown as a fact."""
    from ncclprobe.diagnose.inprocess import is_tuning, process_cached
    if c.env_source == "nccl-log" and c.env is not None:  # the log's own lines, attributed to c (nccllog_model)
        values: dict[str, str | None] = {k: v for k, v in sorted(c.env.items()) if is_tuning(k)}
        witness = "nccl-log"
    else:
        p = m.owner(c)
        witness = _reads_witness(p, c.lib) if p is not None else None
        if witness is None:
            return CommReads(None, "no_witness")
        end = _next_comm(m, c)
        values = {}
        for var, reads in sorted(p.reads_by_var().items()):  # nccl_read for each variable
            if not is_tuning(var):
                continue
            if c.lib is not None:
                reads = [r for r in reads if r.lib in (c.lib, "nccl-log")]
            pick = _pick(reads, var, c, end) if reads else None
            if pick is not None:
                values[var] = pick.value
    if c.nranks == 1 and all(process_cached(v, c.version) for v in values):
        return CommReads(values, "one_rank")
    if not values:
        return CommReads(values, "none_read" if witness == "envplugin" else "log_silent")
    return CommReads(values)


def effective(m: Model, c: CommView, var: str, memo: dict | None = None) -> tuple[bool, str | None]:
    """(known, value) of var for communicator c: what NCCL read where the env plugin or its log saw
    it, else the environment at the communicator's creation; a variable NCCL caches per process takes
    the value at the process's first communicator. memo: what one caller asking of many communicators and
    variables keeps between calls (each communicator's owner's reads and end, each process's first
    communicator, whether NCCL caches a variable); the model must not change meanwhile."""
    if c.env_source == "nccl-log" and c.env is not None:  # what the log says NCCL read for this one
        return True, c.env.get(var)
    memo = {} if memo is None else memo
    facts = memo.get(id(c))
    if facts is None:  # nccl_read's owner, reads and end, once per communicator (the memo holds c: its id stays)
        p = m.owner(c)
        facts = memo[id(c)] = (c, p.reads_by_var() if p is not None else {}, _next_comm(m, c) if p is not None else 0)
    _, by_var, end = facts
    cached = memo.get((var, c.version))
    if cached is None:
        cached = memo[(var, c.version)] = process_cached(var, c.version)
    reads = by_var.get(var)
    if reads:
        if c.lib is not None:
            reads = [r for r in reads if r.lib in (c.lib, "nccl-log")]
        read = _pick(reads, var, c, end, cached) if reads else None
        if read is not None:
            return True, read.value
    if cached:
        owner = (c.host, c.pid, c.retired)
        if owner not in memo:
            memo[owner] = next((x for x in m.comms_by_time(*owner) if x.env is not None), None)
        first = memo[owner]
        if first is not None:
            return True, first.env.get(var)
    return (c.env is not None), (c.env or {}).get(var)


# ---- building --------------------------------------------------------------------------------------

def variables(expect: Mapping[str, str], sets: Mapping[str, str], findings: list[Finding],
              envs=()) -> list[str]:
    """The variables the verdict is about: expected, set by `run`, named by a finding; with none of
    those, the NCCL tuning variables the holders' environments have."""
    from ncclprobe.diagnose.inprocess import is_tuning
    names = list(expect) + [v for v in sets if v not in expect]
    for f in findings:
        if f.severity != "info":
            names += [v for v in f.all_vars if v.startswith("NCCL_") and v not in names]
    if not names:
        names = sorted({v for env in envs if env for v in env if is_tuning(v)})
    return [v for v in dict.fromkeys(names) if is_watched(v)]  # others may be secrets: findings only


def _culprits(findings: list[Finding]) -> dict[tuple, list[tuple[Finding, str | None]]]:
    """(host, pid, var) -> [(finding, the communicator its instance names or None)], most severe first."""
    out: dict[tuple, list] = {}
    for f in sorted((f for f in findings if f.severity != "info"), key=lambda f: f.severity != "error"):
        for i in f.instances:
            for var in f.all_vars:
                out.setdefault((i.get("host"), i.get("pid"), var), []).append((f, i.get("comm")))
    return out


def _culprit_of(index, host, pid, var, comm: str | None, deviates: bool) -> str:
    """A finding that names this communicator is its culprit; one about its whole process only where
    its value deviates (a write after the communicator was created did not reach it)."""
    hits = index.get((host, pid, var), [])
    for f, c in hits:
        if comm is not None and c == comm:
            return f.culprit or f.code
    for f, c in hits:
        if c is None and deviates:
            return f.culprit or f.code
    return ""


def _group(groups: dict, value, culprit) -> Group:
    culprit = culprit or (UNREAD_WHY if value == UNREAD else "")
    key = (value, culprit)
    if key not in groups:
        groups[key] = Group(value, culprit)
    return groups[key]


def _ordered(groups: dict, reference: str | None) -> list[Group]:
    """The reference value without a culprit first, then the most held, then by value."""
    def key(g: Group):
        return (g.value != reference or bool(g.culprit), -(len(g.comms) + len(g.processes)), str(g.value))
    return sorted(groups.values(), key=key)


def for_model(m: Model, findings: list[Finding], expect: Mapping[str, str],
              sets: Mapping[str, str] | None = None) -> Verdict:
    """The verdict over the model's communicators (and processes without one that a finding is about);
    with no communicator, over the processes the rules check (for_processes). Where the expectation could
    be checked on no process at all, it says so (coverage.unchecked)."""
    from ncclprobe.diagnose import coverage
    from ncclprobe.diagnose.propagation import Knowledge
    k = Knowledge.of(m)  # the rules' timelines, for the holders and the coverage check
    v = _for_model(m, findings, expect, sets, k)
    v.unchecked = coverage.unchecked(m, dict(expect), k)
    if v.unchecked is not None and v.unchecked.partial and any(f.severity == "error" for f in findings):
        v.exit = False  # said first all the same; the errors found on the others decide the exit code
    return v


def _for_model(m: Model, findings: list[Finding], expect: Mapping[str, str],
               sets: Mapping[str, str] | None = None, k=None) -> Verdict:
    sets = dict(sets if sets is not None else _run_sets(m))
    comms = [c for c in m.comms if c.ok]
    names = variables(expect, sets, findings, [c.env for c in comms])
    witnesses = sorted({s for p in m.processes.values() for s in p.sources} | {s for c in m.comms for s in c.seen_by})
    if not comms:
        v = for_processes(m, findings, expect, sets, witnesses, k)
        if set(witnesses) - {"proc", "live"}:  # probes ran and saw none (a /proc view alone never could)
            v.note = "no communicator was seen: the values are the processes' environments"
        return v
    index = _culprits(findings)
    roots = [p for p in m.processes.values() if (p.host, p.ppid) not in m.processes and p.start_env is not None]
    root_env = min(roots, key=lambda p: p.t_start or 0).start_env if roots else {}
    shown, more = names[:MAX_VARS], max(len(names) - MAX_VARS, 0)
    rows, memo = [], {}
    by_rank = sorted(comms, key=lambda c: (c.rank is None, c.rank or 0, c.host, c.pid))
    for var in shown:
        reference, basis = _reference(var, expect, sets, root_env)
        groups: dict = {}
        listed: set[tuple[int, str]] = set()  # (group, communicator) already in g.comms: no scan of the list
        for c in by_rank:
            known, value = effective(m, c, var, memo)
            value = value if known else UNREAD
            ident = c.group or c.ident  # one communicator, all its ranks
            g = _group(groups, value, _culprit_of(index, c.host, c.pid, var, ident, value != reference))
            if (id(g), ident) not in listed:
                listed.add((id(g), ident))
                g.comms.append(ident)
                if c.comm_name:
                    g.names.append(c.comm_name)
            if c.rank is not None:
                g.ranks.add(c.rank)
            if c.nranks is not None:
                g.nranks.add(c.nranks)
            g.pids.add((c.host, c.pid))
        with_comm = {(c.host, c.pid) for c in comms}
        for (host, pid, v), hits in index.items():
            if v != var or (host, pid) in with_comm or (host, pid) not in m.processes:
                continue
            p = m.processes[(host, pid)]
            env = _live_env(p)
            value = env.get(var) if env is not None else UNREAD
            g = _group(groups, value, hits[0][0].culprit or hits[0][0].code)
            g.processes.append((host, pid))
            g.pids.add((host, pid))
        rows.append(Row(var, reference, basis, _ordered(groups, reference)))
    return Verdict(rows, "communicators", witnesses, more, time=time_lines(m))


def time_lines(m: Model) -> list:
    """(line, CommTime) per communicator whose collectives the profiler plugin counted."""
    from ncclprobe.model import timing
    return [(timing.time_line(t, comm_label(t.ident, t.name, t.ranks, t.nranks)), t) for t in timing.comm_times(m.comms)]


def comm_label(ident: str, name: str | None, ranks, nranks: int | None) -> str:
    """`decode comm 0x2142313c (ranks 0-1 of 2)`: how a line names one communicator."""
    who = f"{name} comm {short_id(ident)}" if name else f"comm {short_id(ident)}"
    if ranks:
        who += f" (rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)}" + (f" of {nranks})" if nranks else ")")
    return who


def _live_env(p) -> dict[str, str] | None:
    """What p holds last: the boot probe's start environment and writes, else what its memory showed
    (run --live, inspect --live)."""
    from ncclprobe.diagnose.inprocess import env_at
    if p.start_env is None and p.live_env is not None:
        return dict(p.live_env)
    return env_at(p, None)


def _run_sets(m: Model) -> dict[str, str]:
    """What `run` set: --set (CMD's environment) and --enforce (the boot probe's profile)."""
    out: dict[str, str] = {}
    for run in m.runs:
        if not isinstance(run, dict):
            continue
        prof = run.get("profile")
        for values in (run.get("set"), prof.get("set") if isinstance(prof, dict) else None):
            if isinstance(values, dict):
                out.update({str(k): str(v) for k, v in values.items()})
    return out


def _reference(var, expect, sets, root_env) -> tuple[str | None, str]:
    if var in expect:
        return expect[var], "expected"
    if var in sets:
        return sets[var], "set by ncclprobe run"
    if root_env is not None:
        return root_env.get(var), "root process"
    return None, ""


def for_processes(m: Model, findings: list[Finding], expect: Mapping[str, str],
                  sets: Mapping[str, str] | None = None, witnesses: list[str] | None = None, k=None) -> Verdict:
    """The verdict over the processes the rules check (propagation's endpoints: the workers, not their
    launchers), where no communicator was seen: what each holds as far as the witnesses tell (the boot
    probe's record, the live read, else the exec-time block; unknown where that block is not its own), and
    where its environment lacks a value, what an nccl.conf file gives NCCL in a process that loads it."""
    from ncclprobe.diagnose.propagation import Knowledge
    from ncclprobe.model.launchers import client_of
    k = k if k is not None else Knowledge.of(m)
    sets = dict(sets if sets is not None else _run_sets(m))
    # a client (srun, ssh, docker) holds what its workers were meant to get, not what they got
    holders = sorted((p for p in k.endpoints() if client_of(p.argv, p.exe) is None), key=lambda p: (p.host, p.pid))
    index = _culprits(findings)
    names = variables(expect, sets, findings, _job_envs(k, holders))
    root = min((p for p in m.processes.values() if k.parent(p) is None and k.timeline(p) is not None),
               key=lambda p: (p.t_start or p.proc_start or 0), default=None)
    shown, more = names[:MAX_VARS], max(len(names) - MAX_VARS, 0)
    rows = []
    for var in shown:
        reference, basis = _reference(var, expect, sets, k.timeline(root).final if root is not None else None)
        groups: dict = {}
        for p in holders:
            value, conf = _held(k, p, var)
            g = _group(groups, value, _culprit_of(index, p.host, p.pid, var, None, value != reference))
            g.processes.append((p.host, p.pid))
            g.pids.add((p.host, p.pid))
            if conf and conf not in g.conf:
                g.conf.append(conf)
        if not groups:  # never an empty line: that nobody could be read is the answer
            _group(groups, UNREAD, "no witness read any worker")
        rows.append(Row(var, reference, basis, _ordered(groups, reference)))
    seen = witnesses if witnesses is not None else sorted({s for p in m.processes.values() for s in p.sources})
    return Verdict(rows, "processes", seen or ["proc"], more)


def _job_envs(k, holders):
    """The holders' job environments (ncclprobe's wiring left out), each shared one once (processes
    started alike share theirs), as variables() asks for them: only where nothing else names a variable."""
    seen: dict[int, Any] = {}  # each one kept alive while its id is in here
    for p in holders:
        env = k.value_env(p)
        if id(env) not in seen:
            seen[id(env)] = env
            yield wiring.job_env(env)


def _held(k, p, var: str) -> tuple[str | None, str | None]:
    """(value, conf file:line) of var in p now: "?" where no witness can tell; a conf file's value where
    the environment has none and NCCL runs in p (NCCL applies the file with setenv(..., 0))."""
    known, value, conf = k.effective(p, var)
    return (value, conf) if known else (UNREAD, None)


# ---- names on screen (views/verdict.py draws the verdict) -------------------------------------

def short_id(ident: str) -> str:
    """A communicator's id on screen: its commHash's first hex digits, or its unique id's."""
    return f"uid {ident[4:4 + SHORT_ID]}" if ident.startswith("uid:") else ident[:SHORT_ID]
