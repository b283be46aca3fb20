"""From worker rows to what the operator reads: results with nccl-tests columns, realized algo/proto,
the recommendation, the per-forward projection and the findings (no torch here)."""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ncclprobe import model
from ncclprobe.bench import allreduce
from ncclprobe.bench.matrix import DEFAULTS, export_line
from ncclprobe.diagnose import topology as topo_rules
from ncclprobe.witnesses.events import read_dirs
from ncclprobe.model import timing as timing_mod, tuning
from ncclprobe.diagnose.findings import Finding
from ncclprobe.commands.envfile import AssignmentError

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


def _unknown(reason: str) -> dict[str, Any]:
    return {"available": False, "reason": reason, "per_size": {}, "per_size_modes": {}, "timing": None,
            "per_size_gpu_us": {}, "gpu_note": ""}


def realized(ctx: Context, run_dir: str, sizes: list[int], profiler_reason: str) -> dict[str, Any]:
    """What NCCL ran per size, through the model's accounting of the probe library's profiler counts
    (model.CollStat, as `report` reads them): algorithm/protocol, how the calls were launched (eager,
    captured into a CUDA graph, replayed from one; summed over ranks) and, with GPU timing on, the
    GPU time per call (the longest channel, median and p90 from the plugin's histogram)."""
    if ctx.cpu:
        return _unknown("gloo: no NCCL")
    if ctx.nranks == 1:
        return _unknown(SINGLE_RANK)
    if profiler_reason:
        return _unknown(profiler_reason)
    m = model.build(read_dirs([f"{run_dir}/events"]))
    comms = [c for c in m.comms if any(_is_all_reduce(s.func) for s in c.colls.values())]
    stats = [s for c in comms for s in c.colls.values() if _is_all_reduce(s.func)]
    if not stats:
        return _unknown("the probe library wrote no all-reduce coll_summary event")
    timings = {c.activity.timing if c.activity is not None else None for c in comms}
    timing = "gpu" if timings == {"gpu"} else "off" if timings & {"gpu", "off"} else None
    per_size, modes, gpu, shared = {}, {}, {}, set()
    for size in sizes:
        hit = [s for s in stats if s.bytes_min <= size <= s.bytes_max]
        per_size[size] = "+".join(sorted({f"{s.algo}/{s.proto}" for s in hit})) or None
        counted: Counter = Counter()
        for s in hit:
            counted[s.mode or "unknown"] += s.count
        modes[size] = dict(counted)
        if timing != "gpu":
            continue
        # a profiler bucket whose range holds another measured size mixes their times: none for either
        mixed = {o for s in hit for o in sizes if o != size and s.bytes_min <= o <= s.bytes_max}
        if mixed:
            shared |= mixed | {size}
            gpu[size] = None
            continue
        hist: Counter = Counter()
        for s in hit:
            hist.update(s.gpu_hist)
        median, p90 = timing_mod.quantile(hist, 0.5), timing_mod.quantile(hist, 0.9)
        gpu[size] = None if median is None else {"median": round(median / 1e3, 3), "p90": round(p90 / 1e3, 3),
                                                 "calls": sum(s.gpu_count for s in hit)}
    note = (f"sizes {', '.join(_size(s) for s in sorted(shared))} share the profiler's power-of-two buckets "
            f"with the same algorithm/protocol: no GPU time per size for them" if shared else "")
    return {"available": True, "reason": "", "per_size": per_size, "per_size_modes": modes, "timing": timing,
            "per_size_gpu_us": gpu, "gpu_note": note}


def _is_all_reduce(func: str) -> bool:
    return re.sub(r"[^a-z]", "", str(func).lower()) == "allreduce"


def at_size(per_size: dict, size: int):
    """A per-size value, whether the map's keys are sizes (as built) or their text (as read back from JSON)."""
    return per_size.get(size, per_size.get(str(size)))


MODE_ORDER = ("eager", "captured", "replayed", "unknown")


def realized_lines(real: dict[str, Any]) -> list[str]:
    """What a configuration's footer and summary line say NCCL ran: 'RING/LL at 1K-64M', 'eager +
    captured at 1K-64M', and the GPU time per call where it was timed."""
    if not real["available"]:
        return []
    out = [f"NCCL ran (profiler): {spans(real['per_size'])}"]
    modes = {s: " + ".join(m for m in MODE_ORDER if m in ms) or None
             for s, ms in (real.get("per_size_modes") or {}).items()}
    if modes:
        out.append(f"launched (profiler): {spans(modes)}")
    gpu = real.get("per_size_gpu_us") or {}
    timed = [(int(s), g) for s, g in gpu.items() if g]
    if timed:
        out.append("GPU time per call (profiler, longest channel, median/p90 µs): "
                   + ", ".join(f"{_size(s)} {fmt_us(g['median'])}/{fmt_us(g['p90'])}" for s, g in sorted(timed)))
    if real.get("gpu_note"):
        out.append(real["gpu_note"])
    return out


def spans(per_size: dict) -> str:
    """Runs of sizes with the same value: 'RING/LL at 1K-4K, RING/SIMPLE at 16K'."""
    groups: list[list] = []
    for size, value in sorted((int(k), v) for k, v in per_size.items()):
        if groups and groups[-1][0] == value:
            groups[-1][2] = size
        else:
            groups.append([value, size, size])
    return ", ".join(f"{v or 'unknown'} at {_size(a)}" + (f"-{_size(b)}" if b != a else "") for v, a, b in groups)


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
    return all(at_size(pa, s) and at_size(pa, s) == at_size(pb, s) for s in sizes)


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


