"""One model from every in-process witness: processes and communicators, each observation keeping
its source and time. Built from the probes' event log and, where given, NCCL's own INFO log."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ncclprobe.model.tuning import canonical
from ncclprobe.model.watched import is_watched, redact_argv

if TYPE_CHECKING:
    from ncclprobe.witnesses.events import EventLog


@dataclass
class EnvWrite:
    var: str
    old: str | None
    new: str | None
    where: str
    op: str
    blocked: bool
    t: float


@dataclass
class LiveWrite(EnvWrite):
    """A write the live witness found: made after `after` (the start of the latest read that still showed
    the old value; None: at any time since the process started) and at or before `t` (the read that
    showed it)."""
    after: float | None = None


@dataclass(frozen=True)
class LiveReading:
    """One reading of a process's environment from its memory: the watched variables it held, read
    by `t`; `since`: the start of the latest read before it that still showed the reading before
    (None: none did, the first reading); `execs`: the image (run's watch: proc_seen's execs)."""
    env: dict[str, str]
    t: float
    since: float | None = None
    execs: int = 0


@dataclass
class NcclRead:
    """The first value NCCL read for a variable in one process through one library copy."""
    var: str
    value: str | None
    lib: str
    t: float
    source: str  # "envplugin" or "nccl-log"


@dataclass
class ProcessView:
    host: str
    pid: int
    ppid: int | None = None
    argv: list[str] | None = None
    exe: str | None = None
    start_env: dict[str, str] | None = None      # live environment at interpreter start (boot probe)
    exec_env: dict[str, str] | None = None       # /proc/self/environ as the boot probe read it
    exec_env_differs: bool | None = None
    forked_from: int | None = None
    adopted_by: int | None = None                 # a subreaper the process was re-parented to (ppid at start was not its parent)
    exec_after_boot: bool = False                 # the image the boot probe recorded exec'd another program since
    t_start: float | None = None
    mode: str | None = None
    sources: set[str] = field(default_factory=set)
    writes: list[EnvWrite] = field(default_factory=list)
    reads: dict[tuple[str, str, str | None], NcclRead] = field(default_factory=dict)  # (lib, var, value) -> first read
    libs: set[str] = field(default_factory=set)
    plugins: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    tuning: list[Any] = field(default_factory=list)         # NCCL log TUNING records (no comm named)
    nccl_version: int | None = None
    simulated_nccl: bool = False
    injected: dict[str, str] = field(default_factory=dict)  # watched values the boot probe applied (--enforce)
    # the /proc witness: inspect's records and run's watch of the tree
    proc_exec_env: dict[str, str] | None = None   # watched exec-time environment as /proc showed it
    proc_expected: dict[str, str] | None = None   # /proc's values of expected names (rules only, never shown)
    proc_start: float | None = None               # start time from /proc/<pid>/stat (unix seconds)
    proc_env_reason: str | None = None            # why proc_exec_env is missing or incomplete
    proc_stale: str | None = None                 # fork, forkserver, clobbered: the block is not its own
    proc_env_hash: str | None = None             # keyed hash of the raw block (run's watch): one block
    nccl_user: bool = False                       # maps libnccl or uses a GPU, as /proc showed it
    script: str | None = None                     # a shell's script, as its fd 255 names it (absolute)
    images: list[list[str]] = field(default_factory=list)  # earlier command lines of this pid (it exec'd since)
    in_scope: bool | None = None                  # inspect's --scope (None: every process is)
    proc_env_source: str | None = None            # exec | empty | unreadable: what /proc gave (None: no snapshot)
    proc_denied_by: str | None = None             # which ptrace condition refused environ (procaccess)
    proc_user: str | None = None                  # the process's user, as /proc showed it
    # /proc's libnccl copies ({"path", "inode", "version", "simulated", "kind", "defines", ...}) and the nccl.conf
    # files that apply ({"path", "role", "entries": [{"var", "value", "line", "effect"}]}); shared between
    # processes started alike, never modified
    nccl_libs: list[dict[str, Any]] = field(default_factory=list)
    conf_files: list[dict[str, Any]] | None = None  # None: not looked at (run's watch, or out of --scope)
    # the live witness (inspect --live, run --live): the environment read from the process's memory at live_t
    live_env: dict[str, str] | None = None        # watched variables as the process held them then (the last reading)
    live_expected: dict[str, str] | None = None   # expected names outside the watched set (rules only, never
    #                                               shown): the expected value if equal, LIVE_DIFFERS if not
    live_t: float | None = None
    live_reason: str | None = None                # why live_env is missing (where --live was asked)
    live_since: float | None = None               # the last reading's since (LiveReading): None for inspect's
    live_readings: list[LiveReading] = field(default_factory=list)  # run --live: each change, in order

    @property
    def key(self) -> tuple[str, int]:
        return (self.host, self.pid)

    @property
    def loads_nccl(self) -> bool:
        """Whether NCCL runs in it as far as any witness saw: libnccl mapped or named by a probe, a GPU."""
        return bool(self.nccl_user or self.libs or self.nccl_libs)

    def conf_value(self, var: str) -> tuple[str, str] | None:
        """(value, "file:line") of var from the nccl.conf files that apply, as NCCL would apply them: each
        line with setenv(name, value, 0), so the first file (and line) naming it wins; None: none does."""
        for conf in self.conf_files or ():
            for e in conf.get("entries") or ():
                if e.get("var") == var:
                    return str(e.get("value")), f"{conf.get('path')}:{e.get('line')}"
        return None

    def first_read(self, var: str) -> NcclRead | None:
        hits = [r for r in self.reads.values() if r.var == var]
        return min(hits, key=lambda r: r.t) if hits else None


LIVE_WHERE = "in-process (read from memory)"  # where a value the live witness saw was written
# where a value the live witness saw was written in a process whose every os.environ write the boot probe
# recorded: native code (a library or its constructor calling setenv/putenv from C)
LIVE_NATIVE = "native code (C setenv/putenv, no os.environ write; read from memory)"
LIVE_WHERES = (LIVE_WHERE, LIVE_NATIVE)
LIVE_DIFFERS = "<differs from the expected value (read from memory)>"


@dataclass
class CollStat:
    func: str
    algo: str
    proto: str
    nchannels: int
    bytes_min: int
    bytes_max: int
    count: int
    # the profiler plugin's (model/timing.py says what they mean); NCCL's log gives none of them
    mode: str | None = None          # eager | captured | replayed; None: unknown
    size_log2: int | None = None     # bytes in [2^k, 2^(k+1))
    bytes_sum: int = 0
    gpu_count: int = 0
    gpu_ns: int = 0
    untimed: int = 0
    gpu_hist: dict[int, int] = field(default_factory=dict)


@dataclass
class CommView:
    host: str
    pid: int
    t: float
    api: str | None = None            # None: no preload hook saw the creation
    comm: str | None = None
    comm_hash: str | None = None
    call: int | None = None
    rank: int | None = None
    nranks: int | None = None
    parent: str | None = None
    color: int | None = None
    key: int | None = None
    uid: str | None = None
    config: dict[str, Any] | None = None
    env: dict[str, str] | None = None           # watched env at creation (preload, else profiler init)
    env_source: str | None = None
    rc: int | None = None
    lib: str | None = None
    version: int | None = None
    simulated: bool = False
    ms: float | None = None
    dev: int | None = None
    comm_name: str | None = None
    seen_by: set[str] = field(default_factory=set)
    colls: dict[tuple, CollStat] = field(default_factory=dict)
    activity: Any = None                        # model.timing.Activity: the profiler's comm_activity lines
    destroyed: bool = False

    @property
    def ident(self) -> str:
        return self.comm_hash or self.comm or f"call{self.call}"

    @property
    def group(self) -> str | None:
        """Key shared by the ranks of one communicator across processes."""
        return self.comm_hash or (f"uid:{self.uid}" if self.uid else None)

    @property
    def ok(self) -> bool:
        return self.rc in (None, 0)


@dataclass
class LogReading:
    """What the readers did not read and the writers did not write, said per file and per process."""
    skipped_files: dict[str, int] = field(default_factory=dict)   # reason -> files (Model.skipped has them too)
    notes: list[dict[str, Any]] = field(default_factory=list)     # {path, note, bytes}: a file not read whole
    budget: dict[tuple[str, int], tuple[str, int | None]] = field(default_factory=dict)  # log_budget: (reached, limit)
    dropped: dict[tuple[str, int], int] = field(default_factory=dict)  # lines a writer lost ("dropped": K)
    unattributed: dict[str, int] = field(default_factory=dict)    # NCCL log TUNING lines no communicator got


@dataclass
class Model:
    processes: dict[tuple[str, int], ProcessView] = field(default_factory=dict)
    comms: list[CommView] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # lines and files not read, by reason
    reading: LogReading = field(default_factory=LogReading)
    files: int = 0
    nccl_log: Any = None
    shell_pitfalls: list[dict[str, Any]] = field(default_factory=list)  # witnesses.shells, per ancestor shell
    # run's /proc watch per host: its watch_summary, plus missed_started (pids whose boot probe recorded
    # a process_start that no scan saw) and missed_started_pids
    watch: dict[str, dict[str, Any]] = field(default_factory=dict)
    # comms_of's index: (host, pid) -> its communicators, over the first _indexed[1] of the list _indexed[0];
    # _by_time: comms_by_time's, dropped whenever the index grows
    _by_proc: dict[tuple[str, int], list[CommView]] = field(default_factory=dict, repr=False, compare=False)
    _indexed: tuple[list | None, int] = field(default=(None, 0), repr=False, compare=False)
    _by_time: dict[tuple[str, int], list[CommView]] = field(default_factory=dict, repr=False, compare=False)

    def parent(self, p: ProcessView) -> ProcessView | None:
        return self.processes.get((p.host, p.ppid)) if p.ppid else None

    @property
    def given(self) -> dict[str, Any] | None:
        """What `ncclprobe run` gave CMD (run.json): {"env": watched job environment, "set": --set values,
        "enforced": --enforce values, "command": argv}, or None outside run."""
        for r in self.runs:
            if isinstance(r.get("given_env"), dict):
                return {"env": _env(r["given_env"]) or {}, "set": _env(r.get("set")) or {},
                        "enforced": _env(r.get("enforced")) or {}, "command": r.get("command") or [],
                        "pid": r.get("run_pid")}
        return None

    def process(self, host: str, pid: int) -> ProcessView:
        key = (host, pid)
        if key not in self.processes:
            self.processes[key] = ProcessView(host, pid)
        return self.processes[key]

    def comms_of(self, host: str, pid: int) -> list[CommView]:
        """The communicators of one process, in list order: an index kept up with `comms`, which is only
        ever appended to (or replaced whole), so a model of many processes is not scanned once per process."""
        return list(self._index().get((host, pid), ()))

    def comms_by_time(self, host: str, pid: int) -> list[CommView]:
        """comms_of in creation order (CommView.t, set when a witness first sees it), sorted once per process."""
        index = self._index()
        got = self._by_time.get((host, pid))
        if got is None:
            got = self._by_time[(host, pid)] = sorted(index.get((host, pid), ()), key=lambda c: c.t)
        return got

    def _index(self) -> dict[tuple[str, int], list[CommView]]:
        indexed, done = self._indexed
        if indexed is not self.comms or done > len(self.comms):
            self._by_proc, self._by_time, done = {}, {}, 0
        if done < len(self.comms):
            for c in self.comms[done:]:
                self._by_proc.setdefault((c.host, c.pid), []).append(c)
            self._by_time = {}
        self._indexed = (self.comms, len(self.comms))
        return self._by_proc

    @property
    def preload_active(self) -> bool:
        return any(r.get("preload") for r in self.runs) or any("preload" in p.sources for p in self.processes.values())

    @property
    def simulated(self) -> bool:
        return any(c.simulated for c in self.comms)


def ranges(nums) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'."""
    nums = sorted(set(nums))
    out, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ", ".join(out)


