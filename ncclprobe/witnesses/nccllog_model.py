"""NCCL's own INFO log as one more witness in the model: what NCCL says it read ("set by
environment") for each communicator, the communicators it initialised, and the algorithm/protocol its
tuner picked for their collectives.

A process's lines come in the order NCCL wrote them, each with its thread id, and are attributed by
that order (src/init.cc, src/graph/tuning.cc, src/enqueue.cc of 2.18-2.30):
- A variable NCCL re-reads per communicator (NCCL_PROTO, NCCL_ALGO in ncclTopoTuneModel, ...) is printed
  on the thread that runs that communicator's init, between its "Init START" and "Init COMPLETE" lines
  (2.18 prints no START: from that thread's previous COMPLETE). One NCCL caches per process (NCCL_PARAM)
  is printed once, at its first read, and holds for every communicator of the process alive by then.
- Where a process's log shows NCCL's ENV subsystem was on (one NCCL_ENV "set by environment" line), a
  variable without a line is unset for a communicator; without one, its environment is unknown.
- TUNING lines name no communicator, and only a communicator's rank 0 prints them. A line goes to the
  communicator of the oldest pending COLL line of the same collective ("%s: opCount ... comm %p",
  NCCL_DEBUG_SUBSYS=COLL), on the same thread first; else to the only live multi-rank communicator the
  process is rank 0 of; else to the only one of those whose NCCL_PROTO/NCCL_ALGO allows what ran (so a
  mismatch is never concluded from a guess). Anything else stays unattributed, and is counted.
Memory is bounded by the caps below, whatever the log's size; what passes a cap is counted.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field

from ncclprobe.model import catalog, tuning

from ncclprobe.witnesses import events, nccllog
from ncclprobe.model import CollStat, CommView, Model, NcclRead, ProcessView, comm_id
from ncclprobe.model.tuning import canonical

# "set by environment" lines printed at NCCL_ALL whatever NCCL_DEBUG_SUBSYS says (ncclGetLevel in
# src/graph/paths.cc; NCCL_COLLNET_ENABLE in src/init.cc before 2.28): no proof the ENV subsystem was on.
_ALL_SUBSYS = frozenset({"NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL", "NCCL_COLLNET_ENABLE"})
_NO_TUNING = frozenset({"Send", "Recv"})   # point-to-point calls print a COLL line, never a TUNING line
PENDING_MAX = 64          # COLL lines waiting for their TUNING line, per process
TIEBREAK_MAX = 64         # live rank-0 communicators up to which the NCCL_PROTO/NCCL_ALGO test is tried
MAX_PROCESSES = 65_536
MAX_COMMS = 16_384        # per process
MAX_VARS = 1_024          # distinct variables, and distinct (variable, value) reads, per process
MAX_THREADS = 4_096       # threads with an open init window or pending env lines, per process

SEVERAL = "NCCL log TUNING lines that fit several communicators (unattributed)"
NO_COMM = "NCCL log TUNING lines with no rank-0 communicator before them (unattributed)"
OVER_CAP = "NCCL log records past a size limit (counted, not modelled)"


@dataclass(eq=False)
class LogComm:
    """One communicator as the log shows it; a pointer NCCL reuses after a destroy is a new one."""
    host: str
    pid: int
    comm: str
    rank: int | None = None
    nranks: int | None = None
    api: str | None = None
    dev: int | None = None
    comm_id: int | None = None
    parent: str | None = None
    color: int | None = None
    key: int | None = None
    completed: bool = False
    ended: bool = False
    end_seq: int | None = None
    window: dict[str, str] = field(default_factory=dict)     # first value of each variable its init printed
    colls: dict[tuple, CollStat] = field(default_factory=dict)
    basis: Counter = field(default_factory=Counter)         # how its TUNING lines were attributed
    env: dict[str, str] | None = None                       # what it got, per the log (finish())

    @property
    def tunes(self) -> bool:
        """Rank 0 prints TUNING lines; a single rank takes NCCL's shortcut and tunes nothing."""
        return self.rank == 0 and self.nranks != 1 and not self.ended


