"""Ray's shape without Ray: the driver starts a worker daemon (as `ray.init()` starts the raylet),
then sets NCCL_PROTO=LL, then asks the daemon for workers. The daemon passes on its own environment
(all of it), which it got at its start: the workers never see the driver's later write
(ray-project/ray #2260, #38891).

`fail`: daemon started, then the write, then the request. `ok`: the write comes before the daemon.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _daemon  # noqa: E402
import _worker  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--daemon", help="a daemon binary built earlier (default: build one with cc)")
    extra, rest = p.parse_known_args()
    args = _worker.options(rest, words=("fail", "ok"))
    with _daemon.binary(extra.daemon) as daemon:
        if args.variant == "ok":
            os.environ["NCCL_PROTO"] = "LL"
        cmd = [daemon, "-w", "-n", "2", "-k", "*", "--",
               sys.executable, str(Path(_worker.__file__).resolve()), *_worker.forwarded(args)]
        raylet = subprocess.Popen(cmd, stdin=subprocess.PIPE)  # ray.init(): the daemon starts now
        if args.variant == "fail":
            os.environ["NCCL_PROTO"] = "LL"  # after the daemon started: it never sees this
            _worker.wrote(args.out)
        raylet.stdin.write(b"start\n")  # the first actor or task: the daemon forks its workers
        raylet.stdin.close()
        sys.exit(raylet.wait())


if __name__ == "__main__":
    main()
