"""Rules on the exec-time view (`inspect`): pure functions from collected process records to findings.

A record is the dict `inspection` builds per process (the JSON `processes` entry) plus private keys
starting with `_` (`_watched`: the watched part of the exec-time block; `_exp`: its values of the expected names; `_hash`, `_span`: identity of
the block; `_start`: start time; `_alike`: the kind of process, see kinds_of). Every finding carries its evidence and a hint saying what to change
and where.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from ncclprobe.model import wiring
from ncclprobe.model.tuning import NOT_READ_BY_NCCL
from ncclprobe.diagnose.findings import Finding
from ncclprobe.model.watched import is_watched

Kinds = list[tuple[Mapping, list[int]]]  # kinds_of: a group's first record, the pids of all
LIVE_VIEW = ("`ncclprobe run -- CMD` (or `ncclprobe inject install`) records the live environment "
             "from inside each process")
NOT_SHOWN = "<not shown: outside the watched set>"
PTRACE_HINT = ("run ncclprobe as the processes' user, as root, or with CAP_SYS_PTRACE; in a container "
               "run it inside the same PID namespace (docker --pid=host / kubectl debug --target)")


def _cmd(rec: Mapping) -> str:
    return rec.get("command") or rec.get("name") or "?"


def readable(rec: Mapping) -> bool:
    return rec.get("env_source") == "exec" and not rec.get("stale")


def is_forkserver(rec: Mapping) -> bool:
    return any("multiprocessing.forkserver" in a for a in rec.get("cmdline") or ())


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


def stale(kinds: Kinds, by_pid: Mapping[int, Mapping]) -> list[Finding]:
    groups: dict[tuple, list[int]] = defaultdict(list)
    for r, pids in kinds:
        if r.get("stale"):
            groups[(r["stale"], r["ppid"] if r["stale"] in ("fork", "forkserver") else None)].extend(pids)
    out = []
    for (kind, ppid), pids in sorted(groups.items(), key=lambda kv: str(kv[0])):
        parent = by_pid.get(ppid) if ppid else None
        pids_t = tuple(sorted(pids))
        if kind == "clobbered":
            out.append(Finding(
                "EXEC_ENV_STALE", "warning",
                f"{len(pids)} process(es) overwrote their exec-time environment block (setproctitle or "
                "similar): /proc/<pid>/environ no longer shows what they started with",
                pids_t, None, {"env_reason": [by_pid[p].get("env_reason") for p in pids_t][0],
                               "commands": sorted({_cmd(by_pid[p]) for p in pids_t})[:5]},
                "set SPT_NOENV=1 in the environment that starts them (py-setproctitle then leaves "
                f"environ alone), or see the live values: {LIVE_VIEW}"))
        elif kind == "forkserver":
            out.append(Finding(
                "EXEC_ENV_STALE", "warning",
                f"{len(pids)} forkserver child(ren) of pid {ppid} show the forkserver's environment from "
                "its start; os.environ changes made in the main process after the server started never "
                "reach them",
                pids_t, None, {"forkserver": ppid, "forkserver_command": _cmd(parent or {})},
                "set the variables before the first multiprocessing Process starts (the server is "
                "started once, on first use), or use the spawn start method; " + LIVE_VIEW))
        else:
            out.append(Finding(
                "EXEC_ENV_STALE", "warning",
                f"{len(pids)} fork child(ren) of pid {ppid} never exec'ed: /proc/<pid>/environ shows the "
                "parent's exec-time block, not what the child really has (os.environ changes made before "
                "the fork are invisible here)",
                pids_t, None, {"parent": ppid, "parent_command": _cmd(parent or {}),
                               "same": "environ block, executable, command line"},
                "do not trust /proc for these; " + LIVE_VIEW + ". Expectations were not checked on them."))
    return out


def parent_diffs(kinds: Kinds, by_pid: Mapping[int, Mapping], expect: Mapping[str, str]) -> list[Finding]:
    """Watched variables dropped or changed between a process and its parent (warnings), one finding
    per parent, kind and set of children, naming every variable; names with an expectation are left
    to `expectations`, which reports them as errors."""
    # the differences of a pair of watched sets, once per pair (siblings share theirs)
    pairs: dict[tuple[int, int], tuple[Mapping, Mapping, list[tuple[str, dict[str, tuple]]]]] = {}
    groups: dict[tuple, list[int]] = defaultdict(list)
    for r, pids in kinds:
        parent = by_pid.get(r["ppid"])
        if not r.get("in_scope") or parent is None or not readable(r) or parent.get("env_source") != "exec":
            continue
        mine, theirs = r["_watched"], parent["_watched"]
        hit = pairs.get((id(mine), id(theirs)))
        if hit is None:
            hit = pairs[(id(mine), id(theirs))] = (mine, theirs, _watched_diff(mine, theirs, expect))
        for code, diff in hit[2]:
            groups[(code, r["ppid"], tuple(sorted(diff.items())))].extend(pids)
    out = []
    for (code, ppid, diff), pids in sorted(groups.items(), key=lambda kv: str(kv[0])):
        parent = by_pid[ppid]
        names = [v for v, _ in diff]
        ev = {"parent": ppid, "parent_command": _cmd(parent),
              "vars": {v: {"parent": old, "child": new} for v, (old, new) in diff}}
        if code == "ENV_MISSING":
            msg = (f"pid {ppid} had {', '.join(names)}, absent from the environment its child(ren) "
                   f"{', '.join(map(str, sorted(pids)))} were started with")
            hint = (f"whatever starts these children from pid {ppid} ({_cmd(parent)}) passes a curated "
                    f"environment (subprocess env=, a launcher allowlist such as Ray runtime_env or "
                    f"mpirun -x): add {', '.join(names)} there")
        else:
            msg = (f"{', '.join(f'{v} {old!r} -> {new!r}' for v, (old, new) in diff)}: changed between "
                   f"pid {ppid} and its child(ren) {', '.join(map(str, sorted(pids)))}")
            hint = (f"the code in pid {ppid} ({_cmd(parent)}) that starts them sets these; find the "
                    "override (framework defaults, env= of the launch call) and make it keep an explicit value")
        out.append(Finding(code, "warning", msg, tuple(sorted(pids)), names[0] if len(names) == 1 else None, ev, hint,
                           vars=tuple(names) if len(names) > 1 else (), culprit=f"curated env from pid {ppid}"))
    return out


def _watched_diff(mine: Mapping[str, str], theirs: Mapping[str, str],
                  expect: Mapping[str, str]) -> list[tuple[str, dict[str, tuple]]]:
    """("ENV_MISSING" | "ENV_CHANGED", {var: (parent's, child's)}) for a child's and its parent's
    watched variables; empty kinds are left out."""
    missing: dict[str, tuple] = {}
    changed: dict[str, tuple] = {}
    mine, theirs = wiring.job_env(mine) or {}, wiring.job_env(theirs) or {}  # ncclprobe's wiring is not the job's
    for var, old in theirs.items():
        if var in expect or var in NOT_READ_BY_NCCL:
            continue
        new = mine.get(var)
        if new == old:
            continue
        if var not in mine:
            missing[var] = (old, None)
        else:
            changed[var] = (old, mine[var])
    return [(code, d) for code, d in (("ENV_MISSING", missing), ("ENV_CHANGED", changed)) if d]


def expectations(kinds: Kinds, by_pid: Mapping[int, Mapping], expect: Mapping[str, str]) -> list[Finding]:
    groups: dict[tuple, list[int]] = defaultdict(list)
    for r, pids in kinds:
        if not r.get("in_scope") or not readable(r):
            continue
        for var, want in expect.items():
            have = r["_exp"].get(var)
            if have is None:
                groups[("ENV_MISSING", var, want, None)].extend(pids)
            elif have != want:
                groups[("ENV_CHANGED", var, want, have)].extend(pids)
    out = []
    for (code, var, want, have), pids in sorted(groups.items(), key=lambda kv: str(kv[0])):
        pids_t = tuple(sorted(pids))
        # Where to fix it: the nearest ancestor that still has the expected value.
        origin = _last_good_ancestor(by_pid, pids_t[0], var, want)
        # a variable outside the watched set may be a secret: compared, never shown (DESIGN §4)
        shown = is_watched(var)
        ev = {"expected": want if shown else NOT_SHOWN, "commands": sorted({_cmd(by_pid[p]) for p in pids_t})[:5]}
        if origin:
            ev["last_had_it"] = origin["pid"]
        where = (f"it is lost between pid {origin['pid']} ({_cmd(origin)}) and these processes: check the "
                 "env= or launcher that starts them" if origin else
                 "export it in the environment that starts the server's root process (or use "
                 "`ncclprobe run --set`)")
        if code == "ENV_MISSING":
            msg = f"{var} expected {want!r} but absent from {len(pids)} process(es)" if shown else \
                f"{var} is expected but absent from {len(pids)} process(es)"
        else:
            ev["value"] = have if shown else NOT_SHOWN
            msg = f"{var} is {have!r} in {len(pids)} process(es), expected {want!r}" if shown else \
                f"{var} differs from the expected value in {len(pids)} process(es)"
        out.append(Finding(code, "error", msg, pids_t, var, ev, f"set {var}{'=' + want if shown else ''}: {where}",
                           culprit=f"lost after pid {origin['pid']}" if origin else "not in the root's environment"))
    return out


def _last_good_ancestor(by_pid, pid, var, want):
    rec = by_pid.get(by_pid[pid]["ppid"])
    while rec is not None:
        if rec.get("env_source") == "exec" and rec["_exp"].get(var) == want:
            return rec
        rec = by_pid.get(rec["ppid"])
    return None


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


def shell_prefix(pitfalls: list[Mapping]) -> list[Finding]:
    """pitfalls: {"shell": pid, "shell_command", "pids": affected, "var", "value", "command",
    "led_to_target", "kind"} as collected by inspection (shells.pitfalls on each ancestor shell)."""
    out = []
    for p in pitfalls:
        if p["kind"] == "prefix":
            msg = (f"shell pid {p['shell']} assigns {p['var']}={p['value']} only to `{p['command']}`, "
                   f"not to `{p['led_to_target']}`, which started these processes")
            hint = (f"export it for the whole list: `export {p['var']}={p['value']}; ...`, or put the "
                    f"assignment right before the command: `{p['var']}={p['value']} {p['led_to_target']}`")
        else:
            msg = (f"shell pid {p['shell']} sets {p['var']}={p['value']} as an unexported shell variable; "
                   f"`{p['led_to_target']}` does not get it")
            hint = f"write `export {p['var']}={p['value']}` instead"
        scoped_to = (p["command"] or "").split()
        words = [w for w in scoped_to if "=" not in w]
        culprit = (f"prefix on `{words[0]}` only (shell pid {p['shell']})" if p["kind"] == "prefix" and words
                   else f"unexported in shell pid {p['shell']}")
        out.append(Finding("SHELL_PREFIX_SCOPE", "warning", msg, tuple(p["pids"]), p["var"],
                           {"shell": p["shell"], "shell_command": p["shell_command"],
                            "assigned_in": p["command"] or "(bare assignment)",
                            "command_that_led_here": p["led_to_target"]}, hint, culprit=culprit))
    return out


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


def all_rules(recs: list[Mapping], expect: Mapping[str, str], pitfalls: list[Mapping]) -> list[Finding]:
    kinds, by_pid = kinds_of(recs)
    return [*unreadable(kinds), *stale(kinds, by_pid), *expectations(kinds, by_pid, expect),
            *parent_diffs(kinds, by_pid, expect), *libraries(recs), *conf_values(kinds), *shell_prefix(pitfalls)]