@dataclass(eq=False)
class LogProcess:
    host: str
    pid: int
    comms: list[LogComm] = field(default_factory=list)
    version: int | None = None
    simulated: bool = False
    plugins: dict[tuple, None] = field(default_factory=dict)
    first: dict[str, tuple[int, str]] = field(default_factory=dict)   # var -> (seq, first value printed)
    reads: dict[tuple[str, str], LogComm | None] = field(default_factory=dict)  # -> whose init printed it
    env_subsys: bool = False
    no_cache: set[str] = field(default_factory=set)
    unattributed: dict[tuple, CollStat] = field(default_factory=dict)
    why: Counter = field(default_factory=Counter)
    seq: int = 0
    live: dict[str, LogComm] = field(default_factory=dict)         # pointer -> not yet destroyed
    tuners: dict[str, LogComm] = field(default_factory=dict)       # the live ones that print TUNING lines
    window: dict[int, LogComm] = field(default_factory=dict)       # tid -> whose init runs on it
    pending_env: dict[int, dict[str, str]] = field(default_factory=dict)  # tid -> since its last init (2.18)
    calls: deque = field(default_factory=lambda: deque(maxlen=PENDING_MAX))  # (tid, func, LogComm)


def _ptr(text: str | None) -> str | None:
    """One spelling for a pointer printed by %p ("0x55d0..." -> model.comm_id's "0x" + 16 digits, as the
    probes write it; "(nil)" stays)."""
    if not text:
        return None
    t = text.strip().lower()
    return comm_id(t) or t

def _add(stats: dict[tuple, CollStat], t: nccllog.Tuning) -> None:
    key = (t.func or "?", canonical(t.algo), canonical(t.proto or "?"), t.nchannels or 0)
    s = stats.get(key)
    if s is None:
        stats[key] = CollStat(*key, t.nbytes, t.nbytes, 1)
    else:
        s.bytes_min, s.bytes_max, s.count = min(s.bytes_min, t.nbytes), max(s.bytes_max, t.nbytes), s.count + 1


def _allows(c: LogComm, t: nccllog.Tuning) -> bool:
    for var, universe, got in (("NCCL_PROTO", tuning.PROTOS, t.proto), ("NCCL_ALGO", tuning.ALGOS, t.algo)):
        ok = tuning.allowed(c.window.get(var), t.func or "", universe)
        if ok is not None and got in universe and got not in ok:
            return False
    return True


