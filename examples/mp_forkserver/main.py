"""multiprocessing forkserver: every child is a fork of the server, whose environment is frozen when
it starts (on first use), not a copy of the parent's at the child's start.

`fail`: the first worker starts (and with it the server), then the parent sets NCCL_PROTO=LL, then
the second worker starts: neither has the value. `ok`: the value is set before the first start.
"""
import multiprocessing as mp
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _worker  # noqa: E402


def main() -> None:
    args = _worker.options(words=("fail", "ok"))
    ctx = mp.get_context("forkserver")
    if args.variant == "ok":
        os.environ["NCCL_PROTO"] = "LL"
    first = ctx.Process(target=_worker.work, args=(args.out, args.hold))
    first.start()  # starts the forkserver (Lib/multiprocessing/forkserver.py ensure_running)
    if args.variant == "fail":
        os.environ["NCCL_PROTO"] = "LL"  # the server already runs with the old environment
        _worker.wrote(args.out)
    second = ctx.Process(target=_worker.work, args=(args.out, args.hold))
    second.start()
    for p in (first, second):
        p.join()
    sys.exit(max(p.exitcode for p in (first, second)))


if __name__ == "__main__":
    main()
