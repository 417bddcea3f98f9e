"""TLS 1.3 mutual-TLS client for the worker ingress (ADR-0110, offer-delivery.md 1.1-1.7, 5;
remote-execution.md 3, 3.6).

Every call the Remote Worker makes to the cluster goes through :class:`IngressTransport`:
``POST`` to ``/api/v3/worker-ingress/workers/{workerId}/sessions/{sessionId}/{op}`` with
``Authorization: Worker ql3w_...``, answered by ``200`` and a JSON body, or an error.
:meth:`~IngressTransport.post_json` sends a JSON body; :meth:`~IngressTransport.post_stream`
sends the artifact route's binary body (a prefix, then a file's bytes) without holding
the file in memory; :meth:`~IngressTransport.probe_handshake` (``doctor``) only shakes
hands.

Request, byte for byte as the TS worker (Node) sends it (section 1.3)::

    POST <path> HTTP/1.1
    accept: application/json
    authorization: Worker ql3w_<credentialId>_<secret>
    content-type: application/json            (the stream route: its own exact type)
    content-length: <n>                       (exact; never chunked)
    Host: <host>[:<port unless 443>]
    Connection: keep-alive

    <body: 2-4096 bytes (a route may raise the cap to 64 KiB); a stream: prefix + N bytes>

``http.client`` frames the request; the response head and body are read by the strict
sans-IO code of :mod:`qinglong_edge.worker.ingress.http_exchange` (see there why not
``HTTPResponse``). TLS (section 1.2): ``SSLContext(PROTOCOL_TLS_CLIENT)``, TLS 1.3 only,
certificate and host name verified against *only* the configured anchors (never the
system store), security level 2, SNI only for host names (CPython sends none for an
IP literal and checks the IP SAN instead), client chain and key from private files
(:mod:`qinglong_edge.worker.ingress.material`).

Connection life (one connection at most, one idle keep-alive connection at most)::

    no connection --post--> connect --> TLS handshake --> send --> head --> body
          ^                   (resumed with the last session ticket)       |
          +--- closed: any error, a non-200, Connection: close, HTTP/1.0, -+
          |    a body delimited by EOF, bytes after the body, new material  |
          +--- idle: reused by the next request with the same material <----+
               digest if younger than IDLE_REUSE_MAX_S and silent

Reuse across requests (issue 15: a resident worker renews a lease every ~10 s; the
cluster closes idle connections after 5 s, so a renewal usually needs a new
connection): the material is re-read from the files for *every* request (rotation by
atomic replacement works at once, as the reference's credential provider does; ~26 us
for five small files), but the ``SSLContext`` is rebuilt only when the material's
digest changes, and the newest TLS 1.3 session ticket the cluster sent is offered on
the next connection (``wrap_socket(session=...)``): a resumed handshake skips the
certificate chain check and both signatures (figures in benchmarks/bench_transport.py).
The ticket belongs to this process, this origin and this context; new material, a
failed handshake or a ``tls_context_reloaded`` answer drops it, and OpenSSL offers no
ticket past its lifetime (the cluster's hint). ``probe_handshake`` never resumes.

Time (section 1.5): ``request_timeout_ms`` (1 000 - 60 000, default 15 000) bounds every
connect, TLS handshake, send and read like Node's socket inactivity timer; because a
peer that trickles a byte now and then defeats an inactivity timer, each request also
has a hard deadline of ``DEADLINE_FACTOR`` x the timeout (30 s by default) for the whole
exchange, plus, for a stream, its size at :data:`MIN_UPLOAD_BYTES_PER_S`. Name
resolution uses the system resolver and its own timeout (stdlib cannot bound
``getaddrinfo``); IP literals resolve without I/O.

Errors are :class:`~qinglong_edge.errors.TransportError` with the reference's codes, and
a typed ``reason`` (:mod:`qinglong_edge.worker.ingress.reasons`, table in
:data:`qinglong_edge.errors.TRANSPORT_REASONS`) with its remedy and ``reached_cluster``:

=========================  ================================================================
``invalid_configuration``  constructor arguments (origin, paths, anchors, timeout)
``credentials_unavailable`` a credential / certificate / key / anchor file breaks its rules
``request_rejected``       bad call (path, body, caps), DNS, connect, TLS, timeout, deadline,
                           reset or EOF at any stage (``http_status`` set once a head came),
                           a stream's file changed (``source_changed``)
``response_rejected``      section 1.6 violated; ``http_status``, ``cluster_code`` (the
                           ``{"code":..}`` word of a non-200) and, for 429/503,
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
(which includes ``ssl.SSLError`` and ``TimeoutError``) is mapped to ``request_rejected``.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Sequence

from qinglong_edge.config import WorkerConfig
from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.digest import sha256
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.origin import Origin, parse_origin
from qinglong_edge.contracts.strictjson import loads
from qinglong_edge.errors import TransportError
from qinglong_edge.worker.ingress.http_exchange import (
    DEFAULT_MAX_REQUEST_BYTES,
    MAX_ERROR_BODY_BYTES,
    MAX_REQUEST_BYTES_CEILING,
    MAX_RESPONSE_BYTES_CEILING,
    BodyDecoder,
    LengthBody,
    ResponseHead,
    accept_head,
    error_code,
    is_ingress_path,
    is_stream_path,
    parse_response_head,
)
from qinglong_edge.worker.ingress.material import Material, build_context, load_material
from qinglong_edge.worker.ingress.tls_wire import (
    DEADLINE_FACTOR,
    Deadline,
    DeadlineExceeded,
    SourceChanged,
    Wire,
    await_ticket,
    connect,
    read_body,
    read_head,
    resolve,
    send_head,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from qinglong_edge.contracts.x509 import CertificateValidity

# Imported where used, not here: a successful idle pull cycle needs neither the failure
# classification (reasons.py), nor the stream's file half (stream.py), nor
# the DER reader (contracts.x509); a cron run on a router pays for every import.

__all__ = [
    "ARTIFACT_CONTENT_TYPE",
    "DEADLINE_FACTOR",
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "IDLE_REUSE_MAX_S",
    "HandshakeReport",
    "IngressTransport",
    "TransportResponse",
]

DEFAULT_REQUEST_TIMEOUT_MS = 15_000
MIN_REQUEST_TIMEOUT_MS = 1_000
MAX_REQUEST_TIMEOUT_MS = 60_000
MAX_TRUST_ANCHORS = 8
MAX_PATH_BYTES = 4096
#: An idle connection older than this is closed rather than reused: the cluster closes
#: idle connections after 5 s (``keepAliveTimeout``, section 1.5), and a request sent
#: as it does so would fail for nothing.
IDLE_REUSE_MAX_S = 4.0
#: The artifact route's exact content type (remote-execution.md 3.6); the same string as
#: ``contracts.completion.ARTIFACT_CONTENT_TYPE``, not imported from there because the idle
#: pull path never loads that module (tests/worker/ingress/test_transport_stream.py compares them).
ARTIFACT_CONTENT_TYPE = "application/vnd.qinglong.worker-artifact"
#: Largest stream prefix (the artifact route's is 4 + H <= 4 100 bytes).
MAX_STREAM_PREFIX_BYTES = 64 * 1024
#: After a failed send, how long to look for what the server said before it closed
#: (a TLS alert refusing our certificate, an early 413/401 answer).
SALVAGE_S = 1.0
#: How long ``probe_handshake`` waits for a session ticket, the sign that the server
#: accepted the client certificate (TLS 1.3 servers send tickets only after that).
CONFIRM_WAIT_S = 3.0
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}", re.ASCII)
_CONTENT_TYPE = re.compile(r"[a-z0-9][a-z0-9.+-]*/[a-z0-9][a-z0-9.+-]*", re.ASCII)


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
        source_sha256: for :meth:`IngressTransport.post_stream`, the lowercase hex
            SHA-256 of the file bytes sent (not the prefix), to compare with the
            cluster's echo (spec README, "Artifact"); else None.
        resumed: the connection's TLS handshake resumed a session (diagnostics).
    """

    __slots__ = ("status", "body", "content_type", "request_id", "source_sha256", "resumed")  # noqa: RUF023
    _repr_hidden = ("body",)

    status: int
    body: bytes
    content_type: str
    request_id: str | None
    source_sha256: str | None
    resumed: bool

    def __init__(  # noqa: PLR0917 (the dataclass signature)
        self,
        status: int,
        body: bytes,
        content_type: str,
        request_id: str | None,
        source_sha256: str | None = None,
        resumed: bool = False,
    ) -> None:
        _set = object.__setattr__
        _set(self, "status", status)
        _set(self, "body", body)
        _set(self, "content_type", content_type)
        _set(self, "request_id", request_id)
        _set(self, "source_sha256", source_sha256)
        _set(self, "resumed", resumed)


