"""What NCCL's RAS diagnostics (2.31+, witnesses/rasdiag.py, through the model) say of the NCCL_* values the
ranks of one communicator hold: where they differ, which ranks (and processes) hold the odd value, and, where
such a process is in the model, the edge of its process tree where it lost the value (diagnose/propagation's
locate, the rule every propagation finding uses).

The values are what each process held when the diagnostics ran (NCCL reads its environ then), not what its
communicators were created with: NCCL reads most NCCL_* once per process, at first use (src/include/param.h)."""
from __future__ import annotations

from typing import Any

from ncclprobe.diagnose import propagation
from ncclprobe.diagnose.findings import Finding, at
from ncclprobe.diagnose.inprocess import is_tuning
from ncclprobe.model import CommView, Model

HELD = ("held when NCCL's RAS diagnostics ran (each process's environ then); a communicator keeps what it was "
        "created with")


def comm_env_divergent(m: Model, expect: dict[str, str] | None = None) -> list[Finding]:
    """COMM_ENV_DIVERGENT: per communicator and tuning variable (or an expected one) whose value differs
    across its ranks, the ranks that hold the odd value (not the expected one; else not the most ranks')."""
    expect = expect or {}
    out = []
    for h, comms in _by_comm(m).items():
        for var, entry in sorted(comms[0].ras["env_diag"].items()):
            if is_tuning(var) or var in expect:
                out.append(_finding(m, h, comms, var, entry, expect))
    return out


def not_said(mine: list[Finding], found: list[Finding]) -> list[Finding]:
    """Those of mine whose odd processes a finding with an edge (the propagation rules') does not already
    name for the same variable: that loss, said once, by the rule with more evidence."""
    said = {(i.get("host"), i.get("pid"), v) for f in found if f.edge for i in f.instances for v in f.all_vars}
    return [f for f in mine if not f.instances or any(
        i.get("pid") is None or (i.get("host"), i.get("pid"), f.var) not in said for i in f.instances)]


def _by_comm(m: Model) -> dict[str, list[CommView]]:
    groups: dict[str, list[CommView]] = {}
    for c in m.comms:
        if c.ras is not None and c.ras.get("env_diag") and c.comm_hash:
            groups.setdefault(c.comm_hash, []).append(c)
    return groups


def _reference(groups: list[dict], var: str, expect: dict[str, str]) -> tuple[bool, str | None, str]:
    """(found, value, basis): the expected value, else the value of the most ranks; none on a tie."""
    if var in expect:
        return True, expect[var], "expected"
    totals = sorted((g["total"] for g in groups), reverse=True)
    if len(totals) > 1 and totals[0] == totals[1]:
        return False, None, "no value held by most ranks"
    return True, max(groups, key=lambda g: g["total"])["value"], "the value most ranks hold"


def _finding(m: Model, h: str, comms: list[CommView], var: str, entry: dict, expect: dict[str, str]) -> Finding:
    groups = entry["groups"]
    found, target, basis = _reference(groups, var, expect)
    by_rank = {c.rank: c for c in comms}
    odd = [g for g in groups if not found or g["value"] != target]
    odd_ranks = [(r, by_rank.get(r), g["value"]) for g in odd for r in g["ranks"]]
    k = propagation.Knowledge.of(m)
    edges = [(c, have, e) for _, c, have in odd_ranks if found and c is not None
             and (e := _edge(m, k, c, var, target)) is not None]
    said = "; ".join(_group_words(g, by_rank) for g in groups)
    lost = "; ".join(f"pid {c.pid} {_edge_words(e)}" for c, _, e in edges[:3])
    first = edges[0] if edges else None
    evidence: dict[str, Any] = {
        "comm": h, "var": var, "held": HELD, "basis": basis, "reference": target,
        "values": [{**g, "pids": sorted({by_rank[r].pid for r in g["ranks"] if r in by_rank})} for g in groups],
        "edges": [{"pid": c.pid, "rank": c.rank, **e.to_json()} for c, _, e in edges],
        "unnamed_ranks": sum(g["total"] - len(g["ranks"]) for g in odd)}
    return Finding(
        "COMM_ENV_DIVERGENT", "error" if var in expect else "warning",
        f"NCCL's RAS diagnostics: the ranks of communicator {h} hold different {var} — {said}"
        + (f" ({'expected' if var in expect else 'most ranks'}: {_shown(target)})" if found else "")
        + (f"; {lost}" if lost else ""),
        pids=tuple(sorted({c.pid for _, c, _ in odd_ranks if c is not None})), var=var, evidence=evidence,
        hint=_hint(var, target, found, first),
        instances=tuple(at(c.host, c.pid, r, h) if c is not None else at(None, None, r, h) for r, c, _ in odd_ranks),
        culprit=f"pid {first[0].pid}: {_edge_words(first[2])}" if first else "",
        cause=("edge", propagation.cause_of(first[2], first[1])) if first else ("ras-env", h, var),
        edge=first[2].to_json() if first else None)


def _edge(m: Model, k: propagation.Knowledge, c: CommView, var: str, target: str | None):
    """Where c's process lost target, where the model has that process's environment and it agrees that
    the process lacks it (a value changed since the diagnostics is not located)."""
    p = m.processes.get((c.host, c.pid))
    if p is None or k.timeline(p) is None:
        return None
    known, have = k.value(p, var)
    if not known or have == target:
        return None
    return propagation.locate(k, p, var, target, None)


def _shown(value: str | None) -> str:
    return "unset" if value is None else repr(value)


def _group_words(g: dict, by_rank: dict[int | None, CommView]) -> str:
    ranks = ",".join(str(r) for r in g["ranks"]) + (f" and {g['total'] - len(g['ranks'])} more"
                                                    if g["total"] > len(g["ranks"]) else "")
    pids = sorted({by_rank[r].pid for r in g["ranks"] if r in by_rank})
    return f"{_shown(g['value'])} on rank(s) {ranks}" + (f" (pid {', '.join(map(str, pids))})" if pids else "")


def _edge_words(e: propagation.Edge) -> str:
    who = f"pid {e.parent.pid} ({propagation.program(e.parent.argv)})" if e.parent else (e.parent_label or "?")
    return {"not_in_root": f"was started without it by its root {who}",
            "curated_env": f"was started by {who} with an environment of its own",
            "dropped_by_intermediate": f"was started without it by {who} (not Python)",
            "set_after_start": f"was started before {who} set it ({e.where})",
            "overwritten_in_child": f"changed it itself ({e.where})",
            "shell_prefix": f"lost it to a shell assignment that reached another command ({who})",
            }.get(e.kind, f"lost it where no witness saw ({who})")


def _hint(var: str, target: str | None, found: bool, first) -> str:
    if first is not None:  # the propagation rules' remedy for that edge
        return propagation._hint(first[2], {var: (target, first[1])})
    if not found:
        return (f"decide which {var} the job should have and give it to every rank's launcher; NCCL's RAS "
                "diagnostics name the ranks, `ncclprobe inspect --live PID` on their node shows where each got it")
    return (f"give the odd rank(s) {var}" + (f"={target}" if target is not None else " unset") + " where they are "
            "started; `ncclprobe inspect --live PID` on their node shows the edge where they lost it")
