"""The environment a running process holds now, read from its memory (`inspect --live`).

/proc/<pid>/environ is the block execve laid out; setenv, putenv, os.environ writes and NCCL's own
nccl.conf values change the C library's `environ` array instead. This witness finds that array
through the ELF symbol `__environ`/`environ` of the object that defines it in the target (the
executable first: a copy relocation puts `environ` in it and leaves the C library's slot stale;
then the mapped libc; a static binary's `.symtab`), adds the object's load bias from
/proc/<pid>/maps, and reads the pointer, the `char **` array and its strings with pread on
/proc/<pid>/mem. Nothing else of the target is read; it is never stopped, signalled, attached or
written to. Every pointer is checked against its readable mappings, every read is bounded, and a
snapshot is kept only when the slot, the array and every string used read the same a second time
(setenv reallocates the array: a torn read is retried, never trusted).

Opening /proc/<pid>/mem needs ptrace *attach* access (fs/proc/base.c mem_open -> proc_mem_open ->
mm_access(PTRACE_MODE_ATTACH)), stricter than environ's read access: on top of procaccess's checks
Yama applies (security/yama/yama_lsm.c: ptrace_scope 1 descendants only, 2 CAP_SYS_PTRACE, 3 none).

Secrets: only the values of names the caller watches are decoded into strings; a name is matched as
bytes before anything is decoded, and an expected name outside the watched set has its value
compared as bytes (equal or differs), never decoded.

Reading: where the names are known in advance (the watched set, a list, expected names), a tree's
read is one call into native/livemem.c (liveread), which does the same in C and asks the kernel for
the mappings it needs (PROCMAP_QUERY) instead of reading maps; the Python read here is its reference
(tests/test_live_env.py runs both) and the fallback. The ELF symbols are read with struct (elfsyms),
once per file.
"""
from __future__ import annotations

import bisect
import errno
import operator
import os
import re
import struct
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ncclprobe.model.watched import REDACTED, WATCHED_NAMES, WATCHED_PREFIXES, is_watched

RETRIES = 5               # torn snapshots retried before the read is given up with a reason
MAX_ENTRIES = 1 << 16     # pointers of the environ array read at most
MAX_BYTES = 1 << 23       # bytes read from one process at most, per attempt (array and strings; native/livemem.c's too)
MAX_NAME = 1 << 10        # a longer name is no name ncclprobe watches or expects
MAX_STRING = 1 << 20      # one NAME=VALUE string
MAX_MAPS = 1 << 26        # bytes of a maps file read at most (native/livemem.c's too): its paths have no limit
GAP = 1 << 12             # strings this close are read in one pread
TAIL = 1 << 9             # bytes read past the last string start of a window, for its name and value
_SYMBOLS = (b"__environ", b"environ", b"_environ")  # glibc and musl define all three, one object

# reasons (LiveEnv.reason); permission ones name the check that refused, as procaccess does
GONE = "process gone"
NO_MEMORY = "no memory to read (kernel thread or zombie)"
NO_SYMBOLS = "static binary without symbols (no .symtab: environ cannot be found)"
NO_LIBC = "no C library mapped and no environ symbol in the executable"
NO_ENVIRON = "no environ symbol in the static binary's symbol table"
BOUNDED = f"environment over {MAX_BYTES} bytes or {MAX_ENTRIES} entries (not read)"
BIG_MAPS = f"maps over {MAX_MAPS} bytes (not read)"
YAMA = "ptrace_scope"
UNMATCHED = "a mapped object the native read could not match once resolved (not read)"
LONG_PATH = f"a mapped object's path over {1 << 16} bytes (not read)"  # liveread.MAX_PATH


@dataclass(frozen=True)
class LiveEnv:
    env: dict[str, str] | None            # the watched variables as held now; None: not read (reason)
    expected: dict[str, bool] | None      # expected name present now -> equal to the expected value
    reason: str | None
    retries: int = 0                      # torn snapshots before the one kept (or given up)
    bytes_read: int = 0
    t: float | None = None                # when the snapshot was known to hold (unix seconds)


def watched_name(name: bytes) -> bool:
    """model.watched.is_watched on a name still in bytes (nothing decoded before it matches)."""
    return name in _WATCHED_B or name.startswith(_PREFIXES_B)


