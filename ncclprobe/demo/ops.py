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
        for name in ("ncclprobeSimStreamBeginCapture", "ncclprobeSimGraphLaunch", "ncclprobeSimGraphDestroy"):
            getattr(self.nccl, name).argtypes = [ctypes.c_void_p]
        self.nccl.ncclprobeSimStreamEndCapture.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        self.torchlike.simtorch_graph_capture_end.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        for name in ("simtorch_graph_replay", "simtorch_graph_destroy"):
            getattr(self.torchlike, name).argtypes = [ctypes.c_void_p]
        self.comms: list[tuple[str, object]] = []
        self.graphs: list[tuple[str, ctypes.c_void_p]] = []
        self.buf = ctypes.create_string_buffer(1 << 20)
        self._stream_obj = ctypes.create_string_buffer(1)  # a ctypes caller's capture stream: any non-NULL token
        self.stream = ctypes.cast(self._stream_obj, ctypes.c_void_p)

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

    def capture_all_reduce(self, handle, nbytes: int):
        """One all-reduce captured into a (simulated) CUDA graph, as torch.cuda.graph captures it: the
        API events fire now with graphCaptured; each replay() runs it again."""
        kind, comm = handle
        graph = ctypes.c_void_p()
        if kind == "linked":
            rc = self.torchlike.simtorch_graph_capture_begin()
            if rc == 0:
                self.all_reduce(handle, nbytes)  # on the capture stream
                rc = self.torchlike.simtorch_graph_capture_end(ctypes.byref(graph))
        else:
            rc = self.nccl.ncclprobeSimStreamBeginCapture(self.stream)
            if rc == 0:
                arc = self.nccl.ncclAllReduce(self.buf, self.buf, ctypes.c_size_t(nbytes // 2), NCCL_BFLOAT16, NCCL_SUM,
                                              comm, self.stream)
                rc = self.nccl.ncclprobeSimStreamEndCapture(self.stream, ctypes.byref(graph)) or arc
        if rc != 0:
            raise RuntimeError(f"graph capture failed: {rc}")
        self.graphs.append((kind, graph))
        return (kind, graph)

    def replay(self, graph) -> None:
        kind, g = graph
        rc = self.torchlike.simtorch_graph_replay(g) if kind == "linked" else self.nccl.ncclprobeSimGraphLaunch(g)
        if rc != 0:
            raise RuntimeError(f"graph replay failed: {rc}")

    def close(self) -> None:
        for kind, g in reversed(self.graphs):
            if kind == "linked":
                self.torchlike.simtorch_graph_destroy(g)
            else:
                self.nccl.ncclprobeSimGraphDestroy(g)
        self.graphs.clear()
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
