"""The Local API socket server: one poll thread, a bounded worker pool, strict limits.

Threads (fixed, never one per connection)::

    poll thread (1)   accepts, reads request heads with MSG_PEEK so it never
                      consumes a byte past the head, enforces every idle/head
                      deadline, answers 503/408/4xx that need no worker
    workers (N)       N = max in-flight requests (edge 4, standalone 32); run the
                      application (admission, body, route) and write the response

Connection states::

    accept ──> IDLE ──first byte──> HEAD ──head complete──┬─> BUSY (worker) ──> IDLE (keep-alive)
                 │                   │                     │        ├──────────> closed / LINGER
                 └─ idle 5 s ─> closed └─ head deadline: 408 │        └─ 429 ───> PARKED ─1 s─> IDLE
                                                           ├─ credential, every slot taken: QUEUED ─> BUSY
                                                           │     (its wait over: 503; drain: 503 draining)
                                                           ├─ draining / no credential at capacity: 503
                                                           └─ no credential, beyond its budget: 429 ─> PARKED

Limits (local-api.md 2.1; :class:`ServerLimits`):

* a connection is handed to ``accept()`` only once it has sent a byte, or after about the
  head timeout (``TCP_DEFER_ACCEPT`` on Linux; :attr:`ServerLimits.defer_accept_s`): a flood
  of connections that send nothing stays in the kernel and never reaches this thread.
* at most ``max_connections`` open connections (edge 8, standalone 64). IDLE and HEAD
  connections (idle keep-alive, or a head still arriving) never block a new one: at the
  cap, accepting a connection first closes the **oldest** IDLE/HEAD connection (the one
  that has waited longest for its head), so a flood of idle or slowloris connections
  cannot keep an operator in the listen backlog. Only when every connection is BUSY
  (not possible with the profiles, ``max_in_flight < max_connections``) does the
  listening socket stop being polled. A newly accepted connection is read at once: a
  client that sent its request with the connect is dispatched before the next accept
  can evict it. At most ``accept_batch`` connections are accepted per poll round, so
  accepting never starves the connections already open.
* at most ``max_in_flight`` requests in the application at once. A complete head that
  finds every slot taken and **carries a credential** (of the token grammar) is QUEUED:
  it waits, oldest first, for the next free slot, at most ``credential_slot_wait_s``
  (1 s), and only then gets 503 ``server_overloaded``. Whether a credential is valid is
  known only after the store check, and a flood of wrong ones is answered 429 by
  admission in well under a millisecond each, so the operator's request gets a slot
  within a few of theirs instead of a 503 (issue 17 item 1: "an authenticated request
  is never starved by unauthenticated traffic"). A QUEUED connection is not read (its
  body stays in the kernel), holds no thread and is never evicted at the connection cap;
  there are at most ``max_connections`` of them. A request without a credential never
  waits: 503 ``server_overloaded`` (or 429 below).
* requests **without a credential** (no single ``Authorization`` value of the ``ql3c``
  token grammar, decided by the ``classify`` callable from the head alone) hold at most
  ``unauthenticated_slots`` of those slots (edge 1), so requests with a credential
  always find the others; and when the :class:`~qinglong_edge.local.budget.RequestBudget`
  has no token left, or their share is taken, they are answered **429**
  ``{"code":"rate_limited"}`` with ``retry-after`` from this thread, before routing and
  without a worker, and counted (reason ``credential_missing``). A credential that
  fails authentication is charged to the same budget by admission
  (:mod:`qinglong_edge.local.admission`), before its audit row. A connection answered
  429 is then *paused* (PARKED: not read for ``refusal_pause_s``, 1 s), so a client
  sending as fast as it can costs this thread one request per second per connection.
* deadlines: 5 s idle on a keep-alive or new connection before its first byte; a
  complete head within 5 s of the start of the wait (the accept, or the end of the
  previous response: ``head_timeout_s``), so dripping one byte a second cannot hold a
  connection (408 and close); 5 s from the first byte to the end of the body
  (``requestTimeout``); 5 s per response write; at most 100 requests per connection.
* draining (:meth:`Server.shutdown`, SIGTERM in ``qinglong-edge serve``): the
  listener closes, idle connections close, a request that arrives is answered 503
  ``server_draining`` with ``connection: close``, requests in flight finish; after
  the drain timeout (edge 5 s, standalone 10 s) every socket is shut.

Responses to ``HEAD`` (a 404 here: no route takes it) carry their headers but no
body, as Node sends them. A response sent without consuming the request body always carries
``connection: close``; the socket is then half-closed and kept for up to
``linger_s`` without reading (so the client can read the answer before a reset),
then closed. ``Expect: 100-continue`` is answered by :meth:`Exchange.read_body`,
which the application calls only after admission succeeded; a request rejected
earlier gets its final status instead and no ``100``. A client that sends the body
anyway without waiting is read normally.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import logging
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Final

from qinglong_edge.errors import HttpProtocolError
from qinglong_edge.local.budget import RequestBudget, peer_key
from qinglong_edge.local.exchange import Application, BodyReadError, Exchange, Response, ServerLimits
from qinglong_edge.local.http11 import (
    MAX_HEAD_BYTES,
    HeadParser,
    RequestHead,
    new_request_id,
    render_bare_response,
    render_json_response,
    render_raw_response,
)

#: ``observer(status, code, seconds)``: called once per response written (``code``: the
#: JSON body's ``code``, None for a 2xx or a bare response; ``seconds``: from the complete
#: head to the answer). Metrics (:mod:`qinglong_edge.local.metrics`); must not block.
Observer = Callable[[int, str | None, float], None]

__all__ = [
    "Application",
    "BodyReadError",
    "Exchange",
    "Response",
    "Server",
    "ServerLimits",
]

_log = logging.getLogger("qinglong_edge.local.server")

_POLL_IN: Final = select.POLLIN | select.POLLPRI
_POLL_CLOSED: Final = select.POLLHUP | select.POLLERR | select.POLLNVAL
_POLL_RDHUP: Final = getattr(select, "POLLRDHUP", 0x2000)


class _State(enum.Enum):
    IDLE = "idle"
    HEAD = "head"
    QUEUED = "queued"
    BUSY = "busy"
    LINGER = "linger"
    PARKED = "parked"


#: States of a connection waiting for its next head (evictable at the connection cap).
_WAITING: Final = frozenset({_State.IDLE, _State.HEAD, _State.PARKED})


class _Conn:
    """One client connection (changed only by the poll thread, or by the worker that
    holds it while BUSY).

    ``since``: when it started waiting for its next head (accept or end of the previous
    response), the eviction order; ``deadline``: the current one (idle, or head);
    ``head_deadline``: ``since`` + ``head_timeout_s``; ``anonymous``: the request it is
    BUSY with holds one of the slots of requests without a credential.
    """

    __slots__ = ("anonymous", "deadline", "dispatched", "fd", "head_deadline", "parser", "peer", "public",
                 "request_deadline", "served", "since", "sock", "state")

    def __init__(self, sock: socket.socket, now: float, limits: ServerLimits, peer: str) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.served = 0
        self.anonymous = False
        self.public = False
        self.dispatched = now
        self.state = _State.IDLE
        self.parser = HeadParser()
        self.since = now
        self.deadline = now + limits.keep_alive_timeout_s
        self.head_deadline = now + limits.head_timeout_s
        self.request_deadline = self.deadline

    def wait_again(self, now: float, limits: ServerLimits) -> None:
        """Back to IDLE after a response: a new wait for a head starts."""
        self.state = _State.IDLE
        self.parser = HeadParser()
        self.since = now
        self.deadline = now + limits.keep_alive_timeout_s
        self.head_deadline = now + limits.head_timeout_s


class Server:
    """The Local API listener (local-api.md 2.1).

    Args:
        application: called once per admitted request on a worker thread.
        host, port: loopback address; port 0 picks a free port (tests).
        limits: transport limits, e.g. ``ServerLimits.for_profile("edge")``.
        listen_socket: an already bound and listening socket to use instead.
        classify: ``classify(head)`` is True when the request presents a credential
            (:func:`qinglong_edge.local.identity.presents_credential`); requests for
            which it is False hold at most ``limits.unauthenticated_slots`` slots.
            ``None``: every request is treated as presenting one (no share).
        budget: the budget of requests without a valid credential, shared with
            admission; the poll thread answers 429 from it and counts its refusals.

    Call :meth:`start`, then :meth:`shutdown` (also a context manager).
    """

    def __init__(
        self,
        application: Application,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: ServerLimits | None = None,
        listen_socket: socket.socket | None = None,
        classify: Callable[[RequestHead], bool] | None = None,
        budget: RequestBudget | None = None,
        public: Callable[[RequestHead], bool] | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.application = application
        self._public = public
        self._observer = observer
        self.limits = limits or ServerLimits.for_profile("edge")
        self._classify = classify
        self._budget = budget
        if listen_socket is None:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            listen_socket = socket.socket(family, socket.SOCK_STREAM)
            try:
                listen_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listen_socket.bind((host, port))
                listen_socket.listen(self.limits.listen_backlog)
            except OSError:
                listen_socket.close()
                raise
        _defer_accept(listen_socket, self.limits)
        listen_socket.setblocking(False)
        self._listener: socket.socket | None = listen_socket
        self.address: tuple[str, int] = listen_socket.getsockname()[:2]
        self._lock = threading.Lock()
        self._poll = select.poll()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._conns: dict[int, _Conn] = {}
        self._lingering: dict[int, tuple[socket.socket, float]] = {}
        # Workers hand connections back to the poll thread, which alone changes
        # _conns, _lingering and the poll set (so an fd is never reused under it).
        self._returned: collections.deque[tuple[_Conn, str]] = collections.deque()
        self._jobs: collections.deque[tuple[_Conn, RequestHead] | None] = collections.deque()
        self._jobs_ready = threading.Condition(self._lock)
        # Requests with a credential that found every slot taken, oldest first, each with
        # the deadline of its wait (ServerLimits.credential_slot_wait_s). Whoever pops an
        # entry under _lock owns it: a worker (a slot freed), or the poll thread (its wait
        # is over: 503; or the drain: 503 server_draining). At most max_connections long.
        self._waiting: collections.deque[tuple[_Conn, RequestHead, float]] = collections.deque()
        # _in_flight: requests inside the application (the capacity check);
        # _busy: requests handed to a worker and not yet handed back (the drain waits
        # for it, so a response being written is never cut off).
        self._in_flight = 0
        self._anonymous_in_flight = 0
        self._public_in_flight = 0
        self._busy = 0
        self._evicted = 0
        self._rate_limited = 0
        self._listening = False
        self._draining = False
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._bytes_received = 0
        self._requests = 0
        self._idle = threading.Condition(self._lock)

    # -- public -----------------------------------------------------------

    @property
    def draining(self) -> bool:
        """Drain has started: new requests get 503 ``server_draining``."""
        return self._draining

    @property
    def bytes_received(self) -> int:
        """Bytes consumed from client sockets since start (heads and bodies)."""
        return self._bytes_received

    @property
    def requests_completed(self) -> int:
        """Responses written, any status."""
        return self._requests

    @property
    def connection_count(self) -> int:
        """Open client connections (any state but lingering)."""
        with self._lock:
            return len(self._conns)

    @property
    def evicted_connections(self) -> int:
        """IDLE/HEAD connections closed to accept a newer one at the connection cap."""
        return self._evicted

    @property
    def waiting_for_slot(self) -> int:
        """Requests with a credential waiting for a free slot now."""
        with self._lock:
            return len(self._waiting)

    @property
    def rate_limited(self) -> int:
        """Requests this thread answered 429 ``rate_limited`` (admission's are not counted)."""
        return self._rate_limited

    @property
    def healthy(self) -> bool:
        """Every thread the server started is still running."""
        return bool(self._threads) and all(thread.is_alive() for thread in self._threads)

    @property
    def thread_count(self) -> int:
        """Threads this server runs: one poll thread plus the worker pool."""
        return len(self._threads)

    def start(self) -> None:
        """Start the poll thread and the worker pool (``max_in_flight`` threads)."""
        if self._threads:
            raise RuntimeError("server already started")
        assert self._listener is not None
        self._poll.register(self._wake_r, _POLL_IN)
        self._poll.register(self._listener.fileno(), _POLL_IN)
        self._listening = True
        poller = threading.Thread(target=self._poll_loop, name="local-api-poll", daemon=True)
        self._threads.append(poller)
        for index in range(self.limits.max_in_flight):
            self._threads.append(
                threading.Thread(target=self._worker_loop, name=f"local-api-worker-{index}", daemon=True)
            )
        for thread in self._threads:
            thread.start()

    def shutdown(self, timeout: float | None = None) -> bool:
        """Drain and stop: stop accepting, let requests in flight finish, close all.

        Safe to call more than once. Blocks for at most the drain timeout plus a
        second for the threads to exit.

        Args:
            timeout: drain timeout in seconds, default the profile's.

        Returns:
            True when every in-flight request finished within the timeout.
        """
        drain_for = self.limits.drain_timeout_s if timeout is None else timeout
        with self._lock:
            self._draining = True
        self._wake()
        deadline = time.monotonic() + drain_for
        with self._lock:
            clean = self._idle.wait_for(lambda: self._busy == 0, max(0.0, deadline - time.monotonic()))
            self._stopping = True
            busy = [conn.sock for conn in self._conns.values() if conn.state is _State.BUSY]
            for _ in range(self.limits.max_in_flight):
                self._jobs.append(None)
            self._jobs_ready.notify_all()
        for sock in busy:  # unblock a worker stuck writing to a slow client
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._wake()
        for thread in self._threads:
            thread.join(timeout=max(1.0, deadline - time.monotonic()))
        self._close_everything()
        return clean

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- shared helpers ---------------------------------------------------

    def _count_received(self, size: int) -> None:
        with self._lock:
            self._bytes_received += size

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _close_everything(self) -> None:
        with self._lock:
            conns = list(self._conns.values())
            self._conns.clear()
            lingering = [sock for sock, _ in self._lingering.values()]
            self._lingering.clear()
        for conn in conns:
            _close(conn.sock)
        for sock in lingering:
            _close(sock)
        if self._listener is not None:
            _close(self._listener)
            self._listener = None
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- poll thread ------------------------------------------------------

    def _poll_loop(self) -> None:
        try:
            while not self._stopping:
                timeout_ms = self._next_timeout_ms()
                try:
                    events = self._poll.poll(timeout_ms)
                except InterruptedError:
                    continue
                for fd, mask in events:
                    if fd == self._wake_r:
                        with contextlib.suppress(OSError):
                            os.read(self._wake_r, 4096)
                    elif self._listener is not None and fd == self._listener.fileno():
                        self._accept()
                    elif fd in self._lingering:
                        self._end_linger(fd)
                    else:
                        conn = self._conns.get(fd)
                        if conn is not None and conn.state in (_State.IDLE, _State.HEAD):
                            self._on_readable(conn, mask)
                self._take_returned()
                self._apply_drain()
                self._expire()
                self._update_listening()
        except Exception as exc:  # the poll thread must never die silently
            _log.critical("local API poll thread failed: %s", type(exc).__name__)
            raise

    def _next_timeout_ms(self) -> int:
        deadlines = [c.deadline for c in self._conns.values() if c.state in _WAITING]
        deadlines += [d for _, d in self._lingering.values()]
        with self._lock:
            if self._waiting:
                deadlines.append(self._waiting[0][2])
        if not deadlines:
            return 1000
        return max(0, min(1000, int((min(deadlines) - time.monotonic()) * 1000) + 1))

    def _oldest_waiting(self) -> _Conn | None:
        """The IDLE/HEAD connection that has waited longest for its head, if any."""
        oldest: _Conn | None = None
        for conn in self._conns.values():
            if conn.state in _WAITING and (oldest is None or conn.since < oldest.since):
                oldest = conn
        return oldest

    def _accept(self) -> None:
        assert self._listener is not None
        cap = self.limits.max_connections
        for _ in range(self.limits.accept_batch):
            if self._draining or (len(self._conns) >= cap and self._oldest_waiting() is None):
                return
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: try again on the next event
                _log.warning("accept failed: %s", exc.strerror)
                return
            self._make_room(cap)
            sock.setblocking(False)
            conn = _Conn(sock, time.monotonic(), self.limits, peer_key(address))
            with self._lock:
                self._conns[conn.fd] = conn
            self._poll.register(conn.fd, _POLL_IN)
            # Most clients send the request with the connect: take it now, before a
            # later accept of this round could evict the connection as "waiting".
            self._on_readable(conn, 0)

    def _make_room(self, cap: int) -> None:
        """At the cap, close the oldest IDLE/HEAD connection, after reading what it has
        sent since the last poll: a request that already arrived is taken (dispatched or
        answered), not lost with the connection, and the next oldest is considered."""
        for _ in range(len(self._conns) + 1):
            if len(self._conns) < cap:
                return
            victim = self._oldest_waiting()
            if victim is None:
                return
            since = victim.since
            if victim.state is not _State.PARKED:  # a paused connection is not read early
                self._on_readable(victim, 0)
            if self._conns.get(victim.fd) is victim and victim.state in _WAITING and victim.since == since:
                self._drop(victim)
                self._evicted += 1
                return

    def _update_listening(self) -> None:
        if self._listener is None:
            return
        want = not self._draining and (
            len(self._conns) < self.limits.max_connections or self._oldest_waiting() is not None
        )
        if want and not self._listening:
            self._poll.register(self._listener.fileno(), _POLL_IN)
            self._listening = True
        elif not want and self._listening:
            self._poll.unregister(self._listener.fileno())
            self._listening = False

    def _on_readable(self, conn: _Conn, mask: int) -> None:
        parser = conn.parser
        # Never look further than one byte past the head cap; MSG_PEEK so that
        # only the head's own bytes are consumed and the body stays in the kernel.
        room = max(1, MAX_HEAD_BYTES + 1 - parser.buffered)
        try:
            peeked = conn.sock.recv(room, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            if mask & _POLL_CLOSED:
                self._drop(conn)
            return
        except OSError:
            self._drop(conn)
            return
        if not peeked:  # EOF between requests or inside a head: nothing to answer
            self._drop(conn)
            return
        if not parser.started:
            conn.state = _State.HEAD
            conn.deadline = conn.head_deadline
            conn.request_deadline = time.monotonic() + self.limits.request_timeout_s
        try:
            head = parser.feed(peeked)
        except HttpProtocolError as exc:
            _log.debug("rejected request head: %s (%d)", exc.code, exc.http_status or 400)
            self._answer_bare_and_close(conn, exc.http_status or 400)
            return
        if head is not None and time.monotonic() >= conn.head_deadline:
            # Complete, but later than head_timeout_s after the wait began (the poll
            # round that would have expired it was busy): the deadline still holds.
            self._answer_bare_and_close(conn, 408)
            return
        used = len(peeked) - (len(parser.trailing) if head is not None else 0)
        if not self._consume(conn, used):
            return
        if head is not None:
            self._dispatch(conn, head)

    def _consume(self, conn: _Conn, size: int) -> bool:
        remaining = size
        try:
            while remaining > 0:
                got = conn.sock.recv(remaining)
                if not got:
                    self._drop(conn)
                    return False
                remaining -= len(got)
        except OSError:
            self._drop(conn)
            return False
        finally:
            self._count_received(size - remaining)
        return True

    def _dispatch(self, conn: _Conn, head: RequestHead) -> None:
        if self._draining:
            self._answer_from_poll(conn, head, "server_draining", close=True)
            return
        public = self._public is not None and self._public(head)
        anonymous = not public and self._classify is not None and not self._classify(head)
        conn.public = public
        conn.dispatched = time.monotonic()
        wait = 0.0
        if anonymous and self._budget is not None:
            wait = self._budget.wait_s(conn.peer)
        queued = False
        with self._lock:
            if anonymous and self._anonymous_in_flight >= self.limits.unauthenticated_slots:
                wait = max(wait, 1.0)  # their share is taken: the others are for credentials
            # Requests already waiting for a slot go first (FIFO): nobody overtakes them.
            full = self._in_flight >= self.limits.max_in_flight or bool(self._waiting)
            # Public requests (console assets, /metrics) hold at most public_slots, and
            # wait for one like a credential (a browser loads its assets in parallel).
            shared_out = public and self._public_in_flight >= self.limits.public_slots
            if wait <= 0 and not full and not shared_out:
                self._in_flight += 1
                self._busy += 1
                if anonymous:
                    self._anonymous_in_flight += 1
                if public:
                    self._public_in_flight += 1
            elif wait <= 0 and not anonymous and self.limits.credential_slot_wait_s > 0:
                # A credential is only known valid after the store check, and a flood of
                # wrong ones is answered in microseconds each: wait for the next free slot
                # (a worker takes it from _waiting) rather than refuse the operator.
                queued = True
                conn.state = _State.QUEUED
                self._waiting.append((conn, head, time.monotonic() + self.limits.credential_slot_wait_s))
                self._jobs_ready.notify()
        if queued:
            with contextlib.suppress(KeyError, OSError):
                self._poll.unregister(conn.fd)  # its next bytes (a body) stay in the kernel
            return
        if wait > 0:
            self._rate_limited += 1
            if self._budget is not None:
                self._budget.refuse("credential_missing")
            self._answer_from_poll(conn, head, "rate_limited", close=head.has_body or head.wants_close,
                                   status=429, retry_after_s=RequestBudget.retry_after_s(wait))
            return
        if full:
            self._answer_from_poll(conn, head, "server_overloaded", close=head.has_body or head.wants_close)
            return
        self._poll.unregister(conn.fd)
        conn.state = _State.BUSY
        conn.anonymous = anonymous
        with self._lock:
            self._jobs.append((conn, head))
            self._jobs_ready.notify()

    def _answer_from_poll(self, conn: _Conn, head: RequestHead, code: str, *, close: bool, status: int = 503,
                          retry_after_s: int | None = None) -> None:
        close = close or conn.served + 1 >= self.limits.max_requests_per_connection
        self._observe(status, code, 0.0)
        _, data = render_json_response(
            status,
            {"code": code},
            request_id=new_request_id(),
            close=close,
            keep_alive_timeout_s=int(self.limits.keep_alive_timeout_s),
            head_only=head.method == "HEAD",
            retry_after_s=retry_after_s,
        )
        with self._lock:
            self._requests += 1
        if not _send_nonblocking(conn.sock, data):
            self._drop(conn)
            return
        conn.served += 1
        if close:
            self._finish_close(conn, body_unread=head.has_body)
        elif status == 429:
            self._park(conn)
        else:
            self._to_idle(conn)

    def _park(self, conn: _Conn) -> None:
        """After a 429 on a kept connection: not read again for ``refusal_pause_s`` (the
        connection stays open, evictable; its next request waits in the kernel). A client
        refused for lack of a credential then costs this thread one request per pause
        per connection, however fast it sends."""
        now = time.monotonic()
        conn.wait_again(now, self.limits)
        conn.state = _State.PARKED
        conn.deadline = now + self.limits.refusal_pause_s
        with contextlib.suppress(KeyError, OSError):
            self._poll.unregister(conn.fd)

    def _unpark(self, conn: _Conn, now: float) -> None:
        conn.wait_again(now, self.limits)
        self._poll.register(conn.fd, _POLL_IN)

    def _answer_bare_and_close(self, conn: _Conn, status: int) -> None:
        self._observe(status, None, 0.0)
        with self._lock:
            self._requests += 1
        _send_nonblocking(conn.sock, render_bare_response(status))
        self._finish_close(conn, body_unread=True)

    def _to_idle(self, conn: _Conn) -> None:
        conn.wait_again(time.monotonic(), self.limits)

    def _take_returned(self) -> None:
        while True:
            with self._lock:
                if not self._returned:
                    return
                conn, action = self._returned.popleft()
            if action == "keep" and not self._draining:
                conn.sock.setblocking(False)
                self._to_idle(conn)
                self._poll.register(conn.fd, _POLL_IN)
            elif action == "park" and not self._draining:
                conn.sock.setblocking(False)
                self._park(conn)
            elif action == "linger":
                self._finish_close(conn, body_unread=True)
            else:
                self._drop(conn)

    def _answer_waiting(self, conn: _Conn, head: RequestHead, code: str, *, close: bool) -> None:
        """Answer a request taken off :attr:`_waiting` from this thread (503); a kept
        connection is watched again."""
        self._answer_from_poll(conn, head, code, close=close)
        if self._conns.get(conn.fd) is conn and conn.state is _State.IDLE:
            with contextlib.suppress(OSError):
                self._poll.register(conn.fd, _POLL_IN)

    def _expire_waiting(self, now: float) -> None:
        """Requests whose wait for a slot is over (or all of them when draining)."""
        while True:
            with self._lock:
                if not self._waiting or not (self._draining or now >= self._waiting[0][2]):
                    return
                conn, head, _ = self._waiting.popleft()
            if self._draining:
                self._answer_waiting(conn, head, "server_draining", close=True)
            else:
                self._answer_waiting(conn, head, "server_overloaded", close=head.has_body or head.wants_close)

    def _apply_drain(self) -> None:
        if not self._draining:
            return
        self._expire_waiting(time.monotonic())
        if self._listener is not None:
            if self._listening:
                self._poll.unregister(self._listener.fileno())
                self._listening = False
            _close(self._listener)
            self._listener = None
        for conn in list(self._conns.values()):
            if conn.state in (_State.IDLE, _State.PARKED):
                self._drop(conn)

    def _expire(self) -> None:
        now = time.monotonic()
        self._expire_waiting(now)
        for conn in list(self._conns.values()):
            if conn.state is _State.IDLE and now >= conn.deadline:
                self._drop(conn)
            elif conn.state is _State.PARKED and now >= conn.deadline:
                self._unpark(conn, now)
            elif conn.state is _State.HEAD and now >= conn.deadline:
                # headersTimeout: answer as Node does, then close.
                self._answer_bare_and_close(conn, 408)
        for fd, (_, deadline) in list(self._lingering.items()):
            if now >= deadline:
                self._end_linger(fd)

    def _finish_close(self, conn: _Conn, *, body_unread: bool) -> None:
        """Close after a response; keep a half-closed socket a while if unread bytes may follow."""
        self._forget(conn)
        if not body_unread or len(self._lingering) >= self.limits.max_connections:
            _close(conn.sock)
            return
        try:
            conn.sock.shutdown(socket.SHUT_WR)
            self._poll.register(conn.fd, _POLL_RDHUP | _POLL_CLOSED)
        except OSError:
            _close(conn.sock)
            return
        with self._lock:
            self._lingering[conn.fd] = (conn.sock, time.monotonic() + self.limits.linger_s)

    def _end_linger(self, fd: int) -> None:
        with self._lock:
            entry = self._lingering.pop(fd, None)
        if entry is None:
            return
        with contextlib.suppress(KeyError, OSError):
            self._poll.unregister(fd)
        _close(entry[0])

    def _forget(self, conn: _Conn) -> None:
        with self._lock:
            self._conns.pop(conn.fd, None)
        with contextlib.suppress(KeyError, OSError):
            self._poll.unregister(conn.fd)

    def _drop(self, conn: _Conn) -> None:
        self._forget(conn)
        _close(conn.sock)

    # -- workers ----------------------------------------------------------

    def _slot_for_waiting(self) -> bool:
        """(Under _lock.) A waiting request can have a free slot now."""
        return (self._in_flight < self.limits.max_in_flight and not self._draining
                and self._eligible_waiting() is not None)

    def _eligible_waiting(self) -> int | None:
        """(Under _lock.) The oldest waiting request that may take a free slot: one with a
        credential, or a public one while the public share is not taken."""
        share = self._public_in_flight < self.limits.public_slots
        for index, (conn, _, _) in enumerate(self._waiting):
            if share or not conn.public:
                return index
        return None

    def _observe(self, status: int, code: object, seconds: float) -> None:
        if self._observer is not None:
            try:
                self._observer(status, code if isinstance(code, str) else None, seconds)
            except Exception as exc:  # noqa: BLE001 - metrics must never fail a request
                _log.error("response observer failed: %s", type(exc).__name__)

    def _worker_loop(self) -> None:
        while True:
            with self._lock:
                self._jobs_ready.wait_for(lambda: bool(self._jobs) or self._slot_for_waiting())
                if self._jobs:
                    job = self._jobs.popleft()
                else:  # the oldest request waiting for a slot takes the free one
                    index = self._eligible_waiting()
                    assert index is not None
                    conn, head, _ = self._waiting[index]
                    del self._waiting[index]
                    self._in_flight += 1
                    self._busy += 1
                    if conn.public:
                        self._public_in_flight += 1
                    conn.state = _State.BUSY
                    job = (conn, head)
            if job is None:
                return
            conn, head = job
            try:
                action = self._serve(conn, head)
            except Exception as exc:  # noqa: BLE001 - one request must never kill a worker
                # Type name only: a message could quote request bytes.
                _log.error("local API worker failed: %s", type(exc).__name__)
                action = "linger"
            self._hand_back(conn, action)

    def _serve(self, conn: _Conn, head: RequestHead) -> str:
        """Run the application and write its answer; returns what to do with the
        connection next (see :meth:`_hand_back`)."""
        exchange = Exchange(
            conn.sock,
            head,
            request_deadline=conn.request_deadline,
            write_timeout_s=self.limits.write_timeout_s,
            count_received=self._count_received,
            draining=lambda: self._draining,
            peer=conn.peer,
        )
        try:
            conn.sock.setblocking(True)
            response = self.application(exchange)
        except BodyReadError as exc:
            response = _body_error_response(exc.code)
        except Exception as exc:  # noqa: BLE001 - local-api.md 2.2 step 8: anything unexpected is 503
            _log.error("local API application failed: %s", type(exc).__name__)
            response = Response(503, {"code": "request_unavailable"}, close=True)
        finally:
            # The request's work is done: free its capacity slot before the answer is
            # written, so a client that reacts to the answer at once (a new request,
            # a reconnect after connection: close) never finds it still counted.
            with self._lock:
                self._in_flight -= 1
                if conn.anonymous:
                    self._anonymous_in_flight -= 1
                    conn.anonymous = False
                if conn.public:
                    self._public_in_flight -= 1
                    conn.public = False
                if self._waiting:
                    self._jobs_ready.notify()
        if response.status == 0:  # disconnected: nobody to answer
            return "close"
        body_unread = not exchange.body_consumed
        close = (
            response.close
            or response.bare
            or body_unread
            or head.wants_close
            or self._draining
            or conn.served + 1 >= self.limits.max_requests_per_connection
        )
        self._observe(response.status, None if response.bare else response.body.get("code"),
                      time.monotonic() - conn.dispatched)
        if response.bare:
            data = render_bare_response(response.status)
        elif response.content is not None:
            data = render_raw_response(
                response.status, response.content, response.headers, request_id=exchange.request_id, close=close,
                keep_alive_timeout_s=int(self.limits.keep_alive_timeout_s), head_only=head.method == "HEAD",
            )
        else:
            _, data = render_json_response(
                response.status,
                response.body,
                request_id=exchange.request_id,
                close=close,
                keep_alive_timeout_s=int(self.limits.keep_alive_timeout_s),
                head_only=head.method == "HEAD",
                retry_after_s=response.retry_after_s,
            )
        try:
            conn.sock.settimeout(self.limits.write_timeout_s)
            conn.sock.sendall(data)
        except OSError:
            return "close"
        finally:
            with self._lock:
                self._requests += 1
        conn.served += 1
        if not close:
            return "park" if response.status == 429 else "keep"
        return "linger" if body_unread else "close"

    def _hand_back(self, conn: _Conn, action: str) -> None:
        """Return the connection to the poll thread: ``keep`` (keep-alive), ``park``
        (keep-alive after a 429: paused first), ``linger`` (half-close, unread body may
        follow) or ``close``."""
        with self._lock:
            self._busy -= 1
            self._idle.notify_all()
            self._returned.append((conn, action))
        self._wake()


def _defer_accept(listener: socket.socket, limits: ServerLimits) -> None:
    """``TCP_DEFER_ACCEPT`` where the platform has it (Linux); best effort elsewhere."""
    seconds = limits.defer_accept_s
    if seconds is None:
        seconds = math.ceil(limits.head_timeout_s)
    option = getattr(socket, "TCP_DEFER_ACCEPT", None)
    if option is None or seconds <= 0 or listener.family not in (socket.AF_INET, socket.AF_INET6):
        return
    with contextlib.suppress(OSError):
        listener.setsockopt(socket.IPPROTO_TCP, option, int(seconds))


def _body_error_response(code: str) -> Response:
    """local-api.md 2.4: a short body is 400, a slow one 408 (Node ``requestTimeout``),
    a vanished client gets nothing (status 0)."""
    if code == "body_truncated":
        return Response(400, {"code": "invalid_request_body"}, close=True)
    if code == "body_timeout":
        return Response(408, close=True, bare=True)
    return Response(0)


def _send_nonblocking(sock: socket.socket, data: bytes) -> bool:
    """Send a small response from the poll thread without blocking it.

    A fresh socket's send buffer holds far more than one error response, so a
    partial send means the peer is gone or hostile: the caller drops it.
    """
    try:
        sent = sock.send(data)
    except OSError:
        return False
    return sent == len(data)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()
