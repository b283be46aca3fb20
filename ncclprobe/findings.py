"""Findings: the verdicts every command returns, their stable codes, severities and exit codes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CODES = (
    "ENV_MISSING", "ENV_CHANGED", "ENV_LATE", "ENV_OVERRIDDEN", "ENV_UNREADABLE", "EXEC_ENV_STALE",
    "CONF_FILE_VALUE", "SHELL_PREFIX_SCOPE", "NCCL_MULTIPLE_LIBS", "NCCL_UNHOOKABLE",
    "COMM_TUNING_DIVERGENT", "COMM_RANKS_DIVERGENT", "ALGO_PROTO_MISMATCH", "LL128_ON_PCIE",
    "P2P_LEVEL_LIMITS",
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

    def __post_init__(self):
        if self.code not in CODES:
            raise ValueError(f"unknown finding code {self.code!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "message": self.message,
                "pids": list(self.pids), "var": self.var, "evidence": self.evidence, "hint": self.hint}


def sort_findings(findings) -> list[Finding]:
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: (rank[f.severity], f.code, f.pids, f.var or ""))


def exit_code(findings, strict: bool = False) -> int:
    levels = {"error", "warning"} if strict else {"error"}
    return EXIT_FINDINGS if any(f.severity in levels for f in findings) else EXIT_OK
