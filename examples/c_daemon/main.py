"""A C worker daemon that filters its environment (the shape of raylet and orted): it had the
operator's NCCL_PROTO=LL in its own environment and execs its workers with an allow-list.

Start it with NCCL_PROTO=LL exported. `fail`: the allow-list is PATH,HOME,LANG: the two workers start
without NCCL_PROTO. `ok`: the list also forwards NCCL_*. Neither list keeps PYTHONPATH, so no boot
probe reaches the workers: only /proc can tell what they had.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _daemon  # noqa: E402
import _worker  # noqa: E402

KEEP = {"fail": "PATH,HOME,LANG", "ok": "PATH,HOME,LANG,NCCL_*"}


def main() -> None:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--daemon", help="a daemon binary built earlier (default: build one with cc)")
    extra, rest = p.parse_known_args()
    args = _worker.options(rest, words=tuple(KEEP))
    if "NCCL_PROTO" not in os.environ:
        print("c_daemon: start this with NCCL_PROTO=LL exported (the operator's setting)", file=sys.stderr)
    with _daemon.binary(extra.daemon) as daemon:
        cmd = [daemon, "-n", "2", "-k", KEEP[args.variant], "--",
               sys.executable, str(Path(_worker.__file__).resolve()), *_worker.forwarded(args)]
        sys.exit(subprocess.run(cmd).returncode)


if __name__ == "__main__":
    main()
