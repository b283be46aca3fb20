"""An ELF file that another user may control, read within bounds. `inspect` reads the binaries its
processes map, `report` the libraries a log names, `--live` the C library's symbols: a process can run
its own copy of a binary with forged headers, or put a FIFO at the name of a file it mapped and deleted.

Nothing a header says is trusted. A file is opened without blocking and read only if it is a regular
file (checked on the opened file, so a swap between look and open cannot reach a FIFO or a device).
Every offset and size is checked against the file's real size (fstat) before anything is allocated or
read. Small sections (headers, hash, dynamic, section names) are read whole under a cap; string and
symbol tables, which are large in real libraries (libtorch_cpu.so's .dynstr is 76 MB), are streamed
through one window. Only the first symbol table of each kind is used (the gABI allows one of each:
"an object file may have only one section of each type"), and the reads of one file together stay
under a budget. Every failure is a BadElf whose text is the reason.
"""
from __future__ import annotations

import os
import stat
import struct
import sys
import threading

MAX_SECTION = 16 << 20     # a section read whole (headers, hash, dynamic, names): libtorch_cpu's largest is 0.6 MB
MAX_FILE_READ = 512 << 20  # all the reads of one file together (libnccl: 2 MB; libtorch_cpu: 76 MB of names)
WINDOW = 8 << 20           # a streamed section's bytes held at once
MAX_PHDRS = 1 << 16        # bytes of program headers (the kernel's loader takes a page; glibc's a few more)
MAX_SECTIONS = 1 << 16     # section headers (e_shnum holds up to 65,535; a library has tens)
MAX_NAME = 256             # a symbol or library name longer than this is none ncclprobe looks for
MAX_HITS = 1 << 16         # places a searched name is found in one string table (libnccl's .strtab: ~3,000 'nccl')
CHUNK_ROWS = 1 << 14       # symbol rows read and unpacked at a time

SHT_NULL, SHT_SYMTAB, SHT_STRTAB, SHT_HASH, SHT_DYNAMIC, SHT_NOBITS, SHT_DYNSYM = 0, 2, 3, 5, 6, 8, 11
SHT_GNU_HASH = 0x6FFFFFF6
PT_LOAD = 1
SHN_XINDEX = 0xFFFF        # e_shstrndx's escape: the real index is section 0's sh_link (gABI, "Sections")
PN_XNUM = 0xFFFF           # e_phnum's escape: the real count is section 0's sh_info
EM_X86_64 = 62


class BadElf(ValueError):
    """The file cannot be read as ELF within the bounds; the text says why."""


class NotElf(BadElf):
    pass


