"""The one rule set over the model of a job: propagation along the tree (diagnose/propagation), the
communicators and NCCL's reads (diagnose/inprocess), library copies (diagnose/copies), nccl.conf values
(diagnose/conf), what no witness could read (diagnose/visibility), time in NCCL (diagnose/nccltime) and
what NCCL's RAS service says of a communicator's health (diagnose/health) and of the NCCL_* values its
ranks hold (diagnose/rasenv).
Every command runs it (`rules`) on the model alone, whichever witnesses fed it."""
from __future__ import annotations

from ncclprobe.diagnose.findings import Finding, aggregate


def rules(m, expect: dict[str, str] | None = None) -> list[Finding]:
    """Every finding on model m, one per cause."""
    from ncclprobe.diagnose import conf, copies, health, inprocess, nccltime, propagation, rasenv, visibility
    expect = dict(expect or {})
    found = propagation.rules(m, expect)
    # a write a propagation finding already names as the cause of a changed value is that cause
    named = {(f.edge["var"], f.edge["where"]) for f in found if f.edge and f.edge["kind"] == "overwritten_in_child"}
    found += [f for f in inprocess.all_rules(m)
              if not (f.code == "ENV_OVERRIDDEN" and (f.var, f.evidence.get("where")) in named)]
    found += [*copies.multiple_libs(m), *copies.unhookable(m), *conf.conf_file_values(m),
              *visibility.env_unreadable(m), *nccltime.rules(m, expect), *health.comm_unhealthy(m)]
    found += rasenv.not_said(rasenv.comm_env_divergent(m, expect), found)
    from ncclprobe.diagnose import fleet
    return fleet.fold(aggregate(dedupe(found)))


def _covers(f: Finding) -> set[tuple]:
    where = [(i.get("host"), i.get("pid")) for i in f.instances] or [(None, p) for p in f.pids]
    return {(f.code, host, pid, var) for host, pid in where for var in (f.all_vars or (None,))}


def dedupe(findings: list[Finding]) -> list[Finding]:
    """Where two witnesses say the same thing (same code, processes and variables), the first one given
    stays (the in-process rules come first: they carry more evidence)."""
    seen: set[tuple] = set()
    out = []
    for f in findings:
        cover = _covers(f)
        if cover and cover <= seen:
            continue
        seen |= cover
        out.append(f)
    return out
