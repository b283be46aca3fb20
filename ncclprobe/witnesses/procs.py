"""Reading processes from /proc: the tree under a PID and, per process, stat/status/cmdline/environ/
maps/fds/root. The proc root and the file reader are parameters, so tests run on a fake /proc and
inject permission errors (CI runs as root, where chmod proves nothing). With the plain reader, a tree
is read by the native reader (procread) in one call, and the Python reads below are the fallback.

Missing data is a value: an unreadable environ is `env=None, env_reason="permission"`, a process that
exits mid-walk is dropped from the tree and listed in `ProcTree.skipped` with its reason.
"""
from __future__ import annotations

import copy
import errno
import os
import re
import time
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from ncclprobe.witnesses import procread

DEFAULT_PROC = Path("/proc")
PF_KTHREAD = 0x00200000  # include/linux/sched.h: kernel threads have no mm, so no environ
_NVIDIA_DEV = re.compile(r"^/dev/nvidia(\d+)$")
_O_READ = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO in a fake /proc never blocks
# Files whose read returns everything asked for up to the end: stat and status (single_open seq_file,
# one record), cmdline and environ (fs/proc/base.c get_mm_cmdline / environ_read loop until done).
# Multi-record seq_files (maps, children) stop at a page and need reading to 0.
_ONE_CALL = ("/stat", "/status", "/cmdline", "/environ")
# What one file may hold before it is refused with EFBIG (native/procread.c keeps the same caps): stat
# and status are one short record; cmdline and environ are at most ARG_MAX at exec (6 MiB since Linux
# 4.13) unless rewritten through prctl(PR_SET_MM); maps rows are bounded by vm.max_map_count. A fake
# or hostile file can claim any size (a sparse one): the cap bounds the time and memory it costs.
MAX_RECORD = 1 << 20  # (/proc/stat itself, read for btime, holds a line per CPU and per IRQ)
MAX_FILE = 32 << 20
MAX_ROWS = 65536  # maps rows kept (executable or shared file mappings): no process maps that many files
_RECORDS = ("/stat", "/status")


class Reader:
    """The only place that touches the proc filesystem; tests subclass it to inject failures."""

    def read_bytes(self, path: Path | str) -> bytes:
        """The file's bytes; OSError(EFBIG) past MAX_FILE (MAX_RECORD for stat and status)."""
        # os.open/os.read, not open(): no file object and no fstat per file (this is the hot path)
        fd = os.open(path, _O_READ)
        try:
            chunk = os.read(fd, 1 << 16)
            if not chunk or (len(chunk) < 1 << 16 and str(path).endswith(_ONE_CALL)):
                return chunk  # the kernel fills these in one call: a shorter read is the end
            chunks, size = [chunk], len(chunk)
            cap = MAX_RECORD if str(path).endswith(_RECORDS) else MAX_FILE
            while True:
                chunk = os.read(fd, 1 << 16)
                if not chunk:  # maps and children stop at a page before the end: read to 0
                    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
                size += len(chunk)
                if size > cap:
                    raise OSError(errno.EFBIG, os.strerror(errno.EFBIG), str(path))  # as the native reader says it
                chunks.append(chunk)
        finally:
            os.close(fd)

    def readlink(self, path: Path) -> str:
        return os.readlink(path)

    def owner(self, path: Path | str) -> int:
        return os.stat(path).st_uid

    def listdir(self, path: Path) -> list[str]:
        return os.listdir(path)

    def maps_key(self, path: Path | str) -> bytes:
        """The maps file as normalise_maps gives it."""
        return normalise_maps(self.read_bytes(path))


def reason_of(exc: OSError) -> str:
    """What an OSError from /proc/<pid>/... means for that process."""
    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM):
        return "permission"
    if isinstance(exc, (FileNotFoundError, ProcessLookupError)) or exc.errno in (errno.ENOENT, errno.ESRCH):
        return "vanished"
    return f"error: {exc.strerror or exc}"


def decode(raw: bytes) -> str:
    """Non-UTF-8 bytes are shown escaped (\\xNN), never dropped and never an exception."""
    return raw.decode("utf-8", errors="backslashreplace")


@dataclass(frozen=True)
class Stat:
    pid: int
    comm: str
    state: str
    ppid: int
    flags: int
    start_ticks: int
    env_span: tuple[int, int, int, int]  # arg_start, arg_end, env_start, env_end (0s if masked)
    threads: int = 1
    child_faults: int = 0  # cminflt: minor faults of the children it reaped (witnesses/reaping.py)


_new = object.__new__
_setattr = object.__setattr__


