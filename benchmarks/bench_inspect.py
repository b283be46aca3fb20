"""Cost of `inspect` on a live tree of N processes, against a baseline loop that only reads the same
/proc/<pid>/{stat,environ,maps} files in Python. Process start is excluded: the tree is started
once, then both are timed on it, alternating, and the medians compared (goal: ratio <= 1.3, issue 22).

Measures the installed ncclprobe (`pip install .`), else the source tree; it says which /proc reader
ran: the native one (native/procread.c, built at install; on Linux >= 6.11 it asks the kernel for
the mappings it needs instead of reading maps, NCCLPROBE_NATIVE_PROC=maps reads them anyway) or the
Python fallback (NCCLPROBE_NATIVE_PROC=0).

    python benchmarks/bench_inspect.py [--procs 256] [--repeat 7]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

try:
    import ncclprobe  # noqa: F401 - the installed package, with its built native parts
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ncclprobe.witnesses import elf, procread  # noqa: E402
from ncclprobe.commands.inspection import inspect_processes  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tree import children, start_tree  # noqa: E402

CHILD = "import sys, time; sys.stdout.write('x'); sys.stdout.flush(); time.sleep(600)"


def reader_used(pid: int) -> str:
    native = procread.native()
    if native is None:
        return "Python (libprocread.so not built, or NCCLPROBE_NATIVE_PROC=0)"
    flat, _ = native.tree("/proc", [pid])
    how = flat[procread.O_MAPS_HOW]
    return "native, mappings " + ("from PROCMAP_QUERY (Linux >= 6.11)" if how == procread.M_QUERY else "read from maps")


def ncclprobe_file() -> str:
    import ncclprobe
    return ncclprobe.__file__


def baseline(pids: list[int]) -> None:
    for pid in pids:
        for name in ("stat", "environ", "maps"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as fh:
                    fh.read()
            except OSError:
                pass


def tree_pids(root: int) -> list[int]:
    return [root, *children(root)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    env = {**os.environ, "NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
    parent = start_tree(args.procs, CHILD, env)
    try:
        pids = tree_pids(parent.pid)
        assert len(pids) == args.procs, f"expected {args.procs} processes, found {len(pids)}"
        base_t, insp_t = [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            baseline(pids)
            base_t.append(time.perf_counter() - t)
            elf.clear_cache()  # every run pays for its ELF reads, as a fresh `ncclprobe inspect` would
            t = time.perf_counter()
            res = inspect_processes([parent.pid], scope="all", expect={"NCCL_PROTO": "LL"},
                                    gpu_lookup=lambda: ({}, "benchmark: fds"))
            insp_t.append(time.perf_counter() - t)
            assert len(res.data["processes"]) == args.procs
        b, i = statistics.median(base_t), statistics.median(insp_t)
        print(f"processes            {args.procs}")
        print(f"/proc reader         {reader_used(parent.pid)}  [{Path(ncclprobe_file()).parent}]")
        print(f"baseline (read stat, environ, maps)  median {b * 1e3:8.1f} ms  "
              f"(range {min(base_t) * 1e3:.1f}-{max(base_t) * 1e3:.1f})")
        print(f"inspect_processes                    median {i * 1e3:8.1f} ms  "
              f"(range {min(insp_t) * 1e3:.1f}-{max(insp_t) * 1e3:.1f})")
        ratio = i / b
        print(f"ratio inspect/baseline               {ratio:8.2f}x  (goal <= 1.3x: {'ok' if ratio <= 1.3 else 'OVER'})")
        return 0
    finally:
        parent.kill()
        parent.wait()
        for pid in pids if "pids" in locals() else []:
            try:
                os.kill(pid, 9)
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
