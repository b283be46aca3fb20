"""The one door into the model: every witness's observations enter here. The probes' event log through
build() (one handler per event kind, the table HANDLERS), inspect's /proc sightings through add_sightings
(every /proc sighting, run's watch's too, enters through _see),
another model's /proc view (a live inspect of the same job) through add_proc_view, and NCCL's RAS
service's communicators through add_ras. A new witness is
one module in witnesses/ and one handler here; model/__init__.py holds the types."""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from itertools import islice
from typing import TYPE_CHECKING, Any

from dataclasses import fields as _fields

from ncclprobe.model import (FORK_GONE, INIT_PIDNS, CollStat, CommView, EnvWrite, LiveReading, Model, NcclRead,
                             ProcessView, Sighting, SpawnEdge, _env, _id, given_of, space_of, version_code)
from ncclprobe.model.tuning import canonical
from ncclprobe.model.watched import is_watched, redact_argv

if TYPE_CHECKING:
    from ncclprobe.witnesses.events import EventLog
    from ncclprobe.witnesses.ras import RasReading
    from ncclprobe.witnesses.rasdiag import RasDiagnostics


class _Build:
    """What one build keeps between events: the model, and the communicators by the ids later events
    name them by (the preload's call number and pointer, the profiler's hash)."""

    def __init__(self, m: Model):
        self.m = m
        self.by_call: dict[tuple[str, int, int], CommView] = {}
        self.by_ptr: dict[tuple[str, int, str], CommView] = {}
        self.by_hash: dict[tuple[str, int, str], CommView] = {}
        # identity: the report's pid namespace per host (run's, from run.json; else the kernel's initial
        # one), and (host, pidns, pid in there) -> the key of the process a /proc witness showed it is
        self.home = {r["host"]: r["pidns"] for r in m.runs if isinstance(r.get("host"), str) and r.get("pidns")}
        here = os.uname().nodename
        if here not in self.home:  # a log read where it was written: the reader's namespace is the report's
            try:
                link = os.readlink("/proc/self/ns/pid")
                self.home[here] = int(link[5:-1])
            except (OSError, ValueError):
                self.home[here] = INIT_PIDNS
        self.alias: dict[tuple[str, int, int], tuple[str, int]] = {}
        self.placed: _Placed | None = None  # a log read one host after another (build)
        self.strings = None  # the read's events.Strings (build): one copy of each name and value

    def route(self, host: str, pid: int, e: dict[str, Any]) -> tuple[tuple[str, int], dict[str, Any]]:
        """The key of the process a line is of, by its identity (witnesses/events.py): the pid as the
        report's namespace sees it where any witness showed it, else the pid in its namespace's space.
        A line whose ids are its namespace's (ppid, forked_from, of) gets them in the key's space."""
        ns = e.get("pidns")
        if ns is None or ns == self.home.get(host, INIT_PIDNS):
            return (host, pid), e
        inner = e.get("ns_pid", pid)
        if inner != pid or e.get("src") == "proc":  # the pid a /proc outside the namespace showed
            self.join((host, ns, inner), (host, pid))
            key = (host, pid)
        else:
            key = self.alias.get((host, ns, inner)) or (space_of(host, ns), pid)
        if key[0] == host and inner == pid and e.get("src") != "proc":  # ids from in there, the key from outside
            e = dict(e)
            for name in ("ppid", "forked_from", "of"):  # 0: a parent outside (its namespace's first process)
                if isinstance(e.get(name), int):
                    e[name] = self.alias.get((host, ns, e[name]), (host, None))[1]
        p = self.m.process(*key)
        p.ns_pid, p.pidns = inner, ns
        return key, e

    def join(self, ident: tuple[str, int, int], key: tuple[str, int]) -> None:
        """A /proc witness showed that (host, pidns, pid in there) is the process `key`: its records kept
        so far in the namespace's own space move there (merged with what the key has)."""
        if self.alias.get(ident) == key:
            return
        self.alias[ident] = key
        host, ns, inner = ident
        q = self.m.processes.pop((space_of(host, ns), inner), None)
        if q is None:
            return
        if self.placed is not None:
            self.placed.popped()
        old = (q.host, q.pid)
        q.ppid = self.alias.get((host, ns, q.ppid), (host, None))[1] if q.ppid is not None else None
        q.forked_from = self.alias.get((host, ns, q.forked_from), (host, None))[1] if q.forked_from else None
        p = self.m.processes.get(key)
        if p is None:
            q.host, q.pid = key
            self.m.processes[key] = q
        else:
            _merge(p, q)
        for c in self.m.comms:
            if (c.host, c.pid) == old:
                c.host, c.pid = key
        for index in (self.by_call, self.by_ptr, self.by_hash):
            for k in [k for k in index if k[:2] == old]:
                index[key + k[2:]] = index.pop(k)
        self.m._indexed = (None, 0)
        if old in self.m.reading.dropped:
            self.m.reading.dropped[key] = self.m.reading.dropped.get(key, 0) + self.m.reading.dropped.pop(old)

    def incarnation(self, proc: ProcessView, start: Any) -> ProcessView:
        """proc, or, where a start record or sighting shows another process under its pid (the kernel gave
        the pid again within the run: its start differs), a new view; the earlier one is kept apart."""
        if (proc.proc_start is None or not isinstance(start, (int, float)) or isinstance(start, bool)
                or abs(float(start) - proc.proc_start) <= REUSE_S):
            return proc
        proc.retired = proc.proc_start
        self.m.processes[proc.key] = proc
        for c in self.m.comms:  # its communicators stay its own; later lines name the new process's
            if (c.host, c.pid) == (proc.host, proc.pid) and c.retired is None:
                c.retired = proc.retired
        for index in (self.by_call, self.by_ptr, self.by_hash):
            for k in [k for k in index if k[:2] == (proc.host, proc.pid)]:
                del index[k]
        self.m._indexed = (None, 0)
        fresh = self.m.processes[(proc.host, proc.pid)] = ProcessView(proc.host, proc.pid)
        fresh.ns_pid, fresh.pidns = proc.ns_pid, proc.pidns
        last = proc.spawned[-1] if proc.spawned else None
        if last is not None and last.exec and last.undo is not None and last.t >= float(start) - REUSE_S:
            # the native record of an exec written by the new process before it exec'd (no start of its
            # own, so it went to the pid's earlier process): it is the new one's start
            _take_back(proc)
            fresh.spawned.append(last)
            fresh.argv, fresh.exe, fresh.started_by = last.argv, last.exe, last
            if last.forked_from is not None:
                fresh.ppid = last.forked_from
        return fresh

    def hashed(self, host: str, pid: int, t: float, e: dict[str, Any], **extra: Any) -> CommView:
        """The communicator a profiler event names by its hash (made on first sight)."""
        h = _id(e.get("comm_hash"))
        c = self.by_hash.get((host, pid, h))
        if c is None:
            c = CommView(host, pid, t, comm_hash=h, env_source=None, **extra)
            c.seen_by.add("profiler")
            self.m.comms.append(c)
            self.by_hash[(host, pid, h)] = c
        return c


