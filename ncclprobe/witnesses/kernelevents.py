"""The kernel's process events (the netlink process connector, linux/cn_proc.h): fork, exec and exit of
every process on the host, as they happen. `run`'s watch follows CMD's tree with them where the kernel lets
it (CAP_NET_ADMIN in the initial user and pid namespaces): a process of the tree is read from /proc at its
exec, before it can end, however short it lives; a scan every NCCLPROBE_WATCH_S seconds stays as the other
witness (and the only one where the kernel refuses).

The messages: a netlink header (16 bytes), a connector header (cn_msg: id {idx, val}, seq, ack, len, flags:
20 bytes), then a proc_event: what (u32), cpu (u32), timestamp_ns (u64), and the event's data; for fork
(parent pid, parent tgid, child pid, child tgid), exec (pid, tgid), exit (pid, tgid, exit code, exit signal,
parent pid, parent tgid), and the answer to our listen request (err). Native byte order, as the kernel
writes them."""
from __future__ import annotations

import errno
import os
import select
import socket
import struct
import time
from dataclasses import dataclass

from ncclprobe.model import INIT_PIDNS  # ... and the initial pid namespace

NETLINK_CONNECTOR = 11
CN_IDX_PROC, CN_VAL_PROC = 1, 1
NLMSG_DONE = 3
PROC_CN_MCAST_LISTEN, PROC_CN_MCAST_IGNORE = 1, 2
NONE, FORK, EXEC, EXIT = 0, 1, 2, 0x80000000
INIT_USERNS = 4026531837  # PROC_USER_INIT_INO: the connector speaks only to the initial user namespace
ACK_WAIT_S = 1.0
RCVBUF = 8 << 20  # events of the whole host queue here between two reads

_NL = struct.Struct("=IHHII")
_CN = struct.Struct("=IIIIHH")
_EV = struct.Struct("=IIQ")
_FORK = struct.Struct("=IIII")
_PAIR = struct.Struct("=II")


@dataclass(frozen=True)
class Event:
    what: int
    pid: int        # the thread (fork: the child's)
    tgid: int       # its process (fork: the child's)
    ppid: int = 0   # fork: the parent's process (tgid)
    t_ns: int = 0   # the kernel's timestamp (CLOCK_MONOTONIC ns)
    err: int = 0    # the answer to a listen request


def parse(buf: bytes) -> list[Event]:
    """The process events of one datagram (a datagram may hold several netlink messages)."""
    out, off = [], 0
    while off + _NL.size <= len(buf):
        length = _NL.unpack_from(buf, off)[0]
        if length < _NL.size or off + length > len(buf):
            break
        body = off + _NL.size
        if body + _CN.size + _EV.size <= off + length:
            idx, val = _CN.unpack_from(buf, body)[:2]
            ev = body + _CN.size
            if (idx, val) == (CN_IDX_PROC, CN_VAL_PROC):
                what, _, t_ns = _EV.unpack_from(buf, ev)
                data = ev + _EV.size
                room = off + length - data
                if what == FORK and room >= _FORK.size:
                    ppid, ptgid, cpid, ctgid = _FORK.unpack_from(buf, data)
                    out.append(Event(FORK, cpid, ctgid, ptgid, t_ns))
                elif what in (EXEC, EXIT) and room >= _PAIR.size:
                    pid, tgid = _PAIR.unpack_from(buf, data)
                    out.append(Event(what, pid, tgid, 0, t_ns))
                elif what == NONE and room >= 4:
                    out.append(Event(NONE, 0, 0, 0, t_ns, struct.unpack_from("=I", buf, data)[0]))
        off += (length + 3) & ~3
    return out


def _ns(kind: str) -> int | None:
    try:
        link = os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return None
    return int(link[link.index("[") + 1:-1]) if "[" in link else None


class Listener:
    """A socket subscribed to the host's process events; `refused` says why not where the kernel refuses
    (then nothing is read). Open it before the processes it should see start: events queue until read."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.refused: str | None = None
        self.events = self.overruns = 0
        self.pending: list[Event] = []  # events that came before the listen request's answer
        if _ns("user") not in (None, INIT_USERNS) or _ns("pid") not in (None, INIT_PIDNS):
            self.refused = "run is in a container (the kernel gives process events to the host's namespaces only)"
            return
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_CONNECTOR)
        except OSError as exc:
            self.refused = f"no netlink connector ({errno.errorcode.get(exc.errno, exc.errno)})"
            return
        try:
            try:
                sock.setsockopt(socket.SOL_SOCKET, 33, RCVBUF)  # SO_RCVBUFFORCE (CAP_NET_ADMIN)
            except OSError:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            sock.bind((0, CN_IDX_PROC))
            self.sock = sock
            self._control(PROC_CN_MCAST_LISTEN)
            err = self._ack()
        except OSError as exc:
            err = exc.errno or errno.EIO
        if err:
            self.refused = (f"the kernel refused its process events ({errno.errorcode.get(err, err)}: "
                            "they need CAP_NET_ADMIN)" if err != -1 else "the kernel did not answer")
            self.close()

    def _control(self, op: int) -> None:
        payload = struct.pack("=I", op)
        cn = _CN.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(payload), 0)
        self.sock.send(_NL.pack(_NL.size + len(cn) + len(payload), NLMSG_DONE, 0, 0, 0) + cn + payload)

    def _ack(self) -> int:
        """The listen request's answer (0: listening; -1: none came)."""
        deadline = time.monotonic() + ACK_WAIT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return -1
            for e in parse(self.sock.recv(65536)):
                if e.what == NONE:
                    return e.err
                self.pending.append(e)

    def read(self, timeout: float, wake: int | None = None) -> list[Event]:
        """The events that came, waiting up to `timeout` for the first (or until `wake`, a file descriptor,
        is readable); an overrun (events lost while the queue was full) is counted, the reading goes on."""
        if self.sock is None:
            return []
        out, self.pending = self.pending, []
        if not out:
            ready = select.select([self.sock] + ([wake] if wake is not None else []), [], [], timeout)[0]
            if self.sock not in ready:
                return []
        while True:
            try:
                buf = self.sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self.overruns += 1
                    continue
                raise
            out.extend(e for e in parse(buf) if e.what != NONE)
        self.events += len(out)
        return out

    def close(self) -> None:
        if self.sock is None:
            return
        try:
            self._control(PROC_CN_MCAST_IGNORE)
        except OSError:
            pass
        self.sock.close()
        self.sock = None
