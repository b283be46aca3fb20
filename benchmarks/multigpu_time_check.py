"""NCCL time accounting on N GPUs of one host against the job's own CUDA-event timings (issue 16).

    python benchmarks/multigpu_time_check.py [--gpus N] [--replays 200] [--iters 200] [--out FILE.json]

Runs `ncclprobe run --gpu-timing -- torchrun --nproc-per-node N THIS --job DIR`. Every rank makes two
groups over all ranks: "decode", whose all-reduces of 14, 28 and 56 KB are each captured into a CUDA
graph and replayed (--replays times), and "verify", run eagerly (--iters calls each) at 14-56 KB and
1-64 MB. The job times every call with a pair of torch.cuda.Event around it (a replay, or a
synchronous all_reduce) and writes the times. Then `ncclprobe report --json` of the run's log
directory: per group and size, the profiler plugin's count, launch mode and GPU time per call (the
median read from its histogram: 1/8-octave bins, within 6.25 %) beside the job's median. Goal: the
medians within 10 %; the counts exact.

The two groups are told apart in the report by launch mode alone (decode's collectives are replays,
verify's eager), and each compared size has a power-of-two bucket of its own (14 KB, 28 KB, 56 KB,
1 MB ... 64 MB), so a bucket holds one size. Both groups are warmed by a 4-byte all-reduce, a bucket
no compared size shares. An event pair also times the launch gap before the kernel: at the smallest
sizes the job's figure is the larger one.

One GPU runs the whole pipeline, but NCCL short-cuts a one-rank all-reduce before any profiler event
(see reference/observed.md): the report has nothing to compare, and this says so.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _multigpu as mg  # noqa: E402

DECODE_SIZES = [14336, 28672, 57344]                      # 1, 2, 4 tokens x hidden 7168 x bf16
VERIFY_SIZES = DECODE_SIZES + [1 << s for s in range(20, 27, 2)]  # and 1, 4, 16, 64 MB
WARM_BYTES = 4
GOAL = 0.10


def job(out: Path, replays: int, iters: int) -> None:
    import torch
    rank, world, device, dist = mg.rank_setup()
    everyone = list(range(world))
    groups = {"decode": dist.new_group(everyone), "verify": dist.new_group(everyone)}
    warm = torch.zeros(WARM_BYTES // 2, dtype=torch.bfloat16, device=device)
    for g in groups.values():  # each group's communicator is created and warm before a capture
        dist.all_reduce(warm, group=g)
    torch.cuda.synchronize()

    def timed(n: int, call) -> list[float]:
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for a, b in pairs:
            a.record()
            call()
            b.record()
        torch.cuda.synchronize()
        return [a.elapsed_time(b) * 1e3 for a, b in pairs]  # ms -> µs

    times: dict[str, dict[int, list[float]]] = {"decode": {}, "verify": {}}
    for nbytes in DECODE_SIZES:
        t = torch.zeros(nbytes // 2, dtype=torch.bfloat16, device=device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            dist.all_reduce(t, group=groups["decode"])
        times["decode"][nbytes] = timed(replays, graph.replay)
    for nbytes in VERIFY_SIZES:
        t = torch.zeros(nbytes // 2, dtype=torch.bfloat16, device=device)
        times["verify"][nbytes] = timed(iters, lambda t=t: dist.all_reduce(t, group=groups["verify"]))
    mg.write_json(out / f"rank{rank}.json", {"rank": rank, "world": world, "pid": os.getpid(),
                                             "times_us": times})
    dist.barrier()
    dist.destroy_process_group()


def bucket(nbytes: int) -> int:
    return nbytes.bit_length() - 1


def compare(report: dict, ranks: list[dict], replays: int, iters: int) -> dict:
    """Per group and size: the job's median (over every rank's calls) beside the plugin's."""
    from ncclprobe.model import timing
    world = ranks[0]["world"] if ranks else 0
    rows = []
    for role, mode, sizes, n in (("decode", "replayed", DECODE_SIZES, replays), ("verify", "eager", VERIFY_SIZES, iters)):
        for nbytes in sizes:
            job_us = [t for r in ranks for t in r["times_us"][role][str(nbytes)]]
            hist: dict[int, int] = {}
            count = gpu_count = 0
            algo = set()
            for c in report.get("communicators", []):
                for s in c.get("collectives") or []:
                    if s.get("func") == "AllReduce" and s.get("mode") == mode and s.get("size_log2") == bucket(nbytes):
                        count += s["count"]
                        gpu_count += s.get("gpu_count") or 0
                        algo.add(f"{s['algo']}/{s['proto']}/{s['nchannels']}")
                        for b, k in s.get("gpu_hist") or []:
                            hist[b] = hist.get(b, 0) + k
            med = timing.quantile(hist, 0.5)
            job_med = mg.median(job_us)
            ratio = (med / 1e3) / job_med if med is not None and job_med else None
            rows.append({"group": role, "mode": mode, "bytes": nbytes, "calls_job": n * world, "calls_plugin": count,
                         "timed_plugin": gpu_count, "ran": sorted(algo), "job_median_us": _r(job_med),
                         "plugin_median_us": _r(med / 1e3 if med is not None else None), "ratio": _r(ratio, 4),
                         "within_goal": None if ratio is None else abs(ratio - 1) <= GOAL})
    comparable = any(r["calls_plugin"] for r in rows)
    reason = "" if comparable else (
        "one rank: NCCL short-cuts a one-rank all-reduce before any profiler event, so the plugin counted none"
        if world == 1 else "the plugin counted no all-reduce (was the profiler plugin loaded? see the report)")
    return {"rows": rows, "comparable": comparable, "reason": reason,
            "all_within_goal": comparable and all(r["within_goal"] for r in rows),
            "counts_exact": comparable and all(r["calls_plugin"] == r["calls_job"] for r in rows)}


