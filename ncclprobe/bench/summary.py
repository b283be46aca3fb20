"""The document `bench` ends with: what was run, the per-size comparison of every configuration, one
line per configuration, the projection and the recommendation. The per-size rows themselves were
printed while they were measured (live.py) and are in the JSON; they are not repeated here."""
from __future__ import annotations

import sys
from typing import Any

from ncclprobe.bench import report
from ncclprobe.bench.report import Context, fmt_us
from ncclprobe.doc import Table, Text, Title
from ncclprobe.model.timing import percent

BENCH_EXTRA_HINT = "install the bench extra: pip install 'ncclprobe[bench]'"
NOTHING_MEASURED = "nothing was measured: every configuration ended in error or hang"
MEASURED = ("ok", "wrong")


def _unit(ctx: Context) -> str:
    return "ranks" if ctx.cpu else "GPUs"


def interruption(data: dict[str, Any]) -> str:
    """'interrupted by SIGINT during configuration 2/3 (stall) after 1 of 2 sizes; not run: x'."""
    it = data["interrupted"]
    if it["config"]:
        where = (f" during configuration {it['index'] + 1}/{it['of']} ({it['config']}) after "
                 f"{it['sizes_done']} of {it['sizes']} sizes")
    elif it["finished"]:
        where = f" after configuration {it['finished']}/{it['of']}"
    else:
        where = " before any configuration started"
    return f"interrupted by {it['signal']}{where}" + (f"; not run: {', '.join(it['not_run'])}"
                                                      if it["not_run"] else "")


def nothing_measured(ctx: Context, data: dict[str, Any], kept: bool) -> list:
    """No table to read (every cell would be error/hang): say so first, then each configuration's reason."""
    doc: list = [Title(f"bench: all_reduce on {ctx.nranks} {_unit(ctx)}, {ctx.label}: {NOTHING_MEASURED}"),
                 Text("No configuration produced a number, so there is nothing to compare or recommend.", "warn")]
    for c in data["configs"]:
        doc.append(Text(f"{c['name']}: {c['status']}: {c['reason'] or 'no reason recorded'}", "warn"))
    if any("ModuleNotFoundError" in (c["reason"] or "") and "torch" in c["reason"] for c in data["configs"]):
        doc.append(Text(f"The workers could not import what they need: {BENCH_EXTRA_HINT} in the "
                        f"interpreter that runs ncclprobe ({sys.executable}).", "note"))
    doc.append(Text(f"Worker logs kept in {data['workdir']}." if kept
                    else "The worker logs were removed; run again with --keep to keep them.", "dim"))
    return doc


def interrupted_early(ctx: Context, data: dict[str, Any]) -> list:
    return [Title(f"bench: all_reduce on {ctx.nranks} {_unit(ctx)}, {ctx.label}: {interruption(data)}"),
            Text("Nothing was measured; every worker that had started was stopped.", "warn")]


def _ranks_configs(ctx: Context) -> bool:
    """Whether a per-size ranking of configurations means anything: not on gloo (NCCL variables do
    nothing there) and not on one rank (NCCL short-cuts it and chooses no algorithm or protocol): there
    the fastest column would be noise, not a better NCCL setting."""
    return not ctx.cpu and ctx.nranks > 1


def _mark_best(row_times: dict[str, float | None], mark: bool = True) -> dict[str, str]:
    valid = {k: v for k, v in row_times.items() if v is not None}
    best = min(valid, key=valid.get) if valid and mark else None
    return {k: fmt_us(v) + (" *" if k == best and len(valid) > 1 else "") for k, v in row_times.items()}


def _copy_inplace(c: dict[str, Any]) -> bool:
    return str(c.get("out_of_place") or "").startswith("copy + in-place")


def _cell(c: dict[str, Any], t: float | None, marked: dict[str, str]) -> str:
    """ok: the time (with * when fastest); wrong: the time, flagged; a configuration that stopped
    (hang, error, interrupted): the sizes it measured before that, then its status."""
    if c["status"] == "ok":
        return marked[c["name"]]
    if t is not None:
        return fmt_us(t) + (" WRONG" if c["status"] == "wrong" else "")
    return c["status"]


