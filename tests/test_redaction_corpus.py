"""Redaction against a corpus of real-world shapes (tests/data/secret_shapes.json, issue 21): a secret
on a command line or in an environment value shows only its context, a benign shape is shown unchanged.
One rule set, checked on both paths: the tool (ncclprobe.model.watched, as inspect/run/report use it) and
the boot probe, both its function inside interpreters started with the probe (ephemeral and persistent
wiring, the oldest Python it supports when one is here) and the argv of the process_start records
those interpreters write."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ncclprobe.commands import inject
from ncclprobe.model import watched
from boot_support import PYTHON, clean_env, make_venv, starts_by_pid

CORPUS = json.loads((Path(__file__).parent / "data" / "secret_shapes.json").read_text())
SECRET_CASES = CORPUS["secrets"]
BENIGN_CASES = CORPUS["benign"]
# the probe's redaction, run by the probe an interpreter started with: every case in, every result out
REDACT_ALL = ("import json, sys; m = sys.modules[sys._ncclprobe_boot]; m._rest(); "
              "print(json.dumps([m.redact_argv(a) for a in json.load(sys.stdin)]))")


def name(case: dict) -> str:
    return case["name"]


def leaked(shown: list, secrets: list) -> list:
    return [s for s in secrets if any(s in a for a in shown)]


def probe_env(log_dir: Path) -> dict[str, str]:
    env = clean_env()
    env.update(inject.ephemeral_env(env, log_dir, None))
    return env


def all_argvs() -> list[list[str]]:
    return [c["argv"] for c in SECRET_CASES] + [c["argv"] for c in BENIGN_CASES]


def expected() -> list[list[str]]:
    return [c["shown"] for c in SECRET_CASES] + [c["argv"] for c in BENIGN_CASES]


def redacted_by_probe(python: str, env: dict[str, str]) -> list[list[str]]:
    r = subprocess.run([python, "-c", REDACT_ALL], input=json.dumps(all_argvs()), env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_corpus_holds_enough_shapes():
    assert len(SECRET_CASES) >= 100 and len(BENIGN_CASES) >= 30
    assert len({c["name"] for c in SECRET_CASES + BENIGN_CASES}) == len(SECRET_CASES) + len(BENIGN_CASES)
    for case in SECRET_CASES:  # each case says what is secret, and hides it while keeping some context
        assert case["secrets"] and not leaked(case["shown"], case["secrets"]), case["name"]
        assert any(s in a for s in case["secrets"] for a in case["argv"]), case["name"]
        assert case["shown"] != ["<redacted>"] * len(case["argv"]), case["name"]


# ---------------------------------------------------------------------------- the tool

@pytest.mark.parametrize("case", SECRET_CASES, ids=name)
def test_tool_shows_only_the_context_of_a_secret(case):
    shown = watched.redact_argv(case["argv"])
    assert shown == case["shown"]
    assert leaked(shown, case["secrets"]) == []
    assert watched.redact_argv(shown) == shown  # redacting again changes nothing (old logs, new readers)


@pytest.mark.parametrize("case", BENIGN_CASES, ids=name)
def test_tool_shows_a_benign_command_line_unchanged(case):
    assert watched.redact_argv(case["argv"]) == case["argv"]


@pytest.mark.parametrize("case", CORPUS["env"], ids=name)
def test_all_vars_redacts_environment_values_by_the_same_rules(case):
    shown = watched.select(case["env"], all_vars=True)
    assert shown == case["shown"]
    assert leaked(list(shown.values()), case["secrets"]) == []
    assert watched.select(case["env"], all_vars=True, redact=False) == case["env"]  # --no-redact


def test_all_vars_shows_benign_environment_values_unchanged():
    env = CORPUS["env_benign"]
    assert watched.select(env, all_vars=True) == env
    assert watched.looks_secret("PWD") is False and watched.looks_secret("MYSQL_PWD") is True


def test_a_command_line_in_a_value_is_redacted_as_on_the_command_line():
    for case in SECRET_CASES:
        if len(case["argv"]) == 1 or case["argv"][1] != "-c":
            continue
        value = case["argv"][2]  # the script of `sh -c` / `python -c`, as an environment value
        shown = watched.select({"SCRIPT": value}, all_vars=True)["SCRIPT"]
        assert shown == case["shown"][2], case["name"]


# ---------------------------------------------------------------------------- the boot probe

def test_boot_probe_function_redacts_the_corpus_inside_an_interpreter_started_with_it(tmp_path):
    assert redacted_by_probe(PYTHON, probe_env(tmp_path / "log")) == expected()


def test_persistent_probe_function_redacts_the_corpus(tmp_path):
    """The persistent install keeps redact_argv in its second file, loaded by _rest() on first use."""
    python = str(make_venv(tmp_path / "venv"))
    inject.install(python, log_dir=tmp_path / "log")
    assert redacted_by_probe(python, clean_env()) == expected()


def _old_python() -> str | None:
    """The oldest Python the boot probe supports (3.8), if this machine has one that runs."""
    candidates = [shutil.which("python3.8"), *glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8"))]
    for candidate in candidates:
        if candidate and subprocess.run([candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 8)"],
                                        capture_output=True).returncode == 0:
            return candidate
    return None


def test_boot_probe_redacts_the_corpus_on_python_3_8(tmp_path):
    python = _old_python()
    if python is None:
        pytest.skip("no Python 3.8 here")
    assert redacted_by_probe(python, probe_env(tmp_path / "log")) == expected()


def test_process_start_records_show_only_the_context(tmp_path):
    """Each shape as the command line of a real interpreter: the probe's own record of it (start()'s
    check for hints decides whether redact_argv runs at all)."""
    env = probe_env(tmp_path / "log")
    code = "import os; print(os.getpid())"

    def start(argv: list[str]) -> int:
        r = subprocess.run([PYTHON, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return int(r.stdout)

    with ThreadPoolExecutor(4) as pool:
        pids = list(pool.map(start, all_argvs()))
    starts = starts_by_pid(tmp_path / "log")
    logged = [starts[pid]["argv"][3:] for pid in pids]
    assert logged == expected()
    text = "".join(p.read_text() for p in (tmp_path / "log").glob("*.jsonl"))
    assert [s for c in SECRET_CASES for s in c["secrets"] if s in text] == []
