"""NCCL's own log (NCCL_DEBUG=INFO output, NCCL 2.18 through 2.32) as frozen records.

A user who only has NCCL logs still learns which values NCCL read, which communicators it built and
what it ran. Formats (src/debug.cc, src/init.cc, src/enqueue.cc of each release):

  [ts ]host:pid:tid [dev] NCCL INFO msg        ts only when NCCL_DEBUG_TIMESTAMP_LEVELS asks (2.26+)
  host:pid:tid [dev] file.cc:123 [(func) ]NCCL WARN msg   preceded by an empty line; (func) from 2.30
  host:pid:tid [dev] 12.345 file.cc:123 NCCL TRACE msg
  NCCL version 2.30.7+cuda12.9                  bare at NCCL_DEBUG=VERSION|WARN (2.30)

Lines may carry a launcher's prefix (torchrun's "[default0]:"), so the NCCL prefix is searched, not
anchored. Anything else is skipped and counted, never an error.

Reading is linear in the input and bounded in memory: a file is read in CHUNK-byte pieces and a line
over MAX_LINE bytes is skipped (and counted) without ever being held whole; prefixes are found by one
scan for the ":pid:tid " of `host:pid:tid` (the host is then matched backwards, at most MAX_HOST
characters), and every pattern is anchored with bounded repeats. At most MAX_RECORDS records are kept;
a caller that needs every one (nccllog_model, for the per-collective TUNING lines) passes a sink.
"""
from __future__ import annotations

import functools
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, NamedTuple, Union

from ncclprobe.model import tuning

# Numeric ids in pre-2.24 TUNING lines index these (src/include/devcomm.h: NCCL_ALGO_*, NCCL_PROTO_*);
# 2.24+ lines print ncclAlgoToString names ("RING", "COLLNET_DIRECT"). Records carry the NCCL_ALGO /
# NCCL_PROTO spelling, as ncclprobe.model.tuning defines it.
ALGO_IDS = tuning.ALGOS
PROTO_IDS = tuning.PROTOS

# NCCL formats into a 1024-byte buffer (src/debug.cc), but from 2.30 only the format goes there and
# vfprintf expands it, so a ring of thousands of ranks makes a legitimate line of tens of kilobytes.
MAX_LINE = 1 << 16
MAX_HOST = 255            # HOST_NAME_MAX; NCCL prints the name cut at its first '.'
MAX_RECORDS = 20_000
MAX_FILE_LINES = 8_000_000  # lines read per file (a few us each): a long job at NCCL_DEBUG_SUBSYS=COLL writes millions
CHUNK = 1 << 16
_I32 = 1 << 31
_I64 = 1 << 63


@functools.lru_cache(maxsize=256)
def canonical(name: str | None) -> str | None:
    """'RING' / 'ring' / 'COLLNET_DIRECT' / 'SIMPLE' -> 'Ring' / 'CollNetDirect' / 'Simple' (others unchanged)."""
    return None if name is None else tuning.canonical(name)


@dataclass(frozen=True)
class Where:
    """Where a record came from: file:line, and the process that wrote it (None when unknown)."""
    source: str
    host: str | None
    pid: int | None
    tid: int | None
    dev: int | None
    ts: str | None = None


@dataclass(frozen=True)
class VersionLine:
    at: Where
    version: str            # "2.28.9"
    code: int               # 22809 (NCCL_VERSION_CODE from 2.9: major*10000 + minor*100 + patch)
    suffix: str             # "-simulated", "" for a release
    build: str              # "cuda12.9", "cpu"
    simulated: bool


@dataclass(frozen=True)
class EnvSetting:
    """`X set by environment to Y` (NCCL_PARAM form ends in '.', string-valued reads do not)."""
    at: Where
    var: str
    value: str
    param_form: bool        # "%lld." form of ncclLoadParam: a process-cached NCCL_PARAM read


@dataclass(frozen=True)
class InvalidValue:
    at: Where
    var: str
    value: str
    default: str


