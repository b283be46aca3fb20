"""No secret leaves (issue 12): one argv redaction everywhere a command line is shown or stored (the
boot probe's, used by inspect, run, report and their JSON), broadened secret names, URL passwords,
option errors that never echo a value, and `run`'s profile file removed once CMD has ended. Real
processes and the installed CLI throughout; the redaction rule itself also as a table."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ncclprobe.model import watched
from ncclprobe._lib import ncclprobe_boot as boot
from ncclprobe.commands.inject import ephemeral_env
from boot_support import PYTHON, clean_env, starts_by_pid
from rundirs import run_meta

NCCLPROBE = [sys.executable, "-m", "ncclprobe"]
# The secrets of the command lines below; none may appear in any output or file.
SECRETS = ("sk-live123", "tok456", "pw789", "hf_abc", "dbpw1", "dbpw2", "shellkey9", "authv5", "passwd6")
# A python that says it runs (so /proc has its exec'd command line), then waits to be inspected.
WAIT = "import sys, time; print('ready', flush=True); time.sleep(60)"
ARGS = ["--api-key", "sk-live123", "--token=tok456", "--password=pw789", "--hf-token", "hf_abc",
        "DATABASE_URL=postgres://u:dbpw1@dbhost/db", "--db=postgres://u:dbpw2@h:5432/x", "--auth", "authv5",
        "--db-passwd=passwd6", "--port", "8000", "--author", "alice"]


def cli(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*NCCLPROBE, *args], capture_output=True, text=True, timeout=120, **kw)


def leaked(*texts: str) -> list[str]:
    return [s for s in SECRETS if any(s in t for t in texts)]


def files_holding(d: Path, needle: bytes) -> list[str]:
    return [str(p) for p in d.rglob("*") if p.is_file() and needle in p.read_bytes()]


class Ready:
    """A live process started with argv, once it has said it runs; killed at exit."""

    def __init__(self, argv, env=None):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def __enter__(self):
        return self.proc.pid

    def __exit__(self, *exc):
        os.killpg(self.proc.pid, 9)
        self.proc.wait()
        self.proc.stdout.close()


# ---------------------------------------------------------------------------- names and the rule

def test_secret_markers_are_one_list_in_the_tool_and_the_boot_probe():
    assert watched.SECRET_MARKERS == boot.SECRET_MARKERS
    assert watched.SECRET_ENDINGS == boot.SECRET_ENDINGS
    for marker in ("PASSWD", "AUTH", "PRIVATE", "PASSPHRASE", "COOKIE"):
        assert marker in watched.SECRET_MARKERS


NAMES = {"DB_PASSWD": True, "GH_AUTH": True, "AUTH_HEADER": True, "HTTP_AUTHORIZATION": True,
         "--authorization": True, "SSH_PRIVATE": True, "PRIVATE_KEY_PEM": True, "HF_TOKEN": True,
         "GIT_AUTHOR_NAME": False, "--author": False, "AUTHORS": False, "AUTHOR_AUTH_TOKEN": True,
         "DATABASE_URL": False, "HOME": False, "NCCL_PROTO": False,
         # issue 21: names ending with PASS, _PAT, _PWD; PATH, PWD (the working directory) and counts of tokens are not
         "DB_PASS": True, "SSHPASS": True, "--db-pass": True, "--pass": True, "GITHUB_PAT": True, "--github-pat": True,
         "MYSQL_PWD": True, "--db-pwd": True, "GPG_PASSPHRASE": True, "SESSION_COOKIE": True,
         "PWD": False, "OLDPWD": False, "PATH": False, "LD_LIBRARY_PATH": False, "--pass-through": False,
         "DB_PASS_FILE": False, "--tokenizer": False, "--max-num-batched-tokens": False, "MAX_TOKENS": False,
         "ADMIN_TOKENS": True, "HF_TOKENS": True}


@pytest.mark.parametrize("name", NAMES)
def test_secret_names_agree_in_the_tool_and_the_boot_probe(name):
    assert watched.looks_secret(name) is NAMES[name]
    assert boot._secretish(name) is NAMES[name]


REDACTIONS = [
    (["--api-key", "sk-1", "--port", "80"], ["--api-key", "<redacted>", "--port", "80"]),
    (["--token=t", "--password=p", "-e", "HF_TOKEN=x"], ["--token=<redacted>", "--password=<redacted>", "-e",
                                                          "HF_TOKEN=<redacted>"]),
    (["DATABASE_URL=postgres://u:pw@h/db", "--db=mysql://root:p@ss@h:3306/x", "redis://:pw@h/0"],
     ["DATABASE_URL=postgres://u:<redacted>@h/db", "--db=mysql://root:<redacted>@h:3306/x", "redis://:<redacted>@h/0"]),
    (["http://host:8080/a@b", "git@github.com:x/y", "--author", "alice"],
     ["http://host:8080/a@b", "git@github.com:x/y", "--author", "alice"]),
    (["--no-auth", "--port", "80"], ["--no-auth", "--port", "80"]),  # a flag: the next option is no value
    (["--private-key", "-----BEGIN KEY-----"], ["--private-key", "<redacted>"]),
    (["--env=SSH_PRIVATE=k", "NCCL_IB_PKEY=1"], ["--env=SSH_PRIVATE=<redacted>", "NCCL_IB_PKEY=1"]),
    (["sh", "-c", "HF_TOKEN=a python s.py --api-key 'k 1' --port 80 && curl https://u:pw@h/x"],
     ["sh", "-c", "HF_TOKEN=<redacted> python s.py --api-key <redacted> --port 80 && curl https://u:<redacted>@h/x"]),
    # secrets in code on the command line: a quoted key, then its quoted value (watched names stay)
    (["python", "-c", "import os\nos.environ['HF_TOKEN']='hf_1'\nos.environ['NCCL_PROTO']='LL'"],
     ["python", "-c", "import os\nos.environ['HF_TOKEN']='<redacted>'\nos.environ['NCCL_PROTO']='LL'"]),
    (["python", "-c", 'import os; os.environ.setdefault("API_KEY", "k 2"); d = {"password": "p\\"q", "user": "u"}'],
     ["python", "-c", 'import os; os.environ.setdefault("API_KEY", "<redacted>"); d = {"password": "<redacted>", '
                      '"user": "u"}']),
    (["python", "-c", "print('token', 3)"], ["python", "-c", "print('token', 3)"]),  # no quoted value: nothing hidden
]


@pytest.mark.parametrize("argv,shown", REDACTIONS)
def test_argv_redaction_rule(argv, shown):
    assert boot.redact_argv(argv) == shown
    assert watched.redact_argv(argv) == shown
    assert watched.redact_argv(shown) == shown  # redacting again changes nothing (old logs, new readers)


@pytest.mark.parametrize("argv,shown", REDACTIONS[:3])
def test_argv_redaction_is_the_same_for_a_long_line_and_for_a_line_seen_before(argv, shown):
    """model.watched redacts a short line once and keeps it (a fleet shares a few), a long one afresh: either way
    the probe's rule, and a second call gives a list of its own."""
    pad = ["x" * 5000]
    assert watched.redact_argv(argv + pad) == shown + pad
    first, again = watched.redact_argv(argv), watched.redact_argv(list(argv))
    assert first == again == shown and first is not again
    first.append("changed")
    assert watched.redact_argv(argv) == shown


