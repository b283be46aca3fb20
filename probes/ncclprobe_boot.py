"""ncclprobe boot probe: runs first in a Python interpreter and records what happens to its NCCL
environment (standard library only, CPython 3.8+; the target need not have ncclprobe installed).

Wired in by `ncclprobe run` (a sitecustomize.py on PYTHONPATH calls start()) or by `ncclprobe inject
install` (a site-packages .pth / PEP 829 .start calls start() of a copy whose INSTALLED line holds the
log directory and profile). start():
  - emits `process_start` (argv, exe, watched env, the watched part of /proc/self/environ);
  - applies the profile (`set`, `default` = set only if absent, `pin`);
  - guards os.environ / os.environb / os.putenv / os.unsetenv for watched variables: each write is an
    `env_write` with the writer's file:line; writes that would change a pinned variable are refused;
  - follows fork children (os.register_at_fork) as processes of their own.
It never raises: a failure is logged once as `probe_error` and the interpreter goes on. It never
hurts its host (DESIGN.md §4, log directory; probes/ncclprobe/log.c keeps the same rules): it logs only
into a private directory of its euid (no symlink; for root, no system directory), into a file it created
(O_EXCL, O_NONBLOCK) or proved to be its own private regular file; before each write it checks with
fstat that its fd still names that file (a host may close any fd and reuse the number), and an fd
that does not is the host's: never written to, never closed. Its fd sits at 200 or above (never 0-2:
a host started with stdio closed keeps them closed). It takes no lock and starts no thread; a log
filesystem that stalls costs the host one stall, then lines are counted, not written, for a while
(_emit). What it writes is bounded (issue 21's policy, as log.c): NCCLPROBE_MAX_LINE per line (fields
shortened, "truncated"), NCCLPROBE_MAX_BYTES per process file and NCCLPROBE_MAX_FILES files per host
in a directory (then one `log_budget` line); lines lost are said as "dropped": K on the next one. A
refused or unusable log directory costs one line on stderr per process tree (none with
NCCLPROBE_QUIET=1), then silence. The profile file is read once, at start. Importing this module has
no side effects; ncclprobe.commands.profile imports it for the profile parser.

Start-up cost (issue 4: `python -c pass` at most 1.10x with the probe). Everything above the line
"# ncclprobe: the rest of the probe" runs in every interpreter: it imports nothing the interpreter
has not imported already and is kept to a handful of code objects (one start() with the common path
inlined, the guard, the fork hook), since loading each one costs, and every object it keeps counts
towards the interpreter's next garbage collection (a bare start ends ~100 objects short of one). A
persistent install (and `run`) loads only that part at start; the rest (JSON of any value, the log writer for
later events, profile files, argv redaction, fork children, recording of guarded writes, error
reports) is a second file that _rest() runs on first use.
"""
import os
import sys
import time
import _thread
import _weakref

# Same set as ncclprobe/model/watched.py (tests/test_boot_profile.py checks they agree); nothing else is
# ever logged. SECRET_MARKERS and SECRET_ENDINGS too (tests/test_secrets.py): what makes a name look secret.
WATCHED_PREFIXES = ("NCCL_", "TORCH_NCCL_", "NCCLPROBE_")
WATCHED_NAMES = frozenset(("TORCH_DISTRIBUTED_DEBUG", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "PYTHONPATH",
                           "SGLANG_NCCL_SO_PATH", "VLLM_NCCL_SO_PATH"))
SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "KEY", "CREDENTIAL", "AUTH", "PRIVATE",
                  "COOKIE")
# Endings that make a name secret-looking only at its end (DB_PASS, SSHPASS, GITHUB_PAT, MYSQL_PWD, --db-pass):
# PASS_THROUGH, PATH and PWD (the working directory) are no secrets.
SECRET_ENDINGS = ("PASS", "_PAT", "-PAT", "_PWD", "-PWD")
# What makes start() load redact_argv (in "\0".join(argv).upper()): any place a rule of redact_argv starts
# from (a secret-looking name, the "@" of a URL's credentials, a known token's prefix, a program with password
# options; a name ending with PASS and a short program's name followed by what ends a word: `python -c pass`
# loads nothing).
_ARGV_HINTS = ("@", "TOKEN", "SECRET", "PASSW", "PASSP", "PASS=", "PASS:", "PASS'", 'PASS"', "PASS ", "PASS\0",
               "PASS\t", "PASS\n", "KEY", "CREDENTIAL", "AUTH", "PRIVATE", "COOKIE", "_PAT", "-PAT", "_PWD", "-PWD",
               "-USER", "EYJ", "GHP_", "GHO_", "GHU_", "GHS_", "GHR_", "GLPAT", "HF_", "SK-", "XOX", "NPM_", "PYPI-",
               "LOGIN", "MYSQL", "MARIADB", "MONGO", "REDIS", "SQLCMD", "LDAP", "TWINE", "OPENSSL", "CURL",
               "PUT-PARAMETER", "BCP", "7Z", "ZIP\0", "ZIP ", "RAR\0", "RAR ")
# Watched entries of an environment block (NUL first, "NAME=VALUE" entries NUL-separated, NUL last) are
# found with bytes.find: a prefix matches at the start of an entry only, a name is followed by '='.
# Every prefix contains "NCCL": one test rules them all out, usually. (The two lists above, as bytes.)
_FIND = (b"\0NCCL_", b"\0TORCH_NCCL_", b"\0NCCLPROBE_",  # the prefixes, then the names
         b"\0TORCH_DISTRIBUTED_DEBUG=", b"\0CUDA_VISIBLE_DEVICES=", b"\0LD_PRELOAD=", b"\0PYTHONPATH=",
         b"\0SGLANG_NCCL_SO_PATH=", b"\0VLLM_NCCL_SO_PATH=")

DIR_VAR = "NCCLPROBE_DIR"          # log directory (wins over the installed one)
PROFILE_VAR = "NCCLPROBE_PROFILE"  # path of a profile file, applied after the installed profile
OFF_VAR = "NCCLPROBE_BOOT"         # "off": this process and its children skip the probe
QUIET_VAR = "NCCLPROBE_QUIET"      # "1": a refused log directory is not said on stderr
SAID_VAR = "NCCLPROBE_REFUSED"     # the refused directory, once said: the processes started since stay quiet

# `ncclprobe inject install` rewrites this line in its copy: {"log_dir": str|None, "profile": str, ...}
INSTALLED = None
# `ncclprobe run`'s log directory, set by its sitecustomize (the directory above the probe's own): where a
# process it wired records when its environment lost NCCLPROBE_DIR
RUN_DIR = None

MAX_STR = 65536  # bound on any logged string, so a line stays far below the readers' 1 MiB limit

# The log directory is opened O_PATH (no read permission needed) and never through a symlink; the
# file is always new (O_EXCL) and O_NONBLOCK: a FIFO planted at its name fails instead of blocking.
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# `<host>.files`, the count of log files made in the directory (one byte each): shared, never O_EXCL
_COUNT_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FD_FLOOR = 200  # log.c's NP_FD_FLOOR: above the numbers hosts dup2() onto and close in loops
# A log-filesystem operation this slow means the filesystem stalls (see _emit; NCCLPROBE_STALL_MS). Wall
# time also counts waits for the GIL and the CPU: on a loaded machine those reach half a second.
_STALL_S = 2.0

_dir = None  # log directory (absolute), None = silent
_fd = -1     # log file of process _fd_pid, whose (st_dev, st_ino) is _fd_id
_fd_pid = 0
_fd_id = None
_host = ""
# (os.getpid() it was made for, the pid a line names, the line's identity fields): see _identity
_ident = (0, 0, "")
_INIT_PIDNS = "pid:[4026531836]"  # the kernel's initial pid namespace (PROC_PID_INIT_INO): its pids are the host's
_fs_encoding = sys.getfilesystemencoding()
_real_putenv = os.putenv
_real_unsetenv = os.unsetenv
_pins = {}   # name -> pinned value (None: pinned absent)
_c_env = {}  # watched names last written through os.putenv/unsetenv (os.environ does not see them)
_start = {}  # process_start fields shared with fork children (and the parts whose failure was logged)
# Bounds (NCCLPROBE_MAX_LINE, _MAX_BYTES, _MAX_FILES, _STALL_MS; read once per process by start()) and the
# state of the writer: lines lost since the last written one (said as "dropped" on the next), the budget
# reached ("bytes": this process's file is full; "files": the directory's count is), until when the log
# filesystem is left alone after it stalled, which operation on it is in flight since when, whether the
# last write was short (the next line then starts on a line of its own), and whether this process is
# known to have one thread (start, a fork child: see _open_log).
_max_line = 65536
_max_bytes = 67108864
_max_files = 4096
_drops = []  # see _drop
_full = None
_quiet_until = 0.0
_busy = None  # (since, pid, thread id) of an operation on the log filesystem in flight (see _emit)
_tears = []  # a torn line before, as tokens a line that ended it takes back (see _emit)
_alone = False

# The fields of process_start, as _json in the rest writes them.
_START_FIELDS = (',"ppid":%d,"argv":[%s],"exe":%s,"prefix":%s,"python":"%d.%d.%d","mode":"%s","env":{%s},'
                 '"exec_env":%s,"exec_env_differs":%s,"profile":[%s],"profile_unwatched":%d,"pinned":{%s},'
                 '"start":%s')


# ---------------------------------------------------------------------------- log writer

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _jstr(s):
    # s as JSON
    if len(s) > MAX_STR:
        s = s[:MAX_STR] + "...[truncated]"
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return '"' + s + '"'
    out = []
    for ch in s:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code > 0xFFFF:
            code -= 0x10000
            out.append("\\u%04x\\u%04x" % (0xD800 | (code >> 10), 0xDC00 | (code & 0x3FF)))
        else:  # includes lone surrogates from undecodable bytes (surrogateescape)
            out.append("\\u%04x" % code)
    return '"' + "".join(out) + '"'


