"""The worker every example ends in: the process that would create a NCCL communicator.

It records what it really had -- {"pid", "ppid", "NCCL_PROTO"} -- as one JSON file in the directory
given by `--out` (argv, not the environment: a curated environment would drop it), prints the same on
stderr, and with `--hold DIR` waits (at most HOLD_LIMIT_S) for DIR/release so that `ncclprobe inspect`
can look at the live tree. Run as a script (`python _worker.py --out DIR`) or imported by a scenario
(`_worker.work(out, hold)` in a multiprocessing child). Standard library only: some workers start
with `python -S` semantics or without PYTHONPATH.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

VAR = "NCCL_PROTO"
HOLD_LIMIT_S = 30.0  # a held worker never outlives a harness that forgot it by more than this
POLL_S = 0.02


def record(out: str | None, role: str = "worker") -> dict:
    """Write this process's record (atomically: a reader never sees half a file) and say it on stderr."""
    rec = {"pid": os.getpid(), "ppid": os.getppid(), VAR: os.environ.get(VAR), "role": role}
    shown = rec[VAR] if rec[VAR] is not None else "(unset)"
    # one write for the whole line: workers share stderr, and print() makes two (text, then newline) where
    # stderr is unbuffered (PYTHONUNBUFFERED=1): two workers' lines would interleave
    sys.stderr.flush()
    os.write(2, f"[{role} pid {rec['pid']}, parent {rec['ppid']}] {VAR}={shown}\n".encode(errors="replace"))
    if out:
        final = Path(out) / f"{role}-{rec['pid']}.json"
        tmp = final.with_name(f".{final.name}.tmp")
        tmp.write_text(json.dumps(rec))
        os.replace(tmp, final)
    return rec


def wrote(out: str | None) -> None:
    """A scenario's launcher says it has just set the value (its pid is the writer's, for the tests)."""
    record(out, role="writer")


def hold(hold_dir: str | None) -> None:
    """Wait for HOLD_DIR/release (polled; bounded), so the process tree stays up while it is inspected."""
    if not hold_dir:
        return
    release = Path(hold_dir) / "release"
    deadline = time.monotonic() + HOLD_LIMIT_S
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(POLL_S)


def work(out: str | None, hold_dir: str | None) -> None:
    record(out)
    hold(hold_dir)


def options(argv: list[str] | None = None, words: tuple[str, ...] = ()) -> argparse.Namespace:
    """`[WORD] [--out DIR] [--hold DIR]`, the command line of every example; WORD is one of words."""
    p = argparse.ArgumentParser()
    if words:
        p.add_argument("variant", choices=words)
    p.add_argument("--out", help="directory for the workers' records (default: none, stderr only)")
    p.add_argument("--hold", metavar="DIR", help="keep the workers alive until DIR/release exists")
    return p.parse_args(argv)


def forwarded(args: argparse.Namespace) -> list[str]:
    """The options to hand on to a worker started as a command."""
    return (["--out", args.out] if args.out else []) + (["--hold", args.hold] if args.hold else [])


if __name__ == "__main__":
    args = options()
    work(args.out, args.hold)
