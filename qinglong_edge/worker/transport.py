"""TLS 1.3 mutual-TLS client for the worker ingress (ADR-0110, offer-delivery.md 1.1-1.7, 5).

Every call the Remote Worker makes to the cluster goes through :class:`IngressTransport`:
``POST`` of a JSON body to ``/api/v3/worker-ingress/workers/{workerId}/sessions/{sessionId}/{op}``
with ``Authorization: Worker ql3w_...``, answered by ``200`` and a JSON body, or an error.

Request, byte for byte as the TS worker (Node) sends it (section 1.3)::

    POST <path> HTTP/1.1
    accept: application/json
    authorization: Worker ql3w_<credentialId>_<secret>
    content-type: application/json
    content-length: <n>
    Host: <host>[:<port unless 443>]
    Connection: keep-alive

    <body: 2-4096 bytes (a route may raise the cap to 64 KiB), never chunked>

``http.client`` frames the request; the response head and body are read by the strict
sans-IO code of :mod:`qinglong_edge.worker.ingress_http` (see there why not
``HTTPResponse``). TLS (section 1.2): ``SSLContext(PROTOCOL_TLS_CLIENT)``, TLS 1.3 only,
certificate and host name verified against *only* the configured anchors (never the
system store), security level 2, SNI only for host names (CPython sends none for an
IP literal and checks the IP SAN instead), client chain and key from private files
(:mod:`qinglong_edge.worker.ingress_material`).

Connection life (one connection at most, one idle keep-alive connection at most)::

    no connection --post_json--> connect --> TLS handshake --> send --> head --> body
          ^                                                                    |
          +--- closed: any error, a non-200, Connection: close, HTTP/1.0, -----+
          |    a body delimited by EOF, bytes after the body, new material     |
          +--- idle: reused by the next request with the same material <-------+
               digest if younger than IDLE_REUSE_MAX_S and silent

Time (section 1.5): ``request_timeout_ms`` (1 000 - 60 000, default 15 000) bounds every
connect, TLS handshake, send and read like Node's socket inactivity timer; because a
peer that trickles a byte now and then defeats an inactivity timer, each request also
has a hard deadline of ``DEADLINE_FACTOR`` x the timeout (30 s by default) for the whole
exchange. Name resolution uses the system resolver and its own timeout (stdlib cannot
bound ``getaddrinfo``); IP literals resolve without I/O.

Errors are :class:`~qinglong_edge.errors.TransportError` with the reference's codes:

=========================  ================================================================
``invalid_configuration``  constructor arguments (origin, paths, anchors, timeout)
``credentials_unavailable`` a credential / certificate / key / anchor file breaks its rules
``request_rejected``       bad call (path, body, caps), DNS, connect, TLS, timeout, deadline,
                           reset or EOF at any stage (``http_status`` set once a head came)
``response_rejected``      section 1.6 violated; ``http_status`` and, for 429/503,
                           ``retry_after_ms``; never the body
``response_too_large``     more body than the cap or than declared
``closed``                 the transport was closed (before or during the call)
=========================  ================================================================

No message, log line or ``repr`` contains the credential secret, key material or a
response body. (Python audit hooks, ``sys.addaudithook``, see every ``http.client``
send, the ``Authorization`` header included; the agent installs none.)

Exceptions that are not network errors (for example one raised by a signal handler
while the call is blocked, how ``pull`` aborts on SIGTERM) propagate unchanged; the
connection in use is closed first, so nothing half-used is pooled. Only ``OSError``
(which includes ``ssl.SSLError`` and ``TimeoutError``) and ``http.client`` errors are
mapped to ``request_rejected``.
"""

from __future__ import annotations

import http.client
import os
import re
import select
import socket
import ssl
import sys
import threading
import time
from collections.abc import Sequence

from qinglong_edge.config import WorkerConfig
from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.origin import Origin, parse_origin
from qinglong_edge.contracts.strictjson import loads
from qinglong_edge.errors import TransportError
from qinglong_edge.worker.ingress_http import (
    DEFAULT_MAX_REQUEST_BYTES,
    MAX_HEAD_BYTES,
    MAX_REQUEST_BYTES_CEILING,
    MAX_RESPONSE_BYTES_CEILING,
    BodyDecoder,
    ResponseHead,
    accept_head,
    error_body_decoder,
    is_ingress_path,
    parse_error_code,
    parse_response_head,
)
from qinglong_edge.worker.ingress_material import Material, build_context, load_material

__all__ = [
    "DEADLINE_FACTOR",
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "IDLE_REUSE_MAX_S",
    "IngressTransport",
    "TransportResponse",
]

