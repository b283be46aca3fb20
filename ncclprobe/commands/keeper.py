"""When `ncclprobe run` itself is killed (SIGKILL, the OOM killer), nothing in it can end CMD's tree any
more: a keeper does. The keeper is a small interpreter in a session of its own that reads, from a pipe,
the members of the tree as the supervisor last scanned them (pid and start time), and the tree's mark
(supervise.Mark). When the pipe ends without the supervisor's "done" — its write end closed because the
supervisor died — it runs the supervisor's own stop path (supervise.Group.ending) on them: SIGTERM, then
SIGKILL after the grace, the tree re-scanned until it is empty, so what a member starts meanwhile (a
SIGTERM handler that forks a child into a session of its own) is ended too. The keeper is no subreaper
ancestor of the tree, so a child whose parent exits at once is found by the mark, not by its ppid. A
member is signalled only while its start time still matches, so a reused pid is never hit. On a normal
end the supervisor says "done" and the keeper exits."""
from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

# stdlib only, no site (-I -S): it starts in milliseconds and needs nothing installed until it has to act
_KEEPER = r"""
import os, signal, sys
for s in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM):
    signal.signal(s, signal.SIG_IGN)  # the terminal's Ctrl-C is the supervisor's to handle
grace, label, where = float(sys.argv[1]), sys.argv[2], sys.argv[3]
members, scan, mark, done, buf = {}, None, None, False, b""
while True:
    try:
        chunk = os.read(0, 65536)
    except InterruptedError:
        continue
    except OSError:
        break
    if not chunk:
        break
    buf += chunk
    *lines, buf = buf.split(b"\n")
    for line in lines:
        words = line.split()
        if line == b"begin":
            scan = {}
        elif line == b"end" and scan is not None:
            members, scan = scan, None
        elif line == b"done":
            done = True
        elif len(words) == 4 and words[0] == b"mark" and words[2].isdigit() and words[3].isdigit():
            try:
                mark = (bytes.fromhex(words[1].decode()), int(words[2]), int(words[3]))
            except ValueError:
                pass
        elif scan is not None and len(words) == 2 and words[0].isdigit() and words[1].isdigit():
            scan[int(words[0])] = int(words[1])
if done:
    sys.exit(0)
sys.path.append(where)  # the installed ncclprobe: run's own stop path, now that it is needed
try:
    from ncclprobe.commands.supervise import take_over
    take_over(members, mark, grace, label)
except Exception as exc:  # one line, never a traceback on the user's terminal
    try:
        os.write(2, f"{label}: the supervisor is gone and its tree could not be ended: {exc!r}\n".encode())
    except OSError:
        pass
"""
class Keeper:
    """The keeper of one supervised tree: update() after each scan, close() when the tree is settled."""

    def __init__(self, grace: float, label: str, mark=None):
        """mark: the tree's supervise.Mark, or None (then only the scanned members and their descendants)."""
        r, w = os.pipe2(os.O_CLOEXEC)
        where = str(Path(__file__).resolve().parents[2])  # the directory that holds the ncclprobe package
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _KEEPER, f"{grace:g}", label, where],
                                         stdin=r, stdout=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(r)
        os.set_blocking(w, False)  # the supervisor never waits for its keeper
        self.fd: int | None = w
        if mark is not None:  # through the pipe, not argv: argv is anyone's to read in /proc
            self._write(b"mark %s %d %d\n" % (mark.entry.hex().encode(), mark.since, mark.uid))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def update(self, members) -> None:
        """The tree as scanned now: (pid, start time) of each member."""
        lines = b"".join(b"%d %d\n" % (m.pid, m.start) for m in members)
        self._write(b"begin\n" + lines + b"end\n")

    def _write(self, data: bytes) -> None:
        if self.fd is None:
            return
        try:
            os.write(self.fd, data)
        except OSError:  # full (a slow keeper) or gone: the next scan tells it again
            pass

    def close(self) -> None:
        """The supervisor ended the tree itself (or left it running on purpose): the keeper goes."""
        if self.fd is None:
            return
        # "done" must arrive, or the keeper would end what was left running on purpose; a keeper that
        # reads no more within the wait is killed below, which ends nothing
        _, ready, _ = select.select([], [self.fd], [], 5.0)
        if ready:
            self._write(b"\ndone\n")  # the newline ends a line a full pipe may have cut
        else:
            self.proc.kill()
        os.close(self.fd)
        self.fd = None
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
