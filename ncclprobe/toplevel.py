"""The console entry point. `ncclprobe -h` / `--help` is answered here, without click: importing
click alone costs three to four interpreter starts (it imports `inspect`, `typing`, `enum`, ...), and
the top-level help should cost about one. Everything else goes to cli.py, the click command line.
Both take the description and each command's summary from about.py (tests/test_cli_toplevel.py checks
that every command is listed, with the first sentence of its own help).
"""
from __future__ import annotations

import os
import sys

from ncclprobe import stdstreams
from ncclprobe.about import ABOUT, COMMANDS, EXIT_CODES, OUTPUT

OPTIONS = (("--version", "Show the version and exit."), ("-h, --help", "Show this message and exit."))


def width(columns: int | None = None) -> int:
    """As click sizes its help: the terminal's columns (COLUMNS first, 80 when not a terminal), at most
    100, less 2, at least 50."""
    if columns is None:
        try:
            columns = int(os.environ.get("COLUMNS", ""))
        except ValueError:
            columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 80
    return max(min(columns, 100) - 2, 50)


def help_text(columns: int | None = None) -> str:
    """The top-level help for a terminal of that many columns (default: this one)."""
    w = width(columns)
    out = ["Usage: ncclprobe [OPTIONS] COMMAND [ARGS]...", ""]
    out += [f"  {line}" for line in _wrap(ABOUT, w - 2)]
    out += ["", *(f"  {line}" for line in _wrap(EXIT_CODES, w - 2)), ""]
    out += [f"  {line}" for line in _wrap(OUTPUT, w - 2)]
    out += ["", "Options:"]
    out += _table(OPTIONS, w)
    out += ["", "Commands:"]
    out += _table(COMMANDS.items(), w)
    return "\n".join(out) + "\n"


def _table(rows, w: int) -> list[str]:
    """Two columns, as click lays out its option and command lists."""
    rows = list(rows)
    first = max(len(name) for name, _ in rows) + 2
    lines = []
    for name, text in rows:
        wrapped = _wrap(text, max(w - first - 2, 10))
        lines.append(f"  {name:<{first}}{wrapped[0]}")
        lines += [" " * (first + 2) + more for more in wrapped[1:]]
    return lines


def _wrap(text: str, w: int) -> list[str]:
    """Greedy word wrap (textwrap would import re: a third of an interpreter start)."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > w:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return lines + [line] if line or not lines else lines


def main() -> None:
    stdstreams.guard()  # a reader that goes away never changes the exit code (stdstreams.py)
    if sys.argv[1:] in (["-h"], ["--help"]):
        sys.stdout.write(help_text())
        sys.stdout.flush()
        sys.exit(0)
    from ncclprobe.cli import run_cli
    run_cli()
