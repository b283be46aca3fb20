"""NCCL_DEBUG=INFO logs in the formats of NCCL 2.18 through 2.30 (tests/data/nccllog): the parser, the
attribution of env and TUNING lines to communicators, `report --nccl-log`, and hostile input."""
from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from ncclprobe import diagnose, model as model_mod
from ncclprobe.witnesses import nccllog as nl
from ncclprobe.witnesses import nccllog_model as nm
from ncclprobe.commands import report

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
    assert (topo.comm, topo.nranks, topo.nnodes, topo.local_rank, topo.mnnvl) == ("0x5612aa001230", 2, 1, 0, 0)
    assert all(r.at.pid == 2001 and r.at.host == "gpu-a" for r in log.records)


def test_2_26_timestamps_split_count_plugins_channels_and_warn():
    log = parse("nccl-2.26-ts.log")
    assert log.records[0].at.ts == "[2025-03-04 10:11:12]"
    split = [i for i in log.of(nl.CommInit) if i.parent][0]
    assert (split.split_count, split.color, split.key) == (1, 0, 0)
    plugins = log.of(nl.PluginLoaded)
    assert [(p.kind, p.name, p.version) for p in plugins] == [("profiler", "Inspector", None), ("tuner", "example", None)]
    small, big = log.of(nl.Tuning)
    assert (small.algo, small.proto, small.channel_lo, small.channel_hi, small.nchannels) == ("Ring", "LL", 0, 1, 2)
    assert (big.nbytes, big.proto, big.nchannels) == (67108864, "Simple", 16)
    (warn,) = log.of(nl.Warn)
    assert (warn.file, warn.line, warn.at.pid) == ("transport/net_ib.cc", 601, 3001)
    assert warn.message.startswith("NET/IB : Got async event")
    assert log.counts["blank"] == 1


def test_2_28_config_reset_and_env_plugin():
    log = parse("nccl-2.28.log")
    assert [(p.kind, p.name, p.version) for p in log.of(nl.PluginLoaded)] == [("env", "ncclprobe", 1), ("profiler", "ncclprobe", 5)]
    resets = {c.field: c for c in log.of(nl.ConfigLine)}
    assert (resets["maxCTAs"].var, resets["maxCTAs"].value) == ("NCCL_MAX_CTAS", "8")
    assert (resets["netName"].var, resets["netName"].value) == ("NCCL_NET", "Socket")
    assert log.of(nl.CommInit)[0].comm_id == 0xF0E0D0C0B0A0908
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


def test_2_30_param_prefix_git_version_string_env_and_copy_engine():
    log = parse("nccl-2.30.log")
    assert [c.var for c in log.of(nl.CacheDisabled)] == ["NCCL_PROTO"]
    (plugin_env,) = log.of(nl.EnvSetting)
    assert plugin_env.var == "NCCL_ENV_PLUGIN" and plugin_env.value == "/opt/probe/libncclprobe.so"
    assert [(t.func, t.algo, t.proto, t.nchannels) for t in log.of(nl.Tuning)] == [
        ("ReduceScatter", "PAT", "Simple", 32), ("AllReduce", "NVLSTree", "Simple", 1), ("AllGather", "CopyEngine", None, None)]
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


def test_overlong_line_is_skipped_and_counted_with_its_reason():
    log = nl.parse_lines(["h:1:1 [0] NCCL INFO NCCL_PROTO set by environment to " + "L" * (nl.MAX_LINE + 1)])
    assert log.records == [] and log.counts["too_long"] == 1
    assert log.problems() == {f"NCCL log line over {nl.MAX_LINE} bytes": 1}


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


# ---- communicators: which env and TUNING lines are whose ------------------------------------------

def load(*names: str, lines: list[str] | None = None, tmp_path: Path | None = None) -> model_mod.Model:
    """The model `report --nccl-log` builds from data files (or from `lines`, written to tmp_path)."""
    paths = [DATA / n for n in names]
    if lines is not None:
        paths.append(tmp_path / "given.log")
        paths[-1].write_text("".join(ln + "\n" for ln in lines))
    return report.load([], [str(p) for p in paths])


