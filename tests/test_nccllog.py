"""NCCL_DEBUG=INFO parser on log text in the formats of NCCL 2.18 through 2.30 (tests/data/nccllog)."""
from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from ncclprobe import nccllog as nl

DATA = Path(__file__).parent / "data" / "nccllog"


def parse(name: str) -> nl.NcclLog:
    return nl.parse_files([DATA / name])


def test_2_18_init_complete_without_api_and_invalid_value():
    log = parse("nccl-2.18.log")
    (init,) = log.of(nl.CommInit)
    assert (init.api, init.phase, init.rank, init.nranks, init.nvml_dev) == (None, "COMPLETE", 0, 2, None)
    assert init.comm == "0x55d0c0a8e2a0" and init.bus_id == "1000" and init.comm_id == 0x4A5B6C7D8E9F0011
    (bad,) = log.of(nl.InvalidValue)
    assert (bad.var, bad.value, bad.default) == ("NCCL_BUFFSIZE", "99999999999999999999", "4194304")
    env = {e.var: e for e in log.of(nl.EnvSetting)}
    assert env["NCCL_MAX_NCHANNELS"].value == "16" and env["NCCL_MAX_NCHANNELS"].param_form
    assert env["NCCL_P2P_LEVEL"].value == "SYS" and not env["NCCL_P2P_LEVEL"].param_form
    assert env["NCCL_PROTO"].value == "LL"
    (cfg,) = log.of(nl.ConfigLine)
    assert (cfg.field, cfg.value, cfg.var) == ("blocking", "0", None)
    # the bare VERSION-level line and the INFO one; the bare one is attributed to the file's only writer
    versions = log.of(nl.VersionLine)
    assert [v.code for v in versions] == [21801, 21801]
    assert all((v.at.host, v.at.pid) == ("node1", 1001) for v in versions)
    assert log.counts["nccl_other"] == 4 and log.counts["unknown"] == 0


def test_2_23_api_names_split_without_count_and_numeric_tuning():
    log = parse("nccl-2.23.log")
    inits = log.of(nl.CommInit)
    assert [(i.api, i.phase) for i in inits] == [
        ("ncclCommInitRankConfig", "START"), ("ncclCommInitRankConfig", "COMPLETE"),
        ("ncclCommSplit", "START"), ("ncclCommSplit", "COMPLETE")]
    split = inits[2]
    assert (split.parent, split.color, split.key, split.split_count, split.comm_id) == ("0x5612aa001230", 7, 0, None, None)
    assert inits[0].comm_id == 0x1122334455667788 and inits[0].nvml_dev == 1
    t1, t2 = log.of(nl.Tuning)
    assert (t1.func, t1.nbytes, t1.algo, t1.proto, t1.time_us, t1.nchannels) == ("AllReduce", 8192, "Ring", "LL", 12.345, None)
    assert (t2.func, t2.algo, t2.proto) == ("ReduceScatter", "PAT", "Simple")
    (topo,) = log.of(nl.CommTopology)
    assert (topo.comm, topo.nranks, topo.nnodes, topo.local_rank, topo.mnnvl) == ("0x5612aa001230", 2, 1, 1, 0)
    assert all(r.at.pid == 2001 and r.at.host == "gpu-a" for r in log.records)


def test_2_26_timestamps_split_count_plugins_channels_and_warn():
    log = parse("nccl-2.26-ts.log")
    assert log.records[0].at.ts == "[2025-03-04 10:11:12]"
    split = [i for i in log.of(nl.CommInit) if i.parent][0]
    assert (split.split_count, split.color, split.key) == (1, 0, 0)
    plugins = log.of(nl.PluginLoaded)
    assert [(p.kind, p.name, p.version) for p in plugins] == [("profiler", "Inspector", 3), ("tuner", "example", None)]
    small, big = log.of(nl.Tuning)
    assert (small.algo, small.proto, small.channel_lo, small.channel_hi, small.nchannels) == ("Ring", "LL", 0, 1, 2)
    assert (big.nbytes, big.proto, big.nchannels) == (67108864, "Simple", 16)
    (warn,) = log.of(nl.Warn)
    assert (warn.file, warn.line, warn.at.pid) == ("transport/net_ib.cc", 601, 3001)
    assert warn.message.startswith("NET/IB : Got async event")
    assert log.counts["blank"] == 1


def test_2_28_config_reset_env_plugin_and_copy_engine():
    log = parse("nccl-2.28.log")
    assert [(p.kind, p.name, p.version) for p in log.of(nl.PluginLoaded)] == [("env", "ncclprobe", 1), ("profiler", "ncclprobe", 5)]
    resets = {c.field: c for c in log.of(nl.ConfigLine)}
    assert (resets["maxCTAs"].var, resets["maxCTAs"].value) == ("NCCL_MAX_CTAS", "8")
    assert (resets["netName"].var, resets["netName"].value) == ("NCCL_NET", "Socket")
    ce = log.of(nl.Tuning)[1]
    assert (ce.func, ce.proto, ce.algo) == ("AllGather", None, "CopyEngine(cudaMemcpyBatchAsync)")
    assert log.of(nl.VersionLine)[0].code == 22809
    assert log.counts["unknown"] == log.counts["malformed"] == log.counts["nccl_other"] == 0


