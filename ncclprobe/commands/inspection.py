"""`ncclprobe inspect`: the exec-time view of a process tree — environment, NCCL libraries, GPUs,
nccl.conf files — diffed against parents and expectations, with the places that view is blind."""
from __future__ import annotations

import errno
import os
import re
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path

from ncclprobe.witnesses import conffiles, elf, events, procaccess, procs, procsnap, shells

from ncclprobe import diagnose, model as model_mod
from ncclprobe.commands import verdictview
from ncclprobe._lib import ncclprobe_boot as _boot  # the probes' log-directory rules (DESIGN §4)
from ncclprobe.diagnose import verdict

from ncclprobe.model import wiring
from ncclprobe.diagnose.visibility import PTRACE_HINT
from ncclprobe.doc import FindingsHere, Result, Text, Title, Tree, Unexaminable
from ncclprobe.diagnose.findings import EXIT_UNEXAMINABLE
from ncclprobe.model.watched import (ASSIGN_WORD as _ASSIGN_WORD, REDACTED, is_watched, looks_secret, one_line,
                                     redact_argv, redact_text, select, shown_values)

_MAX_SCRIPT = 1 << 20
_FD_PATH = re.compile(r"^/(?:dev|proc/self)/fd/(\d+)$")


class UsageError(ValueError):
    """A malformed argument (the CLI turns it into a usage error, exit 2)."""


def _read_regular(path: Path) -> str:
    """A regular file's text; a pipe, socket or device is refused (opening a FIFO would block)."""
    with open(path, "rb", opener=lambda f, fl: os.open(f, fl | os.O_NONBLOCK)) as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return fh.read(_MAX_SCRIPT).decode("utf-8", errors="backslashreplace")


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
                      live_reader=None) -> Result:
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
    ctx = _Context(fs, tree, all_vars, redact, expect, gpu_map, gpu_reason)
    recs = [ctx.record(p) for p in tree.procs.values()]
    by_pid = {r["pid"]: r for r in recs}
    notes = _scope(recs, scope) + _exited(recs)
    for r in recs:
        parent = by_pid.get(r["ppid"])
        r["stale"] = procsnap.stale_kind(r, parent)
        r["env_diff"] = ctx.diff(r, parent) if parent else None
        if r["in_scope"] or scope == "all":
            r["conf_files"] = ctx.conf(tree.procs[r["pid"]], r)
    _refuse_if_blind(recs, roots)
    live_summary = _live(ctx, recs, tree, proc_root, live_reader) if live else None
    host = socket.gethostname()
    skipped_dirs: list[dict] = []
    dirs = list(log_dirs or [])
    if not dirs and merge_probe_dirs:
        dirs, skipped_dirs = _probe_dirs(fs, tree)
        notes += [f"NCCLPROBE_DIR {one_line(s['dir'])} (in the environment of pid "
                  f"{', '.join(map(str, s['pids']))}) not read: {s['reason']}" for s in skipped_dirs]
    m, in_process_error = model_mod.Model(), None
    if dirs or nccl_logs:  # the probes' witnesses of the same processes: one model with /proc's
        from ncclprobe.commands.report import load  # the event reader costs ~27 ms: only when merging
        try:
            m = load(dirs, list(nccl_logs or []))
        except Unexaminable as exc:
            in_process_error = exc
    model_mod.add_records(m, recs, host)
    m.shell_pitfalls = ctx.shell_pitfalls() + shells.model_pitfalls(m, shells=False)  # + exec'd wrapper scripts
    findings = diagnose.rules(m, expect)
    # a PID named on the command line that is not there (or went during the walk) fails the command
    missing = sorted({s["pid"] for s in not_found} | {s["pid"] for s in tree.skipped if s["pid"] in pids})
    data = {"roots": tree.roots, "expect": shown_values(expect), "scope": scope,
            "processes": _public(recs),
            "skipped": not_found + tree.skipped, "missing_pids": missing, "excluded": tree.excluded,
            "gpu_source": "nvml" if not gpu_reason else "fds", "gpu_reason": gpu_reason or None}
    if live_summary is not None:
        data["live"] = live_summary
    result = _InspectResult("inspect", findings, data, expect,
                            lambda: _document(recs, tree, notes, gpu_reason, not_found, show_wiring, live_summary))
    result.model = m
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


