"""Hostile ELF files and mappings (issue 21): every reader of a binary that another user controls is
bounded and never hangs. Forged copies of real binaries (a string section claiming gigabytes, an
e_shoff of 2^64-1, 65,535 headers, links out of range), a FIFO put at a deleted mapping's name, a C
library mapped at a path over 4,096 bytes, and a seeded fuzz of the ELF readers: each under a time
bound and, where a forged size could make a reader allocate, a memory bound."""
from __future__ import annotations

import json
import os
import random
import resource
import shutil
import struct
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

import ncclprobe._lib
from ncclprobe.witnesses import elf, elfread, elfsyms, livemem

SIM = Path(ncclprobe._lib.__file__).parent / "sim" / "libnccl.so.2"  # has nccl symbols, .rodata, .symtab
LIBC = next((p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6", "/lib64/libc.so.6")
             if os.path.isfile(p)), None)
CC = shutil.which("cc") or shutil.which("gcc")
NCCLPROBE = [sys.executable, "-m", "ncclprobe"]
WAIT_S = 90            # a whole inspect on two loaded cores; the defects this catches never finish
MEM_LIMIT = 1 << 30    # address space of a child that reads a forged file (a bare one needs ~20 MB)
GIB = 1 << 30
needs_libc = pytest.mark.skipif(LIBC is None, reason="needs the C library's file")


# ---------------------------------------------------------------------------------------- forging
_EHDR = {"e_phoff": (0x20, "Q"), "e_shoff": (0x28, "Q"), "e_phentsize": (0x36, "H"), "e_phnum": (0x38, "H"),
         "e_shentsize": (0x3A, "H"), "e_shnum": (0x3C, "H"), "e_shstrndx": (0x3E, "H")}
_SHDR = {"sh_name": (0x00, "I"), "sh_type": (0x04, "I"), "sh_offset": (0x18, "Q"), "sh_size": (0x20, "Q"),
         "sh_link": (0x28, "I"), "sh_info": (0x2C, "I"), "sh_entsize": (0x38, "Q")}


class Forge:
    """A copy of a 64-bit little-endian ELF file whose header and section header fields are set in
    place (the rest of the file stays the real one)."""

    def __init__(self, src: Path | str, dst: Path):
        shutil.copyfile(src, dst)
        self.path = dst
        self.data = dst.read_bytes()
        assert self.data[:6] == b"\x7fELF\x02\x01", "a 64-bit little-endian ELF"
        self.shoff, = struct.unpack_from("<Q", self.data, 0x28)
        self.shnum, self.shstrndx = struct.unpack_from("<HH", self.data, 0x3C)

    def section(self, i: int) -> dict:
        at = self.shoff + 64 * i
        return {k: struct.unpack_from("<" + f, self.data, at + o)[0] for k, (o, f) in _SHDR.items()}

    def index(self, name: str) -> int:
        names = self.section(self.shstrndx)
        table = self.data[names["sh_offset"]:names["sh_offset"] + names["sh_size"]]
        for i in range(self.shnum):
            off = self.section(i)["sh_name"]
            if table[off:table.find(b"\0", off)] == name.encode():
                return i
        raise KeyError(name)

    def set_header(self, field: str, value: int) -> Forge:
        off, f = _EHDR[field]
        return self._write(off, struct.pack("<" + f, value))

    def set_section(self, which: str | int, field: str, value: int) -> Forge:
        i = which if isinstance(which, int) else self.index(which)
        off, f = _SHDR[field]
        return self._write(self.shoff + 64 * i + off, struct.pack("<" + f, value))

    def _write(self, at: int, raw: bytes) -> Forge:
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, raw, at)
        finally:
            os.close(fd)
        self.data = self.data[:at] + raw + self.data[at + len(raw):]
        return self


