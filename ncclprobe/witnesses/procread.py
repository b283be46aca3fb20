"""The native /proc reader (libprocread.so, built from native/procread.c at install): everything
`inspect` reads of every process in a tree, in one call. procs.walk uses it where it would use the
plain procs.Reader, and falls back to that reader when the library is not built (an uninstalled
source tree) or NCCLPROBE_NATIVE_PROC=0 is set; tests/test_procread.py checks that both see the same.
On Linux >= 6.11 it asks the kernel for just the mappings inspect uses (PROCMAP_QUERY) instead of
reading maps files (NCCLPROBE_NATIVE_PROC=maps reads them anyway).

The library numbers the distinct values it returns, per kind: a process whose command line,
environment or maps are byte for byte an earlier process's gets that value's number and no bytes, so
each distinct value is parsed once (procs.ProcFS.native_tree) and then shared.
"""
from __future__ import annotations

import ctypes
import errno
import os
import threading

from ncclprobe import _lib

LIB_NAME = "libprocread.so"
# native/procread.c's output per process: fixed slots, then {errno, number, offset, length} per kind
(O_ERR, O_PID, O_PPID, O_STATE, O_FLAGS, O_START, O_THREADS, O_SPAN, O_UID, O_UID_ERR, O_SPECIAL, O_CLASS, O_FRESH,
 O_ROLE, O_MAPS_HOW, O_KINDS) = (0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 14, 15, 16, 17, 18)
R_TREE, R_EXCLUDED, R_ANCESTOR, R_KNOWN = 0, 1, 2, 3  # O_ROLE (R_KNOWN: the watch's, stat and children only)
M_NONE, M_QUERY, M_READ = 0, 1, 2  # O_MAPS_HOW: PROCMAP_QUERY (Linux >= 6.11) or a read of maps
KINDS = ("comm", "cmdline", "exe", "environ", "maps", "root", "ns/mnt", "children")
CHILDREN = KINDS.index("children")
PR_OUT = O_KINDS + 4 * len(KINDS)
_MAX_BUF = 1 << 31


class Native:
    """The library's tree walk, with buffers kept from call to call (one call at a time)."""

    def __init__(self, lib: ctypes.CDLL, read_maps: bool = False):
        self.lib = lib
        self._fn = lib.ncclprobe_proc_tree
        self._watch_fn = getattr(lib, "ncclprobe_proc_watch", None)  # a library built before the watch has none
        self.read_maps = int(read_maps)  # read maps files even where PROCMAP_QUERY would do
        self._lock = threading.Lock()
        self._buf = ctypes.create_string_buffer(1 << 18)
        self._out = (ctypes.c_int64 * (PR_OUT * 1024))()

    def tree(self, proc_root: str, roots: list[int],
             exclude: frozenset[int] = frozenset()) -> tuple[list[int], dict[tuple[int, int], bytes]]:
        """The output slots of every process read, PR_OUT each, in procs.walk's order (then the
        ancestors of the roots), and the bytes of every distinct value by (kind, number): numbers
        count from 1 in each kind and are only good for this call. Children are not returned (the
        library walked them): only their errno."""
        left_out = (ctypes.c_int * max(1, len(exclude)))(*exclude)
        return self._call(proc_root, roots, lambda root, array, buf, cap, out, slots: self._fn(
            root, array, len(roots), left_out, len(exclude), buf, cap, out, slots, self.read_maps))

    def watch(self, proc_root: str, roots: list[int], exclude: frozenset[int] | set[int],
              known: list[int]) -> tuple[list[int], dict[tuple[int, int], bytes]]:
        """`run`'s watch scan (native ncclprobe_proc_watch), output as tree's: the tree under the
        roots without ancestors; a pid in `known` gets R_KNOWN (stat and children read, no values),
        the others comm, cmdline, exe and environ (maps, root and ns/mnt unread: errno 0, no bytes)."""
        if self._watch_fn is None:
            raise OSError(errno.ENOSYS, "libprocread.so has no ncclprobe_proc_watch (reinstall)")
        left_out = (ctypes.c_int * max(1, len(exclude)))(*exclude)
        knows = (ctypes.c_int * max(1, len(known)))(*known)
        return self._call(proc_root, roots, lambda root, array, buf, cap, out, slots: self._watch_fn(
            root, array, len(roots), left_out, len(exclude), knows, len(known), buf, cap, out, slots))

    def _call(self, proc_root: str, roots: list[int], call) -> tuple[list[int], dict[tuple[int, int], bytes]]:
        with self._lock:
            array = (ctypes.c_int * len(roots))(*roots)
            root = os.fsencode(proc_root)
            while True:
                n = call(root, array, self._buf, len(self._buf), self._out, len(self._out) // PR_OUT)
                if n not in (-errno.ENOBUFS, -errno.ERANGE):
                    break
                if max(len(self._buf), len(self._out) * 8) >= _MAX_BUF:
                    n = -errno.EFBIG
                    break
                # a file larger than the buffer, or more processes than slots: again, that one doubled
                if n == -errno.ENOBUFS:
                    self._buf = ctypes.create_string_buffer(len(self._buf) * 2)
                else:
                    self._out = (ctypes.c_int64 * (len(self._out) * 2))()
            if n < 0:
                raise OSError(-n, os.strerror(-n), proc_root)
            flat = memoryview(self._out).cast("B")[:n * PR_OUT * 8].cast("q").tolist()
            view = memoryview(self._buf)
            fresh: dict[tuple[int, int], bytes] = {}
            for i in range(0, n * PR_OUT, PR_OUT):
                if flat[i + O_FRESH]:
                    for j in range(i + O_KINDS, i + O_KINDS + 4 * CHILDREN, 4):
                        if not flat[j] and flat[j + 3] >= 0:  # -1: a value returned before
                            fresh[((j - i - O_KINDS) // 4, flat[j + 1])] = view[flat[j + 2]:flat[j + 2] + flat[j + 3]].tobytes()
            return flat, fresh


_native: Native | None | bool = False  # False: not loaded yet


def native() -> Native | None:
    """The reader over the built library, or None (not built, not loadable, or disabled).
    NCCLPROBE_NATIVE_PROC: 0 disables it; `maps` makes it read maps files even on kernels with
    PROCMAP_QUERY (to compare the two)."""
    global _native
    mode = os.environ.get("NCCLPROBE_NATIVE_PROC", "1")
    if mode == "0":
        return None
    if _native is False:
        try:
            lib = ctypes.CDLL(str(_lib.lib_path(LIB_NAME)), mode=ctypes.RTLD_LOCAL)
            lib.ncclprobe_proc_tree.restype = ctypes.c_int64
            lib.ncclprobe_proc_tree.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                                ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                                ctypes.c_int64, ctypes.c_int]
            if hasattr(lib, "ncclprobe_proc_watch"):
                lib.ncclprobe_proc_watch.restype = ctypes.c_int64
                lib.ncclprobe_proc_watch.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                                     ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                                     ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
            _native = Native(lib)
        except (OSError, AttributeError):
            _native = None
    if _native is not None:
        _native.read_maps = int(mode == "maps")
    return _native


def watcher() -> Native | None:
    """A reader of its own (its own buffers and lock) for `run`'s watch thread, so that it never
    waits for another caller of native(); None where native() is None or the library predates the
    watch."""
    shared = native()
    if shared is None or shared._watch_fn is None:
        return None
    return Native(shared.lib)
