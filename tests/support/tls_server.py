"""Loopback servers for transport tests: real TLS, real sockets, scripted answers.

Every server listens on ``127.0.0.1`` (port chosen by the kernel), runs in daemon
threads, records what it saw, and is a context manager (``with ... as server``) that
stops it and joins its threads on exit.

:class:`TLSServer` -- an HTTP/1.1 server over TLS built on :mod:`ssl` with the committed
certificates of ``tests/support/certs`` (see ``make_certs.py``). Per request it calls a
*handler* with the parsed :class:`Request` and writes what the handler returns:

* ``bytes`` -- written as-is (raw, so malformed responses are possible); the connection
  then waits for the next request (keep-alive);
* an :class:`Action` -- :class:`Respond` (bytes, optional delay, optional close
  afterwards), :class:`Trickle` (one byte per interval), :class:`Hang` (answer nothing,
  keep the connection until the peer leaves) or :class:`Close` (close at once).

:func:`http_response` builds a cluster-shaped response (offer-delivery.md section 1.7
headers) with any status, body and extra or replaced headers.

Options: ``num_tickets`` (TLS 1.3 session tickets sent per handshake; 0: none, so no
client can resume), the certificate identity the server presents (``identity="server-expired"``
loads ``server-expired.pem``/``.key``), the TLS versions (``"1.3"``, ``"1.2"``, ``"1.1"``,
``"1.0"``; the old ones with ``@SECLEVEL=0``; :func:`legacy_tls_server` raises
RuntimeError, for the caller to skip with, when this OpenSSL cannot speak them, and
:func:`probe_tls_version` checks any server), and the CA a client certificate must
come from (``client_ca="client-ca"``; None: no client certificate requested).
``head_handler`` sees each request head before its body is read and may answer from it
alone (the server then half-closes, discards what the client still sends, and ends the
connection: how a server refuses a body it will not read, e.g. a too-large upload);
``short_bodies=True`` hands the handler a request whose client ended its side before
``Content-Length`` bytes came (``complete=False``) instead of dropping it.

Other peers: :class:`PlainHTTPServer` (plaintext HTTP on the port a client expects TLS
on: answers ``400`` like Node), :class:`SilentPeer` (accepts TCP, never speaks),
:class:`UnacceptingPeer` (a full accept queue: ``connect()`` itself hangs),
:class:`TricklePeer` (accepts TCP, sends one byte per interval, forever), and
:class:`OpenSSLServer` (``openssl s_server`` with given arguments, for TLS stacks and
versions other than this Python's).

Recorded: ``requests`` (every :class:`Request`), ``connections`` (accepted TCP
connections), ``handshakes`` (completed TLS handshakes), ``handshake_errors`` (the
server-side reasons), ``sni`` (server names received, None for no SNI), ``resumed`` (per
completed handshake: whether it resumed a session), ``peer_names``
(the client certificate's CN per handshake), ``peer_closed`` (connections the client
closed) and ``server_closed`` (connections this server closed); :meth:`wait_for` waits for a condition over any of these.

Example (the cluster double builds on this)::

    def handler(request: Request) -> bytes | Action:
        if request.header("authorization") != expected:
            return http_response(401, b'{"code":"worker_authentication_required"}')
        return http_response(200, b'{"schema":...}')

    with TLSServer(handler) as server:
        transport = IngressTransport(server.origin(), ...)
"""

from __future__ import annotations

import contextlib
import pathlib
import re
import select
import socket
import ssl
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, cast

CERTS = pathlib.Path(__file__).resolve().parent / "certs"

#: Server-side socket timeout: long enough for every test, short enough never to hang.
SERVER_IO_TIMEOUT_S = 10.0
MAX_REQUEST_HEAD = 64 * 1024


def cert_path(name: str) -> pathlib.Path:
    """Path of a committed file: ``cert_path("root-ca.pem")``."""
    return CERTS / name