Handler = Callable[[_Build, ProcessView, dict[str, Any], float], None]
REUSE_S = 1.0  # starts further apart than this are two processes (the witnesses' clocks agree to ms)


def _merge(p: ProcessView, q: ProcessView) -> None:
    """q's records into p (the same process, seen under two keys): lists and sets joined, p's values kept."""
    for f in _fields(ProcessView):
        a, b = getattr(p, f.name), getattr(q, f.name)
        if f.name in ("host", "pid"):
            continue
        if isinstance(a, list) and isinstance(b, list):
            setattr(p, f.name, a + [x for x in b if x not in a])
        elif isinstance(a, (set, dict)) and isinstance(b, type(a)):
            setattr(p, f.name, (b | a) if isinstance(a, set) else {**b, **a})
        elif a in (None, False) and b not in (None, False):
            setattr(p, f.name, b)


def _process_start(b: _Build, proc: ProcessView, e: dict[str, Any], t: float) -> None:
    proc = b.incarnation(proc, e.get("start"))
    proc.sources.add("boot")
    # the process that started it, not a subreaper that adopted it before the record was written
    # (a double fork's intermediate may exit before its child's interpreter starts)
    forked, ppid = e.get("forked_from"), e.get("ppid")
    ppid = ppid if ppid is not None else proc.ppid  # (a parent outside its pid namespace: a sighting's)
    proc.ppid = forked if isinstance(forked, int) and forked > 0 else ppid
    proc.adopted_by = ppid if proc.ppid != ppid else None
    argv = redact_argv(e["argv"]) if isinstance(e.get("argv"), list) else None  # older probes: raw
    later = None  # what a sighting stamped before this record showed, where it can only be of a later image
    if proc.argv and argv and proc.argv != argv:  # the watch saw this pid run another program before
        if isinstance(forked, int) and forked > 0 and proc.t_start is None and "proc" in proc.sources:
            # a fork child starts as its parent's program: another one a scan read is what it exec'd since (the
            # scan's batch is stamped when it began, maybe before the fork), not an image before this record
            later = (proc.argv, proc.exe)
        else:
            proc.images.append(proc.argv)
    proc.argv = argv
    proc.exe = e.get("exe")
    proc.start_env = _env(e.get("env"), b.strings)
    proc.exec_env = _env(e.get("exec_env"), b.strings)
    proc.exec_env_differs = e.get("exec_env_differs")
    proc.forked_from = e.get("forked_from")
    proc.t_start = t
    proc.mode = e.get("mode")
    if isinstance(e.get("start"), (int, float)) and not isinstance(e.get("start"), bool):
        proc.proc_start = float(e["start"])  # the kernel's start (the fork), to the clock tick
    for entry in e.get("profile") or ():  # what the boot probe applied itself (--enforce, a profile)
        if isinstance(entry, dict) and entry.get("applied") and is_watched(str(entry.get("var"))):
            proc.injected[str(entry["var"])] = str(entry.get("value"))
    if later is not None:
        _image_after_boot(proc, *later)


def _parent_seen(b: _Build, proc: ProcessView, e: dict[str, Any], t: float) -> None:
    # a boot probe's record of its parent, not Python: /proc at the child's start
    if e.get("of"):  # (none: in its namespace, a parent no witness showed from outside)
        _see(b, Sighting(proc.host, e["of"], "parent", t, **_given(e, _PARENT_KEYS)))


def _proc_seen(b: _Build, proc: ProcessView, e: dict[str, Any], t: float) -> None:
    # run's watch: a later sighting is the same process after an exec, and replaces the earlier
    _see(b, Sighting(proc.host, proc.pid, "watch", t, **_given(e, _WATCH_KEYS)))


# what a watch's proc_seen event carries, by the Sighting field that holds it
_WATCH_KEYS = ("start", "ns_pid", "pidns", "ppid", "argv", "exe", "exec_env", "env_reason", "env_hash", "execs", "cwd",
               "script")


_PARENT_KEYS = ("start", "ppid", "argv", "exe", "exec_env", "env_reason", "script")  # a parent_seen event's


def _given(e: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: e[k] for k in keys if e.get(k) is not None}


