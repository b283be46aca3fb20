"""Cost of `ncclprobe run`'s /proc watch (ncclprobe/commands/watch.py) on a tree of N processes: the
same CMD under `ncclprobe run` with the watch at its default interval and with it off
(NCCLPROBE_WATCH_S=0), alternating, several repeats; the medians compared.

CMD is a `python -S` parent that prints "start", forks N-1 sleeping `python -S` children (fork+exec),
prints "ready" once every child runs, holds the tree for --hold seconds, then ends it. Measured:
- the watch's CPU (its thread's own clock, from the watch_summary event) as a share of one core over
  the time it ran, the tree's build included (goal <= 2 %), and per scan that read the tree; and, on
  its own, the watch's scan on a tree that is up (steady state: the cost per second of a long job);
- CMD's start-up: from starting `ncclprobe run` to CMD's first line ("start"), and to "ready" (the
  whole tree up), as the ratio watch on / watch off (goal: unchanged, ~1.00).
Two trees: "quiet" (nothing starts once it is up: most scans find no new pid and read nothing) and
"churn" (the parent starts a thread every 20 ms, so every scan sees a new pid and walks the whole
tree: the watch's cost on a busy machine).
With --live, a third case in the same rotation: `run --live` at the default interval, its watch CPU
(and the live reads' own share, live_cpu_s) against the watch without --live, as a ratio; and the
steady-state cost of one live read of the whole tree.

Measures the installed ncclprobe (`pip install .`: the native reader is built at install).

    python benchmarks/bench_run_watch.py [--procs 256] [--repeat 5] [--hold 10] [--intervals 0.25,1] [--live]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = "import os, time; os.write(1, b'x'); time.sleep(600)"
PARENT = r"""
import os, sys, threading, time
n, hold, churn = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "churn"
print("start", flush=True)
kids, pipes = [], []
for _ in range(n - 1):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(w, 1)
        os.execv(sys.executable, [sys.executable, "-S", "-c", sys.argv[4]])
    os.close(w)
    kids.append(pid)
    pipes.append(r)
for r in pipes:
    os.read(r, 1)
print("ready", flush=True)
end = time.monotonic() + hold
while time.monotonic() < end:
    if churn:  # a new thread: a new pid for /proc/loadavg, so every scan walks the tree
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
    time.sleep(0.02 if churn else end - time.monotonic())
for pid in kids:
    os.kill(pid, 9)
for pid in kids:
    os.waitpid(pid, 0)
