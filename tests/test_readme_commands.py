"""Every command of the READMEs, run exactly as written, gives what its README promises.

The commands are read from the READMEs themselves (README.md, examples/README.md, examples/*/README.md),
not copied here: a README edited later is tested as edited. A ```bash block holds one or more commands;
each line that calls `ncclprobe` ends one (the lines above it since the previous one are its setup: a
job started with `&` that it inspects). Comment lines are a reader's, not the shell's.

The promise is the README's own "Expected:" paragraph after the block, in plain words the test reads:
  - `exits N`: the exit code of the ncclprobe command (required: a README that promises no exit code
    fails here, so that every example states one);
  - a finding code (`ENV_MISSING`) must be among the findings; an edge kind (`curated_env`) must be the
    edge of every error-level finding on the variable, and of at least one;
  - "both workers/ranks flagged", "the worker flagged", "worker 1 alone is flagged": how many workers
    the error-level findings name -- and they must be exactly the workers that, by their own word
    (examples/_worker.py prints `[worker pid P, parent Q] NCCL_PROTO=V`), lack the expected value;
  - "needs the kernel's process events", "needs a C compiler", "needs torch", "needs a GPU": skipped
    with the reason where this machine lacks it.

A command runs in bash from each directory where its relative paths resolve -- the repository root,
and examples/ -- (a command that begins with `cd examples` runs from the root), with `python` and
`ncclprobe` on PATH as a user's shell has them: a bin directory with this interpreter and a shim. The
shim runs ncclprobe exactly as given and records its exit code; for `inspect` it then asks the same
question again with --json while the tree is still up (the README releases it only afterwards); a
`run`'s JSON is its log directory's, read back with `report --json` (the report `run` printed is
built from that same directory). No --hold is added anywhere.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from rundirs import run_meta

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
READMES = [ROOT / "README.md", EXAMPLES / "README.md", *sorted(EXAMPLES.glob("*/README.md"))]
PY = sys.executable
VAR, WANT = "NCCL_PROTO", "LL"
_DEFS = json.loads((ROOT / "ncclprobe" / "schemas" / "common.json").read_text())["$defs"]
EDGE_KINDS = frozenset(_DEFS["edge"]["properties"]["kind"]["enum"])
FINDING_CODES = frozenset(_DEFS["finding_code"]["enum"])
COMMAND_LIMIT_S = 240.0  # a bound on a command's whole run (torchrun imports torch in three interpreters
# on two shared cores); reached only when something hangs


# -- reading the READMEs ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Promise:
    exit: int | None
    codes: frozenset[str]
    edges: frozenset[str]
    flagged: int | None  # how many workers the error-level findings name (None: not said)
    needs: tuple[str, ...]  # what the machine must have: "kernel events", "cc", "torch", "gpu"


@dataclass(frozen=True)
class Command:
    readme: Path
    line: int  # of the ncclprobe call, in the README
    text: str  # what bash runs, as the README has it
    promise: Promise | None  # None: the README says nothing after the block

    @property
    def id(self) -> str:
        return f"{self.readme.relative_to(ROOT)}:{self.line}"


NEEDS = {"kernel events": "needs the kernel's process events", "cc": "needs a C compiler",
         "torch": "needs torch", "gpu": "needs a GPU"}


def parse_promise(paragraph: str) -> Promise:
    words = " ".join(paragraph.split())
    exit_m = re.search(r"\bexits? (\d)\b", words)
    ticked = re.findall(r"`([^`]+)`", words)
    flagged = None
    for sentence in re.split(r"[.;:]\s", words):
        if "flagged" in sentence:
            flagged = 2 if re.search(r"\bboth\b", sentence) else 1
    if re.search(r"no error-level finding", words):
        flagged = 0
    return Promise(int(exit_m.group(1)) if exit_m else None,
                   frozenset(t for t in ticked if t in FINDING_CODES),
                   frozenset(t for t in ticked if t in EDGE_KINDS), flagged,
                   tuple(k for k, said in NEEDS.items() if said in words))


def _blocks(text: str):
    """(first line number, lines, the Expected paragraph after it or None) of each ```bash block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```bash":
            i += 1
            continue
        start = i + 1
        end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
        after = end + 1
        while after < len(lines) and not lines[after].strip():
            after += 1
        para = None
        if after < len(lines) and lines[after].startswith("Expected:"):
            stop = next((j for j in range(after, len(lines)) if not lines[j].strip()), len(lines))
            para = "\n".join(lines[after:stop])
        yield start + 1, lines[start:end], para
        i = end + 1


