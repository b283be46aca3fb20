"""NCCL's RAS diagnostics (2.31+), the report of the `DIAGNOSTICS` command, parsed into typed observations.

Facts it depends on (NCCL's src/ras/diagnostics*.cc, client_support.cc; docs troubleshooting/ras.rst "RAS
Diagnostics"; the strings of libnccl 2.32.3): the report is text only (in JSON format the server answers
`ERROR: diagnostics only supports text output`); every line is `HOST:PID NCCL DIAG ` (the process that ran it)
then `=== RAS Diagnostics ===`, result lines tagged `[OK]   ` or `[INFO] ` and named by their check
(`GPU inventory: `, `CUDA driver version: `, `ECC: `, `NVLink: `, `NCCL environment: `, and on 2.32 PCI, Xid
and rdma_topo checks), a completion line, and an `ERROR: ...` line where the summary failed. The NCCL
environment check compares each rank's `NCCL_*` entries of `environ`, read when the request arrives (what the
process holds now, not what its communicators were created with): per differing variable a `mismatch ... in
comm 0xHASH for VAR` line, then one `VAR=VALUE on rank(s) {0,1,...} (N=12)` line per value (`(unset)`: not set;
at most 8 ranks named, then the total; a value over 252 characters ends in `...`, control characters are `?`)."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from ncclprobe.model import comm_id

UNSET = "(unset)"          # NCCL's spelling of a variable a rank does not have
CUT = "..."                # NCCL's mark of a key or value it shortened
SHOWN = 252                # the characters of a value NCCL shows (RAS_DIAG_ENV_VALUE_DISPLAY_BYTES - 4)
DONE_MARK = b" NCCL DIAG RAS diagnostics completed in "  # the completion line, the report's last but an error
_HASH = r"(?P<comm>0x[0-9a-fA-F]+)"
_LINE = re.compile(r"^(?P<origin>\S+:\d+) NCCL DIAG (?P<body>.*)$")
_TAG = re.compile(r"^\[(?P<tag>[A-Z]+)\]\s*(?P<text>.*)$")
_DONE = re.compile(r"^RAS diagnostics completed in (?P<ms>[0-9.]+) ms across (?P<n>\d+) (?:ranks|RAS peers)$")
_MISMATCH = re.compile(r"^NCCL environment: mismatch across (?P<n>\d+) ranks in comm " + _HASH + r" for (?P<var>.+)$")
_VALUE = re.compile(r"^NCCL environment: (?P<var>[^=]+)=(?P<value>.*) on rank\(s\) "
                    r"\{(?P<ranks>[0-9,]*?)(?:,\.\.\.\} \(N=(?P<total>\d+)\)|\})$")
_SAME = re.compile(r"^NCCL environment: NCCL_\* env vars consistent across (?P<n>\d+) ranks in comm " + _HASH + "$")
_PARTIAL = re.compile(r"^NCCL environment: (?P<k>\d+) rank\(s\) had >\d+ bytes of NCCL_\* env vars")
_INCOMPLETE = re.compile(r"^(?P<check>[^:]+): diagnostics incomplete, gathered (?P<got>\d+)/(?P<n>\d+) ranks in comm "
                         + _HASH)


@dataclass(frozen=True)
class DiagLine:
    tag: str | None      # "OK" | "INFO" | None (header, completion, errors)
    check: str | None    # the check that said it ("NCCL environment", "GPU inventory", ...)
    text: str


@dataclass(frozen=True)
class EnvGroup:
    value: str | None          # None: the ranks do not have the variable
    ranks: tuple[int, ...]     # the ranks NCCL named (at most 8)
    total: int                 # the ranks with this value, named or not
    cut: bool = False          # NCCL shortened the value


@dataclass(frozen=True)
class EnvMismatch:
    comm: str | None           # comm_id's spelling of the communicator's hash
    var: str
    nranks: int
    groups: tuple[EnvGroup, ...]


@dataclass
class RasDiagnostics:
    """One DIAGNOSTICS conversation: what the report said, or why there is none."""
    address: str
    t: float
    origin: str | None = None          # HOST:PID of the NCCL process that ran the diagnostics
    lines: list[DiagLine] = field(default_factory=list)
    env: list[EnvMismatch] = field(default_factory=list)
    consistent: dict[str, int] = field(default_factory=dict)  # comm -> ranks whose NCCL_* all agree
    partial_ranks: int = 0             # ranks with over 16 KiB of NCCL_* entries: compared in part
    incomplete: list[dict] = field(default_factory=list)      # {check, comm, gathered, nranks}
    completed_ms: float | None = None
    errors: list[str] = field(default_factory=list)           # ERROR lines (a summary that failed)
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


def parse(d: RasDiagnostics, text: str) -> RasDiagnostics:
    """The report's lines into d; lines of no known shape are kept as they are (d.lines)."""
    for raw in text.splitlines():
        m = _LINE.match(raw.strip())
        if m is None:
            if raw.strip():
                d.lines.append(DiagLine(None, None, raw.strip()))
            continue
        d.origin = d.origin or m["origin"]
        _one(d, m["body"])
    if d.completed_ms is None and not d.reason:
        d.reason = f"the diagnostics report from {d.address} ended before its completion line"
    return d


