"""Draws a Result: rich on a terminal, plain text when piped, JSON with --json (only rich importer)."""
from __future__ import annotations

import json
import os
import sys
from typing import TextIO

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable
from rich.tree import Tree as RichTree

from ncclprobe.doc import Result, Table, Text, Title, Tree
from ncclprobe.findings import sort_findings

PIPE_WIDTH = 140
DIAGNOSING = {"inspect", "report", "run", "topo", "bench", "demo"}  # commands whose silence means "all clear"
_STYLES = {"": "", "note": "cyan", "warn": "yellow", "dim": "dim", "good": "green", "bad": "red"}
_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def console(stream: TextIO | None = None, width: int | None = None, color: bool | None = None) -> Console:
    stream = stream or sys.stdout
    tty = stream.isatty() if color is None else color
    if width is None and not stream.isatty():
        width = int(os.environ.get("COLUMNS", "0") or 0) or PIPE_WIDTH  # piped: don't squeeze tables to 80
    return Console(file=stream, width=width, force_terminal=tty, no_color=not tty,
                   color_system="auto" if tty else None, highlight=False, soft_wrap=False,
                   emoji=False)


def render_json(result: Result, stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    json.dump(result.to_json(), stream, indent=2, default=str)
    stream.write("\n")


def render_text(result: Result, stream: TextIO | None = None, width: int | None = None,
                color: bool | None = None) -> None:
    con = console(stream, width, color)
    plain = not con.is_terminal
    for node in result.doc:
        if isinstance(node, Title):
            con.print(f"[bold]{escape(node.text)}[/bold]" if not plain else node.text)
        elif isinstance(node, Text):
            con.print(escape(node.text), style=_STYLES.get(node.style, ""))
        elif isinstance(node, Table):
            con.print(_table(node, plain))
        elif isinstance(node, Tree):
            con.print(_tree(node))
    if result.findings:
        con.print()
        con.print("Findings" if plain else "[bold]Findings[/bold]")
        for f in sort_findings(result.findings):
            tag = f"[{f.severity.upper()}]"
            con.print(f"{escape(tag)} {f.code}: {escape(f.message)}",
                      style=_SEVERITY_STYLE[f.severity] if not plain else "")
            if f.pids:
                con.print(f"    pids: {', '.join(str(p) for p in f.pids)}")
            for k, v in f.evidence.items():
                if k == "t" or k.endswith("_at") and isinstance(v, float):
                    continue  # unix times: in --json, not worth a line here
                con.print(f"    {escape(str(k))}: {escape(_short(v))}")
            if f.hint:
                con.print(f"    hint: {escape(f.hint)}", style="green" if not plain else "")
    elif result.command in DIAGNOSING and any(isinstance(n, (Table, Tree)) for n in result.doc):
        con.print()
        con.print("No findings.")


def _short(value, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _table(node: Table, plain: bool) -> RichTable:
    t = RichTable(title=node.title or None, caption=node.caption or None,
                  box=box.ASCII if plain else box.SIMPLE_HEAVY, show_lines=False,
                  title_justify="left", caption_justify="left")
    for col in node.columns:
        t.add_column(col, overflow="fold")
    for row in node.rows:
        t.add_row(*(escape(str(c)) for c in row))
    return t


def _tree(node: Tree, parent: RichTree | None = None) -> RichTree:
    label = escape(node.label)
    style = _STYLES.get(node.style, "")
    branch = RichTree(label, style=style, guide_style="dim") if parent is None else parent.add(label, style=style)
    for child in node.children:
        _tree(child, branch)
    return branch


def error(message: str, hint: str = "") -> None:
    con = console(sys.stderr)
    con.print(f"error: {escape(message)}", style="bold red" if con.is_terminal else "")
    if hint:
        con.print(f"hint: {escape(hint)}")
