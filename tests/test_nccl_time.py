"""Time in NCCL (issue 15): ncclprobe's profiler plugin (the installed libncclprobe.so) under the simulated NCCL,
which emits NCCL 2.28's profiler events (API events, Coll parented by CollApi, graph replays from a host-callback
thread, KernelCh from a proxy thread with simulated %globaltimer stamps): launch modes, GPU time per collective,
the flush by time and after SIGKILL, and the report's time lines and findings over them. Every output here says
simulated, as the report does."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ncclprobe.commands import report
from ncclprobe.model import timing
from ncclprobe.witnesses import events, probelib

# simKernelNs (probes/simnccl/profiler.c) for a Ring/Simple all-reduce of n bytes on 2 ranks: 7 us + n / 100 B/ns
SIMPLE_LATENCY_NS, SIMPLE_BYTES_PER_NS = 7000, 100.0

SCRIPT = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from ncclprobe.demo.ops import SimOps
    eager, replays, then = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    ops = SimOps(0, Path(os.environ["NCCLPROBE_DIR"]))
    comm = ops.init_ctypes(2, "ab" * 128, 0)
    for _ in range(eager):
        ops.all_reduce(comm, 4096)
    if replays:
        graph = ops.capture_all_reduce(comm, 65536)
        for _ in range(replays):
            ops.replay(graph)
    ops.nccl.ncclprobeSimSynchronize()   # every host callback and KernelCh event delivered
    if then == "wait":                   # a server that keeps running: the test kills it
        print("ready", flush=True)
        time.sleep(600)
    ops.close()
""")


@pytest.fixture(scope="module")
def lib() -> Path:
    check = probelib.self_check()
    assert check.ok, check.reason
    return Path(check.path)


def start(lib: Path, log: Path, eager: int, replays: int, then: str = "close", **env: str) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NCCLPROBE_", "NCCL_"))}
    full = {**base, "NCCLPROBE_DIR": str(log), "NCCL_PROFILER_PLUGIN": str(lib), "NCCL_PROTO": "Simple",
            "NCCL_ALGO": "Ring", **env}
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(eager), str(replays), then], env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(lib: Path, log: Path, eager: int, replays: int, **env: str):
    p = start(lib, log, eager, replays, **env)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, out + err
    return events.read_dirs([log])


def kinds(result, kind: str) -> list[dict]:
    return [e for e in result.events if e["ev"] == kind]


def by_mode(summaries) -> dict:
    out: dict = {}
    for s in summaries:
        out[s["mode"]] = out.get(s["mode"], 0) + s["count"]
    return out


def test_without_gpu_timing_eager_and_capture_are_told_apart_and_replays_are_not_seen(lib, tmp_path):
    """No KernelCh, intra-node: NCCL runs the captured collective's Coll event once, at capture, and reports
    none of its replays (research-15 §4); the API events still count the captured call."""
    log = tmp_path / "log"
    result = run(lib, log, eager=5, replays=4)
    assert result.skipped_total == 0
    summaries = kinds(result, "coll_summary")
    assert by_mode(summaries) == {"eager": 5, "captured": 1}
    assert all("gpu_count" not in s for s in summaries)
    eager = next(s for s in summaries if s["mode"] == "eager")
    assert (eager["size_log2"], eager["bytes_min"], eager["bytes_sum"], eager["algo"].lower(), eager["proto"].lower()) == (
        12, 4096, 5 * 4096, "ring", "simple")
    act = kinds(result, "comm_activity")
    assert act[-1]["reason"] == "finalize" and act[-1]["timing"] == "off"
    assert sum(a["api_eager"] for a in act) == 5 and sum(a["api_captured"] for a in act) == 1
    m = report.load([log])
    t, = timing.comm_times(m.comms)
    assert t.timing == "off" and t.gpu_s is None and t.simulated
    assert any("show once, at capture" in n for n in t.notes)
    line = timing.time_line(t, "comm")
    assert "GPU time not measured" in line and line.endswith("[simulated]")


