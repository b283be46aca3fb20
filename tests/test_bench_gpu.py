"""`ncclprobe bench --gpus 1` end to end on a real GPU with real NCCL (run on the GPU machine:
`pytest -m gpu tests/test_bench_gpu.py`). One rank exercises the harness and CUDA-graph capture, not the
interconnect: NCCL short-cuts a single-rank all-reduce (observed.md), and the output must say so."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

BASE = [sys.executable, "-m", "ncclprobe", "bench", "--gpus", "1", "-n", "10", "-w", "2", "--timeout", "120"]
SWEEP = ["-b", "1K", "-e", "1M"]  # not with --hidden, which sets the sizes itself


def _run(args, tmp_path):
    # wide enough that table headers are not wrapped across lines
    env = {**os.environ, "COLUMNS": "220"}
    args = args if "--hidden" in args else SWEEP + args
    proc = subprocess.run(BASE + args, capture_output=True, text=True, timeout=540, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def default_matrix(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu")
    return json.loads(_run(["--json", "--plot", str(tmp / "lat.png")], tmp)), tmp


def test_default_matrix_all_ok_with_graph_mode(default_matrix):
    data, _ = default_matrix
    assert data["label"] == "GPU/NCCL" and data["nranks"] == 1 and data["basis"] == "graph"
    assert data["device"] and data["device"] != "CPU" and data["versions"]["nccl"]
    assert [c["name"] for c in data["configs"]] == [
        "defaults", "proto=LL", "proto=LL128", "proto=Simple", "algo=Ring", "algo=Tree"]
    for c in data["configs"]:
        assert c["status"] == "ok", c["reason"]
        keys = {(r["bytes"], r["mode"], r["inplace"]) for r in c["results"]}
        assert keys == {(b, m, ip) for b in data["sizes"] for m in ("eager", "graph") for ip in (False, True)}
        assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in c["results"])
        assert all(r["busbw"] == 0 for r in c["results"])  # 2(n-1)/n = 0 at one rank


def test_single_rank_in_place_captures_an_empty_graph(default_matrix):
    data, _ = default_matrix
    for c in data["configs"]:
        assert {r["note"] for r in c["results"] if r["mode"] == "graph" and r["inplace"]} == {"empty graph"}
        assert {r["note"] for r in c["results"] if not r["inplace"]} == {""}


def test_out_of_place_is_a_real_nccl_call(default_matrix):
    data, _ = default_matrix
    assert all("ncclAllReduce(sendbuff != recvbuff)" in c["out_of_place"] for c in data["configs"])


def test_realized_is_unknown_with_the_single_rank_reason(default_matrix):
    data, _ = default_matrix
    for c in data["configs"]:
        assert c["realized"]["available"] is False and "short-cuts" in c["realized"]["reason"]
    assert data["findings"] == []  # no ALGO_PROTO_MISMATCH from a shortcut that chose nothing
    rec = data["recommendation"]
    assert rec["applicable"] is False and "not interconnect" in rec["reason"]


def test_workers_ran_with_their_configuration(default_matrix):
    data, _ = default_matrix
    pids = [set(c["pids"]) for c in data["configs"]]
    assert len(set().union(*pids)) == len(data["configs"])  # one fresh worker per configuration
    by = {c["name"]: c for c in data["configs"]}
    assert by["proto=LL128"]["workers"][0]["env"]["NCCL_PROTO"] == "LL128"
    assert by["algo=Tree"]["workers"][0]["env"]["NCCL_ALGO"] == "Tree"
    assert "NCCL_PROTO" not in by["defaults"]["workers"][0]["env"]


def test_plot_written(default_matrix):
    _, tmp = default_matrix
    assert (tmp / "lat.png").read_bytes()[:4] == b"\x89PNG"


def test_text_says_one_gpu_is_not_interconnect_and_shows_host_overhead(tmp_path):
    out = _run(["--proto", "", "--algo", "", "--hidden", "7168", "--tokens", "1,2,4", "--layers", "61"], tmp_path)
    assert "One GPU: these are not interconnect numbers" in out
    assert "Host overhead (defaults" in out and "graph" in out
    assert "Per-forward communication floor" in out and "break-even k=4" in out
    assert "not a recommendation" in out


def test_gpu_timing_and_the_speculation_projection_on_one_gpu(tmp_path):
    """--gpu-timing wires NCCLPROBE_GPU_TIMING into the workers' profiler and still measures (one rank:
    NCCL reports no collective, and realized says why); --step-ms/--accept-len project on the graph times."""
    doc = json.loads(_run(["--proto", "", "--algo", "", "--hidden", "7168", "--tokens", "1,3", "--layers", "61",
                           "--step-ms", "12", "--accept-len", "2.1", "--gpu-timing", "--keep", "--json"], tmp_path))
    assert doc["options"]["gpu_timing"] is True and any("GPU timing is on" in n for n in doc["notes"])
    (c,) = doc["configs"]
    assert c["status"] == "ok" and "short-cuts" in c["realized"]["reason"]
    proj = doc["projection"]
    assert proj["basis"] == "graph" and proj["break_even_verify_ms"] == {"3": pytest.approx(25.2)}
    assert proj["rows"][0]["verify_ms"]["3"] >= 12.0
    # the plugin's init in the worker says it timed on the GPU (NCCL calls a profiler's init for one rank too)
    inits = [json.loads(line) for f in Path(doc["workdir"]).glob("*/events/*.jsonl")
             for line in f.read_text().splitlines() if '"comm_plugin_init"' in line]
    assert inits and {e["timing"] for e in inits} == {"gpu"}
