"""`ncclprobe report`: per process and per communicator, what NCCL got, read and ran, from the
probes' log directories (several hosts' directories merge) and NCCL's own INFO logs."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ncclprobe import events, model as model_mod
from ncclprobe.diagnose import inprocess
from ncclprobe.doc import Result, Table, Text, Title, Unexaminable
from ncclprobe.findings import Finding
from ncclprobe.model import CommView, Model

SHOWN_VARS_MAX = 8


def load(dirs, nccl_logs=()) -> Model:
    if not dirs and not nccl_logs:
        raise Unexaminable("give a log directory or --nccl-log FILE", "nothing to read")
    events.check_sources(dirs, nccl_logs)
    log = events.read_dirs(dirs)  # may be empty: NCCL logs alone still tell what NCCL read and ran
    m = model_mod.build(log)
    if nccl_logs:
        from ncclprobe import nccllog_model
        nccllog_model.merge(m, nccl_logs)
    else:
        debug_files = [p for d in dirs for p in sorted(Path(d).glob("nccl-debug*")) if p.is_file() and not p.is_symlink()]
        if debug_files:
            from ncclprobe import nccllog_model
            nccllog_model.merge(m, debug_files)
    if not m.processes and not m.comms:
        unreadable_files = sum(v for k, v in log.skipped.items() if k.startswith("unreadable file"))
        reason = (f"{unreadable_files} event file(s) unreadable" if unreadable_files else
                  f"{len(log.files)} event file(s), nothing usable" if log.files else "no event files")
        if nccl_logs:
            reason += f"; no NCCL log lines recognised in {', '.join(map(str, nccl_logs))}"
        raise Unexaminable(f"nothing to report in {', '.join(map(str, [*dirs, *nccl_logs]))}: {reason}",
                           "empty log directory",
                           {"skipped": dict(log.skipped), "hint": "was the job started under `ncclprobe run` "
                            "(or with NCCLPROBE_DIR set and the probes wired in)?"})
    return m


def build_report(dirs, nccl_logs=(), expect: dict[str, str] | None = None) -> Result:
    m = load(dirs, nccl_logs)
    findings = dedupe(inprocess.all_rules(m, expect or {}))
    return Result("report", findings=findings, data=model_json(m), doc=model_doc(m, [*dirs, *nccl_logs]))


def augment_inspection(result: Result, log_dirs, nccl_logs=()) -> Result:
    """Merge the in-process witnesses of log_dirs into an `inspect` result (same pids)."""
    try:
        m = load(log_dirs, nccl_logs)
    except Unexaminable as exc:
        result.doc.append(Text(f"In-process view: {exc}", "warn"))
        result.data["in_process"] = {"error": str(exc)}
        return result
    result.findings = merge_witnesses(inprocess.all_rules(m, result.data.get("expect") or {}), result.findings)
    result.data["communicators"] = model_json(m)["communicators"]
    result.data["in_process"] = {"dirs": [str(d) for d in log_dirs], "processes": len(m.processes)}
    result.doc.extend(model_doc(m, log_dirs, title="In-process view (probes)"))
    return result


def merge_witnesses(in_process: list[Finding], exec_time: list[Finding]) -> list[Finding]:
    """Findings of both views, in-process first (more evidence), one per (code, pids, var); a
    parent/child environment difference the exec-time view already named for a child is not
    repeated from the boot probe's view of the same child."""
    covered = {(f.code, pid) for f in exec_time if "parent" in f.evidence for pid in f.pids}
    kept = [f for f in in_process
            if not ("parent" in f.evidence and f.code in ("ENV_MISSING", "ENV_CHANGED")
                    and f.severity == "warning" and all((f.code, pid) in covered for pid in f.pids))]
    return dedupe([*kept, *exec_time])


def dedupe(findings: list[Finding]) -> list[Finding]:
    """One finding per (code, processes, variable): where two witnesses say the same thing, the first
    one given (callers put the in-process witnesses first: they carry more evidence) stays."""
    seen, out = set(), []
    for f in findings:
        key = (f.code, tuple(sorted(f.pids)), f.var)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