def _probe_dirs(fs: procs.ProcFS, tree: procs.ProcTree) -> tuple[list[str], list[dict]]:
    """The NCCLPROBE_DIRs the inspected processes' environments name that are read as evidence, and
    the others ({"dir", "pids", "reason"}): any user in the tree chooses its own NCCLPROBE_DIR, so one
    is read only if this user (euid) or a process that names it owns it, and it passes the log
    discipline of DESIGN §4; a path the process resolves in another root or mount namespace is not ours."""
    named: dict[str, list[procs.Proc]] = {}
    for p in tree.procs.values():
        d = p.env.env.get("NCCLPROBE_DIR") if p.env and p.env.env else None
        if d:
            named.setdefault(d, []).append(p)
    read, skipped = [], []
    for d, ps in sorted(named.items()):
        here = [p for p in ps if _our_root(fs, p)]
        why = (_unfit_evidence(d, {os.geteuid(), *(p.uid for p in here if p.uid is not None)}) if here else
               "a path in the process's own root or mount namespace")
        if why is None:
            read.append(d)
        else:
            skipped.append({"dir": d, "pids": sorted(p.pid for p in ps), "reason": why})
    return read, skipped


def _our_root(fs: procs.ProcFS, p: procs.Proc) -> bool:
    fs.resolve_root(p)
    return p.same_mnt_ns and p.root == "/"


def _unfit_evidence(d: str, owners: set[int]) -> str | None:
    """Why the directory d is not read as evidence, or None: it must be a real directory (O_NOFOLLOW:
    its last component no symlink) of one of the owners that group and others cannot write to and, if
    root's, no system directory (the probes' own rules: ncclprobe_boot._system_dir)."""
    if not d.startswith("/"):
        return "not an absolute path (the process resolves it in its own working directory)"
    try:
        fd = os.open(d, _boot._DIR_FLAGS)
    except OSError as exc:
        return _open_refusal(exc, d)
    try:
        st = os.fstat(fd)
        if st.st_uid not in owners:
            return f"it belongs to uid {st.st_uid}, neither this user nor the process's"
        if st.st_mode & 0o022:
            return "group or others can write to it"
        if st.st_uid == 0 and _boot._system_dir(fd, d):
            return "it is a system directory"
        return None
    finally:
        os.close(fd)


def _open_refusal(exc: OSError, d: str) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such directory"
    if isinstance(exc, NotADirectoryError):  # O_NOFOLLOW|O_DIRECTORY gives ENOTDIR on a symlink too
        try:
            return "it is a symlink" if stat.S_ISLNK(os.lstat(d).st_mode) else "not a directory"
        except OSError:
            return "not a directory"
    return exc.strerror or str(exc)


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


def _live(ctx: _Context, recs: list[dict], tree: procs.ProcTree, proc_root: Path, reader=None) -> dict:
    """--live: each process's environment as it holds it now, read from its memory (witnesses.livemem),
    shown as its exec-time one is (watched variables, or --all-vars with secrets redacted: a redacted
    value is never decoded), with the difference from the exec-time block. The summary for the JSON."""
    from ncclprobe.model import LIVE_DIFFERS
    from ncclprobe.witnesses import livemem
    if not ctx.all_vars:
        watched, present = is_watched, None
    elif ctx.redact:  # every name; a secret-looking one's value stays in the target (its presence is shown)
        watched = lambda name: livemem.watched_name(name) or not looks_secret(os.fsdecode(name))  # noqa: E731
        present = lambda name: True  # noqa: E731
    else:
        watched, present = (lambda name: True), None
    reading = livemem.Reading(watched, ctx.expect, proc_root, reader=reader, present=present)
    read = retries = size = 0
    todo = [r for r in recs if r["env_reason"] not in ("kernel thread", "zombie")]
    results = dict(zip((r["pid"] for r in todo), reading.read_many([r["pid"] for r in todo],
                                                                   [tree.procs[r["pid"]].exe for r in todo])))
    # every value was there when the last read ended: one time for all (writes dated no earlier than
    # their read), and processes holding the same environment share its dicts (never modified)
    when = time.time()
    alike: dict[tuple, tuple] = {}
    for r in recs:
        got = results.get(r["pid"]) or livemem.LiveEnv(None, None, r["env_reason"])
        read += got.env is not None
        retries, size = retries + got.retries, size + got.bytes_read
        r["live_reason"], r["live_t"] = got.reason, when if got.env is not None else None
        if got.env is None:
            r["live_env"] = r["live_diff"] = r["_live_watched"] = r["_live_exp"] = None
            continue
        exec_env = r["env"] if r["env_source"] == "exec" and r["stale"] != "clobbered" else None
        key = (tuple(got.env.items()), tuple(got.expected.items()), id(exec_env), id(r["conf_files"]))
        hit = alike.get(key)
        if hit is None:
            env = got.env
            shown = env if not ctx.all_vars else select(env, True, ctx.redact)
            hit = alike[key] = (exec_env, r["conf_files"], shown, _live_diff(exec_env, shown, r["conf_files"]),
                                {k: v for k, v in env.items() if is_watched(k)},
                                {k: ctx.expect[k] if same else LIVE_DIFFERS for k, same in got.expected.items()
                                 if not is_watched(k)})
        r["live_env"], r["live_diff"], r["_live_watched"], r["_live_exp"] = hit[2:]
    scope = livemem.yama_scope(proc_root)
    return {"read": read, "unread": len(recs) - read, "retries": retries, "bytes_read": size,
            "ptrace_scope": scope}