def test_2_29_rank_prefix_child_count_graph_mixing_and_no_cache():
    log = parse("nccl-2.29.log")
    start = log.of(nl.CommInit)[0]
    assert (start.api, start.rank, start.comm_id) == ("ncclCommInitRankConfig", 2, 0xABCDEF0123456789)
    child = log.of(nl.CommInit)[2]
    assert (child.split_count, child.color, child.key, child.parent) == (3, 1, 2, "0x61ff00002000")
    (gm,) = log.of(nl.ConfigLine)
    assert (gm.field, gm.value, gm.var, gm.var_value) == ("graphUsageMode", "2", "NCCL_GRAPH_MIXING_SUPPORT", "1")
    assert [c.var for c in log.of(nl.CacheDisabled)] == ["NCCL_MAX_CTAS"]


def test_2_30_param_prefix_git_version_and_string_env():
    log = parse("nccl-2.30.log")
    assert [c.var for c in log.of(nl.CacheDisabled)] == ["NCCL_PROTO"]
    (plugin_env,) = log.of(nl.EnvSetting)
    assert plugin_env.var == "NCCL_ENV_PLUGIN" and plugin_env.value == "/opt/probe/libncclprobe.so"
    assert [(t.func, t.algo, t.nchannels) for t in log.of(nl.Tuning)] == [("ReduceScatter", "PAT", 32), ("AllReduce", "NVLSTree", 1)]
    assert log.counts["nccl_other"] == 1  # "NCCL git version ..." is NCCL's but not modelled
    assert log.of(nl.CommInit)[0].comm_id == 1


def test_interleaved_processes_launcher_prefixes_and_garbage():
    log = parse("torchrun-interleaved.log")
    by_pid = {}
    for e in log.of(nl.EnvSetting):
        by_pid.setdefault(e.at.pid, []).append((e.var, e.value))
    assert by_pid == {7002: [("NCCL_PROTO", "LL"), ("NCCL_MAX_NCHANNELS", "16")],
                      7001: [("NCCL_PROTO", "Simple"), ("NCCL_MAX_NCHANNELS", "16")]}
    assert log.counts["glued"] == 1
    # the two lines of one glued line keep the same source line
    glued = [e for e in log.of(nl.EnvSetting) if e.var == "NCCL_MAX_NCHANNELS"]
    assert {e.at.source.rsplit(":", 1)[1] for e in glued} == {"10"}
    assert sorted((i.at.pid, i.phase) for i in log.of(nl.CommInit)) == [
        (7001, "COMPLETE"), (7001, "START"), (7002, "COMPLETE"), (7002, "START")]
    # a changed Init line format is counted as malformed, not guessed at
    assert log.counts["malformed"] == 1
    assert log.counts["unknown"] == 7  # torch warning, traceback x2, bad tid, orphan, [rank1]: error, colour noise
    assert log.counts["nccl_other"] == 2
    assert log.of(nl.Warn)[0].message == "Cuda failure 'out of memory'"
    assert set(log.processes()) == {("gpu-b", 7001), ("gpu-b", 7002)}


def test_debug_file_per_process_warn_level_bare_version(tmp_path):
    log = nl.parse_files(sorted(DATA.glob("nccl.gpu-b.*.log")))
    versions = log.of(nl.VersionLine)
    assert sorted((v.at.pid, v.code) for v in versions) == [(7003, 22705), (7004, 22705)]
    assert len(log.files) == 2


def test_bare_version_stays_unattributed_when_file_has_several_writers():
    text = ["NCCL version 2.30.7+cuda13.1\n", "a:1:1 [0] NCCL INFO NCCL_PROTO set by environment to LL\n",
            "a:2:2 [0] NCCL INFO NCCL_PROTO set by environment to LL\n"]
    log = nl.parse_lines(text)
    v = log.of(nl.VersionLine)[0]
    assert v.at.pid is None and v.at.host is None and v.code == 23007


def test_simulated_version_suffix_is_flagged():
    log = nl.parse_lines(["h:9:9 [0] NCCL INFO NCCL version 2.28.9-simulated+cpu"])
    (v,) = log.of(nl.VersionLine)
    assert (v.version, v.suffix, v.build, v.simulated, v.code) == ("2.28.9", "-simulated", "cpu", True, 22809)
    real = nl.parse_lines(["h:9:9 [0] NCCL INFO NCCL version 2.28.9+cuda13.0"]).of(nl.VersionLine)[0]
    assert not real.simulated


def test_trace_level_old_tuning_without_function():
    log = nl.parse_lines(["h:5:6 [0] 12.500000 enqueue.cc:1498 NCCL TRACE 65536 Bytes -> Algo 0 proto 1 time 7.5"])
    (t,) = log.of(nl.Tuning)
    assert (t.func, t.nbytes, t.algo, t.proto, t.time_us) == (None, 65536, "Tree", "LL128", 7.5)
    odd = nl.parse_lines(["h:5:6 [0] NCCL INFO 64 Bytes -> Algo 42 proto 9 time nan"]).of(nl.Tuning)[0]
    assert (odd.algo, odd.proto) == ("#42", "#9")