def test_redaction_of_a_foreign_argv_does_not_fail():
    assert watched.redact_argv([1, "--token=x", None]) == [1, "--token=<redacted>", None]


# ---------------------------------------------------------------------------- inspect

def test_inspect_redacts_argv_secrets_in_text_and_json():
    with Ready([PYTHON, "-c", WAIT, *ARGS]) as pid:
        text = cli("inspect", str(pid))
        js = cli("inspect", str(pid), "--json")
    assert text.returncode == 0 and js.returncode == 0, text.stderr + js.stderr
    assert leaked(text.stdout, js.stdout) == []
    (rec,) = [p for p in json.loads(js.stdout)["processes"] if p["pid"] == pid]
    assert rec["argv"][3:] == ["--api-key", "<redacted>", "--token=<redacted>", "--password=<redacted>",
                                  "--hf-token", "<redacted>", "DATABASE_URL=postgres://u:<redacted>@dbhost/db",
                                  "--db=postgres://u:<redacted>@h:5432/x", "--auth", "<redacted>",
                                  "--db-passwd=<redacted>", "--port", "8000", "--author", "alice"]


def test_inspect_all_vars_redacts_new_markers_and_url_passwords():
    env = {**os.environ, "DATABASE_URL": "postgres://u:dbpw1@dbhost/db", "DB_PASSWD": "passwd6",
           "GH_AUTH": "authv5", "SSH_PRIVATE": "pw789", "GIT_AUTHOR_NAME": "alice"}
    with Ready([PYTHON, "-c", WAIT], env=env) as pid:
        js = cli("inspect", str(pid), "--all-vars", "--json")
        text = cli("inspect", str(pid), "--all-vars")
    assert leaked(js.stdout, text.stdout) == []
    (rec,) = [p for p in json.loads(js.stdout)["processes"] if p["pid"] == pid]
    assert rec["exec_env"]["DATABASE_URL"] == "postgres://u:<redacted>@dbhost/db"
    assert rec["exec_env"]["DB_PASSWD"] == rec["exec_env"]["GH_AUTH"] == rec["exec_env"]["SSH_PRIVATE"] == "<redacted>"
    assert rec["exec_env"]["GIT_AUTHOR_NAME"] == "alice"


