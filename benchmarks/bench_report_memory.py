"""Peak memory of `report` on a large event log, as ratios: against the log's size, and against a
baseline of reading the same bytes line by line in a fresh interpreter of the same run. The log is a
few processes whose collectives flush often (coll_summary) and whose env plugin logs many reads, so the
model stays small while the file grows: memory should follow the model, not the file.

    python benchmarks/bench_report_memory.py [--mb 200]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

BASELINE = """
import resource, sys
for line in open(sys.argv[1], "rb"):
    pass
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
REPORT = """
import resource, sys
from ncclprobe.commands import report
report.build_report([sys.argv[1]])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def write_log(path: Path, size: int) -> int:
    """Events of 4 processes in time order until the file holds `size` bytes; returns its size."""
    lib = "/opt/nccl/lib/libnccl.so.2"
    head = [{"ev": "process_start", "src": "boot", "ppid": 1, "argv": ["python", "train.py"], "exe": "/usr/bin/python3",
             "env": {"NCCL_PROTO": "LL"}},
            {"ev": "comm_init", "src": "preload", "api": "ncclCommInitRank", "call": 1, "comm": "0x000000000000abcd",
             "nranks": 4, "rank": 0, "env": {"NCCL_PROTO": "LL"}, "rc": 0, "lib": lib, "version": 22809, "ms": 1.0},
            {"ev": "comm_plugin_init", "src": "profiler", "comm_hash": "0x00000000000000ff", "nranks": 4, "rank": 0,
             "lib": lib, "call": 1}]
    body = [{"ev": "coll_summary", "src": "profiler", "comm_hash": "0x00000000000000ff", "func": "AllReduce",
             "algo": "Ring", "proto": "LL", "nchannels": 2, "bytes_min": 8, "bytes_max": 1 << 20, "count": 7,
             "rank": 0, "reason": "periodic"},
            {"ev": "nccl_getenv", "src": "envplugin", "var": "NCCL_PROTO", "value": "LL", "lib": lib}]
    t, written = 1.7e9, 0
    with open(path, "w") as fh:
        for e in head:
            for pid in range(4):
                t += 1e-6
                written += fh.write(json.dumps({"t": t, "host": "h", "pid": 100 + pid, **e}) + "\n")
        while written < size:
            block = []
            for _ in range(1000):
                for e in body:
                    t += 1e-6
                    block.append(json.dumps({"t": t, "host": "h", "pid": 100 + int(t * 1e6) % 4, **e}))
            written += fh.write("\n".join(block) + "\n")
    return written


def peak_kib(code: str, arg: Path) -> int:
    # cwd: not the source tree, which `-c` would put first on sys.path (the installed package is measured)
    out = subprocess.run([sys.executable, "-c", code, str(arg)], capture_output=True, text=True, check=True,
                         cwd=tempfile.gettempdir())
    return int(out.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200, help="size of the generated log, MiB")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ncclprobe-bench-") as tmp:
        log = Path(tmp) / "h-100.jsonl"
        size = write_log(log, args.mb << 20)
        base = peak_kib(BASELINE, log)
        rep = peak_kib(REPORT, Path(tmp))
    mib = size / (1 << 20)
    print(f"log {mib:.0f} MiB; peak RSS: line-by-line read {base / 1024:.0f} MiB, report {rep / 1024:.0f} MiB")
    print(f"report / log size = {rep / 1024 / mib:.2f}; report / line-by-line baseline = {rep / base:.2f}")


if __name__ == "__main__":
    main()
