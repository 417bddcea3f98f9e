"""Public requests (the console's assets, /metrics) hold at most ``public_slots`` of the
request slots and wait for one, so they never crowd out a request with a credential
(issue 26: "never starve an operator"); every answer reaches the observer."""

from __future__ import annotations

import socket

from qinglong_edge.local.server import Response, Server, ServerLimits
from tests.local.test_server import App
from tests.support.http_client import ResponseReader, exchange, request_bytes
from tests.support.wait import wait_until


class PublicApp(App):
    """``/public-block`` blocks like ``/block``; every path ending in ``public...`` is public."""

    def __call__(self, ex):  # type: ignore[no-untyped-def]
        if ex.head.target.startswith("/public-block"):
            self.entered.release()
            self.release.wait(10)
            return Response(200, content=b"asset", headers=(("content-type", "text/plain"),))
        return super().__call__(ex)


def _send(sock: socket.socket, target: str) -> None:
    sock.sendall(request_bytes("GET", target))


def test_public_requests_wait_for_their_share_and_never_take_every_slot() -> None:
    app = PublicApp()
    seen: list[tuple[int, str | None]] = []
    limits = ServerLimits(max_in_flight=4, max_connections=8, drain_timeout_s=2.0, public_slots=2,
                          credential_slot_wait_s=5.0)
    server = Server(app, limits=limits, public=lambda head: head.target.startswith("/public"),
                    observer=lambda status, code, seconds: seen.append((status, code)))
    server.start()
    socks = []
    try:
        for n in range(3):  # three public requests: two run, the third waits for their share
            sock = socket.create_connection(server.address)
            socks.append(sock)
            _send(sock, f"/public-block-{n}")
        for _ in range(2):
            assert app.entered.acquire(timeout=5)
        assert not app.entered.acquire(timeout=0.3)  # the third is not in the application
        assert exchange(server.address, request_bytes("GET", "/ok")) is not None  # a credential slot is free
        app.release.set()
        for sock in socks:
            response = ResponseReader(sock).read(timeout=10)
            assert response is not None and response.status == 200 and response.body == b"asset"
    finally:
        app.release.set()
        for sock in socks:
            sock.close()
        server.shutdown(timeout=2)
    assert wait_until(lambda: len(seen) >= 4, 5)
    assert sorted(seen) == [(200, None)] * 4


def test_the_observer_sees_refusals_with_their_code() -> None:
    seen: list[tuple[int, str | None, float]] = []
    server = Server(App(), limits=ServerLimits.for_profile("edge"),
                    observer=lambda status, code, seconds: seen.append((status, code, seconds)))
    server.start()
    try:
        exchange(server.address, request_bytes("GET", "/deny"))
        exchange(server.address, b"GARBAGE\r\n\r\n")
    finally:
        server.shutdown(timeout=2)
    assert (401, "authentication_required") in [(s, c) for s, c, _ in seen]
    assert (400, None) in [(s, c) for s, c, _ in seen]
    assert all(seconds >= 0 for _, _, seconds in seen)


def test_a_failing_observer_never_fails_a_request() -> None:
    def broken(status: int, code: str | None, seconds: float) -> None:
        raise RuntimeError("metrics broke")

    server = Server(App(), limits=ServerLimits.for_profile("edge"), observer=broken)
    server.start()
    try:
        response = exchange(server.address, request_bytes("GET", "/ok"))
        assert response is not None and response.status == 200
    finally:
        server.shutdown(timeout=2)
