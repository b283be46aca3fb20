"""Text from a target (argv, paths, values, names) never drives the user's terminal: control
characters are shown as \\xNN, and bytes that are not UTF-8 never make printing fail."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

from ncclprobe import render
from ncclprobe.doc import Result, Text
from ncclprobe.diagnose.findings import Finding

CLEAR = "\x1b[2J"
LINK = "\x1b]8;;http://attacker.example/\x07click\x1b]8;;\x07"


def test_controls_in_findings_and_documents_are_shown_not_obeyed():
    f = Finding("ENV_OVERRIDDEN", "warning", f"app.py:1 set NCCL_PROTO to {CLEAR}", pids=(1,), var="NCCL_PROTO",
                evidence={"new": LINK}, hint="look \x9b at it")
    for color in (False, True):  # piped, and a terminal (rich adds its own styling escapes there)
        out = io.StringIO()
        render.render_text(Result("report", findings=[f], doc=[Text(f"cmd {CLEAR}")]), out, width=100, color=color)
        text = out.getvalue()
        assert CLEAR not in text and "\x1b]8" not in text and "\x9b" not in text
        assert "\\x1b[2J" in text and "\\x1b]8;;http" in text and "\\x9b" in text


def test_lone_surrogates_print_under_strict_utf8():
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    render.render_text(Result("report", doc=[Text("arg\udcff")]), out, width=80, color=False)
    out.flush()
    assert b"arg\\xff" in out.buffer.getvalue()


def test_inspect_shows_an_escape_in_a_live_command_line_escaped():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", CLEAR, LINK])
    try:
        deadline = time.monotonic() + 30
        while CLEAR.encode() not in open(f"/proc/{child.pid}/cmdline", "rb").read():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = subprocess.run([sys.executable, "-m", "ncclprobe", "inspect", str(child.pid), "--scope", "all"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "\x1b" not in r.stdout and "\x07" not in r.stdout
        assert "\\x1b[2J" in r.stdout
        j = subprocess.run([sys.executable, "-m", "ncclprobe", "inspect", str(child.pid), "--json"],
                           capture_output=True, text=True, timeout=120)
        assert CLEAR in " ".join(json.loads(j.stdout)["processes"][0]["argv"])  # JSON keeps it, escaped by JSON
    finally:
        child.kill()
        child.wait()


def test_a_non_utf8_argument_does_not_break_run_under_a_strict_utf8_stdout(tmp_path):
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    r = subprocess.run([sys.executable, "-m", "ncclprobe", "run", "--dir", str(tmp_path / "d"), "--", sys.executable,
                        "-c", "pass", os.fsdecode(b"arg\xff")], capture_output=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert b"arg\\xff" in r.stdout
