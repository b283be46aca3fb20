"""The launcher vocabulary (ncclprobe/model/launchers.py): each launcher is recognised from the images
of the processes around an edge, and the finding's hint is that launcher's own remedy; a launcher the
table does not know, or one too far from the edge, gets the generic hint.

Three kinds of evidence. Real process trees under `ncclprobe run --expect NCCL_PROTO=LL` for the
launchers this machine can run (multiprocessing and its pools, joblib/loky, sudo, su, tmux, make, GNU
parallel over a stand-in ssh, supervisord, gunicorn), each with a healthy control that must give no
error. Process trees in a fake /proc (`inspect`) and probe logs (`report`'s model) carrying the
argv/exe shapes of the launchers that need a cluster or a daemon (Ray, Open MPI, MPICH Hydra, Slurm,
systemd, Celery, uvicorn, DeepSpeed, containers, screen, sshd). And the table itself.

The real cases reuse examples/_worker.py (a worker records what it had and is held until released)
and test_launchers.py's session handling; every wait is on a condition, bounded."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fakeproc import FakeProc
from ncclprobe import diagnose, model
from ncclprobe.commands.inspection import inspect_processes
from ncclprobe.model import launchers
from ncclprobe.witnesses.events import EventLog
from test_launchers import _end_session, _records, _witnessed, errors_on_var, flagged, summary

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PY = sys.executable
NCCLPROBE = [PY, "-m", "ncclprobe"]
VAR, WANT = "NCCL_PROTO", "LL"
EXPECT = {VAR: WANT}
LL = {VAR: WANT}
NO_NVML = lambda: ({}, "no NVML in this test")  # noqa: E731
GPU = ["/dev/nvidia0"]  # an open GPU device: the process is in NCCL's scope
RECORD_WAIT_S = 60.0
EXIT_WAIT_S = 60.0
SCAN_S = "3"  # run's watch interval for the recycling cases: a recycled worker lives well inside it
LATER_S = 4.5  # the job's workers come that long after its pool retired (> SCAN_S + RETIRE_SLACK_S)
WORKER = [PY, str(EXAMPLES / "_worker.py"), "--out", "{out}", "--hold", "{hold}"]  # run's watch interval for the recycling cases: a recycled worker lives well inside it


# ------------------------------------------------------------------------------------ the table
@pytest.mark.parametrize("argv,exe,name", [
    (["/usr/local/bin/raylet", "--node_ip_address=1.2.3.4"], "/opt/ray/core/src/ray/raylet/raylet", "ray"),
    (["ray::RankWorker.init"], "/usr/bin/python3.11", "ray"),
    (["python", "/site-packages/ray/_private/workers/default_worker.py", "--node-ip-address=x"], None, "ray"),
    (["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node", "8", "train.py"], None, "torchrun"),
    (["python", "-u", "-m", "torch.distributed.run", "train.py"], None, "torchrun"),
    (["python3", "-c", "from multiprocessing.forkserver import main; main(5, 6)"], None, "multiprocessing forkserver"),
    (["python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)"], None,
     "multiprocessing spawn"),
    (["python", "-m", "joblib.externals.loky.backend.popen_loky_posix", "--process-name", "LokyProcess-1"], None,
     "joblib/loky"),
    (["[celeryd: celery@node1:ForkPoolWorker-3]"], "/usr/bin/python3", "celery"),
    (["/usr/bin/python3", "/usr/local/bin/celery", "-A", "proj", "worker"], None, "celery"),
    (["gunicorn: worker [app:app]"], "/usr/bin/python3", "gunicorn"),
    (["/usr/bin/python3", "/usr/local/bin/uvicorn", "app:app", "--workers", "2"], None, "uvicorn"),
    (["orted", "-mca", "ess", "env"], "/opt/openmpi/bin/orted", "mpirun"),
    (["prted", "--prtemca", "ess", "env"], "/opt/openmpi/bin/prted", "mpirun"),
    (["mpiexec", "-n", "2", "./a.out"], "/usr/bin/mpiexec.hydra", "mpich hydra"),
    (["slurmstepd: [1234.0]"], "/usr/sbin/slurmstepd", "slurm"),
    (["sudo", "-u", "svc", "python", "w.py"], "/usr/bin/sudo", "sudo"),
    (["su", "-", "svc", "-c", "python w.py"], "/usr/bin/su", "su"),
    (["tmux: server (/tmp/tmux-0/default)"], "/usr/bin/tmux", "tmux"),
    (["SCREEN", "-dmS", "job"], "/usr/bin/screen", "screen"),
    (["/usr/bin/python3", "/usr/bin/supervisord", "-n", "-c", "s.conf"], None, "supervisord"),
    (["/sbin/init"], "/usr/lib/systemd/systemd", "systemd"),
    (["/usr/bin/perl", "/usr/bin/parallel", "--env", "X", "cmd", ":::", "1"], None, "gnu parallel"),
    (["sshd: root@notty"], "/usr/sbin/sshd", "ssh"),
    (["make", "-f", "Makefile", "train"], "/usr/bin/make", "make"),
    (["env", "-i", "PATH=/usr/bin", "python3", "w.py"], "/usr/bin/env", "env -i"),
    (["env", "-u", "NCCL_PROTO", "python3", "w.py"], "/usr/bin/env", "env -u"),
    (["env", "--unset=NCCL_PROTO", "python3", "w.py"], "/usr/bin/env", "env -u"),
    (["env", "-uNCCL_PROTO", "unshare", "--pid", "python3", "w.py"], "/usr/bin/env", "env -u"),
    (["/usr/bin/containerd-shim-runc-v2", "-namespace", "moby", "-id", "abc"], None, "container"),
    (["/usr/bin/python3", "-u", "-m", "deepspeed.launcher.launch", "--world_info=e30="], None, "deepspeed"),
    (["/usr/bin/python3", "/usr/local/bin/deepspeed", "--hostfile", "h", "train.py"], None, "deepspeed"),
])
def test_each_launcher_is_recognised_from_its_image(argv, exe, name):
    la = launchers.identify(argv, exe)
    assert la is not None and la.name == name


@pytest.mark.parametrize("argv,exe", [
    (["env", "PATH=/usr/bin", "python3", "w.py"], "/usr/bin/env"),  # env without -i curates nothing
    (["env", "python3", "-i"], "/usr/bin/env"),  # -i of the command, not of env
    (["python", "train.py", "--launcher", "torchrun"], None),  # a word in the arguments is no image
    (["python", "-c", "import os; os.system('mpirun ls')"], None),
    (["bash", "run.sh"], "/bin/bash"),
    (["/opt/acme/launcherd"], "/opt/acme/launcherd"),
])
def test_what_is_no_launcher(argv, exe):
    assert launchers.identify(argv, exe) is None


def test_every_launcher_has_a_remedy_and_every_remedy_fills_in():
    items = {VAR: (WANT, None), "HF_TOKEN": ("hunter2", None)}  # a value outside the watched set is never shown
    from ncclprobe.model.watched import is_watched
    fields = launchers.remedy_fields(items, is_watched, at=" (d.py:3 main)", who="raylet")
    for la in launchers.LAUNCHERS:
        assert la.remedies, la.name
        for kind, template in la.remedies.items():
            text = template.format(**fields)
            assert VAR in text and "hunter2" not in text, (la.name, kind, text)


# ------------------------------------------------------------------------------- a fake /proc
def inspect(fake: FakeProc, root: int, expect=EXPECT):
    res = inspect_processes([root], expect=expect, proc_root=fake.root, gpu_lookup=NO_NVML)
    return [f for f in res.findings if f.severity == "error" and VAR in (f.var, *f.vars)]


@dataclass
class Shape:
    """A process tree of a launcher this machine cannot run: (pid, ppid, argv, exe, env, gpu) rows; the
    tree given its value where the healthy control has it."""
    id: str
    rows: list
    kind: str
    launcher: str
    says: tuple[str, ...]
    parent: int | None = None
    healthy: dict = field(default_factory=dict)  # pid -> env in the healthy control

    def build(self, base: Path, healthy: bool) -> FakeProc:
        fake = FakeProc(base)
        for i, (pid, ppid, argv, exe, env, gpu) in enumerate(self.rows):
            env = self.healthy.get(pid, env) if healthy else env
            fake.add(pid, ppid, comm=Path(argv[0]).name[:15], cmdline=argv, exe=exe, env=env,
                     fds=GPU if gpu else (), start=100 + 10 * i)
        return fake


PY3 = "/usr/bin/python3"
SHAPES = [
    # Ray: the raylet had the value, the workers it started did not
    Shape("ray-raylet", [(1, 0, ["python", "driver.py"], PY3, LL, False),
                         (5, 1, ["/opt/ray/raylet", "--raylet_socket_name=x"], "/opt/ray/raylet", LL, False),
                         (20, 5, ["ray::RankWorker"], PY3, {}, True), (21, 5, ["ray::RankWorker"], PY3, {}, True)],
          "dropped_by_intermediate", "ray", ("runtime_env", '"env_vars": {"NCCL_PROTO": "LL"}'), parent=5,
          healthy={20: LL, 21: LL}),
    # Open MPI on a remote node: orted under sshd, started without it
    Shape("orted", [(1, 0, ["sshd: root@notty"], "/usr/sbin/sshd", {}, False),
                    (5, 1, ["orted", "-mca", "ess", "env"], "/opt/openmpi/bin/orted", {}, False),
                    (20, 5, ["python", "train.py"], PY3, {}, True)],
          "not_in_root", "mpirun", ("-x NCCL_PROTO",), healthy={1: LL, 5: LL, 20: LL}),
    # MPICH: the proxy had it, the rank not
    Shape("hydra", [(1, 0, ["mpiexec", "-n", "1", "python", "train.py"], "/usr/bin/mpiexec.hydra", LL, False),
                    (5, 1, ["/usr/bin/hydra_pmi_proxy", "--control-port", "h:1"], "/usr/bin/hydra_pmi_proxy", LL, False),
                    (20, 5, ["python", "train.py"], PY3, {}, True)],
          "dropped_by_intermediate", "mpich hydra", ("-genv NCCL_PROTO LL",), parent=5, healthy={20: LL}),
    # Slurm: slurmstepd had it (slurmd's), the task was started with --export=NONE
    Shape("slurmstepd", [(1, 0, ["slurmstepd: [1234.0]"], "/usr/sbin/slurmstepd", LL, False),
                         (20, 1, ["python", "train.py"], PY3, {}, True)],
          "dropped_by_intermediate", "slurm", ("srun --export=ALL,NCCL_PROTO=LL",), parent=1, healthy={20: LL}),
    # systemd: the manager had it, the service runs in a clean environment
    Shape("systemd", [(1, 0, ["/sbin/init"], "/usr/lib/systemd/systemd", LL, False),
                      (200, 1, ["python", "serve.py"], PY3, {}, True)],
          "dropped_by_intermediate", "systemd", ("Environment=NCCL_PROTO=LL", "systemctl set-environment"),
          parent=1, healthy={200: LL}),
    # uvicorn --workers: spawn children; nobody had it: uvicorn's own remedy, not multiprocessing's
    Shape("uvicorn", [(1, 0, [PY3, "/usr/local/bin/uvicorn", "app:app", "--workers", "2"], PY3, {}, False),
                      (20, 1, [PY3, "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)"],
                       PY3, {}, True)],
          "not_in_root", "uvicorn", ("--env-file",), healthy={1: LL, 20: LL}),
    # DeepSpeed on a worker node: sshd -> bash -> deepspeed.launcher.launch -> ranks
    Shape("deepspeed", [(1, 0, ["sshd: root@notty"], "/usr/sbin/sshd", {}, False),
                        (2, 1, ["bash", "-c", "cd /w; python -u -m deepspeed.launcher.launch t.py"], "/bin/bash", {}, False),
                        (5, 2, [PY3, "-u", "-m", "deepspeed.launcher.launch", "--world_info=e30=", "t.py"], PY3, {},
                         False),
                        (20, 5, [PY3, "-u", "t.py", "--local_rank=0"], PY3, {}, True)],
          "not_in_root", "deepspeed", (".deepspeed_env", "multi-node"), healthy={1: LL, 2: LL, 5: LL, 20: LL}),
    # a container: the shim's child started without it
    Shape("container", [(1, 0, ["/usr/bin/containerd-shim-runc-v2", "-namespace", "moby", "-id", "ab"],
                         "/usr/bin/containerd-shim-runc-v2", {}, False),
                        (20, 1, ["python", "train.py"], PY3, {}, True)],
          "not_in_root", "container", ("-e NCCL_PROTO=LL",), healthy={1: LL, 20: LL}),
    # screen: a session's window under a server started without it
    Shape("screen", [(1, 0, ["SCREEN", "-dmS", "job"], "/usr/bin/screen", {}, False),
                     (2, 1, ["/bin/bash"], "/bin/bash", {}, False), (20, 2, ["python", "train.py"], PY3, {}, True)],
          "not_in_root", "screen", ("screen -X setenv NCCL_PROTO LL",), healthy={1: LL, 2: LL, 20: LL}),
    # a bare sshd session: the remote command got sshd's environment
    Shape("sshd", [(1, 0, ["sshd: root@notty"], "/usr/sbin/sshd", {}, False),
                   (2, 1, ["bash", "-c", "python train.py"], "/bin/bash", {}, False),
                   (20, 2, ["python", "train.py"], PY3, {}, True)],
          "not_in_root", "ssh", ("ssh HOST NCCL_PROTO=LL CMD", "SendEnv"), healthy={1: LL, 2: LL, 20: LL}),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.id)
def test_a_launcher_tree_gets_its_own_remedy_and_its_healthy_control_none(shape, tmp_path):
    [f] = inspect(shape.build(tmp_path / "fail", healthy=False), shape.rows[0][0])
    assert (f.edge["kind"], f.edge["launcher"]) == (shape.kind, shape.launcher), f.to_json()
    assert all(s in f.hint for s in shape.says), f.hint
    if shape.parent is not None:
        assert f.edge["parent"] == shape.parent
    assert inspect(shape.build(tmp_path / "ok", healthy=True), shape.rows[0][0]) == []


def test_an_unknown_launcher_gets_the_generic_hint(tmp_path):
    fake = FakeProc(tmp_path)
    fake.add(5, 1, cmdline=["/opt/acme/launcherd", "--pool"], exe="/opt/acme/launcherd", env=LL)
    fake.add(20, 5, cmdline=["python", "train.py"], env={}, fds=GPU, start=110)
    [f] = inspect(fake, 5)
    assert (f.edge["kind"], f.edge["launcher"]) == ("dropped_by_intermediate", None)
    assert f.hint == ("launcherd (not Python) filters the environment of the processes it starts: add NCCL_PROTO "
                      "to its allow-list or configuration, or set it in the worker itself")


def test_a_launcher_far_above_the_edge_does_not_claim_it(tmp_path):
    """mpirun started a rank; the rank itself started a helper with subprocess env={}: that is the
    rank's code, and `mpirun -x` would not help (it did before: any word of any ancestor counted)."""
    fake = FakeProc(tmp_path)
    fake.add(1, 0, cmdline=["mpirun", "-np", "1", "python", "train.py"], exe="/opt/openmpi/bin/prterun", env=LL)
    fake.add(5, 1, cmdline=["python", "train.py"], env=LL, start=110)
    fake.add(20, 5, cmdline=["python", "helper.py"], env={}, fds=GPU, start=120)
    [f] = inspect(fake, 1)
    assert (f.edge["kind"], f.edge["parent"], f.edge["launcher"]) == ("curated_env", 5, None)
    assert "-x" not in f.hint and "the code in `python train.py` that starts `helper.py`" in f.hint


