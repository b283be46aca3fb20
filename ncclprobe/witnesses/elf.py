"""What an ELF file says about NCCL (pyelftools): the libnccl version it carries, and whether it
reaches NCCL through dynamic symbols (an LD_PRELOAD hook sees those calls) or contains NCCL itself
(linked statically: no hook can see it). Results are cached by (path, inode, mtime).
"""
from __future__ import annotations

import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

# The entry points that create communicators; a preload hook interposes exactly these
# (nccl-internals §2). Defining one outside libnccl means NCCL was linked into that object.
COMM_ENTRY_POINTS = frozenset({
    "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitAll", "ncclCommInitRankScalable",
    "ncclCommSplit", "ncclCommShrink", "ncclCommGrow",
})
_VERSION_RE = re.compile(rb"NCCL version (\d+)\.(\d+)\.(\d+)([-+][\w.+-]*)?")
SIM_MARKER = "ncclSimulated"  # defined by ncclprobe's simulated NCCL (probes/simnccl/api.c)
_LIBNCCL_RE = re.compile(r"^libnccl(-[0-9a-f]{8})?\.so(\.\d+)*$")  # auditwheel renames to libnccl-<hash>
_FILENAME_VERSION_RE = re.compile(r"\.so\.(\d+\.\d+\.\d+)$")


def is_libnccl(path: str) -> bool:
    """libnccl.so[.N...] (or a wheel's renamed copy), not its plugins (libnccl-net.so, ...)."""
    return bool(_LIBNCCL_RE.match(os.path.basename(path)))


