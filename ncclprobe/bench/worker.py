"""One rank of one configuration: `python -m ncclprobe.bench.worker SPEC.json`.

Started by the driver in a fresh process per configuration, with the configuration's environment
already in place: NCCL_PARAM caches most variables per process at first read (src/include/param.h),
so a process can never measure two configurations. Timing follows nccl-tests (warm-up, n calls back
to back, host wall time / n) and vLLM's graph benchmark (n calls captured in one CUDA graph, replayed).
All control traffic (barriers, gathering times) goes through a separate gloo group so that the NCCL
communicator, and the profiler events it emits, carry only the measured all-reduces. Rank 0 appends
each size's rows to the spec's `rows` file the moment every rank has measured it (the driver prints
them from there while the configuration runs); result.json, written at the end, carries the versions.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from ncclprobe.bench import allreduce

GRAPH_REPLAYS = 3   # timed launches of the captured graph (each holds `iters` all-reduces)
GRAPH_WARMUP = 3    # eager calls on a side stream before capture, as vLLM's benchmark does
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_NCCL_DTYPES = {"bf16": 9, "fp16": 6, "fp32": 7}  # ncclBfloat16, ncclFloat16, ncclFloat32 (nccl.h)


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this worker when the driver dies (prctl PR_SET_PDEATHSIG), so even a
    SIGKILLed driver leaves no worker behind."""
    parent = int(os.environ.get("NCCLPROBE_BENCH_PARENT", "0") or 0)
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if parent and os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _write(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


class RowLog:
    """Rank 0's measured rows, one JSON line per size, appended the moment they exist so the driver
    can print them while the configuration runs (one write() per line: a reader never sees half of
    one, DESIGN §4's log discipline)."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)

    def __call__(self, rows: list[dict]) -> None:
        os.write(self.fd, (json.dumps({"bytes": rows[0]["bytes"], "rows": rows}) + "\n").encode())


def _loaded_nccl() -> str | None:
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if "/libnccl.so" in path:
                    return path
    except OSError:
        return None
    return None


class Harness:
    def __init__(self, spec: dict, rank: int, nranks: int, local_rank: int):
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.spec = torch, dist, spec
        self.rank, self.nranks = rank, nranks
        self.cuda = spec["backend"] == "nccl"
        timeout = __import__("datetime").timedelta(seconds=max(30.0, float(spec["timeout"])))
        if self.cuda:
            torch.cuda.set_device(local_rank)
            self.device = torch.device("cuda", local_rank)
            # device_id= creates the communicator eagerly (observed on torch 2.11).
            dist.init_process_group("nccl", rank=rank, world_size=nranks, timeout=timeout,
                                    device_id=self.device)
            self.ctrl = dist.new_group(backend="gloo", timeout=timeout)
        else:
            self.device = torch.device("cpu")
            dist.init_process_group("gloo", rank=rank, world_size=nranks, timeout=timeout)
            self.ctrl = None
        self.dtype = getattr(torch, _DTYPES[spec["dtype"]])
        self.elem = torch.tensor([], dtype=self.dtype).element_size()
        count = max(spec["sizes"]) // self.elem
        self.send = torch.zeros(count, dtype=self.dtype, device=self.device)
        self.recv = torch.zeros(count, dtype=self.dtype, device=self.device)
        self.base = (torch.arange(count, device=self.device) % allreduce.PERIOD + 1).to(self.dtype)
        self.oop_method = "copy + in-place all_reduce (torch has no out-of-place all_reduce)"
        self._nccl_allreduce = None
        if self.cuda:
            self._bind_nccl()

    # -- the two placements -------------------------------------------------------------------
    def _bind_nccl(self) -> None:
        """True out-of-place (sendbuff != recvbuff, as nccl-tests and vLLM's pynccl call it): call
        ncclAllReduce of the libnccl copy torch loaded, on torch's own communicator."""
        import ctypes
        self.dist.all_reduce(self.send[:1])  # make sure the communicator exists
        self.sync()
        try:
            comm = self.dist.group.WORLD._get_backend(self.device)._comm_ptr()
            path = _loaded_nccl()
            if not comm or not path:
                raise RuntimeError("no communicator pointer or no loaded libnccl")
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            fn = lib.ncclAllReduce
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                           ctypes.c_void_p, ctypes.c_void_p]
        except Exception as exc:  # any torch without _comm_ptr: keep the copy + in-place fallback
            self.oop_method += f" [direct ncclAllReduce unavailable: {exc}]"
            return
        dt = _NCCL_DTYPES[self.spec["dtype"]]

        def call(send, recv):
            rc = fn(send.data_ptr(), recv.data_ptr(), send.numel(), dt, 0, comm,
                    self.torch.cuda.current_stream().cuda_stream)
            if rc != 0:
                raise RuntimeError(f"ncclAllReduce returned {rc}")
        self._nccl_allreduce = call
        self.oop_method = f"ncclAllReduce(sendbuff != recvbuff) on torch's communicator ({path})"

    def op(self, count: int, inplace: bool):
        send, recv = self.send[:count], self.recv[:count]
        if inplace:
            return lambda: self.dist.all_reduce(recv)
        if self._nccl_allreduce is not None:
            return lambda: self._nccl_allreduce(send, recv)
        return lambda: (recv.copy_(send), self.dist.all_reduce(recv))

    # -- timing -------------------------------------------------------------------------------
    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def barrier(self) -> None:
        # Barrier before the timed region, never inside it (bench-anchors §5.4).
        self.sync()
        self.dist.barrier(group=self.ctrl)

    def eager(self, fn, iters: int) -> float:
        self.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        self.sync()
        return (time.perf_counter() - t0) / iters

    def graph(self, fn, iters: int) -> tuple[float, str]:
        import warnings
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        self.sync()
        g = torch.cuda.CUDAGraph()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.cuda.graph(g):
                for _ in range(iters):
                    fn()
        note = "empty graph" if any("empty" in str(w.message).lower() for w in caught) else ""
        g.replay()
        self.barrier()
        t0 = time.perf_counter()
        for _ in range(GRAPH_REPLAYS):
            g.replay()
        self.sync()
        elapsed = (time.perf_counter() - t0) / (GRAPH_REPLAYS * iters)
        del g
        return elapsed, note

    def check(self, count: int, inplace: bool) -> int:
        """Wrong elements after one call on the known pattern (nccl-tests validates after timing)."""
        torch = self.torch
        pattern = self.base[:count] * (self.rank + 1)  # allreduce.rank_value
        self.send[:count].copy_(pattern)
        self.recv[:count].copy_(pattern if inplace else torch.zeros_like(pattern))
        self.op(count, inplace)()
        self.sync()
        got = self.recv[:count].float()
        want = self.base[:count].float() * allreduce.expected_value(self.nranks, 0)
        bad = ((got - want).abs() > want * allreduce.tolerance(self.spec["dtype"])) | ~torch.isfinite(got)
        return int(bad.sum().item())

    def measure(self, nbytes: int) -> list[dict]:
        """This rank's rows for one size: out-of-place then in-place, each in every mode, then checked."""
        spec = self.spec
        modes = ["eager"] + (["graph"] if spec["graph"] and self.cuda else [])
        count = nbytes // self.elem
        rows = []
        for inplace in (False, True):
            fn = self.op(count, inplace)
            for _ in range(spec["warmup"]):
                fn()
            self.sync()
            placed = []
            for mode in modes:
                if mode == "eager":
                    t, note = self.eager(fn, spec["iters"]), ""
                else:
                    t, note = self.graph(fn, spec["iters"])
                placed.append({"bytes": count * self.elem, "count": count, "mode": mode,
                               "inplace": inplace, "time_s": t, "wrong": 0, "note": note})
            if spec["check"]:
                wrong = self.check(count, inplace)
                for r in placed:
                    r["wrong"] = wrong
            rows += placed
        return rows

    def slowest(self, rows: list[dict]) -> list[dict]:
        """The maximum time across ranks (the slowest rank bounds the collective), wrong summed: on the
        control group and outside every timed region (each timing starts with its own barrier)."""
        torch = self.torch
        times = torch.tensor([r["time_s"] for r in rows], dtype=torch.float64)
        wrong = torch.tensor([r["wrong"] for r in rows], dtype=torch.int64)
        self.dist.all_reduce(times, op=self.dist.ReduceOp.MAX, group=self.ctrl)
        self.dist.all_reduce(wrong, op=self.dist.ReduceOp.SUM, group=self.ctrl)
        for r, t, w in zip(rows, times.tolist(), wrong.tolist()):
            r["time_s"], r["wrong"] = t, int(w)
        return rows

    def run(self, emit) -> None:
        """Every size in turn; `emit` gets each size's rows (slowest rank) as soon as they exist."""
        for nbytes in self.spec["sizes"]:
            emit(self.slowest(self.measure(nbytes)))

    def versions(self) -> dict:
        torch = self.torch
        out = {"torch": torch.__version__, "device": "CPU", "nccl": None}
        if self.cuda:
            out["device"] = torch.cuda.get_device_name(self.device)
            try:
                out["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
            except (AttributeError, RuntimeError, TypeError):
                out["nccl"] = None
        return out


def main(argv: list[str]) -> int:
    _die_with_parent()
    spec = json.loads(Path(argv[0]).read_text())
    rank, nranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    out = Path(spec["out"])
    from ncclprobe.model.watched import select
    info = {"rank": rank, "pid": os.getpid(), "ppid": os.getppid(), "host": os.uname().nodename,
            "env": select(dict(os.environ)), "state": "started"}
    _write(out / f"rank{rank}.json", info)  # before torch loads: the driver sees who started
    try:
        h = Harness(spec, rank, nranks, local_rank)
        h.run(RowLog(Path(spec["rows"])) if rank == 0 else lambda rows: None)
        info.update(state="done", **h.versions())
        if rank == 0:
            _write(out / "result.json", {"nranks": nranks, "out_of_place": h.oop_method, **h.versions()})
        h.dist.destroy_process_group()  # communicator destroy flushes the profiler's summaries
    except Exception as exc:
        info.update(state="error", error=f"{type(exc).__name__}: {exc}",
                    traceback=traceback.format_exc(limit=8))
        _write(out / f"rank{rank}.json", info)
        return 1
    _write(out / f"rank{rank}.json", info)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
