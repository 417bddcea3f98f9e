"""Transport guarantees of the real Local API (edge profile): unread bodies, threads, slowloris."""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from qinglong_edge.local.server import ServerLimits
from tests.local.test_server import _open_many
from tests.support.http_client import ResponseReader, exchange, request_bytes
from tests.support.local_api import CANCEL_PATH, LocalApiServer, local_api
from tests.support.store import AUTHORIZATION
from tests.support.wait import wait_until

LIST = "/api/v3/projects/default/runs?limit=1"


@pytest.fixture
def api(tmp_path: pathlib.Path) -> Iterator[LocalApiServer]:
    with local_api(tmp_path) as server:
        yield server


def test_unauthenticated_10_mib_post_is_401_after_reading_only_the_head(api: LocalApiServer) -> None:
    size = 10 * 1024 * 1024
    head = request_bytes("POST", CANCEL_PATH, headers=[("Content-Type", "application/json"), ("Content-Length", str(size))])
    with socket.create_connection(api.address) as sock:
        sock.sendall(head)
        sent = [0]

        def pump() -> None:
            chunk = b"x" * 65536
            with contextlib.suppress(OSError):
                while sent[0] < size:
                    sent[0] += sock.send(chunk)

        sender = threading.Thread(target=pump, daemon=True)
        sender.start()
        reader = ResponseReader(sock)
        response = reader.read()
        assert response is not None
        assert (response.status, response.json(), response.closes) == (401, {"code": "authentication_required"}, True)
        assert reader.closed_by_server()
        sock.shutdown(socket.SHUT_RDWR)
        sender.join(5)
    # the server consumed the head and not one byte of the body
    assert api.server.bytes_received == len(head)
    assert [row[4] for row in api.audit_rows()] == ["authentication_rejected"]
    assert api.next_request_served()


def test_authorized_oversize_declared_body_is_413_without_reading(api: LocalApiServer) -> None:
    head = request_bytes("POST", CANCEL_PATH, headers=[
        ("Authorization", AUTHORIZATION), ("Content-Type", "application/json"), ("Content-Length", "10485760")])
    response = exchange(api.address, head + b"{" * 4096)
    assert response is not None and response.status == 413 and response.closes
    assert api.server.bytes_received == len(head)


def test_100_concurrent_connections_stay_within_the_thread_budget(api: LocalApiServer) -> None:
    # Everything but the server's own threads already exists (this thread, the store thread).
    before = threading.active_count()
    ceiling = before + api.server.thread_count
    assert api.server.thread_count == 1 + 4  # poll thread + edge pool
    payload = request_bytes("GET", LIST, headers=[("Authorization", AUTHORIZATION), ("Connection", "close")])
    statuses, peak = _open_many(api.address, 100, payload, ceiling)
    assert sum(statuses.values()) == 100
    # b"": connected but not yet sending at the connection cap, closed to accept a newer one.
    assert set(statuses) <= {b"HTTP/1.1 200 OK", b"HTTP/1.1 503 Service Unavailable", b""}, statuses
    assert statuses.get(b"", 0) <= api.server.evicted_connections
    assert peak <= ceiling
    assert len(os.listdir("/proc/self/task")) <= ceiling
    assert api.next_request_served()


def test_slowloris_connections_never_keep_a_ninth_client_waiting(tmp_path: pathlib.Path) -> None:
    """8 connections (the edge cap) drip one header byte every 0.2 s, with a head
    deadline of 60 s so that no deadline can free a connection during the test: a
    ninth client is accepted at once, the oldest dripping connection being closed to
    make room, and is answered 200."""
    limits = ServerLimits(max_in_flight=4, max_connections=8, drain_timeout_s=2.0, head_timeout_s=60.0,
                          keep_alive_timeout_s=60.0)
    drip_bytes = request_bytes("GET", LIST, headers=[("Authorization", AUTHORIZATION)])
    with local_api(tmp_path, limits=limits) as api:
        slow = [socket.create_connection(api.address) for _ in range(8)]
        stop = threading.Event()

        def drip() -> None:
            for index in range(len(drip_bytes)):
                for sock in slow:
                    with contextlib.suppress(OSError):
                        sock.send(drip_bytes[index : index + 1])
                if stop.wait(0.2):
                    return

        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()
        try:
            wait_until(lambda: api.server.connection_count == 8, 10, interval=0.05, what="8 dripping connections")
            response = exchange(api.address, drip_bytes, timeout=15)
            assert response is not None and response.status == 200
            assert api.server.evicted_connections == 1
            # The first connection (the oldest waiting one) was the one closed.
            assert ResponseReader(slow[0]).closed_by_server(timeout=5)
        finally:
            stop.set()
            for sock in slow:
                sock.close()
            dripper.join(3)


def test_a_head_must_be_complete_within_the_head_timeout_of_the_wait(tmp_path: pathlib.Path) -> None:
    """The head deadline runs from the start of the wait (the accept, or the end of the
    previous response), not from the first byte: a keep-alive connection that stays
    silent past ``head_timeout_s`` (its idle timeout being longer) and then sends a whole
    head at once gets 408, not an answer."""
    limits = ServerLimits(max_in_flight=4, max_connections=8, drain_timeout_s=2.0, head_timeout_s=0.3,
                          keep_alive_timeout_s=30.0)
    request = request_bytes("GET", LIST, headers=[("Authorization", AUTHORIZATION)])
    with local_api(tmp_path, limits=limits) as api, socket.create_connection(api.address) as sock:
        sock.sendall(request)
        reader = ResponseReader(sock)
        first = reader.read()
        assert first is not None and first.status == 200 and not first.closes
        time.sleep(0.6)  # the scenario: twice the head timeout passes on the idle connection
        sock.sendall(request)
        late = reader.read()
        assert late is not None and late.status == 408