def comms(m: model_mod.Model) -> dict[tuple[int, str], model_mod.CommView]:
    # keyed by the pointer as the log prints it (%p); the model spells it as every witness does (comm_id)
    return {(c.pid, f"0x{int(c.comm, 16):x}"): c for c in m.comms}


def ran(c: model_mod.CommView) -> set[tuple]:
    return {(s.func, s.algo, s.proto, s.nchannels, s.bytes_min, s.bytes_max, s.count) for s in c.colls.values()}


def findings(m: model_mod.Model, expect: dict[str, str] | None = None):
    from ncclprobe.diagnose import inprocess
    return diagnose.rules(m, expect or {})


def test_2_18_env_lines_before_each_complete_belong_to_that_communicator():
    """2.18 prints no Init START: a thread's lines since its previous COMPLETE are the next init's."""
    m = load("nccl-2.18-two-comms.log")
    c = comms(m)
    first, second = c[(1101, "0x55d0c0a8e2a0")], c[(1101, "0x55d0c0b10000")]
    assert first.env == {"NCCL_MAX_NCHANNELS": "16", "NCCL_PROTO": "LL"} and first.env_source == "nccl-log"
    assert second.env == {"NCCL_MAX_NCHANNELS": "16", "NCCL_PROTO": "Simple"}
    assert c[(1102, "0x5611f0b10000")].env["NCCL_PROTO"] == "LL"
    assert second.destroyed and not first.destroyed
    codes = {(f.code, f.severity, tuple(f.pids)) for f in findings(m)}
    assert ("COMM_TUNING_DIVERGENT", "error", (1101,)) in codes
    # commId printed without its leading zero (%llx) joins both ranks under the one spelling
    divergent = [f for f in findings(m) if f.code == "COMM_RANKS_DIVERGENT"]
    assert [f.evidence["communicator"] for f in divergent] == ["0x07c5e2d1a0b9f3e4"]


def test_every_commid_from_a_log_has_the_one_spelling():
    m = load(*sorted(p.name for p in DATA.glob("*.log")))
    hashes = {c.comm_hash for c in m.comms if c.comm_hash}
    assert "0x0f0e0d0c0b0a0908" in hashes and "0x07c5e2d1a0b9f3e4" in hashes and "0x0000000000000001" in hashes
    assert all(re.fullmatch(r"0x[0-9a-f]{16}", h) for h in hashes)
    assert all(h == model_mod.comm_id(h) for h in hashes)


def test_2_21_coll_lines_name_the_communicator_of_each_tuning_line(tmp_path):
    m = load("nccl-2.21-coll.log")
    c = comms(m)
    ll, unset = c[(3001, "0x5581a0001000")], c[(3001, "0x5581a0002000")]
    assert ll.env == {"NCCL_BUFFSIZE": "16777216", "NCCL_PROTO": "LL"}
    assert unset.env == {"NCCL_BUFFSIZE": "16777216"}   # the ENV subsystem was on: no line is unset
    assert ran(ll) == {("?", "Ring", "LL", 0, 8192, 16384, 2)}
    assert ran(unset) == {("?", "Ring", "LL", 0, 8192, 8192, 1), ("?", "Ring", "Simple", 0, 1048576, 1048576, 1)}
    assert not any(k.startswith("NCCL log TUNING") for k in [*m.skipped, *m.reading.unattributed])
    assert not [f for f in findings(m) if f.code == "ALGO_PROTO_MISMATCH"]
    # without the COLL lines, what only one communicator's NCCL_PROTO allows is still its; the rest is not guessed
    lines = [ln for ln in (DATA / "nccl-2.21-coll.log").read_text().splitlines() if "opCount" not in ln]
    m = load(lines=lines, tmp_path=tmp_path)
    c = comms(m)
    assert ran(c[(3001, "0x5581a0001000")]) == set()
    assert ran(c[(3001, "0x5581a0002000")]) == {("?", "Ring", "Simple", 0, 1048576, 1048576, 1)}
    assert m.reading.unattributed[nm.SEVERAL] == 3 and nm.SEVERAL not in m.skipped  # read, kept on the process
    assert {(s.algo, s.proto, s.count) for s in m.processes[("gpu-c", 3001)].tuning} == {("Ring", "LL", 3)}


