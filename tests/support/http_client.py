"""A tiny raw HTTP/1.1 client for tests: bytes out, parsed response in.

Deliberately not http.client: tests must send malformed bytes and see exactly what
the server answers (status line, raw header lines, body), including "the server
closed the connection".
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RawResponse:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    raw_head: bytes = b""
    extra: list[RawResponse] = field(default_factory=list)  # interim 1xx responses seen first

    def header(self, name: str) -> str | None:
        found = [v for k, v in self.headers if k.lower() == name.lower()]
        assert len(found) <= 1, f"{name} appears {len(found)} times"
        return found[0] if found else None

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def closes(self) -> bool:
        return (self.header("connection") or "").lower() == "close"


class ResponseReader:
    """Reads responses from one socket, keeping leftover bytes between them."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.eof = False

    def _fill(self, deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no complete response before the deadline")
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        self.buffer += chunk
        return True

    def read(self, timeout: float = 10.0) -> RawResponse | None:
        """The next final response (1xx collected in ``extra``), or None if the
        server closed the connection without one."""
        deadline = time.monotonic() + timeout
        interim: list[RawResponse] = []
        while True:
            while b"\r\n\r\n" not in self.buffer:
                if self.eof or not self._fill(deadline):
                    return None
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            version, status, reason = lines[0].decode("latin-1").split(" ", 2)
            assert version == "HTTP/1.1", lines[0]
            headers = []
            for line in lines[1:]:
                name, _, value = line.decode("latin-1").partition(":")
                headers.append((name, value.strip()))
            response = RawResponse(int(status), reason, headers, b"", head + b"\r\n\r\n")
            if 100 <= response.status < 200:
                interim.append(response)
                self.buffer = rest
                continue
            length = int(response.header("content-length") or 0)
            while len(rest) < length:
                if self.eof or not self._fill(deadline):
                    raise AssertionError("connection closed inside a response body")
                rest = self.buffer.partition(b"\r\n\r\n")[2]
            response.body = rest[:length]
            response.extra = interim
            self.buffer = rest[length:]
            return response

    def closed_by_server(self, timeout: float = 5.0) -> bool:
        """True if the server closes (EOF or reset) with no further bytes."""
        deadline = time.monotonic() + timeout
        try:
            while not self.eof:
                if self._fill(deadline):
                    return False
        except TimeoutError:
            return False
        return self.buffer == b""


def exchange(address: tuple[str, int], data: bytes, *, half_close: bool = False, timeout: float = 10.0) -> RawResponse | None:
    """Open a connection, send ``data``, optionally half-close, read one response."""
    with socket.create_connection(address, timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        return ResponseReader(sock).read(timeout)


def request_bytes(
    method: str,
    target: str,
    *,
    headers: list[tuple[str, str]] | None = None,
    body: bytes = b"",
    host: str = "127.0.0.1:5700",
    content_length: bool | None = None,
) -> bytes:
    """Build request bytes: request line, Host, the given headers in order, an
    automatic Content-Length when there is a body (or when asked), body."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in headers or []]
    if content_length or (content_length is None and body):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