def _emit(ev, fields):
    # One event line, as _json(rec) in the rest writes it. fields: a dict (str keys; values other than
    # str, None, bool, int go through _json) or the JSON of the fields already (',"key":value...').
    # A probe_error (fields: (part, exception)) is logged once per part and never raises.
    # A stalled log filesystem costs the host one stall, not one per line: Linux puts a writer to a
    # frozen or hung filesystem to sleep uninterruptibly (creating a file, write(), pwritev2 with
    # RWF_NOWAIT too: fs/read_write.c waits in file_start_write before it looks at the flag), so once an
    # operation on it took _STALL_S, or while one in another thread has been asleep in the kernel (D)
    # that long, lines are counted, not written, for a while (_stalled); the next written line says
    # "dropped": K. Only the operation is timed, and another thread's only if /proc says it sleeps in
    # the kernel: a process paused or starved of CPU (SIGSTOP, a frozen cgroup, a loaded machine) is no
    # stall of the filesystem. Threads share the counts through _drops (see _drop), never a global +=.
    global _fd, _busy
    try:
        if ev == "probe_error":
            part, exc = fields
            if "failed " + part in _start:
                return
            _start["failed " + part] = True
            fields = {"part": part, "message": "%s: %s" % (type(exc).__name__, exc)}
        if _full is not None or (_fd < 0 and _dir is None):
            return
        t0 = time.monotonic()
        busy = _busy
        if t0 < _quiet_until or (busy and t0 - busy[0] > _STALL_S):
            _rest()
            if t0 < _quiet_until or _asleep(busy[1], busy[2]):
                _drop(1)
                return
        pid = os.getpid()
        size = 0
        if _fd >= 0:  # still our file? A host may close any fd and reuse its number (closerange)
            try:
                st = os.fstat(_fd)
                ours = st.st_ino == _fd_id[1] and st.st_dev == _fd_id[0]
            except OSError:
                ours = False
            if not ours:  # the number is the host's now (or nothing): never written to, never closed
                _fd = -1
            elif _fd_pid != pid:  # our file, inherited through fork: the child writes its own
                os.close(_fd)
                _fd = -1
            else:
                size = st.st_size  # every writer of this process's file counts (the C probe's too)
        # this thread's operations on the log filesystem, as another thread sees them (the oldest in flight)
        owner = _busy is None
        if owner:
            tid = _thread.get_native_id()
            _busy = (t0, pid, tid)
        try:
            if _fd < 0:
                size = _open_log(pid, t0)
                if time.monotonic() - t0 > _STALL_S:  # (made or opened at last, or not): this line is lost
                    _rest()
                    _stalled(t0, -1, 0, 0, False)
                    return
                if _fd < 0:
                    return
            given = fields
            if type(fields) is not str:
                parts = [""]
                for k, v in fields.items():
                    if type(v) is str:
                        v = _jstr(v)
                    elif v is None or v is True or v is False:
                        v = "null" if v is None else "true" if v else "false"
                    elif type(v) is int:
                        v = str(v)
                    else:
                        _rest()
                        v = _json(v)
                    parts.append('"%s":%s' % (k, v))
                fields = ",".join(parts)
            carried = 0
            while _drops:  # the counts no other thread has taken (each pop is atomic)
                try:
                    carried += _drops.pop()
                except IndexError:
                    break
            ident = _ident if _ident[0] == pid else _identity(pid)
            head = '{"ev":"%s","t":%r,"host":%s,"pid":%d,"src":"boot"%s' % (
                ev, time.time(), _jstr(_host), ident[1], ident[2])
            line = head + fields + (',"dropped":%d}\n' % carried if carried else "}\n")
            # A torn line before: this one starts on a line of its own, and so does every line until one so
            # started is written whole (the tear is read, not taken: a thread that took it could fail, or
            # write after another thread's line had been glued to the torn one). Two lines that both end it
            # leave an empty line, never a line lost uncounted.
            try:
                tear = _tears[-1]
            except IndexError:
                tear = None
            torn = tear is not None
            if torn or _full is not None or len(line) > _max_line or size + len(line) > _max_bytes - 1024:
                _rest()  # the line cap, the byte and file budgets, a torn line before this one
                line = _bounded(ev, head, fields, line[len(head) + len(fields):], given, size, torn)
            data = line.encode("ascii")
            t1 = time.monotonic()  # the write alone is timed (what came before it was the host's time)
            if owner:
                _busy = (t1, pid, tid)
            try:  # one write per line: O_APPEND keeps it whole
                n = os.write(_fd, data)
            except OSError:
                n = -1
            if torn and n > 0:  # its "\n" ended the torn line
                try:
                    _tears.remove(tear)
                except ValueError:  # (another thread's line ended it too)
                    pass
            if n != len(data) or time.monotonic() - t1 > _STALL_S:
                _rest()
                _stalled(t1, n, len(data), carried, torn)
        finally:
            if owner:
                _busy = None
    except Exception:
        if ev != "probe_error":
            raise


def _system_dir(fd, path, leaf=""):
    # Whether a directory of root's (fd, at path; or its entry leaf) is a system one: in the system's
    # own trees (or / itself), not in the scratch places under them where users keep private
    # directories. Only root's are asked (a log directory is euid's): for root, ownership says nothing.
    try:  # the real path, whatever symlinks led there
        real = os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        real = os.path.realpath(path)
    if leaf:
        real = real.rstrip("/") + "/" + leaf
    top = real[1:].split("/", 1)[0]  # "" for / itself
    return ((top in {"", "bin", "boot", "dev", "etc", "proc", "sbin", "sys", "usr", "var"} or top.startswith("lib"))
            and not real.startswith(("/var/tmp/", "/dev/shm/")))


def default_log_dir(where):
    # Log directory of a persistent install without --dir, for this euid and this process's
    # environment, where nobody else can have made it first: <runtime>/ncclprobe, the runtime
    # directory being $XDG_RUNTIME_DIR or /run/user/<uid> if it is a directory of ours that only we can
    # enter (0700; the probe makes the leaf there: a reboot or the last logout empties it); else
    # <home>/.ncclprobe-logs if it exists (`inject install` makes it; the probe never makes anything in
    # a home), home being $HOME (else the passwd entry's) if it is a directory of ours that nobody else
    # can write to. None: neither. where="runtime" or "home": only that one, made or not. (Comments,
    # not docstrings, and no default arguments in this part: every interpreter loads it.)
    env, uid = os.environ._data, os.geteuid()
    for rt in (env.get(b"XDG_RUNTIME_DIR") or b"", b"/run/user/%d" % uid) if where != "home" else ():
        try:
            st = os.stat(rt)
        except OSError:
            continue
        if rt[:1] == b"/" and st.st_uid == uid and st.st_mode & 0o170777 == 0o040700:
            return os.fsdecode(rt).rstrip("/") + "/ncclprobe"
    home = os.path.expanduser("~").rstrip("/")
    try:
        st = os.stat(home or "/")
    except OSError:
        return None
    leaf = home + "/.ncclprobe-logs"
    if (where == "runtime" or not home or st.st_uid != uid or st.st_mode & 0o170022 != 0o040000
            or not (where or os.path.isdir(leaf))):
        return None
    return leaf


def _open_log(pid, t0):
    # Open <dir>/<host>-<pid>.jsonl under the log discipline of DESIGN.md §4 (log.c keeps the same):
    # the directory a private one of ours (the leaf created 0700 if missing, in a fit parent), the
    # file created new (O_EXCL; O_NONBLOCK: nothing we open can block the host) if the directory's
    # file budget allows, or an existing one re-opened only if it is a private regular file of ours;
    # then moved up to _FD_FLOOR. Returns the file's size, or -1: not opened. A full filesystem drops
    # (and counts) the line; anything else costs one line on stderr, then silence, for this process
    # and its fork children. After a stall (since t0, _emit's), no further step: one stall a line.
    # (One function, not several: every interpreter loads this part.)
    global _fd, _fd_pid, _fd_id, _dir, _full, _alone
    dfd = -1
    try:
        try:
            dfd = os.open(_dir, _DIR_FLAGS)  # O_NOFOLLOW: a symlink fails (ENOTDIR)
        except FileNotFoundError:  # made by the first process only: in the rest
            _rest()
            dfd = _make_dir(_dir)
            if time.monotonic() - t0 > _STALL_S:  # each step that may sleep in the filesystem, then no further
                return -1
        st = os.fstat(dfd)
        if st.st_uid != os.geteuid():
            raise PermissionError("it belongs to another user")
        if st.st_mode & 0o022:
            raise PermissionError("group or others can write to it")
        if st.st_uid == 0 and _system_dir(dfd, _dir):
            raise PermissionError("it is a system directory")
        host = _host.replace("/", "_")
        if _fd_pid != pid:
            # This process's file, about to be made (or an exec'd predecessor's, counted twice then):
            # the directory's file budget. `<host>.files` grows by one byte per file, so that concurrent
            # writers never race, and no more once past the budget; one that is not a private regular
            # file of ours counts as the budget reached (log.c counts alike).
            fd = os.open(host + ".files", _COUNT_FLAGS, 0o600, dir_fd=dfd)
            try:
                if time.monotonic() - t0 > _STALL_S:  # its creation stalled: not its write too
                    return -1
                st = os.fstat(fd)
                if st.st_mode & 0o170077 != 0o100000 or st.st_uid != os.geteuid():
                    n = _max_files + 2
                elif st.st_size > _max_files:
                    n = st.st_size + 1
                else:  # our byte's end (O_APPEND), whatever others appended since: our place
                    os.write(fd, b"\n")
                    n = os.lseek(fd, 0, 1)
            finally:
                os.close(fd)
            if n > _max_files:  # the one just past the budget is made to say so; after it, nothing
                _full = "files"
                if n > _max_files + 1:
                    return -1
            if time.monotonic() - t0 > _STALL_S:
                return -1
        name = "%s-%d.jsonl" % (host, pid)
        try:
            fd = os.open(name, _FILE_FLAGS, 0o600, dir_fd=dfd)
        except FileExistsError:  # ours from before (pid reuse, exec, an fd the host closed), or planted
            _rest()
            fd = _reopen(name, dfd)
        st = os.fstat(fd)
        # Moved to the lowest free number >= _FD_FLOOR, close-on-exec (log.c's move_high): a host that
        # started with stdio closed must not find our file at fd 1. With one thread (start, a fork
        # child) nothing can take a free number between a look and dup2, which saves importing fcntl
        # (~1.5 % of an interpreter's start). Where no high number can be had (RLIMIT_NOFILE), the fd
        # stays, unless it is one of 0-2: then silence rather than a log on the host's stdio.
        high = -1
        try:
            for n in range(_FD_FLOOR, _FD_FLOOR + 64) if _alone else ():  # (_alone: /proc is there)
                if not os.access("/proc/self/fd/%d" % n, 0):  # F_OK: an open fd's link always resolves
                    high = os.dup2(fd, n, False)
                    break
            if high < 0:
                import fcntl
                high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _FD_FLOOR)
        except (ImportError, OSError):
            high = fd if fd > 2 else -1
        if high != fd:
            os.close(fd)
        if high < 0:
            raise OSError("only the host's standard descriptors 0-2 were free")
        _fd, _fd_pid, _fd_id = high, pid, (st.st_dev, st.st_ino)
        return st.st_size
    except Exception as exc:
        # EINTR, EIO, EAGAIN, ENFILE, EMFILE, ENOSPC, EDQUOT: this line is lost, the next may not be (a
        # string, not a tuple: a tuple constant costs every interpreter's start a tracked object)
        if isinstance(exc, OSError) and ",%s," % exc.errno in ",4,5,11,23,24,28,122,":
            _rest()
            _drop(1)
        else:
            d, _dir = _dir, None
            try:
                _rest()
                _refused(d, exc)
            except Exception:
                pass
    finally:
        _alone = False
        if dfd >= 0:
            os.close(dfd)
    return -1


