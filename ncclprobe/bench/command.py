"""`ncclprobe bench`: options -> plan -> matrix run (rows streamed as they are measured) -> Result
(comparison, recommendation, JSON, plot). SIGINT or SIGTERM at any point ends in a Result too: what was
measured so far, `incomplete` set, exit code 128+signal."""
from __future__ import annotations

import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ncclprobe.bench import driver as drv, live, matrix, plot as plot_mod, report, summary
from ncclprobe.bench.report import Context, Speculation, projection_options
from ncclprobe.bench.summary import BENCH_EXTRA_HINT, NOTHING_MEASURED
from ncclprobe.bench.torchnccl import torch_installed
from ncclprobe.doc import Result, Text, Title, Unexaminable
from ncclprobe.commands.envfile import AssignmentError, parse_assignments
from ncclprobe.diagnose.findings import EXIT_UNEXAMINABLE
from ncclprobe.model.watched import shown_values

SWEEP = ("1K", "64M", 4)  # -b, -e, -f when neither they nor --hidden are given
TOKENS = "1,2,3,4"        # --tokens for --hidden: decode and verify steps of k tokens
INCOMPLETE = "the run was interrupted before every configuration was measured"
GLOO_PLOT_CAVEAT = "gloo: NCCL settings cannot change these numbers; differences between lines are noise"
GPU_TIMING_NOTE = ("GPU timing is on (--gpu-timing): NCCL adds a proxy operation to every collective to report its "
                   "kernels' channels")
GPU_TIMING_GRAPH_NOTE = ", and a host callback to every captured CUDA graph, which the graph-mode times include"
ONE_GPU_PLOT_CAVEAT = ("1 GPU: NCCL short-cuts a single-rank all-reduce, so NCCL settings cannot change "
                       "these numbers; differences between lines are noise")


def _torch_missing() -> Unexaminable:
    return Unexaminable("torch is not installed, and bench measures through torch.distributed", "no torch",
                        {"hint": BENCH_EXTRA_HINT})


def _require_torch() -> None:
    """Up front, without importing torch here: the workers import it, and without it every
    configuration would only end in ModuleNotFoundError."""
    if not torch_installed():
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


def _check_combinations(backend: str, gpus, ranks, graph, hidden, tokens, layers, sweep_given: bool,
                        job: drv.Job | None) -> None:
    """Options that would otherwise be ignored without a word are usage errors, before any measurement."""
    if backend == "gloo" and gpus is not None:
        # gloo all-reduces CPU tensors: no GPU takes part, so a GPU count would promise what never runs
        raise AssignmentError(f"--gpus is for --backend nccl; gloo runs on CPU and takes its rank count from "
                              f"--ranks (e.g. --ranks {gpus})")
    if backend == "nccl" and ranks is not None:
        raise AssignmentError(f"--ranks is for --backend gloo; with NCCL give the GPU count with --gpus "
                              f"(e.g. --gpus {ranks})")
    if backend == "gloo" and graph:
        raise AssignmentError("--graph needs CUDA graphs, which a gloo (CPU) all-reduce cannot be captured in; "
                              "drop it or use --backend nccl")
    if hidden is None and (tokens is not None or layers is not None):
        raise AssignmentError("--tokens and --layers need --hidden (sizes become tokens x hidden x dtype bytes)")
    if hidden is not None and sweep_given:
        raise AssignmentError("--hidden sets the sizes (tokens x hidden x dtype bytes) and -b/-e/-f set a sweep: "
                              "give one or the other")
    if job is not None:
        for opt, n in (("--gpus", gpus), ("--ranks", ranks)):
            if n is not None and n != job.nranks:
                raise AssignmentError(f"{opt} {n}: this process is rank {job.rank} of a {job.nranks}-rank job "
                                      f"(WORLD_SIZE), which sets the count; drop {opt}")