def test_with_gpu_timing_replays_are_counted_and_timed(lib, tmp_path):
    log = tmp_path / "log"
    result = run(lib, log, eager=5, replays=4, NCCLPROBE_GPU_TIMING="1")
    assert result.skipped_total == 0
    summaries = kinds(result, "coll_summary")
    # KernelCh puts a proxy op in every plan: no Coll at capture, one per replay from the callback thread
    assert by_mode(summaries) == {"eager": 5, "replayed": 4}
    init, = kinds(result, "comm_plugin_init")
    assert init["timing"] == "gpu"
    for s in summaries:
        n = 4096 if s["mode"] == "eager" else 65536
        expected = SIMPLE_LATENCY_NS + int(n * 2 * (2 - 1) / 2 / SIMPLE_BYTES_PER_NS)
        assert s["gpu_count"] == s["count"] and s["untimed"] == 0
        assert s["gpu_ns"] == s["count"] * expected  # the longest channel's interval, every channel alike here
        hist = dict(map(tuple, s["gpu_hist"]))
        assert sum(hist.values()) == s["count"]
        lo, hi = timing.bin_bounds(next(iter(hist)))
        assert lo <= expected < hi
        assert abs(timing.quantile(hist, 0.5) - expected) <= 0.0625 * expected
    m = report.load([log])
    t, = timing.comm_times(m.comms)
    assert t.timing == "gpu" and t.modes == {"eager": 5, "replayed": 4} and t.api["captured"] == 1
    f = t.per_func["AllReduce"]
    assert f["gpu_count"] == 9 and f["busbw_gbs"] > 0 and f["gpu_p90_ns"] >= f["gpu_median_ns"]
    # nine collectives in well under MIN_WALL_S: no rate and no share, and the line says why
    assert t.wall_s < timing.MIN_WALL_S and t.share is None and f["rate_per_s"] is None
    assert "too short a window for a share" in timing.time_line(t, "comm")


def test_a_communicator_with_few_collectives_reports_within_the_interval(lib, tmp_path):
    """Three collectives, then the process idles: the flusher thread writes them after NCCLPROBE_FLUSH_S,
    not only at teardown."""
    log = tmp_path / "log"
    p = start(lib, log, eager=3, replays=0, then="wait", NCCLPROBE_FLUSH_S="0.2")
    try:
        assert p.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 30
        summaries = []
        while time.monotonic() < deadline and sum(s["count"] for s in summaries) < 3:
            time.sleep(0.1)
            summaries = kinds(events.read_dirs([log]), "coll_summary")
        assert [(s["reason"], s["count"]) for s in summaries] == [("periodic", 3)]
    finally:
        p.kill()
        p.wait(timeout=30)


def test_a_killed_process_loses_at_most_the_last_interval_and_the_report_says_so(lib, tmp_path):
    log = tmp_path / "log"
    p = start(lib, log, eager=7, replays=3, then="wait", NCCLPROBE_FLUSH_S="0.2", NCCLPROBE_GPU_TIMING="1")
    try:
        assert p.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = kinds(events.read_dirs([log]), "coll_summary")
            if sum(s["count"] for s in got) == 10:
                break
            time.sleep(0.1)
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL
    m = report.load([log])
    t, = timing.comm_times(m.comms)
    assert t.count == 10 and t.unflushed == [0]
    assert any("ended without a final flush" in n and "0.2 s" in n for n in t.notes)
    acts = kinds(events.read_dirs([log]), "comm_activity")
    assert acts and all(a["reason"] == "periodic" for a in acts)


def test_report_json_carries_the_time_block(lib, tmp_path):
    log = tmp_path / "log"
    run(lib, log, eager=4, replays=2, NCCLPROBE_GPU_TIMING="1")
    r = subprocess.run([sys.executable, "-m", "ncclprobe", "report", str(log), "--json"], capture_output=True,
                       text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    t, = doc["verdict"]["time"]
    assert t["modes"] == {"eager": 4, "replayed": 2} and t["timing"] == "gpu" and t["simulated"] is True
    assert t["line"].endswith("[simulated]") and "graph replays" in t["line"]
    coll = [c for c in doc["communicators"] if c["collectives"]][0]["collectives"]
    assert {c["mode"] for c in coll} == {"eager", "replayed"} and all(c["gpu_hist"] for c in coll)
    text = subprocess.run([sys.executable, "-m", "ncclprobe", "report", str(log)], capture_output=True, text=True,
                          timeout=120, cwd="/")
    assert "Time in NCCL, per rank" in text.stdout and "[simulated]" in text.stdout
