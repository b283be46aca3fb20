"""What a process's command line says it runs (its image), as every witness and rule reads it."""
from __future__ import annotations


def runs_forkserver(argv) -> bool:
    """Whether a command line is multiprocessing's forkserver."""
    return any("multiprocessing.forkserver" in a for a in argv or ())