def _one(d: RasDiagnostics, body: str) -> None:
    t = _TAG.match(body)
    tag, text = (t["tag"], t["text"]) if t else (None, body)
    check = text.split(":", 1)[0] if ": " in text and tag else None
    d.lines.append(DiagLine(tag, check, text))
    if (done := _DONE.match(text)) is not None:
        d.completed_ms = float(done["ms"])
    elif text.startswith("ERROR"):
        d.errors.append(text)
    elif (mm := _MISMATCH.match(text)) is not None:
        d.env.append(EnvMismatch(comm_id(mm["comm"]), mm["var"], int(mm["n"]), ()))
    elif (v := _VALUE.match(text)) is not None and d.env and d.env[-1].var == v["var"]:
        _add_group(d, v)
    elif (s := _SAME.match(text)) is not None:
        d.consistent[comm_id(s["comm"]) or s["comm"]] = int(s["n"])
    elif (p := _PARTIAL.match(text)) is not None:
        d.partial_ranks += int(p["k"])
    elif (i := _INCOMPLETE.match(text)) is not None:
        d.incomplete.append({"check": i["check"], "comm": comm_id(i["comm"]), "gathered": int(i["got"]),
                             "nranks": int(i["n"])})


def _add_group(d: RasDiagnostics, v: re.Match) -> None:
    ranks = tuple(int(r) for r in v["ranks"].split(",") if r)
    value = None if v["value"] == UNSET else v["value"]
    last = d.env[-1]
    group = EnvGroup(value, ranks, int(v["total"]) if v["total"] else len(ranks),
                     value is not None and len(value) == SHOWN + len(CUT) and value.endswith(CUT))
    d.env[-1] = EnvMismatch(last.comm, last.var, last.nranks, last.groups + (group,))


def summary(d: RasDiagnostics) -> dict:
    """What a command shows of one diagnostics conversation (JSON), and `said`: the line for a person."""
    said = (f"RAS diagnostics not read: {d.reason}" if not d.ok else
            f"RAS diagnostics (run by {d.origin or '?'}): " + (
                f"{len(d.env)} NCCL_* variable(s) differ across ranks" if d.env else
                f"NCCL_* consistent in {len(d.consistent)} communicator(s)"))
    return {"reason": d.reason, "origin": d.origin, "completed_ms": d.completed_ms,
            "env_mismatches": [{"comm": e.comm, "var": e.var, "nranks": e.nranks,
                                "groups": [asdict(g) for g in e.groups]} for e in d.env],
            "env_consistent": dict(d.consistent), "partial_ranks": d.partial_ranks, "incomplete": list(d.incomplete),
            "errors": list(d.errors), "lines": [{"tag": x.tag, "check": x.check, "text": x.text} for x in d.lines],
            "said": said}
