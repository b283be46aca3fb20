"""multiprocessing fork: a child forked before the parent's os.environ write never sees it.

`fail`: the first worker is forked, then the parent sets NCCL_PROTO=LL, then the second worker is
forked: the first runs without the value, the second with it. `ok`: the value is set before either.
"""
import multiprocessing as mp
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _worker  # noqa: E402


def main() -> None:
    args = _worker.options(words=("fail", "ok"))
    ctx = mp.get_context("fork")
    if args.variant == "ok":
        os.environ["NCCL_PROTO"] = "LL"
    first = ctx.Process(target=_worker.work, args=(args.out, args.hold))
    first.start()
    if args.variant == "fail":
        os.environ["NCCL_PROTO"] = "LL"  # too late for `first`: a fork child has the memory it was forked with
        _worker.wrote(args.out)
    second = ctx.Process(target=_worker.work, args=(args.out, args.hold))
    second.start()
    for p in (first, second):
        p.join()
    sys.exit(max(p.exitcode for p in (first, second)))


if __name__ == "__main__":
    main()
