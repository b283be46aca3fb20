"""The native live read (native/livemem.c, in libprocread.so): livemem.Reading's read of one process
in one ctypes call, where the names are known in advance (the watched set, a list of names, expected
names). livemem keeps the semantics (the ELF slots it resolves for the call, the reasons, the
result); this module only speaks the call's layout. NCCLPROBE_NATIVE_LIVE=0 disables it, and
tests/test_live_env.py runs every case through both reads.
"""
from __future__ import annotations

import ctypes
import errno
import os
import struct

from ncclprobe import _lib

LIB_NAME = "libprocread.so"
# native/livemem.c's codes, rule kinds, record kinds, info and status slots
NEED, NO_MEMORY, NO_LIBC, NO_SLOT, TORN, BOUNDED, GONE, BADMAPS, BIGMAPS = range(-1000, -1009, -1)
MAX_PATH = 1 << 16  # a mapped object's path longer than this is not resolved (maps paths have no limit)
R_PREFIX, R_NAME, R_EXPECTED = 1, 2, 3
OUT_VALUE, OUT_EQUAL, OUT_DIFFERS = 1, 2, 3
I_STOP, I_WHICH, I_STATIC, I_START, I_OFFSET, I_MAJOR, I_MINOR, I_INODE, I_PATH_LEN, I_COUNT = range(10)
ST_RC, ST_RETRIES, ST_BYTES, ST_OFF, ST_LEN, ST_NOSLOT0, ST_NOSLOT1, ST_COUNT = range(8)
NO_DELTA = -(1 << 63)  # a table entry of an object that defines no environ
_HEAD = struct.Struct("=BII")


class Obj(ctypes.Structure):
    """lm_obj: an object whose environ slot is resolved, keyed as maps shows its lowest mapping."""
    _fields_ = [("inode", ctypes.c_uint64), ("offset", ctypes.c_uint64), ("dev_major", ctypes.c_uint32),
                ("dev_minor", ctypes.c_uint32), ("delta", ctypes.c_int64), ("word", ctypes.c_int32),
                ("is_static", ctypes.c_int32), ("path_off", ctypes.c_int32), ("path_len", ctypes.c_int32)]


def rules(prefixes, names, expected: dict[bytes, bytes]) -> bytes:
    """The call's rules: watched prefixes, watched names, expected names with their values."""
    out = [struct.pack("=BI", R_PREFIX, len(p)) + p for p in prefixes if p]
    out += [struct.pack("=BI", R_NAME, len(n)) + n for n in names if n]
    out += [struct.pack("=BI", R_EXPECTED, len(n)) + n + struct.pack("=I", len(v)) + v
            for n, v in expected.items() if n]
    return b"".join(out)


