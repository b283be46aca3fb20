"""How the demo's workers call NCCL: the PyTorch way (a library linked against libnccl, so the
preload hook sees it) and the SGLang/vLLM way (ctypes on the library, which it cannot see).

`sim` runs on ncclprobe's simulated NCCL (no GPU); `torch` on torch's real NCCL and a GPU
(ncclprobe.bench.torchnccl, since bench/ is the only package that imports torch: imported lazily, and
bench/ never imports demo/; the C API pieces both use are ncclprobe.ncclapi)."""
from __future__ import annotations

import ctypes
from pathlib import Path

from ncclprobe.ncclapi import NCCL_BFLOAT16, NCCL_SUM, declare, init_rank_ctypes, unique_id


def _uid(hex_id: str):
    return unique_id(bytes.fromhex(hex_id))


class SimOps:
    """Simulated NCCL: libsimtorch stands for PyTorch (linked), the sim libnccl is loaded by ctypes."""

    def __init__(self, rank: int, sync: Path):
        from ncclprobe._lib import lib_path
        self.torchlike = ctypes.CDLL(str(lib_path("sim/libsimtorch.so")))
        self.nccl = ctypes.CDLL(str(lib_path("sim/libnccl.so.2")))  # same copy as libsimtorch's NEEDED
        declare(self.nccl)
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
