"""Lineage and images: a process's parent is the process that started it, never a subreaper that adopted
it (a daemon that double-forks is re-parented to `ncclprobe run` before or after its boot probe writes its
record: the model must say the same either way), and a pid keeps its images in order: a fork of a Python
driver that exec's a C daemon (Ray's raylet does exactly that) is the daemon from then on, with the fork as
its earlier image, and the rules read it as the exec'd program it is, not as a frozen fork child."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ncclprobe import diagnose, model
from ncclprobe.witnesses.events import EventLog
from test_run_watch import NCCLPROBE, Run, runs, wait_until  # noqa: F401 (runs: a fixture)

CC = shutil.which("cc") or shutil.which("gcc")
DOUBLE_FORK = r"""
import os, sys
r, w = os.pipe()
child = os.fork()
if child == 0:
    if os.fork() == 0:  # the daemon: its parent exits at once, so it is adopted by the subreaper
        os.close(r)
        os.write(w, f"{os.getpid()} {os.getppid()}\n".encode())
        os.close(w)
        os.write(1, f"leaf {os.getpid()} {os.getppid()}\n".encode())
        sys.stdin.read()
        os._exit(0)
    os._exit(0)
os.close(w)
os.waitpid(child, 0)
os.write(1, f"daemon {os.read(r, 100).decode().split()[0]} intermediate {child}\n".encode())
sys.stdin.read()
"""
DAEMON_C = r"""
#include <stdio.h>
#include <unistd.h>
int main(void) { printf("leaf %d %d\n", getpid(), getppid()); fflush(stdout); char b[1]; while (read(0, b, 1) > 0) {} return 0; }
"""
FORK_EXEC = r"""
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], [sys.argv[1], "--node-manager"])
os.environ["NCCL_PROTO"] = "LL"  # after the fork: the daemon never gets it
os.waitpid(pid, 0)
"""


def test_a_double_forked_daemon_has_the_process_that_forked_it_as_its_parent(tmp_path, runs):
    run = Run(tmp_path, [sys.executable, "-c", DOUBLE_FORK], {**os.environ, "NCCL_PROTO": "LL"})
    runs.append(run)
    line = wait_until(lambda: next((x for x in run.lines if x.startswith("daemon ")), None),
                      f"no daemon line: {run.lines}")
    daemon, intermediate = int(line.split()[1]), int(line.split()[3])
    run.proc.stdin.close()  # the driver ends; the daemon holds stdin too: the keeper ends it with the run
    run.proc.wait(timeout=60)
    m = model.build(EventLog(events=[e for e in _events(run.dir)]))
    (d,) = [p for p in m.processes.values() if p.pid == daemon]
    assert d.ppid == intermediate and d.forked_from == intermediate
    assert d.adopted_by in (None, run.proc.pid) or d.adopted_by != intermediate
    assert [f for f in diagnose.rules(m, {"NCCL_PROTO": "LL"}) if f.severity == "error"] == []


def _events(d):
    from ncclprobe.witnesses import events
    return list(events.read_dirs([d]).events)


def test_adoption_recorded_before_the_boot_record_does_not_change_the_parent():
    """The race the real test cannot force: the intermediate gone before the daemon's record is written."""
    base = {"src": "boot", "host": "h", "argv": ["python", "d.py"], "exe": "/usr/bin/python3", "env": {"NCCL_PROTO": "LL"}}
    evs = [{**base, "ev": "process_start", "t": 1.0, "pid": 10, "ppid": 1},
           {**base, "ev": "process_start", "t": 1.1, "pid": 11, "ppid": 10, "forked_from": 10, "mode": "fork"},
           {**base, "ev": "process_start", "t": 1.2, "pid": 12, "ppid": 1, "forked_from": 11, "mode": "fork"}]
    m = model.build(EventLog(events=evs))
    p = m.processes[("h", 12)]
    assert (p.ppid, p.adopted_by) == (11, 1) and m.parent(p).pid == 11


@pytest.fixture(scope="module")
def raylet(tmp_path_factory):
    if not CC:
        pytest.skip("needs a C compiler")
    d = tmp_path_factory.mktemp("raylet")
    (d / "raylet.c").write_text(DAEMON_C)
    subprocess.run([CC, "-O1", "-o", str(d / "raylet"), str(d / "raylet.c")], check=True, capture_output=True)
    return d / "raylet"


def test_a_fork_that_execs_a_daemon_is_the_daemon_with_the_fork_as_its_earlier_image(tmp_path, runs, raylet):
    env = {k: v for k, v in os.environ.items() if k != "NCCL_PROTO"}
    run = Run(tmp_path, [sys.executable, "-c", FORK_EXEC, str(raylet)], {**env, "NCCLPROBE_WATCH_S": "0.05"})
    runs.append(run)
    (pid, _), = run.leaves(1).items()
    wait_until(lambda: any(e["ev"] == "proc_seen" and e["pid"] == pid and str(e.get("exe", "")).endswith("raylet")
                           for e in _events(run.dir)), "the watch never saw the daemon's image")
    run.release()
    out = subprocess.run([*NCCLPROBE, "report", "--json", str(run.dir), "--expect", "NCCL_PROTO=LL"],
                         capture_output=True, text=True, timeout=120)
    doc = json.loads(out.stdout)
    (p,) = [p for p in doc["processes"] if p["pid"] == pid]
    assert p["exec_after_boot"] and p["argv"][0].endswith("raylet") and p["earlier_argv"]
    assert p["earlier_argv"][0][0].endswith(("python", "python3")) or "python" in p["earlier_argv"][0][0]
    (f,) = [f for f in doc["findings"] if f["severity"] == "error" and pid in f["pids"]]
    assert f["edge"]["kind"] == "set_after_start" and f["edge"]["via"] == "exec"
    assert "Pool" not in f["hint"] and "ray.init" in f["hint"]
