"""The env plugin role: the real libnccl of the nvidia-nccl-cu12 wheel loads it (NCCL_ENV_PLUGIN)
and every watched variable NCCL reads shows up once per value; driven directly, it returns exactly
what getenv returns, never logs other names, and bounds its table."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "c"))
import probe_support as ps  # noqa: E402


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return ps.build_probe(tmp_path_factory.mktemp("probe_env"))


def real_nccl() -> Path:
    nccl = pytest.importorskip("nvidia.nccl")
    path = Path(list(nccl.__path__)[0]) / "lib" / "libnccl.so.2"
    if not path.exists():
        pytest.skip("nvidia-nccl-cu12 wheel has no lib/libnccl.so.2")
    return path


REAL_SCRIPT = textwrap.dedent("""
    import ctypes, sys
    class UniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_char * 128)]
    nccl = ctypes.CDLL(sys.argv[1])
    v = ctypes.c_int()
    nccl.ncclGetVersion(ctypes.byref(v))
    uid = UniqueId()
    print("version", v.value, "uid", nccl.ncclGetUniqueId(ctypes.byref(uid)))
    comm = ctypes.c_void_p()
    print("init", nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0))
""")


def test_real_nccl_loads_the_env_plugin_and_reports_its_reads(lib, tmp_path):
    nccl = real_nccl()
    log = tmp_path / "log"
    env = ps.probe_env(log, None, NCCL_ENV_PLUGIN=str(lib), NCCL_SOCKET_IFNAME="lo", NCCL_NVTX_DISABLE="1",
                       CUDA_VISIBLE_DEVICES="0")
    r = ps.run([sys.executable, "-c", REAL_SCRIPT, nccl], env, timeout=120)
    assert r.returncode == 0, r.stderr
    version = int(r.stdout.split()[1])
    result = ps.read(log)
    assert result.skipped_total == 0
    load, = ps.of_kind(result, "plugin_load")
    assert load["src"] == "envplugin" and load["nccl_version"] == version and load["lib"] == str(nccl)
    # NCCL looks up the newest env plugin symbol it knows first (src/plugin/env.cc).
    assert load["plugin"] == ("ncclEnvPlugin_v2" if version >= 23007 else "ncclEnvPlugin_v1")
    reads = ps.of_kind(result, "nccl_getenv")
    assert all(e["lib"] == str(nccl) for e in reads)
    seen = {e["var"]: e["value"] for e in reads}
    assert seen["NCCL_SOCKET_IFNAME"] == "lo"
    assert seen["NCCL_NVTX_DISABLE"] == "1"
    assert "NCCL_NO_CACHE" in seen and seen["NCCL_NO_CACHE"] is None
    pairs = [(e["var"], e["value"]) for e in reads]
    assert len(pairs) == len(set(pairs))  # each distinct value once
    assert all(e["var"].startswith("NCCL_") or e["var"] == "CUDA_VISIBLE_DEVICES" or e["var"].startswith("TORCH_")
               for e in reads)


DRIVE_SCRIPT = textwrap.dedent("""
    import ctypes, os, sys
    class EnvV1(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char_p),
                    ("init", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint8, ctypes.c_uint8, ctypes.c_uint8,
                                              ctypes.c_char_p)),
                    ("finalize", ctypes.CFUNCTYPE(ctypes.c_int)),
                    ("getEnv", ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_char_p))]
    plugin = EnvV1.in_dll(ctypes.CDLL(sys.argv[1]), "ncclEnvPlugin_v1")
    assert plugin.init(2, 28, 9, b"") == 0
    out = []
    for name in sys.argv[2:]:
        if name.startswith("set:"):
            k, v = name[4:].split("=", 1)
            os.environ[k] = v
            continue
        got = plugin.getEnv(name.encode())
        want = os.environ.get(name)
        assert got == (want.encode() if want is not None else None), (name, got, want)
        out.append("%s=%s" % (name, got))
    assert plugin.finalize() == 0
    print(" ".join(out))