_WATCHED_B = frozenset(n.encode() for n in WATCHED_NAMES)
_PREFIXES_B = tuple(p.encode() for p in WATCHED_PREFIXES)


class Names:
    """Which strings a read keeps: a watched name (its value is decoded) or an expected one (its value
    compared as bytes). Names known in advance are found in the strings' bytes with bytes.find (a
    window of strings is searched once per needle, not string by string); a caller's predicate (on
    the name as bytes) is called with each name."""

    def __init__(self, watched, expected: dict[bytes, bytes], present: Callable[[bytes], bool] | None = None):
        self.expected, self.present = expected, present  # present: names kept without their value
        self.needles: tuple[bytes, ...] | None = None
        self.prefixes: tuple[bytes, ...] = ()   # the watched set as prefixes and whole names, when known
        self.exact: frozenset[bytes] = frozenset()
        if watched is None or watched is is_watched:
            self.watched = watched_name
            self.prefixes, self.exact = _PREFIXES_B, _WATCHED_B
            needles = [*_PREFIXES_B, *(n + b"=" for n in _WATCHED_B)]
        elif callable(watched) or present is not None:
            self.watched = watched if callable(watched) else frozenset(
                n.encode() if isinstance(n, str) else bytes(n) for n in watched).__contains__
            needles = None
        else:
            names = frozenset(n.encode() if isinstance(n, str) else bytes(n) for n in watched)
            self.watched, self.exact = names.__contains__, names
            needles = [n + b"=" for n in names if n]
        if needles is not None:
            needles += [n + b"=" for n in expected if n]
            # a needle that another one starts with finds everything that one finds
            self.needles = tuple(sorted(n for n in set(needles) if not any(
                n != m and n.startswith(m) for m in needles)))

    def eq_at(self, data: bytes, off: int) -> int:
        """Where the '=' of the string at off is, if its name is kept; -1 if not (or if the name does not
        end within data)."""
        eq = data.find(b"=", off, off + MAX_NAME + 1)
        if eq <= off or data.find(b"\0", off, eq) >= 0:
            return -1  # no '=' before the end (getenv skips the entry), an empty or overlong name
        name = data[off:eq]
        keep = self.watched(name) or name in self.expected or (self.present is not None and self.present(name))
        return eq if keep else -1

    def starts(self, lo: int, data: bytes, members: list[int], ptrs: set[int]) -> list[int]:
        """The offsets in data of the strings (members: their addresses) whose name may be kept."""
        if self.needles is None:
            return [p - lo for p in members]
        if len(members) <= len(self.needles):  # a few strings: each one checked (one call each)
            test = data.startswith
            return [p - lo for p in members if test(self.needles, p - lo)]
        out = []
        find = data.find
        for needle in self.needles:
            i = find(needle)
            while i >= 0:
                if lo + i in ptrs:
                    out.append(i)
                i = find(needle, i + 1)
        return out


class MemReader:
    """Every file this witness touches; tests subclass it to inject failures (CI runs as root)."""

    def open_mem(self, path: str) -> int:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def pread(self, fd: int, n: int, addr: int) -> bytes:
        return os.pread(fd, n, addr)

    def close(self, fd: int) -> None:
        os.close(fd)

    def read_bytes(self, path: str) -> bytes:
        """A maps file, whole; _Bounded past MAX_MAPS bytes."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            chunks, total = [], 0
            while True:  # maps is a multi-record seq_file: read to 0
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return b"".join(chunks)
                total += len(chunk)
                if total > MAX_MAPS:
                    raise _Bounded(BIG_MAPS)
                chunks.append(chunk)
        finally:
            os.close(fd)

    def readlink(self, path: str) -> str:
        return os.readlink(path)

    def stat(self, path: str) -> os.stat_result:
        return os.stat(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)


class _Torn(Exception):
    """The snapshot changed under the read: read again (remap: the mappings may have changed too)."""

    def __init__(self, why: str, remap: bool = False):
        super().__init__(why)
        self.remap = remap


class _Bounded(Exception):
    pass


class _Gone(Exception):
    pass


# ------------------------------------------------------------------------------- the environ slot
@dataclass(frozen=True)
class _Slot:
    """Where an ELF object keeps environ: the symbol's value and what turns it into an address."""
    value: int | None                           # st_value; None: the object does not define it
    loads: tuple[tuple[int, int, int], ...]     # PT_LOAD (p_offset, p_filesz, p_vaddr)
    word: int                                   # pointer size of the object's class
    reason: str | None = None


