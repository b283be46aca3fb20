"""A real multi-node job on this machine: each "node" is its own UTS namespace with its own hostname
(`unshare --uts`, which needs root), under its own `ncclprobe run`, and the nodes are joined by a real
`torchrun --nnodes N --rdzv-backend c10d` rendezvous over loopback; each node runs one worker that joins
a gloo process group (where a GPU job creates its NCCL communicator) and records what it had
(examples/_worker.py). Every node is given NCCL_PROTO=LL, as a batch system exports the job's
environment to each node; one node's launcher starts its worker through `env -u NCCL_PROTO`.

Two layouts of the logs, as jobs leave them: one shared directory every node's run appends to
(`ncclprobe run --dir SHARED --append`), and one directory per host (`srun ncclprobe run --dir
LOGS/$(hostname)`). `report` of them must name the node that dropped the variable (by its hostname)
and its worker, and nothing else (exit 1); the healthy job exits 0. Each node's own report, at the end of
its run, holds its own node only, though the directory is shared.

Waits are bounded and on conditions (the nodes' exit); the rendezvous port is one the kernel handed out
and, should another process take it before the store binds it, the job is started again on another.
Marked slow: three interpreters import torch per node (6 s for two nodes on an idle 2-core machine).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

PY = sys.executable
WORKER = Path(__file__).resolve().parent.parent / "examples" / "torchrun" / "worker.py"
VAR, WANT = "NCCL_PROTO", "LL"
JOB_WAIT_S = 300.0   # all nodes have exited by then: a bound on a polled condition, not a sleep (a loaded
#                      2-core machine imports torch in 9 interpreters; the rendezvous itself waits 120 s at most)
JOIN_TIMEOUT_S = 120  # torchrun's own bound on the rendezvous (join_timeout)
PORT_TRIES = 3

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "--uts", "sh", "-c", "hostname ncclprobe-uts-check"], capture_output=True,
                       timeout=30)
    return r.returncode == 0


needs_uts = pytest.mark.skipif(not _can_unshare(), reason="needs root and `unshare --uts` (a hostname per node)")


def free_port() -> int:
    """A loopback port the kernel has just handed out and nobody holds now (the store binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_command(name: str, is_host: bool, nnodes: int, port: int, logs: Path, layout: str, out: Path,
                 drop: bool) -> list[str]:
    """One node: a shell in a UTS namespace of its own names it, then runs `ncclprobe run` of torchrun.
    The log directory is named as the node's own shell would name it ($(hostname) for per-host logs)."""
    where = f"--dir {_q(str(logs))} --append" if layout == "shared" else f'--dir {_q(str(logs))}/"$(hostname)"'
    torchrun = [PY, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "ncclprobe-test",
                "--rdzv-conf", f"is_host={int(is_host)},join_timeout={JOIN_TIMEOUT_S}",
                "--local-addr", "127.0.0.1", "--max-restarts", "0", "--monitor-interval", "0.2", "--no-python",
                *(["env", "-u", VAR] if drop else []), PY, str(WORKER), "--out", str(out)]
    script = (f'hostname "$1" && exec {_q(PY)} -m ncclprobe run --json {where} -- '
              + " ".join(map(_q, torchrun)))
    return ["unshare", "--uts", "sh", "-c", script, "sh", name]


def _q(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


def _end(procs) -> None:
    """Whatever of the nodes still runs (a failed test): each node's session, by its group."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)


def run_job(tmp: Path, names: list[str], drop: str | None, layout: str) -> tuple[Path, Path, dict[str, dict]]:
    """Start every node at once and wait (bounded) for all of them to exit. Returns the logs, the workers'
    records and each node's own `run --json` document."""
    for attempt in range(PORT_TRIES):
        base = tmp / f"try{attempt}"
        logs, out = base / "logs", base / "out"
        logs.mkdir(parents=True, mode=0o700)
        out.mkdir()
        port = free_port()
        env = {**os.environ, VAR: WANT}
        procs, files = [], []
        try:
            for i, name in enumerate(names):
                cmd = node_command(name, i == 0, len(names), port, logs, layout, out, name == drop)
                fo, fe = open(base / f"{name}.json", "w"), open(base / f"{name}.err", "w")
                files += [fo, fe]
                procs.append(subprocess.Popen(cmd, env=env, stdout=fo, stderr=fe, start_new_session=True))
            deadline = time.monotonic() + JOB_WAIT_S
            for p in procs:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            pytest.fail(f"the nodes did not end within {JOB_WAIT_S} s:\n{_logs(base, names)}")
        finally:
            _end(procs)
            for f in files:
                f.close()
        errs = _logs(base, names)
        if "address already in use" in errs.lower() and attempt + 1 < PORT_TRIES:
            continue  # another process took the port between free_port and the store's bind: another port
        assert all(p.returncode in (0, 1) for p in procs), errs
        docs = {n: json.loads((base / f"{n}.json").read_text()) for n in names}
        return logs, out, docs
    raise AssertionError("unreachable")


def _logs(base: Path, names: list[str]) -> str:
    return "\n".join(f"== {n}\n{(base / f'{n}.err').read_text()[-3000:]}" for n in names)


def report(logs: Path, layout: str) -> tuple[int, dict, str]:
    dirs = [str(logs)] if layout == "shared" else sorted(str(d) for d in logs.iterdir())
    args = [PY, "-m", "ncclprobe", "report", "--expect", f"{VAR}={WANT}", *dirs]
    j = subprocess.run([*args, "--json"], capture_output=True, text=True, timeout=300)
    t = subprocess.run(args, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert j.returncode == t.returncode, (j.returncode, t.returncode)
    return j.returncode, json.loads(j.stdout), t.stdout


def workers(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("worker-*.json"))]


def errors(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["severity"] == "error"]


def host_of(doc: dict, pid: int) -> str:
    (host,) = {p["host"] for p in doc["processes"] if p["pid"] == pid}
    return host


@needs_uts
@pytest.mark.parametrize("layout,names", [("shared", ["node-a", "node-b", "node-c"]),
                                          ("per-host", ["node-a", "node-b"])])
def test_report_names_the_node_whose_launcher_dropped_the_variable(tmp_path, layout, names):
    logs, out, own = run_job(tmp_path, names, drop="node-b", layout=layout)
    recs = workers(out)
    assert len(recs) == len(names)  # every node's worker ran: the rendezvous joined them all
    dropped = [r["pid"] for r in recs if r[VAR] != WANT]
    assert len(dropped) == 1  # ground truth: the worker of node-b, and only it, lacks the value
    code, doc, text = report(logs, layout)
    assert code == 1, text
    assert doc["merged"] == {"runs": len(names), "hosts": len(names), "dirs": 1 if layout == "shared" else len(names)}
    assert f"merged {len(names)} run(s) of {len(names)} host(s)" in text
    (finding,) = errors(doc)
    assert finding["code"] == "ENV_MISSING" and finding["hosts"] == ["node-b"], finding
    assert finding["pids"] == dropped and host_of(doc, dropped[0]) == "node-b"
    others = [r["pid"] for r in recs if r["pid"] not in dropped]
    assert {host_of(doc, pid) for pid in others} == set(names) - {"node-b"}
    cause = next(line for line in text.splitlines() if "ENV_MISSING" in line)
    assert str(dropped[0]) in cause and not any(str(pid) in cause for pid in others)
    assert "host node-b" in text and not any(f"host {n}" in text for n in set(names) - {"node-b"})
    for name, run_doc in own.items():  # each run's own report: its node alone, though the directory is shared
        assert {p["host"] for p in run_doc["processes"]} == {name}, (name, run_doc["processes"])
        assert run_doc["merged"]["runs"] == 1 and [r["host"] for r in run_doc["runs"]] == [name]


@needs_uts
def test_the_healthy_job_exits_0(tmp_path):
    names = ["node-a", "node-b"]
    logs, out, _ = run_job(tmp_path, names, drop=None, layout="shared")
    recs = workers(out)
    assert len(recs) == 2 and all(r[VAR] == WANT for r in recs)
    code, doc, text = report(logs, "shared")
    assert code == 0 and not errors(doc), text
    assert doc["merged"] == {"runs": 2, "hosts": 2, "dirs": 1}
    assert {host_of(doc, r["pid"]) for r in recs} == set(names)
