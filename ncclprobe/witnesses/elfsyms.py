"""One data symbol of an ELF file, found with struct: livemem's environ slot, without pyelftools'
cost (it parses every section and string of a 2 MB libc into objects: ~8 ms a file, paid again by
every fresh `ncclprobe inspect --live`, where this takes a few preads).

A dynamic symbol is looked up through the object's GNU hash (or SysV hash) table, as the dynamic
linker does (glibc elf/dl-lookup.c do_lookup_x); a static binary's .symtab, which has no hash, is
scanned for the symbols whose name offsets can be the ones asked (the linker merges a name that is
another's tail, "environ" inside "__environ", so every such offset is a candidate).
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

SHT_SYMTAB, SHT_HASH, SHT_DYNSYM, SHT_GNU_HASH = 2, 5, 11, 0x6FFFFFF6
PT_LOAD = 1
STT_NOTYPE, STT_OBJECT = 0, 1
MAX_TABLE = 1 << 26  # a symbol or string table larger than this is no ELF file we read


class NotElf(ValueError):
    pass


@dataclass(frozen=True)
class Found:
    value: int | None                         # st_value of the first name found; None: not defined here
    loads: tuple[tuple[int, int, int], ...]   # PT_LOAD (p_offset, p_filesz, p_vaddr)
    word: int                                 # 8 or 4 (the file's class)
    has_symtab: bool                          # a .symtab is there (a static binary not stripped)


class _File:
    def __init__(self, fd: int):
        self.fd = fd
        head = os.pread(fd, 64, 0)
        if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
            raise NotElf("not an ELF file")
        self.is64 = head[4] == 2
        self.e = "<" if head[5] == 1 else ">"
        if self.is64:
            self.phoff, self.shoff = struct.unpack_from(self.e + "QQ", head, 0x20)
            self.phentsize, self.phnum, self.shentsize, self.shnum = struct.unpack_from(self.e + "HHHH", head, 0x36)
            self.sym = struct.Struct(self.e + "IBBHQQ")        # name, info, other, shndx, value, size
            self.sh = struct.Struct(self.e + "IIQQQQIIQQ")
            self.ph = struct.Struct(self.e + "IIQQQQQQ")       # type, flags, offset, vaddr, paddr, filesz, memsz, align
        else:
            self.phoff, self.shoff = struct.unpack_from(self.e + "II", head, 0x1C)
            self.phentsize, self.phnum, self.shentsize, self.shnum = struct.unpack_from(self.e + "HHHH", head, 0x2A)
            self.sym = struct.Struct(self.e + "IIIBBH")        # name, value, size, info, other, shndx
            self.sh = struct.Struct(self.e + "IIIIIIIIII")
            self.ph = struct.Struct(self.e + "IIIIIIII")       # type, offset, vaddr, paddr, filesz, memsz, flags, align

    def read(self, offset: int, size: int) -> bytes:
        if size < 0 or size > MAX_TABLE:
            raise NotElf("table out of bounds")
        data = os.pread(self.fd, size, offset)
        if len(data) != size:
            raise NotElf("truncated")
        return data

    def loads(self) -> tuple[tuple[int, int, int], ...]:
        if not self.phoff or self.phentsize < self.ph.size:
            return ()
        raw = self.read(self.phoff, self.phentsize * self.phnum)
        out = []
        for i in range(self.phnum):
            f = self.ph.unpack_from(raw, i * self.phentsize)
            if f[0] == PT_LOAD:
                out.append((f[2], f[5], f[3]) if self.is64 else (f[1], f[4], f[2]))
        return tuple(out)

    def sections(self) -> list[tuple]:
        """(type, offset, size, link, entsize) of each section header."""
        if not self.shoff or self.shentsize < self.sh.size:
            return []
        raw = self.read(self.shoff, self.shentsize * self.shnum)
        return [(f[1], f[4], f[5], f[6], f[9]) for f in
                (self.sh.unpack_from(raw, i * self.shentsize) for i in range(self.shnum))]

    def symbol(self, table: tuple, index: int) -> tuple[int, int, int, int]:
        """(name offset, type, shndx, value) of symbol `index` of a symbol table section."""
        _, offset, size, _, entsize = table
        entsize = entsize or self.sym.size
        if (index + 1) * entsize > size:
            raise NotElf("symbol out of its table")
        f = self.sym.unpack(self.read(offset + index * entsize, self.sym.size))
        if self.is64:
            return f[0], f[1] & 0xF, f[3], f[4]
        return f[0], f[3] & 0xF, f[5], f[1]


def lookup(path: str, names: tuple[bytes, ...], static: bool) -> Found:
    """The first of `names` that the file defines as data: in .dynsym, and for a static binary also in
    .symtab. Raises OSError (unreadable) or ValueError (not ELF, or not a well-formed one)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        f = _File(fd)
        word = 8 if f.is64 else 4
        loads = f.loads()
        secs = f.sections()
        has_symtab = any(s[0] == SHT_SYMTAB for s in secs)
        for kind in (SHT_DYNSYM, SHT_SYMTAB) if static else (SHT_DYNSYM,):
            for table in (s for s in secs if s[0] == kind):
                if table[3] >= len(secs):
                    continue
                strings = f.read(secs[table[3]][1], secs[table[3]][2])
                hashed = next((s for s in secs if s[0] in (SHT_GNU_HASH, SHT_HASH) and s[3] < len(secs)
                               and secs[s[3]] is table), None) if kind == SHT_DYNSYM else None
                for name in names:
                    hits = _hashed(f, table, strings, hashed, name) if hashed else _scan(f, table, strings, name)
                    for _, typ, shndx, value in hits:
                        if shndx != 0 and typ in (STT_OBJECT, STT_NOTYPE):
                            return Found(value, loads, word, has_symtab)
        return Found(None, loads, word, has_symtab)
    finally:
        os.close(fd)