def _see(b: _Build, s: Sighting) -> None:
    """The /proc door: the only place a sighting of a process (run's watch, inspect's snapshot, a boot
    probe's read of its parent) enters the model. The watch's later sighting replaces an earlier one (an
    exec); a snapshot fills in what the in-process witnesses of the same pid did not give; a parent's
    sighting, what no other sighting gave."""
    b.m.sightings.append(s)
    proc = b.m.process(s.host, s.pid)
    if s.witness == "watch":
        proc = b.incarnation(proc, s.start)
    proc.sources.add("proc")
    # (cwd, script: where a relative script path resolves, and the script fd 255 names; witnesses/shells)
    cwd = s.cwd if isinstance(s.cwd, str) else None
    if s.witness == "snapshot":  # (its argv redacted by inspect already, as it shows it)
        _seen_now(proc, s, cwd)
        return
    argv = redact_argv(s.argv) if isinstance(s.argv, list) else None
    if s.witness == "parent":
        _seen_by_child(proc, s, argv)
        return
    edge = proc.started_by
    # the watch counts each pid's execs: a sighting of fewer than one applied is of an earlier image, of more a
    # later one, whatever their stamps say (a read during an execve is stamped after the exec's own record)
    execs = s.execs if type(s.execs) is int else None
    newer = execs is not None and proc.proc_execs is not None and execs > proc.proc_execs
    older = execs is not None and proc.proc_execs is not None and execs < proc.proc_execs
    if older or (not newer and edge is not None and edge.exec and argv is not None and argv != proc.argv
                 and argv in proc.images):
        # a read of the image before the exec its own record names (a scan stamps its reads late): stale, but
        # where that image was a shell, its script and working directory still name the line of the exec
        if older and argv and argv != proc.argv and argv not in proc.images:  # an image no read had shown: the
            proc.images.insert(min(execs, len(proc.images)), argv)  # execs before it say where it was
        proc.cwd = proc.cwd or cwd
        proc.script = proc.script or (s.script if isinstance(s.script, str) else None)
        return
    if newer and argv in proc.images:  # the image the exec's record named, a read of the one before it taken first
        proc.images.remove(argv)
    proc.proc_execs = execs if execs is not None else proc.proc_execs
    if proc.live_readings and proc.live_readings[-1].execs != (s.execs or 0):
        _forget_live(proc)  # what the live witness read was the earlier image's
    # a fork child read while it still held its parent's block, gone before a second look: that block is its
    # parent's, not what it exec'd with (a record of the call that started it, where there is one, says that)
    proc.proc_exec_env = _env(s.exec_env) if s.env_reason != FORK_GONE else None
    proc.proc_start, proc.proc_env_reason = s.start, s.env_reason
    proc.proc_env_hash = s.env_hash
    proc.cwd = cwd if cwd is not None else proc.cwd
    proc.script = s.script if isinstance(s.script, str) else proc.script
    if proc.t_start is None:  # no process_start (yet): /proc's ancestry and command line
        if proc.argv and argv and proc.argv != argv:  # it exec'd another program since
            proc.images.append(proc.argv)
        proc.ppid, proc.exe, proc.argv = s.ppid, s.exe, argv
    elif _exec_since_boot(proc, s.exe, s.start, s.t):  # a new image: the boot probe's record was the one before it
        _image_after_boot(proc, argv, s.exe)
    else:  # the boot probe's, where it had them
        proc.ppid = proc.ppid if proc.ppid is not None else s.ppid
        proc.exe, proc.argv = proc.exe or s.exe, proc.argv if proc.argv is not None else argv


def _seen_by_child(q: ProcessView, s: Sighting, argv: list[str] | None) -> None:
    if q.proc_start is None:  # the watch's own sighting, where it had one, stays
        q.proc_exec_env, q.proc_env_reason = _env(s.exec_env), s.env_reason
        q.proc_start = s.start
    q.ppid = q.ppid if q.ppid is not None else s.ppid
    q.exe = q.exe or s.exe
    q.argv = q.argv or argv
    q.script = q.script or (s.script if isinstance(s.script, str) else None)


def _seen_now(p: ProcessView, s: Sighting, cwd: str | None) -> None:
    # inspect's snapshot: the in-process witnesses of the same pid stay
    p.ppid = p.ppid if p.ppid is not None else s.ppid
    p.argv = p.argv or s.argv or None
    p.exe = p.exe or s.exe
    readable = s.env_source == "exec"
    # shared with the sightings of processes started alike (never modified): the rules do them once
    p.proc_exec_env = (s.exec_env or {}) if readable else None
    p.proc_expected = (s.expected or {}) if readable else None
    # the boot probe's and the watch's start are to the tick: a /proc snapshot never replaces them
    p.proc_start = p.proc_start if p.proc_start is not None else s.start
    p.proc_env_reason = None if readable else (s.env_reason or s.env_source)
    p.proc_stale = s.stale
    p.proc_env_hash = s.env_hash
    p.nccl_user = bool(s.nccl_libs or s.gpus)
    p.in_scope = s.in_scope
    p.proc_env_source, p.proc_denied_by, p.proc_user = s.env_source, s.denied_by, s.user
    p.nccl_libs = s.nccl_libs or []
    p.conf_files = s.conf_files
    p.cwd = cwd or p.cwd  # (where a relative script path on its command line resolves)
    if s.live is not None:  # inspect --live: one reading, now (after any a run --live log holds)
        p.live_env, p.live_expected = s.live.get("env"), s.live.get("expected")
        if p.live_env is not None:
            p.sources.add("live")
        p.live_t, p.live_reason, p.live_since = s.live.get("t"), s.live.get("reason"), None
        if p.live_readings and p.live_env is not None and p.live_t is not None:
            p.live_readings = [*p.live_readings, LiveReading(p.live_env, p.live_t, None, p.live_readings[-1].execs)]