def parse_stat(raw: bytes) -> Stat:
    """The fields procs uses; a line that is not a stat line (a fake /proc's) raises OSError(EINVAL),
    as an unreadable one would."""
    head, _, tail = raw.rpartition(b")")  # comm may contain spaces and ')'
    pid_s, _, comm_b = head.partition(b" (")
    comm = comm_b.decode("utf-8", "backslashreplace")  # ' (' and ')' never occur inside a UTF-8 sequence
    f = tail.split()
    # f[0] is field 3 (state); proc(5) numbers fields from 1.
    try:
        if max(len(pid_s), len(f[1]), len(f[6]), len(f[17]), len(f[19])) > 20:  # the kernel prints 64-bit numbers
            raise ValueError("not a stat field")
        span = (int(f[45]), int(f[46]), int(f[47]), int(f[48])) if len(f) >= 49 else (0, 0, 0, 0)  # fields 48-51
        fields = {"pid": int(pid_s), "comm": comm, "state": f[0].decode("utf-8", "backslashreplace"),
                  "ppid": int(f[1]), "flags": int(f[6]), "start_ticks": int(f[19]), "env_span": span,
                  "threads": int(f[17]), "child_faults": int(f[8])}
    except (IndexError, ValueError):
        raise OSError(errno.EINVAL, "not a stat line") from None
    st = _new(Stat)  # the frozen dataclass's __init__ sets each field through object.__setattr__
    _setattr(st, "__dict__", fields)
    return st


@dataclass(frozen=True)
class Mapping:
    path: str
    dev: str
    inode: int
    executable: bool
    deleted: bool


# address perms offset dev inode [padding] path; file-backed rows have an inode and a path from '/'
# (a kernel path never holds a NUL; an inode is a 64-bit number: native/procread.c filters the same)
_MAPS_ROW = re.compile(rb"^\S+ (\S{4}) \S+ (\S+) (\d{1,20}) +(/[^\n\0]*)$", re.M)
_NORMAL_ROW = re.compile(rb"^(\S{4}) (\S+) (\d{1,20}) (/[^\n\0]*)$", re.M)


def normalise_maps(raw: bytes) -> bytes:
    """The rows of a maps file that inspect looks at (file mappings that are executable: libraries, or
    shared: GPU device nodes) as sorted `perms dev inode path` lines. The address range and offset
    differ between processes that map the same files (ASLR), so does the order of the libraries, and
    the padding before the path follows the address width: what is left is a cache key
    (native/procread.c does the same, or asks the kernel for just those rows). OSError(EFBIG) past
    MAX_ROWS rows."""
    rows = {b"%s %s %s %s\n" % row for row in _MAPS_ROW.findall(raw)
            if row[2] != b"0" and (row[0][2:3] == b"x" or row[0][3:4] == b"s")}
    if len(rows) > MAX_ROWS:
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))  # more rows than any process maps (as native)
    return b"".join(sorted(rows))


def parse_maps(raw: bytes) -> list[Mapping]:
    """The executable and shared file mappings, one per (path, inode), executable if any of its
    mappings is."""
    return parse_rows(normalise_maps(raw))


def parse_rows(rows: bytes, memo: dict[tuple, Mapping] | None = None) -> list[Mapping]:
    """The mappings of normalise_maps's rows, in path order; memo (kept by the caller) shares Mapping
    objects between parses of different rows (processes that map some of the same files)."""
    seen: dict[tuple[bytes, bytes], list] = {}
    for perms, dev, inode, path in _NORMAL_ROW.findall(rows):
        entry = seen.get((path, inode))
        if entry is None:
            seen[(path, inode)] = [dev, b"x" in perms]
        elif not entry[1] and b"x" in perms:
            entry[1] = True
    out = []
    for (path_b, inode), (dev, exe) in sorted(seen.items()):  # by path: the order of the rows is not kept
        m = memo.get((path_b, inode, dev, exe)) if memo is not None else None
        if m is None:
            path = decode(path_b)
            deleted = path.endswith(" (deleted)")
            if deleted:
                path = path[: -len(" (deleted)")]
            m = Mapping(path, decode(dev), int(inode), exe, deleted)
            if memo is not None:
                memo[(path_b, inode, dev, exe)] = m
        out.append(m)
    return out


@dataclass(frozen=True)
class EnvBlock:
    env: dict[str, str] | None
    source: str  # exec | unreadable | empty
    reason: str | None  # permission, vanished, hidepid, zombie, kernel thread, clobbered, ...
    size: int  # bytes of the block
    garbled: int  # entries without '=' (a title written over the block)
    raw_hash: int | None  # to compare blocks across processes without keeping them
    # Only part of the block is intact (a title or NULs over its head): env holds that part, and a
    # variable not in it is unknown, not absent (lookup)
    partial: bool = False

    def lookup(self, var: str) -> tuple[bool, str | None]:
        """(known, value) of var at exec: unknown where the block is unreadable, clobbered, or only
        partly intact and var is not in the intact part."""
        if self.env is None or self.source != "exec":
            return False, None
        if var in self.env:
            return True, self.env[var]
        return (not self.partial), None


