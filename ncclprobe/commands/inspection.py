"""`ncclprobe inspect`: the exec-time view of a process tree — environment, NCCL libraries, GPUs,
nccl.conf files — diffed against parents and expectations, with the places that view is blind."""
from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from pathlib import Path

from ncclprobe import diagnose, model as model_mod, views
from ncclprobe.views import proctree, verdict as verdictview
from ncclprobe.diagnose import verdict
from ncclprobe.diagnose.findings import EXIT_UNEXAMINABLE
from ncclprobe.diagnose.visibility import PTRACE_HINT
from ncclprobe.doc import FindingsHere, Result, Unexaminable
from ncclprobe.model.watched import one_line, shown_values
from ncclprobe.witnesses import events, probedirs, procs, procsnap, shells


class UsageError(ValueError):
    """A malformed argument (the CLI turns it into a usage error, exit 2)."""


def _default_gpus() -> tuple[dict[int, list[int]], str]:
    try:
        from ncclprobe import topo
        return topo.process_gpus()
    except (ImportError, AttributeError) as exc:
        return {}, f"NVML unavailable ({exc})"


def inspect_processes(pids: list[int], pgrep: str | None = None, expect: dict[str, str] | None = None,
                      scope: str = "nccl", all_vars: bool = False, redact: bool = True,
                      log_dirs: list[str] | None = None, nccl_logs: list[str] | None = None, *,
                      proc_root: Path = procs.DEFAULT_PROC, reader: procs.Reader | None = None,
                      gpu_lookup: Callable[[], tuple[dict[int, list[int]], str]] | None = None,
                      merge_probe_dirs: bool = True, show_wiring: bool = False, live: bool = False,
                      live_reader=None, ras: bool | str | None = None, ras_window: float | None = None,
                      ras_diagnostics: bool = False) -> Result:
    """ras: ask NCCL's RAS service (True: at the targets' NCCL_RAS_ADDR, else localhost:28028; a string:
    there; None: where a target maps libnccl >= 2.24; False: never); ras_window: ask it twice, that many
    seconds apart, for each communicator's collectives per second; ras_diagnostics: also NCCL's RAS
    diagnostics (2.31+)."""
    expect = dict(expect or {})
    events.check_sources(log_dirs or [], nccl_logs or [])
    fs = procs.ProcFS(proc_root, reader)
    roots, not_found = _roots(fs, pids, pgrep)
    # ncclprobe itself (and its children) is not part of the job, even when the target is its ancestor
    tree = procs.walk(fs, roots, exclude=frozenset({os.getpid()}))
    if not tree.procs:
        raise Unexaminable(f"process {roots[0]} could not be read", "vanished",
                           {"hint": "it exited while being read; inspect it again while it runs"})
    gpu_map, gpu_reason = (gpu_lookup or _default_gpus)()
    ctx = procsnap.Snapshot(fs, tree, all_vars, redact, expect, gpu_map, gpu_reason)
    recs = [ctx.record(p) for p in tree.procs.values()]
    by_pid = {r["pid"]: r for r in recs}
    notes = procsnap.apply_scope(recs, scope) + procsnap.exited(recs)
    for r in recs:
        parent = by_pid.get(r["ppid"])
        r["stale"] = procsnap.stale_kind(r, parent)
        r["env_diff"] = ctx.diff(r, parent) if parent else None
        if r["in_scope"] or scope == "all":
            r["conf_files"] = ctx.conf(tree.procs[r["pid"]], r)
    _refuse_if_blind(recs, roots)
    live_summary = procsnap.read_live(ctx, recs, tree, proc_root, live_reader) if live else None
    host = socket.gethostname()
    skipped_dirs: list[dict] = []
    dirs = list(log_dirs or [])
    if not dirs and merge_probe_dirs:
        dirs, skipped_dirs = probedirs.readable_dirs(fs, tree)
        notes += [f"NCCLPROBE_DIR {one_line(s['dir'])} (in the environment of pid "
                  f"{', '.join(map(str, s['pids']))}) not read: {s['reason']}" for s in skipped_dirs]
    m, in_process_error = model_mod.Model(), None
    if dirs or nccl_logs:  # the probes' witnesses of the same processes: one model with /proc's
        from ncclprobe.commands.report import load  # the event reader costs ~27 ms: only when merging
        try:
            m = load(dirs, list(nccl_logs or []))
        except Unexaminable as exc:
            in_process_error = exc
    model_mod.add_sightings(m, procsnap.sightings(recs, host))
    ras_summary = _ask_ras(m, recs, host, ras, ras_window, ras_diagnostics)
    if ras_summary is not None:
        notes.append(ras_summary["said"])
    m.shell_pitfalls = ctx.shell_pitfalls() + shells.model_pitfalls(m, shells=False)  # + exec'd wrapper scripts
    findings = diagnose.rules(m, expect)
    # a PID named on the command line that is not there (or went during the walk) fails the command
    missing = sorted({s["pid"] for s in not_found} | {s["pid"] for s in tree.skipped if s["pid"] in pids})
    data = {"roots": tree.roots, "expect": shown_values(expect), "scope": scope,
            "processes": _processes(m, procsnap.public(recs), host, dirs or nccl_logs),
            "skipped": not_found + tree.skipped, "missing_pids": missing, "excluded": tree.excluded,
            "gpu_source": "nvml" if not gpu_reason else "fds", "gpu_reason": gpu_reason or None}
    if live_summary is not None:
        data["live"] = live_summary
    ras_doc: list = []  # RAS's communicators, after the tree (with a log directory, augment_inspection shows them)
    if ras_summary is not None:
        data["ras"] = {k: v for k, v in ras_summary.items() if k != "said"}
        if m.comms and not (dirs or nccl_logs):  # (with a log directory, augment_inspection gives them)
            from ncclprobe.views.report import comms_doc, model_json
            data["communicators"] = model_json(m)["communicators"]
            ras_doc = comms_doc(m, "Communicators (NCCL's RAS service)")
    result = _InspectResult("inspect", findings, data, expect,
                            lambda: proctree.document(recs, tree, notes, gpu_reason, not_found, show_wiring, live_summary))
    result.model = m
    result.tail = ras_doc
    if missing:
        result.code = EXIT_UNEXAMINABLE
    if dirs or nccl_logs:
        from ncclprobe.commands.report import augment_inspection
        result = augment_inspection(result, m, dirs, in_process_error)
    else:
        v = verdict.for_model(m, findings, expect)
        data["verdict"] = v.to_json()
        result.head = verdictview.doc(v)
        result.code = result.code or v.code
    if skipped_dirs:
        result.data.setdefault("in_process", {"dirs": []})["skipped_dirs"] = skipped_dirs
    return result


