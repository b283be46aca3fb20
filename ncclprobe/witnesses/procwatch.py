"""What a watch of a running tree sees in /proc: every process under a root (Python or not), read
once when first seen — ancestry, start time, command line, exe and the watched part of its exec-time
environment — and after that only its stat and children, to follow membership.

A process is known by pid and start time (pids are reused). Its environ is read once per image: an
exec keeps pid and start time but gives it a new stack, so a process whose arg/env addresses (stat
fields 48-51) changed since it was read has exec'ed and is read again. A child first seen with its
parent's addresses is a fork child that has not exec'ed (yet); one without env_end is inside execve
(or masked: stat shows those fields only with ptrace access). Either is recorded at the next walk as
it was, unless it exec'ed meanwhile: then once, as what it exec'ed.

A walk (every process of the tree: stat and children) costs some microseconds a process, more after
a pause (cold caches), so most scans do not walk: a new process takes a new pid, and /proc/loadavg's
last field is the most recent pid of this pid namespace (threads' too). A scan reads the stat of each
pid allocated since the scan before the last (the overlap catches a child whose pid was allocated a
moment before it was linked to its parent, so not yet in /proc) and takes those whose parent is in
the tree (threads have exit_signal -1); a process recorded less than YOUNG_S ago, or held back, has
its stat read too (a wrapper such as env or numactl execs at once). The tree is walked at the first
and the last scan, every WALK_EVERY_S (for later execs, which take no pid, and for what ended), when
more pids were allocated than RANGE_MAX, and at every scan once a walk finds a process the ranges
missed (loadavg not this namespace's: lxcfs). An idle tree costs one small read a scan.

Short-lived processes may be missed; those known to be missed are counted: a process first seen as a
zombie (it ran and ended between two scans), and what the caller reports (processes its subreaper
reaped, the command it started) that no scan saw running. With a `reaping` ledger (run's scan mode), each
stat read also gives the children a process reaped that no scan saw (witnesses/reaping.py).

The native reader (procread.Native.watch) reads a whole scan in one call; without it the same is read
from Python (procs.Reader), slower. Nothing outside the watched set (model.watched) ever leaves this
module: environments are reduced to it here, and `env_hash` is a keyed hash of the raw block (the key
is the caller's and never written), which tells processes that share a block (fork children) apart
from those that do not, and nothing about the values.
"""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import time
from dataclasses import dataclass

from ncclprobe.model import FORK_GONE
from ncclprobe.model.watched import is_watched, redact_argv
from ncclprobe.witnesses import procread, procs, shells
from ncclprobe.witnesses.reaping import Reaping

WALK_EVERY_S = 5.0  # an exec creates no pid: the tree is walked this often whatever the pids say
YOUNG_S = 1.0  # a process recorded this recently has its stat read at every scan: wrappers (env, numactl) exec at once
RANGE_MAX = 4096  # more new pids than this since the last scan: walking the tree is cheaper
_O_READ = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
_CACHE_MAX = 4096  # distinct environ blocks whose watched part is kept (by keyed hash)


@dataclass(frozen=True)
class Sighting:
    """One process as the watch first saw it (or again after an exec: `execs` > 0)."""
    pid: int
    ppid: int
    start_ticks: int
    start: float | None  # unix seconds
    argv: list[str]  # redacted (model.watched.redact_argv)
    exe: str | None
    exec_env: dict[str, str] | None  # the watched part; None: unreadable, see env_reason
    env_reason: str | None
    env_hash: str | None  # keyed hash of the raw block; None where it was not read
    execs: int = 0
    t: float = 0.0  # when it was read (unix seconds, the read's start): a fork child held back until the
    # next scan (will it exec?) is written later, and what it was, was so at the read, not at the writing
    ns_pid: int | None = None  # in a pid namespace other than the watch's: its pid in there (NSpid's last)
    pidns: int | None = None   # and that namespace's inode
    cwd: str | None = None     # its working directory (a relative script path resolves against it)
    script: str | None = None  # a shell's script, as its fd 255 names it (shells.script_path)

    def fields(self) -> dict:
        """The proc_seen event's own fields (witnesses/events.py); the identity ones are common fields."""
        out = {"ppid": self.ppid, "start": self.start, "argv": self.argv, "exe": self.exe,
               "exec_env": self.exec_env, "env_reason": self.env_reason, "env_hash": self.env_hash,
               "execs": self.execs}
        if self.pidns is not None:
            out["ns_pid"], out["pidns"] = self.ns_pid, self.pidns
        out.update({k: v for k, v in (("cwd", self.cwd), ("script", self.script)) if v is not None})
        return out


