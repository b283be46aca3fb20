"""The edge witness, on real interpreters under a real `ncclprobe run`: the boot probe in a Python process records
each process it starts (`spawn`: subprocess.Popen, os.execve, os.posix_spawn, multiprocessing's spawn), and a
worker started with an environment of its own that drops the probes (PYTHONPATH, NCCLPROBE_DIR) and NCCL_PROTO,
living ~10 ms (`python -S -c`), is named with that edge in the scan mode (NCCLPROBE_WATCH_KERNEL=0: no kernel
events; the 0.5 s /proc watch may well miss it). Ground truth is the worker's own pid, written by the worker."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from boot_support import clean_env, events

ROOT = Path(__file__).resolve().parent.parent
NCCLPROBE = [sys.executable, "-m", "ncclprobe"]
# the worker: writes its pid and exits (no site: nothing of the probe could reach it anyway)
WORKER = "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid()))"
PARENTS = {
    "popen": ("subprocess.Popen", f"""
import os, subprocess, sys
cmd = [sys.executable, "-S", "-c", {WORKER!r}, sys.argv[1]]
subprocess.Popen(cmd, env={{"PATH": os.environ["PATH"]}}).wait()  # EDGE
"""),
    "posix_spawn": ("os.posix_spawn", f"""
import os, sys
pid = os.posix_spawn(sys.executable, [sys.executable, "-S", "-c", {WORKER!r}, sys.argv[1]], {{"PATH": os.environ["PATH"]}})  # EDGE
open(sys.argv[1] + ".returned", "w").write(str(pid))
os.waitpid(pid, 0)
"""),
    "execve": ("os.execve", f"""
import os, sys
os.execve(sys.executable, [sys.executable, "-S", "-c", {WORKER!r}, sys.argv[1]], {{"PATH": os.environ["PATH"]}})  # EDGE
"""),
}


def _run(tmp_path: Path, cmd: list[str], *expect: str, stdin=None, **extra: str) -> tuple[subprocess.CompletedProcess,
                                                                                          dict]:
    env = clean_env(NCCL_PROTO="LL", NCCLPROBE_WATCH_KERNEL="0", **extra)
    args = [*NCCLPROBE, "run", "--json", "--dir", str(tmp_path / "logs")]
    for e in expect:
        args += ["--expect", e]
    out = subprocess.run([*args, "--", *cmd], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT,
                         stdin=stdin)
    return out, json.loads(out.stdout)  # (with --json, what CMD prints goes to stderr)


def _line(script: str) -> int:
    return next(i for i, text in enumerate(script.splitlines(), 1) if text.endswith("# EDGE"))


@pytest.mark.parametrize("how", sorted(PARENTS))
def test_a_short_lived_curated_env_worker_is_named_with_its_edge_in_scan_mode(tmp_path, how):
    call, script = PARENTS[how]
    parent = tmp_path / "parent.py"
    parent.write_text(script.lstrip())
    pidfile = tmp_path / "worker.pid"
    out, doc = _run(tmp_path, [sys.executable, str(parent), str(pidfile)], "NCCL_PROTO=LL")
    worker = int(pidfile.read_text())
    assert out.returncode == 1, (out.stdout, out.stderr)
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert [f["code"] for f in errors] == ["ENV_MISSING"], errors
    f = errors[0]
    assert f["pids"] == [worker]
    edge = f["edge"]
    sp = edge["spawn"]
    assert edge["kind"] == "curated_env" and sp["call"] == call
    assert sp["where"] == f"{parent}:{_line(script.lstrip())}"
    assert sp["env_given"] is True and sp["env_count"] == 1 and sp["exec"] is (how == "execve")
    assert sp["child"] == (None if how == "execve" else worker)
    assert f"`parent.py:{_line(script.lstrip())}`" in f["message"] and "env={1 variable}" in f["message"]
    assert "NCCL_PROTO not passed" in f["message"]
    assert "env=" in f["hint"] and "NCCL_PROTO=LL" in f["hint"]
    if how == "posix_spawn":  # what the call returned is what ran
        assert int((tmp_path / "worker.pid.returned").read_text()) == worker
    # the record itself: the watched part of what was passed, no other name
    (rec,) = [e for e in events(tmp_path / "logs", "spawn") if (e.get("where") or "").endswith("parent.py:%d" % _line(
        script.lstrip()))]
    assert rec["env"] == {} and rec["env_count"] == 1 and "PATH" not in json.dumps(rec["env"])


def test_multiprocessing_spawn_records_the_child_it_started_with_the_callers_line(tmp_path):
    script = """
import multiprocessing as mp, os, sys

def work(path):
    open(path, "w").write(str(os.getpid()))

if __name__ == "__main__":
    p = mp.get_context("spawn").Process(target=work, args=(sys.argv[1],))
    p.start()  # EDGE
    p.join()