def bounded(code: str, *args: str, mem: int = MEM_LIMIT, timeout: float = WAIT_S) -> dict:
    """Run code in a fresh interpreter with its address space limited to mem bytes (an allocation of
    a forged size fails there instead of taking the machine); it prints one JSON line. Returns that,
    with the child's peak RSS."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    prologue = "import json, resource, sys\n"
    # the peak of this image (VmHWM): ru_maxrss keeps the forking parent's peak across the exec, and the
    # suite's pytest process passes 200 MB once torch is imported (28 failures in a full run, none alone)
    epilogue = ("\nout['maxrss_kb'] = next(int(l.split()[1]) for l in open('/proc/self/status') "
                "if l.startswith('VmHWM:'))\nprint(json.dumps(out))\n")
    r = subprocess.run([sys.executable, "-c", prologue + code + epilogue, *args], capture_output=True, text=True,
                       timeout=timeout, preexec_fn=limit, check=False)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


READ_ALL = r"""
from ncclprobe.witnesses import elf, elfsyms, livemem
path, display = sys.argv[1], sys.argv[2]
info = elf.scan(path, display=display, want_version=True)
fv = elf.file_version(path)
try:
    found = elfsyms.lookup(path, (b"__environ", b"environ"), True)
    sym = [found.value, found.word]
except (OSError, ValueError) as exc:
    sym = "refused: " + str(exc)
slot = livemem._read_slot(path, path, True)
out = {"reason": info.reason, "version": info.version, "file_version": fv and fv.version, "sym": sym,
       "slot_reason": slot.reason}