def test_2_28_inits_running_at_once_are_told_apart_by_thread():
    m = load("nccl-2.28-async-init.log")
    c = comms(m)
    ll, simple = c[(4101, "0x55aa00000100")], c[(4101, "0x55aa00000900")]
    assert ll.env == {"NCCL_MAX_NCHANNELS": "8", "NCCL_PROTO": "LL"}
    assert simple.env == {"NCCL_MAX_NCHANNELS": "8", "NCCL_PROTO": "Simple"}   # cached: the process's read
    assert ran(ll) == {("AllReduce", "Ring", "LL", 8, 4096, 4096, 1)}
    assert ran(simple) == {("AllReduce", "Ring", "Simple", 8, 4096, 4096, 1)}


def test_2_30_a_reused_address_is_a_new_communicator():
    m = load("nccl-2.30-reuse.log")
    first, second = [c for c in m.comms if c.pid == 7001]
    assert first.comm == second.comm and first.destroyed and not second.destroyed
    assert (first.comm_hash, second.comm_hash) == ("0x5d4c3b2a19080706", "0x8f7e6d5c4b3a2910")
    assert (first.env["NCCL_PROTO"], second.env["NCCL_PROTO"]) == ("LL128", "Simple")
    assert ran(first) == {("AllReduce", "Ring", "LL128", 4, 65536, 65536, 1)}
    assert ran(second) == {("AllReduce", "Ring", "Simple", 4, 65536, 65536, 1)}
    (warn,) = nl.parse_files([DATA / "nccl-2.30-reuse.log"]).of(nl.Warn)
    assert (warn.file, warn.line, warn.message) == ("misc/socket.cc", 50, "socketProgress: Connection closed by remote peer")


def test_real_2_28_9_log_gives_each_communicator_what_the_log_says():
    m = load("real-2.28.9-h200-1gpu.log")
    first, second = [c for c in m.comms if c.pid == 519]
    assert (first.api, second.api) == ("ncclCommInitRankConfig", "ncclCommInitRank")
    assert first.env["NCCL_NVLS_ENABLE"] == "0" and first.env["NCCL_MAX_NCHANNELS"] == "16"
    assert {k: second.env[k] for k in ("NCCL_NVLS_ENABLE", "NCCL_MAX_NCHANNELS")} == {"NCCL_NVLS_ENABLE": "0",
                                                                                        "NCCL_MAX_NCHANNELS": "16"}
    assert "NCCL_PROTO" not in first.env and "NCCL_PROTO" not in second.env
    missing = [f for f in findings(m, {"NCCL_PROTO": "LL"}) if f.code == "ENV_MISSING"]
    # one cause (the log saw no process environment: where it was lost is not known), both communicators
    [f] = missing
    assert f.to_json()["communicators"] == ["0x90f6b7090f9d3c29", "0xdd7f3ed9e10deeed"]
    assert f.severity == "error" and f.evidence["sources"] == ["nccl-log"] and f.edge["kind"] == "unseen"
    assert not first.colls and not m.processes[("vm", 519)].tuning   # one rank: NCCL tunes nothing


def test_without_env_lines_a_communicators_environment_is_unknown_not_unset(tmp_path):
    lines = ["h:9:9 [0] NCCL INFO NCCL version 2.28.9+cuda13.0",
             "h:9:9 [0] NCCL INFO ncclCommInitRank comm 0x1000 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 "
             "commId 0x77 - Init START",
             "h:9:9 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS",   # NCCL_ALL: printed at any subsystem
             "h:9:9 [0] NCCL INFO ncclCommInitRank comm 0x1000 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 "
             "commId 0x77 - Init COMPLETE"]
    m = load(lines=lines, tmp_path=tmp_path)
    (c,) = m.comms
    assert c.env is None and c.comm_hash == "0x0000000000000077"
    assert findings(m, {"NCCL_PROTO": "LL"}) == []


