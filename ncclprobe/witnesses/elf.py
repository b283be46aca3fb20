"""What an ELF file says about NCCL: the libnccl version it carries, and whether it reaches NCCL
through dynamic symbols (an LD_PRELOAD hook sees those calls) or contains NCCL itself (linked
statically: no hook can see it). The file may be another user's forged copy: it is read through
elfread, every size checked against the file and a cap. Results are cached by (path, inode, mtime).
"""
from __future__ import annotations

import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from ncclprobe.witnesses import elfread
from ncclprobe.witnesses.elfread import SHT_DYNAMIC, SHT_DYNSYM, SHT_SYMTAB, Elf

# The entry points that create communicators; a preload hook interposes exactly these
# (nccl-internals §2). Defining one outside libnccl means NCCL was linked into that object.
COMM_ENTRY_POINTS = frozenset({
    "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitAll", "ncclCommInitRankScalable",
    "ncclCommSplit", "ncclCommShrink", "ncclCommGrow",
})
# bounded: a match is at most _VERSION_SPAN bytes, so a section is searched in windows that overlap by it
_VERSION_RE = re.compile(rb"NCCL version (\d{1,9})\.(\d{1,9})\.(\d{1,9})([-+][\w.+-]{0,64})?")
_VERSION_SPAN = 128
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
    """Read `path` (already resolved inside the process's root: maps names files by their real path,
    so a symbolic link there is not the file mapped and is not followed); `display` is the name to
    report. The version is read for libnccl copies and for objects that contain NCCL, unless told.
    Never raises: what stops the read is the reason."""
    path = str(path)
    display = display or path
    try:
        st = os.stat(path, follow_symlinks=False)
    except (OSError, ValueError) as exc:
        return ElfInfo(display, reason=_reason(exc))
    if not stat.S_ISREG(st.st_mode):  # a FIFO at a deleted mapping's name: never opened
        return ElfInfo(display, reason=f"not a regular file ({elfread._kind(st.st_mode)})")
    key = (path, st.st_ino, st.st_mtime_ns)
    hit = _CACHE.get(key)
    if hit is not None and (want_version is not True or hit.version_source is not None or hit.reason):
        return hit if hit.path == display else _with_path(hit, display)
    info = _scan(path, display, want_version)
    if len(_CACHE) >= CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))  # the oldest entry
    _CACHE[key] = info
    return info


CACHE_MAX = 4096  # files kept: a tree maps a few hundred; a long watch may meet many more


def _with_path(info: ElfInfo, display: str) -> ElfInfo:
    return ElfInfo(display, info.reason, info.nccl_imports, info.nccl_defines, info.needed,
                   info.version, info.version_source, info.simulated)


def _reason(exc: Exception) -> str:
    if isinstance(exc, PermissionError):
        return "permission"
    if isinstance(exc, FileNotFoundError):
        return "vanished"
    if isinstance(exc, OSError):
        return f"error: {exc.strerror or exc}"
    return f"error: {exc}"


def _scan(path: str, display: str, want_version: bool | None) -> ElfInfo:
    try:
        fd, st = elfread.open_regular(path, follow=False)
    except OSError as exc:
        return ElfInfo(display, reason=_reason(exc))
    except elfread.BadElf as exc:  # swapped for something else since the stat
        return ElfInfo(display, reason=str(exc))
    try:
        return _scan_file(fd, display, want_version, st.st_size)
    finally:
        os.close(fd)


def _scan_file(fd: int, display: str, want_version: bool | None, size: int) -> ElfInfo:
    """What the open regular file fd (size bytes) says; never raises."""
    try:
        elf = Elf(fd, size)
        if not is_libnccl(display) and not _may_mention_nccl(elf):
            return ElfInfo(display)
        imports, defines, marked = _nccl_symbols(elf)
        needed = _needed(elf)
        version = source = None
        simulated = marked
        if want_version or (want_version is None and (defines or is_libnccl(display))):
            version, source, suffix = _version(elf, display)
            simulated = simulated or "simulated" in suffix
        return ElfInfo(display, None, imports, defines, needed, version, source, simulated)
    except elfread.NotElf:
        return ElfInfo(display, reason="not ELF")
    except OSError as exc:
        return ElfInfo(display, reason=_reason(exc))
    except (ValueError, IndexError, OverflowError, struct.error) as exc:  # elfread.BadElf: a forged or odd ELF
        return ElfInfo(display, reason=f"unreadable ELF: {exc}")


FILE_VERSIONS_MAX = 256  # (path, file) entries kept: a report names a few copies, a hand-made log may name many
_FILE_VERSIONS: dict[tuple, ElfInfo | None] = {}