def version_from_code(code: int) -> str:
    """ncclGetVersion's integer: major*10000+minor*100+patch since 2.9, major*1000+minor*100+patch before
    (NCCL_VERSION macro in nccl.h)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


@dataclass(frozen=True)
class ElfInfo:
    path: str
    reason: str | None = None  # why nothing could be read (not ELF, permission, vanished)
    nccl_imports: tuple[str, ...] = ()  # undefined nccl* dynamic symbols: resolved at load, hookable
    nccl_defines: tuple[str, ...] = ()  # communicator entry points defined here
    needed: tuple[str, ...] = ()
    version: str | None = None
    version_source: str | None = None  # rodata | ncclGetVersion | filename
    simulated: bool = False  # ncclprobe's simulated NCCL ("-simulated" version suffix, ncclSimulated symbol)

    @property
    def contains_nccl(self) -> bool:
        """NCCL's code is in this object: it defines the entry points and carries NCCL's version
        string. Defining them without it is an interposer (a preload hook such as ncclprobe's own)."""
        return bool(self.nccl_defines) and self.version_source == "rodata"

    @property
    def interposes_nccl(self) -> bool:
        return bool(self.nccl_defines) and not self.contains_nccl

    def to_json(self) -> dict:
        return {"path": self.path, "reason": self.reason, "version": self.version,
                "version_source": self.version_source, "nccl_imports": list(self.nccl_imports),
                "nccl_defines": list(self.nccl_defines), "simulated": self.simulated}


_CACHE: dict[tuple[str, int, int], ElfInfo] = {}


def clear_cache() -> None:
    _CACHE.clear()
    _FILE_VERSIONS.clear()


def scan(path: str | Path, display: str | None = None, want_version: bool | None = None) -> ElfInfo:
    """Read `path` (already resolved inside the process's root); `display` is the name to report.
    The version is read for libnccl copies and for objects that contain NCCL, unless told."""
    path = str(path)
    display = display or path
    try:
        st = os.stat(path)
    except OSError as exc:
        return ElfInfo(display, reason=_reason(exc))
    key = (path, st.st_ino, st.st_mtime_ns)
    hit = _CACHE.get(key)
    if hit is not None and (want_version is not True or hit.version_source is not None or hit.reason):
        return hit if hit.path == display else _with_path(hit, display)
    info = _scan(path, display, want_version)
    _CACHE[key] = info
    return info


def _with_path(info: ElfInfo, display: str) -> ElfInfo:
    return ElfInfo(display, info.reason, info.nccl_imports, info.nccl_defines, info.needed,
                   info.version, info.version_source, info.simulated)


def _reason(exc: OSError) -> str:
    if isinstance(exc, PermissionError):
        return "permission"
    if isinstance(exc, FileNotFoundError):
        return "vanished"
    return f"error: {exc.strerror or exc}"


def _scan(path: str, display: str, want_version: bool | None) -> ElfInfo:
    try:
        with open(path, "rb") as fh:
            return _scan_file(fh, display, want_version)
    except OSError as exc:
        return ElfInfo(display, reason=_reason(exc))


def _scan_file(fh, display: str, want_version: bool | None) -> ElfInfo:
    try:
        if fh.read(4) != b"\x7fELF":
            return ElfInfo(display, reason="not ELF")
        if not is_libnccl(display) and not _may_mention_nccl(fh):
            return ElfInfo(display)
        fh.seek(0)
        elf = ELFFile(fh)
        imports, defines, needed, marked = _nccl_symbols(elf)
        version = source = None
        simulated = marked
        if want_version or (want_version is None and (defines or is_libnccl(display))):
            version, source, suffix = _version(elf, display)
            simulated = simulated or "simulated" in suffix
        return ElfInfo(display, None, imports, defines, needed, version, source, simulated)
    except OSError as exc:
        return ElfInfo(display, reason=_reason(exc))
    except (ELFError, ValueError, KeyError, IndexError, struct.error) as exc:  # truncated or odd ELF
        return ElfInfo(display, reason=f"unreadable ELF: {exc}")


FILE_VERSIONS_MAX = 256  # (path, file) entries kept: a report names a few copies, a hand-made log may name many
_FILE_VERSIONS: dict[tuple, ElfInfo | None] = {}


def file_version(path: str) -> ElfInfo | None:
    """The ELF of a library file that a witness named by path (a probe's event: the copy a process
    ran), read as `inspect` reads it, for its version; None where it cannot be read. Only a regular
    file is read: opened once without blocking (a log may name a FIFO or a device) and checked with
    fstat, then read through that same descriptor. Cached per path and file (device, inode, mtime,
    size), at most FILE_VERSIONS_MAX entries; never raises."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except (OSError, ValueError, TypeError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        key = (path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        if key in _FILE_VERSIONS:
            return _FILE_VERSIONS[key]
        with os.fdopen(os.dup(fd), "rb") as fh:
            info = _scan_file(fh, path, want_version=True)
        got = info if info.version else None
        if len(_FILE_VERSIONS) >= FILE_VERSIONS_MAX:
            _FILE_VERSIONS.pop(next(iter(_FILE_VERSIONS)))  # the oldest entry
        _FILE_VERSIONS[key] = got
        return got
    except Exception:  # noqa: BLE001 - a witness's blind spot, never the report's failure
        return None
    finally:
        os.close(fd)


def _contains(fh, size: int, needle: bytes) -> bool:
    """Whether the next `size` bytes of fh hold needle: read into a buffer kept from call to call (a
    large library's string table, hundreds of KB, read into a new bytes object each time costs a
    fresh mapping, page faults and zeroing: glibc serves allocations that large with mmap), searched
    with libc's memmem where there is one (twice as fast as `in`)."""
    global _scratch, _memmem
    if _memmem is None:
        try:
            import ctypes
            fn = ctypes.CDLL(None).memmem
            fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
            _memmem = fn
        except (OSError, AttributeError, ImportError):
            _memmem = False
    if _memmem is False:
        return needle in fh.read(size)
    if len(_scratch) < size:
        import ctypes
        _scratch = ctypes.create_string_buffer(size)
    n = fh.readinto(memoryview(_scratch).cast("B")[:size])
    return bool(n) and _memmem(_scratch, n, needle, len(needle)) is not None


_memmem = None
_scratch = b""


def _may_mention_nccl(fh) -> bool:
    """Fast path before pyelftools (which costs milliseconds per file): read the section headers with
    struct and look in the symbol string tables for what _nccl_symbols would look for (any 'nccl'
    name in the dynamic ones, a communicator entry point in the others). False only when no symbol
    can be ours."""
    fh.seek(0)
    ident = fh.read(64)
    if len(ident) < 52:
        return True  # let pyelftools report what is wrong
    is64, endian = ident[4] == 2, "<" if ident[5] == 1 else ">"
    if is64:
        shoff, = struct.unpack_from(endian + "Q", ident, 0x28)
        shentsize, shnum = struct.unpack_from(endian + "HH", ident, 0x3A)
        fmt, fields = endian + "IIQQQQIIQQ", 10
    else:
        shoff, = struct.unpack_from(endian + "I", ident, 0x20)
        shentsize, shnum = struct.unpack_from(endian + "HH", ident, 0x2E)
        fmt, fields = endian + "IIIIIIIIII", 10
    size = struct.calcsize(fmt)
    if not shoff or not shnum or shentsize < size:
        return True
    fh.seek(shoff)
    table = fh.read(shentsize * shnum)
    table = table[:len(table) - len(table) % shentsize]
    if shentsize == size:  # as always: one C call for every header
        headers = list(struct.iter_unpack(fmt, table))
    else:
        headers = [struct.unpack_from(fmt, table, i) for i in range(0, len(table), shentsize)]
    assert fields == 10  # name, type, flags, addr, offset, size, link, info, align, entsize
    for h in headers:
        if h[1] in (2, 11) and h[6] < len(headers):  # SHT_SYMTAB, SHT_DYNSYM -> sh_link: its strings
            strings = headers[h[6]]
            fh.seek(strings[4])
            if _contains(fh, strings[5], b"nccl" if h[1] == 11 else b"ncclComm"):
                return True
    return False



def _nccl_symbols(elf: ELFFile) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], bool]:
    """Undefined nccl* dynamic symbols, communicator entry points defined, DT_NEEDED, and whether
    the object defines the simulated NCCL's marker."""
    imports: set[str] = set()
    defines: set[str] = set()
    marked = False
    needed: list[str] = []
    dynamic = elf.get_section_by_name(".dynamic")
    if dynamic is not None:
        needed = [t.needed for t in dynamic.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
    for symtab, strtab in ((".dynsym", ".dynstr"), (".symtab", ".strtab")):
        sec = elf.get_section_by_name(symtab)
        strings = elf.get_section_by_name(strtab)
        if not isinstance(sec, SymbolTableSection) or strings is None or (symtab == ".symtab" and defines):
            continue
        # Iterating symbols in Python is slow; the string table tells cheaply whether any is ours.
        if (b"nccl" if symtab == ".dynsym" else b"ncclComm") not in strings.data():
            continue
        for sym in sec.iter_symbols():
            name = sym.name.split("@", 1)[0]
            if not name.startswith("nccl"):
                continue
            if sym["st_shndx"] == "SHN_UNDEF":
                if symtab == ".dynsym":
                    imports.add(name)
            elif name == SIM_MARKER:
                marked = True
            elif name in COMM_ENTRY_POINTS and sym["st_info"]["type"] in ("STT_FUNC", "STT_GNU_IFUNC"):
                defines.add(name)
    return tuple(sorted(imports)), tuple(sorted(defines)), tuple(needed), marked


def _version(elf: ELFFile, display: str) -> tuple[str | None, str | None, str]:
    """(version, where it was read, the version string's suffix: "+cuda12.9", "-simulated+cpu")."""
    # init.cc prints "NCCL version %s" from a string built at compile time: "NCCL version 2.32.3+cuda12.9"
    for name in (".rodata", ".rodata.str1.1", ".rodata.str1.8"):
        sec = elf.get_section_by_name(name)
        if sec is None:
            continue
        m = _VERSION_RE.search(sec.data())
        if m:
            return f"{int(m[1])}.{int(m[2])}.{int(m[3])}", "rodata", (m[4] or b"").decode("ascii", "replace")
    code = _get_version_constant(elf)
    if code:
        return version_from_code(code), "ncclGetVersion", ""
    m = _FILENAME_VERSION_RE.search(display)
    if m:
        return m.group(1), "filename", ""
    return None, None, ""


def _get_version_constant(elf: ELFFile) -> int | None:
    """ncclGetVersion(int* v) stores a constant: x86-64 `movl $imm32,(%rdi)` = c7 07 imm32."""
    if elf["e_machine"] != "EM_X86_64":
        return None
    for tab in (".dynsym", ".symtab"):
        sec = elf.get_section_by_name(tab)
        if not isinstance(sec, SymbolTableSection):
            continue
        syms = sec.get_symbol_by_name("ncclGetVersion") or sec.get_symbol_by_name("pncclGetVersion")
        if not syms or syms[0]["st_shndx"] == "SHN_UNDEF":
            continue
        addr = syms[0]["st_value"]
        for seg in elf.iter_segments():
            if seg["p_type"] == "PT_LOAD" and seg["p_vaddr"] <= addr < seg["p_vaddr"] + seg["p_filesz"]:
                off = seg["p_offset"] + addr - seg["p_vaddr"]
                elf.stream.seek(off)
                code = elf.stream.read(48)
                i = code.find(b"\xc7\x07")
                if i >= 0 and i + 6 <= len(code):
                    return int.from_bytes(code[i + 2:i + 6], "little")
        return None
    return None
