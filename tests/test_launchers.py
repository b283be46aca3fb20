"""Real launchers, real processes: every scenario of examples/ in its failure and its healthy variant,
driven twice -- under `ncclprobe run` and, started plainly, under `ncclprobe inspect` -- and checked
against what the workers really had.

Ground truth is the workers' own records (examples/_worker.py: one JSON file per worker, written to
a directory given by argv). The affected processes are the workers whose NCCL_PROTO is not "LL";
the assertion is that exactly they, and nothing else, are in the error-level findings about
NCCL_PROTO, with the edge CONTRACT-13 names for the cause. CASES below is the whole table of
expectations; the tests only read it.

Synchronisation is by condition (polled, bounded), never by a fixed sleep: a case waits until every
worker has written its record; held workers (`--hold DIR`) wait for DIR/release. Under `run` the
workers are held too, until run's log directory has a witness of each (a /proc watch may not miss a
worker because it lived a few milliseconds; a real one lives for the job) or WITNESS_WAIT_S passed.
Every case runs in a session of its own; whatever of that session is still alive afterwards is
killed, by pid, and reported (test_case_leaves_nothing_running).

The torchrun cases are marked slow: 3-8 s each on two shared cores (three interpreters import torch).

The examples' README commands exactly as typed (no --hold, workers that live a few milliseconds):
tests/test_readme_commands.py.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NCCLPROBE = [sys.executable, "-m", "ncclprobe"]
PY = sys.executable
TORCHRUN = (PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
VAR, WANT = "NCCL_PROTO", "LL"
EXPECT = f"{VAR}={WANT}"

RECORD_WAIT_S = 120.0  # every worker has recorded by then (torchrun imports torch in three processes; a
# bound on a polled condition, reached only when something is wrong: a loaded CI machine needed over 30 s)
WITNESS_WAIT_S = 30.0  # run drive: how long held workers wait for a witness of theirs in run's log dir
# (a polled bound: on a loaded machine 5 s passed before a witness was written, and the worker, released, was missed)
EXIT_WAIT_S = 30.0  # a released tree (or `run` after it) has exited by then
LEFTOVER_WAIT_S = 5.0  # what a case's session still holds after that is killed, and reported


@dataclass(frozen=True)
class Edge:
    """What a finding's `edge` must say: its kind, and who `edge.parent` is -- "writer" (the process
    that set the value: its record, examples/_worker.wrote), "ppid" (the process that started each
    affected worker) or None (not checked)."""
    kind: str
    parent: str | None = None


BLIND = "blind"  # /proc cannot know (fork children): the workers must be reported as not checked
SET_LATE, CURATED, DROPPED, SHELL, NOT_IN_ROOT = (
    "set_after_start", "curated_env", "dropped_by_intermediate", "shell_prefix", "not_in_root")


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]  # the scenario; --out/--hold are appended
    workers: int  # how many worker records it writes
    run: Edge | None  # what `run` must name; None: healthy (no error-level finding at all)
    inspect: Edge | str | None  # the same for plain `inspect`, or BLIND
    exported: bool = False  # the operator exported NCCL_PROTO=LL before starting it
    cwd: str | None = None  # relative to examples/ (None: a scratch directory)
    slow: bool = False
    needs_cc: bool = False
    live: Edge | None = None  # what `inspect --live` must name where it differs from run (None: run's)

    @property
    def healthy(self) -> bool:
        return self.run is None


def ex(rel: str) -> str:
    return str(EXAMPLES / rel)


# Plain `inspect` has only /proc: an os.environ write in a process is invisible to it, so where `run`
# names the write (set_after_start), inspect can only say that no ancestor's exec-time environment had
# the value (not_in_root). Fork children show their parent's exec-time block: BLIND.
CASES = [
    # 1. multiprocessing fork: 1st worker forked before the write (lacks it), 2nd after (has it)
    Case("mp_fork-fail", (PY, ex("mp_fork/main.py"), "fail"), 2, Edge(SET_LATE, "writer"), BLIND),
    Case("mp_fork-ok", (PY, ex("mp_fork/main.py"), "ok"), 2, None, BLIND),
    # 2. forkserver started (first use) before the write: both workers lack it
    Case("mp_forkserver-fail", (PY, ex("mp_forkserver/main.py"), "fail"), 2,
         Edge(SET_LATE, "writer"), Edge(NOT_IN_ROOT)),
    Case("mp_forkserver-ok", (PY, ex("mp_forkserver/main.py"), "ok"), 2, None, None),
    # 3. spawn: both workers started, then the write
    Case("mp_spawn-fail", (PY, ex("mp_spawn/main.py"), "fail"), 2, Edge(SET_LATE, "writer"), Edge(NOT_IN_ROOT)),
    Case("mp_spawn-ok", (PY, ex("mp_spawn/main.py"), "ok"), 2, None, None),
    # 4. ProcessPoolExecutor (fork context): workers run before the write / an initializer sets it
    Case("process_pool-fail", (PY, ex("process_pool/main.py"), "fail"), 2, Edge(SET_LATE, "writer"), BLIND),
    Case("process_pool-ok", (PY, ex("process_pool/main.py"), "ok"), 2, None, BLIND),
    # 5. subprocess env= allow-list (1st worker), full environment (2nd worker)
    Case("subprocess_env-fail", (PY, ex("subprocess_env/main.py"), "fail"), 2,
         Edge(CURATED, "ppid"), Edge(CURATED, "ppid"), exported=True),
    Case("subprocess_env-fail-nopythonpath", (PY, ex("subprocess_env/main.py"), "fail-nopythonpath"), 2,
         Edge(CURATED, "ppid"), Edge(CURATED, "ppid"), exported=True),
    Case("subprocess_env-ok", (PY, ex("subprocess_env/main.py"), "ok"), 2, None, None, exported=True),
    Case("subprocess_env-ok-nopythonpath", (PY, ex("subprocess_env/main.py"), "ok-nopythonpath"), 2,
         None, None, exported=True),
    # 6. torchrun on CPU (gloo): exported; a driver that sets it after starting torchrun; --no-python wrapper
    Case("torchrun-exported-ok", (*TORCHRUN, ex("torchrun/worker.py")), 2, None, None, exported=True, slow=True),
    Case("torchrun-fail", (PY, ex("torchrun/main.py"), "fail"), 2, Edge(SET_LATE, "writer"), Edge(NOT_IN_ROOT),
         slow=True),
    Case("torchrun-ok", (PY, ex("torchrun/main.py"), "ok"), 2, None, None, slow=True),
    Case("torchrun_wrapper-fail", (*TORCHRUN, "--no-python", ex("torchrun_wrapper/fail.sh")), 2,
         Edge(SHELL), Edge(SHELL), slow=True),
    Case("torchrun_wrapper-ok", (*TORCHRUN, "--no-python", ex("torchrun_wrapper/ok.sh")), 2, None, None, slow=True),
    # 7. bash: a prefix of another command, an unexported assignment, a prefix of exec; the script by
    #    absolute path, and by a relative one while the script itself changes directory
    *[Case(f"bash_prefix-{script}-{how}",
           ("bash", ex(f"bash_prefix/{script}.sh") if how == "abs" else f"bash_prefix/{script}.sh"), 1,
           None if script.startswith("ok") else Edge(SHELL, "ppid"),
           None if script.startswith("ok") else Edge(SHELL, "ppid"),
           cwd="." if how == "rel" else None)
      for script in ("fail_prefix", "fail_unexported", "ok_exec") for how in ("abs", "rel")],
    # 8. env -i
    Case("env_i-fail", ("bash", ex("env_i/fail.sh")), 1, Edge(CURATED, "ppid"), Edge(CURATED, "ppid"), exported=True),
    Case("env_i-ok", ("bash", ex("env_i/ok.sh")), 1, None, None, exported=True),
    # 9. a C daemon that execs its workers with an allow-list (raylet, orted)
    # (run: the preload hook in the daemon records each execve with the envp it built; inspect sees only
    # that the daemon had the value and its children do not)
    Case("c_daemon-fail", (PY, ex("c_daemon/main.py"), "fail"), 2, Edge(CURATED, "ppid"), Edge(DROPPED, "ppid"),
         exported=True, needs_cc=True, live=Edge(DROPPED, "ppid")),
    Case("c_daemon-ok", (PY, ex("c_daemon/main.py"), "ok"), 2, None, None, exported=True, needs_cc=True),
    # Ray's shape: the driver starts the daemon, then sets the value, then asks for workers
    Case("ray_shaped-fail", (PY, ex("ray_shaped/main.py"), "fail"), 2, Edge(SET_LATE, "writer"),
         Edge(NOT_IN_ROOT), needs_cc=True),
    Case("ray_shaped-ok", (PY, ex("ray_shaped/main.py"), "ok"), 2, None, None, needs_cc=True),
]
# inspect-live: `inspect --live` reads what each process holds now from its memory: an in-process write
# is a value it holds (dated at the read), a fork child's own environment is read: it names what run does
DRIVES = ("run", "inspect", "inspect-live")


def expected(case: Case, drive: str) -> Edge | str | None:
    if drive == "inspect-live" and case.live is not None:
        return case.live
    return case.inspect if drive == "inspect" else case.run


def _params(keep) -> list:
    marks = lambda c: [pytest.mark.slow] if c.slow else []  # noqa: E731
    return [pytest.param(c, d, id=f"{c.id}-{d}", marks=marks(c)) for c in CASES for d in DRIVES if keep(c, d)]


# -- what "reported as not checked" means: the lead's to adjust, here only ---------------------------
NOT_CHECKED_CODES = frozenset({"EXEC_ENV_STALE"})


def reported_not_checked(doc: dict) -> set[int]:
    """Pids a report says it could not check: named by a non-error finding of a blind-spot code."""
    return {p for f in doc["findings"] if f["severity"] != "error" and f["code"] in NOT_CHECKED_CODES
            for p in f["pids"]}


# -- reading a report ------------------------------------------------------------------------------
def about_var(f: dict) -> bool:
    return f.get("var") == VAR or VAR in (f.get("vars") or ())


def errors_on_var(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["severity"] == "error" and about_var(f)]


def flagged(doc: dict) -> set[int]:
    return {p for f in errors_on_var(doc) for p in f["pids"]}


def summary(doc: dict) -> str:
    """Each finding in one line, for assertion messages."""
    return "\n".join(f"  {f['severity']} {f['code']} var={f.get('var')} pids={f['pids']} edge={f.get('edge')}"
                     for f in doc["findings"]) or "  (no findings)"


# -- running one case -----------------------------------------------------------------------------
@dataclass
class Outcome:
    case: Case
    drive: str
    records: dict[int, dict]  # worker pid -> its record
    writers: set[int]  # pids of the processes that set the value (examples/_worker.wrote)
    doc: dict | None  # ncclprobe's JSON
    rc: int | None  # ncclprobe's exit code
    root_rc: int | None  # the scenario's own exit code (inspect drive)
    leftover: list[str]  # what of the case's session had to be killed afterwards
    stderr: str

    @property
    def bad(self) -> set[int]:
        return {pid for pid, r in self.records.items() if r.get(VAR) != WANT}

    def why(self) -> str:
        truth = ", ".join(f"{p}:{r.get(VAR)!r}(ppid {r['ppid']})" for p, r in sorted(self.records.items()))
        return (f"\n{self.case.id} under {self.drive}: workers {truth}; writers {sorted(self.writers)}\n"
                f"findings:\n{summary(self.doc or {'findings': []})}\nstderr tail:\n{self.stderr[-1500:]}")


def _session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of session sid."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(d))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _end_session(proc: subprocess.Popen) -> list[str]:
    """Wait (bounded) for proc's session to empty; kill, by pid, what is still in it; reap proc.
    Returns what had to be killed."""
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while _session_members(proc.pid) and time.monotonic() < deadline:
        proc.poll()  # reap the session leader itself as soon as it ends
        time.sleep(0.02)
    killed = []
    for _ in range(50):
        members = _session_members(proc.pid)
        if not members:
            break
        for pid in members:
            killed.append(f"{pid} {_cmdline(pid)}")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.poll()
        time.sleep(0.02)
    try:
        proc.wait(timeout=EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return sorted(set(killed))


def _records(out: Path, role: str) -> dict[int, dict]:
    return {r["pid"]: r for r in (json.loads(p.read_text()) for p in out.glob(f"{role}-*.json"))}


def _wait_records(out: Path, n: int, proc: subprocess.Popen, stderr: Path) -> None:
    deadline = time.monotonic() + RECORD_WAIT_S
    while len(list(out.glob("worker-*.json"))) < n:
        if proc.poll() is not None or time.monotonic() > deadline:
            got = len(list(out.glob("worker-*.json")))
            raise AssertionError(f"harness: {got} of {n} workers recorded "
                                 f"({'exited ' + str(proc.returncode) if proc.returncode is not None else 'timed out'})"
                                 f"\n{stderr.read_text(errors='replace')[-3000:]}")
        time.sleep(0.02)


def _witnessed(log_dir: Path) -> set[int]:
    """Pids whose worker image (a Python interpreter: every worker is _worker.py's) run's log directory
    has a witness of: a boot probe's event, or the /proc watch's sighting of it. A sighting of the
    same pid before it exec'ed Python (the `env -i` wrapper it was a moment before) is not one: a
    worker released then could exit before any scan saw what it exec'ed."""
    pids = set()
    for path in log_dir.glob("*.jsonl"):
        try:
            lines = path.read_bytes().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                e = json.loads(line)
                pid = e.get("pid")
            except (ValueError, AttributeError):
                continue  # a line being written
            python = e.get("src") == "boot" or (
                e.get("ev") == "proc_seen" and os.path.basename(str(e.get("exe") or "")).startswith("python"))
            if isinstance(pid, int) and python:
                pids.add(pid)
    return pids


def _wait_witnessed(log_dir: Path, pids: set[int]) -> None:
    """Held workers stay until run has a witness of each (so a /proc watch cannot miss them) or for
    WITNESS_WAIT_S at most: a missing witness is then run's to report, not the harness's to hide."""
    deadline = time.monotonic() + WITNESS_WAIT_S
    while not pids <= _witnessed(log_dir) and time.monotonic() < deadline:
        time.sleep(0.02)


def _env(case: Case) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "NCCLPROBE_"))}
    env["PATH"] = os.path.dirname(PY) + os.pathsep + env.get("PATH", "")  # `python3` in the scripts: ours
    if case.exported:
        env[VAR] = WANT
    return env