def test_tuning_lines_of_several_equal_communicators_are_not_guessed(tmp_path):
    init = ("h:9:9 [0] NCCL INFO ncclCommInitRank comm {p} rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 "
            "commId {i} - Init {ph}")
    lines = [init.format(p="0x1000", i="0xa", ph="START"), "h:9:9 [0] NCCL INFO NCCL_ALGO set by environment to Ring",
             init.format(p="0x1000", i="0xa", ph="COMPLETE"),
             init.format(p="0x2000", i="0xb", ph="START"), "h:9:9 [0] NCCL INFO NCCL_ALGO set by environment to Ring",
             init.format(p="0x2000", i="0xb", ph="COMPLETE"),
             "h:9:9 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}",
             "h:9:9 [0] NCCL INFO comm 0x2000 rank 0 nranks 2 cudaDev 0 busId 1000 - Destroy COMPLETE",
             "h:9:9 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}"]
    m = load(lines=lines, tmp_path=tmp_path)
    a, b = m.comms
    assert ran(a) == {("AllReduce", "Ring", "LL", 2, 4096, 4096, 1)} and ran(b) == set()
    assert m.reading.unattributed[nm.SEVERAL] == 1 and nm.SEVERAL not in m.skipped


def test_a_profilers_collectives_are_never_counted_twice_with_the_log(tmp_path):
    """A probe directory with the log of the same process: the profiler's counts stand alone."""
    d = tmp_path / "logs"
    d.mkdir(mode=0o700)
    ev = {"t": 1.0, "host": "vm", "pid": 9800}
    lines = [{"ev": "comm_plugin_init", "src": "profiler", "comm_hash": "0x764413d93a78d6c7", "nranks": 2, "rank": 0,
              "lib": "/x/libnccl.so.2", "env": {"NCCL_PROTO": "LL"}, **ev},
             {"ev": "coll_summary", "src": "profiler", "comm_hash": "0x764413d93a78d6c7", "func": "AllReduce",
              "algo": "Ring", "proto": "LL", "nchannels": 16, "bytes_min": 14336, "bytes_max": 14336, "count": 8, **ev}]
    (d / "vm-9800.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    init = ("vm:9800:9800 [0] NCCL INFO ncclCommInitRankConfig comm 0x55e8a016c8a0 rank 0 nranks 2 cudaDev 0 "
            "nvmlDev 0 busId 1000 commId 0x764413d93a78d6c7 - Init {}")
    (d / "nccl-debug.vm.9800").write_text("\n".join(
        [init.format("START"), "vm:9800:9800 [0] NCCL INFO NCCL_PROTO set by environment to LL", init.format("COMPLETE")]
        + ["vm:9800:9800 [0] NCCL INFO AllReduce: 14336 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..15}"] * 8) + "\n")
    m = report.load([str(d)])
    (c,) = m.comms
    assert c.seen_by == {"profiler", "nccl-log"} and c.env_source == "profiler"
    assert ran(c) == {("AllReduce", "Ring", "LL", 16, 14336, 14336, 8)}
    assert c.comm == "0x000055e8a016c8a0" and c.api == "ncclCommInitRankConfig"  # comm_id's spelling