def _live_diff(exec_env: dict | None, live: dict, conf_files: list | None) -> dict | None:
    """What the process changed in its own environment since exec: set, changed, unset in-process; a value
    set in-process that an nccl.conf file gives NCCL is named with that file (NCCL sets it on init)."""
    if exec_env is None:
        return None
    conf = {e["var"]: (e["value"], f"{c['path']}:{e['line']}") for c in conf_files or []
            for e in c.get("entries") or [] if e.get("effect") == "applies"}
    added = {k: v for k, v in sorted(live.items()) if k not in exec_env}
    return {"set": added,
            "changed": {k: {"exec": exec_env[k], "live": v} for k, v in sorted(live.items())
                        if k in exec_env and exec_env[k] != v},
            "unset": sorted(k for k in exec_env if k not in live),
            "conf": {k: conf[k][1] for k, v in added.items() if k in conf and conf[k][0] == v}}


def _public(recs: list[dict]) -> list[dict]:
    """The records, their private `_` keys removed in place once the rules have read them (the
    document drawn later reads only public keys); every record has the same keys (_Context.record)."""
    drop = [k for k in recs[0] if k.startswith("_")] if recs else []
    for r in recs:
        try:
            for k in drop:
                del r[k]
        except KeyError:  # not built by _Context.record: whatever private keys it has
            for k in [k for k in r if k.startswith("_")]:
                del r[k]
    return list(recs)


def _exited(recs: list[dict]) -> list[str]:
    """Processes that exited between their stat and their environ: a note, not a finding."""
    gone = [r["pid"] for r in recs if r["env_source"] == "unreadable" and r["env_reason"] == "vanished"]
    return [f"Exited during the scan (environment not read): pid {', '.join(map(str, gone))}."] if gone else []


def _refuse_if_blind(recs: list[dict], roots: list[int]) -> None:
    """A root whose whole tree is unreadable cannot be examined at all (exit 3)."""
    if recs and all(r["env_source"] == "unreadable" and r["env_reason"] in ("permission", "hidepid") for r in recs):
        raise Unexaminable(f"cannot read the environment of process {roots[0]} or any process under it "
                           f"({recs[0]['env_reason']})", recs[0]["env_reason"], {"hint": PTRACE_HINT})


def _scope(recs: list[dict], scope: str) -> list[str]:
    nccl = [r for r in recs if r["nccl_libs"] or r["gpus"]]
    for r in recs:
        r["in_scope"] = scope == "all" or bool(r["nccl_libs"] or r["gpus"])
    if scope == "nccl" and not nccl:
        for r in recs:
            r["in_scope"] = True
        return ["No process maps libnccl or uses a GPU (yet): every process was checked (as with --scope all)."]
    return []


def _diff(rec: dict, parent: dict) -> dict | None:
    if rec["env"] is None or parent["env"] is None:
        return None
    mine, theirs = rec["env"], parent["env"]
    return {"parent": parent["pid"],
            "inherited": sorted(k for k in mine if k in theirs and theirs[k] == mine[k]),
            "added": {k: v for k, v in sorted(mine.items()) if k not in theirs},
            "removed": sorted(k for k in theirs if k not in mine),
            "changed": {k: {"parent": theirs[k], "value": mine[k]} for k in sorted(mine)
                        if k in theirs and theirs[k] != mine[k]}}