@dataclass(frozen=True)
class Request:
    """One request as the server parsed it.

    Attributes:
        method, target, version: the request line's parts.
        headers: every header line in order, names as sent (case kept).
        body: ``Content-Length`` bytes of body.
        raw_head: the head bytes exactly as received (request line to CRLF CRLF).
        connection: 1-based index of the TCP connection that carried it.
        complete: False when the client ended its side before ``Content-Length``
            bytes came (only with ``short_bodies=True``), or for the head alone given
            to a ``head_handler``.
    """

    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    raw_head: bytes
    connection: int
    complete: bool = True

    def header(self, name: str) -> str | None:
        """The first value of ``name`` (case-insensitive), or None."""
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None


@dataclass(frozen=True)
class Respond:
    """Write ``data`` after ``delay_s``; then close the connection if ``close``."""

    data: bytes
    delay_s: float = 0.0
    close: bool = False


@dataclass(frozen=True)
class Trickle:
    """Write ``data`` one byte every ``interval_s`` seconds (until the peer leaves)."""

    data: bytes
    interval_s: float = 1.0


@dataclass(frozen=True)
class Hang:
    """Answer nothing; keep the connection until the peer closes it or the server stops."""


@dataclass(frozen=True)
class Close:
    """Close the connection at once without answering."""


Action = Respond | Trickle | Hang | Close
Handler = Callable[[Request], "bytes | Action"]
#: Called with the head alone (``body`` empty, ``complete`` False) before the body is
#: read; an answer other than None is sent and the connection ends (body unread).
HeadHandler = Callable[[Request], "bytes | Action | None"]


def http_response(
    status: int = 200,
    body: bytes = b'{"ok":true}',
    *,
    reason: str | None = None,
    content_type: str | None = "application/json; charset=utf-8",
    headers: tuple[tuple[str, str], ...] = (),
    content_length: bool = True,
    version: str = "HTTP/1.1",
) -> bytes:
    """A response shaped like the cluster's (section 1.7), as raw bytes.

    ``headers`` are added after the standard ones; a standard header whose name (any
    case) appears in ``headers`` is left out, so a test can replace or drop it (an
    empty name list keeps all). ``content_length=False`` omits ``Content-Length``.
    """
    overridden = {name.lower() for name, _ in headers}
    standard: list[tuple[str, str]] = [
        ("Cache-Control", "no-store"),
        ("X-Content-Type-Options", "nosniff"),
        ("X-Request-Id", "req-test-1"),
    ]
    if content_type is not None:
        standard.insert(0, ("Content-Type", content_type))
    if content_length:
        standard.append(("Content-Length", str(len(body))))
    lines = [f"{version} {status} {reason or _REASONS.get(status, 'Status')}"]
    lines += [f"{name}: {value}" for name, value in standard if name.lower() not in overridden]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


_REASONS = {
    200: "OK", 201: "Created", 204: "No Content", 302: "Found", 400: "Bad Request",
    401: "Unauthorized", 404: "Not Found", 409: "Conflict", 429: "Too Many Requests",
    500: "Internal Server Error", 503: "Service Unavailable",
}


def default_handler(request: Request) -> bytes:
    """``200 {"ok":true}``."""
    return http_response()


