"""How short a life `ncclprobe run`'s watch still catches, in kernel mode (each process read at its exec,
from the kernel's process events) against scan mode (NCCLPROBE_WATCH_KERNEL=0, the baseline, measured in
the same run), and what following the kernel costs.

Each case runs `ncclprobe run --json -- bash SCRIPT`, where SCRIPT starts --workers C workers one after the
other, each through `env -i` (an environment of its own: no probe runs in it), each living --life ms. A
worker counts as caught when the report holds it by its pid with its own command line. Also printed: run's
wall time (kernel / scan) and the kernel-event thread's CPU over the run's wall time.

    python benchmarks/bench_kernel_watch.py [--workers 40] [--lives 1,10,30] [--repeat 3]

Needs root (or CAP_NET_ADMIN) in the host's namespaces for kernel mode; says so and stops otherwise."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char** argv) {
  printf("cworker %d\n", getpid());
  fflush(stdout);
  usleep(atoi(argv[1]) * 1000);
  return 0;
}
"""


def one(tmp: Path, workers: int, life_ms: int, kernel: bool) -> dict:
    script = tmp / "launch.sh"
    script.write_text("".join(f"env -i PATH=/usr/bin:/bin {tmp}/cworker {life_ms}\n" for _ in range(workers)))
    env = {**os.environ, "NCCL_PROTO": "LL"}
    if not kernel:
        env["NCCLPROBE_WATCH_KERNEL"] = "0"
    d = tempfile.mkdtemp(prefix="kw-", dir=tmp)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ncclprobe", "run", "--dir", d, "--json", "--", "bash", str(script)],
                       env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    pids = {int(w[1]) for w in (x.split() for x in r.stderr.splitlines()) if w[:1] == ["cworker"]}
    out = json.loads(r.stdout)
    caught = {p["pid"] for p in out["processes"] if p["pid"] in pids and (p["argv"] or [""])[0].endswith("cworker")}
    [w] = out["watch"].values()
    return {"caught": len(caught), "workers": len(pids), "wall": wall, "mode": w.get("mode"),
            "kernel_cpu": (w.get("kernel_cpu_s") or 0.0) / max(w.get("wall_s") or 1e-9, 1e-9)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=40)
    ap.add_argument("--lives", default="1,10,30", help="worker lifetimes in ms")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from ncclprobe.witnesses.kernelevents import Listener
    lst = Listener()
    lst.close()
    if lst.refused:
        print(f"kernel mode unavailable here: {lst.refused}")
        return 1
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        print("needs a C compiler")
        return 1
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; {args.workers} workers a run through "
          f"`env -i`, {args.repeat} repeats, kernel and scan alternating")
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        (tmp / "w.c").write_text(WORKER_C)
        subprocess.run([cc, "-O1", "-o", str(tmp / "cworker"), str(tmp / "w.c")], check=True)
        for life in (int(x) for x in args.lives.split(",")):
            rows: dict[bool, list[dict]] = {True: [], False: []}
            for i in range(args.repeat):
                for kernel in ((True, False) if i % 2 == 0 else (False, True)):
                    rows[kernel].append(one(tmp, args.workers, life, kernel))
            k, s = rows[True], rows[False]
            assert all(r["mode"] == "kernel" for r in k) and all(r["mode"] == "scan" for r in s)
            caught_k = sum(r["caught"] for r in k) / max(1, sum(r["workers"] for r in k))
            caught_s = sum(r["caught"] for r in s) / max(1, sum(r["workers"] for r in s))
            wall = statistics.median(r["wall"] for r in k) / statistics.median(r["wall"] for r in s)
            cpu = statistics.median(r["kernel_cpu"] for r in k) * 100
            print(f"  life {life:>3} ms: caught kernel {caught_k:6.1%}  scan {caught_s:6.1%}; run's wall time "
                  f"kernel/scan {wall:.3f}x (medians {statistics.median(r['wall'] for r in k):.2f} s / "
                  f"{statistics.median(r['wall'] for r in s):.2f} s); kernel thread {cpu:.2f} % of one core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
