"""`ncclprobe report`: per process and per communicator, what NCCL got, read and ran, from the
probes' log directories (several hosts' directories merge) and NCCL's own INFO logs."""
from __future__ import annotations

import contextlib
import gc
import os

from ncclprobe import diagnose, model as model_mod
from ncclprobe.aside import Aside
from ncclprobe.diagnose import verdict
from ncclprobe.doc import FindingsHere, Later, Result, Text, Title, Unexaminable
from ncclprobe.model import Model
from ncclprobe.views import report as view, verdict as verdictview
from ncclprobe.witnesses import events, nccllog_model


def load(dirs, nccl_logs=(), run_id: str | None = None) -> Model:
    if not dirs and not nccl_logs:
        raise Unexaminable("give a log directory or --nccl-log FILE", "nothing to read")
    events.check_sources(dirs, nccl_logs)
    # one host after another (memory holds one host's events at a time); may be empty: NCCL logs alone still
    # tell what NCCL read and ran
    log = events.stream_dirs(dirs, fold=True, by_host=True)
    if log.refused:
        raise Unexaminable(log.refused, "bad log directory",
                           {"hint": "the probes write at most NCCLPROBE_MAX_FILES files per host: report the "
                                    "directories of fewer hosts at once, or raise NCCLPROBE_REPORT_MAX_FILES "
                                    "where the memory is there"})
    # NCCL's logs: those named, else the probes' NCCL_DEBUG_FILE copies in the directories; a fleet's are
    # parsed in a child while the events are read here (they join the model after it is built)
    debug = list(nccl_logs) or log.nccl_debug
    with Aside(nccllog_model.parse, debug, worth=_bytes(debug) >= ASIDE_BYTES) as parsing:
        m = model_mod.build(log, run_id)
        if log.split_hosts:  # a host's events in files named for another: its order is all hosts' time order
            m = None  # (not two models at once)
            log = events.stream_dirs(dirs, fold=True)
            m = model_mod.build(log, run_id)
        m.dirs = list(log.dirs)
        if debug:
            nccllog_model.merge(m, debug, parsing.result())
    from ncclprobe.witnesses import shells
    m.shell_pitfalls = shells.model_pitfalls(m)  # the scripts the command lines name, read now
    if not m.processes and not m.comms:
        unreadable_files = sum(log.skipped_files.values())
        reason = (f"{unreadable_files} event file(s) skipped" if unreadable_files else
                  f"{len(log.files)} event file(s), nothing usable" if log.files else "no event files")
        if nccl_logs:
            reason += f"; no NCCL log lines recognised in {', '.join(map(str, nccl_logs))}"
        raise Unexaminable(f"nothing to report in {', '.join(map(str, [*dirs, *nccl_logs]))}: {reason}",
                           "empty log directory",
                           {"skipped": {**log.skipped, **log.skipped_files},
                            "hint": "was the job started under `ncclprobe run` "
                                    "(or with NCCLPROBE_DIR set and the probes wired in)?"})
    return m


ASIDE_BYTES = 1 << 20  # NCCL logs of at least this size are parsed in a child (aside.py): ~0.1 s of work


def _bytes(paths) -> int:
    total = 0
    for p in paths:
        try:
            total += os.stat(p).st_size
        except OSError:
            pass
    return total


@contextlib.contextmanager
def _no_cycle_collection():
    """The cyclic garbage collector held off while the model is built and read: each of its full passes walks
    every object the growing model holds (hundreds of thousands for a fleet), so their sum grows faster than
    the logs (about 1.5x the time at 1,024 hosts); what is freed meanwhile is freed by its reference count.
    After it, what the report made is moved to the oldest generation in one step (freeze, then unfreeze: two
    list splices): left in the youngest, the first collection after gc.enable() would walk all of it (~0.1 s
    for a 256-host job, 7% of the report), as a full collection would."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was:
            gc.enable()


def build_report(dirs, nccl_logs=(), expect: dict[str, str] | None = None, proc_view=None,
                 run_id: str | None = None, details: bool = False) -> Result:
    """The report of log directories (and NCCL logs); proc_view: a model holding a /proc view of the same
    job (the demo's live inspect), whose /proc witness joins the model before the rules run; run_id: only
    that run's part of them (`run`'s own report in a directory it shares with other runs)."""
    with _no_cycle_collection():
        return _build_report(dirs, nccl_logs, expect, proc_view, run_id, details)


def _build_report(dirs, nccl_logs, expect, proc_view, run_id, details) -> Result:
    m = load(dirs, nccl_logs, run_id)
    if proc_view is not None:
        model_mod.add_proc_view(m, proc_view)
    findings = diagnose.rules(m, expect or {})
    v = verdict.for_model(m, findings, expect or {})
    data = Later(lambda: view.model_json(m), view.MODEL_KEYS, {"verdict": v.to_json(), "fleet": view.fleet_json(m, findings)})
    brief = data["fleet"]["hosts"] > 1 and not details  # many hosts: the answer, the rest behind --details
    doc = [*view.header_doc(m, [*dirs, *nccl_logs], per_host=not brief), *verdictview.doc(v), FindingsHere()]
    if brief:
        doc.append(Text(f"Each finding's evidence and hint, the processes, communicators and per-host lines of "
                        f"{data['fleet']['hosts']} hosts: --details; everything: --json.", "dim"))
    else:
        doc += view.model_doc(m)
    return Result("report", findings=findings, data=data, doc=doc, code=v.code, brief=brief)


def augment_inspection(result, m: Model, log_dirs, error: Unexaminable | None = None):
    """An `inspect` result whose model also holds the in-process witnesses of log_dirs (same pids; the
    rules already ran on it): the verdict over the model's communicators, its tables after the tree."""
    if error is not None:
        result.tail.append(Text(f"In-process view: {error}", "warn"))
        result.data["in_process"] = {"error": str(error)}
        v = verdict.for_model(m, result.findings, result.expect)
        result.data["verdict"] = v.to_json()
        result.head = verdictview.doc(v)
        result.code = result.code or v.code
        return result
    expect = result.expect
    v = verdict.for_model(m, result.findings, expect)
    result.data["verdict"] = v.to_json()
    result.head = verdictview.doc(v)
    result.code = result.code or v.code
    result.data["communicators"] = view.model_json(m)["communicators"]
    result.data["in_process"] = {"dirs": [str(d) for d in log_dirs],
                                 "processes": sum(1 for p in m.processes.values() if p.sources - {"proc", "live"})}
    result.tail.extend([Title("In-process view (probes)"), *view.header_doc(m, log_dirs, title=False),
                        *view.model_doc(m)])
    return result


