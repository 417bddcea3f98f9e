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

from tests.local.test_server import _open_many
from tests.support.http_client import ResponseReader, exchange, request_bytes
from tests.support.local_api import CANCEL_PATH, LocalApiServer, local_api
from tests.support.store import AUTHORIZATION

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
    assert set(statuses) <= {b"HTTP/1.1 200 OK", b"HTTP/1.1 503 Service Unavailable"}, statuses
    assert peak <= ceiling
    assert len(os.listdir("/proc/self/task")) <= ceiling
    assert api.next_request_served()


@pytest.mark.slow
def test_slowloris_does_not_stop_a_ninth_client(api: LocalApiServer) -> None:
    """8 connections (the edge cap) send one byte a second; their head deadline (5 s
    from the first byte) frees the slots, and a ninth client waiting in the listen
    backlog is served within that timeout."""
    drip_bytes = request_bytes("GET", LIST, headers=[("Authorization", AUTHORIZATION)])
    slow = [socket.create_connection(api.address) for _ in range(8)]
    stop = threading.Event()

    def drip() -> None:
        for index in range(len(drip_bytes)):
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.send(drip_bytes[index : index + 1])
            if stop.wait(1.0):
                return

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    try:
        time.sleep(0.5)
        started = time.monotonic()
        response = exchange(api.address, drip_bytes, timeout=15)
        elapsed = time.monotonic() - started
        assert response is not None and response.status == 200
        assert elapsed < 5.0 + 1.5, elapsed
        for sock in slow:
            late = ResponseReader(sock).read(timeout=3)
            assert late is not None and late.status == 408
    finally:
        stop.set()
        for sock in slow:
            sock.close()
        dripper.join(3)
