"""Process identity: a process is (host, pid namespace, pid, start), and every witness's records join on it.

Inside a pid namespace (`unshare --pid`, a container, a scheduler's sandbox) os.getpid() is the pid in there:
two workers, each the first process of a namespace of its own, are both "pid 1". The probes name a process by
the pid their /proc shows and add the pid in its namespace and the namespace's inode; run's /proc watch says
the same of what it sees; the model joins them, keeps a namespace no witness saw from outside as a pid space
of its own, and splits a pid the kernel gave twice within the run into two processes. Real processes, real
namespaces (root, or a kernel that lets this user unshare), the real probes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_run_watch import NCCLPROBE, Run, records, runs, wait_until  # noqa: F401 (runs: a fixture)

UNSHARE = shutil.which("unshare")


def _can_unshare(*opts: str) -> bool:
    if UNSHARE is None:
        return False
    try:
        return subprocess.run([UNSHARE, "--pid", "--fork", *opts, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


pytestmark = pytest.mark.skipif(not _can_unshare("--mount-proc"), reason="cannot make a pid namespace here")

# A worker: says who it is (its tag, the pid its /proc shows, its own pid), creates one communicator on the
# installed simulated NCCL (so the C probe writes too), then holds until stdin ends where asked.
WORKER = r"""
import json, os, runpy, sys
tag, hold, out = sys.argv[1], sys.argv[2] == "hold", sys.argv[3]
os.write(1, ("worker %s %s %d\n" % (tag, os.readlink("/proc/self"), os.getpid())).encode())
sys.argv = ["simworker", "--mode", "simtorch", "--lib-dir", os.environ["SIM_LIB"], "--out", out,
            json.dumps([["newuid"], ["init", tag, 1, 0]])]
runpy.run_path(os.environ["SIM_WORKER"])["main"]()
if hold:
    sys.stdin.read()
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    from ncclprobe._lib import lib_path
    (tmp_path / "w.py").write_text(WORKER)
    env = {**os.environ, "NCCL_PROTO": "LL", "SIM_LIB": str(lib_path("sim")),
           "SIM_WORKER": str(Path(__file__).parent / "csim" / "simworker.py"),
           "NCCLSIM_ETC_NCCL_CONF": "/nonexistent/nccl.conf", "NCCLSIM_HOME": "/nonexistent", **extra}
    return env


def _launcher(tmp_path: Path, unshare: str, hold: str) -> list[str]:
    """Two workers, each the first process of a pid namespace of its own; `env -u` drops NCCL_PROTO for one."""
    w = tmp_path / "w.py"
    script = tmp_path / "launch.sh"
    script.write_text(f"{unshare} {sys.executable} {w} kept {hold} {tmp_path}/kept.jsonl &\n"
                      f"env -u NCCL_PROTO {unshare} {sys.executable} {w} lost {hold} {tmp_path}/lost.jsonl &\n"
                      "wait\n")
    return ["bash", str(script)]


