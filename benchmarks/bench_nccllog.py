"""Cost of reading NCCL INFO logs (`ncclprobe.witnesses.nccllog.parse_files`, what `report --nccl-log` and the
automatic merge of a log directory's `nccl-debug*` files run), per MB and as a ratio against a baseline
measured in the same run on the same bytes: a plain `for line in open(path, "rb"): pass`.

Cases: a normal multi-process log (Init, env, channel and TUNING lines in NCCL 2.28 formats), and
hostile inputs: single long lines without an NCCL header (the shape that made the old parser
quadratic), many 8k-character lines, a long line full of `host:pid:tid`-like fragments, and one huge
line without a newline. Each case runs in a fresh interpreter, so its peak RSS is its own; the
baseline of the huge line reads it whole (that is what `for line in f` does), the parser must not.
Each figure is the best of three runs (of one, where the parser takes over 10 s).

    python benchmarks/bench_nccllog.py [--mb 20] [--json] [--cases normal,long40k,...]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_NORMAL = [
    "{h}:{p}:{p} [0] NCCL INFO NCCL version 2.28.9+cuda13.0",
    "{h}:{p}:{p} [0] NCCL INFO ncclCommInitRankConfig comm 0x55e8a016c8a0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 "
    "busId 1000 commId 0x764413d93a78d6c7 - Init START",
    "{h}:{p}:{p} [0] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 16.",
    "{h}:{p}:{p} [0] NCCL INFO comm 0x55e8a016c8a0 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0",
    "{h}:{p}:{p} [0] NCCL INFO NCCL_PROTO set by environment to LL",
    "{h}:{p}:{p} [0] NCCL INFO Channel 00/16 : 0 1",
    "{h}:{p}:{p} [0] NCCL INFO Trees [0] -1/-1/-1->0->1 [1] -1/-1/-1->0->1 [2] -1/-1/-1->0->1 [3] -1/-1/-1->0->1",
    "{h}:{p}:{p} [0] NCCL INFO 16 coll channels, 16 collnet channels, 0 nvls channels, 16 p2p channels, "
    "2 p2p channels per peer",
    "{h}:{p}:{p} [0] NCCL INFO ncclCommInitRankConfig comm 0x55e8a016c8a0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 "
    "busId 1000 commId 0x764413d93a78d6c7 - Init COMPLETE",
] + ["{h}:{p}:{p} [0] NCCL INFO AllReduce: 14336 Bytes -> Algo RING proto LL channel{{Lo..Hi}}={{0..15}}"] * 20 + [
    "{h}:{p}:{p} [0] NCCL INFO comm 0x55e8a016c8a0 rank 0 nranks 2 cudaDev 0 busId 1000 - Destroy COMPLETE",
]


def _write(case: str, path: Path, mb: float) -> None:
    target = int(mb * (1 << 20))
    with open(path, "wb") as f:
        if case == "normal":
            n, pid = 0, 1000
            while n < target:
                block = "\n".join(line.format(h="gpu-node-7", p=pid) for line in _NORMAL).encode() + b"\n"
                f.write(block)
                n += len(block)
                pid += 1
        elif case.startswith("long"):            # one line, no header: long10k, long20k, long40k
            f.write(b"x" * (int(case[4:-1]) * 1000) + b"\n")
        elif case == "lines8k":                  # 200 header-less lines of 8k characters
            f.write((b"a" * 8000 + b"\n") * 200)
        elif case == "fragments":                # 40k characters of "a:1:1 " almost-headers
            f.write(b"a:1:1 " * 6700 + b"\n")
        elif case == "huge":                     # mb MB without a newline
            chunk = b"y" * (1 << 20)
            for _ in range(int(mb)):
                f.write(chunk)


def _measure(case: str, path: str) -> dict:
    """Runs in a child interpreter: times the baseline then the parser on the same file."""
    size = os.path.getsize(path)
    if case == "baseline":
        t0 = time.perf_counter()
        with open(path, "rb") as f:
            for _ in f:
                pass
        dt = time.perf_counter() - t0
    else:
        from ncclprobe.witnesses import nccllog
        t0 = time.perf_counter()
        log = nccllog.parse_files([path])
        dt = time.perf_counter() - t0
        assert log.files == [path]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"bytes": size, "seconds": dt, "max_rss_mb": rss}


def _child(case: str, path: str, timeout: float) -> dict | None:
    try:
        r = subprocess.run([sys.executable, __file__, "--child", case, path], capture_output=True, text=True,
                           timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        return None
    return json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=20.0, help="size of the normal log and of the huge line")
    ap.add_argument("--cases", default="normal,long10k,long20k,long40k,lines8k,fragments,huge")
    ap.add_argument("--timeout", type=float, default=300.0, help="per measurement; a case over it is reported as such")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_measure(*args.child)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            path = Path(tmp) / f"{case}.log"
            _write(case, path, args.mb)
            base = min((_child("baseline", str(path), args.timeout) for _ in range(3)), key=lambda r: r["seconds"])
            parsed = _child("parse", str(path), args.timeout)
            if parsed and parsed["seconds"] < 10:   # short runs: the best of three, as for the baseline
                parsed = min([parsed] + [_child("parse", str(path), args.timeout) for _ in range(2)],
                             key=lambda r: r["seconds"])
            mb = base["bytes"] / (1 << 20)
            row = {"case": case, "mb": round(mb, 3), "baseline_s": base["seconds"],
                   "parse_s": parsed["seconds"] if parsed else None,
                   "parse_s_per_mb": parsed["seconds"] / mb if parsed else None,
                   "ratio": parsed["seconds"] / base["seconds"] if parsed and base["seconds"] else None,
                   "baseline_rss_mb": base["max_rss_mb"], "parse_rss_mb": parsed["max_rss_mb"] if parsed else None}
            rows.append(row)
            path.unlink()
    if args.json:
        print(json.dumps({"timeout_s": args.timeout, "rows": rows}, indent=2))
        return
    print(f"{'case':<10} {'MB':>8} {'baseline s':>11} {'parse s':>9} {'s/MB':>8} {'ratio':>9} {'RSS MB':>7} {'base RSS':>8}")
    for r in rows:
        if r["parse_s"] is None:
            print(f"{r['case']:<10} {r['mb']:>8.3f} {r['baseline_s']:>11.4f} {'>' + str(int(args.timeout)):>9}"
                  f" {'-':>8} {'-':>9} {'-':>7} {r['baseline_rss_mb']:>8.0f}")
            continue
        print(f"{r['case']:<10} {r['mb']:>8.3f} {r['baseline_s']:>11.4f} {r['parse_s']:>9.3f} {r['parse_s_per_mb']:>8.3f}"
              f" {r['ratio']:>8.0f}x {r['parse_rss_mb']:>7.0f} {r['baseline_rss_mb']:>8.0f}")


if __name__ == "__main__":
    main()