DEFAULT_REQUEST_TIMEOUT_MS = 15_000
MIN_REQUEST_TIMEOUT_MS = 1_000
MAX_REQUEST_TIMEOUT_MS = 60_000
MAX_TRUST_ANCHORS = 8
MAX_PATH_BYTES = 4096
#: The whole exchange must end within this many request timeouts (trickle guard).
DEADLINE_FACTOR = 2
#: An idle connection older than this is closed rather than reused: the cluster closes
#: idle connections after 5 s (``keepAliveTimeout``, section 1.5), and a request sent
#: as it does so would fail for nothing.
IDLE_REUSE_MAX_S = 4.0
_RECV_BYTES = 64 * 1024
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}", re.ASCII)



def _debug(message: str, *args: object) -> None:
    """A DEBUG record on this module's logger, if :mod:`logging` is in use at all.

    The pull path does not import :mod:`logging` (a cron run would pay its import for
    records nobody handles: without a configured handler DEBUG goes nowhere). An
    application or test that imported and configured logging still gets the records.
    """
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.getLogger(__name__).debug(message, *args)


class TransportResponse(Frozen):
    """An accepted response (section 1.6): status 200 and 2 - cap bytes of JSON.

    Attributes:
        status: always 200.
        body: the raw body bytes, not yet parsed (hidden from ``repr``).
        content_type: the ``Content-Type`` value as received.
        request_id: the ``x-request-id`` the cluster echoed or generated, when it
            matches ``^[A-Za-z0-9._:-]{1,128}$``, else None.
    """

    __slots__ = ("status", "body", "content_type", "request_id")  # noqa: RUF023 (field order)
    _repr_hidden = ("body",)

    status: int
    body: bytes
    content_type: str
    request_id: str | None

    def __init__(self, status: int, body: bytes, content_type: str, request_id: str | None) -> None:
        _set = object.__setattr__
        _set(self, "status", status)
        _set(self, "body", body)
        _set(self, "content_type", content_type)
        _set(self, "request_id", request_id)


class _DeadlineExceeded(TimeoutError):
    """The request's hard deadline passed."""


class _PeerClosed(ConnectionError):
    """The peer closed the connection before the response head was complete."""