def test_inspect_shell_prefix_evidence_redacts_the_commands_argv():
    script = ("NCCL_ALGO=Ring cd /tmp && " + PYTHON + " -c \"" + WAIT + "\" --api-key shellkey9 "
              "--db=postgres://u:dbpw2@h/x; echo done")
    with Ready(["bash", "-c", script], env={**os.environ, "NCCL_PROTO": "LL"}) as pid:
        js = cli("inspect", str(pid), "--json")
        text = cli("inspect", str(pid))
    assert js.returncode in (0, 1), js.stderr
    (f,) = [f for f in json.loads(js.stdout)["findings"] if f["code"] == "SHELL_PREFIX_SCOPE"]
    assert "--api-key <redacted>" in json.dumps(f["evidence"])
    assert leaked(js.stdout, text.stdout) == []


# ---------------------------------------------------------------------------- run, run.json, report

def test_run_header_run_json_and_report_json_redact_the_command(tmp_path):
    d = tmp_path / "log"
    r = cli("run", "--dir", str(d), "--", PYTHON, "-c", "pass", *ARGS)
    assert r.returncode == 0, r.stderr
    assert "--api-key <redacted>" in " ".join(r.stdout.split())  # the header (wrapped at 80 columns)
    meta = run_meta(d)
    assert meta["command"][3:5] == ["--api-key", "<redacted>"]
    rep = cli("report", str(d), "--json")
    (proc,) = json.loads(rep.stdout)["processes"]
    assert proc["argv"][3:5] == ["--api-key", "<redacted>"]  # the boot probe's own record
    assert leaked(r.stdout, r.stderr, rep.stdout, cli("report", str(d)).stdout) == []
    assert files_holding(d, b"sk-live123") == []


def test_report_redacts_raw_argv_of_older_probes_and_runs(tmp_path):
    """Event files and run.json written before redaction existed hold the raw command line."""
    d = tmp_path / "old"
    d.mkdir(mode=0o700)
    (d / "run.json").write_text(json.dumps({"command": ["python", "serve.py", *ARGS], "notes": [], "boot": True}))
    start = {"ev": "process_start", "t": 1.0, "host": "h", "pid": 5, "src": "boot", "ppid": 1,
             "argv": ["python", "serve.py", *ARGS], "env": {"NCCL_PROTO": "LL"}}
    (d / "h-5.jsonl").write_text(json.dumps(start) + "\n")
    js, text = cli("report", str(d), "--json"), cli("report", str(d))
    assert js.returncode == 0 and text.returncode == 0, js.stderr + text.stderr
    assert leaked(js.stdout, text.stdout) == []
    out = json.loads(js.stdout)
    assert out["processes"][0]["argv"][2:4] == ["--api-key", "<redacted>"]
    assert out["runs"][0]["command"][2:4] == ["--api-key", "<redacted>"]


def test_run_launch_error_does_not_show_an_assignment_as_program(tmp_path):
    r = cli("run", "--dir", str(tmp_path / "l"), "--", "HF_TOKEN=hunter2", "true")
    assert r.returncode == 127 and "command not found" in r.stderr
    assert "hunter2" not in r.stdout + r.stderr and files_holding(tmp_path / "l", b"hunter2") == []


def test_run_json_and_header_never_hold_a_non_watched_expectation(tmp_path):
    d = tmp_path / "l"
    r = cli("run", "--dir", str(d), "--expect", "HF_TOKEN=hunter2", "--expect", "NCCL_PROTO=LL", "--",
            PYTHON, "-c", "pass")
    assert r.returncode == 1, r.stderr  # NCCL_PROTO is not in the environment run gave CMD: ENV_MISSING
    assert run_meta(d)["expect"] == {"HF_TOKEN": "<redacted>", "NCCL_PROTO": "LL"}
    assert "hunter2" not in r.stdout + r.stderr and files_holding(d, b"hunter2") == []


