"""Terminal conventions, on the installed command: colour follows NO_COLOR and FORCE_COLOR on a real terminal
(a pty of a given size) and piped; a reader of stdout that goes away never changes the exit code; the width
is COLUMNS, else the terminal's, else 80; words are never cut (a long one gets a line of its own); no line
ends in a space; every --help fits 80 columns; `explain VAR` has no empty header row; `report FILE` reads
an NCCL log as `report --nccl-log FILE` does."""
from __future__ import annotations

import fcntl
import io
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from ncclprobe import render
from ncclprobe.cli import main as cli
from ncclprobe.diagnose.findings import Finding
from ncclprobe.doc import Grid, Records, Result, Table, Text, Title, Tree

HERE = Path(__file__).resolve().parent
DEMO_RUN = HERE / "data" / "demo-run"
NCCL_LOG = HERE / "data" / "nccllog" / "nccl-2.28.log"
SGR = re.compile(r"\x1b\[([0-9;]*)m")
BROKEN = ("Traceback", "Exception ignored", "BrokenPipeError")
PATH = "/opt/venvs/serving-stack/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2"  # 84 columns
NAME = "NCCL_COMM_SPLIT_SHARE_RESOURCES"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")}
    return {**env, "TERM": "xterm-256color", **extra}


def ncclprobe(*args) -> list[str]:
    return [sys.executable, "-m", "ncclprobe", *map(str, args)]