_SLOTS: dict[tuple, _Slot] = {}


def clear_cache() -> None:
    _SLOTS.clear()


def _slot(path: str, file: str, st: os.stat_result, static: bool) -> _Slot:
    """The environ slot of the object mapped from `path` (read from `file`), once per path, inode and
    mtime."""
    key = (path, st.st_dev, st.st_ino, st.st_mtime_ns, static)
    hit = _SLOTS.get(key)
    if hit is None:
        if len(_SLOTS) > 1024:
            _SLOTS.clear()
        hit = _SLOTS[key] = _read_slot(file, path, static, st.st_ino)
    return hit


def _read_slot(file: str, path: str, static: bool, inode: int | None = None) -> _Slot:
    """`__environ` (or an alias) defined in the dynamic symbols (and, for a static binary, the full
    symbol table), found through the symbol hash where there is one (elfsyms: every read bounded by
    the file's size and a cap; the file opened must be the inode looked at)."""
    from ncclprobe.witnesses import elfsyms
    try:
        found = elfsyms.lookup(file, _SYMBOLS, static, inode)
    except OSError as exc:
        return _Slot(None, (), 8, f"cannot read {path}: {exc.strerror or exc}")
    except (ValueError, IndexError, OverflowError, struct.error) as exc:  # elfsyms.NotElf: why, in its text
        return _Slot(None, (), 8, f"unreadable ELF {path}: {exc}")
    if found.value is not None:
        return _Slot(found.value, found.loads, found.word)
    if static:
        return _Slot(None, found.loads, found.word, NO_ENVIRON if found.has_symtab else NO_SYMBOLS)
    return _Slot(None, found.loads, found.word)


def _bias(slot: _Slot, start: int, offset: int) -> int | None:
    """The load bias of an object whose lowest mapping, of file offset `offset`, starts at `start`."""
    for p_offset, p_filesz, p_vaddr in slot.loads:
        page = p_offset & ~0xFFF
        if page <= offset < p_offset + max(p_filesz, 1):
            return start - ((p_vaddr & ~0xFFF) + (offset - page))
    return None


# ---------------------------------------------------------------------------------- the mappings
def _row_start(row: bytes) -> int:
    return int(row[:row.find(b"-")], 16)


def _row(row: bytes) -> tuple[int, int, bytes, int, bytes, int, bytes]:
    """(start, end, perms, offset, device, inode, path) of a maps row."""
    parts = row.split(None, 5)
    start, _, end = parts[0].partition(b"-")
    return (int(start, 16), int(end, 16), parts[1], int(parts[2], 16), parts[3], int(parts[4]),
            parts[5] if len(parts) > 5 else b"")


def _usable(perms: bytes, path: bytes) -> bool:
    """Memory an environment can live in: readable, and no device (a GPU's BAR) or kernel page."""
    if perms[:1] != b"r":
        return False
    if not path:
        return True
    if path.startswith(b"["):
        return path in (b"[heap]", b"[stack]") or path.startswith((b"[anon:", b"[stack:"))
    return not path.startswith(b"/dev/") or path.startswith((b"/dev/zero", b"/dev/shm/"))