# ------------------------------------------------------------------------------------ probe logs
from test_propagation import H, ev, start  # noqa: E402 (the hand-made events of the propagation tests)




def comm(pid, t, env):
    return ev("comm_init", pid, t, "preload", api="ncclCommInitRank", call=1, comm="0x1", rank=0, nranks=2,
              uid="ab", env=env, rc=0, lib="/lib/libnccl.so.2", version=22809)


def seen(pid, ppid, t, argv, env, start_, exe=None):
    return ev("proc_seen", pid, t, "proc", ppid=ppid, start=start_, argv=argv, exe=exe or "/bin/" + argv[0],
              exec_env=env, env_reason=None, env_hash=None)


def log_rules(events):
    return [f for f in diagnose.rules(model.build(EventLog(events=sorted(events, key=lambda e: e["t"]))), EXPECT)
            if f.severity == "error"]


CELERY = ["/usr/bin/python3", "/usr/local/bin/celery", "-A", "proj", "worker", "--concurrency=2"]
GUNICORN = ["/usr/bin/python3", "/usr/local/bin/gunicorn", "-w", "2", "app:app"]


@pytest.mark.parametrize("argv,name,says", [(CELERY, "celery", "worker_process_init"),
                                            (GUNICORN, "gunicorn", "gunicorn --env NCCL_PROTO=LL")])
