"""Cost of ncclprobe's env plugin per variable read, against a plain getenv in the same run.

NCCL 2.30.7 with the efficiency CTA policy reads NCCL_ALGO and NCCL_PROTO through ncclGetEnv (so
through the env plugin) on every collective (src/enqueue.cc). tests/c/env_driver.c `bench` loads
the plugin as NCCL does and times getEnv("NCCL_ALGO") through it and getenv("NCCL_ALGO") directly,
interleaved, best of 5 rounds each; a run is repeated and the median taken. Logging on (the value
is logged once, then every read is a repeat), and silent (no NCCLPROBE_DIR).
Goal: a repeated read within a small constant of getenv (no syscall, lock or loader call).
Printed, never asserted.

    python benchmarks/probe_envplugin_cost.py [--n 1000000] [--repeat 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "c"))
import probe_support as ps  # noqa: E402


def read_ns(driver: Path, lib: Path, n: int, env: dict[str, str]) -> tuple[float, float]:
    r = ps.run([driver, lib, "bench", n], env, timeout=600)
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    fields = dict(kv.split("=", 1) for kv in r.stdout.split() if "=" in kv)
    return float(fields["plugin_ns"]), float(fields["getenv_ns"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="reads per timed round")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        lib = ps.build_probe(d)
        driver = ps.build_env_driver(d)
        print(f"env plugin getEnv vs plain getenv, {args.n} reads x best of 5 rounds, median of {args.repeat} runs")
        for label, value, log in [("NCCL_ALGO set, logging", "Ring", True), ("NCCL_ALGO unset, logging", None, True),
                                  ("NCCL_ALGO set, silent", "Ring", False)]:
            extra = {"NCCL_ALGO": value} if value is not None else {}
            plugin, plain = [], []
            for i in range(args.repeat):
                p, g = read_ns(driver, lib, args.n, ps.probe_env(d / f"log-{i}" if log else None, None, **extra))
                plugin.append(p)
                plain.append(g)
            p, g = statistics.median(plugin), statistics.median(plain)
            print(f"  {label:26s} plugin {p:7.1f} ns   getenv {g:7.1f} ns   added {p - g:6.1f} ns   ratio {p / g:.2f}")


if __name__ == "__main__":
    main()