def _ranks(backend: str, gpus: int | None, ranks: int | None, job: drv.Job | None) -> int:
    if job is not None:
        return job.nranks
    if backend == "gloo":
        return ranks if ranks is not None else 2
    visible = _visible_gpus()
    want = gpus if gpus is not None else visible
    if visible == 0:
        raise Unexaminable("no CUDA GPU is visible, so NCCL cannot be measured here", "no GPU",
                           {"hint": "try the harness on CPU with --backend gloo --ranks 2 (its numbers "
                                    "are CPU/gloo numbers, not GPU numbers)"})
    if want > visible:
        raise Unexaminable(f"asked for {want} GPUs but only {visible} are visible", "not enough GPUs",
                           {"hint": f"use --gpus {visible} or fewer (check CUDA_VISIBLE_DEVICES)"})
    return want


@dataclass
class Plan:
    """Everything the measurement needs, decided before any worker starts."""
    ctx: Context
    configs: list[matrix.Config]
    notes: list[str]              # what the backend or the options changed, said in the output
    sizes: list[int]
    token_sizes: dict[int, int]
    layers: int | None
    common: dict[str, str]        # --env
    spec: dict[str, Any]          # what every worker gets (spec.json)
    job: drv.Job | None
    plot: str | None
    speculation: Speculation | None = None  # --step-ms / --accept-len


def bench_command(gpus=None, backend="nccl", ranks=None, proto=None, algo=None, configs=(), envs=(),
                  minbytes=None, maxbytes=None, stepfactor=None, hidden=None, tokens=None, layers=None,
                  dtype="bf16", iters=20, warmup=5, graph=None, check=True, timeout=120.0, plot=None,
                  basis=None, keep=False, workdir=None, rows_to=None, progress_to=None, gpu_timing=False,
                  accept_len=None, step_ms=None) -> Result:
    """Usage errors first (AssignmentError, exit 2), then what this machine lacks (Unexaminable,
    exit 3), then the measurement. None means an option was not given (some defaults depend on the
    backend). Rows stream to `rows_to` as they are measured and progress to `progress_to` (None:
    nowhere). The worker directory is removed at the end unless `keep` (or the caller gave its own
    `workdir`)."""
    with drv.Signals() as signals:
        try:
            plan = _plan(gpus, backend, ranks, proto, algo, configs, envs, minbytes, maxbytes, stepfactor,
                         hidden, tokens, layers, dtype, iters, warmup, graph, check, timeout, plot, basis,
                         gpu_timing, accept_len, step_ms)
        except KeyboardInterrupt as exc:  # torch's import (GPU count) takes seconds: a Ctrl-C can land there
            return _stopped_before(backend, getattr(exc, "signum", signal.SIGINT))
        return _measure(plan, signals, workdir, keep, rows_to, progress_to)