# ---- presentation ---------------------------------------------------------------------------------

def one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _command(p) -> str:
    argv = list(p.argv or [p.exe or "?"])
    if argv:
        argv[0] = Path(argv[0]).name
    return one_line(" ".join(argv), 70)


def _short_lib(path: str | None) -> str:
    if not path:
        return "?"
    parts = Path(path).parts
    return "/".join(parts[-3:]) if len(parts) > 3 else path


def _version(v: int | None) -> str:
    """NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9, major*1000 + minor*100 + patch before."""
    if not v:
        return "?"
    if v >= 10000:
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
    return f"{v // 1000}.{v // 100 % 10}.{v % 100}"


def _tuning(env: dict[str, str] | None) -> str:
    if env is None:
        return "unknown"
    items = [f"{k[5:]}={v}" for k, v in sorted(env.items()) if inprocess.is_tuning(k)]
    if not items:
        return "(no NCCL tuning)"
    more = len(items) - SHOWN_VARS_MAX
    return " ".join(items[:SHOWN_VARS_MAX]) + (f" +{more}" if more > 0 else "")


def _realized(c: CommView) -> str:
    if not c.colls:
        return "-"
    rows = sorted(c.colls.values(), key=lambda s: (s.func, s.bytes_min))
    return "; ".join(f"{s.func} {s.algo}/{s.proto} ch{s.nchannels} {_size(s.bytes_min)}-{_size(s.bytes_max)} x{s.count}"
                     for s in rows)


def _size(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n}B" if n < 1024 else f"{n / 1024:.1f}K"


def _nccl_read(m: Model, c: CommView) -> str:
    """What NCCL itself read for this communicator: for a variable NCCL re-reads per communicator,
    the first read after this communicator started (else the last one before it); for a cached one,
    the process's first read."""
    if c.env_source == "nccl-log":  # the log's own lines, attributed to this communicator (nccllog_model)
        return " ".join([f"{k[5:]}={v}" for k, v in sorted(c.env.items()) if inprocess.is_tuning(k)][:SHOWN_VARS_MAX]) \
            or "(defaults)"
    p = m.processes.get((c.host, c.pid))
    if p is None or not p.reads:
        return "-"
    starts = sorted(x.t for x in m.comms_of(c.host, c.pid) if x.t > c.t)
    end = starts[0] if starts else float("inf")
    shown = []
    for var in sorted({r.var for r in p.reads.values() if inprocess.is_tuning(r.var)}):
        reads = sorted((r for r in p.reads.values() if r.var == var and (c.lib is None or r.lib in (c.lib, "nccl-log"))),
                       key=lambda r: r.t)
        if not reads:
            continue
        if inprocess.process_cached(var, c.version):
            pick = reads[0]
        else:
            inside = [r for r in reads if c.t <= r.t < end]
            before = [r for r in reads if r.t < c.t]
            pick = inside[0] if inside else (before[-1] if before else reads[0])
        if pick.value is not None:
            shown.append(f"{var[5:]}={pick.value}")
    return " ".join(shown[:SHOWN_VARS_MAX]) or "(defaults)"


def _api(c: CommView, m: Model) -> str:
    if c.api is None:
        return "unseen by preload"
    if c.parent:
        parent = next((p for p in m.comms if p.pid == c.pid and p.comm == c.parent), None)
        return f"{c.api} of {parent.ident if parent else c.parent} color {c.color}"
    return c.api