def in_terminal(args: list[str], cols: int, env: dict[str, str], timeout: float = 120) -> tuple[int, str]:
    """Exit code and everything a terminal of `cols` columns received (stdout and stderr, escapes included)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 1)[0]:
                try:
                    data = os.read(master, 1 << 16)
                except OSError:  # EIO: the last slave descriptor is closed
                    break
                if not data:
                    break
                chunks.append(data)
        code = proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return code, b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


def colours(text: str) -> set[int]:
    """The colour parameters of the SGR sequences in text (30-38, 40-48, 90-97, 100-107); bold, dim and the
    resets are not colours."""
    found = set()
    for m in SGR.finditer(text):
        for p in (int(p) for p in m.group(1).split(";") if p):
            if p in (38, 48):
                found.add(p)
                break  # the rest are its arguments (5;N or 2;R;G;B)
            if 30 <= p <= 37 or 40 <= p <= 47 or 90 <= p <= 97 or 100 <= p <= 107:
                found.add(p)
    return found


def widest(text: str) -> int:
    """The widest line that could have been broken: a line holding one word (after its indent and tree
    guides) may be wider than the screen, as a path must stay whole."""
    plain = SGR.sub("", text)
    return max(len(line) for line in plain.splitlines() if " " in line.lstrip(" │├└─").strip())


def trailing_spaces(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.search(r"[ \t](?:\x1b\[[0-9;]*m)*$", line)]


# -- colour --------------------------------------------------------------------------------------------------

TTY_CASES = {  # environment -> what a terminal gets
    "": "colour", "NO_COLOR=1": "bold, no colour", "NO_COLOR=1 FORCE_COLOR=1": "bold, no colour",
    "NO_COLOR=": "colour", "FORCE_COLOR=1": "colour"}
PIPE_CASES = {  # environment -> what a pipe gets
    "": "plain", "FORCE_COLOR=1": "colour", "FORCE_COLOR=1 NO_COLOR=1": "plain", "FORCE_COLOR=": "plain",
    "FORCE_COLOR=1 NO_COLOR=": "colour"}


def _settings(text: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in text.split())


def _check_colour(out: str, expect: str) -> None:
    if expect == "colour":
        assert colours(out) and "\x1b[1m" in out, out[:300]
    elif expect == "bold, no colour":
        assert not colours(out) and "\x1b[1m" in out, out[:300]  # NO_COLOR is about colour: bold stays
    else:
        assert "\x1b" not in out and "━" not in out, out[:300]


@pytest.mark.parametrize("settings", TTY_CASES)
def test_colour_on_a_terminal(settings):
    code, out = in_terminal(ncclprobe("explain", "NCCL_PROTO"), 100, _env(**_settings(settings)))
    assert code == 0, out
    _check_colour(out, TTY_CASES[settings])


@pytest.mark.parametrize("settings", PIPE_CASES)
def test_colour_when_piped(settings):
    r = subprocess.run(ncclprobe("explain", "NCCL_PROTO"), capture_output=True, text=True, timeout=120,
                       env=_env(**_settings(settings)))
    assert r.returncode == 0, r.stderr
    _check_colour(r.stdout, PIPE_CASES[settings])


@pytest.mark.parametrize("settings, expect", [("", "colour"), ("NO_COLOR=1", "no colour")])
def test_error_lines_follow_the_same_rules(settings, expect, tmp_path):
    code, out = in_terminal(ncclprobe("report", tmp_path / "absent"), 100, _env(**_settings(settings)))
    assert code == 3 and "error: no such log directory" in SGR.sub("", out), out
    assert bool(colours(out)) == (expect == "colour"), out


# -- width ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cols", [60, 100])
def test_width_is_the_terminals(cols):
    code, out = in_terminal(ncclprobe("report", DEMO_RUN), cols, _env())
    assert code == 1 and "Verdict:" in out, out[-2000:]
    assert cols - 10 < widest(out) <= cols


def test_columns_wins_over_the_terminal():
    code, out = in_terminal(ncclprobe("report", DEMO_RUN), 100, _env(COLUMNS="70"))
    assert code == 1
    assert 60 < widest(out) <= 70


@pytest.mark.parametrize("columns, width", [("", 80), ("120", 120), ("64", 64)])
def test_width_when_piped(columns, width):
    r = subprocess.run(ncclprobe("report", DEMO_RUN), capture_output=True, text=True, timeout=120,
                       env=_env(**({"COLUMNS": columns} if columns else {})))
    assert r.returncode == 1, r.stderr
    assert width - 10 < widest(r.stdout) <= width


# -- words and spaces ----------------------------------------------------------------------------------------

def _document() -> Result:
    """Every kind of node render.py draws, each holding words too long to share a line at 40-80 columns."""
    finding = Finding("ENV_OVERRIDDEN", "warning", f"{PATH} was loaded where {NAME} is cached", pids=(7,),
                      var="NCCL_PROTO", evidence={"lib": PATH, "var": NAME}, hint=f"preload {PATH} first")
    doc = [Title(f"Libraries of {NAME} and the break-even point"),
           Text(f"The process mapped {PATH} (dynamic symbols) and read {NAME}; break-even at 3 tokens."),
           Grid([["library", f"{PATH} — dynamic symbols (hookable)"], ["variable", f"{NAME} read once"],
                 ["NCCL_PROTO", "LL (expected): 2 comms (0x3597dcfc, 0x5842c6ef, ranks 0-1) · unset: 1 comm"]]),
           Table(["variable", "read", "affects"], [[NAME, "per process", "whether split children share the "
                                                   "parent's resources"], ["NCCL_PROTO", "per communicator",
                                                   f"protocol; the break-even size; see {PATH}"]],
                 title="Known variables", caption=f"{NAME}: read once per process"),
           Table(["size", "break-even", "verdict"], [["1K", "2.5 tokens", "graph replay beats eager"]]),
           Tree(f"1201 python -m serve --lib {PATH} [root]",
                [Tree("env: exec", [Tree(f"{NAME}=1")]), Tree(f"libnccl 2.28.9 {PATH} — dynamic symbols")]),
           Records([(f"0x3597dcfc  ranks 0-1  {NAME}", [("library", PATH), ("ran", "AllReduce Ring/LL ch16 "
                                                                                   "14K-14K x1; break-even")])])]
    return Result("report", findings=[finding], doc=doc)


def _drawn(width: int, color: bool) -> str:
    out = io.StringIO()
    render.render_text(_document(), out, width=width, color=color)
    return out.getvalue()


@pytest.mark.parametrize("width", [40, 60, 80, 120])
@pytest.mark.parametrize("color", [False, True])
def test_words_are_never_cut(width, color):
    text, unwrapped = SGR.sub("", _drawn(width, color)), _drawn(1000, False)
    for word in (PATH, "…/nvidia/nccl/lib/libnccl.so.2", NAME, "break-even"):
        assert text.count(word) == unwrapped.count(word) > 0, (word, text)  # each whole, on one line
    assert widest(text) <= width  # only a line of one word is wider
    assert not trailing_spaces(_drawn(width, color))


def test_an_indented_paragraph_keeps_its_indent_on_every_line():
    out = io.StringIO()
    hint = f"  to check it: read {PATH} with the kernel's process events, or keep the probes in each call's environment"
    render.render_text(Result("report", doc=[Text(hint), Text("flush " * 20)]), out, width=40, color=False)
    lines = out.getvalue().splitlines()
    first = lines.index("  to check it: read")
    ours = lines[first:lines.index("flush flush flush flush flush flush")]
    assert len(ours) > 3 and all(x.startswith("  ") and not x.startswith("   ") for x in ours), lines
    assert " ".join(x.strip() for x in ours) == hint.strip()  # nothing lost, nothing cut
    assert all(len(x) <= 40 for x in ours if PATH not in x) and not trailing_spaces(out.getvalue())


ROWS = [[NAME, "per process", "whether split children share the parent's resources"],
        ["NCCL_PROTO", "per communicator", "protocol of every collective"],
        ["NCCL_ALGO", "per communicator", "algorithm of every collective"]]


def _table_at(width: int) -> list[str]:
    out = io.StringIO()
    render.render_text(Result("explain", doc=[Table(["variable", "read", "affects"], ROWS)]), out, width=width,
                       color=False)
    return out.getvalue().splitlines()


def test_a_table_keeps_its_columns_while_its_words_fit():
    lines = _table_at(90)
    assert lines[0].startswith("+-") and lines[1].startswith("| variable") and len(lines) == 8  # a row a line
    assert all(len(line) <= 90 for line in lines)
    lines = _table_at(80)  # the third column wraps: still a table (7 lines of rows against 9 of blocks)
    assert lines[1].startswith("| variable") and sum(NAME in line for line in lines) == 1
    assert all(len(line) <= 80 for line in lines) and len(lines) == 11


def test_a_table_squeezed_past_its_use_is_one_block_per_row():
    lines = _table_at(72)  # every row wraps: 10 lines of rows, where blocks take 9
    assert lines[:3] == [NAME, "  read     per process", "  affects  whether split children share the parent's resources"]


def test_a_table_too_wide_for_its_words_is_one_block_per_row():
    lines = _table_at(50)  # 31 + 16 + 10 columns of words, and borders: more than 50
    assert lines[:4] == [NAME, "  read     per process", "  affects  whether split children share the",
                         "           parent's resources"]
    assert not any("|" in line for line in lines)


def test_explain_list_names_every_variable_whole():
    names = [v["name"] for v in json.loads(subprocess.run(ncclprobe("explain", "--list", "--json"), capture_output=True,
                                                          text=True, timeout=120, env=_env()).stdout)["variables"]]
    for columns in ("60", "80", "120"):
        r = subprocess.run(ncclprobe("explain", "--list"), capture_output=True, text=True, timeout=120,
                           env=_env(COLUMNS=columns))
        tokens = set(re.findall(r"NCCL_\w+", r.stdout))
        assert set(names) <= tokens, (columns, set(names) - tokens)
        assert max(map(len, r.stdout.splitlines())) <= int(columns) and not trailing_spaces(r.stdout)


# -- a reader that goes away ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def target():
    """A process for `inspect`, with an NCCL variable in its environment."""
    proc = subprocess.Popen(["sleep", "600"], env={"NCCL_PROTO": "LL", "PATH": os.environ["PATH"]})
    yield proc.pid
    proc.kill()
    proc.wait()


def _commands(target: int, tmp: Path) -> dict[str, list]:
    return {
        "inspect": ["inspect", target],
        "report": ["report", DEMO_RUN],
        "report --json": ["report", DEMO_RUN, "--json"],
        "report FILE": ["report", NCCL_LOG],
        "explain": ["explain", "NCCL_PROTO"],
        "explain --list": ["explain", "--list"],
        "run": ["run", "--dir", tmp / "run", "--", "true"],
        "--help": ["--help"],
        "run --help": ["run", "--help"],
        "demo": ["demo"],
    }


def _fresh_run_dir(args: list, tmp: Path, tag: str) -> list:
    return [tmp / f"run-{tag}" if isinstance(a, Path) and a.name == "run" else a for a in args]


def _unpiped(args: list, tmp: Path) -> tuple[int, str]:
    """Exit code and output with stdout on a regular file: what a command does when nobody stops reading."""
    with open(tmp / "stdout", "w+") as out:
        r = subprocess.run(ncclprobe(*args), stdout=out, stderr=subprocess.PIPE, text=True, timeout=300, env=_env())
        out.seek(0)
        return r.returncode, out.read()


def _reader_gone_before(args: list) -> tuple[int, str]:
    """stdout is a pipe whose reader is gone before the first write: every write fails with EPIPE."""
    r_end, w_end = os.pipe()
    os.close(r_end)
    try:
        r = subprocess.run(ncclprobe(*args), stdout=w_end, stderr=subprocess.PIPE, text=True, timeout=300, env=_env())
    finally:
        os.close(w_end)
    return r.returncode, r.stderr


def _reader_of_one_line(args: list) -> tuple[int, str, bytes]:
    """`| head -1` made certain: a 4 KiB pipe (the writer blocks once it is full), a reader that takes one
    line and closes; what follows that line fails with EPIPE whenever more than 4 KiB follow it."""
    r_end, w_end = os.pipe()
    fcntl.fcntl(w_end, fcntl.F_SETPIPE_SZ, 4096)
    proc = subprocess.Popen(ncclprobe(*args), stdout=w_end, stderr=subprocess.PIPE, env=_env())
    os.close(w_end)
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(r_end, 1)
        if not byte:
            break
        line += byte
    os.close(r_end)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err.decode(errors="replace"), line


def _stdout_closed(args: list) -> tuple[int, str]:
    """stdout closed before Python starts (`>&-`): Python's sys.stdout is None."""
    r = subprocess.run(["bash", "-c", 'exec "$@" >&-', "bash", *ncclprobe(*args)], capture_output=True, text=True,
                       timeout=300, env=_env())
    return r.returncode, r.stderr


