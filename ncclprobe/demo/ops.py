"""How the demo's workers call NCCL: the PyTorch way (a library linked against libnccl, so the
preload hook sees it) and the SGLang/vLLM way (ctypes on the library, which it cannot see).

`sim` runs on ncclprobe's simulated NCCL (no GPU); `torch` on torch's real NCCL and a GPU
(ncclprobe.bench.torchnccl, since bench/ is the only package that imports torch)."""
from __future__ import annotations

import ctypes
from pathlib import Path

NCCL_BFLOAT16, NCCL_SUM = 9, 0        # ncclDataType_t / ncclRedOp_t values (nccl.h)
UID_BYTES = 128                      # sizeof(ncclUniqueId)


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * UID_BYTES)]


def _uid(hex_id: str) -> UniqueId:
    raw = bytes.fromhex(hex_id)[:UID_BYTES].ljust(UID_BYTES, b"\0")
    uid = UniqueId()
    ctypes.memmove(ctypes.byref(uid), raw, UID_BYTES)
    return uid


def init_rank_ctypes(lib, world: int, uid: UniqueId, rank: int) -> ctypes.c_void_p:
    comm = ctypes.c_void_p()
    rc = lib.ncclCommInitRank(ctypes.byref(comm), ctypes.c_int(world), uid, ctypes.c_int(rank))
    if rc != 0:
        raise RuntimeError(f"ncclCommInitRank failed: {rc}")
    return comm


class SimOps:
    """Simulated NCCL: libsimtorch stands for PyTorch (linked), the sim libnccl is loaded by ctypes."""

    def __init__(self, rank: int, sync: Path):
        from ncclprobe._lib import lib_path
        self.torchlike = ctypes.CDLL(str(lib_path("sim/libsimtorch.so")))
        self.nccl = ctypes.CDLL(str(lib_path("sim/libnccl.so.2")))  # same copy as libsimtorch's NEEDED
        self.nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
        self.comms: list[tuple[str, object]] = []
        self.buf = ctypes.create_string_buffer(1 << 20)

    def init_linked(self, world: int, uid_hex: str, rank: int, name: str):
        comm = ctypes.c_void_p()
        uid = _uid(uid_hex)
        # -1 / NULL: leave blocking, CTAs and name unset, as PyTorch does by default
        rc = self.torchlike.simtorch_init_rank_config(ctypes.byref(comm), world, ctypes.byref(uid), rank,
                                                      -1, -1, -1, None)
        if rc != 0:
            raise RuntimeError(f"simtorch_init_rank_config failed: {rc}")
        self.comms.append(("linked", comm))
        return ("linked", comm)

    def init_ctypes(self, world: int, uid_hex: str, rank: int):
        comm = init_rank_ctypes(self.nccl, world, _uid(uid_hex), rank)
        self.comms.append(("ctypes", comm))
        return ("ctypes", comm)

    def all_reduce(self, handle, nbytes: int) -> None:
        kind, comm = handle
        count = nbytes // 2
        if kind == "linked":
            rc = self.torchlike.simtorch_all_reduce(comm, self.buf, self.buf, ctypes.c_size_t(count), NCCL_BFLOAT16,
                                                    NCCL_SUM)
        else:
            rc = self.nccl.ncclAllReduce(self.buf, self.buf, ctypes.c_size_t(count), NCCL_BFLOAT16, NCCL_SUM, comm, None)
        if rc != 0:
            raise RuntimeError(f"all-reduce failed: {rc}")

    def close(self) -> None:
        for kind, comm in reversed(self.comms):
            if kind == "linked":
                self.torchlike.simtorch_destroy(comm)
            else:
                self.nccl.ncclCommDestroy(comm)
        self.comms.clear()


def load(backend: str, rank: int, sync: Path):
    if backend == "sim":
        return SimOps(rank, sync)
    from ncclprobe.bench.torchnccl import TorchOps  # bench/ is the only torch importer
    return TorchOps(rank, sync)