"""


def read_all(path: Path, display: str | None = None) -> dict:
    return bounded(READ_ALL, str(path), display or str(path))


# ---------------------------------------------------------------------------------- forged sizes
@pytest.mark.parametrize("section", [".dynstr", ".strtab", ".rodata", ".dynsym", ".symtab", ".gnu.hash"])
@pytest.mark.parametrize("name", ["libforged.so", "libnccl.so.2"])
def test_a_section_claiming_gigabytes_is_refused_without_allocating_it(tmp_path, section, name):
    """The issue's case: a string section whose header claims gigabytes made `inspect` allocate and
    zero-fill that much (or die with a traceback). Read in a child limited to 1 GiB of address space,
    every reader says why instead, with a small peak RSS."""
    f = Forge(SIM, tmp_path / name).set_section(section, "sh_size", 8 * GIB)
    got = read_all(f.path)
    assert got["maxrss_kb"] < 200 * 1024, got
    if section in (".dynstr", ".dynsym", ".rodata"):  # what elf.scan reads of it (the rest is never read)
        assert got["reason"].startswith("unreadable ELF") and "past the end" in got["reason"], got
        assert got["file_version"] is None
    else:
        assert got["reason"] is None and got["version"] == got["file_version"] == "2.28.9", got
    if section in (".gnu.hash", ".strtab"):  # what the environ lookup reads whole (a static binary's .strtab)
        assert got["sym"].startswith("refused") and "past the end" in got["sym"], got
        assert got["slot_reason"].startswith("unreadable ELF") and "past the end" in got["slot_reason"], got
    else:  # what it needs only where a name is found (the simulated NCCL has no environ)
        assert got["sym"] == [None, 8] or "past the end" in got["sym"], got


@pytest.mark.slow
def test_string_sections_of_gigabytes_in_a_sparse_file_stay_within_the_budget(tmp_path):
    """Sections inside the file (a sparse one: their sizes are real, their bytes holes) are streamed
    through one window, not allocated; the reads of one file stop at its budget (512 MiB)."""
    f = Forge(SIM, tmp_path / "libforged.so")
    part = 300 << 20
    os.truncate(f.path, 4 * part)
    f.set_section(".dynstr", "sh_offset", part).set_section(".dynstr", "sh_size", part)
    f.set_section(".strtab", "sh_offset", 2 * part).set_section(".strtab", "sh_size", part)
    t0 = time.monotonic()
    got = read_all(f.path)
    assert got["reason"].startswith("unreadable ELF: reads over the 512 MiB budget"), got
    assert got["maxrss_kb"] < 200 * 1024, got
    assert time.monotonic() - t0 < WAIT_S


@pytest.mark.parametrize("field,value", [("e_shoff", (1 << 64) - 1), ("e_shoff", (1 << 63)), ("e_phoff", (1 << 64) - 1),
                                         ("e_shnum", 65535), ("e_shentsize", 1), ("e_shentsize", 65535),
                                         ("e_phnum", 65535), ("e_shstrndx", 65535)])
def test_extreme_header_fields_become_reasons(tmp_path, field, value):
    """e_shoff of 2^64-1 made os.pread raise OverflowError out of `--live`'s symbol reader; every
    extreme header value is now a reason (or an ordinary result where the field is not needed)."""
    f = Forge(SIM, tmp_path / "libnccl.so.2").set_header(field, value)
    got = read_all(f.path)
    if field in ("e_shoff", "e_shnum", "e_shentsize"):
        assert got["reason"].startswith("unreadable ELF"), got
        assert isinstance(got["sym"], str) and got["sym"].startswith("refused"), got
        assert got["slot_reason"].startswith("unreadable ELF"), got


def test_e_shoff_of_all_ones_in_process(tmp_path):
    f = Forge(SIM, tmp_path / "libnccl.so.2").set_header("e_shoff", (1 << 64) - 1)
    with pytest.raises(ValueError, match="past the end of the file"):
        elfsyms.lookup(str(f.path), (b"environ",), False)
    assert livemem._read_slot(str(f.path), "lib", False).reason.startswith("unreadable ELF lib: ")
    assert elf.scan(f.path).reason.startswith("unreadable ELF: ")


@pytest.mark.parametrize("case", ["link out of range", "link to itself", "link to the symbols", "link to null",
                                  "entsize 1", "entsize huge", "strings without NUL", "names past the table",
                                  "hash out of range", "shstrndx to symbols"])
def test_odd_links_and_tables_become_values(tmp_path, case):
    f = Forge(SIM, tmp_path / "libnccl.so.2")
    dynsym, dynstr = f.index(".dynsym"), f.index(".dynstr")
    if case == "link out of range":
        f.set_section(dynsym, "sh_link", 0xFFFFFFFF)
    elif case == "link to itself":
        f.set_section(dynsym, "sh_link", dynsym)
    elif case == "link to the symbols":  # the strings are the symbol table: names anywhere in it
        f.set_section(".symtab", "sh_link", f.index(".symtab"))
    elif case == "link to null":
        f.set_section(dynsym, "sh_link", 0)
    elif case == "entsize 1":
        f.set_section(dynsym, "sh_entsize", 1)
    elif case == "entsize huge":
        f.set_section(dynsym, "sh_entsize", (1 << 64) - 1)
    elif case == "strings without NUL":  # every name runs to the end of its table
        sec = f.section(dynstr)
        f._write(sec["sh_offset"], b"ncclCommInitRank" * (sec["sh_size"] // 16))
    elif case == "names past the table":
        f.set_section(dynstr, "sh_size", 1)
    elif case == "hash out of range":
        f.set_section(".gnu.hash", "sh_size", 1 << 20)
    elif case == "shstrndx to symbols":
        f.set_header("e_shstrndx", dynsym)
    got = read_all(f.path)
    assert got["maxrss_kb"] < 200 * 1024, got
    assert got["reason"] is None or got["reason"].startswith("unreadable ELF"), got


def _many_dynsym(src: Path, dst: Path, headers: int, strings: int) -> Path:
    """src with a string table of `strings` bytes appended (names, none the one looked up) and a new
    section header table: the original headers, then DYNSYM headers up to `headers`, every one of
    them over the original symbols and linked to the appended strings."""
    data = bytearray(src.read_bytes())
    f = Forge(src, dst)
    dynsym = f.section(f.index(".dynsym"))
    table = data[f.shoff:f.shoff + 64 * f.shnum]
    blob = (b"no_such_name_here\0" * (strings // 18 + 1))[:strings]
    str_off = len(data)
    data += blob
    strhdr = struct.pack("<IIQQQQIIQQ", 0, 3, 0, 0, str_off, len(blob), 0, 0, 1, 0)
    sym = struct.pack("<IIQQQQIIQQ", 0, 11, 2, 0, dynsym["sh_offset"], dynsym["sh_size"], f.shnum, 1, 8, 24)
    shoff = len(data) + (-len(data)) % 8
    data += b"\0" * (shoff - len(data)) + table + strhdr + sym * (headers - f.shnum - 1)
    struct.pack_into("<Q", data, 0x28, shoff)
    struct.pack_into("<H", data, 0x3C, headers)
    # the original .dynsym too, so that its string table is the appended one for every DYNSYM header
    struct.pack_into("<I", data, shoff + 64 * f.index(".dynsym") + 0x28, f.shnum)
    dst.write_bytes(bytes(data))
    return dst


@contextmanager
def bytes_read():
    """Counts the bytes this process reads with os.pread and os.preadv meanwhile."""
    count = [0]
    pread, preadv = os.pread, os.preadv

    def counting_pread(fd, n, off):
        got = pread(fd, n, off)
        count[0] += len(got)
        return got

    def counting_preadv(fd, bufs, off):
        got = preadv(fd, bufs, off)
        count[0] += got
        return got
    os.pread, os.preadv = counting_pread, counting_preadv
    try:
        yield count
    finally:
        os.pread, os.preadv = pread, preadv


def test_many_dynsym_headers_over_one_string_section_cost_once(tmp_path):
    """The issue's case: 65,535 DYNSYM headers over one 64 MB string section were read once per header
    (hours). Built small (4 MB of strings, 2,000 headers): the bytes read stay a small multiple of the
    file whatever the count of headers (the first symbol table of each kind is the only one read)."""
    lib = _many_dynsym(SIM, tmp_path / "libnccl.so.2", 2000, 4 << 20)
    size = lib.stat().st_size
    for read in (lambda: elfsyms.lookup(str(lib), (b"__environ", b"environ"), True),
                 lambda: elf._scan(str(lib), str(lib), True)):
        with bytes_read() as count:
            read()
        assert count[0] <= 2 * size, (count[0], size)


def test_the_cost_of_many_dynsym_headers_grows_with_the_headers_not_with_headers_times_strings(tmp_path):
    """Linear: four times the headers over the same strings costs about four times the header table,
    not four times the strings."""
    cost = {}
    for headers in (4000, 16000):
        lib = _many_dynsym(SIM, tmp_path / f"libnccl-{headers}.so.2", headers, 4 << 20)
        with bytes_read() as count:
            elfsyms.lookup(str(lib), (b"__environ", b"environ"), True)
            elf._scan(str(lib), str(lib), True)
        cost[headers] = count[0]
    table = (16000 - 4000) * 64
    assert cost[16000] - cost[4000] <= 2 * 2 * table + (1 << 20), cost  # each reader reads the table once


def test_a_name_cut_by_the_end_of_its_table_is_no_name(tmp_path):
    """A string table whose size ends inside a name: that name has no NUL in the table and is none,
    even where the window buffer, left larger by an earlier read, holds a NUL past the table's end."""
    f = Forge(SIM, tmp_path / "libnccl.so.2")
    dynstr = f.section(f.index(".dynstr"))
    table = f.data[dynstr["sh_offset"]:dynstr["sh_offset"] + dynstr["sh_size"]]
    last = table.rfind(b"nccl")
    cut = last + 6  # inside the last nccl* name
    f.set_section(".dynstr", "sh_size", cut)
    elfread._local.buf = bytearray(1 << 16)  # zeros: what a longer table read before may have left
    fd, st = elfread.open_regular(f.path)
    try:
        e = elfread.Elf(fd, st.st_size)
        names = e.occurrences(e.linked(e.first(elfread.SHT_DYNSYM)), b"nccl", names=True)
    finally:
        os.close(fd)
    assert names and last not in names
    assert all(table[off:off + len(n) + 1] == n + b"\0" and off + len(n) < cut for off, n in names.items())


