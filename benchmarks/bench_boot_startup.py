"""Start-up cost of the boot probe: `python -c pass` in a venv with the persistent probe installed,
against the same in an identical venv without it (and, for reference, the ephemeral wiring).

Runs alternate between the interpreters so that drift (CPU frequency, page cache) hits both alike.
Each run is measured twice: wall time, and the child's CPU time (user + system, from wait4), which a
busy machine disturbs much less. The verdict is the ratio of median wall times. Goal: persistent <= 1.10x.

With --instructions (needs valgrind), each case also runs once under callgrind with a fixed hash seed:
its user-space instruction count is the same from run to run whatever the machine's load, so a change
of a fraction of a percent shows (the kernel's share, e.g. creating the log file, is not counted).

Each case also reports how many young-generation garbage collections its start-up ran: the objects the
probe keeps count towards the next one, and a bare start ends ~100 objects short of it, so a probe that
keeps too many costs a whole extra collection (~100 us).

    python benchmarks/bench_boot_startup.py [--runs 300] [--instructions] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ncclprobe.commands import inject, profile  # the installed package (its boot probe is built at install)

GOAL = 1.10


def _venv(path: Path) -> str:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return str(path / "bin" / "python")


def _time_once(python: str, env: dict[str, str]) -> tuple[float, float]:
    """(wall, cpu) seconds of one `python -c pass`."""
    t0 = time.perf_counter()
    pid = os.posix_spawn(python, [python, "-c", "pass"], env)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{python} -c pass failed")
    return wall, usage.ru_utime + usage.ru_stime


def _instructions(python: str, env: dict[str, str], tmp: Path) -> int | None:
    """User-space instructions of one `python -c pass` under callgrind (hash seed fixed: repeatable)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    out = subprocess.run([valgrind, "--tool=callgrind", f"--callgrind-out-file={tmp / 'callgrind.out'}",
                          python, "-c", "pass"], env={**env, "PYTHONHASHSEED": "0"},
                         capture_output=True, text=True)
    m = re.search(r"Collected : (\d+)", out.stderr)
    return int(m.group(1)) if out.returncode == 0 and m else None


def _gc_collections(python: str, env: dict[str, str]) -> int | None:
    """Young-generation collections run by the start-up of `python` (up to the -c code)."""
    out = subprocess.run([python, "-c", "import gc, sys; sys.stdout.write(str(gc.get_stats()[0]['collections']))"],
                         env=env, capture_output=True, text=True)
    return int(out.stdout) if out.returncode == 0 and out.stdout.isdigit() else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300, help="timed runs per case")
    ap.add_argument("--instructions", action="store_true",
                    help="also count each case's instructions under valgrind's callgrind (repeatable)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("NCCLPROBE_") and k != "PYTHONPATH"}
    with tempfile.TemporaryDirectory(prefix="ncclprobe-bench-") as tmp:
        tmp = Path(tmp)
        plain, probed = _venv(tmp / "plain"), _venv(tmp / "probed")
        prof = profile.from_cli(["NCCL_PROTO=LL"], ["NCCL_ALGO=Ring"], ["NCCL_PROTO"])
        inject.install(probed, profile=prof, log_dir=tmp / "log-persistent")
        eph_env = {**base_env, **inject.ephemeral_env(base_env, tmp / "log-ephemeral", prof)}
        cases = {"baseline": (plain, base_env), "persistent": (probed, base_env), "ephemeral": (plain, eph_env)}
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for name, (py, env) in cases.items():  # warm-up: page cache, .pyc files
            for _ in range(5):
                _time_once(py, env)
        for _ in range(args.runs):
            for name, (py, env) in cases.items():
                times[name].append(_time_once(py, env))
        files = len(list((tmp / "log-persistent").glob("*.jsonl")))
        gcs = {name: _gc_collections(py, env) for name, (py, env) in cases.items()}
        instr = {name: _instructions(py, env, tmp) for name, (py, env) in cases.items()} if args.instructions else {}
    med = {name: statistics.median(w for w, _ in v) for name, v in times.items()}
    # the middle half of the runs (25th-75th percentile), to judge a ratio on a noisy machine
    iqr = {name: [q for q in statistics.quantiles([w for w, _ in v], n=4)[::2]] for name, v in times.items()}
    cpu = {name: statistics.median(c for _, c in v) for name, v in times.items()}
    ratio = {name: med[name] / med["baseline"] for name in med}
    cpu_ratio = {name: cpu[name] / cpu["baseline"] for name in cpu}
    out = {"runs": args.runs, "median_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
           "p25_p75_ms": {k: [round(q * 1e3, 3) for q in v] for k, v in iqr.items()},
           "ratio": {k: round(v, 3) for k, v in ratio.items()},
           "cpu_median_ms": {k: round(v * 1e3, 3) for k, v in cpu.items()},
           "cpu_ratio": {k: round(v, 3) for k, v in cpu_ratio.items()}, "goal": GOAL,
           "ok": ratio["persistent"] <= GOAL, "persistent_log_files": files, "gc_collections": gcs,
           "load": os.getloadavg()}
    if instr:
        out["instructions"] = instr
        if instr.get("baseline") and None not in instr.values():
            out["instructions_ratio"] = {k: round(v / instr["baseline"], 4) for k, v in instr.items()}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"python -c pass, median of {args.runs} runs each (alternating); load {os.getloadavg()[0]:.2f}")
        print(f"  {'case':<11} {'wall':>9} {'ratio':>7} {'cpu':>9} {'ratio':>7}   wall p25-p75")
        for name in cases:
            print(f"  {name:<11} {med[name] * 1e3:6.2f} ms {ratio[name]:6.3f}x {cpu[name] * 1e3:6.2f} ms "
                  f"{cpu_ratio[name]:6.3f}x   {iqr[name][0] * 1e3:.2f}-{iqr[name][1] * 1e3:.2f} ms")
        print("  young-generation collections at start-up: " + ", ".join(f"{k} {v}" for k, v in gcs.items()))
        if instr:
            print("  instructions (callgrind, PYTHONHASHSEED=0): " + ", ".join(
                f"{k} {v / 1e6:.2f}M" + (f" ({out['instructions_ratio'][k]:.3f}x)" if "instructions_ratio" in out else "")
                if v is not None else f"{k} n/a" for k, v in instr.items()))
        verdict = "ok" if out["ok"] else "OVER"
        print(f"persistent / baseline = {ratio['persistent']:.3f}x wall, {cpu_ratio['persistent']:.3f}x cpu "
              f"(goal <= {GOAL:.2f}x): {verdict}")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
