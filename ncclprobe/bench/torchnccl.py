"""torch with its real NCCL, as the `ncclprobe demo --real` workers use it: a process group (created
lazily by c10d through ncclCommInitRankConfig at the first collective) and PyNccl-style ctypes calls
on the libnccl.so.2 torch already loaded (a bare soname returns torch's copy)."""
from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

from ncclprobe.ncclapi import NCCL_BFLOAT16, NCCL_SUM, UniqueId, declare, init_rank_ctypes, unique_id


def torch_installed() -> bool:
    """torch is there, found without importing it (that takes seconds; the workers do it)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken parent package or a torch without __spec__
        return False


def gpu_count() -> int:
    """CUDA devices torch sees (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class TorchOps:
    """Real NCCL through torch, with the demo's worker interface (init_linked, init_ctypes,
    all_reduce, capture_all_reduce, replay, close)."""

    def __init__(self, rank: int, sync: Path):
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.sync = torch, dist, sync
        torch.cuda.set_device(rank % torch.cuda.device_count())
        self.nccl = None
        self.ctypes_comms: list[ctypes.c_void_p] = []

    def init_linked(self, world: int, uid_hex: str, rank: int, name: str):
        store = self.dist.FileStore(str(self.sync / f"store-{name}"), world)
        self.dist.init_process_group("nccl", store=store, rank=rank, world_size=world)
        return ("pg", None)

    def init_ctypes(self, world: int, uid_hex: str, rank: int):
        self.torch.zeros(1, device="cuda")  # torch's libnccl is loaded with libtorch_cuda
        self.nccl = self.nccl or ctypes.CDLL("libnccl.so.2")
        declare(self.nccl)
        store = self.dist.FileStore(str(self.sync / "store-verify"), world)
        if rank == 0:  # a real id carries the bootstrap root's address: rank 0 makes it, the rest read it
            uid = UniqueId()
            if self.nccl.ncclGetUniqueId(ctypes.byref(uid)) != 0:
                raise RuntimeError("ncclGetUniqueId failed")
            store.set("uid", bytes(uid.internal))
        comm = init_rank_ctypes(self.nccl, world, unique_id(store.get("uid")), rank)
        self.ctypes_comms.append(comm)
        return ("ctypes", comm)

    def all_reduce(self, handle, nbytes: int) -> None:
        kind, comm = handle
        t = self.torch.ones(nbytes // 2, dtype=self.torch.bfloat16, device="cuda")
        if kind == "pg":
            self.dist.all_reduce(t)
        else:
            stream = self.torch.cuda.current_stream().cuda_stream
            rc = self.nccl.ncclAllReduce(ctypes.c_void_p(t.data_ptr()), ctypes.c_void_p(t.data_ptr()),
                                         ctypes.c_size_t(t.numel()), NCCL_BFLOAT16, NCCL_SUM, comm,
                                         ctypes.c_void_p(stream))
            if rc != 0:
                raise RuntimeError(f"ncclAllReduce failed: {rc}")
        self.torch.cuda.synchronize()

    def capture_all_reduce(self, handle, nbytes: int):
        """One all-reduce of the default group captured into a CUDA graph (torch.cuda.graph), to replay."""
        t = self.torch.ones(nbytes // 2, dtype=self.torch.bfloat16, device="cuda")
        graph = self.torch.cuda.CUDAGraph()
        with self.torch.cuda.graph(graph):
            self.dist.all_reduce(t)
        self.torch.cuda.synchronize()
        return (graph, t)  # the tensor lives as long as the graph

    def replay(self, captured) -> None:
        captured[0].replay()
        self.torch.cuda.synchronize()

    def close(self) -> None:
        for comm in self.ctypes_comms:
            self.nccl.ncclCommDestroy(comm)
        self.ctypes_comms.clear()
        if self.dist.is_initialized():
            self.dist.destroy_process_group()