# ------------------------------------------------------------------------- files that are no files
NO_HANG = r"""
import os
from ncclprobe.witnesses import elf
out = {p: [elf.scan(p).reason, bool(elf.file_version(p))] for p in sys.argv[1:]}
"""


def test_what_is_not_a_regular_file_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "libnccl.so.2"
    os.mkfifo(fifo)
    link = tmp_path / "link" / "libnccl.so.2"
    link.parent.mkdir()
    link.symlink_to(SIM)
    got = bounded(NO_HANG, str(fifo), "/dev/null", str(link), str(tmp_path), str(SIM), timeout=60)
    assert got[str(fifo)] == ["not a regular file (FIFO)", False]
    assert got["/dev/null"] == ["not a regular file (character device)", False]
    assert got[str(tmp_path)] == ["not a regular file (directory)", False]
    # a mapped path is the file's own (the kernel names it): a link there is not the file mapped;
    # a log's path may be a soname link, and a link to a regular file is read
    assert got[str(link)] == ["not a regular file (symbolic link)", True]
    assert got[str(SIM)] == [None, True]


def test_open_regular_never_opens_a_fifo_or_a_device(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "FIFO"), ("/dev/zero", "character device")):
        with pytest.raises(elfread.BadElf, match=kind):
            elfread.open_regular(path)
    with pytest.raises(OSError):
        elfread.open_regular(tmp_path / "missing")


