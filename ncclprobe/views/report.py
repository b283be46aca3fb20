"""`report`'s result as text and JSON: the header (what was read), the processes and communicators
tables, the model as --json gives it. Two projections of the same model; nothing here reads a witness
or draws (render.py does)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ncclprobe import views
from ncclprobe.diagnose import coverage, inprocess, verdict
from ncclprobe.doc import Records, Table, Text, Title
from ncclprobe.model import CommView, Model, ranges
from ncclprobe.witnesses.libversions import LibVersion, lib_versions
from ncclprobe.model.watched import redact_argv

SHOWN_VARS_MAX = 8
# witness -> its name in the processes table (one line per process at 80 columns)
WITNESS_SHORT = {"boot": "boot", "preload": "pre", "profiler": "prof", "envplugin": "env", "nccl-log": "log",
                 "proc": "proc", "live": "live", "run": "run", "ras": "ras", "edge": "edge"}
WITNESS_WORDS = {"boot": "boot probe", "preload": "preload hook", "profiler": "profiler plugin",
                 "envplugin": "env plugin", "nccl-log": "NCCL's log", "proc": "run's /proc watch",
                 "live": "its memory (run --live)", "run": "ncclprobe run (CMD, as it started it)",
                 "ras": "NCCL's RAS service", "edge": "its parent's record of the call that started it"}


def fleet_json(m: Model, findings) -> dict[str, Any]:
    """What the report folded across hosts (diagnose/fleet): per finding, on how many hosts it was seen
    and whether its instances were folded from several hosts alike; processes grouped by command and
    witnesses, with how many hosts run each group."""
    groups: dict[tuple, dict[str, Any]] = {}
    for p in m.processes.values():
        key = (_command(p), ",".join(sorted(p.sources)))
        g = groups.setdefault(key, {"command": key[0], "witnesses": sorted(p.sources), "processes": 0, "hosts": set()})
        g["processes"] += 1
        g["hosts"].add(p.node)
    return {"hosts": merged(m)["hosts"],
            "findings": [{"code": f.code, "hosts": len(f.hosts), "alike": "fleet" in f.evidence}
                         for f in findings],
            "process_groups": [{**g, "hosts": len(g["hosts"])} for g in groups.values()]}


# ---- presentation ---------------------------------------------------------------------------------

def one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _command(p) -> str:
    argv = list(p.argv or [p.exe or "?"])
    if argv:
        argv[0] = Path(argv[0]).name
    return one_line(" ".join(argv), 200)


def _short_lib(path: str | None) -> str:
    if not path:
        return "?"
    parts = Path(path).parts
    return "/".join(parts[-3:]) if len(parts) > 3 else path


def _lib_text(c: CommView, versions: dict[tuple[str, str], LibVersion]) -> str:
    got = versions.get((c.host, c.lib or ""))
    code = c.version or (got.code if got else None)
    text = f"{_short_lib(c.lib)} {_version(code)}"
    if not c.version and got is not None and got.source == "file":
        text += " (read from the file)"
    if c.simulated or (got is not None and got.simulated):
        text += " (simulated)"
    return text


def _version(v: int | None) -> str:
    return views.version_text(v) or "?"


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
    """What NCCL itself read for this communicator (verdict.comm_reads), tuning variables only; where it
    read none, or no witness could see its reads, the reason (never defaults shown as a fact)."""
    got = verdict.comm_reads(m, c)
    if got.values is None:
        return verdict.NOT_READ[got.reason or "no_witness"]
    shown = [f"{var[5:]}={value}" for var, value in got.values.items() if value is not None]
    unset = len(got.values) - len(shown)
    text = " ".join(shown[:SHOWN_VARS_MAX]) + (f" +{len(shown) - SHOWN_VARS_MAX}" if len(shown) > SHOWN_VARS_MAX else "")
    if not shown and unset:
        text = f"{unset} read, all unset (NCCL's defaults)"
    if got.reason is None:
        return text
    if not text:
        return verdict.NOT_READ[got.reason]
    if got.reason == "one_rank":
        return f"{text}; the per-communicator ones {verdict.NOT_READ['one_rank']}"
    return text


def _api(c: CommView, m: Model) -> str:
    if c.api is None:
        return "unseen by preload"
    if c.parent:
        parent = next((p for p in m.comms_of(c.host, c.pid, c.retired) if p.comm == c.parent), None)
        return f"{c.api} of {parent.ident if parent else c.parent} color {c.color}"
    return c.api


def injected(meta: dict[str, Any]) -> dict[str, Any]:
    """Every value ncclprobe put into CMD's tree, and how (run.json's record of it)."""
    pins = list((meta.get("profile") or {}).get("pin") or [])
    wiring_names = [n for n, on in (("LD_PRELOAD", meta.get("preload")), ("NCCL_PROFILER_PLUGIN", "profiler" in
                    (meta.get("plugins") or [])), ("NCCL_ENV_PLUGIN", "env" in (meta.get("plugins") or [])),
                    ("PYTHONPATH", meta.get("boot")), ("NCCLPROBE_DIR", True)) if on]
    return {"set": dict(meta.get("set") or {}), "enforced": dict(meta.get("enforced") or {}), "pinned": pins,
            "wiring": wiring_names}


def injected_lines(meta: dict[str, Any]) -> list[str]:
    inj = injected(meta)
    lines = []
    if inj["set"]:
        lines.append("ncclprobe put into CMD's environment (--set, as `env K=V CMD`): "
                     + " ".join(f"{k}={v}" for k, v in inj["set"].items()))
    if inj["enforced"]:
        lines.append("ncclprobe re-applies in every Python interpreter it reaches (--enforce), even one started "
                     "without it: " + " ".join(f"{k}={v}" for k, v in inj["enforced"].items()))
    if inj["pinned"]:
        lines.append("ncclprobe refuses in-process writes to (--pin): " + " ".join(inj["pinned"]))
    return lines


def merged(m: Model) -> dict[str, int]:
    """How many runs, hosts (of the runs and of the processes) and log directories the model merges."""
    hosts = {r["host"] for r in m.runs if isinstance(r.get("host"), str)} | {p.node for p in m.processes.values()}
    return {"runs": len(m.runs), "hosts": len(hosts), "dirs": len(m.dirs)}


def header_doc(m: Model, dirs, title: bool = True, per_host: bool = True) -> list:
    doc: list = []
    if title:
        names = list(map(str, dirs))
        where = ", ".join(names) if len(names) <= 3 else f"{len(names)} sources ({names[0]} … {names[-1]})"
        hosts = {p.host for p in m.processes.values()}
        on = f" on {len(hosts)} hosts" if len(hosts) > 1 else ""
        doc.append(Title(f"ncclprobe report: {len(m.processes)} process(es), {len(m.comms)} communicator(s){on} "
                         f"from {where}"))
        got = merged(m)
        if got["runs"] > 1 or got["hosts"] > 1:
            doc.append(Text(f"merged {got['runs']} run(s) of {got['hosts']} host(s) from {got['dirs']} log "
                            f"director{'y' if got['dirs'] == 1 else 'ies'}", "note"))
    if m.simulated:
        doc.append(Text("SIMULATED NCCL: these communicators ran on ncclprobe's simulated NCCL (no GPU); "
                        "algorithms and protocols are the simulator's choices, not a real machine's.", "warn"))
    for run in m.runs:
        who = f"run {run.get('run_id') or run.get('file', '?')} on {run.get('host', '?')}" if len(m.runs) > 1 else "run"
        for note in run.get("notes", []):
            doc.append(Text(f"{who}: {note}", "note"))
        doc += [Text(line if who == "run" else f"{who}: {line}", "note") for line in injected_lines(run)]
    for host, w in sorted(m.watch.items()) if per_host else ():
        doc.append(Text(watch_line(w, host if len(m.watch) > 1 else None), "dim"))
    for p in coverage.unseen_execs(m):
        doc.append(Text(unseen_exec_line(p), "warn"))
    doc += [Text(line, "warn") for line in writer_lines(m)]
    return doc


WRITER_LINES_MAX = 8  # per kind; the JSON lists every process


def writer_lines(m: Model) -> list[str]:
    """What the writers said they did not record: a spent log budget, lines dropped (the shared log-bounding
    policy), grouped where many processes say the same."""
    hosts = {h for h, _ in [*m.reading.budget, *m.reading.dropped]}
    on = (lambda h: f" on {h}") if len(hosts) > 1 else (lambda h: "")
    budgets: dict[tuple, list[int]] = {}
    for (host, pid), (reached, limit) in sorted(m.reading.budget.items()):
        budgets.setdefault((host, reached, limit), []).append(pid)
    out = []
    for (host, reached, limit), pids in budgets.items():
        what = _budget_size(limit) if reached == "bytes" else str(limit) if limit is not None else "?"
        if reached == "bytes":
            out.append(f"log budget reached (bytes, {what}){on(host)}: later lines of pid {_pids(pids)} not recorded")
        else:
            out.append(f"log budget reached (files, {what}){on(host)}: pid {_pids(pids)} and the processes started "
                       "after it have no log file")
    dropped = sorted(m.reading.dropped.items())
    for (host, pid), n in dropped[:WRITER_LINES_MAX]:
        out.append(f"{n} line(s) dropped by pid {pid}'s writer{on(host)} (stalled or full filesystem)")
    if len(dropped) > WRITER_LINES_MAX:
        rest = dropped[WRITER_LINES_MAX:]
        out.append(f"{sum(n for _, n in rest)} more line(s) dropped by the writers of {len(rest)} more process(es)")
    return out


def _budget_size(limit: int | None) -> str:
    if limit is None:
        return "?"
    return f"{limit >> 20} MiB" if limit >= 1 << 20 and limit % (1 << 20) == 0 else f"{limit} bytes"


def _wrapped_command(argv: list[str]) -> str | None:
    from ncclprobe.witnesses import shells
    words = shells.wrapped_command(argv)
    return os.path.basename(words[0]) if words else None


def unseen_exec_line(p) -> str:
    words = [w if len(w) <= 40 else w[:39] + "…" for w in p.argv or []]  # a PATH=… is long
    shown = one_line(" ".join(words), 160)  # redacted already (the model's argv)
    what = _wrapped_command(p.argv or [])
    curated = (" `env -i` would have started it with only the variables named after it, so it had none of the "
               "others." if os.path.basename(p.argv[0]) == "env" and any(a in ("-i", "-", "--ignore-environment")
                                                                           for a in p.argv[1:3]) else "")
    return (f"pid {p.pid} was last seen as `{shown}`: {os.path.basename(p.argv[0])} execs {what}, and no witness saw "
            f"{what} (it ended before the watch's next scan and ran no boot probe), so its environment and what it "
            f"did are not in this report.{curated}")


def _watch_json(m: Model) -> dict[str, Any]:
    unseen: dict[str, list[int]] = {}
    for p in coverage.unseen_execs(m):
        unseen.setdefault(p.host, []).append(p.pid)
    return {host: {**w, "exec_unseen": unseen.get(host, [])} for host, w in m.watch.items()}


def watch_line(w: dict[str, Any], host: str | None = None) -> str:
    """run's /proc watch in one line: what it saw, and what it knows it missed."""
    # a pid both lists hold (an orphan run reaped that its parent's record names) is one process
    both = set(w.get("missed_pids") or []) & set(w.get("missed_started_pids") or [])
    missed = int(w.get("missed_known") or 0) + int(w.get("missed_started") or 0) - len(both)
    children = int(w.get("missed_children") or 0)
    kernel = w.get("mode") == "kernel"
    runs = f" ({w['runs']} runs)" if (w.get("runs") or 1) > 1 else ""
    text = (f"/proc watch{' on ' + host if host else ''}{runs}: {w.get('seen', 0)} process(es) seen"
            + (f", {w.get('kernel_reads', 0)} exec(s) read as they happened (the kernel's process events)" if kernel
               else "")
            + f" and {w.get('scans', 0)} scan(s) every {w.get('interval_s')} s")
    text += (f"; {missed} short-lived process(es) known to have run that no read caught (their boot probe, their "
             "parent's record of the call that started them, the kernel or run's reaping saw them)" if missed
             else "; none known missed")
    if children:
        text += (f"; at least {children} more that pid(s) {', '.join(map(str, (w.get('missed_parents') or [])[:8]))} "
                 "started and reaped between two scans, seen by no witness (the page faults of the children a "
                 "process reaps are added to its own count)")
    if kernel:
        if w.get("kernel_overruns"):
            text += f"; the kernel's event queue overflowed {w['kernel_overruns']} time(s): events were lost"
    else:
        why = f"; {w['kernel_refused']}" if w.get("kernel_refused") else ""
        text += (f" (scans only{why}: one that lives less than {w.get('interval_s')} s and runs no boot probe "
                 "can go unseen: NCCLPROBE_WATCH_S)")
    if w.get("live_reads") is not None:
        every = (f"every {w['live_s'] or w.get('interval_s')} s" if w.get("live_s") is not None
                 else "as often as 1 % of a core allows")
        text += (f"; --live: {w.get('live_processes', 0)} read(s) of a process's memory, each new process when seen "
                 f"and the whole tree {every} (NCCLPROBE_LIVE_S)")
    if w.get("stuck"):
        text += "; the watch was stuck on a /proc read at the end"
    return text


