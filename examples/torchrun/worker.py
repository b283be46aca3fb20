"""A torchrun rank on CPU: joins a gloo process group (where a GPU job would create its NCCL
communicator), then records what it had (../_worker.py) and, with --hold, waits."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _worker  # noqa: E402


def main() -> None:
    args = _worker.options()
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()
    _worker.work(args.out, args.hold)
    dist.barrier()  # nobody leaves while another rank is held
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