MAPS_THEN_FIFO = r"""
import mmap, os, sys, shutil
path = sys.argv[1]
shutil.copyfile(sys.argv[2], path)
fd = os.open(path, os.O_RDONLY)
m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_EXEC)
os.close(fd)
os.unlink(path)
os.mkfifo(path)  # the deleted mapping's name is a FIFO now: a blocking open of it never returns
print("ready", flush=True)
sys.stdin.read()
"""


MAPS_KEEP = r"""
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_EXEC)
print("ready", flush=True)
sys.stdin.read()
"""


@contextmanager
def running(code: str, *args: str, **kw):
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, **kw)
    try:
        assert p.stdout.readline().strip() == "ready"
        yield p
    finally:
        p.kill()
        p.wait()


def inspect(pid: int, *args: str, env: dict | None = None) -> dict:
    r = subprocess.run([*NCCLPROBE, "inspect", str(pid), "--json", *args], capture_output=True, text=True,
                       timeout=WAIT_S, env=env, check=False)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.mark.parametrize("live", [False, True])
def test_a_fifo_at_a_deleted_mapping_s_name_never_hangs_inspect(tmp_path, live):
    """The issue's case: a process maps a file, deletes it and puts a FIFO at its name; `inspect` opened
    that name with a blocking open() and hung. It finishes now (within WAIT_S, or the test fails)."""
    with running(MAPS_THEN_FIFO, str(tmp_path / "libplugin.so"), "/bin/true") as p:
        maps = Path(f"/proc/{p.pid}/maps").read_text()
        assert f"{tmp_path}/libplugin.so (deleted)" in maps
        t0 = time.monotonic()
        doc = inspect(p.pid, *(["--live"] if live else []))
        assert time.monotonic() - t0 < WAIT_S
        assert [r["pid"] for r in doc["processes"]] == [p.pid]


# ---------------------------------------------------------------------------- the native loop
def _deep_dir(base: Path, depth: int = 24) -> tuple[Path, list[str]]:
    """A directory nested `depth` levels of 200-byte names under base (a path over 4,096 bytes: made
    one level at a time, relative to the one before, as no call takes it whole)."""
    names = [f"{i:02d}" + "d" * 198 for i in range(depth)]
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in names:
            os.mkdir(name, dir_fd=fd)
            nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)
    return base.joinpath(*names), names