def test_unreadable_and_symlinked_files_are_counted(tmp_path):
    real = tmp_path / "real.log"
    real.write_text("h:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Tree\n")
    link = tmp_path / "link.log"
    link.symlink_to(real)
    log = nl.parse_files([tmp_path / "missing.log", link, real])
    assert log.counts["unreadable"] == 2 and log.files == [str(real)]
    assert log.of(nl.EnvSetting)[0].value == "Tree"


def test_carriage_returns_inside_a_line_do_not_split_it(tmp_path):
    p = tmp_path / "cr.log"
    p.write_bytes(b"h:1:1 [0] NCCL INFO NCCL_PROTO set by environment to LL\r\n"
                  b"progress 10%\rprogress 20%\rh:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Ring\n")
    log = nl.parse_files([p])
    assert [(e.var, e.value) for e in log.of(nl.EnvSetting)] == [("NCCL_PROTO", "LL"), ("NCCL_ALGO", "Ring")]
    assert log.counts["lines"] == 2


def test_random_bytes_and_mutated_lines_never_crash(tmp_path):
    rng = random.Random(1234)
    samples = [ln for p in DATA.iterdir() for ln in p.read_bytes().split(b"\n")]
    blob = bytearray()
    for _ in range(3000):
        ln = bytearray(rng.choice(samples))
        for _ in range(rng.randint(0, 4)):
            if ln:
                ln[rng.randrange(len(ln))] = rng.randrange(256)
        if rng.random() < 0.2:
            ln = ln[: rng.randrange(len(ln) + 1)]
        blob += ln + b"\n"
    blob += os.urandom(20000)
    p = tmp_path / "fuzz.log"
    p.write_bytes(bytes(blob))
    log = nl.parse_files([p])
    c = log.counts
    assert c["records"] > 300
    accounted = c["records"] + c["blank"] + c["unknown"] + c["nccl_other"] + c["malformed"]
    assert accounted >= c["lines"]  # every line lands in some bucket (glued lines in several)


def test_overlong_line_is_skipped():
    log = nl.parse_lines(["h:1:1 [0] NCCL INFO NCCL_PROTO set by environment to " + "L" * (nl.MAX_LINE + 1)])
    assert log.records == [] and log.counts["unknown"] == 1


@pytest.mark.parametrize("pattern,expect", [
    ("nccl.%h.%p.log", "nccl.gpu-b.4242.log"),
    ("/tmp/%p/%h", "/tmp/4242/gpu-b"),
    ("100%%-%x", "100%-%x"),
    ("trailing%", "trailing%"),
])
def test_debug_file_name_expansion(pattern, expect):
    assert nl.debug_file_name(pattern, "gpu-b.cluster.local", 4242) == expect


@pytest.mark.parametrize("raw,canon", [("RING", "Ring"), ("COLLNET_DIRECT", "CollNetDirect"), ("NVLS_TREE", "NVLSTree"),
                                       ("SIMPLE", "Simple"), ("LL128", "LL128"), ("Tree", "Tree"), ("Other", "Other")])
def test_canonical_algo_proto_names(raw, canon):
    assert nl.canonical(raw) == canon


def test_real_uppercase_tuning_names_become_nccl_algo_spelling():
    small, big = parse("nccl-2.26-ts.log").of(nl.Tuning)
    assert (small.algo, small.proto, big.proto) == ("Ring", "LL", "Simple")


def test_real_2_28_9_log_from_the_h200():
    """A real NCCL 2.28.9 INFO log (one H200, torch 2.11, `ncclprobe demo --real`): a lazily created
    torch communicator and a ctypes one, with ncclprobe's env and profiler plugins loaded."""
    log = nl.parse_files([DATA / "real-2.28.9-h200-1gpu.log"])
    assert log.counts.get("malformed", 0) == 0
    (version,) = log.of(nl.VersionLine)
    assert version.code == 22809 and not version.simulated and version.build == "cuda13.0"
    done = [r for r in log.of(nl.CommInit) if r.phase == "COMPLETE"]
    assert [(r.api, r.comm, r.comm_id) for r in done] == [
        ("ncclCommInitRankConfig", "0x1541a650", 0x90f6b7090f9d3c29),
        ("ncclCommInitRank", "0x1cc411e0", 0xdd7f3ed9e10deeed)]
    env = {(r.var, r.value) for r in log.of(nl.EnvSetting)}
    assert {("NCCL_NVLS_ENABLE", "0"), ("NCCL_MAX_NCHANNELS", "16")} <= env
    assert not any(var == "NCCL_PROTO" for var, _ in env)  # a single rank never reads it (observed.md)
    plugins = {(p.kind, p.version) for p in log.of(nl.PluginLoaded)}
    assert ("profiler", 5) in plugins and ("env", 1) in plugins
    assert {r.at.pid for r in log.records} == {519}