def commands(readme: Path) -> list[Command]:
    out = []
    for first, lines, para in _blocks(readme.read_text()):
        promise = parse_promise(para) if para is not None else None
        pending: list[str] = []
        n = first
        for n, line in enumerate(lines, first):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            pending.append(line)
            if re.search(r"(^|[\s;&|(])ncclprobe\s", line):
                out.append(Command(readme, n, "\n".join(pending), promise))
                pending = []
        if pending:  # a block with no ncclprobe call (the top README's `pip install`): one command
            out.append(Command(readme, n, "\n".join(pending), promise))
    return out


ALL = [c for r in READMES for c in commands(r)]


def _paths(words: list[str]) -> list[str]:
    """The words of a command that name a file or directory relative to its cwd."""
    return [w for w in words if re.fullmatch(r"[\w.][\w./-]*", w) and ("/" in w or w.endswith((".py", ".sh")))]


def cwds(cmd: Command) -> list[Path]:
    """Where the command's relative paths resolve: the repository root, examples/, or both."""
    try:
        words = shlex.split(cmd.text, comments=True)
    except ValueError:
        return [ROOT]
    found = []
    for base in (ROOT, EXAMPLES):
        here, rest = base, words
        if rest[:1] == ["cd"] and len(rest) > 1:
            here, rest = base / rest[1], rest[2:]
            if not here.is_dir():
                continue
        if all((here / p).exists() for p in _paths(rest)):
            found.append(base)
    return found


def test_the_readmes_have_commands():
    """The extraction reads what is there: each example's README gives at least one command, and each of
    its commands a promise the test can check (an exit code; a failure variant, the code or edge it names)."""
    for readme in EXAMPLES.glob("*/README.md"):
        assert [c for c in ALL if c.readme == readme], readme
    for cmd in ALL:
        if cmd.readme == ROOT / "README.md":
            continue
        p = cmd.promise
        assert p is not None and p.exit is not None, f"{cmd.id}: no 'Expected: exits N' after its block"
        assert p.exit == 0 or p.codes or p.edges, f"{cmd.id}: a failure that names no finding code or edge"


def test_promises_are_read_from_plain_words():
    p = parse_promise("Expected: exits 1; both ranks flagged, `SHELL_PREFIX_SCOPE` with edge `shell_prefix`, "
                      "`NCCL_PROTO` named. It needs torch.")
    assert p == Promise(1, frozenset({"SHELL_PREFIX_SCOPE"}), frozenset({"shell_prefix"}), 2, ("torch",))
    p = parse_promise("Expected: exits 1; worker 1 alone is flagged, `ENV_SET_AFTER_START`.")
    assert (p.exit, p.flagged) == (1, 1)
    assert parse_promise("Expected: exits 0, no error-level finding.").flagged == 0


# -- what this machine has --------------------------------------------------------------------------
def _kernel_events() -> str | None:
    from ncclprobe.witnesses.kernelevents import Listener
    lst = Listener()
    lst.close()
    return lst.refused


def _lacks(need: str) -> str | None:
    """Why this machine cannot run a command that needs `need` (None: it can)."""
    import importlib.util
    import shutil
    if need == "kernel events":
        refused = _kernel_events()
        return f"needs the kernel's process events: {refused}" if refused else None
    if need == "cc":
        return None if shutil.which("cc") or shutil.which("gcc") else "needs a C compiler (cc)"
    if need == "torch":
        return None if importlib.util.find_spec("torch") else "needs torch"
    if need == "gpu":
        return None if Path("/dev/nvidiactl").exists() else "needs a GPU"
    raise AssertionError(need)


