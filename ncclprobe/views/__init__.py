"""Projections of a command's objects into --json (no rich: render.py draws the text).

One process shape for every command that lists processes (inspect, run, report, demo; schema
common.json#/$defs/process): a model process, plus for inspect the /proc record it was built from. The
three environments are named for when they held: `exec_env` (the block given at execve, as
/proc/PID/environ shows it), `start_env` (what the boot probe saw at interpreter start), `live_env` (read
from the process's memory). A key a witness cannot know is there as null (or []), so a script reads one
shape whatever the command."""
from __future__ import annotations

import math
from typing import Any

from ncclprobe.model import ProcessView, version_code
from ncclprobe.model.watched import one_line

COMMAND_MAX = 100  # `command`: the command line on one line, as inspect's tree shows it


def finite(t: float | None) -> float | None:
    """Times NCCL's log does not give are infinite in the model; JSON has no infinity (null)."""
    return t if t is None or math.isfinite(t) else None


def version_text(code: int | None) -> str | None:
    """NCCL_VERSION_CODE as text: major*10000 + minor*100 + patch since 2.9, major*1000 + minor*100 + patch
    before; None for none."""
    if not code:
        return None
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def process(p: ProcessView, versions: dict | None = None, rec: dict | None = None) -> dict[str, Any]:
    """p as --json shows a process; versions: (host, path) -> libversions.LibVersion of the copies the probes
    named; rec: inspect's /proc record of p (procsnap.Snapshot.record, public keys), which knows more than
    the model keeps: the exec-time block as shown (--all-vars), the mappings, GPUs and the live reading."""
    seen = _from_record(rec) if rec is not None else _from_model(p)
    return {
        "host": p.node, "pid": p.pid, "ns_pid": p.ns_pid, "pidns": p.pidns, "host_pid_known": p.node == p.host,
        "pid_given_again": p.retired is not None, "ppid": p.ppid, "forked_from": p.forked_from,
        "adopted_by": p.adopted_by, "witnesses": sorted(p.sources),
        **{k: seen[k] for k in ("name", "user", "uid", "state", "root")},
        "start": finite(p.proc_start), "start_time": seen["start_time"],
        "argv": seen["argv"], "command": seen["command"], "exe": seen["exe"],
        "earlier_argv": p.images, "exec_after_boot": p.exec_after_boot,
        **{k: seen[k] for k in ("exec_env", "exec_env_source", "exec_env_reason", "exec_env_size",
                                "exec_env_denied_by", "exec_env_stale", "exec_env_diff")},
        "exec_env_differs": p.exec_env_differs, "cuda_visible_devices": seen["cuda_visible_devices"],
        "start_env": p.start_env, "injected": p.injected, "env_writes": [w.__dict__ for w in p.writes],
        # inspect --live's reading is the record's (--all-vars shows more than the model keeps)
        "live_env": seen.get("live_env", p.live_env), "live_t": seen.get("live_t", p.live_t),
        "live_since": p.live_since, "live_reason": seen.get("live_reason", p.live_reason),
        "live_diff": seen.get("live_diff"),
        "live_readings": [{"env": x.env, "t": x.t, "since": x.since} for x in p.live_readings],
        "nccl_libs": nccl_libs(p, versions or {}, seen["nccl_libs"]),
        "nccl_callers": seen["nccl_callers"], "maps_reason": seen["maps_reason"],
        "nccl_reads": [{"var": x.var, "value": x.value, "lib": x.lib, "t": finite(x.t), "source": x.source}
                       for x in sorted(p.reads.values(), key=lambda x: x.t)],
        "probe_errors": p.errors,
        **{k: seen[k] for k in ("gpus", "gpus_source", "gpus_reason", "conf_files", "in_scope", "notes")},
    }


def _from_model(p: ProcessView) -> dict[str, Any]:
    """What the model keeps of /proc (run's watch, a child's boot probe): less than inspect's record."""
    return {"name": None, "user": p.proc_user, "uid": None, "state": None, "root": None, "start_time": None,
            "argv": p.argv, "command": _command(p.argv), "exe": p.exe,
            "exec_env": p.proc_exec_env, "exec_env_source": p.proc_env_source, "exec_env_reason": p.proc_env_reason,
            "exec_env_size": None, "exec_env_denied_by": p.proc_denied_by, "exec_env_stale": p.proc_stale,
            "exec_env_diff": None, "cuda_visible_devices": (p.proc_exec_env or {}).get("CUDA_VISIBLE_DEVICES"),
            "nccl_libs": p.nccl_libs, "nccl_callers": [], "maps_reason": None,
            "gpus": [], "gpus_source": None, "gpus_reason": None, "conf_files": p.conf_files,
            "in_scope": p.in_scope, "notes": []}


def _from_record(r: dict) -> dict[str, Any]:
    """inspect's record under the names every command uses."""
    out = {k: r[k] for k in ("name", "user", "uid", "state", "root", "start_time", "command", "exe",
                             "cuda_visible_devices", "nccl_libs", "nccl_callers", "maps_reason", "gpus",
                             "gpus_source", "gpus_reason", "conf_files", "in_scope", "notes")}
    out.update({"argv": r["cmdline"], "exec_env": r["env"], "exec_env_source": r["env_source"],
                "exec_env_reason": r["env_reason"], "exec_env_size": r["env_size"],
                "exec_env_denied_by": r["env_denied_by"], "exec_env_stale": r["stale"],
                "exec_env_diff": r["env_diff"]})
    out.update({k: r[k] for k in ("live_env", "live_t", "live_reason", "live_diff") if k in r})  # --live only
    return out


def nccl_libs(p: ProcessView, versions: dict, mapped: list[dict]) -> list[dict[str, Any]]:
    """Every libnccl copy of p: those /proc showed mapped (path, inode, the ELF's version, how it is
    reached), then those only the probes named (p.libs); a version /proc did not read is the one the
    probes learnt (versions), where they did."""
    out = []
    for lib in mapped:
        got = versions.get((p.host, lib["path"])) if not lib.get("version") else None
        out.append(_lib(lib["path"], got, lib) if got else
                   _lib(lib["path"], None, lib, lib.get("version"), lib.get("version_source")))
    seen = {lib["path"] for lib in mapped}
    for path in sorted(p.libs - seen):
        out.append(_lib(path, versions.get((p.host, path)), {}))
    return out


def _lib(path: str, got, known: dict, version: str | None = None, source: str | None = None) -> dict[str, Any]:
    """One copy; got: the version the probes learnt (libversions.LibVersion), else version/source as /proc read it."""
    code = got.code if got else version_code(version)
    return {"path": path, "version": version_text(code) if got else version, "version_code": code,
            "version_source": got.source if got else source, "kind": known.get("kind"),
            "reached_by": known.get("reached_by"),
            "simulated": got.simulated if got and known.get("simulated") is None else known.get("simulated"),
            "inode": known.get("inode"), "defines": known.get("defines"), "deleted": known.get("deleted"),
            "reason": known.get("reason")}


def _command(argv: list[str] | None) -> str | None:
    if not argv:
        return None
    text = one_line(" ".join(argv))
    return text if len(text) <= COMMAND_MAX else text[: COMMAND_MAX - 1] + "…"
