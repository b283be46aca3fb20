"""One door: /proc enters the model only as model.Sighting, through model.build._see, whichever witness
read it (inspect's snapshot, run's watch); the same real process read by both is the same process."""
from __future__ import annotations

import ast
import importlib
import inspect
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

from ncclprobe import model
from ncclprobe.commands.inspection import inspect_processes
from ncclprobe.witnesses.procwatch import Scanner

build = importlib.import_module("ncclprobe.model.build")  # (model.build is the function)

# what both witnesses read of a process (the snapshot reads more: libraries, conf files, GPUs, its user)
COMMON = ("host", "pid", "start", "ns_pid", "pidns", "ppid", "argv", "exe", "exec_env", "cwd", "script")
PROC_VIEW = ("ppid", "argv", "exe", "proc_exec_env", "proc_start", "cwd", "script", "sources")


def _watched_child(tmp_path: Path) -> subprocess.Popen:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring"}
    child = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=tmp_path, text=True)
    assert child.stdout.readline() == "ready\n"  # exec'd and running: both witnesses read the same image
    return child


def test_snapshot_and_watch_see_the_same_process(tmp_path):
    child = _watched_child(tmp_path)
    try:
        res = inspect_processes([child.pid], scope="all", gpu_lookup=lambda: ({}, "no NVML in this test"),
                                merge_probe_dirs=False)
        host = res.model.processes and next(iter(res.model.processes))[0]
        (snap,) = [s for s in res.model.sightings if s.pid == child.pid]
        assert snap.witness == "snapshot" and isinstance(snap, model.Sighting)
        found = Scanner(os.getpid(), b"k" * 16).scan(final=True)
        (raw,) = [s for s in found if s.pid == child.pid]
        # run's watch: its proc_seen event, as the event log gives it to build's handler
        e = {"ev": "proc_seen", "host": host, "pid": child.pid, "src": "proc", **raw.fields()}
        m = model.Model()
        b = build._Build(m)
        build.HANDLERS["proc_seen"](b, m.process(host, child.pid), e, raw.t)
        (watched,) = m.sightings
        assert watched.witness == "watch" and isinstance(watched, model.Sighting)
        assert watched.exec_env == {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring"}
        assert {f: getattr(watched, f) for f in COMMON} == {f: getattr(snap, f) for f in COMMON}
        # and the model's process is the same, whichever read it
        a, w = res.model.processes[(host, child.pid)], m.processes[(host, child.pid)]
        assert {f: getattr(a, f) for f in PROC_VIEW} == {f: getattr(w, f) for f in PROC_VIEW}
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_add_proc_view_replays_the_sightings(tmp_path):
    child = _watched_child(tmp_path)
    try:
        res = inspect_processes([child.pid], scope="all", gpu_lookup=lambda: ({}, "no NVML in this test"),
                                merge_probe_dirs=False)
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    m = model.add_proc_view(model.Model(), res.model)
    assert m.sightings == res.model.sightings
    assert m.processes == res.model.processes


def _calls(fn) -> set[str]:
    tree = ast.parse(inspect.getsource(fn).lstrip())
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def _writers(names: set[str]) -> set[str]:
    """The functions of model/build.py that set any of these fields of a process."""
    out = set()
    for fn in ast.walk(ast.parse(inspect.getsource(build))):
        if isinstance(fn, ast.FunctionDef):
            for n in ast.walk(fn):
                targets = n.targets if isinstance(n, ast.Assign) else []
                for t in targets:
                    for a in ast.walk(t):
                        if isinstance(a, ast.Attribute) and a.attr in names:
                            out.add(fn.name)
    return out


def test_every_proc_path_goes_through_see():
    # the watch's handler, a boot probe's read of its parent, inspect's snapshot and another model's view:
    # each hands _see a Sighting, in one line
    for door in (build.HANDLERS["proc_seen"], build.HANDLERS["parent_seen"], build.add_sightings,
                 build.add_proc_view):
        assert "_see" in _calls(door), door.__name__
        assert "Sighting" in _calls(door) or door in (build.add_sightings, build.add_proc_view)
    # and nothing else in the build writes what /proc showed of a process (_spawn forgets an earlier
    # image's sighting after an exec; _cmd_of_runs takes what run gave CMD; _process_start, the start time
    # in the boot probe's own record: none is a sighting)
    shown = {"proc_exec_env", "proc_env_reason", "proc_env_hash", "proc_start", "proc_stale", "proc_expected",
             "nccl_libs", "conf_files", "proc_env_source", "proc_denied_by", "proc_user", "nccl_user", "in_scope"}
    assert _writers(shown) == {"_see", "_seen_now", "_seen_by_child", "_spawn", "_cmd_of_runs",
                               "_process_start"}


def test_a_sighting_field_is_one_line():
    # a field of the observation: one line in the type, read by name in _see (or _seen_now), nowhere else
    names = {f.name for f in fields(model.Sighting)}
    assert {"host", "pid", "start", "ppid", "argv", "exe", "exec_env", "env_reason", "nccl_libs", "conf_files",
            "gpus", "t", "cwd", "script"} <= names
    see = inspect.getsource(build._see) + inspect.getsource(build._seen_now)
    unread = sorted(n for n in names - {"witness", "host", "pid", "t", "ns_pid", "pidns"} if f"s.{n}" not in see)
    assert not unread, f"Sighting fields no door reads: {unread}"