def start():
    """Boot the probe in this process (idempotent: a second copy, e.g. ephemeral on top of
    persistent, does nothing). Never raises."""
    # The common path (profile given at install, nothing secret-looking, plain strings) is inlined
    # here; anything else goes to the rest of the probe.
    global _dir, _host, _alone
    try:
        data, enc = os.environ._data, _fs_encoding
        if getattr(sys, "_ncclprobe_boot", None) or data.get(b"NCCLPROBE_BOOT") == b"off":
            return
        sys._ncclprobe_boot = __name__
        _host = os.uname().nodename
        if (b"NCCLPROBE_MAX_LINE" in data or b"NCCLPROBE_MAX_BYTES" in data or b"NCCLPROBE_MAX_FILES" in data
                or b"NCCLPROBE_STALL_MS" in data):
            _rest()
            _bounds(data)
        pid = os.getpid()
        d = data.get(b"NCCLPROBE_DIR")
        if d:
            d = d.decode(enc, "surrogateescape")
        elif not INSTALLED:  # `run`'s wiring (its sitecustomize sets RUN_DIR): PYTHONPATH reached this
            d = RUN_DIR  # process, NCCLPROBE_DIR did not (an env= allow-list): it is still run's to record
        elif INSTALLED.get("log_dir"):
            d = INSTALLED["log_dir"]
        else:  # per user, private; None where this user has none (not made by `inject install`)
            d = default_log_dir(None)
        if d and d[0] != "/":  # as the host found it: fork children and re-opens after a chdir too
            d = os.getcwd() + "/" + d
        _dir = d
        argv = getattr(sys, "orig_argv", None)
        if argv is None:  # before 3.10
            try:
                with open("/proc/self/cmdline", "rb") as f:
                    argv = list(map(os.fsdecode, f.read().split(b"\0")[:-1]))
            except OSError:
                argv = list(sys.argv)
        argv = list(argv)
        if len(argv) > 512:  # a start must stay cheap; the line cap may drop more
            _start["argv_dropped"] = len(argv) - 512
            del argv[512:]
        argv = _scrub(argv)
        # (the pid a fork child names as forked_from: as its lines name this process, see _identity)
        _start.update(pid=_identity(pid)[1], mode="persistent" if INSTALLED else "ephemeral", argv=argv)
        found = []  # watched part of os.environ (before the profile) and of /proc/self/environ
        if d is not None:  # silent: nothing to find
            try:
                fd = os.open("/proc/self/environ", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    chunks = [b"\0"]
                    b = os.read(fd, 65536)
                    while b:
                        chunks.append(b)
                        # procfs fills a read up to its size unless the block ends (fs/proc/base.c
                        # environ_read): a short one is the last, and an empty read more is saved
                        b = os.read(fd, 65536) if len(b) == 65536 else b""
                    chunks.append(b"\0")  # an extra empty entry at the end is harmless
                    raw = b"".join(chunks)
                finally:
                    os.close(fd)
            except OSError:
                raw = None
            found.append(_find_watched(b"\0" + b"\0".join(map(b"=".join, data.items())) + b"\0"))
            found.append(None if raw is None else _find_watched(raw))
        # the profile: the installed one (parsed at install time), then the file NCCLPROBE_PROFILE names
        entries = INSTALLED.get("entries") if INSTALLED else None
        if (entries is None and INSTALLED and INSTALLED.get("profile")) or data.get(b"NCCLPROBE_PROFILE"):
            _rest()
            entries = _profile_entries()
        applied, pinned, strs, unwatched, set_watched = [], [], [], 0, []
        for op, name, value in entries or ():
            if op == "pin":
                continue
            key = name.encode(enc, "surrogateescape")
            prev = data.get(key)
            if prev is not None:
                prev = prev.decode(enc, "surrogateescape")
            changed = (op == "set" or prev is None) and prev != value
            if changed:  # what os.environ[name] = value does (3.8-3.14); before the guard: no foreign write
                value_b = value.encode(enc, "surrogateescape")
                _real_putenv(key, value_b)
                data[key] = value_b
            if name in WATCHED_NAMES or name.startswith(WATCHED_PREFIXES):
                applied.append((op, name, value, prev, changed))
                strs += (op, name, value, prev or "")
                if changed:
                    set_watched.append((name, value))
            else:
                unwatched += 1
        for op, name, _ in entries or ():
            if op == "pin":
                value = data.get(name.encode(enc, "surrogateescape"))
                if value is not None:
                    value = value.decode(enc, "surrogateescape")
                _pins[name] = value
                pinned.append((name, value))
                strs += (name, value or "")
        _start.update(profile=applied, profile_unwatched=unwatched)
        if _dir is not None:
            before, exec_env = found
            env = before
            if set_watched:  # the profile only sets variables: what it set, on top of what was there
                env = dict(before)
                env.update(set_watched)
            strs += argv
            strs += env
            strs += env.values()
            if exec_env is not None:
                strs += exec_env
                strs += exec_env.values()
            s = "".join(strs) + sys.executable + sys.prefix
            # plain strings (printable ASCII without '"' or '\\', within MAX_STR) are their JSON between quotes
            q = _jstr
            if len(s) <= MAX_STR and s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
                q = '"%s"'.__mod__
            texts = []
            for op, name, value, prev, changed in applied:
                texts.append('{"op":%s,"var":%s,"value":%s,"previous":%s,"applied":%s}' % (
                    q(op), q(name), q(value), "null" if prev is None else q(prev), "true" if changed else "false"))
            for i, (name, value) in enumerate(pinned):
                pinned[i] = "%s:%s" % (q(name), "null" if value is None else q(value))
            vi = sys.version_info
            try:  # when the kernel started this process, to the tick (the _kernel_start of the rest, inlined)
                fd = os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    b = os.read(fd, 4096)
                finally:
                    os.close(fd)
                b = b[b.rindex(b")") + 2:].split()
                ppid = int(b[1])  # as this /proc shows it (os.getppid() in a pid namespace: the pid in there)
                _alone = b[17] == b"1"  # num_threads: the log fd can be moved up without fcntl (_open_log)
                kstart = "%.3f" % (time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
                                   + int(b[19]) / os.sysconf("SC_CLK_TCK"))
            except Exception:
                kstart, ppid = "null", os.getppid()
            text = None  # a record too long already (a huge command line): shortened in the rest
            if len(s) < _max_line - 512 and "argv_dropped" not in _start:
                text = _START_FIELDS % (
                    ppid, ",".join(map(q, argv)), q(sys.executable), q(sys.prefix), vi[0], vi[1], vi[2],
                    _start["mode"], ",".join(map("%s:%s".__mod__, zip(map(q, env), map(q, env.values())))),
                    "null" if exec_env is None else
                    "{" + ",".join(map("%s:%s".__mod__, zip(map(q, exec_env), map(q, exec_env.values())))) + "}",
                    "null" if exec_env is None else "false" if exec_env == before else "true",
                    ",".join(texts), unwatched, ",".join(pinned), kstart)
            if text is None or len(text) > _max_line - 512:
                _rest()
                text = _start_fields(_process_start({}, env, exec_env, before))
            _emit("process_start", text)
            _alone = False  # (if the line was not written: the next opening may not be alone)
            try:  # a parent that is not Python (a C/C++ daemon, a shell) has no probe: record it from here
                exe = os.readlink("/proc/%d/exe" % ppid) if ppid > 1 else "python"
                if not exe.rsplit("/", 1)[-1].startswith("python"):
                    _parent_seen(ppid, exe)
            except Exception:
                pass
    except Exception as exc:
        _emit("probe_error", ("start", exc))
        return
    try:
        # the class of os.environ and os.environb (patched rather than subclassed: a class costs more
        # objects at start than the interpreter's next garbage collection leaves room for)
        os._Environ.__setitem__, os._Environ.__delitem__ = _setitem, _delitem
        os.putenv, os.unsetenv = putenv, unsetenv
    except Exception as exc:
        _emit("probe_error", ("guard", exc))
    try:
        # through a function whose globals hold only a weak reference to the handler: a handler
        # that refers to this module's globals would keep them (and every module they reach)
        # alive until the interpreter's last clean-up, which makes every process exit slower
        os.register_at_fork(after_in_child=type(_fork_hook)(
            _fork_hook.__code__, {"_ref": _weakref.ref(_rest)}))
    except Exception as exc:
        _emit("probe_error", ("fork", exc))
    if _dir is None:  # silent: no edge to record
        return
    try:  # the processes this one starts (`spawn`): os's exec and posix_spawn now, Popen's and
        # multiprocessing's _posixsubprocess.fork_exec when it is imported (most processes never do)
        for name in ("execv", "execve", "posix_spawn", "posix_spawnp"):
            real = getattr(os, name, None)
            if real is not None:
                setattr(os, name, _edge(real, name))
        if "_posixsubprocess" in sys.modules:
            _rest()
            _wrap_fork_exec(sys.modules["_posixsubprocess"])
        else:
            # (globals holding only a weak reference, as the fork hook's: see there)
            finder = type(_import_hook)(_import_hook.__code__, {"_ref": _weakref.ref(_spawn_import)})
            finder.find_spec = finder
            sys.meta_path.insert(0, finder)
    except Exception as exc:
        _emit("probe_error", ("spawn", exc))


def _scrub(argv):
    """argv as a log may hold it: through redact_argv (the rest) where it may hold a secret (a hint of
    one, or more than a cheap look reads), else as it is."""
    joined = "\0".join(argv)
    if len(joined) <= 4096:  # redact_argv reads at most ARGV_SCAN characters: cheaper than ~50 searches
        upper = joined.upper()
        for marker in _ARGV_HINTS:
            if marker in upper:  # something looks like a secret
                break
        else:
            return argv
    _rest()
    return redact_argv(argv)


def _find_watched(block):
    """The watched part of an environment block (NUL first, NAME=VALUE entries NUL-separated, NUL
    last), in block order."""
    found = []
    for key in _FIND if b"NCCL" in block else _FIND[3:]:
        i = block.find(key)
        while i >= 0:
            j = block.find(b"\0", i + 1)
            found.append((i, block[i + 1:j]))
            i = block.find(key, j)
    found.sort()
    env = {}
    for _, entry in found:
        name, sep, value = entry.partition(b"=")
        if sep:
            env[name.decode(_fs_encoding, "surrogateescape")] = value.decode(_fs_encoding, "surrogateescape")
    return env


def _identity(pid):
    """_ident for this process (pid: os.getpid()). In the initial pid namespace, the pid itself. In another
    (a container, `unshare --pid`, a scheduler's sandbox) os.getpid() is the pid in there, which other
    namespaces' processes share: a line then names the process by the pid the /proc mounted here shows
    (the host's, where that /proc is the host's; the same pid where it was mounted in the namespace) and
    adds "ns_pid" (os.getpid()) and "pidns" (the namespace's inode), on which the model joins the
    process's records with the /proc witnesses' sightings. Two readlinks, once per process."""
    global _ident
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = _INIT_PIDNS
    shown, extra = pid, ""
    if ns != _INIT_PIDNS and ns[5:-1].isdigit():
        try:
            shown = int(os.readlink("/proc/self"))  # procfs names its own namespace's pid
        except (OSError, ValueError):
            pass
        extra = ',"ns_pid":%d,"pidns":%s' % (pid, ns[5:-1])
    _ident = (pid, shown, extra)
    return _ident


def _parent_seen(ppid, exe):
    """parent_seen: this process's parent (pid ppid, running exe), not Python, as /proc shows it now
    (its start, command line and watched exec-time environment). It may be gone before a scan of run's
    watch sees it (a daemon that forks its workers and exits); the child saw it start them. Here, not in
    the rest: most interpreters started from a shell write one."""
    try:
        base = "/proc/%d/" % ppid
        with open(base + "stat", "rb") as f:
            st = f.read()
        st = st[st.rindex(b")") + 2:].split()
        start = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME) + int(st[19]) / os.sysconf("SC_CLK_TCK")
        with open(base + "cmdline", "rb") as f:
            argv = [os.fsdecode(a) for a in f.read(1 << 20).split(b"\0")[:-1]][:512]
        env, reason, script = None, None, None
        try:
            with open(base + "environ", "rb") as f:
                env = _find_watched(b"\0" + f.read(1 << 22) + b"\0")
        except OSError as exc:
            reason = "permission" if isinstance(exc, PermissionError) else "unreadable"
        if env is not None and not env and not argv:
            reason, env = "empty", None  # a zombie: nothing left to read
        if exe.rsplit("/", 1)[-1] in ("bash", "sh", "dash", "zsh", "ksh", "ash"):
            try:  # bash keeps the script it runs open on fd 255: its path, whatever cwd it was named from
                script = os.readlink(base + "fd/255")
            except OSError:
                pass
        argv, q = _scrub(argv), _jstr
        fields = ',"of":%d,"ppid":%d,"start":%.3f,"argv":[%s],"exe":%s,"exec_env":%s,"env_reason":%s,"script":%s' % (
            ppid, int(st[1]), start, ",".join(map(q, argv)), q(exe),
            "null" if env is None else "{%s}" % ",".join([q(k) + ":" + q(v) for k, v in env.items()]),
            "null" if reason is None else q(reason), "null" if script is None else q(script))
        if len(fields) > _max_line - 512:  # as fields the line cap can shorten (_fit, in the rest)
            fields = {"of": ppid, "ppid": int(st[1]), "start": round(start, 3), "argv": argv, "exe": exe,
                      "exec_env": env, "env_reason": reason, "script": script}
        _emit("parent_seen", fields)
    except Exception as exc:
        _emit("probe_error", ("parent", exc))


# ---------------------------------------------------------------------------- environ guard
# Writes to unwatched variables take the path os._Environ / os.putenv / os.unsetenv would (3.8-3.14);
# those to watched ones go to _guarded_write (in the rest): recorded, and refused if pinned. If the rest
# cannot be loaded, such a write is reported (probe_error) and done as without the probe.

# os._Environ.__setitem__ / __delitem__ (of os.environ and os.environb, which keep their identity:
# `from os import environ` elsewhere sees the same guard) with writes to watched variables recorded.

def _setitem(self, key, value):
    if isinstance(key, (bytes, str)):
        name = os.fsdecode(key)
        if name in WATCHED_NAMES or name.startswith(WATCHED_PREFIXES):
            try:
                _rest()
            except Exception as exc:
                _emit("probe_error", ("guard", exc))
            else:
                return _guarded_write("set", self, key, value, name)
    key, value = self.encodekey(key), self.encodevalue(value)
    _real_putenv(key, value)
    self._data[key] = value