def zeroed_head(raw: bytes) -> bool:
    """Whether NULs were written over part of the block: an exec-time block is NUL-terminated strings,
    none empty, so a leading NUL or two NULs in a row is a hole. setproctitle takes over the block up
    to the first variable no longer at its exec-time place (the process changed it before the title
    was set), zeroes that head and leaves the tail as it was (Ray's agents: ~1.6 KB of NULs)."""
    return raw[:1] == b"\0" or raw.find(b"\0\0", 0, len(raw) - 1) >= 0


def parse_environ(raw: bytes) -> tuple[dict[str, str], int]:
    env: dict[str, str] = {}
    garbled = 0
    for entry in decode(raw).split("\0"):  # one decode for the block: this is the hot path
        if not entry:
            continue
        name, eq, value = entry.partition("=")
        if not eq or not name:
            garbled += 1
            continue
        if name not in env:  # getenv returns the first match
            env[name] = value
    return env, garbled


@dataclass
class Proc:
    pid: int
    ppid: int
    name: str
    state: str
    uid: int | None
    start_ticks: int
    flags: int
    env_span: tuple[int, int, int, int]
    cmdline: list[str] = field(default_factory=list)
    cmdline_reason: str | None = None
    exe: str | None = None
    env: EnvBlock | None = None
    maps: list[Mapping] | None = None
    maps_reason: str | None = None
    root: str | None = None  # read lazily (ProcFS.resolve_root)
    root_reason: str | None = None
    same_mnt_ns: bool = True
    cwd: str | None = None  # read lazily (ProcFS.cwd_of)
    notes: list[str] = field(default_factory=list)
    cwd_read: bool = False

    @property
    def kernel_thread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)


# every field of a Proc that has a plain default (ProcFS.load gives the others)
_PROC_DEFAULTS = {f.name: f.default for f in fields(Proc) if f.default is not MISSING}