def _name_at(strings: bytes, offset: int) -> bytes:
    end = strings.find(b"\0", offset)
    return strings[offset:end] if end >= 0 else b""


def _hashed(f: _File, table: tuple, strings: bytes, hashed: tuple, name: bytes):
    """The symbols of `name` through the hash section (GNU: a bloom-less walk of one chain)."""
    data = f.read(hashed[1], hashed[2])
    e = f.e
    if hashed[0] == SHT_GNU_HASH:
        nbuckets, symoffset, bloom_size, _ = struct.unpack_from(e + "IIII", data, 0)
        if not nbuckets:
            return
        at = 16 + bloom_size * (8 if f.is64 else 4)
        h = 5381
        for c in name:
            h = (h * 33 + c) & 0xFFFFFFFF
        i, = struct.unpack_from(e + "I", data, at + 4 * (h % nbuckets))
        chain = at + 4 * nbuckets
        while i >= symoffset:
            ch, = struct.unpack_from(e + "I", data, chain + 4 * (i - symoffset))
            if (ch | 1) == (h | 1):
                sym = f.symbol(table, i)
                if _name_at(strings, sym[0]) == name:
                    yield sym
            if ch & 1:
                return
            i += 1
        return
    nbucket, _ = struct.unpack_from(e + "II", data, 0)
    if not nbucket:
        return
    h = 0
    for c in name:
        h = ((h << 4) + c) & 0xFFFFFFFF
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    i, = struct.unpack_from(e + "I", data, 8 + 4 * (h % nbucket))
    seen = set()
    while i and i not in seen:
        seen.add(i)
        sym = f.symbol(table, i)
        if _name_at(strings, sym[0]) == name:
            yield sym
        i, = struct.unpack_from(e + "I", data, 8 + 4 * nbucket + 4 * i)


def _scan(f: _File, table: tuple, strings: bytes, name: bytes):
    """The symbols of `name` in a table without a hash: every symbol whose name offset can hold it."""
    offsets, at = set(), strings.find(name + b"\0")
    while at >= 0:  # the name itself, or the tail of a longer one
        offsets.add(at)
        at = strings.find(name + b"\0", at + 1)
    if not offsets:
        return
    _, offset, size, _, entsize = table
    entsize = entsize or f.sym.size
    raw = f.read(offset, size - size % entsize)
    rows = f.sym.iter_unpack(raw) if entsize == f.sym.size else \
        (f.sym.unpack_from(raw, i * entsize) for i in range(size // entsize))
    for fields in rows:
        if fields[0] in offsets:
            yield (fields[0], fields[1] & 0xF, fields[3], fields[4]) if f.is64 else \
                (fields[0], fields[3] & 0xF, fields[5], fields[1])