# -- running one command ----------------------------------------------------------------------------
SHIM = """#!/bin/sh
# ncclprobe as typed; its exit code recorded; an inspect asked again with --json while the tree is up
"{py}" -m ncclprobe "$@"
rc=$?
n=$(ls "{rec}" | wc -l)
if [ "$1" = inspect ]; then "{py}" -m ncclprobe "$@" --json > "{rec}/$n.json" 2>/dev/null; fi
printf '%s\\n' "$rc" "$1" > "{rec}/$n.rc"
exit $rc
"""


@dataclass
class Ran:
    rc: int  # bash's
    calls: list[tuple[str, int, dict]]  # (subcommand, exit code, JSON) of each ncclprobe call
    output: str

    def workers(self) -> dict[int, str | None]:
        """Each worker's own word: pid -> its NCCL_PROTO (None: unset)."""
        out = {}
        for m in re.finditer(rf"^\[worker pid (\d+), parent \d+\] {VAR}=(.*)$", self.output, re.M):
            out[int(m.group(1))] = None if m.group(2) == "(unset)" else m.group(2)
        return out


def _kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_typed(cmd: Command, cwd: Path, work: Path, extra_env: dict[str, str] | None = None) -> Ran:
    bin_dir, rec, tmp = work / "bin", work / "calls", work / "tmp"
    for d in (bin_dir, rec, tmp):
        d.mkdir()
    # `python` as an activated environment has it: a script, not a symlink (a symlink to a venv's python
    # that is itself a symlink loses the venv: torch, installed there, would not be found)
    (bin_dir / "python").write_text(f"#!/bin/sh\nexec {shlex.quote(PY)} \"$@\"\n")
    (bin_dir / "python").chmod(0o755)
    shim = bin_dir / "ncclprobe"
    shim.write_text(SHIM.format(py=PY, rec=rec))
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "NCCLPROBE_"))}
    # this interpreter's own bin directory too (torchrun), as an activated environment has it
    env["PATH"] = os.pathsep.join([str(bin_dir), os.path.dirname(PY), env.get("PATH", "")])
    env["TMPDIR"] = str(tmp)  # run's fresh log directory, the C daemon's build: found here, removed with it
    env.update(extra_env or {})
    proc = subprocess.Popen(["bash", "-c", cmd.text], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=COMMAND_LIMIT_S)
    except subprocess.TimeoutExpired:
        _kill_session(proc)
        output, _ = proc.communicate()
        raise AssertionError(f"still running after {COMMAND_LIMIT_S} s:\n{output.decode(errors='replace')[-3000:]}")
    finally:
        _kill_session(proc)  # anything it left behind
    calls = []
    for path in sorted(rec.glob("*.rc"), key=lambda p: int(p.stem)):
        rc, sub = path.read_text().split()
        calls.append((sub, int(rc), _json_of(sub, rec / f"{path.stem}.json", tmp)))
    return Ran(proc.returncode, calls, output.decode(errors="replace"))


def _json_of(sub: str, inspect_json: Path, tmp: Path) -> dict:
    if sub == "inspect":
        return json.loads(inspect_json.read_text())
    if sub != "run":
        return {}
    dirs = sorted(tmp.glob("ncclprobe-*"))
    assert len(dirs) == 1, f"one fresh log directory of run: {dirs}"
    expect = run_meta(dirs[0])["expect"]  # what run was given, as it checked it
    res = subprocess.run([PY, "-m", "ncclprobe", "report", "--json", *[f"--expect={k}={v}" for k, v in expect.items()],
                          str(dirs[0])], capture_output=True, text=True, timeout=120)
    return json.loads(res.stdout)


# -- reading a report ---------------------------------------------------------------------------------
def errors_on_var(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["severity"] == "error"
            and (f.get("var") == VAR or VAR in (f.get("vars") or ()))]


def summary(doc: dict) -> str:
    return "\n".join(f"  {f['severity']} {f['code']} var={f.get('var')} pids={f['pids']} "
                     f"edge={(f.get('edge') or {}).get('kind')}" for f in doc.get("findings", [])) or "  (no findings)"


