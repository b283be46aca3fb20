"""concurrent.futures.ProcessPoolExecutor: the workers start on the first submit and live on; a
write in the parent afterwards never reaches them. An `initializer` runs in each worker instead.

`fail`: a first task starts the pool, then the parent sets NCCL_PROTO=LL, then every worker records.
`ok`: the initializer sets NCCL_PROTO=LL in each worker; the parent itself never has the value.
The pool uses the fork context (the Linux default up to Python 3.13; 3.14 defaults to forkserver),
named here so the example is the same on every Python.
"""
import multiprocessing as mp
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _worker  # noqa: E402

WORKERS = 2
_barrier = None


def _init(barrier, set_value: bool) -> None:
    global _barrier
    _barrier = barrier
    if set_value:
        os.environ["NCCL_PROTO"] = "LL"


def _task(out, hold) -> None:
    _barrier.wait(timeout=_worker.HOLD_LIMIT_S)  # WORKERS tasks at once: one in each worker
    _worker.work(out, hold)


def main() -> None:
    args = _worker.options(words=("fail", "ok"))
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(WORKERS)
    with ProcessPoolExecutor(WORKERS, mp_context=ctx, initializer=_init,
                             initargs=(barrier, args.variant == "ok")) as pool:
        pool.submit(int).result()  # the first submit starts every worker (fork context)
        if args.variant == "fail":
            os.environ["NCCL_PROTO"] = "LL"  # the workers already run
            _worker.wrote(args.out)
        for f in [pool.submit(_task, args.out, args.hold) for _ in range(WORKERS)]:
            f.result()


if __name__ == "__main__":
    main()