@dataclass(frozen=True)
class Speculation:
    """--step-ms (the measured plain decode step, ms) and --accept-len (tokens accepted per verify
    step, per k), for the speculative-decoding projection."""
    step_ms: float | None = None
    accept: dict[int, float] | float | None = None

    def fitted(self, ks: list[int]) -> "Speculation":
        """One accepted length per verify width k > 1 of --tokens: a k-token verify accepts 1..k tokens."""
        verify = [k for k in ks if k > 1]
        if isinstance(self.accept, dict):
            for k, a in self.accept.items():
                if k not in verify:
                    raise AssignmentError(f"--accept-len {k}:{a:g}: {k} is not a verify width in --tokens "
                                          f"({', '.join(map(str, verify)) or 'none above 1'})")
                if a > k:
                    raise AssignmentError(f"--accept-len {k}:{a:g}: a {k}-token verify step accepts at most {k} tokens")
            return Speculation(self.step_ms, dict(sorted(self.accept.items())))
        fit = {k: self.accept for k in verify if self.accept <= k}
        if not fit:
            raise AssignmentError(f"--accept-len {self.accept:g}: no verify width in --tokens "
                                  f"({', '.join(map(str, verify)) or 'none above 1'}) can accept that many tokens "
                                  f"(a k-token verify step accepts at most k)")
        return Speculation(self.step_ms, fit)


def projection_options(hidden, accept_len, step_ms) -> Speculation:
    """--accept-len A (every verify width k >= A) or K:A,K:A (per width), and --step-ms D; usage errors
    before any measurement."""
    if (accept_len is not None or step_ms is not None) and hidden is None:
        raise AssignmentError("--accept-len and --step-ms project a model's decoding: they need --hidden")
    if accept_len is not None and step_ms is None:
        raise AssignmentError("--accept-len needs --step-ms (the measured plain decode step, in ms): the "
                              "throughput and the break-even verify time are in its units")
    if step_ms is not None and not (0 < step_ms < float("inf")):
        raise AssignmentError(f"--step-ms must be a positive number of milliseconds (got {step_ms:g})")
    if accept_len is None:
        return Speculation(step_ms)
    return Speculation(step_ms, _parse_accept(str(accept_len)))


def _parse_accept(text: str) -> dict[int, float] | float:
    def number(v: str) -> float:
        try:
            a = float(v)
        except ValueError:
            raise AssignmentError(f"--accept-len {text!r}: expected a number such as 2.1, or K:A pairs such "
                                  f"as 2:1.6,4:2.5") from None
        if not (1 <= a < float("inf")):
            raise AssignmentError(f"--accept-len {text!r}: a verify step accepts at least 1 token (the "
                                  f"target model's own), got {v}")
        return a
    if ":" not in text:
        return number(text.strip())
    out: dict[int, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        k, sep, a = part.partition(":")
        if not sep or not k.strip().isdigit():
            raise AssignmentError(f"--accept-len {text!r}: expected K:A pairs such as 2:1.6,4:2.5")
        out[int(k)] = number(a.strip())
    return out


def projection(ctx: Context, configs: list[dict[str, Any]], token_sizes: dict[int, int], layers: int | None,
               spec: Speculation | None = None) -> dict[str, Any]:
    """Communication per forward = 2 all-reduces per layer (attention output + MLP/MoE) x layers x
    latency, for each token count; break-even of a k-token verify = comm(k) / comm(1) accepted tokens.

    With --step-ms D (a measured plain decode step): a k-token verify step is projected at
    D + max(comm(k) - comm(1), 0), everything but the extra communication taken as the decode step's (the
    extra compute of k tokens and the draft model are not in it: an upper bound on throughput). With
    --accept-len A: tokens per second A / verify, against plain decoding's 1 / D, and the break-even
    time A x D that a whole speculative cycle (draft + verify) must stay under."""
    spec = spec or Speculation()
    per = layers or 1
    accept = spec.accept if isinstance(spec.accept, dict) else {}
    rows = []
    for c in configs:
        if c["status"] != "ok":
            continue
        t = {k: time_of(c["results"], s, ctx.basis) for k, s in token_sizes.items()}
        if any(v is None for v in t.values()):
            continue
        fwd = {k: 2 * per * v for k, v in t.items()}
        one = fwd.get(1)
        row = {"config": c["name"], "per_forward_us": fwd,
               "break_even": {k: (v / one if one else None) for k, v in fwd.items() if k > 1}}
        if spec.step_ms is not None and one is not None:
            # k tokens cannot need less communication than one: a lower reading is noise, taken as none
            verify = {k: round(spec.step_ms + max(v - one, 0.0) / 1e3, 6) for k, v in fwd.items() if k > 1}
            row["comm_of_step"] = round(one / 1e3 / spec.step_ms, 6)
            row["verify_ms"] = verify
            if accept:
                row["tok_s"] = {k: round(1e3 * a / verify[k], 3) for k, a in accept.items() if k in verify}
                row["speedup"] = {k: round(1e3 * a / verify[k] * spec.step_ms / 1e3, 4) for k, a in accept.items()
                                  if k in verify}
        rows.append(row)
    out = {"layers": layers, "allreduces_per_forward": 2 * per, "basis": ctx.basis, "rows": rows}
    if spec.step_ms is not None:
        out["step_ms"] = spec.step_ms
        out["plain_tok_s"] = round(1e3 / spec.step_ms, 3)
    if accept:
        out["accept_len"] = accept
        out["break_even_verify_ms"] = {k: round(a * spec.step_ms, 6) for k, a in accept.items()}
    return out


def _size(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n}B" if n < 1024 else f"{n / 1024:.1f}K"


def fmt_us(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 100 else f"{v:.1f}" if v < 10000 else f"{v:.0f}"
