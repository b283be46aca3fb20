"""The lines of a file someone else may have written, in bounded memory and time: the event log's
*.jsonl files (witnesses/events.py checks what the lines say).

A file is opened O_RDONLY|O_NONBLOCK|O_NOFOLLOW (a symlink fails, a FIFO never blocks) and must be a
regular file (fstat); its first CHUNK is read through that descriptor, and it is re-opened for each later
CHUNK and checked to be the same inode, so a merge of thousands of files holds no descriptor between
reads. Holes are stepped over with SEEK_DATA (a sparse 20 GB file costs one lseek, not 20 GB of
reads) and runs of NUL bytes inside data are skipped without
held (C scans of the chunk in hand); either one ends the line before it (a crash's zero fill, a
truncate). At most FILE_CAP bytes of a file's data and FILE_LINES lines are read; what is left is said
(Source.not_read, Lines.unread). A line over MAX_LINE is counted and discarded up to its newline without
being held whole.
"""
from __future__ import annotations

import errno
import os
import stat
from collections import Counter
from pathlib import Path
from typing import Iterator

MAX_LINE = 1 << 20   # a longer line is not ours (the probes cap theirs at NCCLPROBE_MAX_LINE, 64 KiB by default)
CHUNK = 1 << 16      # bytes read at a time
FILE_CAP = 1 << 30   # data bytes read per file: 16 x a writer's own budget (NCCLPROBE_MAX_BYTES, 64 MiB by default)
# lines (of any kind, empty ones too) read per file: a writer's 64 MiB holds ~300,000 of its lines; at ~10 us
# a line (less for garbage) a file costs at most ~20 s a pass, however short its lines
FILE_LINES = 2_000_000
OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
TORN, OVERSIZED, EMPTY = "torn line", "oversized line", "empty line"


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words (for the reason it is skipped)."""
    for test, word in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symlink")):
        if test(mode):
            return word
    return "special file"


class NotRegular(OSError):
    """Refused before any read: a symlink (O_NOFOLLOW's ELOOP), a FIFO, a device, a directory."""


def open_regular(path: Path | str) -> tuple[int, os.stat_result]:
    """(fd, its fstat) of a regular file; NotRegular for a symlink, FIFO, device or directory."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # open(2): O_NOFOLLOW on a symlink
            raise NotRegular(errno.ELOOP, "symlink (not followed)") from None
        raise
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegular(errno.EINVAL, f"not a regular file ({kind_of(st.st_mode)})")
    return fd, st


class Source:
    """One regular file's data, CHUNK bytes at a time: `pieces()` yields bytes, and None where a hole
    (unallocated blocks: the file reads as NUL bytes there) was stepped over."""

    def __init__(self, path: Path | str, cap: int = FILE_CAP):
        fd, st = open_regular(path)
        self.path, self.ident, self.cap = path, (st.st_dev, st.st_ino), cap
        self.offset = self.data = self.holes = self.not_read = 0
        self.size = st.st_size  # as the latest fstat saw it: a read that reaches it is the last (no extra open)
        try:  # the first piece through the descriptor just checked (a fleet's files are one piece each)
            self.first = self._read(fd, st.st_size) if 0 < st.st_size and 0 < cap else b""
        except OSError:
            self.first = b""
        finally:
            os.close(fd)

    def pieces(self) -> Iterator[bytes | None]:
        first, self.first = self.first, b""
        if first != b"":
            yield first
        while self.offset < self.size or self.data >= self.cap:
            piece = self._next()
            if piece == b"":
                return
            yield piece

    def _next(self) -> bytes | None:
        try:
            fd = os.open(self.path, OPEN_FLAGS)
        except OSError:
            return b""
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != self.ident:  # replaced since it was opened: not the file we read
                return b""
            self.size = st.st_size
            if self.data >= self.cap:
                self.not_read = max(0, st.st_size - self.offset)
                return b""
            return self._read(fd, st.st_size)
        except OSError:
            return b""
        finally:
            os.close(fd)

    def _read(self, fd: int, size: int) -> bytes | None:
        try:
            at = os.lseek(fd, self.offset, os.SEEK_DATA)  # lseek(2): the next data at or after offset
        except OSError as exc:
            # ENXIO: no data after offset (a hole to the end, or at EOF); EINVAL: no SEEK_DATA here
            at = max(size, self.offset) if exc.errno == errno.ENXIO else self.offset
        if at > self.offset:
            self.holes += at - self.offset
            self.offset = at
            return None
        data = os.pread(fd, min(CHUNK, self.cap - self.data), self.offset)
        self.offset += len(data)
        self.data += len(data)
        return data


def size_words(n: int) -> str:
    """A byte count as a person reads it: '20 GiB', '8 MiB', '512 bytes'."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n} bytes"


def read_small(path: Path | str, cap: int) -> bytes:
    """A small regular file whole (run metadata), at most cap + 1 bytes (more means oversized)."""
    fd, _ = open_regular(path)
    try:
        out = b""
        while len(out) <= cap and (data := os.read(fd, min(CHUNK, cap + 1 - len(out)))):
            out += data
        return out
    finally:
        os.close(fd)


class Lines:
    """Complete lines out of a file's pieces. NUL bytes are never part of a line: a NUL run or a hole
    ends the fragment before it as a newline would, but a fragment so ended is a torn line (oversized past
    MAX_LINE). Skipped lines are counted in `counts` by reason (TORN, OVERSIZED, EMPTY), once each,
    whatever pieces the file comes in; NUL bytes in the data are counted in `nul`. Every scan is a bytes
    method (C): a chunk costs a few Python steps per newline, however its NULs fall."""

    def __init__(self, counts: Counter, max_lines: int = FILE_LINES):
        self.counts, self.nul = counts, 0
        self.buf, self.discarding = b"", False  # the fragment so far; dropping an oversized one (counted)
        self.after_cut = False                  # nothing since the last NUL run or hole (a newline there: no line)
        self.left = max_lines                   # newlines still to be read; past them the rest is left
        self.unread = 0                         # bytes of the last piece left when the line cap was reached

    @property
    def capped(self) -> bool:
        return self.left < 0

    def of(self, pieces) -> Iterator[bytes]:
        """Every complete line (with its newline) of the pieces; a last line without one is torn. Past
        max_lines newlines it stops (capped): the line so far is not counted, the rest not read."""
        for piece in pieces:
            if piece is None:
                self.cut()
            else:
                yield from self._text(piece)
            if self.capped:
                return
        self.cut()

    def cut(self) -> None:
        """The fragment so far ends here without its newline (a hole, the end of the file)."""
        if self.buf and not self.discarding:
            self.counts[TORN] += 1
        self.buf, self.discarding, self.after_cut = b"", False, True

    def _past_nuls(self, chunk: bytes, start: int, last: int) -> int:
        """chunk[start:last + 1] ends with a NUL: count the fragments it ends (the one so far first);
        return where the next fragment begins."""
        parts = chunk[start:last + 1].split(b"\0")  # its last part is the empty one after the final NUL
        self.nul += chunk.count(b"\0", start, last + 1)
        first = len(self.buf) + len(parts[0])
        if not self.discarding and first:  # a discarded one was counted when it overflowed
            self.counts[OVERSIZED if first > MAX_LINE else TORN] += 1
        rest = parts[1:]
        if (n := len(rest) - rest.count(b"")):
            big = sum(len(p) > MAX_LINE for p in rest) if max(map(len, rest)) > MAX_LINE else 0
            self.counts[TORN] += n - big
            if big:
                self.counts[OVERSIZED] += big
        self.buf, self.discarding, self.after_cut = b"", False, True
        return last + 1

    def _text(self, chunk: bytes) -> Iterator[bytes]:
        start, nuls = 0, b"\0" in chunk
        while (nl := chunk.find(b"\n", start)) >= 0:
            self.left -= 1
            if self.left < 0:
                self.unread = len(chunk) - start
                return
            if nuls and (last := chunk.rfind(b"\0", start, nl)) >= 0:
                start = self._past_nuls(chunk, start, last)
            if self.discarding:
                self.discarding = False
            elif len(self.buf) + nl + 1 - start > MAX_LINE:
                self.counts[OVERSIZED] += 1
            elif not self.buf and nl == start:
                if not self.after_cut:  # NULs or a hole, then a newline: a zero fill, not a line
                    self.counts[EMPTY] += 1
            else:
                yield self.buf + chunk[start:nl + 1]
            self.buf, start, self.after_cut = b"", nl + 1, False
        if nuls and (last := chunk.rfind(b"\0", start)) >= 0:
            start = self._past_nuls(chunk, start, last)
        if start == len(chunk) or self.discarding:
            return
        self.after_cut = False
        if len(self.buf) + len(chunk) - start > MAX_LINE:  # counted now, its bytes dropped up to its newline
            self.counts[OVERSIZED] += 1
            self.buf, self.discarding = b"", True
        else:
            self.buf += chunk[start:]
