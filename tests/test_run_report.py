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

NCCLPROBE = [sys.executable, "-m", "ncclprobe"]


def cli(*args, **kw):
    return subprocess.run([*NCCLPROBE, *args], capture_output=True, text=True, timeout=120, **kw)


def test_run_passes_the_exit_code_and_records_the_environment_write(tmp_path):
    d = tmp_path / "logs"
    code = "import os, sys; os.environ['NCCL_PROTO'] = 'Simple'; sys.exit(7)"
    r = cli("run", "--dir", str(d), "--set", "NCCL_PROTO=LL", "--json", "--", sys.executable, "-c", code)
    assert r.returncode == 7, r.stderr
    out = json.loads(r.stdout)
    assert out["schema"] == "ncclprobe/1" and out["command"] == "run" and out["returncode"] == 7
    f = [f for f in out["findings"] if f["code"] == "ENV_OVERRIDDEN"]
    assert f and f[0]["evidence"]["old"] == "LL" and f[0]["evidence"]["new"] == "Simple"
    assert (os.stat(d).st_mode & 0o777) == 0o700
    assert all((os.stat(p).st_mode & 0o777) == 0o600 for p in d.glob("*.jsonl"))
    meta = json.loads((d / "run.json").read_text())
    assert meta["returncode"] == 7 and meta["boot"] is True


def test_run_command_not_found_is_127(tmp_path):
    r = cli("run", "--dir", str(tmp_path / "l"), "--", "/no/such/command-xyz")
    assert r.returncode == 127
    assert "command not found" in r.stderr


def test_run_reports_a_crash_signal(tmp_path):
    r = cli("run", "--dir", str(tmp_path / "l"), "--", sys.executable, "-c",
            "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert r.returncode == 128 + signal.SIGKILL
    assert "killed by SIGKILL" in r.stdout


def test_run_usage_errors_exit_2(tmp_path):
    assert cli("run", "--set", "NOEQUALS", "--", "true").returncode == 2
    assert cli("run", "--set", "1BAD=x", "--", "true").returncode == 2
    assert cli("run").returncode == 2


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
    p.wait(timeout=30)
    time.sleep(0.2)
    alive = [k for k in kids if psutil.pid_exists(k) and psutil.Process(k).status() != psutil.STATUS_ZOMBIE]
    assert alive == []


def test_report_missing_or_empty_directory_exits_3(tmp_path):
    r = cli("report", str(tmp_path / "nope"))
    assert r.returncode == 3 and "no such log directory" in r.stderr
    (tmp_path / "empty").mkdir()
    r = cli("report", str(tmp_path / "empty"), "--json")
    assert r.returncode == 3 and json.loads(r.stdout)["error"]["reason"] == "empty log directory"
    assert cli("report").returncode == 2


def _event(**kw):
    base = {"t": 1.0, "host": "h", "src": "boot"}
    return json.dumps({**base, **kw}) + "\n"


def test_report_skips_torn_garbage_and_unknown_lines_and_counts_them(tmp_path):
    d = tmp_path / "l"
    d.mkdir()
    good = _event(ev="process_start", pid=5, ppid=1, argv=["x"], env={"NCCL_PROTO": "LL"})
    (d / "h-5.jsonl").write_text(good + _event(ev="from_the_future", pid=5) + "{not json\n" + '{"ev": "comm_init", "pi')
    (d / "garbage.jsonl").write_bytes(os.urandom(256) + b"\n")
    (d / "link.jsonl").symlink_to(d / "h-5.jsonl")
    r = cli("report", str(d), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [p["pid"] for p in out["processes"]] == [5]
    skipped = out["skipped"]
    assert skipped["torn or oversized line"] == 1 and skipped["unknown event from_the_future"] == 1
    assert skipped["symlink or special file"] == 1 and skipped.get("malformed line", 0) >= 1


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
    assert "NCCL_PROFILER_PLUGIN=/opt/site/libnccl-profiler-inspector.so was set by you and kept" in r.stdout
    meta = json.loads((d / "run.json").read_text())
    assert meta["plugins"] == ["env"] and meta["preload"] is True


def test_run_without_probes_still_reports_the_boot_view(tmp_path):
    r = cli("run", "--dir", str(tmp_path / "l"), "--no-preload", "--no-plugins", "--json", "--", sys.executable, "-c",
            "import os; print(os.environ.get('LD_PRELOAD', ''), os.environ.get('NCCL_PROFILER_PLUGIN', ''))")
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert r.returncode == 0 and out["runs"][0]["preload"] is False and out["runs"][0]["plugins"] == []
    assert [p["witnesses"] for p in out["processes"]] == [["boot"]]


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
    assert json.loads(r.stdout)["processes"][0]["env"] == {"NCCL_PROTO": "LL"}


def test_run_json_keeps_stdout_for_the_document(tmp_path):
    r = cli("run", "--dir", str(tmp_path / "l"), "--json", "--", sys.executable, "-c", "print('hello from CMD')")
    assert json.loads(r.stdout)["command"] == "run" and "hello from CMD" in r.stderr


def test_run_refuses_an_unwritable_log_directory(tmp_path):
    r = cli("run", "--dir", "/proc/self", "--", "true")
    assert r.returncode == 3 and "Traceback" not in r.stderr


def test_report_missing_nccl_log_is_named(tmp_path):
    r = cli("report", "--nccl-log", str(tmp_path / "nope.log"))
    assert r.returncode == 3 and "nope.log" in r.stderr