@dataclass(frozen=True)
class CacheDisabled:
    """`[PARAM: ]Disabling caching for environment variable X.` (NCCL_NO_CACHE, 2.29.7+)."""
    at: Where
    var: str


@dataclass(frozen=True)
class CommInit:
    at: Where
    phase: str              # "START" | "COMPLETE"
    api: str | None         # absent before 2.21 ("comm %p rank ..." lines)
    comm: str               # the ncclComm_t pointer as printed
    rank: int
    nranks: int
    cuda_dev: int
    nvml_dev: int | None    # absent in 2.18
    bus_id: str
    comm_id: int | None     # commHash from 2.26 (== profiler commId); hashUniqueId before; none on splits
    parent: str | None = None
    split_count: int | None = None  # splitCount (2.24-2.28) / childCount (2.29+)
    color: int | None = None
    key: int | None = None


@dataclass(frozen=True)
class CommEnd:
    """`comm %p rank %d nranks %d cudaDev %d busId %lx - Destroy|Abort COMPLETE` (every release)."""
    at: Where
    comm: str
    rank: int
    nranks: int
    how: str                # "Destroy" | "Abort"


@dataclass(frozen=True)
class CommTopology:
    """`comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d MNNVL %d` (2.20+)."""
    at: Where
    comm: str
    rank: int
    nranks: int
    nnodes: int
    local_ranks: int | None
    local_rank: int | None
    mnnvl: int | None


@dataclass(frozen=True)
class PluginLoaded:
    at: Where
    kind: str               # "profiler" | "env" | "tuner"
    name: str
    version: int | None     # the plugin ABI version (v5 -> 5); None where the line does not say


@dataclass(frozen=True)
class ConfigLine:
    """`Comm config F set to V` (caller's ncclConfig_t) or `Comm config F reset to NCCL_X=V` (env wins)."""
    at: Where
    field: str
    value: str
    var: str | None         # the overriding variable, None when the caller set it
    var_value: str | None


@dataclass(frozen=True)
class CollCall:
    """`%s: opCount %lx ... count %zu datatype %d op %d root %d comm %p [nranks=%d] stream %p`
    (NCCL_DEBUG_SUBSYS=COLL, every rank, at the call): the one per-collective line naming its comm."""
    at: Where
    func: str
    op_count: int
    count: int
    comm: str
    nranks: int


@dataclass(frozen=True)
class Tuning:
    """What NCCL ran for one collective (rank 0 only): algorithm, protocol, channels or time."""
    at: Where
    func: str | None        # absent in 2.20-2.22 lines
    nbytes: int
    algo: str               # NCCL_ALGO spelling ("Ring", "CollNetDirect"); "CopyEngine", "Symmetric(kernel)"
    proto: str | None       # "LL" | "LL128" | "Simple"; None for copy-engine and symmetric kernels
    channel_lo: int | None
    channel_hi: int | None
    time_us: float | None   # the model's predicted time (pre-2.24 lines)

    @property
    def nchannels(self) -> int | None:
        if self.channel_lo is None or self.channel_hi is None:
            return None
        return self.channel_hi - self.channel_lo + 1


@dataclass(frozen=True)
class Warn:
    at: Where
    file: str
    line: int
    message: str


Record = Union[VersionLine, EnvSetting, InvalidValue, CacheDisabled, CommInit, CommEnd, CommTopology,
               PluginLoaded, ConfigLine, CollCall, Tuning, Warn]

# What the counts mean where a report lists what it skipped: lines, and files (FILE_PROBLEMS). Records
# past MAX_RECORDS are not kept in NcclLog.records but still reach the sink (the model): not skipped.
PROBLEMS = {
    "too_long": f"NCCL log line over {MAX_LINE} bytes",
    "malformed": "NCCL log line in an unexpected format",
    "unreadable": "NCCL log file unreadable or not a regular file",
}
FILE_PROBLEMS = frozenset({PROBLEMS["unreadable"]})