class ProcFS:
    """One view of a proc filesystem (a real /proc or a fake one under a test's tmp_path)."""

    def __init__(self, proc_root: Path = DEFAULT_PROC, reader: Reader | None = None):
        self.root = Path(proc_root)
        self._root_s = str(self.root)
        self.reader = reader or Reader()
        self._self_mnt: str | None = None
        # Parsed environ blocks and maps, shared by the processes of a tree that have the same ones
        # (exec'ed siblings have the same block; their maps differ only in addresses).
        self._environs: dict[bytes, EnvBlock] = {}
        self._maps: dict[bytes, list[Mapping]] = {}
        self._mappings: dict[tuple, Mapping] = {}
        self._cmdlines: dict[bytes, list[str]] = {}  # likewise their command lines (never modified)
        # The native reader reads a whole tree in one call, each distinct value parsed once (in place
        # of the plain Reader only: a test's reader that injects failures is used as it is);
        # native_tree keeps what it read of each process until load.
        self._native = procread.native() if type(self.reader) is Reader else None
        self._snaps: dict[int, list] = {}

    def path(self, pid: int | str, *rest: str) -> str:
        return "/".join((self._root_s, str(pid), *rest))  # str, not Path: this is the hot path

    # -- system-wide ---------------------------------------------------------------------------
    def pids(self) -> list[int]:
        return [int(n) for n in self.reader.listdir(self.root) if n.isdigit()]

    def boot_time(self) -> float | None:
        """When the machine booted, in unix seconds: for the real /proc from CLOCK_BOOTTIME (to the
        microsecond; /proc/stat's btime is whole seconds, up to 1 s off, more than a start time needs
        to order a parent's write and a child's start), else from the root's stat file."""
        if Path(self.root) == DEFAULT_PROC:
            try:
                return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
            except (AttributeError, OSError):
                pass
        try:
            for line in self.reader.read_bytes(self.root / "stat").split(b"\n"):
                if line.startswith(b"btime "):
                    return float(line.split()[1])
        except OSError:
            return None
        return None

    def clock_ticks(self) -> int:
        try:
            return os.sysconf("SC_CLK_TCK")
        except (ValueError, OSError):
            return 100

    def self_mnt_ns(self) -> str | None:
        if self._self_mnt is None:
            try:
                self._self_mnt = self.reader.readlink(self.root / "self" / "ns" / "mnt")
            except OSError:
                self._self_mnt = ""
        return self._self_mnt or None

    # -- per process ---------------------------------------------------------------------------
    def stat(self, pid: int) -> Stat:
        return parse_stat(self.reader.read_bytes(f"{self._root_s}/{pid}/stat"))

    def native_tree(self, roots: list[int], exclude: frozenset[int] = frozenset()) -> NativeTree | None:
        """The tree under the roots as walk lists it, read with the native reader, which reads all
        that load will want of each process in the same pass, and its roots' ancestors (kept for
        load: the processes it could make whole, else what it read and their stat). None without
        the native reader."""
        if self._native is None:
            return None
        P = procread
        try:
            flat, fresh = self._native.tree(self._root_s, roots, exclude)
        except (OSError, MemoryError):
            return None  # out of memory, or a /proc file of more than a GiB: the Python reader reads it
        parsers = (decode, self._argv, os.fsdecode, self._native_block, self._rows_maps, os.fsdecode, os.fsdecode)
        values: list[dict[int, object]] = [{} for _ in range(P.CHILDREN)]
        for (k, num), raw in sorted(fresh.items()):
            values[k][num] = parsers[k](raw)
        nums = slice(P.O_KINDS + 1, P.O_KINDS + 4 * P.CHILDREN, 4)  # of every kind but children
        self_mnt = self.self_mnt_ns()
        # what the processes of a class (exec'ed siblings, most of a tree) have in common, by number
        classes: dict[int, dict] = {}
        tree = NativeTree({}, {}, [], [], True)
        ppids, stats, order = tree.ppids, tree.stats, tree.order
        o_special, o_class, o_children, o_role = P.O_SPECIAL, P.O_CLASS, P.O_KINDS + 4 * P.CHILDREN, P.O_ROLE
        for i in range(0, len(flat), P.PR_OUT):
            pid, role = flat[i + P.O_PID], flat[i + o_role]
            if role == P.R_EXCLUDED:
                tree.excluded.append(pid)
                continue
            if flat[i + P.O_ERR]:
                if role == P.R_TREE and pid in roots:
                    order.append(pid)  # load says why it is skipped; a child that is gone is not ours
                continue
            ppid = ppids[pid] = flat[i + P.O_PPID]
            if role == P.R_TREE:
                order.append(pid)
                if flat[i + o_children]:
                    tree.complete = False  # what is under this one is unknown
            if not flat[i + o_special]:  # the common case, everything read: the process as load would make it
                common = classes.get(flat[i + o_class])
                if common is None:
                    got = [values[k].get(num) for k, num in enumerate(flat[i + nums.start:i + nums.stop:4])]
                    # every field: a copy of a dict with all its keys is cheaper than building one
                    common = classes[flat[i + o_class]] = {
                        **_PROC_DEFAULTS, "pid": 0, "ppid": 0, "name": got[0], "state": "", "uid": 0, "start_ticks": 0,
                        "flags": 0, "env_span": (), "cmdline": got[1], "exe": got[2], "env": got[3], "maps": got[4],
                        "root": got[5], "same_mnt_ns": got[6] == self_mnt}
                proc = self._snaps[pid] = _new(Proc)
                d = proc.__dict__ = common.copy()
                d["pid"] = pid
                d["ppid"] = ppid
                d["state"] = chr(flat[i + P.O_STATE])
                d["uid"] = flat[i + P.O_UID]
                d["start_ticks"] = flat[i + P.O_START]
                d["flags"] = flat[i + P.O_FLAGS]
                j = i + P.O_SPAN
                d["env_span"] = (flat[j], flat[j + 1], flat[j + 2], flat[j + 3])
                d["notes"] = []
                continue
            # anything unusual: load works it out from what was read, as it would from what it reads
            out = flat[i:i + P.PR_OUT]
            key = out[nums]
            st = stats[pid] = _new(Stat)
            _setattr(st, "__dict__", {"pid": pid, "comm": values[0].get(key[0]), "state": chr(out[P.O_STATE]),
                                      "ppid": ppid, "flags": out[P.O_FLAGS], "start_ticks": out[P.O_START],
                                      "env_span": tuple(out[P.O_SPAN:P.O_SPAN + 4]), "threads": out[P.O_THREADS]})
            errs = out[P.O_KINDS::4]
            snap = self._snaps[pid] = [OSError(e, os.strerror(e), self.path(pid)) if e else v for e, v in (
                (out[P.O_UID_ERR], out[P.O_UID]), *((errs[k], values[k].get(key[k])) for k in range(1, P.CHILDREN)))]
            if role == P.R_ANCESTOR:  # its environ and maps were not read: load reads them if it wants them
                snap[3] = snap[4] = None
        return tree

    def _native_block(self, raw: bytes) -> EnvBlock | bytes:
        """The native reader's parser for environ: an empty block stays bytes (what it means depends
        on the process, see environ)."""
        return self.parsed_block(raw) if raw else raw

    def _rows_maps(self, rows: bytes) -> list[Mapping]:
        hit = self._maps.get(rows)
        if hit is None:
            hit = self._maps[rows] = parse_rows(rows, self._mappings)
        return hit

    def status(self, pid: int) -> dict[str, str]:
        out = {}
        for line in decode(self.reader.read_bytes(self.path(pid, "status"))).split("\n"):
            k, sep, v = line.partition(":")
            if sep:
                out[k] = v.strip()
        return out

    def uid(self, pid: int) -> int:
        """The effective uid, as the owner of /proc/<pid>: the kernel gives that directory the task's
        euid even when it is not dumpable (fs/proc/base.c task_dump_owner), which is what procps reads
        for `ps -o user`; one stat, where parsing status would cost a file read per process."""
        return self.reader.owner(self.path(pid))

    def hidden(self, pid: int) -> bool:
        """Whether status is refused too, after environ was: procfs mounted with hidepid (proc(5))."""
        try:
            self.reader.read_bytes(self.path(pid, "status"))
        except OSError as exc:
            return reason_of(exc) == "permission"
        return False

    def cmdline(self, pid: int, path: str | None = None) -> list[str]:
        return self._argv(self.reader.read_bytes(path or self.path(pid, "cmdline")))

    def _argv(self, raw: bytes) -> list[str]:
        argv = self._cmdlines.get(raw)
        if argv is None:
            args = raw[:-1] if raw.endswith(b"\0") else raw
            argv = self._cmdlines[raw] = [decode(a) for a in args.split(b"\0")] if args else []
        return argv

    def environ(self, pid: int, state: str = "", kernel_thread: bool = False,
                env_span: tuple[int, int, int, int] = (0, 0, 0, 0), path: str | None = None,
                raw: bytes | EnvBlock | OSError | None = None) -> EnvBlock:
        """The process's exec-time block; `raw`: what reading its environ gave, when it was read
        already (bytes, the block the native reader parsed from them, or the error)."""
        # Kernel threads and zombies have no mm: environ reads 0 bytes on older kernels and fails with
        # ESRCH on recent ones (fs/proc/base.c proc_mem_open), so their state decides before any read.
        if kernel_thread:
            return EnvBlock({}, "empty", "kernel thread", 0, 0, None)
        if state in ("Z", "X"):
            return EnvBlock({}, "empty", "zombie", 0, 0, None)
        if isinstance(raw, EnvBlock):
            return raw
        if raw is None:
            try:
                raw = self.reader.read_bytes(path or self.path(pid, "environ"))
            except OSError as exc:
                raw = exc
        if isinstance(raw, OSError):
            reason = reason_of(raw)
            if reason == "vanished" and self._exited(pid):
                return EnvBlock({}, "empty", "zombie", 0, 0, None)  # exited between its stat and this read
            return EnvBlock(None, "unreadable", reason, 0, 0, None)
        if not raw and env_span[3] > env_span[2]:
            # stat showed a non-empty block: the mm went away since (older kernels read 0 bytes then)
            return (EnvBlock({}, "empty", "zombie", 0, 0, None) if self._exited(pid)
                    else EnvBlock(None, "unreadable", "vanished", 0, 0, None))
        if not raw:
            # env_start == env_end: exec'ed with no environment at all (env -i, Popen(env={})). setproctitle
            # writes over the block but never shrinks it, so a clobbered block is never 0 bytes.
            return EnvBlock({}, "exec", "empty at exec", 0, 0, hash(raw))
        return self.parsed_block(raw)

    def parsed_block(self, raw: bytes) -> EnvBlock:
        """The block of these (non-empty) bytes, as every process with them shows it."""
        block = self._environs.get(raw)
        if block is None:
            env, garbled = parse_environ(raw)
            if not env:
                # setproctitle moves environ to the heap and zeroes or overwrites the exec-time block
                block = EnvBlock({}, "empty", "clobbered", len(raw), garbled, hash(raw))
            else:
                # a title or NULs over the head: the tail's variables are kept, the others unknown
                partial = bool(garbled) or zeroed_head(raw)
                block = EnvBlock(env, "exec", "partly overwritten" if partial else None, len(raw), garbled,
                                 hash(raw), partial)
            self._environs[raw] = block
        return block

    def _exited(self, pid: int) -> bool:
        """Whether the process is a zombie now (its stat still reads) rather than gone."""
        try:
            return self.stat(pid).state in ("Z", "X")
        except OSError:
            return False

    def maps(self, pid: int, path: str | None = None) -> list[Mapping]:
        """The process's file mappings (a list shared with processes that map the same files)."""
        return self._rows_maps(self.reader.maps_key(path or self.path(pid, "maps")))

    def fd_targets(self, pid: int) -> list[str]:
        d = self.path(pid, "fd")
        out = []
        for name in self.reader.listdir(d):
            try:
                out.append(self.reader.readlink(f"{d}/{name}"))
            except OSError:
                continue  # closed between listdir and readlink
        return out

    def nvidia_fds(self, pid: int) -> list[int]:
        gpus = set()
        for target in self.fd_targets(pid):
            m = _NVIDIA_DEV.match(target)
            if m:
                gpus.add(int(m.group(1)))
        return sorted(gpus)

    def resolve_root(self, proc: Proc, read: tuple[str | OSError, str | OSError] | None = None) -> None:
        """Read the process's root and mount namespace once, when a path must be resolved in it
        (`read`: the two links' targets, or the errors, when they were read already)."""
        if proc.root is not None or proc.root_reason is not None:
            return
        base = f"{self._root_s}/{proc.pid}"
        root, mnt = read or (_readlink(self.reader, base + "/root"), _readlink(self.reader, base + "/ns/mnt"))
        if isinstance(root, OSError):
            proc.root_reason = reason_of(root)  # needs ptrace access
        else:
            proc.root = root
        proc.same_mnt_ns = True if isinstance(mnt, OSError) else mnt == self.self_mnt_ns()

    def cwd_of(self, proc: Proc) -> str | None:
        """The process's working directory, read once, when a relative path must be resolved."""
        if not proc.cwd_read:
            proc.cwd_read = True
            self.resolve_root(proc)
            if proc.root is not None:
                try:
                    proc.cwd = self.reader.readlink(self.path(proc.pid, "cwd"))
                except OSError as exc:
                    proc.root_reason = reason_of(exc)  # needs ptrace access, as the root does
        return proc.cwd

    def in_root(self, proc: Proc, path: str) -> Path:
        """Where `path`, as the process sees it, is for us: inside /proc/<pid>/root unless it
        shares our mount namespace and root (the common, cheaper case)."""
        self.resolve_root(proc)
        if proc.same_mnt_ns and proc.root == "/":
            return Path(path)
        return Path(self.path(proc.pid, "root")) / path.lstrip("/")

    def load(self, pid: int, st: Stat | None = None, with_env: bool = True, with_maps: bool = True) -> Proc:
        """Everything about one process; raises OSError only if even its stat is gone or refused."""
        base = f"{self._root_s}/{pid}"  # built once: this is the hot path
        # what native_tree read: [uid, cmdline, exe, env, maps, root, mnt], each the value or the
        # OSError reading it gave
        snap = self._snaps.pop(pid, None)
        if type(snap) is Proc:  # all of it read, by native_tree
            if not with_env:
                snap.env = None
            if not with_maps:
                snap.maps = None
            return snap
        reader, notes = self.reader, []
        st = st or parse_stat(reader.read_bytes(base + "/stat"))
        uid = cmdline_reason = exe = env = maps = maps_reason = None
        cmdline: list[str] = []
        try:
            uid = reader.owner(base) if snap is None else _value(snap[0])
        except OSError as exc:
            notes.append(f"owner: {reason_of(exc)}")
        try:
            cmdline = self.cmdline(pid, base + "/cmdline") if snap is None else _value(snap[1])
        except OSError as exc:
            cmdline_reason = reason_of(exc)
        try:
            exe = reader.readlink(base + "/exe") if snap is None else _value(snap[2])
        except OSError:
            pass  # needs ptrace access; kernel threads have none
        kernel_thread = bool(st.flags & PF_KTHREAD)
        if with_env:
            env = self.environ(pid, st.state, kernel_thread, st.env_span, base + "/environ",
                               None if snap is None else snap[3])
            if env.reason == "permission" and self.hidden(pid):
                notes.append("hidden by hidepid")
                env = EnvBlock(None, "unreadable", "hidepid", 0, 0, None)
        if with_maps and (kernel_thread or st.state in ("Z", "X")):
            maps = []  # no mm, nothing mapped (and recent kernels refuse the read with ESRCH)
        elif with_maps:
            try:
                maps = self.maps(pid, base + "/maps") if snap is None or snap[4] is None else _value(snap[4])
            except OSError as exc:
                maps_reason = reason_of(exc)
        # Proc(pid=..., ...) in one dict, without the generated __init__'s cost (one per process)
        proc = _new(Proc)
        proc.__dict__ = {**_PROC_DEFAULTS, "pid": pid, "ppid": st.ppid, "name": st.comm, "state": st.state,
                         "uid": uid, "start_ticks": st.start_ticks, "flags": st.flags, "env_span": st.env_span,
                         "cmdline": cmdline, "cmdline_reason": cmdline_reason, "exe": exe, "env": env,
                         "maps": maps, "maps_reason": maps_reason, "notes": notes}
        if snap is not None:
            self.resolve_root(proc, (snap[5], snap[6]))  # read already (else when first needed)
        return proc