def _proc_exit(b: _Build, proc: ProcessView, e: dict[str, Any], t: float) -> None:
    # run's watch (kernel mode): the process it recorded under this pid ended
    start = e.get("start")
    if proc.proc_start is None or start is None or abs(float(start) - proc.proc_start) <= REUSE_S:
        proc.t_exit = t


def _live_env(b: _Build, proc: ProcessView, e: dict[str, Any], t: float) -> None:
    # run --live: the environment the process holds, where it changed
    execs = e.get("execs") or 0
    if proc.live_readings and proc.live_readings[-1].execs != execs:
        _forget_live(proc)
    env = _env(e.get("env"), b.strings)
    if env is None:
        proc.live_reason = None if proc.live_readings else str(e.get("reason") or "not read")
        return
    since = e.get("since")
    since = float(since) if since is not None and since < t else None
    proc.live_readings.append(LiveReading(env, t, since, execs))
    proc.live_env, proc.live_t, proc.live_since, proc.live_reason = env, t, since, None
    proc.sources.add("live")


def _env_write(b: _Build, proc: ProcessView, e: dict[str, Any], t: float) -> None:
    proc.writes.append(EnvWrite(str(e.get("var")), e.get("old"), e.get("new"), str(e.get("where", "?")),
                                str(e.get("op", "set")), bool(e.get("blocked")), t))


def _log_budget(b: _Build, proc: ProcessView, e: dict[str, Any], t: float) -> None:
    # the writer's last line: nothing after it was recorded
    b.m.reading.budget.setdefault((proc.host, proc.pid), (e["reached"], e.get("limit")))


def _probe_error(b: _Build, proc: ProcessView, e: dict[str, Any], t: float) -> None:
    proc.errors.append(str(e.get("message", "")))


def _plugin_load(b: _Build, proc: ProcessView, e: dict[str, Any], t: float) -> None:
    proc.plugins.append(e)
    if e.get("lib"):
        proc.libs.add(e["lib"])


def _nccl_getenv(b: _Build, proc: ProcessView, e: dict[str, Any], t: float) -> None:
    # one read, or a run of them folded into one event (events._folded: each with its own time); of each
    # (lib, var, value) the process keeps its first read: the earliest, whatever order the runs came in
    reads = e.get("reads")
    for t, var, value, lib in reads if reads is not None else ((t, e.get("var"), e.get("value"), e.get("lib")),):
        lib, var, t = str(lib or "?"), str(var), float(t)
        if lib != "?":
            proc.libs.add(lib)
        key = (lib, var, value)
        r = proc.reads.get(key)
        if r is None or t < r.t:
            proc.reads[key] = NcclRead(var, value, lib, t, "envplugin")


def _comm_init(b: _Build, proc: ProcessView, e: dict[str, Any], t: float) -> None:
    host, pid = proc.host, proc.pid
    c = CommView(host, pid, t, api=e.get("api"), comm=_id(e.get("comm")), call=e.get("call"),
                 rank=e.get("rank"), nranks=e.get("nranks"), parent=_id(e.get("parent")),
                 color=e.get("color"), key=e.get("key"), uid=_id(e.get("uid")), config=e.get("config"),
                 env=_env(e.get("env"), b.strings), env_source="preload", rc=e.get("rc"), lib=e.get("lib"),
                 version=e.get("version"), simulated=bool(e.get("simulated")), ms=e.get("ms"),
                 dev=e.get("dev"))
    c.seen_by.add("preload")
    if c.lib:
        proc.libs.add(c.lib)
    b.m.comms.append(c)
    if c.call is not None:
        b.by_call[(host, pid, c.call)] = c
    if c.comm:
        b.by_ptr[(host, pid, c.comm)] = c


def _comm_plugin_init(b: _Build, proc: ProcessView, e: dict[str, Any], t: float) -> None:
    host, pid, call = proc.host, proc.pid, e.get("call")
    c = b.by_call.get((host, pid, call)) if call is not None else None
    if c is None or c.comm_hash is not None:
        c = CommView(host, pid, t, env=_env(e.get("env"), b.strings), env_source="profiler")
        b.m.comms.append(c)
    c.seen_by.add("profiler")
    c.comm_hash = _id(e.get("comm_hash"))
    c.comm_name = e.get("comm_name")
    c.nranks = c.nranks if c.nranks is not None else e.get("nranks")
    c.rank = c.rank if c.rank is not None else e.get("rank")
    c.lib = c.lib or e.get("lib")
    c.version = c.version or e.get("version")
    c.simulated = c.simulated or bool(e.get("simulated"))
    if e.get("lib"):
        proc.libs.add(e["lib"])
    if c.env is None:
        c.env, c.env_source = _env(e.get("env"), b.strings), "profiler"
    if c.comm_hash:
        b.by_hash[(host, pid, c.comm_hash)] = c


def _coll_summary(b: _Build, proc: ProcessView, e: dict[str, Any], t: float) -> None:
    _add_coll(b.hashed(proc.host, proc.pid, t, e), e)


def _comm_activity(b: _Build, proc: ProcessView, e: dict[str, Any], t: float) -> None:
    c = b.hashed(proc.host, proc.pid, t, e, rank=e.get("rank"), nranks=e.get("nranks"))
    if c.activity is None:
        from ncclprobe.model.timing import Activity
        c.activity = Activity()
    c.activity.add(e)


def _comm_end(b: _Build, proc: ProcessView, e: dict[str, Any], t: float) -> None:
    host, pid = proc.host, proc.pid
    c = b.by_ptr.get((host, pid, _id(e.get("comm")))) or b.by_hash.get((host, pid, _id(e.get("comm_hash"))))
    if c is not None:
        c.destroyed = True


