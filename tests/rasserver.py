"""A local stand-in for NCCL's RAS service (protocol 2, src/ras/client.cc), replaying a report recorded from
a real one (tests/data/ras), or behaving badly on purpose: the tests' server, never the tool's."""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

DATA = Path(__file__).parent / "data" / "ras"


def recorded(name: str) -> str:
    """The report body of a recorded reply (what the server said after the handshake lines)."""
    text = (DATA / name).read_text()
    lines = text.split("\n")
    while lines and (lines[0].startswith("SERVER PROTOCOL") or lines[0] == "OK"):
        lines.pop(0)
    return "\n".join(lines)


class Server:
    """Answers each connection: the handshake, SET FORMAT json (OK where `json`, else an error line as an
    older NCCL does), then `body` on STATUS and closes. `mode` misbehaves: "silent" (never answers),
    "hello-only" (answers the handshake, then nothing), "no-close" (the report, then keeps the connection),
    "slow" (the report a byte at a time), "huge" (`body` repeated without end), "garbage" (not RAS).
    DIAGNOSTICS (NCCL >= 2.31, src/ras/client_support.cc) gets `diagnostics`, then the server closes; in JSON
    format `ERROR: diagnostics only supports text output`; without `diagnostics` (an NCCL < 2.31) `ERROR: Unknown
    command DIAGNOSTICS`, and the connection stays open as NCCL keeps it."""

    def __init__(self, body: str = "", json: bool = True, mode: str = "", protocol: int = 2, later: str | None = None,
                 diagnostics: str | None = None):
        self.body, self.json, self.mode, self.protocol = body, json, mode, protocol
        self.diagnostics = diagnostics
        self.later = later  # the report from the second connection on (a job that ran collectives meanwhile)
        self.served = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.heard: list[str] = []
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop.set()
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        as_json = False
        try:
            if self.mode == "garbage":
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                return
            for raw in f:
                line = raw.decode().strip()
                self.heard.append(line)
                if self.mode == "silent":
                    continue
                if line.startswith("CLIENT PROTOCOL"):
                    conn.sendall(f"SERVER PROTOCOL {self.protocol}\n".encode())
                    if self.mode == "hello-only":
                        time.sleep(30)
                        return
                elif line == "SET FORMAT json":
                    conn.sendall(b"OK\n" if self.json else b"ERROR: Unknown command SET\n")
                    as_json = self.json
                elif line.upper() == "DIAGNOSTICS":
                    if self._diagnose(conn, as_json):
                        return
                elif line.endswith("STATUS"):
                    self._report(conn)
                    return
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _diagnose(self, conn: socket.socket, as_json: bool) -> bool:
        """The reply to DIAGNOSTICS; whether the server then closes."""
        if self.diagnostics is None:
            conn.sendall(b"ERROR: Unknown command DIAGNOSTICS\n")
            return False
        if as_json:
            conn.sendall(b"ERROR: diagnostics only supports text output\n")
            return True
        self._send(conn, self.diagnostics.encode())
        return True

    def _send(self, conn: socket.socket, data: bytes) -> None:
        if self.mode == "slow":
            for i in range(len(data)):
                conn.sendall(data[i:i + 1])
                time.sleep(0.01)
        elif self.mode == "huge":
            while not self._stop.is_set():
                conn.sendall(data)
        else:
            conn.sendall(data)
            if self.mode == "no-close":
                time.sleep(30)

    def _report(self, conn: socket.socket) -> None:
        self.served += 1
        self._send(conn, (self.body if self.later is None or self.served == 1 else self.later).encode())
