"""`ncclprobe run`: start a command with the probes wired in, supervise its whole tree (supervise.py),
and report what its communicators got."""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ncclprobe.commands import logdir, supervise, watch as proc_watch
from ncclprobe.doc import Result, Text, Unexaminable
from ncclprobe.witnesses import procs
from ncclprobe.witnesses import events
from ncclprobe.commands.supervise import Group, printable
from ncclprobe.model.watched import redact_argv, redact_text, shown_values


@dataclass
class Wiring:
    """What `run` adds to the command's environment, and what it left alone (and why)."""
    env: dict[str, str]
    log_dir: Path
    notes: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    profile_file: Path | None = None  # the profile written for the boot probe (it may hold --set secrets)

    def remove_profile(self) -> str | None:
        """Remove the profile file (each interpreter read it at its start); what failed, if anything."""
        if self.profile_file is None:
            return None
        try:
            self.profile_file.unlink(missing_ok=True)
        except OSError as exc:
            return f"could not remove the profile file {self.profile_file}: {exc.strerror or exc}"
        return None


class DirUsed(Exception):
    """--dir names a directory an earlier run wrote, and --append was not given (a usage error: exit 2)."""


def make_log_dir(log_dir: str | os.PathLike | None, append: bool = False) -> Path:
    """A private log directory under the log discipline (logdir): fresh by default; a given one is
    used if fit, or created 0700 (its last component only). A given one that holds an earlier run is
    refused (DirUsed) unless append: a report of it would merge the runs."""
    try:
        d = logdir.fresh("ncclprobe-") if log_dir is None else logdir.check(log_dir)
    except logdir.Unfit as exc:
        raise Unexaminable(str(exc), "bad log directory",
                           {"hint": "give a directory of yours that only you can write (mode 0700), or leave "
                                    "--dir out for a fresh one"}) from None
    if log_dir is not None and not append:
        try:
            used = events.holds_run(d)
        except OSError as exc:
            raise Unexaminable(f"log directory {d}: {exc.strerror or exc}", "bad log directory") from None
        if used is not None:
            raise DirUsed(f"log directory {d} holds an earlier run ({used}): give a new directory, or --append "
                          "to add this run to it (the runs are kept apart by their run id; `ncclprobe report` "
                          "of the directory merges them)")
    return d