def _delitem(self, key):
    if isinstance(key, (bytes, str)):
        name = os.fsdecode(key)
        if ((name in WATCHED_NAMES or name.startswith(WATCHED_PREFIXES))
                and (_c_env[name] if name in _c_env else os.environ.get(name)) is not None):
            try:
                _rest()
            except Exception as exc:
                _emit("probe_error", ("guard", exc))
            else:
                return _guarded_write("unset", self, key, None, name)
    # deleting an absent variable changes nothing (and raises KeyError)
    ekey = self.encodekey(key)
    _real_unsetenv(ekey)
    try:
        del self._data[ekey]
    except KeyError:
        raise KeyError(key) from None


def putenv(name, value):
    n = os.fsdecode(name) if isinstance(name, (str, bytes, os.PathLike)) else None
    if n is not None and (n in WATCHED_NAMES or n.startswith(WATCHED_PREFIXES)):
        try:
            _rest()
        except Exception as exc:
            _emit("probe_error", ("guard", exc))
        else:
            return _guarded_write("putenv", None, name, value, n)
    return _real_putenv(name, value)


def unsetenv(name):
    n = os.fsdecode(name) if isinstance(name, (str, bytes, os.PathLike)) else None
    if n is not None and (n in WATCHED_NAMES or n.startswith(WATCHED_PREFIXES)):
        try:
            _rest()
        except Exception as exc:
            _emit("probe_error", ("guard", exc))
        else:
            return _guarded_write("unsetenv", None, name, None, n)
    return _real_unsetenv(name)


putenv.__doc__ = _real_putenv.__doc__
unsetenv.__doc__ = _real_unsetenv.__doc__


def _edge(real, name):
    """os.<name> (real) that records the process it starts: an exec before the call (it does not come
    back), posix_spawn after it (with the child's pid). Calls, passes and returns exactly as real."""
    if name.startswith("exec"):
        def edge(*args, **kw):
            _spawn_hook(name, args, kw, None)
            return real(*args, **kw)
    else:
        def edge(*args, **kw):
            pid = real(*args, **kw)
            _spawn_hook(name, args, kw, pid)
            return pid
    edge.__doc__ = real.__doc__
    return edge


def _spawn_hook(name, args, kw, pid):
    try:
        _rest()
        _spawned(name, args, kw, pid)
    except Exception as exc:
        _emit("probe_error", ("spawn", exc))


def _import_hook(name, path=None, target=None):
    # sys.meta_path's first entry until _posixsubprocess is imported (its find_spec is itself): wraps it
    if name == "_posixsubprocess":
        hook = _ref()  # noqa: F821 (a global of the copy start() registers; see there)
        if hook is not None:
            return hook(name, path, target)
    return None


def _spawn_import(name, path, target):
    try:
        _rest()
        return _fork_exec_spec(name, path, target)
    except Exception as exc:
        _emit("probe_error", ("spawn", exc))
    return None


def _fork_hook():
    rest = _ref()  # noqa: F821 (a global of the copy start() registers; see there)
    if rest is not None:
        rest("fork")


def _rest(*fork):
    """Define the rest of the probe (what only some processes need) in this module. A persistent
    install (and `run`) keeps it in a second file beside this one, run here on first use, so that a start
    does not load it; imported whole, it is already defined below. With an argument (the fork hook start()
    registers): then log the fork child's process_start, reporting errors rather than raising them."""
    try:
        if "_guarded_write" not in globals():
            from _frozen_importlib_external import SourceFileLoader  # the import system's own: no import
            name = __name__ + "_rest"
            code = SourceFileLoader(name, __file__[:-len(".py")] + "_rest.py").get_code(name)  # its .pyc
            exec(code, globals())
        if fork:
            _forked()
    except Exception as exc:
        if not fork:
            raise
        _emit("probe_error", ("fork", exc))


# ncclprobe: the rest of the probe (`ncclprobe inject install` writes what follows into a second file)

OPS = ("set", "default", "pin")


def is_watched(name):
    return name in WATCHED_NAMES or name.startswith(WATCHED_PREFIXES)


def _fail(part, exc):
    """Log a probe_error for `part` (once per part); never raises."""
    _emit("probe_error", (part, exc))


def _bounds(env):
    """NCCLPROBE_MAX_LINE, _MAX_BYTES, _MAX_FILES of env (os.environ._data), as log.c reads them: decimal,
    at least 1024 (a line must hold the common fields), 4096 (a file, a line and the budget line) and
    1, at most 2**50; anything else is the default. And NCCLPROBE_STALL_MS (the boot probe's alone: the
    C probe's writer thread keeps stalls off the host's threads), at least 100: how long one operation
    on the log filesystem may take before the probe takes it for a stall (default 2000)."""
    global _max_line, _max_bytes, _max_files, _STALL_S
    given = []
    for key, value, least in ((b"NCCLPROBE_MAX_LINE", _max_line, 1024), (b"NCCLPROBE_MAX_BYTES", _max_bytes, 4096),
                              (b"NCCLPROBE_MAX_FILES", _max_files, 1), (b"NCCLPROBE_STALL_MS", _STALL_S * 1000, 100)):
        text = env.get(key)
        given.append(int(text) if text and text.isdigit() and least <= int(text) <= 1 << 50 else value)
    _max_line, _max_bytes, _max_files = given[:3]
    _STALL_S = given[3] / 1000


def _drop(k):
    # k more lines lost, said as "dropped" on the next written line. Threads share the count as numbers
    # in _drops that each takes or puts back whole: list.pop and list.append are atomic (with the GIL
    # or without it), a global's += is not (two threads that both wrote a line said one count twice).
    try:
        k += _drops.pop()
    except IndexError:
        pass
    _drops.append(k)


