"""multiprocessing spawn: each child is exec'ed with the parent's environment at its start; a write
made afterwards stays in the parent.

`fail`: both workers start, then the parent sets NCCL_PROTO=LL. `ok`: the value is set first.
"""
import multiprocessing as mp
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _worker  # noqa: E402


def main() -> None:
    args = _worker.options(words=("fail", "ok"))
    ctx = mp.get_context("spawn")
    if args.variant == "ok":
        os.environ["NCCL_PROTO"] = "LL"
    workers = [ctx.Process(target=_worker.work, args=(args.out, args.hold)) for _ in range(2)]
    for p in workers:
        p.start()
    if args.variant == "fail":
        os.environ["NCCL_PROTO"] = "LL"  # the workers were exec'ed with the environment of their start
        _worker.wrote(args.out)
    for p in workers:
        p.join()
    sys.exit(max(p.exitcode for p in workers))


if __name__ == "__main__":
    main()