SPAWN_SAME_S = 2.0  # two probes' records of one call (the boot probe's Popen, the preload's posix_spawn) lie this close


def _spawn(b: _Build, proc: ProcessView, e: dict[str, Any], t: float) -> None:
    # a probe in this process recorded a process it started (or its own exec): the edge, and the child's
    # environment at its start where no other witness reads it (Knowledge._witnessed prefers any that does)
    if e.get("rc") is not None:  # the call failed: nothing was started
        if e.get("exec"):  # the native probe wrote the exec before the call: that record did not happen
            _exec_failed(proc, e.get("call"), t)
        return
    child, is_exec = e.get("child"), bool(e.get("exec"))
    if child is None and not is_exec:
        return
    argv = redact_argv(e["argv"]) if isinstance(e.get("argv"), list) else None
    edge = SpawnEdge(proc.host, proc.pid, child, e.get("call"), e.get("where"), argv, e.get("exe"),
                     e.get("env_given"), _env(e.get("env"), b.strings), e.get("env_count"), is_exec, t, {e["src"]})
    for known in proc.spawned:  # the same call seen by the boot probe and the native one: one edge
        if known.child == child and known.exec == is_exec and abs(known.t - t) <= SPAWN_SAME_S and (
                child is not None or known.exe == edge.exe):
            known.witnesses |= edge.witnesses
            known.call = known.call if known.where else edge.call  # the Python caller's spelling, with its line
            known.where = known.where or edge.where
            for name in ("argv", "exe", "env", "env_count", "env_given"):
                if getattr(known, name) is None:
                    setattr(known, name, getattr(edge, name))
            return
    proc.spawned.append(edge)
    if is_exec and isinstance(e.get("ppid"), int) and e.get("src") == "preload":  # a native fork child's line
        edge.forked_from = e["ppid"]
        if proc.ppid is None:
            proc.ppid = e["ppid"]
    if is_exec:  # this pid runs another program from here, with the environment it exec'd with
        edge.undo = {name: getattr(proc, name) for name in _EXEC_STATE} | {"images": len(proc.images)}
        if proc.argv and argv and proc.argv != argv:
            proc.images.append(proc.argv)
        proc.argv, proc.exe, proc.started_by = argv, edge.exe, edge
        if proc.t_start is not None and proc.t_start <= t:
            proc.exec_after_boot = True
            proc.start_env = proc.exec_env = None
        proc.proc_exec_env = proc.proc_env_reason = None  # a sighting so far was of the image before (a later one wins)
        return
    c = b.m.process(proc.host, child)
    if c.started_by is None:
        c.started_by = edge
    c.sources.add("edge")
    if c.ppid is None:
        c.ppid = proc.pid
    if c.argv is None and not c.images:
        c.argv, c.exe = argv, c.exe or edge.exe


_EXEC_STATE = ("argv", "exe", "started_by", "exec_after_boot", "start_env", "exec_env", "proc_exec_env",
               "proc_env_reason")


def _exec_failed(proc: ProcessView, call: str | None, t: float) -> None:
    """A record of an exec's failure (rc): the same call's record from before the call, if it is the last
    thing this process was seen to do, is taken back, and the process is what it was before."""
    last = proc.spawned[-1] if proc.spawned else None
    if last is None or not last.exec or last.undo is None or last.call != call or not 0 <= t - last.t <= SPAWN_SAME_S:
        return
    _take_back(proc)


def _take_back(proc: ProcessView) -> SpawnEdge:
    """proc's last record, an exec's (written before the call), taken back: proc is what it was before it."""
    last = proc.spawned.pop()
    state = dict(last.undo)
    last.undo = None
    del proc.images[state.pop("images"):]
    for name, value in state.items():
        setattr(proc, name, value)
    return last


# Every event kind of witnesses/events.py.FIELDS that says something of a process (watch_summary is run's
# own, no process of the job: build() keeps it apart).
HANDLERS: dict[str, Handler] = {
    "process_start": _process_start, "parent_seen": _parent_seen, "proc_seen": _proc_seen, "proc_exit": _proc_exit,
    "live_env": _live_env, "env_write": _env_write, "log_budget": _log_budget, "probe_error": _probe_error,
    "plugin_load": _plugin_load, "nccl_getenv": _nccl_getenv, "comm_init": _comm_init,
    "comm_plugin_init": _comm_plugin_init, "coll_summary": _coll_summary, "comm_activity": _comm_activity,
    "comm_destroy": _comm_end, "comm_plugin_finalize": _comm_end, "spawn": _spawn,
}