def new_run_id() -> str:
    """A run's id: its start (UTC, to the second, so ids sort by time) and 48 random bits."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + os.urandom(6).hex()


def wire(base_env: dict[str, str], log_dir: Path, profile=None, preload: bool = True, plugins: bool = True,
         boot: bool = True, gpu_timing: bool = False) -> Wiring:
    """The environment for the command: base_env plus the probe wiring and the profile's values.
    gpu_timing: the profiler plugin also times each collective on the GPU (NCCLPROBE_GPU_TIMING=1)."""
    env = dict(base_env)
    notes: list[str] = []
    meta: dict[str, Any] = {"preload": False, "plugins": [], "boot": False, "gpu_timing": False}
    env["NCCLPROBE_DIR"] = str(log_dir)
    if preload or plugins:
        from ncclprobe.witnesses import probelib
        check = probelib.self_check()
        if not check.ok:
            raise Unexaminable(f"the probe library failed its self-check: {check.reason}", "probe library",
                               {"hint": "reinstall ncclprobe (pip install --force-reinstall .) so probes/ is rebuilt"})
        lib = str(check.path)
        if preload:
            old = env.get("LD_PRELOAD", "")
            env["LD_PRELOAD"] = lib + (" " + old if old else "")
            meta["preload"] = True
        if plugins:
            for var, role in (("NCCL_PROFILER_PLUGIN", "profiler"), ("NCCL_ENV_PLUGIN", "env")):
                if env.get(var) and env[var] != lib:
                    notes.append(f"{var}={env[var]} was set by you and kept; ncclprobe's {role} plugin is not "
                                 f"loaded, so {'collective algo/proto' if role == 'profiler' else 'NCCL reads'} "
                                 "are not recorded")
                else:
                    env[var] = lib
                    meta["plugins"].append(role)
    if gpu_timing:
        if "profiler" in meta["plugins"]:
            env["NCCLPROBE_GPU_TIMING"] = "1"
            meta["gpu_timing"] = True
            notes.append(GPU_TIMING_NOTE)
        else:
            notes.append("--gpu-timing needs ncclprobe's profiler plugin, which is not loaded: no GPU times")
    profile_file = None
    if boot:  # the profile goes into CMD's environment and is re-applied in every Python interpreter
        from ncclprobe.commands import inject
        try:
            changes = inject.ephemeral_env(env, log_dir, profile)
        except OSError as exc:
            raise Unexaminable(f"cannot write the boot probe into {log_dir}: {exc.strerror or exc}",
                               "bad log directory") from None
        except logdir.Unfit as exc:
            raise Unexaminable(str(exc), "bad log directory") from None
        env.update(changes)
        # ours, not the environment's: a NCCLPROBE_PROFILE of the user's own is never removed
        profile_file = Path(changes["NCCLPROBE_PROFILE"]) if "NCCLPROBE_PROFILE" in changes else None
        meta["boot"] = True
    elif profile is not None:
        env.update(profile.env_changes(env))
        if profile.pins:
            notes.append(f"--pin {' '.join(profile.pins)} needs the boot probe: not enforced with --no-boot")
    return Wiring(env, log_dir, notes, meta, profile_file)


GPU_TIMING_NOTE = ("GPU timing is on (--gpu-timing): NCCL adds a proxy operation to every collective, and a host "
                   "callback to every CUDA graph captured with one, to report its kernels' channels; that costs time "
                   "(benchmarks/probe_profiler_cost.py prices the plugin's part)")


def _watched_job_env(env: dict[str, str]) -> dict[str, str]:
    """The watched part of the environment CMD was given, less ncclprobe's own wiring: what the root of
    CMD's tree should start with (the propagation rules' reference above the root)."""
    from ncclprobe.model import wiring as wiring_mod
    from ncclprobe.model.watched import is_watched
    return wiring_mod.job_env({k: v for k, v in env.items() if is_watched(k)}) or {}


def _write_meta(log_dir: Path, meta: dict[str, Any]) -> None:
    """The run's metadata (run-<host>-<run id>.json: no other run or host writes that name), replaced
    whole in the re-checked log directory (logdir.replace_file)."""
    name = events.run_meta_name(meta["host"], meta["run_id"])
    try:
        logdir.replace_file(log_dir, name, json.dumps(meta, indent=1, default=str).encode())
    except logdir.Unfit as exc:
        raise Unexaminable(f"cannot write {name}: {exc}", "bad log directory") from None
    except OSError as exc:
        raise Unexaminable(f"cannot write {log_dir / name}: {exc.strerror or exc}", "bad log directory") from None


def describe_status(code: int | None) -> tuple[str, int]:
    """Popen returncode (None: it did not end even after SIGKILL) -> (words, shell-style exit code)."""
    if code is None:
        return "still running after SIGKILL", 128 + signal.SIGKILL
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}", 128 - code
    return f"exited with code {code}", code


class LaunchError(Exception):
    """CMD could not be started: the exit code a shell gives (127 not found, 126 found but not
    executable) and a stable snake_case reason."""

    def __init__(self, message: str, reason: str, code: int, log_dir: Path | None):
        super().__init__(message)
        self.reason, self.code, self.log_dir = reason, code, log_dir

    def result(self) -> Result:
        return Result("run", data={"error": {"message": str(self), "reason": self.reason}, "returncode": None,
                                   "exit_status": "not started", "log_dir": str(self.log_dir) if self.log_dir else None},
                      code=self.code)


def launch_error(prog: str, exc: OSError, log_dir: Path | None) -> LaunchError:
    """What execve's error means, in a shell's words and exit codes (bash: 127 when nothing could be
    run, 126 when the file is there but cannot be executed)."""
    shown = printable(redact_text(prog))  # `run -- HF_TOKEN=x cmd` names a program "HF_TOKEN=x"
    if exc.errno == errno.ENOENT:
        interp = _interpreter(prog) if "/" in prog else None
        if interp is not None:  # the file is there; ENOENT is for the #! interpreter (execve(2))
            return LaunchError(f"{shown}: cannot execute: interpreter {interp} not found", "interpreter_not_found",
                               127, log_dir)
        return LaunchError(f"{shown}: command not found", "command_not_found", 127, log_dir)
    if "/" in prog and os.path.isdir(prog):  # execve gives EACCES for a directory
        return LaunchError(f"{shown}: Is a directory", "is_a_directory", 126, log_dir)
    reason = {errno.EACCES: "permission_denied", errno.ENOTDIR: "not_a_directory",
              errno.ENOEXEC: "exec_format_error"}.get(exc.errno, "cannot_execute")
    return LaunchError(f"{shown}: {exc.strerror or exc}", reason, 126, log_dir)


def _interpreter(path: str) -> str | None:
    """The #! interpreter of an existing file, shown with its control characters (a CRLF line end)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].lstrip(b" \t").split(b" ", 1)
    return printable(words[0].decode("utf-8", "backslashreplace"))


