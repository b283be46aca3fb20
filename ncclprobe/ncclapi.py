"""NCCL's C API as ctypes sees it: the few constants, the unique id and the communicator call that the
demo's workers (demo/ops.py, on the simulated NCCL) and torch's real NCCL path (bench/torchnccl.py,
PyNccl-style) both make. It imports neither package, so neither imports the other for it."""
from __future__ import annotations

import ctypes

NCCL_BFLOAT16, NCCL_SUM = 9, 0        # ncclDataType_t / ncclRedOp_t values (nccl.h)
UID_BYTES = 128                      # sizeof(ncclUniqueId): NCCL_UNIQUE_ID_BYTES (nccl.h)


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * UID_BYTES)]


def unique_id(raw: bytes) -> UniqueId:
    """An id from its bytes (cut or zero-padded to UID_BYTES)."""
    raw = bytes(raw)[:UID_BYTES].ljust(UID_BYTES, b"\0")
    uid = UniqueId()
    ctypes.memmove(ctypes.byref(uid), raw, UID_BYTES)
    return uid


def declare(lib) -> None:
    """Argument types of the calls made through lib: the id is passed by value, as PyNccl declares it."""
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]


def init_rank_ctypes(lib, world: int, uid: UniqueId, rank: int) -> ctypes.c_void_p:
    comm = ctypes.c_void_p()
    rc = lib.ncclCommInitRank(ctypes.byref(comm), ctypes.c_int(world), uid, ctypes.c_int(rank))
    if rc != 0:
        raise RuntimeError(f"ncclCommInitRank failed: {rc}")
    return comm