def model_doc(m: Model) -> list:
    """The details under the verdict and the findings: processes, then communicators."""
    procs = sorted(m.processes.values(), key=lambda p: (p.host, p.t_start or 0, p.pid))
    hosts = {p.node for p in procs}
    rows: dict[tuple, list] = {}
    fold = len(hosts) > FOLD_HOSTS  # many hosts: one row per kind of process, with how many hosts run it
    for p in procs:
        ranks = sorted({c.rank for c in m.comms_of(p.host, p.pid, p.retired) if c.rank is not None})
        key = ("" if fold else p.node if len(hosts) > 1 else "", None if fold else p.ppid, _command(p),
               ",".join(WITNESS_SHORT.get(s, s) for s in sorted(p.sources)), _ns_of(p))
        rows.setdefault(key, [[], [], set()])
        rows[key][0].append(p.pid)
        rows[key][1].extend(ranks)
        rows[key][2].add(p.node)
    table = []
    for (host, ppid, cmd, sources, ns), (pids, ranks, on) in rows.items():
        if fold:
            host = f"{len(on)} alike" if len(on) > 1 else next(iter(on))
            row = [f"{len(pids)}" + ns, "-", ranges(ranks) or "-", sources, cmd]
        else:
            row = [_pids(pids) + ns, str(ppid or "?"), ranges(ranks) or "-", sources, cmd]
        table.append([host, *row] if len(hosts) > 1 else row)
    cols = ["processes" if fold else "pid", "ppid", "ranks", "witnesses", "command"]
    host_col = "hosts" if fold else "host"
    used = {s for p in procs for s in p.sources}
    legend = ", ".join(f"{WITNESS_SHORT[k]} = {WITNESS_WORDS[k]}" for k in WITNESS_SHORT if k in used)
    doc: list = [Title("Processes"), Table([host_col, *cols] if len(hosts) > 1 else cols, table, compact=True)]
    if legend:
        doc.append(Text(f"witnesses: {legend}", "dim"))
    doc.extend(_copies_doc(m, procs))
    doc.extend(_live_doc(procs))
    boot_expected = any(r.get("boot") for r in m.runs)
    blind = [p for p in procs if boot_expected and "boot" not in p.sources]
    if blind:
        doc.append(Text("Ran without the boot probe (not Python, python -S, or an environment that dropped "
                        "PYTHONPATH): " + ", ".join(f"pid {p.pid}" for p in blind), "warn"))
    items = _comm_records(m)
    if items:
        doc.append(Records(items, title="Communicators"))
    else:
        doc.append(Text("No communicator was created, or none was seen by a probe.", "warn"))
    doc.extend(Text(line, "dim") for line in reading_lines(m))
    return doc


