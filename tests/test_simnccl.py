"""The simulated NCCL: both ways of calling it, NCCL's environment semantics, conf files, the env
and profiler plugin ABIs, odd input, and its NCCL_DEBUG output read back by ncclprobe.witnesses.nccllog."""
from __future__ import annotations

import ctypes
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ncclprobe.witnesses import nccllog as nl

ROOT = Path(__file__).resolve().parents[1]
CSIM = Path(__file__).parent / "csim"
WORKER = CSIM / "simworker.py"
sys.path.insert(0, str(Path(__file__).resolve().parent / "c"))
import probe_support as ps  # noqa: E402


@pytest.fixture(scope="session")
def libs(tmp_path_factory):
    """A fresh build of the sim (probes/build.py) and of the test plugins from tests/csim."""
    sys.path.insert(0, str(ROOT / "probes"))
    try:
        import build as probes_build
    finally:
        sys.path.pop(0)
    out = tmp_path_factory.mktemp("lib")
    probes_build.build(out)
    cc = probes_build.compiler()
    flags = ["-O1", "-fPIC", "-shared", "-std=gnu11", "-Wall", "-D_GNU_SOURCE"]
    built = {"dir": out, "sim": out / "sim"}
    for name, src, extra in [("envplugin", "envplugin.c", []), ("prof5", "profplugin.c", []),
                             ("prof4", "profplugin.c", ["-DPROF_V4"]), ("hook", "hook.c", ["-ldl"])]:
        target = out / f"libsimtest-{name}.so"
        subprocess.run([cc, *flags, "-o", str(target), str(CSIM / src), *extra], check=True)
        built[name] = target
    return built


