"""The verdict line is never empty: every expected variable lists who holds which value, and "no witness
read it" is a value (`?` in the text, "?" in JSON, its culprit saying so) -- for a worker whose
environment no witness read (gone before the watch could read it), beside workers that were read, where
the only processes are clients, and on examples/env_i/fail.sh typed as its README gives it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NCCLPROBE = [sys.executable, "-m", "ncclprobe"]
T0 = 1.7e9


def seen(pid: int, ppid: int, argv: list[str], env: dict | None, reason: str | None = None, dt: float = 0.0) -> dict:
    return {"ev": "proc_seen", "t": T0 + dt, "host": "h", "pid": pid, "src": "proc", "ppid": ppid, "start": T0 + dt,
            "argv": argv, "exe": "/usr/bin/" + argv[0], "exec_env": env, "env_reason": reason}


def report(tmp_path: Path, *events: dict) -> tuple[dict, str]:
    (tmp_path / "h-100.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    args = [*NCCLPROBE, "report", "--expect", "NCCL_PROTO=LL", str(tmp_path)]
    js = subprocess.run([*args, "--json"], capture_output=True, text=True, timeout=120)
    text = subprocess.run(args, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    return json.loads(js.stdout), text.stdout


def row(d: dict, var: str = "NCCL_PROTO") -> dict:
    (r,) = [r for r in d["verdict"]["variables"] if r["var"] == var]
    return r


def line(text: str, var: str = "NCCL_PROTO") -> str:
    (hit,) = [x for x in text.splitlines() if x.startswith(var + " ")]
    return hit


def test_a_worker_no_witness_read_holds_the_value_unread(tmp_path):
    d, text = report(tmp_path, seen(100, 1, ["bash", "job.sh"], {"NCCL_PROTO": "LL"}),
                     seen(101, 100, ["python3", "w.py"], None, "vanished", 0.5))
    (g,) = row(d)["groups"]
    assert g["value"] == "?" and g["culprit"] == "no witness read it" and g["pids"] == [101], g
    assert line(text).split(None, 1)[1] == "?: 1 process (pid 101); no witness read it", text
    # and NOT CHECKED says how it was missed, with what would read it next time
    un = d["verdict"]["unchecked"]
    assert un["reason"] == ("not checked: 1 process of the tree known to have run whose environment no witness read, "
                            "and that ran no probe: pid 101 (/proc showed it only as it ended)"), un
    assert un["unread"] == [101] and "the kernel's process events" in un["hint"], un
    assert "pid 101 (/proc showed it only as it ended)" in " ".join(text.split()), text


def test_unread_beside_read_workers(tmp_path):
    d, text = report(tmp_path, seen(100, 1, ["bash", "job.sh"], {"NCCL_PROTO": "LL"}),
                     seen(101, 100, ["python3", "w.py"], {"NCCL_PROTO": "LL"}, dt=0.5),
                     seen(102, 100, ["python3", "w.py"], None, "permission", 0.5))
    groups = {g["value"]: g for g in row(d)["groups"]}
    assert set(groups) == {"LL", "?"} and groups["LL"]["pids"] == [101] and groups["?"]["pids"] == [102], groups
    assert groups["?"]["culprit"] == "no witness read it"
    assert "LL (expected): 1 process (pid 101)" in line(text) and "?: 1 process (pid 102); no witness read it" in line(text)


def test_only_clients_still_give_a_value(tmp_path):
    d, text = report(tmp_path, seen(100, 1, ["srun", "-N2", "python3", "w.py"], {"NCCL_PROTO": "LL"}))
    (g,) = row(d)["groups"]
    assert g["value"] == "?" and g["culprit"], g
    assert line(text).split(None, 1)[1].startswith("?: "), text


def test_examples_env_i_fail_as_typed_lists_its_worker(tmp_path):
    """examples/env_i/README.md: `NCCL_PROTO=LL ncclprobe run --expect NCCL_PROTO=LL -- bash examples/env_i/fail.sh`
    from the repository root, no --hold."""
    # python3 as an activated virtual environment gives it (a pyenv shim runs helpers of its own before it execs)
    env = {**os.environ, "NCCL_PROTO": "LL", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    p = subprocess.run([*NCCLPROBE, "run", "--json", "--dir", str(tmp_path / "logs"), "--expect", "NCCL_PROTO=LL",
                        "--", "bash", "examples/env_i/fail.sh"], cwd=EXAMPLES.parent, env=env, capture_output=True,
                       text=True, timeout=120)
    d = json.loads(p.stdout)
    r = row(d)
    assert r["groups"] and all(g["pids"] for g in r["groups"]), r
    workers = {q["pid"] for q in d["processes"] if any(a.endswith("_worker.py") for a in q["argv"] or [])}
    assert workers and workers <= {pid for g in r["groups"] for pid in g["pids"]}, (workers, r)
    assert p.returncode == 1, p.stderr


def test_no_worker_read_names_those_seen_only_as_they_ended_beside_the_unreadable(tmp_path):
    d, text = report(tmp_path, seen(100, 1, ["bash", "job.sh"], {"NCCL_PROTO": "LL"}),
                     seen(101, 100, ["python3", "w.py"], None, "permission", 0.5),
                     seen(102, 100, ["python3", "w.py"], None, "vanished", 0.5))
    un = d["verdict"]["unchecked"]
    assert un["reason"].startswith("not checked: no witness could read the environment of any worker (2 process(es))")
    assert un["reason"].endswith("; and 1 process of the tree known to have run whose environment no witness read, "
                                 "and that ran no probe: pid 102 (/proc showed it only as it ended)"), un
    assert un["unread"] == [101, 102] and "NOT CHECKED: no witness could read" in text, (un, text)


def test_a_pid_on_two_hosts_is_two_processes_and_each_keeps_how_it_was_missed(tmp_path):
    """host a's pid 101 could not be read (permission), host b's pid 101 was seen only as it ended: two processes,
    the second named with its host, and the first not taken for it."""
    def on(host: str, e: dict) -> dict:
        return {**e, "host": host}
    d, text = report(tmp_path, on("a", seen(100, 1, ["bash", "job.sh"], {"NCCL_PROTO": "LL"})),
                     on("a", seen(101, 100, ["python3", "w.py"], None, "permission", 0.5)),
                     on("b", seen(100, 1, ["bash", "job.sh"], {"NCCL_PROTO": "LL"})),
                     on("b", seen(101, 100, ["python3", "w.py"], None, "vanished", 0.5)))
    un = d["verdict"]["unchecked"]
    assert un["reason"].startswith("not checked: no witness could read the environment of any worker (2 process(es))")
    assert un["reason"].endswith("; and 1 process of the tree known to have run whose environment no witness read, "
                                 "and that ran no probe: pid b:101 (/proc showed it only as it ended)"), un
    assert "ncclprobe inspect --live PID" in un["hint"], un
