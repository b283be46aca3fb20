"""NCCL's own log (NCCL_DEBUG=INFO output, NCCL 2.18 through 2.32) as frozen records.

A user who only has NCCL logs still learns which values NCCL read, which communicators it built and
what it ran. Formats (src/debug.cc, src/init.cc, src/enqueue.cc of each release):

  [ts ]host:pid:tid [dev] NCCL INFO msg        ts only when NCCL_DEBUG_TIMESTAMP_LEVELS asks (2.26+)
  host:pid:tid [dev] file.cc:123 NCCL WARN msg  preceded by an empty line
  host:pid:tid [dev] 12.345 file.cc:123 NCCL TRACE msg
  NCCL version 2.30.7+cuda12.9                  bare at NCCL_DEBUG=VERSION|WARN (2.30)

Lines may carry a launcher's prefix (torchrun's "[default0]:"), so the NCCL prefix is searched, not
anchored. Anything else is skipped and counted, never an error.
"""
from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Union

from ncclprobe import tuning

# Numeric ids in pre-2.24 TUNING lines index these (src/include/devcomm.h: NCCL_ALGO_*, NCCL_PROTO_*);
# 2.24+ lines print ncclAlgoToString names ("RING", "COLLNET_DIRECT"). Records carry the NCCL_ALGO /
# NCCL_PROTO spelling, as ncclprobe.tuning defines it.
ALGO_IDS = tuning.ALGOS
PROTO_IDS = tuning.PROTOS


def canonical(name: str | None) -> str | None:
    """'RING' / 'ring' / 'COLLNET_DIRECT' / 'SIMPLE' -> 'Ring' / 'CollNetDirect' / 'Simple' (others unchanged)."""
    return None if name is None else tuning.canonical(name)


MAX_LINE = 1 << 16  # NCCL formats into a 1024-byte buffer; anything far longer is not NCCL's


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
    api: str | None         # absent before 2.22 ("comm %p rank ..." lines)
    comm: str               # the ncclComm_t pointer as printed
    rank: int
    nranks: int
    cuda_dev: int
    nvml_dev: int | None    # absent in 2.18/2.19
    bus_id: str
    comm_id: int | None     # commHash from 2.26 (== profiler commId); hashUniqueId before; none on splits
    parent: str | None = None
    split_count: int | None = None  # splitCount (2.26-2.28) / childCount (2.29+)
    color: int | None = None
    key: int | None = None


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
class Tuning:
    """What NCCL ran for one collective (rank 0 only): algorithm, protocol, channels or time."""
    at: Where
    func: str | None        # absent in 2.20-2.22 lines
    nbytes: int
    algo: str               # NCCL_ALGO spelling ("Ring", "CollNetDirect"), whatever case the line used
    proto: str | None       # "LL" | "LL128" | "Simple"; None for copy-engine collectives
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


Record = Union[VersionLine, EnvSetting, InvalidValue, CacheDisabled, CommInit, CommTopology,
               PluginLoaded, ConfigLine, Tuning, Warn]


@dataclass
class NcclLog:
    records: list = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)  # lines, blank, records, nccl_other, unknown, unreadable

    def of(self, kind: type) -> list:
        return [r for r in self.records if isinstance(r, kind)]

    @property
    def skipped(self) -> int:
        return self.counts["unknown"]

    def processes(self) -> list[tuple[str | None, int | None]]:
        seen = dict.fromkeys((r.at.host, r.at.pid) for r in self.records)
        return list(seen)


_HEAD = (r"(?P<ts>\[[^\]\n]{1,64}\] ?)?(?P<host>[^\s:.\[\]]+):(?P<pid>\d+):(?P<tid>\d+) "
         r"(?:\[(?P<dev>-?\d+)\] (?:(?P<ttime>\d+\.\d+) )?(?:(?P<file>[\w./+-]+):(?P<fline>\d+) )?)?"
         r"NCCL (?P<level>INFO|WARN|TRACE|CALL)\b ?")
_PREFIX = re.compile(_HEAD + r"(?P<msg>.*)$")
_HEADS = re.compile(_HEAD)
_VERSION = re.compile(r"NCCL version (?P<ver>(?P<maj>\d+)\.(?P<min>\d+)\.(?P<pat>\d+))"
                      r"(?P<suffix>[^+\s]*)(?:\+(?P<build>\S+))?")
