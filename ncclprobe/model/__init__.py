"""One model from every in-process witness: processes and communicators, each observation keeping
its source and time. Built from the probes' event log and, where given, NCCL's own INFO log."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any

from ncclprobe.model.watched import WATCHED_NAMES, WATCHED_PREFIXES

# a proc_seen's env_reason: a fork child read while it still held its parent's block, gone before a second look;
# what it exec'd after, if it did, no read saw (witnesses/procwatch.py)
FORK_GONE = "fork child, gone before a second look"

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


@dataclass(slots=True)
class NcclRead:
    """The first value NCCL read for a variable in one process through one library copy (a fleet's model
    holds one per worker and variable: slots)."""
    var: str
    value: str | None
    lib: str
    t: float
    source: str  # "envplugin" or "nccl-log"


@dataclass
class SpawnEdge:
    """One process starting another (or exec'ing), as the probe in the starting process recorded the call
    (the `spawn` event): what it called, from where, the command line and executable, the child's pid
    (None: an exec, which keeps the pid, or unknown), and the watched part of the environment it passed
    (env_given: its own, env=/envp; else the caller's, inherited) with how many variables that held.
    witnesses: the probes that recorded this one call (boot, preload: both see a Popen)."""
    host: str
    parent: int
    child: int | None
    call: str | None
    where: str | None
    argv: list[str] | None
    exe: str | None
    env_given: bool | None
    env: dict[str, str] | None
    env_count: int | None
    exec: bool
    t: float
    witnesses: set[str] = field(default_factory=set)
    # an exec's record comes before the call (a successful one never returns): what the process was before
    # it, so a later record of the same call's failure (rc) puts it back
    undo: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    forked_from: int | None = None  # a native exec in a fork child: the process it is a fork of (the caller's program)

    @property
    def site(self) -> str:
        """How a report names the call: `main.py:37` (pid P), or the call and pid where no file is known."""
        where = (self.where or "").rsplit("/", 1)[-1]
        if where:
            return f"`{where}` (pid {self.parent})"
        if self.exec and self.forked_from is not None:
            return f"{self.call or 'exec'} in a fork of pid {self.forked_from}"
        return f"{self.call or 'a call'} in pid {self.parent}"

    def env_text(self) -> str:
        """The environment it passed, as a report says it (names of variables outside the watched set never)."""
        if not self.env_given:
            return "the caller's own environment"
        n = self.env_count
        return "env={%s}" % (f"{n} variable{'s' if n != 1 else ''}" if n is not None else "...")


@dataclass
class Sighting:
    """What one read of a process's /proc gave (inspect's snapshot, run's watch): the one typed observation
    of /proc that enters the model, through model.build._see. A new field: one line here, one in _see."""
    host: str
    pid: int
    witness: str                                  # "watch" (run's, over time) | "snapshot" (inspect's, now)
    t: float | None = None                        # time of the read
    start: float | None = None                    # /proc/<pid>/stat start time (unix seconds)
    ns_pid: int | None = None                     # its pid in its own pid namespace, where that is not the reader's
    pidns: int | None = None                      # and that namespace's inode
    ppid: int | None = None
    argv: list[str] | None = None                 # redacted
    exe: str | None = None
    exec_env: dict[str, str] | None = None        # watched exec-time environment (None: unreadable)
    env_reason: str | None = None                 # why exec_env is missing or incomplete
    env_hash: str | None = None                   # keyed hash of the raw block (the watch)
    execs: int = 0                                # execs the watch saw of this pid
    cwd: str | None = None
    script: str | None = None                     # a shell's script, as its fd 255 names it
    # the snapshot's (run's watch does not read them)
    expected: dict[str, str] | None = None        # /proc's values of expected names (rules only, never shown)
    env_source: str | None = None                 # exec | empty | unreadable
    denied_by: str | None = None                  # which ptrace condition refused environ
    user: str | None = None
    stale: str | None = None                      # fork, forkserver, clobbered
    in_scope: bool | None = None
    nccl_libs: list[dict[str, Any]] = field(default_factory=list)
    gpus: list[Any] | None = None
    conf_files: list[dict[str, Any]] | None = None
    live: dict[str, Any] | None = None            # inspect --live's reading: env, expected, t, reason


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
    proc_execs: int | None = None                 # run's watch: the execs it counted before the sighting applied
    nccl_user: bool = False                       # maps libnccl or uses a GPU, as /proc showed it
    script: str | None = None                     # a shell's script, as its fd 255 names it (absolute)
    cwd: str | None = None                        # its working directory as /proc showed it (run's watch, inspect)
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
    # identity (model/build.py joins every witness's records on it): a process in a pid namespace other than
    # the report's has its pid in there (ns_pid) and the namespace's inode; where no /proc witness showed
    # its pid outside, `host` is its namespace's pid space (space_of) and `pid` the pid in there. A pid the
    # kernel gave again to a later process within the run: the earlier one's start (its key gains it)
    ns_pid: int | None = None
    pidns: int | None = None
    retired: float | None = None
    t_exit: float | None = None                   # when it ended (run's watch in kernel mode: proc_exit)
    spawned: list[SpawnEdge] = field(default_factory=list)  # what it started (or exec'd), as its probes recorded
    started_by: SpawnEdge | None = None           # the record of the call that started it (or exec'd it)

    @property
    def key(self) -> tuple:
        return (self.host, self.pid) if self.retired is None else (self.host, self.pid, self.retired)

    @property
    def node(self) -> str:
        """The host it runs on (host without the pid-namespace part of space_of)."""
        return self.host.split(SPACE_MARK, 1)[0]

    @property
    def name(self) -> str:
        """How a report names it: by the pid the user's shell sees, and the pid in its namespace where
        that differs (or, where only the namespace's own pid is known, by that, in its namespace)."""
        if SPACE_MARK in self.host:
            return f"pid {self.pid} in pid namespace {self.pidns} (host pid unknown)"
        if self.ns_pid is not None and self.ns_pid != self.pid:
            return f"pid {self.pid} (pid {self.ns_pid} in its namespace)"
        return f"pid {self.pid}"

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
        hits = self.reads_by_var().get(var)
        return hits[0] if hits else None

    def reads_by_var(self) -> dict[str, list[NcclRead]]:
        """reads by variable, each list in time order (ties in the order they were recorded): kept until
        reads grows (reads are only ever added: the first read of each (lib, var, value) stays)."""
        cached = self.__dict__.get("_by_var")
        if cached is None or cached[0] != len(self.reads):
            by: dict[str, list[NcclRead]] = {}
            for r in sorted(self.reads.values(), key=_TIME):
                by.setdefault(r.var, []).append(r)
            cached = self.__dict__["_by_var"] = (len(self.reads), by)
        return cached[1]


_TIME = operator.attrgetter("t")  # sort key: a read's or a communicator's time
SPACE_MARK = "/pidns:"
INIT_PIDNS = 4026531836  # PROC_PID_INIT_INO: the kernel's initial pid namespace, whose pids are the host's


def space_of(host: str, pidns: int) -> str:
    """The pid space of a namespace on a host whose processes no /proc witness showed from outside (a
    /proc mounted inside it): their pids are theirs in there, apart from the host's and each other's."""
    return f"{host}{SPACE_MARK}{pidns}"


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
    retired: float | None = None                # its process's ProcessView.retired (a pid given again since)
    ras: dict[str, Any] | None = None           # NCCL's RAS service's word on it: status, collective counts, devices

    @property
    def ras_troubles(self) -> tuple[list[str], list[str]]:
        """What NCCL's RAS service's status of this rank says is wrong: (errors: an asynchronous error, an
        abort; others: still initialising, finalized, being destroyed). Both empty: running, or not listed."""
        st = (self.ras or {}).get("status") or {}
        errors = ([f"async error {st['async_error']}"] if st.get("async_error") else []) + \
            (["aborted"] if st.get("abort_flag") else [])
        others = (["still initialising"] if st.get("init_state") not in (0, None) else []) + \
            (["finalized"] if st.get("finalize_called") else []) + (["being destroyed"] if st.get("destroy_flag") else [])
        return errors, others

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
    dirs: list[str] = field(default_factory=list)  # the log directories read
    nccl_log: Any = None
    shell_pitfalls: list[dict[str, Any]] = field(default_factory=list)  # witnesses.shells, per ancestor shell
    # run's /proc watch per host: its watch_summary, plus missed_started (pids whose boot probe recorded
    # a process_start, or whose parent's probe recorded the call that started them, that no scan saw) and
    # missed_started_pids
    watch: dict[str, dict[str, Any]] = field(default_factory=dict)
    sightings: list[Sighting] = field(default_factory=list)  # every /proc read, in the order it entered (_see)
    # comms_of's index: (host, pid) -> its communicators, over the first _indexed[1] of the list _indexed[0];
    # _by_time: comms_by_time's, dropped whenever the index grows
    _by_proc: dict[tuple, list[CommView]] = field(default_factory=dict, repr=False, compare=False)
    _indexed: tuple[list | None, int] = field(default=(None, 0), repr=False, compare=False)
    _by_time: dict[tuple, list[CommView]] = field(default_factory=dict, repr=False, compare=False)
    _knowledge: Any = field(default=None, repr=False, compare=False)  # diagnose's Knowledge.of (memo)
    _runs_indexed: tuple = field(default=(None, None), repr=False, compare=False)  # run_of's index of runs

    def parent(self, p: ProcessView) -> ProcessView | None:
        return self.processes.get((p.host, p.ppid)) if p.ppid else None

    def given_for(self, p: ProcessView | None) -> dict[str, Any] | None:
        """What the `ncclprobe run` that started p gave its CMD (run_of): {"env": watched job environment,
        "set": --set values, "enforced": --enforce values, "command": argv, "pid": run's pid}, or None
        where no run started it (outside run, or a run no witness ties it to). p None: the model's one run."""
        r = self.run_of(p) if p is not None else (self.runs[0] if len(self.runs) == 1 else None)
        return given_of(r) if r is not None else None

    def run_of(self, p: ProcessView) -> dict[str, Any] | None:
        """The run metadata of the `ncclprobe run` that started p: the run whose CMD is p or its nearest
        ancestor on p's host (lineage); else the one run on that host whose span holds p's start; else,
        in a model of one run, that run. None where no run, or more than one, could have."""
        if len(self.runs) == 1:
            return self.runs[0]
        by_cmd, by_host = self._run_index()
        q, seen = p, set()
        while q is not None and q.key not in seen:
            seen.add(q.key)
            found = _during(by_cmd.get((q.node, q.pid), ()), _start(q))
            if found is None and self.parent(q) is None:  # CMD itself, seen by no witness with its parent
                found = _during([r for r in by_host.get(q.node, ()) if r.get("run_pid") == q.ppid], _start(q))
            if found is not None:
                return found
            q = self.parent(q)
        return _during(by_host.get(p.node, ()), _start(p), only=True)

    def _run_index(self) -> tuple[dict, dict]:
        if self._runs_indexed[0] is not self.runs:
            by_cmd: dict[tuple, list] = {}
            by_host: dict[str, list] = {}
            for r in self.runs:
                host = r.get("host")
                if isinstance(host, str):
                    by_host.setdefault(host, []).append(r)
                    if isinstance(r.get("cmd_pid"), int):
                        by_cmd.setdefault((host, r["cmd_pid"]), []).append(r)
            self._runs_indexed = (self.runs, (by_cmd, by_host))
        return self._runs_indexed[1]

    def process(self, host: str, pid: int) -> ProcessView:
        key = (host, pid)
        if key not in self.processes:
            self.processes[key] = ProcessView(host, pid)
        return self.processes[key]

    def owner(self, c: CommView) -> ProcessView | None:
        """The process a communicator was created in."""
        return self.processes.get(_owner(c.host, c.pid, c.retired))

    def comms_of(self, host: str, pid: int, retired: float | None = None) -> list[CommView]:
        """The communicators of one process (retired: its ProcessView.retired), in list order: an index kept
        up with `comms`, which is only ever appended to (or replaced whole), so a model of many processes is
        not scanned once per process."""
        if not self.comms:  # (inspect's /proc view alone: no communicator to index)
            return []
        return list(self._index().get(_owner(host, pid, retired), ()))

    def comms_by_time(self, host: str, pid: int, retired: float | None = None) -> list[CommView]:
        """comms_of in creation order (CommView.t, set when a witness first sees it), sorted once per process."""
        index, key = self._index(), _owner(host, pid, retired)
        got = self._by_time.get(key)
        if got is None:
            got = self._by_time[key] = sorted(index.get(key, ()), key=_TIME)
        return got

    def _index(self) -> dict[tuple[str, int], list[CommView]]:
        indexed, done = self._indexed
        if indexed is not self.comms or done > len(self.comms):
            self._by_proc, self._by_time, done = {}, {}, 0
        if done < len(self.comms):
            for c in self.comms[done:]:
                self._by_proc.setdefault(_owner(c.host, c.pid, c.retired), []).append(c)
            self._by_time = {}
        self._indexed = (self.comms, len(self.comms))
        return self._by_proc

    @property
    def preload_active(self) -> bool:
        return any(r.get("preload") for r in self.runs) or any("preload" in p.sources for p in self.processes.values())

    @property
    def simulated(self) -> bool:
        return any(c.simulated for c in self.comms)


def _owner(host: str, pid: int, retired: float | None) -> tuple:
    return (host, pid) if retired is None else (host, pid, retired)


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
        if not text or len(text) > 16 or text.lstrip("0123456789abcdef"):  # (left over: a character no hex digit)
            return None
        value = int(text, 16)
    if not isinstance(value, int) or not 0 <= value < 1 << 64:
        return None
    return f"0x{value:016x}"


def version_code(version: Any) -> int | None:
    """An NCCL version as NCCL_VERSION_CODE: "2.28.9" (as the ELF, RAS and the log name it) -> 22809; an int is
    one already; anything else None."""
    if isinstance(version, int) and not isinstance(version, bool):
        return version
    parts = str(version or "").split(".")
    if len(parts) < 2 or not all(x.isdigit() for x in parts[:3]):
        return None
    major, minor, patch = (int(x) for x in (parts + ["0"])[:3])
    return major * 10000 + minor * 100 + patch


def _id(value: Any) -> str | None:
    """An id from an event as comm_id spells it. A string that is no 64-bit hex number (a hand-made or
    foreign log's own name for a communicator) has no other spelling: it is kept as written, to join on."""
    canon = comm_id(value)
    return value if canon is None and isinstance(value, str) and value.strip() else canon


def given_of(r: dict[str, Any]) -> dict[str, Any] | None:
    """What one run gave its CMD (Model.given_for), or None for a run that did not record it."""
    if not isinstance(r.get("given_env"), dict):
        return None
    return {"env": _env(r["given_env"]) or {}, "set": _env(r.get("set")) or {},
            "enforced": _env(r.get("enforced")) or {}, "command": r.get("command") or [], "pid": r.get("run_pid")}


def _start(p: ProcessView) -> float | None:
    """When p started, as the witnesses tell (the kernel's start time, else the boot probe's record)."""
    return p.proc_start if p.proc_start is not None else p.t_start


def _during(runs, t: float | None, only: bool = False) -> dict[str, Any] | None:
    """Of runs, the one whose span (started .. ended, open while it runs) holds t; where t is not known,
    the only run. only: None where more than one holds it (concurrent runs on one host)."""
    runs = list(runs)
    if t is not None:  # /proc's start is boot time (whole seconds, /proc/stat btime) plus ticks: 1 s of slack
        runs = [r for r in runs if r.get("started", 0) - 1.0 <= t <= (r.get("ended") or math.inf) + 1.0]
    if len(runs) == 1 or (runs and not only):
        return runs[-1]
    return None


def _env(obj: Any, strings=None) -> dict[str, str] | None:
    """A watched-variable map from an event; anything outside the watched set is dropped, whatever
    wrote the file (the probes never log it, a foreign or hand-made file might). strings: the read's
    events.Strings, whose copy of each name and value the map keeps (one a log, not one a line)."""
    if not isinstance(obj, dict):
        return None
    out = {}
    one = strings.one if strings is not None else str
    for k, v in obj.items():
        if v is not None:
            k = k if type(k) is str else str(k)
            if k in WATCHED_NAMES or k.startswith(WATCHED_PREFIXES):  # is_watched, inline (every env of a log)
                out[one(k)] = one(v if type(v) is str else str(v))
    return out


# The doors: every witness enters the model in model/build.py (one handler per event or observation kind).
from ncclprobe.model.build import (add_proc_view as add_proc_view, add_ras as add_ras,  # noqa: I001
                                   add_sightings as add_sightings, build as build)
