"""What commands return: a Result with JSON data and a small document that render.py draws.

The core never formats for a terminal; it describes what to show (titles, tables, trees, notes) and
render.py, the only rich importer, turns that into a terminal view or plain text.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from ncclprobe import SCHEMA
from ncclprobe.findings import Finding, exit_code, sort_findings


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


@dataclass
class Result:
    """One command's outcome: findings, extra JSON keys, the document to draw, and its exit code."""
    command: str
    findings: list[Finding] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    doc: list[Node] = field(default_factory=list)
    code: int | None = None  # None: derived from findings

    def exit_code(self, strict: bool = False) -> int:
        return self.code if self.code is not None else exit_code(self.findings, strict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": SCHEMA, "command": self.command,
                               "findings": [f.to_json() for f in sort_findings(self.findings)]}
        out.update(self.data)
        return out


class Unexaminable(Exception):
    """The target cannot be examined at all (exit 3): no such process, no log directory, no GPU."""

    def __init__(self, message: str, reason: str = "", data: dict[str, Any] | None = None):
        super().__init__(message)
        self.reason = reason
        self.data = data or {}