class Maps:
    """A process's mappings from its maps file, a row parsed only where an address or an object is
    looked up (the rows are sorted by address: a binary search parses a few)."""

    def __init__(self, raw: bytes):
        self.raw = raw if raw.endswith(b"\n") else raw + b"\n"
        self.rows = self.raw.split(b"\n")[:-1]
        self._found: list[tuple[int, int]] = []   # usable ranges looked up so far

    def end_of(self, addr: int) -> int | None:
        """The end of the usable mapping holding addr; None where none does."""
        for s, e in self._found:
            if s <= addr < e:
                return e
        i = bisect.bisect_right(self.rows, addr, key=_row_start) - 1
        if i < 0:
            return None
        start, end, perms, _, _, _, path = _row(self.rows[i])
        if not start <= addr < end or not _usable(perms, path):  # (rows read while they changed: not sorted)
            return None
        self._found.append((start, end))
        return end

    def lowest(self, path: bytes) -> tuple[int, int, bytes, int] | None:
        """(start, offset, device, inode) of the lowest mapping of the file at path (the executable's
        is usually the first row)."""
        first = self.rows[0] if self.rows else b""
        if first.endswith(path) and first[-len(path) - 1:-len(path)] == b" ":
            start, _, _, offset, dev, inode, shown = _row(first)
            if shown == path and inode:
                return start, offset, dev, inode
        at = self.raw.find(b" " + path + b"\n")
        while at >= 0:
            line = self.raw[self.raw.rfind(b"\n", 0, at) + 1:at + len(path) + 1]
            start, _, _, offset, dev, inode, shown = _row(line)
            if shown == path and inode:
                return start, offset, dev, inode
            at = self.raw.find(b" " + path + b"\n", at + 1)
        return None

    def libc(self) -> tuple[bytes, tuple[int, int, bytes, int]] | None:
        """The C library mapped (glibc's libc.so.6, musl's ld-musl): its path and lowest mapping, as
        lowest gives it (the first row naming it: the rows are sorted)."""
        for needle in _LIBC_NEEDLES:
            at = self.raw.find(needle)
            while at >= 0:
                eol = self.raw.find(b"\n", at)
                start, _, _, offset, dev, inode, path = _row(self.raw[self.raw.rfind(b"\n", 0, at) + 1:eol])
                if inode and _LIBC.match(path.rsplit(b"/", 1)[-1].removesuffix(b" (deleted)")):
                    return path, (start, offset, dev, inode)
                at = self.raw.find(needle, eol)
        return None


_LIBC_NEEDLES = (b"/libc", b"/ld-musl-")
_LIBC = re.compile(rb"^(libc\.so(\.\d+)*|libc-[\d.]+\.so|libc\.musl-[\w-]+\.so\.1|ld-musl-[\w-]+\.so\.1)$")


def _locate(reader: MemReader, base: str, memo: dict, exe: str | None = None) -> tuple[Maps, int, int] | str:
    """(mappings, address of the environ slot, pointer size), or why there is none: the executable's
    own definition first (a copy relocation), then the C library's; a static binary's symbol table.
    memo: the slots of the objects already met in this reading, by (path, device, inode) as maps
    shows them (the processes of one tree map the same few files)."""
    raw = reader.read_bytes(base + "/maps")
    if not raw:
        return NO_MEMORY
    maps = Maps(raw)
    if exe is None:
        try:
            exe = reader.readlink(base + "/exe")
        except OSError:
            exe = None
    exe = os.fsencode(exe) if exe else None
    libc = maps.libc()
    order = [(exe, libc is None, None)] if exe else []
    if libc is not None and libc[0] != exe:
        order.append((libc[0], False, libc[1]))
    reason = None
    for path, static, low in order:
        low = low or maps.lowest(path)
        if low is None:
            continue
        start, offset, dev, inode = low
        key = (path, dev, inode, static)
        slot = memo.get(key)
        if slot is None:
            shown = os.fsdecode(path)
            st, file = _file(reader, base, shown, start, inode)
            if st is None:
                reason = reason or file
                continue
            slot = memo[key] = _slot(shown, file, st, static)
        if slot.value is None:
            reason = reason or slot.reason
            continue
        bias = _bias(slot, start, offset)
        if bias is None:
            reason = reason or f"{os.fsdecode(path)}: its mappings do not match its program headers"
            continue
        return maps, bias + slot.value, slot.word
    return reason or NO_LIBC


def _file(reader: MemReader, base: str, path: str, start: int, inode: int):
    """(stat, file to read) of a mapped object as the target sees it, through /proc/<pid>/root (a
    container's files, another mount namespace); the mapping itself (map_files) where the file at
    that path is not the one mapped (replaced, deleted). (None, why) where neither can be read."""
    if not path.endswith(" (deleted)"):
        file = base + "/root" + path
        try:
            st = reader.stat(file)
            if st.st_ino == inode:
                return st, file
        except OSError:
            pass
    try:  # needs CAP_SYS_ADMIN (fs/proc/base.c proc_map_files_get_link)
        name = next(n for n in reader.listdir(base + "/map_files") if n.startswith(f"{start:x}-"))
        file = f"{base}/map_files/{name}"
        return reader.stat(file), file
    except (OSError, StopIteration):
        pass
    return None, f"{path.removesuffix(' (deleted)')}: the mapped file is not at its path any more (replaced or deleted)"