def _processes(m, recs: list[dict], host: str, merged) -> list[dict]:
    """The records as every command's --json shows a process (views.process), each with its model process
    (the sighting of it, and the probes' witnesses of it where log directories were merged)."""
    versions = {}
    if merged:
        from ncclprobe.witnesses.libversions import lib_versions
        versions = lib_versions(m)
    return [views.process(m.processes.get((host, r["pid"])) or model_mod.ProcessView(host, r["pid"]), versions, r)
            for r in recs]


RAS_SINCE = 22400  # NCCL_VERSION_CODE of 2.24.0, the first with the RAS service


def _ask_ras(m, recs: list[dict], host: str, ras: bool | str | None, window: float | None = None,
             diagnostics: bool = False) -> dict | None:
    """NCCL's RAS service's communicators into the model (witnesses/ras.py); what was asked and said, or
    None where it was not asked (off, or by default no target maps libnccl >= 2.24)."""
    if ras is False:
        return None
    versions = [model_mod.version_code(lib.get("version")) for r in recs for lib in r.get("nccl_libs") or () if isinstance(lib, dict)]
    if ras is None and not any(v is not None and v >= RAS_SINCE for v in versions):
        return None
    from ncclprobe.witnesses import ras as ras_mod, rasdiag
    if isinstance(ras, str):
        address = ras
    else:  # the targets' own NCCL_RAS_ADDR: what they hold now, then what they started with
        held = [(r.get("_live_watched") or {}).get("NCCL_RAS_ADDR") for r in recs]
        held += [(r.get("_watched") or {}).get("NCCL_RAS_ADDR") for r in recs]
        address = ras_mod.address_for(held)
    reading = ras_mod.read_window(address, window, diagnostics)
    joined = model_mod.add_ras(m, reading, host, ras_mod.local_addresses())
    said = (f"RAS at {address}: {len(reading.comms)} communicator(s)"
            + (f" of NCCL {reading.nccl_version}" if reading.nccl_version else "")
            + (f", {joined} rank(s) in the processes inspected" if reading.comms else "")
            + ("; text format (NCCL < 2.28.7): no per-communicator pids or hashes" if reading.format == "text" else "")
            + (f"; collectives per second over {reading.window_s:.1f} s" if reading.window_s else "")
            if reading.ok else f"RAS not read: {reading.reason}")
    out = {"address": address, "format": reading.format, "nccl_version": reading.nccl_version,
           "window_s": reading.window_s,
           "communicators": len(reading.comms), "ranks_joined": joined, "reason": reading.reason,
           "text": reading.text, "said": said}
    if reading.diagnostics is not None:
        out["diagnostics"] = rasdiag.summary(reading.diagnostics)
        out["said"] += "; " + out["diagnostics"]["said"]
        del out["diagnostics"]["said"]
    return out