class _Deadline:
    """Per-operation timeout: the inactivity timeout, capped by the hard deadline."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.end = time.monotonic() + timeout_s * DEADLINE_FACTOR

    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def budget(self) -> float:
        remaining = self.end - time.monotonic()
        if remaining <= 0:
            raise _DeadlineExceeded("request deadline exceeded")
        return min(self.timeout_s, remaining)


class _Wire:
    """One TLS connection: its socket, bytes read ahead, material digest, idle time."""

    __slots__ = ("buffer", "digest", "idle_since", "sock")

    def __init__(self, sock: ssl.SSLSocket, digest: bytes) -> None:
        self.sock = sock
        self.digest = digest
        self.buffer = bytearray()
        self.idle_since = 0.0

    def recv(self, deadline: _Deadline) -> bytes:
        self.sock.settimeout(deadline.budget())
        return self.sock.recv(_RECV_BYTES)

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


def _config_error(message: str) -> TransportError:
    return TransportError(message, code="invalid_configuration")


def _rejected(message: str) -> TransportError:
    return TransportError(message, code="request_rejected")


def _check_origin(origin: object) -> Origin:
    if isinstance(origin, Origin):
        text: object = origin.text
    elif isinstance(origin, str):
        text = origin
    else:
        raise _config_error("origin must be an Origin or a string")
    try:
        parsed = parse_origin(text)
    except ContractError as exc:
        raise _config_error(f"origin: {exc.detail}") from None
    if isinstance(origin, Origin) and parsed != origin:
        raise _config_error("origin is not a canonical Origin")
    return parsed


def _check_path(value: object, name: str) -> str:
    """Absolute, normalized, not ``/``, no NUL, at most 4096 UTF-8 bytes (reference rule)."""
    if not isinstance(value, str) or "\0" in value:
        raise _config_error(f"{name} must be an absolute path")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise _config_error(f"{name} is not valid UTF-8") from None
    if not value.startswith("/") or value == "/" or os.path.normpath(value) != value or size > MAX_PATH_BYTES:
        raise _config_error(f"{name} must be a normalized absolute file path of at most {MAX_PATH_BYTES} bytes")
    return value


def _check_int(value: object, low: int, high: int, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _rejected(f"{name} must be an integer from {low} to {high}")
    return value


def _open_tcp(origin: Origin, deadline: _Deadline) -> socket.socket:
    """Connect to the first address that answers, each attempt within the budget."""
    # bytes, not str: CPython encodes a str host with the "idna" codec, which needs
    # unicodedata, absent from OpenWrt's python3-light (packaging.md); our hosts are
    # ASCII LDH names or IP literals (contracts.origin), so ASCII bytes are exact.
    infos = socket.getaddrinfo(origin.host.encode("ascii"), origin.port, type=socket.SOCK_STREAM)
    last: OSError = OSError("no address to connect to")
    for family, kind, proto, _name, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.budget())
            sock.connect(address)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except _DeadlineExceeded:
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


def _send(sock: ssl.SSLSocket, origin: Origin, path: str, authorization: str, body: bytes) -> None:
    """Frame and send the request with ``http.client`` (headers in the Node worker's order)."""
    framer = http.client.HTTPConnection(origin.host, origin.port)
    framer.sock = sock
    try:
        framer.putrequest("POST", path, skip_host=True, skip_accept_encoding=True)
        framer.putheader("accept", "application/json")
        framer.putheader("authorization", authorization)
        framer.putheader("content-type", "application/json")
        framer.putheader("content-length", str(len(body)))
        framer.putheader("Host", origin.host_header)
        framer.putheader("Connection", "keep-alive")
        framer.endheaders(body)
    except ValueError:
        # http.client quotes the offending header value in its message: never show it.
        raise _rejected("send request: http.client refused a header") from None
    finally:
        framer.sock = None  # the socket belongs to the _Wire, not to this one-shot framer


def _reason(exc: BaseException) -> str:
    """A secret-free description of a network failure."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed ({exc.verify_message})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error ({exc.reason or type(exc).__name__})"
    if isinstance(exc, _DeadlineExceeded | _PeerClosed):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return type(exc).__name__


class IngressTransport:
    """The worker ingress HTTPS client (see the module docstring).

    Thread safety: calls are serialized (one connection at most); :meth:`close` may be
    called from any thread and interrupts a call in progress.
    """

    def __init__(
        self,
        origin: Origin | str,
        *,
        credential_file: str,
        certificate_file: str,
        private_key_file: str,
        trust_anchor_files: Sequence[str],
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
    ) -> None:
        """Validate the configuration; no file is read and no connection is made yet.

        Args:
            origin: ``https://host[:port][/]`` (section 1.1) or a parsed :class:`Origin`.
            credential_file: private file holding ``ql3w_<credentialId>_<secret>``.
            certificate_file: private PEM file with the client chain (leaf first).
            private_key_file: private PEM file with the client key (unencrypted).
            trust_anchor_files: 1-8 PEM (or DER) files; the only roots trusted.
            request_timeout_ms: 1 000 - 60 000 (section 1.5).

        Raises:
            TransportError: ``invalid_configuration``.
        """
        if not ssl.HAS_TLSv1_3:
            raise _config_error("this Python's OpenSSL has no TLS 1.3")
        self._origin = _check_origin(origin)
        self._credential_file = _check_path(credential_file, "credential_file")
        self._certificate_file = _check_path(certificate_file, "certificate_file")
        self._private_key_file = _check_path(private_key_file, "private_key_file")
        if isinstance(trust_anchor_files, str | bytes) or not isinstance(trust_anchor_files, Sequence):
            raise _config_error("trust_anchor_files must be a sequence of paths")
        if not 1 <= len(trust_anchor_files) <= MAX_TRUST_ANCHORS:
            raise _config_error(f"trust_anchor_files must hold 1 to {MAX_TRUST_ANCHORS} paths")
        self._anchor_files = tuple(
            _check_path(path, f"trust_anchor_files[{index}]") for index, path in enumerate(trust_anchor_files)
        )
        timeout = request_timeout_ms
        if (
            not isinstance(timeout, int)
            or isinstance(timeout, bool)
            or not MIN_REQUEST_TIMEOUT_MS <= timeout <= MAX_REQUEST_TIMEOUT_MS
        ):
            raise _config_error(
                f"request_timeout_ms must be an integer from {MIN_REQUEST_TIMEOUT_MS} to {MAX_REQUEST_TIMEOUT_MS}"
            )
        self._timeout_s = timeout / 1000
        self._request_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._closed = False
        self._idle: _Wire | None = None
        self._active: socket.socket | None = None
        self._context: ssl.SSLContext | None = None
        self._context_digest = b""

    @classmethod
    def from_config(cls, worker: WorkerConfig) -> IngressTransport:
        """The transport of a validated ``worker`` configuration section.

        Raises:
            TransportError: ``invalid_configuration`` (cannot happen for a config that
                :func:`qinglong_edge.config.parse_config` accepted).
        """
        return cls(
            worker.origin,
            credential_file=worker.credential_file,
            certificate_file=worker.certificate_file,
            private_key_file=worker.private_key_file,
            trust_anchor_files=worker.trust_anchor_files,
            request_timeout_ms=worker.request_timeout_ms,
        )

    @property
    def origin(self) -> Origin:
        return self._origin

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"IngressTransport(origin={self._origin.text!r}, closed={self._closed})"

    def __enter__(self) -> IngressTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the idle connection and interrupt a call in progress; later calls fail
        with ``closed``. Idempotent."""
        with self._state_lock:
            self._closed = True
            idle, self._idle = self._idle, None
            active = self._active
        if idle is not None:
            idle.close()
        if active is not None:
            try:
                # The plain socket's shutdown, not SSLSocket's (which would drop the
                # SSL object under the reading thread): the blocked read sees EOF.
                socket.socket.shutdown(active, socket.SHUT_RDWR)
            except OSError:
                pass

    def post_json(
        self,
        path: str,
        body: bytes,
        *,
        max_response_bytes: int,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    ) -> TransportResponse:
        """POST ``body`` (compact JSON object bytes) to ``path`` and return the accepted response.

        Args:
            path: an ingress JSON route (:func:`~qinglong_edge.worker.ingress_http.is_ingress_path`).
            body: 2 - ``max_request_bytes`` bytes of strict JSON (an object).
            max_response_bytes: the route's response cap, 2 - 262 144 (offers: 131 072).
            max_request_bytes: the route's request cap, 2 - 65 536 (default 4 096).

        Returns:
            The 200 response; its body is not parsed.

        Raises:
            TransportError: see the module docstring for the codes.
        """
        _check_int(max_response_bytes, 2, MAX_RESPONSE_BYTES_CEILING, "max_response_bytes")
        _check_int(max_request_bytes, 2, MAX_REQUEST_BYTES_CEILING, "max_request_bytes")
        if not is_ingress_path(path):
            raise _rejected("path is not a worker ingress JSON route")
        if not isinstance(body, bytes) or not 2 <= len(body) <= max_request_bytes:
            raise _rejected(f"body must be 2 to {max_request_bytes} bytes")
        try:
            document = loads(body, max_bytes=max_request_bytes, min_bytes=2)
        except ContractError as exc:
            raise _rejected(f"body is not strict JSON ({exc.code})") from None
        if not isinstance(document, dict):
            raise _rejected("body must be a JSON object")
        with self._request_lock:
            if self._closed:
                raise TransportError("transport is closed", code="closed")
            deadline = _Deadline(self._timeout_s)
            material = load_material(
                self._credential_file, self._certificate_file, self._private_key_file, self._anchor_files
            )
            context = self._context_for(material)
            try:
                return self._exchange(
                    context, material, path, body, max_response_bytes=max_response_bytes, deadline=deadline
                )
            except TransportError as error:
                if self._closed and error.code in ("request_rejected", "response_rejected") and (
                    error.http_status in (None, 200)
                ):
                    # close() shut the socket under this call: report that, not the EOF.
                    raise TransportError("transport closed during the request", code="closed") from None
                _debug("worker ingress %s: %s", self._origin.text, error)
                raise

    def _context_for(self, material: Material) -> ssl.SSLContext:
        if self._context is None or material.digest != self._context_digest:
            self._context = build_context(material, self._certificate_file, self._private_key_file)
            self._context_digest = material.digest
        return self._context

    def _take_idle(self, digest: bytes) -> _Wire | None:
        with self._state_lock:
            wire, self._idle = self._idle, None
        if wire is None:
            return None
        if (
            wire.digest != digest
            or time.monotonic() - wire.idle_since > IDLE_REUSE_MAX_S
            or wire.probe() != "quiet"
        ):
            wire.close()
            return None
        return wire

    def _set_active(self, sock: socket.socket | None) -> None:
        with self._state_lock:
            self._active = sock
            closed = self._closed
        if closed and sock is not None:
            raise TransportError("transport closed during the request", code="closed")

    def _handshake(self, raw: socket.socket, context: ssl.SSLContext, deadline: _Deadline) -> ssl.SSLSocket:
        """Wrap ``raw`` and complete the TLS handshake within the budget; closes on failure."""
        try:
            # bytes for the same reason as in _open_tcp (SSLContext encodes a str with idna).
            tls = context.wrap_socket(
                raw, server_hostname=self._origin.host.encode("ascii"), do_handshake_on_connect=False
            )
        except BaseException:
            raw.close()
            raise
        try:
            self._set_active(tls)
            tls.settimeout(deadline.budget())
            tls.do_handshake()
        except BaseException:
            tls.close()
            raise
        _debug("worker ingress %s: connected (%s)", self._origin.text, tls.version())
        return tls

    def _exchange(
        self,
        context: ssl.SSLContext,
        material: Material,
        path: str,
        body: bytes,
        *,
        max_response_bytes: int,
        deadline: _Deadline,
    ) -> TransportResponse:
        wire = self._take_idle(material.digest)
        stage = "connect"
        status: int | None = None
        pooled = False
        try:
            if wire is None:
                raw = _open_tcp(self._origin, deadline)
                stage = "TLS handshake"
                wire = _Wire(self._handshake(raw, context, deadline), material.digest)
            else:
                self._set_active(wire.sock)
                _debug("worker ingress %s: reusing the idle connection", self._origin.text)
            stage = "send request"
            wire.sock.settimeout(deadline.budget())
            _send(wire.sock, self._origin, path, material.authorization, body)
            stage = "read response head"
            head = parse_response_head(self._read_head(wire, deadline))
            status = head.status
            try:
                decoder = accept_head(head, max_response_bytes, time.time_ns() // 1_000_000)
            except TransportError as refused:
                if status != 200:  # keep the answer's {"code": ...}, never the body
                    refused.error_code = self._error_code(wire, head, deadline)
                raise
            stage = "read response body"
            reusable = self._read_body(wire, decoder, deadline) and head.keep_alive
            data = decoder.finish()
            response = TransportResponse(
                status=status,
                body=data,
                content_type=head.values("content-type")[0],
                request_id=_request_id(head),
            )
            pooled = reusable and self._pool(wire)
            _debug("worker ingress %s: HTTP %d, %d bytes", self._origin.text, status, len(data))
            return response
        except TransportError:
            raise
        except OSError as exc:
            # A timeout of an operation whose budget the deadline had cut is the deadline.
            reason = "request deadline exceeded" if isinstance(exc, TimeoutError) and deadline.expired() else None
            raise TransportError(
                f"{stage}: {reason or _reason(exc)}", code="request_rejected", http_status=status
            ) from None
        except http.client.HTTPException as exc:
            raise TransportError(f"{stage}: {_reason(exc)}", code="request_rejected", http_status=status) from None
        finally:
            with self._state_lock:
                self._active = None
            if wire is not None and not pooled:
                wire.close()

    def _read_head(self, wire: _Wire, deadline: _Deadline) -> bytes:
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
                raise _PeerClosed("peer closed the connection before the response head")
            buffer += data

    @staticmethod
    def _error_code(wire: _Wire, head: ResponseHead, deadline: _Deadline) -> str | None:
        """The ``code`` of a small JSON error body (ingress_http.error_body_decoder), or
        None; any problem reading it is None (the status is what counts)."""
        decoder = error_body_decoder(head)
        if decoder is None:
            return None
        try:
            decoder.feed(bytes(wire.buffer))
            wire.buffer.clear()
            while not decoder.done:
                data = wire.recv(deadline)
                if not data:
                    return None
                decoder.feed(data)
            return parse_error_code(decoder.finish())
        except (OSError, TransportError):
            return None

    def _read_body(self, wire: _Wire, decoder: BodyDecoder, deadline: _Deadline) -> bool:
        """Feed the body to ``decoder``; True when the connection may be reused."""
        decoder.feed(bytes(wire.buffer))
        wire.buffer.clear()
        while not decoder.done:
            data = wire.recv(deadline)
            if not data:
                decoder.eof()
                return False
            decoder.feed(data)
        if not decoder.reusable:
            return False
        state = wire.probe()
        if state == "data":
            raise TransportError("server sent bytes after the end of the body", code="response_too_large",
                                 http_status=200)
        return state == "quiet"

    def _pool(self, wire: _Wire) -> bool:
        """Keep ``wire`` as the idle connection; False (caller closes it) once closed."""
        with self._state_lock:
            if self._closed:
                return False
            previous, self._idle = self._idle, wire
            wire.idle_since = time.monotonic()
        if previous is not None:
            previous.close()
        return True


def _request_id(head: ResponseHead) -> str | None:
    values = head.values("x-request-id")
    if len(values) == 1 and _REQUEST_ID.fullmatch(values[0]):
        return values[0]
    return None
