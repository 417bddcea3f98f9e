"""What the Local API server hands the application, and what it gets back.

:class:`Exchange` is one request on a worker thread (its head, its request id, and
a body reader bounded by the request deadline); :class:`Response` is the answer;
:class:`ServerLimits` are the transport limits of local-api.md 2.1 per profile.
Kept apart from :mod:`qinglong_edge.local.server` so the application side
(:mod:`qinglong_edge.local.api`) sees only these few types.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from qinglong_edge.errors import EdgeError
from qinglong_edge.local.http11 import RequestHead, new_request_id, render_continue

__all__ = ["Application", "BodyReadError", "Exchange", "Response", "ServerLimits"]

#: :class:`BodyReadError` code -> the status the server answers with (local-api.md 2.4).
_BODY_READ_STATUS = {"body_truncated": 400, "body_timeout": 408}


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Transport limits. Times in seconds (monotonic), counts in connections/requests.

    Use :meth:`for_profile` for the local-api.md 2.1 values and our budget of requests
    without a valid credential (spec README, "Decisions for storage on flash"):

    ==============================  =====  ==========
    field                           edge   standalone
    ==============================  =====  ==========
    ``max_in_flight``               4      32
    ``max_connections``             8      64
    ``unauthenticated_slots``       1      4
    ``unauthenticated_burst``       10     60
    ``unauthenticated_per_minute``  10     60
    ``refusal_interval_s``          60     60
    ==============================  =====  ==========

    ``credential_slot_wait_s``: a request that carries a credential and finds every slot
    taken waits this long for one before its 503 ``server_overloaded`` (0: no wait).
    ``head_timeout_s``: a connection must deliver a complete request head within this
    time of starting to wait for it (its accept, or the end of the previous response);
    ``keep_alive_timeout_s``: an idle connection that sent no byte closes after it.
    ``listen_backlog`` is large (the kernel caps it at ``net.core.somaxconn``) so that a
    flood of connections waiting to be accepted (and evicted) never fills the accept
    queue and makes the kernel drop an operator's SYN.
    """

    max_in_flight: int
    max_connections: int
    drain_timeout_s: float
    head_timeout_s: float = 5.0
    request_timeout_s: float = 5.0
    keep_alive_timeout_s: float = 5.0
    write_timeout_s: float = 5.0
    max_requests_per_connection: int = 100
    linger_s: float = 2.0
    listen_backlog: int = 4096
    #: Request slots that requests without a credential may hold at once.
    unauthenticated_slots: int = 1
    #: Token bucket of requests without a valid credential: capacity and refill per minute.
    unauthenticated_burst: int = 10
    unauthenticated_per_minute: float = 10.0
    #: One summary audit row per refusal reason per interval (seconds).
    refusal_interval_s: float = 60.0
    #: A kept connection answered 429 is not read again for this long (seconds).
    refusal_pause_s: float = 1.0
    #: How long a request that carries a credential waits for a slot when all are busy (s).
    credential_slot_wait_s: float = 1.0
    #: Slots that public requests (status console assets, ``/metrics``: no credential,
    #: no audit) may hold at once; beyond them they wait like a credential request.
    public_slots: int = 2
    #: Connections accepted per poll round (the rest wait for the next round).
    accept_batch: int = 16
    #: ``TCP_DEFER_ACCEPT`` on the listener, in seconds (``None``: ``ceil(head_timeout_s)``;
    #: 0: off): a connection that sends nothing is not handed to ``accept()`` before it does
    #: or this time passes (the kernel rounds it up to its SYN-ACK retransmit steps: 5 s is
    #: about 7 s), so idle connections cost the server nothing and cannot evict anyone.
    defer_accept_s: int | None = None

    @classmethod
    def for_profile(cls, profile: str) -> ServerLimits:
        """``edge``: 4 in flight, 8 connections, 5 s drain; ``standalone``: 32, 64, 10 s
        (table above)."""
        if profile == "edge":
            return cls(max_in_flight=4, max_connections=8, drain_timeout_s=5.0)
        if profile == "standalone":
            return cls(max_in_flight=32, max_connections=64, drain_timeout_s=10.0, unauthenticated_slots=4,
                       unauthenticated_burst=60, unauthenticated_per_minute=60.0)
        raise ValueError(f"unknown profile {profile!r}")


