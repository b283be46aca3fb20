"""CONF_FILE_VALUE: values NCCL takes from an nccl.conf file (NCCL_CONF_FILE or ~/.nccl.conf, then
/etc/nccl.conf, each line applied with setenv(name, value, 0) inside NCCL, src/misc/param.cc), which no
process environment shows, and environment variables that shadow such a value. Two witnesses: the
files /proc let `inspect` read for each process, and a value NCCL read (env plugin, NCCL's log) that the
process's environment never had."""
from __future__ import annotations

from collections import defaultdict

from ncclprobe.diagnose.findings import Finding, at
from ncclprobe.model import Model
from ncclprobe.model.watched import is_watched


def conf_file_values(m: Model) -> list[Finding]:
    return [*_from_files(m), *_shadowed(m), *_from_reads(m)]


def _entries(m: Model, effect: str):
    """(process, file, entry) for every entry of that effect in the files of a process the rules scope."""
    for p in m.processes.values():
        if p.in_scope is False:
            continue
        for conf in p.conf_files or ():
            for e in conf.get("entries") or ():
                if e.get("effect") == effect:
                    yield p, conf, e


def _from_files(m: Model) -> list[Finding]:
    groups: dict[tuple, list] = defaultdict(list)
    for p, conf, e in _entries(m, "applies"):
        groups[(conf["path"], e["var"], e["value"], e["line"])].append(p)
    return [Finding("CONF_FILE_VALUE", "info",
                    f"{path} sets {var}={value} inside NCCL (not visible in /proc/<pid>/environ)",
                    _pids(ps), var, {"file": path, "line": line, "value": value},
                    f"a real {var} in the environment overrides this; edit {path} to change the default",
                    instances=tuple(at(p.host, p.pid) for p in ps), cause=("file", path, var, value, line))
            for (path, var, value, line), ps in sorted(groups.items(), key=lambda kv: str(kv[0]))]


def _shadowed(m: Model) -> list[Finding]:
    """A real variable that shadows a different value of a conf file: named, so neither is a surprise."""
    groups: dict[tuple, list] = defaultdict(list)
    for p, conf, e in _entries(m, "env wins"):
        have = (p.proc_exec_env or {}).get(e["var"])
        if have is not None and have != e["value"] and is_watched(e["var"]):
            groups[(conf["path"], e["var"], e["value"], e["line"], have)].append(p)
    return [Finding("CONF_FILE_VALUE", "info",
                    f"the environment's {var}={have} shadows {path}:{line} ({var}={value}): NCCL uses {have}",
                    _pids(ps), var, {"file": path, "line": line, "value": value, "environment": have},
                    f"remove {var} from the environment to use {path}'s value, or edit {path}",
                    instances=tuple(at(p.host, p.pid) for p in ps), cause=("shadowed", path, var, value, line, have))
            for (path, var, value, line, have), ps in sorted(groups.items(), key=lambda kv: str(kv[0]))]


def _from_reads(m: Model) -> list[Finding]:
    """NCCL read a value the process never had in its environment nor wrote: it came from nccl.conf."""
    out = []
    for p in m.processes.values():
        if p.start_env is None:
            continue
        for r in p.reads.values():
            if r.value is None or p.start_env.get(r.var) == r.value:
                continue
            if any(w.var == r.var and w.new == r.value for w in p.writes):
                continue
            out.append(Finding(
                "CONF_FILE_VALUE", "info",
                f"NCCL read {r.var}={r.value!r}, which the process environment did not have: "
                f"it came from an nccl.conf file (NCCL_CONF_FILE, ~/.nccl.conf or /etc/nccl.conf)",
                pids=(p.pid,), var=r.var, evidence={"value": r.value, "lib": r.lib, "at_start": p.start_env.get(r.var)},
                instances=(at(p.host, p.pid),), culprit="nccl.conf", cause=(r.var, r.value),
                hint="a real environment variable overrides the conf file; set it there if this value is unwanted"))
    return out


def _pids(ps) -> tuple[int, ...]:
    return tuple(sorted({p.pid for p in ps}))
