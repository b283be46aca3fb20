"""ELF reading on the real libnccl wheel and on a fake NCCL linked dynamically and statically."""
import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ncclprobe.witnesses import elf

CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(not CC or not shutil.which("ar"), reason="needs a C compiler and ar")

FAKE_NCCL = r"""
typedef struct ncclComm* ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
const char ncclVersionString[] = "NCCL version 2.99.1+cuda12.4";
int ncclGetVersion(int* v) { if (!v) return 4; *v = 29901; return 0; }
int ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  (void)id; *comm = 0; return nranks > 0 && rank >= 0 ? (int)ncclVersionString[0] - 'N' : 4;
}
"""
MAIN = r"""
#include <unistd.h>
typedef struct ncclComm* ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
int ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int);
int main(int argc, char** argv) {
  ncclComm_t c; ncclUniqueId id = {{0}};
  int rc = ncclCommInitRank(&c, 1, id, 0);
  if (argc > 1) sleep(atoi(argv[1]));
  return rc;
}
"""


def real_libnccl() -> Path | None:
    try:
        import nvidia.nccl
    except ImportError:
        return None
    for base in nvidia.nccl.__path__:
        p = Path(base) / "lib" / "libnccl.so.2"
        if p.exists():
            return p
    return None


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """lib/libnccl.so.2 (fake, shared), lib/libnccl.a, dyn (links -lnccl), static (links the .a)."""
    if not CC or not shutil.which("ar"):
        pytest.skip("needs a C compiler and ar")
    d = tmp_path_factory.mktemp("fakenccl")
    (d / "lib").mkdir()
    (d / "nccl.c").write_text(FAKE_NCCL)
    (d / "main.c").write_text("#include <stdlib.h>\n" + MAIN)
    run = lambda *a: subprocess.run(a, cwd=d, check=True, capture_output=True)
    run(CC, "-shared", "-fPIC", "-O1", "-o", "lib/libnccl.so.2", "nccl.c")
    run(CC, "-c", "-fPIC", "-O1", "-o", "nccl.o", "nccl.c")
    run("ar", "rcs", "lib/libnccl.a", "nccl.o")
    (d / "lib" / "libnccl.so").symlink_to("libnccl.so.2")
    run(CC, "-O1", "-o", "dyn", "main.c", "-Llib", "-l:libnccl.so.2", "-Wl,-rpath," + str(d / "lib"))
    run(CC, "-O1", "-o", "static", "main.c", "lib/libnccl.a")
    return d


def test_real_wheel_version_matches_ncclGetVersion():
    lib = real_libnccl()
    if lib is None:
        pytest.skip("nvidia-nccl-cu12 not installed")
    info = elf.scan(lib)
    assert info.reason is None and info.version_source == "rodata"
    assert "ncclCommInitRank" in info.nccl_defines
    code = ctypes.c_int()
    assert ctypes.CDLL(str(lib)).ncclGetVersion(ctypes.byref(code)) == 0
    assert info.version == elf.version_from_code(code.value)


def test_real_wheel_version_constant_decoding():
    lib = real_libnccl()
    if lib is None:
        pytest.skip("nvidia-nccl-cu12 not installed")
    from ncclprobe.witnesses import elfread
    fd, st = elfread.open_regular(lib)
    try:
        code = elf._get_version_constant(elfread.Elf(fd, st.st_size))
    finally:
        os.close(fd)
    assert elf.version_from_code(code) == elf.scan(lib).version


@needs_cc
def test_fake_shared_library(built):
    info = elf.scan(built / "lib" / "libnccl.so.2")
    assert info.version == "2.99.1" and info.version_source == "rodata"
    assert info.nccl_defines == ("ncclCommInitRank",)


@needs_cc
def test_dynamic_caller_imports_static_caller_contains(built):
    dyn = elf.scan(built / "dyn")
    assert "ncclCommInitRank" in dyn.nccl_imports and not dyn.contains_nccl
    assert "libnccl.so.2" in dyn.needed
    static = elf.scan(built / "static")
    assert static.contains_nccl and not static.nccl_imports
    assert static.version == "2.99.1"