def check(cmd: Command, ran: Ran, mode: str | None = None) -> None:
    p = cmd.promise
    why = f"\n{cmd.id} as typed:\n{cmd.text}\noutput:\n{ran.output[-4000:]}"
    assert len(ran.calls) == 1, f"ncclprobe called {len(ran.calls)} times, not once{why}"
    (sub, rc, doc), = ran.calls
    why = f"\nfindings:\n{summary(doc)}{why}"
    assert rc == p.exit, f"exit {rc}, the README promises {p.exit}{why}"
    if mode is not None:
        assert [w.get("mode") for w in doc["watch"].values()] == [mode], f"{doc['watch']}{why}"
    codes = {f["code"] for f in doc["findings"]}
    assert p.codes <= codes, f"promised {sorted(p.codes)}{why}"
    errors = errors_on_var(doc)
    if p.edges:
        kinds = {(f.get("edge") or {}).get("kind") for f in errors}
        assert errors and kinds <= p.edges, f"promised edge {sorted(p.edges)}, got {sorted(map(str, kinds))}{why}"
    if p.flagged is not None:
        truth = ran.workers()
        assert truth, f"no worker said what it had{why}"
        bad = {pid for pid, value in truth.items() if value != WANT}
        flagged = {pid for f in errors for pid in f["pids"]}
        assert len(bad) == p.flagged, f"the workers lacking {VAR}={WANT} are {sorted(bad)}, not {p.flagged}{why}"
        assert flagged == bad, f"flagged {sorted(flagged)}, the workers lacking it {sorted(bad)}{why}"


# -- the tests ------------------------------------------------------------------------------------------
# Causes that belong to other items of issue 23, each strict: fixed there, the mark must go.
# (the README, a word of the command, where it runs from): why it fails today
XFAIL: dict[tuple[str, str, str], str] = {}  # (README, a word of the command, where it runs): why it fails


def _xfail(cmd: Command, where: str) -> str | None:
    readme = str(cmd.readme.relative_to(ROOT))
    return next((why for (r, word, w), why in XFAIL.items() if (r, w) == (readme, where) and word in cmd.text), None)


# run's watch: the kernel's process events where they are given (root, CAP_NET_ADMIN), else scans of
# /proc; both are driven here (scans: NCCLPROBE_WATCH_KERNEL=0), so a root machine also tests what a
# user without the kernel's events gets
MODES = {"kernel": {}, "scan": {"NCCLPROBE_WATCH_KERNEL": "0"}}


def _params() -> list:
    out = []
    for cmd in ALL:
        for cwd in cwds(cmd) or [ROOT]:
            where = "root" if cwd == ROOT else "examples"
            reason = _xfail(cmd, where)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            if cmd.promise is not None and "torch" in cmd.promise.needs:
                marks.append(pytest.mark.slow)  # three interpreters import torch: 3-8 s on two shared cores
            modes = list(MODES) if re.search(r"\bncclprobe run\b", cmd.text) else [None]
            out += [pytest.param(cmd, cwd, mode, id=f"{cmd.id}-from-{where}" + (f"-{mode}" if mode else ""),
                                 marks=marks) for mode in modes]
    return out


@pytest.mark.parametrize("cmd, cwd, mode", _params())
def test_command_gives_its_promise(tmp_path, cmd, cwd, mode):
    if cmd.promise is None:
        assert cmd.readme == ROOT / "README.md", f"{cmd.id}: the block states no 'Expected:' promise"
        pytest.skip("README.md states no result for this command (an install, or placeholders for your own job)")
    if not cwds(cmd):
        pytest.fail(f"{cmd.id}: its paths resolve neither from the repository root nor from examples/")
    needs = [n for n in cmd.promise.needs if n != "kernel events"] + ["kernel events"] * (mode == "kernel")
    if mode == "scan" and "kernel events" in cmd.promise.needs:
        pytest.skip("its README says it needs the kernel's process events; this is the scan mode")
    for need in needs:
        lacking = _lacks(need)
        if lacking:
            pytest.skip(lacking)
    assert cmd.promise.exit is not None, f"{cmd.id}: the README's Expected: says no exit code ('exits N')"
    check(cmd, run_typed(cmd, cwd, tmp_path, MODES.get(mode)), mode)
