"""NCCL's RAS service as a witness: every communicator of the jobs on a node, as NCCL itself knows them,
read from a running job without restarting it (NCCL >= 2.24, on unless NCCL_RAS_ENABLE=0; it listens on
NCCL_RAS_ADDR, localhost:28028 by default).

The client protocol is plain text (NCCL's src/ras/client.cc): the client says `CLIENT PROTOCOL 2`, the
server `SERVER PROTOCOL <n>`; `SET FORMAT json` is answered `OK` where the server has the JSON format
(2.28.7+), an error line before; `STATUS` (or `VERBOSE STATUS`) then gets the report, after which the
server closes. Only these are ever sent, and `DIAGNOSTICS` (NCCL >= 2.31, on request: witnesses/rasdiag.py):
nothing here changes the job (never `CONTROL ...`, which does). Replies are read within a deadline
and a byte bound, and anything unexpected (refused, a server that never answers or never closes, a reply
too large, malformed JSON) becomes the reading's `reason`, never an exception.

What it sees (JSON): per communicator its hash (the profiler's comm_hash of the same communicator, checked
on an H200 with NCCL 2.28.9), size, and per rank its host (an address), pid, CUDA and NVML device, status
(init state, async error, finalize/destroy/abort flags) and collective counts per function; the ranks it
is missing. What it does not: any environment or tuning; communicators of jobs listening elsewhere."""
from __future__ import annotations

import ipaddress
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from ncclprobe.model import comm_id
from ncclprobe.witnesses import rasdiag
from ncclprobe.witnesses.rasdiag import RasDiagnostics

DEFAULT_ADDR = "localhost:28028"
TIMEOUT_S = 5.0    # the whole conversation, connecting included
DIAG_TIMEOUT_S = 30.0  # diagnostics wait for every RAS peer's checks (lspci, dmesg, rdma_topo on 2.32)
DONE_GRACE_S = 0.5     # after the completion line: a summary that failed follows it at once
DIAG_SINCE = (2, 31)   # the first NCCL with the DIAGNOSTICS command
MAX_BYTES = 32 << 20  # a report of thousands of ranks is a few MB
PROTOCOL = 2


@dataclass(frozen=True)
class RasRank:
    rank: int | None
    host: str | None       # the rank's address as RAS names it (an IP)
    pid: int | None
    cuda_dev: int | None
    nvml_dev: int | None
    status: dict[str, Any]   # init_state, async_error, finalize_called, destroy_flag, abort_flag
    counts: dict[str, int]   # collective counts per function


@dataclass(frozen=True)
class RasComm:
    hash: str | None         # comm_id's spelling
    secondary: str | None
    size: int | None
    ranks: tuple[RasRank, ...]
    missing: int = 0         # ranks RAS could not reach


@dataclass
class RasReading:
    """One conversation with a RAS server: what it said, or why nothing."""
    address: str
    t: float
    format: str | None = None          # "json" | "text"
    nccl_version: str | None = None
    comms: list[RasComm] = field(default_factory=list)
    text: str | None = None            # the text report (older NCCL: no per-communicator hashes or pids)
    reason: str | None = None          # why there is nothing (or less): refused, timed out, ...
    window_s: float | None = None      # with_rates: the seconds between the two readings
    rates: dict[tuple[str | None, int | None, int | None], dict[str, float]] = field(default_factory=dict)
    # with_rates: (hash, rank, pid) -> collectives per second per function
    diagnostics: RasDiagnostics | None = None  # read_window(diagnostics=True): NCCL's RAS diagnostics (2.31+)

    @property
    def ok(self) -> bool:
        return self.reason is None


def read_window(address: str, window: float | None, diagnostics: bool = False) -> RasReading:
    """read(address); with a window, a second reading that many seconds later, kept with the collectives per
    second since the first (with_rates). A second reading that fails leaves the first. With diagnostics, NCCL's
    RAS diagnostics too (diagnostics_after)."""
    first = read(address)
    if window and first.ok:
        time.sleep(window)
        later = read(address)
        first = with_rates(first, later) if later.ok else first
    if diagnostics:
        first.diagnostics = diagnostics_after(first)
    return first


def diagnostics_after(status: RasReading) -> RasDiagnostics:
    """read_diagnostics at the address a STATUS reading was read from, unless that reading says there is no
    server or it names an NCCL older than 2.31 (then not asked: a reason)."""
    version = _version_tuple(status.nccl_version)
    if not status.ok:
        return RasDiagnostics(status.address, status.t, reason=f"not asked: {status.reason}")
    if version is not None and version < DIAG_SINCE:
        return RasDiagnostics(status.address, status.t,
                              reason=f"not asked: NCCL {status.nccl_version} has no RAS diagnostics (2.31+)")
    return read_diagnostics(status.address)


def _version_tuple(text: str | None) -> tuple[int, int] | None:
    parts = (text or "").split(".")
    return (int(parts[0]), int(parts[1])) if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit() else None


