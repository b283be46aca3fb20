"""Readers of hostile argv, environment values and log text stay linear (issue 21): adversarial shapes
built to make a backtracking scan re-read its input (long runs of scheme characters before an '@', many
':' '@' '/' quotes '=' '-', unclosed quotes, nested ${ and $( ...), 128 KB to 2 MB, each under a
generous time bound. Before, one 128 KB argument made `python -c pass` under the boot probe take
minutes (the URL-password regex), and the tool's redaction, path shortening and shell-word matching
were quadratic or worse on the same kinds of text."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from ncclprobe.commands import inject
from ncclprobe.model import watched
from ncclprobe.render import shorten_paths
from ncclprobe.witnesses import shells
from boot_support import PYTHON, clean_env, starts_by_pid

ARG = 131000                # an argument the kernel takes whole (MAX_ARG_STRLEN is 128 KiB)
ARGS_2MB = 15               # 15 of them: about 2 MB, within ARG_MAX beside a test's environment
BOUND_PROBE = 30.0          # seconds for one interpreter start (a bare one: well under 1 s)
BOUND_TOOL = 60.0           # seconds for the tool to redact 2 MB (linear: a few)
SECRET = "hunter2pw"
UNITS = ["a", "a://", ":@/", "'", '"', "'a", "=", "a=", "TOKEN=", "TOKEN=x ", "KEY:", "key: ", "'KEY':",
         "'KEY'] = '", '{"password": "', "--api-key ", "-p ", "https://u:", "@", "&a=", "a:b@", "\\", '\\"', "-",
         "_", "eyJ", "ghp_", "PRIVATE KEY-----", "a ", "\t", "\n", "/a", "mysql -p", "curl -u ", "set token "]


def shape(unit: str, n: int = ARG) -> str:
    """n characters of unit repeated, ending with '@' (what makes the probe look for credentials)."""
    return (unit * (n // len(unit) + 1))[:n - 1] + "@"


def timed(f, *args, **kw):
    t0 = time.perf_counter()
    out = f(*args, **kw)
    return out, time.perf_counter() - t0


def probe_env(log_dir: Path) -> dict[str, str]:
    env = clean_env()
    env.update(inject.ephemeral_env(env, log_dir, None))
    return env


# ---------------------------------------------------------------------------- the boot probe

@pytest.mark.parametrize("unit", ["a", "a://", ":@/", "'a", "TOKEN=x ", "key: ", "'KEY'] = '", "https://u:", "a "],
                         ids=repr)
def test_interpreter_start_with_a_huge_adversarial_argument_stays_fast(tmp_path, unit):
    env = probe_env(tmp_path / "log")
    argv = ["--db=postgres://u:" + SECRET + "@h/x", shape(unit)]
    r, took = timed(subprocess.run, [PYTHON, "-c", "import os; print(os.getpid())", *argv], env=env,
                    capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert took < BOUND_PROBE, took
    logged = starts_by_pid(tmp_path / "log")[int(r.stdout)]["argv"]
    assert logged[3] == "--db=postgres://u:<redacted>@h/x"
    assert SECRET not in json.dumps(logged)


@pytest.mark.parametrize("unit", ["a://", "'", "=", "key: ", '{"password": "', "a "], ids=repr)
def test_interpreter_start_with_a_2mb_adversarial_argv_stays_fast_and_says_what_it_did_not_read(tmp_path, unit):
    env = probe_env(tmp_path / "log")
    argv = [shape(unit)] * ARGS_2MB + ["--api-key", SECRET]  # the secret lies past what the probe reads
    r, took = timed(subprocess.run, [PYTHON, "-c", "import os; print(os.getpid())", *argv], env=env,
                    capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert took < BOUND_PROBE, took
    logged = starts_by_pid(tmp_path / "log")[int(r.stdout)]["argv"]
    assert len(logged) == 3 + len(argv)  # every argument is there, or says it was not read
    assert logged[-1] == "<not scanned: %d chars>" % len(SECRET)
    assert SECRET not in json.dumps(logged)
    assert len(json.dumps(logged)) < 64 * 1024


# ---------------------------------------------------------------------------- the tool

@pytest.mark.parametrize("unit", UNITS, ids=repr)
def test_tool_redaction_is_linear_on_each_shape(unit):
    text = shape(unit)
    argv = ["python", text, "--token", SECRET]
    shown, took = timed(watched.redact_argv, argv)
    assert took < BOUND_TOOL / 4, took
    assert shown[-1] == "<redacted>" and SECRET not in "".join(shown)
    _, took = timed(watched.select, {"VALUE": text, "DB_URL": "postgres://u:" + SECRET + "@h/x"}, True)
    assert took < BOUND_TOOL / 4, took


@pytest.mark.parametrize("unit", ["a", "a://", "TOKEN=x ", "'"], ids=repr)
def test_tool_redacts_2mb_in_linear_time(unit):
    argv = [shape(unit)] * ARGS_2MB + ["--api-key", SECRET]
    shown, took = timed(watched.redact_argv, argv)
    assert took < BOUND_TOOL, took
    assert shown[-1] == "<redacted>" and len(shown) == len(argv)


def test_the_probes_scan_is_bounded_and_the_tools_is_not():
    from ncclprobe._lib import ncclprobe_boot as boot
    argv = ["x " * 20000, "--api-key", SECRET]
    assert boot.redact_argv(argv)[1:] == ["<not scanned: 9 chars>", "<not scanned: %d chars>" % len(SECRET)]
    assert watched.redact_argv(argv)[1:] == ["--api-key", "<redacted>"]


# ---------------------------------------------------------------------------- other readers of hostile text

@pytest.mark.parametrize("unit", ["/a", "=/a", "/", ":/a/", "/site-packages"], ids=repr)
def test_path_shortening_is_linear(unit):
    text = shape(unit)
    _, took = timed(shorten_paths, text)
    assert took < 5.0, took
    assert shorten_paths("at /venv/lib/python3.11/site-packages/ncclprobe/x.py:3") == "at …/ncclprobe/x.py:3"


@pytest.mark.parametrize("word", ["${a}-" * 6 + "b", "$(a)-" * 6 + "b", "${a" * 40000, "$(" * 40000 + "b"],
                         ids=lambda w: repr(w[:12]))
def test_shell_word_matching_is_linear(word):
    script = "x " + word + "\n"
    _, took = timed(shells.pitfalls, script, ["x", "-" * 20000], lambda name: True)
    assert took < 5.0, took