def _value(v):
    """A value the native reader read, or the OSError it gave, raised."""
    if isinstance(v, OSError):
        raise fresh(v)
    return v


def fresh(exc: OSError) -> OSError:
    """A kept error, to raise again: a copy (errno, message, file names), without the traceback the last raise
    gave it, whose frames would hold the reader that keeps the error (a cycle only the cyclic GC frees, with
    everything inspect built)."""
    return copy.copy(exc)


def _readlink(reader: Reader, path: str) -> str | OSError:
    try:
        return reader.readlink(path)
    except OSError as exc:
        return exc


@dataclass
class ProcTree:
    procs: dict[int, Proc]  # pid -> process, parents before children
    roots: list[int]
    ancestors: dict[int, Proc]  # processes above the roots (for shell command lines)
    skipped: list[dict]  # {"pid", "reason"}: exited mid-walk or refused
    boot_time: float | None
    clk_tck: int
    excluded: list[int] = field(default_factory=list)  # left out on request, with everything under them
    _by_parent: dict[int, list[int]] | None = field(default=None, init=False, repr=False, compare=False)

    def children(self, pid: int) -> list[int]:
        if self._by_parent is None:  # built on first use: procs does not change once walk returns it
            by_parent: dict[int, list[int]] = {}
            for p in self.procs.values():
                by_parent.setdefault(p.ppid, []).append(p.pid)
            self._by_parent = by_parent
        return list(self._by_parent.get(pid, ()))

    def start_time(self, proc: Proc) -> float | None:
        """Unix seconds; None where unknown, or where stat's start is no time a process could have
        started at (a corrupt or fake stat: before boot, or a day or more from now)."""
        if self.boot_time is None or not 0 <= proc.start_ticks <= (time.time() + 86400 - self.boot_time) * self.clk_tck:
            return None
        return self.boot_time + proc.start_ticks / self.clk_tck