NOTES_SHOWN = 16  # file notes in the text; the JSON has every one


def reading_lines(m: Model) -> list[str]:
    """What was not read: lines and files skipped (each counted once, by reason), files not read whole,
    NCCL log lines read but given to no communicator."""
    files = m.reading.skipped_files
    lines = {k: v for k, v in m.skipped.items() if k not in files}
    out = []
    for what, counts in (("line(s)", lines), ("file(s)", files)):
        if counts:
            out.append(f"Skipped {sum(counts.values())} {what}: " + ", ".join(f"{k}: {v}" for k, v in counts.items()))
    notes = m.reading.notes
    out += [f"{n['path']}: {n['note']}" for n in notes[:NOTES_SHOWN]]
    if len(notes) > NOTES_SHOWN:
        out.append(f"… and {len(notes) - NOTES_SHOWN} more file note(s) (--json lists them)")
    out += [f"{k}: {v}" for k, v in m.reading.unattributed.items()]
    return out


def _copies_doc(m: Model, procs) -> list:
    """Processes that loaded more than one libnccl copy: each copy with its version (a second copy
    loaded through ctypes often made no communicator a probe saw, so no other line names it)."""
    versions = lib_versions(m)
    by_set: dict[tuple[str, ...], list[int]] = {}
    for p in procs:
        if len(p.libs) > 1:
            words = []
            for lib in sorted(p.libs):
                got = versions.get((p.host, lib))
                mark = (" (read from the file)" if got is not None and got.source == "file" else "") + \
                    (" (simulated)" if got is not None and got.simulated else "")
                words.append(f"{_short_lib(lib)} {_version(got.code if got else None)}{mark}")
            by_set.setdefault(tuple(words), []).append(p.pid)
    return [Text(f"libnccl copies in pid {_pids(pids)}: " + ", ".join(words), "note") for words, pids in by_set.items()]


