"""The socket server's transport guarantees, with a small real application.

The application here is a stand-in for admission + routes so the transport
properties (limits, timeouts, keep-alive, drain, thread count, bytes read) are
tested on their own; tests/local/test_local_api.py runs the real pipeline.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from qinglong_edge.local.server import Exchange, Response, Server, ServerLimits
from tests.support.http_client import ResponseReader, exchange, request_bytes
from tests.support.wait import wait_until


class App:
    """GET /ok -> 200; GET /block -> waits for ``release``; POST /echo reads the body
    (after "admission"); POST /deny -> 401 without reading; GET /boom raises."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def __call__(self, ex: Exchange) -> Response:
        target = ex.head.target
        if target == "/block":
            self.entered.release()
            self.release.wait(10)
            return Response(200, {"blocked": True})
        if target == "/echo":
            body = ex.read_body(ex.head.content_length or 0)
            return Response(200, {"size": len(body)})
        if target == "/slow-admission":  # admission waited on a busy store past the request timeout
            time.sleep(0.8)  # the scenario: a slow handler
            body = ex.read_body(ex.head.content_length or 0)
            return Response(200, {"size": len(body)})
        if target == "/deny":
            return Response(401, {"code": "authentication_required"})
        if target == "/boom":
            raise RuntimeError("secret detail must not leak")
        return Response(200, {"ok": True})


@contextlib.contextmanager
def running(limits: ServerLimits | None = None, app: App | None = None) -> Iterator[tuple[Server, App]]:
    app = app or App()
    server = Server(app, limits=limits or ServerLimits.for_profile("edge"))
    server.start()
    try:
        yield server, app
    finally:
        app.release.set()
        server.shutdown(timeout=2)


