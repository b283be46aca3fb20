"""From worker rows to what the operator reads: results with nccl-tests columns, realized algo/proto,
the recommendation, the per-forward projection and the findings (no torch here)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ncclprobe.bench import allreduce
from ncclprobe.bench.matrix import DEFAULTS, export_line
from ncclprobe.diagnose import topology as topo_rules
from ncclprobe.witnesses.events import read_dirs
from ncclprobe.model import tuning
from ncclprobe.diagnose.findings import Finding

MIN_GAIN = 1.02  # below this a configuration is noise against the defaults, not a recommendation
SINGLE_RANK = ("single rank: NCCL short-cuts the all-reduce (no algorithm or protocol is chosen, no "
               "profiler collective event fires)")


@dataclass(frozen=True)
class Context:
    backend: str        # nccl | gloo
    nranks: int
    basis: str          # graph | eager: the mode the recommendation and the summary use
    label: str          # "GPU/NCCL" or "CPU/gloo", printed wherever a number appears

    @property
    def cpu(self) -> bool:
        return self.backend == "gloo"


def results(rows: list[dict[str, Any]], nranks: int) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        t = r["time_s"]
        out.append({"bytes": r["bytes"], "count": r["count"], "mode": r["mode"], "inplace": r["inplace"],
                    "time_us": t * 1e6, "algbw": allreduce.algbw(r["bytes"], t),
                    "busbw": allreduce.busbw(r["bytes"], t, nranks), "wrong": r["wrong"],
                    "note": r.get("note", "")})
    return out


def time_of(res: list[dict[str, Any]], nbytes: int, mode: str, inplace: bool = False) -> float | None:
    for r in res:
        if r["bytes"] == nbytes and r["mode"] == mode and r["inplace"] == inplace:
            return r["time_us"]
    return None


def realized(ctx: Context, run_dir: str, sizes: list[int], profiler_reason: str) -> dict[str, Any]:
    """Algo/proto NCCL ran per size, from the probe library's coll_summary events in the workers."""
    def unknown(reason):
        return {"available": False, "reason": reason, "per_size": {}}
    if ctx.cpu:
        return unknown("gloo: no NCCL")
    if ctx.nranks == 1:
        return unknown(SINGLE_RANK)
    if profiler_reason:
        return unknown(profiler_reason)
    log = read_dirs([f"{run_dir}/events"])
    colls = [e for e in log.events if e["ev"] == "coll_summary"
             and re.sub(r"[^a-z]", "", str(e.get("func", "")).lower()) == "allreduce"]
    if not colls:
        return unknown("the probe library wrote no all-reduce coll_summary event")
    per_size = {}
    for size in sizes:
        seen = sorted({f"{e.get('algo')}/{e.get('proto')}" for e in colls
                       if int(e.get("bytes_min", -1)) <= size <= int(e.get("bytes_max", -1))})
        per_size[size] = "+".join(seen) if seen else None
    return {"available": True, "reason": "", "per_size": per_size}


def mismatch_findings(name: str, env: dict[str, str], real: dict[str, Any], pids) -> list[Finding]:
    out = []
    for var, part, universe in (("NCCL_ALGO", 0, tuning.ALGOS), ("NCCL_PROTO", 1, tuning.PROTOS)):
        allowed = tuning.allowed(env.get(var), "AllReduce", universe)
        if not allowed or not real["available"]:
            continue
        bad = {size: got for size, got in real["per_size"].items() if got and any(
            tuning.canonical(pair.split("/")[part]) not in allowed for pair in got.split("+"))}
        if bad:
            shown = ", ".join(f"{s} B: {g}" for s, g in list(bad.items())[:6])
            out.append(Finding(
                "ALGO_PROTO_MISMATCH", "error",
                f"configuration {name} forced {var}={env[var]}, but NCCL ran {shown}",
                pids=tuple(pids), var=var, evidence={"config": name, "realized": bad},
                hint=f"NCCL ignores a {var} value it cannot run for this collective/topology; check "
                     f"`NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING` and `ncclprobe explain {var}`"))
    return out


def ll128_findings(ctx: Context, name: str, env: dict[str, str], topology) -> list[Finding]:
    if ctx.cpu or ctx.nranks < 2 or topology is None or not topology.available:
        return []
    n = min(ctx.nranks, len(topology.links))
    links = [row[:n] for row in topology.links[:n]]
    return topo_rules.ll128_findings(links, env.get("NCCL_PROTO"), f"bench configuration {name}")


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))