@dataclass(frozen=True, slots=True)
class Response:
    """What the application answers.

    Attributes:
        status: HTTP status.
        body: JSON object in wire order (ignored when ``bare``).
        close: close the connection after this response.
        bare: send a body-less ``Connection: close`` response (protocol-level, e.g. 408).
        retry_after_s: a ``retry-after`` header in whole seconds (429 ``rate_limited``).
        content: a body that is not JSON (the console's assets, ``/metrics``): sent as
            it is, with ``headers`` (which must include ``content-type``).
        headers: extra ``(name, value)`` header lines for ``content``.
    """

    status: int
    body: Mapping[str, object] = field(default_factory=dict)
    close: bool = False
    bare: bool = False
    retry_after_s: int | None = None
    content: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()


class BodyReadError(EdgeError):
    """:meth:`Exchange.read_body` could not read the declared bytes.

    Attributes:
        code: ``body_truncated`` (the stream ended early: EOF), ``body_timeout`` (the
            request deadline passed), ``disconnected`` (reset or another socket error).
        http_status: what the server answers (local-api.md 2.4): 400, 408, or None
            for ``disconnected`` (nobody to answer).
    """

    code = "disconnected"

    def __init__(self, code: str) -> None:
        super().__init__(code, code=code)
        self.http_status = _BODY_READ_STATUS.get(code)


class Exchange:
    """One admitted request as the application sees it (used from a worker thread).

    Attributes:
        head: the parsed head.
        request_id: ``local:<uuidv4>``, also the ``x-request-id`` of the answer.
        body_consumed: True once the whole declared body has been read.
        peer: the client's budget key (:func:`qinglong_edge.local.budget.peer_key`).
    """

    def __init__(
        self,
        sock: socket.socket,
        head: RequestHead,
        *,
        request_deadline: float,
        write_timeout_s: float,
        count_received: Callable[[int], None],
        draining: Callable[[], bool],
        peer: str = "loopback",
    ) -> None:
        """Built by the server's worker for one request.

        Args:
            sock: the client socket (blocking mode; only this request uses it now).
            head: the parsed head.
            request_deadline: ``time.monotonic()`` deadline for the whole request body.
            write_timeout_s: timeout for the ``100 Continue`` write, seconds.
            count_received: called with each body chunk's size (server statistics).
            draining: whether the server is draining.
            peer: the client's budget key.
        """
        self._sock = sock
        self._deadline = request_deadline
        self._write_timeout_s = write_timeout_s
        self._count_received = count_received
        self._draining = draining
        self.head = head
        self.peer = peer
        self.request_id = new_request_id()
        self.body_consumed = not head.has_body
        self._continue_sent = False

    @property
    def draining(self) -> bool:
        """The server is draining (the application may refuse new work)."""
        return self._draining()

    def read_body(self, size: int) -> bytes:
        """Read exactly ``size`` body bytes before the request deadline (bytes that had
        already arrived when the deadline passed are still taken).

        Sends ``100 Continue`` first when the client asked for it: the application
        calls this only after admission succeeded (local-api.md 2.2, step 7).

        Args:
            size: the declared ``Content-Length`` (already capped by the caller).

        Raises:
            BodyReadError: ``body_truncated``, ``body_timeout`` or ``disconnected``.
        """
        sock = self._sock
        if self.head.expects_continue and not self._continue_sent:
            self._continue_sent = True
            try:
                sock.settimeout(self._write_timeout_s)
                sock.sendall(render_continue())
            except OSError:
                raise BodyReadError("disconnected") from None
        chunks: list[bytes] = []
        remaining = size
        while remaining > 0:
            # Past the deadline only bytes already received are taken: the deadline
            # bounds a slow *client*, not the time admission spent waiting on the store
            # (busyTimeoutMs may exceed the 5 s request timeout).
            left = max(0.0, self._deadline - time.monotonic())
            try:
                sock.settimeout(left)
                chunk = sock.recv(min(remaining, 65536))
            except (TimeoutError, BlockingIOError):
                raise BodyReadError("body_timeout") from None
            except OSError:
                raise BodyReadError("disconnected") from None
            if not chunk:
                raise BodyReadError("body_truncated")
            self._count_received(len(chunk))
            chunks.append(chunk)
            remaining -= len(chunk)
        self.body_consumed = True
        return b"".join(chunks)


#: The application: admission, body, route. Never raises on purpose; if it does,
#: the server answers 503 ``request_unavailable`` and closes.
Application = Callable[[Exchange], Response]