def pidns_of(proc_root: str, pid: int | str = "self") -> int | None:
    """The inode of a process's pid namespace (its ns/pid link, "pid:[N]"); None where it cannot be read."""
    try:
        link = os.readlink(f"{proc_root}/{pid}/ns/pid")
    except OSError:
        return None
    return int(link[5:-1]) if link.startswith("pid:[") and link[5:-1].isdigit() else None


def ns_pid_of(reader: Reader, proc_root: str, pid: int) -> int | None:
    """A process's pid in its own (innermost) pid namespace: the last of /proc/<pid>/status's NSpid."""
    try:
        raw = reader.read_bytes(f"{proc_root}/{pid}/status")
    except OSError:
        return None
    for line in raw.splitlines():
        if line.startswith(b"NSpid:"):
            parts = line.split()
            return int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else None
    return None


def tgid_of(fs: ProcFS, pid: int) -> int:
    """A thread id given as a PID resolves to its process (threads are not listed in /proc)."""
    try:
        raw = fs.reader.read_bytes(fs.path(pid, "status"))
    except OSError:
        return pid
    _, found, rest = raw.partition(b"\nTgid:")  # the one line wanted of ~55
    try:
        return int(rest.split(b"\n", 1)[0]) if found else pid
    except ValueError:
        return pid


