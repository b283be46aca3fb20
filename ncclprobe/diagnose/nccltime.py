"""Rules on time in NCCL (model/timing.py, from the profiler plugin): a communicator whose collectives
run eagerly beside one of the same processes that runs from a CUDA graph (the seed's verify step), and
NCCL's GPU time as a small share of the wall while NCCL variables are being tuned."""
from __future__ import annotations

from collections.abc import Mapping

from ncclprobe.diagnose.findings import Finding, at
from ncclprobe.model import Model
from ncclprobe.model import timing


def _pids(m: Model, ident: str) -> set[tuple[str, int]]:
    return {(c.host, c.pid) for c in m.comms if (c.comm_hash or c.group or c.ident) == ident}


def _instances(m: Model, ident: str) -> tuple[dict, ...]:
    return tuple(at(c.host, c.pid, c.rank, c.group or c.ident) for c in m.comms if (c.comm_hash or c.group or c.ident) == ident)


def _share(t: timing.CommTime) -> str:
    if t.share is None:
        return ""
    return f" (its GPU time: {timing.percent(t.share)} of the wall)"


def eager_beside_graph(m: Model, times: list[timing.CommTime]) -> list[Finding]:
    """An eager-only communicator of processes that also run a graph-captured one."""
    from ncclprobe.diagnose.verdict import comm_label
    out = []
    graphed = [t for t in times if t.graphed]
    for t in times:
        if not t.eager_only:
            continue
        mine = _pids(m, t.ident)
        other = next((g for g in graphed if g.ident != t.ident and mine & _pids(m, g.ident)), None)
        if other is None:
            continue
        label, other_label = comm_label(t.ident, t.name, t.ranks, t.nranks), comm_label(
            other.ident, other.name, other.ranks, other.nranks)
        funcs = ", ".join(f"{f['per_rank']:.0f} {timing.func_words(name, f['per_rank'])}"
                          for name, f in t.per_func.items())
        sim = " [simulated]" if t.simulated else ""
        out.append(Finding(
            "COMM_EAGER_BESIDE_GRAPH", "warning",
            f"{label} launches its collectives eagerly ({funcs} per rank){_share(t)}, while {other_label} of the "
            f"same processes runs its collectives from a CUDA graph: every eager call pays the host's launch path, "
            f"which no NCCL variable changes{sim}",
            pids=tuple(sorted({p for _, p in mine})), instances=_instances(m, t.ident),
            evidence={"eager": t.ident, "graphed": other.ident, "eager_modes": dict(t.modes),
                      "graph_modes": dict(other.modes), "graph_api_calls": dict(other.api),
                      "eager_gpu_share": t.share, "simulated": t.simulated},
            culprit="eager beside a CUDA graph", cause=("eager_beside_graph", t.ident),
            hint="if this step should run from a CUDA graph too (a speculative verify step, a prefill), check the "
                 "server's graph-capture settings for it; `ncclprobe run --gpu-timing` measures how much of the wall "
                 "its collectives take"))
    return out


def time_small(m: Model, times: list[timing.CommTime], expect: Mapping[str, str]) -> list[Finding]:
    """GPU time in NCCL under timing.SMALL_SHARE of the wall where NCCL variables are being tuned."""
    from ncclprobe.diagnose.inprocess import is_tuning
    from ncclprobe.diagnose.verdict import comm_label
    out = []
    expected = {k for k in expect if is_tuning(k)}
    for t in times:
        if t.timing != "gpu" or t.share is None or t.share >= timing.SMALL_SHARE or not t.wall_s:
            continue
        tuned = sorted(expected | {k for c in m.comms if (c.comm_hash or c.group or c.ident) == t.ident
                                   for k, v in (c.env or {}).items() if is_tuning(k) and v is not None})
        if not tuned:
            continue
        bound = 1 / (1 - t.share)
        sim = " [simulated]" if t.simulated else ""
        out.append(Finding(
            "NCCL_TIME_SMALL", "info",
            f"{comm_label(t.ident, t.name, t.ranks, t.nranks)}: NCCL's GPU time is {timing.percent(t.share)} of the wall "
            f"({timing.duration_words((t.gpu_s or 0) * 1e9)} in {t.wall_s:.3g} s per rank) while NCCL variables are "
            f"tuned ({', '.join(tuned[:4])}{'…' if len(tuned) > 4 else ''}): even an NCCL that took no time would "
            f"shorten this wall by at most {timing.percent(t.share)} (a speedup of {bound:.4f}x at most){sim}",
            pids=tuple(sorted({p for _, p in _pids(m, t.ident)})), instances=_instances(m, t.ident),
            evidence={"gpu_share": round(t.share, 6), "gpu_s": t.gpu_s, "wall_s": t.wall_s,
                                         "max_speedup": round(bound, 4), "tuned": tuned, "simulated": t.simulated},
            cause=("time_small", t.ident),
            hint="look for the time elsewhere first (host launch overhead, eager steps, the model's kernels); "
                 "NCCL tuning can buy at most the share above"))
    return out


def rules(m: Model, expect: Mapping[str, str] | None = None) -> list[Finding]:
    times = timing.comm_times(m.comms)
    return [*eager_beside_graph(m, times), *time_small(m, times, expect or {})]