@dataclass
class NcclLog:
    records: list = field(default_factory=list)     # the first `keep` records, in order
    files: list[str] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)   # path -> reason
    counts: Counter = field(default_factory=Counter)  # lines, blank, records, nccl_other, unknown, malformed, ...
    procs: dict[tuple[str, int], None] = field(default_factory=dict)
    notes: list[dict] = field(default_factory=list)   # {path, note, bytes}: a file not read whole
    keep: int = MAX_RECORDS  # records kept in `records` (0: a sink takes each, as the model's reader does)

    def of(self, kind: type) -> list:
        return [r for r in self.records if isinstance(r, kind)]

    def processes(self) -> list[tuple[str | None, int | None]]:
        return list(self.procs)

    def problems(self) -> dict[str, int]:
        """Skipped lines and files by reason (for a report's list of what it could not read)."""
        return {text: self.counts[key] for key, text in PROBLEMS.items() if self.counts[key]}


# ---- the prefix ---------------------------------------------------------------------------------

_ANCHOR = re.compile(r":(\d{1,10}):(\d{1,10}) ")      # the ":pid:tid " of host:pid:tid
_HOST_REV = re.compile(r"[^\s:.\[\]\x00-\x1f\x7f]{1,%d}" % (MAX_HOST + 1))   # matched on the reversed line
_TAIL_TEXT = (r"(?:\[(?P<dev>-?\d{1,10})\] )?(?:(?P<ttime>\d{1,20}\.\d{1,9}) )?"
              r"(?:(?P<file>[\w./+<>-]{1,256}):(?P<fline>\d{1,10}) (?:\((?P<func>[^()\s]{1,256})\) )?)?"
              r"NCCL (?P<level>INFO|WARN|TRACE|CALL)(?: |$)")
_TAIL = re.compile(_TAIL_TEXT)
# A line that begins with the last line's prefix (up to the space after its level) has that prefix: no path
# of _AT_START reads past a space before the level, so none that failed on the last line can match this one.
REUSE_PREFIX = True
# the usual line, prefix first: one anchored match with bounded repeats
_AT_START = re.compile(r"(?:(?P<ts>\[[^\]]{1,64}\]) ?)?"
                       r"(?P<host>[^\s:.\[\]\x00-\x1f\x7f]{1,%d}):(?P<pid>\d{1,10}):(?P<tid>\d{1,10}) " % MAX_HOST
                       + _TAIL_TEXT)


class _Head(NamedTuple):  # (a tuple: one a line, built without a frozen dataclass's setattr per field)
    start: int              # where the prefix (with its timestamp) begins
    body: int               # where the message begins
    host: str
    pid: int
    tid: int
    dev: int | None
    ts: str | None
    level: str
    file: str | None
    fline: int | None


def _heads(line: str) -> list[_Head]:
    """Every NCCL prefix in line, in order; linear in len(line) (see the module docstring)."""
    m = _AT_START.match(line)
    if m is not None and _ANCHOR.search(line, m.end()) is None:
        head = _head(m, 0, m["host"], m["pid"], m["tid"], m["ts"])
        return [head] if head is not None else []
    return _scan(line)


def _head(t: re.Match, start: int, host: str, pid_text: str, tid_text: str, ts: str | None) -> _Head | None:
    """The prefix from its tail match `t` (dev, file:line, level) and the host:pid:tid before it."""
    pid, tid = int(pid_text), int(tid_text)
    if pid >= _I32 or tid >= _I32:
        return None
    dev = int(t["dev"]) if t["dev"] is not None else None
    return _Head(start, t.end(), host, pid, tid, dev if dev is not None and -_I32 <= dev < _I32 else None,
                 _clean(ts) if ts else None, t["level"], t["file"], int(t["fline"]) if t["fline"] is not None else None)


