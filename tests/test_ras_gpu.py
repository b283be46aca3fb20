"""NCCL's RAS service on a real GPU (marker gpu: run on the GPU machine): `inspect --live --ras` of a torch job
started without ncclprobe lists its communicators with pid, GPU and status, the values the process holds,
and checks --expect on them; RAS off is said; NCCL_RAS_ADDR on another port is followed; under `ncclprobe
run` each RAS communicator joins the probes' by hash; a second communicator opened through ctypes on torch's
own libnccl is listed beside torch's and joined to the same pid; RAS diagnostics are asked where NCCL has them
(2.31+) and an older NCCL's refusal is said. Without torch or a CUDA device every test here skips."""
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


@pytest.fixture(autouse=True, scope="module")
def _a_cuda_device():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")

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


# torch's one-rank job, then a communicator of its own through ctypes on the libnccl torch mapped (the same
# library: dlopen of a loaded path returns it), like PyNccl in vLLM/SGLang; "destroy" on stdin ends that one
CTYPES_JOB = r"""
import ctypes, os, sys, torch, torch.distributed as dist
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", sys.argv[1])
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
x = torch.ones(1 << 20, device="cuda"); dist.all_reduce(x); torch.cuda.synchronize()
libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "/libnccl.so" in l})
if not libs:
    sys.stdout.write("no libnccl mapped\n"); sys.stdout.flush(); sys.exit(0)
nccl = ctypes.CDLL(libs[0])
class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]
uid, comm = UniqueId(), ctypes.c_void_p()
torch.cuda.set_device(0)
assert nccl.ncclGetUniqueId(ctypes.byref(uid)) == 0
assert nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0
sys.stdout.write("ready " + libs[0] + "\n"); sys.stdout.flush()
for line in sys.stdin:
    if line.strip() == "destroy":
        assert nccl.ncclCommDestroy(comm) == 0
        sys.stdout.write("destroyed\n"); sys.stdout.flush()
dist.destroy_process_group()
"""


def _ras_comms(address: str, pid: int, want: int, timeout: float = 60.0) -> list:
    """RAS's communicators of pid, once there are `want` of them (NCCL registers a communicator with RAS at
    its init, and drops it at its destroy, each on RAS's own thread)."""
    from ncclprobe.witnesses import ras
    deadline = time.monotonic() + timeout
    while True:
        r = ras.read(address)
        mine = [c for c in r.comms if any(k.pid == pid for k in c.ranks)]
        if len(mine) == want or time.monotonic() > deadline:
            return mine
        time.sleep(0.5)


def test_a_ctypes_communicator_beside_torchs_is_listed_and_joined_to_the_same_pid(tmp_path):
    """RAS lists torch's communicator and the one opened through ctypes on the same libnccl; `inspect --live
    --ras` (RAS found at the NCCL_RAS_ADDR the process holds) shows both joined to that pid with the values it
    holds; after the ctypes one is destroyed RAS lists one fewer (so the extra one was the ctypes one)."""
    port = free_port()
    (tmp_path / "job.py").write_text(CTYPES_JOB)
    env = {**os.environ, "NCCL_RAS_ADDR": f"127.0.0.1:{port}", "NCCL_PROTO": "Simple"}
    proc = subprocess.Popen([sys.executable, str(tmp_path / "job.py"), str(free_port())], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        said = proc.stdout.readline().strip()
        if said == "no libnccl mapped":
            pytest.skip("this torch links NCCL statically: no libnccl for ctypes to share")
        assert said.startswith("ready "), said
        address = f"127.0.0.1:{port}"
        both = _ras_comms(address, proc.pid, 2)
        assert len(both) == 2 and all(k.cuda_dev == 0 for c in both for k in c.ranks), both
        r = ncclprobe("inspect", str(proc.pid), "--live", "--ras", "--expect", "NCCL_PROTO=Simple", "--json",
                      cwd=tmp_path)
        out = json.loads(r.stdout)
        assert out["ras"]["address"] == address and out["ras"]["communicators"] == 2, out["ras"]
        comms = [c for c in out["communicators"] if c["pid"] == proc.pid]
        assert {c["comm_hash"] for c in comms} == {c.hash for c in both} and len(comms) == 2, comms
        assert all(c["seen_by"] == ["ras"] and c["env"].get("NCCL_PROTO") == "Simple"
                   and c["env_source"].startswith("held now (live read") for c in comms), comms
        assert r.returncode == 0, out["findings"]
        proc.stdin.write("destroy\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "destroyed"
        [left] = _ras_comms(address, proc.pid, 1)
        assert left.hash in {c.hash for c in both}
    finally:
        proc.stdin.close()
        proc.wait(timeout=120)


def test_ras_diagnostics_are_asked_where_nccl_has_them_and_an_older_nccls_refusal_is_said(tmp_path):
    """NCCL >= 2.31: the real report, its NCCL environment check present. Older (2.28.9 on the GPU machine):
    inspect does not ask and says why, and asked anyway the server's refusal is a reason within the bound
    (NCCL answers an error line and keeps the connection open)."""
    from ncclprobe.witnesses import ras
    port = free_port()
    job = Job(tmp_path, {**os.environ, "NCCL_RAS_ADDR": f"127.0.0.1:{port}"})
    try:
        out = json.loads(ncclprobe("inspect", str(job.pid), "--ras-diagnostics", "--json", cwd=tmp_path).stdout)
        version = ras._version_tuple(out["ras"]["nccl_version"])
        diag = out["ras"]["diagnostics"]
        t0 = time.monotonic()
        asked = ras.read_diagnostics(f"127.0.0.1:{port}", timeout=60)
        if version >= ras.DIAG_SINCE:
            assert diag["reason"] is None and any(x["check"] == "NCCL environment" for x in diag["lines"]), diag
            assert asked.ok and asked.origin.endswith(f":{job.pid}"), asked.reason
        else:
            assert "has no RAS diagnostics (2.31+)" in diag["reason"], diag
            assert not asked.ok and "NCCL < 2.31" in asked.reason and time.monotonic() - t0 < 10, asked.reason
    finally:
        job.end()
