"""Draws a Result: rich on a terminal, plain text when piped, JSON with --json (only rich importer)."""
from __future__ import annotations

import json
import os
import re
import sys
from typing import TextIO

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable
from rich.tree import Tree as RichTree

from ncclprobe.doc import FindingsHere, Grid, Records, Result, Table, Text, Title, Tree
from ncclprobe.diagnose.findings import sort_findings

PIPE_WIDTH = 100  # piped output: COLUMNS if set, else this (README, "Output")
DIAGNOSING = {"inspect", "report", "run", "topo", "bench", "demo"}  # commands whose silence means "all clear"
_STYLES = {"": "", "note": "cyan", "warn": "yellow", "dim": "dim", "good": "green", "bad": "red"}
_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


# C0 controls, DEL and C1 controls from a target (argv, names, paths, values) never reach the terminal
# as such: ESC[2J or an OSC 8 link in a command line is shown, not obeyed
_CONTROLS = {i: f"\\x{i:02x}" for i in [*range(0x20), *range(0x7f, 0xa0)]}
_CONTROLS.update({0x09: "\\t", 0x0a: "\\n", 0x0d: "\\r"})
# lone surrogates: bytes of a non-UTF-8 argv (surrogateescape) shown as \xNN, never an encoding error
_CONTROLS.update({i: f"\\x{i - 0xdc00:02x}" if 0xdc80 <= i < 0xdd00 else f"\\u{i:04x}" for i in range(0xd800, 0xe000)})


def clean(text) -> str:
    text = str(text)
    return text if text.isprintable() else text.translate(_CONTROLS)


def _t(text) -> str:
    """Target-derived text, safe to print: controls made visible, rich markup escaped."""
    return escape(clean(text))


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
    drawn = False
    for i, node in enumerate(result.doc):
        if isinstance(node, FindingsHere):
            _findings(con, result, plain)
            drawn = True
        else:
            if isinstance(node, Title) and i:
                con.print()  # a blank line between sections, not before the first
            _node(con, node, plain)
    if not drawn:
        _findings(con, result, plain)


def _node(con: Console, node, plain: bool) -> None:
    if isinstance(node, Title):
        con.print(f"[bold]{_t(node.text)}[/bold]" if not plain else _t(node.text))
    elif isinstance(node, Text):
        con.print(_t(node.text), style=_STYLES.get(node.style, ""))
    elif isinstance(node, Table) and node.compact:
        for i, line in enumerate(compact_lines(node, con.width)):
            header = i == (1 if node.title else 0)
            con.print(_t(line), no_wrap=True, crop=True, overflow="ignore", style="bold" if header and not plain else "")
    elif isinstance(node, Table):
        con.print(_table(node, plain))
    elif isinstance(node, Tree):
        con.print(_tree(node))
    elif isinstance(node, Grid):
        con.print(_grid(node.rows))
    elif isinstance(node, Records):
        if node.title:
            con.print(f"[bold]{_t(node.title)}[/bold]" if not plain else _t(node.title))
        for heading, fields in node.items:
            con.print(_t(heading), style="bold" if not plain else "")
            con.print(_grid(fields, indent=2))


def _grid(rows, indent: int = 0) -> RichTable:
    g = RichTable.grid(padding=(0, 2), pad_edge=False)
    g.add_column(no_wrap=True, style="bold" if indent == 0 else "")
    g.add_column(overflow="fold")
    for label, text in rows:
        g.add_row(" " * indent + _t(str(label)), _t(str(text)))
    return g