class _Context:
    def __init__(self, fs, tree, all_vars, redact, expect, gpu_map, gpu_reason):
        self.fs, self.tree = fs, tree
        self.all_vars, self.redact, self.expect = all_vars, redact, expect
        self.gpu_map, self.gpu_reason = gpu_map, gpu_reason
        self._elf: dict[tuple, elf.ElfInfo] = {}
        self._text: dict[tuple, str | OSError] = {}
        self._users: dict[int, str] = {}
        self._viewer: procaccess.Viewer | None = None
        self._argv: dict[int, tuple[list[str], list[str], str]] = {}
        self._alike: dict[tuple, tuple] = {}
        # Per-tree memos keyed by the identity of what procs.ProcFS shares between processes (the
        # parsed environ block, the parsed maps); each entry keeps its key object alive. The values
        # are shared by the records of those processes, which nothing modifies after they are built.
        self._selected: dict[tuple[int, bool], tuple[dict, dict]] = {}
        self._libs: dict[int | tuple, tuple[list, tuple]] = {}
        self._conf: dict[tuple, tuple[object, list[dict]]] = {}
        self._times: dict[int, str] = {}
        self._diffs: dict[tuple[int, int], tuple[dict | None, dict | None, dict | None]] = {}

    def diff(self, rec: dict, parent: dict) -> dict | None:
        """_diff, once per pair of shown environments (siblings share theirs, see select)."""
        key = (id(rec["env"]), id(parent["env"]))
        hit = self._diffs.get(key)
        if hit is None:
            hit = self._diffs[key] = (rec["env"], parent["env"], _diff(rec, parent))
        return hit[2]

    def select(self, env: dict[str, str], all_vars: bool) -> dict[str, str]:
        key = (id(env), all_vars)
        hit = self._selected.get(key)
        if hit is None:
            hit = self._selected[key] = (env, select(env, all_vars, self.redact))
        return hit[1]

    def start_time(self, start: float | None) -> str | None:
        """The start as shown, to the second: once per second (localtime floors, as int() does here)."""
        if not start:
            return None
        second = int(start)
        text = self._times.get(second)
        if text is None:
            text = self._times[second] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        return text

    # -- per process --------------------------------------------------------------------------
    def record(self, p: procs.Proc) -> dict:
        """The record of p; processes started alike (the same command line, block and mappings, as
        procs.ProcFS shares them, the same user, name, executable, state and root) differ only in the
        fields set here, so the rest is copied from the first one's record as it was built; its
        `_alike` names that kind of process (conf does each kind once)."""
        key = (id(p.cmdline), id(p.env), id(p.maps), p.maps_reason, p.uid, p.name, p.exe, p.state, p.root,
               p.root_reason, p.same_mnt_ns)
        hit = self._alike.get(key)
        if hit is None:
            rec = self._record(p)
            rec["_alike"] = key
            # the objects whose ids are in the key stay alive with the entry
            self._alike[key] = (p.cmdline, p.env, p.maps, dict(rec), rec["gpus_source"] == "maps")
            return rec
        start = self.tree.start_time(p)
        rec = hit[3].copy()  # cheaper than building a dict: it has every key
        rec["pid"] = p.pid
        rec["ppid"] = p.ppid
        rec["start_time"] = self.start_time(start)
        rec["root"] = p.root
        rec["notes"] = list(p.notes)
        rec["_span"] = p.env_span
        rec["_start"] = start
        if hit[4]:  # found in the mappings, which p shares
            rec["gpus"] = list(rec["gpus"])
        else:
            rec["gpus"], rec["gpus_source"], rec["gpus_reason"] = self.gpus(p)
        if p.cmdline_reason:
            rec["notes"].append(f"cmdline: {p.cmdline_reason}")
        return rec

    def _record(self, p: procs.Proc) -> dict:
        block = p.env
        env = block.env if block else None
        watched = self.select(env, False) if env is not None else {}
        start = self.tree.start_time(p)
        libs, callers, maps_reason = self.libraries(p)
        gpus, gpus_source, gpus_reason = self.gpus(p)
        argv, command = self.argv(p)
        rec = {
            "pid": p.pid, "ppid": p.ppid, "user": self.user(p.uid), "uid": p.uid, "name": p.name,
            "cmdline": argv, "command": command,
            "exe": p.exe, "state": p.state,
            "start_time": self.start_time(start),
            "env_source": block.source if block else "unreadable",
            "env_reason": block.reason if block else "not read",
            "env": (watched if not self.all_vars else self.select(env, True))
                   if block and block.source != "unreadable" else None,
            "env_size": block.size if block else 0,
            "env_denied_by": self.denied_by(p) if block and block.reason == "permission" else None,
            "cuda_visible_devices": (env or {}).get("CUDA_VISIBLE_DEVICES"),
            "nccl_libs": libs, "nccl_callers": callers, "maps_reason": maps_reason,
            "gpus": gpus, "gpus_source": gpus_source, "gpus_reason": gpus_reason,
            "conf_files": None, "root": p.root, "notes": list(p.notes),
            "in_scope": None, "stale": None, "env_diff": None,  # set by inspect_processes
            "_watched": watched,
            "_exp": {k: env[k] for k in self.expect if env and k in env},
            "_hash": block.raw_hash if block else None, "_span": p.env_span, "_start": start, "_alike": None,
        }
        if p.cmdline_reason:
            rec["notes"].append(f"cmdline: {p.cmdline_reason}")
        return rec

    def denied_by(self, p: procs.Proc) -> str:
        """Which condition of ptrace access refused p's environ (procaccess), for refused processes only."""
        if self._viewer is None:
            self._viewer = procaccess.viewer()
        return procaccess.denied_by(self.fs, p.pid, p.uid, self._viewer)

    def user(self, uid: int | None) -> str | None:
        if uid is None:
            return None
        if uid not in self._users:
            try:
                import pwd
                self._users[uid] = pwd.getpwuid(uid).pw_name
            except (KeyError, ImportError):
                self._users[uid] = str(uid)
        return self._users[uid]

    def cmdline(self, argv: list[str]) -> list[str]:
        """argv as the boot probe logs it (redact_argv: `--api-key X`, `HF_TOKEN=X`, URL passwords)."""
        return redact_argv(argv) if self.redact else argv

    def argv(self, p: procs.Proc) -> tuple[list[str], str]:
        """cmdline and short, once per command line (procs.ProcFS shares the lists of processes
        started with the same one; a record's list is never modified)."""
        if not p.cmdline:  # shown by name: kernel threads, zombies
            return self.cmdline(p.cmdline), self.short(p)
        hit = self._argv.get(id(p.cmdline))
        if hit is None:
            hit = self._argv[id(p.cmdline)] = (p.cmdline, self.cmdline(p.cmdline), self.short(p))
        return hit[1], hit[2]

    def short(self, p: procs.Proc, limit: int = 100) -> str:
        text = one_line(" ".join(self.cmdline(p.cmdline))) or f"[{p.name}]"
        return text if len(text) <= limit else text[: limit - 1] + "…"

    def shell_command(self, shell: procs.Proc, limit: int = 200) -> str:
        """A shell's command line for a finding's evidence: its script is shell code, so every NAME=VALUE
        word there is an assignment, shown only as shown_value allows."""
        def sub(m):
            value = self.shown_value(m.group(1), m.group(2))
            return m.group(0) if value is not None else f"{m.group(1)}={REDACTED}"
        argv = self.cmdline(shell.cmdline)
        text = one_line(" ".join(_ASSIGN_WORD.sub(sub, a) if "=" in a else a for a in argv))
        return text if len(text) <= limit else text[: limit - 1] + "…"

    def command_text(self, text: str) -> str:
        """Shell code of a finding's evidence (a pitfall's commands) under cmdline's rule."""
        return redact_text(text) if self.redact else text

    def shown_value(self, name: str, value: str) -> str | None:
        """How an assignment word's value may appear in evidence: watched ones as they are, others
        only with --all-vars (secret-looking ones then redacted unless --no-redact); None: redacted."""
        if is_watched(name) or (self.all_vars and not (self.redact and looks_secret(name))):
            return value
        return None

    def _root_key(self, p: procs.Proc):
        self.fs.resolve_root(p)
        return "/" if p.same_mnt_ns and p.root == "/" else p.pid

    def libraries(self, p: procs.Proc) -> tuple[list[dict], list[dict], str | None]:
        if p.maps is None:
            return [], [], p.maps_reason
        hit = self._libs.get(id(p.maps))
        if hit is None:
            # the ELF scans below resolve p's root on a miss only, as they would for each process
            hit = self._libs[id(p.maps)] = (p.maps, self._libraries(p))
        return hit[1]

    def _libraries(self, p: procs.Proc) -> tuple[list[dict], list[dict], None]:
        libs, callers = [], []
        for m in p.maps:
            if not m.executable:
                continue
            key = (m.dev, m.inode, m.path)  # device and inode name one file in any namespace
            info = self._elf.get(key)
            if info is None:
                info = self._elf[key] = elf.scan(self.fs.in_root(p, m.path), display=m.path)
            shared = elf.is_libnccl(m.path)
            if shared or info.contains_nccl:
                libs.append({"path": m.path, "inode": m.inode, "version": info.version,
                             "version_source": info.version_source, "simulated": info.simulated,
                             "kind": "shared" if shared else "static",
                             "defines": list(info.nccl_defines), "deleted": m.deleted, "reason": info.reason})
            elif info.interposes_nccl:
                callers.append({"path": m.path, "interposes": list(info.nccl_defines)[:8], "hookable": True})
            elif info.nccl_imports:
                callers.append({"path": m.path, "imports": list(info.nccl_imports)[:8],
                                "hookable": True})
        for lib in libs:
            if lib["kind"] == "shared":
                # §5.4: NEEDED/undefined-symbol callers are interposable; ctypes/dlopen(dlsym) ones are not
                users = [c for c in callers if "imports" in c]
                lib["reached_by"] = "dynamic symbols (hookable)" if users else "dlopen/ctypes only (not hookable)"
            else:
                lib["reached_by"] = "linked in (not hookable)"
        return libs, callers, None

    def gpus(self, p: procs.Proc) -> tuple[list[int], str | None, str | None]:
        if not self.gpu_reason:
            return list(self.gpu_map.get(p.pid, [])), "nvml", None
        if p.maps is not None:
            # CUDA maps /dev/nvidiactl and /dev/nvidia<N>: maps (already read) usually says it all
            gpus, any_nv = self._mapped_gpus(p.maps)
            if gpus or not any_nv:
                return list(gpus), "maps", None
        try:
            return self.fs.nvidia_fds(p.pid), "fds", None
        except OSError as exc:
            return [], None, procs.reason_of(exc)

    def _mapped_gpus(self, maps: list[procs.Mapping]) -> tuple[list[int], bool]:
        key = ("gpus", id(maps))
        hit = self._libs.get(key)
        if hit is None:
            nv = [m.path for m in maps if m.path.startswith("/dev/nvidia")]
            hit = self._libs[key] = (maps, (sorted({int(path[11:]) for path in nv if path[11:].isdigit()}), bool(nv)))
        return hit[1]

    def read_text(self, p: procs.Proc, path: str) -> str:
        fd_path = self._fd_path(p, path)
        key = (p.pid, path) if fd_path is not None else (self._root_key(p), path)  # a descriptor is its own
        hit = self._text.get(key)
        if hit is None:
            if fd_path is None and p.root is None:  # /proc/<pid>/root refused or gone: so is every path in it
                raise conffiles.NotVisible(f"pid {p.pid}'s root (/proc/{p.pid}/root) cannot be entered "
                                           f"({p.root_reason})")
            try:
                hit = _read_regular(fd_path or self.fs.in_root(p, path))
            except OSError as exc:
                hit = exc
            self._text[key] = hit
        if isinstance(hit, OSError):
            raise hit
        return hit

    def _fd_path(self, p: procs.Proc, path: str) -> Path | None:
        """/dev/fd/N and /proc/self/fd/N name the process's own descriptors, not ours."""
        m = _FD_PATH.match(path)
        return self.fs.path(p.pid, "fd", m.group(1)) if m else None

    def conf(self, p: procs.Proc, rec: dict) -> list[dict]:
        """The nccl.conf files that apply to p, once per kind of process (record's _alike)."""
        hit = self._conf.get(rec["_alike"])
        if hit is not None:
            return hit[1]
        env = p.env.env if p.env and p.env.source == "exec" else None
        libs = rec["nccl_libs"]
        version = next((lib["version"] for lib in libs if lib["version"]), None) if libs else None
        named = (env or {}).get("NCCL_CONF_FILE", "")
        # the same files in the same root for the same block, uid and version: the same answer, unless
        # the named file is relative to the cwd or one of the process's own descriptors
        key = None
        if not named or (named.startswith("/") and not _FD_PATH.match(named)):
            key = (self._root_key(p), id(env), p.uid, version)
            hit = self._conf.get(key)
            if hit is not None:
                self._conf[rec["_alike"]] = hit
                return hit[1]
        cwd = self.fs.cwd_of(p) if named and not named.startswith("/") else None  # only a relative name needs it
        files = conffiles.applicable(env, p.uid, version, lambda path: self.read_text(p, path), cwd)
        out = [f.to_json() for f in files if f.exists or f.reason]
        if key is not None:
            self._conf[key] = self._conf[rec["_alike"]] = (env, out)
        return out

    # -- shells -------------------------------------------------------------------------------
    def shell_pitfalls(self) -> list[dict]:
        everyone = {**self.tree.ancestors, **self.tree.procs}
        kids: dict[int, list[procs.Proc]] = {}
        for q in everyone.values():
            kids.setdefault(q.ppid, []).append(q)
        out = []
        scripts: dict[int, tuple[list[str], str | None, str | None]] = {}  # by command line (shared lists)
        for shell in everyone.values():
            hit = scripts.get(id(shell.cmdline))
            if hit is None:
                script = shells.shell_script(shell.cmdline)
                hit = scripts[id(shell.cmdline)] = (shell.cmdline, script,
                                                    shells.script_file(shell.cmdline) if script is None else None)
            script = hit[1]
            if script is None:
                path = hit[2]
                if path is None:
                    continue
                script = self._script_on_fd(shell, path)
                if script is None:
                    cwd = self.fs.cwd_of(shell) if not path.startswith("/") else None
                    if cwd:
                        path = f"{cwd.rstrip('/')}/{path}"
                    try:
                        script = self.read_text(shell, path)
                    except OSError:
                        continue
            shell_env = self._env_of(shell)
            for child in kids.get(shell.pid, []):
                if child.cmdline == shell.cmdline:
                    continue  # a forked subshell: which list element it runs is unknown
                affected = self._subtree(child.pid)
                if not affected:
                    continue
                for pf in shells.pitfalls(script, child.cmdline, is_watched, shell_env, self.shown_value):
                    out.append({"shell": shell.pid, "shell_command": self.shell_command(shell), "pids": affected,
                                "var": pf.var, "value": one_line(pf.value),
                                "command": one_line(self.command_text(pf.command)),
                                "led_to_target": one_line(self.command_text(pf.led_to_target)), "kind": pf.kind})
        return out

    def _script_on_fd(self, shell: procs.Proc, path: str) -> str | None:
        """The script a shell is reading, from the descriptor it reads it on: bash keeps it open on fd
        255 (shell.c, default_buffered_input), which still names it after the script changed directory
        (`cd /tmp && bash ./run.sh` where run.sh does `cd elsewhere`: ./run.sh no longer resolves
        against its cwd). Used only where the descriptor names a file of the script's name, read as a
        regular file, bounded (read_text); None otherwise, and the argv path is resolved instead."""
        link = self._fd_path(shell, "/proc/self/fd/255")
        try:
            target = self.fs.reader.readlink(link)
        except (OSError, TypeError):
            return None
        if not target.startswith("/") or os.path.basename(target) != os.path.basename(path.rstrip("/")):
            return None  # not the script argv names (a symlinked script, or fd 255 put to another use)
        try:
            return self.read_text(shell, "/proc/self/fd/255")
        except OSError:
            return None

    def _env_of(self, p: procs.Proc):
        block = p.env if p.env is not None else self.fs.environ(p.pid, p.state, p.kernel_thread, p.env_span)
        return block.env if block.source == "exec" else None

    def _subtree(self, pid: int) -> list[int]:
        """The inspected processes at or under pid (pid may be an ancestor of the roots)."""
        if pid in self.tree.procs:
            out, stack = [], [pid]
            while stack:
                q = stack.pop()
                out.append(q)
                stack.extend(self.tree.children(q))
            return sorted(out)
        # an ancestor: everything inspected that descends from it
        chain_hits = []
        for r in self.tree.roots:
            q = self.tree.procs[r].ppid
            while q in self.tree.ancestors:
                if q == pid:
                    chain_hits.append(r)
                    break
                q = self.tree.ancestors[q].ppid
        return sorted(x for r in chain_hits for x in self._subtree(r))