def recommend(ctx: Context, configs: list[dict[str, Any]], sizes: list[int], common: dict[str, str]) -> dict[str, Any]:
    """The fastest correct configuration over the sizes that matter (geometric mean of out-of-place
    times in the basis mode), against NCCL's defaults."""
    rec: dict[str, Any] = {"basis": ctx.basis, "sizes": sizes, "config": None, "export": "", "gain": None,
                           "applicable": not ctx.cpu and ctx.nranks > 1, "reason": ""}
    if ctx.cpu:
        rec["reason"] = ("CPU/gloo run: NCCL variables have no effect on gloo, so these numbers cannot "
                         "rank NCCL configurations")
    elif ctx.nranks == 1:
        rec["reason"] = ("one GPU: " + SINGLE_RANK + "; the numbers are launch overhead, not interconnect. "
                         "Run with --gpus 2 or more before exporting anything")
    scores = {}
    for c in configs:
        if c["status"] != "ok":
            continue
        times = [time_of(c["results"], s, ctx.basis) for s in sizes]
        if all(t is not None for t in times):
            scores[c["name"]] = _geomean(times)
    if not scores:
        rec["reason"] = rec["reason"] or "no configuration finished correctly"
        rec["applicable"] = False
        return rec
    best = min(scores, key=scores.get)
    base = scores.get(DEFAULTS)
    gain = base / scores[best] if base else None
    if base and (best == DEFAULTS or gain < MIN_GAIN):
        best, gain = DEFAULTS, 1.0
    elif base and _same_choice(configs, best, sizes):
        # NCCL already picks that algorithm and protocol at these sizes: the gap is run-to-run noise
        rec["same_as_defaults"] = best
        best, gain = DEFAULTS, 1.0
    env = dict(common, **next(c["env"] for c in configs if c["name"] == best))
    rec.update(config=best, gain=gain, export=export_line(env) if best != DEFAULTS else "",
               scores_us={k: round(v, 3) for k, v in scores.items()})
    if base is None:
        rec["reason"] = rec["reason"] or "NCCL's defaults did not finish correctly: no gain to compute"
    return rec


def _same_choice(configs: list[dict[str, Any]], name: str, sizes: list[int]) -> bool:
    """Whether configuration `name` realized the same algorithm/protocol as the defaults at every
    size (known from the profiler); unknown realizations never count as the same."""
    real = {c["name"]: (c.get("realized") or {}) for c in configs}
    a, b = real.get(name, {}), real.get(DEFAULTS, {})
    if not (a.get("available") and b.get("available")):
        return False
    pa, pb = a.get("per_size", {}), b.get("per_size", {})
    return all(pa.get(str(s)) and pa.get(str(s)) == pb.get(str(s)) for s in sizes)


def recommendation_text(rec: dict[str, Any], label: str) -> tuple[str, str]:
    if rec["config"] is None or label == "CPU/gloo":
        return f"No recommendation: {rec['reason']}.", "warn"
    sizes = ", ".join(_size(s) for s in rec["sizes"])
    if rec["config"] == DEFAULTS and rec.get("same_as_defaults"):
        line = (f"Keep NCCL's defaults: the fastest, {rec['same_as_defaults']}, ran the same algorithm and "
                f"protocol as the defaults at {sizes} (profiler), so its lead is run-to-run noise.")
    elif rec["config"] == DEFAULTS:
        line = f"Keep NCCL's defaults: no configuration beat them by {MIN_GAIN:.2f}x or more at {sizes} ({rec['basis']} mode)."
    else:
        gain = f"{rec['gain']:.2f}x faster than the defaults" if rec["gain"] else "defaults failed"
        line = f"Best at {sizes} ({rec['basis']} mode): {rec['config']}, {gain}.  {rec['export']}"
    if not rec["applicable"]:
        return f"{label} only, not a recommendation: {line} ({rec['reason']}.)", "warn"
    return line, "good"


def projection(ctx: Context, configs: list[dict[str, Any]], token_sizes: dict[int, int], layers: int | None):
    """Communication per forward = 2 all-reduces per layer (attention output + MLP/MoE) x layers x
    latency, for each token count; break-even of a k-token verify = comm(k) / comm(1) accepted tokens."""
    per = layers or 1
    rows = []
    for c in configs:
        if c["status"] != "ok":
            continue
        t = {k: time_of(c["results"], s, ctx.basis) for k, s in token_sizes.items()}
        if any(v is None for v in t.values()):
            continue
        fwd = {k: 2 * per * v for k, v in t.items()}
        one = fwd.get(1)
        rows.append({"config": c["name"], "per_forward_us": fwd,
                     "break_even": {k: (v / one if one else None) for k, v in fwd.items() if k > 1}})
    return {"layers": layers, "allreduces_per_forward": 2 * per, "basis": ctx.basis, "rows": rows}


def _size(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n}B" if n < 1024 else f"{n / 1024:.1f}K"


def fmt_us(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 100 else f"{v:.1f}" if v < 10000 else f"{v:.0f}"
