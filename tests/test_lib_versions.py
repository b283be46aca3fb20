"""A libnccl copy the model names without a version (a second copy loaded through ctypes: only the
profiler saw its communicator) gets the version its ELF carries, read as `inspect` reads it and
marked as read from the file — on the real libnccl of the nvidia-nccl-cu12 wheel and on ncclprobe's
simulated one. Only regular files are read, a bounded number, cached; nothing here fails a report."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
from pathlib import Path

import pytest

import ncclprobe._lib
from ncclprobe import schemas
from ncclprobe.commands import report
from ncclprobe.witnesses import libversions
from ncclprobe.witnesses import elf

HERE = socket.gethostname()
SIM = str(Path(ncclprobe._lib.__file__).parent / "sim" / "libnccl.so.2")


def _real_libnccl() -> str | None:
    """The libnccl.so.2 of the nvidia-nccl-cu12 wheel (a test extra); None without it."""
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except ImportError:  # no `nvidia` package at all: find_spec imports the parent before it looks
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / "lib" / "libnccl.so.2"
        if path.is_file():
            return str(path)
    return None


REAL = _real_libnccl()
needs_real = pytest.mark.skipif(REAL is None, reason="needs the nvidia-nccl-cu12 wheel (test extra)")


def valid(doc: dict) -> None:
    """doc against its JSON Schema, which needs jsonschema (a test extra): without it the test skips
    here, after its other checks ran."""
    pytest.importorskip("jsonschema", reason="schema validation needs jsonschema (test extra)")
    schemas.validate(doc)


def ev(kind, pid, t, src, host=HERE, **kw):
    return {"ev": kind, "pid": pid, "t": t, "host": host, "src": src, **kw}


def torch_comm(pid, t, host=HERE):
    return ev("comm_init", pid, t, "preload", host, api="ncclCommInitRank", call=1, comm="0x1", rank=0, nranks=2,
              uid="0xa", env={}, rc=0, lib=SIM, version=22809, simulated=True)


def ctypes_comm(pid, t, lib, host=HERE):
    """A communicator of a copy loaded through ctypes: the preload hook never saw it, so no version."""
    return ev("comm_plugin_init", pid, t, "profiler", host, comm_hash="0xbeef", comm_name=None, nnodes=1, nranks=2,
              rank=0, env={}, lib=lib)


def write_log(tmp_path, events) -> Path:
    log = tmp_path / "log"
    log.mkdir(mode=0o700)
    for key in sorted({(e["host"], e["pid"]) for e in events}):
        lines = "".join(json.dumps(e) + "\n" for e in events if (e["host"], e["pid"]) == key)
        (log / f"{key[0]}-{key[1]}.jsonl").write_text(lines)
    return log


def comm_of(result, comm_hash):
    return next(c for c in result.data["communicators"] if c["comm_hash"] == comm_hash)


def library_lines(result) -> list[str]:
    lines = []
    for item in result.doc:
        for _title, fields in getattr(item, "items", []):
            lines += [v for k, v in fields if k == "library"]
    return lines


def texts(result) -> list[str]:
    return [getattr(item, "text", "") for item in result.doc]


@pytest.fixture(autouse=True)
def _fresh_cache():
    elf.clear_cache()
    yield
    elf.clear_cache()


@needs_real
def test_a_ctypes_copy_of_the_real_libnccl_shows_the_version_its_elf_carries(tmp_path):
    want = elf.scan(REAL).version  # what `inspect` reads from the same file
    assert want and want.count(".") == 2
    log = write_log(tmp_path, [torch_comm(10, 1.0), ctypes_comm(10, 2.0, REAL)])
    result = report.build_report([log])
    second = comm_of(result, "0x000000000000beef")
    major, minor, patch = map(int, want.split("."))
    assert (second["version_code"], second["version_source"]) == (major * 10000 + minor * 100 + patch, "file")
    assert second["version"] == want
    first = next(c for c in result.data["communicators"] if c["api"])
    assert (first["version"], first["version_code"], first["version_source"]) == ("2.28.9", 22809, "probe")
    lines = library_lines(result)
    assert any(f"{want} (read from the file)" in ln and "(simulated)" not in ln for ln in lines), lines
    assert not any(" ?" in ln for ln in lines)
    # the process loaded two copies: one line names both, with their versions
    assert any(t.startswith("libnccl copies in pid 10:") and f"{want} (read from the file)" in t and "2.28.9" in t
               for t in texts(result)), texts(result)
    (proc,) = result.data["processes"]
    assert {(v["path"], v["version_source"]) for v in proc["nccl_libs"]} == {(SIM, "probe"), (REAL, "file")}
    valid(result.to_json())


def test_the_simulated_copy_read_from_its_file_is_marked_simulated(tmp_path):
    log = write_log(tmp_path, [ctypes_comm(10, 2.0, SIM)])
    result = report.build_report([log])
    c = comm_of(result, "0x000000000000beef")
    assert (c["version"], c["version_code"], c["version_source"]) == ("2.28.9", 22809, "file")
    assert library_lines(result) == ["_lib/sim/libnccl.so.2 2.28.9 (read from the file) (simulated)"]
    valid(result.to_json())


def test_what_nccl_told_its_plugin_comes_before_the_file(tmp_path):
    other = str(tmp_path / "libnccl.so.2")  # not even a file: the plugin's word is enough
    load = ev("plugin_load", 10, 1.5, "profiler", plugin="ncclProfiler_v5", nccl_version=22803, lib=other)
    log = write_log(tmp_path, [torch_comm(10, 1.0), load, ctypes_comm(10, 2.0, other)])
    result = report.build_report([log])
    c = comm_of(result, "0x000000000000beef")
    assert (c["version"], c["version_code"], c["version_source"]) == ("2.28.3", 22803, "plugin")
    assert any(ln.endswith("libnccl.so.2 2.28.3") for ln in library_lines(result)), library_lines(result)


def test_another_host_s_path_is_not_read_here(tmp_path):
    log = write_log(tmp_path, [ctypes_comm(10, 2.0, SIM, host=HERE + "-elsewhere")])
    result = report.build_report([log])
    c = comm_of(result, "0x000000000000beef")
    assert (c["version"], c["version_code"], c["version_source"]) == (None, None, None)
    assert library_lines(result) == ["_lib/sim/libnccl.so.2 ?"]


def test_only_regular_files_are_read_and_nothing_raises(tmp_path):
    fifo = tmp_path / "libnccl.so.2"
    os.mkfifo(fifo)  # opening it for reading would block a plain open() forever
    assert elf.file_version(str(fifo)) is None
    assert elf.file_version(str(tmp_path)) is None
    assert elf.file_version(str(tmp_path / "missing.so")) is None
    assert elf.file_version("/dev/zero") is None
    assert elf.file_version("bad\0path") is None
    junk = tmp_path / "junk" / "libnccl.so.2"
    junk.parent.mkdir()
    junk.write_bytes(b"\x7fELF" + b"\xff" * 100)
    assert elf.file_version(str(junk)) is None
    log = write_log(tmp_path, [ctypes_comm(10, 2.0, str(fifo)), ctypes_comm(11, 2.0, str(junk))])
    result = report.build_report([log])  # a report over such a log still comes out
    assert {c["version"] for c in result.data["communicators"]} == {None}


def test_cached_per_path_and_file_and_bounded(tmp_path, monkeypatch):
    copy = tmp_path / "a" / "libnccl.so.2"
    copy.parent.mkdir()
    shutil.copyfile(SIM, copy)
    first = elf.file_version(str(copy))
    assert first is not None and first.version == "2.28.9" and first.simulated
    calls = []
    real_scan = elf._scan_file
    monkeypatch.setattr(elf, "_scan_file", lambda *a, **k: calls.append(a[1]) or real_scan(*a, **k))
    assert elf.file_version(str(copy)) == first and calls == []  # same path, same file: cached
    copy.unlink()
    shutil.copyfile(SIM, copy)  # another file (inode) at the same path is read again
    assert elf.file_version(str(copy)) is not None and calls == [str(copy)]
    monkeypatch.setattr(elf, "FILE_VERSIONS_MAX", 2)
    for name in "bcd":
        other = tmp_path / name / "libnccl.so.2"
        other.parent.mkdir()
        shutil.copyfile(SIM, other)
        elf.file_version(str(other))
    assert len(elf._FILE_VERSIONS) <= 2


def test_a_report_reads_a_bounded_number_of_files(tmp_path, monkeypatch):
    monkeypatch.setattr(libversions, "FILE_READS_MAX", 3)
    seen = []
    monkeypatch.setattr(elf, "file_version", lambda path: seen.append(path))
    events = [ev("nccl_getenv", 10, 1.0 + i, "envplugin", var="NCCL_PROTO", value=str(i), lib=f"/x/{i}/libnccl.so.2")
              for i in range(50)]
    report.build_report([write_log(tmp_path, events)])
    assert seen and len(set(seen)) <= 3
