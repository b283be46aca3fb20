"""The probe library under torch with real NCCL on one GPU (marker `gpu`; run on the GPU machine):
lazy init (ncclCommInitRankConfig), eager init with device_id plus new_group (ncclCommSplit), and
all_reduce under NCCL_PROTO=LL and NCCL_PROTO=Simple. Every communicator must appear with its
API, its environment and its profiler init, joined by call id.

A single-rank communicator takes NCCL's shortcut: the profiler's init fires, no collective event
does and NCCL_PROTO is never read (reference/observed.md), so nothing here expects coll_summary.

    python -m pytest -m gpu tests/test_probe_gpu.py
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "c"))
import probe_support as ps  # noqa: E402

from ncclprobe.witnesses import events, probelib  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    res = probelib.self_check()
    if res.ok:
        return Path(res.path)
    return ps.build_probe(tmp_path_factory.mktemp("probe_gpu"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(probe: Path, log: Path, body: str, **env: str) -> subprocess.CompletedProcess:
    script = textwrap.dedent("""
        import os, torch, torch.distributed as dist
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = os.environ["TEST_PORT"]
        torch.cuda.set_device(0)
    """) + textwrap.dedent(body)
    full = ps.probe_env(log, probe, NCCL_PROFILER_PLUGIN=str(probe), NCCL_ENV_PLUGIN=str(probe),
                        TEST_PORT=str(free_port()), **env)
    r = subprocess.run([sys.executable, "-c", script], env=full, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def joined(log: Path):
    """(comm_init events with rc 0, {call: comm_plugin_init}, whole log)."""
    result = events.read_dirs([log])
    assert result.skipped_total == 0
    inits = [e for e in result.events if e["ev"] == "comm_init" and e["rc"] == 0 and e["comm"]]
    plugin = {e["call"]: e for e in result.events if e["ev"] == "comm_plugin_init" and e["call"] is not None}
    for e in inits:
        assert Path(e["lib"]).name.startswith("libnccl")
        assert e["version"] >= 22700 and e["simulated"] is False
        assert (e["rank"], e["nranks"], e["dev"]) == (0, 1, 0)
        assert e["call"] in plugin, f"no profiler init inside call {e['call']} ({e['api']})"
        p = plugin[e["call"]]
        assert (p["rank"], p["nranks"], p["nnodes"]) == (0, 1, 1)
        assert p["lib"] == e["lib"]
    return inits, plugin, result


def test_lazy_init_and_new_group_use_init_rank_config(probe, tmp_path):
    log = tmp_path / "log"
    run_torch(probe, log, """
        dist.init_process_group("nccl", rank=0, world_size=1)
        t = torch.ones(1024, device="cuda")
        dist.all_reduce(t)                      # the default group's communicator, created now
        g = dist.new_group([0])
        dist.all_reduce(t, group=g)             # another lazy communicator
        torch.cuda.synchronize()
        dist.destroy_process_group()
    """, NCCL_PROTO="LL")
    inits, plugin, result = joined(log)
    assert [e["api"] for e in inits] == ["ncclCommInitRankConfig", "ncclCommInitRankConfig"]
    assert all(e["env"]["NCCL_PROTO"] == "LL" and e["config"]["valid"] for e in inits)
    assert all(plugin[e["call"]]["env"]["NCCL_PROTO"] == "LL" for e in inits)
    loads = {(e["src"], e["plugin"]) for e in result.events if e["ev"] == "plugin_load"}
    assert any(src == "profiler" for src, _ in loads) and any(src == "envplugin" for src, _ in loads)
    assert any(e["ev"] == "nccl_getenv" for e in result.events)


def test_eager_init_with_device_id_then_new_group_splits(probe, tmp_path):
    log = tmp_path / "log"
    run_torch(probe, log, """
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
        g = dist.new_group([0])
        t = torch.ones(1024, device="cuda")
        dist.all_reduce(t, group=g)
        torch.cuda.synchronize()
        dist.destroy_process_group()
    """)
    inits, plugin, _ = joined(log)
    apis = [e["api"] for e in inits]
    assert apis[0] == "ncclCommInitRankConfig" and "ncclCommSplit" in apis
    split = inits[apis.index("ncclCommSplit")]
    assert split["parent"] == inits[0]["comm"]
    assert plugin[split["call"]]["comm_hash"] != plugin[inits[0]["call"]]["comm_hash"]


@pytest.mark.parametrize("proto", ["LL", "Simple"])
def test_all_reduce_under_each_protocol(probe, tmp_path, proto):
    log = tmp_path / "log"
    r = run_torch(probe, log, """
        dist.init_process_group("nccl", rank=0, world_size=1)
        t = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        for _ in range(10):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        print("sum", float(t[1].item()))
        dist.destroy_process_group()
    """, NCCL_PROTO=proto)
    assert "sum 1.0" in r.stdout  # single rank: all_reduce leaves the data as it was
    inits, plugin, result = joined(log)
    assert len(inits) == 1
    assert inits[0]["env"]["NCCL_PROTO"] == proto
    assert plugin[inits[0]["call"]]["env"]["NCCL_PROTO"] == proto
    assert any(e["ev"] == "comm_destroy" and e["comm"] == inits[0]["comm"] for e in result.events)


def test_in_process_change_between_two_communicators(probe, tmp_path):
    log = tmp_path / "log"
    run_torch(probe, log, """
        dist.init_process_group("nccl", rank=0, world_size=1)
        t = torch.ones(16, device="cuda")
        dist.all_reduce(t)
        os.environ["NCCL_PROTO"] = "Simple"
        g = dist.new_group([0])
        dist.all_reduce(t, group=g)
        torch.cuda.synchronize()
        dist.destroy_process_group()
    """, NCCL_PROTO="LL")
    inits, plugin, _ = joined(log)
    assert [e["env"]["NCCL_PROTO"] for e in inits] == ["LL", "Simple"]
    assert [plugin[e["call"]]["env"]["NCCL_PROTO"] for e in inits] == ["LL", "Simple"]


# eager all-reduces, one on a side stream, one captured into a CUDA graph and replayed: one rank
ONE_RANK_MIX = """
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
        t = torch.ones(8192, device="cuda")
        for _ in range(3):
            dist.all_reduce(t)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dist.all_reduce(t)
        for _ in range(5):
            g.replay()
        torch.cuda.synchronize()
        dist.destroy_process_group()
