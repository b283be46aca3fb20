"""Draws a Result: rich on a terminal, plain text when piped, JSON with --json (only rich importer).

Text is laid out here, not by rich's wrapping: lines break at spaces only, and a word wider than its
room (a path, a variable name) moves to a line of its own, whole, even where that line is wider than
the screen (a terminal then wraps it without cutting what is copied from it). No line ends in a space."""
from __future__ import annotations

import json
import os
import re
import sys
from typing import TextIO

from rich import box
from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text as RichText

from ncclprobe.doc import FindingsHere, Grid, Records, Result, Table, Text, Title, Tree
from ncclprobe.diagnose.findings import sort_findings

PIPE_WIDTH = 80  # neither COLUMNS nor a terminal: the width terminals open at (README, "Output")
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


def console(stream: TextIO | None = None, width: int | None = None, color: bool | None = None) -> Console:
    """A console on stream, as wide as width_of(stream). Styled (colour, bold, box drawing) when the caller
    says so (`color`), else when stream is a terminal or FORCE_COLOR is set (any non-empty value,
    force-color.org: colour even when piped). NO_COLOR (any non-empty value, no-color.org) takes the
    colour away whatever else is set: it wins over FORCE_COLOR, and a terminal keeps bold and layout."""
    stream = stream or sys.stdout
    no_color = bool(os.environ.get("NO_COLOR")) if color is None else not color
    forced = bool(os.environ.get("FORCE_COLOR")) and not no_color
    styled = (_isatty(stream) or forced) if color is None else color
    return Console(file=_Trimmed(stream), width=width or width_of(stream), force_terminal=styled,
                   no_color=no_color or not styled, color_system="auto" if styled else None, highlight=False,
                   soft_wrap=False, emoji=False)


