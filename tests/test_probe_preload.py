"""The preload role on real processes: a fake libnccl.so.2 called by a linked C program (seen) and
through Python ctypes (not seen), every create/destroy entry point, the RTLD_LOCAL scope where
dlsym(RTLD_NEXT) finds nothing, many threads, fork, no libnccl, and the real libnccl of the
nvidia-nccl-cu12 wheel failing with a real CUDA error."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "c"))
import probe_support as ps  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe_preload")
    lib = ps.build_probe(d)
    nccl_dir = d / "nccl"
    fake = ps.build_fake_nccl(nccl_dir)
    app = ps.build_app(d, nccl_dir)
    driver, mid = ps.build_local(d, nccl_dir)
    return {"lib": lib, "fake": fake, "app": app, "driver": driver, "mid": mid, "dir": d}


def run_app(built, log, mode, *args, **env):
    r = ps.run([built["app"], mode, *args], ps.probe_env(log, built["lib"], **env))
    assert r.returncode == 0, r.stderr
    plain = ps.run([built["app"], mode, *args], ps.probe_env(None, None, **env))
    return r, plain


def test_linked_program_every_init_recorded_with_args_config_env_and_unchanged_rc(built, tmp_path):
    log = tmp_path / "log"
    r, plain = run_app(built, log, "basic", NCCL_PROTO="Simple", NCCL_PROFILER_PLUGIN=str(built["lib"]))
    assert r.stdout == plain.stdout  # every return code exactly as without the hook
    assert r.stderr == ""
    result = ps.read(log)
    assert result.skipped_total == 0
    inits = ps.of_kind(result, "comm_init")
    assert [e["api"] for e in inits] == ["ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommSplit",
                                         "ncclCommInitRank", "ncclCommInitRankConfig"]
    first, cfg, split, bad, badcfg = inits
    fake = str(built["fake"])
    for e in inits:
        assert e["src"] == "preload" and e["lib"] == fake and e["version"] == ps.FAKE_VERSION
        assert e["simulated"] is False
    assert len({e["call"] for e in inits}) == 5

    assert (first["rc"], first["rank"], first["nranks"], first["dev"]) == (0, 0, 2, 0)
    assert ps.ID.fullmatch(first["comm"]) and "config" not in first
    assert first["uid"] == cfg["uid"] and ps.ID.fullmatch(first["uid"])
    # The environment as getenv saw it at each call: changed in-process between the two inits.
    assert first["env"]["NCCL_PROTO"] == "Simple" and cfg["env"]["NCCL_PROTO"] == "LL"
    assert "HOME" not in first["env"] and "PATH" not in first["env"]

    # A caller compiled against 2.28 (size 80): graphUsageMode lies past its size and is ignored.
    assert cfg["config"] == {"size": 80, "version": 22809, "valid": True, "blocking": 1, "minCTAs": 4,
                             "netName": "Socket", "commName": "tp0"}
    assert (cfg["rc"], cfg["rank"], cfg["nranks"], cfg["dev"]) == (0, 1, 2, 1)

    assert split["parent"] == first["comm"] and (split["color"], split["key"]) == (3, 7)
    assert split["config"] is None and split["rc"] == 0 and split["nranks"] == 1

    assert (bad["rc"], bad["comm"], bad["rank"], bad["dev"]) == (4, None, 5, None)
    assert badcfg["rc"] == 4 and badcfg["config"] == {"size": 80, "magic": "0x1234", "valid": False}

    destroys = ps.of_kind(result, "comm_destroy")
    assert [d["comm"] for d in destroys] == [split["comm"], cfg["comm"], first["comm"]]
    assert all(d["rc"] == 0 and d["api"] == "ncclCommDestroy" for d in destroys)

    # NCCL runs the profiler init inside the real init call: same thread, so the call id joins.
    plugin_inits = ps.of_kind(result, "comm_plugin_init")
    assert [p["call"] for p in plugin_inits] == [first["call"], cfg["call"], split["call"]]
    assert plugin_inits[1]["comm_name"] == "tp0"
    assert plugin_inits[1]["env"]["NCCL_PROTO"] == "LL"


def test_every_other_entry_point(built, tmp_path):
    log = tmp_path / "log"
    r, plain = run_app(built, log, "all")
    assert r.stdout == plain.stdout
    result = ps.read(log)
    inits = ps.of_kind(result, "comm_init")
    init_all = [e for e in inits if e["api"] == "ncclCommInitAll"]
    assert len(init_all) == 3 and len({e["call"] for e in init_all}) == 1
    assert [(e["rank"], e["nranks"], e["dev"]) for e in init_all] == [(0, 3, 4), (1, 3, 5), (2, 3, 6)]
    assert init_all[0]["devlist"] == [4, 5, 6]
    scal = next(e for e in inits if e["api"] == "ncclCommInitRankScalable")
    assert (scal["nid"], scal["rank"], scal["nranks"], scal["rc"]) == (2, 3, 4, 0)
    assert scal["config"]["commName"] == "tp0"
    shrink = next(e for e in inits if e["api"] == "ncclCommShrink")
    assert shrink["parent"] == init_all[0]["comm"] and shrink["exclude"] == [1] and shrink["nranks"] == 2
    grow = next(e for e in inits if e["api"] == "ncclCommGrow")
    assert (grow["rank"], grow["nranks"]) == (4, 5) and grow["uid"]
    nocolor = next(e for e in inits if e["api"] == "ncclCommSplit")
    assert nocolor["rc"] == 0 and nocolor["comm"] is None and nocolor["color"] == -1
    ends = [(d["api"], d["rc"]) for d in ps.of_kind(result, "comm_destroy")]
    assert ends[:3] == [("ncclCommFinalize", 0), ("ncclCommAbort", 0), ("ncclCommDestroy", 4)]


def test_ctypes_calls_bypass_the_preload_but_not_the_plugin(built, tmp_path):
    """SGLang/vLLM call NCCL through ctypes handles: the hook never sees them, the plugin does."""
    log = tmp_path / "log"
    script = textwrap.dedent(f"""
        import ctypes
        class UniqueId(ctypes.Structure):  # passed by value, as pynccl_wrapper.py declares it
            _fields_ = [("internal", ctypes.c_char * 128)]
        nccl = ctypes.CDLL({str(built['fake'])!r})
        uid = UniqueId()
        assert nccl.ncclGetUniqueId(ctypes.byref(uid)) == 0
        comm = ctypes.c_void_p()
        print("rc", nccl.ncclCommInitRank(ctypes.byref(comm), 2, uid, 1))
        print("rc", nccl.ncclCommDestroy(comm))
    """)
    env = ps.probe_env(log, built["lib"], NCCL_PROFILER_PLUGIN=str(built["lib"]))
    py = ps.run([sys.executable, "-c", script], env)
    assert py.returncode == 0, py.stderr
    assert py.stdout.split() == ["rc", "0", "rc", "0"]
    app = ps.run([built["app"], "basic"], env)
    assert app.returncode == 0

    result = ps.read(log)
    by_pid: dict[int, list] = {}
    for e in result.events:
        by_pid.setdefault(e["pid"], []).append(e)
    assert len(by_pid) == 2
    (py_pid, py_events), = [(p, ev) for p, ev in by_pid.items() if not any(e["ev"] == "comm_init" for e in ev)]
    app_events = next(ev for p, ev in by_pid.items() if p != py_pid)
    assert [e["ev"] for e in py_events if e["src"] == "preload"] == []
    py_plugin = [e for e in py_events if e["ev"] == "comm_plugin_init"]
    assert len(py_plugin) == 1 and py_plugin[0]["call"] is None and py_plugin[0]["rank"] == 1
    assert py_plugin[0]["lib"] == str(built["fake"])
    assert len([e for e in app_events if e["ev"] == "comm_init"]) == 5


def test_local_scope_where_rtld_next_finds_nothing(built, tmp_path):
    log = tmp_path / "log"
    cmd = [built["driver"], built["fake"], built["mid"]]
    r = ps.run(cmd, ps.probe_env(log, built["lib"]))
    assert r.returncode == 0, r.stderr
    # libnccl is not in the global scope, and both calls reach the real function.
    assert r.stdout.splitlines() == ["global ncclGetVersion=no", "mid_init rc=0", "global ncclCommInitRank rc=0"]
    plain = ps.run(cmd, ps.probe_env(None, None))
    assert "global ncclCommInitRank absent" in plain.stdout
    inits = ps.of_kind(ps.read(log), "comm_init")
    assert len(inits) == 2
    assert all(e["lib"] == str(built["fake"]) and e["rc"] == 0 and e["version"] == ps.FAKE_VERSION for e in inits)
    assert [e["rank"] for e in inits] == [0, 1]


def test_simulated_nccl_is_labelled(built, tmp_path):
    sim = ps.build_fake_nccl(tmp_path / "sim", simulated=True)
    log = tmp_path / "log"
    # liblocal_mid.so's NEEDED libnccl.so.2 resolves to the copy already loaded under that soname.
    r = ps.run([built["driver"], sim, built["mid"]], ps.probe_env(log, built["lib"]))
    assert r.returncode == 0, r.stderr
    inits = ps.of_kind(ps.read(log), "comm_init")
    assert len(inits) == 2
    assert all(e["simulated"] is True and e["lib"] == str(sim) for e in inits)


def test_concurrent_inits_from_many_threads(built, tmp_path):
    log = tmp_path / "log"
    r, _ = run_app(built, log, "threads", "32", NCCL_PROFILER_PLUGIN=str(built["lib"]))
    assert "threads=32 failures=0" in r.stdout
    result = ps.read(log)
    assert result.skipped_total == 0
    inits = ps.of_kind(result, "comm_init")
    assert len(inits) == 32 * 20 and all(e["rc"] == 0 for e in inits)
    assert len({e["call"] for e in inits}) == len(inits)
    assert len(ps.of_kind(result, "comm_destroy")) == 32 * 20
    calls = {e["call"] for e in inits}
    plugin = ps.of_kind(result, "comm_plugin_init")
    assert len(plugin) == 32 * 20 and {p["call"] for p in plugin} == calls


def test_fork_child_writes_its_own_file(built, tmp_path):
    log = tmp_path / "log"
    r, _ = run_app(built, log, "fork")
    child_pid = int(next(line for line in r.stdout.splitlines() if line.startswith("child pid=")).split()[1][4:])
    files = sorted(p.name for p in log.glob("*.jsonl"))
    assert len(files) == 2 and any(f.endswith(f"-{child_pid}.jsonl") for f in files)
    result = ps.read(log)
    child = [e for e in result.events if e["pid"] == child_pid]
    parent = [e for e in result.events if e["pid"] != child_pid]
    assert [(e["ev"], e["rank"]) for e in child if e["ev"] == "comm_init"] == [("comm_init", 1)]
    assert [(e["ev"], e.get("rank")) for e in parent] == [("comm_init", 0), ("comm_destroy", None)]


def test_no_libnccl_loaded_returns_error_without_crashing(built, tmp_path):
    """A caller reaching our exported symbol with no NCCL loaded gets an error, not a segfault."""
    log = tmp_path / "log"
    script = textwrap.dedent("""
        import ctypes
        class UniqueId(ctypes.Structure):
            _fields_ = [("internal", ctypes.c_char * 128)]
        glob = ctypes.CDLL(None)
        comm = ctypes.c_void_p()
        uid = UniqueId()
        print(glob.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0), glob.ncclCommDestroy(comm))
    """)
    r = ps.run([sys.executable, "-c", script], ps.probe_env(log, built["lib"]))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3", "3"]  # ncclInternalError
    errors = ps.of_kind(ps.read(log), "probe_error")
    assert {e["message"].split(";")[0] for e in errors} == {"no loaded libnccl defines ncclCommInitRank",
                                                           "no loaded libnccl defines ncclCommDestroy"}
    assert {e["part"] for e in errors} == {"ncclCommInitRank", "ncclCommDestroy"}


def _real_nccl() -> Path:
    nccl = pytest.importorskip("nvidia.nccl")
    path = Path(list(nccl.__path__)[0]) / "lib" / "libnccl.so.2"
    if not path.exists():
        pytest.skip("nvidia-nccl-cu12 wheel has no lib/libnccl.so.2")
    return path


def test_real_libnccl_failing_init_keeps_its_return_code(built, tmp_path):
    real = _real_nccl()
    prog = ps.cc(tmp_path / "real_init", [ps.HERE / "real_init.c"], str(real), f"-Wl,-rpath,{real.parent}")
    plain = ps.run([prog], ps.probe_env(None, None))
    if "init rc=0" in plain.stdout:
        pytest.skip("this machine has a usable GPU: the failure path is not reachable")
    log = tmp_path / "log"
    r = ps.run([prog], ps.probe_env(log, built["lib"]))
    assert r.returncode == 0
    assert r.stdout == plain.stdout and "init rc=1" in r.stdout  # ncclUnhandledCudaError, unchanged
    init, = ps.of_kind(ps.read(log), "comm_init")
    assert init["api"] == "ncclCommInitRank" and init["rc"] == 1 and init["comm"] is None
    assert init["lib"] == str(real) and init["version"] >= 22700 and init["simulated"] is False
    assert (init["rank"], init["nranks"], init["dev"]) == (0, 1, None)
    # The id real NCCL made, hashed and spelled as for every other id (0x + 16 hex digits).
    assert "uid rc=0" in r.stdout
    raw = next(line.split()[1] for line in r.stderr.splitlines() if line.startswith("uid "))
    assert init["uid"] == ps.uid_hash(bytes.fromhex(raw)) and ps.ID.fullmatch(init["uid"])


def test_interposer_preloaded_ahead_of_the_probe(built, tmp_path):
    """A tracing shim ahead of us forwards with dlsym(RTLD_NEXT) to our hook; our hook must reach
    NCCL, not come back to the shim (whose own definition its handle finds first)."""
    shim = ps.build_shim(tmp_path)
    log = tmp_path / "log"
    env = ps.probe_env(log, None, LD_PRELOAD=f"{shim}:{built['lib']}")
    r = ps.run([built["app"], "basic"], env, timeout=30)
    plain = ps.run([built["app"], "basic"], ps.probe_env(None, None, LD_PRELOAD=str(shim)))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout == plain.stdout and "rc=99" not in r.stdout
    inits = ps.of_kind(ps.read(log), "comm_init")
    assert [e["api"] for e in inits if e["api"] == "ncclCommInitRank"] == ["ncclCommInitRank"] * 2
    assert all(e["lib"] == str(built["fake"]) for e in inits)


def test_forwarding_cycle_is_cut_by_the_reentry_bound(built, tmp_path):
    """An interposer that also defines ncclGetVersion passes for NCCL, so our hook calls it, and it
    forwards back to us: past 8 hook frames on the thread the probe returns ncclInternalError
    instead of recursing (the shim would give up at 20 frames with 99, a naive one never)."""
    shim = ps.build_shim(tmp_path, claims_nccl=True)
    log = tmp_path / "log"
    r = ps.run([built["app"], "basic"], ps.probe_env(log, None, LD_PRELOAD=f"{shim}:{built['lib']}"), timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "ncclCommInitRank rc=3" in r.stdout
    errors = ps.of_kind(ps.read(log), "probe_error")
    assert any("forwarding cycle" in e["message"] for e in errors)


NOT_NCCL_SRC = """
#include "nccl_abi.h"
__attribute__((visibility("default"))) ncclResult_t ncclCommInitRank(ncclComm_t* c, int n, ncclUniqueId id, int r) {
  return (ncclResult_t)77;
}
"""


@pytest.mark.parametrize("other", ["libncclprobe.so", "libnccl-profiler-probe.so", "libnccl-net-x.so"])
def test_no_nccl_but_another_probe_copy_or_nccl_plugin_is_an_error_not_a_crash(built, tmp_path, other):
    """Two installs of the probe (one preloaded, one loaded as a plugin) and no NCCL: each must not
    take the other (or a libnccl-*.so plugin of NCCL) for NCCL."""
    d = tmp_path / "other"
    d.mkdir()
    if other == "libnccl-net-x.so":
        src = tmp_path / "notnccl.c"
        src.write_text(NOT_NCCL_SRC)
        lib = ps.cc(d / other, [src], shared=True)
    else:
        lib = d / other
        lib.write_bytes(built["lib"].read_bytes())
    driver = ps.build_dl_driver(tmp_path)
    log = tmp_path / "log"
    r = ps.run([driver, lib], ps.probe_env(log, built["lib"]), timeout=30)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stdout.split() == ["rc=3"]  # ncclInternalError: no NCCL defines it
    err, = ps.of_kind(ps.read(log), "probe_error")
    assert err["part"] == "ncclCommInitRank"


def test_hook_leaves_errno_as_the_real_call_did(built, tmp_path):
    log = tmp_path / "log"
    log.mkdir(mode=0o700)  # the log's first open then meets EEXIST from mkdir
    r, plain = run_app(built, log, "errno")
    assert r.stdout == plain.stdout and "errno=0" in r.stdout
    assert len(ps.of_kind(ps.read(log), "comm_init")) == 1


def test_config_smaller_than_its_header_is_not_read_past_its_size(built, tmp_path):
    """size=8 at the end of a page: the hook and the simulated NCCL read `size` and stop."""
    ps._probes_build().build(tmp_path / "out")
    sim = tmp_path / "out" / "sim" / "libnccl.so.2"
    prog = ps.build_cfg_edge(tmp_path)
    plain = ps.run([prog, sim], ps.probe_env(None, None))
    assert (plain.returncode, plain.stdout.split()) == (0, ["rc=4"]), plain.stderr  # ncclInvalidArgument
    log = tmp_path / "log"
    r = ps.run([prog, sim], ps.probe_env(log, built["lib"]))
    assert (r.returncode, r.stdout.split()) == (0, ["rc=4"]), r.stderr
    init, = ps.of_kind(ps.read(log), "comm_init")
    assert init["config"] == {"size": 8, "valid": False} and init["rc"] == 4