def document(ctx: Context, data: dict[str, Any], token_sizes: dict[int, int]) -> list:
    configs, n = data["configs"], ctx.nranks
    opts = data["options"]
    if ctx.cpu:
        head = f"bench: all_reduce on CPU/gloo, {n} ranks: CPU numbers, not GPU or NCCL numbers"
    else:
        head = (f"bench: all_reduce on {n} x {data['device'] or 'GPU'} (GPU/NCCL, torch "
                f"{data['versions']['torch']}, NCCL {data['versions']['nccl']})")
    doc: list = [Title(head)]
    if data["incomplete"]:
        doc.append(Text(f"INCOMPLETE: {interruption(data)}. What was measured before that follows.", "warn"))
    doc.append(Text(f"{opts['dtype']}, warm-up {opts['warmup']}, {opts['iters']} calls back to back per "
                    f"measurement, host wall time / calls, slowest rank; algbw = bytes/time, busbw = algbw x "
                    f"2(n-1)/n = x{2 * (n - 1) / n:.2f}. Modes: eager"
                    + (f", graph ({opts['iters']} calls captured in one CUDA graph, replayed)" if opts["graph"]
                       else "" if ctx.cpu else " (graph mode off)") + ".", "dim"))
    if ctx.cpu:
        doc.append(Text("CPU/gloo: this exercises the harness; NCCL variables have no effect on gloo and no "
                        "number here says anything about a GPU.", "warn"))
    elif n == 1:
        doc.append(Text("One GPU: these are not interconnect numbers. NCCL short-cuts a single-rank all-reduce "
                        "(no algorithm or protocol is chosen, in-place is a no-op and captures an empty graph); "
                        "what is measured is launch and host overhead. Use --gpus 2 or more to compare settings.",
                        "warn"))
    for note in data["notes"]:
        doc.append(Text(note + ".", "note"))
    if data["dropped_env"]:
        doc.append(Text("Not passed to the workers (inherited, would change 'defaults'; use --env): "
                        + ", ".join(data["dropped_env"]), "dim"))
    doc += _comparison(ctx, data)
    doc += [_config_line(c) for c in configs]
    host = _host_overhead(ctx, configs, data["sizes"])
    if host:
        doc.append(Text(host, "note"))
    if token_sizes and data["projection"]:
        doc += _projection_nodes(data["projection"], token_sizes, ctx.label)
    line, style = report.recommendation_text(data["recommendation"], ctx.label)
    doc.append(Text("Recommendation: " + line, style))
    return doc


def _comparison(ctx: Context, data: dict[str, Any]) -> list:
    configs, basis = data["configs"], ctx.basis
    rows = []
    for s in data["sizes"]:
        times = {c["name"]: report.time_of(c["results"], s, basis) for c in configs}
        marked = _mark_best({c["name"]: times[c["name"]] if c["status"] == "ok" else None for c in configs},
                            _ranks_configs(ctx))
        rows.append([report._size(s)] + [_cell(c, times[c["name"]], marked) for c in configs])
    measured = [c for c in configs if c["results"]]
    oop = ("out-of-place = copy + in-place all_reduce" if ctx.cpu or all(_copy_inplace(c) for c in measured)
           else "out-of-place")
    planned = len(configs) + len((data["interrupted"] or {}).get("not_run", []))
    if ctx.cpu and planned == 1:
        ranking = "one configuration: gloo reads no NCCL variable"
    elif ctx.cpu:
        ranking = ("the NCCL configurations do not apply to gloo (it reads no NCCL variable): columns that "
                   "differ only in NCCL variables are the same gloo all-reduce, their differences are noise, "
                   "and no fastest is marked")
    elif not _ranks_configs(ctx):
        ranking = ("one rank: NCCL short-cuts the all-reduce and chooses no algorithm or protocol, so the "
                   "columns do not rank NCCL settings and no fastest is marked")
    else:
        ranking = "* = fastest correct configuration per size"
    return [Text(f"{ctx.label} all_reduce time (µs), {basis} mode, {oop}; {ranking}"),
            Table(["size"] + [c["name"] for c in configs], rows)]


def _config_line(c: dict[str, Any]) -> Text:
    """'proto=LL: NCCL_PROTO=LL; ok, 9 sizes in 12.1 s; NCCL ran RING/LL at 1K-64M'."""
    env = " ".join(f"{k}={v}" for k, v in sorted(c["env"].items())) or "(NCCL defaults)"
    sizes = len({r["bytes"] for r in c["results"]})
    line = f"{c['name']}: {env}; {c['status']}, {sizes} sizes in {c['seconds']:.1f} s"
    if c["reason"]:
        line += f": {c['reason']}"
    real = c["realized"]
    if real["available"]:
        line += "; " + "; ".join(report.realized_lines(real))
    elif c["status"] in MEASURED and real["reason"] != "gloo: no NCCL":
        line += f"; algo/proto unknown: {real['reason']}"
    return Text(line, "" if c["status"] in MEASURED else "warn")


