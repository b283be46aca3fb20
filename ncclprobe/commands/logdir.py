"""ncclprobe's own files under the log discipline of DESIGN.md §4: `run`'s log directory and its
run.json, the boot probe's directory in it, `inject install --dir`.

The rules are the boot probe's own functions (probes/ncclprobe_boot.py, installed as
ncclprobe._lib.ncclprobe_boot, which ncclprobe.commands.profile imports already: stdlib only, no side effects
on import), so the tool cannot accept a directory the probes would then refuse, and one fix fixes
all writers. A log directory is a real directory (never reached through a symlink) of this euid that
group and others cannot write to and, for root, no system directory (/etc, /usr, /var but /var/tmp,
...); a missing one is created 0700, its last component only, in a parent that is no system
directory and that nobody else can write to unless it is sticky (/tmp). Files are created new
(O_EXCL, O_NOFOLLOW, O_NONBLOCK: a FIFO or symlink planted at the name fails at once) and checked
with fstat; run.json is replaced by rename, which never follows a symlink at its name.
"""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from ncclprobe._lib import ncclprobe_boot as _boot

FILE_FLAGS = _boot._FILE_FLAGS  # O_WRONLY|O_APPEND|O_CREAT|O_EXCL|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC


class Unfit(Exception):
    """A directory the log discipline refuses; the message names it and says why."""

    def __init__(self, path: str | os.PathLike, why: str):
        super().__init__(f"log directory {path}: {why}")
        self.path, self.why = str(path), why


def _why(exc: OSError, path: str) -> str:
    if isinstance(exc, NotADirectoryError) and exc.filename == path:  # O_NOFOLLOW|O_DIRECTORY on a symlink too
        try:
            return "it is a symlink" if stat.S_ISLNK(os.lstat(path).st_mode) else "not a directory"
        except OSError:
            return "not a directory"
    return exc.strerror or str(exc)


def open_dir(path: str | os.PathLike, create: bool = True) -> int:
    """An O_PATH descriptor of the log directory `path`, checked (and created, with create, if it is
    missing) as the probes check theirs; Unfit otherwise."""
    d = str(Path(path).absolute())  # as the boot probe makes it absolute: no normalisation of '..'
    try:
        try:
            fd = os.open(d, _boot._DIR_FLAGS)
        except FileNotFoundError:
            if not create:
                raise
            fd = _boot._make_dir(d)
    except OSError as exc:
        raise Unfit(d, _why(exc, d)) from None
    try:
        st = os.fstat(fd)
        euid = os.geteuid()
        if st.st_uid != euid:
            raise Unfit(d, "it belongs to another user")
        if st.st_mode & 0o022:
            raise Unfit(d, "group or others can write to it")
        if st.st_uid == 0 and _boot._system_dir(fd, d):
            raise Unfit(d, "it is a system directory")
        if euid != 0 and st.st_mode & 0o300 != 0o300:
            raise Unfit(d, "its owner (this user) cannot write to it")
    except BaseException:
        os.close(fd)
        raise
    return fd


def check(path: str | os.PathLike, create: bool = True) -> Path:
    """The absolute path of a fit log directory (created if missing, with create); Unfit otherwise."""
    os.close(open_dir(path, create))
    return Path(path).absolute()


def fresh(prefix: str) -> Path:
    """A new log directory (0700) under the temporary directory (TMPDIR), by the same rules."""
    parent = Path(tempfile.gettempdir()).absolute()
    for _ in range(100):
        d = parent / (prefix + os.urandom(6).hex())
        if not os.path.lexists(d):  # never an existing one: fresh means made now, by us
            fd = open_dir(d, create=True)
            os.close(fd)
            return d
    raise Unfit(parent, "no unused name for a fresh directory in it")


def replace_file(directory: str | os.PathLike, name: str, data: bytes) -> None:
    """Write `name` in the log directory whole: into a new temporary file (FILE_FLAGS, mode 0600,
    fstat-checked), then renamed over `name` (rename replaces a symlink there, never follows it).
    The directory is checked again first: Unfit, or OSError if the write fails."""
    dfd = open_dir(directory, create=False)
    try:
        tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}"  # unguessable: nothing can be planted there
        fd = os.open(tmp, FILE_FLAGS, 0o600, dir_fd=dfd)
        try:
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(f"{tmp} is not a regular file")
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
    finally:
        os.close(dfd)


class LogFile:
    """An event file of ncclprobe's own in a log directory (`run`'s /proc watch writes one): created
    new under FILE_FLAGS, 0600 (an existing one of ours is re-opened as the boot probe re-opens its
    own: a private regular file of this euid, else refused), fstat-checked; each line is one write(),
    and before each batch of lines the descriptor is checked to be still this file."""

    def __init__(self, directory: str | os.PathLike, name: str):
        dfd = open_dir(directory, create=False)
        try:
            try:
                fd = os.open(name, FILE_FLAGS, 0o600, dir_fd=dfd)
            except FileExistsError:
                fd = _boot._reopen(name, dfd)
        finally:
            os.close(dfd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            os.close(fd)
            raise Unfit(directory, f"{name} is not a private regular file of this user")
        self.fd: int | None = fd
        self.ident = (st.st_dev, st.st_ino)
        self.lost = 0  # lines not written (a full disk, a descriptor that is no longer ours)

    def write_lines(self, lines: list[bytes]) -> None:
        if self.fd is not None:
            try:
                st = os.fstat(self.fd)
                if (st.st_dev, st.st_ino) != self.ident:
                    self.fd = None  # not ours any more (never written to, never closed)
            except OSError:
                self.fd = None
        for i, line in enumerate(lines):
            if self.fd is None:
                self.lost += len(lines) - i
                return
            try:
                n = os.write(self.fd, line)
            except OSError:
                n = -1
            if n != len(line):  # a full disk (a torn line: readers skip it): nothing more is written
                self.lost += 1
                self.close()

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            try:
                os.close(fd)
            except OSError:
                pass
