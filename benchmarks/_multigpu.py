"""What the multi-GPU benchmarks share (issue 16): the machine they ran on, a torchrun launch of one
process per GPU, and the rank-side set-up of a job (no torch imported here until a job needs it)."""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

# NVLink multicast stays off on the lent machines (the device notes say why): NCCL, PyTorch, NVSHMEM
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def main(doc: str, add, job, measure) -> int:
    """A script's entry: the options both take (--gpus, --out, the hidden --job a rank runs under) and
    `add(parser)`'s; under torchrun `job(args)`, else `measure(args, ranks)` (exit 3 without a GPU)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=None, help="GPUs (one rank each); default: all visible")
    add(ap)
    ap.add_argument("--out", type=Path, default=None, help="write the machine and the figures here (JSON)")
    ap.add_argument("--job", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.job:
        job(a)
        return 0
    n = a.gpus or visible_gpus()
    if n < 1:
        print("no GPU visible: this needs one process per GPU", file=sys.stderr)
        return 3
    return measure(a, n)


def visible_gpus() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def machine() -> dict:
    """GPU model and driver (nvidia-smi), torch and the NCCL it links, the host's CPU count."""
    import torch
    out = {"host": socket.gethostname(), "cpus": os.cpu_count(), "torch": torch.__version__,
           "nccl": None, "gpus": visible_gpus(), "gpu": None, "driver": None}
    try:
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:  # a CPU build: no NCCL
        out["nccl"] = f"unknown ({type(exc).__name__})"
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.splitlines()
        if smi:
            out["gpu"], out["driver"] = (s.strip() for s in smi[0].split(",", 1))
    except (OSError, subprocess.TimeoutExpired, ValueError):
        pass
    return out


def torchrun(nproc: int, script: Path, args: list[str]) -> list[str]:
    """One process per GPU on this host, through torch's own launcher (as `torchrun` runs it)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            str(script), *args]


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCLPROBE_")}
    return {**env, **SAFE_ENV, **(extra or {})}


def rank_setup():
    """In a torchrun rank: its device bound and the default group up. (rank, world, device, dist)."""
    import torch
    import torch.distributed as dist
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    return rank, world, device, dist


def write_json(path: Path, doc) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def median(values: list[float]) -> float | None:
    v = sorted(values)
    if not v:
        return None
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2
