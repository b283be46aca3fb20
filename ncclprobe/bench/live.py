"""What `bench` prints while it measures: each size's rows the moment rank 0 has them, in nccl-tests'
layout (size, count, type, redop, root, then time, algbw, busbw and #wrong for out-of-place and for
in-place; src/common.cu), with a `mode` column added because bench times eager and CUDA-graph calls.
A header opens each configuration and a footer closes it. Progress goes to stderr: one line rewritten
in place on a terminal, one plain line per configuration anywhere else (pipes, CI logs).

Plain fixed-width text, no rich: the rows keep nccl-tests' column order, so what reads its output
reads these; `#` starts every line that is not a row.
"""
from __future__ import annotations

import os
from typing import Any, TextIO

from ncclprobe.bench import allreduce
from ncclprobe.bench.report import realized_lines

TYPE_NAMES = {"bf16": "bfloat16", "fp16": "half", "fp32": "float"}  # nccl-tests' -d spellings
_LEFT = (("size", "(B)", 12), ("count", "(elements)", 12), ("type", "", 8), ("redop", "", 6),
         ("root", "", 6), ("mode", "", 6))
_PLACED = (("time", "(us)", 7), ("algbw", "(GB/s)", 6), ("busbw", "(GB/s)", 6), ("#wrong", "", 6))
_CLEAR = "\r\x1b[K"  # carriage return, erase to end of line (ECMA-48 EL)


def fit(value: float, width: int) -> str:
    """A number in `width` columns as nccl-tests fits them: two decimals, fewer when they do not
    fit, scientific notation when no fixed form does."""
    for digits in (2, 1, 0):
        text = f"{value:.{digits}f}"
        if len(text) <= width:
            return text.rjust(width)
    return f"{value:.0e}".rjust(width)


def _line(cells: list[str]) -> str:
    return "  ".join(cells)


def header() -> list[str]:
    """The three header lines of a row table: placements, names, units."""
    left = sum(w for *_, w in _LEFT) + 2 * len(_LEFT)
    span = sum(w for *_, w in _PLACED) + 2 * (len(_PLACED) - 1)
    names = _line([n.rjust(w) for n, _, w in _LEFT] + [n.rjust(w) for _ in (0, 1) for n, _, w in _PLACED])
    units = _line([u.rjust(w) for _, u, w in _LEFT] + [u.rjust(w) for _ in (0, 1) for _, u, w in _PLACED])
    places = " " * left + "out-of-place".center(span) + "  " + "in-place".center(span)
    return ["#" + line[1:].rstrip() for line in (places, names, units)]


def rows_text(rows: list[dict[str, Any]], nranks: int, dtype: str, checked: bool) -> list[str]:
    """One line per mode for one size: out-of-place cells, then in-place cells."""
    out = []
    for mode in ("eager", "graph"):
        placed = {r["inplace"]: r for r in rows if r["mode"] == mode}
        if not placed:
            continue
        first = next(iter(placed.values()))
        cells = [str(first["bytes"]).rjust(12), str(first["count"]).rjust(12), TYPE_NAMES[dtype].rjust(8),
                 allreduce.REDOP.rjust(6), str(allreduce.ROOT).rjust(6), mode.rjust(6)]
        for inplace in (False, True):
            r = placed.get(inplace)
            if r is None:
                cells += ["-".rjust(w) for *_, w in _PLACED]
                continue
            t = r["time_s"]
            cells += [fit(t * 1e6, 7), fit(allreduce.algbw(r["bytes"], t), 6),
                      fit(allreduce.busbw(r["bytes"], t, nranks), 6),
                      (str(r["wrong"]) if checked else "N/A").rjust(6)]
        out.append(_line(cells))
    return out