def model_doc(m: Model, dirs, title: str = "") -> list:
    procs = sorted(m.processes.values(), key=lambda p: (p.host, p.t_start or 0, p.pid))
    doc: list = [Title(title or f"ncclprobe report: {len(procs)} process(es), {len(m.comms)} communicator(s) "
                       f"from {', '.join(map(str, dirs))}")]
    if m.simulated:
        doc.append(Text("SIMULATED NCCL: these communicators ran on ncclprobe's simulated NCCL (no GPU); "
                        "algorithms and protocols are the simulator's choices, not a real machine's.", "warn"))
    for run in m.runs:
        for note in run.get("notes", []):
            doc.append(Text(f"run: {note}", "note"))
    rows = []
    for p in procs:
        ranks = sorted({str(c.rank) for c in m.comms_of(p.host, p.pid) if c.rank is not None})
        rows.append([p.host, str(p.pid), str(p.ppid or "?"), _command(p),
                     ",".join(sorted(p.sources)), ",".join(ranks) or "-",
                     " ".join(_short_lib(lib) for lib in sorted(p.libs)) or "-"])
    doc.append(Table(["host", "pid", "ppid", "command", "witnesses", "ranks", "NCCL library"], rows, title="Processes"))
    boot_expected = any(r.get("boot") for r in m.runs)
    blind = [p for p in procs if boot_expected and "boot" not in p.sources]
    if blind:
        doc.append(Text("Ran without the boot probe (not Python, python -S, or an environment that dropped "
                        "PYTHONPATH): " + ", ".join(f"pid {p.pid}" for p in blind), "warn"))
    crow = []
    for c in sorted(m.comms, key=lambda c: (c.host, c.pid, c.t)):
        lib = f"{_short_lib(c.lib)} {_version(c.version)}" + (" (simulated)" if c.simulated else "")
        crow.append([f"{c.pid}", f"{c.rank}/{c.nranks}", _api(c, m), c.ident, lib,
                     ",".join(sorted(c.seen_by)), _tuning(c.env) + ("" if c.ok else f" rc={c.rc}"),
                     _nccl_read(m, c), _realized(c)])
    if crow:
        doc.append(Table(["pid", "rank", "API", "communicator", "library", "seen by", "env at creation",
                          "NCCL read", "ran (algo/proto)"], crow, title="Communicators"))
    else:
        doc.append(Text("No communicator was created, or none was seen by a probe.", "warn"))
    skipped = sum(m.skipped.values())
    if skipped:
        doc.append(Text(f"Skipped {skipped} unreadable line(s)/file(s): "
                        + ", ".join(f"{k}: {v}" for k, v in m.skipped.items()), "dim"))
    return doc


def _finite(t: float) -> float | None:
    """Times NCCL's log does not give are infinite in the model; JSON has no infinity (null)."""
    return t if math.isfinite(t) else None


def model_json(m: Model) -> dict[str, Any]:
    procs = [{"host": p.host, "pid": p.pid, "ppid": p.ppid, "argv": p.argv, "exe": p.exe,
              "witnesses": sorted(p.sources), "env": p.start_env, "exec_env_differs": p.exec_env_differs,
              "forked_from": p.forked_from, "nccl_libs": sorted(p.libs),
              "env_writes": [w.__dict__ for w in p.writes],
              "nccl_reads": [{**r.__dict__, "t": _finite(r.t)} for r in sorted(p.reads.values(), key=lambda r: r.t)],
              "probe_errors": p.errors} for p in m.processes.values()]
    comms = [{"host": c.host, "pid": c.pid, "t": _finite(c.t), "api": c.api, "comm": c.comm, "comm_hash": c.comm_hash,
              "rank": c.rank, "nranks": c.nranks, "parent": c.parent, "color": c.color, "key": c.key,
              "uid": c.uid, "config": c.config, "env": c.env, "env_source": c.env_source, "rc": c.rc,
              "lib": c.lib, "version": c.version, "simulated": c.simulated, "ms": c.ms, "dev": c.dev,
              "comm_name": c.comm_name, "seen_by": sorted(c.seen_by), "destroyed": c.destroyed,
              "collectives": [s.__dict__ for s in c.colls.values()]} for c in m.comms]
    return {"processes": procs, "communicators": comms, "simulated": m.simulated,
            "skipped": m.skipped, "runs": m.runs}
