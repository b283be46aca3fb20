"""What ncclprobe itself adds to a job's environment (`run`, `demo`, `inject`), told from the values:
its own variables, its library as LD_PRELOAD entry and NCCL plugin, its boot-probe directory on
PYTHONPATH, an NCCL debug log written into its log directory. Trees, tables and rules show the job's
environment without it (unless --show-wiring): it is not what the operator set, and it is the same
in every process."""
from __future__ import annotations

import os
from collections.abc import Mapping

PROBE_LIB = "libncclprobe"
PLUGIN_VARS = ("NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN")
DEBUG_VARS = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")


def _under(path: str, d: str | None) -> bool:
    return bool(d) and os.path.dirname(path.rstrip("/")) == d.rstrip("/")


def split(env: Mapping[str, str] | None) -> tuple[dict[str, str] | None, dict[str, str]]:
    """(the job's part of env, ncclprobe's wiring). A variable whose value mixes both (LD_PRELOAD,
    PYTHONPATH) keeps the job's entries in the first and ours in the second."""
    if env is None:
        return None, {}
    ours = env.get("NCCLPROBE_DIR")
    job: dict[str, str] = {}
    wired: dict[str, str] = {}
    # the demo's NCCL log goes into the log directory: the NCCL_DEBUG* that write it are ours too
    debug_ours = bool(ours) and _under(env.get("NCCL_DEBUG_FILE", ""), ours)
    for k, v in env.items():
        if k.startswith("NCCLPROBE_") or (k in PLUGIN_VARS and PROBE_LIB in v) or (k in DEBUG_VARS and debug_ours):
            wired[k] = v
        elif k == "LD_PRELOAD" and PROBE_LIB in v:
            _part(k, v.replace(":", " ").split(), lambda e: PROBE_LIB in e, " ", job, wired)
        elif k == "PYTHONPATH" and ours and any(_under(e, ours) for e in v.split(os.pathsep)):
            _part(k, v.split(os.pathsep), lambda e: _under(e, ours), os.pathsep, job, wired)
        else:
            job[k] = v
    return job, wired


def _part(k, entries, is_ours, sep, job, wired) -> None:
    mine = [e for e in entries if is_ours(e)]
    rest = [e for e in entries if e and not is_ours(e)]
    wired[k] = sep.join(mine)
    if rest:
        job[k] = sep.join(rest)


def job_env(env: Mapping[str, str] | None) -> dict[str, str] | None:
    return split(env)[0]


def is_wiring(var: str, value: str | None, env: Mapping[str, str] | None = None) -> bool:
    """Whether var=value is ncclprobe's own (wholly): judged within env where given."""
    if value is None:
        return False
    job, wired = split({**(env or {}), var: value})
    return var in wired and var not in job