def _scan(line: str) -> list[_Head]:
    """_heads for a line whose prefix is not at its start, or that holds several (glued lines)."""
    out: list[_Head] = []
    rev = None
    n = len(line)
    for a in _ANCHOR.finditer(line):
        t = _TAIL.match(line, a.end())
        if t is None:
            continue
        if rev is None:
            rev = line[::-1]
        h = _HOST_REV.match(rev, n - a.start())
        if h is None or h.end() - h.start() > MAX_HOST:
            continue
        hs = a.start() - (h.end() - h.start())
        start, ts = hs, None
        e = hs - 1 if hs > 0 and line[hs - 1] == " " else hs
        if e > 0 and line[e - 1] == "]":
            o = line.rfind("[", max(0, e - 66), e - 1)
            if o >= 0 and 1 <= e - 1 - o - 1 <= 64:
                start, ts = o, line[o:e]
        head = _head(t, start, line[hs:a.start()], a[1], a[2], ts)
        if head is not None:
            out.append(head)
    return out


def _clean(text: str) -> str:
    """Control characters (a terminal's escapes among them) never leave the parser."""
    return text if text.isprintable() else "".join(ch if ch.isprintable() else "\ufffd" for ch in text)


# ---- messages -----------------------------------------------------------------------------------

_PTR = r"(?:0x[0-9a-fA-F]{1,16}|\(nil\))"
_INT = r"-?\d{1,10}"
_U64 = r"\d{1,20}"
_VERSION = re.compile(r"NCCL version (?P<ver>(?P<maj>\d{1,3})\.(?P<min>\d{1,3})\.(?P<pat>\d{1,3}))"
                      r"(?P<suffix>[^+\s]{0,64})(?:\+(?P<build>\S{1,64}))?")
_SET_BY_ENV = re.compile(r"(?P<var>NCCL_\w{1,128}) set by environment to (?P<value>.*)")
_PARAM_VALUE = re.compile(r"-?\d{1,20}\.")
_INVALID = re.compile(r"Invalid value (?P<value>.{0,4096}?) for (?P<var>NCCL_\w{1,128}), "
                      r"using default (?P<default>-?\w{1,32})\.?")
_NO_CACHE = re.compile(r"(?:PARAM: )?Disabling caching for environment variable (?P<var>\w{1,128})\.?")
_INIT = re.compile(
    rf"(?:\[Rank {_INT}\] )?(?:(?P<api>[A-Za-z_]\w{{0,63}}) )?comm (?P<comm>{_PTR}) rank (?P<rank>{_INT}) "
    rf"nranks (?P<nranks>{_INT}) cudaDev (?P<cuda>{_INT})(?: nvmlDev (?P<nvml>{_INT}))? busId (?P<bus>[0-9a-fA-F]{{1,16}})"
    rf"(?: parent (?P<parent>{_PTR})(?: (?:splitCount|childCount) (?P<split>{_INT}))? color (?P<color>{_INT}) "
    rf"key (?P<key>{_INT}))?(?: commId 0x(?P<commid>[0-9a-fA-F]{{1,16}}))? ?- Init (?P<phase>START|COMPLETE)")
_END = re.compile(rf"comm (?P<comm>{_PTR}) rank (?P<rank>{_INT}) nranks (?P<nranks>{_INT}) cudaDev {_INT} "
                  rf"busId [0-9a-fA-F]{{1,16}} - (?P<how>Destroy|Abort) COMPLETE")
_TOPO = re.compile(rf"comm (?P<comm>{_PTR}) rank (?P<rank>{_INT}) nRanks (?P<nranks>{_INT}) nNodes (?P<nnodes>{_INT})"
                   rf"(?: localRanks (?P<lranks>{_INT}) localRank (?P<lrank>{_INT}))?(?: MNNVL (?P<mnnvl>{_INT}))?")
_PLUGIN = re.compile(r"(?P<kind>PROFILER|ENV|TUNER)/Plugin: (?:Loaded|loaded|Using tuner plugin|Using) "
                     r"(?P<name>.{1,256}?)(?: \(v(?P<ver>\d{1,4})\))?")