def _json(text: str, what: str) -> dict:
    try:
        return json.loads(text)
    except ValueError:
        raise AssertionError(f"{what} printed no JSON document:\n{text[-2000:]}") from None


def drive_case(case: Case, drive: str, work: Path, daemon: str | None) -> Outcome:
    out, hold = work / "out", work / "hold"
    out.mkdir()
    hold.mkdir()
    argv = [*case.argv, *(["--daemon", daemon] if case.needs_cc else []), "--out", str(out), "--hold", str(hold)]
    cwd = EXAMPLES / case.cwd if case.cwd else work
    stdout, stderr = work / "stdout", work / "stderr"
    log_dir = work / "log"
    if drive == "run":
        argv = [*NCCLPROBE, "run", "--json", "--dir", str(log_dir), "--expect", EXPECT, "--", *argv]
    with open(stdout, "wb") as so, open(stderr, "wb") as se:
        proc = subprocess.Popen(argv, stdout=so, stderr=se, stdin=subprocess.DEVNULL, cwd=cwd,
                                env=_env(case), start_new_session=True)
    doc = rc = root_rc = None
    leftover: list[str] = []
    try:
        _wait_records(out, case.workers, proc, stderr)
        if drive == "run":
            _wait_witnessed(log_dir, set(_records(out, "worker")))
        else:
            live = ["--live"] if drive == "inspect-live" else []
            res = subprocess.run([*NCCLPROBE, "inspect", str(proc.pid), *live, "--json", "--expect", EXPECT],
                                 capture_output=True, text=True, timeout=120, cwd=work)
            rc, doc = res.returncode, _json(res.stdout, f"inspect (rc {res.returncode}, {res.stderr[-500:]})")
        (hold / "release").touch()
        proc.wait(timeout=EXIT_WAIT_S)
        if drive == "run":
            rc, doc = proc.returncode, _json(stdout.read_text(errors="replace"), f"run (rc {proc.returncode})")
        else:
            root_rc = proc.returncode
    finally:
        (hold / "release").touch()
        leftover = _end_session(proc)
    return Outcome(case, drive, _records(out, "worker"), set(_records(out, "writer")), doc, rc, root_rc,
                   leftover, stderr.read_text(errors="replace"))