def run_command(cmd: list[str], profile=None, log_dir=None, preload: bool = True, plugins: bool = True,
                boot: bool = True, expect: dict[str, str] | None = None,
                stdout_to_stderr: bool = False, given=None, gpu_timing: bool = False,
                live: bool = False, append: bool = False) -> Result:
    """Run cmd under the probes and return the report, with exit code CMD's own when it is not 0
    (Result.code; None lets the findings decide). With stdout_to_stderr (for --json) CMD's output
    goes to stderr so that stdout carries only the JSON document. A fresh log directory is removed
    again when CMD could not be started; a given one keeps the run's metadata with what happened.
    given: the --set/--set-default values (a Profile), put into CMD's environment exactly as
    `env K=V CMD` would; profile: what the boot probe re-applies in every interpreter (--enforce, --pin);
    live: the watch also reads the environment each process of the tree holds (--live); append: a given
    log directory may hold earlier runs (the report at the end is this run's alone)."""
    fresh = log_dir is None
    d = make_log_dir(log_dir, append)
    shown = redact_argv(cmd)  # as the boot probe logs it: stored and printed only so
    started, wiring, removal = False, None, None
    try:
        try:
            base = dict(os.environ)
            set_env = given.env_changes(base) if given is not None else {}
            base.update(set_env)  # `env K=V CMD`
            wiring = wire(base, d, profile, preload, plugins, boot, gpu_timing)
            grace, grace_note = supervise.grace_from_env(os.environ)
            notes = wiring.notes + ([grace_note] if grace_note else [])
            watch_s = proc_watch.interval_from_env(os.environ)[0]  # 0: off (a note says so)
            live_s = proc_watch.live_from_env(os.environ)[0] if live and watch_s else None
            meta = {"run_id": new_run_id(), "command": shown, "host": socket.gethostname(), "started": time.time(),
                    "log_dir": str(d), "notes": notes, "expect": shown_values(expect or {}),
                    "profile": profile.to_json() if profile is not None else None,
                    "run_pid": os.getpid(), "pidns": procs.pidns_of("/proc"), "set": shown_values(set_env),
                    "enforced": shown_values(dict(profile.sets)) if profile is not None else {},
                    "given_env": _watched_job_env(wiring.env), "watch_s": watch_s, "live": bool(live and watch_s),
                    "live_s": live_s,
                    **wiring.meta}
            _write_meta(d, meta)
            # before CMD starts: the kernel's process events are followed from CMD's own fork on
            watch, watch_notes = proc_watch.prepare(d, os.environ, live=live)
            notes += watch_notes
            try:
                group = Group(cmd, wiring.env, stdout=sys.stderr if stdout_to_stderr else None,
                              grace=grace, label="ncclprobe run")
            except OSError as exc:
                if watch is not None:
                    watch.stop()
                err = launch_error(cmd[0], exc, None if fresh else d)
                if not fresh:
                    meta.update(ended=time.time(), returncode=None, status=f"not started: {err}",
                                error={"message": str(err), "reason": err.reason})
                    _write_meta(d, meta)
                raise err from None
            started = True
        finally:
            if fresh and not started:  # nothing ran: leave nothing behind
                shutil.rmtree(d, ignore_errors=True)
        rc, failed = None, True
        try:
            notes += proc_watch.begin(watch, group)
            rc = group.wait()
            failed = False
        finally:
            if failed:  # ncclprobe itself failed while CMD ran: leave nothing of the tree behind
                group.reap_group()
            if watch is not None:  # after the tree is settled: its orphans are reaped, CMD's pid known
                watch.stop(reaped=group.tree.reaped, started=[group.proc.pid], last_reads=group.tree.last_reads)
            words, code = ("unknown: ncclprobe run failed while CMD ran", 1) if failed else describe_status(rc)
            meta.update(ended=time.time(), returncode=rc, status=words, cmd_pid=group.proc.pid,
                        **group.outcome.to_json())
            try:
                _write_meta(d, meta)
            except Unexaminable as exc:  # CMD ran: its code and report still count
                notes = [*notes, f"{exc}; the report is built from the events alone"]
    finally:
        if wiring is not None:  # the profile holds the --set values, secrets too: never left behind
            removal = wiring.remove_profile()
    return _result(shown, d, notes + ([removal] if removal else []), expect, rc, words, code, group.outcome, meta)