def clean_env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL", "SIMTEST_", "LD_PRELOAD"))}
    env["NCCLSIM_ETC_NCCL_CONF"] = "/nonexistent/nccl.conf"  # never the machine's own /etc/nccl.conf
    env["NCCLSIM_HOME"] = "/nonexistent"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_worker(libs, tmp_path, mode, plan, env, tag="w"):
    out = tmp_path / f"{tag}.jsonl"
    p = subprocess.run([sys.executable, str(WORKER), "--mode", mode, "--lib-dir", str(libs["sim"]), "--out", str(out),
                        json.dumps(plan)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    results = [json.loads(line) for line in out.read_text().splitlines()]
    return results, p.stdout


def prof_lines(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        kind, *kv = line.split()
        rows.append({"kind": kind, **dict(x.split("=", 1) for x in kv if "=" in x)})
    return rows


@pytest.fixture(scope="session")
def uid(libs):
    lib = ctypes.CDLL(str(libs["sim"] / "libnccl.so.2"))
    buf = (ctypes.c_ubyte * 128)()
    assert lib.ncclGetUniqueId(buf) == 0
    return bytes(buf).hex()


# ------------------------------------------------------------------ library surface

def test_exports_soname_marker_and_simtorch_linkage(libs):
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    with open(libs["sim"] / "libnccl.so.2", "rb") as fh:
        elf = ELFFile(fh)
        dyn = next(s for s in elf.iter_sections() if isinstance(s, DynamicSection))
        assert [t.soname for t in dyn.iter_tags() if t.entry.d_tag == "DT_SONAME"] == ["libnccl.so.2"]
        syms = {s.name for s in elf.get_section_by_name(".dynsym").iter_symbols() if s["st_shndx"] != "SHN_UNDEF"}
    api = {"ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommSplit",
           "ncclCommInitAll", "ncclAllReduce", "ncclCommDestroy", "ncclCommFinalize", "ncclCommAbort",
           "ncclCommCount", "ncclCommUserRank", "ncclCommCuDevice", "ncclGetErrorString", "ncclGetLastError"}
    assert api <= syms and {"p" + s for s in api} <= syms and "ncclSimulated" in syms
    with open(libs["sim"] / "libsimtorch.so", "rb") as fh:
        dyn = next(s for s in ELFFile(fh).iter_sections() if isinstance(s, DynamicSection))
        tags = {(t.entry.d_tag, getattr(t, "needed", None) or getattr(t, "runpath", None)) for t in dyn.iter_tags()}
    assert ("DT_NEEDED", "libnccl.so.2") in tags and ("DT_RUNPATH", "$ORIGIN") in tags


def test_version_marker_and_error_strings(libs):
    lib = ctypes.CDLL(str(libs["sim"] / "libnccl.so.2"))
    v = ctypes.c_int()
    assert lib.ncclGetVersion(ctypes.byref(v)) == 0 and v.value == 22809
    assert lib.ncclGetVersion(None) == 4
    assert ctypes.c_int.in_dll(lib, "ncclSimulated").value == 1
    marker = ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(lib, "ncclSimVersionString")))
    assert marker == b"NCCL version 2.28.9-simulated+cpu"
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    assert lib.ncclGetErrorString(0) == b"no error"
    assert lib.ncclGetErrorString(4).startswith(b"invalid argument")
    assert lib.ncclGetErrorString(99) == b"unknown result code"


# ------------------------------------------------------------------ caching, re-reading, both callers

@pytest.mark.parametrize("mode", ["ctypes", "simtorch"])
def test_cached_params_ignore_late_changes_but_proto_is_reread(libs, tmp_path, uid, mode):
    prof = tmp_path / "prof.log"
    env = clean_env(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,ENV,TUNING", NCCL_PROTO="LL",
                    NCCL_MAX_NCHANNELS=16, NCCL_PROFILER_PLUGIN=libs["prof5"], SIMTEST_PROF_LOG=prof)
    plan = [["uid", uid], ["init", "decode", 2, 0], ["allreduce", "decode", 4096],
            ["setenv", "NCCL_PROTO", "Simple"], ["setenv", "NCCL_MAX_NCHANNELS", "4"],
            ["init", "verify", 2, 0], ["allreduce", "verify", 4096], ["allreduce", "decode", 4096],
            ["destroy", "decode"], ["destroy", "verify"]]
    results, stdout = run_worker(libs, tmp_path, mode, plan, env)
    assert all(r["rc"] == 0 for r in results), results
    assert results[2]["first"] == 1.5  # simulated all-reduce: the rank's own data
    rows = prof_lines(prof)
    inits = [r for r in rows if r["kind"] == "init"]
    colls = [r for r in rows if r["kind"] == "coll"]
    assert [i["proto_env"] for i in inits] == ["LL", "Simple"]
    assert inits[0]["hash"] == inits[1]["hash"]  # same unique id -> same commHash
    assert [(c["proto"], c["algo"], c["nch"], c["func"], c["dt"]) for c in colls] == [
        ("LL", "RING", "16", "AllReduce", "ncclFloat32"),
        ("SIMPLE", "RING", "16", "AllReduce", "ncclFloat32"),   # PROTO re-read; MAX_NCHANNELS cached at 16
        ("LL", "RING", "16", "AllReduce", "ncclFloat32")]        # the first comm keeps what it read
    # comm->seqNumber[func] counts from 0 per communicator (profiler.cc ncclProfilerStartTaskEvents)
    assert [c["seq"] for c in colls] == ["0", "0", "1"] and rows.count({"kind": "stop"}) == 3
    assert [r["kind"] for r in rows].count("finalize") == 2

    log = nl.parse_lines(stdout.splitlines(), "stdout")
    (version,) = log.of(nl.VersionLine)
    assert version.simulated and version.code == 22809 and version.at.pid is not None
    env_lines = [(e.var, e.value) for e in log.of(nl.EnvSetting)]
    assert env_lines.count(("NCCL_MAX_NCHANNELS", "16")) == 1 and ("NCCL_MAX_NCHANNELS", "4") not in env_lines
    assert [v for k, v in env_lines if k == "NCCL_PROTO"] == ["LL", "Simple"]
    assert [(t.algo, t.proto, t.nchannels, t.nbytes) for t in log.of(nl.Tuning)] == [
        ("Ring", "LL", 16, 16384), ("Ring", "Simple", 16, 16384), ("Ring", "LL", 16, 16384)]
    inits = log.of(nl.CommInit)
    api = "ncclCommInitRank"
    assert [(i.api, i.phase) for i in inits] == [(api, "START"), (api, "COMPLETE")] * 2
    assert {i.comm_id for i in inits} == {int(inits[0].comm_id)}
    assert [p.name for p in log.of(nl.PluginLoaded)] == ["simtest-prof"]
    assert log.counts["malformed"] == 0


def test_ranks_of_one_comm_share_hashes_and_splits_derive_theirs(libs, tmp_path, uid):
    prof = tmp_path / "prof.log"
    per_rank = []
    for rank in (0, 1):
        env = clean_env(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,TUNING", NCCL_PROFILER_PLUGIN=libs["prof5"],
                        SIMTEST_PROF_LOG=prof)
        plan = [["uid", uid], ["initcfg", "world", 2, rank, {"maxCTAs": 8, "commName": "tp"}],
                ["split", "world", "spec", 5, 0], ["split", "world", "none", -1, 0], ["allreduce", "spec", 64],
                ["info", "spec"], ["destroy", "spec"], ["destroy", "world"]]
        results, stdout = run_worker(libs, tmp_path, "simtorch", plan, env, tag=f"r{rank}")
        assert all(r["rc"] == 0 for r in results), results
        assert results[3]["null"] is True  # NCCL_SPLIT_NOCOLOR: no child
        assert (results[5]["rank"], results[5]["nranks"]) == (rank, 2)
        per_rank.append(nl.parse_lines(stdout.splitlines()))
    inits = [r for r in prof_lines(prof) if r["kind"] == "init"]
    by_rank = {0: [i for i in inits if i["rank"] == "0"], 1: [i for i in inits if i["rank"] == "1"]}
    assert [i["hash"] for i in by_rank[0]] == [i["hash"] for i in by_rank[1]]
    world, spec = by_rank[0]
    assert world["hash"] != spec["hash"] and world["name"] == "tp" and world["nranks"] == "2"
    assert spec["name"] == "tp"  # the child inherits the parent's config
    # TUNING lines come from rank 0 only, as in NCCL
    assert len(per_rank[0].of(nl.Tuning)) == 1 and per_rank[1].of(nl.Tuning) == []
    split = [i for i in per_rank[1].of(nl.CommInit) if i.api == "ncclCommSplit"]
    assert split and split[0].color == 5 and split[0].split_count == 1 and split[0].parent is not None
    assert {i.api for i in per_rank[0].of(nl.CommInit)} == {"ncclCommInitRankConfig", "ncclCommSplit"}


def test_env_maxctas_overrides_caller_config_and_is_logged(libs, tmp_path, uid):
    prof = tmp_path / "prof.log"
    env = clean_env(NCCL_DEBUG="INFO", NCCL_MAX_CTAS=4, NCCL_PROFILER_PLUGIN=libs["prof5"], SIMTEST_PROF_LOG=prof)
    plan = [["uid", uid], ["initcfg", "c", 2, 0, {"maxCTAs": 8}], ["allreduce", "c", 1024]]
    results, stdout = run_worker(libs, tmp_path, "ctypes", plan, env)
    assert all(r["rc"] == 0 for r in results)
    log = nl.parse_lines(stdout.splitlines())
    cfg = {(c.field, c.var): c.value for c in log.of(nl.ConfigLine)}
    assert cfg[("maxCTAs", None)] == "8" and cfg[("maxCTAs", "NCCL_MAX_CTAS")] == "4"
    assert [r["nch"] for r in prof_lines(prof) if r["kind"] == "coll"] == ["4"]


# ------------------------------------------------------------------ LD_PRELOAD: linked vs ctypes callers

def test_preload_hook_sees_the_linked_caller_but_not_ctypes(libs, tmp_path, uid):
    hooklog = tmp_path / "hook.log"
    env = clean_env(LD_PRELOAD=libs["hook"], SIMTEST_HOOK_LOG=hooklog)
    plan = [["uid", uid], ["initcfg", "c", 2, 1, {}], ["allreduce", "c", 8], ["destroy", "c"]]
    res, _ = run_worker(libs, tmp_path, "simtorch", plan, env, tag="linked")
    assert all(r["rc"] == 0 for r in res)
    assert hooklog.read_text().splitlines() == ["hooked ncclCommInitRankConfig rank=1"]
    hooklog.unlink()
    res, _ = run_worker(libs, tmp_path, "ctypes", plan, env, tag="ctypes")
    assert all(r["rc"] == 0 for r in res)
    assert not hooklog.exists()


# ------------------------------------------------------------------ nccl.conf

def test_conf_file_precedence(libs, tmp_path, uid):
    user = tmp_path / "user.conf"
    user.write_text("# comment\nNCCL_PROTO=Simple\nNCCL_ALGO=Tree\nnot a setting\n")
    etc = tmp_path / "etc.conf"
    etc.write_text("NCCL_ALGO=Ring\nNCCL_BUFFSIZE=123456\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".nccl.conf").write_text("NCCL_NTHREADS=128\n")
    plan = [["uid", uid], ["cgetenv", "NCCL_ALGO"], ["init", "c", 2, 0],
            *[["cgetenv", k] for k in ("NCCL_PROTO", "NCCL_ALGO", "NCCL_BUFFSIZE", "NCCL_NTHREADS")]]
    env = clean_env(NCCL_DEBUG="INFO", NCCL_PROTO="LL", NCCL_CONF_FILE=user)
    env.update(NCCLSIM_ETC_NCCL_CONF=str(etc), NCCLSIM_HOME=str(home))
    res, stdout = run_worker(libs, tmp_path, "ctypes", plan, env)
    got = {r["var"]: r["value"] for r in res[3:]}
    assert res[1]["value"] is None  # conf values enter the environment only at NCCL's first read
    # process env > NCCL_CONF_FILE (replaces ~/.nccl.conf) > /etc/nccl.conf
    assert got == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Tree", "NCCL_BUFFSIZE": "123456", "NCCL_NTHREADS": None}
    envs = {e.var: e.value for e in nl.parse_lines(stdout.splitlines()).of(nl.EnvSetting)}
    assert envs["NCCL_BUFFSIZE"] == "123456" and envs["NCCL_ALGO"] == "Tree"
    # without NCCL_CONF_FILE the home file is read
    env.pop("NCCL_CONF_FILE")
    res, _ = run_worker(libs, tmp_path, "ctypes", plan, env, tag="home")
    got = {r["var"]: r["value"] for r in res[3:]}
    assert got == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_BUFFSIZE": "123456", "NCCL_NTHREADS": "128"}


# ------------------------------------------------------------------ env plugin

def test_env_plugin_sees_every_lookup_and_can_answer(libs, tmp_path, uid):
    envlog, prof = tmp_path / "env.log", tmp_path / "prof.log"
    env = clean_env(NCCL_DEBUG="INFO", NCCL_ENV_PLUGIN=libs["envplugin"], SIMTEST_ENV_LOG=envlog,
                    SIMTEST_ENV_OVERRIDE="NCCL_PROTO=LL128", NCCL_PROTO="Simple", NCCL_MAX_NCHANNELS=8,
                    NCCL_PROFILER_PLUGIN=libs["prof5"], SIMTEST_PROF_LOG=prof)
    plan = [["uid", uid], ["init", "a", 2, 0], ["init", "b", 2, 0], ["allreduce", "a", 1 << 18],
            ["destroy", "a"], ["destroy", "b"]]
    res, stdout = run_worker(libs, tmp_path, "ctypes", plan, env)
    assert all(r["rc"] == 0 for r in res)
    lines = envlog.read_text().splitlines()
    assert lines[0] == "init 2.28.9 -simulated" and lines[-1] == "finalize"
    gets = [ln.split()[1] for ln in lines if ln.startswith("get ")]
    assert gets.count("NCCL_PROTO") == 2 and gets.count("NCCL_ALGO") == 2  # per communicator
    assert gets.count("NCCL_MAX_NCHANNELS") == 1 and gets.count("NCCL_BUFFSIZE") == 1  # cached per process
    assert "NCCL_PROFILER_PLUGIN" in gets and "NCCL_COLLNET_ENABLE" in gets
    # the plugin's answer is what NCCL uses: LL128 forced, for a 1 MiB all-reduce
    assert [(r["proto"], r["nwarps"]) for r in prof_lines(prof) if r["kind"] == "coll"] == [("LL128", "20")]
    log = nl.parse_lines(stdout.splitlines())
    assert ("env", "simtest-env", 1) in {(p.kind, p.name, p.version) for p in log.of(nl.PluginLoaded)}


def test_env_plugin_none_and_missing_fall_back_to_getenv(libs, tmp_path, uid):
    for value in ("none", str(tmp_path / "missing.so")):
        env = clean_env(NCCL_ENV_PLUGIN=value, NCCL_PROTO="Simple", NCCL_PROFILER_PLUGIN=libs["prof5"],
                        SIMTEST_PROF_LOG=tmp_path / "p.log")
        res, _ = run_worker(libs, tmp_path, "ctypes", [["uid", uid], ["init", "a", 2, 0], ["allreduce", "a", 8]], env)
        assert all(r["rc"] == 0 for r in res)
    assert {r["proto"] for r in prof_lines(tmp_path / "p.log") if r["kind"] == "coll"} == {"SIMPLE"}


# ------------------------------------------------------------------ profiler plugin versions, NCCL_ALGO/PROTO syntax

def test_profiler_v4_plugin_loads_with_its_own_init_order(libs, tmp_path, uid):
    prof = tmp_path / "prof.log"
    env = clean_env(NCCL_DEBUG="INFO", NCCL_PROFILER_PLUGIN=libs["prof4"], SIMTEST_PROF_LOG=prof)
    res, stdout = run_worker(libs, tmp_path, "ctypes", [["uid", uid], ["init", "a", 4, 3], ["allreduce", "a", 1 << 20],
                                                        ["destroy", "a"]], env)
    assert all(r["rc"] == 0 for r in res)
    rows = prof_lines(prof)
    assert rows[0]["kind"] == "init" and rows[0]["nranks"] == "4" and rows[0]["rank"] == "3"
    assert "v4" in Path(prof).read_text().splitlines()[0]
    assert [p.version for p in nl.parse_lines(stdout.splitlines()).of(nl.PluginLoaded)] == [4]
    assert rows[-1]["kind"] == "finalize"


@pytest.mark.parametrize("proto,algo,nbytes_count,expect", [
    ("^LL128", None, 16, ("RING", "LL")),
    ("^LL", None, 16, ("RING", "LL128")),   # "^LL" enables LL128 explicitly, as in NCCL (PCIe or not)
    ("^LL", None, (4 << 20) // 4, ("RING", "SIMPLE")),
    ("LL128", None, 16, ("RING", "LL128")),
    (None, "allreduce:tree", 16, ("TREE", "LL")),
    (None, "ring;allreduce:tree", 1 << 20, ("TREE", "SIMPLE")),
    ("allgather:LL;allreduce:Simple", "Tree,Ring", 16, ("RING", "SIMPLE")),
    (None, None, (64 << 10) // 4, ("RING", "SIMPLE")),   # 64 KiB: Simple from there
    (None, None, (64 << 10) // 4 - 1, ("RING", "LL")),
])
def test_algo_proto_choice_follows_nccl_syntax(libs, tmp_path, uid, proto, algo, nbytes_count, expect):
    prof = tmp_path / "prof.log"
    extra = {k: v for k, v in (("NCCL_PROTO", proto), ("NCCL_ALGO", algo)) if v is not None}
    env = clean_env(NCCL_PROFILER_PLUGIN=libs["prof5"], SIMTEST_PROF_LOG=prof, **extra)
    res, _ = run_worker(libs, tmp_path, "ctypes", [["uid", uid], ["init", "a", 2, 0], ["allreduce", "a", nbytes_count]],
                        env)
    assert all(r["rc"] == 0 for r in res), res
    (coll,) = [r for r in prof_lines(prof) if r["kind"] == "coll"]
    assert (coll["algo"], coll["proto"]) == expect


@pytest.mark.parametrize("var,value,rc", [
    ("NCCL_PROTO", "Bogus", 5), ("NCCL_ALGO", "allreduce:ring;tree", 5), ("NCCL_ALGO", "gather:ring", 5),
])
def test_bad_proto_algo_fail_init_with_invalid_usage(libs, tmp_path, uid, var, value, rc):
    env = clean_env(NCCL_DEBUG="WARN", **{var: value})
    res, stdout = run_worker(libs, tmp_path, "ctypes", [["uid", uid], ["init", "a", 2, 0]], env)
    assert res[1]["rc"] == rc
    warns = nl.parse_lines(stdout.splitlines()).of(nl.Warn)
    assert warns and value.split(";")[-1].split(":")[0] in stdout


def test_no_algorithm_left_is_an_internal_error(libs, tmp_path, uid):
    env = clean_env(NCCL_ALGO="NVLS")
    res, _ = run_worker(libs, tmp_path, "ctypes", [["uid", uid], ["init", "a", 2, 0], ["allreduce", "a", 8]], env)
    assert res[1]["rc"] == 0 and res[2]["rc"] == 3


def test_single_rank_takes_the_shortcut(libs, tmp_path, uid):
    prof = tmp_path / "prof.log"
    env = clean_env(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="TUNING", NCCL_PROFILER_PLUGIN=libs["prof5"],
                    SIMTEST_PROF_LOG=prof)
    res, stdout = run_worker(libs, tmp_path, "ctypes", [["uid", uid], ["init", "a", 1, 0], ["allreduce", "a", 64]], env)
    assert all(r["rc"] == 0 for r in res) and res[2]["first"] == 1.5
    assert [r["kind"] for r in prof_lines(prof)] == ["init"] and "Bytes ->" not in stdout


# ------------------------------------------------------------------ odd input never crashes

def test_odd_input_returns_nccl_error_codes(libs):
    code = f"""
import ctypes
lib = ctypes.CDLL({str(libs['sim'] / 'libnccl.so.2')!r})
class Id(ctypes.Structure): _fields_ = [("internal", ctypes.c_char * 128)]
uid = Id(); assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
c = ctypes.c_void_p(); out = []
out.append(lib.ncclGetUniqueId(None))
out.append(lib.ncclCommInitRank(None, 2, uid, 0))
out.append(lib.ncclCommInitRank(ctypes.byref(c), 0, uid, 0))
out.append(lib.ncclCommInitRank(ctypes.byref(c), 2, uid, 2))
bad = (ctypes.c_ubyte * 80)(); out.append(lib.ncclCommInitRankConfig(ctypes.byref(c), 2, uid, 0, bad))
out.append(lib.ncclCommDestroy(None))
out.append(lib.ncclCommDestroy(ctypes.c_void_p(0x1234)))
out.append(lib.ncclAllReduce(None, None, 8, 7, 0, ctypes.c_void_p(0x1234), None))
assert lib.ncclCommInitRank(ctypes.byref(c), 2, uid, 0) == 0
buf = (ctypes.c_float * 8)()
out.append(lib.ncclAllReduce(None, buf, 8, 7, 0, c, None))
out.append(lib.ncclAllReduce(buf, buf, 8, 99, 0, c, None))
out.append(lib.ncclAllReduce(buf, buf, 8, 7, 42, c, None))
out.append(lib.ncclAllReduce(buf, buf, 0, 7, 0, c, None))
out.append(lib.ncclCommCount(c, None))
out.append(lib.ncclCommSplit(c, -5, 0, ctypes.byref(ctypes.c_void_p()), None))
out.append(lib.ncclCommSplit(ctypes.c_void_p(0x99), 1, 0, ctypes.byref(ctypes.c_void_p()), None))
comms = (ctypes.c_void_p * 3)()
out.append(lib.ncclCommInitAll(comms, 3, None))
out.append(lib.ncclCommInitAll(comms, 0, None))
dev = ctypes.c_int(); lib.ncclCommCuDevice(ctypes.c_void_p(comms[2]), ctypes.byref(dev)); out.append(dev.value)
out.append(lib.ncclCommFinalize(c)); out.append(lib.ncclAllReduce(buf, buf, 8, 7, 0, c, None))
out.append(lib.ncclCommDestroy(c)); out.append(lib.ncclCommDestroy(c)); out.append(lib.ncclCommAbort(ctypes.c_void_p(comms[0])))
lib.ncclGetLastError.restype = ctypes.c_char_p
print(out, lib.ncclGetLastError(None).decode())
"""
    p = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    values, last = p.stdout.strip().split("] ", 1)
    assert json.loads(values + "]") == [4, 4, 4, 4, 4, 0, 4, 4, 4, 4, 4, 0, 4, 4, 4, 0, 4, 2, 0, 5, 0, 4, 0]
    assert "invalid communicator" in last


# ------------------------------------------------------------------ NCCL_DEBUG_FILE, VERSION level

def test_debug_file_per_process_is_parsed_back(libs, tmp_path, uid):
    pattern = str(tmp_path / "nccl.%h.%p.log")
    env = clean_env(NCCL_DEBUG="INFO", NCCL_DEBUG_FILE=pattern, NCCL_DEBUG_SUBSYS="ALL")
    res, stdout = run_worker(libs, tmp_path, "simtorch", [["uid", uid], ["init", "a", 2, 0], ["allreduce", "a", 8]], env)
    assert all(r["rc"] == 0 for r in res) and "NCCL INFO" not in stdout
    files = list(tmp_path.glob("nccl.*.log"))
    assert len(files) == 1
    host = socket.gethostname().split(".")[0]
    m = re.fullmatch(rf"nccl\.{re.escape(host)}\.(\d+)\.log", files[0].name)
    assert m
    log = nl.parse_files(files)
    assert {(r.at.host, r.at.pid) for r in log.records} == {(host, int(m.group(1)))}
    assert log.of(nl.VersionLine)[0].simulated and log.of(nl.Tuning)[0].proto == "LL"
    assert log.counts["unknown"] == 0 and log.counts["malformed"] == 0


def test_version_level_prints_the_bare_simulated_version_on_rank_0_only(libs, tmp_path, uid):
    for rank, expect in ((0, ["NCCL version 2.28.9-simulated+cpu"]), (1, [])):
        env = clean_env(NCCL_DEBUG="VERSION")
        _, stdout = run_worker(libs, tmp_path, "ctypes", [["uid", uid], ["init", "a", 2, rank]], env, tag=f"v{rank}")
        assert stdout.splitlines() == expect


# ------------------------------------------------------------------ with the real probe library (installed)

def test_probe_library_records_the_sim_through_preload_and_both_plugins(libs, tmp_path, uid):
    from ncclprobe.witnesses import events
    from ncclprobe._lib import lib_path
    probe = lib_path("libncclprobe.so")  # built by the install, like the sim the fixture builds
    logdir = tmp_path / "probe"
    logdir.mkdir(mode=0o700)
    env = clean_env(NCCLPROBE_DIR=logdir, NCCL_PROFILER_PLUGIN=probe, NCCL_ENV_PLUGIN=probe, LD_PRELOAD=probe,
                    NCCL_PROTO="LL")
    plan = [["uid", uid], ["initcfg", "decode", 2, 0, {}], ["allreduce", "decode", 256],
            ["setenv", "NCCL_PROTO", "Simple"], ["initcfg", "verify", 2, 0, {}], ["allreduce", "verify", 256],
            ["destroy", "decode"], ["destroy", "verify"]]
    res, _ = run_worker(libs, tmp_path, "simtorch", plan, env)
    assert all(r["rc"] == 0 for r in res)
    evs = events.read_dirs([logdir]).events
    inits = [e for e in evs if e["ev"] == "comm_init"]
    assert [(e["api"], e["simulated"], e["version"]) for e in inits] == [("ncclCommInitRankConfig", True, 22809)] * 2
    hashes = {e["comm_hash"] for e in evs if e["ev"] == "comm_plugin_init"}
    assert hashes == {inits[0]["uid"]}  # the sim's commHash is the probe's uid hash of the same id
    summaries = sorted((e["proto"], e["algo"], e["nchannels"]) for e in evs if e["ev"] == "coll_summary")
    assert summaries == [("LL", "RING", 32), ("SIMPLE", "RING", 32)]
    loads = {e["src"]: e for e in evs if e["ev"] == "plugin_load"}
    assert loads["envplugin"]["nccl_suffix"] == "-simulated" and loads["profiler"]["plugin"] == "ncclProfiler_v5"


def uid_hashing_with_leading_zeros(zeros: int = 2) -> str:
    """A unique id in the sim's own layout ("SIMNCCL", then 32 id bytes) whose commHash, which is the
    probe's uid hash, starts with `zeros` zero hex digits: found by counting, never left to luck."""
    n = 0
    while True:
        raw = b"SIMNCCL\0" + n.to_bytes(32, "little") + bytes(88)
        if ps.uid_hash(raw).startswith("0x" + "0" * zeros):
            return raw.hex()
        n += 1


def test_ids_with_leading_zeros_are_spelled_alike_by_every_witness(libs, tmp_path):
    """Two ranks of one communicator whose hash starts with zeros, and a split child: the preload
    hook (uid, comm, parent), the profiler plugin (comm_hash), the sim's NCCL log (commId and %p
    pointers, printed without leading zeros as NCCL prints them) and report's JSON all name it alike."""
    from ncclprobe._lib import lib_path
    uid = uid_hashing_with_leading_zeros()
    expected = ps.uid_hash(bytes.fromhex(uid))
    assert expected.startswith("0x00")
    probe = lib_path("libncclprobe.so")
    logdir = tmp_path / "probe"
    logdir.mkdir(mode=0o700)
    for rank in (0, 1):
        env = clean_env(NCCLPROBE_DIR=logdir, NCCL_PROFILER_PLUGIN=probe, NCCL_ENV_PLUGIN=probe, LD_PRELOAD=probe,
                        NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT", NCCL_DEBUG_FILE=logdir / "nccl-debug.%h.%p.log")
        plan = [["uid", uid], ["initcfg", "world", 2, rank, {}], ["split", "world", "spec", 5, 0],
                ["allreduce", "world", 256], ["allreduce", "spec", 256], ["destroy", "spec"], ["destroy", "world"]]
        res, _ = run_worker(libs, tmp_path, "simtorch", plan, env, tag=f"r{rank}")
        assert all(r["rc"] == 0 for r in res), res

    logs = sorted(logdir.glob("nccl-debug.*"))
    assert len(logs) == 2
    text = logs[0].read_text()
    assert f"commId 0x{int(expected, 16):x} - Init COMPLETE" in text and f"commId {expected}" not in text

    r = subprocess.run([sys.executable, "-m", "ncclprobe", "report", str(logdir), "--json"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    comms = json.loads(r.stdout)["communicators"]
    ids = [c[k] for c in comms for k in ("comm", "comm_hash", "uid", "parent") if c[k] is not None]
    assert ids and all(ps.ID.fullmatch(i) for i in ids), ids
    # Each witness joined: two ranks of each communicator, no communicator seen by one witness alone.
    assert len(comms) == 4
    assert all(c["seen_by"] == ["nccl-log", "preload", "profiler"] for c in comms), comms
    world = [c for c in comms if c["api"] == "ncclCommInitRankConfig"]
    spec = [c for c in comms if c["api"] == "ncclCommSplit"]
    assert [(c["comm_hash"], c["uid"]) for c in world] == [(expected, expected)] * 2
    assert len({c["comm_hash"] for c in spec}) == 1 and spec[0]["comm_hash"] != expected
    by_pid = {c["pid"]: c for c in world}
    assert all(c["parent"] == by_pid[c["pid"]]["comm"] for c in spec)


# ------------------------------------------------------------------ the event sequence of NCCL 2.28 (research-15)

COLL, KCH, GROUP_API, COLL_API, KLAUNCH = 0x2, 0x40, 0x100, 0x200, 0x800


@pytest.fixture(scope="session")
def rec(libs):
    """tests/c/rec_profiler.c as a v5 and a v4 plugin."""
    d = libs["dir"]
    return {v: ps.cc(d / f"librec{v}.so", [ROOT / "tests" / "c" / "rec_profiler.c"],
                     *(["-DREC_V4"] if v == 4 else []), shared=True) for v in (4, 5)}


def record(libs, rec, tmp_path, plan, mask=COLL, version=5, null=0, nch=2, tag="rec"):
    """Runs the plan under the recording plugin: (the calls it saw as dicts, the caller's thread id)."""
    log = tmp_path / f"{tag}.log"
    env = clean_env(NCCL_PROFILER_PLUGIN=rec[version], REC_PROF_LOG=log, REC_PROF_MASK=f"{mask:x}",
                    REC_PROF_NULL=f"{null:x}", NCCL_MAX_NCHANNELS=nch)
    p = subprocess.run([sys.executable, str(CSIM / "recdriver.py"), str(libs["sim"]), json.dumps(plan)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    main_tid = p.stdout.split("main_tid=")[1].split()[0]
    return (prof_lines(log) if log.exists() else []), main_tid


def kinds(rows):
    """Each call as one short word: start:Coll, stop, record:23, init, finalize."""
    out = []
    for r in rows:
        if r["kind"] == "start":
            out.append(f"start:{r['type']}")
        elif r["kind"] == "record":
            out.append(f"record:{r['state']}")
        else:
            out.append(r["kind"])
    return out


def starts(rows, type_):
    return [r for r in rows if r["kind"] == "start" and r["type"] == type_]


EAGER = ["start:GroupApi", "record:23", "start:CollApi", "stop", "record:24",
         "start:Group", "start:Coll", "stop", "stop", "stop"]


def test_eager_all_reduce_sequence_and_parents(libs, rec, tmp_path):
    rows, main_tid = record(libs, rec, tmp_path, [["init", "c", 2], ["ar", "c", 256, None], ["destroy", "c"]])
    assert kinds(rows) == ["init", *EAGER, "finalize"]
    ga, = starts(rows, "GroupApi")
    ca, = starts(rows, "CollApi")
    g, = starts(rows, "Group")
    c, = starts(rows, "Coll")
    assert (ga["cap"], ga["depth"], ga["parent"]) == ("0", "1", "0")
    assert (ca["parent"], ca["cap"], ca["func"], ca["count"], ca["dt"]) == (ga["h"], "0", "AllReduce", "256",
                                                                             "ncclFloat32")
    assert (c["parent"], c["pgroup"], g["parent"]) == (ca["h"], g["h"], "0")
    assert (c["nch"], c["seq"], c["count"]) == ("2", "0", "256")
    # stops, innermost first: CollApi at once, then Coll, Group, and GroupApi last
    assert [r["h"] for r in rows if r["kind"] == "stop"] == [ca["h"], c["h"], g["h"], ga["h"]]
    assert [r["h"] for r in rows if r["kind"] == "record"] == [ga["h"], ga["h"]]
    assert {r["tid"] for r in rows} == {main_tid}


@pytest.mark.parametrize("mask,expect", [
    (0, []),
    (0x20, []),  # ProxyCtrl is in no gate of a collective
    (GROUP_API, ["start:GroupApi", "record:23", "record:24", "stop"]),
    (COLL_API, ["start:GroupApi", "record:23", "start:CollApi", "stop", "record:24", "stop"]),
    (COLL, EAGER),
    (KLAUNCH | COLL, EAGER[:5] + ["start:KernelLaunch", "stop"] + EAGER[5:]),
])
def test_events_follow_nccls_gates(libs, rec, tmp_path, mask, expect):
    rows, _ = record(libs, rec, tmp_path, [["init", "c", 2], ["ar", "c", 8, None], ["destroy", "c"]], mask=mask)
    assert kinds(rows) == ["init", *expect, "finalize"]
    if mask & KLAUNCH:
        kl, = starts(rows, "KernelLaunch")
        assert kl["parent"] == starts(rows, "GroupApi")[0]["h"]


def test_null_handles_are_never_stopped_and_coll_keeps_a_null_parent(libs, rec, tmp_path):
    rows, _ = record(libs, rec, tmp_path, [["init", "c", 2], ["ar", "c", 8, None], ["destroy", "c"]],
                     null=GROUP_API | COLL_API | 0x1)
    assert kinds(rows) == ["init", "start:GroupApi", "start:CollApi", "start:Group", "start:Coll", "stop", "finalize"]
    c, = starts(rows, "Coll")
    assert (c["parent"], c["pgroup"]) == ("0", "0")


def kernel_ch_checks(rows, coll_handles, nch, main_tid):
    """Every Coll handle got nch KernelCh events (start, KernelChStop with a later stamp, stop) from
    one thread that is not the caller's."""
    kch = starts(rows, "KernelCh")
    assert sorted(r["parent"] for r in kch) == sorted(h for h in coll_handles for _ in range(nch))
    for h in coll_handles:
        assert sorted(r["ch"] for r in kch if r["parent"] == h) == [str(i) for i in range(nch)]
    for s in kch:
        calls = [r for r in rows if r.get("h") == s["h"]]
        assert [r["kind"] for r in calls] == ["start", "record", "stop"]
        assert calls[1]["state"] == "22" and int(calls[1]["ptimer"]) > int(s["ptimer"]) > 0
    tids = {r["tid"] for r in rows if r.get("h") in {s["h"] for s in kch}}
    assert len(tids) == 1 and main_tid not in tids
    return tids.pop()


def test_kernel_ch_comes_from_the_proxy_thread_under_the_coll_handle(libs, rec, tmp_path):
    plan = [["init", "c", 2], ["ar", "c", 256, None], ["ar", "c", 4096, None], ["destroy", "c"]]
    rows, main_tid = record(libs, rec, tmp_path, plan, mask=COLL | KCH, nch=4)
    colls = [c["h"] for c in starts(rows, "Coll")]
    assert len(colls) == 2
    kernel_ch_checks(rows, colls, 4, main_tid)
    assert kinds(rows)[-1] == "finalize"  # destroy waited for the proxy's events


@pytest.mark.parametrize("version", [4, 5])
def test_single_rank_emits_nothing_eager_or_captured(libs, rec, tmp_path, version):
    plan = [["init", "c", 1], ["ar", "c", 64, None], ["begin", "s"], ["ar", "c", 64, "s"], ["end", "s", "g"],
            ["launch", "g"], ["sync"], ["destroy", "c"]]
    rows, _ = record(libs, rec, tmp_path, plan, mask=COLL | KCH | GROUP_API | COLL_API | KLAUNCH, version=version)
    assert kinds(rows) == ["init", "finalize"]


CAPTURE = [["init", "c", 2], ["begin", "s"], ["ar", "c", 512, "s"], ["end", "s", "g"]]


def test_capture_with_kernel_ch_replays_coll_on_the_callback_thread(libs, rec, tmp_path):
    plan = CAPTURE + [["launch", "g"], ["launch", "g"], ["sync"], ["gdestroy", "g"], ["destroy", "c"]]
    rows, main_tid = record(libs, rec, tmp_path, plan, mask=COLL | KCH | KLAUNCH, nch=2)
    ga, = starts(rows, "GroupApi")
    ca, = starts(rows, "CollApi")
    assert ga["cap"] == ca["cap"] == "1" and ca["stream"] != "(nil)"
    # at capture: the API events and the (recorded, not run) kernel launch; no Group, no Coll
    capture_end = next(i for i, r in enumerate(rows) if r["kind"] == "stop" and r["h"] == ga["h"])
    assert kinds(rows[1:capture_end + 1]) == ["start:GroupApi", "record:23", "start:CollApi", "stop", "record:24",
                                              "start:KernelLaunch", "stop", "stop"]
    colls, groups = starts(rows, "Coll"), starts(rows, "Group")
    assert len(colls) == len(groups) == 2  # one per replay
    assert all(c["parent"] == ca["h"] for c in colls)  # the CollApi handle returned at capture
    assert [c["pgroup"] for c in colls] == [g["h"] for g in groups]
    assert [c["seq"] for c in colls] == ["0", "1"]  # KernelCh: persistent plans advance the counter
    cb_tids = {r["tid"] for r in rows if r.get("h") in {x["h"] for x in colls + groups}}
    assert len(cb_tids) == 1 and main_tid not in cb_tids
    proxy_tid = kernel_ch_checks(rows, [c["h"] for c in colls], 2, main_tid)
    assert proxy_tid not in cb_tids
    assert [r["kind"] for r in rows if r.get("h") == ca["h"]] == ["start", "stop"]  # never stopped again
    assert kinds(rows)[-1] == "finalize"


def test_capture_without_kernel_ch_fires_coll_once_at_capture(libs, rec, tmp_path):
    plan = CAPTURE + [["launch", "g"], ["launch", "g"], ["launch", "g"], ["sync"], ["destroy", "c"]]
    rows, main_tid = record(libs, rec, tmp_path, plan, mask=COLL)
    assert kinds(rows) == ["init", *EAGER, "finalize"]  # inside the captured GroupApi window, and never again
    assert starts(rows, "GroupApi")[0]["cap"] == "1" and starts(rows, "CollApi")[0]["cap"] == "1"
    assert starts(rows, "Coll")[0]["parent"] == starts(rows, "CollApi")[0]["h"]
    assert {r["tid"] for r in rows} == {main_tid}


def test_replays_keep_the_mask_of_the_capture(libs, rec, tmp_path):
    """A later init resets NCCL's one global mask: eager work follows it, the graph keeps its own."""
    plan = CAPTURE + [["mask", f"{COLL:x}"], ["init", "d", 2], ["launch", "g"], ["ar", "c", 64, None], ["sync"],
                      ["destroy", "d"], ["destroy", "c"]]
    rows, main_tid = record(libs, rec, tmp_path, plan, mask=COLL | KCH)
    eager, = [c for c in starts(rows, "Coll") if c["tid"] == main_tid]
    replay, = [c for c in starts(rows, "Coll") if c["tid"] != main_tid]
    assert replay["parent"] == starts(rows, "CollApi")[0]["h"] and eager["parent"] != replay["parent"]
    assert {k["parent"] for k in starts(rows, "KernelCh")} == {replay["h"]}


def test_several_captured_collectives_replay_in_order(libs, rec, tmp_path):
    plan = [["init", "c", 2], ["begin", "s"], ["ar", "c", 64, "s"], ["ar", "c", 128, "s"], ["ar", "c", 256, "s"],
            ["end", "s", "g"], ["ar", "c", 8, None]] + [["launch", "g"]] * 3 + [["destroy", "c"]]
    rows, main_tid = record(libs, rec, tmp_path, plan, mask=COLL | KCH)
    apis = starts(rows, "CollApi")
    colls = [c for c in starts(rows, "Coll") if c["tid"] != main_tid]
    assert [c["parent"] for c in colls] == [a["h"] for a in apis[:3]] * 3
    assert [c["count"] for c in colls] == ["64", "128", "256"] * 3
    kernel_ch_checks(rows, [c["h"] for c in starts(rows, "Coll")], 2, main_tid)


@pytest.mark.parametrize("kch", [0, KCH])
def test_v4_plugin_gets_group_and_coll_only(libs, rec, tmp_path, kch):
    plan = CAPTURE + [["launch", "g"], ["ar", "c", 64, None], ["destroy", "c"]]
    rows, main_tid = record(libs, rec, tmp_path, plan, mask=COLL | kch | GROUP_API | COLL_API, version=4)
    assert not starts(rows, "GroupApi") and not starts(rows, "CollApi") and rows[0]["v"] == "4"
    groups, colls = starts(rows, "Group"), starts(rows, "Coll")
    assert len(colls) == 2 and sorted(c["parent"] for c in colls) == sorted(g["h"] for g in groups)
    if kch:
        assert sorted(c["tid"] == main_tid for c in colls) == [False, True]  # the replay's from its host callback
        kernel_ch_checks(rows, [c["h"] for c in colls], 2, main_tid)
    else:
        assert not starts(rows, "KernelCh") and {c["tid"] for c in colls} == {main_tid}


def test_v4_coll_needs_a_group_handle(libs, rec, tmp_path):
    rows, _ = record(libs, rec, tmp_path, [["init", "c", 2], ["ar", "c", 64, None], ["destroy", "c"]],
                     version=4, null=0x1)
    assert kinds(rows) == ["init", "start:Group", "finalize"]


def test_fork_child_runs_its_own_threads_and_exit_never_waits(libs, rec, tmp_path):
    """A child forked while the threads run starts without them (and without the parent's queued
    work), gets its own on first use; a process exiting with work queued and comms live exits."""
    child = [["init", "k", 2], ["ar", "k", 64, None], ["sync"], ["destroy", "k"]]
    plan = CAPTURE + [["launch", "g"], ["sync"], ["launch", "g"], ["fork", child], ["launch", "g"],
                      ["ar", "c", 64, None], ["exit"]]
    rows, main_tid = record(libs, rec, tmp_path, plan, mask=COLL | KCH)
    parent_pid = rows[0]["pid"]
    kid = [r for r in rows if r["pid"] != parent_pid]
    kid_pid = kid[0]["pid"]
    kid_main = [r for r in kid if r["tid"] == kid_pid]  # its proxy's KernelCh events interleave freely
    assert kinds(kid_main) == ["init", *EAGER, "finalize"]
    kernel_ch_checks(kid, [c["h"] for c in starts(kid, "Coll")], 2, kid_pid)  # its main thread's tid is its pid
    parent = [r for r in rows if r["pid"] == parent_pid]
    ca, = starts(parent, "CollApi")[:1]
    assert starts(parent, "Coll")[0]["parent"] == ca["h"] and starts(parent, "Coll")[0]["tid"] != main_tid


SIMOPS = """
import ctypes, sys
from pathlib import Path
from ncclprobe.demo.ops import SimOps
ops = SimOps(0, Path("."))
uid = (ctypes.c_char * 128)()
ops.nccl.ncclGetUniqueId(uid)
for h in (ops.init_linked(2, bytes(uid).hex(), 0, "decode"), ops.init_ctypes(2, bytes(uid).hex(), 0)):
    g = ops.capture_all_reduce(h, 2048)
    ops.replay(g)
    ops.replay(g)
ops.nccl.ncclprobeSimSynchronize()
ops.close()
"""


def test_simops_capture_and_replay_both_ways(libs, rec, tmp_path):
    """The demo's SimOps (installed package): PyTorch's graph capture through libsimtorch, and a
    ctypes caller's on its own stream, each replayed twice."""
    log = tmp_path / "ops.log"
    env = clean_env(NCCL_PROFILER_PLUGIN=rec[5], REC_PROF_LOG=log, REC_PROF_MASK=f"{COLL | KCH:x}",
                    NCCL_MAX_NCHANNELS=2)
    p = subprocess.run([sys.executable, "-c", SIMOPS], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    rows = prof_lines(log)
    apis = starts(rows, "CollApi")
    assert [(a["cap"], a["count"], a["dt"]) for a in apis] == [("1", "1024", "ncclBfloat16")] * 2
    assert apis[0]["stream"] != apis[1]["stream"]  # torch's side stream, the ctypes caller's own
    assert sorted(c["parent"] for c in starts(rows, "Coll")) == sorted([apis[0]["h"], apis[1]["h"]] * 2)
    assert len(starts(rows, "KernelCh")) == 4 * 2 and kinds(rows).count("finalize") == 2


# ------------------------------------------------------------------ tests/c/prof_driver.c follows the same rules

@pytest.fixture(scope="session")
def driver(libs):
    return ps.build_prof_driver(libs["dir"])


def drive_rec(driver, rec, tmp_path, mask, *args):
    log = tmp_path / f"drv-{mask:x}-{'-'.join(map(str, args))}.log"
    r = ps.run([driver, rec[5], 5, *args], clean_env(REC_PROF_LOG=log, REC_PROF_MASK=f"{mask:x}"))
    assert r.returncode == 0, r.stderr
    rows = prof_lines(log)
    return rows, rows[0]["tid"], r.stdout


def test_driver_eager_sequence_matches_the_sim(driver, rec, tmp_path):
    rows, _, _ = drive_rec(driver, rec, tmp_path, COLL, "shapes", 1)
    assert kinds(rows) == ["init", *EAGER, "finalize"]
    rows, _, _ = drive_rec(driver, rec, tmp_path, COLL_API, "shapes", 1)
    assert kinds(rows) == ["init", "start:GroupApi", "record:23", "start:CollApi", "stop", "record:24", "stop",
                           "finalize"]


@pytest.mark.parametrize("mask,proxy", [(COLL | KCH, 0), (COLL, 1), (COLL, 0)])
def test_driver_graph_mode(driver, rec, tmp_path, mask, proxy):
    rows, main_tid, out = drive_rec(driver, rec, tmp_path, mask, "graph", 2, 3, proxy)
    callback = bool(proxy or mask & KCH)
    assert f"callback={int(callback)}" in out
    apis = starts(rows, "CollApi")
    captured = {a["h"] for a in apis if a["cap"] == "1"}
    assert len(captured) == 2 and len(apis) == 4
    replayed = [c for c in starts(rows, "Coll") if c["parent"] in captured]
    assert len(replayed) == (6 if callback else 2)
    assert all((c["tid"] != main_tid) == callback for c in replayed)
    if mask & KCH:
        kernel_ch_checks(rows, [c["h"] for c in starts(rows, "Coll")], 2, main_tid)
    assert kinds(rows)[-1] == "finalize"


def test_driver_timed_and_loop_kernel_ch(driver, rec, tmp_path):
    rows, main_tid, out = drive_rec(driver, rec, tmp_path, COLL | KCH, "timed", 50)
    assert "timed=50 gpu_ns_sum=573000" in out
    kernel_ch_checks(rows, [c["h"] for c in starts(rows, "Coll")], 2, main_tid)
    assert kinds(rows)[-1] == "finalize"
    rows, _, out = drive_rec(driver, rec, tmp_path, COLL | KCH, "loop", 100, "kernelch")
    assert "ns_per_coll=" in out and len(starts(rows, "KernelCh")) == 2 * 110
