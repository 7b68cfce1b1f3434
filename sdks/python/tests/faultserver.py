"""A small scripted HTTP/1.1 fault server on a loopback socket, for the tests whose fault is at
the socket level (resets, hangs, cut-off and slow bodies, refused connections).

Each request that arrives takes the next step of the script (the last one repeats). It records
what every request sent and counts the connections that are open.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple


@dataclass
class Step:
    """What the server does with one request."""

    status: int = 200
    headers: Dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    fault: Optional[str] = None
    """None, "reset", "hang", "cut" (send ``cut_after`` body bytes, then close) or "slow"."""
    cut_after: int = 0
    chunk: int = 16
    interval: float = 0.1


@dataclass
class Seen:
    method: str
    path: str
    headers: Dict[str, str]
    body: bytes
    arrived: float
    ended: float = 0.0


class FaultServer:
    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.seen: List[Seen] = []
        self.open_connections = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def __enter__(self) -> FaultServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        try:
            self._sock.close()
        except OSError:
            pass

    def wait_closed(self, timeout: float = 5.0) -> bool:
        """Waits (bounded) until the clients have closed every connection."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.open_connections == 0:
                return True
            time.sleep(0.01)
        return False

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.open_connections += 1
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _next_step(self) -> Step:
        with self._lock:
            i = min(len(self.seen), len(self.steps) - 1)
            return self.steps[i]

    def _read_request(self, conn: socket.socket, buf: bytearray) -> Optional[Tuple[str, str, Dict[str, str], bytes]]:
        while b"\r\n\r\n" not in buf:
            data = conn.recv(65536)
            if not data:
                return None
            buf += data
        head, _, rest = bytes(buf).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers: Dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            headers[name] = headers[name] + ", " + value.strip() if name in headers else value.strip()
        length = int(headers.get("content-length", "0"))
        body = bytearray(rest)
        while len(body) < length:
            data = conn.recv(65536)
            if not data:
                return None
            body += data
        del buf[:]
        buf += body[length:]
        return method, path, headers, bytes(body[:length])

    def _serve(self, conn: socket.socket) -> None:
        buf = bytearray()
        try:
            while True:
                req = self._read_request(conn, buf)
                if req is None:
                    return
                step = self._next_step()
                seen = Seen(req[0], req[1], req[2], req[3], time.monotonic())
                with self._lock:
                    self.seen.append(seen)
                keep = self._answer(conn, step)
                seen.ended = time.monotonic()
                if not keep:
                    return
        except OSError:
            return
        finally:
            try:
                conn.close()
            except OSError:
                pass
            with self._lock:
                self.open_connections -= 1

    def _head(self, step: Step) -> bytes:
        lines = [f"HTTP/1.1 {step.status} X"]
        headers = {"content-length": str(len(step.body)), **step.headers}
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _answer(self, conn: socket.socket, step: Step) -> bool:
        if step.fault == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        if step.fault == "hang":
            conn.settimeout(30)
            try:
                while conn.recv(65536):
                    pass
            except OSError:
                pass
            return False
        if step.fault == "cut":
            conn.sendall(self._head(step) + step.body[: step.cut_after])
            conn.shutdown(socket.SHUT_WR)
            return False
        if step.fault == "slow":
            conn.sendall(self._head(step))
            for i in range(0, len(step.body), step.chunk):
                conn.sendall(step.body[i : i + step.chunk])
                time.sleep(step.interval)
            return True
        conn.sendall(self._head(step) + step.body)
        return True


def refused_url() -> str:
    """A loopback URL where nothing listens (a port bound, then closed)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"