def file_version(path: str) -> ElfInfo | None:
    """The ELF of a library file that a witness named by path (a probe's event: the copy a process
    ran), read as `inspect` reads it, for its version; None where it cannot be read. Only a regular
    file is read, opened without blocking (a log may name a FIFO or a device: elfread.open_regular
    opens nothing else) and read through that descriptor. A symbolic link is followed: a log names
    the path the library was loaded by, often a soname link. Cached per path and file (device, inode,
    mtime, size), at most FILE_VERSIONS_MAX entries; never raises."""
    try:
        fd, st = elfread.open_regular(path, follow=True)
    except (OSError, ValueError, TypeError):
        return None
    try:
        key = (path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        if key in _FILE_VERSIONS:
            return _FILE_VERSIONS[key]
        info = _scan_file(fd, path, True, st.st_size)
        got = info if info.version else None
        if len(_FILE_VERSIONS) >= FILE_VERSIONS_MAX:
            _FILE_VERSIONS.pop(next(iter(_FILE_VERSIONS)))  # the oldest entry
        _FILE_VERSIONS[key] = got
        return got
    except Exception:  # noqa: BLE001 - a witness's blind spot, never the report's failure
        return None
    finally:
        os.close(fd)


def _may_mention_nccl(elf: Elf) -> bool:
    """Before reading symbols: whether the symbol names can hold what _nccl_symbols looks for (any
    'nccl' name in the dynamic ones, a communicator entry point in the others)."""
    for kind, needle in ((SHT_DYNSYM, b"nccl"), (SHT_SYMTAB, b"ncclComm")):
        table = elf.first(kind)
        strings = elf.linked(table) if table is not None else None
        if strings is not None and elf.contains(strings, needle):
            return True
    return False


def _nccl_symbols(elf: Elf) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    """Undefined nccl* dynamic symbols, communicator entry points defined, and whether the object
    defines the simulated NCCL's marker."""
    imports: set[str] = set()
    defines: set[str] = set()
    marked = False
    for kind, needle in ((SHT_DYNSYM, b"nccl"), (SHT_SYMTAB, b"ncclComm")):
        table = elf.first(kind)
        strings = elf.linked(table) if table is not None else None
        if strings is None or (kind == SHT_SYMTAB and defines):
            continue
        for name, typ, shndx, _ in _named(elf, table, strings, needle, (b"nccl",)):
            if shndx == 0:  # SHN_UNDEF
                if kind == SHT_DYNSYM:
                    imports.add(name)
            elif name == SIM_MARKER:
                marked = True
            elif name in COMM_ENTRY_POINTS and typ in (STT_FUNC, STT_GNU_IFUNC):
                defines.add(name)
    return tuple(sorted(imports)), tuple(sorted(defines)), marked


STT_FUNC, STT_GNU_IFUNC = 2, 10
DT_NEEDED = 1
MAX_NEEDED = 1024  # DT_NEEDED entries kept


def _named(elf: Elf, table: tuple, strings: tuple, needle: bytes, prefixes: tuple[bytes, ...]):
    """(name, type, shndx, value) of the symbols whose name (without its @version) starts with one of
    prefixes; none unless the string table holds needle. Iterating symbols in Python is slow: the
    places a name can start are found in the strings first (a symbol's name offset may point into
    another name: the linker merges a name that is another's tail), and only those rows unpacked."""
    if needle not in prefixes and not elf.contains(strings, needle):
        return
    names = {off: name.split(b"@", 1)[0].decode("utf-8", "replace")
             for prefix in prefixes for off, name in elf.occurrences(strings, prefix, names=True).items()}
    if not names:
        return
    for off, typ, shndx, value in elf.symbols(table, names):
        yield names[off], typ, shndx, value


def _needed(elf: Elf) -> tuple[str, ...]:
    """DT_NEEDED of the dynamic section, names from its linked string table."""
    dynamic = elf.first(SHT_DYNAMIC)
    strings = elf.linked(dynamic) if dynamic is not None else None
    if strings is None:
        return ()
    values = [value for tag, value in elf.dynamic(dynamic) if tag == DT_NEEDED][:MAX_NEEDED]
    names = (elf.name(strings, value) for value in values)
    return tuple(n.decode("utf-8", "replace") for n in names if n)


def _version(elf: Elf, display: str) -> tuple[str | None, str | None, str]:
    """(version, where it was read, the version string's suffix: "+cuda12.9", "-simulated+cpu")."""
    # init.cc prints "NCCL version %s" from a string built at compile time: "NCCL version 2.32.3+cuda12.9"
    for name in (b".rodata", b".rodata.str1.1", b".rodata.str1.8"):
        sec = elf.by_name(name)
        m = _search(elf, sec, _VERSION_RE) if sec is not None else None
        if m:
            return f"{int(m[0])}.{int(m[1])}.{int(m[2])}", "rodata", (m[3] or b"").decode("ascii", "replace")
    code = _get_version_constant(elf)
    if code:
        return version_from_code(code), "ncclGetVersion", ""
    m = _FILENAME_VERSION_RE.search(display)
    if m:
        return m.group(1), "filename", ""
    return None, None, ""


def _search(elf: Elf, sec: tuple, pattern: re.Pattern) -> tuple[bytes, ...] | None:
    """The groups of the first match of pattern in a section, read in windows that overlap by the
    longest match (_VERSION_SPAN)."""
    for _, buf, n in elf.windows(sec, _VERSION_SPAN, "section"):
        m = pattern.search(buf, 0, n)
        if m:
            return tuple(bytes(g) if g is not None else None for g in m.groups())
    return None


def _get_version_constant(elf: Elf) -> int | None:
    """ncclGetVersion(int* v) stores a constant: x86-64 `movl $imm32,(%rdi)` = c7 07 imm32."""
    if elf.machine != elfread.EM_X86_64:
        return None
    for kind in (SHT_DYNSYM, SHT_SYMTAB):
        table = elf.first(kind)
        strings = elf.linked(table) if table is not None else None
        if strings is None:
            continue
        found: dict[str, tuple[int, int]] = {}
        for name, _, shndx, value in _named(elf, table, strings, b"ncclGetVersion", (b"nccl", b"pnccl")):
            found.setdefault(name, (shndx, value))
        sym = found.get("ncclGetVersion") or found.get("pncclGetVersion")
        if not sym or sym[0] == 0:
            continue
        addr = sym[1]
        for p_offset, p_filesz, p_vaddr in elf.loads():
            if p_vaddr <= addr < p_vaddr + p_filesz:
                code = elf.read_upto(p_offset + addr - p_vaddr, 48)
                i = code.find(b"\xc7\x07")
                if i >= 0 and i + 6 <= len(code):
                    return int.from_bytes(code[i + 2:i + 6], "little")
        return None
    return None