def with_rates(first: RasReading, later: RasReading) -> RasReading:
    """`later`, with each communicator rank's collectives per second since `first` (a rank in both)."""
    dt = later.t - first.t
    if dt <= 0:
        return later
    before = {(c.hash, k.rank, k.pid): k.counts for c in first.comms for k in c.ranks}
    later.window_s = dt
    for c in later.comms:
        for k in c.ranks:
            old = before.get((c.hash, k.rank, k.pid))
            if old is not None:
                later.rates[(c.hash, k.rank, k.pid)] = {
                    f: max(0, n - old.get(f, 0)) / dt for f, n in k.counts.items()}
    return later


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (or [v6]:PORT, or a bare host: port 28028) as NCCL_RAS_ADDR takes it."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"not a port: {port!r}")
    return host or "localhost", int(port) if port else 28028


class _Conn:
    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline, self.buf, self.closed = sock, deadline, b"", False

    def send(self, line: str) -> None:
        self.sock.settimeout(max(0.01, self.deadline - time.monotonic()))
        self.sock.sendall(line.encode("ascii") + b"\n")

    def _more(self) -> bool:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self.sock.settimeout(left)
        data = self.sock.recv(65536)
        if not data:
            self.closed = True
            return False
        self.buf += data
        if len(self.buf) > MAX_BYTES:
            raise OverflowError
        return True

    def line(self) -> str | None:
        while b"\n" not in self.buf:
            if self.closed or not self._more():
                return None
        head, _, self.buf = self.buf.partition(b"\n")
        return head.decode("utf-8", "replace").strip()

    def rest(self, complete=None) -> bytes:
        """Until the server closes (or `complete(buf)` says the reply is whole: a server that keeps the
        connection open still gives a usable reply)."""
        while not self.closed:
            if complete is not None and complete(self.buf):
                break
            self._more()
        return self.buf


def _json_whole(buf: bytes) -> bool:
    text = buf.decode("utf-8", "replace").lstrip()
    if not text.startswith("{"):
        return False
    try:
        json.JSONDecoder().raw_decode(text)
    except ValueError:
        return False
    return True


def _connect(address: str, timeout: float) -> tuple[socket.socket | None, str | None]:
    """A connection to the RAS server at address, or why none."""
    try:
        host, port = parse_address(address)
    except ValueError as exc:
        return None, f"bad address {address!r}: {exc}"
    try:
        return socket.create_connection((host, port), timeout=timeout), None
    except ConnectionRefusedError:
        return None, (f"connection refused at {address}: no RAS service there (NCCL < 2.24, NCCL_RAS_ENABLE=0, "
                      "another NCCL_RAS_ADDR, or no NCCL job on this node)")
    except (TimeoutError, socket.timeout):
        return None, f"timed out connecting to {address}"
    except OSError as exc:
        return None, f"cannot connect to {address}: {exc.strerror or exc}"


def _hello(c: _Conn, address: str) -> str | None:
    """The protocol handshake; why it failed, or None."""
    c.send(f"CLIENT PROTOCOL {PROTOCOL}")
    hello = c.line()
    if hello is None or not hello.startswith("SERVER PROTOCOL"):
        return f"not a RAS server at {address} (it said {_short(hello)})"
    version = hello.split()[-1]
    if not version.isdigit() or int(version) < PROTOCOL:
        return f"RAS protocol {_short(version)} at {address}: this client speaks {PROTOCOL}"
    return None


def read(address: str = DEFAULT_ADDR, timeout: float = TIMEOUT_S, verbose: bool = False) -> RasReading:
    """One RAS report from the server at `address` (HOST:PORT), in JSON where the server has it."""
    r = RasReading(address, time.time())
    sock, r.reason = _connect(address, timeout)
    if sock is None:
        return r
    deadline = time.monotonic() + timeout
    try:
        c = _Conn(sock, deadline)
        r.reason = _hello(c, address)
        if r.reason:
            return r
        c.send("SET FORMAT json")
        answer = c.line()
        r.format = "json" if answer == "OK" else "text"  # an older server answers with an error line
        c.send("VERBOSE STATUS" if verbose else "STATUS")
        body = c.rest(_json_whole if r.format == "json" else None)
    except (TimeoutError, socket.timeout):
        r.reason = f"timed out after {timeout:g} s reading from {address}"
        return r
    except OverflowError:
        r.reason = f"reply from {address} over {MAX_BYTES} bytes: not read"
        return r
    except OSError as exc:
        r.reason = f"connection to {address} failed: {exc.strerror or exc}"
        return r
    finally:
        sock.close()
    text = body.decode("utf-8", "replace")
    if r.format == "json":
        _from_json(r, text)
    else:
        r.text = text.strip() or None
        r.nccl_version = _text_version(text)
        if not r.text:
            r.reason = f"empty reply from {address}"
    return r