DEEP = r"""
import ctypes, mmap, os, shutil, sys
names, src, how = sys.argv[1].split("/"), sys.argv[2], sys.argv[3]
os.chdir(names[0])
for name in names[1:]:
    os.chdir(name)  # one level at a time: the whole path is longer than PATH_MAX
if how == "mmap":  # the C library's bytes mapped at the long path, executable (not loaded)
    fd = os.open("libc.so.6", os.O_RDWR | os.O_CREAT, 0o755)
    with open(src, "rb") as s:
        os.write(fd, s.read())
    m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_EXEC)
else:  # a C-library-like object loaded from there, its environ pointing at the process's own
    shutil.copyfile(src, "libc.so.6")
    lib = ctypes.CDLL(os.path.abspath("libc.so.6") if False else "./libc.so.6")
    ctypes.c_void_p.in_dll(lib, "environ").value = ctypes.c_void_p.in_dll(ctypes.CDLL(None), "environ").value
print("ready", flush=True)
sys.stdin.read()
"""


def _long_row(pid: int) -> str:
    row = next(line for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if line.endswith("/libc.so.6")
               and "ddd" in line)
    path = row.split(None, 5)[5]
    assert len(path.encode()) > 4096
    return path


@pytest.fixture(scope="module")
def fake_libc(tmp_path_factory) -> Path:
    """A shared object that exports `environ` as data, as the C library does."""
    if not CC:
        pytest.skip("needs a C compiler")
    d = tmp_path_factory.mktemp("fakelibc")
    (d / "e.c").write_text("char **environ = 0;\nint fake_libc_marker(void) { return 1; }\n")
    subprocess.run([CC, "-shared", "-fPIC", "-o", d / "libc.so.6", d / "e.c"], check=True, capture_output=True)
    return d / "libc.so.6"


@pytest.mark.parametrize("native", ["1", "maps", "0"])
def test_a_c_library_at_a_path_over_4096_bytes_is_read_not_looped_on(tmp_path, fake_libc, native):
    """The issue's case: the native read handed Python the path cut at 4,096 bytes and compared the
    whole one when it looked the object up again: `inspect --live` looped for ever. Now the path is
    handed whole (the buffer grows to it) and the environment is read through that object."""
    _, names = _deep_dir(tmp_path)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NCCL_DEBUG": "INFO", "NCCL_LONG_PATH": "yes"}
    with running(DEEP, "/".join(names), str(fake_libc), "load", cwd=tmp_path, env=env) as p:
        _long_row(p.pid)
        t0 = time.monotonic()
        doc = inspect(p.pid, "--live", env={**os.environ, "NCCLPROBE_NATIVE_LIVE": native})
        assert time.monotonic() - t0 < WAIT_S
        (row,) = doc["processes"]
        assert row["live_env"] is not None, row.get("live_reason")
        assert row["live_env"].get("NCCL_LONG_PATH") == "yes" and row["live_env"].get("NCCL_DEBUG") == "INFO"


@needs_libc
@pytest.mark.parametrize("native", ["1", "0"])
def test_a_libc_copy_mapped_at_a_path_over_4096_bytes_finishes(tmp_path, native):
    """The C library's bytes mapped (not loaded) at a long path: the read cannot succeed through it
    (its environ slot is not there), and says so, in bounded time."""
    _, names = _deep_dir(tmp_path)
    with running(DEEP, "/".join(names), LIBC, "mmap", cwd=tmp_path) as p:
        _long_row(p.pid)
        t0 = time.monotonic()
        doc = inspect(p.pid, "--live", env={**os.environ, "NCCLPROBE_NATIVE_LIVE": native})
        assert time.monotonic() - t0 < WAIT_S
        (row,) = doc["processes"]
        assert row["live_env"] is not None or row["live_reason"], row


def test_the_native_read_never_asks_for_one_object_twice(monkeypatch):
    """Whatever the C side answers, the Python side of the call ends: an object asked for again after
    it was resolved stops that process with a reason (here the resolution is made to add nothing)."""
    from ncclprobe.witnesses import liveread
    if liveread.load() is None:
        pytest.skip("native/livemem.c is not built")
    reading = livemem.Reading(native=True)
    monkeypatch.setattr(reading._native, "add", lambda key, delta, word: 0)  # the table never grows
    p = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        got = reading.read(p.pid)
        assert got.env is None and got.reason == livemem.UNMATCHED
    finally:
        p.kill()
        p.wait()