def _plan(gpus, backend, ranks, proto, algo, configs, envs, minbytes, maxbytes, stepfactor, hidden, tokens,
          layers, dtype, iters, warmup, graph, check, timeout, plot, basis, gpu_timing=False, accept_len=None,
          step_ms=None) -> Plan:
    if iters < 1 or warmup < 0 or timeout <= 0:
        raise AssignmentError("-n must be >= 1, -w >= 0 and --timeout > 0")
    if layers is not None and layers < 1:
        raise AssignmentError("--layers must be positive")
    _check_counts(gpus, ranks)
    job = drv.job_from_env()
    _check_combinations(backend, gpus, ranks, graph, hidden, tokens, layers,
                        any(v is not None for v in (minbytes, maxbytes, stepfactor)), job)
    if backend == "gloo" and gpu_timing:
        raise AssignmentError("--gpu-timing times NCCL's kernels on the GPU; a gloo all-reduce has none: drop it "
                              "or use --backend nccl")
    spec_proj = projection_options(hidden, accept_len, step_ms)
    if plot:
        _check_plot_path(plot)
        plot_mod.require()
    common = parse_assignments(envs, "--env")
    for var in ("NCCL_PROTO", "NCCL_ALGO"):
        if var in common:
            matrix.check_selector(var, common[var], "--env")
    cfgs, note = matrix.select(backend, proto, algo, configs)
    notes = [note] if note else []
    nccl_env = sorted(k for k in common if k.startswith("NCCL_"))
    if backend == "gloo" and nccl_env:
        notes.append(f"gloo: --env {', '.join(nccl_env)} cannot change a gloo all-reduce (it reads no NCCL variable)")
    elem = matrix.DTYPE_BYTES[dtype]
    token_sizes = matrix.model_sizes(hidden, matrix.parse_tokens(tokens or TOKENS), dtype) if hidden else {}
    if spec_proj.step_ms is not None and 1 not in token_sizes:
        raise AssignmentError("--step-ms projects a k-token verify step from the 1-token decode step: --tokens "
                              "must include 1")
    if spec_proj.accept:
        spec_proj = spec_proj.fitted(sorted(token_sizes))
    b, e, f = (v if v is not None else d for v, d in zip((minbytes, maxbytes, stepfactor), SWEEP))
    sizes = sorted(set(token_sizes.values())) if hidden else matrix.sweep(
        matrix.parse_size(b), matrix.parse_size(e), f, elem)
    _require_torch()
    nranks = _ranks(backend, gpus, ranks, job)
    graph_ok = graph is not False and backend == "nccl"
    ctx = Context(backend, nranks, basis or ("graph" if graph_ok else "eager"),
                  "GPU/NCCL" if backend == "nccl" else "CPU/gloo")
    if ctx.basis == "graph" and not graph_ok:
        raise AssignmentError("--basis graph needs CUDA graphs: --backend nccl without --no-graph")
    if backend == "nccl" and job is not None and _visible_gpus() <= job.local_rank:
        raise Unexaminable(f"LOCAL_RANK {job.local_rank} has no GPU on this node", "not enough GPUs")
    spec = {"backend": backend, "sizes": sizes, "dtype": dtype, "iters": iters, "warmup": warmup,
            "graph": graph_ok, "check": check, "timeout": timeout, "gpu_timing": bool(gpu_timing)}
    if gpu_timing:
        notes.append(GPU_TIMING_NOTE + (GPU_TIMING_GRAPH_NOTE if graph_ok else ""))
    return Plan(ctx, cfgs, notes, sizes, token_sizes, layers, common, spec, job, plot, spec_proj)


def _measure(plan: Plan, signals: drv.Signals, workdir, keep: bool, rows_to, progress_to) -> Result:
    d = drv.Driver(plan.job or drv.Job(plan.ctx.nranks), plan.spec, plan.common, plan.spec["timeout"],
                   workdir=workdir)
    remove = workdir is None and not keep  # a caller's own directory is the caller's
    printer = _printer(plan, rows_to, progress_to) if rows_to or progress_to else None
    try:
        m = drv.run_matrix(d, plan.configs, signals, printer)
        stop = _interruption(plan, m)
        if printer and stop:
            printer.interrupted(summary.interruption({"interrupted": stop}))
        elif printer:
            printer.finish()
        if plan.job is not None and plan.job.rank != 0:
            result = _other_rank_result(plan, m, stop, None if remove else d.workdir)
        else:
            result = build_result(plan, m, d, kept=not remove)
    finally:
        if remove:  # run_matrix has killed every worker by now, also on Ctrl-C
            shutil.rmtree(d.workdir, ignore_errors=True)
    if m.signum is None and signals.signum is not None:  # after the last configuration: all was measured
        result.doc.append(Text(f"{signal.Signals(signals.signum).name} arrived while the result was being "
                               f"built; every configuration had finished.", "warn"))
    signum = m.signum or signals.signum
    if signum is not None:
        result.code = 128 + signum
    return result


