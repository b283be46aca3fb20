"""libncclprobe.so as a library: self-check, the watched set and JSON escaping against the Python
contracts, and the log writer (silence without NCCLPROBE_DIR, unwritable directory, file mode,
oversized environments, hosts that are not NCCL programs at all)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "c"))
import probe_support as ps  # noqa: E402

from ncclprobe.witnesses import probelib

from ncclprobe.model import watched  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe_lib")
    lib = ps.build_probe(d)
    nccl_dir = d / "nccl"
    ps.build_fake_nccl(nccl_dir)
    app = ps.build_app(d, nccl_dir)
    return {"lib": lib, "app": app, "dir": d}


def test_self_check_accepts_fresh_build(built):
    res = probelib.self_check(built["lib"])
    assert res.ok, res.reason
    assert res.version == probelib.PROBE_ABI
    assert res.roles == probelib.ALL_ROLES
    assert res.role_names == ("preload", "profiler", "envplugin")


def test_self_check_of_installed_library_matches_package():
    res = probelib.self_check()
    if not Path(res.path).exists():
        pytest.skip("package installed without its native library")
    assert res.ok, res.reason


def test_self_check_refuses_missing_file(tmp_path):
    res = probelib.self_check(tmp_path / "libncclprobe.so")
    assert not res.ok and "not built" in res.reason


@pytest.mark.parametrize("version, roles, reason", [
    ("0", 7, "probe ABI '0'"),
    ("1", 3, "missing roles: envplugin"),
    ("1", 0, "missing roles: preload, profiler, envplugin"),
])
def test_self_check_refuses_wrong_version_or_roles(tmp_path, version, roles, reason):
    src = tmp_path / "impostor.c"
    src.write_text(
        '__attribute__((visibility("default"))) const char* ncclprobe_version(void) { return "%s"; }\n'
        '__attribute__((visibility("default"))) unsigned ncclprobe_roles(void) { return %du; }\n'
        '__attribute__((visibility("default"))) int ncclprobe_watched(const char* n) { return 0; }\n'
        '__attribute__((visibility("default"))) unsigned long ncclprobe_json_escape(const char* a, unsigned long n,'
        ' char* o, unsigned long c) { return 0; }\n' % (version, roles))
    so = ps.cc(tmp_path / "libimpostor.so", [src], shared=True)
    res = probelib.self_check(so)
    assert not res.ok
    assert reason in res.reason


def test_self_check_refuses_library_without_probe_symbols(tmp_path):
    src = tmp_path / "other.c"
    src.write_text("int other(void) { return 1; }\n")
    so = ps.cc(tmp_path / "libother.so", [src], shared=True)
    res = probelib.self_check(so)
    assert not res.ok and "not a ncclprobe library" in res.reason


NAMES = ["NCCL_PROTO", "NCCL_", "NCCL", "nccl_proto", "TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL", "NCCLPROBE_DIR",
         "TORCH_DISTRIBUTED_DEBUG", "TORCH_DISTRIBUTED_DEBUGX", "CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE", "LD_PRELOAD",
         "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "SGLANG_NCCL_SO_PATH", "VLLM_NCCL_SO_PATH", "HOME",
         "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "", "X_NCCL_PROTO"]


def test_c_watched_set_is_the_python_one(built):
    lib = probelib.load(built["lib"])
    for name in NAMES:
        assert bool(lib.ncclprobe_watched(name.encode())) == watched.is_watched(name), name


@pytest.mark.parametrize("raw", [
    b"plain", b'quote " backslash \\ slash /', b"tab\tnewline\ncr\rbell\x07del\x7f",
    "h\u00e9llo \u20ac \U0001f600".encode(), b"\xff\xfe bad \xc3( \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf",
    bytes(range(256)),
])
def test_json_escaping_round_trips_bytes(built, raw):
    lib = probelib.load(built["lib"])
    out = (__import__("ctypes").create_string_buffer(len(raw) * 6 + 64))
    n = lib.ncclprobe_json_escape(raw, len(raw), out, len(out))
    assert n > 0
    text = out.raw[:n]
    text.decode("ascii" if max(raw, default=0) < 0x80 else "utf-8")  # always valid UTF-8
    value = json.loads(b'"' + text + b'"')
    # Bytes that are not UTF-8 come back through Python's surrogateescape convention.
    assert value.encode("utf-8", "surrogateescape") == raw


def test_json_escape_reports_too_small_buffer(built):
    lib = probelib.load(built["lib"])
    out = __import__("ctypes").create_string_buffer(40)
    assert lib.ncclprobe_json_escape(b"x" * 100, 100, out, 40) == 0


def test_silent_without_log_dir(built, tmp_path):
    env = ps.probe_env(None, built["lib"])
    before = set(os.listdir(tmp_path))
    r = ps.run([built["app"], "basic"], env)
    assert r.returncode == 0 and r.stderr == ""
    assert set(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("cmd", [["/bin/true"], ["bash", "-c", "echo hi; exit 3"],
                                 [sys.executable, "-c", "import os; print(len(os.environ) > 0)"]])
def test_preload_into_programs_without_nccl(built, tmp_path, cmd):
    plain = subprocess.run(cmd, capture_output=True, text=True)
    r = ps.run(cmd, ps.probe_env(tmp_path / "log", built["lib"]))
    assert (r.returncode, r.stdout, r.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    assert not (tmp_path / "log").exists()  # nothing to say, nothing written


def test_unwritable_dir_warns_once_then_silence(built, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = ps.probe_env(blocker / "sub", built["lib"], NCCL_PROFILER_PLUGIN=str(built["lib"]))
    r = ps.run([built["app"], "threads", "8"], env)
    assert r.returncode == 0
    assert "threads=8 failures=0" in r.stdout
    warnings = [line for line in r.stderr.splitlines() if line.startswith("ncclprobe:")]
    assert len(warnings) == 1, r.stderr
    assert str(blocker / "sub") in warnings[0] and "silent" in warnings[0]


def test_log_file_is_private_regular_and_named_by_host_and_pid(built, tmp_path):
    log = tmp_path / "log"
    r = ps.run([built["app"], "basic"], ps.probe_env(log, built["lib"]))
    assert r.returncode == 0
    files = list(log.glob("*.jsonl"))
    assert len(files) == 1
    host, pid = files[0].name[:-len(".jsonl")].rsplit("-", 1)
    # beside it only the file budget's counter, <host>.files: one byte per log file created
    assert sorted(p.name for p in log.iterdir()) == sorted([files[0].name, f"{host}.files"])
    assert (log / f"{host}.files").read_bytes() == b"\n"
    for path in log.iterdir():
        mode = path.lstat().st_mode
        assert stat.S_ISREG(mode) and stat.S_IMODE(mode) == 0o600
    events = ps.read(log).events
    assert {e["pid"] for e in events} == {int(pid)}
    assert {e["host"] for e in events} == {host}


def test_oversized_environment_gives_valid_truncated_lines(built, tmp_path):
    log = tmp_path / "log"
    big = {f"NCCL_BIG_{i:02d}": "v" * 1500 for i in range(20)}
    big["NCCL_HUGE"] = "h" * 5000
    big["NCCL_UNICODE"] = "\u00e9\u20ac"
    r = ps.run([built["app"], "basic"], ps.probe_env(log, built["lib"], **big))
    assert r.returncode == 0
    result = ps.read(log)
    assert result.skipped_total == 0
    inits = ps.of_kind(result, "comm_init")
    assert len(inits) == 5
    for e in inits:
        assert e["truncated"] is True
        assert len(e["env"]) < len(big)
        assert "rc" in e and "lib" in e  # the fields after the environment still fit
        assert all(len(v) <= 2048 for v in e["env"].values())


def test_config_members_too_large_for_the_line_are_left_out_whole(built, tmp_path):
    log = tmp_path / "log"
    huge = "\x01" * 3000  # each byte escapes to 6: two of these cannot fit one line
    r = ps.run([built["app"], "basic"], ps.probe_env(log, built["lib"], APP_COMM_NAME=huge, APP_NET_NAME=huge))
    assert r.returncode == 0
    result = ps.read(log)
    assert result.skipped_total == 0
    cfg, bad = [e for e in ps.of_kind(result, "comm_init") if e["api"] == "ncclCommInitRankConfig"]
    # netName fits and is kept; commName no longer fits and is left out whole.
    assert cfg["config"]["netName"] == "\x01" * 2048 and "commName" not in cfg["config"]
    assert cfg["truncated"] is True and cfg["rc"] == 0 and cfg["lib"] and cfg["comm"]
    # With a wrong magic nothing past the header is read, so the line is complete.
    assert bad["config"] == {"size": 80, "magic": "0x1234", "valid": False} and "truncated" not in bad


@pytest.fixture(scope="module")
def env_driver(built):
    return ps.build_env_driver(built["dir"])


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700)
    return path


def probe_warnings(r) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.startswith("ncclprobe:")]


@pytest.mark.parametrize("kind", ["fifo", "open0666", "other"])
def test_planted_log_file_is_refused_without_blocking(built, env_driver, tmp_path, kind):
    """Whatever sits at <host>-<pid>.jsonl before we open it (a FIFO that nobody reads, a file
    others can read, another user's file) is never opened for writing and never blocks."""
    if kind == "other" and os.geteuid() != 0:
        pytest.skip("planting another user's file needs root")
    log = private_dir(tmp_path / "log")
    r = ps.run([env_driver, built["lib"], "plant", kind], ps.probe_env(log, None, NCCL_PROTO="LL"), timeout=20)
    assert r.returncode == 0, r.stderr
    assert "NCCL_PROTO=LL" in r.stdout
    planted = Path(r.stdout.split("planted ")[1].split()[0])
    assert len(probe_warnings(r)) == 1 and str(log) in r.stderr
    if kind != "fifo":
        assert planted.read_bytes() == b""
    assert [p.name for p in log.iterdir()] == [planted.name]


@pytest.mark.parametrize("kind", ["world", "group", "other", "symlink"])
def test_shared_or_foreign_log_dir_is_refused(built, env_driver, tmp_path, kind):
    """A directory others can write to (NCCLPROBE_DIR=/tmp) or that is not ours would let them
    plant files at our predictable names: one warning, then silence."""
    if kind == "other" and os.geteuid() != 0:
        pytest.skip("a directory of another user needs root")
    real = private_dir(tmp_path / "real")
    log = real
    if kind == "world":
        os.chmod(real, 0o1777)
    elif kind == "group":
        os.chmod(real, 0o770)
    elif kind == "other":
        os.chown(real, 65534, 65534)
    else:
        log = tmp_path / "link"
        log.symlink_to(real)
    r = ps.run([env_driver, built["lib"], "errno"], ps.probe_env(log, None, NCCL_PROTO="LL"),
               timeout=20)
    assert r.returncode == 0, r.stderr
    assert "NCCL_PROTO=LL" in r.stdout
    assert len(probe_warnings(r)) == 1, r.stderr
    assert list(real.iterdir()) == []


def test_relative_log_dir_survives_chdir(built, env_driver, tmp_path):
    elsewhere = private_dir(tmp_path / "elsewhere")
    r = subprocess.run([str(env_driver), str(built["lib"]), "chdir", str(elsewhere)], cwd=tmp_path,
                       env=ps.probe_env(Path("log"), None, NCCL_PROTO="LL", NCCL_ALGO="Ring"), capture_output=True,
                       text=True, timeout=20)
    assert r.returncode == 0 and "child status=0" in r.stdout, r.stderr
    assert not (elsewhere / "log").exists()
    result = ps.read(tmp_path / "log")
    assert len(result.files) == 2
    assert sorted((e["var"], e["value"]) for e in ps.of_kind(result, "nccl_getenv")) == [
        ("NCCL_ALGO", "Ring"), ("NCCL_PROTO", "LL")]


def test_warning_never_goes_into_a_file_the_host_opened_as_fd_2(built, env_driver, tmp_path):
    """A host that closed stderr and opened a data file gets fd 2 for it: our warning must not
    land in the host's data."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    data = tmp_path / "data.bin"
    r = ps.run([env_driver, built["lib"], "fd2", data], ps.probe_env(blocker / "sub", None, NCCL_PROTO="LL"))
    assert r.returncode == 0 and "NCCL_PROTO=LL" in r.stdout
    assert data.read_bytes() == b""


def test_plugin_tables_are_read_only(built):
    """NCCL only reads the tables it looks up: const puts them in read-only memory after relocation."""
    import ctypes
    lib = ctypes.CDLL(str(built["lib"]), mode=os.RTLD_LOCAL)
    maps = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        rng, perms = line.split()[:2]
        lo, hi = (int(x, 16) for x in rng.split("-"))
        maps.append((lo, hi, perms))
    for name in ["ncclProfiler_v4", "ncclProfiler_v5", "ncclProfiler_v6", "ncclProfiler_v7", "ncclEnvPlugin_v1",
                 "ncclEnvPlugin_v2"]:
        addr = ctypes.addressof(ctypes.c_char.in_dll(lib, name))
        perms, = [p for lo, hi, p in maps if lo <= addr < hi]
        assert "w" not in perms, (name, perms)
