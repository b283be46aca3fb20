"""What commands return: a Result with JSON data and a small document that render.py draws.

The core never formats for a terminal; it describes what to show (titles, tables, trees, notes) and
render.py, the only rich importer, turns that into a terminal view or plain text. A Result holds
diagnose's findings, so this module sits above diagnose/ and model/: they return data and never import
it; the commands (and bench, demo, topo) build the document (tests/test_imports.py keeps it so).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Union

from ncclprobe import SCHEMA
from ncclprobe.diagnose.findings import Finding, exit_code, sort_findings


@dataclass
class Title:
    text: str


@dataclass
class Text:
    text: str
    style: str = ""  # "", "note", "warn", "dim", "good"


@dataclass
class Table:
    columns: list[str]
    rows: list[list[str]]
    title: str = ""
    caption: str = ""
    compact: bool = False  # one line per row, no borders; the last column is cut to fit the width


@dataclass
class Tree:
    label: str
    children: list["Tree"] = field(default_factory=list)
    style: str = ""


@dataclass
class Grid:
    """Label / text rows without borders; the text wraps under itself (the verdict block)."""
    rows: list[list[str]]


@dataclass
class Records:
    """One block per item — a heading line, then label / value lines — readable at any width where a
    table of many columns is not (communicators)."""
    items: list[tuple[str, list[tuple[str, str]]]]
    title: str = ""


@dataclass
class FindingsHere:
    """Where the findings are drawn (at the end of the document without one)."""


Node = Union[Title, Text, Table, Tree, Grid, Records, FindingsHere]


class Later(dict):
    """A dict whose keys `keys` are computed at their first read (a report's model as JSON: a fifth of a
    fleet's report, and drawn text never reads it). A plain dict to every reader: a read of one of `keys`,
    or of the whole, fills it first; a read of another key (render's data.get("verdict")) does not."""

    def __init__(self, later: Callable[[], dict[str, Any]], keys: tuple[str, ...], now: dict[str, Any]):
        super().__init__(now)
        self._later: Callable[[], dict[str, Any]] | None = later
        self._keys = frozenset(keys)

    def _fill(self) -> None:
        if self._later is not None:
            later, self._later = self._later, None
            now = dict(super().items())
            super().clear()
            super().update(later())
            super().update(now)

    def __getitem__(self, key):
        if key in self._keys:
            self._fill()
        return super().__getitem__(key)

    def get(self, key, default=None):
        if key in self._keys:
            self._fill()
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        return (self._later is not None and key in self._keys) or super().__contains__(key)

    def _filled(name):  # noqa: N805 (a method-maker, run while the class is built)
        plain = getattr(dict, name)

        def method(self, *args, **kwargs):
            self._fill()
            return plain(self, *args, **kwargs)
        method.__name__ = name
        return method

    for _name in ("__iter__", "__len__", "__eq__", "__repr__", "keys", "items", "values", "pop", "popitem",
                  "setdefault", "update", "copy", "__or__", "__reversed__"):
        locals()[_name] = _filled(_name)
    del _name, _filled
    __hash__ = None


@dataclass
class Result:
    """One command's outcome: findings, extra JSON keys, the document to draw, and its exit code."""
    command: str
    findings: list[Finding] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    doc: list[Node] = field(default_factory=list)
    code: int | None = None  # None: derived from findings
    brief: bool = False  # findings without their evidence (a report of many hosts without --details)

    def exit_code(self, strict: bool = False) -> int:
        return self.code if self.code is not None else exit_code(self.findings, strict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": SCHEMA, "command": self.command,
                               "findings": [f.to_json() for f in sort_findings(self.findings)]}
        out.update(self.data)
        return out


# `error.reason` in JSON output (stable codes; schemas/error.json lists them with these meanings).
ERROR_REASONS = {
    "usage_error": "the command line is wrong (exit 2)",
    "no_such_process": "a named PID is not running",
    "vanished": "the process exited while it was read",
    "permission": "the target belongs to another user, or ptrace rules forbid reading it",
    "hidepid": "/proc is mounted with hidepid and hides the process",
    "error": "the kernel refused the read for another reason (the message says which)",
    "no_log_directory": "a named log directory does not exist",
    "bad_log_directory": "a log directory is unsafe or unusable (symlink, another user's, not writable)",
    "nothing_to_read": "no log directory and no NCCL log was given",
    "empty_log_directory": "the log directories hold nothing usable",
    "no_nccl_log": "a named NCCL log cannot be read",
    "probe_library": "the probe library failed its self-check",
    "not_built": "a native part of ncclprobe is missing: reinstall",
    "no_interpreter": "--python does not name a working Python interpreter",
    "no_site_packages": "the interpreter has no site-packages to install into",
    "unknown_variable": "explain: the name is not in the catalog of NCCL variables (exit 2)",
    "no_torch": "torch is not installed (bench, demo --real)",
    "no_gpu": "no NVIDIA GPU is visible",
    "not_enough_gpus": "fewer GPUs than asked for",
    "no_nvml": "NVML cannot be loaded",
    "demo_failed": "the demo's server did not come up",
    "nothing_measured": "bench: every configuration failed",
    "command_not_found": "run: CMD cannot be found (exit 127)",
    "permission_denied": "run: CMD cannot be executed (exit 126)",
    "is_a_directory": "run: CMD names a directory (exit 126)",
    "not_a_directory": "run: a part of CMD's path is not a directory (exit 126)",
    "exec_format_error": "run: CMD is not an executable the kernel can start (exit 126)",
    "interpreter_not_found": "run: CMD's #! interpreter does not exist (exit 127)",
    "interrupted": "stopped by a signal before it finished",
}


def reason_code(reason: str) -> str:
    """A reason as its stable snake_case code ("no such process" -> "no_such_process")."""
    code = "".join(ch if ch.isalnum() else "_" for ch in (reason or "error").split(":")[0].strip().lower())
    code = "_".join(part for part in code.split("_") if part)
    return code if code in ERROR_REASONS else "error"


class Unexaminable(Exception):
    """The target cannot be examined at all (exit 3): no such process, no log directory, no GPU."""

    def __init__(self, message: str, reason: str = "", data: dict[str, Any] | None = None):
        super().__init__(message)
        self.reason = reason_code(reason)
        self.data = data or {}