def _printer(plan: Plan, rows_to, progress_to) -> live.Printer:
    ctx, spec = plan.ctx, plan.spec
    unit = "ranks" if ctx.cpu else "GPUs"
    intro = [f"ncclprobe bench: all_reduce on {ctx.nranks} {unit}, {ctx.label}"
             + (": CPU numbers, not GPU or NCCL numbers" if ctx.cpu else ""),
             f"{live.TYPE_NAMES[spec['dtype']]}, warm-up {spec['warmup']}, {spec['iters']} calls back to back "
             f"per measurement, host wall time / calls, slowest rank; modes: "
             f"{'eager, graph' if spec['graph'] else 'eager'}; validation: {int(spec['check'])}; "
             f"{len(plan.configs)} configuration{'s' if len(plan.configs) > 1 else ''}"] + plan.notes
    return live.Printer(rows_to, progress_to, intro=intro, nranks=ctx.nranks, dtype=spec["dtype"],
                        checked=spec["check"], basis=ctx.basis, configs=plan.configs, nsizes=len(plan.sizes),
                        realize=lambda run: report.realized(ctx, run.dir, plan.sizes, run.profiler))


def _interruption(plan: Plan, m: drv.Matrix) -> dict[str, Any] | None:
    """Where the signal stopped the matrix (None when it ran through): JSON `interrupted`."""
    if m.signum is None:
        return None
    last = m.runs[-1] if m.runs and m.runs[-1].status == "interrupted" else None
    return {"signal": signal.Signals(m.signum).name, "config": last.config.name if last else None,
            "index": len(m.runs) - 1 if last else None, "of": len(plan.configs),
            "finished": len(m.runs) - (1 if last else 0),
            "sizes_done": len({r["bytes"] for r in last.rows}) if last else None, "sizes": len(plan.sizes),
            "not_run": [c.name for c in m.not_run]}


def _stopped_before(backend: str, signum: int) -> Result:
    data = {"backend": backend, "incomplete": True, "configs": [], "interrupted": {
        "signal": signal.Signals(signum).name, "config": None, "index": None, "of": None, "finished": 0,
        "sizes_done": None, "sizes": None, "not_run": []}}
    return Result("bench", data=data, doc=[Title(f"bench: {summary.interruption(data)}; nothing was measured")],
                  code=128 + signum)


def _measured(runs) -> bool:
    return any(r.status in summary.MEASURED or r.rows for r in runs)


def _other_rank_result(plan: Plan, m: drv.Matrix, stop, kept: Path | None) -> Result:
    job, runs = plan.job, m.runs
    doc = [Text(f"rank {job.rank} of {plan.ctx.nranks}: results are reported by rank 0.", "note")]
    data: dict[str, Any] = {"rank": job.rank, "configs": [{"name": r.config.name, "status": r.status,
                                                           "reason": r.reason} for r in runs],
                            "incomplete": stop is not None, "interrupted": stop,
                            "workdir": str(kept) if kept else None}
    code = None
    if stop:
        doc.append(Text(f"rank {job.rank}: {summary.interruption(data)}.", "warn"))
    elif runs and not any(r.status in summary.MEASURED for r in runs):
        doc.append(Text(f"rank {job.rank}: {NOTHING_MEASURED}.", "warn"))
        data["error"] = {"message": NOTHING_MEASURED, "reason": "nothing_measured"}
        code = EXIT_UNEXAMINABLE
    if kept:
        doc.append(Text(f"Worker logs kept in {kept}.", "dim"))
    return Result("bench", data=data, doc=doc, code=code)


def _topology(ctx: Context):
    if ctx.cpu:
        return None
    from ncclprobe import topo
    return topo.collect()


def _plot_caveat(ctx: Context) -> str:
    """What the image must say when its lines cannot differ by NCCL setting (else noise looks like a win)."""
    return GLOO_PLOT_CAVEAT if ctx.cpu else ONE_GPU_PLOT_CAVEAT if ctx.nranks == 1 else ""