@needs_cc
def test_version_constant_without_string(built, tmp_path):
    src = FAKE_NCCL.replace("NCCL version 2.99.1+cuda12.4", "no string here")
    (tmp_path / "n.c").write_text(src)
    subprocess.run([CC, "-shared", "-fPIC", "-O1", "-o", tmp_path / "libnccl.so.2", tmp_path / "n.c"], check=True)
    info = elf.scan(tmp_path / "libnccl.so.2")
    assert (info.version, info.version_source) == ("2.99.1", "ncclGetVersion")


def test_version_codes():
    assert elf.version_from_code(23203) == "2.32.3"
    assert elf.version_from_code(21803) == "2.18.3"
    assert elf.version_from_code(2708) == "2.7.8"


def test_libnccl_names():
    assert elf.is_libnccl("/x/libnccl.so.2") and elf.is_libnccl("libnccl.so.2.18.1")
    assert elf.is_libnccl("/site/torch.libs/libnccl-3f2a1b9c.so.2")
    assert not elf.is_libnccl("/x/libnccl-net.so") and not elf.is_libnccl("libnccl_device.bc")


def test_not_elf_and_missing(tmp_path):
    (tmp_path / "data.so").write_bytes(b"hello")
    assert elf.scan(tmp_path / "data.so").reason == "not ELF"
    assert elf.scan(tmp_path / "missing.so").reason == "vanished"
    (tmp_path / "trunc.so").write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 20)
    assert elf.scan(tmp_path / "trunc.so").reason.startswith("unreadable ELF")


@needs_cc
def test_cache_follows_inode_and_mtime(built, tmp_path):
    lib = tmp_path / "libnccl.so.2"
    shutil.copy(built / "lib" / "libnccl.so.2", lib)
    assert elf.scan(lib).version == "2.99.1"
    data = lib.read_bytes().replace(b"2.99.1+cuda", b"2.98.7+cuda")
    lib.unlink()
    lib.write_bytes(data)  # a new file (new inode) at the same path
    assert elf.scan(lib).version == "2.98.7"


@needs_cc
def test_interposer_is_not_a_static_nccl(tmp_path):
    """A preload hook defines the entry points but carries no NCCL code (no version string)."""
    (tmp_path / "hook.c").write_text(
        "typedef struct ncclComm* ncclComm_t; typedef struct { char i[128]; } ncclUniqueId;\n"
        "int ncclCommInitRank(ncclComm_t* c, int n, ncclUniqueId id, int r) { (void)c; (void)id; return n + r; }\n")
    subprocess.run([CC, "-shared", "-fPIC", "-o", tmp_path / "libhook.so", tmp_path / "hook.c"], check=True)
    info = elf.scan(tmp_path / "libhook.so")
    assert info.nccl_defines == ("ncclCommInitRank",)
    assert info.interposes_nccl and not info.contains_nccl


@needs_cc
def test_live_dynamic_and_static_callers(built):
    from ncclprobe.commands.inspection import inspect_processes
    procs = {name: subprocess.Popen([str(built / name), "30"]) for name in ("dyn", "static")}
    try:
        import time
        time.sleep(0.3)
        dyn = inspect_processes([procs["dyn"].pid], gpu_lookup=lambda: ({}, "test"))
        (lib,) = dyn.data["processes"][0]["nccl_libs"]
        assert lib["kind"] == "shared" and lib["version"] == "2.99.1"
        assert lib["reached_by"] == "dynamic symbols (hookable)"
        assert not [f for f in dyn.findings if f.code == "NCCL_UNHOOKABLE"]
        static = inspect_processes([procs["static"].pid], gpu_lookup=lambda: ({}, "test"))
        (f,) = [f for f in static.findings if f.code == "NCCL_UNHOOKABLE"]
        assert f.pids == (procs["static"].pid,) and f.evidence["version"] == "2.99.1"
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
