"""`ncclprobe run` and `ncclprobe report` as a user runs them: real processes, real exit codes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from rundirs import run_meta

NCCLPROBE = [sys.executable, "-m", "ncclprobe"]


def cli(*args, **kw):
    return subprocess.run([*NCCLPROBE, *args], capture_output=True, text=True, timeout=120, **kw)


def test_run_passes_the_exit_code_and_records_the_environment_write(tmp_path):
    d = tmp_path / "logs"
    code = "import os, sys; os.environ['NCCL_PROTO'] = 'Simple'; sys.exit(7)"
    r = cli("run", "--dir", str(d), "--set", "NCCL_PROTO=LL", "--json", "--", sys.executable, "-c", code)
    assert r.returncode == 7, r.stderr
    out = json.loads(r.stdout)
    assert out["schema"] == "ncclprobe/2" and out["command"] == "run" and out["returncode"] == 7
    f = [f for f in out["findings"] if f["code"] == "ENV_OVERRIDDEN"]
    assert f and f[0]["evidence"]["old"] == "LL" and f[0]["evidence"]["new"] == "Simple"
    assert (os.stat(d).st_mode & 0o777) == 0o700
    assert all((os.stat(p).st_mode & 0o777) == 0o600 for p in d.glob("*.jsonl"))
    meta = run_meta(d)
    assert meta["returncode"] == 7 and meta["boot"] is True


def _launch_targets(tmp_path) -> dict[str, tuple[str, int, str, str]]:
    """name -> (CMD, exit code, error.reason, words of the message), as bash says them."""
    plain = tmp_path / "not-executable.sh"
    plain.write_text("echo hi\n")
    plain.chmod(0o644)  # no x bit at all: execve refuses even root (EACCES)
    crlf = tmp_path / "crlf.sh"
    crlf.write_bytes(b"#!/bin/sh\r\necho hi\r\n")  # a script saved on Windows: its interpreter is '/bin/sh\r'
    crlf.chmod(0o755)
    (tmp_path / "a-directory").mkdir()
    return {"not found": ("no-such-command-xyz", 127, "command_not_found", "no-such-command-xyz: command not found"),
            "not found by path": ("/no/such/command-xyz", 127, "command_not_found", "command not found"),
            "not executable": (str(plain), 126, "permission_denied", "Permission denied"),
            "directory": (str(tmp_path / "a-directory"), 126, "is_a_directory", "Is a directory"),
            "bad interpreter": (str(crlf), 127, "interpreter_not_found", "interpreter /bin/sh\\r not found")}


@pytest.mark.parametrize("case", ["not found", "not found by path", "not executable", "directory", "bad interpreter"])
def test_a_command_that_cannot_start_is_one_error_and_leaves_no_directory(tmp_path, case):
    cmd, code, reason, words = _launch_targets(tmp_path)[case]
    tmp = tmp_path / "tmp"  # where a fresh log directory would go
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    r = cli("run", "--", cmd, env=env)
    assert r.returncode == code, r.stderr
    assert r.stdout == "" and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr
    j = cli("run", "--json", "--", cmd, env=env)
    assert j.returncode == code and j.stderr == ""
    out = json.loads(j.stdout)
    assert out["command"] == "run" and out["error"]["reason"] == reason and words in out["error"]["message"]
    assert list(tmp.iterdir()) == []


def test_a_given_directory_keeps_the_launch_failure_in_run_json(tmp_path):
    d = tmp_path / "l"
    r = cli("run", "--dir", str(d), "--", "/no/such/command-xyz")
    assert r.returncode == 127 and "command not found" in r.stderr and r.stdout == ""
    meta = run_meta(d)
    assert meta["error"]["reason"] == "command_not_found" and meta["status"].startswith("not started")
    q = cli("run", "--dir", str(d), "--append", "--quiet", "--json", "--", "/no/such/command-xyz")  # --quiet: no report, still the error
    assert q.returncode == 127 and json.loads(q.stdout)["error"]["reason"] == "command_not_found"


def test_run_reports_a_crash_signal(tmp_path):
    r = cli("run", "--dir", str(tmp_path / "l"), "--", sys.executable, "-c",
            "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert r.returncode == 128 + signal.SIGKILL
    assert "killed by SIGKILL" in r.stdout


def test_run_usage_errors_exit_2(tmp_path):
    assert cli("run", "--set", "NOEQUALS", "--", "true").returncode == 2
    assert cli("run", "--set", "1BAD=x", "--", "true").returncode == 2
    assert cli("run").returncode == 2


def test_unknown_options_before_cmd_are_usage_errors_and_run_nothing(tmp_path):
    ran = tmp_path / "ran"
    r = cli("run", "--bogus", "--", "touch", str(ran))
    assert r.returncode == 2 and "No such option '--bogus'" in r.stderr
    r = cli("run", "--strcit", "--", "touch", str(ran))
    assert r.returncode == 2 and "Did you mean" in r.stderr and "--strict" in r.stderr
    assert not ran.exists()


def test_options_after_the_first_word_of_cmd_are_cmds(tmp_path):
    r = cli("run", "--dir", str(tmp_path / "l"), sys.executable, "-c", "import sys; print(sys.argv[1:])", "--foo", "--json")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "['--foo', '--json']"


def _override(exit_code: int = 0) -> list[str]:
    """CMD that overwrites the --set value in-process (ENV_OVERRIDDEN, a warning), then exits."""
    return ["--set", "NCCL_PROTO=LL", "--", sys.executable, "-c",
            f"import os, sys; os.environ['NCCL_PROTO'] = 'Simple'; sys.exit({exit_code})"]


def test_strict_fails_a_successful_run_on_warnings_and_keeps_cmds_own_failure(tmp_path):
    plain = cli("run", "--dir", str(tmp_path / "a"), *_override())
    assert plain.returncode == 0 and "ENV_OVERRIDDEN" in plain.stdout
    assert cli("run", "--dir", str(tmp_path / "b"), "--strict", *_override()).returncode == 1
    assert cli("run", "--dir", str(tmp_path / "c"), "--strict", "--quiet", *_override()).returncode == 1
    assert cli("run", "--dir", str(tmp_path / "d"), "--strict", *_override(7)).returncode == 7


def _sim_worker(tmp_path, exit_code: int = 0) -> list[str]:
    """A process that creates one communicator on the installed simulated NCCL, then exits."""
    from ncclprobe._lib import lib_path
    worker = Path(__file__).parent / "csim" / "simworker.py"
    argv = ["simworker", "--mode", "simtorch", "--lib-dir", str(lib_path("sim")), "--out", str(tmp_path / "w.jsonl"),
            json.dumps([["newuid"], ["init", "a", 1, 0]])]
    code = (f"import runpy, sys; sys.argv = {argv!r}; runpy.run_path({str(worker)!r})['main'](); "
            f"sys.exit({exit_code})")
    return [sys.executable, "-c", code]


def test_an_unmet_expectation_fails_a_successful_run(tmp_path):
    env = {**os.environ, "NCCLSIM_ETC_NCCL_CONF": "/nonexistent/nccl.conf", "NCCLSIM_HOME": "/nonexistent"}
    env.pop("NCCL_PROTO", None)
    r = cli("run", "--dir", str(tmp_path / "a"), "--expect", "NCCL_PROTO=LL", "--json", "--", *_sim_worker(tmp_path),
            env=env)
    out = json.loads(r.stdout)
    assert [f["code"] for f in out["findings"]] == ["ENV_MISSING"] and out["returncode"] == 0
    assert r.returncode == 1
    r = cli("run", "--dir", str(tmp_path / "b"), "--expect", "NCCL_PROTO=LL", "--", *_sim_worker(tmp_path, 5), env=env)
    assert r.returncode == 5 and "ENV_MISSING" in r.stdout
    r = cli("run", "--dir", str(tmp_path / "c"), "--expect", "NCCL_PROTO=LL", "--", *_sim_worker(tmp_path),
            env={**env, "NCCL_PROTO": "LL"})
    assert r.returncode == 0 and "ENV_MISSING" not in r.stdout


def test_without_a_communicator_the_expectation_is_checked_on_each_process_and_the_report_says_so(tmp_path):
    r = cli("run", "--dir", str(tmp_path / "l"), "--expect", "NCCL_PROTO=LL", "--", sys.executable, "-c", "pass")
    assert r.returncode == 1 and "No communicator was seen: --expect NCCL_PROTO=LL was checked on each process" in \
        " ".join(r.stdout.split())  # wrapped at 80 columns
    out = json.loads(cli("report", str(tmp_path / "l"), "--expect", "NCCL_PROTO=LL", "--json").stdout)
    [f] = [f for f in out["findings"] if f["severity"] == "error"]
    assert f["code"] == "ENV_MISSING" and f["var"] == "NCCL_PROTO" and f["edge"]["kind"] == "not_in_root"
    r = cli("run", "--dir", str(tmp_path / "m"), "--set", "NCCL_PROTO=LL", "--expect", "NCCL_PROTO=LL", "--",
            sys.executable, "-c", "pass")
    assert r.returncode == 0, r.stdout


def test_ctrl_c_leaves_no_process_behind(tmp_path):
    marker = tmp_path / "started"
    script = (f"import subprocess, sys, time, pathlib; "
              f"kids = [subprocess.Popen(['sleep', '300']) for _ in range(3)]; "
              f"pathlib.Path({str(marker)!r}).write_text(' '.join(str(k.pid) for k in kids)); time.sleep(300)")
    p = subprocess.Popen([*NCCLPROBE, "run", "--dir", str(tmp_path / "l"), "--quiet", "--", sys.executable, "-c", script],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists()
    kids = [int(x) for x in marker.read_text().split()]
    p.send_signal(signal.SIGINT)
    p.wait(timeout=60)
    alive = [k for k in kids if psutil.pid_exists(k) and psutil.Process(k).status() != psutil.STATUS_ZOMBIE]
    assert alive == []  # run returns only once every process of the tree is gone


def test_report_missing_or_empty_directory_exits_3(tmp_path):
    r = cli("report", str(tmp_path / "nope"))
    assert r.returncode == 3 and "no such log directory" in r.stderr
    (tmp_path / "empty").mkdir()
    r = cli("report", str(tmp_path / "empty"), "--json")
    assert r.returncode == 3 and json.loads(r.stdout)["error"]["reason"] == "empty_log_directory"
    assert cli("report").returncode == 2


def _event(**kw):
    base = {"t": 1.0, "host": "h", "src": "boot"}
    return json.dumps({**base, **kw}) + "\n"


def test_report_skips_torn_garbage_and_unknown_lines_and_counts_them(tmp_path):
    d = tmp_path / "l"
    d.mkdir()
    good = _event(ev="process_start", pid=5, ppid=1, argv=["x"], env={"NCCL_PROTO": "LL"})
    (d / "h-5.jsonl").write_text(good + _event(ev="from_the_future", pid=5) + "{not json\n" + '{"ev": "comm_init", "pi')
    (d / "garbage.jsonl").write_bytes(bytes(11 + b % 245 for b in os.urandom(256)) + b"\n")  # one line: no \0, no \n
    (d / "link.jsonl").symlink_to(d / "h-5.jsonl")
    r = cli("report", str(d), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [p["pid"] for p in out["processes"]] == [5]
    skipped = out["skipped"]
    assert skipped["torn line"] == 1 and skipped["unknown event from_the_future"] == 1
    assert skipped["symlink (not followed)"] == 1 and skipped["not JSON"] == 2
    assert out["reading"]["lines_skipped"] == 4 and out["reading"]["files_skipped"] == 1


def test_report_merges_several_hosts(tmp_path):
    for host, pid in (("a", 1), ("b", 1)):
        d = tmp_path / host
        d.mkdir()
        env = {"NCCL_PROTO": "LL" if host == "a" else "Simple"}
        line = json.dumps({"ev": "comm_init", "t": 1.0, "host": host, "pid": pid, "src": "preload", "api": "ncclCommInitRank",
                           "call": 1, "comm": "0x1", "rank": 0 if host == "a" else 1, "nranks": 2, "uid": "u",
                           "env": env, "rc": 0})
        (d / f"{host}-{pid}.jsonl").write_text(line + "\n")
    r = cli("report", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 1  # COMM_RANKS_DIVERGENT is an error
    assert {c["host"] for c in out["communicators"]} == {"a", "b"}
    assert [f["code"] for f in out["findings"]] == ["COMM_RANKS_DIVERGENT"]


def test_run_keeps_a_profiler_plugin_the_user_set_and_says_so(tmp_path):
    d = tmp_path / "l"
    env = {**os.environ, "NCCL_PROFILER_PLUGIN": "/opt/site/libnccl-profiler-inspector.so"}
    code = "import os; print(os.environ['NCCL_PROFILER_PLUGIN'], os.environ['NCCL_ENV_PLUGIN'], os.environ['LD_PRELOAD'])"
    r = subprocess.run([*NCCLPROBE, "run", "--dir", str(d), "--", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    seen_profiler, seen_env, preload = r.stdout.splitlines()[0].split()
    assert seen_profiler == "/opt/site/libnccl-profiler-inspector.so"
    assert seen_env.endswith("libncclprobe.so") and preload.split()[0].endswith("libncclprobe.so")
    assert "NCCL_PROFILER_PLUGIN=/opt/site/libnccl-profiler-inspector.so was set by you and kept" in \
        " ".join(r.stdout.split())  # wrapped at 80 columns
    meta = run_meta(d)
    assert meta["plugins"] == ["env"] and meta["preload"] is True


def test_run_without_probes_still_reports_the_boot_view(tmp_path):
    r = cli("run", "--dir", str(tmp_path / "l"), "--no-preload", "--no-plugins", "--json", "--", sys.executable, "-c",
            "import os; print(os.environ.get('LD_PRELOAD', ''), os.environ.get('NCCL_PROFILER_PLUGIN', ''))")
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert r.returncode == 0 and out["runs"][0]["preload"] is False and out["runs"][0]["plugins"] == []
    # proc: run's /proc watch, where a scan saw the short-lived process; run: CMD as run started it
    assert [sorted(set(p["witnesses"]) - {"proc"}) for p in out["processes"]] == [["boot", "run"]]


def test_strict_turns_warnings_into_exit_1(tmp_path):
    d = tmp_path / "l"
    d.mkdir()
    w = {"ev": "env_write", "t": 2.0, "host": "h", "pid": 5, "src": "boot", "var": "NCCL_PROTO", "old": "LL",
         "new": "Simple", "where": "engine.py:3 f", "op": "set", "blocked": False}
    (d / "h-5.jsonl").write_text(json.dumps(w) + "\n")
    plain = cli("report", str(d))
    assert plain.returncode == 0 and "ENV_OVERRIDDEN" in plain.stdout  # a warning only
    assert cli("report", str(d), "--strict").returncode == 1


def test_report_drops_unwatched_variables_from_foreign_event_files(tmp_path):
    d = tmp_path / "l"
    d.mkdir()
    e = {"ev": "process_start", "t": 1.0, "host": "h", "pid": 5, "src": "boot", "ppid": 1,
         "env": {"NCCL_PROTO": "LL", "HF_TOKEN": "sekrit123", "AWS_SECRET_ACCESS_KEY": "abc"}}
    (d / "h-5.jsonl").write_text(json.dumps(e) + "\n")
    r = cli("report", str(d), "--json")
    assert r.returncode == 0 and "sekrit123" not in r.stdout and "HF_TOKEN" not in r.stdout
    assert json.loads(r.stdout)["processes"][0]["start_env"] == {"NCCL_PROTO": "LL"}


def test_run_json_keeps_stdout_for_the_document(tmp_path):
    r = cli("run", "--dir", str(tmp_path / "l"), "--json", "--", sys.executable, "-c", "print('hello from CMD')")
    assert json.loads(r.stdout)["command"] == "run" and "hello from CMD" in r.stderr


def test_run_refuses_an_unwritable_log_directory(tmp_path):
    r = cli("run", "--dir", "/proc/self", "--", "true")
    assert r.returncode == 3 and "Traceback" not in r.stderr


def test_report_missing_nccl_log_is_named(tmp_path):
    r = cli("report", "--nccl-log", str(tmp_path / "nope.log"))
    assert r.returncode == 3 and "nope.log" in r.stderr
