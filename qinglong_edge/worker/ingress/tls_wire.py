"""Socket-level pieces of the ingress client: deadlines, one connection, TCP, framing.

Used only by :mod:`qinglong_edge.worker.ingress.transport` (split out to keep it readable).
Time (offer-delivery.md 1.5): every blocking operation gets the inactivity timeout,
cut by the request's hard deadline (:class:`Deadline`).
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import time
from collections.abc import Callable

from qinglong_edge.contracts.origin import Origin
from qinglong_edge.errors import EX_TEMPFAIL, EdgeError, TransportError
from qinglong_edge.worker.ingress.http_exchange import MAX_HEAD_BYTES, BodyDecoder

__all__ = [
    "DEADLINE_FACTOR",
    "Deadline",
    "DeadlineExceeded",
    "PeerClosed",
    "SourceChanged",
    "Wire",
    "await_ticket",
    "connect",
    "read_body",
    "read_head",
    "resolve",
    "send_head",
]

#: The whole exchange must end within this many request timeouts (trickle guard).
DEADLINE_FACTOR = 2
_RECV_BYTES = 64 * 1024


class DeadlineExceeded(EdgeError, TimeoutError):
    """The request's hard deadline passed (a ``TimeoutError``: the transport classifies it
    with the socket's own, :func:`qinglong_edge.worker.ingress.reasons.classify`)."""

    code = "deadline_exceeded"
    exit_status = EX_TEMPFAIL


class PeerClosed(EdgeError, ConnectionError):
    """The peer closed the connection before the response head was complete (a
    ``ConnectionError``, classified like a reset)."""

    code = "connection_closed"
    exit_status = EX_TEMPFAIL


class SourceChanged(EdgeError):
    """A streamed file changed size or content time under the upload
    (:mod:`qinglong_edge.worker.ingress.stream`; here so that the transport can catch
    it without importing that module on every call). The transport turns it into a
    ``TransportError`` with reason ``source_changed``."""

    code = "source_changed"
    exit_status = EX_TEMPFAIL


class Deadline:
    """Per-operation timeout: the inactivity timeout, capped by the hard deadline.

    Args:
        timeout_s: the inactivity timeout (``requestTimeoutMs`` / 1000).
        extra_s: added to the hard deadline (a long upload: its size at the slowest
            rate allowed, see ``transport.MIN_UPLOAD_BYTES_PER_S``).
    """

    def __init__(self, timeout_s: float, extra_s: float = 0.0) -> None:
        self.timeout_s = timeout_s
        self.end = time.monotonic() + timeout_s * DEADLINE_FACTOR + extra_s

    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def budget(self) -> float:
        remaining = self.end - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded("request deadline exceeded")
        return min(self.timeout_s, remaining)


class Wire:
    """One TLS connection: its socket, bytes read ahead, material digest, idle time,
    and whether a response byte ever arrived on it (``answered``)."""

    __slots__ = ("answered", "buffer", "digest", "early", "fresh", "idle_since", "sock")

    def __init__(self, sock: ssl.SSLSocket, digest: bytes) -> None:
        self.sock = sock
        self.digest = digest
        self.buffer = bytearray()
        self.idle_since = 0.0
        #: Opened for the current request (not a reused idle connection).
        self.fresh = True
        self.answered = False
        #: The server answered before the request body was complete (never pooled).
        self.early = False

    def recv(self, deadline: Deadline) -> bytes:
        self.sock.settimeout(deadline.budget())
        data = self.sock.recv(_RECV_BYTES)
        if data:
            self.answered = True
        return data

    def read_ready(self) -> bytes | None:
        """Without blocking: the application data that has arrived (kept in
        ``buffer`` too), ``b""`` at EOF, or None when there is none (a session ticket
        alone is not data).

        Raises:
            OSError: ``ssl.SSLError`` for an alert, a reset.
        """
        if self.sock.pending() == 0:
            poller = select.poll()
            poller.register(self.sock, select.POLLIN | select.POLLERR | select.POLLHUP)
            if not poller.poll(0):
                return None
        self.sock.settimeout(0.0)
        try:
            data = self.sock.recv(_RECV_BYTES)
        except ssl.SSLWantReadError:
            return None
        if data:
            self.answered = True
            self.buffer += data
        return data

    def probe(self) -> str:
        """Without blocking: ``quiet`` (nothing to read), ``eof`` or ``data``."""
        try:
            if self.sock.pending() == 0:
                poller = select.poll()
                poller.register(self.sock, select.POLLIN | select.POLLERR | select.POLLHUP)
                if not poller.poll(0):
                    return "quiet"
            self.sock.settimeout(0.0)
            data = self.sock.recv(1)
        except ssl.SSLWantReadError:
            return "quiet"  # only TLS records without application data (session tickets)
        except (OSError, ValueError):  # ValueError: the socket is already closed
            return "eof"
        return "data" if data else "eof"

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def resolve(origin: Origin) -> list[tuple[int, int, int, object]]:
    """``getaddrinfo`` of the origin (stage ``resolve``): ``(family, type, proto, address)``.

    Raises:
        OSError: ``socket.gaierror`` and others, classified by the caller.
    """
    # bytes, not str: CPython encodes a str host with the "idna" codec, which needs
    # unicodedata, absent from OpenWrt's python3-light (packaging.md); our hosts are
    # ASCII LDH names or IP literals (contracts.origin), so ASCII bytes are exact.
    infos = socket.getaddrinfo(origin.host.encode("ascii"), origin.port, type=socket.SOCK_STREAM)
    return [(family, kind, proto, address) for family, kind, proto, _name, address in infos]