def _asleep(pid, tid):
    """Whether thread tid of process pid sleeps uninterruptibly in the kernel (state D: in a log
    filesystem that stalls), as /proc says: not if that thread has ended; yes where /proc cannot say (no
    second thread then joins what may be a stall)."""
    try:
        fd = os.open("/proc/%d/task/%d/stat" % (pid, tid), os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return data[data.rfind(b")") + 2:][:1] == b"D"


def _stalled(t0, n, length, carried, torn):
    """A line begun at t0 (time.monotonic) that was not written whole (n of its length bytes; -1: none)
    or whose writing took _STALL_S: it is counted as dropped (a part written is a torn line: the next one
    starts on a line of its own), and after a stall the log filesystem is left alone for ten times as
    long (5 s to 10 min), so that a host on a stalling filesystem spends at most about a tenth of its
    time in the probe's writes."""
    global _quiet_until
    if n != length:
        if n < 0 or n < length - 1:  # (all but its newline: the line is read whole once the next ends it)
            _drop(carried + 1)  # the counts this line carried are still to be said
        if n > torn and not _tears:  # a part of it written: its own tear (past the "\n" that ended one before)
            _tears.append(object())
    now = time.monotonic()
    if now - t0 > _STALL_S:
        _quiet_until = now + min(600.0, max(5.0, 10 * (now - t0)))


def _bounded(ev, head, text, tail, given, size, torn):
    """The line of _emit (head, its fields' JSON text, tail; the fields as given) as it may be written:
    "\n" first after a torn line; the fields shortened to the line cap (_fit); a log_budget line
    instead where this process's byte budget or the directory's file budget is reached (the last)."""
    global _full
    if len(head) + len(text) + len(tail) > _max_line:
        text = _fit(given if type(given) is dict else None, _max_line - len(head) - len(tail))
    if _full is None and size + len(head) + len(text) + len(tail) > _max_bytes - 1024:
        _full = "bytes"
    if _full is not None:
        head = head.replace('"ev":"%s"' % ev, '"ev":"log_budget"', 1)
        text = ',"reached":"%s","limit":%d' % (_full, _max_files if _full == "files" else _max_bytes)
    return ("\n" if torn else "") + head + text + tail


# ---------------------------------------------------------------------------- the line cap

def _fit(fields, room):
    """The JSON of `fields` (',"key":value...', as _emit writes them) in at most `room` characters, and
    "truncated": true: where they do not fit, each string cut to room/16 characters of JSON (halved
    again while too long), list elements past half the room dropped (counted in "<key>_dropped":
    argv_dropped), then the largest fields left out (null). A line that cannot be short has no fields."""
    room -= len(',"truncated":true')
    out = dict(fields or {})
    if _chars(out) <= room:  # (argv_dropped alone): it may fit as it is
        text = _fields_json(out)
        if len(text) <= room:
            return text + ',"truncated":true'
    cut = max(16, room // 16)
    for key, value in list(out.items()):
        short = _cut(value, cut) if type(value) is list else None
        if short is not None and len(_json(short)) > room // 2:
            kept, used = [], 0
            for item in short:
                used += len(_json(item)) + 1
                if used > room // 2:
                    break
                kept.append(item)
            out[key + "_dropped"] = out.get(key + "_dropped", 0) + len(value) - len(kept)
            out[key] = kept
    text = _fields_json(_cut(out, cut))
    while len(text) > room and cut > 16:
        cut //= 2
        text = _fields_json(_cut(out, cut))
    while len(text) > room:  # many fields: the largest one left out, until the rest fits
        key = max((k for k in out if out[k] is not None), key=lambda k: len(_json(_cut(out[k], cut))), default=None)
        if key is None:
            return ',"truncated":true'
        out[key] = None
        text = _fields_json(_cut(out, cut))
    return text + ',"truncated":true'


def _cut(value, cut):
    """value with every string (and dict key) cut so that its JSON is at most `cut` characters."""
    if type(value) is str:
        if len(value) + 2 <= cut and _plain(value):
            return value
        value = value[:cut]
        size = len(_jstr(value))
        while size > cut and value:  # escapes make JSON longer than the text
            value = value[:len(value) * cut // size - 1]
            size = len(_jstr(value))
        return value
    if type(value) is dict:
        return {_cut(str(k), cut): _cut(v, cut) for k, v in value.items()}
    if type(value) in (list, tuple):
        return [_cut(v, cut) for v in value]
    return value


def _chars(value):
    """How many characters the strings of value hold (its JSON holds at least as many)."""
    if type(value) is str:
        return len(value)
    if type(value) is dict:
        return sum(len(str(k)) + _chars(v) for k, v in value.items())
    if type(value) in (list, tuple):
        return sum(map(_chars, value))
    return 0


def _fields_json(fields):
    return "".join(',"%s":%s' % (k, _json(v)) for k, v in fields.items())


# ---------------------------------------------------------------------------- log opening, the rare paths
# (_open_log, in the part every interpreter loads, has the common ones)

def _make_dir(d):
    # Create the log directory d, its last component only (0700), if its parent exists, is no system
    # directory, and nobody but its owner can write to it unless it is sticky like /tmp (elsewhere
    # another user could rename our directory away and put theirs in its place). Returns an O_PATH
    # descriptor of the new directory (or of one that appeared meanwhile: _open_log checks it).
    parent, _, leaf = d.rstrip("/").rpartition("/")
    try:  # the parent may be reached through symlinks (/tmp -> /private/tmp)
        fd = os.open(parent or "/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError("its parent does not exist (only the last directory is ever created)") from None
    try:
        mode = os.fstat(fd).st_mode
        if mode & 0o022 and not mode & 0o1000:
            raise PermissionError("group or others can write to its parent")
        if os.geteuid() == 0 and _system_dir(fd, parent or "/", leaf):  # the new directory would be root's
            raise PermissionError("it is a system directory")
        try:
            os.mkdir(leaf, 0o700, dir_fd=fd)
        except FileExistsError:
            pass
        return os.open(leaf, _DIR_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)


_S_IFMT, _S_IFREG, _S_IFIFO = 0o170000, 0o100000, 0o010000


def _private_file(st):
    return (st.st_mode & _S_IFMT) == _S_IFREG and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def _reopen(name, dfd):
    """Our file at `name` from before (pid reuse, an interpreter that exec'd another, an fd the host
    closed), opened again only if it is a private regular file of ours; anything else (a FIFO, a
    device, a file others may read, another user's) is refused without being opened."""
    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    if (st.st_mode & _S_IFMT) == _S_IFIFO:
        raise PermissionError("a FIFO sits at the log file's name")
    refusal = PermissionError("the file at its name is not a private regular file of this user")
    if not _private_file(st):
        raise refusal
    fd = os.open(name, _FILE_FLAGS & ~(os.O_CREAT | os.O_EXCL), dir_fd=dfd)
    now = os.fstat(fd)
    if not _private_file(now) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):  # swapped meanwhile
        os.close(fd)
        raise refusal
    return fd


def _stderr_usable():
    """Whether fd 2 is a place for a warning (as log.c decides): open for writing and a terminal, pipe,
    socket or other character device, or a regular file opened for appending. A host that closed
    stderr may have fd 2 on a data file of its own: never write there."""
    try:
        kind = os.fstat(2).st_mode & _S_IFMT
        fd = os.open("/proc/self/fdinfo/2", os.O_RDONLY | os.O_CLOEXEC)
        try:
            info = os.read(fd, 4096)
        finally:
            os.close(fd)
        flags = int(info.split(b"flags:", 1)[1].split()[0], 8)
    except (OSError, IndexError, ValueError):
        return False
    if flags & 3 == os.O_RDONLY:  # O_ACCMODE
        return False
    if kind == _S_IFREG:
        return bool(flags & os.O_APPEND)
    return kind in (0o020000, _S_IFIFO, 0o140000)  # character device, FIFO, socket


def _refused(d, exc):
    """The one line a refused log costs (then silence), on stderr if that is a place for it."""
    if isinstance(exc, NotADirectoryError) and exc.filename == d:  # O_NOFOLLOW|O_DIRECTORY on a symlink too
        try:
            why = "it is a symlink" if (os.lstat(d).st_mode & _S_IFMT) == 0o120000 else "not a directory"
        except OSError:
            why = "not a directory"
    elif isinstance(exc, OSError):
        why = exc.strerror or str(exc)
        if exc.strerror and exc.filename not in (None, d):
            why += " (%s)" % ascii(exc.filename)[1:-1]
    else:
        why = "%s: %s" % (type(exc).__name__, exc)
    env, said = os.environ._data, os.fsencode(d)
    if env.get(QUIET_VAR.encode(), b"0") not in (b"", b"0") or env.get(SAID_VAR.encode()) == said:
        return  # the user asked for silence, or an ancestor said it already (a re-exec, a subprocess)
    if _stderr_usable():
        os.write(2, ("ncclprobe: cannot log in %s: %s; the boot probe stays silent\n"
                     % (ascii(d)[1:-1], why)).encode("ascii", "backslashreplace"))
        _real_putenv(SAID_VAR.encode(), said)  # inherited by what this process starts (fork children
        env[SAID_VAR.encode()] = said          # are silent anyway): the tree hears it once


# ---------------------------------------------------------------------------- JSON (no json import:
# it costs more start-up time than the whole probe)

def _plain(s):
    """Whether s, between quotes, is already its JSON form (no escape needed, no truncation)."""
    return len(s) <= MAX_STR and s.isascii() and s.isprintable() and '"' not in s and "\\" not in s


def _json(v):
    t = type(v)
    if t is str:
        return '"' + v + '"' if _plain(v) else _jstr(v)
    if t is not dict and t is not list:
        if v is None:
            return "null"
        if v is True:
            return "true"
        if v is False:
            return "false"
        if isinstance(v, int):
            return str(int(v))
        if isinstance(v, float):
            return repr(v) if v - v == 0.0 else "null"  # NaN and the infinities are not JSON
        if isinstance(v, str):
            return _jstr(v)
        if not isinstance(v, (dict, list, tuple)):
            return _jstr(str(v))
    parts = []
    if isinstance(v, dict):
        try:
            plain_keys = _plain("".join(v))  # every key is plain if all of them together are
        except TypeError:  # a key that is not a str
            plain_keys = False
        for k, x in v.items():
            k = '"' + k + '":' if plain_keys else _jstr(str(k)) + ":"
            parts.append(k + '"' + x + '"' if type(x) is str and _plain(x) else k + _json(x))
        return "{" + ",".join(parts) + "}"
    for x in v:
        parts.append('"' + x + '"' if type(x) is str and _plain(x) else _json(x))
    return "[" + ",".join(parts) + "]"


# ---------------------------------------------------------------------------- process facts
# (start() finds them inlined; these serve fork children)

def _watched_now():
    """Watched part of os.environ, in its order."""
    return _find_watched(b"\0" + b"\0".join(map(b"=".join, os.environ._data.items())) + b"\0")


def _kernel_start():
    """When the kernel started this process (the fork), in unix seconds to the clock tick, as JSON (the
    boot probe runs later: a parent's write in between would look earlier than the start): "null"
    where /proc/self/stat cannot tell."""
    try:
        fd = os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            raw = os.read(fd, 4096)
        finally:
            os.close(fd)
        ticks = int(raw[raw.rindex(b")") + 2:].split()[19])  # field 22, starttime, in ticks since boot
        return "%.3f" % (time.time() - time.clock_gettime(time.CLOCK_BOOTTIME) + ticks / os.sysconf("SC_CLK_TCK"))
    except Exception:
        return "null"


def _exec_env():
    """Watched part of /proc/self/environ (the environment at execve), None if unreadable."""
    try:
        fd = os.open("/proc/self/environ", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    chunks = [b"\0"]
    try:
        while True:
            b = os.read(fd, 65536)
            if not b:
                break
            chunks.append(b)
    except OSError:
        return None
    finally:
        os.close(fd)
    chunks.append(b"\0")  # the last entry ends with one already; an extra empty entry is harmless
    return _find_watched(b"".join(chunks))


def _getenv(name):
    """os.environ.get(name), without raising and catching KeyError twice for an absent one."""
    value = os.environ._data.get(name.encode(_fs_encoding, "surrogateescape"))
    return None if value is None else value.decode(_fs_encoding, "surrogateescape")


def _secretish(name):
    """Whether a name (a variable, an option, a key of code or JSON, a header) looks like it holds a secret."""
    upper = name.upper()
    if upper.endswith(SECRET_ENDINGS):
        return True
    if "AUTHOR" in upper:  # GIT_AUTHOR_NAME and --author hold no secret; AUTHORIZATION does
        upper = upper.replace("AUTHORIZ", "AUTHIZ").replace("AUTHORIS", "AUTHIS").replace("AUTHOR", "/")
    if "TOKEN" in upper:  # a tokenizer (a model's name) and a count of tokens (--max-num-batched-tokens) neither
        upper = upper.replace("TOKENIZ", "/")
        if upper.endswith("TOKENS") and _COUNT_WORDS.intersection(upper.replace("-", "_").split("_")):
            upper = upper[:-6]
    for marker in SECRET_MARKERS:
        if marker in upper:
            return True
    return False


REDACTED = "<redacted>"
# What a redaction budget did not afford is never shown, and says so: "<not scanned: N chars>".
UNSCANNED = "<not scanned: %d chars>"
# The probe's redaction reads at most ARGV_SCAN characters of a command line and starts at most
# ARGV_SCAN // _PLACE rules (at places where a name, a URL, a token or a program's word begins): about
# a millisecond on any argv (an ordinary command line has a handful of places, and is read whole).
ARGV_SCAN = 16384
_PLACE = 128
_COUNT_WORDS = frozenset(("MAX", "MIN", "NUM"))
_NO_DIGITS = dict.fromkeys(range(48, 58))
_NAME = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_"
_KEY = _NAME + "-."   # a name as options, code, JSON and headers spell it: --api-key, db.password, X-Api-Key
_TOKEN = _NAME + "-"  # base64url
_SCHEME = _NAME + "+.-"
_BLANK = (" ", "\t", "\n")  # what separates the words of a shell command
_QUOTES = ("'", '"')
# Where a place of each kind starts (in the upper-cased text): a name that may be secret-looking, an
# option with a user:password or proxy value, and a program that has password options.
_NAME_HINTS = ("TOKEN", "SECRET", "PASS", "KEY", "CREDENTIAL", "AUTH", "PRIVATE", "COOKIE", "PAT", "PWD", "-USER",
               "PROXY")
_TOOL_HINTS = ("LOGIN", "MYSQL", "MARIADB", "MONGO", "SSHPASS", "REDIS", "VALKEY", "KEYDB", "SQLCMD", "LDAP", "TWINE",
               "OPENSSL", "CURL", "SECRET", "PUT-PARAMETER", "AUTHTOKEN", "BCP", "7Z", "ZIP ", "RAR ")
# Well-known token shapes, whatever holds them (20+ characters with a digit): GitHub, GitLab, Hugging Face,
# OpenAI-style, Slack, npm and PyPI tokens, and JSON Web Tokens (three base64url parts).
_TOKEN_PREFIXES = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "hf_", "sk-", "xoxb-", "xoxp-",
                   "xoxa-", "xoxe-", "npm_", "pypi-", "eyJ")
_TOKEN_FAMILIES = ("gh", "glpat-", "hf_", "sk-", "xox", "npm_", "pypi-", "eyJ")  # their starts, one search each
# A header or `key: value` starts after one of these (not inside a URL: "https://key:pw@host")
_BEFORE_KEY = ("", " ", "\t", "\n", "'", '"', "=", ",", ";", "{", "(", "[")
# `aws configure set NAME VALUE`, `npm config set NAME VALUE`, `git config --global NAME VALUE`
_SETTERS = ("set", "config", "--global", "--local", "--system")
_SEPARATORS = (";", "&&", "||", "|", "&")  # what follows is another program
# Programs with password options their names do not give away: program -> (the subcommand they need,
# () for none; the options whose value is a password, () for the first argument after the subcommand).
# mysql's -p takes an attached password only (-pPW): after a separate -p it prompts, the next word is a database
# (7z and rar: a separate -p prompts too).
_TOOLS = {}
for _names, _entry in (
        ("mysql mysqldump mysqladmin mysqlimport mysqlshow mysqlcheck mysqlpump mariadb mariadb-dump mariadb-admin",
         ((), ("-p",))),
        ("docker podman nerdctl buildah skopeo helm oras crane az", (("login",), ("-p",))),
        ("mongo mongosh mongodump mongorestore mongoexport mongoimport mongostat mongotop mongofiles twine sshpass",
         ((), ("-p",))),
        ("redis-cli valkey-cli keydb-cli", ((), ("-a",))),
        ("sqlcmd bcp", ((), ("-P",))),
        ("ldapsearch ldapadd ldapmodify ldapdelete ldapwhoami ldappasswd ldapcompare ldapmodrdn", ((), ("-w",))),
        ("openssl", (("enc",), ("-k",))),
        ("curl", ((), ("-b",))),
        ("zip unzip", ((), ("-P",))),
        ("7z 7za 7zr rar unrar", ((), ("-p",))),
        ("gh", (("secret",), ("-b", "--body"))),
        ("aws", (("put-parameter",), ("--value",))),
        ("wandb vault", (("login",), ())),
        ("ngrok", (("authtoken", "add-authtoken"), ()))):
    _TOOLS.update(dict.fromkeys(_names.split(), _entry))
del _names, _entry
_ATTACHED_ONLY = frozenset(n for n in _TOOLS if n.startswith(("mysql", "mariadb", "7z")) or n.endswith("rar"))
_CURL_USERPASS = ("-u", "-U", "-E", "--cert")  # user:password, and a certificate's file:password


def redact_argv(argv, limit=ARGV_SCAN):
    """argv with its secrets replaced by <redacted>: the one rule of this probe and of ncclprobe's inspect,
    run and report, for command lines and environment values alike:
      - the value of a secret-looking option (`--hf-token=X`, `--api-key X`, `--db-pass X`), assignment
        (`HF_TOKEN=X`, `password=X` of a connection string, `api_key = 'X'`), `key: X` line or header
        (`-H "Authorization: Bearer X"`), and quoted key in code or JSON (`os.environ['HF_TOKEN'] = 'X'`,
        `{"password": "X"}`), also inside a shell command (`sh -c '... --api-key X'`); watched
        variables are no secrets;
      - a URL's password (`postgres://user:PW@host`; PW may hold '/', ':' and '@'), a token used as its
        user name (`https://ghp_...@github.com`), the password of `--user u:X`, `--proxy u:X@host`;
      - the password options of known programs (`mysql -pX`, `docker login -p X`, `curl -u u:X`,
        `redis-cli -a X`, ...), PEM private keys, and well-known token shapes (ghp_..., hf_..., JWTs).
    Linear in what it reads. With a `limit` (the probe's: ARGV_SCAN), it reads at most `limit` characters
    and starts at most limit // _PLACE rules; what it did not read is shown as UNSCANNED."""
    scan = _Scan(limit)
    return [scan.element(a) for a in argv]


class _Scan:
    """One command line's redaction: the budget left, the option waiting for its value in the next
    argument, the program whose options are being read; and the argument being read (s)."""

    def __init__(self, limit):
        self.chars = limit
        self.places = None if limit is None else limit // _PLACE
        self.pending = None       # what the next argument is: "hide", "userpass", "proxy" (an option before it)
        self.tool_pending = None  # the same, for the option of a program (or its "arg": first argument)
        self.tool = None          # a program of _TOOLS, while its options are read
        self.sub = False          # its subcommand was seen
        self.last = ""            # the last word of the argument before
        self.s = self.upper = ""
        self.next = None          # _finder of the pass running over s (each pass reads from the start)

    def element(self, a):
        a, left_out = self._within_chars(a)
        if a is None:
            return UNSCANNED % left_out
        pending = self.pending or self.tool_pending
        self.pending = None
        spans = []
        if pending is not None and not (pending in ("hide", "arg") and _long_option(a)):
            self.tool_pending = None
            _value_spans(pending, a, 0, len(a), spans)  # the value of the option before it, whole
        else:
            upper = a.upper()
            words = _any_in(a, _BLANK) and (self.tool is not None or _any_in(upper, _TOOL_HINTS))
            places = _places(a, upper, words)
            if self.places is not None and places[-1] > self.places:
                a, more = self._within_places(a, words, places[-1])
                if a is None:
                    return UNSCANNED % (left_out + more)
                left_out += more
                upper = a.upper()
                places = _places(a, upper, words)
            if self.places is not None:
                self.places -= places[-1]
            self._rules(a, upper, places, spans)
            if words or self.tool is not None or a.rsplit("/", 1)[-1] in _TOOLS:
                self._tool_words(a, spans)
        self.last = (a.rsplit(None, 1) or [""])[-1]
        out = _apply(a, spans)
        return out + UNSCANNED % left_out if left_out else out

    def _within_chars(self, a):
        """(a, 0), or a cut to the characters left (_cut)."""
        if self.chars is None or len(a) <= self.chars:
            self.chars = None if self.chars is None else self.chars - len(a)
            return a, 0
        return self._cut(a, self.chars)

    def _within_places(self, a, words, places):
        """a cut to the places left (_cut), places being how many a holds."""
        n = len(a) * self.places // places
        while n > 0 and _places(a[:n], a[:n].upper(), words)[-1] > self.places:
            n //= 2
        return self._cut(a, n)

    def _cut(self, a, n):
        """(a cut at its last blank before a[n], or None if it has none there; how many characters are
        left out). A cut word may hold the start of a secret: it is left out whole. The budget is spent."""
        n = max(a.rfind(" ", 0, n), a.rfind("\t", 0, n), a.rfind("\n", 0, n))
        self.chars = self.places = 0
        return (a[:n], len(a) - n) if n > 0 else (None, len(a))

    def _rules(self, s, upper, places, spans):
        """The rules that start at a place of s: names, URLs, token shapes, PEM keys."""
        names, tokens, urls, pem, _ = places
        self.s, self.upper = s, upper
        if names:
            self.next = _finder(s)
            self._names(names, spans)
        if urls:
            self.next = _finder(s)
            self._urls(spans)
        if tokens:
            _token_shapes(s, tokens, spans)
        if pem:
            _pem_keys(s, spans)

    # ------------------------------------------------------------------ programs and their options

    def _tool_words(self, a, spans):
        """The options of programs in _TOOLS (mysql -pX, docker login -p X, curl -u u:X, wandb login X)."""
        words = _words(a) if _any_in(a, _BLANK) else [(0, len(a))]
        for i, j in words:
            w = a[i:j]
            pending, self.tool_pending = self.tool_pending, None
            if pending == "arg" and w[:1] == "-":
                self.tool_pending = pending  # `wandb login --relogin KEY`: the key is the first argument
            elif pending is not None and not (pending == "hide" and _long_option(w)):
                _value_spans(pending, a, i, j, spans)
            elif w[:1] == "-" and len(w) > 1:
                self._tool_option(a, i, j, w, spans)
            else:
                self._argument(w)
        if len(words) > 1 and self.tool_pending != "arg":
            self.tool_pending = None  # a shell command's last option takes no value from the next argument

    def _tool_option(self, s, i, j, w, spans):
        name, eq, _ = w.partition("=")
        short = name if name[:2] == "--" else name[:2]
        tool = _TOOLS.get(self.tool)
        if self.tool == "curl" and short in _CURL_USERPASS:
            kind = "userpass"
        elif tool is not None and self.sub and short in tool[1]:
            kind = "hide"
        else:
            return
        if len(name) > len(short):  # `-pPASSWORD`, `-p=PASSWORD`, `-uuser:PASSWORD`
            _value_spans(kind, s, i + 2 + (s[i + 2:i + 3] == "="), j, spans)
        elif eq:
            _value_spans(kind, s, i + len(name) + 1, j, spans)
        elif kind == "userpass" or self.tool not in _ATTACHED_ONLY:
            self.tool_pending = kind

    def _argument(self, w):
        if w in _SEPARATORS or w[-1:] == ";":
            self.tool = None
            return
        base = w.rsplit("/", 1)[-1]
        if base in _TOOLS:
            self.tool, self.sub = base, not _TOOLS[base][0]
        elif self.tool is not None and w in _TOOLS[self.tool][0]:
            self.sub = True
            if not _TOOLS[self.tool][1]:
                self.tool_pending = "arg"

    # ------------------------------------------------------------------ names: options, assignments, keys

    def _names(self, hints, spans):
        """Each name holding a hint, in order, once: its value if the name looks secret."""
        places = []
        for hint in hints:
            k = self.upper.find(hint)
            while k >= 0:
                places.append(k)
                k = self.upper.find(hint, k + 1)
        done = 0
        for k in sorted(places):
            if k >= done:
                done = self._name(*_name_around(self.s, k), spans)

    def _name(self, n0, n1, spans):
        """Hide the value of the name s[n0:n1] if it is secret; returns where the next name may start."""
        s = self.s
        name, before, after = s[n0:n1], s[n0 - 1:n0] if n0 else "", s[n1:n1 + 1]
        if name[:1] == "-" and before in _BEFORE_KEY:
            return self._option(n1, name, after, spans)
        if is_watched(name) or not _secretish(name):
            return n1
        eq = n1 + _run(s, n1, " \t", n1 + 64)
        if s[eq:eq + 1] == "=" and s[eq + 1:eq + 2] != "=":
            return self._assignment(n0, n1, eq, before, spans)
        if after == ":" and s[n1 + 1:n1 + 2] not in ("/", ":") and before in _BEFORE_KEY:
            return self._key_value(n1, before, spans)
        if before in _QUOTES and after == before:
            return self._quoted(n1 + 1, spans)
        if after in _BLANK + ("",) and self._setter(n0):
            return self._next_word(n1, "hide", spans)
        return n1

    def _option(self, n1, name, after, spans):
        """--api-key X, --token=X, --user u:X, --proxy u:X@host (a word of its own)."""
        if _secretish(name):
            kind = None if name.upper().endswith("STDIN") else "hide"  # --password-stdin takes no value
        elif name in ("--user", "--proxy-user"):
            kind = "userpass"
        elif "PROXY" in name.upper() and name[:2] == "--":
            kind = "proxy"
        else:
            kind = None
        if kind is None or after not in ("=", "", " ", "\t", "\n"):
            return n1
        if after == "=":
            e = self._value_end(n1 + 1)
            _value_spans(kind, self.s, n1 + 1, e, spans)
            return e
        return self._next_word(n1, kind, spans)

    def _next_word(self, k, kind, spans):
        """The word after s[k] is the value (of this kind); at the end of the argument, the next argument is."""
        s = self.s
        i = k + _run(s, k, " \t\n")
        if i >= len(s):
            if i == k:  # the argument is the option alone (in a shell command, the next argument is no value)
                self.pending = kind
            return i
        e = self._value_end(i)
        if not (kind == "hide" and _long_option(s[i:e])):
            _value_spans(kind, s, i, e, spans)
        return e

    def _assignment(self, n0, n1, eq, before, spans):
        """NAME=VALUE anywhere in a word (`env X=1`, `--env=X=1`, `a;X=1`, `?u=a&password=X`, `api_key = 'X'`)."""
        s = self.s
        if before in ("_", "-") or before.isalnum() or s[n0].isdigit() or s[n0] in "-.":
            return n1
        v = eq + 1
        if eq > n1:  # code: `api_key = 'X'`
            v += _run(s, v, " \t", v + 64)
        e = self._value_end(v, True)
        if v < e:
            spans.append((v, e))
        return max(e, n1)

    def _value_end(self, v, parts=False):
        """Where a value starting at s[v] ends: after its closing quote, or at the next blank; with
        `parts`, also at a '&' ';' ',' before the next NAME= (a query, connection string or option list)."""
        s = self.s
        if v >= len(s):
            return v
        if s.startswith(REDACTED, v):  # redacted already (an old log read again): the same text again
            return v + len(REDACTED)
        if s[v] in _QUOTES:
            close = _closing(s, v + 1, s[v])
            return len(s) if close < 0 else close + 1
        end = self.next(_BLANK, v, len(s))
        for sep in "&;," if parts else ():
            k = self.next(sep, v, end)
            n = _run(s, k + 1, _NAME, end) if k < end else 0
            if n and s[k + 1 + n:k + 2 + n] == "=":
                end = k
        return end

    def _key_value(self, colon, before, spans):
        """`Name: value` (a header, a YAML line, openssl's pass:X): the value, to its closing quote when
        the name opened one, else to the end of the line (after ": ") or of the word (after ":")."""
        s = self.s
        v = colon + 1 + _run(s, colon + 1, " \t")
        if before in _QUOTES:
            e = s.find(before, v)
        elif v > colon + 1:
            e = s.find("\n", v)
        else:
            e = self.next(_BLANK, v, len(s))
        e = len(s) if e < 0 else e
        if v < e:
            spans.append((v, e))
        return max(e, colon + 1)

    def _quoted(self, t, spans):
        """A quoted key's value, as code writes them: `os.environ['HF_TOKEN'] = 'x'`, `setenv("API_KEY",
        "x")`, `{"password": "x"}`, `{"pin": 1234}`; an unclosed value runs to the end."""
        s = self.s
        v, sep = _after_separator(s, t)
        if v is None:
            return t
        if s[v:v + 1] in _QUOTES:
            close = _closing(s, v + 1, s[v])
            e = len(s) if close < 0 else close
            if sep == "," and s[e + 1 + _run(s, e + 1, " \t\n", e + 65):][:1] == ":":
                return t  # `{"grant_type": "refresh_token", "refresh_token": "X"}`: a key follows, not a value
            if v + 1 < e:
                spans.append((v + 1, e))
            return e + 1
        if sep == ":":  # a number or a name in JSON or code (after a ',' it is the next argument of a call)
            n = _run(s, v, _TOKEN + ".+")
            if n:
                spans.append((v, v + n))
            return v + n
        return v

    def _setter(self, n0):
        """Whether the word before the one holding s[n0] is `set`, `config`, --global... (`aws configure set
        NAME VALUE`, `npm config set //host/:_authToken VALUE`); words longer than 256 are no names."""
        s = self.s
        start = max(s.rfind(b, max(0, n0 - 256), n0) for b in _BLANK) + 1
        if start == 0:
            return n0 <= 256 and self.last in _SETTERS
        w = s[max(0, start - 24):start].rstrip(" \t")
        return w[max(w.rfind(" "), w.rfind("\t"), w.rfind("\n")) + 1:] in _SETTERS

    # ------------------------------------------------------------------ URLs

    def _urls(self, spans):
        """scheme://user:PASSWORD@host: the password may hold '/', ':' and '@' (it ends at the last '@'
        before the host's '/', '?' or '#'); host:port/path@x is no password. A user name alone
        (scheme://NAME@host) is hidden when it has a token's shape. Reads at most _URL_MOST past "://"."""
        s, nxt, k = self.s, self.next, self.s.find("://")
        while k >= 0:
            a = k + 3
            e = min(nxt(_BLANK, a, len(s)), a + _URL_MOST)
            nk = a
            if k > 0 and s[k - 1] in _SCHEME and s[a:a + 1] not in ("[", ""):
                u = nxt(":@/?#", a, e)
                if u < e and s[u] == "@" and _token_like(s, a, u):
                    spans.append((a, u))
                elif u < e and s[u] == ":":
                    p = u + 1
                    at = nxt("@", p, e)
                    port = s[p:nxt("/?#", p, e)]
                    if at < e and port and not port.isdigit():
                        host = nxt("/?#", at, e)
                        spans.append((p, s.rfind("@", at, host)))
                        nk = host
            k = s.find("://", nk)


_URL_MOST = 8192  # a URL's credentials end within this many characters of its "://"


def _places(a, upper, words):
    """Where rules may start in a (the budget's unit): (the name hints it holds, the token prefixes it
    holds, its URLs, its PEM keys, how many places in all, words too when a program's options are read)."""
    names = [h for h in _NAME_HINTS if h in upper]
    tokens = [p for p in _TOKEN_FAMILIES if p in a]
    urls, pem = a.count("://"), a.count("PRIVATE KEY-----")
    n = urls + pem
    for hint in names:
        n += upper.count(hint)
    for prefix in tokens:
        n += a.count(prefix)
    for blank in _BLANK if words else ():
        n += a.count(blank)
    return names, tokens, urls, pem, n


def _any_in(text, hints):
    for hint in hints:
        if hint in text:
            return True
    return False


def _name_around(s, k, most=256):
    """(start, end) of the name (letters, digits, '_' '-' '.') holding s[k], at most `most` either side."""
    w = s[max(0, k - most):k]
    return k - len(w) + len(w.rstrip(_KEY)), k + _run(s, k, _KEY, k + most)


def _run(s, i, chars, end=None):
    """How many characters of `chars` follow s[i] (up to end), reading those and one window past them."""
    end = len(s) if end is None else min(end, len(s))
    size = 64
    while True:
        w = s[i:min(i + size, end)]
        n = len(w) - len(w.lstrip(chars))
        if n < len(w) or i + size >= end:
            return n
        size *= 4


def _finder(s):
    """find(chars, i, end): the first of `chars` at or after s[i], or end if none is before it; for
    increasing i, each character of s is read once per character of chars."""
    at = {}

    def find(chars, i, end):
        best = end
        for ch in chars:
            k = at.get(ch, -2)
            if k == -2 or -1 < k < i:
                k = at[ch] = s.find(ch, i)
            if 0 <= k < best:
                best = k
        return best
    return find


def _words(s):
    """(start, end) of each word of s as a shell splits it: at spaces, tabs and newlines outside quotes
    (a backslash escapes a quote, except inside single quotes)."""
    words, pos, start, quote = [], 0, None, None
    for piece in s.replace("\t", " ").replace("\n", " ").split(" "):
        if start is None:
            start = pos
        if quote is not None or "'" in piece or '"' in piece:
            quote = _quote_after(piece, quote)
        pos += len(piece) + 1
        if quote is None:
            if pos - 1 > start:
                words.append((start, pos - 1))
            start = None
    if start is not None and start < len(s):
        words.append((start, len(s)))  # an unclosed quote: the rest is one word
    return words


def _quote_after(piece, quote):
    """The quote still open at the end of piece, given the one open at its start (None: none)."""
    i = 0
    while True:
        if quote is None:
            a, b = piece.find("'", i), piece.find('"', i)
            k = a if b < 0 or 0 <= a < b else b
            if k < 0:
                return None
            if not _escaped(piece, i, k):
                quote = piece[k]
            i = k + 1
        else:
            k = piece.find(quote, i)
            while k >= 0 and quote == '"' and _escaped(piece, i, k):
                k = piece.find(quote, k + 1)
            if k < 0:
                return quote
            quote, i = None, k + 1


def _escaped(s, start, k):
    """Whether s[k] follows an odd run of backslashes (none of them before s[start])."""
    run = s[start:k]
    return (len(run) - len(run.rstrip("\\"))) % 2 == 1


def _closing(s, i, quote):
    """Where the quote opened before s[i] closes (a backslash escapes it), -1 if it does not."""
    start, k = i, s.find(quote, i)
    while k >= 0 and _escaped(s, start, k):
        start, k = k + 1, s.find(quote, k + 1)
    return k


def _value_spans(kind, s, i, j, spans):
    """What to hide of s[i:j], the value of an option of this kind."""
    if i >= j:
        return
    if kind in ("hide", "arg"):
        spans.append((i, j))
        return
    if j - i >= 2 and s[i] in _QUOTES and s[j - 1] == s[i]:
        i, j = i + 1, j - 1
    if kind == "userpass":  # user:password (a uid:gid is no secret)
        colon = s.find(":", i, j)
        if colon >= 0 and colon + 1 < j and not (s[i:colon].isdigit() and s[colon + 1:j].isdigit()):
            spans.append((colon + 1, j))
    elif kind == "proxy":  # [scheme://]user:password@host:port
        at = s.rfind("@", i, j)
        scheme = s.find("://", i, max(at, i))
        colon = s.find(":", i if scheme < 0 else scheme + 3, max(at, i))
        if colon >= 0:
            spans.append((colon + 1, at))


def _after_separator(s, t):
    """(where the value starts after a quoted key ending before s[t], past `] =`, `:` or `,` and blanks;
    that separator), or (None, None)."""
    t += _run(s, t, " \t", t + 64)
    sep = s[t:t + 1]
    if sep == "]":
        t += 1 + _run(s, t + 1, " \t", t + 65)
        if s[t:t + 1] != "=":
            return None, None
    elif sep not in (":", ","):
        return None, None
    return t + 1 + _run(s, t + 1, " \t\n", t + 129), sep


def _token_like(s, i, j):
    """A URL's user name that is a token (GitHub's https://TOKEN@github.com, a Sentry DSN's key)."""
    return j - i >= 20 and _run(s, i, _TOKEN, j) == j - i and _has_digit(s[i:j])


def _has_digit(t):  # a random token of 20+ characters has one; words joined by '-' or '_' usually not
    return len(t.translate(_NO_DIGITS)) < len(t)


def _token_shapes(s, families, spans):
    """Tokens of a well-known shape (_TOKEN_PREFIXES), found by the start their prefixes share."""
    for family in families:
        chars = _TOKEN + "." if family == "eyJ" else _TOKEN
        k = s.find(family)
        while k >= 0:
            n = _run(s, k, chars)
            if (n >= 20 and (k == 0 or s[k - 1] not in chars) and s.startswith(_TOKEN_PREFIXES, k)
                    and _has_digit(s[k:k + n]) and (family != "eyJ" or s.count(".", k, k + n) >= 2)):
                spans.append((k, k + n))
            k = s.find(family, k + max(n, 1))


def _pem_keys(s, spans):
    """The body of a PEM private key (-----BEGIN ... PRIVATE KEY----- ... -----END ... PRIVATE KEY-----)."""
    k = s.find("PRIVATE KEY-----")
    while k >= 0:
        v = k + len("PRIVATE KEY-----")
        e = s.find("-----END", v)
        if e < 0:
            spans.append((v, len(s)))
            return
        if v < e:
            spans.append((v, e))
        k = s.find("PRIVATE KEY-----", e)
        if k >= 0 and s.find("\n", e, k) < 0:  # the END line's own
            k = s.find("PRIVATE KEY-----", k + 1)


def _apply(s, spans):
    """s with each span replaced by REDACTED (spans that overlap or touch, by one)."""
    if not spans:
        return s
    spans.sort()
    out, last = [], 0
    for i, j in spans:
        if i > last or not out:
            out += (s[last:i], REDACTED)
        last = max(last, j)
    out.append(s[last:])
    return "".join(out)


def _long_option(w):
    # `--no-auth --port 80`: a flag, not a value (a PEM key's "-----BEGIN" is a value)
    return w[:2] == "--" and w[2:3].isalpha()


def _process_start(extra, env, exec_env, live):
    """process_start fields; exec_env_differs compares /proc's view with `live`."""
    profile = []
    for op, name, value, prev, changed in _start.get("profile") or ():
        profile.append({"op": op, "var": name, "value": value, "previous": prev, "applied": changed})
    fields = {"ppid": _shown_ppid(), "argv": _start.get("argv"), "exe": sys.executable,
              "prefix": sys.prefix, "python": "%d.%d.%d" % sys.version_info[:3], "mode": _start.get("mode"),
              "env": env, "exec_env": exec_env, "exec_env_differs": None if exec_env is None else exec_env != live,
              "profile": profile if "profile" in _start else None,
              "profile_unwatched": _start.get("profile_unwatched", 0), "pinned": dict(_pins),
              "start": None}
    if "argv_dropped" in _start:  # past the 512 a start reads
        fields["argv_dropped"] = _start["argv_dropped"]
    fields.update(extra)
    start = _kernel_start()
    fields["start"] = None if start == "null" else float(start)
    return fields


def _shown_ppid():
    """The parent's pid as this /proc shows it (see _identity): os.getppid() in the initial pid namespace."""
    ident = _ident if _ident[0] == os.getpid() else _identity(os.getpid())
    if ident[0] == ident[1]:
        return os.getppid()
    try:
        with open("/proc/self/stat", "rb") as f:
            raw = f.read()
        return int(raw[raw.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return os.getppid()


def _start_fields(fields):
    """process_start's fields, or their JSON already shortened to the line cap where the command line
    alone would pass it (serializing a 2 MB argv whole before shortening it costs its size again)."""
    if sum(map(len, fields.get("argv") or ())) + len(fields) < _max_line // 2 and "argv_dropped" not in fields:
        return fields
    return _fit(fields, _max_line - 256)


def _forked():
    """process_start of a fork child (os.register_at_fork, through _rest)."""
    global _alone, _full, _busy, _quiet_until
    del _drops[:]  # its own file, its own counts; one thread; a stall in flight at the fork is its too
    del _tears[:]
    _alone = True
    if _full == "bytes":
        _full = None
    busy = _busy
    if busy and time.monotonic() - busy[0] > _STALL_S and _asleep(busy[1], busy[2]):  # (the parent's thread)
        _quiet_until = max(_quiet_until, time.monotonic() + 5.0)
    _busy = None
    _writes.clear()
    parent = _start.get("pid")
    _start["pid"] = _identity(os.getpid())[1]
    try:
        env = _watched_now()
        _emit("process_start", _start_fields(_process_start({"forked_from": parent}, env, _exec_env(), env)))
    finally:
        _alone = False  # (if the line was not written: the next opening may not be alone)


def _profile_entries():
    """The profile's entries: the installed one, then the file NCCLPROBE_PROFILE names ([] and a
    probe_error if either cannot be read or parsed)."""
    entries = []
    try:
        if INSTALLED and INSTALLED.get("entries") is not None:  # parsed at install time
            entries.extend(map(tuple, INSTALLED["entries"]))
        elif INSTALLED and INSTALLED.get("profile"):
            entries.extend(parse_profile(INSTALLED["profile"], "installed profile"))
        path = _getenv(PROFILE_VAR)
        if path:
            entries.extend(parse_profile(_read_text(path), path))
    except (OSError, ValueError) as exc:
        entries = []
        _fail("profile", exc)
    return entries


class ProfileError(ValueError):
    """A malformed profile line; the message starts with `source:line` (or the CLI option)."""


def _valid_name(name):
    return (bool(name) and name.isascii() and (name[0].isalpha() or name[0] == "_")
            and all(c.isalnum() or c == "_" for c in name))


# ---------------------------------------------------------------------------- profile format
# One directive a line; blank lines and lines starting with '#' are ignored:
#   set NAME=VALUE       NAME=VALUE in every process (the value is everything after the first '=')
#   default NAME=VALUE   NAME=VALUE only where NAME is absent
#   pin NAME             refuse in-process writes that would change NAME (watched variables only)

def parse_line(line, where):
    """One profile line -> (op, name, value) (value None for pin), or None for a blank/comment."""
    text = line.rstrip("\r\n").lstrip()
    if not text.strip() or text.startswith("#"):
        return None
    parts = text.split(None, 1)
    op, rest = parts[0], (parts[1] if len(parts) > 1 else "")
    if op not in OPS:  # the line is not shown: it may be a secret's value (a `set` forgotten)
        raise ProfileError("%s: unknown directive (expected 'set NAME=VALUE', 'default NAME=VALUE' "
                           "or 'pin NAME')" % where)
    if op == "pin":
        name = rest.strip()
        if "=" in name:
            raise ProfileError("%s: pin takes a name only, not NAME=VALUE (use 'set' for the value)" % where)
        if not _valid_name(name):
            raise ProfileError("%s: %r is not a valid environment variable name" % (where, name))
        if not is_watched(name):
            raise ProfileError("%s: %s is not a watched variable; only watched variables (NCCL_*, "
                               "TORCH_NCCL_*, CUDA_VISIBLE_DEVICES, ...) can be pinned" % (where, name))
        return (op, name, None)
    if "=" not in rest:  # not shown: 'set HF_TOKEN hf_...' would print the value
        raise ProfileError("%s: expected '%s NAME=VALUE' (the line has no '=')" % (where, op))
    name, value = rest.split("=", 1)
    name = name.strip()
    if not _valid_name(name):
        raise ProfileError("%s: %r is not a valid environment variable name" % (where, name))
    if "\n" in value or "\r" in value or "\0" in value:
        raise ProfileError("%s: the value of %s contains a newline or NUL" % (where, name))
    return (op, name, value)


def check_entries(entries):
    """Reject contradictions: a name both `set` and `default`, or set twice to different values.
    entries: (op, name, value, where) tuples. Returns (op, name, value) tuples without repeats."""
    seen = {}
    out = []
    for op, name, value, where in entries:
        key = (op == "pin", name)
        if key in seen:
            prev_op, prev_value = seen[key]
            if (prev_op, prev_value) != (op, value):
                shown = prev_value if is_watched(name) else "<redacted>"  # values of others are never shown
                raise ProfileError("%s: %s is already given as '%s %s=%s'" % (where, name, prev_op, name, shown))
            continue
        seen[key] = (op, value)
        out.append((op, name, value))
    return out


def parse_profile(text, source="profile"):
    """Profile text -> list of (op, name, value); ProfileError names the offending line."""
    entries = []
    for lineno, line in enumerate(text.split("\n"), 1):
        where = "%s:%d" % (source, lineno)
        entry = parse_line(line, where)
        if entry is not None:
            entries.append(entry + (where,))
    return check_entries(entries)


def format_profile(entries):
    """The inverse of parse_profile."""
    lines = []
    for op, name, value in entries:
        lines.append("pin %s" % name if op == "pin" else "%s %s=%s" % (op, name, value))
    return "".join(line + "\n" for line in lines)


# ---------------------------------------------------------------------------- recording guarded writes

def _guarded_write(op, env, key, value, name):
    """A write to the watched variable `name`, as os.environ[key] = value ("set"), del os.environ[key]
    ("unset", env: os.environ or os.environb), os.putenv or os.unsetenv would do it (3.8-3.14)."""
    if op == "set":
        ekey, evalue = env.encodekey(key), env.encodevalue(value)

        def base():
            _real_putenv(ekey, evalue)
            env._data[ekey] = evalue
            _c_env.pop(name, None)
        return _write(name, os.fsdecode(value), "set", base)
    if op == "unset":
        ekey = env.encodekey(key)

        def base():
            _real_unsetenv(ekey)
            try:
                del env._data[ekey]
            except KeyError:
                raise KeyError(key) from None
            finally:
                _c_env.pop(name, None)
        return _write(name, None, "unset", base)
    if op == "putenv":
        new = os.fsdecode(value)

        def base():
            _real_putenv(key, value)
            _c_env[name] = new
        return _write(name, new, "putenv", base)

    def base():
        _real_unsetenv(key)
        _c_env[name] = None
    return _write(name, None, "unsetenv", base)


_stdlib = getattr(sys, "_stdlib_dir", None) or os.path.dirname(getattr(os, "__file__", "") or "")
_stdlib = _stdlib.rstrip("/") + "/" if _stdlib else None


def _is_stdlib(filename):
    if filename.startswith("<frozen"):
        return True
    if _stdlib and filename.startswith(_stdlib):
        return "-packages" not in filename[len(_stdlib):]
    return False


def _writer():
    """`file:line function` of the first frame outside this probe and the standard library."""
    own = (start.__code__.co_filename, _writer.__code__.co_filename)  # a persistent install has two files
    frame = sys._getframe(1)
    first = None
    while frame is not None:
        fn = frame.f_code.co_filename
        if fn not in own:
            if first is None:
                first = frame
            if not _is_stdlib(fn):
                break
        frame = frame.f_back
    frame = frame or first
    if frame is None:
        return "?"
    return "%s:%d %s" % (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


def _blocks(name, new):
    return name in _pins and _pins[name] != new


# A variable written over and over (a scheduler setting CUDA_VISIBLE_DEVICES per task) would fill the
# process's byte budget with one kind of line and leave none for what comes later (a fork child, a pin
# refused, comm inits of the C probe in the same file): its first COALESCE writes are logged, then only
# its 1024th, 2048th, 4096th, ... write, with "repeats": how many were not logged since its last line.
COALESCE = 1000
_writes = {}  # variable -> writes in this process (a fork child starts afresh)


def _record(name, old, new, op, blocked):
    try:
        n = _writes[name] = _writes.get(name, 0) + 1
        if n > COALESCE and n & (n - 1):  # not a power of two: counted only
            return
        fields = {"var": name, "old": old, "new": new, "where": _writer(), "op": op, "blocked": blocked}
        if n == COALESCE:
            fields["coalescing"] = True  # from here on, see above
        elif n > COALESCE:
            fields["repeats"] = n - max(COALESCE, n // 2) - 1
        _emit("env_write", fields)
    except Exception as exc:
        _fail("guard", exc)


def _old(name):
    if name in _c_env:
        return _c_env[name]
    return os.environ.get(name)


def _write(name, new, op, base_op):
    """Shared path of every guarded write: record it, refuse it if pinned, else perform it."""
    old = _old(name)
    if _blocks(name, new):
        _record(name, old, new, op, True)
        return
    base_op()
    _record(name, old, new, op, False)


def _read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "surrogateescape")


# ---------------------------------------------------------------------------- spawn: the edges it starts

SPAWN_ARGV = 512  # elements of a started command line kept (as process_start keeps its own)


def _fork_exec_spec(name, path, target):
    """_posixsubprocess's spec from the finders after start()'s import hook (which leaves sys.meta_path here),
    its loader made to wrap fork_exec once the module is made; None (the import goes on as without the probe)
    where the loader is no instance of its own (a built-in module: its class is shared, never patched)."""
    ours = _import_hook.__code__
    for finder in sys.meta_path:
        if getattr(finder, "__code__", None) is ours:
            continue
        find = getattr(finder, "find_spec", None)
        spec = find(name, path, target) if find is not None else None
        if spec is not None:
            break
    else:
        return None
    loader = spec.loader
    real = getattr(loader, "exec_module", None)
    if loader is None or isinstance(loader, type) or real is None:
        return None

    def exec_module(module):
        real(module)
        try:
            _wrap_fork_exec(module)
        except Exception as exc:
            _fail("spawn", exc)

    loader.exec_module = exec_module
    # the hook is done (the import machinery iterates sys.meta_path: it is replaced, not changed in place)
    sys.meta_path = [f for f in sys.meta_path if getattr(f, "__code__", None) is not ours]
    return spec


def _wrap_fork_exec(module):
    """module.fork_exec (what subprocess.Popen and multiprocessing's spawn and forkserver call) recording
    the child it started: after it returned the child's pid, where its arguments read as this probe knows
    them (checked at each call: any other shape is left unrecorded)."""
    real = getattr(module, "fork_exec", None)
    if real is None or getattr(real, "_ncclprobe", False):
        return

    def fork_exec(*args, **kw):
        pid = real(*args, **kw)
        try:
            _spawned("fork_exec", args, kw, pid)
        except Exception as exc:
            _fail("spawn", exc)
        return pid

    fork_exec.__doc__ = real.__doc__
    fork_exec._ncclprobe = True
    module.fork_exec = fork_exec


def _text(v):
    return v if type(v) is str else os.fsdecode(v)


def _env_of(env):
    """(watched part, count) of an environment passed: a mapping or a list of b"NAME=VALUE" entries."""
    found = {}
    items = env.items() if hasattr(env, "items") else (_text(e).partition("=")[::2] for e in env)
    n = 0
    for k, v in items:
        n += 1
        k = _text(k)
        if is_watched(k):
            found[k] = _text(v)
    return found, n


def _executable(path):
    return type(path) is int or os.access(path, os.X_OK)


def _spawned(name, args, kw, pid):
    """One `spawn` line: `name` (execv, execve, posix_spawn, posix_spawnp, fork_exec) was called with
    args/kw and started pid (None: an exec, this process itself)."""
    exe = env = None
    if name == "fork_exec":  # (args, executable_list, close_fds, pass_fds, cwd, env, ...): 3.8 to 3.14
        if kw or len(args) < 6 or not isinstance(args[0], (list, tuple)) or not isinstance(args[1], (list, tuple)) or not (
                args[5] is None or isinstance(args[5], (list, tuple)) and all(type(e) is bytes and b"=" in e
                                                                             for e in args[5])):
            return
        argv, env = args[0], args[5]
        for path in args[1]:  # the child tries them in order
            if _executable(path):
                exe = _text(path)
                break
        else:
            return  # nothing it could run: no child ran (Popen raises)
    else:
        path = args[0] if args else kw.get("path")
        argv = args[1] if len(args) > 1 else kw.get("argv")
        if name in ("execve", "posix_spawn", "posix_spawnp"):
            env = args[2] if len(args) > 2 else kw.get("env")
        if name == "posix_spawnp" and type(path) is not int and "/" not in _text(path):
            for d in (_getenv("PATH") or os.defpath).split(":"):
                if _executable(os.path.join(d or ".", _text(path))):
                    exe = os.path.join(d or ".", _text(path))
                    break
        elif type(path) is int:
            try:
                exe = os.readlink("/proc/self/fd/%d" % path)
            except OSError:
                pass
        elif _executable(path):
            exe = _text(path)
        elif name.startswith("exec"):
            return  # os.execvp tries each PATH entry: only the one that can run is an edge
    call, where = _spawn_caller(name)
    argv = list(argv or ())
    fields = {"call": call, "where": where}
    if len(argv) > SPAWN_ARGV:
        fields["argv_dropped"] = len(argv) - SPAWN_ARGV
        del argv[SPAWN_ARGV:]
    fields["argv"] = _scrub([_text(a) for a in argv])
    if env is None:
        watched, count = _watched_now(), len(os.environ._data)
    else:
        watched, count = _env_of(env)
    fields.update(exe=exe, child=pid if type(pid) is int else None, exec=pid is None,
                  env_given=env is not None, env=watched, env_count=count)
    _emit("spawn", fields)


def _spawn_caller(name):
    """(call, where): what the code outside the standard library called, as it spelled it (subprocess.Popen,
    multiprocessing, pty.spawn, os.execvpe, os.spawnlp, ...), and its "file:line"."""
    own = (start.__code__.co_filename, _spawned.__code__.co_filename)
    frame, outer_os, seen, where = sys._getframe(1), None, set(), None
    while frame is not None:
        fn = frame.f_code.co_filename
        if fn not in own:
            if not _is_stdlib(fn):
                where = "%s:%d" % (fn, frame.f_lineno)
                break
            base = fn[8:-1] + ".py" if fn.startswith("<frozen ") else fn.rsplit("/", 1)[-1]  # <frozen os>: 3.11+
            seen.add("multiprocessing" if "/multiprocessing/" in fn else base)
            if base == "os.py":
                outer_os = frame.f_code.co_name
        frame = frame.f_back
    if "multiprocessing" in seen:
        call = "multiprocessing"
    elif "pty.py" in seen:
        call = "pty.spawn"
    elif "subprocess.py" in seen:
        call = "subprocess.Popen"
    elif outer_os and not outer_os.startswith("_"):
        call = "os." + outer_os
    else:
        call = "_posixsubprocess.fork_exec" if name == "fork_exec" else "os." + name
    return call, where