@contextlib.contextmanager
def blocked(server: Server, app: App, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections, each with a GET /block the app has entered (each holds a slot);
    after the block the app is released and every socket in the list is closed."""
    socks = [socket.create_connection(server.address) for _ in range(count)]
    try:
        for sock in socks:
            sock.sendall(request_bytes("GET", "/block"))
        for _ in range(count):
            assert app.entered.acquire(timeout=5)
        yield socks
    finally:
        app.release.set()
        for sock in socks:
            sock.close()


def fast(**overrides: float) -> ServerLimits:
    base = {"max_in_flight": 4, "max_connections": 8, "drain_timeout_s": 2.0}
    base.update(overrides)
    return ServerLimits(**base)  # type: ignore[arg-type]


GET_OK = request_bytes("GET", "/ok")


def test_serves_keep_alive_and_pipelined_requests() -> None:
    with running() as (server, _), socket.create_connection(server.address) as sock:
        sock.sendall(GET_OK + GET_OK)
        reader = ResponseReader(sock)
        first, second = reader.read(), reader.read()
        assert first is not None and second is not None
        assert (first.status, second.status) == (200, 200)
        assert first.header("connection") == "keep-alive"
        assert first.header("keep-alive") == "timeout=5"
        assert first.header("x-request-id") != second.header("x-request-id")
        sock.sendall(GET_OK)
        third = reader.read()
        assert third is not None and third.status == 200


def test_closes_after_100_requests_on_one_connection() -> None:
    with running() as (server, _), socket.create_connection(server.address) as sock:
        reader = ResponseReader(sock)
        for index in range(100):
            sock.sendall(GET_OK)
            response = reader.read()
            assert response is not None
            assert response.closes is (index == 99)
        assert reader.closed_by_server()


def test_honours_connection_close_from_the_client() -> None:
    with running() as (server, _), socket.create_connection(server.address) as sock:
        sock.sendall(request_bytes("GET", "/ok", headers=[("Connection", "close")]))
        reader = ResponseReader(sock)
        response = reader.read()
        assert response is not None and response.closes
        assert reader.closed_by_server()


def test_rejects_protocol_errors_with_a_bare_response_and_close() -> None:
    with running() as (server, _), socket.create_connection(server.address) as sock:
        sock.sendall(b"GET / HTTP/1.1\nHost: a\n\n")
        reader = ResponseReader(sock)
        response = reader.read()
        assert response is not None
        assert (response.status, response.headers, response.body) == (400, [("Connection", "close")], b"")
        assert reader.closed_by_server()


def test_application_errors_become_503_request_unavailable_without_detail() -> None:
    with running() as (server, _):
        response = exchange(server.address, request_bytes("GET", "/boom"))
        assert response is not None
        assert (response.status, response.json()) == (503, {"code": "request_unavailable"})
        assert b"secret" not in response.body
        assert exchange(server.address, GET_OK).status == 200  # type: ignore[union-attr]


def test_reads_the_body_and_keeps_the_connection() -> None:
    with running() as (server, _), socket.create_connection(server.address) as sock:
        sock.sendall(request_bytes("POST", "/echo", body=b"x" * 300) + GET_OK)
        reader = ResponseReader(sock)
        first, second = reader.read(), reader.read()
        assert first is not None and first.json() == {"size": 300} and not first.closes
        assert second is not None and second.status == 200


def test_answers_without_reading_the_body_then_closes() -> None:
    with running() as (server, _), socket.create_connection(server.address) as sock:
        head = request_bytes("POST", "/deny", headers=[("Content-Length", "10485760")])
        sock.sendall(head)
        reader = ResponseReader(sock)
        response = reader.read()
        assert response is not None and response.status == 401 and response.closes
        assert reader.closed_by_server()
        assert server.bytes_received == len(head)


def test_unauthenticated_10_mib_post_reads_only_the_head() -> None:
    body = b"{" * (10 * 1024 * 1024)
    head = request_bytes("POST", "/deny", headers=[("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    with running() as (server, _), socket.create_connection(server.address) as sock:
        sock.sendall(head)

        def pump() -> None:
            with contextlib.suppress(OSError):
                sock.sendall(body)

        sender = threading.Thread(target=pump, daemon=True)
        sender.start()
        response = ResponseReader(sock).read()
        assert response is not None and response.status == 401
        assert server.bytes_received == len(head)
        sock.shutdown(socket.SHUT_RDWR)
        sender.join(5)


def test_expect_continue_is_sent_only_after_admission() -> None:
    with running() as (server, _), socket.create_connection(server.address) as sock:
        sock.sendall(request_bytes("POST", "/deny", headers=[("Expect", "100-continue"), ("Content-Length", "5")]))
        response = ResponseReader(sock).read()
        assert response is not None and response.status == 401 and response.extra == []
    with running() as (server, _), socket.create_connection(server.address) as sock:
        sock.sendall(request_bytes("POST", "/echo", headers=[("Expect", "100-continue"), ("Content-Length", "5")]))
        reader = ResponseReader(sock)
        sock.settimeout(5)
        interim = sock.recv(100)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"hello")
        response = reader.read()
        assert response is not None and response.json() == {"size": 5}


def test_truncated_body_after_half_close_is_400() -> None:
    with running() as (server, _):
        response = exchange(server.address, request_bytes("POST", "/echo", headers=[("Content-Length", "100")]) + b"abc", half_close=True)
        assert response is not None
        assert (response.status, response.json()) == (400, {"code": "invalid_request_body"})


def test_slow_body_gets_408() -> None:
    with running(fast(request_timeout_s=0.5)) as (server, _):
        with socket.create_connection(server.address) as sock:
            sock.sendall(request_bytes("POST", "/echo", headers=[("Content-Length", "100")]) + b"abc")
            response = ResponseReader(sock).read()
        assert response is not None and response.status == 408


def test_body_already_received_is_read_after_a_slow_admission() -> None:
    # The client sent head and body at once; the server's own wait (a busy store during
    # admission, busyTimeoutMs up to 30 s) must not turn into a 408 for the client.
    with running(fast(request_timeout_s=0.5)) as (server, _):
        response = exchange(server.address, request_bytes("POST", "/slow-admission", body=b"x" * 75))
        assert response is not None and (response.status, response.json()) == (200, {"size": 75})
        with socket.create_connection(server.address) as sock:  # a missing body still times out
            sock.sendall(request_bytes("POST", "/slow-admission", headers=[("Content-Length", "100")]) + b"abc")
            late = ResponseReader(sock).read()
        assert late is not None and late.status == 408


def test_slow_head_gets_408_and_idle_connections_close() -> None:
    # defer_accept_s=0: the idle connection reaches the server at once (by default the
    # kernel holds a connection that sends nothing for about the head timeout first).
    with running(fast(head_timeout_s=0.5, keep_alive_timeout_s=0.5, defer_accept_s=0)) as (server, _):
        with socket.create_connection(server.address) as sock:
            sock.sendall(b"GET /ok HTTP/1.1\r\n")
            response = ResponseReader(sock).read(timeout=3)
            assert response is not None and response.status == 408
        with socket.create_connection(server.address) as sock:
            started = time.monotonic()
            assert ResponseReader(sock).closed_by_server(timeout=3)
            assert time.monotonic() - started < 2.5


def test_overload_beyond_the_in_flight_cap_is_503_before_routing() -> None:
    """(Every request counts as carrying a credential here: it first waits its bounded
    time for a slot, ``credential_slot_wait_s``, then gets the 503.)"""
    with running(fast(credential_slot_wait_s=0.1)) as (server, app):
        with blocked(server, app, 4) as socks:
            response = exchange(server.address, request_bytes("GET", "/no-such-route"))
            assert response is not None
            assert (response.status, response.json()) == (503, {"code": "server_overloaded"})
            app.release.set()
            for sock in socks:
                done = ResponseReader(sock).read()
                assert done is not None and done.status == 200


def test_drain_finishes_in_flight_requests_and_refuses_new_ones() -> None:
    app = App()
    server = Server(app, limits=fast())
    server.start()
    try:
        busy = socket.create_connection(server.address)
        idle = socket.create_connection(server.address)
        idle.sendall(GET_OK)
        idle_reader = ResponseReader(idle)
        assert idle_reader.read() is not None
        slow_head = socket.create_connection(server.address)
        slow_head.sendall(b"GET /ok HTTP/1.1\r\n")
        busy.sendall(request_bytes("GET", "/block"))
        assert app.entered.acquire(timeout=5)
        result: list[bool] = []
        drainer = threading.Thread(target=lambda: result.append(server.shutdown()))
        drainer.start()
        assert idle_reader.closed_by_server()  # idle keep-alive connections close at once (it waits up to 5 s)
        slow_head.sendall(b"Host: a\r\n\r\n")
        refused = ResponseReader(slow_head).read()
        assert refused is not None
        assert (refused.status, refused.json(), refused.closes) == (503, {"code": "server_draining"}, True)
        with pytest.raises(OSError):
            socket.create_connection(server.address, timeout=1).close()
        app.release.set()
        finished = ResponseReader(busy).read()
        assert finished is not None and finished.status == 200 and finished.closes
        drainer.join(5)
        assert result == [True]
    finally:
        app.release.set()
        server.shutdown(timeout=1)


def test_drain_times_out_when_a_request_does_not_finish() -> None:
    app = App()
    server = Server(app, limits=fast(drain_timeout_s=0.3))
    server.start()
    with socket.create_connection(server.address) as sock:
        sock.sendall(request_bytes("GET", "/block"))
        assert app.entered.acquire(timeout=5)
        started = time.monotonic()
        assert server.shutdown() is False
        assert time.monotonic() - started < 3
    app.release.set()


def _open_many(address: tuple[str, int], count: int, payload: bytes, ceiling: int) -> tuple[dict[bytes, int], int]:
    """Open ``count`` connections from this one thread (no client threads), send
    ``payload`` on each, read every response; return (count per status line,
    highest thread count seen)."""
    sel = selectors.DefaultSelector()
    buffers: dict[socket.socket, bytes] = {}
    peak = threading.active_count()
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(address)
        sel.register(sock, selectors.EVENT_WRITE)
        buffers[sock] = b""
    pending_send = set(buffers)
    statuses: dict[bytes, int] = {}
    deadline = time.monotonic() + 30
    while buffers and time.monotonic() < deadline:
        for key, events in sel.select(timeout=0.2):
            sock = key.fileobj  # type: ignore[assignment]
            assert isinstance(sock, socket.socket)
            if events & selectors.EVENT_WRITE and sock in pending_send:
                sock.sendall(payload)
                pending_send.discard(sock)
                sel.modify(sock, selectors.EVENT_READ)
                continue
            try:
                chunk = sock.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                chunk = b""
            buffers[sock] += chunk
            data = buffers[sock]
            if b"\r\n\r\n" in data or not chunk:
                status = data.split(b"\r\n", 1)[0]
                statuses[status] = statuses.get(status, 0) + 1
                sel.unregister(sock)
                sock.close()
                del buffers[sock]
        peak = max(peak, threading.active_count())
        assert peak <= ceiling, f"{peak} threads"
    for sock in buffers:
        sock.close()
    return statuses, peak


def test_100_concurrent_connections_never_raise_the_thread_count() -> None:
    before = threading.active_count()
    with running() as (server, _):
        ceiling = before + server.thread_count
        assert server.thread_count == 1 + 4
        statuses, peak = _open_many(server.address, 100, request_bytes("GET", "/ok", headers=[("Connection", "close")]), ceiling)
        # Every client gets an answer: served, or 503 server_overloaded when more
        # than 4 heads complete at once (local-api.md 2.1); or, connected but not yet
        # sending when the connection cap was reached, it was closed without one to
        # accept a newer connection (the oldest waiting connection goes first): never
        # more such closes than evictions.
        assert set(statuses) <= {b"HTTP/1.1 200 OK", b"HTTP/1.1 503 Service Unavailable", b""}, statuses
        assert statuses.get(b"", 0) <= server.evicted_connections, (statuses, server.evicted_connections)
        assert sum(statuses.values()) == 100
        assert statuses.get(b"HTTP/1.1 200 OK", 0) >= 4
        assert peak <= ceiling
        assert len(os.listdir("/proc/self/task")) <= ceiling


def test_clients_at_the_in_flight_limit_never_see_overload() -> None:
    """4 keep-alive clients (the edge in-flight limit) in a tight loop, reconnecting at
    the 100-request limit: the slot of an answered request is always free again by
    the time its client can send the next one."""
    statuses: list[int] = []
    lock = threading.Lock()

    def client(address: tuple[str, int]) -> None:
        sock = socket.create_connection(address)
        reader = ResponseReader(sock)
        mine = []
        for _ in range(150):
            sock.sendall(GET_OK)
            response = reader.read()
            assert response is not None
            mine.append(response.status)
            if response.closes:
                sock.close()
                sock = socket.create_connection(address)
                reader = ResponseReader(sock)
        sock.close()
        with lock:
            statuses.extend(mine)

    with running() as (server, _):
        threads = [threading.Thread(target=client, args=(server.address,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert statuses == [200] * 600


def test_a_request_leaves_the_in_flight_count_before_its_answer_is_sent() -> None:
    with running() as (server, app):
        with blocked(server, app, 3):
            for _ in range(50):
                with socket.create_connection(server.address) as sock:
                    sock.sendall(GET_OK)
                    assert ResponseReader(sock).read() is not None
                    # the answer is here: its slot is already free (3 still blocked)
                    assert server._in_flight == 3
                again = exchange(server.address, GET_OK)
                assert again is not None and again.status == 200


def test_head_requests_get_headers_without_a_body() -> None:
    """RFC 9110 9.3.2, as Node does: content-length is sent, the body is not, and the
    next response on the connection is not mistaken for one."""
    with running() as (server, _), socket.create_connection(server.address) as sock:
        sock.sendall(request_bytes("HEAD", "/ok") + GET_OK)
        sock.settimeout(5)
        data = b""
        while data.count(b"HTTP/1.1 ") < 2 or not data.endswith(b'{"ok":true}'):
            chunk = sock.recv(65536)
            assert chunk
            data += chunk
        first, second = data.split(b"HTTP/1.1 ")[1:]
        assert first.startswith(b"200 OK") and first.endswith(b"\r\n\r\n")
        assert b"content-length: 11\r\n" in first
        assert second.endswith(b'{"ok":true}')


def _presents(head: object) -> bool:
    return bool(head.values("authorization"))  # type: ignore[attr-defined]


def test_requests_without_a_credential_hold_at_most_their_share_of_the_slots() -> None:
    """Edge: 4 slots, 1 for requests without a credential. A second such request while the
    first holds its slot is 429 (``retry-after: 1``); requests with one still get the other
    three, and only then 503 ``server_overloaded``."""
    app = App()
    server = Server(app, limits=ServerLimits.for_profile("edge"), classify=_presents)
    server.start()
    credential = [("Authorization", "Bearer x")]
    socks: list[socket.socket] = []
    try:
        anonymous = socket.create_connection(server.address)
        socks.append(anonymous)
        anonymous.sendall(request_bytes("GET", "/block"))
        assert app.entered.acquire(timeout=5)
        refused = exchange(server.address, request_bytes("GET", "/ok"))
        assert refused is not None and (refused.status, refused.json()) == (429, {"code": "rate_limited"})
        assert refused.header("retry-after") == "1"
        for _ in range(3):
            sock = socket.create_connection(server.address)
            socks.append(sock)
            sock.sendall(request_bytes("GET", "/block", headers=credential))
            assert app.entered.acquire(timeout=5)
        full = exchange(server.address, request_bytes("GET", "/ok", headers=credential))  # after its 1 s wait
        assert full is not None and (full.status, full.json()) == (503, {"code": "server_overloaded"})
        app.release.set()
        for sock in socks:
            done = ResponseReader(sock).read()
            assert done is not None and done.status == 200
        again = exchange(server.address, request_bytes("GET", "/ok"))  # the share is free again
        assert again is not None and again.status == 200
    finally:
        app.release.set()
        for sock in socks:
            sock.close()
        server.shutdown(timeout=2)


def test_an_empty_budget_is_answered_from_the_poll_thread_without_the_application() -> None:
    from qinglong_edge.local.budget import RequestBudget

    calls: list[str] = []

    def app(ex: Exchange) -> Response:
        calls.append(ex.head.target)
        return Response(200, {"ok": True})

    budget = RequestBudget(burst=1, per_minute=1.0)
    assert budget.take() == 0.0
    server = Server(app, limits=fast(), classify=_presents, budget=budget)
    server.start()
    try:
        refused = exchange(server.address, request_bytes("GET", "/anything"))
        assert refused is not None and refused.status == 429
        assert refused.header("retry-after") == "60"
        served = exchange(server.address, request_bytes("GET", "/ok", headers=[("Authorization", "Bearer x")]))
        assert served is not None and served.status == 200
    finally:
        server.shutdown(timeout=2)
    assert calls == ["/ok"]
    assert budget.pending() == {"credential_missing": 1} and server.rate_limited == 1


def _partial(server: Server) -> socket.socket:
    """A connection that has sent the start of a head (HEAD state, waiting)."""
    sock = socket.create_connection(server.address)
    sock.sendall(b"GET /ok HTTP/1.1\r\n")
    return sock


def test_at_the_connection_cap_the_oldest_waiting_connection_makes_room() -> None:
    with running(fast(max_connections=3)) as (server, _):
        idle = []
        for count in range(1, 4):  # one after another: their order is the eviction order
            idle.append(_partial(server))
            assert wait_until(lambda n=count: server.connection_count == n)
        try:
            assert server.connection_count == 3
            response = exchange(server.address, GET_OK)
            assert response is not None and response.status == 200
            assert server.evicted_connections == 1
            assert ResponseReader(idle[0]).closed_by_server(timeout=5)  # the oldest
            idle[1].sendall(b"Host: x\r\n\r\n")  # the others are still served
            kept = ResponseReader(idle[1]).read()
            assert kept is not None and kept.status == 200
        finally:
            for sock in idle:
                sock.close()


def test_a_request_that_arrived_is_served_not_evicted() -> None:
    """The oldest waiting connection's bytes are read before it would be closed: its
    request had arrived, so it is answered and a younger idle one goes instead."""
    with running(fast(max_connections=2)) as (server, _):
        first = _partial(server)
        assert wait_until(lambda: server.connection_count == 1)
        second = _partial(server)
        try:
            assert wait_until(lambda: server.connection_count == 2)
            first.sendall(b"Host: x\r\n\r\n")
            third = exchange(server.address, GET_OK)
            assert third is not None and third.status == 200
            answered = ResponseReader(first).read()
            assert answered is not None and answered.status == 200
        finally:
            first.close()
            second.close()


def test_when_every_connection_is_busy_new_clients_wait_in_the_backlog() -> None:
    with running(fast(max_in_flight=2, max_connections=2)) as (server, app):
        with blocked(server, app, 2) as socks:
            waiting = socket.create_connection(server.address)  # the kernel completes the handshake
            socks.append(waiting)
            waiting.sendall(GET_OK)
            assert server.evicted_connections == 0
            app.release.set()
            answer = ResponseReader(waiting).read()
            assert answer is not None and answer.status == 200


def test_connections_that_send_nothing_never_reach_the_server() -> None:
    """``TCP_DEFER_ACCEPT``: 20 connections that send nothing are not handed to accept()
    (within the 30 s head timeout of this test): no slot is taken, nobody is evicted, and
    a client with a request is served at once."""
    with running(fast(max_connections=3, head_timeout_s=30.0, keep_alive_timeout_s=30.0)) as (server, _):
        silent = [socket.create_connection(server.address) for _ in range(20)]
        try:
            response = exchange(server.address, GET_OK)
            assert response is not None and response.status == 200
            assert server.evicted_connections == 0
            assert server.connection_count <= 1  # only the client that sent something
        finally:
            for sock in silent:
                sock.close()


def test_a_connection_answered_429_is_paused_before_it_is_read_again() -> None:
    """After a 429 a kept connection is not read for ``refusal_pause_s``: its next request
    waits in the kernel while other connections are served (the flood costs one request
    per pause per connection)."""
    from qinglong_edge.local.budget import RequestBudget

    budget = RequestBudget(burst=1, per_minute=1.0)
    assert budget.take() == 0.0
    server = Server(lambda ex: Response(200, {"ok": True}), limits=fast(refusal_pause_s=30.0),
                    classify=_presents, budget=budget)
    server.start()
    try:
        with socket.create_connection(server.address) as paused:
            reader = ResponseReader(paused)
            paused.sendall(GET_OK)
            first = reader.read()
            assert first is not None and first.status == 429 and not first.closes
            paused.sendall(GET_OK)  # now in the server's receive buffer, before the next client
            other = exchange(server.address, GET_OK)
            assert other is not None and other.status == 429  # a later client was read and answered
            paused.setblocking(False)
            with pytest.raises(BlockingIOError):
                paused.recv(1)  # ... but not the paused connection's request
            assert server.rate_limited == 2
    finally:
        server.shutdown(timeout=2)


def _readable_or(sock: socket.socket, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``sock`` has something to read (an answer came) or ``predicate()``."""
    with selectors.DefaultSelector() as sel:
        sel.register(sock, selectors.EVENT_READ)
        wait_until(lambda: predicate() or bool(sel.select(timeout=0)), timeout)


def test_a_request_with_a_credential_waits_for_a_slot_instead_of_503() -> None:
    """Issue 17 item 1 (review): every slot busy, a request that carries a credential is
    not answered 503 ``server_overloaded`` at once: it waits (without a thread of its own)
    for the next free slot and is served. Before the fix it was refused at once, which a
    flood of well-formed wrong credentials turned into 503s for the operator."""
    with running(fast(credential_slot_wait_s=30.0)) as (server, app):
        socks = [socket.create_connection(server.address) for _ in range(4)]
        waiting = socket.create_connection(server.address)
        socks.append(waiting)
        try:
            for sock in socks[:4]:
                sock.sendall(request_bytes("GET", "/block"))
            for _ in range(4):
                assert app.entered.acquire(timeout=5)
            before = threading.active_count()
            waiting.sendall(GET_OK)
            _readable_or(waiting, lambda: getattr(server, "waiting_for_slot", 0) == 1)
            assert threading.active_count() == before
            app.release.set()
            answer = ResponseReader(waiting).read()
            assert answer is not None and (answer.status, answer.json()) == (200, {"ok": True})
            for sock in socks[:4]:
                done = ResponseReader(sock).read()
                assert done is not None and done.status == 200
            assert server.waiting_for_slot == 0
        finally:
            for sock in socks:
                sock.close()


def test_the_wait_for_a_slot_is_bounded_then_503() -> None:
    """The wait is bounded (``credential_slot_wait_s``): slots held past it, the waiting
    request gets 503 ``server_overloaded`` after all, and the connection stays usable."""
    with running(fast(credential_slot_wait_s=0.2)) as (server, app):
        with blocked(server, app, 4):
            with socket.create_connection(server.address) as late:
                late.sendall(GET_OK)
                reader = ResponseReader(late)
                refused = reader.read()
                assert refused is not None and (refused.status, refused.json()) == (503, {"code": "server_overloaded"})
                assert server.waiting_for_slot == 0
                app.release.set()
                late.sendall(GET_OK)
                again = reader.read()
                assert again is not None and again.status == 200


def test_a_request_waiting_for_a_slot_is_never_evicted_and_drain_answers_it() -> None:
    """At the connection cap a waiting request is not a waiting *connection*: it is not
    closed to make room (its head was read; it would be lost). On drain it is answered
    503 ``server_draining``."""
    with running(fast(max_in_flight=1, max_connections=2, credential_slot_wait_s=30.0)) as (server, app):
        busy = socket.create_connection(server.address)
        waiting = socket.create_connection(server.address)
        try:
            busy.sendall(request_bytes("GET", "/block"))
            assert app.entered.acquire(timeout=5)
            waiting.sendall(GET_OK)
            assert wait_until(lambda: server.waiting_for_slot == 1)
            with socket.create_connection(server.address) as third:  # in the backlog: nobody to evict
                third.sendall(GET_OK)
                assert server.evicted_connections == 0
                drained = threading.Thread(target=server.shutdown, kwargs={"timeout": 5})
                drained.start()
                answer = ResponseReader(waiting).read()
                assert answer is not None and (answer.status, answer.json()) == (503, {"code": "server_draining"})
                app.release.set()
                drained.join(10)
                done = ResponseReader(busy).read()
                assert done is not None and done.status == 200
        finally:
            app.release.set()
            busy.close()
            waiting.close()