# -- document ----------------------------------------------------------------------------------
def lib_label(lib: dict) -> str:
    """`libnccl 2.28.9 (simulated NCCL) PATH`: a simulated copy is named so wherever it is shown."""
    return (f"libnccl {lib['version'] or '?'}" + (" (simulated NCCL)" if lib.get("simulated") else "")
            + f" {lib['path']}")


def _document(recs: list[dict], tree: procs.ProcTree, notes: list[str], gpu_reason: str,
              not_found: list[dict] = (), show_wiring: bool = False, live: dict | None = None) -> list:
    by_pid = {r["pid"]: r for r in recs}
    kids: dict[int, list[int]] = {}
    for r in recs:
        kids.setdefault(r["ppid"], []).append(r["pid"])
    doc: list = [Title(f"Process tree under {', '.join(str(r) for r in tree.roots)} "
                       f"({len(recs)} process{'es' if len(recs) != 1 else ''}, exec-time view from /proc"
                       + (", live environment from memory" if live is not None else "") + ")")]
    drawn: set[int] = set()

    def node(pid: int) -> Tree:
        drawn.add(pid)
        r = by_pid[pid]
        label = f"{pid} {r['command']}  [{r['user'] or '?'}, {r['state']}, started {r['start_time'] or '?'}]"
        t = Tree(label, style="" if r["in_scope"] else "dim")
        t.children.append(_env_node(r, by_pid.get(r["ppid"]), show_wiring))
        if live is not None:
            t.children.append(_live_node(r, show_wiring))
        for lib in r["nccl_libs"]:
            t.children.append(Tree(f"{lib_label(lib)} — {lib['reached_by']}",
                                   style="warn" if lib["kind"] == "static" else ""))
        if r["gpus"] or r["cuda_visible_devices"] is not None:
            g = ",".join(map(str, r["gpus"])) or "none"
            cvd = r["cuda_visible_devices"]
            t.children.append(Tree(f"GPUs: {g} ({r['gpus_source'] or r['gpus_reason']})"
                                   + (f"  CUDA_VISIBLE_DEVICES={cvd}" if cvd is not None else "")))
        for conf in r["conf_files"] or []:
            t.children.append(Tree(conffiles.describe(conf), style="note"))
        for child in sorted(kids.get(pid, [])):
            if child not in drawn:
                t.children.append(node(child))
        return t

    for root in tree.roots:
        if root not in drawn:
            doc.append(node(root))
    for n in notes:
        doc.append(Text(n, "note"))
    if gpu_reason:
        doc.append(Text(f"GPUs from open /dev/nvidia* files: {gpu_reason}", "dim"))
    for s in not_found:
        doc.append(Text(f"pid {s['pid']} (given) not examined: {s['reason'].replace('_', ' ')} (exit code 3)", "warn"))
    for s in tree.skipped:
        doc.append(Text(f"pid {s['pid']} skipped: {s['reason']} (exited mid-walk or refused)", "dim"))
    if live is not None:
        scope = live["ptrace_scope"]
        doc.append(Text(f"live: {live['read']} of {len(recs)} read from memory ({live['bytes_read']} bytes, "
                        f"{live['retries']} torn read(s) retried); Yama ptrace_scope "
                        + (str(scope) if scope is not None else "absent (no Yama on this kernel)"), "dim"))
    if tree.excluded:
        doc.append(Text(f"left out: this ncclprobe process ({', '.join(map(str, tree.excluded))}) and anything "
                        "under it", "dim"))
    return doc


