"""`ncclprobe demo` end to end, on the simulated NCCL: it must name every planted cause with the right
code and evidence, and nothing it did not plant."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ncclprobe.demo import engine, story

ENGINE = engine.__file__


def _engine_line(text: str) -> int:
    return next(i for i, line in enumerate(open(ENGINE), 1) if text in line)


@pytest.fixture(scope="module")
def demo_json():
    r = subprocess.run([sys.executable, "-m", "ncclprobe", "demo", "--json"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout)


def by_code(out, code):
    return [f for f in out["findings"] if f["code"] == code]


def test_demo_names_every_planted_cause_and_nothing_else(demo_json):
    out = demo_json
    assert out["schema"] == "ncclprobe/2" and out["command"] == "demo"
    assert out["simulated"] is True and out["ok"] is True
    codes = {f["code"] for f in out["findings"]}
    assert set(story.PLANTED) <= codes
    assert {f["code"] for f in out["findings"] if f["severity"] != "info"} <= set(story.PLANTED) | story.CONSEQUENCES
    assert out["missed"] == [] and out["unplanted"] == []


def test_demo_evidence_points_at_the_culprits(demo_json):
    out = demo_json
    proto_line = _engine_line('os.environ["NCCL_PROTO"]')
    buff_line = _engine_line('os.environ["NCCL_BUFFSIZE"]')
    over = by_code(out, "ENV_OVERRIDDEN")
    assert over and all(f["var"] == "NCCL_PROTO" for f in over)
    assert all(f"engine.py:{proto_line}" in f["evidence"]["where"] for f in over)
    assert {f["evidence"]["old"] for f in over} == {"LL"} and {f["evidence"]["new"] for f in over} == {"Simple"}
    div = by_code(out, "COMM_TUNING_DIVERGENT")
    tp = sorted(c["pid"] for c in out["communicators"] if c["api"] == "ncclCommInitRankConfig" and c["nranks"] == 2)
    assert len(div) == 1 and div[0]["pids"] == tp and div[0]["ranks"] == [0, 1]  # one cause, on both workers
    assert div[0]["culprit"] == f"engine.py:{proto_line}"
    for f in div:
        assert f["evidence"]["first_value"] == "LL" and f["evidence"]["then_value"] == "Simple"
        assert "Ring/LL" in f["evidence"]["realized_first"] and "Ring/Simple" in f["evidence"]["realized_then"]
    late = by_code(out, "ENV_LATE")
    assert late and all(f["var"] == "NCCL_BUFFSIZE" and f"engine.py:{buff_line}" in f["evidence"]["where"] for f in late)
    unhook = by_code(out, "NCCL_UNHOOKABLE")
    assert len(unhook) == 1 and len(unhook[0]["communicators"]) == 1 and unhook[0]["ranks"] == [0, 1]
    shell = by_code(out, "SHELL_PREFIX_SCOPE")
    assert shell and shell[0]["var"] == "NCCL_P2P_LEVEL"
    missing = by_code(out, "ENV_MISSING")
    replica = [p for p in out["processes"] if "--role" in p["argv"] and "replica" in p["argv"]]
    assert len(replica) == 1 and all(replica[0]["pid"] in f["pids"] for f in missing)
    assert len(missing) == 1 and missing[0]["severity"] == "error"  # one edge: the curated environment
    assert set(missing[0]["vars"]) == {"NCCL_PROTO", "NCCL_ALGO", "NCCL_MAX_NCHANNELS"}
    # one finding per cause: the verify communicator's changed NCCL_PROTO is ENV_OVERRIDDEN's (the write), not a
    # second finding
    assert len([f for f in out["findings"] if f["severity"] != "info"]) == len(story.PLANTED)
    assert over[0]["severity"] == "error" and over[0]["edge"]["kind"] == "overwritten_in_child"


def test_demo_time_lines_tell_graph_from_eager(demo_json):
    """Decode is captured into a (simulated) CUDA graph and replayed 8 times after one eager warm-up,
    verify runs 3 all-reduces eagerly: per rank, from the profiler's counts with GPU timing on."""
    times = {t["communicator"]: t for t in demo_json["verdict"]["time"]}
    comms = {c["comm_hash"]: c for c in demo_json["communicators"] if c["comm_hash"]}
    decode = next(t for t in times.values() if t["modes"].get("replayed"))
    verify = next(t for t in times.values() if t is not decode and t["collectives"])
    assert decode["ranks"] == verify["ranks"] == [0, 1] and decode["simulated"] and verify["simulated"]
    assert decode["modes"] == {"eager": 2, "replayed": 16} and decode["api_calls"] == {"eager": 2, "captured": 2}
    assert verify["modes"] == {"eager": 6} and verify["api_calls"] == {"eager": 6, "captured": 0}
    assert decode["timing"] == verify["timing"] == "gpu" and not decode["unflushed_ranks"]
    ar = verify["per_func"]["AllReduce"]
    assert (ar["count"], ar["bytes_min"], ar["bytes_max"], ar["gpu_count"]) == (6, 2 * 7168 * 2, 4 * 7168 * 2, 6)
    assert ar["gpu_median_ns"] > 0 and ar["busbw_gbs"] > 0
    assert "89 % graph replays, 11 % eager" in decode["line"] and "[simulated]" in decode["line"]
    assert ", eager," in verify["line"]
    assert all(comms[t["communicator"]]["simulated"] for t in (decode, verify))
    eager, = by_code(demo_json, "COMM_EAGER_BESIDE_GRAPH")
    assert eager["evidence"]["eager"] == verify["communicator"] and eager["evidence"]["graphed"] == decode["communicator"]
    assert eager["severity"] == "warning" and eager["ranks"] == [0, 1]
    small = by_code(demo_json, "NCCL_TIME_SMALL")
    assert all(f["severity"] == "info" and f["evidence"]["simulated"] for f in small)


