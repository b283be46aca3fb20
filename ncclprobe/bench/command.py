"""`ncclprobe bench`: options -> plan -> matrix run -> Result (tables, recommendation, JSON, plot)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from ncclprobe.bench import driver as drv, matrix, plot as plot_mod, report
from ncclprobe.bench.report import Context, fmt_us
from ncclprobe.doc import Result, Table, Text, Title, Unexaminable
from ncclprobe.envfile import AssignmentError, parse_assignments
from ncclprobe.findings import EXIT_UNEXAMINABLE

BENCH_EXTRA_HINT = "install the bench extra: pip install 'ncclprobe[bench]'"
NOTHING_MEASURED = "nothing was measured: every configuration ended in error or hang"


def _torch_missing() -> Unexaminable:
    return Unexaminable("torch is not installed, and bench measures through torch.distributed", "no torch",
                        {"hint": BENCH_EXTRA_HINT})


def _require_torch() -> None:
    """Up front, without importing torch here: the workers import it, and without it every
    configuration would only end in ModuleNotFoundError."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken parent package or a torch without __spec__
        found = False
    if not found:
        raise _torch_missing()


def _visible_gpus() -> int:
    try:
        import torch
    except ImportError:
        raise _torch_missing() from None
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _check_counts(gpus: int | None, ranks: int | None) -> None:
    for opt, n in (("--gpus", gpus), ("--ranks", ranks)):
        if n is not None and n < 1:
            raise AssignmentError(f"{opt} must be at least 1 (got {n})")