@dataclass
class _Raw:
    """What one scan read of one process: its stat, and for a full read its values."""
    pid: int
    ppid: int
    state: str
    start_ticks: int
    span: tuple[int, int, int, int]
    full: bool
    cmdline: bytes | OSError = b""
    exe: str | None = None
    environ: bytes | OSError | None = None  # None: not read (a known process)
    t: float = 0.0  # the read's start (unix seconds)


class Scanner:
    """The tree under `root` (itself left out, as are `exclude` and all under them), scanned on
    request. `extra_roots`: also follow processes seen before that are no longer under root (without
    a child subreaper, an orphan goes to init)."""

    def __init__(self, root: int, key: bytes, proc_root: str = "/proc", exclude: frozenset[int] = frozenset(),
                 extra_roots: bool = False, native: procread.Native | None | bool = True,
                 reaping: Reaping | None = None):
        self.root, self.key, self.proc_root = root, key, str(proc_root)
        self.reaping = reaping
        self.exclude = frozenset(exclude)
        self.extra_roots = extra_roots
        self.native = procread.watcher() if native is True else (native or None)
        self.fs = procs.ProcFS(procs.Path(proc_root))
        self.clk_tck = self.fs.clock_ticks()
        # the boot epoch to the ms (CLOCK_BOOTTIME is what stat's starttime counts; btime is whole seconds)
        self.boot = _boot_epoch()
        self.known: dict[int, tuple[int, tuple, int]] = {}  # pid -> (start ticks, env span, execs) of what runs
        self.seen: set[tuple[int, int]] = set()  # (pid, start ticks) recorded running
        self.zombies: set[tuple[int, int]] = set()  # first seen as a zombie: ran, never seen running
        self.pending: dict[int, tuple[int, Sighting]] = {}  # fork children not exec'ed yet, held one walk
        self.young: dict[int, float] = {}  # pid -> until when its stat is read at every scan (execs)
        self.scans = self.walks = 0
        self._last_pid: int | None = None  # loadavg's last pid at the last scan, and at the one before
        self._prev_pid: int | None = None
        self._done: set[int] = set()  # pids of the last range that were read (others are read again)
        self._root_span: tuple = ()
        self._next_walk = 0.0
        self._pid_hint = True  # /proc/loadavg's last pid is trusted until a walk finds it stale
        self._envs: dict[str, tuple[dict[str, str] | None, str | None]] = {}
        self.pidns = procs.pidns_of(self.proc_root)  # the watch's own: a process in another is said so
        self.vanished: set[int] = set()  # exec'ed (the kernel said so) and gone before they could be read

    @property
    def reader(self) -> str:
        return "native" if self.native is not None else "python"

    def scan(self, final: bool = False) -> list[Sighting]:
        """The processes new since the last scan (and those that exec'ed), each once; `final`: walk
        the tree whatever the pids say, and record what is held back (fork children)."""
        self.scans += 1
        last, now = self._loadavg_pid(), time.monotonic()
        lo = self._prev_pid
        self._prev_pid, self._last_pid = self._last_pid, last
        ranged = (not final and now < self._next_walk and self._pid_hint and last is not None and lo is not None
                  and lo <= last and last - lo <= RANGE_MAX)
        if ranged:
            found = self._range(lo, last)
        else:
            self._next_walk = now + WALK_EVERY_S
            self.walks += 1
            found, new = self._walk()
            if (self.walks > 1 and last is not None and lo is not None and lo <= last
                    and any(pid <= lo for pid in new)):
                self._pid_hint = False  # a process the ranges missed: loadavg is not this namespace's (lxcfs)
            self._done = set()
        if final:
            for pid in list(self.pending):
                self._flush(pid, found)
        return found

    def start_of(self, pid: int) -> float | None:
        """The start (unix seconds) of the recorded process that has this pid now; None: none is."""
        known = self.known.get(pid)
        if known is None or (pid, known[0]) not in self.seen or self.boot is None:
            return None
        return round(self.boot + known[0] / self.clk_tck, 3)

    def take_exec(self, pid: int) -> Sighting | None:
        """A process of the tree read at its execve (the kernel's exec event), ahead of the scans, which
        then know it: its sighting, as what it exec'ed; None where this image was recorded already, or where
        it was gone before the read (kept in `vanished`: known to have run, never read)."""
        r = next((r for r in self._read([pid], set(self.known) - {pid}) if r.pid == pid), None)
        if r is None or not r.full or r.state in ("Z", "X"):
            self.vanished.add(pid)
            return None
        known = self.known.get(pid)
        same = known is not None and known[0] == r.start_ticks
        if same and known[1] == r.span:
            return None
        execs = known[2] + 1 if same and pid not in self.pending and (pid, r.start_ticks) in self.seen else 0
        self.pending.pop(pid, None)  # a fork child that exec'ed: its first record is what it exec'ed
        self.known[pid] = (r.start_ticks, r.span, execs)
        self.seen.add((pid, r.start_ticks))
        self.vanished.discard(pid)
        self.young[pid] = time.monotonic() + YOUNG_S
        return self._sighting(r, execs)

    def missed(self, reaped=(), started=(), kernel: bool = False) -> list[int]:
        """Pids known to have run that no scan saw running: first seen as zombies, `reaped`
        ((pid, start ticks) the caller's subreaper reaped) and `started` (pids the caller started)
        never seen. kernel: every exec of the tree came as the kernel's event (none lost) and was read at
        once (take_exec) or kept in `vanished`: then a zombie or a reaped orphan no read saw never exec'd,
        and a fork that exec'd nothing runs its parent's program with its parent's block (a subshell, a
        fork child whose own probes speak for it): no process that was missed."""
        seen_pids = {pid for pid, _ in self.seen}
        out = {(pid, -1) for pid in [*started, *self.vanished] if pid not in seen_pids}
        if not kernel:
            out |= {k for k in self.zombies if k not in self.seen}
            out |= {k for k in reaped if tuple(k) not in self.seen}
        return sorted({pid for pid, _ in out})

    # -- the pids allocated since ------------------------------------------------------------
    def _range(self, lo: int, hi: int) -> list[Sighting]:
        """The new processes among the pids in (lo, hi], and the fork children held back. A pid of the
        last scan's range that was a thread or taken is not read again; one that was not there, or
        whose parent was not in the tree (yet: its parent was not in /proc yet), is."""
        found: list[Sighting] = []
        done, fresh, t0 = set(), {}, time.monotonic()
        for pid in range(lo + 1, hi + 1):
            if pid in self._done:
                continue
            st = self._stat(pid)
            if st is None:
                continue  # gone, or not in /proc yet
            if st[3] == -1:
                done.add(pid)  # a thread (CLONE_THREAD: no exit signal)
                continue
            known = self.known.get(pid)
            if known is not None:
                if known[0] == st[1]:
                    done.add(pid)
                    continue
                del self.known[pid]  # that pid is another process's now: the one known is gone
            fresh[pid] = st
        members, new, looked, gone = {self.root, *self.known}, [], {}, set()
        grew = True
        while grew:  # a child's parent may be new too
            grew = False
            for pid in [p for p, st in fresh.items() if st[0] in members]:
                members.add(pid)
                new.append(pid)
                looked[pid] = fresh.pop(pid)
                grew = True
        self._done = done | set(new)
        again, now = [], time.monotonic()
        for pid in list(self.pending) + [p for p in self.young if p not in self.pending]:
            known, st = self.known.get(pid), self._stat(pid)
            if known is None or st is None or st[1] != known[0]:
                self._flush(pid, found, gone=True)  # gone: recorded as it was
                self.young.pop(pid, None)
                gone |= {(pid, known[0])} if known is not None else set()
                continue
            looked[pid] = st
            if st[4] == known[1]:
                self._flush(pid, found)  # still its parent's image after a scan: a fork child, as it was
                if self.young.get(pid, 0) < now:
                    self.young.pop(pid, None)
            elif st[4][3]:
                again.append(pid)  # exec'ed (and through execve): recorded as what it exec'ed
        if new or again:
            spans = {p: k[1] for p, k in self.known.items()}
            spans[self.root] = self._root_span
            take = set(new) | set(again)
            raws = self._read(sorted(take), set(self.known) - take)
            spans.update((r.pid, r.span) for r in raws)
            for r in raws:
                if r.full and (r.pid in take or r.ppid in members):
                    members.add(r.pid)
                    self._take(r, self.known.get(r.pid), self.known, found, spans)
        self._reaped_kids(t0, looked, gone)
        return found

    def _reaped_kids(self, t0: float, stats: dict[int, tuple | None], gone=(),
                     read: tuple[float, dict[int, int]] | None = None) -> None:
        """What the stat reads begun at t0 (pid -> _stat) of processes of the tree say of the children each reaped,
        to the reaping ledger; `gone`: (pid, start ticks) of those found ended since; `read`: (when, pid -> ppid)
        of the walk that took them, whose children gone before these stat reads were seen all the same."""
        if self.reaping is None:
            return
        procs, ended = {}, {}
        for pid, st in stats.items():
            known = self.known.get(pid)
            if st is None and known is not None and read is not None and pid in read[1]:
                parent = self.known.get(read[1][pid])
                if parent is not None:  # read by the walk, gone before its stat read: a child seen
                    ended[(pid, known[0])] = ((read[1][pid], parent[0]), read[0])
                continue
            if st is None or known is None or known[0] != st[1]:
                continue  # gone meanwhile, or not taken into the tree
            parent = self.known.get(st[0])
            procs[(pid, st[1])] = ((st[0], parent[0]) if parent is not None else None, st[5])
        self.reaping.look(t0, time.monotonic(), procs, gone, ended)

    def _stat(self, pid: int) -> tuple[int, int, str, int, tuple, int] | None:
        """(ppid, start ticks, state, exit signal, arg/env span, cminflt) of a pid, or None if it is not there."""
        try:
            fd = os.open(f"{self.proc_root}/{pid}/stat", _O_READ)
        except OSError:
            return None
        try:
            raw = os.read(fd, 4096)
        except OSError:
            return None
        finally:
            os.close(fd)
        f = raw.rpartition(b")")[2].split()  # f[0] is field 3 (state), proc(5)
        try:
            span = (int(f[45]), int(f[46]), int(f[47]), int(f[48])) if len(f) >= 49 else (0, 0, 0, 0)
            return int(f[1]), int(f[19]), f[0].decode("ascii", "replace"), int(f[35]), span, int(f[8])
        except (IndexError, ValueError):
            return None

    # -- the walk ------------------------------------------------------------------------------
    def _walk(self) -> tuple[list[Sighting], list[int]]:
        """What this walk found to record, and the pids of the processes new to it."""
        roots = [self.root] + ([p for p in self.known] if self.extra_roots else [])
        begun = time.monotonic()
        raws = self._read(roots, {*self.known, self.root})  # the root itself: only its children
        members, alive, found, again, spans, new, ppids = {self.root}, {}, [], [], {}, [], {}
        for r in raws:
            spans[r.pid] = r.span
            ppids[r.pid] = r.ppid
            known = self.known.get(r.pid)
            if r.pid == self.root:
                self._root_span = r.span
                continue
            if r.ppid not in members and not (known is not None and known[0] == r.start_ticks):
                continue  # not under the root (an extra root whose pid was reused)
            members.add(r.pid)
            if not r.full:  # a process known before: stat only
                if known is None or known[0] != r.start_ticks:
                    again.append(r.pid)  # its pid is another process's now
                elif r.span == known[1]:
                    alive[r.pid] = known
                    self._flush(r.pid, found)  # a fork child that stayed as it was
                elif r.span[3]:
                    again.append(r.pid)  # it exec'ed, and is through execve (its new stack is set up)
                else:
                    alive[r.pid] = known  # inside execve: read once it is through
                continue
            if self._take(r, None, alive, found, spans):
                new.append(r.pid)
        if again:  # read in full what only a stat showed to be new (its subtree is read as known)
            ours = set(again)
            for r in self._read(again, set(alive)):
                spans[r.pid] = r.span
                ppids[r.pid] = r.ppid
                if (r.pid in ours or r.ppid in members) and r.full:
                    members.add(r.pid)
                    if self._take(r, self.known.get(r.pid), alive, found, spans):
                        new.append(r.pid)
        for pid in [p for p in self.pending if p not in alive]:
            self._flush(pid, found, gone=True)  # gone: recorded as it was seen
        now = time.monotonic()
        self.young = {p: t for p, t in self.young.items() if p in alive and t >= now}
        gone = {(p, k[0]) for p, k in self.known.items()} - {(p, k[0]) for p, k in alive.items()}
        self.known = alive
        self._reaped_kids(now, {pid: self._stat(pid) for pid in alive} if self.reaping is not None else {}, gone,
                          (begun, ppids))
        return found, new

    def _take(self, r: _Raw, known, alive: dict, found: list, spans: dict) -> int:
        """Record a process read in full (held back if it is a fork child not exec'ed yet: one that
        execs before the next walk is recorded once, as what it exec'ed); 1 if it is new."""
        key = (r.pid, r.start_ticks)
        same = known is not None and known[0] == r.start_ticks  # read again: it exec'ed
        held = self.pending.get(r.pid)
        if held is not None and held[0] != r.start_ticks:
            self._flush(r.pid, found, gone=True)  # that pid is another process's now
            held = None
        if r.state in ("Z", "X"):
            if held is not None:
                self._flush(r.pid, found, gone=True)
            elif key not in self.seen:
                self.zombies.add(key)  # ran and ended between two scans
            alive[r.pid] = (r.start_ticks, r.span, 0)  # stat only until it is reaped
            return int(not same)
        if same and known[1] == r.span:
            alive[r.pid] = known  # the same image after all
            return 0
        execs = known[2] + 1 if same and held is None else 0
        self.pending.pop(r.pid, None)  # a fork child that exec'ed: its first record is what it exec'ed
        alive[r.pid] = (r.start_ticks, r.span, execs)
        self.seen.add(key)
        sighting = self._sighting(r, execs)
        self.young[r.pid] = time.monotonic() + YOUNG_S
        if not same and (not r.span[3] or spans.get(r.ppid) == r.span):
            # its parent's image still (a fork child: will it exec?), or no environment yet (inside
            # execve: the ELF loader sets env_end last; or masked): recorded at the next walk
            self.pending[r.pid] = (r.start_ticks, sighting)
        else:
            found.append(sighting)
        return int(not same)

    def _flush(self, pid: int, found: list, gone: bool = False) -> None:
        """Record a fork child held back, as it was; `gone`: it ended before a second look, so whether it exec'd
        meanwhile, and what, no read saw (FORK_GONE)."""
        held = self.pending.pop(pid, None)
        if held is None:
            return
        if held[1].ppid == self.root:  # the root's own fork before it exec'd (run's child before CMD's
            self.seen.discard((pid, held[0]))  # execve): the root's image, no process of the tree; unseen
            return
        found.append(dataclasses.replace(held[1], env_reason=FORK_GONE) if gone else held[1])

    def _sighting(self, r: _Raw, execs: int) -> Sighting:
        env, reason, digest = self._environ(r)
        argv = [] if isinstance(r.cmdline, OSError) else _argv(r.cmdline)
        ns = procs.pidns_of(self.proc_root, r.pid) if self.pidns is not None else None
        ns_pid = procs.ns_pid_of(self.fs.reader, self.proc_root, r.pid) if ns not in (None, self.pidns) else None
        cwd, script = shells.cwd_and_script(self.fs.reader, f"{self.proc_root}/{r.pid}", argv)
        return Sighting(r.pid, r.ppid, r.start_ticks,
                        None if self.boot is None else round(self.boot + r.start_ticks / self.clk_tck, 3),
                        redact_argv(argv), r.exe, env, reason, digest, execs, r.t,
                        ns_pid, ns if ns_pid is not None else None, cwd, script)

    def _environ(self, r: _Raw) -> tuple[dict[str, str] | None, str | None, str | None]:
        raw = r.environ
        if isinstance(raw, OSError) or raw is None:
            return None, procs.reason_of(raw) if raw is not None else "not read", None
        if not raw:  # env_start == env_end: exec'ed with none at all (env -i); else its mm is going
            if r.span[3] > r.span[2]:
                return None, "vanished", None
            if not r.span[3] and r.span[0]:
                return None, "inside execve", None  # its new stack has no environment yet
            return {}, None, self._hash(raw)
        digest = self._hash(raw)
        hit = self._envs.get(digest)
        if hit is None:
            if len(self._envs) >= _CACHE_MAX:
                self._envs.clear()
            hit = self._envs[digest] = _watched(raw)
        return hit[0], hit[1], digest

    def _hash(self, raw: bytes) -> str:
        return hashlib.blake2b(raw, digest_size=8, key=self.key).hexdigest()

    # -- reading -------------------------------------------------------------------------------
    def _read(self, roots: list[int], known: set[int]) -> list[_Raw]:
        t = time.time()
        raws = None
        if self.native is not None:
            try:
                raws = self._read_native(roots, known)
            except (OSError, MemoryError):
                pass  # a file of more than a GiB, out of memory: the Python reads below
        if raws is None:
            raws = self._read_python(roots, known)
        for r in raws:
            r.t = t
        return raws

    def _read_native(self, roots: list[int], known: set[int]) -> list[_Raw]:
        P = procread
        flat, fresh = self.native.watch(self.proc_root, roots, self.exclude, list(known))
        out = []
        k_cmd, k_exe, k_env = (P.O_KINDS + 4 * P.KINDS.index(k) for k in ("cmdline", "exe", "environ"))
        for i in range(0, len(flat), P.PR_OUT):
            role = flat[i + P.O_ROLE]
            if role == P.R_EXCLUDED or flat[i + P.O_ERR]:
                continue
            j = i + P.O_SPAN
            r = _Raw(flat[i + P.O_PID], flat[i + P.O_PPID], chr(flat[i + P.O_STATE]), flat[i + P.O_START],
                     (flat[j], flat[j + 1], flat[j + 2], flat[j + 3]), role == P.R_TREE)
            if r.full:
                r.cmdline = _value(flat, fresh, i + k_cmd, P.KINDS.index("cmdline"), r.pid)
                exe = _value(flat, fresh, i + k_exe, P.KINDS.index("exe"), r.pid)
                r.exe = None if isinstance(exe, OSError) else os.fsdecode(exe)
                r.environ = _value(flat, fresh, i + k_env, P.KINDS.index("environ"), r.pid)
            out.append(r)
        return out

    def _read_python(self, roots: list[int], known: set[int]) -> list[_Raw]:
        """The native walk's order and reads, from Python."""
        fs, reader, out, done = self.fs, self.fs.reader, [], set()
        stack = list(reversed(roots))
        while stack:
            pid = stack.pop()
            if pid in done:
                continue
            done.add(pid)
            if pid in self.exclude and pid not in roots:
                continue
            try:
                st = fs.stat(pid)
            except OSError:
                continue
            r = _Raw(pid, st.ppid, st.state, st.start_ticks, st.env_span, pid not in known)
            base = fs.path(pid)
            if r.full:
                try:
                    r.cmdline = reader.read_bytes(base + "/cmdline")
                except OSError as exc:
                    r.cmdline = exc
                try:
                    r.exe = reader.readlink(base + "/exe")
                except OSError:
                    r.exe = None
                if st.state in ("Z", "X") or st.flags & procs.PF_KTHREAD:
                    r.environ = OSError(errno.ESRCH, "no mm")
                else:
                    try:
                        r.environ = reader.read_bytes(base + "/environ")
                    except OSError as exc:
                        r.environ = exc
            out.append(r)
            try:
                kids = procs.children_of(fs, st)
            except (OSError, ValueError):
                continue
            stack.extend(sorted(kids, reverse=True))
        return out

    def _loadavg_pid(self) -> int | None:
        try:
            return int(self.fs.reader.read_bytes(self.proc_root + "/loadavg").rsplit(None, 1)[-1])
        except (OSError, IndexError, ValueError):
            return None


