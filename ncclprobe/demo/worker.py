"""One worker of the demo's miniature server: a decode communicator created the PyTorch way (through a
library linked against NCCL), whose all-reduce is captured into a CUDA graph and replayed, then, after
the engine turns on speculative decoding, a verify communicator created the SGLang/vLLM way (ctypes on
the NCCL library), whose all-reduces run eagerly."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HIDDEN = 7168          # DeepSeek-V3 / Kimi-K2 hidden size
DTYPE_BYTES = 2        # bf16
DECODE_STEPS = 8
# the seed's server: a decode step of 12 ms, a verify step of 30 ms (compute, simulated by sleeping; NCCL's own
# share of them is what the time lines measure)
DECODE_STEP_S, VERIFY_STEP_S = 0.012, 0.030
VERIFY_DRAFTS = (1, 2, 3)   # k draft tokens: the verify step all-reduces (1 + k) tokens
GO_TIMEOUT_S = 60.0


def _handshake(sync: Path, name: str) -> None:
    (sync / f"ready-{name}.tmp").write_text(str(os.getpid()))
    os.replace(sync / f"ready-{name}.tmp", sync / f"ready-{name}")
    deadline = time.monotonic() + GO_TIMEOUT_S
    while not (sync / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def serve(rank: int, world: int, uids: dict[str, str], sync_dir: str, backend: str, role: str) -> None:
    from ncclprobe.demo import engine, ops as ops_mod
    sync = Path(sync_dir)
    if role == "sidecar":  # a metrics sidecar: no NCCL at all
        _handshake(sync, "sidecar")
        return
    ops = ops_mod.load(backend, rank if role == "tp" else 0, sync)
    try:
        if role == "tp":
            decode = ops.init_linked(world, uids["decode"], rank, "decode")
            # decode as serving stacks run it: one eager warm-up, then captured into a CUDA graph and replayed
            ops.all_reduce(decode, HIDDEN * DTYPE_BYTES)
            step = ops.capture_all_reduce(decode, HIDDEN * DTYPE_BYTES)
            for _ in range(DECODE_STEPS):
                ops.replay(step)
                time.sleep(DECODE_STEP_S)
            engine.enable_speculative()
            verify = ops.init_ctypes(world, uids["verify"], rank)
            for k in VERIFY_DRAFTS:  # the verify step runs eagerly (the seed's server: no CUDA graph for it)
                ops.all_reduce(verify, (1 + k) * HIDDEN * DTYPE_BYTES)
                time.sleep(VERIFY_STEP_S)
        else:  # a replica started with a curated environment: its own single-rank communicator
            comm = ops.init_linked(1, uids["replica"], 0, "replica")
            for _ in range(DECODE_STEPS):
                ops.all_reduce(comm, HIDDEN * DTYPE_BYTES)
        _handshake(sync, f"{role}{rank}")
    finally:
        ops.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sync", required=True)
    ap.add_argument("--backend", choices=["sim", "torch"], default="sim")
    ap.add_argument("--role", choices=["replica", "sidecar"], required=True)
    ap.add_argument("--uid", default="")
    args = ap.parse_args(argv)
    serve(0, 1, {"replica": args.uid}, args.sync, args.backend, args.role)
    return 0


if __name__ == "__main__":
    sys.exit(main())