_SET_BY_ENV = re.compile(r"^(?P<var>NCCL_\w+) set by environment to (?P<value>.*?)(?P<dot>\.)?\s*$")
_INVALID = re.compile(r"^Invalid value (?P<value>.*) for (?P<var>NCCL_\w+), using default (?P<default>-?\w+)\.?$")
_NO_CACHE = re.compile(r"^(?:PARAM: )?Disabling caching for environment variable (?P<var>\w+)\.?$")
_INIT = re.compile(
    r"^(?:\[Rank -?\d+\] )?(?:(?P<api>[A-Za-z_]\w*) )?comm (?P<comm>\S+) rank (?P<rank>-?\d+) "
    r"nranks (?P<nranks>-?\d+) cudaDev (?P<cuda>-?\d+)(?: nvmlDev (?P<nvml>-?\d+))? busId (?P<bus>[0-9a-fA-F]+)"
    r"(?: parent (?P<parent>\S+)(?: (?:splitCount|childCount) (?P<split>-?\d+))? color (?P<color>-?\d+) "
    r"key (?P<key>-?\d+))?(?: commId (?P<commid>0x[0-9a-fA-F]+))? ?- Init (?P<phase>START|COMPLETE)\b")
_TOPO = re.compile(r"^comm (?P<comm>\S+) rank (?P<rank>-?\d+) nRanks (?P<nranks>-?\d+) nNodes (?P<nnodes>-?\d+)"
                   r"(?: localRanks (?P<lranks>-?\d+) localRank (?P<lrank>-?\d+))?(?: MNNVL (?P<mnnvl>-?\d+))?")
_PLUGIN = re.compile(r"^(?P<kind>PROFILER|ENV|TUNER)/Plugin: (?:Loaded|loaded|Using tuner plugin|Using) "
                     r"(?P<name>.+?)(?: \(v(?P<ver>\d+)\))?$")
_CONFIG_RESET = re.compile(r"^Comm config (?P<field>\w+) reset to (?:(?P<fval>-?\d+) by )?"
                           r"(?P<var>NCCL_\w+)=(?P<value>.*)$")
_CONFIG_SET = re.compile(r"^Comm config (?P<field>\w+) set to (?P<value>.*)$")
_TUNING_NEW = re.compile(r"^(?P<func>\w+): (?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"
                         r" channel\{Lo\.\.Hi\}=\{(?P<lo>-?\d+)\.\.(?P<hi>-?\d+)\}")
_TUNING_OLD = re.compile(r"^(?:(?P<func>\w+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>-?\d+) proto (?P<proto>-?\d+)"
                         r" time (?P<time>[-\d.einfa]+)")
_TUNING_CE = re.compile(r"^(?P<func>\w+) \[Copy Engine\]: (?P<bytes>\d+) Bytes -> (?P<how>\w+)")
# Messages that name a format we parse: if one of these fails to match, the format changed.
_KEYWORDS = ("Init START", "Init COMPLETE", "set by environment", "Bytes -> ", "/Plugin: Loaded",
             "/Plugin: Using", "Comm config ", "nNodes ")


def _id_name(table: tuple[str, ...], raw: str) -> str:
    i = int(raw)
    return table[i] if 0 <= i < len(table) else f"#{i}"


def _message(msg: str, at: Where):
    """The record for one INFO/TRACE message, or None if it is not one we model."""
    if m := _SET_BY_ENV.match(msg):
        return EnvSetting(at, m["var"], m["value"], bool(m["dot"]))
    if m := _INIT.match(msg):
        return CommInit(at, m["phase"], m["api"], m["comm"], int(m["rank"]), int(m["nranks"]), int(m["cuda"]),
                        int(m["nvml"]) if m["nvml"] else None, m["bus"],
                        int(m["commid"], 16) if m["commid"] else None, m["parent"],
                        int(m["split"]) if m["split"] else None,
                        int(m["color"]) if m["color"] else None, int(m["key"]) if m["key"] else None)
    if m := _TUNING_NEW.match(msg):
        return Tuning(at, m["func"], int(m["bytes"]), canonical(m["algo"]), canonical(m["proto"]),
                      int(m["lo"]), int(m["hi"]), None)
    if m := _TUNING_OLD.match(msg):
        try:
            t = float(m["time"])
        except ValueError:
            t = None
        return Tuning(at, m["func"], int(m["bytes"]), _id_name(ALGO_IDS, m["algo"]),
                      _id_name(PROTO_IDS, m["proto"]), None, None, t)
    if m := _TUNING_CE.match(msg):
        return Tuning(at, m["func"], int(m["bytes"]), f"CopyEngine({m['how']})", None, None, None, None)
    if m := _TOPO.match(msg):
        opt = lambda k: int(m[k]) if m[k] else None  # noqa: E731
        return CommTopology(at, m["comm"], int(m["rank"]), int(m["nranks"]), int(m["nnodes"]),
                            opt("lranks"), opt("lrank"), opt("mnnvl"))
    if m := _PLUGIN.match(msg):
        return PluginLoaded(at, m["kind"].lower(), m["name"], int(m["ver"]) if m["ver"] else None)
    if m := _CONFIG_RESET.match(msg):
        return ConfigLine(at, m["field"], m["fval"] if m["fval"] else m["value"], m["var"], m["value"])
    if m := _CONFIG_SET.match(msg):
        return ConfigLine(at, m["field"], m["value"], None, None)
    if m := _INVALID.match(msg):
        return InvalidValue(at, m["var"], m["value"], m["default"])
    if m := _NO_CACHE.match(msg):
        return CacheDisabled(at, m["var"])
    if m := _VERSION.match(msg):
        return _version(m, at)
    return None