""")


def test_delegates_to_getenv_and_logs_watched_values_once(lib, tmp_path):
    log = tmp_path / "log"
    args = ["NCCL_PROTO", "HOME", "NCCL_PROTO", "SECRET_TOKEN", "set:NCCL_PROTO=Simple", "NCCL_PROTO",
            "NCCL_ALGO", "NCCL_ALGO", "LD_PRELOAD", "TORCH_NCCL_ASYNC_ERROR_HANDLING"]
    env = ps.probe_env(log, None, NCCL_PROTO="LL", SECRET_TOKEN="hunter2", TORCH_NCCL_ASYNC_ERROR_HANDLING="1")
    r = ps.run([sys.executable, "-c", DRIVE_SCRIPT, lib, *args], env)
    assert r.returncode == 0, r.stderr
    result = ps.read(log)
    load, = ps.of_kind(result, "plugin_load")
    assert (load["plugin"], load["nccl_version"]) == ("ncclEnvPlugin_v1", 22809)
    reads = [(e["var"], e["value"]) for e in ps.of_kind(result, "nccl_getenv")]
    assert reads == [("NCCL_PROTO", "LL"), ("NCCL_PROTO", "Simple"), ("NCCL_ALGO", None), ("LD_PRELOAD", None),
                     ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")]
    assert "hunter2" not in (log / result.files[0].split("/")[-1]).read_text()


def test_table_overflow_is_one_probe_error(lib, tmp_path):
    log = tmp_path / "log"
    names = [f"NCCL_X{i}" for i in range(2100)]
    r = ps.run([sys.executable, "-c", DRIVE_SCRIPT, lib, *names], ps.probe_env(log, None))
    assert r.returncode == 0, r.stderr
    result = ps.read(log)
    assert len(ps.of_kind(result, "nccl_getenv")) == 2048
    err, = ps.of_kind(result, "probe_error")
    assert err["src"] == "envplugin" and "2048" in err["message"] and err["part"] == "getenv table"


def test_silent_without_log_dir(lib, tmp_path):
    r = ps.run([sys.executable, "-c", DRIVE_SCRIPT, lib, "NCCL_PROTO", "NCCL_ALGO"],
               ps.probe_env(None, None, NCCL_PROTO="LL"))
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.split() == ["NCCL_PROTO=b'LL'", "NCCL_ALGO=None"]


def test_a_value_already_seen_costs_no_syscall_lock_or_loader_call(lib, tmp_path):
    """NCCL 2.30 reads NCCL_ALGO/NCCL_PROTO through the plugin on every collective (efficiency CTA
    policy, src/enqueue.cc): once a (library, variable, value) is logged, a read is getenv plus
    a lock-free table probe, nothing else."""
    driver = ps.build_env_driver(tmp_path, count_calls=True)
    log = tmp_path / "log"
    r = ps.run([driver, lib, "count", 1000], ps.probe_env(log, None, NCCL_PROTO="LL"))
    assert r.returncode == 0, r.stderr
    assert "fstat=0 getpid=0 dladdr=0 lock=0" in r.stdout, r.stdout
    reads = [(e["var"], e["value"]) for e in ps.of_kind(ps.read(log), "nccl_getenv")]
    assert reads == [("NCCL_ALGO", None), ("NCCL_PROTO", "LL")]


def test_errno_is_unchanged_by_init_and_reads(lib, tmp_path):
    """Init and the first watched read open the log (mkdir of an existing directory fails with
    EEXIST): NCCL must find errno as it left it."""
    log = tmp_path / "log"
    log.mkdir(mode=0o700)
    driver = ps.build_env_driver(tmp_path)
    r = ps.run([driver, lib, "errno"], ps.probe_env(log, None, NCCL_PROTO="LL"))
    assert r.returncode == 0, r.stderr
    assert "init errno=0 NCCL_PROTO=LL errno=0" in r.stdout
    assert len(ps.of_kind(ps.read(log), "nccl_getenv")) == 1