"""


def one(procs: int, hold: float, tree: str, interval: float | None, live: bool = False) -> dict:
    """One `ncclprobe run` of the tree; interval None: the watch at its default, 0: off; live: --live."""
    env = dict(os.environ)
    env.pop("NCCLPROBE_WATCH_S", None)
    if interval is not None:
        env["NCCLPROBE_WATCH_S"] = f"{interval:g}"
    watch = interval != 0
    with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp:
        d = Path(tmp) / "logs"
        cmd = [sys.executable, "-m", "ncclprobe", "run", *(["--live"] if live else []), "--dir", str(d), "--",
               sys.executable, "-S", "-c", PARENT,
               str(procs), str(hold), tree, CHILD]
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             cwd=tmp)  # not the source tree: the installed package, with its native parts
        marks = {}
        for line in p.stdout:
            word = line.strip()
            if word in ("start", "ready") and word not in marks:
                marks[word] = time.perf_counter() - t0
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        assert set(marks) == {"start", "ready"}, f"CMD did not start: {marks}"
        summary = None
        for f in d.glob("*.jsonl"):
            for line in f.read_text().splitlines():
                if '"watch_summary"' in line:
                    summary = json.loads(line)
        seen = sum(f.read_text().count('"proc_seen"') for f in d.glob("*.jsonl"))
        lives = sum(f.read_text().count('"live_env"') for f in d.glob("*.jsonl"))
    assert (summary is not None) == watch, "watch_summary missing" if watch else "a watch ran with NCCLPROBE_WATCH_S=0"
    return {"start": marks["start"], "ready": marks["ready"], "summary": summary, "seen": seen, "live_lines": lives,
            "tree_cpu": usage.ru_utime + usage.ru_stime}


def steady_live(procs: int, reads: int) -> tuple[float, float]:
    """One live read of the whole tree (livewatch.Tracker, as run --live's watch does it), on a tree that
    is up: its CPU (ms, median of `reads`) and wall time (ms)."""
    from ncclprobe.witnesses.livewatch import Tracker
    p = subprocess.Popen([sys.executable, "-S", "-c", PARENT, str(procs), "3600", "quiet", CHILD],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "start" and p.stdout.readline().strip() == "ready"
        from ncclprobe.witnesses.procwatch import Scanner
        sc = Scanner(os.getpid(), os.urandom(16))
        sc.scan(final=True)
        targets = [(pid, k[0], k[2], None) for pid, k in sc.known.items()]
        assert len(targets) == procs
        tr = Tracker()
        assert len(tr.read(targets)) == procs  # the first reading of each is recorded
        cpu, wall = [], []
        for _ in range(reads):
            time.sleep(0.05)
            t, w = time.thread_time(), time.perf_counter()
            tr.read(targets)
            cpu.append((time.thread_time() - t) * 1e3)
            wall.append((time.perf_counter() - w) * 1e3)
        return statistics.median(cpu), statistics.median(wall)
    finally:
        p.kill()
        p.wait()


def steady(procs: int, tree: str, interval: float, scans: int) -> tuple[float, int]:
    """The watch's scan alone, on a tree that is up (started here, not under run), at the interval:
    its CPU per scan (ms) and how many of the scans walked the tree."""
    from ncclprobe.witnesses.procwatch import Scanner
    p = subprocess.Popen([sys.executable, "-S", "-c", PARENT, str(procs), "3600", tree, CHILD],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "start" and p.stdout.readline().strip() == "ready"
        from ncclprobe.witnesses.procwatch import YOUNG_S
        sc = Scanner(os.getpid(), os.urandom(16))
        assert len(sc.scan(final=True)) == procs
        end = time.monotonic() + YOUNG_S  # past the first seconds, when every process is young (watched for execs)
        while time.monotonic() < end:
            time.sleep(interval)
            sc.scan()
        cpu, walks = 0.0, sc.walks
        for _ in range(scans):
            time.sleep(interval)
            t = time.thread_time()
            sc.scan()
            cpu += time.thread_time() - t
        return cpu / scans * 1e3, sc.walks - walks
    finally:
        p.kill()
        p.wait()


def med(rows: list[dict], key) -> float:
    return statistics.median(key(r) for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--hold", type=float, default=10.0, help="seconds the tree runs once it is up")
    ap.add_argument("--trees", default="quiet,churn")
    ap.add_argument("--intervals", default="", help="other intervals to measure beside the default, e.g. 0.25,1")
    ap.add_argument("--steady-scans", type=int, default=30, help="scans of the steady-state measurement")
    ap.add_argument("--live", action="store_true", help="also measure run --live at the default interval")
    args = ap.parse_args()
    import ncclprobe
    from ncclprobe.commands import watch as watch_mod
    default = watch_mod.WATCH_S
    intervals = [default] + [float(x) for x in args.intervals.split(",") if x and float(x) != default]
    print(f"ncclprobe {Path(ncclprobe.__file__).parent}; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; tree of {args.procs} processes, held {args.hold:g} s; default interval "
          f"{default:g} s; {args.repeat} repeats, the order of the cases rotating")
    verdict = True
    for tree in args.trees.split(","):
        cases = [0.0, *intervals] + (["live"] if args.live else [])  # 0: the watch off, the baseline
        rows: dict = {c: [] for c in cases}
        for i in range(args.repeat):
            for c in cases[i % len(cases):] + cases[:i % len(cases)]:
                rows[c].append(one(args.procs, args.hold, tree, None if c in (default, "live") else c, c == "live"))
        for c in intervals:
            ms, walks = steady(args.procs, tree, c, args.steady_scans)
            print(f"\n[{tree}] steady state, every {c:g} s: {ms:.3f} ms of CPU a scan ({walks} of {args.steady_scans} "
                  f"walked the tree) = {ms / 1e3 / c * 100:.3f} % of one core")
        off = rows[0.0]
        print(f"\n[{tree}] baseline (NCCLPROBE_WATCH_S=0): to 'start' {med(off, lambda r: r['start']) * 1e3:.0f} ms, "
              f"to 'ready' {med(off, lambda r: r['ready']) * 1e3:.0f} ms (medians)")
        for c in intervals:
            on = rows[c]
            s = [r["summary"] for r in on]
            share = [x["cpu_s"] / x["wall_s"] * 100 for x in s]
            per_walk = [x["cpu_s"] / max(1, x["walks"]) * 1e3 for x in s]
            name = f"{c:g} s" + (" (default)" if c == default else "")
            print(f"  watch every {name}: seen {med(on, lambda r: r['seen']):.0f} (median), scans "
                  f"{med(s, lambda x: x['scans']):.0f}, walks {med(s, lambda x: x['walks']):.0f}, missed_known "
                  f"{med(s, lambda x: x['missed_known']):.0f}, reader {s[0]['reader']}")
            ok = max(share) <= 2
            print(f"    watch CPU         median {statistics.median(share):6.3f} % of one core (range {min(share):.3f}-"
                  f"{max(share):.3f}; {med(s, lambda x: x['cpu_s']) * 1e3:.1f} ms over {med(s, lambda x: x['wall_s']):.1f} s)"
                  f"  goal <= 2 %: {'ok' if ok else 'OVER'}")
            print(f"    per walk          median {statistics.median(per_walk):6.3f} ms of CPU (tree build included)")
            for mark in ("start", "ready"):
                a, b = med(on, lambda r: r[mark]), med(off, lambda r: r[mark])
                pairs = statistics.median(x[mark] / y[mark] for x, y in zip(on, off))
                print(f"    to '{mark}'{' ' * (6 - len(mark))}      {a * 1e3:7.0f} ms vs {b * 1e3:7.0f} ms off: ratio of "
                      f"medians {a / b:5.3f}, median of per-repeat ratios {pairs:5.3f}")
            a, b = med(on, lambda r: r["tree_cpu"]), med(off, lambda r: r["tree_cpu"])
            print(f"    run + tree CPU    {a:.3f} s vs {b:.3f} s off ({a - b:+.3f} s; a noisy cross-check)")
            verdict &= ok if c == default else True
        if args.live:
            on, base = rows["live"], rows[default]
            s, b = [r["summary"] for r in on], [r["summary"] for r in base]
            share = [x["cpu_s"] / x["wall_s"] * 100 for x in s]
            share_b = [x["cpu_s"] / x["wall_s"] * 100 for x in b]
            live_share = [x["live_cpu_s"] / x["wall_s"] * 100 for x in s]
            print(f"  --live at the default interval: live reads {med(s, lambda x: x['live_reads']):.0f}, process reads "
                  f"{med(s, lambda x: x['live_processes']):.0f}, live_env lines {med(on, lambda r: r['live_lines']):.0f}, "
                  f"{med(s, lambda x: x['live_bytes']) / 1e6:.1f} MB read (medians), reader {s[0]['live_reader']}")
            print(f"    watch CPU         median {statistics.median(share):6.3f} % of one core with --live vs "
                  f"{statistics.median(share_b):6.3f} % without: ratio {statistics.median(share) / statistics.median(share_b):5.2f} "
                  f"(the live reads alone {statistics.median(live_share):.3f} %)")
            for mark in ("start", "ready"):
                a, c = med(on, lambda r: r[mark]), med(base, lambda r: r[mark])
                print(f"    to '{mark}'{' ' * (6 - len(mark))}      {a * 1e3:7.0f} ms vs {c * 1e3:7.0f} ms without --live: "
                      f"ratio of medians {a / c:5.3f}")
            if tree == args.trees.split(",")[0]:
                cpu, wall = steady_live(args.procs, args.steady_scans)
                print(f"    one live read of the whole tree (steady state): {cpu:.2f} ms of CPU, {wall:.2f} ms wall "
                      f"(median of {args.steady_scans})")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