def _env_node(r: dict, parent: dict | None, show_wiring: bool = False) -> Tree:
    src, why = r["env_source"], r["env_reason"]
    if src == "unreadable":
        return Tree(f"env: unreadable ({why})", style="warn")
    if src == "empty":
        return Tree(f"env: empty ({why})", style="warn")
    env, wired = (r["env"] or {}, {}) if show_wiring else wiring.split(r["env"] or {})
    if parent is not None and parent.get("env") is not None and not show_wiring:
        parent = {**parent, "env": wiring.job_env(parent["env"])}
    stale = {"fork": "fork child: shows its parent's exec-time block",
             "forkserver": "forkserver child: shows the server's block from its start",
             "clobbered": "block partly overwritten"}.get(r["stale"] or "")
    head = f"env: exec, {len(env)} shown" + (f" (+{len(wired)} of ncclprobe's wiring: --show-wiring)" if wired else "") \
        + (f" — {stale}" if stale else "")
    if why == "empty at exec":
        head = "env: exec, empty at exec (started with no environment at all)" + (f" — {stale}" if stale else "")
    t = Tree(head, style="warn" if stale else "")
    diff = r["env_diff"] if show_wiring or parent is None else _diff({"env": env}, parent)
    if diff is None or parent is None:
        t.children.extend(Tree(f"{k}={v}") for k, v in sorted(env.items()))
        return t
    if diff["inherited"]:
        t.children.append(Tree(f"{len(diff['inherited'])} inherited unchanged from {parent['pid']}", style="dim"))
    t.children.extend(Tree(f"+ {k}={v}", style="good") for k, v in diff["added"].items())
    t.children.extend(Tree(f"- {k} (parent: {parent['env'][k]})", style="warn") for k in diff["removed"])
    t.children.extend(Tree(f"~ {k}: {c['parent']} -> {c['value']}", style="warn") for k, c in diff["changed"].items())
    return t