# -------------------------------------------------------------------------------------- the read
class _Target:
    """One attempt's reads of the target's memory: each inside one usable mapping, all bounded."""

    def __init__(self, reader: MemReader, fd: int, maps: Maps):
        self.reader, self.fd, self.maps, self.read = reader, fd, maps, 0

    def upto(self, addr: int, n: int) -> bytes:
        """Up to n bytes at addr, cut at the end of its mapping."""
        end = self.maps.end_of(addr)
        if end is None:
            raise _Torn("a pointer outside the readable mappings", remap=True)
        return self.pread(addr, min(n, end - addr))

    def pread(self, addr: int, n: int) -> bytes:
        if self.read + n > MAX_BYTES:
            raise _Bounded()
        try:
            data = self.reader.pread(self.fd, n, addr)
        except OSError as exc:
            if exc.errno in (errno.EIO, errno.EFAULT):  # unmapped since the maps were read
                raise _Torn("unmapped", remap=True) from None
            raise
        self.read += len(data)
        if len(data) != n:
            raise _Gone() if not data else _Torn("short read", remap=True)
        return data

    def checked(self, addr: int, n: int) -> bytes:
        end = self.maps.end_of(addr)
        if end is None or addr + n > end:
            raise _Torn("a pointer outside the readable mappings", remap=True)
        return self.pread(addr, n)


