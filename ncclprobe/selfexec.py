"""How ncclprobe starts its own modules in new interpreters (the demo's server, bench workers): they run
the installed package whatever the current directory is.

`python -m` and `python -c` (multiprocessing's spawn children) put the current directory first on
sys.path, so from a source checkout its unbuilt `ncclprobe/` would shadow the installed one, whose
native parts exist only after an install. PYTHONSAFEPATH (Python >= 3.11) drops that entry, in the
children's children too; starting them in a directory of ours covers 3.10.
"""
from __future__ import annotations

import sys


def module_argv(module: str, *args) -> list[str]:
    """The command line that runs ncclprobe module `module` (e.g. "ncclprobe.bench.worker")."""
    return [sys.executable, "-m", module, *map(str, args)]


def module_env(env: dict[str, str]) -> dict[str, str]:
    """env for a process started with module_argv: the current directory never goes on sys.path."""
    return {**env, "PYTHONSAFEPATH": "1"}
