"""Which libnccl copies the job runs, and which of them a preload hook can see: NCCL_MULTIPLE_LIBS and
NCCL_UNHOOKABLE, one function each, over every witness the model holds (the copies /proc showed
mapped, the ones a probe or plugin named, the communicators' versions)."""
from __future__ import annotations

from collections import defaultdict

from ncclprobe.diagnose.findings import Finding, at
from ncclprobe.model import CommView, Model, ProcessView

_ONE_COPY = ("load one libnccl: point VLLM_NCCL_SO_PATH / SGLANG_NCCL_SO_PATH at the copy torch loads, or "
             "remove the extra copy; each copy has its own parameter cache, so tuning must reach every copy")


def _version(text_or_code) -> str | None:
    """One spelling of a version whatever the witness gave (ELF text '2.28.9', NCCL_VERSION_CODE)."""
    from ncclprobe.model import catalog
    code = catalog.version_code(text_or_code) if text_or_code else None
    return catalog.version_text(code) if code else None


def _copies(p: ProcessView) -> dict[str, str | None]:
    """path -> version label of every libnccl copy in p: mapped (/proc) or named by a probe."""
    out: dict[str, str | None] = {}
    for lib in p.nccl_libs:
        v = _version(lib.get("version"))
        out[lib["path"]] = f"{v} simulated" if v and lib.get("simulated") else v
    mapped = set(out)
    for path in p.libs:  # a probe names the copy as it was loaded (a symlink); maps shows the file
        if not mapped or _real(path) not in mapped:
            out.setdefault(path, None)
    return out


def _real(path: str) -> str:
    import os
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return path


def multiple_libs(m: Model) -> list[Finding]:
    """Several copies in one process, or several versions across the job."""
    out = []
    versions: dict[str, set] = defaultdict(set)
    for p in m.processes.values():
        copies = _copies(p)
        for v in copies.values():
            if v:
                versions[v].add((p.host, p.pid))
        if len(copies) > 1:
            labels = [f"{path} ({v or '?'})" for path, v in sorted(copies.items())]
            out.append(Finding(
                "NCCL_MULTIPLE_LIBS", "warning",
                f"pid {p.pid} has {len(copies)} NCCL copies loaded, each with its own parameter cache and its own "
                "communicators", (p.pid,), None, {"libs": labels}, _ONE_COPY, instances=(at(p.host, p.pid),),
                cause=("copies", p.host, p.pid)))
    for c in m.comms:
        v = _version(c.version)
        if v:
            versions[f"{v} simulated" if c.simulated else v].add((c.host, c.pid))
    if len(versions) > 1:
        where = sorted({k for ks in versions.values() for k in ks})
        out.append(Finding(
            "NCCL_MULTIPLE_LIBS", "warning", f"different NCCL versions across the job: {', '.join(sorted(versions))}",
            tuple(sorted({pid for _, pid in where})), None,
            {"versions": {v: sorted(pid for _, pid in ks) for v, ks in sorted(versions.items())}},
            "ranks of one communicator must run the same NCCL; install one nvidia-nccl version for every process "
            "(check VLLM_NCCL_SO_PATH, LD_LIBRARY_PATH, vendored copies)",
            instances=tuple(at(h, pid) for h, pid in where), cause=("versions",)))
    return out


def unhookable(m: Model) -> list[Finding]:
    """NCCL a preload hook cannot see, with the reason: linked statically into another object (/proc's
    ELF scan), or reached through ctypes (a communicator only the profiler plugin saw, in a process
    that had the preload)."""
    return [*_static(m), *_ctypes(m)]


def _static(m: Model) -> list[Finding]:
    out = []
    for p in m.processes.values():
        for lib in p.nccl_libs:
            if lib.get("kind") != "static":
                continue
            sim = "simulated " if lib.get("simulated") else ""
            out.append(Finding(
                "NCCL_UNHOOKABLE", "warning",
                f"{sim}NCCL is linked statically into {lib['path']} in pid {p.pid}: no LD_PRELOAD hook can see its "
                "communicators", (p.pid,), None,
                {"reason": "static", "object": lib["path"], "defines": list(lib.get("defines") or [])[:4],
                 "version": lib.get("version"), "simulated": bool(lib.get("simulated"))},
                "rely on NCCL's own plugins (NCCL_PROFILER_PLUGIN / NCCL_ENV_PLUGIN, which `ncclprobe run` sets) or "
                "use a build that links libnccl.so dynamically", instances=(at(p.host, p.pid),),
                culprit="statically linked NCCL", cause=("static", lib["path"])))
    return out


def _ctypes(m: Model) -> list[Finding]:
    if not m.preload_active:
        return []
    return [Finding(
        "NCCL_UNHOOKABLE", "warning",
        "a communicator was created through a path the preload hook cannot see (a ctypes-loaded NCCL, as "
        "SGLang/vLLM PyNccl do); only NCCL's profiler plugin saw it", (c.pid,), None,
        {"reason": "ctypes", "comm_hash": c.comm_hash, "lib": c.lib, "env_source": c.env_source},
        "its creation API and arguments are unknown; its environment comes from the profiler init",
        instances=(_at(c),), culprit="ctypes-loaded NCCL", cause=("ctypes", c.lib))
        for c in m.comms if "profiler" in c.seen_by and "preload" not in c.seen_by and c.comm_hash]


def _at(c: CommView) -> dict:
    return at(c.host, c.pid, c.rank, c.group or c.ident)
