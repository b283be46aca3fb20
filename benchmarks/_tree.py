"""The live tree the benchmarks inspect: a parent that starts N-1 children by fork+exec of a tiny
interpreter (python -S -c CHILD), waits until each has written one byte, says "ready", then sleeps."""
from __future__ import annotations

import os
import subprocess
import sys

PARENT = r"""
import os, sys, time
n = int(sys.argv[1])
kids = []
for _ in range(n - 1):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(w, 1)
        os.execv(sys.executable, [sys.executable, "-S", "-c", sys.argv[2]])
    os.close(w)
    kids.append(r)
for r in kids:
    os.read(r, 1)
print("ready", flush=True)
time.sleep(600)
"""


def start_tree(n: int, child: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """The tree of n processes, up (every child has started); the caller kills it."""
    parent = subprocess.Popen([sys.executable, "-S", "-c", PARENT, str(n), child], stdout=subprocess.PIPE,
                              text=True, env=env)
    assert parent.stdout.readline().strip() == "ready"
    return parent


def children(root: int) -> list[int]:
    """The pids whose parent is root (the tree's children), from /proc."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    if int(fh.read().rpartition(b")")[2].split()[1]) == root:
                        out.append(int(name))
            except OSError:
                pass
    return out