def _value(flat: list[int], fresh: dict, slot: int, kind: int, pid: int) -> bytes | OSError:
    """One value of a native read: its bytes (shared by number within the call), or the error."""
    err = flat[slot]
    if err:
        return OSError(err, os.strerror(err), pid)
    return fresh.get((kind, flat[slot + 1]), b"")


def _argv(raw: bytes) -> list[str]:
    args = raw[:-1] if raw.endswith(b"\0") else raw
    return [procs.decode(a) for a in args.split(b"\0")] if args else []


def _watched(raw: bytes) -> tuple[dict[str, str] | None, str | None]:
    """The watched part of a raw environ block, and why it is not the whole story where it is not:
    setproctitle writes over the block (its head zeroed, entries cut): "partly overwritten", or
    nothing left: "clobbered"."""
    env: dict[str, str] = {}
    entries = garbled = 0
    for entry in raw.split(b"\0"):
        if not entry:
            continue
        entries += 1
        name, eq, value = entry.partition(b"=")
        if not eq or not name:
            garbled += 1
            continue
        key = procs.decode(name)
        if is_watched(key) and key not in env:  # getenv returns the first match
            env[key] = procs.decode(value)
    if entries == garbled:
        return None, "clobbered"
    return env, "partly overwritten" if garbled or raw.startswith(b"\0") else None


def _boot_epoch() -> float | None:
    try:
        return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return None