"""


def test_one_rank_time_accounting_with_gpu_timing_and_a_cuda_graph(probe, tmp_path):
    """What fires on one GPU (issue 15): eager all-reduces, one on a side stream, then one captured into a CUDA
    graph and replayed, with GPU timing on. NCCL's one-rank shortcut (enqueue.cc taskAppend) comes before the
    API events, so nothing but init and finalize reaches the plugin: no collective is counted, the
    communicator's activity line says none ran, and the report's time line says why."""
    log = tmp_path / "log"
    run_torch(probe, log, ONE_RANK_MIX, NCCLPROBE_GPU_TIMING="1", NCCLPROBE_FLUSH_S="0.5")
    result = events.read_dirs([log])
    assert result.skipped_total == 0
    inits = [e for e in result.events if e["ev"] == "comm_plugin_init"]
    assert inits and all(e["timing"] == "gpu" and e["nranks"] == 1 for e in inits)
    assert [e for e in result.events if e["ev"] == "coll_summary"] == []
    acts = [e for e in result.events if e["ev"] == "comm_activity"]
    assert acts and all(a["api_eager"] == 0 and a["api_captured"] == 0 and a["first_t"] is None for a in acts)
    assert {a["reason"] for a in acts} <= {"finalize", "exit"}
    from ncclprobe.commands import report as report_mod
    from ncclprobe.model import timing
    m = report_mod.load([log])
    lines = [timing.time_line(t, "comm") for t in timing.comm_times(m.comms)]
    assert lines and all("one-rank communicator takes NCCL's shortcut" in ln for ln in lines)


def test_what_nccl_calls_a_profiler_with_for_one_rank(tmp_path):
    """Every call NCCL makes to a plugin that asks for every v5 event (tests/c/rec_profiler.c, mask
    0xfff): eager all-reduces, one on a side stream, one captured into a CUDA graph and replayed. One rank:
    init and finalize only (enqueue.cc's nRanks == 1 shortcut comes before every event)."""
    rec = ps.cc(tmp_path / "librec_profiler.so", [Path(__file__).resolve().parent / "c" / "rec_profiler.c"],
                shared=True)
    out = tmp_path / "calls.txt"
    script = textwrap.dedent("""
        import os, torch, torch.distributed as dist
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = os.environ["TEST_PORT"]
        torch.cuda.set_device(0)
    """) + textwrap.dedent(ONE_RANK_MIX)
    env = {**os.environ, "NCCL_PROFILER_PLUGIN": str(rec), "REC_PROF_LOG": str(out), "REC_PROF_MASK": "fff",
           "TEST_PORT": str(free_port())}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = out.read_text().splitlines()
    copy = os.environ.get("NCCLPROBE_GPU_RECORD")  # where the device run keeps the record for the notes
    if copy:
        Path(copy).write_text("\n".join(calls) + "\n")
    assert calls and calls[0].split()[0] == "init"
    assert [c.split()[0] for c in calls if c.split()[0] not in ("init", "finalize")] == [], calls