class Attribution:
    """Feed it the log's records in order (nccllog.parse_files(paths, sink=a.feed)), then finish()."""

    def __init__(self) -> None:
        self.procs: dict[tuple[str, int], LogProcess] = {}
        self.over_cap = 0

    def feed(self, rec) -> None:
        at = rec.at
        if at.pid is None or at.host is None:
            return
        p = self.procs.get((at.host, at.pid))
        if p is None:
            if len(self.procs) >= MAX_PROCESSES:
                self.over_cap += 1
                return
            p = self.procs[(at.host, at.pid)] = LogProcess(at.host, at.pid)
        p.seq += 1
        handler = self._handlers.get(type(rec))
        if handler is not None:
            handler(self, p, rec)

    def finish(self) -> None:
        for p in self.procs.values():
            for c in p.comms:
                c.env = _env(p, c)

    def drop_state(self) -> None:
        """After finish(): what only the reading needed (the open windows, the live and pending ones, each
        variable's first sighting) let go, so that what merge() takes is all there is to hand over (a
        fleet's parse comes back from another process: 2.9 -> 2.0 MiB at 256 hosts)."""
        pool = events.Strings()  # equal strings made one object: a pickle holds each once (values repeat per rank)

        def same(text):
            return text if text is None else pool.one(text)
        for p in self.procs.values():
            p.first, p.live, p.tuners, p.window, p.pending_env = {}, {}, {}, {}, {}
            p.calls.clear()
            p.host = same(p.host)
            p.reads = {(same(var), same(value)): c for (var, value), c in p.reads.items()}
            for c in p.comms:
                c.window, c.basis = {}, Counter()
                c.host, c.api = p.host, same(c.api)
                if c.env is not None:
                    c.env = {same(var): same(value) for var, value in c.env.items()}

    # ---- records

    def _version(self, p: LogProcess, rec: nccllog.VersionLine) -> None:
        p.version = p.version or rec.code   # a second libnccl copy prints its own; the first stays
        p.simulated = p.simulated or rec.simulated

    def _plugin(self, p: LogProcess, rec: nccllog.PluginLoaded) -> None:
        if len(p.plugins) < 64:
            p.plugins.setdefault((rec.kind, rec.name, rec.version))

    def _no_cache(self, p: LogProcess, rec: nccllog.CacheDisabled) -> None:
        if len(p.no_cache) < MAX_VARS:
            p.no_cache.add(rec.var)

    def _env_line(self, p: LogProcess, rec: nccllog.EnvSetting) -> None:
        var, value, tid = rec.var, rec.value, rec.at.tid
        if var not in p.first:
            if len(p.first) >= MAX_VARS:
                self.over_cap += 1
                return
            p.first[var] = (p.seq, value)
        p.env_subsys = p.env_subsys or var not in _ALL_SUBSYS
        c = p.window.get(tid)
        if c is not None:
            c.window.setdefault(var, value)
        elif tid in p.pending_env or len(p.pending_env) < MAX_THREADS:
            p.pending_env.setdefault(tid, {}).setdefault(var, value)
        if (var, value) not in p.reads and len(p.reads) < MAX_VARS:
            p.reads[(var, value)] = c

    def _init(self, p: LogProcess, rec: nccllog.CommInit) -> None:
        tid = rec.at.tid
        if rec.phase == "START":
            c = self._new(p, rec, {})
            if c is not None and (tid in p.window or len(p.window) < MAX_THREADS):
                p.window[tid] = c
            p.pending_env.pop(tid, None)
            return
        c = p.window.get(tid)
        if c is None or c.comm != rec.comm:
            c = p.live.get(rec.comm)
            if c is None or c.completed:   # no START seen: 2.18, or a log that begins mid-init
                c = self._new(p, rec, p.pending_env.get(tid, {}))
        if c is None:
            return
        if p.window.get(tid) is c:
            del p.window[tid]
        p.pending_env.pop(tid, None)
        c.completed = True
        c.api = c.api or rec.api
        c.comm_id = c.comm_id if rec.comm_id is None else rec.comm_id

    def _new(self, p: LogProcess, rec: nccllog.CommInit, window: dict[str, str]) -> LogComm | None:
        if len(p.comms) >= MAX_COMMS:
            self.over_cap += 1
            return None
        self._retire(p, rec.comm)   # a live one at this pointer was destroyed without a line we saw
        c = LogComm(p.host, p.pid, rec.comm, rec.rank, rec.nranks, rec.api, rec.cuda_dev, rec.comm_id,
                    rec.parent, rec.color, rec.key, window=dict(window))
        p.comms.append(c)
        p.live[rec.comm] = c
        if c.tunes:
            p.tuners[rec.comm] = c
        return c

    def _retire(self, p: LogProcess, ptr: str) -> None:
        c = p.live.pop(ptr, None)
        p.tuners.pop(ptr, None)
        if c is None:
            return
        c.ended, c.end_seq = True, p.seq
        for tid in [t for t, w in p.window.items() if w is c]:
            del p.window[tid]
        if any(entry[2] is c for entry in p.calls):
            p.calls = deque((e for e in p.calls if e[2] is not c), maxlen=PENDING_MAX)

    def _end(self, p: LogProcess, rec: nccllog.CommEnd) -> None:
        self._retire(p, rec.comm)

    def _call(self, p: LogProcess, rec: nccllog.CollCall) -> None:
        c = p.live.get(rec.comm)
        if c is not None and c.tunes and rec.func not in _NO_TUNING and rec.nranks != 1:
            p.calls.append((rec.at.tid, rec.func, c))

    def _tuning(self, p: LogProcess, rec: nccllog.Tuning) -> None:
        c, why = self._owner(p, rec)
        if c is None:
            _add(p.unattributed, rec)
            p.why[why] += 1
        else:
            _add(c.colls, rec)
            c.basis[why] += 1

    def _owner(self, p: LogProcess, rec: nccllog.Tuning) -> tuple[LogComm | None, str]:
        tid, func = rec.at.tid, rec.func
        entry = next((e for e in p.calls if e[0] == tid and (func is None or e[1] == func)), None)
        if entry is None and func is not None:  # a nonblocking group launches on its own thread
            entry = next((e for e in p.calls if e[1] == func), None)
        if entry is not None:
            p.calls.remove(entry)
            return entry[2], "COLL line"
        tuners = p.tuners
        if len(tuners) == 1:
            return next(iter(tuners.values())), "only rank-0 communicator"
        if not tuners:
            return None, NO_COMM
        if len(tuners) <= TIEBREAK_MAX:
            fits = [c for c in tuners.values() if _allows(c, rec)]
            if len(fits) == 1:
                return fits[0], "only one whose NCCL_PROTO/NCCL_ALGO allows it"
        return None, SEVERAL

    _handlers = {nccllog.VersionLine: _version, nccllog.PluginLoaded: _plugin, nccllog.CacheDisabled: _no_cache,
                 nccllog.EnvSetting: _env_line, nccllog.CommInit: _init, nccllog.CommEnd: _end,
                 nccllog.CollCall: _call, nccllog.Tuning: _tuning}


