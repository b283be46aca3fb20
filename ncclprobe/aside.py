"""Work done beside the main line, in a forked child: a fleet's NCCL logs are parsed while the events are read
(report of 256 hosts: 0.6 s of 2.6 taken off the main line on two cores).

Aside(fn, *args).result() is fn(*args), whichever process ran it: the child where that pays (two or more
cores, a large enough input, fork available and the caller running one thread, so that no lock another
thread held at the fork is held forever in the child), else here, when the result is asked for. The child
hands its value back through a private pipe as a pickle (the child is ours, a fork of this process; nothing
else writes to that pipe); a child that fails, is killed or gives back nothing usable costs the time it took
and fn runs here instead, so an error is raised where the caller can see it. Used as a context manager, a
child whose result was never asked for (an error, ^C in the main line) is killed and reaped on the way out.
"""
from __future__ import annotations

import os
import pickle
import signal
import threading
from typing import Any, Callable


def cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Aside:
    def __init__(self, fn: Callable[..., Any], *args: Any, worth: bool = True):
        self.fn, self.args = fn, args
        self.pid: int | None = None
        self.fd: int | None = None
        if worth and hasattr(os, "fork") and cores() > 1 and threading.active_count() == 1:
            self._start()

    @property
    def forked(self) -> bool:
        return self.pid is not None

    def _start(self) -> None:
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:  # no memory or process slot for a child: the work is done here
            os.close(r)
            os.close(w)
            return
        if pid == 0:
            code = 1
            try:
                os.close(r)
                signal.signal(signal.SIGINT, signal.SIG_DFL)  # ^C ends the child at once, no traceback
                view = memoryview(pickle.dumps(self.fn(*self.args), protocol=pickle.HIGHEST_PROTOCOL))
                while view:
                    view = view[os.write(w, view):]
                code = 0
            except BaseException:  # noqa: BLE001 (the parent runs fn itself and sees any error)
                pass
            finally:
                os._exit(code)  # no atexit, no flush of buffers the parent owns
        os.close(w)
        self.pid, self.fd = pid, r

    def result(self) -> Any:
        if self.pid is None:
            return self.fn(*self.args)
        try:
            with open(self.fd, "rb", closefd=True) as f:
                self.fd = None
                data = f.read()
        except BaseException:  # ^C or a signal meant for this process alone: the child's work is not waited for
            self._reap(kill=True)
            raise
        status = self._reap(kill=False)
        if status == 0 and data:
            try:
                return pickle.loads(data)
            except Exception:  # noqa: BLE001 (a child cut short mid-write: do the work here)
                pass
        return self.fn(*self.args)

    def _reap(self, kill: bool) -> int | None:
        pid, self.pid = self.pid, None
        if pid is None:
            return None
        if kill:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while True:
            try:
                return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            except InterruptedError:
                continue
            except ChildProcessError:
                return None

    def __enter__(self) -> "Aside":
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self._reap(kill=True)