def _live_doc(procs) -> list:
    """run --live: what each process held in its memory where it differs from its start (or exec-time)
    environment, each change between the two reads that bracket it; then the processes it could not read."""
    from ncclprobe.model import wiring
    from ncclprobe.diagnose.propagation import start_of
    out, unread = [], {}
    for p in procs:
        if p.live_reason is not None and not p.live_readings and p.live_env is None:
            unread.setdefault(p.live_reason, []).append(p.pid)
        if not p.live_readings:
            continue
        before = p.start_env if p.start_env is not None else (p.proc_exec_env or {})
        s0, words = start_of(p), []
        for r in p.live_readings:
            env = wiring.job_env(r.env) or {}
            old = wiring.job_env(before) or {}
            changed = [f"{k}={v}" for k, v in sorted(env.items()) if old.get(k) != v]
            changed += [f"-{k}" for k in sorted(old) if k not in env]
            if changed:
                rel = (lambda x: f"{x - s0:.2f}") if s0 is not None else (lambda x: f"{x:.3f}")
                span = f"by {rel(r.t)} s" if r.since is None else f"between {rel(r.since)} and {rel(r.t)} s"
                words.append(f"{' '.join(changed)} ({span}{' after its start' if s0 is not None else ''})")
            before = r.env
        if words:
            out.append(Text(f"live (read from memory), pid {p.pid}: " + "; ".join(words), "note"))
    if unread:
        out.append(Text("live: not read in " + "; ".join(f"{_pids(pids)} ({why})" for why, pids in unread.items()),
                        "dim"))
    return out