class _InspectResult(Result):
    """A Result whose document is built on first use: --json never draws it. Nothing changes the
    records or the tree it is drawn from once inspect_processes has returned."""

    def __init__(self, command: str, findings: list, data: dict, expect: dict, build: Callable[[], list]):
        super().__init__(command, findings, data)
        self.expect = expect   # the values themselves: data["expect"] shows non-watched ones by name only
        self._build: Callable[[], list] | None = build
        self.head: list = []   # the verdict: drawn before the findings
        self.tail: list = []   # the in-process view: after the tree

    @property
    def doc(self) -> list:
        if self._build is not None:
            build, self._build = self._build, None
            self._doc = [*self.head, FindingsHere(), *build(), *self.tail]
        return self._doc

    @doc.setter
    def doc(self, value: list) -> None:
        self._build = None
        self._doc = value


def _roots(fs: procs.ProcFS, pids: list[int], pgrep: str | None) -> tuple[list[int], list[dict]]:
    """The roots to walk, and the given PIDs that cannot be examined ({"pid", "reason", "given"});
    raises Unexaminable only when nothing given can be examined."""
    roots: list[int] = []
    not_found: list[dict] = []
    first_error: Unexaminable | None = None
    if pgrep:
        try:
            matched = procs.matching_pids(fs, pgrep, exclude={os.getpid()})
        except re.error as exc:
            raise UsageError(f"--pgrep {pgrep!r} is not a valid regular expression: {exc}") from None
        if not matched:
            raise Unexaminable(f"no process matches {pgrep!r}", "no such process",
                               {"hint": "check the pattern against `ps -eo pid,args`"})
        roots.extend(matched)
    for pid in pids:
        try:
            fs.stat(pid)
        except OSError as exc:
            reason = procs.reason_of(exc)
            if reason == "vanished":
                error = Unexaminable(f"no such process: {pid}", "no such process",
                                     {"hint": "check the PID with `ps -p PID` (it may have exited)", "pid": pid})
            else:
                error = Unexaminable(f"cannot read /proc/{pid}: {reason}", reason,
                                     {"hint": PTRACE_HINT, "pid": pid})
            first_error = first_error or error
            not_found.append({"pid": pid, "reason": error.reason, "given": True})
            continue
        roots.append(procs.tgid_of(fs, pid))
    if not roots and first_error is not None:
        raise first_error
    return list(dict.fromkeys(roots)), not_found


def _refuse_if_blind(recs: list[dict], roots: list[int]) -> None:
    """A root whose whole tree is unreadable cannot be examined at all (exit 3)."""
    if recs and all(r["env_source"] == "unreadable" and r["env_reason"] in ("permission", "hidepid") for r in recs):
        raise Unexaminable(f"cannot read the environment of process {roots[0]} or any process under it "
                           f"({recs[0]['env_reason']})", recs[0]["env_reason"], {"hint": PTRACE_HINT})