def build(log: EventLog, run_id: str | None = None) -> Model:
    """The model of one event log, iterating its events once, in time order (events.stream_dirs gives
    them as an iterator, checked against events.FIELDS). Every id (comm, parent, uid, comm_hash) is read
    in comm_id's spelling (_id), so witnesses join whatever spelling wrote them (older probes dropped
    leading zeros). run_id: only what that run started (its own report in a directory of several runs)."""
    m = Model(runs=list(log.runs), files=len(log.files))
    b = _Build(m)
    watches: dict[tuple[str, int], dict[str, Any]] = {}
    placed = b.placed = _Placed(m) if log.by_host else None
    b.strings = log.strings
    for seq, e in enumerate(log.events):
        host, pid, kind, t = e.get("host", "?"), e["pid"], e["ev"], float(e["t"])
        if placed is not None:
            placed.now(e, seq)
        if e.get("dropped"):  # lines this writer lost before this one
            m.reading.dropped[(host, pid)] = m.reading.dropped.get((host, pid), 0) + e["dropped"]
        if kind == "watch_summary":  # its pid is run's, no process of the job
            w = watches[(host, pid)] = {k: v for k, v in e.items() if k not in ("ev", "host", "pid", "src")}
            earlier = [v for (h, p), v in watches.items() if h == host and p != pid]
            m.watch[host] = _merged_watch(earlier, w)
            continue
        if "pidns" in e:
            (host, pid), e = b.route(host, pid, e)
        proc = m.process(host, pid)
        proc.sources.add(e["src"])
        handler = HANDLERS.get(kind)
        if handler is not None:
            handler(b, proc, e, t)
    if placed is not None:
        placed.restore()
    _cmd_of_runs(m)
    if run_id is not None:
        _only_run(m, run_id, watches)
    for host, w in m.watch.items():  # processes the watch missed: their boot probe, or their parent's record of
        unseen = sorted(p.pid for p in m.processes.values()  # the call that started them, says they ran
                        if p.node == host and (p.t_start is not None or "edge" in p.sources) and "proc" not in p.sources)
        w["missed_started"], w["missed_started_pids"] = len(unseen), unseen
        _missed_children(m, host, w, {pid for h, pid in watches if h == host})
    # a stream's counts are complete only once it has been consumed
    # in an order of their own, not the order the files were read in (one host after another, or all at once)
    m.skipped = dict(sorted({**log.skipped, **{f"unknown event {k}": v for k, v in log.unknown.items()},
                             **log.skipped_files}.items()))
    listed = {f: i for i, f in enumerate(log.files)}  # (a file skipped as it was listed: -1, first)
    m.reading.skipped_files = dict(sorted(log.skipped_files.items()))
    m.reading.notes = sorted(log.notes, key=lambda n: listed.get(n["path"], -1))
    _label_simulated(m)
    return m


class _Placed:
    """Of a log read one host after another (EventLog.by_host), where each thing the model keeps in one order
    for all hosts (processes, communicators, sightings, watches) came in, as the event that added it would lie in
    the time order of all hosts' events: (t, host, pid, its place in its host's order). restore() puts them in
    that order, the order a build in time order gives them: a model and its report alike, whichever way the
    log was read. now() before each event compares four lengths; only what grew is looked at. (reading.budget
    and reading.dropped keep the order they came in: every reader sorts them. build orders the notes and skip
    reasons itself.)"""

    def __init__(self, m: Model):
        self.m, self.e, self.seq = m, None, 0
        self.np = self.nc = self.ns = self.nw = 0  # the lengths as the events before the last one left them
        self.procs: dict[tuple, tuple] = {}
        self.items: dict[int, tuple] = {}  # id() of a communicator or sighting -> its key (both kept in m)
        self.watch: dict[str, tuple] = {}

    def now(self, e: dict[str, Any], seq: int) -> None:
        """What the last event added is its; e is the event now."""
        m = self.m
        if len(m.processes) != self.np or len(m.comms) != self.nc or len(m.sightings) != self.ns or \
                len(m.watch) != self.nw:
            self.took()
        self.e, self.seq = e, seq

    def took(self) -> None:
        m, e = self.m, self.e
        key = (e["t"], e.get("host", "?"), e["pid"], self.seq)
        if len(m.processes) > self.np:
            for k in islice(reversed(m.processes), len(m.processes) - self.np):
                self.procs[k] = key
        for c in m.comms[self.nc:]:
            self.items[id(c)] = key
        for s in m.sightings[self.ns:]:
            self.items[id(s)] = key
        for host in islice(reversed(m.watch), len(m.watch) - self.nw):
            self.watch[host] = key
        self.np, self.nc, self.ns, self.nw = len(m.processes), len(m.comms), len(m.sightings), len(m.watch)

    def popped(self) -> None:
        """A process was taken out (_Build.join): what comes in after it is new all the same."""
        self.np -= 1

    def restore(self) -> None:
        m = self.m
        if self.e is not None:
            self.took()
        procs, items, watch = self.procs.__getitem__, self.items, self.watch.__getitem__
        m.processes = dict(sorted(m.processes.items(), key=lambda kv: procs(kv[0])))
        m.comms.sort(key=lambda c: items[id(c)])
        m.sightings.sort(key=lambda s: items[id(s)])
        m.watch = dict(sorted(m.watch.items(), key=lambda kv: watch(kv[0])))
        m._indexed = (None, 0)


def _missed_children(m: Model, host: str, w: dict[str, Any], watchers: set[int]) -> None:
    """missed_children and missed_parents: the children the watch counted from their parents' reaping
    (reaped_unseen) less those another witness knows (their boot probe, their parent's record of the call, a child
    of theirs it knows): each such child explains one count at most, so what is left is still a lower bound. None
    in kernel mode. watchers: the pids of the runs whose watch this is (CMD's parent, outside the tree; its
    watch_summary's pid)."""
    if w.get("reaped_unseen") is None:
        w["missed_children"], w["missed_parents"] = None, []
        return
    left = Counter(w["reaped_unseen"])
    for p in m.processes.values():
        edge = p.started_by  # (an exec's record names the process that exec'd: its own pid)
        parent = edge.parent if edge is not None and edge.child is not None else p.ppid
        if p.node == host and "proc" not in p.sources and left.get(parent, 0) > 0:
            left[parent] -= 1
    # a process known only as the parent of one a witness knows (a script's $(…) subshell that forked dirname:
    # no record of its own) ran too, as a child of a process of the tree: it may be one that was counted
    here = {p.pid for p in m.processes.values() if p.node == host}
    outside = {0, 1, *watchers}
    implied = {p.ppid for p in m.processes.values() if p.node == host and p.ppid not in here and p.ppid not in outside}
    for _ in implied:
        parent = next((pid for pid in sorted(left) if left[pid] > 0), None)
        if parent is None:
            break
        left[parent] -= 1
    w["missed_children"], w["missed_parents"] = sum(left.values()), sorted(pid for pid, n in left.items() if n)


