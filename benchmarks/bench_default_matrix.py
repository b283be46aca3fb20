"""End-to-end wall time of the default bench matrix: on NCCL defaults + LL, LL128, Simple + Ring, Tree
(six configurations, each a fresh worker set; 1 KB .. 64 MB, eager and graph), goal on one GPU <= 60 s;
on gloo NCCL's defaults alone (NCCL variables cannot change gloo, so that is bench's default there).

    python benchmarks/bench_default_matrix.py              # ncclprobe bench --gpus 1
    python benchmarks/bench_default_matrix.py --gloo       # CPU/gloo fallback (2 ranks), labelled

The wall time is that of the whole `ncclprobe bench ... --json` command, as a user runs it (its rows
stream to stderr, captured here); the per-configuration seconds come from its JSON.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

GOAL_S = 60.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gloo", action="store_true", help="CPU/gloo fallback, 2 ranks (not GPU numbers)")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("extra", nargs="*", help="more ncclprobe bench arguments (after --)")
    args = ap.parse_args()
    target = ["--backend", "gloo", "--ranks", "2"] if args.gloo else ["--gpus", str(args.gpus)]
    cmd = [sys.executable, "-m", "ncclprobe", "bench", *target, "--json", *args.extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        print(proc.stderr[-4000:], file=sys.stderr)
        print(f"ncclprobe bench failed with exit code {proc.returncode}", file=sys.stderr)
        return 1
    data = json.loads(proc.stdout)
    label = "CPU/gloo (fallback: not GPU numbers)" if args.gloo else f"GPU/NCCL on {data.get('device')}"
    print(f"default matrix ({len(data['configs'])} configuration(s)), {data['nranks']} rank(s), {label}: "
          f"{' '.join(cmd[3:])}")
    for c in data["configs"]:
        print(f"  {c['name']:<14} {c['status']:<6} {c['seconds']:7.2f} s")
    goal = "met" if wall <= GOAL_S else "NOT met"
    print(f"wall time {wall:.1f} s (goal <= {GOAL_S:.0f} s on one GPU): {goal}")
    out = Path(__file__).parent / "results" / f"default_matrix-{'gloo' if args.gloo else 'gpu'}.json"
    out.write_text(json.dumps({"label": label, "command": cmd[3:], "wall_s": wall, "goal_s": GOAL_S,
                               "configs": [{k: c[k] for k in ("name", "status", "seconds")}
                                           for c in data["configs"]]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