_CONFIG_RESET = re.compile(rf"Comm config (?P<field>\w{{1,64}}) reset to (?:(?P<fval>{_INT}) by )?"
                           r"(?P<var>NCCL_\w{1,128})=(?P<value>.*)")
_CONFIG_SET = re.compile(r"Comm config (?P<field>\w{1,64}) set to (?P<value>.*)")
_TUNING_NEW = re.compile(rf"(?P<func>\w{{1,64}}): (?P<bytes>{_U64}) Bytes -> Algo (?P<algo>\w{{1,32}}) "
                         rf"proto (?P<proto>\w{{1,32}}) channel\{{Lo\.\.Hi\}}=\{{(?P<lo>{_INT})\.\.(?P<hi>{_INT})\}}")
_TUNING_OLD = re.compile(rf"(?:(?P<func>\w{{1,64}}): )?(?P<bytes>{_U64}) Bytes -> Algo (?P<algo>{_INT}) "
                         rf"proto (?P<proto>{_INT}) time (?P<time>[-+\w.]{{1,32}})")
_TUNING_CE = re.compile(rf"(?P<func>\w{{1,64}}) \[(?P<kind>Copy Engine|Hierarchical CE)\]: (?P<bytes>{_U64}) Bytes -> ")
_TUNING_SYM = re.compile(rf"(?P<func>\w{{1,64}}) \[Symmetric\]: (?P<bytes>{_U64}) Bytes -> Kernel (?P<kernel>\S{{1,128}}) "
                         rf"nchannels (?P<nch>{_INT}) nthreads {_INT}")
_COLL = re.compile(rf"(?P<func>\w{{1,64}}): opCount (?P<op>[0-9a-fA-F]{{1,16}}) sendbuff {_PTR} recvbuff {_PTR} "
                   rf"count (?P<count>{_U64}) datatype {_INT} op {_INT} root {_INT} comm (?P<comm>{_PTR}) "
                   rf"\[nranks=(?P<nranks>{_INT})\] stream {_PTR}")


def _i32(text: str | None) -> int | None:
    """A C int from a bounded digit run (the patterns allow at most 10 digits), None outside int range."""
    if text is None:
        return None
    v = int(text)
    return v if -_I32 <= v < _I32 else None


def _id_name(table: tuple[str, ...], raw: str) -> str:
    i = int(raw)
    return table[i] if 0 <= i < len(table) else f"#{i}"