def _env(p: LogProcess, c: LogComm) -> dict[str, str] | None:
    """What c got per the log: its own init's lines, and the process's cached reads while it lived."""
    if not p.env_subsys:
        return None
    no_cache = ",".join(sorted(p.no_cache)) or None
    env = {}
    for var, (seq, value) in p.first.items():
        if var in c.window:
            env[var] = c.window[var]
        elif catalog.is_process_cached(var, p.version, no_cache=no_cache) is False:
            continue    # re-read at every init, and this init printed none: unset for it
        elif c.end_seq is None or seq < c.end_seq:
            env[var] = value
    return env


# ---- into the model -----------------------------------------------------------------------------

def parse(paths) -> tuple[nccllog.NcclLog, Attribution]:
    """NCCL's logs read and each record attributed to its process: what merge() joins to a model. The
    records themselves go through the attribution and are not kept (log.records is empty)."""
    a = Attribution()
    log = nccllog.parse_files(paths, sink=a.feed, keep=0)
    a.finish()
    a.drop_state()
    return log, a


def merge(m: Model, paths, parsed: tuple[nccllog.NcclLog, Attribution] | None = None) -> Model:
    """The model m with NCCL's logs joined: paths parsed here, or parsed already (parse(paths), perhaps
    in another process)."""
    log, a = parsed if parsed is not None else parse(paths)
    m.nccl_log = log
    m.reading.notes.extend(log.notes)
    by_pid: dict[int, list[ProcessView]] = defaultdict(list)
    for view in m.processes.values():
        by_pid[view.pid].append(view)
    problems = Counter(log.problems())
    problems[OVER_CAP] += a.over_cap
    unattributed: Counter = Counter()
    for lp in a.procs.values():
        p = _process(m, by_pid, lp.host, lp.pid)
        p.sources.add("nccl-log")
        if lp.version is not None:
            p.nccl_version = lp.version
        p.simulated_nccl = p.simulated_nccl or lp.simulated
        for kind, name, version in lp.plugins:
            p.plugins.append({"plugin": f"{kind}:{name}", "version": version, "src": "nccl-log"})
        views = _comms(m, p, lp)
        for (var, value), lc in lp.reads.items():
            c = views.get(lc) if lc is not None else None
            # the log has no clock: a read is as old as the probe-witnessed init that printed it, else unordered
            t = c.t if c is not None and math.isfinite(c.t) else math.inf
            p.reads.setdefault(("nccl-log", var, value), NcclRead(var, value, "nccl-log", t, "nccl-log"))
        p.tuning.extend(lp.unattributed.values())
        if not all("profiler" in views[lc].seen_by for lc in lp.comms if lc.rank == 0):
            unattributed.update(lp.why)   # where the profiler saw every rank-0 communicator, moot
        if p.simulated_nccl:
            for c in m.comms_of(p.host, p.pid, p.retired):
                c.simulated = True
    for text, n in problems.items():
        if n:
            m.skipped[text] = m.skipped.get(text, 0) + n
            if text in nccllog.FILE_PROBLEMS:
                m.reading.skipped_files[text] = m.reading.skipped_files.get(text, 0) + n
    for text, n in unattributed.items():  # read and kept on the process (ProcessView.tuning): not skipped
        m.reading.unattributed[text] = m.reading.unattributed.get(text, 0) + n
    return m


