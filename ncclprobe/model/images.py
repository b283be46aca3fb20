"""What a process's command line says it runs (its image), as every witness and rule reads it."""
from __future__ import annotations


def runs_forkserver(argv) -> bool:
    """Whether a command line is multiprocessing's forkserver."""
    return any("multiprocessing.forkserver" in a for a in argv or ())


# programs that exec the command they are given (after their own options): their pid runs that command next
EXEC_WRAPPERS = frozenset({"env", "nohup", "nice", "ionice", "stdbuf", "setsid", "taskset", "numactl", "chrt"})
_TAKES_VALUE = frozenset({"-u", "--unset", "-C", "--chdir", "-n", "--adjustment", "-c", "--class", "-p", "-o", "-e",
                          "-i", "--cpu-nodebind", "--membind", "--physcpubind", "--interleave", "-S"})


def wraps_a_program(argv) -> bool:
    """Whether an exec wrapper's command line names a program to exec (`env -i A=1 python3 w.py`: yes; `env`
    alone, which prints the environment: no). A word that is neither an option (nor an option's value) nor a
    NAME=VALUE assignment is the program; witnesses/shells.wrapped_command parses the same line fully."""
    args = list(argv or ())[1:]
    wrapper = str((argv or [""])[0]).rsplit("/", 1)[-1]
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return i + 1 < len(args)
        if a.startswith("-"):
            i += 2 if a in _TAKES_VALUE and not (wrapper == "env" and a == "-i") else 1
            continue
        if wrapper == "env" and "=" in a:
            i += 1
            continue
        if wrapper in ("taskset", "chrt") and a.replace(",", "").replace("-", "").isalnum() and a[0].isdigit():
            i += 1  # the mask or the priority
            continue
        return True
    return False