def _message(msg: str, at: Where):
    """The record for one INFO/TRACE message; None if it is none we model, False if it looks like one
    we model but does not parse (a changed format, or a damaged line)."""
    if " set by environment to " in msg:
        if m := _SET_BY_ENV.fullmatch(msg):
            value = m["value"]
            param = bool(_PARAM_VALUE.fullmatch(value))
            return EnvSetting(at, m["var"], _clean(value[:-1] if param else value), param)
        return False
    if msg.endswith(("- Init START", "- Init COMPLETE")):
        return _init(msg, at)
    if msg.endswith((" - Destroy COMPLETE", " - Abort COMPLETE")):
        m = _END.fullmatch(msg)
        rank, nranks = (_i32(m["rank"]), _i32(m["nranks"])) if m else (None, None)
        return CommEnd(at, m["comm"].lower(), rank, nranks, m["how"]) if m and None not in (rank, nranks) else False
    if " Bytes -> " in msg:
        return _tuning(msg, at)
    if ": opCount " in msg:
        m = _COLL.fullmatch(msg)
        nranks = _i32(m["nranks"]) if m else None
        if m is None or nranks is None or int(m["count"]) >= _I64:
            return False
        return CollCall(at, m["func"], int(m["op"], 16), int(m["count"]), m["comm"].lower(), nranks)
    if msg.startswith("comm ") and " nNodes " in msg:
        m = _TOPO.match(msg)
        vals = [_i32(m[k]) for k in ("rank", "nranks", "nnodes")] if m else [None]
        if None in vals:
            return False
        return CommTopology(at, m["comm"].lower(), *vals, _i32(m["lranks"]), _i32(m["lrank"]), _i32(m["mnnvl"]))
    if msg.startswith(("PROFILER/Plugin: ", "ENV/Plugin: ", "TUNER/Plugin: ")):
        if m := _PLUGIN.fullmatch(msg):
            return PluginLoaded(at, m["kind"].lower(), _clean(m["name"]), int(m["ver"]) if m["ver"] else None)
        return False if msg.partition(": ")[2].startswith(("Loaded ", "loaded ", "Using ")) else None
    if msg.startswith("Comm config "):
        if m := _CONFIG_RESET.fullmatch(msg):
            value = _clean(m["value"])
            return ConfigLine(at, m["field"], m["fval"] if m["fval"] else value, m["var"], value)
        if m := _CONFIG_SET.fullmatch(msg):
            return ConfigLine(at, m["field"], _clean(m["value"]), None, None)
        return False
    if msg.startswith("Invalid value "):
        if m := _INVALID.fullmatch(msg):
            return InvalidValue(at, m["var"], _clean(m["value"]), m["default"])
        return False
    if "Disabling caching for environment variable" in msg:
        m = _NO_CACHE.fullmatch(msg)
        return CacheDisabled(at, m["var"]) if m else False
    if msg.startswith("NCCL version "):
        m = _VERSION.match(msg)
        return _version(m, at) if m else False
    return None


def _init(msg: str, at: Where):
    m = _INIT.fullmatch(msg)
    if m is None:
        return False
    ints = {k: _i32(m[k]) for k in ("rank", "nranks", "cuda", "nvml", "split", "color", "key")}
    if None in (ints["rank"], ints["nranks"], ints["cuda"]) or any(
            m[k] is not None and ints[k] is None for k in ("nvml", "split", "color", "key")):
        return False
    return CommInit(at, m["phase"], m["api"], m["comm"].lower(), ints["rank"], ints["nranks"], ints["cuda"],
                    ints["nvml"], m["bus"].lower(), int(m["commid"], 16) if m["commid"] else None,
                    m["parent"].lower() if m["parent"] else None, ints["split"], ints["color"], ints["key"])


def _tuning(msg: str, at: Where):
    if m := _TUNING_NEW.match(msg):
        lo, hi, nbytes = _i32(m["lo"]), _i32(m["hi"]), int(m["bytes"])
        if lo is None or hi is None or nbytes >= _I64:
            return False
        return Tuning(at, m["func"], nbytes, canonical(m["algo"]), canonical(m["proto"]), lo, hi, None)
    if m := _TUNING_OLD.match(msg):
        if int(m["bytes"]) >= _I64:
            return False
        try:
            t = float(m["time"])
        except ValueError:
            t = None
        return Tuning(at, m["func"], int(m["bytes"]), _id_name(ALGO_IDS, m["algo"]), _id_name(PROTO_IDS, m["proto"]),
                      None, None, t if t is not None and math.isfinite(t) else None)
    if m := _TUNING_CE.match(msg):
        algo = "CopyEngine" if m["kind"] == "Copy Engine" else "HierarchicalCE"
        return Tuning(at, m["func"], int(m["bytes"]), algo, None, None, None, None) if int(m["bytes"]) < _I64 else False
    if m := _TUNING_SYM.match(msg):
        nch = _i32(m["nch"])
        if nch is None or nch < 1 or int(m["bytes"]) >= _I64:
            return False
        return Tuning(at, m["func"], int(m["bytes"]), f"Symmetric({_clean(m['kernel'])})", None, 0, nch - 1, None)
    return False


def _version(m: re.Match, at: Where) -> VersionLine:
    code = int(m["maj"]) * 10000 + int(m["min"]) * 100 + int(m["pat"])
    suffix, build = _clean(m["suffix"] or ""), _clean(m["build"] or "")
    return VersionLine(at, m["ver"], code, suffix, build, "simulated" in (suffix + build).lower())