# ---------------------------------------------------------------------------------------- fuzzing
SEED = 21
CASES = {"true": 100, "sim": 120, "libnccl": 80}
PER_CASE_S = 2.0
FUZZ_MEM = 1 << 30          # the fuzzing child's address space: an allocation of a forged size fails in it
FUZZ_RSS = 256 << 20        # and its peak resident memory over all its cases
EXTREMES = (0, 1, 2, 0x7F, 0xFF, 0xFFFF, 0xFFFFFFFF, (1 << 63) - 1, 1 << 63, (1 << 64) - 1)


def _real_libnccl() -> Path | None:
    try:
        import nvidia.nccl
    except ImportError:
        return None
    return next((p for b in nvidia.nccl.__path__ for p in [Path(b) / "lib" / "libnccl.so.2"] if p.exists()), None)


def _sparse_copy(src: Path, dst: Path) -> None:
    """src's size and every byte the readers may read (headers, symbol, string, hash, dynamic tables,
    small sections such as .rodata); the rest (0.4 GB of GPU code) left as holes."""
    with open(src, "rb") as fh:
        head = fh.read(64)
        shoff, = struct.unpack_from("<Q", head, 0x28)
        shnum, = struct.unpack_from("<H", head, 0x3C)
        fh.seek(shoff)
        table = fh.read(64 * shnum)
        ranges = [(0, 1 << 16), (shoff, 64 * shnum)]
        for i in range(shnum):
            _, typ, _, _, off, size, *_ = struct.unpack_from("<IIQQQQIIQQ", table, 64 * i)
            if typ in (2, 3, 5, 6, 11, 0x6FFFFFF6) or (typ == 1 and size < 1 << 20):
                ranges.append((off, size))
        with open(dst, "wb") as out:
            out.truncate(src.stat().st_size)
            for off, size in ranges:
                fh.seek(off)
                out.seek(off)
                out.write(fh.read(size))


def _layout(path: Path) -> tuple[int, int, int, int, int]:
    """What _mutate draws from: (file size, e_shoff, e_shnum, e_phoff, e_phnum)."""
    with open(path, "rb") as fh:
        head = fh.read(64)
    phoff, shoff = struct.unpack_from("<QQ", head, 0x20)
    phnum, = struct.unpack_from("<H", head, 0x38)
    shnum, = struct.unpack_from("<H", head, 0x3C)
    return path.stat().st_size, shoff, shnum, phoff, phnum


def _mutate(rng: random.Random, layout: tuple[int, int, int, int, int]) -> list[tuple[int, bytes]]:
    """A few writes that make a forged file of a real one: header fields set to extremes (sizes,
    offsets, counts, links, types), bytes flipped in the ELF header, the section headers or the first
    64 KB (the ELF and program headers, the dynamic symbols and their strings)."""
    size, shoff, shnum, phoff, phnum = layout
    out = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        value = rng.choice(EXTREMES + (size, size - 1, rng.getrandbits(64)))
        if kind < 0.25:  # an ELF header field
            off, f = rng.choice(list(_EHDR.values()))
        elif kind < 0.6 and shnum:  # a section header field
            field_off, f = rng.choice(list(_SHDR.values()))
            off = shoff + 64 * rng.randrange(shnum) + field_off
        elif kind < 0.7 and phnum:  # a program header's offset, address or sizes
            off, f = phoff + 56 * rng.randrange(phnum) + rng.choice((8, 16, 32, 40)), "Q"
        else:  # a byte flipped
            lo, n = rng.choice(((0, 64), (shoff, 64 * shnum), (0, min(size, 1 << 16))))
            out.append((lo + rng.randrange(max(1, n)), bytes([rng.getrandbits(8)])))
            continue
        out.append((off, struct.pack("<" + f, value & ((1 << (8 * struct.calcsize(f))) - 1))))
    return [(at, raw) for at, raw in out if at + len(raw) <= size]


