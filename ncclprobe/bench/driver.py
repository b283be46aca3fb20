"""Runs the matrix: one fresh set of worker processes per configuration, each in its own process group,
killed at the configuration's timeout (status hang) and on Ctrl-C or SIGTERM (status interrupted: the
matrix stops there and returns what was measured), so no worker outlives the driver. Rank 0's rows
are read from its rows file while the configuration runs and handed on as they arrive.

Local mode starts every rank here. Job mode (started by torchrun or Slurm: RANK/WORLD_SIZE set) starts
this process's one rank per configuration and rendezvouses on MASTER_PORT + 1 + index; rank 0 reports.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ncclprobe import selfexec
from ncclprobe._lib import lib_path
from ncclprobe.bench.matrix import Config

# Inherited NCCL_* variables are dropped so "defaults" means NCCL's defaults; these only say how to
# reach the network or what to log, or are a site's safety policy (NVLink multicast off), and stay.
KEEP_INHERITED = ("NCCL_SOCKET_IFNAME", "NCCL_IB_", "NCCL_NET", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS",
                  "NCCL_DEBUG_FILE", "NCCL_HOSTID", "NCCL_COMM_ID", "NCCL_NVLS_ENABLE")
ERROR_GRACE_S = 3.0  # after one rank fails, how long the others get to fail on their own
POLL_S = 0.02
ROWS_FILE = "rows.jsonl"


@dataclass
class Job:
    """Where this process stands: every rank here (local) or one rank of a torchrun/Slurm job."""
    nranks: int
    rank: int | None = None        # None: local mode, all ranks are children of this process
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0

    @property
    def local(self) -> bool:
        return self.rank is None


def job_from_env(env=os.environ) -> Job | None:
    """A torchrun (RANK, WORLD_SIZE, LOCAL_RANK) or Slurm (SLURM_PROCID, SLURM_NTASKS) rank, or None."""
    if "NCCLPROBE_BENCH_PARENT" in env:
        return None  # a worker of ours never re-enters the driver
    rank, size = env.get("RANK"), env.get("WORLD_SIZE")
    local = env.get("LOCAL_RANK")
    if rank is None and "SLURM_PROCID" in env and "MASTER_ADDR" in env:
        rank, size, local = env["SLURM_PROCID"], env.get("SLURM_NTASKS"), env.get("SLURM_LOCALID")
    if rank is None or size is None:
        return None
    return Job(nranks=int(size), rank=int(rank), local_rank=int(local or 0),
               master_addr=env.get("MASTER_ADDR", "127.0.0.1"), master_port=int(env.get("MASTER_PORT", "29500")))


@dataclass
class ConfigRun:
    config: Config
    env: dict[str, str]                 # what this configuration set on top of the inherited environment
    status: str = "error"               # ok | wrong | hang | error | interrupted
    reason: str = ""
    pids: list[int] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)  # each rank's own report (pid, env, state)
    rows: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    dir: str = ""
    seconds: float = 0.0
    profiler: str = ""                  # why the profiler plugin was not wired in ('' when it was)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(base, common: dict[str, str], cfg: Config, extra: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """(environment of a worker, inherited NCCL_* names dropped). Order: inherited < --env < config <
    the harness's own rendezvous variables."""
    env, dropped = {}, []
    for k, v in base.items():
        if k.startswith("NCCL_") and not k.startswith(KEEP_INHERITED):
            dropped.append(k)
            continue
        env[k] = v
    env.update(common)
    env.update(cfg.env)
    env.update(extra)
    return env, sorted(dropped)


def _profiler_env(events: Path, user_env: dict[str, str]) -> tuple[dict[str, str], str]:
    """NCCL_PROFILER_PLUGIN=libncclprobe.so with a per-configuration NCCLPROBE_DIR: NCCL loads the
    profiler itself, so it sees the communicator however torch loaded libnccl."""
    if "NCCL_PROFILER_PLUGIN" in user_env:
        return {}, f"NCCL_PROFILER_PLUGIN is set by the user ({user_env['NCCL_PROFILER_PLUGIN']})"
    lib = lib_path("libncclprobe.so")
    if not lib.is_file():
        return {}, f"the probe library is not built ({lib})"
    events.mkdir(mode=0o700, exist_ok=True)
    return {"NCCL_PROFILER_PLUGIN": str(lib), "NCCLPROBE_DIR": str(events)}, ""