def _process(m: Model, by_pid: dict[int, list[ProcessView]], host: str, pid: int) -> ProcessView:
    # NCCL cuts the host name at the first '.'; the probes keep it whole.
    for view in by_pid.get(pid, ()):
        if view.host == host or view.host.split(".")[0] == host:
            return view
    view = m.process(host, pid)
    by_pid[pid].append(view)
    return view


def _comms(m: Model, p: ProcessView, lp: LogProcess) -> dict[LogComm, CommView]:
    """Each log communicator joined to the communicator another witness saw (same commId, else same
    pointer, and a rank that agrees), or added; first come first joined, so a reused pointer is not
    joined twice."""
    by_hash: dict[str, list[CommView]] = defaultdict(list)
    by_ptr: dict[str, list[CommView]] = defaultdict(list)
    for c in m.comms_of(p.host, p.pid, p.retired):
        if h := comm_id(c.comm_hash):
            by_hash[h].append(c)
        if ptr := _ptr(c.comm):
            by_ptr[ptr].append(c)
    taken: set[int] = set()
    views: dict[LogComm, CommView] = {}
    for lc in lp.comms:
        h = comm_id(lc.comm_id)
        c = _first_free(by_hash.get(h, ()) if h else (), lc, taken) or \
            _first_free(by_ptr.get(_ptr(lc.comm), ()), lc, taken)
        if c is None:
            c = CommView(p.host, p.pid, math.inf, api=lc.api, comm=_ptr(lc.comm), rank=lc.rank, nranks=lc.nranks,
                         parent=_ptr(lc.parent), color=lc.color, key=lc.key, dev=lc.dev)
            m.comms.append(c)
        taken.add(id(c))
        views[lc] = c
        c.seen_by.add("nccl-log")
        c.api = c.api or lc.api  # NCCL names the API even where no preload hook saw the call
        c.comm = c.comm or _ptr(lc.comm)
        c.rank = c.rank if c.rank is not None else lc.rank
        c.nranks = c.nranks if c.nranks is not None else lc.nranks
        # before 2.26 NCCL printed hashUniqueId() as commId, not commHash: still one value for all the
        # ranks of the communicator (it groups them), and no profiler this tool loads predates 2.27
        c.comm_hash = c.comm_hash or h
        c.version = c.version or p.nccl_version
        c.destroyed = c.destroyed or lc.ended
        if c.env is None and lc.env is not None:
            c.env, c.env_source = dict(lc.env), "nccl-log"
        if not c.colls:  # a profiler's counts, where there are any, are complete: never add the log's
            c.colls = {k: CollStat(*k, s.bytes_min, s.bytes_max, s.count) for k, s in lc.colls.items()}
    return views


def _first_free(candidates, lc: LogComm, taken: set[int]) -> CommView | None:
    for c in candidates:
        if id(c) not in taken and c.rank in (None, lc.rank):
            return c
    return None