def build_result(plan: Plan, m: drv.Matrix, d: drv.Driver, kept: bool = True) -> Result:
    ctx, runs, sizes, token_sizes = plan.ctx, m.runs, plan.sizes, plan.token_sizes
    topology = _topology(ctx)
    findings, configs = [], []
    meta = next((r.meta for r in runs if r.meta), {})
    for r in runs:
        real = report.realized(ctx, r.dir, sizes, r.profiler)
        configs.append({"name": r.config.name, "env": shown_values(r.env), "status": r.status, "reason": r.reason,
                        "realized": real, "results": report.results(r.rows, ctx.nranks), "pids": r.pids,
                        "workers": [{k: w.get(k) for k in ("rank", "pid", "ppid", "host", "env", "state")}
                                    for w in r.workers],
                        "seconds": round(r.seconds, 3), "out_of_place": r.meta.get("out_of_place")})
        findings += report.mismatch_findings(r.config.name, r.env, real, r.pids)
        findings += report.ll128_findings(ctx, r.config.name, r.env, topology)
    stop = _interruption(plan, m)
    rec = report.recommend(ctx, configs, sorted(token_sizes.values()) if token_sizes else sizes, plan.common)
    if stop and not ctx.cpu:  # an unmeasured configuration might have won
        rec.update(applicable=False, reason=INCOMPLETE + (f"; {rec['reason']}" if rec["reason"] else ""))
    proj = report.projection(ctx, configs, token_sizes, plan.layers, plan.speculation) if token_sizes else None
    spec = plan.spec
    data = {"backend": ctx.backend, "label": ctx.label, "nranks": ctx.nranks, "basis": ctx.basis,
            "device": meta.get("device"), "versions": {"torch": meta.get("torch"), "nccl": meta.get("nccl")},
            "collective": "all_reduce", "sizes": sizes,
            "options": {k: spec[k] for k in ("dtype", "iters", "warmup", "graph", "check", "timeout", "gpu_timing")},
            "topology": topology.to_json() if topology is not None else
            {"available": False, "reason": "CPU/gloo run: no GPU topology involved"},
            "incomplete": stop is not None, "interrupted": stop, "notes": plan.notes,
            "configs": configs, "recommendation": rec, "projection": proj,
            "dropped_env": d.dropped, "workdir": str(d.workdir) if kept else None}
    if not _measured(runs):
        if stop:
            doc = summary.interrupted_early(ctx, data)
        else:
            # Exit 3, not 1: nothing about this machine's all-reduce could be examined (as with no GPU or
            # no torch); 1 is for error-level findings, which need a measurement to stand on.
            data["error"] = {"message": NOTHING_MEASURED, "reason": "nothing_measured"}
            doc = summary.nothing_measured(ctx, data, kept)
        if plan.plot:
            doc.append(Text(f"No plot written to {plan.plot}: there is no number to draw.", "dim"))
        return Result("bench", findings=findings, data=data, doc=doc, code=None if stop else EXIT_UNEXAMINABLE)
    doc = summary.document(ctx, data, token_sizes)
    if kept:
        doc.append(Text(f"Worker logs, specs and events kept in {d.workdir}.", "dim"))
    elif any(c["status"] in ("hang", "error") for c in configs):
        doc.append(Text("The worker logs were removed; run again with --keep to keep them.", "dim"))
    if plan.plot and stop:
        doc.append(Text(f"No plot written to {plan.plot}: the run was interrupted.", "dim"))
    elif plan.plot:
        unit = "ranks" if ctx.cpu else "GPUs"
        plot_mod.write(plan.plot, configs, ctx.basis,
                       f"all_reduce {ctx.basis}, {ctx.nranks} {unit}, {ctx.label}"
                       + (" (CPU numbers, not GPU)" if ctx.cpu else f", {data['device']}"), _plot_caveat(ctx))
        doc.append(Text(f"Plot written to {plan.plot}.", "dim"))
        data["plot"] = plan.plot
    return Result("bench", findings=findings, data=data, doc=doc)
