"""Findings: the verdicts every command returns, their stable codes, severities and exit codes.

A finding is one cause. Rules may emit it once per place they see it (a process, a rank, a host);
`aggregate` then folds the findings of one cause into one that lists every host, pid, rank and
communicator it covers, so an 8-rank and a 1,024-rank job give the same number of findings.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

CODES = (
    "ENV_MISSING", "ENV_CHANGED", "ENV_LATE", "ENV_OVERRIDDEN", "ENV_UNREADABLE", "EXEC_ENV_STALE",
    "CONF_FILE_VALUE", "SHELL_PREFIX_SCOPE", "NCCL_MULTIPLE_LIBS", "NCCL_UNHOOKABLE",
    "COMM_TUNING_DIVERGENT", "COMM_RANKS_DIVERGENT", "ALGO_PROTO_MISMATCH", "LL128_ON_PCIE",
    "P2P_LEVEL_LIMITS", "ENV_SET_AFTER_START", "COMM_EAGER_BESIDE_GRAPH", "NCCL_TIME_SMALL", "COMM_UNHEALTHY",
    "COMM_ENV_DIVERGENT",
)
SEVERITIES = ("error", "warning", "info")

# Exit codes (DESIGN.md §4).
EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_UNEXAMINABLE = 0, 1, 2, 3


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    message: str
    pids: tuple[int, ...] = ()
    var: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    hint: str = ""
    # every place the cause was seen: {"host", "pid", "rank", "comm"} (rank and comm where one applies)
    instances: tuple[dict[str, Any], ...] = ()
    vars: tuple[str, ...] = ()      # every variable the cause covers, when more than `var`
    culprit: str = ""               # the culprit in a few words (file:line, the edge), for the verdict
    cause: Any = field(default=None, compare=False)  # findings with equal (code, cause) are one cause
    # the propagation edge where a value was lost or changed (diagnose/propagation.Edge.to_json), or None
    edge: dict[str, Any] | None = None

    def __post_init__(self):
        if self.code not in CODES:
            raise ValueError(f"unknown finding code {self.code!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    @property
    def all_vars(self) -> tuple[str, ...]:
        return self.vars or ((self.var,) if self.var else ())

    @property
    def hosts(self) -> list[str]:
        return sorted({str(i["host"]) for i in self.instances if i.get("host") is not None})

    def to_json(self) -> dict[str, Any]:
        insts = [{k: v for k, v in i.items() if v is not None} for i in self.instances]
        return {"code": self.code, "severity": self.severity, "message": self.message,
                "pids": list(self.pids), "var": self.var, "vars": list(self.all_vars),
                "hosts": self.hosts,
                "ranks": sorted({i["rank"] for i in insts if isinstance(i.get("rank"), int)}),
                "communicators": sorted({str(i["comm"]) for i in insts if i.get("comm")}),
                "instances": insts, "culprit": self.culprit or None,
                "edge": self.edge, "evidence": self.evidence, "hint": self.hint}


def at(host: str | None, pid: int, rank: int | None = None, comm: str | None = None) -> dict[str, Any]:
    """One instance of a finding."""
    return {"host": host, "pid": pid, "rank": rank, "comm": comm}


def with_host(findings, host: str) -> list[Finding]:
    """Findings of a one-host view (inspect) given their instances on that host."""
    return [f if f.instances else replace(f, instances=tuple(at(host, p) for p in f.pids)) for f in findings]


def aggregate(findings) -> list[Finding]:
    """One finding per cause: findings with the same code and cause (or, where a rule named none, the
    same message, variable and hint) fold into the first, with every instance, pid and variable of
    all of them and the most severe level; evidence that differs is kept per instance (`merged`)."""
    groups: dict[Any, list[Finding]] = {}
    for f in findings:
        key = (f.code, f.cause if f.cause is not None else (f.message, f.var, f.hint))
        groups.setdefault(key, []).append(f)
    return [_fold(g) for g in groups.values()]


def _fold(group: list[Finding]) -> Finding:
    first = group[0]
    if len(group) == 1:
        return first
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    instances, seen = [], set()
    for f in group:
        for i in f.instances:
            key = (i.get("host"), i.get("pid"), i.get("rank"), i.get("comm"))
            if key not in seen:
                seen.add(key)
                instances.append(i)
    names = list(dict.fromkeys(v for f in group for v in f.all_vars))
    evidence = dict(first.evidence)
    others = [f.evidence for f in group[1:] if f.evidence != first.evidence]
    if others:
        evidence["merged"] = [first.evidence, *others]
    return replace(first, severity=min((f.severity for f in group), key=rank.__getitem__),
                   pids=tuple(sorted({p for f in group for p in f.pids})),
                   var=names[0] if len(names) == 1 else None, vars=tuple(names) if len(names) > 1 else (),
                   instances=tuple(instances), evidence=evidence)


def sort_findings(findings) -> list[Finding]:
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: (rank[f.severity], f.code, f.pids, f.var or ""))


def exit_code(findings, strict: bool = False) -> int:
    levels = {"error", "warning"} if strict else {"error"}
    return EXIT_FINDINGS if any(f.severity in levels for f in findings) else EXIT_OK