# ---- lines and files ----------------------------------------------------------------------------

Sink = Callable[[Record], None]


def parse_lines(lines: Iterable[str | None], name: str = "<text>", log: NcclLog | None = None,
                sink: Sink | None = None) -> NcclLog:
    """Parses NCCL log text into `log` (a new one if None); returns it. A None item is a line the
    reader skipped as too long. Every record goes to `sink` too, in order, kept or not."""
    log = log if log is not None else NcclLog()
    bare: list[VersionLine] = []      # records without a process (bare version lines) of this input
    procs: set[tuple[str, int]] = set()
    prefix, prefix_heads = None, []   # the last line's prefix, where it began the line and ended in a space
    for n, raw in enumerate(lines, 1):
        log.counts["lines"] += 1
        if raw is None or len(raw) > MAX_LINE:
            log.counts["too_long"] += 1
            continue
        line = raw.rstrip("\r\n")
        if not line or line.isspace():
            log.counts["blank"] += 1
            continue
        if prefix is not None and line.startswith(prefix) and _ANCHOR.search(line, len(prefix)) is None:
            heads = prefix_heads  # a writer's lines share one prefix: _AT_START would match it again, and alike
        else:
            heads = _heads(line)
            if REUSE_PREFIX and len(heads) == 1 and heads[0].start == 0 and line[heads[0].body - 1] == " ":
                prefix, prefix_heads = line[:heads[0].body], heads
        if len(heads) > 1:
            # two processes' lines glued together on a shared stream: parse each part on its own
            log.counts["glued"] += 1
        malformed = False
        for i, h in enumerate(heads):
            end = heads[i + 1].start if i + 1 < len(heads) else len(line)
            malformed |= _one(h, line[h.body:end].rstrip(), f"{name}:{n}", log, sink, procs)
        if malformed:  # once per line, however many glued parts it holds
            log.counts["malformed"] += 1
        if heads:
            continue
        stripped = line.strip()
        if stripped.startswith("NCCL version ") and (v := _VERSION.match(stripped)):
            bare.append(_version(v, Where(f"{name}:{n}", None, None, None, None)))
        else:
            log.counts["unknown"] += 1
    _attribute_bare(log, bare, procs, sink)
    return log


def _one(h: _Head, msg: str, source: str, log: NcclLog, sink: Sink | None, procs: set) -> bool:
    """Parses one message into a record; whether it was malformed."""
    at = Where(source, _clean(h.host), h.pid, h.tid, h.dev, h.ts)
    procs.add((at.host, at.pid))
    log.procs.setdefault((at.host, at.pid))
    rec = None
    if h.level == "WARN":
        rec = Warn(at, _clean(h.file or ""), h.fline if h.fline is not None and h.fline < _I32 else 0, _clean(msg))
    elif h.level in ("INFO", "TRACE"):
        rec = _message(msg, at)
    if not rec:
        if rec is None:
            log.counts["nccl_other"] += 1
        return rec is False
    _keep(log, rec, sink)
    return False


def _keep(log: NcclLog, rec, sink: Sink | None) -> None:
    log.counts["records"] += 1
    log.counts[type(rec).__name__] += 1
    if len(log.records) < log.keep:
        log.records.append(rec)
    elif log.keep:
        log.counts["records_not_kept"] += 1
    if sink is not None:
        sink(rec)


def _attribute_bare(log: NcclLog, bare: list[VersionLine], procs: set, sink: Sink | None) -> None:
    # a per-process NCCL_DEBUG_FILE (%p): its bare version lines belong to its one writer
    one = next(iter(procs)) if len(procs) == 1 else (None, None)
    for r in bare:
        _keep(log, VersionLine(Where(r.at.source, one[0], one[1], None, None), r.version, r.code, r.suffix,
                               r.build, r.simulated), sink)


