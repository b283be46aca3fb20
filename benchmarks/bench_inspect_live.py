"""Cost of `inspect --live` on a live tree of N processes against `inspect` without it, on the same
tree, in the same run: each process's environment read from its memory (witnesses.livemem) on top
of the /proc view (issue 14: goal ratio <= 2). The children write os.environ after they start, so
each one's environ array and some of its strings are on its heap, as in a real server's workers.

Process start is excluded: the tree is started once, then both are timed on it, alternating, each
run with cold ELF caches (as a fresh `ncclprobe inspect` would be), and the medians compared.
Measures the installed ncclprobe (`pip install .`), else the source tree.

    python benchmarks/bench_inspect_live.py [--procs 256] [--repeat 7]
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

from ncclprobe.commands.inspection import inspect_processes  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tree import children, start_tree  # noqa: E402
from ncclprobe.witnesses import elf, livemem  # noqa: E402

CHILD = ("import os, sys, time; os.environ['NCCL_SET_IN_CHILD'] = '1'; {more}"
         "sys.stdout.write('x'); sys.stdout.flush(); time.sleep(600)")
# --violate: the children also change a value the inspection expects, so --live has a finding about
# every one of them to make (the plain inspection, blind to it, has none)
VIOLATE = "os.environ['NCCL_PROTO'] = 'Simple'; "


def timed(pid: int, live: bool, n: int) -> float:
    elf.clear_cache()
    livemem.clear_cache()
    t = time.perf_counter()
    res = inspect_processes([pid], scope="all", expect={"NCCL_PROTO": "LL"}, live=live,
                            gpu_lookup=lambda: ({}, "benchmark: fds"))
    took = time.perf_counter() - t
    assert len(res.data["processes"]) == n
    if live:
        assert res.data["live"]["read"] == n, res.data["live"]
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--violate", action="store_true", help="children also break the expectation NCCL_PROTO=LL")
    args = ap.parse_args()
    env = {**os.environ, "NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
    child = CHILD.format(more=VIOLATE if args.violate else "")
    parent = start_tree(args.procs, child, env)
    try:
        plain, live = [], []
        for _ in range(args.repeat):
            plain.append(timed(parent.pid, False, args.procs))
            live.append(timed(parent.pid, True, args.procs))
        res = inspect_processes([parent.pid], scope="all", live=True, gpu_lookup=lambda: ({}, "benchmark: fds"))
        summary = res.data["live"]
        p, v = statistics.median(plain), statistics.median(live)
        print(f"processes            {args.procs}  [{Path(ncclprobe.__file__).parent}]"
              + ("  (children break the expectation)" if args.violate else ""))
        print(f"live read            {'native (native/livemem.c)' if livemem.Reading().native else 'Python'}; "
              f"findings {len(res.findings)}")
        print(f"inspect              median {p * 1e3:8.1f} ms  (range {min(plain) * 1e3:.1f}-{max(plain) * 1e3:.1f})")
        print(f"inspect --live       median {v * 1e3:8.1f} ms  (range {min(live) * 1e3:.1f}-{max(live) * 1e3:.1f})")
        print(f"per process (live)   {(v - p) / args.procs * 1e6:8.1f} us  ({summary['bytes_read'] / args.procs:.0f} bytes "
              f"read, {summary['retries']} torn reads retried in the last run)")
        ratio = v / p
        print(f"ratio live/plain     {ratio:8.2f}x  (goal <= 2x: {'ok' if ratio <= 2 else 'OVER'})")
        return 0
    finally:
        kids = children(parent.pid)  # before the parent goes: then they are init's
        parent.kill()
        parent.wait()
        for pid in kids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
