"""What NCCL's RAS service says of a communicator's health (witnesses/ras.py, through the model): a rank with an
asynchronous error or aborted, a rank destroyed or finalized while its communicator is still listed, ranks RAS
cannot reach. One finding per communicator, naming its ranks and processes."""
from __future__ import annotations

from ncclprobe.diagnose.findings import Finding, at
from ncclprobe.model import Model


def comm_unhealthy(m: Model) -> list[Finding]:
    """COMM_UNHEALTHY: error where a rank has an async error or its abort flag set; warning where ranks are
    missing, or a rank is still initialising, finalized or being destroyed."""
    groups: dict[str, list] = {}
    for c in m.comms:
        if c.ras is not None and c.comm_hash:
            groups.setdefault(c.comm_hash, []).append(c)
    out = []
    for h, comms in groups.items():
        bad, odd, missing = [], [], max((c.ras.get("missing_ranks") or 0) for c in comms)
        for c in comms:
            errors, others = c.ras_troubles
            if errors:  # an error rank's other states are beside the point
                bad.append((c, f"rank {c.rank} (pid {c.pid}): " + ", ".join(errors)))
            elif others:
                odd.append((c, f"rank {c.rank} (pid {c.pid}): " + ", ".join(others)))
        if not (bad or odd or missing):
            continue
        said = [w for _, w in bad + odd] + ([f"{missing} rank(s) RAS could not reach"] if missing else [])
        severity = "error" if bad else "warning"
        shown = bad + odd or [(c, "") for c in comms]
        out.append(Finding(
            "COMM_UNHEALTHY", severity,
            f"communicator {h} ({comms[0].nranks or '?'} ranks), as NCCL's RAS service reports it: " + "; ".join(said),
            tuple(sorted({c.pid for c, _ in shown})), None,
            {"comm": h, "status": {str(c.rank): c.ras.get("status") for c, _ in shown}, "missing_ranks": missing},
            "look at the ranks named: an asynchronous error or an abort ends the communicator's collectives (NCCL's "
            "log, NCCL_DEBUG=WARN, says why); missing ranks are processes RAS could not reach (gone, hung, or a "
            "network between them)" if bad or missing else
            "a rank still initialising, finalized or being destroyed takes no part in new collectives",
            instances=tuple(at(c.host, c.pid, c.rank, h) for c, _ in shown), cause=("ras", h)))
    return out