def width_of(stream: TextIO) -> int:
    """COLUMNS when set, else the terminal's width, else PIPE_WIDTH (piped; a pty nobody sized reports 0)."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(stream.fileno()).columns or PIPE_WIDTH
    except (AttributeError, OSError, ValueError):  # not a terminal, or no descriptor (StringIO)
        return PIPE_WIDTH


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # ValueError: a closed file
        return False


_TRAILING = re.compile(r"(?:[ \t]|\x1b\[[0-9;]*m)+$")  # spaces at a line's end, among rich's style codes


def _rstrip(line: str) -> str:
    """The line without its trailing spaces; the style codes among them stay (a reset must still reset)."""
    if line[-1:] not in (" ", "\t", "m"):
        return line
    m = _TRAILING.search(line)
    return line if m is None else line[:m.start()] + "".join(re.findall(r"\x1b\[[0-9;]*m", m.group()))


class _Trimmed:
    """What rich writes to: every line without its trailing spaces (rich pads table cells to the width)."""

    def __init__(self, stream: TextIO):
        self.stream, self.pending = stream, ""

    def write(self, text: str) -> int:
        lines = (self.pending + text).split("\n")
        self.pending = lines.pop()  # a line goes out when its end is known
        if lines:
            self.stream.write("".join(_rstrip(line) + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def finish(self) -> None:
        """The last line, when it has no newline (rich ends every print with one)."""
        if self.pending:
            self.stream.write(_rstrip(self.pending))
            self.pending = ""
        self.stream.flush()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def render_json(result: Result, stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    json.dump(result.to_json(), stream, indent=2, default=str)
    stream.write("\n")


def answer_line(result: Result, code: int) -> str:
    """The one-line answer a terminal shows last (so it is on screen when the command ends)."""
    levels = [f.severity for f in result.findings]
    counts = ", ".join(f"{levels.count(s)} {s}{'s' if levels.count(s) != 1 else ''}" for s in ("error", "warning", "info")
                       if s in levels)
    what = f"{len(levels)} cause{'s' if len(levels) != 1 else ''} ({counts})" if levels else "no findings"
    cmd = result.data.get("returncode")
    whose = f" (CMD {result.data.get('exit_status')})" if cmd not in (None, 0) and code else ""
    return f"Answer: {what} · exit {code}{whose}"


def render_text(result: Result, stream: TextIO | None = None, width: int | None = None,
                color: bool | None = None, answer_code: int | None = None) -> None:
    """answer_code: the exit status, to end with the one-line answer (a terminal's last line)."""
    con = console(stream, width, color)
    drawn = False
    for i, node in enumerate(result.doc):
        if isinstance(node, FindingsHere):
            _findings(con, result)
            drawn = True
        else:
            if isinstance(node, Title) and i:
                con.print()  # a blank line between sections, not before the first
            _node(con, node)
    if not drawn:
        _findings(con, result)
    if answer_code is not None:
        con.print()
        _out(con, _para(answer_line(result, answer_code), con.width, "bold"))
    con.file.finish()


def _node(con: Console, node) -> None:
    if isinstance(node, Title):
        _out(con, _para(node.text, con.width, "bold"))
    elif isinstance(node, Text):
        _out(con, _para(node.text, con.width, _STYLES.get(node.style, "")))
    elif isinstance(node, Table) and node.compact:
        _compact(con, node)
    elif isinstance(node, Table):
        _table(con, node)
    elif isinstance(node, Tree):
        _out(con, _tree(node, con.width))
    elif isinstance(node, Grid):
        _out(con, _grid(node.rows, con.width))
    elif isinstance(node, Records):
        lines = _para(node.title, con.width, "bold") if node.title else []
        for heading, fields in node.items:
            lines += _para(heading, con.width, "bold")
            lines += _grid(fields, con.width, indent=2)
        _out(con, lines)


def _out(con: Console, lines: list[RichText]) -> None:
    """Lines laid out here, printed as they are: rich neither wraps nor crops them again."""
    if lines:
        con.print(RichText("\n").join(lines), soft_wrap=True)


# -- layout: lines break at spaces only; a word wider than its room is a line of its own, whole ----------
_WORD = re.compile(r"\s*\S+\s*")  # a word with the spaces after it (and, first, those before it)
MIN_COLUMN = 16  # a grid's text column narrower than this goes under its label instead


def wrap(text: str, width: int) -> list[str]:
    """text in lines of at most width cells, broken at spaces; a word wider than width stays whole on a
    line of its own (a path, a variable name: cut, it would read as two). No line ends in a space."""
    lines, line, used = [], "", 0
    for word in _WORD.findall(text):
        bare = cell_len(word.rstrip())
        if line and used + bare > width:
            lines.append(line.rstrip())
            word = word.lstrip()
            line, used = "", 0
        line += word
        used += cell_len(word)
    return [*lines, line.rstrip()]


def _para(text, width: int, style: str = "") -> list[RichText]:
    """text wrapped to width; an indented paragraph keeps its indent on every line."""
    text = clean(text)
    body = text.lstrip(" ")
    if len(text) - len(body) >= width // 2:  # too deep to hang the rest under: only the first line is indented
        return [RichText(line, style=style) for line in wrap(text, width)]
    indent = text[:len(text) - len(body)]
    return [RichText(indent + line if line else line, style=style) for line in wrap(body, width - len(indent))]


def _grid(rows, width: int, indent: int = 0) -> list[RichText]:
    """Label / text rows, the text wrapped under itself; a word too wide for the text column moves to a
    line of its own below the label (all of them do when the column is narrower than MIN_COLUMN)."""
    rows = [(clean(label), clean(text)) for label, text in rows]
    label_w = max((cell_len(label) for label, _ in rows), default=0)
    at = indent + label_w + 2
    room = width - at
    stacked = room < MIN_COLUMN
    label_style = "bold" if indent == 0 else ""
    out = []
    for label, text in rows:
        lines = wrap(text, room) if not stacked else wrap(text, width - indent - 4)
        head = RichText(" " * indent + label, style=label_style)
        if stacked or cell_len(lines[0]) > room:
            out.append(head)
        else:
            head.append(" " * (label_w - cell_len(label) + 2) + lines.pop(0))
            out.append(head)
        out += [RichText(" " * (at if not stacked and cell_len(line) <= room else indent + 4) + line)
                for line in lines]
    return out


def _tree(node: Tree, width: int, first: str = "", rest: str = "") -> list[RichText]:
    """A tree with rich's guides; a label wraps under itself, after its guides."""
    style = _STYLES.get(node.style, "")
    out = []
    for i, line in enumerate(wrap(clean(node.label), max(width - cell_len(rest), 1))):
        out.append(RichText.assemble((first if i == 0 else rest, "dim"), (line, style)))
    for i, child in enumerate(node.children):
        last = i == len(node.children) - 1
        out += _tree(child, width, rest + ("└── " if last else "├── "), rest + ("    " if last else "│   "))
    return out


def fit_columns(rows: list[list[str]], room: int) -> list[int] | None:
    """Column widths summing to at most room, none narrower than its column's longest word, each as near
    its widest cell as room allows (spare cells shared out evenly); None when the words alone do not fit."""
    cols = list(zip(*rows))
    widths = [max([1, *(cell_len(w) for cell in col for w in cell.split())]) for col in cols]
    wants = [max(cell_len(cell) for cell in col) for col in cols]
    spare = room - sum(widths)
    if spare < 0:
        return None
    while spare > 0:
        short = [i for i, w in enumerate(widths) if w < wants[i]]
        if not short:
            break
        share = max(spare // len(short), 1)
        for i in short:
            add = min(share, wants[i] - widths[i], spare)
            widths[i] += add
            spare -= add
    return widths


def _table(con: Console, node: Table) -> None:
    """A bordered table whose columns never cut a word; one block per row instead (its first cell, then
    column / cell lines) when the words alone are wider than the screen, or the blocks take fewer lines."""
    plain = not con.is_terminal
    columns = [clean(c) for c in node.columns]
    rows = [[clean(c) for c in row] for row in node.rows]
    if node.title:
        _out(con, _para(node.title, con.width, "italic"))
    cells = [columns, *rows] if any(columns) else rows
    widths = fit_columns(cells, con.width - 3 * len(columns) - 1) if cells else []  # borders and padding
    blocks = _blocks(columns, rows, con.width)
    if widths is None or len(blocks) < _rows_height(rows, widths):  # columns squeezed past their use
        _out(con, blocks)
    else:
        t = RichTable(box=box.ASCII if plain else box.SIMPLE_HEAVY, show_header=any(columns), show_lines=False)
        for col, w in zip(columns, widths):
            t.add_column(RichText(col), width=w, overflow="fold")  # every word fits its width: fold never cuts
        for row in rows:
            t.add_row(*(RichText(c) for c in row))
        con.print(t)
    if node.caption:
        _out(con, _para(node.caption, con.width, "italic dim"))


def _rows_height(rows: list[list[str]], widths: list[int]) -> int:
    """Lines the rows of a table take as their cells wrap (its header and borders not counted)."""
    return sum(max(len(wrap(c, w)) for c, w in zip(row, widths)) for row in rows)


def _blocks(columns: list[str], rows: list[list[str]], width: int) -> list[RichText]:
    """A table as one block per row, as Records draws an item: the first cell, then column / cell lines."""
    return [line for row in rows
            for line in _para(row[0], width, "bold") + _grid(list(zip(columns[1:], row[1:])), width, indent=2)]


def _compact(con: Console, node: Table) -> None:
    lines = _para(node.title, con.width) if node.title else []
    for i, line in enumerate(compact_lines(node, con.width)):
        lines.append(RichText(line, style="bold" if i == 0 else ""))
    if node.caption:
        lines += _para(node.caption, con.width)
    _out(con, lines)


def _findings(con: Console, result: Result) -> None:
    w = con.width
    if result.findings:
        n = len(result.findings)
        lines = [RichText(""), RichText.assemble(("Findings", "bold"), f" ({n} cause{'s' if n != 1 else ''})")]
        for f in sort_findings(result.findings):
            lines += _para(f"[{f.severity.upper()}] {f.code}: {shorten_paths(f.message)}", w,
                           _SEVERITY_STYLE[f.severity])
            scope = scope_line(f)
            if scope:
                lines += _para(f"    scope: {scope}", w)
            for k, v in ({} if result.brief else f.evidence).items():
                if k in ("t", "merged", "fleet") or k.endswith("_at") and isinstance(v, float):
                    continue  # unix times and per-instance evidence: in --json, not worth a line here
                if isinstance(v, str) and len(v) > 12 and v in f.message:
                    continue  # already in the message
                lines += _para(f"    {k}: {shorten_paths(_short(v))}", w)
            if f.hint and not result.brief:
                lines += _para(f"    hint: {shorten_paths(f.hint)}", w, "green")
        _out(con, lines)
    elif result.command in DIAGNOSING and not result.data.get("incomplete") and \
            not (result.data.get("verdict") or {}).get("unchecked") and \
            any(isinstance(n, (Table, Tree, Records, Grid)) for n in result.doc):  # an interrupted run proves nothing
        con.print()
        con.print("No findings.")


_INSTALLED = re.compile(r"(?<![^\s'\"`=:,;(\[{])/[^\s'\"`=:,;(\[{]*/(?:site|dist)-packages/")  # starts apart: linear


def shorten_paths(text: str) -> str:
    """Paths inside an installed package, from the package down (--json keeps them whole)."""
    return _INSTALLED.sub("…/", text)


def scope_line(f) -> str:
    """Everything a finding covers, in one line: pids, ranks, communicators, hosts. Over several hosts:
    the outliers host → rank → pid; over more than three, how many are alike (the JSON names each)."""
    from ncclprobe.model import ranges
    insts = f.instances
    pids = sorted({i["pid"] for i in insts if isinstance(i.get("pid"), int)}) or list(f.pids)
    ranks = sorted({i["rank"] for i in insts if isinstance(i.get("rank"), int)})
    comms = sorted({str(i["comm"]) for i in insts if i.get("comm")})
    comm = (("comm " if len(comms) == 1 else f"{len(comms)} comms: ") + ", ".join(comms[:3])
            + ("…" if len(comms) > 3 else "")) if comms else ""
    hosts = f.hosts
    if len(hosts) > 3:  # a fleet: how many alike, not every pid of every host
        parts = [f"{len(hosts)} hosts alike", f"{len(pids)} processes"]
        if ranks:
            parts.append(("rank " if len(ranks) == 1 else "ranks ") + ranges(ranks))
        return " · ".join(parts + ([comm] if comm else []))
    if len(hosts) > 1:
        per_host = []
        for h in hosts:
            mine = [i for i in insts if i.get("host") == h]
            hr = sorted({i["rank"] for i in mine if isinstance(i.get("rank"), int)})
            hp = sorted({i["pid"] for i in mine if isinstance(i.get("pid"), int)})
            rank = (("rank " if len(hr) == 1 else "ranks ") + ranges(hr) + " ") if hr else ""
            per_host.append(f"{h}: {rank}({'pid' if len(hp) == 1 else 'pids'} {ranges(hp)})")
        return " · ".join(["; ".join(per_host)] + ([comm] if comm else []))
    parts = []
    if pids:
        parts.append(("pid " if len(pids) == 1 else "pids ") + (ranges(pids) if len(pids) > 2 else ", ".join(map(str, pids))))
    if ranks and not (ranks == [0] and all(i.get("rank") in (0, None) for i in insts) and len(pids) == 1):
        parts.append(("rank " if len(ranks) == 1 else "ranks ") + ranges(ranks))
    if comm:
        parts.append(comm)
    if hosts:
        parts.append(f"host {hosts[0]}")
    return " · ".join(parts)


def _short(value, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def compact_lines(node: Table, width: int) -> list[str]:
    """A table one line per row, columns two spaces apart; the last column is cut to the width, and says
    so with an ellipsis (command lines: --json has them whole)."""
    rows = [[clean(c) for c in r] for r in [node.columns, *node.rows]]
    widths = [max(cell_len(r[i]) for r in rows) for i in range(len(node.columns) - 1)]
    room = max(width - sum(widths) - 2 * len(widths), 12)
    out = []
    for r in rows:
        last = r[-1] if cell_len(r[-1]) <= room else set_cell_size(r[-1], room - 1) + "…"
        out.append("  ".join([*(c + " " * (w - cell_len(c)) for c, w in zip(r, widths)), last]).rstrip())
    return out


def error(message: str, hint: str = "") -> None:
    con = console(sys.stderr)
    # one line each, whatever the width: scripts grep them, terminals wrap them
    con.print(RichText(f"error: {clean(message)}", style="bold red" if con.is_terminal else ""), soft_wrap=True)
    if hint:
        con.print(RichText(f"hint: {clean(hint)}"), soft_wrap=True)
    con.file.finish()