class RowTail:
    """The complete lines rank 0 has appended to its rows file so far; a line still being written
    waits for the next read, a malformed one is skipped."""

    def __init__(self, path: Path):
        self.path, self.fh, self.partial = path, None, b""

    def read(self) -> list[dict[str, Any]]:
        if self.fh is None:
            try:
                self.fh = open(self.path, "rb")
            except FileNotFoundError:  # rank 0 has not measured its first size yet
                return []
        *lines, self.partial = (self.partial + self.fh.read()).split(b"\n")
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised like Ctrl-C so the same cleanup runs; `signum` gives the shell exit
    code 128+n."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Signals:
    """SIGINT and SIGTERM for the length of a matrix: the first one is raised as Interrupted while
    `armed`; later ones, and any that arrive while `held` (spawning a worker set), are only recorded,
    so a second Ctrl-C can neither cut the kill short nor leave a started worker unrecorded."""

    def __init__(self):
        self.armed, self.signum, self._old = True, None, {}

    def __enter__(self) -> "Signals":
        if _main_thread():  # Python sets signal handlers only from the main thread
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._on)
        return self

    def __exit__(self, *exc) -> None:
        for s, old in self._old.items():
            signal.signal(s, old if old is not None else signal.SIG_DFL)
        self._old = {}

    def _on(self, signum, frame) -> None:
        self.signum = self.signum or signum
        if self.armed:
            self.armed = False
            raise Interrupted(signum)

    @contextmanager
    def held(self):
        was, before = self.armed, self.signum
        self.armed = False
        try:
            yield
        finally:
            self.armed = was
        if was and before is None and self.signum is not None:
            self.armed = False
            raise Interrupted(self.signum)


