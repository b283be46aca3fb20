""""Not checked" is never "fine": a job whose command is only a client (a scheduler's or a daemon's) has
its workers under another daemon, outside CMD's tree, and no witness reads them. The verdict says so first,
names where the workers run and how to reach them, and the exit code is 3 (could not be examined), under
`run` and `inspect` alike. Real processes: a daemon started before the job spawns the workers that a
compiled client (`srun`, `ssh`, `docker`: the program's own name, as the real clients have) asks for."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

CC = shutil.which("cc") or shutil.which("gcc")
# The client: sends its arguments to the daemon's FIFO and waits for the daemon's one-byte reply.
CLIENT = r"""
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char** argv) {
  int fd = open(getenv("FAKE_DAEMON_REQ"), O_WRONLY);
  if (fd < 0) return 2;
  for (int i = 1; i < argc; i++) { (void)!write(fd, argv[i], strlen(argv[i]) + 1); }
  close(fd);
  int r = open(getenv("FAKE_DAEMON_REP"), O_RDONLY);
  char c; (void)!read(r, &c, 1);
  if (argc > 1 && !strcmp(argv[1], "--hold")) sleep(30);
  return 0;
}
"""
DAEMON = r"""
import os, subprocess, sys
req, rep = sys.argv[1], sys.argv[2]
print("ready", flush=True)
while True:
    with open(req, "rb") as f:
        argv = [a.decode() for a in f.read().split(b"\0") if a]
    argv = [a for a in argv if a != "--hold"]
    if argv == ["stop"]:
        break
    subprocess.run(argv, env={"PATH": os.environ["PATH"]})  # the daemon's own environment, not the job's
    with open(rep, "wb") as f:
        f.write(b"k")
"""
WORKER = "import os, sys; print('worker NCCL_PROTO=' + str(os.environ.get('NCCL_PROTO')), flush=True)\n"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    if not CC:
        pytest.skip("needs a C compiler")
    d = tmp_path_factory.mktemp("clientjob")
    (d / "client.c").write_text(CLIENT)
    (d / "bin").mkdir()
    for name in ("srun", "ssh", "docker"):
        subprocess.run([CC, "-O1", "-o", str(d / "bin" / name), str(d / "client.c")], check=True, capture_output=True)
    (d / "daemon.py").write_text(DAEMON)
    (d / "worker.py").write_text(WORKER)
    req, rep = d / "req", d / "rep"
    os.mkfifo(req)
    os.mkfifo(rep)
    proc = subprocess.Popen([sys.executable, str(d / "daemon.py"), str(req), str(rep)], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    env = {**os.environ, "PATH": f"{d / 'bin'}:{os.environ['PATH']}", "FAKE_DAEMON_REQ": str(req),
           "FAKE_DAEMON_REP": str(rep), "NCCL_PROTO": "LL"}
    yield d, env
    with open(req, "wb") as f:
        f.write(b"stop")
    proc.wait(timeout=10)


def ncclprobe(*args, env, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ncclprobe", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("client,runs_under", [("srun", "slurmstepd"), ("ssh", "sshd"), ("docker", "shim")])
def test_run_of_a_client_whose_workers_run_under_a_daemon_is_not_checked(daemon, tmp_path, client, runs_under):
    d, env = daemon
    out = ncclprobe("run", "--json", "--dir", str(tmp_path / "logs"), "--expect", "NCCL_PROTO=LL", "--",
                    client, sys.executable, str(d / "worker.py"), env=env)
    doc = json.loads(out.stdout)
    assert out.returncode == 3, doc
    un = doc["verdict"]["unchecked"]
    assert un and un["clients"][0]["program"] == client and runs_under in un["clients"][0]["runs_under"]
    assert un["hint"] and not [f for f in doc["findings"] if f["severity"] == "error"]
    text = ncclprobe("report", str(tmp_path / "logs"), "--expect", "NCCL_PROTO=LL", env=env)
    assert text.returncode == 3 and "NOT CHECKED" in text.stdout and "No findings" not in text.stdout


def test_the_same_job_with_its_worker_in_the_tree_is_checked(daemon, tmp_path):
    d, env = daemon
    out = ncclprobe("run", "--json", "--dir", str(tmp_path / "logs"), "--expect", "NCCL_PROTO=LL", "--",
                    sys.executable, str(d / "worker.py"), env=env)
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["verdict"]["unchecked"] is None


def test_inspect_of_a_waiting_client_is_not_checked(daemon):
    d, env = daemon
    p = subprocess.Popen(["srun", "--hold", sys.executable, str(d / "worker.py")], env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not Path(f"/proc/{p.pid}/wchan").exists() or \
                Path(f"/proc/{p.pid}/exe").resolve().name != "srun":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        out = ncclprobe("inspect", str(p.pid), "--expect", "NCCL_PROTO=LL", env=env)
    finally:
        p.kill()
        p.wait()
    assert out.returncode == 3, out.stdout
    assert out.stdout.startswith("Verdict") and "NOT CHECKED" in out.stdout.splitlines()[1]
    assert "slurmstepd" in out.stdout and "No findings" not in out.stdout
