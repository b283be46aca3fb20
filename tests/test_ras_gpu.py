"""NCCL's RAS service on a real GPU (marker gpu: run on the GPU machine): `inspect --live --ras` of a torch job
started without ncclprobe lists its communicators with pid, GPU and status, the values the process holds,
and checks --expect on them; RAS off is said; NCCL_RAS_ADDR on another port is followed; under `ncclprobe
run` each RAS communicator joins the probes' by hash."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

JOB = r"""
import os, sys, time, torch, torch.distributed as dist
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", sys.argv[1])
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
x = torch.ones(1 << 20, device="cuda"); dist.all_reduce(x); torch.cuda.synchronize()
g = dist.new_group([0]); dist.all_reduce(x, group=g); torch.cuda.synchronize()
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.read()
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ncclprobe(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ncclprobe", *args], capture_output=True, text=True, timeout=180,
                          cwd=cwd)


class Job:
    def __init__(self, tmp_path: Path, env: dict[str, str], under_run: bool = False):
        (tmp_path / "job.py").write_text(JOB)
        cmd = [sys.executable, str(tmp_path / "job.py"), str(free_port())]
        if under_run:
            cmd = [sys.executable, "-m", "ncclprobe", "run", "--dir", str(tmp_path / "logs"), "--", *cmd]
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=tmp_path)
        deadline = time.monotonic() + 180
        while self.proc.stdout.readline().strip() != "ready":
            assert time.monotonic() < deadline and self.proc.poll() is None, "the job did not start"
        self.pid = self.proc.pid if not under_run else _worker_pid(self.proc.pid)

    def end(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def _worker_pid(run_pid: int) -> int:
    kids = Path(f"/proc/{run_pid}/task/{run_pid}/children").read_text().split()
    for k in kids:
        if "job.py" in Path(f"/proc/{k}/cmdline").read_bytes().decode(errors="replace"):
            return int(k)
    raise AssertionError(f"no job under run ({kids})")


def test_inspect_live_ras_of_a_job_started_without_ncclprobe(tmp_path):
    job = Job(tmp_path, {**os.environ, "NCCL_PROTO": "LL"})
    try:
        r = ncclprobe("inspect", str(job.pid), "--live", "--ras", "--expect", "NCCL_PROTO=LL", "--json", cwd=tmp_path)
        out = json.loads(r.stdout)
        assert r.returncode == 0, out["findings"]
        assert out["ras"]["format"] == "json" and out["ras"]["communicators"] == 2 and out["ras"]["reason"] is None
        comms = out["communicators"]
        assert len(comms) == 2 and {c["pid"] for c in comms} == {job.pid}
        assert all(c["seen_by"] == ["ras"] and c["ras"]["cuda_dev"] == 0 and c["env"].get("NCCL_PROTO") == "LL"
                   and c["env_source"].startswith("held now (live read") for c in comms), comms
        wrong = ncclprobe("inspect", str(job.pid), "--live", "--ras", "--expect", "NCCL_PROTO=Simple", cwd=tmp_path)
        assert wrong.returncode == 1 and "NCCL_PROTO" in wrong.stdout
        default = json.loads(ncclprobe("inspect", str(job.pid), "--json", cwd=tmp_path).stdout)
        assert default["ras"]["communicators"] == 2  # libnccl 2.28 mapped: RAS asked unasked
    finally:
        job.end()


def test_ras_off_and_on_another_port(tmp_path):
    job = Job(tmp_path, {**os.environ, "NCCL_RAS_ENABLE": "0"})
    try:
        out = json.loads(ncclprobe("inspect", str(job.pid), "--json", cwd=tmp_path).stdout)
        assert out["ras"]["communicators"] == 0 and "connection refused" in out["ras"]["reason"]
    finally:
        job.end()
    port = free_port()
    job = Job(tmp_path, {**os.environ, "NCCL_RAS_ADDR": f"127.0.0.1:{port}"})
    try:
        out = json.loads(ncclprobe("inspect", str(job.pid), "--json", cwd=tmp_path).stdout)
        assert out["ras"]["address"] == f"127.0.0.1:{port}" and out["ras"]["communicators"] == 2, out["ras"]
    finally:
        job.end()


def test_under_run_each_ras_communicator_joins_the_probes_by_hash(tmp_path):
    job = Job(tmp_path, dict(os.environ), under_run=True)
    try:
        out = json.loads(ncclprobe("inspect", str(job.pid), "--ras", "--json", cwd=tmp_path).stdout)
        comms = [c for c in out["communicators"] if c["pid"] == job.pid]
        assert len(comms) == 2 and all({"profiler", "ras"} <= set(c["seen_by"]) for c in comms), comms
    finally:
        job.end()
