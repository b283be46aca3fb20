"""The profiler plugin's cost to a real NCCL job on N GPUs of one host (issue 16): a 1 KB all-reduce loop,
eager and from a CUDA graph, with no plugin (the baseline), with ncclprobe's accounting, and with its
GPU timing on, in one run, the three alternating round by round (these machines are noisy).

    python benchmarks/multigpu_probe_cost.py [--gpus N] [--rounds 5] [--calls 2000] [--out FILE.json]

Each configuration of each round is a fresh torchrun job (NCCL reads NCCL_PROFILER_PLUGIN once, at its
first communicator): rank 0's host wall time per all-reduce, median of --reps timed loops of --calls
calls after a warm-up (eager: back to back, then one synchronize; graph: --calls all-reduces captured
in one graph, replayed). The plugin is the installed libncclprobe.so alone, set as NCCL sets a profiler
(NCCL_PROFILER_PLUGIN); no preload, no boot probe. Printed: per mode, each configuration's median over
rounds and its ratio to the baseline of the same rounds. Goal: accounting <= 1.02 x the baseline.

With GPU timing NCCL adds a proxy operation to every collective and a host callback to every captured
graph: that cost is NCCL's, and it is in these ratios. One GPU runs, but NCCL's one-rank shortcut comes
before every profiler event: its ratios price nothing but the plugin's init.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _multigpu as mg  # noqa: E402

CONFIGS = ("baseline", "accounting", "gpu_timing")
NBYTES = 1024


def job(out: Path, calls: int, reps: int) -> None:
    import time
    import torch
    rank, world, device, dist = mg.rank_setup()
    t = torch.zeros(NBYTES // 2, dtype=torch.bfloat16, device=device)
    for _ in range(50):
        dist.all_reduce(t)
    torch.cuda.synchronize()

    def loop(call) -> list[float]:
        out = []
        for _ in range(reps):
            dist.barrier()
            torch.cuda.synchronize()
            start = time.perf_counter()
            call()
            torch.cuda.synchronize()
            out.append((time.perf_counter() - start) / calls * 1e6)
        return out

    def eager():
        for _ in range(calls):
            dist.all_reduce(t)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            dist.all_reduce(t)
    graph.replay()  # the first replay uploads the graph
    torch.cuda.synchronize()
    times = {"eager": loop(eager), "graph": loop(graph.replay)}
    if rank == 0:
        mg.write_json(out, {"world": world, "times_us": times})
    dist.barrier()
    dist.destroy_process_group()


def _plugin_env(config: str, events: Path) -> dict[str, str]:
    if config == "baseline":
        return {}
    from ncclprobe._lib import lib_path
    env = {"NCCL_PROFILER_PLUGIN": str(lib_path("libncclprobe.so")), "NCCLPROBE_DIR": str(events)}
    if config == "gpu_timing":
        env["NCCLPROBE_GPU_TIMING"] = "1"
    return env


def _options(ap) -> None:
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000, help="all-reduces per timed loop")
    ap.add_argument("--reps", type=int, default=5, help="timed loops per job (their median is the job's figure)")


def _measure(a, n: int) -> int:
    work = Path(tempfile.mkdtemp(prefix="ncclprobe-mgpu-cost-"))
    per: dict[str, dict[str, list[float]]] = {c: {"eager": [], "graph": []} for c in CONFIGS}
    for r in range(a.rounds):
        for c in CONFIGS:
            out = work / f"{r}-{c}.json"
            cmd = mg.torchrun(n, Path(__file__).resolve(), ["--job", str(out), "--calls", str(a.calls),
                                                            "--reps", str(a.reps)])
            env = mg.job_env(_plugin_env(c, work / f"events-{r}-{c}"))
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            if p.returncode != 0:
                print(p.stdout[-3000:] + p.stderr[-3000:], file=sys.stderr)
                print(f"round {r + 1} {c}: the job failed (exit {p.returncode}); files in {work}", file=sys.stderr)
                return 1
            doc = json.loads(out.read_text())
            for mode, values in doc["times_us"].items():
                per[c][mode].append(mg.median(values))
    info = mg.machine()
    print(f"# {info['gpus']} x {info['gpu']} (driver {info['driver']}), torch {info['torch']}, NCCL {info['nccl']}; "
          f"{n} rank(s), {NBYTES} B all-reduce, {a.calls} calls x {a.reps} loops per job, {a.rounds} rounds "
          f"alternating {', '.join(CONFIGS)}")
    result = {"machine": info, "ranks": n, "bytes": NBYTES, "calls": a.calls, "reps": a.reps, "rounds": a.rounds,
              "per_round_us": per, "median_us": {}, "ratio": {}}
    for mode in ("eager", "graph"):
        base = mg.median(per["baseline"][mode])
        for c in CONFIGS:
            m = mg.median(per[c][mode])
            result["median_us"].setdefault(c, {})[mode] = round(m, 3)
            result["ratio"].setdefault(c, {})[mode] = round(m / base, 4) if base else None
            goal = "  (goal <= 1.02)" if c == "accounting" else ""
            print(f"{mode:6} {c:11} {m:9.3f} µs per all-reduce   ratio {m / base:.4f}{goal}")
    if n == 1:
        print("one rank: NCCL short-cuts the all-reduce before any profiler event; these ratios price the "
              "plugin's init only, not its accounting")
    if a.out:
        mg.write_json(a.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(mg.main(__doc__, _options, lambda a: job(a.job, a.calls, a.reps), _measure))
