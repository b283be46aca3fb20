"""`ncclprobe run`: start a command with the probes wired in, forward signals to its whole process
group, and report what its communicators got."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ncclprobe.doc import Result, Text, Unexaminable
from ncclprobe.events import RUN_META

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
GRACE_S = 5.0


@dataclass
class Wiring:
    """What `run` adds to the command's environment, and what it left alone (and why)."""
    env: dict[str, str]
    log_dir: Path
    notes: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


def make_log_dir(log_dir: str | os.PathLike | None) -> Path:
    """A private log directory: fresh (0700) by default; a given one is created 0700 or must be a real
    directory owned by us (never followed through a symlink)."""
    if log_dir is None:
        return Path(tempfile.mkdtemp(prefix="ncclprobe-"))
    d = Path(log_dir)
    try:
        d.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        st = os.lstat(d)
        import stat as stat_mod
        if stat_mod.S_ISLNK(st.st_mode) or not stat_mod.S_ISDIR(st.st_mode):
            raise Unexaminable(f"log directory {d} is a symlink or not a directory", "bad log directory") from None
        if st.st_uid != os.getuid():
            raise Unexaminable(f"log directory {d} belongs to another user", "bad log directory") from None
        if not os.access(d, os.W_OK | os.X_OK):
            raise Unexaminable(f"log directory {d} is not writable", "bad log directory",
                               {"hint": "give a directory you can write, or leave --dir out for a fresh one"}) from None
    except OSError as exc:
        raise Unexaminable(f"cannot create log directory {d}: {exc.strerror}", "bad log directory") from None
    return d


def wire(base_env: dict[str, str], log_dir: Path, profile=None, preload: bool = True, plugins: bool = True,
         boot: bool = True) -> Wiring:
    """The environment for the command: base_env plus the probe wiring and the profile's values."""
    env = dict(base_env)
    notes: list[str] = []
    meta: dict[str, Any] = {"preload": False, "plugins": [], "boot": False}
    env["NCCLPROBE_DIR"] = str(log_dir)
    if preload or plugins:
        from ncclprobe import probelib
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
    if boot:  # the profile goes into CMD's environment and is re-applied in every Python interpreter
        from ncclprobe import inject
        try:
            env.update(inject.ephemeral_env(env, log_dir, profile))
        except OSError as exc:
            raise Unexaminable(f"cannot write the boot probe into {log_dir}: {exc.strerror or exc}",
                               "bad log directory") from None
        meta["boot"] = True
    elif profile is not None:
        env.update(profile.env_changes(env))
        if profile.pins:
            notes.append(f"--pin {' '.join(profile.pins)} needs the boot probe: not enforced with --no-boot")
    return Wiring(env, log_dir, notes, meta)


def _write_meta(log_dir: Path, meta: dict[str, Any]) -> None:
    path = log_dir / RUN_META
    tmp = log_dir / f".{RUN_META}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(meta, fh, indent=1, default=str)
    os.replace(tmp, path)


class Group:
    """The command in its own process group, with signals forwarded to the whole group."""

    def __init__(self, cmd: list[str], env: dict[str, str], stdout=None, cwd=None):
        self.proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=stdout, cwd=cwd)
        self.pgid = self.proc.pid
        self._old = {}
        for sig in FORWARDED:
            try:
                self._old[sig] = signal.signal(sig, self._forward)
            except (ValueError, OSError):  # not the main thread
                pass

    def _forward(self, signum, frame):
        self.signal(signum)

    def signal(self, signum: int) -> None:
        try:
            os.killpg(self.pgid, signum)
        except ProcessLookupError:
            pass

    def wait(self) -> int:
        try:
            while True:
                try:
                    return self.proc.wait()
                except KeyboardInterrupt:  # SIGINT arrived while the handler was not yet set
                    self.signal(signal.SIGINT)
        finally:
            for sig, old in self._old.items():
                signal.signal(sig, old)

    def reap_group(self, grace: float = GRACE_S) -> None:
        """After an interrupted run: TERM, then KILL whatever is left of the group."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _group_alive(self.pgid):
            time.sleep(0.05)
        if _group_alive(self.pgid):
            self.signal(signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def describe_status(code: int) -> tuple[str, int]:
    """Popen returncode -> (words, shell-style exit code)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}", 128 - code
    return f"exited with code {code}", code


def run_command(cmd: list[str], profile=None, log_dir=None, preload: bool = True, plugins: bool = True,
                boot: bool = True, expect: dict[str, str] | None = None,
                stdout_to_stderr: bool = False) -> tuple[Result, int]:
    """Run cmd under the probes; with stdout_to_stderr (for --json) CMD's output goes to stderr so that
    stdout carries only the JSON document."""
    d = make_log_dir(log_dir)
    wiring = wire(dict(os.environ), d, profile, preload, plugins, boot)
    meta = {"command": cmd, "host": socket.gethostname(), "started": time.time(), "log_dir": str(d),
            "notes": wiring.notes, "expect": expect or {},
            "profile": profile.to_json() if profile is not None else None, **wiring.meta}
    _write_meta(d, meta)
    try:
        group = Group(cmd, wiring.env, stdout=sys.stderr if stdout_to_stderr else None)
    except FileNotFoundError:
        return _launch_failed(cmd, d, f"command not found: {cmd[0]}", "command_not_found", 127)
    except PermissionError:
        return _launch_failed(cmd, d, f"permission denied: {cmd[0]}", "permission_denied", 126)
    rc = None
    try:
        rc = group.wait()
    finally:
        if rc is None or rc < 0:  # interrupted, or killed: leave nothing of the group behind
            group.reap_group()
    words, code = describe_status(rc)
    meta.update(ended=time.time(), returncode=rc, status=words)
    _write_meta(d, meta)
    from ncclprobe import report
    header = [Text(f"{report.one_line(' '.join(cmd), 100)}: {words}", "warn" if code else "good"),
              Text(f"log directory: {d}", "dim")]
    header += [Text(n, "note") for n in wiring.notes]
    try:
        result = report.build_report([d], expect=expect)
    except Unexaminable as exc:
        result = Result("run", doc=[Text(f"No probe events: {exc}", "warn")])
    result.command = "run"
    result.doc[:0] = header
    result.data.update(log_dir=str(d), returncode=rc, exit_status=words)
    result.code = code
    return result, code


def _launch_failed(cmd, d, message, reason, code) -> tuple[Result, int]:
    print(f"ncclprobe run: {message}", file=sys.stderr)
    res = Result("run", doc=[Text(message, "bad")], data={"log_dir": str(d), "returncode": code,
                                                           "error": {"message": message, "reason": reason}},
                 code=code)
    return res, code