SMALL_OUTPUT = ("inspect", "report", "explain", "explain --list", "run", "--help", "run --help", "report FILE")
NAMES = ["inspect", "report", "report --json", "report FILE", "explain", "explain --list", "run", "--help",
         "run --help", "demo"]


@pytest.fixture(scope="module")
def unpiped(target, tmp_path_factory):
    """name -> (exit code, stdout) of each command with stdout on a regular file, each run once."""
    done: dict[str, tuple[int, str]] = {}

    def get(name: str) -> tuple[int, str]:
        if name not in done:
            tmp = tmp_path_factory.mktemp("unpiped")
            done[name] = _unpiped(_commands(target, tmp)[name], tmp)
        return done[name]
    return get


@pytest.mark.parametrize("name", NAMES)
def test_no_line_ends_in_a_space(name, unpiped):
    code, text = unpiped(name)
    assert code in (0, 1) and text, text[-2000:]
    assert not trailing_spaces(text), trailing_spaces(text)[:5]


@pytest.mark.parametrize("name", NAMES)
def test_a_reader_that_goes_away_never_changes_the_exit_code(name, target, unpiped, tmp_path):
    args = _commands(target, tmp_path)[name]
    code, text = unpiped(name)
    assert code in (0, 1), text[-2000:]
    gone_code, err = _reader_gone_before(_fresh_run_dir(args, tmp_path, "a"))
    assert gone_code == code and not any(b in err for b in BROKEN), err[-2000:]
    closed_code, err = _stdout_closed(_fresh_run_dir(args, tmp_path, "c"))
    assert closed_code == code and not any(b in err for b in BROKEN), err[-2000:]
    if name not in SMALL_OUTPUT:
        assert len(text.encode()) > 2 * 4096  # so that the one-line reader below leaves writes to fail
        one_code, err, line = _reader_of_one_line(_fresh_run_dir(args, tmp_path, "b"))
        assert line.decode() == text.splitlines(keepends=True)[0]
        assert one_code == code and not any(b in err for b in BROKEN), err[-2000:]


