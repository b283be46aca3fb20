"""Cost the preload hook adds to a communicator init (and its destroy), on the fake NCCL.

tests/c/nccl_app.c `bench` times ncclCommInitRank + ncclCommDestroy pairs; run with the probe
preloaded and logging (NCCLPROBE_DIR set: every call writes its event line) and without, in the
same run. Each pair crosses two hooks, so the added time per pair bounds the added time per init.
Goal: at most 50 us added per init. Printed, never asserted.

    python benchmarks/probe_init_cost.py [--n 20000] [--repeat 5]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "c"))
import probe_support as ps  # noqa: E402


def pair_ns(app: Path, n: int, env: dict[str, str]) -> float:
    r = ps.run([app, "bench", n], env, timeout=600)
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    return float(r.stdout.split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000, help="init+destroy pairs per run")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        probe = ps.build_probe(d)
        ps.build_fake_nccl(d / "nccl")
        app = ps.build_app(d, d / "nccl")
        base, hooked, silent = [], [], []
        for i in range(args.repeat):
            base.append(pair_ns(app, args.n, ps.probe_env(None)))
            log = d / f"log-{i}"
            hooked.append(pair_ns(app, args.n, ps.probe_env(log, probe)))
            shutil.rmtree(log, ignore_errors=True)
            silent.append(pair_ns(app, args.n, ps.probe_env(None, probe)))
        b, h, s = (statistics.median(x) for x in (base, hooked, silent))
        print(f"ncclCommInitRank+ncclCommDestroy on the fake NCCL, {args.n} pairs x {args.repeat} runs (median)")
        print(f"  no preload                 {b / 1000:8.2f} us per pair")
        print(f"  preload, NCCLPROBE_DIR set {h / 1000:8.2f} us per pair   added {(h - b) / 1000:6.2f} us"
              f"   ratio {h / b:.1f}")
        print(f"  preload, silent            {s / 1000:8.2f} us per pair   added {(s - b) / 1000:6.2f} us")
        print("  (goal: <= 50 us added per init; a pair is two hooked calls)")


if __name__ == "__main__":
    main()