# watch_summary fields that add up over the runs of one host (run --append); the others are the latest run's
WATCH_SUMS = ("scans", "walks", "seen", "missed_known", "cpu_s", "wall_s", "errors", "lost_lines", "live_reads",
              "live_processes", "live_bytes", "live_cpu_s", "kernel_events", "kernel_reads", "kernel_vanished",
              "kernel_overruns", "kernel_cpu_s")


def _merged_watch(earlier: list[dict[str, Any]], w: dict[str, Any]) -> dict[str, Any]:
    """The watch of one host over its runs: counts and costs added up, every run's missed pids, stuck if one
    was; scans only (and why) if one run's watch had no kernel events. `runs`: how many were merged."""
    if not earlier:
        return w
    every = [*earlier, w]
    out = {**w, "runs": len(every), "stuck": any(x.get("stuck") for x in every),
           "missed_pids": [pid for x in every for pid in x.get("missed_pids") or []],
           "reaped_unseen": [pid for x in every for pid in x.get("reaped_unseen") or []],
           "kernel_complete": all(x.get("kernel_complete") for x in every)}
    for k in WATCH_SUMS:
        if any(x.get(k) is not None for x in every):
            out[k] = sum(x.get(k) or 0 for x in every)
    scans_only = next((x for x in every if x.get("mode") != "kernel"), None)
    if scans_only is not None:
        out["mode"], out["kernel_refused"] = scans_only.get("mode"), scans_only.get("kernel_refused")
    return out


def _only_run(m: Model, run_id: str, watches: dict[tuple[str, int], dict[str, Any]]) -> None:
    """Keep of m what the run run_id started (Model.run_of): its processes, their communicators, its watch;
    the other runs of a directory `run --append` shares are left out whole."""
    own = next((r for r in m.runs if r.get("run_id") == run_id), None)
    if own is None:
        return
    keep = {id(p) for p in m.processes.values() if m.run_of(p) is own}
    m.comms = [c for c in m.comms if id(m.owner(c)) in keep]
    m.processes = {k: p for k, p in m.processes.items() if id(p) in keep}
    writers = {(p.host, p.pid) for p in m.processes.values()}
    m.reading.budget = {k: v for k, v in m.reading.budget.items() if k in writers}
    m.reading.dropped = {k: v for k, v in m.reading.dropped.items() if k in writers}
    watch = watches.get((own.get("host"), own.get("run_pid")))
    m.watch = {own["host"]: watch} if watch is not None else {}
    m.runs = [own]


def _cmd_of_runs(m: Model) -> None:
    """CMD of each `ncclprobe run` (run.json): run started it, with the command line and the environment
    it says, whether or not another witness saw it (a client that lived less than a scan, srun handing
    its job to slurmstepd, leaves nothing else of itself). What a witness saw of it stays."""
    for r in m.runs:
        pid, host, command = r.get("cmd_pid"), r.get("host"), r.get("command")
        if not isinstance(pid, int) or not isinstance(host, str) or not command:
            continue
        p = m.process(host, pid)
        p.sources.add("run")
        if p.ppid is None:
            p.ppid = r.get("run_pid")
        if not p.argv and not p.images:
            p.argv = redact_argv([str(a) for a in command])
        given = given_of(r)
        exec_ed = p.started_by is not None and p.started_by.exec  # it exec'd since, with an environment of its own
        if p.proc_exec_env is None and p.proc_env_reason is None and given is not None and not exec_ed:
            p.proc_exec_env = dict(given["env"])  # exactly what this run gave it (watched part)
            p.proc_env_source = "exec"


def _image_after_boot(p: ProcessView, argv: list[str] | None, exe: Any) -> None:
    """p exec'd argv after its boot probe's record, which is now an earlier image; its environment is the one
    it exec'd with (/proc's), not the boot probe's."""
    p.images.append(p.argv or [])
    p.argv, p.exe, p.exec_after_boot = argv, exe, True
    p.start_env = p.exec_env = None


def _exec_since_boot(p: ProcessView, exe: Any, start: Any, t: float | None) -> bool:
    """Whether a sighting shows the process running another program than the one its boot probe recorded:
    seen after that record with another executable (a fork of a Python driver that exec'd raylet). The same
    executable with another command line may be setproctitle, not an exec: that keeps the record."""
    if p.exec_after_boot or not isinstance(exe, str) or not p.exe or t < (p.t_start or t):
        return False
    # the boot probe names its interpreter as sys.executable (often a venv's symlink), /proc by its target;
    # another interpreter is the Python image's own re-exec, which writes its own start record
    if exe.rsplit("/", 1)[-1].startswith(("python", "pypy")) or exe == p.exe:
        return False
    return start is None or p.proc_start is None or abs(float(start) - p.proc_start) < 0.05


def _forget_live(p: ProcessView) -> None:
    p.live_readings = []
    p.live_env = p.live_t = p.live_since = p.live_reason = None
    p.sources.discard("live")


def _label_simulated(m: Model) -> None:
    """A communicator only the profiler saw runs on the same library copy as one the preload saw:
    carry over what that copy is (version, simulated)."""
    known = {c.lib: (c.version, c.simulated) for c in m.comms if c.lib and c.version}
    for c in m.comms:
        if c.lib in known and c.version is None:
            c.version, c.simulated = known[c.lib][0], c.simulated or known[c.lib][1]