class Printer:
    """The matrix's watch (driver.run_matrix): rows to `out`, progress to `err`. `realize(run)` gives
    the configuration's realized algo/proto (report.realized) for its footer."""

    def __init__(self, out: TextIO | None, err: TextIO | None, *, intro: list[str], nranks: int, dtype: str,
                 checked: bool, basis: str, configs: list, nsizes: int, realize):
        self.out, self.err, self.intro = out, err, intro
        self.nranks, self.dtype, self.checked, self.basis = nranks, dtype, checked, basis
        self.configs, self.nsizes, self.realize = configs, nsizes, realize
        self.tty = err is not None and _isatty(err)
        self.progress = ""   # the progress line to show (terminal only)
        self.shown = False   # whether it is on the terminal now
        self.done_sizes = 0

    # -- output, tolerant of a reader that went away (`bench | head`) --------------------------
    def _write(self, stream_name: str, text: str) -> None:
        stream = getattr(self, stream_name)
        if stream is None:
            return
        try:
            stream.write(text)
            stream.flush()
        except (BrokenPipeError, ValueError):  # closed pipe or closed file: stop writing there
            setattr(self, stream_name, None)

    def _emit(self, lines: list[str]) -> None:
        """Lines on `out` with the progress line lifted off the terminal and put back after them."""
        if self.shown:
            self._write("err", _CLEAR)
            self.shown = False
        self._write("out", "".join(line + "\n" for line in lines))
        if self.tty and self.progress:
            self._write("err", self.progress[: _columns(self.err) - 1])  # one line, or \r cannot rewrite it
            self.shown = True

    def _progress(self, i: int) -> None:
        if self.tty:
            self.progress = (f"bench: config {i + 1}/{len(self.configs)} {self.configs[i].name}: "
                             f"{self.done_sizes}/{self.nsizes} sizes")

    # -- the watch ---------------------------------------------------------------------------
    def started(self, i: int, cfg) -> None:
        env = " ".join(f"{k}={v}" for k, v in sorted(cfg.env.items())) or "(NCCL defaults)"
        self.done_sizes = 0
        self._progress(i)
        intro, self.intro = [f"# {line}" for line in self.intro], []  # once, before the first configuration
        self._emit(intro + ["#", f"# config {i + 1}/{len(self.configs)} {cfg.name}: {env}"] + header())
        if not self.tty:
            self._write("err", f"bench: config {i + 1}/{len(self.configs)} {cfg.name}: {env}: "
                               f"{self.nsizes} sizes\n")

    def rows(self, i: int, rows: list[dict[str, Any]]) -> None:
        self.done_sizes += 1
        self._progress(i)
        self._emit(rows_text(rows, self.nranks, self.dtype, self.checked))

    def done(self, i: int, run) -> None:
        self.progress = ""
        sizes = len({r["bytes"] for r in run.rows})
        lines = [f"# {run.config.name}: {run.status}, {sizes} of {self.nsizes} sizes in {run.seconds:.1f} s"
                 + (f": {run.reason}" if run.reason else "")]
        if run.meta.get("out_of_place"):
            lines.append(f"# out-of-place = {run.meta['out_of_place']}")
        lines += [f"# {line}" for line in realized_lines(self.realize(run))]
        busbw = [allreduce.busbw(r["bytes"], r["time_s"], self.nranks) for r in run.rows if r["mode"] == self.basis]
        if busbw:  # nccl-tests' footer: the mean over every row, out-of-place and in-place
            lines.append(f"# Avg bus bandwidth    : {sum(busbw) / len(busbw):.6g} GB/s ({self.basis})")
        self._emit(lines)

    def interrupted(self, what: str) -> None:
        self.finish()
        self._write("err", f"bench: {what}; every worker was stopped; what was measured follows\n")

    def finish(self) -> None:
        self.progress = ""
        self._emit([""])  # the streamed rows end; the summary follows


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _columns(stream: TextIO) -> int:
    try:
        cols = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        cols = 0
    return cols if cols > 0 else 80  # a pty nobody sized (script, CI runners) reports 0
