"""inspect's /proc snapshot of a tree: one record per process (command line, the watched part of its
exec-time environment and why it may be unreadable, the libnccl copies it maps and whether a preload hook
can reach them, its GPUs, the nccl.conf files NCCL would read in it, the shell pitfalls above it), its
live environment where --live reads it, and how far an exec-time block can be trusted (stale_kind).
Processes started alike share one record's parts (Snapshot.record), so a tree of hundreds of workers costs
a few records."""
from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Mapping
from pathlib import Path

from ncclprobe.model import Sighting
from ncclprobe.model.images import runs_forkserver
from ncclprobe.model.watched import (ASSIGN_WORD as _ASSIGN_WORD, REDACTED, is_watched, looks_secret, one_line,
                                     redact_argv, redact_text, select)
from ncclprobe.witnesses import conffiles, elf, procaccess, procs, shells

_MAX_SCRIPT = 1 << 20
_FD_PATH = re.compile(r"^/(?:dev|proc/self)/fd/(\d+)$")


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
        return "forkserver" if runs_forkserver(parent.get("cmdline")) else "fork"
    return None


def _read_regular(path: Path) -> str:
    """A regular file's text; a pipe, socket or device is refused (opening a FIFO would block)."""
    with open(path, "rb", opener=lambda f, fl: os.open(f, fl | os.O_NONBLOCK)) as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return fh.read(_MAX_SCRIPT).decode("utf-8", errors="backslashreplace")


def read_live(ctx: Snapshot, recs: list[dict], tree: procs.ProcTree, proc_root: Path, reader=None) -> dict:
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


def public(recs: list[dict]) -> list[dict]:
    """The records, their private `_` keys removed in place once the rules have read them (the
    document drawn later reads only public keys); every record has the same keys (Snapshot.record)."""
    drop = [k for k in recs[0] if k.startswith("_")] if recs else []
    for r in recs:
        try:
            for k in drop:
                del r[k]
        except KeyError:  # not built by Snapshot.record: whatever private keys it has
            for k in [k for k in r if k.startswith("_")]:
                del r[k]
    return list(recs)


def exited(recs: list[dict]) -> list[str]:
    """Processes that exited between their stat and their environ: a note, not a finding."""
    gone = [r["pid"] for r in recs if r["env_source"] == "unreadable" and r["env_reason"] == "vanished"]
    return [f"Exited during the scan (environment not read): pid {', '.join(map(str, gone))}."] if gone else []


def apply_scope(recs: list[dict], scope: str) -> list[str]:
    nccl = [r for r in recs if r["nccl_libs"] or r["gpus"]]
    for r in recs:
        r["in_scope"] = scope == "all" or bool(r["nccl_libs"] or r["gpus"])
    if scope == "nccl" and not nccl:
        for r in recs:
            r["in_scope"] = True
        return ["No process maps libnccl or uses a GPU (yet): every process was checked (as with --scope all)."]
    return []


def env_diff(rec: dict, parent: dict) -> dict | None:
    if rec["env"] is None or parent["env"] is None:
        return None
    mine, theirs = rec["env"], parent["env"]
    return {"parent": parent["pid"],
            "inherited": sorted(k for k in mine if k in theirs and theirs[k] == mine[k]),
            "added": {k: v for k, v in sorted(mine.items()) if k not in theirs},
            "removed": sorted(k for k in theirs if k not in mine),
            "changed": {k: {"parent": theirs[k], "value": mine[k]} for k in sorted(mine)
                        if k in theirs and theirs[k] != mine[k]}}


class Snapshot:
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
            hit = self._diffs[key] = (rec["env"], parent["env"], env_diff(rec, parent))
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
            "_cwd": self.fs.cwd_of(p),  # where a relative script path on its command line resolves (shells)
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
                hit = exc.with_traceback(None)
            self._text[key] = hit
        if isinstance(hit, OSError):
            raise procs.fresh(hit)
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
            if script is None and hit[2] is None:  # no shell script (most processes): nothing to name
                continue
            name = f"`{os.path.basename(shell.cmdline[0]).lstrip('-')} -c`" if script is not None else \
                os.path.basename(hit[2] or "")  # what a hint calls the script (FILE:LINE)
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
                                "led_to_target": one_line(self.command_text(pf.led_to_target)), "kind": pf.kind,
                                **shells.pitfall_fields(pf, name)})
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


def sightings(recs: list[dict], host: str) -> list[Sighting]:
    """inspect's records as the typed observation the model takes (model.add_sightings): one per process.
    The start to the ms, as run's watch gives it (ticks are 10 ms: nothing is lost)."""
    return [Sighting(
        host, r["pid"], "snapshot", None, start=None if r.get("_start") is None else round(r["_start"], 3),
        ppid=r.get("ppid"), argv=r.get("cmdline"), exe=r.get("exe"), exec_env=r.get("_watched"), env_reason=r.get("env_reason"),
        env_hash=r.get("_hash"), cwd=r.get("_cwd"), expected=r.get("_exp"), env_source=r.get("env_source"),
        denied_by=r.get("env_denied_by"), user=r.get("user"), stale=r.get("stale"), in_scope=r.get("in_scope"),
        nccl_libs=r.get("nccl_libs") or [], gpus=r.get("gpus"), conf_files=r.get("conf_files"),
        live={"env": r.get("_live_watched"), "expected": r.get("_live_exp"), "t": r.get("live_t"),
              "reason": r.get("live_reason")} if "live_reason" in r else None) for r in recs]