def test_the_forked_workers_of_a_server_get_the_servers_remedy(argv, name, says):
    """Celery's prefork pool and gunicorn's workers are forks of the server, with its command line:
    the server's remedy, not multiprocessing's; a fork of a plain script stays multiprocessing's."""
    events = [start(1, 0, {}, argv=argv), start(10, 1, {}, t=1.0, argv=argv, forked_from=1), comm(10, 2.0, {})]
    [f] = log_rules(events)
    assert (f.edge["kind"], f.edge["launcher"]) == ("not_in_root", name) and says in f.hint
    assert log_rules([start(1, 0, LL, argv=argv), start(10, 1, LL, t=1.0, argv=argv, forked_from=1),
                      comm(10, 2.0, LL)]) == []
    write = ev("env_write", 1, 0.5, "boot", var=VAR, old=None, new=WANT, where="main.py:3 m", op="set", blocked=False)
    plain = ["python", "main.py"]
    [f] = log_rules([start(1, 0, {}, argv=plain), start(10, 1, {}, t=0.2, argv=plain, forked_from=1), write,
                     comm(10, 2.0, {})])
    assert (f.edge["kind"], f.edge["launcher"]) == ("set_after_start", "multiprocessing fork")
    assert "maxtasksperchild" in f.hint


def test_a_fork_child_that_exec_d_a_daemon_is_named_by_its_daemon():
    """A fork of the Ray driver that exec'd the raylet: its images say raylet, not multiprocessing."""
    drv = ["python", "driver.py"]
    write = ev("env_write", 1, 0.5, "boot", var=VAR, old=None, new=WANT, where="driver.py:9 main", op="set",
               blocked=False)
    events = [start(1, 0, {}, argv=drv), start(5, 1, {}, t=0.2, argv=drv, forked_from=1),
              seen(5, 1, 0.6, ["/opt/ray/raylet", "--x"], {}, 0.2), write,
              start(20, 5, {}, t=1.0, argv=["ray::Worker"]), comm(20, 2.0, {})]
    m = model.build(EventLog(events=sorted(events, key=lambda e: e["t"])))
    m.processes[(H, 5)].images, m.processes[(H, 5)].argv = [drv], ["/opt/ray/raylet", "--x"]  # issue 22 item 4's order
    [f] = [f for f in diagnose.rules(m, EXPECT) if f.severity == "error"]
    assert (f.edge["kind"], f.edge["launcher"]) == ("set_after_start", "ray") and "ray.init()" in f.hint