class Driver:
    def __init__(self, job: Job, spec: dict[str, Any], common: dict[str, str], timeout: float,
                 workdir: Path | None = None, base_env=None):
        self.job, self.spec, self.common, self.timeout = job, spec, common, timeout
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="ncclprobe-bench-"))
        self.live: list = []
        self.dropped: list[str] = []
        self.current: ConfigRun | None = None  # the configuration started last

    # -- processes ---------------------------------------------------------------------------
    def _kill(self, procs) -> None:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # the worker's own group: its children too
                except ProcessLookupError:
                    pass
        for p in procs:
            try:
                p.wait(timeout=10)
            except Exception:  # a process stuck in D state: nothing more a signal can do
                pass

    def kill_all(self) -> None:
        self._kill(self.live)
        self.live = []

    def _start(self, index: int, cfg: Config, cdir: Path, user_env: dict[str, str]) -> tuple[list, str]:
        import subprocess
        spec = dict(self.spec, out=str(cdir), rows=str(cdir / ROWS_FILE))
        (cdir / "spec.json").write_text(json.dumps(spec))
        prof, prof_reason = ({}, "gloo: no NCCL") if self.spec["backend"] == "gloo" else \
            _profiler_env(cdir / "events", user_env)
        if prof and self.spec.get("gpu_timing"):
            prof["NCCLPROBE_GPU_TIMING"] = "1"
        if self.job.local:
            port, ranks = _free_port(), list(range(self.job.nranks))
            addr = "127.0.0.1"
        else:
            port, ranks, addr = self.job.master_port + 1 + index, [self.job.rank], self.job.master_addr
        procs = []
        for r in ranks:
            extra = {"RANK": str(r), "WORLD_SIZE": str(self.job.nranks), "MASTER_ADDR": addr,
                     "MASTER_PORT": str(port), "NCCLPROBE_BENCH_PARENT": str(os.getpid()),
                     "LOCAL_RANK": str(r if self.job.local else self.job.local_rank), **prof}
            env, self.dropped = worker_env(self.base_env, self.common, cfg, extra)
            log = open(cdir / f"rank{r}.log", "wb")
            try:
                procs.append(subprocess.Popen(selfexec.module_argv("ncclprobe.bench.worker", cdir / "spec.json"),
                                              env=selfexec.module_env(env), cwd=cdir, stdout=log,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True))
            finally:
                log.close()
            self.live.append(procs[-1])
        return procs, prof_reason

    def run_config(self, index: int, cfg: Config, on_rows=None, signals: Signals | None = None) -> ConfigRun:
        """One configuration; `on_rows` gets each size's rows as rank 0 measures them. An interrupt
        kills the worker set, marks the run interrupted (keeping its rows) and goes on up."""
        cdir = self.workdir / f"{index:02d}-{cfg.name.replace('/', '_')}"
        cdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        run = self.current = ConfigRun(cfg, dict(self.common, **cfg.env), dir=str(cdir))
        tail, procs, t0 = RowTail(cdir / ROWS_FILE), [], time.monotonic()
        try:
            with signals.held() if signals else nullcontext():
                procs, run.profiler = self._start(index, cfg, cdir, run.env)
            self._wait(run, procs, tail, on_rows, t0)
        except KeyboardInterrupt as exc:
            self._kill(procs)
            run.status, run.reason = "interrupted", f"stopped by {_signame(exc)}"
            raise
        finally:
            self.live = [p for p in self.live if p not in procs]
            self._take(run, tail, on_rows)  # what rank 0 wrote before it ended
            tail.close()
            run.seconds = time.monotonic() - t0
            run.pids = [p.pid for p in procs]
            self._collect(run, cdir, procs)
        return run

    def _take(self, run: ConfigRun, tail: RowTail, on_rows) -> None:
        for line in tail.read():
            run.rows += line["rows"]
            if on_rows:
                on_rows(line["rows"])

    def _wait(self, run: ConfigRun, procs, tail: RowTail, on_rows, t0: float) -> None:
        deadline, failed_at = t0 + self.timeout, None
        while True:
            self._take(run, tail, on_rows)
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            now = time.monotonic()
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = now
            if failed_at is not None and now - failed_at > ERROR_GRACE_S:
                self._kill(procs)
                break
            if now > deadline:
                self._kill(procs)
                run.status, run.reason = "hang", f"killed after the {self.timeout:g} s timeout"
                break
            time.sleep(POLL_S)

    def _collect(self, run: ConfigRun, cdir: Path, procs) -> None:
        for path in sorted(cdir.glob("rank*.json")):
            try:
                run.workers.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        run.workers.sort(key=lambda w: w.get("rank", 0))
        result = cdir / "result.json"
        if run.status == "interrupted":
            done, total = len({r["bytes"] for r in run.rows}), len(self.spec["sizes"])
            run.reason += f" after {done} of {total} sizes"
            return
        if run.status == "hang":
            expected = range(self.job.nranks) if self.job.local else [self.job.rank]
            seen = {w.get("rank") for w in run.workers}
            stuck = [w["rank"] for w in run.workers if w.get("state") != "done"]
            silent = [r for r in expected if r not in seen]
            if stuck:
                run.reason += f"; ranks not finished: {', '.join(map(str, stuck))}"
            if silent:
                run.reason += f"; ranks that never reached the harness: {', '.join(map(str, silent))}"
            return
        errors = [f"rank {w['rank']}: {w['error']}" for w in run.workers if w.get("state") == "error"]
        if errors:
            run.status, run.reason = "error", "; ".join(errors)
            return
        if self.job.local or self.job.rank == 0:
            if not result.is_file():
                tail = _tail(cdir / f"rank{0 if self.job.local else self.job.rank}.log")
                run.status = "error"
                run.reason = f"no result (exit codes {[p.returncode for p in procs]})" + (f": {tail}" if tail else "")
                return
            run.meta = json.loads(result.read_text())
            run.status = "wrong" if any(r["wrong"] for r in run.rows) else "ok"
        else:
            run.status = "ok" if all(p.returncode == 0 for p in procs) else "error"


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def _signame(exc: BaseException) -> str:
    return signal.Signals(getattr(exc, "signum", signal.SIGINT)).name


@dataclass
class Matrix:
    runs: list[ConfigRun]                 # every configuration started, the interrupted one last
    not_run: list[Config]                 # the configurations an interrupt kept from starting
    signum: int | None = None             # the signal that stopped the matrix, None when it ran through


def run_matrix(driver: Driver, configs: list[Config], signals: Signals, watch=None) -> Matrix:
    """Every configuration in turn, reporting to `watch` (started, rows, done). The first SIGINT or
    SIGTERM kills the live worker set and returns what was measured, the interrupted run included."""
    runs: list[ConfigRun] = []
    signum = None
    try:
        for i, cfg in enumerate(configs):
            if watch:
                watch.started(i, cfg)
            runs.append(driver.run_config(i, cfg, watch and (lambda rows, i=i: watch.rows(i, rows)), signals))
            if watch:
                watch.done(i, runs[-1])
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        if driver.current is not None and not any(r is driver.current for r in runs):
            runs.append(driver.current)
            if watch:
                watch.done(len(runs) - 1, runs[-1])
    finally:
        signals.armed = False  # from here a signal only sets the exit code: the kill and the result run whole
        driver.kill_all()
    return Matrix(runs, configs[len(runs):], signum)


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()
