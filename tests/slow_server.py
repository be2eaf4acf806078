"""A hostile HTTP peer on loopback: it reads a request, then answers it a piece at a
time with a pause between pieces (one byte every 50 ms by default), as the probe of
issue 34 did to keep a request alive past every per-read timeout. It records what it
managed to send and whether the client hung up first. Bounded: it stops by itself
after `lifetime` seconds, and at `stop()`."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Exchange:
    request: bytes = b""
    sent: int = 0
    hung_up: bool = False  # the client closed the connection before the answer was over
    finished: bool = False


def response(status: str = "200 OK", headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    if "Content-Length" not in (headers or {}):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass
class SlowServer:
    # The answer as pieces, sent one after the other with `interval` between them.
    pieces: Callable[[], Iterable[bytes]]
    interval: float = 0.05
    lifetime: float = 60.0
    tls: ssl.SSLContext | None = None  # serve HTTPS with this context
    exchanges: list[Exchange] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)
    in_flight: int = 0
    max_in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _sock: socket.socket | None = None

    @classmethod
    def trickling(cls, answer: bytes, piece: int = 1, **kwargs: Any) -> SlowServer:
        return cls(lambda: (answer[i : i + piece] for i in range(0, len(answer), piece)), **kwargs)

    @property
    def port(self) -> int:
        assert self._sock is not None
        return int(self._sock.getsockname()[1])

    def url(self, path: str = "/hook") -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{path}"

    def start(self) -> SlowServer:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        ends = time.monotonic() + self.lifetime
        threading.Thread(target=self._accept, args=(ends,), daemon=True).start()
        return self

    def settled(self, timeout: float = 10.0) -> bool:
        """Wait until no answer is being sent: the client's side of an exchange ends
        before ours does (our next send is what learns that the client hung up)."""
        ends = time.monotonic() + timeout
        while time.monotonic() < ends:
            with self._lock:
                if self.in_flight == 0:
                    return True
            time.sleep(0.01)
        return False

    def stop(self) -> None:
        self._stop.set()
        if self._sock is not None:
            self._sock.close()

    def _accept(self, ends: float) -> None:
        assert self._sock is not None
        while not self._stop.is_set() and time.monotonic() < ends:
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._answer, args=(conn, ends), daemon=True).start()

    def _answer(self, conn: socket.socket, ends: float) -> None:
        exchange = Exchange()
        with self._lock:
            self.exchanges.append(exchange)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            conn.settimeout(5)
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except (OSError, ssl.SSLError):
                    exchange.hung_up = True  # the client refused our certificate
                    return
            exchange.request = self._read_request(conn)
            self.arrived.set()
            for piece in self.pieces():
                if self._stop.is_set() or time.monotonic() >= ends:
                    return
                try:
                    conn.sendall(piece)
                except OSError:
                    exchange.hung_up = True
                    return
                exchange.sent += len(piece)
                if self.interval:
                    time.sleep(self.interval)
            exchange.finished = True
        finally:
            with self._lock:
                self.in_flight -= 1
            conn.close()

    @staticmethod
    def _read_request(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(rest) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            rest += chunk
        return head + b"\r\n\r\n" + rest