class _LoopbackServer:
    """Accept loop + one thread per connection; subclasses implement :meth:`_serve`."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.host = "127.0.0.1"
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._lock = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self.connections = 0
        self.peer_closed = 0
        self.server_closed = 0

    # -- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        thread = threading.Thread(target=self._accept_loop, name=f"{type(self).__name__}-accept", daemon=True)
        self._threads.append(thread)
        thread.start()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
        for thread in list(self._threads):
            thread.join(timeout=5)

    def origin(self, host: str = "localhost") -> str:
        """``https://<host>:<port>``; the test certificates name localhost and 127.0.0.1."""
        return f"https://{host}:{self.port}"

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Wait until ``predicate()`` (evaluated under the server's lock) holds."""
        with self._lock:
            return self._lock.wait_for(predicate, timeout=timeout)

    def _note(self, attribute: str, value: object = None) -> None:
        with self._lock:
            current = getattr(self, attribute)
            if isinstance(current, list):
                current.append(value)
            else:
                setattr(self, attribute, current + 1)
            self._lock.notify_all()

    # -- accept loop -------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(SERVER_IO_TIMEOUT_S)
            with self._lock:
                self.connections += 1
                index = self.connections
                self._sockets.append(conn)
                self._lock.notify_all()
            thread = threading.Thread(target=self._run, args=(conn, index), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _run(self, conn: socket.socket, index: int) -> None:
        try:
            self._serve(conn, index)
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.close()
            self._note("server_closed")

    def _serve(self, conn: socket.socket, index: int) -> None:
        raise NotImplementedError

    def _wait_peer_close(self, conn: socket.socket) -> None:
        """Block until the client closes (EOF or reset) or the server stops."""
        while not self._stop.is_set():
            try:
                readable, _, _ = select.select([conn], [], [], 0.1)
                if not readable and not (isinstance(conn, ssl.SSLSocket) and conn.pending()):
                    continue
                if not conn.recv(4096):
                    break
            except ssl.SSLWantReadError:
                continue
            except OSError:
                break
        if not self._stop.is_set():
            self._note("peer_closed")


class TLSServer(_LoopbackServer):
    """HTTP/1.1 over TLS with scripted answers (see the module docstring)."""

    def __init__(
        self,
        handler: Handler = default_handler,
        *,
        identity: str = "server",
        certificate: str | None = None,
        client_ca: str | None = "client-ca",
        tls_version: str = "1.3",
        head_handler: HeadHandler | None = None,
        short_bodies: bool = False,
        num_tickets: int | None = None,
    ) -> None:
        super().__init__()
        self.handler = handler
        self.head_handler = head_handler
        self.short_bodies = short_bodies
        self.requests: list[Request] = []
        self.handshakes = 0
        self.handshake_errors: list[str] = []
        self.sni: list[str | None] = []
        self.peer_names: list[str] = []
        self.resumed: list[bool] = []
        self.context = self._make_context(identity, certificate, client_ca, tls_version)
        if num_tickets is not None:
            self.context.num_tickets = num_tickets
        if short_bodies:
            # A client that half-closes the TCP stream (FIN, no close_notify) must still
            # be able to read the answer: without this, OpenSSL 3 treats the EOF as a
            # fatal error and answers with an alert instead of the data.
            self.context.options |= ssl.OP_IGNORE_UNEXPECTED_EOF

    def _make_context(
        self, identity: str, certificate: str | None, client_ca: str | None, tls_version: str
    ) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        version = _TLS_VERSIONS[tls_version]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            if tls_version != "1.3":
                # Old versions and weak keys need security level 0 in OpenSSL 3.
                context.set_ciphers("DEFAULT:@SECLEVEL=0")
            context.minimum_version = version
            context.maximum_version = version
        if identity == "server-rsa1024":
            context.set_ciphers("DEFAULT:@SECLEVEL=0")
        context.load_cert_chain(cert_path(certificate or f"{identity}.pem"), cert_path(f"{identity}.key"))
        if client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cert_path(f"{client_ca}.pem"))

        def remember_sni(sock: ssl.SSLObject | ssl.SSLSocket, name: str | None, ctx: ssl.SSLContext) -> None:
            self._note("sni", name)

        context.sni_callback = remember_sni
        return context

    def _serve(self, conn: socket.socket, index: int) -> None:
        try:
            tls = self.context.wrap_socket(conn, server_side=True)
        except (OSError, ValueError) as exc:
            self._note("handshake_errors", getattr(exc, "reason", None) or str(exc))
            return
        with self._lock:
            self._sockets.append(tls)
        peer = tls.getpeercert() or {}
        rdns = cast("tuple[tuple[tuple[str, str], ...], ...]", peer.get("subject", ()))
        subject = dict(item[0] for item in rdns)
        self._note("peer_names", subject.get("commonName", ""))
        self._note("resumed", tls.session_reused)
        self._note("handshakes")
        buffer = bytearray()
        try:
            while not self._stop.is_set():
                head = _read_head(tls, buffer, index)
                if head is None:
                    self._note("peer_closed")
                    return
                if self.head_handler is not None:
                    early = self.head_handler(head)
                    if early is not None:
                        # Answered from the head alone: the body stays unread, so the
                        # connection ends; lingering first lets the peer read the answer
                        # instead of a reset (the unread bytes would cause one).
                        self._note("requests", head)
                        self._answer(tls, early)
                        self._linger(tls)
                        return
                request = _read_body(tls, buffer, head, self.short_bodies)
                if request is None:
                    self._note("peer_closed")
                    return
                self._note("requests", request)
                answer = self.handler(request)
                if not self._answer(tls, answer):
                    return
                if not request.complete:
                    self._note("peer_closed")
                    return
        finally:
            tls.close()

    def _linger(self, tls: ssl.SSLSocket, limit_s: float = 5.0) -> None:
        """Half-close, then discard what the peer still sends until it closes (bounded)."""
        with contextlib.suppress(OSError):
            socket.socket.shutdown(tls, socket.SHUT_WR)
        deadline = time.monotonic() + limit_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                readable, _, _ = select.select([tls], [], [], 0.1)
                if readable and not socket.socket.recv(tls, 65536):
                    return
            except OSError:
                return

    def _answer(self, tls: ssl.SSLSocket, answer: bytes | Action) -> bool:
        """Carry out ``answer``; False when the connection is finished."""
        if isinstance(answer, bytes):
            answer = Respond(answer)
        if isinstance(answer, Respond):
            if answer.delay_s:
                time.sleep(answer.delay_s)  # the scenario: a slow server
            tls.sendall(answer.data)
            return not answer.close
        if isinstance(answer, Trickle):
            for offset in range(len(answer.data)):
                if self._stop.wait(answer.interval_s if offset else 0):
                    return False
                tls.sendall(answer.data[offset : offset + 1])
            return False
        if isinstance(answer, Hang):
            self._wait_peer_close(tls)
            return False
        return False  # Close


_TLS_VERSIONS = {
    "1.3": ssl.TLSVersion.TLSv1_3,
    "1.2": ssl.TLSVersion.TLSv1_2,
    "1.1": ssl.TLSVersion.TLSv1_1,
    "1.0": ssl.TLSVersion.TLSv1,
}
_REQUEST_LINE = re.compile(rb"([A-Z]+) (\S+) (HTTP/1\.[01])")


def _read_head(sock: socket.socket, buffer: bytearray, index: int) -> Request | None:
    """Read one request head (the body not yet read: ``body`` empty, ``complete`` False);
    None at a clean EOF."""
    while b"\r\n\r\n" not in buffer:
        if len(buffer) > MAX_REQUEST_HEAD:
            raise ValueError("request head too large")
        data = sock.recv(65536)
        if not data:
            return None
        buffer += data
    end = buffer.index(b"\r\n\r\n") + 4
    raw_head = bytes(buffer[:end])
    del buffer[:end]
    lines = raw_head[:-4].split(b"\r\n")
    match = _REQUEST_LINE.fullmatch(lines[0])
    if match is None:
        raise ValueError("bad request line")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers.append((name.decode("latin-1"), value.strip().decode("latin-1")))
    return Request(
        method=match.group(1).decode(),
        target=match.group(2).decode(),
        version=match.group(3).decode(),
        headers=tuple(headers),
        body=b"",
        raw_head=raw_head,
        connection=index,
        complete=False,
    )


def _read_body(sock: socket.socket, buffer: bytearray, head: Request, short_bodies: bool) -> Request | None:
    """Read ``Content-Length`` bytes of body after ``head``. At EOF before that: None, or
    with ``short_bodies`` the request with what came (``complete`` False)."""
    text = head.header("content-length")
    length = int(text) if text is not None and text.isdigit() else 0
    while len(buffer) < length:
        data = sock.recv(65536)
        if not data:
            if not short_bodies:
                return None
            body = bytes(buffer)
            buffer.clear()
            return replace(head, body=body, complete=False)
        buffer += data
    body = bytes(buffer[:length])
    del buffer[:length]
    return replace(head, body=body, complete=True)


class PlainHTTPServer(_LoopbackServer):
    """Plaintext HTTP where TLS is expected: reads what arrives, answers a raw 400."""

    def _serve(self, conn: socket.socket, index: int) -> None:
        with contextlib.suppress(OSError):
            conn.recv(65536)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")


class SilentPeer(_LoopbackServer):
    """Accepts TCP and never sends a byte."""

    def _serve(self, conn: socket.socket, index: int) -> None:
        self._wait_peer_close(conn)


class TricklePeer(_LoopbackServer):
    """Accepts TCP and sends one byte of ``data`` every ``interval_s``, forever."""

    def __init__(self, data: bytes = b"HTTP/1.1 200 OK\r\n", interval_s: float = 1.0) -> None:
        super().__init__()
        self.data = data
        self.interval_s = interval_s

    def _serve(self, conn: socket.socket, index: int) -> None:
        offset = 0
        while not self._stop.wait(self.interval_s if offset else 0):
            conn.sendall(self.data[offset % len(self.data) : offset % len(self.data) + 1])
            offset += 1


class UnacceptingPeer:
    """A listener that never accepts, its one-slot accept queue already full: Linux then
    drops further SYNs, so a client's ``connect()`` never completes (a connect timeout)."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(0)
        self.port: int = self._listener.getsockname()[1]
        self._filler = socket.create_connection(("127.0.0.1", self.port), timeout=5)

    def __enter__(self) -> UnacceptingPeer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._filler.close()
        self._listener.close()

    def origin(self, host: str = "127.0.0.1") -> str:
        return f"https://{host}:{self.port}"

    def connect_blocks(self) -> bool:
        """True when a plain connect really hangs here (proves the fixture works)."""
        probe = socket.socket()
        probe.settimeout(0.3)
        try:
            probe.connect(("127.0.0.1", self.port))
        except TimeoutError:
            return True
        except OSError:
            return False
        finally:
            probe.close()
        return False


@dataclass
class OpenSSLServer:
    """``openssl s_server`` on loopback, for TLS stacks/versions other than this Python's.

    ``args`` are extra s_server options (``["-tls1", "-cipher", "DEFAULT@SECLEVEL=0"]``).
    It answers no HTTP POST: use it for handshake-level tests.
    """

    args: list[str]
    identity: str = "server"
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    port: int = field(default=0, init=False)

    def __enter__(self) -> OpenSSLServer:
        command = [
            "openssl", "s_server", "-accept", "127.0.0.1:0", "-naccept", "16",
            "-cert", str(cert_path(f"{self.identity}.pem")), "-key", str(cert_path(f"{self.identity}.key")),
            "-cert_chain", str(cert_path("intermediate-ca.pem")), *self.args,
        ]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert self.process.stdout is not None
        seen = []
        for _ in range(20):  # "Using default temp DH parameters", then "ACCEPT host:port"
            line = self.process.stdout.readline().decode(errors="replace")
            seen.append(line)
            match = re.match(r"ACCEPT .*:(\d+)", line)
            if match is not None or not line:
                break
        if match is None:
            self.__exit__()
            raise RuntimeError(f"openssl s_server did not start: {seen!r}")
        self.port = int(match.group(1))
        # Keep draining its chatter so a full pipe never blocks it.
        threading.Thread(target=self.process.stdout.read, daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait(timeout=5)
            for stream in (self.process.stdin, self.process.stdout):
                if stream is not None:
                    stream.close()

    def origin(self, host: str = "localhost") -> str:
        return f"https://{host}:{self.port}"


def probe_tls_version(port: int, version: str) -> str | None:
    """Handshake with a permissive client limited to ``version``; the negotiated
    version, or None when the server cannot speak it (used to prove a fixture is real)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.set_ciphers("DEFAULT:@SECLEVEL=0")
        context.minimum_version = _TLS_VERSIONS[version]
        context.maximum_version = _TLS_VERSIONS[version]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                return tls.version()
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def legacy_tls_server(version: str) -> Iterator[TLSServer]:
    """An in-process server speaking only ``version``; raises RuntimeError when this
    OpenSSL refuses to (callers skip with the reason)."""
    try:
        server = TLSServer(tls_version=version, client_ca=None)
    except (ssl.SSLError, ValueError) as exc:
        raise RuntimeError(f"this OpenSSL cannot configure a TLS {version} server: {exc}") from exc
    with server:
        negotiated = probe_tls_version(server.port, version)
        if negotiated is None:
            raise RuntimeError(f"this OpenSSL cannot speak TLS {version} even at security level 0")
        yield server