def test_env_i_of_an_ancestor_is_not_the_launcher_of_an_edge_below_it():
    """pid 10 began as `env -i … python3 a.py` (the watch saw both images); a.py then starts b.py with
    env={}: that edge is a.py's code, not env -i's."""
    events = [seen(10, 1, 1.0, ["env", "-i", "NCCL_PROTO=LL", "python3", "a.py"], LL, 0.9),
              seen(10, 1, 1.2, ["python3", "a.py"], LL, 0.9), seen(11, 10, 1.3, ["python3", "b.py"], {}, 1.25)]
    [f] = log_rules(events)
    assert (f.edge["kind"], f.edge["parent"], f.edge["launcher"]) == ("curated_env", 10, None)
    assert "env -i" not in f.hint


def _lost_by(first: list[str], then: list[str] | None = None, parent: list[str] | None = None) -> list:
    """pid 11, started by pid 10 (`python3 a.py`, or `parent`: two images, its last holding NCCL_PROTO=LL) as
    `first`, exec'ing `then`, without NCCL_PROTO."""
    up = parent or ["python3", "a.py"]
    events = [seen(10, 1, 1.0, up, LL, 0.9), seen(11, 10, 1.3, first, {}, 1.25)]
    if parent:
        events.insert(1, seen(10, 1, 1.1, ["bash", "job.sh"], LL, 0.9))
    return log_rules(events + ([seen(11, 10, 1.4, then, {}, 1.25)] if then else []))


@pytest.mark.parametrize("first,then,parent,launcher,says", [
    (["env", "-i", "python3", "w.py"], ["python3", "w.py"], None, "env -i",
     "and `env -i` in the command a.py ran started them"),
    # b.py exec'd env -i, but what b.py held before, no read kept: its parent may have dropped it
    (["python3", "b.py"], ["env", "-i", "python3", "w.py"], None, "env -i", "had it when it started them"),
    (["env", "--unset=NCCL_PROTO", "python3", "w.py"], ["python3", "w.py"], None, "env -u",
     "and `env -u` in the command a.py ran started them"),
    # env -u of another name, or sudo in the parent's own past (it had the value when it started the worker): the
    # worker's parent curated its environment, no wrapper did
    (["env", "-u", "FOO", "python3", "w.py"], ["python3", "w.py"], None, None, "had it when it started them"),
    (["python3", "w.py"], None, ["sudo", "bash", "job.sh"], "sudo", "had it when it started them"),
])
def test_a_filtering_wrapper_is_the_culprit_only_where_the_worker_ran_it(first, then, parent, launcher, says):
    [f] = _lost_by(first, then, parent)
    assert (f.edge["kind"], f.edge["launcher"]) == ("curated_env", launcher) and says in f.message, f.message
    if launcher is None:
        assert "env -u" not in f.hint and "env -u" not in f.message, f.hint


# ------------------------------------------------------------------------------------ real trees
@dataclass
class Outcome:
    records: dict[int, dict]
    writers: set[int]
    doc: dict
    rc: int
    stderr: str

    @property
    def bad(self) -> set[int]:
        return {pid for pid, r in self.records.items() if r.get(VAR) != WANT}

    def why(self) -> str:
        truth = ", ".join(f"{p}:{r.get(VAR)!r}(ppid {r['ppid']})" for p, r in sorted(self.records.items()))
        procs = "\n".join(f"  {p['pid']} <- {p.get('ppid')} {p.get('argv')} {p.get('witnesses')}"
                          for p in self.doc.get("processes", []))
        return (f"\nworkers {truth}; writers {sorted(self.writers)}\nfindings:\n{summary(self.doc)}\n"
                f"hints: {[f.get('hint') for f in self.doc['findings']]}\nprocesses:\n{procs}\n"
                f"stderr tail:\n{self.stderr[-1500:]}")


def _scanned(log: Path, pids: set[int]) -> bool:
    """Whether run's /proc watch has recorded each of pids (a scan saw it alive)."""
    got = set()
    for path in log.glob("*.jsonl"):
        for line in path.read_bytes().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue  # a line being written
            if e.get("ev") == "proc_seen" and e.get("pid") in pids:
                got.add(e["pid"])
    return got == pids


def _until(cond, what: str, limit: float, proc: subprocess.Popen | None = None, stderr: Path | None = None):
    deadline = time.monotonic() + limit
    while not cond():
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            tail = stderr.read_text(errors="replace")[-3000:] if stderr else ""
            raise AssertionError(f"harness: {what} ({'exited' if proc and proc.poll() is not None else 'timed out'})"
                                 f"\n{tail}")
        time.sleep(0.02)


