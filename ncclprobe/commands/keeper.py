"""When `ncclprobe run` itself is killed (SIGKILL, the OOM killer), nothing in it can end CMD's tree any
more: a keeper does. The keeper is a small interpreter in a session of its own that reads, from a pipe,
the members of the tree as the supervisor last scanned them (pid and start time). When the pipe ends
without the supervisor's "done" — its write end closed because the supervisor died — it ends them:
SIGTERM, then SIGKILL after the grace. A member is signalled only while its start time still matches,
so a reused pid is never hit. On a normal end the supervisor says "done" and the keeper exits."""
from __future__ import annotations

import os
import select
import subprocess
import sys

# stdlib only, no site (-I -S): it starts in milliseconds and needs nothing installed
_KEEPER = r"""
import os, signal, sys, time
for s in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM):
    signal.signal(s, signal.SIG_IGN)  # the terminal's Ctrl-C is the supervisor's to handle
grace, label = float(sys.argv[1]), sys.argv[2]
members, scan, done, buf = {}, None, False, b""
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
        if line == b"begin":
            scan = {}
        elif line == b"end" and scan is not None:
            members, scan = scan, None
        elif line == b"done":
            done = True
        elif scan is not None:
            words = line.split()
            if len(words) == 2 and words[0].isdigit() and words[1].isdigit():
                scan[int(words[0])] = int(words[1])
if done:
    sys.exit(0)
def stat(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
        return int(rest[1]), int(rest[19])  # ppid, start time
    except (OSError, ValueError, IndexError):
        return None, None
def start(pid):
    return stat(pid)[1]
# what a member started after the supervisor's last scan is the member's descendant: add it now
kids = {}
for name in os.listdir("/proc"):
    if name.isdigit():
        ppid, began = stat(int(name))
        if ppid is not None:
            kids.setdefault(ppid, []).append((int(name), began))
todo = [p for p, s in members.items() if start(p) == s]
while todo:
    for pid, began in kids.get(todo.pop(), ()):
        if pid not in members:
            members[pid] = began
            todo.append(pid)
def alive():
    return [p for p, s in members.items() if start(p) == s]
def send(sig):
    for p in alive():
        try:
            os.kill(p, sig)
        except OSError:
            pass
left = alive()
if left:
    try:
        os.write(2, f"{label}: the supervisor is gone; ending the {len(left)} process(es) it ran: SIGTERM now, SIGKILL in {grace:g} s\n".encode())
    except OSError:
        pass
    send(signal.SIGTERM)
    send(signal.SIGCONT)
    deadline = time.monotonic() + grace
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    send(signal.SIGKILL)
"""


class Keeper:
    """The keeper of one supervised tree: update() after each scan, close() when the tree is settled."""

    def __init__(self, grace: float, label: str):
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _KEEPER, f"{grace:g}", label],
                                         stdin=r, stdout=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(r)
        os.set_blocking(w, False)  # the supervisor never waits for its keeper
        self.fd: int | None = w

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