def open_regular(path, follow: bool = True) -> tuple[int, os.stat_result]:
    """(fd, fstat) of the regular file at path, opened for reading without blocking. The name is
    resolved once with O_PATH (opening nothing: no FIFO waits, no device's open runs) and the file is
    reopened through that descriptor (/proc/self/fd: the same inode, not the name again). follow=False
    refuses a symbolic link as the last component. Raises OSError, or BadElf for what is not a regular
    file."""
    pfd = os.open(path, os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    try:
        st = os.fstat(pfd)
        if not stat.S_ISREG(st.st_mode):
            raise BadElf(f"not a regular file ({_kind(st.st_mode)})")
        fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    finally:
        os.close(pfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # no /proc/self/fd here and a name in its place: never read it
            raise BadElf(f"not a regular file ({_kind(st.st_mode)})")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISLNK, "symbolic link"), (stat.S_ISDIR, "directory"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "unknown type"


class Elf:
    """The headers of one open ELF file, validated, and bounded reads of its sections."""

    def __init__(self, fd: int, size: int):
        self.fd, self.size, self.budget = fd, size, MAX_FILE_READ
        self._cache: dict[tuple[int, int], bytes] = {}
        phnum, shnum, shstrndx = self._header(self.read_upto(0, 64))
        self.sections = self._sections(shnum)
        zero = self.sections[0] if self.sections else None
        self.phnum = zero[7] if phnum == PN_XNUM and zero else phnum
        self.shstrndx = zero[6] if shstrndx == SHN_XINDEX and zero else shstrndx
        self._names: bytes | None = None
        self._by_name: dict[bytes, tuple] | None = None
        self._loads: tuple | None = None

    def _header(self, head: bytes) -> tuple[int, int, int]:
        """The ELF header's class, byte order and table offsets; (e_phnum, e_shnum, e_shstrndx)."""
        if head[:4] != b"\x7fELF":
            raise NotElf("not ELF")
        if len(head) < 52 or head[4] not in (1, 2) or head[5] not in (1, 2) or (head[4] == 2 and len(head) < 64):
            raise BadElf("truncated ELF header")
        self.is64, e = head[4] == 2, "<" if head[5] == 1 else ">"
        self.e = e
        self.machine, = struct.unpack_from(e + "H", head, 18)
        if self.is64:
            self.phoff, self.shoff = struct.unpack_from(e + "QQ", head, 0x20)
            self.phentsize, phnum, self.shentsize, shnum, shstrndx = struct.unpack_from(e + "HHHHH", head, 0x36)
            self.sym, self.sh = struct.Struct(e + "IBBHQQ"), struct.Struct(e + "IIQQQQIIQQ")
            self.ph, self.dyn = struct.Struct(e + "IIQQQQQQ"), struct.Struct(e + "qQ")
        else:
            self.phoff, self.shoff = struct.unpack_from(e + "II", head, 0x1C)
            self.phentsize, phnum, self.shentsize, shnum, shstrndx = struct.unpack_from(e + "HHHHH", head, 0x2A)
            self.sym, self.sh = struct.Struct(e + "IIIBBH"), struct.Struct(e + "IIIIIIIIII")
            self.ph, self.dyn = struct.Struct(e + "IIIIIIII"), struct.Struct(e + "iI")
        return phnum, shnum, shstrndx

    # ------------------------------------------------------------------------------------ reads
    def read(self, offset: int, size: int, what: str) -> bytes:
        """Exactly size bytes at offset, or BadElf: past the end of the file, over MAX_SECTION, over
        the file's budget."""
        self.claim(offset, size, what, MAX_SECTION)
        data = self._pread(offset, size)
        if len(data) != size:
            raise BadElf(f"{what} truncated (the file shrank while read)")
        return data

    def claim(self, offset: int, size: int, what: str, cap: int | None = None) -> None:
        """Check a read before anything is allocated for it (in the file, under cap), and count it
        against the budget."""
        self.within(offset, size, what)
        if cap is not None and size > cap:
            raise BadElf(f"{what} of {size} bytes, over the {cap >> 20} MiB cap")
        if size > self.budget:
            raise BadElf(f"reads over the {MAX_FILE_READ >> 20} MiB budget of one file")
        self.budget -= size

    def within(self, offset: int, size: int, what: str) -> None:
        if size < 0 or offset < 0 or offset + size > self.size:
            raise BadElf(f"{what} past the end of the file ({size} bytes at {offset}, file {self.size})")

    def read_upto(self, offset: int, size: int) -> bytes:
        """Up to size (small) bytes at offset, cut at the end of the file."""
        size = max(0, min(size, self.size - offset))
        return self._pread(offset, size) if size and offset >= 0 else b""

    def _pread(self, offset: int, size: int) -> bytes:
        chunks, done = [], 0
        while done < size:  # a regular file returns everything up to its end; a signal may cut a read
            got = os.pread(self.fd, size - done, offset + done)
            if not got:
                break
            chunks.append(got)
            done += len(got)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def data(self, sec: tuple, what: str = "section") -> bytes:
        """A small section's bytes, read once per file (by offset and size: many headers may name one
        range)."""
        if sec[1] == SHT_NOBITS:
            return b""
        key = (sec[4], sec[5])
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self.read(sec[4], sec[5], what)
        return hit

    def windows(self, sec: tuple, overlap: int, what: str):
        """A section's bytes as (offset in it, buffer, length) windows of at most WINDOW bytes, each
        starting `overlap` bytes before the previous one ended (a match that long is in one). The
        buffer is reused: valid until the next window."""
        if sec[1] == SHT_NOBITS:
            return
        self.claim(sec[4], sec[5], what)
        self.budget += sec[5]  # counted below, window by window
        buf = _buffer(min(WINDOW, sec[5]))
        at = 0
        while at < sec[5]:
            n = min(WINDOW, sec[5] - at)
            self.claim(sec[4] + at, n, what, WINDOW)
            got = os.preadv(self.fd, [memoryview(buf)[:n]], sec[4] + at)
            if got != n:
                raise BadElf(f"{what} truncated (the file shrank while read)")
            yield at, buf, n
            if at + n >= sec[5]:
                return
            at += max(1, n - overlap)

    def contains(self, sec: tuple, needle: bytes, what: str = "string table") -> bool:
        return any(buf.find(needle, 0, n) >= 0 for _, buf, n in self.windows(sec, len(needle) - 1, what))

    def occurrences(self, sec: tuple, needle: bytes, names: bool = False, what: str = "string table") -> dict:
        """{offset in the section: b""} of every place needle is, or with names, {offset: the name
        there, up to its NUL} of every place a name starts with needle (one without a NUL within
        MAX_NAME is none looked for). At most MAX_HITS: more is no ELF file ncclprobe reads."""
        out: dict[int, bytes] = {}
        overlap = max(len(needle), MAX_NAME + 1 if names else 0) - 1
        for at, buf, n in self.windows(sec, overlap, what):
            own = n if at + n >= sec[5] else n - overlap  # a place in the overlap is the next window's
            find = buf.find
            i = find(needle, 0, n)
            while 0 <= i < own:
                if len(out) >= MAX_HITS:
                    raise BadElf(f"{what}: over {MAX_HITS} names holding {needle!r}")
                if not names:
                    out[at + i] = b""
                else:
                    end = find(b"\0", i, min(i + MAX_NAME + 1, n))  # never into what a longer read left
                    if end >= 0:
                        out[at + i] = bytes(buf[i:end])
                i = find(needle, i + 1, n)
        return out

    # ---------------------------------------------------------------------------------- headers
    def _sections(self, shnum: int) -> list[tuple]:
        """Each section header as (name, type, flags, addr, offset, size, link, info, addralign, entsize)."""
        if not self.shoff:
            return []
        if self.shentsize < self.sh.size:
            raise BadElf(f"section header size {self.shentsize} under {self.sh.size}")
        if shnum == 0:  # 0 with an offset: the count is section 0's sh_size (gABI extended numbering)
            shnum = self.sh.unpack(self.read(self.shoff, self.sh.size, "section header 0"))[5]
        if shnum > MAX_SECTIONS:
            raise BadElf(f"{shnum} section headers, over {MAX_SECTIONS}")
        raw = self.read(self.shoff, self.shentsize * shnum, f"{shnum} section headers")
        if self.shentsize == self.sh.size:
            return list(self.sh.iter_unpack(raw))
        return [self.sh.unpack_from(raw, i * self.shentsize) for i in range(shnum)]

    def first(self, kind: int) -> tuple | None:
        """The first section of a type (the gABI allows one symbol table of each kind)."""
        return next((s for s in self.sections if s[1] == kind), None)

    def linked(self, sec: tuple) -> tuple | None:
        """The section sec's sh_link names (a symbol table's strings), None where out of range."""
        return self.sections[sec[6]] if 0 < sec[6] < len(self.sections) else None

    def name_of(self, sec: tuple) -> bytes:
        if self._names is None:
            names = self.sections[self.shstrndx] if 0 < self.shstrndx < len(self.sections) else None
            self._names = self.data(names, "section names") if names is not None else b""
        return name_at(self._names, sec[0])

    def by_name(self, name: bytes) -> tuple | None:
        """The first section of a name."""
        if self._by_name is None:
            self._by_name = {}
            for sec in self.sections:
                self._by_name.setdefault(self.name_of(sec), sec)
        return self._by_name.get(name)

    def loads(self) -> tuple[tuple[int, int, int], ...]:
        """PT_LOAD segments as (p_offset, p_filesz, p_vaddr)."""
        if self._loads is None:
            self._loads = self._read_loads()
        return self._loads

    def _read_loads(self) -> tuple[tuple[int, int, int], ...]:
        if not self.phoff or not self.phnum:
            return ()
        if self.phentsize < self.ph.size:
            raise BadElf(f"program header size {self.phentsize} under {self.ph.size}")
        size = self.phentsize * self.phnum
        if size > MAX_PHDRS:  # the kernel loads none over a page (fs/binfmt_elf.c load_elf_phdrs)
            raise BadElf(f"{self.phnum} program headers, over {MAX_PHDRS} bytes")
        raw = self.read(self.phoff, size, f"{self.phnum} program headers")
        rows = self.ph.iter_unpack(raw) if self.phentsize == self.ph.size else \
            (self.ph.unpack_from(raw, i * self.phentsize) for i in range(self.phnum))
        if self.is64:  # type, flags, offset, vaddr, paddr, filesz, ...
            return tuple((f[2], f[5], f[3]) for f in rows if f[0] == PT_LOAD)
        return tuple((f[1], f[4], f[2]) for f in rows if f[0] == PT_LOAD)  # type, offset, vaddr, paddr, filesz

    # ---------------------------------------------------------------------------------- symbols
    def entsize(self, table: tuple) -> int:
        entsize = table[9] or self.sym.size
        if entsize < self.sym.size:
            raise BadElf(f"symbol size {entsize} under {self.sym.size}")
        return entsize

    def count(self, table: tuple) -> int:
        return 0 if table[1] == SHT_NOBITS else table[5] // self.entsize(table)

    def symbols(self, table: tuple, names: dict | set | None = None):
        """Each symbol of a table as (name offset, type, shndx, value), CHUNK_ROWS rows read at a time;
        only those whose name offset is in `names`, where given (filtered before they are unpacked
        into fields: the name offset is each row's first)."""
        entsize, n = self.entsize(table), self.count(table)
        self.claim(table[4], table[5], "symbol table")
        self.budget += table[5]  # counted chunk by chunk
        for lo in range(0, n, CHUNK_ROWS):
            rows = min(CHUNK_ROWS, n - lo)
            raw = self.read(table[4] + lo * entsize, rows * entsize, "symbol table")
            if names is not None and self.e == _NATIVE and entsize % 4 == 0:
                # only the rows asked for are unpacked: the name offsets read as one column of words
                column = memoryview(raw).cast("I")[::entsize // 4].tolist()
                got = [self.sym.unpack_from(raw, i * entsize) for i, n in enumerate(column) if n in names]
            elif entsize == self.sym.size:
                got = self.sym.iter_unpack(raw)
            else:
                got = (self.sym.unpack_from(raw, i * entsize) for i in range(rows))
            if names is not None:
                got = [f for f in got if f[0] in names]
            yield from map(self.fields, got)

    def symbol(self, table: tuple, index: int) -> tuple[int, int, int, int]:
        """(name offset, type, shndx, value) of one symbol."""
        self.within(table[4], table[5], "symbol table")
        if not 0 <= index < self.count(table):
            raise BadElf("symbol index out of its table")
        return self.fields(self.sym.unpack(self.read(table[4] + index * self.entsize(table), self.sym.size, "symbol")))

    def fields(self, f: tuple) -> tuple[int, int, int, int]:
        if self.is64:  # name, info, other, shndx, value, size
            return f[0], f[1] & 0xF, f[3], f[4]
        return f[0], f[3] & 0xF, f[5], f[1]  # name, value, size, info, other, shndx

    def name(self, strings: tuple, offset: int) -> bytes:
        """The NUL-terminated name at offset in a string table; b"" where there is none (out of the
        table, or no NUL within MAX_NAME: a section without its NUL, or a name no one looks for)."""
        if strings[1] == SHT_NOBITS or offset >= strings[5]:
            return b""
        self.within(strings[4], strings[5], "string table")
        return name_at(self.read_upto(strings[4] + offset, min(MAX_NAME + 1, strings[5] - offset)), 0)

    def dynamic(self, sec: tuple):
        """(tag, value) of a dynamic section's entries, up to DT_NULL."""
        data = self.data(sec, "dynamic section")
        for tag, value in self.dyn.iter_unpack(data[:len(data) - len(data) % self.dyn.size]):
            if tag == 0:
                return
            yield tag, value


def name_at(strings: bytes, offset: int) -> bytes:
    """The NUL-terminated name at offset, b"" where there is none (out of range, no NUL within
    MAX_NAME: a string section without its NUL, or a name no one looks for)."""
    end = strings.find(b"\0", offset, offset + MAX_NAME + 1)
    return strings[offset:end] if end >= 0 and offset >= 0 else b""


_NATIVE = "<" if sys.byteorder == "little" else ">"
_local = threading.local()  # one window buffer per thread (a watch thread reads beside the main one)


def _buffer(size: int) -> bytearray:
    """A buffer of at least size bytes, kept from file to file: a fresh one per library's string table
    (hundreds of KB) is a fresh mapping, page faults and zeroing (glibc serves it with mmap)."""
    buf = getattr(_local, "buf", None)
    if buf is None or len(buf) < size:
        buf = _local.buf = bytearray(size)
    return buf
