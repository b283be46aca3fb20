"""What a process's command line says it runs (its image), as every witness and rule reads it."""
from __future__ import annotations

import os
import re
import shlex


def runs_forkserver(argv) -> bool:
    """Whether a command line is multiprocessing's forkserver."""
    return any("multiprocessing.forkserver" in a for a in argv or ())


# programs that exec the command they are given (after their own options): their pid runs that command next
EXEC_WRAPPERS = frozenset({"env", "nohup", "nice", "ionice", "stdbuf", "setsid", "taskset", "numactl", "chrt"})
# The wrappers' options that take the next word as their value (not the command), and the word some take
# before the command (`timeout 10 CMD`, `taskset 0x3 CMD`, `taskset -c 0-3 CMD`: -c makes the mask a list,
# `chrt 10 CMD`): one table for the shell's command lines (witnesses/shells) and for an exec's argv (here).
WRAPPER_OPTION_ARGS = {
    "env": {"-u", "--unset", "-C", "--chdir", "-S", "--split-string"},
    "sudo": {"-u", "--user", "-g", "--group", "-C", "--close-from", "-D", "--chdir", "-h", "--host", "-p", "--prompt",
             "-r", "--role", "-t", "--type", "-U", "--other-user", "-T", "--command-timeout"},
    "su": {"-c", "--command", "-s", "--shell", "-g", "--group", "-G", "--supp-group", "-w", "--whitelist-environment"},
    "runuser": {"-c", "--command", "-s", "--shell", "-g", "--group", "-G", "--supp-group", "-w",
                "--whitelist-environment", "-u", "--user"},
    "nice": {"-n", "--adjustment"}, "ionice": {"-c", "-n", "-p", "--class", "--classdata"},
    "taskset": set(), "chrt": set(), "timeout": {"-s", "--signal", "-k", "--kill-after"},
    "numactl": {"-m", "--membind", "-N", "--cpunodebind", "-C", "--physcpubind", "-i", "--interleave", "-p",
                "--preferred", "-P", "--preferred-many", "-w", "--weighted-interleave"},
    "stdbuf": {"-i", "-o", "-e"}}
WRAPPER_POSITIONAL = {"timeout": r"^\d", "taskset": r"^(0[xX])?[0-9a-fA-F][0-9a-fA-F,:-]*$", "chrt": r"^\d+$"}
ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


def unwrap(wrapper: str, words: list[str]) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """One wrapper's arguments (`words`: its argv after its name) as (its options, each with its value; the
    NAME=VALUE words it passes on itself (env, sudo); the words after them: the command it runs, first). `env -S
    'python3 -u' w.py` runs python3 -u w.py."""
    options: list[str] = []
    given: list[tuple[str, str]] = []
    takes = WRAPPER_OPTION_ARGS.get(wrapper, set())
    while words and (words[0].startswith("-") or (wrapper in ("env", "sudo") and ASSIGN.match(words[0]))):
        m = ASSIGN.match(words[0])
        if m:
            given.append((m.group(1), m.group(2)))
        else:
            options.append(words[0])
            if words[0] in takes and len(words) > 1:
                options.append(words[1])
                words = words[1:]
            if words[0] == "--":
                words = words[1:]
                break
        words = words[1:]
    if wrapper in WRAPPER_POSITIONAL and words and re.match(WRAPPER_POSITIONAL[wrapper], words[0]):
        options.append(words[0])
        words = words[1:]
    split = next((options[k + 1] for k, o in enumerate(options[:-1]) if o in ("-S", "--split-string")), None)
    if wrapper == "env" and split is not None:
        try:
            words = [*shlex.split(split), *words]
        except ValueError:  # an unclosed quote: env itself refuses it
            pass
    return options, given, list(words)


def option_values(options, short: str, long: str) -> list[str]:
    """The values of a wrapper's option (`-u A`, `-uA`, `--unset A`, `--unset=A`) among its options (unwrap's
    first), in order."""
    out, it = [], iter(options)
    for o in it:
        if o in (short, long):
            out.append(next(it, ""))
        elif o.startswith(long + "="):
            out.append(o.split("=", 1)[1])
        elif o.startswith(short) and not o.startswith("--") and len(o) > len(short):
            out.append(o[len(short):])
    return [v for v in out if v]


def wraps_a_program(argv) -> bool:
    """Whether an exec wrapper's command line names a program to exec (`env -i A=1 python3 w.py`: yes; `env`
    alone, which prints the environment: no)."""
    argv = [str(a) for a in argv or ()]
    return bool(argv) and bool(unwrap(os.path.basename(argv[0]), argv[1:])[2])