def test_demo_communicators_and_their_realized_protocols(demo_json):
    comms = demo_json["communicators"]
    assert all(c["simulated"] for c in comms if c["lib"])
    linked = [c for c in comms if c["api"] == "ncclCommInitRankConfig"]
    ctypes_made = [c for c in comms if "preload" not in c["seen_by"] and "profiler" in c["seen_by"]]
    assert len(linked) == 3 and len(ctypes_made) == 2   # decode x2 + replica; verify x2
    verify_protos = {s["proto"] for c in ctypes_made for s in c["collectives"]}
    assert verify_protos == {"Simple"}
    # NCCL's own log names the API the preload hook could not see
    assert {c["api"] for c in ctypes_made} == {"ncclCommInitRank"} and all("nccl-log" in c["seen_by"] for c in ctypes_made)


def test_demo_text_output_says_simulated():
    r = subprocess.run([sys.executable, "-m", "ncclprobe", "demo"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-2000:]
    assert "SIMULATED NCCL" in r.stdout
    assert "Planted causes" in r.stdout and "MISSED" not in r.stdout


def test_demo_verdict_names_each_value_and_its_culprit(demo_json):
    rows = {r["var"]: r for r in demo_json["verdict"]["variables"]}
    assert demo_json["verdict"]["holders"] == "communicators"
    proto = rows["NCCL_PROTO"]
    assert proto["reference"] == "LL" and proto["basis"] == "expected"
    by_value = {g["value"]: g for g in proto["groups"]}
    assert set(by_value) == {"LL", "Simple", None}
    assert by_value["LL"]["culprit"] is None and by_value["LL"]["ranks"] == [0, 1]
    proto_line = _engine_line('os.environ["NCCL_PROTO"]')
    assert by_value["Simple"]["culprit"] == f"engine.py:{proto_line}"
    assert by_value[None]["culprit"] == "curated env from ncclprobe.demo.launcher"
    # NCCL caches NCCL_BUFFSIZE: the verify communicator runs the value NCCL read first, and says why
    late = [g for g in rows["NCCL_BUFFSIZE"]["groups"] if g["culprit"]]
    assert [g["value"] for g in late] == [None] and late[0]["culprit"].startswith("set late at engine.py:")
    # the sidecar made no communicator: it is in the verdict as a process, with the shell line as culprit
    sidecar = [g for g in rows["NCCL_P2P_LEVEL"]["groups"] if g["processes"]]
    assert len(sidecar) == 1 and sidecar[0]["value"] is None and "prefix on `cd` only" in sidecar[0]["culprit"]


def test_demo_opens_with_the_verdict_on_one_80_column_screen():
    r = subprocess.run([sys.executable, "-m", "ncclprobe", "demo"], capture_output=True, text=True, timeout=180,
                       env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0, r.stdout[-2000:]
    lines = r.stdout.splitlines()
    # wider than 80 only where one word is, after its tree guides (an installed path): words are never cut
    assert all(len(ln) <= 80 or " " not in ln.lstrip(" │├└─") for ln in lines), [ln for ln in lines if len(ln) > 80]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Verdict:"))
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    # the verdict, whole (variables and time lines), within the first screen of a 40-line terminal
    assert end - start <= 26 and start < 12
    order = [next(i for i, ln in enumerate(lines) if ln.startswith(h)) for h in ("Verdict:", "Findings", "Details")]
    assert order == sorted(order)
    assert "LD_PRELOAD" not in r.stdout and "NCCL_PROFILER_PLUGIN" not in r.stdout  # ncclprobe's wiring


@pytest.mark.gpu
def test_demo_real_on_gpu():
    r = subprocess.run([sys.executable, "-m", "ncclprobe", "demo", "--real", "--json"], capture_output=True, text=True,
                       timeout=600)
    out = json.loads(r.stdout)
    assert out["simulated"] is False and out["backend"] == "torch"
    assert out["missed"] == [] and out["unplanted"] == [], out
    assert r.returncode == 0