def drive(work: Path, argv: list[str], workers: int, env: dict[str, str] | None = None, scan_s: str | None = None,
          stop=None) -> Outcome:
    """`ncclprobe run --json --expect NCCL_PROTO=LL -- argv` in a session of its own: wait until `workers`
    workers have recorded and run's /proc watch has seen each, release them, `stop(records)` what a
    server keeps running, and read run's report."""
    out, hold, log = work / "out", work / "hold", work / "log"
    for d in (out, hold):
        d.mkdir(mode=0o777)
        os.chmod(d, 0o777)  # a worker of another user (su) writes here
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "NCCLPROBE_"))}
    base["PATH"] = os.path.dirname(PY) + os.pathsep + base.get("PATH", "")
    if scan_s:
        base["NCCLPROBE_WATCH_S"] = scan_s
    full = [*NCCLPROBE, "run", "--json", "--dir", str(log), "--expect", f"{VAR}={WANT}", "--",
            *[a.format(out=out, hold=hold, work=work) for a in argv]]
    so, se = work / "stdout", work / "stderr"
    with open(so, "wb") as o, open(se, "wb") as e:
        proc = subprocess.Popen(full, stdout=o, stderr=e, stdin=subprocess.DEVNULL, cwd=work,
                                env={**base, **(env or {})}, start_new_session=True)
    try:
        _until(lambda: len(_records(out, "worker")) >= workers, f"{workers} worker records", RECORD_WAIT_S, proc, se)
        records = _records(out, "worker")
        _until(lambda: _scanned(log, set(records)) or not set(records) - _witnessed(log) and scan_s is None,
               "a witness of each worker", RECORD_WAIT_S, proc, se)
        (hold / "release").touch()
        if stop is not None:
            stop(records)
        proc.wait(timeout=EXIT_WAIT_S)
    finally:
        (hold / "release").touch()
        left = _end_session(proc)
    assert left == [], f"left running: {left}"
    doc = json.loads(so.read_text(errors="replace"))
    return Outcome(_records(out, "worker"), set(_records(out, "writer")), doc, proc.returncode,
                   se.read_text(errors="replace"))


def check(o: Outcome, kind: str | None, launcher: str | None = None, says: tuple[str, ...] = (),
          parent: str | None = None) -> None:
    """kind None: a healthy control (no error at all, exit 0). Else: exactly the workers that lack the
    value are flagged, in one finding whose edge has this kind and launcher, and whose hint says `says`."""
    if kind is None:
        assert not o.bad and [f for f in o.doc["findings"] if f["severity"] == "error"] == [], o.why()
        assert o.rc == 0 or ended_before_the_kernels_read(o), o.why()
        return
    assert o.bad and flagged(o.doc) == o.bad, o.why()
    [f] = errors_on_var(o.doc)
    assert (f["edge"]["kind"], f["edge"]["launcher"]) == (kind, launcher), o.why()
    assert all(s in f["hint"] for s in says), o.why()
    if parent == "writer":
        assert f["edge"]["parent"] in o.writers, o.why()
    elif parent == "ppid":
        assert {f["edge"]["parent"]} == {o.records[p]["ppid"] for p in o.bad}, o.why()


def ended_before_the_kernels_read(o: Outcome) -> bool:
    """A healthy control's exit 3, truthful: NOT CHECKED on processes alone that the kernel said exec'd and that
    ended before its read of them, or whose environment was gone when it read them (a launcher script's `rm` of
    its job file lives a millisecond), none a worker. Whether such a process is caught depends on the machine's
    timing; that it is said, and only it, does not."""
    unread = set(((o.doc.get("verdict") or {}).get("unchecked") or {}).get("unread") or [])
    watch = (o.doc.get("watch") or {}).values()
    if not unread or not watch or any(w.get("mode") != "kernel" for w in watch):
        return False
    gone = {pid for w in watch for pid in w.get("missed_pids") or []}
    gone |= {p["pid"] for p in o.doc.get("processes") or [] if p.get("exec_env_reason") in ("vanished", "zombie")
             and p.get("witnesses") == ["proc"]}
    return o.rc == 3 and unread <= gone and not unread & set(o.records)


def script(work: Path, name: str, text: str) -> str:
    """A scenario file in the case's directory, beside a copy of examples/_worker.py (importable)."""
    shutil.copy(EXAMPLES / "_worker.py", work / "_worker.py")
    path = work / name
    text = textwrap.dedent(text)
    if name.endswith(".py"):  # PYTHONSAFEPATH (conftest) keeps a script's own directory off sys.path
        text = f"import sys\nsys.path.insert(0, {str(work)!r})\nLATER_S = {LATER_S}\n{text}"
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


AFTER_A_SCAN = '''
    import json, os, subprocess, time
    from pathlib import Path

    def after_a_scan():
        """Return once run's /proc watch has scanned (it recorded a marker child): its next scan is a
        whole NCCLPROBE_WATCH_S away, so what lives only a moment from now on is seen by no scan."""
        log, marker = Path(os.environ["NCCLPROBE_DIR"]), subprocess.Popen(["sleep", "60"])
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline and not any(
                    b'"proc_seen"' in line and json.loads(line).get("pid") == marker.pid
                    for path in log.glob("*.jsonl") for line in path.read_bytes().splitlines()
                    if line.endswith(b"}")):
                time.sleep(0.01)
        finally:
            marker.kill()
            marker.wait()
'''

POOL = AFTER_A_SCAN + '''
    import multiprocessing as mp
    import sys
    import _worker

    def main():
        args = _worker.options(words=("fail", "ok"))
        ctx = mp.get_context("fork")
        after_a_scan()
        with ctx.Pool(1, maxtasksperchild=1) as pool:  # a worker retires after one task and is replaced
            pool.apply(os.getpid)
            pool.close()
            pool.join()
        t1 = time.time()
        if args.variant == "ok":
            os.environ["NCCL_PROTO"] = "LL"
        while time.time() < t1 + LATER_S:  # the job's workers come later (a model loads)
            time.sleep(0.05)
        worker = ctx.Process(target=_worker.work, args=(args.out, args.hold))
        worker.start()
        if args.variant == "fail":
            os.environ["NCCL_PROTO"] = "LL"  # too late for the worker
            _worker.wrote(args.out)
        worker.join()
        sys.exit(worker.exitcode)

    if __name__ == "__main__":
        main()
'''