def _check_plot_path(plot: str) -> None:
    """Before any measurement: a plot that cannot be written must not cost the whole run."""
    target = Path(plot)
    if target.is_dir():
        raise AssignmentError(f"--plot {plot}: is a directory; give a file name such as {target / 'bench.png'}")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise AssignmentError(f"--plot {plot}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise AssignmentError(f"--plot {plot}: directory {parent} is not writable")
    if target.exists() and not os.access(target, os.W_OK):
        raise AssignmentError(f"--plot {plot}: the file exists and is not writable")


def _ranks(backend: str, gpus: int | None, ranks: int | None, job: drv.Job | None) -> int:
    if job is not None:
        return job.nranks
    if backend == "gloo":
        return ranks if ranks is not None else gpus if gpus is not None else 2
    if ranks is not None and gpus is not None and ranks != gpus:
        raise AssignmentError("--ranks is for --backend gloo; with NCCL use --gpus")
    visible = _visible_gpus()
    want = gpus if gpus is not None else ranks if ranks is not None else visible
    if visible == 0:
        raise Unexaminable("no CUDA GPU is visible, so NCCL cannot be measured here", "no GPU",
                           {"hint": "try the harness on CPU with --backend gloo --ranks 2 (its numbers "
                                    "are CPU/gloo numbers, not GPU numbers)"})
    if want > visible:
        raise Unexaminable(f"asked for {want} GPUs but only {visible} are visible", "not enough GPUs",
                           {"hint": f"use --gpus {visible} or fewer (check CUDA_VISIBLE_DEVICES)"})
    return want


def bench_command(gpus=None, backend="nccl", ranks=None, proto="LL,LL128,Simple", algo="Ring,Tree",
                  configs=(), envs=(), minbytes="1K", maxbytes="64M", stepfactor=4, hidden=None,
                  tokens="1,2,3,4", layers=None, dtype="bf16", iters=20, warmup=5, graph=True,
                  check=True, timeout=120.0, plot=None, basis=None, keep=False, workdir=None,
                  progress=None) -> Result:
    """Usage errors first (AssignmentError, exit 2), then what this machine lacks (Unexaminable,
    exit 3), then the measurement. The worker directory is removed at the end unless `keep` (or the
    caller gave its own `workdir`)."""
    if iters < 1 or warmup < 0 or timeout <= 0:
        raise AssignmentError("-n must be >= 1, -w >= 0 and --timeout > 0")
    if layers is not None and layers < 1:
        raise AssignmentError("--layers must be positive")
    _check_counts(gpus, ranks)
    if plot:
        _check_plot_path(plot)
        plot_mod.require()
    common = parse_assignments(envs, "--env")
    for var in ("NCCL_PROTO", "NCCL_ALGO"):
        if var in common:
            matrix.check_selector(var, common[var], "--env")
    cfgs = matrix.build_matrix(proto, algo, configs)
    elem = matrix.DTYPE_BYTES[dtype]
    token_sizes = matrix.model_sizes(hidden, matrix.parse_tokens(tokens), dtype) if hidden else {}
    sizes = sorted(set(token_sizes.values())) if hidden else matrix.sweep(
        matrix.parse_size(minbytes), matrix.parse_size(maxbytes), stepfactor, elem)
    job = drv.job_from_env()
    _require_torch()
    nranks = _ranks(backend, gpus, ranks, job)
    graph_ok = graph and backend == "nccl"
    ctx = Context(backend, nranks, basis or ("graph" if graph_ok else "eager"),
                  "GPU/NCCL" if backend == "nccl" else "CPU/gloo")
    if ctx.basis == "graph" and not graph_ok:
        raise AssignmentError("--basis graph needs CUDA graphs: --backend nccl without --no-graph")
    if backend == "nccl" and job is not None and _visible_gpus() <= job.local_rank:
        raise Unexaminable(f"LOCAL_RANK {job.local_rank} has no GPU on this node", "not enough GPUs")
    spec = {"backend": backend, "sizes": sizes, "dtype": dtype, "iters": iters, "warmup": warmup,
            "graph": graph_ok, "check": check, "timeout": timeout}
    d = drv.Driver(job or drv.Job(nranks), spec, common, timeout, workdir=workdir)
    remove = workdir is None and not keep  # a caller's own directory is the caller's
    if progress is None and sys.stderr.isatty():
        def progress(msg):
            print(f"bench {msg}", file=sys.stderr, flush=True)
    try:
        runs = drv.run_matrix(d, cfgs, progress)
        if job is not None and job.rank != 0:
            return _other_rank_result(job, nranks, runs, None if remove else d.workdir)
        return build_result(ctx, runs, d, sizes, token_sizes, layers, common, plot, dict(
            dtype=dtype, iters=iters, warmup=warmup, graph=graph_ok, check=check, timeout=timeout),
            kept=not remove)
    except KeyboardInterrupt as exc:  # the CLI says where the logs are, if they stay
        exc.workdir = None if remove else str(d.workdir)
        raise
    finally:
        if remove:  # run_matrix has killed every worker by now, also on Ctrl-C
            shutil.rmtree(d.workdir, ignore_errors=True)


def _measured(runs) -> bool:
    return any(r.status in ("ok", "wrong") for r in runs)


def _other_rank_result(job: drv.Job, nranks: int, runs, kept: Path | None) -> Result:
    doc = [Text(f"rank {job.rank} of {nranks}: results are reported by rank 0.", "note")]
    data: dict[str, Any] = {"rank": job.rank, "configs": [{"name": r.config.name, "status": r.status,
                                                           "reason": r.reason} for r in runs],
                            "workdir": str(kept) if kept else None}
    code = None
    if runs and not _measured(runs):
        doc.append(Text(f"rank {job.rank}: {NOTHING_MEASURED}.", "warn"))
        data["error"] = {"message": NOTHING_MEASURED, "reason": "nothing measured"}
        code = EXIT_UNEXAMINABLE
    if kept:
        doc.append(Text(f"Worker logs kept in {kept}.", "dim"))
    return Result("bench", data=data, doc=doc, code=code)


def _topology(ctx: Context):
    if ctx.cpu:
        return None
    from ncclprobe import topo
    return topo.collect()


def build_result(ctx: Context, runs, d: drv.Driver, sizes, token_sizes, layers, common, plot, opts,
                 kept: bool = True) -> Result:
    topology = _topology(ctx)
    findings, configs = [], []
    meta = next((r.meta for r in runs if r.meta), {})
    for r in runs:
        real = report.realized(ctx, r.dir, sizes, r.profiler)
        configs.append({"name": r.config.name, "env": r.env, "status": r.status, "reason": r.reason,
                        "realized": real, "results": report.results(r.rows, ctx.nranks), "pids": r.pids,
                        "workers": [{k: w.get(k) for k in ("rank", "pid", "ppid", "host", "env", "state")}
                                    for w in r.workers],
                        "seconds": round(r.seconds, 3), "out_of_place": r.meta.get("out_of_place")})
        findings += report.mismatch_findings(r.config.name, r.env, real, r.pids)
        findings += report.ll128_findings(ctx, r.config.name, r.env, topology)
    rec = report.recommend(ctx, configs, sorted(token_sizes.values()) if token_sizes else sizes, common)
    proj = report.projection(ctx, configs, token_sizes, layers) if token_sizes else None
    data = {"backend": ctx.backend, "label": ctx.label, "nranks": ctx.nranks, "basis": ctx.basis,
            "device": meta.get("device"), "versions": {"torch": meta.get("torch"), "nccl": meta.get("nccl")},
            "collective": "all_reduce", "sizes": sizes, "options": opts,
            "topology": topology.to_json() if topology is not None else
            {"available": False, "reason": "CPU/gloo run: no GPU topology involved"},
            "configs": configs, "recommendation": rec, "projection": proj,
            "dropped_env": d.dropped, "workdir": str(d.workdir) if kept else None}
    if not _measured(runs):
        # Exit 3, not 1: nothing about this machine's all-reduce could be examined (as with no GPU or
        # no torch); 1 is for error-level findings, which need a measurement to stand on.
        data["error"] = {"message": NOTHING_MEASURED, "reason": "nothing measured"}
        doc = _nothing_measured(ctx, data, kept)
        if plot:
            doc.append(Text(f"No plot written to {plot}: there is no number to draw.", "dim"))
        return Result("bench", findings=findings, data=data, doc=doc, code=EXIT_UNEXAMINABLE)
    doc = document(ctx, data, token_sizes)
    if kept:
        doc.append(Text(f"Worker logs, specs and events kept in {d.workdir}.", "dim"))
    elif any(c["status"] in ("hang", "error") for c in configs):
        doc.append(Text("The worker logs were removed; run again with --keep to keep them.", "dim"))
    if plot:
        unit = "ranks" if ctx.cpu else "GPUs"
        plot_mod.write(plot, configs, ctx.basis,
                       f"all_reduce {ctx.basis}, {ctx.nranks} {unit}, {ctx.label}"
                       + (" (CPU numbers, not GPU)" if ctx.cpu else f", {data['device']}"))
        doc.append(Text(f"Plot written to {plot}.", "dim"))
        data["plot"] = plot
    return Result("bench", findings=findings, data=data, doc=doc)


def _nothing_measured(ctx: Context, data: dict[str, Any], kept: bool) -> list:
    """No table to read (every cell would be error/hang): say so first, then each configuration's reason."""
    unit = "ranks" if ctx.cpu else "GPUs"
    doc: list = [Title(f"bench: all_reduce on {ctx.nranks} {unit}, {ctx.label}: "
                       f"{NOTHING_MEASURED}"),
                 Text("No configuration produced a number, so there is nothing to compare or recommend.", "warn")]
    for c in data["configs"]:
        doc.append(Text(f"{c['name']}: {c['status']}: {c['reason'] or 'no reason recorded'}", "warn"))
    if any("ModuleNotFoundError" in (c["reason"] or "") and "torch" in c["reason"] for c in data["configs"]):
        doc.append(Text(f"The workers could not import what they need: {BENCH_EXTRA_HINT} in the "
                        f"interpreter that runs ncclprobe ({sys.executable}).", "note"))
    doc.append(Text(f"Worker logs kept in {data['workdir']}." if kept
                    else "The worker logs were removed; run again with --keep to keep them.", "dim"))
    return doc


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


def document(ctx: Context, data: dict[str, Any], token_sizes: dict[int, int]) -> list:
    configs, n = data["configs"], ctx.nranks
    opts = data["options"]
    if ctx.cpu:
        head = (f"bench: all_reduce on CPU/gloo, {n} ranks: CPU numbers, not GPU or NCCL numbers")
    else:
        head = (f"bench: all_reduce on {n} x {data['device'] or 'GPU'} (GPU/NCCL, torch "
                f"{data['versions']['torch']}, NCCL {data['versions']['nccl']})")
    doc: list = [Title(head)]
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
    if data["dropped_env"]:
        doc.append(Text("Not passed to the workers (inherited, would change 'defaults'; use --env): "
                        + ", ".join(data["dropped_env"]), "dim"))
    basis = ctx.basis
    cols = ["size"] + [c["name"] for c in configs]
    rows = []
    for s in data["sizes"]:
        times = {c["name"]: report.time_of(c["results"], s, basis) if c["status"] in ("ok", "wrong") else None
                 for c in configs}
        marked = _mark_best({k: (v if next(c for c in configs if c["name"] == k)["status"] == "ok" else None)
                             for k, v in times.items()}, _ranks_configs(ctx))
        rows.append([report._size(s)] + [marked[c["name"]] if c["status"] == "ok" else
                                         (fmt_us(times[c["name"]]) + " WRONG" if c["status"] == "wrong"
                                          else c["status"]) for c in configs])
    oop = ("out-of-place = copy + in-place all_reduce" if ctx.cpu or all(_copy_inplace(c) for c in configs
                                                                        if c["status"] in ("ok", "wrong"))
           else "out-of-place")
    if ctx.cpu:
        ranking = ("the NCCL configurations do not apply to gloo (it reads no NCCL variable): columns that "
                   "differ only in NCCL variables are the same gloo all-reduce, their differences are noise, "
                   "and no fastest is marked")
    elif not _ranks_configs(ctx):
        ranking = ("one rank: NCCL short-cuts the all-reduce and chooses no algorithm or protocol, so the "
                   "columns do not rank NCCL settings and no fastest is marked")
    else:
        ranking = "* = fastest correct configuration per size"
    doc.append(Text(f"{ctx.label} all_reduce time (µs), {basis} mode, {oop}; {ranking}"))
    doc.append(Table(cols, rows))
    for c in configs:
        doc += _detail(ctx, c, opts["graph"])
    host = _host_overhead(ctx, configs, data["sizes"])
    if host:
        doc.append(Text(host, "note"))
    if token_sizes and data["projection"]:
        doc += _projection_nodes(data["projection"], token_sizes, ctx.label)
    line, style = report.recommendation_text(data["recommendation"], ctx.label)
    doc.append(Text("Recommendation: " + line, style))
    return doc


def _detail(ctx: Context, c: dict[str, Any], graph: bool) -> list:
    env = " ".join(f"{k}={v}" for k, v in sorted(c["env"].items())) or "(NCCL defaults)"
    head = f"{c['name']}: {env}; status {c['status']}"
    if c["status"] in ("hang", "error"):
        return [Text(f"{head}: {c['reason']}", "warn")]
    real = c["realized"]
    modes = ["eager"] + (["graph"] if graph else [])
    oop = "oop=copy+ip" if ctx.cpu or _copy_inplace(c) else "oop"
    cols = ["size", "count"] + [f"{m} {p} µs" for m in modes for p in (oop, "ip")]
    cols += ["algbw GB/s", "busbw GB/s", "#wrong", "algo/proto"]
    rows = []
    for s in sorted({r["bytes"] for r in c["results"]}):
        rs = [r for r in c["results"] if r["bytes"] == s]
        cells = [report._size(s), str(rs[0]["count"])]
        for m in modes:
            for inplace in (False, True):
                r = next((r for r in rs if r["mode"] == m and r["inplace"] == inplace), None)
                cells.append("-" if r is None else fmt_us(r["time_us"]) + (" (empty graph)" if r["note"] else ""))
        basis = next((r for r in rs if r["mode"] == ctx.basis and not r["inplace"]), rs[0])
        cells += [f"{basis['algbw']:.3g}", f"{basis['busbw']:.3g}", str(max(r["wrong"] for r in rs)),
                  real["per_size"].get(s) or "unknown"]
        rows.append(cells)
    caption = "" if real["available"] else f"algo/proto unknown: {real['reason']}"
    if c.get("out_of_place"):
        caption = (caption + "; " if caption else "") + f"oop = {c['out_of_place']}"
    return [Text(head), Table(cols, rows, caption=caption)]


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
    return [Text(f"Per-forward communication floor ({label})"), Table(cols, rows, caption=caption)]