def _r(v, digits: int = 3):
    return None if v is None else round(v, digits)


def table(result: dict) -> str:
    lines = [f"{'group':7} {'mode':8} {'size':>9} {'calls job/plugin':>17} {'job µs':>9} {'plugin µs':>10} "
             f"{'ratio':>6}  ran"]
    for r in result["rows"]:
        lines.append(f"{r['group']:7} {r['mode']:8} {r['bytes']:>9} {r['calls_job']:>8}/{r['calls_plugin']:<8} "
                     f"{_fmt(r['job_median_us']):>9} {_fmt(r['plugin_median_us']):>10} {_fmt(r['ratio']):>6}  "
                     f"{', '.join(r['ran']) or '-'}")
    if not result["comparable"]:
        lines.append(f"nothing to compare: {result['reason']}")
    else:
        lines.append(f"medians within {GOAL:.0%}: {'yes' if result['all_within_goal'] else 'NO'}; "
                     f"counts exact: {'yes' if result['counts_exact'] else 'NO'}")
    return "\n".join(lines)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def _options(ap) -> None:
    ap.add_argument("--replays", type=int, default=200, help="replays of each decode graph")
    ap.add_argument("--iters", type=int, default=200, help="eager calls per verify size")


def _measure(a, n: int) -> int:
    work = Path(tempfile.mkdtemp(prefix="ncclprobe-mgpu-"))
    log, jobdir = work / "log", work / "job"
    run = [sys.executable, "-m", "ncclprobe", "run", "--gpu-timing", "--dir", str(log), "--",
           *mg.torchrun(n, Path(__file__).resolve(), ["--job", str(jobdir), "--replays", str(a.replays),
                                                       "--iters", str(a.iters)])]
    p = subprocess.run(run, env=mg.job_env(), capture_output=True, text=True, timeout=1800)
    if p.returncode not in (0, 1):  # 1: the report has error-level findings; the job itself ran
        print(p.stdout[-4000:] + p.stderr[-4000:], file=sys.stderr)
        print(f"the job failed (exit {p.returncode}); logs in {work}", file=sys.stderr)
        return 1
    rep = subprocess.run([sys.executable, "-m", "ncclprobe", "report", str(log), "--json"], capture_output=True,
                         text=True, timeout=600)
    report = json.loads(rep.stdout)
    ranks = [json.loads(f.read_text()) for f in sorted(jobdir.glob("rank*.json"))]
    result = compare(report, ranks, a.replays, a.iters)
    info = mg.machine()
    print(f"# {info['gpus']} x {info['gpu']} (driver {info['driver']}), torch {info['torch']}, NCCL {info['nccl']}; "
          f"{n} rank(s), replays {a.replays}, eager calls {a.iters}; log directory {log}")
    print(table(result))
    time_lines = [t for t in (report.get("verdict") or {}).get("time") or []]
    if a.out:
        mg.write_json(a.out, {"machine": info, "ranks": n, "replays": a.replays, "iters": a.iters, **result,
                              "verdict_time": time_lines})
    return 0 if result["comparable"] or n == 1 else 1


if __name__ == "__main__":
    sys.exit(mg.main(__doc__, _options, lambda a: job(a.job, a.replays, a.iters), _measure))
