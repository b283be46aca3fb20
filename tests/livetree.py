"""Live process trees for tests that walk /proc: a `python -S -c` script started in its own session,
waited for until it prints its first line, and killed with its whole group afterwards."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def running(script: str, env: dict[str, str] | None = None) -> Iterator[tuple[int, list[str]]]:
    """(the script's pid, the words of its first line); skips where /proc has no children files."""
    if not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"):
        pytest.skip("kernel without CONFIG_PROC_CHILDREN")
    p = subprocess.Popen([sys.executable, "-S", "-c", script], stdout=subprocess.PIPE, text=True,
                         start_new_session=True, env=env)
    try:
        yield p.pid, p.stdout.readline().split()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def alive(pid: int) -> bool:
    """Whether pid runs (a zombie is dead for our purposes)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
