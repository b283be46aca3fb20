"""The profile format (one parser, shared by the tool and the boot probe) and the probe's pure parts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ncclprobe.commands import profile

from ncclprobe.model import watched
from ncclprobe._lib import ncclprobe_boot as boot
from ncclprobe.commands.envfile import AssignmentError

ROOT = Path(__file__).resolve().parent.parent


def test_watched_set_matches_the_tool():
    assert boot.WATCHED_PREFIXES == watched.WATCHED_PREFIXES
    assert boot.WATCHED_NAMES == watched.WATCHED_NAMES
    assert boot.SECRET_MARKERS == watched.SECRET_MARKERS


def test_installed_copy_is_the_probe_source():
    # the copy the installed package ships must be this source's probe (a stale build ships an old one:
    # reinstall, or `python probes/build.py` for an editable install)
    from ncclprobe._lib import lib_path
    assert lib_path("ncclprobe_boot.py").read_bytes() == (ROOT / "probes/ncclprobe_boot.py").read_bytes()


def test_parse_and_format_round_trip():
    text = ("# tuning for PCIe\n\nset NCCL_PROTO=LL\n  default NCCL_ALGO=Ring\nset NCCL_X= a=b c \n"
            "set MY_FLAG=\npin NCCL_PROTO\n")
    p = profile.parse(text, "p.txt")
    assert p.sets == (("NCCL_PROTO", "LL"), ("NCCL_X", " a=b c "), ("MY_FLAG", ""))
    assert p.defaults == (("NCCL_ALGO", "Ring"),)
    assert p.pins == ("NCCL_PROTO",)
    assert profile.parse(p.to_text()) == p


@pytest.mark.parametrize("text, line, words", [
    ("set NCCL_PROTO=LL\nfrob NCCL_ALGO=Ring\n", 2, "unknown directive"),
    ("set NCCL_PROTO\n", 1, "NAME=VALUE"),
    ("set 9BAD=1\n", 1, "not a valid"),
    ("\n\npin MY_VAR\n", 3, "not a watched variable"),
    ("pin NCCL_PROTO=LL\n", 1, "name only"),
    ("set NCCL_PROTO=LL\ndefault NCCL_PROTO=Simple\n", 2, "already given"),
    ("set NCCL_PROTO=LL\nset NCCL_PROTO=Simple\n", 2, "already given"),
])
def test_parse_errors_name_the_line(text, line, words):
    with pytest.raises(AssignmentError) as err:
        profile.parse(text, "prof.txt")
    assert str(err.value).startswith(f"prof.txt:{line}:")
    assert words in str(err.value)


# Mistakes a hand-written profile holding a secret can make; none may echo the secret (the boot probe
# logs these messages as probe_error).
SECRET_MISTAKES = ["HF_TOKEN=hunter2", "set HF_TOKEN hunter2", "default HF_TOKEN hunter2", "pin HF_TOKEN=hunter2",
                   "hunter2", "set HF_TOKEN=hunter2\nset HF_TOKEN=other", "set HF_TOKEN=hunter2\ndefault HF_TOKEN=x"]


@pytest.mark.parametrize("text", SECRET_MISTAKES)
def test_parse_errors_never_show_values_of_unwatched_variables(text):
    with pytest.raises(AssignmentError) as err:
        profile.parse("# tuning\n" + text + "\n", "prof.txt")
    assert str(err.value).startswith("prof.txt:") and "hunter2" not in str(err.value), str(err.value)


def test_parse_errors_show_values_of_watched_variables():
    with pytest.raises(AssignmentError, match="already given as 'set NCCL_PROTO=LL'"):
        profile.parse("set NCCL_PROTO=LL\nset NCCL_PROTO=Simple\n")


def test_same_entry_twice_is_kept_once():
    assert profile.parse("set NCCL_PROTO=LL\nset NCCL_PROTO=LL\n").sets == (("NCCL_PROTO", "LL"),)


def test_read_missing_file_is_an_assignment_error(tmp_path):
    with pytest.raises(AssignmentError, match="cannot read"):
        profile.read(tmp_path / "nope")


def test_from_cli():
    p = profile.from_cli(["NCCL_PROTO=LL", "NCCL_BUFFSIZE=16777216"], ["NCCL_ALGO=Ring"], ["NCCL_PROTO"])
    assert p.entries() == [("set", "NCCL_PROTO", "LL"), ("set", "NCCL_BUFFSIZE", "16777216"),
                           ("default", "NCCL_ALGO", "Ring"), ("pin", "NCCL_PROTO", None)]
    assert profile.from_cli().empty


@pytest.mark.parametrize("kw, words", [
    ({"sets": ["NCCL_PROTO"]}, "--set NCCL_PROTO: expected NAME=VALUE"),
    ({"sets": ["=LL"]}, "--set =<redacted>: '' is not a valid"),  # no watched name: its value is not shown
    ({"defaults": ["A B=1"]}, "--set-default A B=<redacted>: 'A B' is not a valid"),
    ({"pins": ["HOME"]}, "--pin HOME: HOME is not a watched variable"),
    ({"pins": [""]}, "--pin : '' is not a valid"),
    ({"sets": ["NCCL_X=a\nset NCCL_Y=b"]}, "newline"),
    ({"sets": ["NCCL_PROTO=LL"], "defaults": ["NCCL_PROTO=Simple"]}, "--set-default NCCL_PROTO=Simple: NCCL_PROTO is already given"),
])
def test_from_cli_errors_name_the_option(kw, words):
    with pytest.raises(AssignmentError) as err:
        profile.from_cli(**kw)
    assert words in str(err.value)


def test_env_changes_sets_always_defaults_only_if_absent():
    p = profile.from_cli(["NCCL_PROTO=LL"], ["NCCL_ALGO=Ring", "NCCL_DEBUG=INFO"], [])
    assert p.env_changes({"NCCL_PROTO": "Simple", "NCCL_ALGO": "Tree"}) == {"NCCL_PROTO": "LL", "NCCL_DEBUG": "INFO"}


def test_json_view_redacts_unwatched_values():
    p = profile.from_cli(["NCCL_PROTO=LL", "HF_TOKEN=hunter2"], [], [])
    assert p.to_json() == {"set": {"NCCL_PROTO": "LL", "HF_TOKEN": "<redacted>"}, "default": {}, "pin": []}


@pytest.mark.parametrize("value", [
    "plain", 'quote " and \\ backslash', "ctl \x00\x01\x1f\x7f tab\t nl\n", "é ünïcode ✓", "astral 𝄞",
    "undecodable \udcff\udc80", "x" * 70000,
])
def test_probe_json_encoder_is_json(value):
    doc = {"s": value, "n": None, "b": [True, False], "i": -3, "f": 1.5, "d": {"k": value}}
    back = json.loads(boot._json(doc))
    expect = value if len(value) <= boot.MAX_STR else value[:boot.MAX_STR] + "...[truncated]"
    assert back == {"s": expect, "n": None, "b": [True, False], "i": -3, "f": 1.5, "d": {"k": expect}}


def test_redact_argv():
    argv = ["python", "serve.py", "--hf-token=abc", "--api-key", "xyz", "--tp", "8", "-c", "k"]
    assert boot.redact_argv(argv) == ["python", "serve.py", "--hf-token=<redacted>", "--api-key", "<redacted>",
                                      "--tp", "8", "-c", "k"]