def _live_node(r: dict, show_wiring: bool = False) -> Tree:
    """The environment the process holds now, as what changed since exec: set, changed, unset in-process."""
    if r["live_env"] is None:
        return Tree(f"live: not read ({r['live_reason']})", style="warn")
    diff = r["live_diff"]
    if diff is None:  # no exec-time block to compare with
        env = r["live_env"] if show_wiring else wiring.job_env(r["live_env"]) or {}
        t = Tree(f"live (read from memory): {len(env)} shown")
        t.children.extend(Tree(f"{k}={v}") for k, v in sorted(env.items()))
        return t
    ours = set() if show_wiring else set(r["live_env"]) - set(wiring.job_env(r["live_env"]) or {})
    lines = [Tree(f"+ {k}={v}  (set in-process" + (f"; NCCL's conf file {diff['conf'][k]}" if k in diff["conf"] else "")
                  + ")", style="good") for k, v in diff["set"].items() if k not in ours]
    lines += [Tree(f"~ {k}: {c['exec']} -> {c['live']}  (changed in-process)", style="warn")
              for k, c in diff["changed"].items() if k not in ours]
    lines += [Tree(f"- {k}  (unset in-process)", style="warn") for k in diff["unset"] if k not in ours]
    if not lines:
        return Tree("live (read from memory): as at exec", style="dim")
    t = Tree(f"live (read from memory): {len(lines)} differ{'s' if len(lines) == 1 else ''} from the exec-time block")
    t.children.extend(lines)
    return t
