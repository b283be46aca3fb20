"""One data symbol of an ELF file, found with struct: livemem's environ slot, without pyelftools'
cost (it parses every section and string of a 2 MB libc into objects: ~8 ms a file, paid again by
every fresh `ncclprobe inspect --live`, where this takes a few preads). The file may be another
user's forged copy: elfread checks every size against the file and a cap before reading it.

A dynamic symbol is looked up through the object's GNU hash (or SysV hash) table, as the dynamic
linker does (glibc elf/dl-lookup.c do_lookup_x); a static binary's .symtab, which has no hash, is
scanned for the symbols whose name offsets can be the ones asked (the linker merges a name that is
another's tail, "environ" inside "__environ", so every such offset is a candidate).
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from ncclprobe.witnesses import elfread
from ncclprobe.witnesses.elfread import (
    SHT_DYNSYM,
    SHT_GNU_HASH,
    SHT_HASH,
    SHT_SYMTAB,
    BadElf,
    Elf,
)

STT_NOTYPE, STT_OBJECT = 0, 1
MAX_CHAIN = 1 << 12  # symbols one hash chain visits at most (a real chain holds a few)
NotElf = BadElf  # what lookup raises for a file it cannot read as ELF (the text says why)


@dataclass(frozen=True)
class Found:
    value: int | None                         # st_value of the first name found; None: not defined here
    loads: tuple[tuple[int, int, int], ...]   # PT_LOAD (p_offset, p_filesz, p_vaddr)
    word: int                                 # 8 or 4 (the file's class)
    has_symtab: bool                          # a .symtab is there (a static binary not stripped)


def lookup(path: str, names: tuple[bytes, ...], static: bool, inode: int | None = None) -> Found:
    """The first of `names` that the file defines as data: in .dynsym, and for a static binary also in
    .symtab. path is /proc/<pid>/root/... or /proc/<pid>/map_files/... (a link the kernel made: it is
    followed); inode, where given, must be the opened file's. Raises OSError (unreadable) or
    ValueError (not a regular file, not ELF, or not a well-formed one: elfread bounds every read)."""
    fd, st = elfread.open_regular(path, follow=True)
    try:
        if inode is not None and st.st_ino != inode:
            raise BadElf("the file at the path is not the one mapped (replaced)")
        f = Elf(fd, st.st_size)
        word = 8 if f.is64 else 4
        loads = f.loads()
        has_symtab = f.first(SHT_SYMTAB) is not None
        for kind in (SHT_DYNSYM, SHT_SYMTAB) if static else (SHT_DYNSYM,):
            table = f.first(kind)  # the gABI allows one of each: the others are never read
            strings = f.linked(table) if table is not None else None
            if strings is None:
                continue
            hashed = _hash_of(f, table) if kind == SHT_DYNSYM else None
            for name in names:
                hits = _hashed(f, table, strings, hashed, name) if hashed else _scan(f, table, strings, name)
                for _, typ, shndx, value in hits:
                    if shndx != 0 and typ in (STT_OBJECT, STT_NOTYPE):
                        return Found(value, loads, word, has_symtab)
        return Found(None, loads, word, has_symtab)
    finally:
        os.close(fd)


def _hash_of(f: Elf, table: tuple) -> tuple | None:
    """The hash section whose sh_link is this symbol table (GNU's first, as glibc prefers it)."""
    for kind in (SHT_GNU_HASH, SHT_HASH):
        sec = next((s for s in f.sections if s[1] == kind and f.linked(s) is table), None)
        if sec is not None:
            return sec
    return None


def _hashed(f: Elf, table: tuple, strings: tuple, hashed: tuple, name: bytes):
    """The symbols of `name` through the hash section (GNU: a bloom-less walk of one chain). A walk
    visits each symbol at most once and at most MAX_CHAIN of them (a forged chain without its end)."""
    data = f.data(hashed, "hash table")
    word = _words(data, f.e)
    nsyms = f.count(table)
    if hashed[1] == SHT_GNU_HASH:
        nbuckets, symoffset, bloom_size = word(0), word(1), word(2)
        if not nbuckets:
            return
        buckets = 4 + bloom_size * (2 if f.is64 else 1)  # in 32-bit words
        h = 5381
        for c in name:
            h = (h * 33 + c) & 0xFFFFFFFF
        first = word(buckets + h % nbuckets)
        if first < symoffset:  # an empty bucket
            return
        chain = buckets + nbuckets
        for i in range(first, min(nsyms, first + MAX_CHAIN)):
            ch = word(chain + i - symoffset)
            if (ch | 1) == (h | 1):
                sym = f.symbol(table, i)
                if f.name(strings, sym[0]) == name:
                    yield sym
            if ch & 1:
                return
        return
    nbucket = word(0)
    if not nbucket:
        return
    h = 0
    for c in name:
        h = ((h << 4) + c) & 0xFFFFFFFF
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    i = word(2 + h % nbucket)
    seen = set()
    while i and i not in seen and len(seen) < MAX_CHAIN:
        seen.add(i)
        sym = f.symbol(table, i)
        if f.name(strings, sym[0]) == name:
            yield sym
        i = word(2 + nbucket + i)


def _words(data: bytes, endian: str):
    """The hash table's 32-bit word at an index; BadElf past its end (a forged count or index)."""
    unpack = struct.Struct(endian + "I").unpack_from

    def word(index: int) -> int:
        if not 0 <= index < len(data) // 4:
            raise BadElf("hash table index out of the table")
        return unpack(data, 4 * index)[0]
    return word


def _scan(f: Elf, table: tuple, strings: tuple, name: bytes):
    """The symbols of `name` in a table without a hash: every symbol whose name offset can hold it
    (the linker merges a name that is another's tail: each place the name ends a string is one)."""
    offsets = f.occurrences(strings, name + b"\0")
    if not offsets:
        return
    yield from f.symbols(table, offsets)