def _array(t: _Target, ptr: int, word: int) -> tuple[list[int], bytes]:
    """The pointers of the NULL-terminated array at ptr, and the bytes they were read from."""
    fmt = "Q" if word == 8 else "I"
    raw, chunk = b"", 4096
    while True:
        got = t.upto(ptr + len(raw), chunk)
        got = got[:len(got) - len(got) % word]
        if not got:
            raise _Torn("the array runs off its mapping", remap=True)
        raw += got
        words = memoryview(raw).cast(fmt)
        try:
            n = words.tolist().index(0, (len(raw) - len(got)) // word)
        except ValueError:
            if len(raw) // word > MAX_ENTRIES:
                raise _Bounded() from None
            chunk = min(chunk * 4, 1 << 18)
            continue
        return words[:n].tolist(), raw[:(n + 1) * word]


def _windows(t: _Target, ptrs: list[int]) -> list[tuple[int, bytes, list[int]]]:
    """The bytes at the strings, one pread per group laid out together (less than GAP apart, in one
    mapping): (address, bytes, the string addresses in it)."""
    todo = sorted(set(ptrs))
    # where the groups break: a gap of GAP or more (then the mapping of each group is checked)
    cuts = [i + 1 for i, gap in enumerate(map(_sub, todo[1:], todo)) if gap >= GAP]
    out = []
    for i, j in zip([0, *cuts], [*cuts, len(todo)]):
        while i < j:
            lo = todo[i]
            end = t.maps.end_of(lo)
            if end is None:
                raise _Torn("a string outside the readable mappings", remap=True)
            k = j if todo[j - 1] < end else bisect.bisect_left(todo, end, i, j)  # the group spans two mappings
            out.append((lo, t.upto(lo, min(todo[k - 1] + TAIL, end) - lo), todo[i:k]))
            i = k
    return out


_sub = operator.sub


def _whole(t: _Target, addr: int) -> bytes:
    """The string at addr on its own, NUL included (one that ran past its window)."""
    size = 4096
    while True:
        want = min(size, MAX_STRING + 1)
        got = t.upto(addr, want)
        nul = got.find(b"\0")
        if nul >= 0:
            return got[:nul + 1]
        if len(got) < want:
            raise _Torn("a string runs off its mapping", remap=True)
        if len(got) > MAX_STRING:
            raise _Bounded()
        size *= 4


def _snapshot(t: _Target, slot_addr: int, word: int, names: Names):
    """One consistent read: {name: value bytes} of the watched names and {name: equal} of the other
    expected ones (the first of a name in the array wins, as with getenv), every byte used read the
    same a second time."""
    head = t.checked(slot_addr, word)
    ptr = int.from_bytes(head, _ORDER)
    values: dict[bytes, bytes | None] = {}
    same: dict[bytes, bool] = {}
    if ptr == 0:  # clearenv(): no environment at all
        if t.checked(slot_addr, word) != head:
            raise _Torn("environ moved")
        return values, same
    ptrs, raw = _array(t, ptr, word)
    starts = set(ptrs)
    found: list[tuple[int, int, bytes, int, int]] = []   # (index in the array, address, bytes, offset, '=')
    for lo, data, members in _windows(t, ptrs):
        offsets = names.starts(lo, data, members, starts)
        last = lo + data.rfind(b"\0")  # the strings starting after it run past the window
        for p in reversed(members):
            if p <= last:
                break
            whole = _whole(t, p)  # read on its own
            eq = names.eq_at(whole, 0)
            if eq > 0:
                found.append((ptrs.index(p), p, whole, 0, eq))
            offsets = [o for o in offsets if o != p - lo]
        for off in set(offsets):
            eq = names.eq_at(data, off)
            if eq > 0:
                found.append((ptrs.index(lo + off), lo + off, data, off, eq))
    used: list[tuple[int, bytes]] = []
    for _, p, data, off, eq in sorted(found, key=lambda f: f[0]):
        end = data.find(b"\0", eq)
        if end < 0:  # its value runs past the window
            data, eq, off = _whole(t, p), eq - off, 0
            end = len(data) - 1
        name = data[off:eq]
        if name in values or name in same:
            continue
        used.append((p, data[off:end + 1]))
        if names.watched(name):
            values[name] = data[eq + 1:end]
            continue
        exp = names.expected.get(name)
        if exp is not None:  # compared where it lies: never copied out, let alone decoded
            same[name] = end - eq - 1 == len(exp) and data.startswith(exp, eq + 1)
        if names.present is not None and names.present(name):
            values[name] = None  # there, its value not read out
    # the same a second time: the slot, the array, then every string used
    if t.checked(slot_addr, word) != head or t.checked(ptr, len(raw)) != raw:
        raise _Torn("environ changed")
    used.sort()
    i = 0
    while i < len(used):
        j = i
        while j + 1 < len(used) and used[j + 1][0] - (used[j][0] + len(used[j][1])) < GAP:
            j += 1
        lo = used[i][0]
        again = t.checked(lo, max(a + len(b) for a, b in used[i:j + 1]) - lo)
        if any(again[a - lo:a - lo + len(b)] != b for a, b in used[i:j + 1]):
            raise _Torn("a string changed")
        i = j + 1
    return values, same


_ORDER = sys.byteorder


# ------------------------------------------------------------------------------------ permission
def yama_scope(proc_root: str | Path = "/proc") -> int | None:
    """Yama's ptrace_scope, or None where Yama is not there (not built in, or not enabled)."""
    try:
        return int(Path(proc_root, "sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return None


def denied(pid: int, proc_root: str | Path = "/proc", viewer=None) -> str:
    """Why opening pid's memory was refused: Yama's rule where it applies, else procaccess's check
    (viewer: whose credentials; None: this process's)."""
    from ncclprobe.witnesses import procaccess, procs
    me = viewer or procaccess.viewer()
    scope = yama_scope(proc_root)
    if scope == 3:
        return f"permission: {YAMA} 3 (Yama forbids reading another process's memory)"
    if scope == 2 and not me.ptrace_capable:
        return f"permission: {YAMA} 2 (Yama: reading another process's memory needs CAP_SYS_PTRACE)"
    fs = procs.ProcFS(Path(proc_root))
    if scope == 1 and not me.ptrace_capable and not _descendant(fs, pid):
        return f"permission: {YAMA} 1 (Yama: only ncclprobe's descendants, or with CAP_SYS_PTRACE)"
    try:
        uid = fs.uid(pid)
    except OSError:
        uid = None
    return f"permission: {procaccess.denied_by(fs, pid, uid, me)}"


def _descendant(fs, pid: int) -> bool:
    me, seen = os.getpid(), set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        try:
            pid = fs.stat(pid).ppid
        except OSError:
            return False
        if pid == me:
            return True
    return False


# ---------------------------------------------------------------------------------------- the API
class Reading:
    """Reads of many processes with one set of names (a tree's inspection): the names' needles are
    built once, and each object's environ slot is looked up once per (path, device, inode). Where
    the names are known in advance and the files are the real ones, each read is one call into
    native/livemem.c (liveread); native=False forces the Python read, which is the reference."""

    def __init__(self, watched: Iterable[str] | Callable[[bytes], bool] | None = is_watched,
                 expected: Mapping[str, str] = (), proc_root: str | Path = "/proc", *,
                 reader: MemReader | None = None, retries: int = RETRIES,
                 present: Callable[[bytes], bool] | None = None, native: bool | None = None, viewer=None):
        self.expected = dict(expected or {})
        self.names = Names(watched, {k.encode(): v.encode() for k, v in self.expected.items()}, present)
        self.proc_root, self.reader, self.retries = str(proc_root), reader or MemReader(), retries
        self.viewer = viewer  # procaccess.Viewer for the reasons (tests); None: this process's
        self._slots: dict[tuple, _Slot] = {}
        self._native = None
        if native is not False and type(self.reader) is MemReader and self.names.needles is not None:
            global _liveread
            from ncclprobe.witnesses import liveread
            _liveread = liveread
            fn = liveread.load()
            if fn is not None:
                self._native = liveread.Native(fn, liveread.rules(self.names.prefixes, self.names.exact,
                                                                  self.names.expected))
        self._why: dict[int, str] = {}  # the native table's objects that define no environ: why

    @property
    def native(self) -> bool:
        return self._native is not None

    def read(self, pid: int, exe: str | None = None) -> LiveEnv:
        """pid's environment now (exe: its /proc/<pid>/exe where the caller has read it already)."""
        return self.read_many([pid], [exe])[0]

    def read_many(self, pids: list[int], exes: list[str | None] | None = None) -> list[LiveEnv]:
        """read() of each process, in order (natively: in one call for all)."""
        exes = exes or [None] * len(pids)
        if self._native is not None:
            return self._read_native(pids, exes)
        out = []
        for pid, exe in zip(pids, exes):
            got = self._read_python(pid, exe)
            out.append(got if isinstance(got, LiveEnv) else self._result(*got))
        return out

    def _result(self, values: dict, same: dict, tries: int, total: int) -> LiveEnv:
        when = time.time()
        env = {k.decode("utf-8", "backslashreplace"): REDACTED if v is None else v.decode("utf-8", "backslashreplace")
               for k, v in values.items()}
        equal = {k.decode("utf-8", "backslashreplace"): v for k, v in same.items()}
        for k, v in self.expected.items():
            if k in env:
                equal[k] = env[k] == v
        return LiveEnv(env, equal, None, tries, total, when)

    def _reason(self, exc: OSError, pid: int) -> str:
        if exc.errno == errno.ESRCH and os.path.exists(f"{self.proc_root}/{pid}/stat"):
            return NO_MEMORY  # still there without an mm (fs/proc/base.c proc_mem_open: ESRCH)
        if exc.errno in (errno.ENOENT, errno.ESRCH):
            return GONE
        if exc.errno in (errno.EACCES, errno.EPERM):
            return denied(pid, self.proc_root, viewer=self.viewer)
        return f"error: {exc.strerror or exc}"

    def _read_python(self, pid: int, exe: str | None):
        reader, base = self.reader, f"{self.proc_root}/{pid}"
        try:
            fd = reader.open_mem(base + "/mem")
        except OSError as exc:
            return LiveEnv(None, None, self._reason(exc, pid))
        total, tries, where = 0, 0, None
        try:
            while True:
                if where is None:
                    where = _locate(reader, base, self._slots, exe)
                    if isinstance(where, str):
                        return LiveEnv(None, None, where, tries, total)
                maps, slot_addr, word = where
                t = _Target(reader, fd, maps)
                try:
                    values, same = _snapshot(t, slot_addr, word, self.names)
                    total += t.read
                    return values, same, tries, total
                except _Torn as torn:
                    total += t.read
                    tries += 1
                    if tries > self.retries:
                        return LiveEnv(None, None, torn_reason(self.retries), self.retries, total)
                    if torn.remap:
                        where = None
                    os.sched_yield()  # let the writer finish what it is changing
                except BaseException:
                    total += t.read
                    raise
        except _Bounded as exc:
            return LiveEnv(None, None, str(exc) or BOUNDED, tries, total)
        except _Gone:
            return LiveEnv(None, None, GONE, tries, total)
        except OSError as exc:
            return LiveEnv(None, None, self._reason(exc, pid), tries, total)
        except (ValueError, IndexError) as exc:  # a maps file that is not one (a fake /proc's)
            return LiveEnv(None, None, f"unreadable maps: {exc}", tries, total)
        finally:
            reader.close(fd)

    def _read_native(self, pids: list[int], exes: list[str | None]) -> list[LiveEnv]:
        lr, nat = _liveread, self._native
        root = self.proc_root

        def resolve(key, start, index):
            delta, word, why = self._resolve(f"{root}/{pids[index]}", key, start)
            i = nat.add(key, delta, word)
            if why:
                self._why[i] = why

        got = nat.read(root.encode("utf-8", "surrogateescape"), pids,
                       [e.encode("utf-8", "surrogateescape") if e else None for e in exes], self.retries, resolve)
        out = []
        for pid, (st, records) in zip(pids, got):
            n, tries, total = st[lr.ST_RC], st[lr.ST_RETRIES], st[lr.ST_BYTES]
            if n >= 0:
                values: dict[bytes, bytes] = {}
                same: dict[bytes, bool] = {}
                for kind, name, value in records:
                    if name in values or name in same:
                        continue  # getenv returns the first
                    if kind == lr.OUT_VALUE:
                        values[name] = value
                    else:
                        same[name] = kind == lr.OUT_EQUAL
                out.append(self._result(values, same, tries, total))
                continue
            reason = {lr.NO_MEMORY: NO_MEMORY, lr.NO_LIBC: NO_LIBC, lr.TORN: torn_reason(self.retries),
                      lr.BOUNDED: BOUNDED, lr.GONE: GONE, lr.BADMAPS: "unreadable maps", lr.BIGMAPS: BIG_MAPS,
                      lr.NEED: UNMATCHED, -errno.ENAMETOOLONG: LONG_PATH}.get(n)
            if n == lr.NO_SLOT:
                reason = next((self._why[i] for i in (st[lr.ST_NOSLOT0], st[lr.ST_NOSLOT1]) if i in self._why), NO_LIBC)
            elif reason is None:
                reason = self._reason(OSError(-n, os.strerror(-n)), pid)
            out.append(LiveEnv(None, None, reason, tries, total))
        return out

    def _resolve(self, base: str, key: tuple, start: int) -> tuple[int | None, int, str | None]:
        """(slot - start of its lowest mapping, pointer size, why none) of an object the native read met."""
        path, _, _, inode, offset, static = key
        shown = os.fsdecode(path)
        st, file = _file(self.reader, base, shown, start, inode)
        if st is None:
            return None, 8, file
        slot = _slot(shown, file, st, bool(static))
        if slot.value is None:
            return None, slot.word, slot.reason
        bias = _bias(slot, start, offset)
        if bias is None:
            return None, slot.word, f"{shown}: its mappings do not match its program headers"
        return bias + slot.value - start, slot.word, None


_liveread = None  # the module, once a Reading has loaded it


def torn_reason(retries: int) -> str:
    return f"torn after {retries} retries"


def live_env(pid: int, watched: Iterable[str] | Callable[[bytes], bool] | None = is_watched,
             expected: Mapping[str, str] = (), proc_root: str | Path = "/proc", *,
             reader: MemReader | None = None, retries: int = RETRIES, native: bool | None = None) -> LiveEnv:
    """The environment pid holds now: its watched variables (`watched`: names, or a predicate on the
    name as bytes; model.watched.is_watched by default) and, for each name of `expected`
    ({name: value}) it has, whether its value is the expected one. Never raises for the target's
    sake: whatever stops the read is the reason."""
    return Reading(watched, expected, proc_root, reader=reader, retries=retries, native=native).read(pid)