def _read_everything(path: str, display: str) -> None:
    """Every ELF reader of the tool on one file: what must never raise, and never block."""
    elf.clear_cache()
    for want in (None, True):
        info = elf._scan(path, display, want)
        assert info.reason is None or isinstance(info.reason, str)
    elf.file_version(path)
    for static in (False, True):
        try:
            elfsyms.lookup(path, (b"__environ", b"environ", b"_environ"), static)
        except (OSError, ValueError):
            pass  # its documented refusals (livemem turns them into reasons)
        livemem._read_slot(path, display, static)


def fuzz(which: str, copy: str, cases: int) -> list[float]:
    """`cases` seeded forgeries of the file at copy, each written in place, read by every reader and
    undone; the time of each. Raises with the case that raised."""
    rng = random.Random(f"{SEED}-{which}")
    layout = _layout(Path(copy))
    times = []
    fd = os.open(copy, os.O_RDWR)
    try:
        for case in range(cases):
            writes = _mutate(rng, layout)
            saved = [(at, os.pread(fd, len(raw), at)) for at, raw in writes]
            for at, raw in writes:
                os.pwrite(fd, raw, at)
            t0 = time.monotonic()
            try:
                _read_everything(copy, copy)
            except Exception as exc:  # the case is the failure's evidence
                raise AssertionError(f"case {case} of {which}: {writes!r} raised {exc!r}") from exc
            times.append(time.monotonic() - t0)
            assert times[-1] < PER_CASE_S, (case, which, writes, times[-1])
            for at, raw in reversed(saved):
                os.pwrite(fd, raw, at)
    finally:
        os.close(fd)
    return times


FUZZ = r"""
sys.path.insert(0, sys.argv[1])
import test_elf_hostile
times = test_elf_hostile.fuzz(sys.argv[2], sys.argv[3], int(sys.argv[4]))
out = {"cases": len(times), "max_s": max(times), "mean_s": sum(times) / len(times)}
"""


@pytest.mark.slow
@pytest.mark.parametrize("which", sorted(CASES))
def test_fuzz_the_elf_readers(tmp_path, which):
    """Seeded random forgeries of real binaries: /bin/true, ncclprobe's simulated libnccl and (where the
    wheel is installed) the real 0.4 GB libnccl. Read in a child whose address space is FUZZ_MEM (a
    forged size allocated fails the case there), each case finishes within PER_CASE_S and raises
    nothing, and the child's peak RSS over all cases stays under FUZZ_RSS."""
    src = {"true": Path("/bin/true"), "sim": SIM, "libnccl": _real_libnccl()}[which]
    if src is None or not src.exists():
        pytest.skip(f"{which}: not on this machine")
    copy = tmp_path / ("libnccl.so.2" if which != "true" else "true")
    if which == "libnccl":
        _sparse_copy(src, copy)
    else:
        shutil.copyfile(src, copy)
    got = bounded(FUZZ, str(Path(__file__).parent), which, str(copy), str(CASES[which]), mem=FUZZ_MEM, timeout=600)
    assert got["cases"] == CASES[which] and got["max_s"] < PER_CASE_S, got
    assert got["maxrss_kb"] * 1024 < FUZZ_RSS, got


def test_fuzz_truncations(tmp_path):
    """A file cut anywhere (a copy being written, a forged short one) reads as a reason."""
    rng = random.Random(SEED)
    data = SIM.read_bytes()
    cuts = sorted({0, 1, 4, 16, 51, 52, 63, 64, *(rng.randrange(len(data)) for _ in range(40))})
    for cut in cuts:
        path = tmp_path / f"libnccl-{cut}.so.2"
        path.write_bytes(data[:cut])
        t0 = time.monotonic()
        _read_everything(str(path), str(path))
        assert time.monotonic() - t0 < PER_CASE_S