def _findings(con: Console, result: Result, plain: bool) -> None:
    if result.findings:
        con.print()
        n = len(result.findings)
        con.print(f"Findings ({n} cause{'s' if n != 1 else ''})" if plain else f"[bold]Findings[/bold] ({n} cause{'s' if n != 1 else ''})")
        for f in sort_findings(result.findings):
            tag = f"[{f.severity.upper()}]"
            con.print(f"{_t(tag)} {f.code}: {_t(shorten_paths(f.message))}",
                      style=_SEVERITY_STYLE[f.severity] if not plain else "")
            scope = scope_line(f)
            if scope:
                con.print(f"    scope: {_t(scope)}")
            for k, v in f.evidence.items():
                if k in ("t", "merged") or k.endswith("_at") and isinstance(v, float):
                    continue  # unix times and per-instance evidence: in --json, not worth a line here
                if isinstance(v, str) and len(v) > 12 and v in f.message:
                    continue  # already in the message
                con.print(f"    {_t(str(k))}: {_t(shorten_paths(_short(v)))}")
            if f.hint:
                con.print(f"    hint: {_t(shorten_paths(f.hint))}", style="green" if not plain else "")
    elif result.command in DIAGNOSING and not result.data.get("incomplete") and \
            any(isinstance(n, (Table, Tree, Records, Grid)) for n in result.doc):  # an interrupted run proves nothing
        con.print()
        con.print("No findings.")


_INSTALLED = re.compile(r"(?<![^\s'\"`=:,;(\[{])/[^\s'\"`=:,;(\[{]*/(?:site|dist)-packages/")  # starts apart: linear


def shorten_paths(text: str) -> str:
    """Paths inside an installed package, from the package down (--json keeps them whole)."""
    return _INSTALLED.sub("…/", text)


def scope_line(f) -> str:
    """Everything a finding covers, in one line: pids, ranks, communicators, hosts."""
    from ncclprobe.model import ranges
    insts = f.instances
    pids = sorted({i["pid"] for i in insts if isinstance(i.get("pid"), int)}) or list(f.pids)
    parts = []
    if pids:
        parts.append(("pid " if len(pids) == 1 else "pids ") + (ranges(pids) if len(pids) > 8 else ", ".join(map(str, pids))))
    ranks = sorted({i["rank"] for i in insts if isinstance(i.get("rank"), int)})
    if ranks and not (ranks == [0] and all(i.get("rank") in (0, None) for i in insts) and len(pids) == 1):
        parts.append(("rank " if len(ranks) == 1 else "ranks ") + ranges(ranks))
    comms = sorted({str(i["comm"]) for i in insts if i.get("comm")})
    if comms:
        parts.append(("comm " if len(comms) == 1 else f"{len(comms)} comms: ") + ", ".join(comms[:3])
                     + ("…" if len(comms) > 3 else ""))
    hosts = f.hosts
    if len(hosts) > 1:
        parts.append(f"{len(hosts)} hosts: {', '.join(hosts[:3])}" + ("…" if len(hosts) > 3 else ""))
    elif hosts:
        parts.append(f"host {hosts[0]}")
    return " · ".join(parts)


def _short(value, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def compact_lines(node: Table, width: int) -> list[str]:
    """A table one line per row, columns two spaces apart; the last column is cut to the width."""
    rows = [node.columns, *node.rows]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(node.columns) - 1)]
    room = max(width - sum(widths) - 2 * len(widths), 12)
    out = [f"{node.title}"] if node.title else []
    for r in rows:
        last = str(r[-1])
        last = last if len(last) <= room else last[: room - 1] + "…"
        out.append("  ".join([*(str(c).ljust(w) for c, w in zip(r, widths)), last]).rstrip())
    if node.caption:
        out.append(node.caption)
    return out


def _table(node: Table, plain: bool) -> RichTable:
    t = RichTable(title=node.title or None, caption=node.caption or None,
                  box=box.ASCII if plain else box.SIMPLE_HEAVY, show_lines=False,
                  title_justify="left", caption_justify="left")
    for col in node.columns:
        t.add_column(col, overflow="fold")
    for row in node.rows:
        t.add_row(*(_t(str(c)) for c in row))
    return t


def _tree(node: Tree, parent: RichTree | None = None) -> RichTree:
    label = _t(node.label)
    style = _STYLES.get(node.style, "")
    branch = RichTree(label, style=style, guide_style="dim") if parent is None else parent.add(label, style=style)
    for child in node.children:
        _tree(child, branch)
    return branch


def error(message: str, hint: str = "") -> None:
    con = console(sys.stderr)
    # one line each, whatever the width: scripts grep them, terminals wrap them
    con.print(f"error: {_t(message)}", style="bold red" if con.is_terminal else "", soft_wrap=True)
    if hint:
        con.print(f"hint: {_t(hint)}", soft_wrap=True)