@pytest.mark.slow
def test_demo_logs_alone_give_each_communicator_its_values_and_check_expect(tmp_path):
    """The demo's NCCL_DEBUG_FILE output, read with nothing else: the second communicator of each rank
    got NCCL_PROTO=Simple, rank 0's TUNING lines say what ran, and --expect is checked against it."""
    r = subprocess.run([sys.executable, "-m", "ncclprobe", "demo", "--keep", "--json"], capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    log_dir = Path(json.loads(r.stdout)["log_dir"])
    try:
        files = sorted(str(p) for p in log_dir.glob("nccl-debug*"))
        assert len(files) == 2
        args = [sys.executable, "-m", "ncclprobe", "report"] + [a for f in files for a in ("--nccl-log", f)]
        plain = subprocess.run(args + ["--json"], capture_output=True, text=True, timeout=120)
        out = json.loads(plain.stdout)
        per_comm = {(c["rank"], c["api"]): c for c in out["communicators"]}
        assert len(per_comm) == 4 and all(c["env_source"] == "nccl-log" for c in out["communicators"])
        assert {k: c["env"]["NCCL_PROTO"] for k, c in per_comm.items()} == {
            (0, "ncclCommInitRankConfig"): "LL", (1, "ncclCommInitRankConfig"): "LL",
            (0, "ncclCommInitRank"): "Simple", (1, "ncclCommInitRank"): "Simple"}
        assert {(s["algo"], s["proto"]) for s in per_comm[(0, "ncclCommInitRankConfig")]["collectives"]} == {("Ring", "LL")}
        assert {(s["algo"], s["proto"]) for s in per_comm[(0, "ncclCommInitRank")]["collectives"]} == {("Ring", "Simple")}
        assert plain.returncode == 1 and {f["code"] for f in out["findings"]} == {"COMM_TUNING_DIVERGENT"}
        expect = subprocess.run(args + ["--json", "--expect", "NCCL_PROTO=LL"], capture_output=True, text=True,
                                timeout=120)
        changed = [f for f in json.loads(expect.stdout)["findings"] if f["code"] == "ENV_CHANGED"]
        assert expect.returncode == 1 and len(changed) == 1 and changed[0]["ranks"] == [0, 1]  # one cause, two ranks
        assert all(f["severity"] == "error" and f["evidence"]["vars"]["NCCL_PROTO"]["value"] == "Simple" and
                   f["evidence"]["checked_at"] == "communicator creation" for f in changed)
        text = subprocess.run(args, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"})
        lines = text.stdout[text.stdout.index("\nCommunicators\n"):].splitlines()[2:]
        start = next(i for i, ln in enumerate(lines) if ln.split() == ["API", "ncclCommInitRank"])
        block = lines[start:start + 6]  # API, library, seen by, env at creation, NCCL read, ran
        assert "rank 0 of 2" in lines[start - 1] and "Ring/Simple" in " ".join(block)
        assert sum(ln.count("PROTO=Simple") for ln in block) == 2 and not any("PROTO=LL" in ln for ln in block)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


# ---- hostile input: linear time, bounded memory, type-safe records --------------------------------

class _Counting:
    """A compiled pattern that counts its calls (the parser's work is a bounded number of anchored,
    bounded-repeat matches per ':pid:tid ' it finds, never a search from every position)."""

    def __init__(self, pattern: re.Pattern):
        self.pattern, self.calls = pattern, 0

    def __getattr__(self, name):
        fn = getattr(self.pattern, name)

        def counted(*a, **kw):
            self.calls += 1
            return fn(*a, **kw)
        return counted


def test_header_matching_is_a_bounded_number_of_anchored_matches_per_anchor(monkeypatch):
    tail, host = _Counting(nl._TAIL), _Counting(nl._HOST_REV)
    monkeypatch.setattr(nl, "_TAIL", tail)
    monkeypatch.setattr(nl, "_HOST_REV", host)
    nl.parse_lines(["x" * 40_000, "a" * 8000 + " NCCL INFO " * 500, "[" * 30_000])
    assert tail.calls == 0 and host.calls == 0      # no ':pid:tid ': nothing tried, whatever the length
    nl.parse_lines(["a:1:1 " * 6_000])              # 6,000 almost-prefixes: one tail match each
    assert tail.calls == 6_000 and host.calls == 0
    glued = "h:1:1 [0] NCCL INFO NCCL_BUFFSIZE set by environment to 4194304." * 300
    log = nl.parse_lines([glued])
    assert tail.calls == 6_300 and host.calls == 300 and len(log.of(nl.EnvSetting)) == 300


@pytest.mark.timeout(60)
def test_long_lines_without_a_prefix_cost_no_more_than_short_ones(tmp_path):
    """The old parser took 104 s on 200 lines of 8k characters, 3.3 s on one of 20k (quadratic)."""
    p = tmp_path / "long.log"
    with open(p, "wb") as f:
        f.write((b"a" * 8000 + b"\n") * 200)
        for n in (10_000, 20_000, 40_000, 60_000):
            f.write(b"x" * n + b"\n" + b"y:" * (n // 2) + b"\n" + b"1:" * (n // 2) + b"\n")
        f.write(b"h:1:1 [0] NCCL INFO NCCL_PROTO set by environment to LL\n")
        f.write(b"h:1:1 [0] NCCL INFO NCCL_ALGO set by environment to " + b" " * 60_000 + b"Ring\n")
    log = nl.parse_files([p])
    assert [(e.var, e.value.strip()) for e in log.of(nl.EnvSetting)] == [("NCCL_PROTO", "LL"), ("NCCL_ALGO", "Ring")]
    assert log.counts["unknown"] == 212


def test_a_huge_line_without_newline_is_skipped_in_bounded_memory(tmp_path):
    p = tmp_path / "huge.log"
    with open(p, "wb") as f:
        f.write(b"h:1:1 [0] NCCL INFO NCCL_PROTO set by environment to LL\n")
        f.write(b"h:1:1 [0] NCCL INFO " + b"z" * (1 << 20) * 24 + b"\n")
        f.write(b"h:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Ring\n")
        f.write(b"q" * (1 << 20) * 24)   # and one that never ends
    tracemalloc.start()
    try:
        log = nl.parse_files([p])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * (nl.MAX_LINE + nl.CHUNK) + (1 << 20), peak   # never a whole line, never the file
    assert log.counts["too_long"] == 2 and log.counts["lines"] == 4
    assert [e.var for e in log.of(nl.EnvSetting)] == ["NCCL_PROTO", "NCCL_ALGO"]


def test_read_lines_splits_at_every_chunk_boundary(tmp_path):
    p = tmp_path / "edges.log"
    lines = [b"a" * n for n in (0, 1, nl.CHUNK - 1, nl.CHUNK, nl.CHUNK + 1, nl.MAX_LINE, nl.MAX_LINE + 1, 3)]
    p.write_bytes(b"\n".join(lines))
    from ncclprobe.witnesses import jsonlines
    got = list(nl.read_lines(jsonlines.Source(p).pieces()))
    assert got == [ln if len(ln) <= nl.MAX_LINE else None for ln in lines]


def test_fifos_and_other_non_regular_files_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "nccl-debug.h.1"
    os.mkfifo(fifo)
    log = nl.parse_files([fifo, tmp_path])
    assert log.unreadable == {str(fifo): "not a regular file (FIFO)", str(tmp_path): "not a regular file (directory)"}
    assert log.files == [] and log.counts["unreadable"] == 2


def _hostile_lines(rng: random.Random) -> list[bytes]:
    samples = [ln for p in sorted(DATA.iterdir()) for ln in p.read_bytes().split(b"\n") if ln]
    big = b"9" * 30
    out = [
        b"h:1:1 [0] NCCL INFO ncclCommInitRank comm 0x1 rank " + big + b" nranks 2 cudaDev 0 nvmlDev 0 busId 1 "
        b"commId 0x1 - Init START",
        b"h:1:1 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 2147483648 nranks 2 cudaDev 0 busId 1 - Init COMPLETE",
        b"h:1:1 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1 commId 0x" + b"f" * 40
        + b" - Init COMPLETE",
        b"h:1:1 [0] NCCL INFO AllReduce: " + big + b" Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}",
        b"h:1:1 [0] NCCL INFO AllReduce: 9223372036854775808 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}",
        b"h:1:1 [0] NCCL INFO AllReduce: 8 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..99999999999}",
        b"h:1:1 [0] NCCL INFO 8 Bytes -> Algo 99999 proto -7 time 1e999",
        b"h:1:1 [0] NCCL INFO AllReduce [Symmetric]: 8 Bytes -> Kernel \x1b[2J nchannels 0 nthreads 1",
        b"h:" + big + b":1 [0] NCCL INFO NCCL_PROTO set by environment to LL",
        b"h:1:1 [" + big + b"] NCCL INFO NCCL_PROTO set by environment to LL",
        b"h:1:1 [0] NCCL INFO NCCL_PROTO set by environment to \x1b]8;;http://x\x07LL\x1b[0m\xff\xfe",
        b"\x1b[31mh\x1b:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda\x1b[2J",
        b"[" + b"\x00" * 60 + b"] h:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Ring",
        b"h:1:1 [0] " + b"f" * 300 + b":1 (" + b"g" * 300 + b") NCCL WARN x",
        b"h:1:1 [0] NCCL INFO Comm config maxCTAs reset to " + big + b" by NCCL_MAX_CTAS=8",
        b"h:1:1 [0] NCCL INFO AllReduce: opCount fffffffffffffffff sendbuff 0x1 recvbuff 0x1 count " + big
        + b" datatype 7 op 0 root 0 comm 0x1 [nranks=2] stream 0x1",
    ]
    pool = samples + out
    for _ in range(3000):
        ln = bytearray(rng.choice(pool))
        for _ in range(rng.randint(0, 4)):
            if ln:
                ln[rng.randrange(len(ln))] = rng.randrange(256)
        if rng.random() < 0.3:
            ln = ln[: rng.randrange(len(ln) + 1)]
        out.append(bytes(ln))
    return out


def _check_types(obj, path="") -> None:
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        where = f"{path}{type(obj).__name__}.{f.name}={v!r}"
        if dataclasses.is_dataclass(v):
            _check_types(v, where + " > ")
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int):
            assert -(1 << 64) < v < 1 << 64, where
        elif isinstance(v, float):
            assert v == v and abs(v) != float("inf"), where
        else:
            assert isinstance(v, str) and (v.isprintable() or f.name == "source"), where


def test_fuzz_random_bytes_huge_numbers_escapes_and_truncation_never_crash(tmp_path):
    rng = random.Random(20261201)
    p = tmp_path / "fuzz.log"
    p.write_bytes(b"\n".join(_hostile_lines(rng)) + b"\n" + os.urandom(50_000))
    log = nl.parse_files([p])
    assert log.counts["records"] > 200 and log.counts["malformed"] > 10
    for rec in log.records:
        _check_types(rec)
    result = report.build_report([], [str(p)], {"NCCL_PROTO": "LL"})   # the model, the rules and the report
    json.dumps(result.data, allow_nan=False)
    for c in result.data["communicators"]:
        assert c["comm_hash"] is None or re.fullmatch(r"0x[0-9a-f]{16}", c["comm_hash"])
        assert all(isinstance(k, str) and isinstance(v, str) and v.isprintable() for k, v in (c["env"] or {}).items())


def test_every_truncation_of_every_sample_line_parses_or_is_counted():
    for p in sorted(DATA.iterdir()):
        for ln in p.read_text(errors="replace").splitlines():
            for cut in range(len(ln) + 1):
                log = nl.parse_lines([ln[:cut]])
                c = log.counts
                assert c["records"] + c["blank"] + c["unknown"] + c["nccl_other"] + c["malformed"] >= 1
                for rec in log.records:
                    _check_types(rec)


@pytest.mark.timeout(60)
def test_report_of_a_log_directory_with_hostile_nccl_debug_files_stays_fast(tmp_path):
    """report merges a directory's nccl-debug* files by itself: one 40k-character line made `run`
    take 13 s after its command had finished, and 200 lines of 8k took 104 s."""
    d = tmp_path / "logs"
    d.mkdir(mode=0o700)
    init = ("vm:77:77 [0] NCCL INFO ncclCommInitRank comm 0x1000 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 "
            "commId 0xbdba985b4a6820a - Init {}\n")
    with open(d / "nccl-debug.vm.77", "w") as f:
        f.write("z" * 40_000 + "\n" + ("a" * 8000 + "\n") * 200)
        f.write(init.format("START") + "vm:77:77 [0] NCCL INFO NCCL_PROTO set by environment to LL\n"
                + init.format("COMPLETE"))
    r = subprocess.run([sys.executable, "-m", "ncclprobe", "report", str(d), "--json", "--expect", "NCCL_PROTO=Simple"],
                       capture_output=True, text=True, timeout=60)
    out = json.loads(r.stdout)
    (c,) = out["communicators"]
    assert (c["comm_hash"], c["env"], c["env_source"]) == ("0x0bdba985b4a6820a", {"NCCL_PROTO": "LL"}, "nccl-log")
    assert r.returncode == 1 and [f["code"] for f in out["findings"]] == ["ENV_CHANGED"]


def _mutants(lines: list[str], rng: random.Random) -> list[str]:
    """Lines that share a prefix with the line before and then differ: another tid, a second prefix glued
    on, a prefix at the end of the line, the level alone, a byte cut from the prefix."""
    out = []
    for line in lines:
        out.append(line)
        m = nl._AT_START.match(line)
        if m is None:
            continue
        head, rest = line[:m.end()], line[m.end():]
        out += [head + rest[::-1], head + head + rest, head.rstrip(" "), line, head + "x " + head,
                line.replace(":", "::", 1), head[:-2] + " " + rest, head + rest + " " + head + "INFO end",
                head.replace(m["tid"] + " ", m["tid"] + "1 ", 1) + rest]
        if rng.random() < 0.3:
            i = rng.randrange(len(head))
            out.append(head[:i] + head[i + 1:] + rest)
    return out


def test_a_prefix_shared_with_the_line_before_parses_as_if_read_afresh(monkeypatch):
    """parse_lines reads a prefix that began the line before once (REUSE_PREFIX): every record and count
    is what reading each prefix afresh gives, on the real logs and on lines that share a prefix and then
    differ."""
    rng, paths = random.Random(7), sorted(DATA.glob("*.log"))
    assert len(paths) >= 10
    for path in paths:
        lines = path.read_text(errors="replace").splitlines()
        for text in (lines, _mutants(lines, rng)):
            got = nl.parse_lines(list(text), path.name)
            monkeypatch.setattr(nl, "REUSE_PREFIX", False)
            want = nl.parse_lines(list(text), path.name)
            monkeypatch.setattr(nl, "REUSE_PREFIX", True)
            assert got.records == want.records, path.name
            assert got.counts == want.counts, path.name


def test_what_parse_lets_go_changes_nothing_merge_gives(monkeypatch):
    """parse() drops the reading's own state and makes equal strings one (drop_state) before its result is
    handed over: the model merge() makes of it is the one it makes of everything, on a demo run and on
    every real log."""
    from ncclprobe.views import report as view
    from ncclprobe.witnesses import events
    demo = Path(__file__).parent / "data" / "demo-run"
    cases = [([str(demo)], sorted(str(p) for p in demo.glob("nccl-debug*")))]
    cases += [([], [str(p)]) for p in sorted(DATA.glob("*.log"))]

    def model_of(dirs, paths):
        m = model_mod.build(events.stream_dirs(dirs, fold=True))
        nm.merge(m, paths, nm.parse(paths))
        findings = diagnose.rules(m, {"NCCL_PROTO": "LL"})
        return {**view.model_json(m), "findings": [f.to_json() for f in findings],
                "plugins": [p.plugins for p in m.processes.values()]}
    comms = 0
    for dirs, paths in cases:
        lean = model_of(dirs, paths)
        monkeypatch.setattr(nm.Attribution, "drop_state", lambda self: None)
        whole = model_of(dirs, paths)
        monkeypatch.undo()
        assert json.dumps(lean, sort_keys=True, default=str) == json.dumps(whole, sort_keys=True, default=str), paths
        comms += len(lean["communicators"])
    assert comms > 20