def read_lines(pieces: Iterable[bytes | None], cap: int = MAX_LINE) -> Iterator[bytes | None]:
    """The lines of a file's pieces (witnesses.jsonlines.Source: CHUNK bytes at a time, None for a hole
    stepped over), split on b"\n" only (as NCCL writes; a '\r' inside stays): a line over `cap` bytes
    comes out as None and is never held whole; a hole ends the line before it."""
    buf = b""
    skipping = False
    for chunk in pieces:
        if chunk is None:  # a crash's or a truncate's hole: what came before it is the line
            if skipping or buf:
                yield None if skipping else buf
            buf, skipping = b"", False
            continue
        start = 0
        while (nl := chunk.find(b"\n", start)) >= 0:
            piece = chunk[start:nl]
            if skipping or len(buf) + len(piece) > cap:
                yield None
            else:
                yield buf + piece
            buf, skipping, start = b"", False, nl + 1
        if not skipping:
            rest = chunk[start:]
            if len(buf) + len(rest) > cap:
                buf, skipping = b"", True
            else:
                buf += rest
    if skipping:
        yield None
    elif buf:
        yield buf


def _capped(pieces, left: list) -> Iterator[bytes | None]:
    """pieces up to left[0] lines; then left[0] is -1 and the rest is not read."""
    for piece in pieces:
        n = piece.count(b"\n") if piece is not None else 0
        if n > left[0]:
            end = -1
            for _ in range(left[0]):  # once per file, at most a chunk's newlines
                end = piece.find(b"\n", end + 1)
            if end >= 0:
                yield piece[:end + 1]
            left[0] = -1
            return
        left[0] -= n
        yield piece


def parse_files(paths: Iterable[str | os.PathLike], sink: Sink | None = None, keep: int = MAX_RECORDS) -> NcclLog:
    """Parses every file (NCCL_DEBUG_FILE outputs, captured stdout/stderr); unreadable ones (missing,
    symlinks, FIFOs and other non-regular files: never opened so that they block) are counted. Holes are
    stepped over and at most jsonlines.FILE_CAP bytes of each file's data are read (log.notes says so)."""
    from ncclprobe.witnesses import jsonlines
    log = NcclLog(keep=keep)
    for p in paths:
        path = str(Path(p))
        try:
            src = jsonlines.Source(path)  # O_NONBLOCK|O_NOFOLLOW, then fstat: a regular file
        except OSError as exc:
            log.counts["unreadable"] += 1
            log.unreadable[path] = exc.strerror or type(exc).__name__
            continue
        log.files.append(path)
        left = [MAX_FILE_LINES]
        lines = (b if b is None else b.decode("utf-8", "replace") for b in read_lines(_capped(src.pieces(), left)))
        parse_lines(lines, path, log, sink)
        if left[0] < 0:
            log.notes.append({"path": path, "note": f"read its first {MAX_FILE_LINES} lines (the per-file cap); "
                              "the rest not read", "bytes": None})
        if src.holes:
            log.notes.append({"path": path, "note": f"{jsonlines.size_words(src.holes)} of NUL bytes skipped (a "
                              "hole: a crash, a truncate)", "bytes": src.holes})
        if src.not_read:
            log.notes.append({"path": path, "note": f"read the first {jsonlines.size_words(src.cap)} of its data "
                              f"(the per-file cap); {jsonlines.size_words(src.not_read)} after it not read",
                              "bytes": src.not_read})
    return log


def debug_file_name(pattern: str, host: str, pid: int) -> str:
    """NCCL_DEBUG_FILE expansion (src/debug.cc): %h host (cut at the first '.'), %p pid, %% a percent."""
    out, i = [], 0
    short = host.split(".", 1)[0]
    while i < len(pattern):
        c = pattern[i]
        if c == "%" and i + 1 < len(pattern) and pattern[i + 1] in "hp%":
            out.append({"h": short, "p": str(pid), "%": "%"}[pattern[i + 1]])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)