def _report(d: Path) -> dict:
    r = subprocess.run([*NCCLPROBE, "report", str(d), "--expect", "NCCL_PROTO=LL", "--json"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    return json.loads(r.stdout)


def _workers(out: dict) -> dict[str, dict]:
    """tag -> the JSON process of each worker (by its command line)."""
    got = {}
    for p in out["processes"]:
        argv = p.get("argv") or []
        for tag in ("kept", "lost"):
            if tag in argv and "w.py" in " ".join(argv) and not any(a.endswith("unshare") for a in argv[:1]):
                assert tag not in got, f"two processes for the {tag} worker: {got[tag]} and {p}"
                got[tag] = p
    return got


def test_workers_that_are_each_pid_1_of_their_namespace_are_two_processes_by_their_host_pids(tmp_path):
    """/proc is the host's: the probes name each worker by its host pid, and say it is pid 1 in there."""
    d = tmp_path / "logs"
    r = subprocess.run([*NCCLPROBE, "run", "--dir", str(d), "--expect", "NCCL_PROTO=LL", "--json", "--",
                        *_launcher(tmp_path, f"{UNSHARE} --pid --fork", "go")], env=_env(tmp_path),
                       capture_output=True, text=True, timeout=300)
    said = (r.stdout + r.stderr).splitlines()  # (with --json, CMD's output goes to stderr)
    seen = {w[1]: (int(w[2]), int(w[3])) for w in (x.split() for x in said) if w[:1] == ["worker"]}
    assert set(seen) == {"kept", "lost"} and seen["kept"][1] == seen["lost"][1] == 1, said
    out = json.loads(r.stdout)
    assert r.returncode == 1
    workers = _workers(out)
    for tag, (host_pid, _) in seen.items():
        p = workers[tag]
        assert p["pid"] == host_pid and p["ns_pid"] == 1 and p["host_pid_known"], p
        assert "boot" in p["witnesses"]
        # the C probe's lines (the simulated communicator) joined the same process
        assert [c["pid"] for c in out["communicators"] if c["comm_hash"] and c["pid"] == host_pid], out["communicators"]
    assert workers["kept"]["pidns"] != workers["lost"]["pidns"]
    assert not [p for p in out["processes"] if p["pid"] == 1], "a phantom pid 1"
    [f] = [f for f in out["findings"] if f["severity"] == "error"]
    assert f["code"] == "ENV_MISSING" and f["pids"] == [seen["lost"][0]], f
    assert "did not give it to CMD" not in f["message"]


def test_a_namespace_with_its_own_proc_is_joined_through_the_watch(tmp_path, runs):
    """/proc mounted inside: the probes know only pid 1; run's watch saw each worker from outside (its
    NSpid and namespace), and the model joins the two."""
    run = Run(tmp_path, _launcher(tmp_path, f"{UNSHARE} --pid --fork --mount-proc", "hold"),
              _env(tmp_path, NCCLPROBE_WATCH_S="0.1"))
    runs.append(run)
    wait_until(lambda: sum(x.startswith("worker ") for x in run.lines) == 2, lambda: f"workers: {run.lines}")
    sighted = wait_until(lambda: {e["pid"]: e for e in records(run.dir)
                                  if e["ev"] == "proc_seen" and e.get("ns_pid") == 1 and "w.py" in " ".join(e["argv"])}
                         if len([e for e in records(run.dir) if e["ev"] == "proc_seen" and e.get("ns_pid") == 1
                                 and "w.py" in " ".join(e["argv"])]) == 2 else None,
                         "the watch did not see both workers from outside")
    rc, err = run.release()
    out = _report(run.dir)
    workers = _workers(out)
    by_tag = {tag: pid for pid, e in sighted.items() for tag in ("kept", "lost") if tag in e["argv"]}
    for tag, pid in by_tag.items():
        p = workers[tag]
        assert p["pid"] == pid != 1 and p["ns_pid"] == 1 and p["host_pid_known"], p
        assert {"boot", "proc"} <= set(p["witnesses"]) and p["ppid"] not in (None, 0), p
        assert [c for c in out["communicators"] if c["pid"] == pid and c["comm_hash"]], out["communicators"]
    assert not [p for p in out["processes"] if p["pid"] == 1], "a phantom pid 1"
    [f] = [f for f in out["findings"] if f["severity"] == "error"]
    assert f["pids"] == [by_tag["lost"]], f
    assert f["edge"]["kind"] != "not_in_root" and "did not give it to CMD" not in f["message"], f


def test_a_namespace_no_witness_saw_from_outside_is_a_pid_space_of_its_own(tmp_path):
    """/proc mounted inside and no watch: both workers are only ever "pid 1", each in its namespace. Two
    processes, never merged, and the finding says the edge is outside the namespace, unseen."""
    d = tmp_path / "logs"
    r = subprocess.run([*NCCLPROBE, "run", "--dir", str(d), "--expect", "NCCL_PROTO=LL", "--",
                        *_launcher(tmp_path, f"{UNSHARE} --pid --fork --mount-proc", "go")],
                       env=_env(tmp_path, NCCLPROBE_WATCH_S="0"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    out = _report(d)
    workers = _workers(out)
    assert workers["kept"]["pid"] == workers["lost"]["pid"] == 1
    assert not workers["kept"]["host_pid_known"] and workers["kept"]["pidns"] != workers["lost"]["pidns"]
    [f] = [f for f in out["findings"] if f["severity"] == "error"]
    assert f["pids"] == [1] and len(f["instances"]) == 1, f
    assert str(workers["lost"]["pidns"]) in f["instances"][0]["host"], f
    assert "did not give it to CMD" not in f["message"] and "pid namespace of its own" in f["message"], f
    assert f"1 (in pid ns {workers['lost']['pidns']}, host pid unknown)" in r.stdout, r.stdout


def test_a_pid_the_kernel_gives_twice_is_two_processes(tmp_path):
    """ns_last_pid makes the kernel give pid 2 twice in one namespace: two workers, two processes."""
    w = tmp_path / "w.py"
    again = "echo 1 > /proc/sys/kernel/ns_last_pid"
    inner = (f"{again}; {sys.executable} {w} kept go {tmp_path}/kept.jsonl; sleep 1.5; {again}; "
             f"env -u NCCL_PROTO {sys.executable} {w} lost go {tmp_path}/lost.jsonl; true")
    d = tmp_path / "logs"
    r = subprocess.run([*NCCLPROBE, "run", "--dir", str(d), "--", UNSHARE, "--pid", "--fork", "--mount-proc",
                        "bash", "-c", inner], env=_env(tmp_path, NCCLPROBE_WATCH_S="0"),
                       capture_output=True, text=True, timeout=300)
    seen = {w[1]: int(w[3]) for w in (x.split() for x in r.stdout.splitlines()) if w[:1] == ["worker"]}
    assert r.returncode == 0 and set(seen) == {"kept", "lost"}, r.stdout + r.stderr
    if seen["kept"] != seen["lost"]:
        pytest.skip(f"the kernel did not give the pid again (ns_last_pid refused): {seen}")
    out = _report(d)
    workers = _workers(out)
    assert workers["kept"]["pid"] == workers["lost"]["pid"] == seen["kept"]
    assert workers["kept"]["start"] < workers["lost"]["start"]
    [f] = [f for f in out["findings"] if f["severity"] == "error"]
    assert f["pids"] == [seen["lost"]] and len(f["instances"]) == 1, f
    [row] = [v for v in out["verdict"]["variables"] if v["var"] == "NCCL_PROTO"]
    held = {g["value"]: len(g["communicators"]) for g in row["groups"]}
    assert held == {"LL": 1, None: 1}, row
