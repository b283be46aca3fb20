"""ncclprobe's standard output and error, whatever becomes of their readers. A reader that goes away
(`ncclprobe report DIR | head -1`), a terminal that hangs up, or a stream closed before the start (`>&-`)
never changes a command's exit code, never draws a traceback, and never makes Python print "Exception
ignored ... BrokenPipeError" at exit: the first write that fails points the descriptor at /dev/null
(Python's docs, "Note on SIGPIPE") and the command goes on to its own exit code.

SIGPIPE stays ignored (Python's default), so a write to a closed pipe fails with EPIPE instead of
killing ncclprobe: `run` must still end CMD's tree and report CMD's exit code, `bench` stop its workers.
Imports nothing beyond the interpreter's own start-up modules: `ncclprobe --help` guards its output too.
"""
from __future__ import annotations

import errno
import io
import os
import sys


class Guarded:
    """A text stream that drops what it cannot write, and everything after it."""

    def __init__(self, stream, name: str):
        self.stream, self.name = stream, name
        self.gone = stream is None  # None: the descriptor was closed when Python started (`>&-`)

    def write(self, text: str) -> int:
        if not isinstance(text, str):  # click probes a stream with write(b"") to tell binary from text
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if not self.gone:
            self._call(self.stream.write, text)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self.gone:
            self._call(self.stream.flush)

    def isatty(self) -> bool:
        return not self.gone and self.stream.isatty()

    def fileno(self) -> int:
        if self.stream is None:
            raise io.UnsupportedOperation(f"{self.name} was closed when ncclprobe started")
        return self.stream.fileno()

    @property
    def closed(self) -> bool:
        return self.stream is None or self.stream.closed

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str:
        return getattr(self.stream, "errors", None) or "strict"

    def __getattr__(self, name: str):
        if self.stream is None:
            raise AttributeError(name)
        return getattr(self.stream, name)

    def _call(self, op, *args) -> None:
        try:
            op(*args)
        except BlockingIOError:
            raise  # a non-blocking descriptor whose reader is slow, not gone: not ours to drop
        except OSError as exc:
            self._reader_gone(exc)

    def _reader_gone(self, exc: OSError) -> None:
        self.gone = True
        try:  # what is still buffered, and Python's flush at exit, now go to /dev/null
            null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            os.dup2(null, self.stream.fileno())  # inheritable, as it was: children started later inherit it
            os.close(null)
            self.stream.flush()
        except (OSError, ValueError):
            pass
        if exc.errno != errno.EPIPE and self.name == "stdout":  # EPIPE is `| head`: nothing went wrong
            try:
                sys.stderr.write(f"ncclprobe: could not write to standard output ({exc.strerror or exc}): "
                                 "the rest of it is dropped\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass


def guard() -> None:
    """sys.stdout and sys.stderr become Guarded (once): the console entry point calls it first."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, Guarded):
            setattr(sys, name, Guarded(stream, name))
