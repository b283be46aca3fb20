"""What the exec-time view (`inspect`'s /proc records) shows on its own: pure functions from the
collected process records to findings (unreadable environments, libraries, conf files), and how a
record's block is known to be stale. Propagation along the tree is diagnose/propagation's.

A record is the dict `inspection` builds per process (the JSON `processes` entry) plus private keys
starting with `_` (`_watched`: the watched part of the exec-time block; `_exp`: its values of the expected names; `_hash`, `_span`: identity of
the block; `_start`: start time; `_alike`: the kind of process, see kinds_of). Every finding carries its evidence and a hint saying what to change
and where.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from ncclprobe.diagnose.findings import Finding

Kinds = list[tuple[Mapping, list[int]]]  # kinds_of: a group's first record, the pids of all
LIVE_VIEW = ("`ncclprobe inspect --live PID` reads the environment each process holds now from its memory; "
             "`ncclprobe run --live -- CMD` reads it while CMD runs, and `ncclprobe run -- CMD` (or `ncclprobe inject "
             "install`) records it from inside each Python process")
NOT_SHOWN = "<not shown: outside the watched set>"
PTRACE_HINT = ("run ncclprobe as the processes' user, as root, or with CAP_SYS_PTRACE; in a container "
               "run it inside the same PID namespace (docker --pid=host / kubectl debug --target)")


def _cmd(rec: Mapping) -> str:
    return rec.get("command") or rec.get("name") or "?"


def readable(rec: Mapping) -> bool:
    return rec.get("env_source") == "exec" and not rec.get("stale")


def runs_forkserver(argv) -> bool:
    """Whether a command line is multiprocessing's forkserver."""
    return any("multiprocessing.forkserver" in a for a in argv or ())


def is_forkserver(rec: Mapping) -> bool:
    return runs_forkserver(rec.get("cmdline"))


def stale_kind(rec: Mapping, parent: Mapping | None) -> str | None:
    """Why this process's exec-time block is known not to be its live environment, or None.

    fork copies the parent's memory, so a child that never exec'ed shows the parent's block: same
    block, same executable and command line, and (when the kernel shows it) the same env_start/end
    addresses, which a fresh exec would have randomised (ASLR)."""
    source, reason = rec.get("env_source"), rec.get("env_reason")
    if reason == "partly overwritten" or (reason == "clobbered" and source == "empty"):
        return "clobbered"
    if parent is None or source != "exec" or parent.get("env_source") != "exec":
        return None
    block = rec.get("_hash")
    if block is None or block != parent.get("_hash"):  # not the same block
        return None
    span, pspan = rec.get("_span") or (0, 0, 0, 0), parent.get("_span") or (0, 0, 0, 0)
    if tuple(span) != tuple(pspan) and any(span) and any(pspan):  # a block laid out elsewhere: exec'ed again
        return None  # (most children of a launcher)
    layout = None if not any(span) or not any(pspan) else True
    if (rec.get("_start") or 0) < (parent.get("_start") or 0):
        return None
    same_program = rec.get("exe") == parent.get("exe") and rec.get("cmdline") == parent.get("cmdline")
    if same_program or layout:
        return "forkserver" if is_forkserver(parent) else "fork"
    return None


# Why /proc/<pid>/environ was refused (procaccess.denied_by): what the message says, and the hint.
_DENIED = {
    "other user": ("they run as another user ({users}), and /proc/<pid>/environ needs the same user or "
                   "CAP_SYS_PTRACE", PTRACE_HINT),
    "other group": ("they run as ncclprobe's user but with another group (a setgid program, sg/newgrp), and "
                    "/proc/<pid>/environ needs the same uids and gids or CAP_SYS_PTRACE",
                    "run ncclprobe with the processes' group (sg GROUP ncclprobe ...), as root, or with CAP_SYS_PTRACE"),
    "not dumpable": ("they run as ncclprobe's user but are not dumpable (a setuid, setgid or file-capability "
                     "program, or prctl(PR_SET_DUMPABLE, 0)), so /proc/<pid>/environ needs CAP_SYS_PTRACE",
                     "run ncclprobe as root or with CAP_SYS_PTRACE, or see the live values: " + LIVE_VIEW),
    "capabilities": ("they run as ncclprobe's user but hold capabilities ncclprobe lacks, so "
                     "/proc/<pid>/environ needs CAP_SYS_PTRACE",
                     "run ncclprobe with CAP_SYS_PTRACE (or with the processes' capabilities)"),
    "refused": ("the kernel refused although, as far as /proc shows, ncclprobe passes ptrace's checks (same "
                "user and group, dumpable, capabilities, or CAP_SYS_PTRACE): a security module (SELinux, "
                "AppArmor) or a user-namespace boundary denies it",
                "check the security module's denials (audit log, dmesg), run ncclprobe with CAP_SYS_PTRACE in "
                "the processes' own user namespace (inside their container), or see the live values: " + LIVE_VIEW),
}