class HandshakeReport(Frozen):
    """What :meth:`IngressTransport.probe_handshake` found (``doctor``).

    Attributes:
        tls_version: ``TLSv1.3``.
        cipher: the negotiated suite (``TLS_AES_256_GCM_SHA384``).
        server_certificate: the cluster leaf's validity window, None if unreadable.
        client_certificate_accepted: True when the server sent a session ticket (it
            accepted the client certificate); None when it sent nothing within the
            wait (unconfirmed: some servers send no tickets).
    """

    __slots__ = ("tls_version", "cipher", "server_certificate", "client_certificate_accepted")  # noqa: RUF023

    tls_version: str
    cipher: str
    server_certificate: CertificateValidity | None
    client_certificate_accepted: bool | None

    def __init__(
        self,
        tls_version: str,
        cipher: str,
        server_certificate: CertificateValidity | None,
        client_certificate_accepted: bool | None,
    ) -> None:
        _set = object.__setattr__
        _set(self, "tls_version", tls_version)
        _set(self, "cipher", cipher)
        _set(self, "server_certificate", server_certificate)
        _set(self, "client_certificate_accepted", client_certificate_accepted)


def _config_error(message: str) -> TransportError:
    return TransportError(message, code="invalid_configuration")


def _bad_call(message: str) -> TransportError:
    return TransportError(message, code="request_rejected", reason="invalid_request")


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
        raise _bad_call(f"{name} must be an integer from {low} to {high}")
    return value