""".lstrip()
    parent = tmp_path / "parent.py"
    parent.write_text(script)
    pidfile = tmp_path / "worker.pid"
    out, doc = _run(tmp_path, [sys.executable, str(parent), str(pidfile)], "NCCL_PROTO=LL")
    worker = int(pidfile.read_text())
    assert out.returncode == 0, (out.stdout, out.stderr)
    recs = [e for e in events(tmp_path / "logs", "spawn") if e.get("child") == worker]
    assert len(recs) == 1, recs
    rec = recs[0]
    assert rec["call"] == "multiprocessing" and rec["where"] == f"{parent}:{_line(script)}"
    assert rec["env_given"] is False and rec["env"]["NCCL_PROTO"] == "LL" and rec["exec"] is False


def test_a_call_that_starts_nothing_is_no_edge_and_raises_as_before(tmp_path):
    script = """
import os, subprocess, sys
try:
    subprocess.run(["/nonexistent/prog"], env={})
except FileNotFoundError:
    print("raised")
try:
    os.execvpe("no-such-program-here", ["x"], {"PATH": "/nonexistent"})
except FileNotFoundError:
    print("raised")
subprocess.run(["true"])
"""
    parent = tmp_path / "parent.py"
    parent.write_text(script)
    out, _ = _run(tmp_path, [sys.executable, str(parent)])
    assert out.stderr.count("raised") == 2 and out.returncode == 0, (out.stdout, out.stderr)  # (--json: CMD on stderr)
    recs = events(tmp_path / "logs", "spawn")
    assert [(r["call"], r["argv"]) for r in recs] == [("subprocess.Popen", ["true"])], recs


@pytest.mark.parametrize("variant,code", [("fail-nopythonpath", 1), ("ok", 0)])
def test_the_subprocess_env_example_as_typed_in_scan_mode(tmp_path, variant, code):
    # NCCL_PROTO=LL ncclprobe run --expect NCCL_PROTO=LL -- python examples/subprocess_env/main.py VARIANT
    out, doc = _run(tmp_path, [sys.executable, "examples/subprocess_env/main.py", variant], "NCCL_PROTO=LL")
    assert out.returncode == code, (out.stdout, out.stderr)
    if code:
        (f,) = [f for f in doc["findings"] if f["severity"] == "error"]
        assert f["code"] == "ENV_MISSING" and f["edge"]["spawn"]["where"].endswith("examples/subprocess_env/main.py:37")
        assert "`main.py:37`" in f["message"] and "_worker.py" in f["message"]


def test_an_expectation_the_edge_record_cannot_hold_is_not_checked_there(tmp_path):
    # FOO is outside the watched set: the record of the call holds none of it, and no witness read the worker
    # (the /proc watch is off: a scan that caught the worker would read FOO there, and check it)
    out, doc = _run(tmp_path, [sys.executable, "examples/subprocess_env/main.py", "ok-nopythonpath"],
                    "NCCL_PROTO=LL", "FOO=1", FOO="1", NCCLPROBE_WATCH_S="0")
    assert out.returncode == 3, (out.stdout, out.stderr)
    un = doc["verdict"]["unchecked"]
    assert un and len(un["unread"]) == 1 and "FOO" in un["reason"] and "main.py:37" in un["reason"]
    assert not [f for f in doc["findings"] if f["severity"] == "error"]


def test_each_way_python_starts_a_process_is_named_as_the_caller_spelled_it(tmp_path):
    # fork children that exec (os.spawnlp, pty.spawn) record from the child, asyncio goes through Popen
    script = """
import asyncio, os, pty, subprocess

async def co():
    p = await asyncio.create_subprocess_exec("true")  # asyncio
    await p.wait()

asyncio.run(co())
os.spawnlp(os.P_WAIT, "true", "true")  # spawnlp
pty.spawn(["true"])  # pty
pid = os.posix_spawnp("true", ["true"], dict(os.environ))  # posix_spawnp
os.waitpid(pid, 0)
""".lstrip()
    parent = tmp_path / "parent.py"
    parent.write_text(script)
    out, _ = _run(tmp_path, [sys.executable, str(parent)], stdin=subprocess.DEVNULL)
    assert out.returncode == 0, (out.stdout, out.stderr)
    lines = {text.rsplit("# ", 1)[1]: i for i, text in enumerate(script.splitlines(), 1) if "# " in text}
    got = {(r["call"], r["where"], r["exec"]) for r in events(tmp_path / "logs", "spawn")}
    assert got == {("subprocess.Popen", f"{parent}:{lines['asyncio']}", False),
                   ("os.spawnlp", f"{parent}:{lines['spawnlp']}", True),
                   ("pty.spawn", f"{parent}:{lines['pty']}", True),
                   ("os.posix_spawnp", f"{parent}:{lines['posix_spawnp']}", False)}, got