EXECUTOR = AFTER_A_SCAN + '''
    import sys
    from concurrent.futures import ProcessPoolExecutor
    import _worker

    if __name__ == "__main__":
        args = _worker.options(words=("ok",))
        after_a_scan()
        # spawn (max_tasks_per_child's default): a resource tracker, a worker and its replacement start
        # before the write; the tracker stays
        with ProcessPoolExecutor(1, max_tasks_per_child=1) as ex:
            ex.submit(os.getpid).result()
        t1 = time.time()
        os.environ["NCCL_PROTO"] = "LL"
        while time.time() < t1 + LATER_S:  # the job's workers come later (a model loads)
            time.sleep(0.05)
        with ProcessPoolExecutor(1) as ex:
            ex.submit(_worker.work, args.out, args.hold).result()
'''

LOKY = '''
    import os
    import sys
    from joblib import Parallel, delayed
    import _worker

    if __name__ == "__main__":
        args = _worker.options(words=("fail", "ok"))
        if args.variant == "ok":
            os.environ["NCCL_PROTO"] = "LL"
        Parallel(n_jobs=2)(delayed(abs)(-i) for i in range(4))  # loky starts its workers, and keeps them
        if args.variant == "fail":
            os.environ["NCCL_PROTO"] = "LL"
            _worker.wrote(args.out)
        Parallel(n_jobs=2)(delayed(_worker.work)(args.out, args.hold) for _ in range(2))
'''


@pytest.mark.slow  # a whole NCCLPROBE_WATCH_S between two scans, and LATER_S
def test_a_recycled_pool_worker_that_did_no_nccl_work_is_not_affected(tmp_path):
    """Pool(maxtasksperchild=1): its workers retired (seen by no scan, gone long before the job's worker
    started) before the value was set, and no witness saw them use NCCL: not affected; the job's
    worker has the value: no error."""
    o = drive(tmp_path, [PY, script(tmp_path, "pool.py", POOL), "ok", "--out", "{out}", "--hold", "{hold}"], 1,
              scan_s=SCAN_S)
    check(o, None)


@pytest.mark.slow
def test_a_worker_started_before_the_write_is_named_not_the_pool_workers_retired_before_it(tmp_path):
    o = drive(tmp_path, [PY, script(tmp_path, "pool.py", POOL), "fail", "--out", "{out}", "--hold", "{hold}"], 1,
              scan_s=SCAN_S)
    check(o, "set_after_start", "multiprocessing fork", ("maxtasksperchild", "initializer"), parent="writer")


@pytest.mark.slow
def test_the_resource_tracker_and_a_retired_executor_worker_are_not_affected(tmp_path):
    """ProcessPoolExecutor(max_tasks_per_child=1): its resource tracker and its first worker started
    before the write; the worker that does the work was spawned after it."""
    o = drive(tmp_path, [PY, script(tmp_path, "executor.py", EXECUTOR), "ok", "--out", "{out}", "--hold", "{hold}"], 1,
              scan_s=SCAN_S)
    check(o, None)
    trackers = [p for p in o.doc["processes"] if "resource_tracker" in " ".join(p.get("argv") or ())]
    assert trackers, o.why()  # the tracker was there, lacking the value, and is no finding's


@pytest.mark.slow  # loky's workers outlive the job by a few seconds
@pytest.mark.parametrize("variant", ["fail", "ok"])
def test_joblib_loky_keeps_its_workers_and_its_remedy_says_so(tmp_path, variant):
    pytest.importorskip("joblib")
    o = drive(tmp_path, [PY, script(tmp_path, "loky.py", LOKY), variant, "--out", "{out}", "--hold", "{hold}"], 2)
    check(o, None) if variant == "ok" else check(o, "set_after_start", "joblib/loky",
                                                 ("first joblib Parallel", "get_reusable_executor(env="), "writer")


@pytest.mark.parametrize("example,launcher,says", [
    ("mp_fork", "multiprocessing fork", "fork children copy the parent's environment at the fork"),
    ("mp_forkserver", "multiprocessing forkserver", "the forkserver is started once"),
    ("mp_spawn", "multiprocessing spawn", "each spawned worker copies the parent's environment"),
    ("process_pool", "multiprocessing fork", "ProcessPoolExecutor initializer"),
])
def test_the_multiprocessing_start_methods_name_themselves(tmp_path, example, launcher, says):
    o = drive(tmp_path, [PY, str(EXAMPLES / example / "main.py"), "fail", "--out", "{out}", "--hold", "{hold}"], 2)
    check(o, "set_after_start", launcher, (says,), parent="writer")


@pytest.mark.parametrize("variant", ["fail", "ok"])
def test_env_i_as_the_command_names_itself(tmp_path, variant):
    """`run -- env -i … python3 w.py`: env's image lives for an exec only, but it is the command run
    was given (examples/env_i has it inside a script, where only a witness of that exec can tell)."""
    named = ["NCCL_PROTO=LL"] if variant == "ok" else []
    o = drive(tmp_path, ["env", "-i", f"PATH={os.environ['PATH']}", *named, *WORKER], 1, env=LL)
    if variant == "ok":
        return check(o, None)
    check(o, "curated_env", "env -i", ("name NCCL_PROTO=LL after `env -i`",))
    # the verdict's culprit and the finding name the wrapper, and where it was
    (row,) = [r for r in o.doc["verdict"]["variables"] if r["var"] == VAR]
    assert [g["culprit"] for g in row["groups"]] == ["dropped by `env -i` in CMD's command line"], o.why()
    [f] = errors_on_var(o.doc)
    assert "and `env -i` in CMD's command line started them" in f["message"], o.why()