def unreadable(kinds: Kinds) -> list[Finding]:
    """ENV_UNREADABLE per reason the environment was refused. A process that exited while it was read
    is no finding: there is nothing left to read (inspection notes it)."""
    groups: dict[tuple[str, str | None], list[tuple[Mapping, list[int]]]] = defaultdict(list)
    for r, pids in kinds:
        if r.get("env_source") == "unreadable" and r.get("env_reason") != "vanished":
            reason = r.get("env_reason") or "unknown"
            groups[(reason, r.get("env_denied_by") if reason == "permission" else None)].append((r, pids))
    out = []
    for (reason, denied), members in groups.items():
        pids = sorted(pid for _, ps in members for pid in ps)
        users = sorted({str(r["user"] if r.get("user") is not None else r.get("uid", "?")) for r, _ in members})
        evidence = {"reason": reason}
        if reason == "permission" and denied in _DENIED:
            what, hint = _DENIED[denied]
            what = what.format(users=", ".join(users))
            evidence.update({"denied_by": denied, "users": users})
        elif reason == "permission":  # not classified: the plain ptrace requirement
            what, hint = "reading /proc/<pid>/environ needs ptrace access to them", PTRACE_HINT
        elif reason == "hidepid":
            what, hint = "/proc is mounted with hidepid, which hides other users' processes", PTRACE_HINT
        else:
            what, hint = reason, "inspect again while it runs"
        out.append(Finding("ENV_UNREADABLE", "warning",
                           f"exec-time environment of {len(pids)} process(es) unreadable: {what}",
                           tuple(pids), None, evidence, hint))
    return out


def _lib_version(lib: Mapping) -> str:
    v = lib.get("version") or "?"
    return f"{v} simulated" if lib.get("simulated") else v


def libraries(recs: list[Mapping]) -> list[Finding]:
    out = []
    versions: dict[str, list[int]] = defaultdict(list)
    for r in recs:
        libs = r.get("nccl_libs")
        if not libs:
            continue
        copies = {(lib["path"], lib.get("inode")) for lib in libs}
        if len(copies) > 1:
            out.append(Finding(
                "NCCL_MULTIPLE_LIBS", "warning",
                f"pid {r['pid']} has {len(copies)} NCCL copies loaded, each with its own parameter cache "
                "and its own communicators",
                (r["pid"],), None, {"libs": [f"{lib['path']} ({_lib_version(lib)})" for lib in libs]},
                "load one libnccl: point VLLM_NCCL_SO_PATH / SGLANG_NCCL_SO_PATH at the copy torch "
                "loads, or remove the extra copy; tuning must reach every copy"))
        for lib in libs:
            versions[_lib_version(lib) if lib.get("version") else "unknown"].append(r["pid"])
        for lib in libs:
            if lib.get("kind") == "static":
                out.append(Finding(
                    "NCCL_UNHOOKABLE", "warning",
                    f"{'simulated ' if lib.get('simulated') else ''}NCCL is linked statically into {lib['path']} "
                    f"in pid {r['pid']}: no LD_PRELOAD "
                    "hook can see its communicators",
                    (r["pid"],), None, {"object": lib["path"], "defines": lib.get("defines", [])[:4],
                                        "version": lib.get("version"), "simulated": bool(lib.get("simulated"))},
                    "rely on NCCL's own plugins (NCCL_PROFILER_PLUGIN / NCCL_ENV_PLUGIN, which "
                    "`ncclprobe run` sets) or use a build that links libnccl.so dynamically"))
    known = {v: p for v, p in versions.items() if v != "unknown"}
    if len(known) > 1:
        out.append(Finding(
            "NCCL_MULTIPLE_LIBS", "warning",
            f"different NCCL versions across the tree: {', '.join(sorted(known))}",
            tuple(sorted({p for ps in known.values() for p in ps})), None,
            {"versions": {v: sorted(set(p)) for v, p in known.items()}},
            "ranks of one communicator must run the same NCCL; install one nvidia-nccl version for every "
            "process (check VLLM_NCCL_SO_PATH, LD_LIBRARY_PATH, vendored copies)"))
    return out


def conf_values(kinds: Kinds) -> list[Finding]:
    groups: dict[tuple, list[int]] = defaultdict(list)
    for r, pids in kinds:
        if not r.get("in_scope"):
            continue
        for conf in r.get("conf_files") or []:
            for e in conf.get("entries") or []:
                if e["effect"] == "applies":
                    groups[(conf["path"], e["var"], e["value"], e["line"])].extend(pids)
    return [Finding("CONF_FILE_VALUE", "info",
                    f"{path} sets {var}={value} inside NCCL (not visible in /proc/<pid>/environ)",
                    tuple(sorted(pids)), var, {"file": path, "line": line, "value": value},
                    f"a real {var} in the environment overrides this; edit {path} to change the default")
            for (path, var, value, line), pids in sorted(groups.items(), key=lambda kv: str(kv[0]))]


def kinds_of(recs: list[Mapping]) -> tuple[Kinds, dict[int, Mapping]]:
    """The records every rule here treats alike, grouped, and every record by pid. Alike: the same
    kind of process (`_alike`, set by inspection: the same command line, environment block, mappings,
    user, ...) under the same parent, equally stale and in scope, with the same conf files. A group is
    its first record and the pids of all; the rules look at each group once (a tree of hundreds of
    workers is a few groups)."""
    groups: dict[tuple, tuple[Mapping, list[int]]] = {}
    by_pid: dict[int, Mapping] = {}
    for r in recs:
        pid = r["pid"]
        by_pid[pid] = r
        alike = r.get("_alike")
        key = (id(alike) if alike is not None else -pid, r["ppid"], r.get("stale"), r.get("in_scope"),
               id(r.get("conf_files")))
        group = groups.get(key)
        if group is None:
            groups[key] = (r, [pid])
        else:
            group[1].append(pid)
    return list(groups.values()), by_pid


def observations(recs: list[Mapping]) -> list[Finding]:
    """What /proc alone shows: environments it could not read, the libnccl copies mapped, the nccl.conf
    values that apply. Where values went along the tree is diagnose/propagation's, over the model."""
    kinds, _ = kinds_of(recs)
    return [*unreadable(kinds), *libraries(recs), *conf_values(kinds)]
