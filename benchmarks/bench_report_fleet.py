"""`report` of a fleet against a plain `json.loads` of every line of the same files, in the same run.

The logs are benchmarks/fleetgen.py's: one job of --hosts hosts × 8 ranks (real demo lines rewritten),
one directory per host. Prints the baseline, the report's time (load, rules, rendering) and their
ratio; with --scale N also the report of N hosts and its time against the first. Each time is the
least of --repeat runs (3), the baseline's as the report's: this machine's noise only ever adds. The
runs take turns (baseline, report, the larger report; again), so that a slow stretch of the machine
falls on each of them alike, not on the one that ran in it.
Each run is timed in a process of its own, as `ncclprobe report` runs (after a report of two hosts,
so that imports and first calls are not timed): in one long-lived process every run after the first
finds the heap the earlier ones left (and the larger fleet's generation), which no report a user
runs ever finds. --in-process times them all here instead.

    python benchmarks/bench_report_fleet.py [--hosts 256] [--scale 1024] [--repeat 3] [--in-process] [--profile]
"""
from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleetgen  # noqa: E402


def baseline(dirs) -> tuple[float, int]:
    t0, n = time.perf_counter(), 0
    for d in dirs:
        for f in sorted(Path(d).glob("*.jsonl")):
            with open(f, "rb") as fh:
                for line in fh:
                    json.loads(line)
                    n += 1
    return time.perf_counter() - t0, n


def report_time(dirs) -> float:
    from ncclprobe import render
    from ncclprobe.commands import report
    t0 = time.perf_counter()
    result = report.build_report([str(d) for d in dirs])
    render.render_text(result, io.StringIO(), width=100, color=False)
    return time.perf_counter() - t0


def fresh(what: str, dirs) -> float:
    """The time of baseline ("json") or report_time ("report") of dirs, in a new process."""
    out = subprocess.run([sys.executable, __file__, "--child", what, *map(str, dirs)], capture_output=True,
                         text=True, check=True)
    return float(out.stdout.split()[-1])


def child(what: str, dirs: list[str]) -> None:
    if what == "json":
        print(baseline(dirs)[0])
        return
    report_time(dirs[:2])  # imports and first calls, untimed
    print(report_time(dirs))


def main(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=256)
    ap.add_argument("--scale", type=int, default=0, help="also this many hosts: their time against --hosts'")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each timing; the least is kept (default 3)")
    ap.add_argument("--in-process", action="store_true", help="time every run in this process")
    ap.add_argument("--profile", action="store_true", help="cProfile the report (top 25 by cumulative time)")
    a = ap.parse_args(argv)
    here = a.in_process or a.profile
    with tempfile.TemporaryDirectory() as tmp:
        dirs = fleetgen.job(Path(tmp) / "a", a.hosts)
        report_time(dirs[:2])  # imports, once
        lines = sum(f.read_bytes().count(b"\n") for d in dirs for f in Path(d).glob("*.jsonl"))
        big = fleetgen.job(Path(tmp) / "b", a.scale) if a.scale else None
        if a.profile:
            import cProfile
            import pstats
            prof = cProfile.Profile()
            prof.enable()
            report_time(dirs)
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        bases, times, bigs = [], [], []
        for _ in range(max(1, a.repeat)):  # in turn: each timing sees the same stretches of this machine's noise
            bases.append(baseline(dirs)[0] if here else fresh("json", dirs))
            times.append(report_time(dirs) if here else fresh("report", dirs))
            if big is not None:
                bigs.append(report_time(big) if here else fresh("report", big))
        base, t = min(bases), min(times)
        print(f"{a.hosts} hosts × 8 ranks: {lines} lines; json.loads {base:.2f} s; report {t:.2f} s; "
              f"ratio {t / base:.2f} (budget 5; {'one process' if here else 'a process a run'})")
        if big is not None:
            t2 = min(bigs)
            print(f"{a.scale} hosts: report {t2:.2f} s; {t2 / t:.2f}× the {a.hosts}-host time "
                  f"(hosts ×{a.scale / a.hosts:g}; budget 4.5×)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