@pytest.mark.parametrize("command,images,where", [
    (["env", "-i", "python3", "w.py"], [], "in CMD's command line"),
    # CMD exec'd the wrapper (a read caught its image: whether one does is the machine's timing): CMD had run's
    # environment, so the wrapper it exec'd is where the value went
    (["python3", "launch.py"], [["python3", "launch.py"], ["env", "-i", "python3", "w.py"]], "exec'd by launch.py"),
])
def test_the_wrapper_cmd_ran_is_named_where_it_was(command, images, where):
    run = {"given_env": dict(LL), "command": command, "run_pid": 1, "started": 1.0, "ended": 9.0, "host": H}
    events = [seen(10, 1, 1.3 + i / 10, argv, LL if not i else {}, 1.25) for i, argv in enumerate(images)]
    events.append(seen(10, 1, 1.6, ["python3", "w.py"], {}, 1.25))
    m = model.build(EventLog(events=events, runs=[run]))
    [f] = [f for f in diagnose.rules(m, EXPECT) if f.severity == "error"]
    assert (f.edge["kind"], f.edge["launcher"], f.edge["parent"]) == ("curated_env", "env -i", None), f.edge
    assert f"had it, and `env -i` {where} started them" in f.message, f.message


@pytest.mark.parametrize("variant", ["fail", "ok"])
def test_sudo_resets_the_environment_and_preserve_env_keeps_it(tmp_path, variant):
    if shutil.which("sudo") is None or os.geteuid() != 0:
        pytest.skip("needs sudo, as root")
    keep = ["--preserve-env=NCCL_PROTO"] if variant == "ok" else []
    o = drive(tmp_path, ["sudo", *keep, *WORKER], 1, env=LL)
    # (the preload hook in sudo records its exec of the command with the envp sudo built: curated)
    check(o, None) if variant == "ok" else check(o, "curated_env", "sudo",
                                                 ("sudo --preserve-env=NCCL_PROTO", "env_keep"), parent="ppid")


@pytest.mark.parametrize("variant", ["fail", "ok"])
def test_su_login_clears_the_environment_and_whitelist_keeps_it(tmp_path, variant, other_user):
    """`su --login` as another user; the worker runs the system python (the other user cannot reach
    a venv under /root)."""
    system_py = "/usr/bin/python3"
    if shutil.which("su") is None or not os.access(system_py, os.X_OK):
        pytest.skip("needs su and /usr/bin/python3")
    work = Path(tempfile.mkdtemp(prefix="ncpt-su-"))  # pytest's tmp_path is 0700 root's
    try:
        os.chmod(work, 0o755)
        user = pwd.getpwuid(other_user).pw_name
        keep = ["-w", "NCCL_PROTO"] if variant == "ok" else []
        # the login "shell" is python itself: a login sh would run its profile's `id -u` before exec'ing
        # the worker, a child of the worker's pid that only issue 22's image order can place
        cmd = (f"import sys; sys.argv = ['w', '--out', '{{out}}', '--hold', '{{hold}}']; "
               f"exec(open('{EXAMPLES / '_worker.py'}').read())")
        o = drive(work, ["su", "--login", *keep, "-s", system_py, user, "-c", cmd], 1, env=LL)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    check(o, None) if variant == "ok" else check(o, "dropped_by_intermediate", "su", ("su -w NCCL_PROTO",),
                                                 parent="ppid")


TMUX = '''
    # a tmux server started before the value was exported keeps its own environment
    sock="ncpt-$$"
    tmux -L "$sock" -f /dev/null new-session -d -s job "sleep 120"
    export NCCL_PROTO=LL
    [ "$1" = ok ] && tmux -L "$sock" set-environment -g NCCL_PROTO LL
    tmux -L "$sock" new-window -t job "$2 $3 --out $4 --hold $5"
    while [ ! -e "$5/release" ]; do sleep 0.05; done
    while tmux -L "$sock" list-panes -a -F '#{pane_current_command}' 2>/dev/null | grep -qv sleep; do sleep 0.05; done
    tmux -L "$sock" kill-server
'''


@pytest.mark.parametrize("variant", ["fail", "ok"])
def test_a_tmux_server_started_earlier_keeps_its_environment(tmp_path, variant):
    if shutil.which("tmux") is None:
        pytest.skip("needs tmux")
    o = drive(tmp_path, ["bash", script(tmp_path, "tmux.sh", TMUX), variant, PY, str(EXAMPLES / "_worker.py"),
                         "{out}", "{hold}"], 1)
    check(o, None) if variant == "ok" else check(o, "not_in_root", "tmux", ("tmux set-environment -g NCCL_PROTO LL",
                                                                            "new-window -e NCCL_PROTO=LL"))


def test_a_tmux_server_seen_through_its_double_fork_has_the_same_cause():
    """A real run's log (tests/data/tmux-fork-chain, the fail variant above) where the watch read the server's
    first fork once and saw it gone before a second look, and read the server as that fork's child, not as a
    process run adopted: the fork exec'd nothing, so it ran tmux with tmux's environment, and the cause is the
    one the adopted server gives (once in ~25 runs of the test above, before)."""
    from ncclprobe.commands import report
    from ncclprobe.model import FORK_GONE
    logs = Path(__file__).resolve().parent / "data" / "tmux-fork-chain"
    result = report.build_report([str(logs)], expect=EXPECT)
    m = report.load([str(logs)])
    forks = [p for p in m.processes.values() if p.proc_env_reason == FORK_GONE and p.argv and p.argv[0] == "tmux"]
    server = [p for p in m.processes.values() if p.argv and p.argv[0] == "tmux" and (p.host, p.ppid) in
              {(f.host, f.pid) for f in forks}]
    assert len(forks) == 1 and len(server) == 1  # the case: the server's parent is the fork, read once
    [f] = [f for f in result.findings if f.code == "ENV_MISSING"]
    assert (f.edge["kind"], f.edge["launcher"]) == ("not_in_root", "tmux")
    assert "tmux set-environment -g NCCL_PROTO LL" in f.hint and "new-window -e NCCL_PROTO=LL" in f.hint


MAKEFILES = {
    "fail": "NCCL_PROTO = LL\n",  # a make variable only: recipes do not get it
    "ok": "export NCCL_PROTO = LL\n",
    "unexport": "unexport NCCL_PROTO\n",  # the environment had it; make keeps it from its recipes
}