@pytest.fixture(scope="session")
def daemon_binary(tmp_path_factory) -> str | None:
    """examples/c_daemon/daemon.c, compiled once for the session (never kept in the repository)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    dest = tmp_path_factory.mktemp("daemon") / "daemon"
    subprocess.run([cc, "-O1", "-Wall", "-o", str(dest), str(EXAMPLES / "c_daemon" / "daemon.c")], check=True)
    return str(dest)


_OUTCOMES: dict[tuple[str, str], Outcome | BaseException] = {}


@pytest.fixture
def outcome(tmp_path_factory, daemon_binary):
    """The case's outcome under the drive, run once and shared by every test below (a harness
    failure too: it is raised again, not run again)."""
    def get(case: Case, drive: str) -> Outcome:
        if case.needs_cc and daemon_binary is None:
            pytest.skip("no C compiler (cc)")
        key = (case.id, drive)
        if key not in _OUTCOMES:
            try:
                _OUTCOMES[key] = drive_case(case, drive, tmp_path_factory.mktemp(f"{case.id}-{drive}"), daemon_binary)
            except Exception as exc:  # noqa: BLE001 (kept, and raised for every test of the case)
                _OUTCOMES[key] = exc
        o = _OUTCOMES[key]
        if isinstance(o, BaseException):
            raise o
        # the harness's own checks: the scenario did what its variant says, and ended well
        assert len(o.records) == case.workers, o.why()
        assert bool(o.bad) != case.healthy, f"the scenario's ground truth is not its variant's{o.why()}"
        assert o.root_rc in (None, 0), f"the scenario failed on its own{o.why()}"
        return o
    return get


# -- the verdicts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("case,drive", _params(lambda c, d: expected(c, d) != BLIND))
def test_flags_exactly_the_affected_workers(case, drive, outcome):
    """The error-level findings about NCCL_PROTO name the workers that lack LL, and only them."""
    o = outcome(case, drive)
    assert flagged(o.doc) == o.bad, o.why()


@pytest.mark.parametrize("case,drive", _params(lambda c, d: expected(c, d) is None))
def test_healthy_variant_has_no_error(case, drive, outcome):
    o = outcome(case, drive)
    assert [f["code"] for f in o.doc["findings"] if f["severity"] == "error"] == [], o.why()
    assert o.rc == 0, o.why()


@pytest.mark.parametrize("case,drive", _params(lambda c, d: isinstance(expected(c, d), Edge)))
def test_one_finding_names_the_edge(case, drive, outcome):
    """One cause, one finding, whose edge has the contract's kind for the launcher, the variable, and
    the right process as its parent."""
    o = outcome(case, drive)
    want = expected(case, drive)
    errors = errors_on_var(o.doc)
    assert len(errors) == 1, f"one finding per cause{o.why()}"
    edge = errors[0].get("edge") or {}
    assert (edge.get("kind"), edge.get("var")) == (want.kind, VAR), o.why()
    if want.parent == "writer":
        assert len(o.writers) == 1 and edge.get("parent") in o.writers, o.why()
    elif want.parent == "ppid":
        parents = {o.records[p]["ppid"] for p in o.bad}
        assert len(parents) == 1 and edge.get("parent") in parents, o.why()


@pytest.mark.parametrize("case,drive", _params(lambda c, d: expected(c, d) == BLIND))
def test_inspect_states_fork_children_not_checked(case, drive, outcome):
    """Fork children never exec'ed: /proc shows their parent's exec-time block, not what they have.
    inspect must neither flag them (a guess) nor pass them silently: it says they were not checked."""
    o = outcome(case, drive)
    assert flagged(o.doc) == set(), o.why()  # nor their parent, which started them and is no endpoint
    assert set(o.records) <= reported_not_checked(o.doc), o.why()
    if case.healthy:
        assert [f["code"] for f in o.doc["findings"] if f["severity"] == "error"] == [], o.why()


@pytest.mark.parametrize("case,drive", _params(lambda c, d: True))
def test_case_leaves_nothing_running(case, drive, outcome):
    """Released and reaped: nothing of the case's session outlives it."""
    o = outcome(case, drive)
    assert o.leftover == [], o.why()