def _pids(pids: list[int]) -> str:
    return ", ".join(map(str, pids)) if len(pids) <= 4 else f"{len(pids)}: {ranges(pids)}"


FOLD_HOSTS = 3  # more hosts than this: rows and blocks alike on several hosts are one (diagnose/fleet)


def _comm_records(m: Model) -> list:
    """One block per communicator and tuning: its ranks that were created alike share it."""
    from ncclprobe.diagnose import fleet
    blocks: dict[tuple, dict] = {}
    versions = lib_versions(m)
    fold = len({c.host for c in m.comms}) > FOLD_HOSTS
    for c in sorted(m.comms, key=lambda c: (c.t, c.rank or 0)):
        lib = _lib_text(c, versions)
        held_now = (c.env_source or "").startswith("held now")
        fields = (("API", _api(c, m)), ("library", lib), ("seen by", ", ".join(sorted(c.seen_by))),
                  ("env held now" if held_now else "env at creation",
                   (_tuning(c.env) if c.env is not None or not held_now else "unknown (its process was not read)")
                   + ("" if c.ok else f" rc={c.rc}") + (" (not at creation: no probe saw it made)" if held_now else "")),
                  ("NCCL read", _nccl_read(m, c)), ("ran", _realized(c)))
        if c.ras is not None:
            fields += (("RAS", ras_words(c)),)
        ident = c.group or f"{c.host}:{c.pid}:{c.ident}"
        # many hosts: one block for the communicators alike on every host (replicas: one id each)
        key = (fleet.alike(ident, (c.host,), (c.pid,)) if fold else ident, fields)
        b = blocks.setdefault(key, {"id": c.group or c.ident, "ranks": [], "pids": [], "hosts": set(),
                                    "nranks": c.nranks, "name": c.comm_name, "ids": set()})
        b["ids"].add(c.group or c.ident)
        if c.rank is not None:
            b["ranks"].append(c.rank)
        b["pids"].append(c.pid)
        b["hosts"].add(c.host)
    items = []
    for (_, fields), b in blocks.items():
        who = (f"rank{'s' if len(b['ranks']) > 1 else ''} {ranges(b['ranks'])} of {b['nranks']}"
               if b["ranks"] else "rank ?")
        where = f"pid {_pids(sorted(set(b['pids'])))}" + (f" on {len(b['hosts'])} hosts" if len(b["hosts"]) > 1 else "")
        if fold and len(b["hosts"]) > 1:
            where = f"{len(set(b['pids']))} processes on {len(b['hosts'])} hosts alike; --json names each"
        name = f" {b['name']}" if b["name"] else ""
        ids = f" (and {len(b['ids']) - 1} alike)" if len(b["ids"]) > 1 else ""
        if len(b["ids"]) > 1:
            who = f"{len(b['pids'])} ranks"
        items.append((f"{b['id']}{ids}{name}  {who}  ({where})", [(k, v) for k, v in fields]))
    return items