@pytest.mark.parametrize("variant", list(MAKEFILES))
def test_make_passes_only_exported_variables_to_its_recipes(tmp_path, variant):
    if shutil.which("make") is None:
        pytest.skip("needs make")
    (tmp_path / "Makefile").write_text(MAKEFILES[variant] + "all:\n\t$(PY) $(W) --out $(OUT) --hold $(HOLD)\n")
    argv = ["make", "-s", "-f", str(tmp_path / "Makefile"), f"PY={PY}", f"W={EXAMPLES / '_worker.py'}",
            "OUT={out}", "HOLD={hold}"]
    o = drive(tmp_path, argv, 1, env=LL if variant == "unexport" else None)
    if variant == "ok":
        return check(o, None)
    # unexport: make had it and passed its recipe an environment without it; the preload hook in make
    # records the posix_spawn with the envp make built (an environment of its own: curated)
    kind = "curated_env" if variant == "unexport" else "not_in_root"
    check(o, kind, "make", ("export NCCL_PROTO", "make NCCL_PROTO=LL"))


FAKE_SSH = '''\
    #!/usr/bin/python3
    """A stand-in for ssh to another host: the remote command runs as sshd runs it, in a session
    environment of its own (PATH, HOME, SHELL, USER, LOGNAME), never with the client's."""
    import os, subprocess, sys
    args = sys.argv[1:]
    while args and args[0].startswith("-"):
        args = args[2:] if args[0] in ("-l", "-p", "-o", "-i") else args[1:]
    words = args[1:][1:] if args[1:2] == ["--"] else args[1:]
    session = {"PATH": os.environ["PATH"], "HOME": "/root", "SHELL": "/bin/sh", "USER": "root", "LOGNAME": "root"}
    sys.exit(subprocess.run(["/bin/sh", "-c", " ".join(words)], env=session).returncode)
'''


@pytest.mark.parametrize("variant", ["fail", "ok"])
def test_gnu_parallel_on_another_host_needs_env(tmp_path, variant):
    if shutil.which("parallel") is None or shutil.which("perl") is None:
        pytest.skip("needs GNU parallel")
    ssh = script(tmp_path, "ssh", FAKE_SSH)
    env = ["--env", "NCCL_PROTO"] if variant == "ok" else []
    argv = ["parallel", "--will-cite", *env, "--ssh", ssh, "-S", "1/otherhost",
            "-N0", f"{PY} {EXAMPLES / '_worker.py'} --out {{out}} --hold {{hold}}", ":::", "1"]
    o = drive(tmp_path, argv, 1, env=LL)
    check(o, None) if variant == "ok" else check(o, "curated_env", "gnu parallel", ("parallel --env NCCL_PROTO",))


@pytest.mark.parametrize("variant", ["fail", "ok"])
def test_supervisord_gives_its_programs_environment_from_its_config(tmp_path, variant):
    if shutil.which("supervisord") is None:
        pytest.skip("needs supervisord")
    env_line = 'environment=NCCL_PROTO="LL"\n' if variant == "ok" else ""
    conf = tmp_path / "supervisord.conf"
    conf.write_text(f"[supervisord]\nnodaemon=true\nlogfile={tmp_path}/s.log\npidfile={tmp_path}/s.pid\n"
                    f"childlogdir={tmp_path}\n[program:w]\ncommand={PY} {EXAMPLES / '_worker.py'} --out "
                    f"{tmp_path / 'out'} --hold {tmp_path / 'hold'}\nautorestart=false\nstartsecs=0\n{env_line}")
    o = drive(tmp_path, ["supervisord", "-c", str(conf)], 1,
              stop=lambda recs: [os.kill(r["ppid"], signal.SIGTERM) for r in recs.values()])
    check(o, None) if variant == "ok" else check(o, "not_in_root", "supervisord", ('environment=NCCL_PROTO="LL"',))


@pytest.mark.parametrize("variant", ["fail", "ok"])
def test_gunicorn_workers_get_the_masters_env(tmp_path, variant):
    pytest.importorskip("gunicorn")
    (tmp_path / "app.py").write_text(textwrap.dedent(f'''
        import _worker
        _worker.work({str(tmp_path / "out")!r}, {str(tmp_path / "hold")!r})

        def app(environ, start_response):
            start_response("200 OK", [])
            return [b""]
    '''))
    shutil.copy(EXAMPLES / "_worker.py", tmp_path / "_worker.py")
    env = ["--env", "NCCL_PROTO=LL"] if variant == "ok" else []
    argv = [PY, "-m", "gunicorn", *env, "-w", "1", "-b", "127.0.0.1:0", "--chdir", str(tmp_path), "app:app"]
    o = drive(tmp_path, argv, 1, stop=lambda recs: [os.kill(r["ppid"], signal.SIGTERM) for r in recs.values()])
    check(o, None) if variant == "ok" else check(o, "not_in_root", "gunicorn", ("gunicorn --env NCCL_PROTO=LL",))


def test_a_client_is_a_launcher_of_the_one_table():
    """srun, ssh, docker... are launchers (recognised, with their remedies) whose workers run under another
    daemon: one table says both, and a client is named by its program's path or its executable."""
    assert {"srun", "sbatch", "ssh", "docker", "kubectl", "systemd-run"} <= set(launchers.CLIENTS)
    for program, client in launchers.CLIENTS.items():
        la = launchers.BY_NAME[client.launcher]
        assert program in la.programs and launchers.identify([program, "x"]) is la
        assert launchers.client_of([f"/usr/bin/{program}", "x"]) is client is launchers.client_of(None, program)
    assert launchers.client_of(["slurmstepd", "[12.0]"]) is None  # the daemon itself runs the workers


def test_a_root_started_with_another_value_is_not_said_to_lack_it():
    """The root had NCCL_PROTO, only not the expected value: "started without that value", never "without it"."""
    other = {VAR: "Simple"}
    [f] = log_rules([start(1, 0, other, argv=["python", "main.py"]), comm(1, 2.0, other)])
    assert f.code == "ENV_CHANGED" and f.edge["kind"] == "not_in_root", f.to_json()
    assert "was started without that value" in f.message and "without it" not in f.message, f.message
    [f] = log_rules([start(1, 0, {}, argv=["python", "main.py"]), comm(1, 2.0, {})])
    assert f.code == "ENV_MISSING" and "was started without it" in f.message, f.message