def read_diagnostics(address: str = DEFAULT_ADDR, timeout: float = DIAG_TIMEOUT_S) -> RasDiagnostics:
    """NCCL's RAS diagnostics (2.31+) from the server at `address`: the DIAGNOSTICS command, in text (NCCL
    refuses it in JSON). It changes nothing in the job, but every process of it runs the checks (NVML queries;
    on 2.32 also lspci, dmesg and rdma_topo), so it is asked only on request."""
    d = RasDiagnostics(address, time.time())
    sock, d.reason = _connect(address, timeout)
    if sock is None:
        return d
    try:
        c = _Conn(sock, time.monotonic() + timeout)
        d.reason = _hello(c, address)
        if d.reason:
            return d
        c.send("DIAGNOSTICS")
        first = c.line()
        d.reason = _refusal(first, address)
        if d.reason:
            return d
        body = first + "\n" + _until_closed(c).decode("utf-8", "replace")
    except (TimeoutError, socket.timeout):
        d.reason = f"timed out after {timeout:g} s waiting for the diagnostics report from {address}"
        return d
    except OverflowError:
        d.reason = f"diagnostics report from {address} over {MAX_BYTES} bytes: not read"
        return d
    except OSError as exc:
        d.reason = f"connection to {address} failed: {exc.strerror or exc}"
        return d
    finally:
        sock.close()
    return rasdiag.parse(d, body)


def _refusal(first: str | None, address: str) -> str | None:
    """Why the server gave no report (its first line says so), or None."""
    if first is None:
        return f"{address} closed the connection without a diagnostics report"
    if first.startswith("ERROR: Unknown command"):  # NCCL < 2.31: and it keeps the connection open
        return f"no RAS diagnostics at {address} (NCCL < 2.31)"
    if first.startswith("BUSY"):  # one run at a time per process (src/ras/client_support.cc)
        return (f"RAS diagnostics busy at {address}: a run is in progress in that process "
                "(NCCL_RUN_RAS_DIAGNOSTICS at a communicator's creation, or another client); ask again later")
    if first.startswith("ERROR"):
        return f"RAS diagnostics refused at {address}: {_short(first)}"
    return None


def _until_closed(c: _Conn) -> bytes:
    """The report until the server closes; where the completion line came and nothing more within
    DONE_GRACE_S, that is the report (a server that keeps the connection open)."""
    while not c.closed:
        if rasdiag.DONE_MARK in c.buf:
            c.deadline = min(c.deadline, time.monotonic() + DONE_GRACE_S)
            try:
                while c._more():
                    pass
            except TimeoutError:
                pass
            break
        c._more()
    return c.buf


def _short(text: str | None) -> str:
    return "nothing" if not text else repr(text[:60])


def _int(v: Any) -> int | None:
    return v if type(v) is int else None


def _from_json(r: RasReading, text: str) -> None:
    try:
        doc, _ = json.JSONDecoder().raw_decode(text.lstrip())
    except ValueError:
        r.reason = f"malformed JSON reply from {r.address}"
        return
    if not isinstance(doc, dict):
        r.reason = f"malformed JSON reply from {r.address} (not an object)"
        return
    r.nccl_version = doc.get("nccl_version") if isinstance(doc.get("nccl_version"), str) else None
    for c in doc.get("communicators") or ():
        if not isinstance(c, dict):
            continue
        ranks = []
        for k in c.get("ranks") or ():
            if not isinstance(k, dict):
                continue
            status = {n: v for n, v in (k.get("status") or {}).items() if isinstance(v, (int, bool))} \
                if isinstance(k.get("status"), dict) else {}
            counts = {str(n): v for n, v in (k.get("collective_counts") or {}).items() if type(v) is int} \
                if isinstance(k.get("collective_counts"), dict) else {}
            ranks.append(RasRank(_int(k.get("rank")), k.get("host") if isinstance(k.get("host"), str) else None,
                                 _int(k.get("pid")), _int(k.get("cuda_dev")), _int(k.get("nvml_dev")), status, counts))
        missing = c.get("missing_ranks_count")
        r.comms.append(RasComm(comm_id(c.get("hash")), c.get("secondary_hash") if isinstance(c.get("secondary_hash"), str)
                               else None, _int(c.get("size")), tuple(ranks), missing if type(missing) is int else 0))


def _text_version(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("NCCL version "):
            return line.split()[2]
    return None


def local_addresses() -> set[str]:
    """This host's own IP addresses (RAS names a rank's host by address): IPv4 from /proc/net/fib_trie's
    LOCAL entries, IPv6 from /proc/net/if_inet6, and the loopback names."""
    out = {"127.0.0.1", "::1", "localhost"}
    try:
        with open("/proc/net/fib_trie") as f:
            last = None
            for line in f:
                s = line.strip()
                if s.startswith("|--"):
                    last = s[3:].strip()
                elif s.startswith("/32 host LOCAL") and last:
                    out.add(last)
    except OSError:
        pass
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                h = line.split()[0] if line.split() else ""
                if len(h) == 32:
                    out.add(str(ipaddress.IPv6Address(int(h, 16))))
    except (OSError, ValueError):
        pass
    return out


def address_for(env_values: list[str | None]) -> str:
    """The address to ask: the first NCCL_RAS_ADDR a target process holds (live, then exec-time), else
    localhost:28028."""
    for v in env_values:
        if v:
            return v
    return DEFAULT_ADDR