def comm_id(value: Any) -> str | None:
    """The one spelling of a communicator's 64-bit id (commHash, the hash of its unique id) across every
    witness, the NCCL log and the JSON output: "0x" and 16 lowercase hex digits. Takes an int or a hex
    string of any case and width, with or without "0x"; anything else (or out of range) is None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        text = text[2:] if text.startswith("0x") else text
        if not text or len(text) > 16 or any(ch not in "0123456789abcdef" for ch in text):
            return None
        value = int(text, 16)
    if not isinstance(value, int) or not 0 <= value < 1 << 64:
        return None
    return f"0x{value:016x}"


def _id(value: Any) -> str | None:
    """An id from an event as comm_id spells it. A string that is no 64-bit hex number (a hand-made or
    foreign log's own name for a communicator) has no other spelling: it is kept as written, to join on."""
    canon = comm_id(value)
    return value if canon is None and isinstance(value, str) and value.strip() else canon


def _env(obj: Any) -> dict[str, str] | None:
    """A watched-variable map from an event; anything outside the watched set is dropped, whatever
    wrote the file (the probes never log it, a foreign or hand-made file might)."""
    if not isinstance(obj, dict):
        return None
    return {str(k): str(v) for k, v in obj.items() if v is not None and is_watched(str(k))}


def build(log: EventLog) -> Model:
    """The model of one event log, iterating its events once, in time order (events.stream_dirs gives
    them as an iterator, checked against events.FIELDS). Every id (comm, parent, uid, comm_hash) is read
    in comm_id's spelling (_id), so witnesses join whatever spelling wrote them (older probes dropped
    leading zeros)."""
    m = Model(runs=list(log.runs), files=len(log.files))
    by_call: dict[tuple[str, int, int], CommView] = {}
    by_ptr: dict[tuple[str, int, str], CommView] = {}
    by_hash: dict[tuple[str, int, str], CommView] = {}
    for e in log.events:
        host, pid, kind, t = e.get("host", "?"), e["pid"], e["ev"], float(e["t"])
        if e.get("dropped"):  # lines this writer lost before this one
            m.reading.dropped[(host, pid)] = m.reading.dropped.get((host, pid), 0) + e["dropped"]
        if kind == "watch_summary":  # its pid is run's, no process of the job
            m.watch[host] = {k: v for k, v in e.items() if k not in ("ev", "host", "pid", "src")}
            continue
        proc = m.process(host, pid)
        proc.sources.add(e["src"])
        if kind == "process_start":
            # the process that started it, not a subreaper that adopted it before the record was written
            # (a double fork's intermediate may exit before its child's interpreter starts)
            forked, ppid = e.get("forked_from"), e.get("ppid")
            proc.ppid = forked if isinstance(forked, int) and forked > 0 else ppid
            proc.adopted_by = ppid if proc.ppid != ppid else None
            argv = redact_argv(e["argv"]) if isinstance(e.get("argv"), list) else None  # older probes: raw
            if proc.argv and argv and proc.argv != argv:  # the watch saw this pid run another program before
                proc.images.append(proc.argv)
            proc.argv = argv
            proc.exe = e.get("exe")
            proc.start_env = _env(e.get("env"))
            proc.exec_env = _env(e.get("exec_env"))
            proc.exec_env_differs = e.get("exec_env_differs")
            proc.forked_from = e.get("forked_from")
            proc.t_start = t
            proc.mode = e.get("mode")
            if isinstance(e.get("start"), (int, float)) and not isinstance(e.get("start"), bool):
                proc.proc_start = float(e["start"])  # the kernel's start (the fork), to the clock tick
            for entry in e.get("profile") or ():  # what the boot probe applied itself (--enforce, a profile)
                if isinstance(entry, dict) and entry.get("applied") and is_watched(str(entry.get("var"))):
                    proc.injected[str(entry["var"])] = str(entry.get("value"))
        elif kind == "parent_seen":  # a boot probe's record of its parent, not Python: /proc at the child's start
            q = m.process(host, e["of"])
            q.sources.add("proc")
            if q.proc_start is None:  # the watch's own sighting, where it had one, stays
                q.proc_exec_env, q.proc_env_reason = _env(e.get("exec_env")), e.get("env_reason")
                q.proc_start = e.get("start")
            q.ppid = q.ppid if q.ppid is not None else e.get("ppid")
            q.exe = q.exe or e.get("exe")
            q.argv = q.argv or (redact_argv(e["argv"]) if isinstance(e.get("argv"), list) else None)
            q.script = q.script or (e.get("script") if isinstance(e.get("script"), str) else None)
        elif kind == "proc_seen":  # a later one is the same process after an exec: it replaces the earlier
            if proc.live_readings and proc.live_readings[-1].execs != (e.get("execs") or 0):
                _forget_live(proc)  # what the live witness read was the earlier image's
            proc.proc_exec_env = _env(e.get("exec_env"))
            proc.proc_start, proc.proc_env_reason = e.get("start"), e.get("env_reason")
            proc.proc_env_hash = e.get("env_hash")
            argv = redact_argv(e["argv"]) if isinstance(e.get("argv"), list) else None
            if proc.t_start is None:  # no process_start (yet): /proc's ancestry and command line
                if proc.argv and argv and proc.argv != argv:  # it exec'd another program since
                    proc.images.append(proc.argv)
                proc.ppid, proc.exe, proc.argv = e.get("ppid"), e.get("exe"), argv
            elif _exec_since_boot(proc, e, t):  # a new image: the boot probe's record was the one before it
                proc.images.append(proc.argv or [])
                proc.exe, proc.argv, proc.exec_after_boot = e.get("exe"), argv, True
                proc.start_env = proc.exec_env = None  # its environment is the one it exec'd with (/proc's)
            else:  # the boot probe's, where it had them
                proc.ppid = proc.ppid if proc.ppid is not None else e.get("ppid")
                proc.exe, proc.argv = proc.exe or e.get("exe"), proc.argv if proc.argv is not None else argv
        elif kind == "live_env":  # run --live: the environment the process holds, where it changed
            execs = e.get("execs") or 0
            if proc.live_readings and proc.live_readings[-1].execs != execs:
                _forget_live(proc)
            env = _env(e.get("env"))
            if env is None:
                proc.live_reason = None if proc.live_readings else str(e.get("reason") or "not read")
                continue
            since = e.get("since")
            since = float(since) if since is not None and since < t else None
            proc.live_readings.append(LiveReading(env, t, since, execs))
            proc.live_env, proc.live_t, proc.live_since, proc.live_reason = env, t, since, None
            proc.sources.add("live")
        elif kind == "env_write":
            proc.writes.append(EnvWrite(str(e.get("var")), e.get("old"), e.get("new"), str(e.get("where", "?")),
                                        str(e.get("op", "set")), bool(e.get("blocked")), t))
        elif kind == "log_budget":  # the writer's last line: nothing after it was recorded
            m.reading.budget.setdefault((host, pid), (e["reached"], e.get("limit")))
        elif kind == "probe_error":
            proc.errors.append(str(e.get("message", "")))
        elif kind == "plugin_load":
            proc.plugins.append(e)
            if e.get("lib"):
                proc.libs.add(e["lib"])
        elif kind == "nccl_getenv":
            lib, var = str(e.get("lib") or "?"), str(e.get("var"))
            if lib != "?":
                proc.libs.add(lib)
            key = (lib, var, e.get("value"))
            if key not in proc.reads:
                proc.reads[key] = NcclRead(var, e.get("value"), lib, t, "envplugin")
        elif kind == "comm_init":
            c = CommView(host, pid, t, api=e.get("api"), comm=_id(e.get("comm")), call=e.get("call"),
                         rank=e.get("rank"), nranks=e.get("nranks"), parent=_id(e.get("parent")),
                         color=e.get("color"), key=e.get("key"), uid=_id(e.get("uid")), config=e.get("config"),
                         env=_env(e.get("env")), env_source="preload", rc=e.get("rc"), lib=e.get("lib"),
                         version=e.get("version"), simulated=bool(e.get("simulated")), ms=e.get("ms"),
                         dev=e.get("dev"))
            c.seen_by.add("preload")
            if c.lib:
                proc.libs.add(c.lib)
            m.comms.append(c)
            if c.call is not None:
                by_call[(host, pid, c.call)] = c
            if c.comm:
                by_ptr[(host, pid, c.comm)] = c
        elif kind == "comm_plugin_init":
            call = e.get("call")
            c = by_call.get((host, pid, call)) if call is not None else None
            if c is None or c.comm_hash is not None:
                c = CommView(host, pid, t, env=_env(e.get("env")), env_source="profiler")
                m.comms.append(c)
            c.seen_by.add("profiler")
            c.comm_hash = _id(e.get("comm_hash"))
            c.comm_name = e.get("comm_name")
            c.nranks = c.nranks if c.nranks is not None else e.get("nranks")
            c.rank = c.rank if c.rank is not None else e.get("rank")
            c.lib = c.lib or e.get("lib")
            c.version = c.version or e.get("version")
            c.simulated = c.simulated or bool(e.get("simulated"))
            if e.get("lib"):
                proc.libs.add(e["lib"])
            if c.env is None:
                c.env, c.env_source = _env(e.get("env")), "profiler"
            if c.comm_hash:
                by_hash[(host, pid, c.comm_hash)] = c
        elif kind == "coll_summary":
            h = _id(e.get("comm_hash"))
            c = by_hash.get((host, pid, h))
            if c is None:
                c = CommView(host, pid, t, comm_hash=h, env_source=None)
                c.seen_by.add("profiler")
                m.comms.append(c)
                by_hash[(host, pid, h)] = c
            _add_coll(c, e)
        elif kind == "comm_activity":
            h = _id(e.get("comm_hash"))
            c = by_hash.get((host, pid, h))
            if c is None:
                c = CommView(host, pid, t, comm_hash=h, env_source=None, rank=e.get("rank"), nranks=e.get("nranks"))
                c.seen_by.add("profiler")
                m.comms.append(c)
                by_hash[(host, pid, h)] = c
            if c.activity is None:
                from ncclprobe.model.timing import Activity
                c.activity = Activity()
            c.activity.add(e)
        elif kind in ("comm_destroy", "comm_plugin_finalize"):
            c = by_ptr.get((host, pid, _id(e.get("comm")))) or by_hash.get((host, pid, _id(e.get("comm_hash"))))
            if c is not None:
                c.destroyed = True
    for host, w in m.watch.items():  # Python processes the watch missed: their boot probe says they ran
        unseen = sorted(p.pid for p in m.processes.values()
                        if p.host == host and p.t_start is not None and "proc" not in p.sources)
        w["missed_started"], w["missed_started_pids"] = len(unseen), unseen
    # a stream's counts are complete only once it has been consumed
    m.skipped = {**log.skipped, **{f"unknown event {k}": v for k, v in log.unknown.items()}, **log.skipped_files}
    m.reading.skipped_files, m.reading.notes = dict(log.skipped_files), list(log.notes)
    _label_simulated(m)
    return m


def _exec_since_boot(p: ProcessView, e: dict[str, Any], t: float) -> bool:
    """Whether a sighting shows the process running another program than the one its boot probe recorded:
    seen after that record with another executable (a fork of a Python driver that exec'd raylet). The same
    executable with another command line may be setproctitle, not an exec: that keeps the record."""
    exe = e.get("exe")
    if p.exec_after_boot or not isinstance(exe, str) or not p.exe or t < (p.t_start or t):
        return False
    # the boot probe names its interpreter as sys.executable (often a venv's symlink), /proc by its target;
    # another interpreter is the Python image's own re-exec, which writes its own start record
    if exe.rsplit("/", 1)[-1].startswith(("python", "pypy")) or exe == p.exe:
        return False
    start = e.get("start")
    return start is None or p.proc_start is None or abs(float(start) - p.proc_start) < 0.05


def _forget_live(p: ProcessView) -> None:
    p.live_readings = []
    p.live_env = p.live_t = p.live_since = p.live_reason = None
    p.sources.discard("live")


def _label_simulated(m: Model) -> None:
    """A communicator only the profiler saw runs on the same library copy as one the preload saw:
    carry over what that copy is (version, simulated)."""
    known = {c.lib: (c.version, c.simulated) for c in m.comms if c.lib and c.version}
    for c in m.comms:
        if c.lib in known and c.version is None:
            c.version, c.simulated = known[c.lib][0], c.simulated or known[c.lib][1]


def _add_coll(c: CommView, e: dict[str, Any]) -> None:
    """Merge one flush. A flush carries counts, bytes, GPU times and bins since the previous one for the
    same key (sizes min/max since the start)."""
    try:
        mode = e.get("mode") if e.get("mode") in ("eager", "captured", "replayed") else None
        size_log2 = e.get("size_log2") if type(e.get("size_log2")) is int else None
        key = (str(e.get("func")), canonical(str(e.get("algo"))), canonical(str(e.get("proto"))),
               int(e.get("nchannels") or 0), mode, size_log2)
        bmin, bmax, count = int(e.get("bytes_min", 0)), int(e.get("bytes_max", 0)), int(e.get("count", 0))
        bytes_sum = int(e.get("bytes_sum") or 0)
        gpu_count, gpu_ns, untimed = (int(e.get(k) or 0) for k in ("gpu_count", "gpu_ns", "untimed"))
        hist = [(int(b), int(n)) for b, n in (e.get("gpu_hist") or [])]
    except (TypeError, ValueError):
        return
    s = c.colls.get(key)
    if s is None:
        s = c.colls[key] = CollStat(*key[:4], bmin, bmax, 0, mode, size_log2)
    s.bytes_min, s.bytes_max, s.count = min(s.bytes_min, bmin), max(s.bytes_max, bmax), s.count + count
    s.bytes_sum += bytes_sum
    s.gpu_count, s.gpu_ns, s.untimed = s.gpu_count + gpu_count, s.gpu_ns + gpu_ns, s.untimed + untimed
    for b, n in hist:
        s.gpu_hist[b] = s.gpu_hist.get(b, 0) + n


def add_records(m: Model, recs, host: str) -> Model:
    """Feed inspect's /proc records (commands/inspection: the private `_` keys still on them) into the
    model as the /proc witness of each process; the in-process witnesses of the same pids stay."""
    for r in recs:
        p = m.process(host, r["pid"])
        p.sources.add("proc")
        p.ppid = p.ppid if p.ppid is not None else r.get("ppid")
        p.argv = p.argv or r.get("cmdline") or None
        p.exe = p.exe or r.get("exe")
        readable = r.get("env_source") == "exec"
        # shared with the records of processes started alike (never modified): the rules do them once
        p.proc_exec_env = (r.get("_watched") or {}) if readable else None
        p.proc_expected = (r.get("_exp") or {}) if readable else None
        # the boot probe's and the watch's start are to the tick: a /proc snapshot never replaces them
        p.proc_start = p.proc_start if p.proc_start is not None else r.get("_start")
        p.proc_env_reason = None if readable else (r.get("env_reason") or r.get("env_source"))
        p.proc_stale = r.get("stale")
        p.proc_env_hash = r.get("_hash")
        p.nccl_user = bool(r.get("nccl_libs") or r.get("gpus"))
        p.in_scope = r.get("in_scope")
        p.proc_env_source, p.proc_denied_by, p.proc_user = r.get("env_source"), r.get("env_denied_by"), r.get("user")
        p.nccl_libs = r.get("nccl_libs") or []
        p.conf_files = r.get("conf_files")
        if "live_reason" in r:  # inspect --live: one reading, now (after any a run --live log holds)
            p.live_env, p.live_expected = r.get("_live_watched"), r.get("_live_exp")
            if p.live_env is not None:
                p.sources.add("live")
            p.live_t, p.live_reason, p.live_since = r.get("live_t"), r.get("live_reason"), None
            if p.live_readings and p.live_env is not None and p.live_t is not None:
                p.live_readings = [*p.live_readings, LiveReading(p.live_env, p.live_t, None, p.live_readings[-1].execs)]
    return m


def add_proc_view(m: Model, other: Model) -> Model:
    """The /proc witness of another model of the same job (a live inspect of it) joined into m."""
    for key, q in other.processes.items():
        if "proc" not in q.sources:
            continue
        p = m.process(*key)
        p.sources.add("proc")
        for name in ("proc_exec_env", "proc_expected", "proc_env_reason", "proc_stale", "proc_env_hash", "nccl_user",
                     "in_scope", "proc_env_source", "proc_denied_by", "proc_user", "nccl_libs", "conf_files"):
            setattr(p, name, getattr(q, name))
        if q.live_env is not None or q.live_reason is not None:  # it was read live: its reading is the latest
            if q.live_env is not None and p.live_readings and not q.live_readings and q.live_t is not None:
                p.live_readings = [*p.live_readings, LiveReading(q.live_env, q.live_t, None, p.live_readings[-1].execs)]
            elif q.live_readings:
                p.live_readings = list(q.live_readings)
            for name in ("live_env", "live_expected", "live_t", "live_reason", "live_since"):
                setattr(p, name, getattr(q, name))
        p.proc_start = p.proc_start if p.proc_start is not None else q.proc_start
        p.ppid = p.ppid if p.ppid is not None else q.ppid
        p.argv, p.exe = p.argv or q.argv, p.exe or q.exe
    m.shell_pitfalls = [*m.shell_pitfalls, *other.shell_pitfalls]
    return m