def ras_words(c: CommView) -> str:
    """NCCL's RAS service's word on a communicator rank, in one line."""
    word = c.ras or {}
    errors, others = c.ras_troubles
    state = ", ".join(errors + others) or "running"
    counts = {k: v for k, v in (word.get("collective_counts") or {}).items() if v}
    ran = ", ".join(f"{k} {v}" for k, v in counts.items()) or "no collective counted"
    if word.get("per_s") is not None:  # --ras-window
        rates = {k: v for k, v in word["per_s"].items() if v}
        ran += "; " + (", ".join(f"{k} {v:.3g}/s" for k, v in rates.items()) if rates else "idle") + \
            f" over {word['window_s']:.1f} s"
    gpu = f"GPU {word['cuda_dev']}" if word.get("cuda_dev") is not None else "GPU ?"
    missing = f"; {word['missing_ranks']} rank(s) missing" if word.get("missing_ranks") else ""
    return f"{gpu}, {state}; {ran}{missing}"


def comms_doc(m: Model, title: str = "Communicators") -> list:
    items = _comm_records(m)
    return [Records(items, title=title)] if items else []


_finite = views.finite


def _version_json(c: CommView, versions: dict[tuple[str, str], LibVersion]) -> dict[str, Any]:
    """version as text and as NCCL_VERSION_CODE, as a process's nccl_libs give them."""
    got = versions.get((c.host, c.lib or ""))
    code, source = (c.version, "probe") if c.version else (got.code, got.source) if got else (None, None)
    return {"version": views.version_text(code), "version_code": code, "version_source": source}


