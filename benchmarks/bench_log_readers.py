"""How `report`'s cost grows with its input (issue 21): each case builds a small and a large input (the large
one a known multiple of the small), runs `report` on each in a fresh interpreter and prints CPU seconds,
wall seconds, peak RSS and the ratio large/small. A linear reader gives a ratio near the multiple; a
quadratic one its square.

  nccl_init   an NCCL INFO log of 4,000 then 32,000 Init lines (2,000 / 16,000 processes, one communicator
              each): ratio ~8, was ~64 (632 s for 32,000)
  nccl_comms  the same with 125 / 1,000 processes of 16 communicators each
  one_proc    one process creating 1,000 / 8,000 communicators (comm_init, env read, profiler init, a flush)
  events      4 processes writing N / 4N ordinary lines (collective flushes, env reads, activity): ratio ~4
  files       1,000 / 4,000 one-line files: the cost of one more file (RSS KiB, CPU ms), and what the
              reader's cap (events.FILES_MAX) allows for
  files1m     1,000,000 one-line files (under /dev/shm): refused at once past the cap (time, RSS)
  sparse      a 20 GB sparse file beside a normal one

    python benchmarks/bench_log_readers.py [--cases nccl_init,events,...] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import logsynth  # noqa: E402

MEASURE = r"""
import json, resource, sys, time
from ncclprobe.commands import report
from ncclprobe.doc import Unexaminable
args = json.loads(sys.argv[1])
t0 = time.perf_counter()
try:
    report.build_report(args["dirs"], nccl_logs=args["logs"])
    error = None
except Unexaminable as exc:
    error = exc.reason
use = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": use.ru_utime + use.ru_stime,
                  "rss_mib": use.ru_maxrss / 1024, "error": error}))
"""


def run_report(dirs=(), logs=()) -> dict:
    arg = json.dumps({"dirs": [str(d) for d in dirs], "logs": [str(f) for f in logs]})
    out = subprocess.run([sys.executable, "-c", MEASURE, arg], capture_output=True, text=True, check=True,
                         cwd=tempfile.gettempdir())  # the installed package, not the source tree
    return json.loads(out.stdout)


# case -> (small input, large input, the multiple); an input is a function of a scratch directory that
# builds it and returns (dirs, logs, what it is)
def _nccl(procs: int, comms: int):
    def build(tmp: Path):
        n = logsynth.nccl_init_log(tmp / "nccl.log", procs, comms)
        return [], [tmp / "nccl.log"], f"{n} Init lines ({procs} x {comms})"
    return build


def _one_proc(comms: int):
    def build(tmp: Path):
        n = logsynth.comm_events_dir(tmp / "logs", 1, comms)
        return [tmp / "logs"], [], f"{n} lines, 1 process x {comms} communicators"
    return build


def _events(lines_each: int):
    def build(tmp: Path):
        n = logsynth.event_dir(tmp / "logs", 4, lines_each)
        return [tmp / "logs"], [], f"{n} lines, 4 processes"
    return build


def _files(n: int, where: str | None = None):
    def build(tmp: Path):
        d = Path(where) / f"ncclprobe-bench-{os.getpid()}" if where else tmp / "logs"
        logsynth.one_line_files(d, n)
        return [d], [], f"{n} one-line files"
    return build


def _sparse(tmp: Path):
    d = tmp / "logs"
    d.mkdir(mode=0o700)
    (d / "h-1.jsonl").write_bytes(logsynth.ordinary_events(1, 100))
    with open(d / "h-2.jsonl", "wb") as fh:
        fh.write(logsynth.ordinary_events(2, 100))
        fh.truncate(20 << 30)
    return [d], [], "a 20 GB sparse file and a normal one"


CASES = {
    "nccl_init": (_nccl(2_000, 1), _nccl(16_000, 1), 8),
    "nccl_comms": (_nccl(125, 16), _nccl(1_000, 16), 8),
    "one_proc": (_one_proc(1_000), _one_proc(8_000), 8),
    "events": (_events(25_000), _events(100_000), 4),
    "files": (_files(1_000), _files(4_000), 4),
    "files1m": (None, _files(1_000_000, "/dev/shm"), None),
    "sparse": (None, _sparse, None),
}


def measure(build) -> dict:
    with tempfile.TemporaryDirectory(prefix="ncclprobe-bench-") as tmp:
        dirs, logs, what = build(Path(tmp))
        try:
            return {"input": what, **run_report(dirs, logs)}
        finally:
            for d in dirs:
                if str(d).startswith("/dev/shm/"):
                    shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for name in args.cases.split(","):
        small_build, large_build, multiple = CASES[name]
        small = measure(small_build) if small_build else None
        large = measure(large_build)
        row = {"case": name, "small": small, "large": large, "multiple": multiple,
               "cpu_ratio": large["cpu_s"] / small["cpu_s"] if small else None}
        if name == "files" and small:
            n_small, n_large = 1_000, 4_000
            row["per_file_kib"] = (large["rss_mib"] - small["rss_mib"]) * 1024 / (n_large - n_small)
            row["per_file_cpu_ms"] = (large["cpu_s"] - small["cpu_s"]) * 1000 / (n_large - n_small)
        rows.append(row)
        if not args.json:
            _print(row)
    if args.json:
        print(json.dumps(rows, indent=2))


def _print(row: dict) -> None:
    def one(r):
        err = f", refused ({r['error']})" if r["error"] else ""
        return f"{r['input']}: {r['cpu_s']:.2f} CPU s, {r['wall_s']:.2f} s, {r['rss_mib']:.0f} MiB{err}"
    print(f"{row['case']}:")
    if row["small"]:
        print(f"  small  {one(row['small'])}")
    print(f"  large  {one(row['large'])}")
    if row["cpu_ratio"] is not None:
        print(f"  CPU ratio large/small {row['cpu_ratio']:.1f} (input x{row['multiple']}: linear ~{row['multiple']}, "
              f"quadratic ~{row['multiple'] ** 2})")
    if "per_file_kib" in row:
        print(f"  one more file: {row['per_file_kib']:.1f} KiB, {row['per_file_cpu_ms']:.2f} CPU ms")


if __name__ == "__main__":
    main()