def children_of(fs: ProcFS, st: Stat) -> list[int]:
    """The process's children from /proc/<pid>/task/<tid>/children (CONFIG_PROC_CHILDREN), which lists
    the children each thread forked (fs/proc/array.c get_children_pid): every thread's, when it has
    several. Raises OSError when the file is absent or unreadable."""
    if st.threads <= 1:  # one thread: one file (most processes, and most of them have no children)
        raw = fs.reader.read_bytes(f"{fs._root_s}/{st.pid}/task/{st.pid}/children")
        return [int(c) for c in raw.split()] if raw else []
    tids = fs.reader.listdir(fs.path(st.pid, "task"))
    out: list[int] = []
    for tid in tids:
        out.extend(int(c) for c in fs.reader.read_bytes(fs.path(st.pid, "task", tid, "children")).split())
    return out


def _tree_by_children(fs: ProcFS, roots: list[int]) -> tuple[dict[int, int], dict[int, Stat]] | None:
    """The parents and stats of the processes under the roots only, read top down (the native reader
    keeps the stats it needs itself); None when a children file cannot be read (kernel without
    CONFIG_PROC_CHILDREN, a fake /proc, a process that exited or is hidden mid-walk): then only a scan
    of every process is sure to see the same tree."""
    stats: dict[int, Stat] = {}
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in stats:
            continue
        try:
            st = fs.stat(pid)
        except OSError:
            continue  # a root that is gone is reported by load; a child that is gone is not ours
        stats[pid] = st
        try:
            kids = children_of(fs, st)
        except (OSError, ValueError):
            return None
        todo.extend(kids)
    return {pid: st.ppid for pid, st in stats.items()}, stats  # by each stat's parent, as the scan does


