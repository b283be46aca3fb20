"""Whole screens of `ncclprobe report` on a fixed log directory (tests/data/demo-run, a kept demo run),
at 80 and 120 columns: rendered to a plain stream, and captured from a real terminal (tmux
capture-pane). A change to what the report shows changes these files: regenerate them with
`NCCLPROBE_REGEN_GOLDEN=1 pytest tests/test_golden.py` and read the diff before committing it."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from ncclprobe import render

from ncclprobe.commands import report

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "demo-run"
GOLDEN = HERE / "golden"
REGEN = os.environ.get("NCCLPROBE_REGEN_GOLDEN") == "1"
EXPECT = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_MAX_NCHANNELS": "16"}


def _check(name: str, text: str) -> None:
    path = GOLDEN / name
    if REGEN:
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed (NCCLPROBE_REGEN_GOLDEN=1 rewrites it; read the diff)"


def _plain(width: int) -> str:
    result = report.build_report(["data/demo-run"], expect=EXPECT)
    out = io.StringIO()
    render.render_text(result, out, width=width, color=False)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"


@pytest.fixture
def in_tests_dir(monkeypatch):
    monkeypatch.chdir(HERE)  # the report names its directory as given: relative, the same on every machine


@pytest.mark.parametrize("width", [80, 120])
def test_report_piped(in_tests_dir, width):
    text = _plain(width)
    assert max(len(line) for line in text.splitlines()) <= width
    _check(f"report-{width}.txt", text)


def _tmux(width: int, command: str) -> str:
    """What a terminal of `width` columns shows after command ran (tmux, plain text of the pane)."""
    sock = f"ncclprobe-golden-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    done = f"done-{sock}"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX")}
    env["TERM"] = "xterm-256color"
    try:
        subprocess.run([*tmux, "new-session", "-d", "-x", str(width), "-y", "500", "-c", str(HERE),
                        f"{command}; tmux -L {sock} wait-for -S {done}; sleep 600"], check=True, env=env, timeout=30)
        subprocess.run([*tmux, "wait-for", done], check=True, timeout=120)
        pane = subprocess.run([*tmux, "capture-pane", "-p", "-S", "0", "-E", "-"], check=True, capture_output=True,
                              text=True, timeout=30).stdout
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=30)
    lines = [line.rstrip() for line in pane.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(shutil.which("tmux") is None or shutil.which("ncclprobe") is None,
                    reason="needs tmux and the installed ncclprobe script")
@pytest.mark.parametrize("width", [80, 120])
def test_report_in_a_real_terminal(width):
    expects = " ".join(f"--expect {k}={v}" for k, v in EXPECT.items())
    text = _tmux(width, f"{shutil.which('ncclprobe')} report data/demo-run {expects}")
    assert max(len(line) for line in text.splitlines()) <= width
    assert "Verdict:" in text.splitlines()[5] or any(ln.startswith("Verdict:") for ln in text.splitlines()[:8])
    _check(f"report-tty-{width}.txt", text)