def connect(addresses: list[tuple[int, int, int, object]], budget: Callable[[], float]) -> socket.socket:
    """Connect to the first address that answers, each attempt within ``budget()`` s.

    Raises:
        DeadlineExceeded: the hard deadline passed.
        OSError: the last address's failure (``no address`` when there was none).
    """
    last: OSError = OSError("no address to connect to")
    for family, kind, proto, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(budget())
            sock.connect(address)  # type: ignore[arg-type]  # a getaddrinfo sockaddr
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except DeadlineExceeded:
            sock.close()
            raise
        except OSError as exc:
            sock.close()
            last = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise last


def send_head(
    sock: ssl.SSLSocket,
    origin: Origin,
    path: str,
    authorization: str,
    *,
    content_type: str,
    content_length: int,
    body: bytes,
) -> None:
    """Frame and send the request head (headers in the Node worker's order) and ``body``
    (all of a JSON body, or the prefix of a stream) with ``http.client``.

    Raises:
        TransportError: ``request_rejected`` / ``invalid_request`` when http.client
            refuses a header (its message, which quotes the value, is not shown).
        OSError: from the socket.
    """
    framer = http.client.HTTPConnection(origin.host, origin.port)
    framer.sock = sock
    try:
        framer.putrequest("POST", path, skip_host=True, skip_accept_encoding=True)
        framer.putheader("accept", "application/json")
        framer.putheader("authorization", authorization)
        framer.putheader("content-type", content_type)
        framer.putheader("content-length", str(content_length))
        framer.putheader("Host", origin.host_header)
        framer.putheader("Connection", "keep-alive")
        framer.endheaders(body)
    except (ValueError, http.client.HTTPException):
        # http.client quotes the offending header value in its message: never show it.
        raise TransportError("send request: http.client refused a header", code="request_rejected",
                             reason="invalid_request") from None
    finally:
        framer.sock = None  # the socket belongs to the Wire, not to this one-shot framer


def await_ticket(wire: Wire, wait_s: float) -> bool | None:
    """After a handshake: True once a session ticket (or any data) arrived; None if
    nothing came within ``wait_s``. A TLS 1.3 server sends tickets only after it
    accepted the client certificate, so a ticket proves that without a request.

    Raises:
        OSError: an alert (``ssl.SSLError``), EOF (:class:`PeerClosed`), a reset.
    """
    tls = wire.sock
    end = time.monotonic() + wait_s
    poller = select.poll()
    poller.register(tls, select.POLLIN | select.POLLERR | select.POLLHUP)
    tls.settimeout(0.0)
    while True:
        try:
            data = tls.recv(1)
        except ssl.SSLWantReadError:
            session = tls.session
            if session is not None and session.has_ticket:
                return True
        else:
            if not data:
                raise PeerClosed("the server closed the connection after the handshake")
            return True  # the server spoke first: its TLS layer accepted us
        remaining = end - time.monotonic()
        if remaining <= 0 or not poller.poll(int(remaining * 1000) + 1):
            return None


def read_head(wire: Wire, deadline: Deadline) -> bytes:
    """The response head (through ``CRLF CRLF``), or more than :data:`MAX_HEAD_BYTES`
    bytes without one (the parser refuses them); bytes after it stay in ``wire.buffer``.

    Raises:
        PeerClosed: EOF before the head ended. OSError: from the socket.
    """
    buffer = wire.buffer
    searched = 0
    while True:
        end = buffer.find(b"\r\n\r\n", max(0, searched - 3))
        if end >= 0:
            head = bytes(buffer[: end + 4])
            del buffer[: end + 4]
            return head
        if len(buffer) > MAX_HEAD_BYTES:
            return bytes(buffer)  # parse_response_head refuses it as too large
        searched = len(buffer)
        data = wire.recv(deadline)
        if not data:
            raise PeerClosed("peer closed the connection before the response head")
        buffer += data


def read_body(wire: Wire, decoder: BodyDecoder, deadline: Deadline, *, probe_after: bool = True) -> bool:
    """Feed the body to ``decoder``; True when the connection may be reused (the body
    ended by its framing and nothing follows it).

    Raises:
        TransportError: the decoder's, or ``response_too_large`` for bytes after the body.
        OSError: from the socket.
    """
    decoder.feed(bytes(wire.buffer))
    wire.buffer.clear()
    while not decoder.done:
        data = wire.recv(deadline)
        if not data:
            decoder.eof()
            return False
        decoder.feed(data)
    if not decoder.reusable or not probe_after:
        return False
    state = wire.probe()
    if state == "data":
        raise TransportError("server sent bytes after the end of the body", code="response_too_large",
                             http_status=200)
    return state == "quiet"