@pytest.mark.parametrize("name", ["report", "explain --list", "demo"])
def test_head_in_a_shell_pipeline(name, target, unpiped, tmp_path):
    """What a user types: `ncclprobe … | head -1`, the exit code read from ${PIPESTATUS[0]}."""
    args = _commands(target, tmp_path)[name]
    code, _ = unpiped(name)
    r = subprocess.run(["bash", "-c", '"$@" | head -1; exit "${PIPESTATUS[0]}"', "bash", *ncclprobe(*args)],
                       capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == code and len(r.stdout.splitlines()) == 1
    assert not any(b in r.stderr for b in BROKEN), r.stderr[-2000:]


@pytest.mark.slow
def test_bench_keeps_its_exit_code_when_the_reader_goes_away(tmp_path):
    pytest.importorskip("torch")
    args = ["bench", "--backend", "gloo", "--ranks", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0"]
    code, text = _unpiped(args, tmp_path)
    assert code == 0 and "# config 1/1" in text and not trailing_spaces(text), text[-2000:]
    # the reader closes after the first line; the rows and the summary come seconds later
    one_code, err, line = _reader_of_one_line(args)
    assert line.decode() == text.splitlines(keepends=True)[0]
    assert one_code == code and not any(b in err for b in BROKEN), err[-2000:]


# -- help ------------------------------------------------------------------------------------------------------

def _every_command() -> list[list[str]]:
    out = [[]]
    for name, command in sorted(cli.commands.items()):
        out.append([name])
        out += [[name, sub] for sub in sorted(getattr(command, "commands", {}))]
    return out


def test_every_command_is_in_the_help_test():
    assert {" ".join(c) for c in _every_command()} >= {"", "inspect", "run", "report", "inject", "inject install",
                                                       "inject status", "inject uninstall", "explain", "demo",
                                                       "bench", "topo"}


@pytest.mark.parametrize("command", [" ".join(c) for c in _every_command()])
@pytest.mark.parametrize("columns", ["80", ""])
def test_every_help_fits_80_columns(command, columns):
    env = _env(COLUMNS=columns) if columns else _env()
    for flag in ("--help", "-h"):
        r = subprocess.run(ncclprobe(*command.split(), flag), capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0 and r.stdout.startswith("Usage: ncclprobe"), r.stderr
        wide = [line for line in r.stdout.splitlines() if len(line) > 80]
        assert not wide, wide
        assert not trailing_spaces(r.stdout)


# -- explain, report FILE ------------------------------------------------------------------------------------

def _no_empty_row(text: str) -> None:
    lines = SGR.sub("", text).splitlines()
    assert lines[0].startswith("NCCL_PROTO  (")
    assert lines[1].startswith("affects"), lines[:4]  # the first row right under the title: no header
    for before, rule in zip(lines, lines[1:]):  # a header's rule (piped |---+, terminal ━━━) under its names
        if rule.strip() and not rule.strip(" |+-━"):
            assert before.strip(" |+-━"), lines


def test_explain_has_no_empty_header_row():
    r = subprocess.run(ncclprobe("explain", "NCCL_PROTO"), capture_output=True, text=True, timeout=120, env=_env())
    _no_empty_row(r.stdout)
    code, out = in_terminal(ncclprobe("explain", "NCCL_PROTO"), 100, _env())
    assert code == 0
    _no_empty_row(out)


def _report(*args) -> subprocess.CompletedProcess:
    return subprocess.run(ncclprobe("report", *args), capture_output=True, text=True, timeout=120, env=_env())


@pytest.mark.parametrize("as_json", [False, True])
def test_report_of_a_file_reads_it_as_an_nccl_log(as_json):
    flag = ["--json"] if as_json else []
    by_option, by_name = _report("--nccl-log", NCCL_LOG, *flag), _report(NCCL_LOG, *flag)
    assert by_option.returncode in (0, 1), by_option.stderr
    assert (by_name.returncode, by_name.stdout) == (by_option.returncode, by_option.stdout), by_name.stderr
    both = _report(DEMO_RUN, "--nccl-log", NCCL_LOG, *flag)
    assert (_report(DEMO_RUN, NCCL_LOG, *flag).stdout, both.returncode) == (both.stdout, both.returncode)


def test_report_of_a_file_that_is_no_nccl_log_says_so(tmp_path):
    junk = tmp_path / "notes.txt"
    junk.write_text("these are notes, not a log\n")
    r = _report(junk)
    assert r.returncode == 3 and not r.stdout
    assert f"no NCCL log lines recognised in {junk}" in r.stderr and "no such log directory" not in r.stderr
    assert not any(b in r.stderr for b in BROKEN), r.stderr
    r = _report(junk, "--json")
    assert r.returncode == 3 and json.loads(r.stdout)["error"]["reason"]


def test_run_keeps_cmds_code_when_its_reader_is_gone(tmp_path):
    """run goes on to end CMD's tree and exit with CMD's code: SIGPIPE stays ignored, EPIPE is absorbed."""
    code, err = _reader_gone_before(["run", "--dir", tmp_path / "logs", "--", "sh", "-c", "exit 7"])
    assert code == 7 and not any(b in err for b in BROKEN), err


@pytest.mark.parametrize("status,tail", [(0, ""), (3, " (CMD exited with code 3)")])
def test_run_in_a_terminal_ends_with_the_answer_and_whose_exit_it_is(status, tail, tmp_path):
    """As report, inspect and demo do: the last line is the one-line answer and the exit status; when CMD's
    own failure decides that status, the line says so. Piped, no such line."""
    args = ["run", "--dir", tmp_path / "logs", "--", "sh", "-c", f"exit {status}"]
    code, out = in_terminal(ncclprobe(*args), 80, _env())
    last = [line for line in SGR.sub("", out).splitlines() if line.strip()][-1]
    assert code == status and re.fullmatch(rf"Answer: (no findings|\d+ causes? \(.*\)) · exit {status}"
                                            + re.escape(tail), last), out[-2000:]
    args[2] = tmp_path / "piped"
    piped = subprocess.run(ncclprobe(*args), capture_output=True, text=True, timeout=120, env=_env())
    assert piped.returncode == status and "Answer:" not in piped.stdout


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_a_write_error_other_than_a_closed_pipe_is_said_once_and_keeps_the_exit_code():
    """stdout on a full disk (/dev/full: every write fails with ENOSPC): one line on stderr, the rest dropped,
    the command's own exit code (the report of demo-run has error-level findings: 1)."""
    with open("/dev/full", "w") as full:
        r = subprocess.run(ncclprobe("report", DEMO_RUN), stdout=full, stderr=subprocess.PIPE, text=True,
                           timeout=120, env=_env())
    assert r.returncode == 1 and not any(b in r.stderr for b in BROKEN), r.stderr
    assert r.stderr == ("ncclprobe: could not write to standard output (No space left on device): "
                        "the rest of it is dropped\n")
