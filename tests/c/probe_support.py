"""Builds the probe library and the C test programs of tests/c/ into a folder, and runs them.

Shared by tests/test_probe_*.py and benchmarks/. Needs only a C compiler.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from pathlib import Path

from ncclprobe.witnesses import events

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
INCLUDE = ROOT / "probes" / "include"
FAKE_VERSION = 22809
ID = re.compile(r"0x[0-9a-f]{16}")  # a 64-bit id as the probes write it (ncclprobe/witnesses/events.py)


def uid_hash(*ids: bytes) -> str:
    """The `uid` the preload hook writes for these ncclUniqueIds: 64-bit FNV-1a over their bytes
    (preload.c jb_uid), in the id spelling; the simulated NCCL's commHash of one id is the same."""
    h = 0xcbf29ce484222325
    for b in b"".join(ids):
        h = ((h ^ b) * 0x100000001b3) & (1 << 64) - 1
    return f"0x{h:016x}"


def _probes_build():
    spec = importlib.util.spec_from_file_location("_probes_build", ROOT / "probes" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cc(out: Path, sources: list[Path], *extra: str, shared: bool = False) -> Path:
    build = _probes_build()
    cmd = [build.compiler(), "-O2", "-g", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-D_GNU_SOURCE",
           f"-I{INCLUDE}"]
    if shared:
        cmd += ["-fPIC", "-shared", "-fvisibility=hidden"]
    cmd += ["-o", str(out), *map(str, sources), *extra]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def build_probe(out_dir: Path) -> Path:
    """libncclprobe.so from the current sources, with the flags probes/build.py uses."""
    build = _probes_build()
    folder, extra = build.TARGETS["libncclprobe.so"]
    sources = sorted((ROOT / "probes" / folder).glob("*.c"))
    out = Path(out_dir) / "libncclprobe.so"
    subprocess.run([build.compiler(), *build.CFLAGS, "-Werror", "-o", str(out), *map(str, sources), *extra],
                   check=True, capture_output=True, text=True)
    return out


def build_fake_nccl(out_dir: Path, simulated: bool = False, no_getenv: bool = False) -> Path:
    """A fake libnccl.so.2 in out_dir (soname libnccl.so.2); no_getenv: it reads no variable at comm init."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    flags = [f"-DFAKE_VERSION={FAKE_VERSION}", "-Wl,-soname,libnccl.so.2", "-ldl"]
    if simulated:
        flags.append("-DFAKE_SIMULATED")
    if no_getenv:
        flags.append("-DFAKE_NO_GETENV")
    return cc(out_dir / "libnccl.so.2", [HERE / "fake_nccl.c"], *flags, shared=True)


def build_app(out_dir: Path, nccl_dir: Path) -> Path:
    """nccl_app linked against the fake libnccl.so.2 in nccl_dir (found through RUNPATH)."""
    link = Path(nccl_dir) / "libnccl.so"
    if not link.exists():
        link.symlink_to("libnccl.so.2")
    return cc(Path(out_dir) / "nccl_app", [HERE / "nccl_app.c"], f"-L{nccl_dir}", f"-Wl,-rpath,{nccl_dir}", "-lnccl",
              "-lpthread")


def build_local(out_dir: Path, nccl_dir: Path) -> tuple[Path, Path]:
    """(local_driver, liblocal_mid.so): libnccl reached only through an RTLD_LOCAL scope."""
    link = Path(nccl_dir) / "libnccl.so"
    if not link.exists():
        link.symlink_to("libnccl.so.2")
    mid = cc(Path(out_dir) / "liblocal_mid.so", [HERE / "local_mid.c"], f"-L{nccl_dir}", f"-Wl,-rpath,{nccl_dir}",
             "-lnccl", shared=True)
    driver = cc(Path(out_dir) / "local_driver", [HERE / "local_driver.c"], "-ldl")
    return driver, mid


def build_prof_driver(out_dir: Path) -> Path:
    return cc(Path(out_dir) / "prof_driver", [HERE / "prof_driver.c"], "-ldl", "-lpthread")


def build_env_driver(out_dir: Path, count_calls: bool = False) -> Path:
    """env_driver; with count_calls it interposes fstat/getpid/dladdr/pthread_mutex_lock to count
    the plugin's calls (its `count` mode)."""
    if count_calls:
        return cc(Path(out_dir) / "env_driver_count", [HERE / "env_driver.c"], "-DCOUNT_CALLS", "-rdynamic", "-ldl",
                  "-lpthread")
    return cc(Path(out_dir) / "env_driver", [HERE / "env_driver.c"], "-ldl", "-lpthread")


def build_lock_driver(out_dir: Path) -> tuple[Path, Path]:
    """(lock_driver, libslow_nccl.so)."""
    slow = cc(Path(out_dir) / "libslow_nccl.so", [HERE / "slow_nccl.c"], shared=True)
    return cc(Path(out_dir) / "lock_driver", [HERE / "lock_driver.c"], "-ldl", "-lpthread"), slow


def build_shim(out_dir: Path, claims_nccl: bool = False) -> Path:
    if claims_nccl:
        return cc(Path(out_dir) / "libshim_nccl.so", [HERE / "shim.c"], "-DCLAIMS_NCCL", "-ldl", shared=True)
    return cc(Path(out_dir) / "libshim.so", [HERE / "shim.c"], "-ldl", shared=True)


def build_dl_driver(out_dir: Path) -> Path:
    return cc(Path(out_dir) / "dl_driver", [HERE / "dl_driver.c"], "-ldl")


def build_cfg_edge(out_dir: Path) -> Path:
    return cc(Path(out_dir) / "cfg_edge", [HERE / "cfg_edge.c"], "-ldl")


def build_sim_nccl(out_dir: Path) -> Path:
    """The simulated NCCL (probes/simnccl) alone, as probes/build.py builds it: out_dir/libnccl.so.2."""
    build = _probes_build()
    folder, extra = build.TARGETS["sim/libnccl.so.2"]
    sources = sorted((ROOT / "probes" / folder).glob("*.c"))
    out = Path(out_dir) / "libnccl.so.2"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([build.compiler(), *build.CFLAGS, f"-I{ROOT / 'probes' / folder}", "-o", str(out),
                    *map(str, sources), *extra], check=True, capture_output=True, text=True)
    return out


def build_getenv_spy(out_dir: Path) -> Path:
    """getenv_spy.so: preloaded ahead of the probe, it counts the probe's getenv() reads of its own settings."""
    return cc(Path(out_dir) / "getenv_spy.so", [HERE / "getenv_spy.c"], "-ldl", shared=True)


def build_hostile_host(out_dir: Path, nccl_dir: Path | None = None) -> Path:
    """hostile_host linked against the libnccl.so.2 in nccl_dir; by default the simulated NCCL, built in
    out_dir/sim."""
    out_dir = Path(out_dir)
    if nccl_dir is None:
        nccl_dir = build_sim_nccl(out_dir / "sim").parent
    return cc(out_dir / "hostile_host", [HERE / "hostile_host.c"], f"-L{nccl_dir}", f"-Wl,-rpath,{nccl_dir}",
              "-l:libnccl.so.2", "-lpthread")


def probe_env(log_dir: Path | None, preload: Path | None = None, **extra: str) -> dict[str, str]:
    """The current environment without any probe settings, plus the given ones."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NCCLPROBE_", "NCCL_")) and k != "LD_PRELOAD"}
    if log_dir is not None:
        env["NCCLPROBE_DIR"] = str(log_dir)
    if preload is not None:
        env["LD_PRELOAD"] = str(preload)
    env.update(extra)
    return env


def run(cmd: list, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=timeout)


def read(log_dir: Path) -> events.EventLog:
    return events.read_dirs([log_dir])


def of_kind(log: events.EventLog, kind: str) -> list[dict]:
    return [e for e in log.events if e["ev"] == kind]