class Native:
    """One reading's calls: its rules, its table of resolved objects, its buffers."""

    def __init__(self, fn, rule_bytes: bytes):
        self._fn, self._rules = fn, rule_bytes
        self._objs: list[tuple[tuple, int, int]] = []  # (key, delta, word); key as need() gives it
        self._table, self._paths = (Obj * 1)(), b""
        self._out = ctypes.create_string_buffer(1 << 16)
        self._need = ctypes.create_string_buffer(1 << 12)
        self._info = (ctypes.c_int64 * I_COUNT)()

    def add(self, key: tuple, delta: int | None, word: int) -> int:
        """An object resolved (key from need(); delta None: it defines no environ); its table index."""
        self._objs.append((key, NO_DELTA if delta is None else delta, word))
        self._table = (Obj * len(self._objs))()
        paths = []
        at = 0
        for i, ((path, major, minor, inode, offset, static), d, w) in enumerate(self._objs):
            self._table[i] = Obj(inode, offset, major, minor, d, w, static, at, len(path))
            paths.append(path)
            at += len(path)
        self._paths = b"".join(paths)
        return len(self._objs) - 1

    def _unstick(self, info, resolve, i: int, asked: set) -> bool:
        """What let the call go on from process i, done (an object resolved, a larger buffer); False
        where nothing can (an object asked twice, a buffer at its limit)."""
        if info[I_STOP] == NEED:
            key = (ctypes.string_at(self._need, info[I_PATH_LEN]), info[I_MAJOR], info[I_MINOR], info[I_INODE],
                   info[I_OFFSET], info[I_STATIC])
            if key in asked:
                return False
            asked.add(key)
            resolve(key, info[I_START], i)
        elif info[I_STOP] == -errno.ENOBUFS and len(self._out) < 1 << 28:
            self._out = ctypes.create_string_buffer(len(self._out) * 2)
        elif info[I_STOP] == -errno.ENAMETOOLONG and len(self._need) < info[I_PATH_LEN] <= MAX_PATH:
            self._need = ctypes.create_string_buffer(info[I_PATH_LEN])  # the path's whole length
        else:
            return False
        return True

    def read(self, root: bytes, pids: list[int], exes: list[bytes | None], retries: int, resolve):
        """Each process's (status, records) in order, records as (kind, name, value) in array order
        (value b"" for OUT_EQUAL / OUT_DIFFERS). resolve(key, start, index) is called for an object the
        table lacks, met in the process pids[index] (it adds the object); a full output buffer is
        doubled, a path buffer too short for an object's path grown to it (up to MAX_PATH)."""
        n = len(pids)
        c_pids = (ctypes.c_int32 * n)(*pids)
        c_exes = (ctypes.c_char_p * n)(*exes)
        status = (ctypes.c_int64 * (ST_COUNT * n))()
        info = self._info
        out: list = []
        i, asked = 0, set()  # the objects resolved for process i: one asked again would never match
        while i < n:
            done = self._fn(root, ctypes.byref(c_pids, 4 * i), ctypes.byref(c_exes, ctypes.sizeof(ctypes.c_char_p) * i),
                            n - i, self._table, len(self._objs), self._paths, self._rules, len(self._rules), retries,
                            self._out, len(self._out), ctypes.byref(status, 8 * ST_COUNT * i), self._need,
                            len(self._need), info)
            if done:
                data = ctypes.string_at(self._out, status[ST_COUNT * (i + done - 1) + ST_OFF]
                                        + status[ST_COUNT * (i + done - 1) + ST_LEN])
                flat = status[ST_COUNT * i:ST_COUNT * (i + done)]
                for j in range(0, len(flat), ST_COUNT):
                    st = flat[j:j + ST_COUNT]
                    out.append((st, list(_records(data, st[ST_OFF], st[ST_RC]))))
                i, asked = i + done, set()
            if i >= n:
                break
            if not self._unstick(info, resolve, i, asked):  # nothing to change: what stopped it stops that process
                out.append(([info[I_STOP], 0, 0, 0, 0, -1, -1], []))
                i, asked = i + 1, set()
        return out


def _records(data: bytes, at: int, count: int):
    for _ in range(max(count, 0)):
        kind, n, v = _HEAD.unpack_from(data, at)
        at += _HEAD.size
        yield kind, data[at:at + n], data[at + n:at + n + v]
        at += n + v


_fn = None
_lib_handle = None


def load():
    """The C function, or None (not built, not loadable, or NCCLPROBE_NATIVE_LIVE=0). With
    NCCLPROBE_NATIVE_LIVE=maps it reads maps files even where the kernel has PROCMAP_QUERY."""
    global _fn, _lib_handle
    mode = os.environ.get("NCCLPROBE_NATIVE_LIVE", "1")
    if mode == "0":
        return None
    if _fn is None:
        try:
            _lib_handle = ctypes.CDLL(str(_lib.lib_path(LIB_NAME)), mode=ctypes.RTLD_LOCAL)
            fn = _lib_handle.ncclprobe_live_read_tree
            fn.restype = ctypes.c_int64
            fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p,
                           ctypes.c_int32, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int32,
                           ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                           ctypes.c_void_p]
            _lib_handle.ncclprobe_live_read_maps.argtypes = [ctypes.c_int32]
            _fn = fn
        except (OSError, AttributeError):
            _fn = False
    if _fn:
        _lib_handle.ncclprobe_live_read_maps(mode == "maps")
    return _fn or None