def _ns_of(p) -> str:
    """A process's pid namespace, where it is not the report's: the pid in there, or that only it is known."""
    if p.pidns is None:
        return ""
    if p.node != p.host:  # only the pid in there is known
        return f" (in pid ns {p.pidns}, host pid unknown)"
    return f" (pid {p.ns_pid} in its ns)" if p.ns_pid is not None and p.ns_pid != p.pid else ""


MODEL_KEYS = ("processes", "communicators", "simulated", "skipped", "reading", "runs", "merged", "watch")


def model_json(m: Model) -> dict[str, Any]:
    """The model as JSON: the keys MODEL_KEYS, in that order."""
    versions = lib_versions(m)
    procs = [views.process(p, versions) for p in m.processes.values()]
    comms = [{"host": c.host, "pid": c.pid, "t": _finite(c.t), "api": c.api, "comm": c.comm, "comm_hash": c.comm_hash,
              "rank": c.rank, "nranks": c.nranks, "parent": c.parent, "color": c.color, "key": c.key,
              "uid": c.uid, "config": c.config, "env": c.env, "env_source": c.env_source, "rc": c.rc,
              "lib": c.lib, **_version_json(c, versions), "simulated": c.simulated, "ms": c.ms, "dev": c.dev,
              "comm_name": c.comm_name, "seen_by": sorted(c.seen_by), "destroyed": c.destroyed,
              **verdict.comm_reads(m, c).to_json(),
              "collectives": [_coll_json(s) for s in c.colls.values()],
              "activity": c.activity.__dict__ if c.activity is not None else None, "ras": c.ras} for c in m.comms]
    return {"processes": procs, "communicators": comms, "simulated": m.simulated,
            "skipped": m.skipped, "reading": _reading_json(m), "runs": [_run_json(r) for r in m.runs],
            "merged": merged(m), "watch": _watch_json(m)}


def _reading_json(m: Model) -> dict[str, Any]:
    files = m.reading.skipped_files
    keys = sorted({*m.reading.budget, *m.reading.dropped})
    return {"files": m.files, "lines_skipped": sum(v for k, v in m.skipped.items() if k not in files),
            "files_skipped": sum(files.values()), "file_notes": m.reading.notes,
            "writers": [{"host": h, "pid": p, "budget_reached": m.reading.budget.get((h, p), (None, None))[0],
                         "budget_limit": m.reading.budget.get((h, p), (None, None))[1],
                         "lines_dropped": m.reading.dropped.get((h, p), 0)} for h, p in keys],
            "unattributed": m.reading.unattributed}


def _coll_json(s) -> dict[str, Any]:
    return {**s.__dict__, "gpu_hist": sorted(s.gpu_hist.items())}


def _run_json(run: dict) -> dict:
    """run.json as reported: its command redacted (redact_argv), as older versions of `run` did not."""
    if isinstance(run, dict) and isinstance(run.get("command"), list):
        return {**run, "command": redact_argv(run["command"])}
    return run
