"""Runs the matrix: one fresh set of worker processes per configuration, each in its own process group,
killed at the configuration's timeout (status hang) and on Ctrl-C, so no worker outlives the driver.

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
    status: str = "error"               # ok | wrong | hang | error
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


class Driver:
    def __init__(self, job: Job, spec: dict[str, Any], common: dict[str, str], timeout: float,
                 workdir: Path | None = None, base_env=None):
        self.job, self.spec, self.common, self.timeout = job, spec, common, timeout
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="ncclprobe-bench-"))
        self.live: list = []
        self.dropped: list[str] = []

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

    def _start(self, index: int, cfg: Config, cdir: Path) -> tuple[list, dict[str, str], str]:
        import subprocess
        spec = dict(self.spec, out=str(cdir))
        (cdir / "spec.json").write_text(json.dumps(spec))
        user_env = dict(self.common, **cfg.env)
        prof, prof_reason = ({}, "gloo: no NCCL") if self.spec["backend"] == "gloo" else \
            _profiler_env(cdir / "events", user_env)
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
        return procs, user_env, prof_reason

    def run_config(self, index: int, cfg: Config) -> ConfigRun:
        cdir = self.workdir / f"{index:02d}-{cfg.name.replace('/', '_')}"
        cdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        t0 = time.monotonic()
        procs, user_env, prof_reason = self._start(index, cfg, cdir)
        run = ConfigRun(cfg, user_env, dir=str(cdir), profiler=prof_reason)
        deadline, failed_at = t0 + self.timeout, None
        while True:
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
        self.live = [p for p in self.live if p not in procs]
        run.seconds = time.monotonic() - t0
        run.pids = [p.pid for p in procs]
        self._collect(run, cdir, procs)
        return run

    def _collect(self, run: ConfigRun, cdir: Path, procs) -> None:
        for path in sorted(cdir.glob("rank*.json")):
            try:
                run.workers.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        run.workers.sort(key=lambda w: w.get("rank", 0))
        result = cdir / "result.json"
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
            data = json.loads(result.read_text())
            run.rows = data.pop("rows")
            run.meta = data
            run.status = "wrong" if any(r["wrong"] for r in run.rows) else "ok"
        else:
            run.status = "ok" if all(p.returncode == 0 for p in procs) else "error"


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so the same cleanup runs; `signum` gives the shell exit code 128+n."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def run_matrix(driver: Driver, configs: list[Config], progress=None) -> list[ConfigRun]:
    """Every configuration in turn; Ctrl-C or SIGTERM kills the live worker set before returning."""
    def on_term(signum, frame):
        raise Interrupted(signum)
    old = signal.signal(signal.SIGTERM, on_term) if _main_thread() else None
    runs = []
    try:
        for i, cfg in enumerate(configs):
            if progress:
                progress(f"[{i + 1}/{len(configs)}] {cfg.name}")
            runs.append(driver.run_config(i, cfg))
    finally:
        driver.kill_all()
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    return runs


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()