def _add_coll(c: CommView, e: dict[str, Any]) -> None:
    """Merge one flush. A flush carries counts, bytes, GPU times and bins since the previous one for the
    same key (sizes min/max since the start)."""
    try:
        mode = e.get("mode") if e.get("mode") in ("eager", "captured", "replayed") else None
        size_log2 = e.get("size_log2") if type(e.get("size_log2")) is int else None
        key = (str(e.get("func")), canonical(str(e.get("algo"))), canonical(str(e.get("proto"))),
               int(e.get("nchannels") or 0), mode, size_log2)
        bmin, bmax, count = int(e.get("bytes_min", 0)), int(e.get("bytes_max", 0)), int(e.get("count", 0))
        bytes_sum = int(e.get("bytes_sum") or 0)
        gpu_count, gpu_ns, untimed = (int(e.get(k) or 0) for k in ("gpu_count", "gpu_ns", "untimed"))
        hist = [(int(b), int(n)) for b, n in (e.get("gpu_hist") or [])]
    except (TypeError, ValueError):
        return
    s = c.colls.get(key)
    if s is None:
        s = c.colls[key] = CollStat(*key[:4], bmin, bmax, 0, mode, size_log2)
    s.bytes_min, s.bytes_max, s.count = min(s.bytes_min, bmin), max(s.bytes_max, bmax), s.count + count
    s.bytes_sum += bytes_sum
    s.gpu_count, s.gpu_ns, s.untimed = s.gpu_count + gpu_count, s.gpu_ns + gpu_ns, s.untimed + untimed
    for b, n in hist:
        s.gpu_hist[b] = s.gpu_hist.get(b, 0) + n


def add_sightings(m: Model, sightings: list[Sighting]) -> Model:
    """Feed inspect's /proc sightings (witnesses/procsnap.sightings) into the model through _see, the
    /proc door; the in-process witnesses of the same pids stay."""
    m._knowledge = None  # what the rules knew of the model is stale now
    b = _Build(m)
    for s in sightings:
        _see(b, s)
    return m


def add_proc_view(m: Model, other: Model) -> Model:
    """The /proc witness of another model of the same job (a live inspect of it) joined into m: its
    sightings, replayed through _see."""
    m._knowledge = None  # what the rules knew of the model is stale now
    b = _Build(m)
    for s in other.sightings:
        _see(b, s)
    m.shell_pitfalls = [*m.shell_pitfalls, *other.shell_pitfalls]
    return m


def add_ras(m: Model, reading: RasReading, host: str, local: set[str]) -> int:
    """NCCL's RAS service's communicators (witnesses/ras.RasReading) into m: each rank a communicator of its
    process, joined by hash to one a probe recorded (the profiler's comm_hash is RAS's hash), else new. A
    rank on this host (its address one of `local`) is of `host`'s processes; another's keeps its address as
    its host. A new one has no environment at creation: where its process's environment is known now (the
    live read, else the exec-time block) that is its value, labelled as held now. Returns the ranks of
    processes in the model."""
    m._knowledge = None
    joined = 0
    by_hash = {(c.host, c.pid, c.comm_hash): c for c in m.comms if c.comm_hash}
    for rc in reading.comms:
        for k in rc.ranks:
            if k.pid is None:
                continue
            where = host if k.host in local or k.host is None else k.host
            word = {"status": dict(k.status), "collective_counts": dict(k.counts), "cuda_dev": k.cuda_dev,
                    "nvml_dev": k.nvml_dev, "secondary_hash": rc.secondary, "missing_ranks": rc.missing,
                    "t": reading.t}
            rates = reading.rates.get((rc.hash, k.rank, k.pid))
            if rates is not None:  # two readings (--ras-window): collectives per second between them
                word["per_s"], word["window_s"] = {f: round(v, 3) for f, v in rates.items()}, reading.window_s
            c = by_hash.get((where, k.pid, rc.hash))
            if c is None:
                p = m.processes.get((where, k.pid))
                env, source = None, None
                if p is not None and p.live_env is not None:
                    env, source = dict(p.live_env), "held now (live read; not at creation)"
                elif p is not None and p.proc_exec_env is not None:
                    env, source = dict(p.proc_exec_env), "held now (exec-time, /proc; not at creation)"
                c = CommView(where, k.pid, reading.t, comm_hash=rc.hash, rank=k.rank, nranks=rc.size, env=env,
                             env_source=source, dev=k.cuda_dev, version=version_code(reading.nccl_version))
                m.comms.append(c)
                by_hash[(where, k.pid, rc.hash)] = c
            c.seen_by.add("ras")
            c.ras = word
            p = m.process(where, k.pid)
            p.sources.add("ras")
            joined += "proc" in p.sources
    if reading.diagnostics is not None and reading.diagnostics.ok:
        _add_ras_env(m, reading.diagnostics)
    return joined


def _add_ras_env(m: Model, diag: RasDiagnostics) -> None:
    """NCCL's RAS diagnostics' NCCL_* mismatches (witnesses/rasdiag) onto every RAS-listed rank of their
    communicator: ras["env_diag"][var] = {"groups": [{value, ranks, total, cut}], "nranks", "t"}, the values
    each process held when the diagnostics ran (its environ then, not at the communicator's creation)."""
    ranks: dict[str, list[CommView]] = {}
    for c in m.comms:
        if c.ras is not None and c.comm_hash:
            ranks.setdefault(c.comm_hash, []).append(c)
    for mm in diag.env:
        entry = {"groups": [{"value": g.value, "ranks": list(g.ranks), "total": g.total, "cut": g.cut}
                            for g in mm.groups], "nranks": mm.nranks, "t": diag.t}
        for c in ranks.get(mm.comm, ()):
            c.ras.setdefault("env_diag", {})[mm.var] = entry
