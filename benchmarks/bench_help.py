"""`ncclprobe --help` as a whole process, against `python -c pass`, measured alternately in one run
(goal: ratio <= 4). With --why, also lists the slowest imports of the --help path (-X importtime).

    python benchmarks/bench_help.py [--repeat 15] [--why]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def slowest_imports(top: int = 12) -> list[tuple[int, str]]:
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "ncclprobe", "--help"],
                       capture_output=True, text=True)
    rows = []
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = (x.strip() for x in line[len("import time:"):].split("|"))
            if cumulative.isdigit():
                rows.append((int(cumulative), name))
    return sorted(rows, reverse=True)[:top]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--why", action="store_true", help="also list the slowest imports")
    args = ap.parse_args()
    base_cmd = [sys.executable, "-c", "pass"]
    help_cmd = [sys.executable, "-m", "ncclprobe", "--help"]
    timed(base_cmd), timed(help_cmd)  # warm the page cache
    base, helps = [], []
    for _ in range(args.repeat):
        base.append(timed(base_cmd))
        helps.append(timed(help_cmd))
    b, h = statistics.median(base), statistics.median(helps)
    ratio = h / b
    print(f"python -c pass        median {b * 1e3:7.1f} ms")
    print(f"ncclprobe --help      median {h * 1e3:7.1f} ms")
    print(f"ratio                        {ratio:7.2f}x  (goal <= 4x: {'ok' if ratio <= 4 else 'OVER'})")
    if args.why or ratio > 4:
        print("slowest imports on the --help path (cumulative µs):")
        for us, name in slowest_imports():
            print(f"  {us:8d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