# ---------------------------------------------------------------------------- the profile file

def test_run_removes_its_profile_once_cmd_has_ended(tmp_path):
    d = tmp_path / "log"
    code = "import os; print(len(os.environ['HF_TOKEN']), os.environ['NCCL_PROTO'])"  # CMD got them
    r = cli("run", "--dir", str(d), "--set", "HF_TOKEN=hunter2", "--set", "NCCL_PROTO=LL", "--", PYTHON, "-c", code)
    assert r.returncode == 0 and "7 LL" in r.stdout, r.stderr
    assert files_holding(d, b"hunter2") == []
    assert list(d.glob("boot-*/sitecustomize.py")) and not list(d.glob("boot-*/profile"))
    # the plain case of the task: python -c pass
    r = cli("run", "--dir", str(tmp_path / "pass"), "--set", "HF_TOKEN=hunter2", "--set", "NCCL_PROTO=LL", "--",
            PYTHON, "-c", "pass")
    assert r.returncode == 0 and files_holding(tmp_path / "pass", b"hunter2") == []


def test_run_removes_its_profile_when_cmd_cannot_start(tmp_path):
    d = tmp_path / "log"
    r = cli("run", "--dir", str(d), "--set", "HF_TOKEN=hunter2", "--", "/no/such/program")
    assert r.returncode == 127, r.stderr
    assert files_holding(d, b"hunter2") == []


def test_run_leaves_the_users_own_profile_alone(tmp_path):
    mine = tmp_path / "my.profile"
    mine.write_text("set HF_TOKEN=hunter2\n")
    env = {**os.environ, "NCCLPROBE_PROFILE": str(mine)}
    r = cli("run", "--dir", str(tmp_path / "log"), "--", PYTHON, "-c", "import os; print(os.environ['HF_TOKEN'])",
            env=env)
    assert r.returncode == 0 and "hunter2" in r.stdout and mine.exists()


# ---------------------------------------------------------------------------- option errors

@pytest.mark.parametrize("args", [["--set", "HF_TOKEN=a", "--set", "HF_TOKEN=hunter2"],
                                  ["--set-default", "HF_TOKEN=a", "--set-default", "HF_TOKEN=hunter2"],
                                  ["--pin", "HF_TOKEN=hunter2"], ["--set", "hunter2"],
                                  ["--set", "HF_TOKEN=hunter2", "--set-default", "HF_TOKEN=hunter2"]])
def test_option_errors_never_show_a_non_watched_value(tmp_path, args):
    # inject install gets a --python that does not exist: should the options pass, nothing is installed
    for sub in (["run", "--dir", str(tmp_path / "l"), *args, "--", "true"],
                ["inject", "install", "--python", str(tmp_path / "no-python"), *args]):
        r = cli(*sub)
        assert r.returncode == 2 and "Error:" in r.stderr, (sub, r.stderr)
        assert "hunter2" not in r.stdout + r.stderr, r.stderr
        assert "HF_TOKEN" in r.stderr or "may be a value" in r.stderr


def test_option_errors_still_show_watched_values(tmp_path):
    r = cli("run", "--dir", str(tmp_path / "l"), "--set", "NCCL_PROTO=LL", "--set-default", "NCCL_PROTO=Simple",
            "--", "true")
    assert r.returncode == 2 and "--set-default NCCL_PROTO=Simple" in r.stderr


# ---------------------------------------------------------------------------- the boot probe's own record

def test_boot_probe_redacts_url_passwords_and_new_markers_in_argv(tmp_path):
    env = clean_env()
    env.update(ephemeral_env(env, tmp_path / "log", None))
    code = "import os; print(os.getpid())"
    out = subprocess.run([PYTHON, "-c", code, "--db=postgres://u:dbpw2@h/x", "--auth", "authv5",
                          "--db-passwd=passwd6", "--author", "alice"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    argv = starts_by_pid(tmp_path / "log")[int(out.stdout)]["argv"]
    assert argv[3:] == ["--db=postgres://u:<redacted>@h/x", "--auth", "<redacted>", "--db-passwd=<redacted>",
                        "--author", "alice"]