def _tree_by_scan(fs: ProcFS) -> tuple[dict[int, int], dict[int, Stat]]:
    """The parents and stats of every process on the system."""
    stats: dict[int, Stat] = {}
    for pid in fs.pids():
        try:
            stats[pid] = fs.stat(pid)
        except OSError:
            continue  # exited between listdir and read; not ours unless it is in the tree
    return {pid: st.ppid for pid, st in stats.items()}, stats


@dataclass
class NativeTree:
    """What ProcFS.native_tree read: the parent of every process read, the stats load needs, the
    processes in walk's order, those left out, and whether every children file could be read."""
    ppids: dict[int, int]
    stats: dict[int, Stat]
    order: list[int]
    excluded: list[int]
    complete: bool


def _depth_first(roots: list[int], ppids: dict[int, int], exclude: frozenset[int]) -> tuple[list[int], list[int]]:
    """The processes under each root in turn, children by ascending pid, and those left out (in
    `exclude` and not a root: nothing under them is listed)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in ppids.items():
        children.setdefault(ppid, []).append(pid)
    order: list[int] = []
    excluded: list[int] = []
    seen: set[int] = set()
    for root in roots:
        stack = [root]
        while stack:
            pid = stack.pop()
            if pid in seen:
                continue
            seen.add(pid)
            if pid in exclude and pid not in roots:
                excluded.append(pid)
                continue
            order.append(pid)
            stack.extend(sorted(children.get(pid, ()), reverse=True))
    return order, excluded


def walk(fs: ProcFS, roots: list[int], with_ancestors: bool = True, exclude: frozenset[int] = frozenset()) -> ProcTree:
    """The processes under each root (threads excluded), each loaded once, in tree order; a process
    in `exclude` (unless it is a root) is left out with everything under it.

    The tree is read from the children files under the roots; when those are missing, from the
    stat of every process (the cost then grows with the whole system, not with the tree)."""
    skipped: list[dict] = []
    native = fs.native_tree(roots, exclude)
    if native is not None and native.complete:
        ppids, stats, order, excluded = native.ppids, native.stats, native.order, native.excluded
    else:  # what the native reader read is kept for load all the same
        ppids, stats = (_tree_by_children(fs, roots) if native is None else None) or _tree_by_scan(fs)
        order, excluded = _depth_first(roots, ppids, exclude)
    procs: dict[int, Proc] = {}
    made = fs._snaps  # the processes native_tree made whole already (most of them, when it ran)
    for pid in order:
        proc = made.get(pid)
        if type(proc) is Proc:
            procs[pid] = made.pop(pid)
            continue
        try:
            procs[pid] = fs.load(pid, stats.get(pid))
        except OSError as exc:
            skipped.append({"pid": pid, "reason": reason_of(exc)})
    ancestors: dict[int, Proc] = {}
    if with_ancestors:
        for root in roots:
            pid = ppids.get(root, 0)
            while pid > 0 and pid not in procs and pid not in ancestors:
                try:
                    ancestors[pid] = fs.load(pid, stats.get(pid), with_env=False, with_maps=False)
                except OSError:
                    break
                pid = ancestors[pid].ppid
    return ProcTree(procs, [r for r in roots if r in procs], ancestors, skipped, fs.boot_time(),
                    fs.clock_ticks(), sorted(excluded))


def matching_pids(fs: ProcFS, pattern: str, exclude: set[int] = frozenset()) -> list[int]:
    """PIDs whose command line (or name) matches the regex, like `pgrep -f`."""
    rx = re.compile(pattern)
    out = []
    for pid in fs.pids():
        if pid in exclude:
            continue
        try:
            cmd = " ".join(fs.cmdline(pid)) or fs.stat(pid).comm
        except OSError:
            continue
        if rx.search(cmd):
            out.append(pid)
    return sorted(out)