def _result(cmd, d: Path, notes, expect, rc, words: str, code: int, outcome: supervise.Outcome,
            meta: dict[str, Any]) -> Result:
    from ncclprobe.commands import report
    from ncclprobe.views import report as view
    header = [Text(f"{view.one_line(' '.join(cmd), 100)}: {words}", "warn" if code else "good"),
              Text(f"log directory: {d}", "dim")]
    header += [Text(n, "note") for n in notes]
    header += _outcome_lines(outcome)
    try:
        result = report.build_report([d], expect=expect, run_id=meta["run_id"])  # not the others of --append
    except Unexaminable as exc:
        result = Result("run", doc=[Text(f"No probe events: {exc}", "warn")])
    except KeyboardInterrupt:  # CMD has ended and its status is in its metadata: print what is known
        result = Result("run", doc=[Text("Report not built: interrupted", "warn")])
    result.command = "run"
    if expect and not any(c.get("env") is not None for c in result.data.get("communicators", [])) and \
            not (result.data.get("verdict") or {}).get("unchecked"):
        given = " ".join(f"{k}={v}" for k, v in shown_values(expect).items())
        header.append(Text(f"No communicator was seen: --expect {given} was checked on each process's own "
                           "environment (the boot probe's and /proc's witnesses), not at communicator creation",
                           "warn"))
    result.doc[:0] = header
    result.data.update(log_dir=str(d), returncode=rc, exit_status=words, injected=view.injected(meta),
                       **outcome.to_json())
    result.code = code or result.code  # CMD's own failure first; else the report's (3: checked nowhere)
    return result


def _outcome_lines(o: supervise.Outcome) -> list[Text]:
    """What happened to CMD's tree, as warnings: what run ended, and what still runs."""
    lines = []
    if o.subreaper:
        lines.append(Text(f"Could not become a child subreaper ({o.subreaper}): a descendant that left CMD's "
                          "tree is found only if a scan saw it first", "warn"))
    if o.stopped:
        by = ", ".join(f"pid {s['pid']} ({s['name']}) by {s['signal']}" for s in o.stopped[:supervise.NAMES_SHOWN])
        more = len(o.stopped) - supervise.NAMES_SHOWN
        lines.append(Text(f"{o.cause}: ncclprobe run ended {len(o.stopped)} process(es) of CMD's tree: {by}"
                          + (f" and {more} more" if more > 0 else ""), "warn"))
    if o.left_running and o.cause is None:
        lines.append(Text(f"{len(o.left_running)} process(es) CMD started are still running; ncclprobe run "
                          f"left them running: {supervise.labels(o.left_running)}", "warn"))
    elif o.left_running:
        lines.append(Text(f"Could not end {len(o.left_running)} process(es), still running: "
                          f"{supervise.labels(o.left_running)}", "bad"))
    return lines