def _version(m: re.Match, at: Where) -> VersionLine:
    code = int(m["maj"]) * 10000 + int(m["min"]) * 100 + int(m["pat"])
    suffix, build = m["suffix"] or "", m["build"] or ""
    return VersionLine(at, m["ver"], code, suffix, build, "simulated" in (suffix + build).lower())


def parse_lines(lines: Iterable[str], name: str = "<text>", log: NcclLog | None = None) -> NcclLog:
    """Parses NCCL log text into `log` (a new one if None); returns it."""
    log = log if log is not None else NcclLog()
    bare: list[int] = []      # indexes of records without a process (bare version lines)
    procs: set[tuple[str, int]] = set()
    for n, raw in enumerate(lines, 1):
        log.counts["lines"] += 1
        line = raw.rstrip("\r\n")
        if not line.strip():
            log.counts["blank"] += 1
            continue
        if len(line) > MAX_LINE:
            log.counts["unknown"] += 1
            continue
        source = f"{name}:{n}"
        heads = [h.start() for h in _HEADS.finditer(line)]
        if len(heads) > 1:
            # two processes' lines glued together on a shared stream: parse each part on its own
            parts = [line[a:b] for a, b in zip(heads, heads[1:] + [len(line)])]
            log.counts["glued"] += 1
        else:
            parts = [line]
        for part in parts:
            _one(part, source, log, bare, procs)
    _attribute_bare(log, bare, procs)
    return log


def _one(line: str, source: str, log: NcclLog, bare: list[int], procs: set) -> None:
    m = _PREFIX.search(line)
    if m:
        at = Where(source, m["host"], int(m["pid"]), int(m["tid"]),
                   int(m["dev"]) if m["dev"] is not None else None, (m["ts"] or "").strip() or None)
        procs.add((at.host, at.pid))
        msg = m["msg"]
        rec = None
        if m["level"] == "WARN":
            rec = Warn(at, m["file"] or "", int(m["fline"] or 0), msg)
        elif m["level"] in ("INFO", "TRACE"):
            rec = _message(msg, at)
        if rec is None:
            log.counts["malformed" if any(k in msg for k in _KEYWORDS) else "nccl_other"] += 1
            return
    elif line.lstrip().startswith("NCCL version") and (v := _VERSION.search(line)):
        # bare VERSION-level line (NCCL_DEBUG=VERSION|WARN): no host/pid on it
        rec = _version(v, Where(source, None, None, None, None))
        bare.append(len(log.records))
    else:
        log.counts["unknown"] += 1
        return
    log.records.append(rec)
    log.counts["records"] += 1
    log.counts[type(rec).__name__] += 1


def _attribute_bare(log: NcclLog, bare: list[int], procs: set) -> None:
    if len(procs) != 1 or not bare:
        return
    # a per-process NCCL_DEBUG_FILE (%p): its bare version lines belong to its one writer
    host, pid = next(iter(procs))
    for i in bare:
        r = log.records[i]
        log.records[i] = VersionLine(Where(r.at.source, host, pid, None, None), r.version, r.code,
                                     r.suffix, r.build, r.simulated)


def parse_files(paths: Iterable[str | os.PathLike]) -> NcclLog:
    """Parses every file (NCCL_DEBUG_FILE outputs, captured stdout/stderr); unreadable ones are counted."""
    log = NcclLog()
    for p in paths:
        path = Path(p)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            log.counts["unreadable"] += 1
            continue
        with os.fdopen(fd, "rb") as fh:
            log.files.append(str(path))
            # binary iteration splits on b"\n" only, as NCCL writes; text mode would also split on '\r'
            parse_lines((b.decode("utf-8", "replace") for b in fh), str(path), log)
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
