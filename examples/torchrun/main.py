"""A Python driver that starts torchrun with subprocess. torchrun's agent passes its own environment
(the one it was started with) to every rank.

`fail`: the driver starts torchrun, then sets os.environ["NCCL_PROTO"] = "LL": the ranks never get it.
`ok`: the driver sets it before it starts torchrun (as `NCCL_PROTO=LL torchrun ...` would).
"""
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _worker  # noqa: E402

RANK = str(Path(__file__).resolve().parent / "worker.py")


def torchrun(*entry: str) -> list[str]:
    """`torchrun --standalone --nproc-per-node 2 ENTRY...`, through this interpreter (no PATH lookup)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *entry]


def main() -> None:
    args = _worker.options(words=("fail", "ok"))
    if args.variant == "ok":
        os.environ["NCCL_PROTO"] = "LL"
    agent = subprocess.Popen(torchrun(RANK, *_worker.forwarded(args)))
    if args.variant == "fail":
        os.environ["NCCL_PROTO"] = "LL"  # torchrun already runs with the environment of its start
        _worker.wrote(args.out)
    sys.exit(agent.wait())


if __name__ == "__main__":
    main()
