"""Environment assignments as users write them: `K=V` on a command line and `.env` files."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class AssignmentError(ValueError):
    """A malformed assignment; the message names the offending text (and line, for files)."""


def parse_assignment(text: str, where: str = "", echo: bool = True) -> tuple[str, str]:
    """`K=V` -> (K, V); the value may be empty, the name must be a valid variable name. With
    echo=False (file contents, which may hold secrets) the error names the place, not the text."""
    prefix = f"{where}: " if where else ""
    if "=" not in text:
        raise AssignmentError(f"{prefix}expected NAME=VALUE" + (f", got {text!r}" if echo else ""))
    name, value = text.split("=", 1)
    name = name.strip()
    if not NAME_RE.match(name):
        raise AssignmentError(f"{prefix}" + (f"{name!r} is" if echo else "the name is")
                              + " not a valid environment variable name")
    return name, value


def parse_assignments(items, where: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        k, v = parse_assignment(item, where)
        out[k] = v
    return out


def parse_env_text(text: str, source: str = "<text>") -> dict[str, str]:
    """A `.env` file: `K=V` lines, `export K=V`, quotes, comments and blank lines."""
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        where = f"{source}:{lineno}"
        name, value = parse_assignment(line, where, echo=False)
        value = value.strip()
        if value[:1] in ("'", '"'):
            try:
                parts = shlex.split(value, comments=True)
            except ValueError as exc:
                raise AssignmentError(f"{where}: {exc}") from None
            value = parts[0] if parts else ""
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        out[name] = value
    return out


def read_env_file(path: str | Path) -> dict[str, str]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as exc:
        raise AssignmentError(f"{p}: cannot read ({exc.strerror or exc})") from None
    return parse_env_text(text, str(p))