def _host_overhead(ctx: Context, configs, sizes) -> str:
    d = next((c for c in configs if c["status"] == "ok"), None)
    if d is None or ctx.cpu:
        return ""
    small = sizes[0]
    e, g = report.time_of(d["results"], small, "eager"), report.time_of(d["results"], small, "graph")
    if e is None or g is None:
        return ""
    return (f"Host overhead ({d['name']}, {report._size(small)}, out-of-place): eager {fmt_us(e)} µs vs graph "
            f"{fmt_us(g)} µs per all-reduce. Serving stacks capture decode in CUDA graphs, so graph mode is "
            f"the latency a decode step sees; the eager excess is launch overhead.")


def _projection_nodes(proj: dict[str, Any], token_sizes: dict[int, int], label: str) -> list:
    ks = sorted(token_sizes)
    per = (f"{proj['layers']} layers" if proj["layers"] else "one layer (give --layers for a whole forward)")
    cols = ["config"] + [f"{k} tok ({report._size(token_sizes[k])}) µs" for k in ks]
    cols += [f"break-even k={k}" for k in ks if k > 1]
    rows = []
    for r in proj["rows"]:
        rows.append([r["config"]] + [fmt_us(r["per_forward_us"][k]) for k in ks]
                    + [f"{r['break_even'][k]:.2f}" if r["break_even"].get(k) else "-" for k in ks if k > 1])
    caption = (f"Communication per forward = {proj['allreduces_per_forward']} all-reduces ({per}, 2 per layer) x "
               f"latency ({proj['basis']} mode). A verify step of k tokens beats plain decoding on "
               f"communication only if it accepts more than 'break-even' tokens per step.")
    out = [Text(f"Per-forward communication floor ({label})"), Table(cols, rows, caption=caption)]
    if proj.get("step_ms") is not None and proj["rows"]:
        out += _speculation_nodes(proj, label)
    return out


def _speculation_nodes(proj: dict[str, Any], label: str) -> list:
    """--step-ms / --accept-len: the verify step per k projected from the measured communication, the
    tokens per second it allows and the break-even cycle time."""
    d, accept = proj["step_ms"], proj.get("accept_len") or {}
    ks = sorted(proj["rows"][0]["verify_ms"])
    cols = ["config", "comm of the step"] + [f"k={k}" + (f" (A={accept[k]:g})" if k in accept else "") for k in ks]
    rows = []
    for r in proj["rows"]:
        cells = [r["config"], percent(r["comm_of_step"])]
        for k in ks:
            cell = f"{r['verify_ms'][k]:.2f} ms"
            if k in r.get("tok_s", {}):
                cell += f", {r['tok_s'][k]:.0f} tok/s ({r['speedup'][k]:.2f}x)"
            cells.append(cell)
        rows.append(cells)
    caption = (f"verify(k) = D + comm(k) - comm(1), 0 where lower (noise): the decode step plus the extra "
               f"communication of k tokens ({proj['basis']} mode), not the extra compute of k tokens nor the draft model"
               + ("; tokens/s = A / verify(k), an upper bound" if accept else "") + ".")
    out = [Text(f"Speculative decoding, projected from communication ({label}): plain decoding at D = {d:g} ms "
                f"a token, {proj['plain_tok_s']:.1f} tok/s"), Table(cols, rows, caption=caption)]
    if accept:
        out.append(Text("Break-even: speculation beats plain decoding while a whole cycle (draft + verify) takes "
                        "under A x D: " + ", ".join(f"k={k} {ms:.1f} ms" for k, ms in
                                                   sorted(proj["break_even_verify_ms"].items())) + ".", "note"))
    base = next((r for r in proj["rows"] if r["config"] == report.DEFAULTS), proj["rows"][0])
    widest = ks[-1]
    out.append(Text(f"On communication alone a {widest}-token verify step costs {base['verify_ms'][widest]:.2f} ms "
                    f"({base['config']}): a measured verify step much slower than that is slow for a reason "
                    f"other than all-reduce latency (compute, the draft model, eager launches: `ncclprobe report` "
                    f"gives each communicator's launch mode and NCCL time).", "note"))
    slow = [r["config"] for r in proj["rows"] if r["comm_of_step"] > 1]
    if slow:
        out.append(Text(f"The communication measured per forward exceeds --step-ms {d:g} for {', '.join(slow)}: "
                        f"--hidden/--layers do not describe that step, or this machine's all-reduce is slower than "
                        f"the server's; the projection does not hold.", "warn"))
    return out