class IngressTransport:
    """The worker ingress HTTPS client (see the module docstring).

    Thread safety: calls are serialized (one connection at most); :meth:`close` may be
    called from any thread and interrupts a call in progress.

    Attributes:
        stats: counters for diagnostics and benchmarks: ``connections`` (TCP+TLS
            opened), ``resumed`` (of which the handshake resumed a session),
            ``reused`` (requests sent on an idle keep-alive connection).
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
        self._idle: Wire | None = None
        self._active: socket.socket | None = None
        self._context: ssl.SSLContext | None = None
        self._context_digest = b""
        self._session: ssl.SSLSession | None = None
        self.stats = {"connections": 0, "resumed": 0, "reused": 0}

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

    # -- calls ---------------------------------------------------------------------------

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
            path: an ingress JSON route (:func:`~qinglong_edge.worker.ingress.http_exchange.is_ingress_path`).
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
            raise _bad_call("path is not a worker ingress JSON route")
        if not isinstance(body, bytes) or not 2 <= len(body) <= max_request_bytes:
            raise _bad_call(f"body must be 2 to {max_request_bytes} bytes")
        try:
            document = loads(body, max_bytes=max_request_bytes, min_bytes=2)
        except ContractError as exc:
            raise _bad_call(f"body is not strict JSON ({exc.code})") from None
        if not isinstance(document, dict):
            raise _bad_call("body must be a JSON object")

        def send(wire: Wire, authorization: str, deadline: Deadline) -> None:
            wire.sock.settimeout(deadline.budget())
            send_head(wire.sock, self._origin, path, authorization, content_type="application/json",
                      content_length=len(body), body=body)

        return self._call(send, max_response_bytes, Deadline(self._timeout_s))

    def post_stream(
        self,
        path: str,
        prefix: bytes,
        source: object,
        length: int,
        *,
        offset: int = 0,
        content_type: str = ARTIFACT_CONTENT_TYPE,
        max_response_bytes: int,
    ) -> TransportResponse:
        """POST ``prefix`` then ``length`` bytes of ``source`` from ``offset``, with an
        exact ``content-length`` (``len(prefix) + length``), never chunked
        (remote-execution.md 3.6: prefix = 4-byte ``H`` + the header JSON, then the log).

        The file is read with ``preadv`` in :data:`STREAM_CHUNK_BYTES` steps into one
        buffer (the file position is not used or moved) and never held whole. Before
        the last step its size and mtime are compared with the start: a file that
        changed fails with ``source_changed`` and the body is cut short, so the
        cluster refuses it (its content-length check). Same authorization,
        acceptance and timeout rules as :meth:`post_json`; a route may answer early
        (413, 401) and close: that answer is reported.

        Args:
            path: the stream route (:func:`~qinglong_edge.worker.ingress.http_exchange.is_stream_path`).
            prefix: 1 - 65 536 bytes sent before the file's.
            source: a file descriptor or a binary file object (``fileno()``) of a
                regular file holding at least ``offset + length`` bytes.
            length: 0 - 67 108 864 bytes of the file to send.
            content_type: a ``type/subtype`` (default the artifact route's).
            max_response_bytes: the route's response cap (the artifact route: 4 096).

        Returns:
            The 200 response, with ``source_sha256`` = SHA-256 (hex) of the file bytes sent.

        Raises:
            TransportError: as :meth:`post_json`; ``request_rejected`` with reason
                ``source_changed`` for a file that changed.
        """
        _check_int(max_response_bytes, 2, MAX_RESPONSE_BYTES_CEILING, "max_response_bytes")
        if not is_stream_path(path):
            raise _bad_call("path is not a worker ingress stream route")
        if not isinstance(prefix, bytes) or not 1 <= len(prefix) <= MAX_STREAM_PREFIX_BYTES:
            raise _bad_call(f"prefix must be 1 to {MAX_STREAM_PREFIX_BYTES} bytes")
        if not isinstance(content_type, str) or _CONTENT_TYPE.fullmatch(content_type) is None:
            raise _bad_call("content_type must be a lower-case type/subtype")
        from qinglong_edge.worker.ingress.stream import MIN_UPLOAD_BYTES_PER_S, StreamSource, send_file

        stream = StreamSource(source, length, offset)
        hasher = sha256()

        def send(wire: Wire, authorization: str, deadline: Deadline) -> None:
            wire.sock.settimeout(deadline.budget())
            send_head(wire.sock, self._origin, path, authorization, content_type=content_type,
                      content_length=len(prefix) + stream.length, body=prefix)
            if not send_file(wire, stream, hasher.update, deadline):
                wire.early = True  # answered before the body was complete: read that answer

        extra_s = stream.length / MIN_UPLOAD_BYTES_PER_S
        response = self._call(send, max_response_bytes, Deadline(self._timeout_s, extra_s))
        return TransportResponse(response.status, response.body, response.content_type, response.request_id,
                                 source_sha256=hasher.hexdigest(), resumed=response.resumed)

    def probe_handshake(self, *, confirm_s: float = CONFIRM_WAIT_S) -> HandshakeReport:
        """Connect and complete a full TLS 1.3 handshake with the configured material;
        send no request (``doctor``).

        After the handshake it waits up to ``confirm_s`` (within the request timeout)
        for the server's first records: a session ticket means the server accepted the
        client certificate (TLS 1.3 servers issue tickets only after that); an alert
        means it refused it (``client_certificate_rejected``).

        Raises:
            TransportError: the same codes and reasons as a request would get.
        """
        with self._request_lock:
            if self._closed:
                raise TransportError("transport is closed", code="closed", reached_cluster=False)
            deadline = Deadline(self._timeout_s)
            material = self._material()
            context = self._context_for(material)
            wire: Wire | None = None
            try:
                wire = self._connect(context, material, deadline, session=None)
                tls = wire.sock
                report_version, cipher = tls.version() or "", (tls.cipher() or ("",))[0]
                peer = tls.getpeercert(binary_form=True)
                from qinglong_edge.contracts.x509 import read_validity

                try:
                    server = read_validity(peer) if peer else None
                except ContractError:
                    server = None
                accepted = await_ticket(wire, min(confirm_s, deadline.budget()))
                return HandshakeReport(report_version, cipher, server, accepted)
            except TransportError:  # a ConnectionError too: already classified
                raise
            except OSError as exc:
                raise self._classified(exc, "confirm client certificate", wire, deadline) from None
            finally:
                with self._state_lock:
                    self._active = None
                if wire is not None:
                    wire.close()

    # -- internals ---------------------------------------------------------------------

    def _material(self) -> Material:
        return load_material(self._credential_file, self._certificate_file, self._private_key_file,
                             self._anchor_files)

    def _context_for(self, material: Material) -> ssl.SSLContext:
        if self._context is None or material.digest != self._context_digest:
            self._context = build_context(material, self._certificate_file, self._private_key_file)
            self._context_digest = material.digest
            self._session = None  # a ticket belongs to the context that received it
        return self._context

    def _call(
        self,
        send: Callable[[Wire, str, Deadline], None],
        max_response_bytes: int,
        deadline: Deadline,
    ) -> TransportResponse:
        with self._request_lock:
            if self._closed:
                raise TransportError("transport is closed", code="closed", reached_cluster=False)
            material = self._material()
            context = self._context_for(material)
            try:
                return self._exchange(context, material, send, max_response_bytes, deadline)
            except TransportError as error:
                if self._closed and error.code in ("request_rejected", "response_rejected") and (
                    error.http_status in (None, 200)
                ):
                    # close() shut the socket under this call: report that, not the EOF.
                    raise TransportError("transport closed during the request", code="closed") from None
                _debug("worker ingress %s: %s [%s]", self._origin.text, error, error.reason)
                raise

    def _take_idle(self, digest: bytes) -> Wire | None:
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
        wire.fresh = False
        wire.answered = False
        return wire

    def _set_active(self, sock: socket.socket | None) -> None:
        with self._state_lock:
            self._active = sock
            closed = self._closed
        if closed and sock is not None:
            raise TransportError("transport closed during the request", code="closed")

    def _connect(
        self, context: ssl.SSLContext, material: Material, deadline: Deadline, *, session: ssl.SSLSession | None
    ) -> Wire:
        """Resolve, connect and shake hands; errors are classified by stage."""
        stage = "resolve"
        try:
            addresses = resolve(self._origin)
            stage = "connect"
            raw = connect(addresses, deadline.budget)
            stage = "TLS handshake"
            tls = self._handshake(raw, context, deadline, session)
        except TransportError:  # a ConnectionError too: already classified (closed)
            raise
        except OSError as exc:
            if session is not None:
                self._session = None  # never offer a ticket again that a failed handshake carried
            raise self._classified(exc, stage, None, deadline) from None
        self.stats["connections"] += 1
        if tls.session_reused:
            self.stats["resumed"] += 1
        return Wire(tls, material.digest)

    def _handshake(
        self, raw: socket.socket, context: ssl.SSLContext, deadline: Deadline, session: ssl.SSLSession | None
    ) -> ssl.SSLSocket:
        """Wrap ``raw`` and complete the TLS handshake within the budget; closes on failure."""
        host = self._origin.host.encode("ascii")  # bytes: as in tls_wire.resolve (no idna codec)
        try:
            try:
                tls = context.wrap_socket(raw, server_hostname=host, do_handshake_on_connect=False, session=session)
            except ValueError:
                if session is None:
                    raise
                # A session OpenSSL will not resume from (never expected: tickets are
                # dropped with their context): shake hands afresh.
                self._session = None
                tls = context.wrap_socket(raw, server_hostname=host, do_handshake_on_connect=False)
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
        _debug("worker ingress %s: connected (%s%s)", self._origin.text, tls.version(),
               ", resumed" if tls.session_reused else "")
        return tls

    def _classified(self, exc: BaseException, stage: str, wire: Wire | None, deadline: Deadline,
                    http_status: int | None = None) -> TransportError:
        if isinstance(exc, TimeoutError) and not isinstance(exc, DeadlineExceeded) and deadline.expired():
            exc = DeadlineExceeded("request deadline exceeded")  # the deadline had cut its budget
        from qinglong_edge.worker.ingress.reasons import classify

        first_read = wire is not None and wire.fresh and not wire.answered
        return classify(exc, stage, first_read=first_read, http_status=http_status)

    def _exchange(
        self,
        context: ssl.SSLContext,
        material: Material,
        send: Callable[[Wire, str, Deadline], None],
        max_response_bytes: int,
        deadline: Deadline,
    ) -> TransportResponse:
        wire = self._take_idle(material.digest)
        status: int | None = None
        pooled = False
        stage = "connect"
        try:
            if wire is None:
                wire = self._connect(context, material, deadline, session=self._session)
            else:
                self.stats["reused"] += 1
                self._set_active(wire.sock)
                _debug("worker ingress %s: reusing the idle connection", self._origin.text)
            stage = "send request"
            try:
                send(wire, material.authorization, deadline)
            except OSError as exc:
                self._salvage(wire, exc)
                raise
            stage = "read response head"
            head = parse_response_head(read_head(wire, deadline))
            status = head.status
            if wire.early and status == 200:
                raise TransportError("the server answered 200 before the request body was complete",
                                     code="response_rejected", http_status=200, reason="malformed_response")
            decoder = self._accept(wire, head, max_response_bytes, deadline)
            stage = "read response body"
            reusable = read_body(wire, decoder, deadline) and head.keep_alive and not wire.early
            data = decoder.finish()
            response = TransportResponse(
                status=status,
                body=data,
                content_type=head.values("content-type")[0],
                request_id=_request_id(head),
                resumed=bool(wire.sock.session_reused),
            )
            self._keep_session(wire.sock)
            pooled = reusable and self._pool(wire)
            _debug("worker ingress %s: HTTP %d, %d bytes", self._origin.text, status, len(data))
            return response
        except TransportError:
            raise
        except SourceChanged as exc:
            raise TransportError(f"send request: {exc.message}", code="request_rejected",
                                 reason="source_changed") from None
        except OSError as exc:
            raise self._classified(exc, stage, wire, deadline, status) from None
        finally:
            with self._state_lock:
                self._active = None
            if wire is not None and not pooled:
                wire.close()

    def _accept(self, wire: Wire, head: ResponseHead, cap: int, deadline: Deadline) -> BodyDecoder:
        """:func:`accept_head`; a non-200 also gets its ``{"code":..}`` read (briefly)."""
        try:
            return accept_head(head, cap, time.time_ns() // 1_000_000)
        except TransportError as error:
            if head.status != 200:
                error.cluster_code = self._error_code(wire, head, deadline)
                if error.cluster_code == "tls_context_reloaded":
                    self._session = None  # the cluster reloaded its TLS: start afresh
                else:
                    self._keep_session(wire.sock)  # the TLS layer is fine: keep its newest ticket
            raise

    def _error_code(self, wire: Wire, head: ResponseHead, deadline: Deadline) -> str | None:
        """The cluster's code of a non-200 answer with a small Content-Length body, read
        within :data:`SALVAGE_S`; None when anything is off (never an error of its own)."""
        lengths = head.values("content-length")
        if len(lengths) != 1 or not lengths[0].isdigit() or len(lengths[0]) > 4:
            return None
        size = int(lengths[0])
        if not 2 <= size <= MAX_ERROR_BODY_BYTES:
            return None
        body = LengthBody(size, MAX_ERROR_BODY_BYTES)
        short = Deadline(min(SALVAGE_S, deadline.timeout_s))
        short.end = min(short.end, deadline.end)
        try:
            read_body(wire, body, short, probe_after=False)
            return error_code(body.finish())
        except (OSError, TransportError):
            return None

    def _salvage(self, wire: Wire, failure: OSError) -> None:
        """After a failed send: did the server say why before it closed? A TLS alert
        (our certificate refused: TLS 1.3 tells only now) or an early answer (413, 401)
        is raised instead of the send error; otherwise nothing happens."""
        if isinstance(failure, TimeoutError):
            return
        short = Deadline(min(SALVAGE_S, self._timeout_s))
        try:
            data = read_head(wire, short)
        except OSError as exc:
            from qinglong_edge.worker.ingress.reasons import is_tls_alert

            if is_tls_alert(exc):
                raise self._classified(exc, "send request", wire, short) from None
            return
        except TransportError:
            return
        try:
            head = parse_response_head(data)
        except TransportError:
            return
        if head.status != 200:
            self._accept(wire, head, MAX_ERROR_BODY_BYTES, short)

    def _keep_session(self, tls: ssl.SSLSocket) -> None:
        """Remember the newest session ticket of a connection that answered."""
        try:
            session = tls.session
        except (ValueError, OSError):
            return
        if session is not None and session.has_ticket:
            self._session = session

    def _pool(self, wire: Wire) -> bool:
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
