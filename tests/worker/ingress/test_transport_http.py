"""Request bytes, response acceptance, connections and rotation against a real TLS server.

offer-delivery.md 1.3 (request as the Node worker sends it), 1.5 (one connection, one
idle keep-alive connection), 1.6 (response acceptance), 1.7 (statuses, Retry-After)
and 1.2/1.4 (material and credential re-read for every request).
"""

from __future__ import annotations

import email.utils
import gzip
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

import pytest

from qinglong_edge.errors import TransportError
from qinglong_edge.worker.ingress import transport as transport_module
from qinglong_edge.worker.ingress.transport import IngressTransport
from tests.support.tls_server import Hang, Request, Respond, SilentPeer, TLSServer, cert_path, http_response
from tests.support.transport_env import (
    OFFER_BODY,
    OFFER_CAP,
    OFFER_PATH,
    LeakGuard,
    WorkerFiles,
    expect_error,
)

pytestmark = pytest.mark.usefixtures("no_leaks")

#: A body no error may ever show (section 1.6: only the status is kept).
MARKER = b"BODY-MARKER-must-not-leak"


@pytest.fixture
def no_leaks(no_leaks: LeakGuard) -> Iterator[LeakGuard]:
    """The folder's guard (tests/worker/ingress/conftest.py); no error names the marker either."""
    guard = no_leaks
    yield guard
    for error in guard.errors:
        assert MARKER.decode() not in str(error) and MARKER.decode() not in repr(error.args)


class Script:
    """A handler answering from a list, one entry per request (the last one repeats)."""

    def __init__(self, *answers: bytes | Respond | Hang) -> None:
        self.answers = list(answers)

    def __call__(self, request: Request) -> bytes | Respond | Hang:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


@pytest.fixture
def serve(files: WorkerFiles) -> Iterator[Callable[..., tuple[TLSServer, IngressTransport]]]:
    """``serve(*answers)`` starts a scripted server and a transport to it."""
    opened: list[tuple[TLSServer, IngressTransport]] = []

    def start(*answers: bytes | Respond | Hang, timeout_ms: int = 1000) -> tuple[TLSServer, IngressTransport]:
        server = TLSServer(Script(*answers)).__enter__()
        transport = files.transport(server.origin(), timeout_ms=timeout_ms)
        opened.append((server, transport))
        return server, transport

    yield start
    for server, transport in opened:
        transport.close()
        server.stop()


def post(transport: IngressTransport, cap: int = OFFER_CAP) -> bytes:
    return transport.post_json(OFFER_PATH, OFFER_BODY, max_response_bytes=cap).body


# -- the request ---------------------------------------------------------------------


def test_request_is_byte_for_byte_the_node_workers(files: WorkerFiles, serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    server, transport = serve(http_response())
    post(transport)
    request = server.requests[0]
    assert request.raw_head == (
        f"POST {OFFER_PATH} HTTP/1.1\r\n"
        "accept: application/json\r\n"
        f"authorization: {files.authorization}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(OFFER_BODY)}\r\n"
        f"Host: localhost:{server.port}\r\n"
        "Connection: keep-alive\r\n"
        "\r\n"
    ).encode()
    assert request.body == OFFER_BODY


def test_response_fields(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    _, transport = serve(http_response(body=b'{"status":"idle"}', headers=(("X-Request-Id", "req-1.a:b_c"),)))
    response = transport.post_json(OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP)
    assert (response.status, response.body, response.content_type, response.request_id) == (
        200, b'{"status":"idle"}', "application/json; charset=utf-8", "req-1.a:b_c")
    assert "idle" not in repr(response)


@pytest.mark.parametrize("value", ["has space", "x" * 129, ""], ids=["space", "129", "empty"])
def test_ignores_malformed_request_id(serve: Callable[..., tuple[TLSServer, IngressTransport]], value: str) -> None:
    _, transport = serve(http_response(headers=(("X-Request-Id", value),)))
    assert transport.post_json(OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP).request_id is None


# -- response faults (section 1.6) -----------------------------------------------------


def rejected(serve: Callable[..., tuple[TLSServer, IngressTransport]], answer: bytes, code: str = "response_rejected",
             cap: int = OFFER_CAP) -> tuple[TransportError, TLSServer, IngressTransport]:
    server, transport = serve(answer, http_response())
    error = expect_error(code, transport.post_json, OFFER_PATH, OFFER_BODY, max_response_bytes=cap)
    # Fail closed: the connection is not reused; the next request opens a new one.
    assert post(transport) == b'{"ok":true}'
    assert [r.connection for r in server.requests] == [1, 2]
    return error, server, transport


@pytest.mark.parametrize(
    ("status", "headers"),
    [(201, ()), (204, ()), (302, (("Location", "https://evil.test/api"),)), (401, ()), (403, ()), (404, ()),
     (409, ()), (500, ()), (504, ())],
    ids=["201", "204", "302-location", "401", "403", "404", "409", "500", "504"],
)
def test_rejects_status(serve: Callable[..., tuple[TLSServer, IngressTransport]], status: int,
                        headers: tuple[tuple[str, str], ...]) -> None:
    body = b"" if status == 204 else b'{"code":"' + MARKER + b'"}'
    error, server, _ = rejected(serve, http_response(status, body, headers=headers, content_length=status != 204))
    assert (error.http_status, error.retry_after_ms) == (status, None)
    assert len(server.requests) == 2, "a redirect is never followed"


def test_rejects_503_with_retry_after_seconds(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    answer = http_response(503, b'{"code":"tls_context_reloaded"}', headers=(("Retry-After", "7"),))
    error, _, _ = rejected(serve, answer)
    assert (error.http_status, error.retry_after_ms) == (503, 7000)


def test_rejects_429_with_retry_after_date(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    when = email.utils.formatdate(time.time() + 120, usegmt=True)
    error, _, _ = rejected(serve, http_response(429, b'{"code":"x"}', headers=(("Retry-After", when),)))
    assert error.http_status == 429
    assert error.retry_after_ms is not None and 115_000 <= error.retry_after_ms <= 121_000


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        (http_response(body=MARKER, content_type="text/plain"), "response_rejected"),
        (http_response(body=gzip.compress(b'{"ok":true}'), headers=(("Content-Encoding", "gzip"),)),
         "response_rejected"),
        (http_response(body=b"{" + b" " * 131_071 + b"}"), "response_rejected"),  # Content-Length 131073
        (http_response(body=b'{"a":"12345678"}', headers=(("Content-Length", "12a"),)), "response_rejected"),
        (http_response(body=b'{"a":1}', headers=(("Content-Length", "7"), ("Content-Length", "7"))),
         "response_rejected"),
        (http_response(body=b'{"a":1}', headers=(("Content-Length", "1_0"),)), "response_rejected"),
        (http_response(body=b'{"a":1}' + MARKER, headers=(("Content-Length", "7"),)), "response_too_large"),
        (http_response(body=b"", content_type="application/json"), "response_rejected"),
        (http_response(body=b"{"), "response_rejected"),
        (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Junk\r\nContent-Encoding: gzip\r\n"
         b"Content-Length: 2\r\n\r\n{}", "response_rejected"),
        (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX: " + b"a" * 20_000 + b"\r\n\r\n{}",
         "response_rejected"),
        (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n folded: x\r\nContent-Length: 2\r\n\r\n{}",
         "response_rejected"),
        (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nContent-Length: 2"
         b"\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "response_rejected"),
    ],
    ids=["text-plain", "gzip", "content-length-131073", "content-length-12a", "duplicate-content-length",
         "content-length-underscore", "body-longer-than-content-length", "empty-body", "one-byte-body",
         "header-hidden-after-junk-line", "head-over-16k", "obs-fold", "chunked-and-content-length"],
)
def test_rejects_response(serve: Callable[..., tuple[TLSServer, IngressTransport]], answer: bytes, code: str) -> None:
    error, _, _ = rejected(serve, answer, code)
    # A head too large to parse has no status to report.
    assert error.http_status == (None if b"X: aaaa" in answer else 200)


def chunked_response(*chunks: bytes, tail: bytes = b"") -> bytes:
    head = http_response(body=b"", content_length=False, headers=(("Transfer-Encoding", "chunked"),))
    return head + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n" + tail


def test_accepts_chunked_body_and_reuses_the_connection(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    server, transport = serve(chunked_response(b'{"o', b'k":true}'), http_response())
    assert post(transport) == b'{"ok":true}'
    assert post(transport) == b'{"ok":true}'
    assert [r.connection for r in server.requests] == [1, 1]


def test_rejects_chunked_body_longer_than_the_cap(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    chunks = [b"{" + b" " * 65_535, b" " * 65_536, b" " * 10]  # 131 082 bytes in total
    error, _, _ = rejected(serve, chunked_response(*chunks), "response_too_large")
    assert error.http_status == 200


def test_rejects_endless_chunked_body(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    """A server that keeps sending is cut off at the cap, not read to the end."""
    head = http_response(body=b"", content_length=False, headers=(("Transfer-Encoding", "chunked"),))
    endless = head + b"".join(b"4000\r\n" + b" " * 0x4000 + b"\r\n" for _ in range(64))  # 1 MiB, no last chunk
    rejected(serve, endless, "response_too_large", cap=4096)


def test_rejects_bytes_after_last_chunk(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    rejected(serve, chunked_response(b"{}", tail=b"HTTP/1.1 200 OK\r\n\r\n"), "response_too_large")


def test_accepts_body_of_exactly_the_cap(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    body = b"{" + b" " * 131_070 + b"}"
    _, transport = serve(http_response(body=body))
    assert post(transport) == body


def test_close_delimited_body(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    answer = Respond(http_response(body=b'{"ok":true}', content_length=False), close=True)
    server, transport = serve(answer, answer)
    assert post(transport) == b'{"ok":true}'
    assert post(transport) == b'{"ok":true}'
    assert [r.connection for r in server.requests] == [1, 2]


def test_rejects_close_delimited_body_over_the_cap(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    answer = Respond(http_response(body=b"{" + b" " * 5000 + b"}", content_length=False), close=True)
    rejected(serve, answer, "response_too_large", cap=4096)


def test_rejects_truncated_body(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    answer = Respond(http_response(body=b'{"ok":', headers=(("Content-Length", "11"),)), close=True)
    error, _, _ = rejected(serve, answer)
    assert error.http_status == 200


# -- connections (section 1.5) -----------------------------------------------------------


def test_keeps_one_idle_connection(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    server, transport = serve(http_response())
    for _ in range(3):
        post(transport)
    assert server.connections == 1 and server.handshakes == 1


@pytest.mark.parametrize(
    "answer",
    [http_response(headers=(("Connection", "close"),)), http_response(version="HTTP/1.0")],
    ids=["connection-close", "http-1.0"],
)
def test_does_not_reuse_a_connection_the_server_ends(serve: Callable[..., tuple[TLSServer, IngressTransport]],
                                                     answer: bytes) -> None:
    server, transport = serve(answer)
    post(transport)
    post(transport)
    assert [r.connection for r in server.requests] == [1, 2]
    assert server.wait_for(lambda: server.peer_closed >= 1), "the client closes what it does not keep"


def test_notices_an_idle_connection_the_server_closed(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    server, transport = serve(Respond(http_response(), close=True))
    post(transport)
    assert server.wait_for(lambda: server.server_closed >= 1)  # its close (on loopback) reaches us while idle
    post(transport)  # no failure: the dead idle connection is dropped, not used
    assert [r.connection for r in server.requests] == [1, 2]


def test_does_not_reuse_an_old_idle_connection(serve: Callable[..., tuple[TLSServer, IngressTransport]],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_module, "IDLE_REUSE_MAX_S", 0.05)
    server, transport = serve(http_response())
    post(transport)
    time.sleep(0.1)  # the scenario: the idle connection ages past IDLE_REUSE_MAX_S (the transport's monotonic clock)
    post(transport)
    assert [r.connection for r in server.requests] == [1, 2]


def test_close_drops_the_idle_connection(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    server, transport = serve(http_response())
    post(transport)
    transport.close()
    assert server.wait_for(lambda: server.peer_closed == 1)
    expect_error("closed", transport.post_json, OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP)


def test_close_interrupts_a_call_in_progress(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    server, transport = serve(Hang(), timeout_ms=10_000)
    closer = threading.Timer(0.3, transport.close)
    closer.start()
    started = time.monotonic()
    expect_error("closed", transport.post_json, OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP)
    assert time.monotonic() - started < 3.0
    closer.join()
    assert server.wait_for(lambda: server.peer_closed == 1)


def test_concurrent_calls_share_one_connection(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    server, transport = serve(Respond(http_response(), delay_s=0.05))
    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(post(transport))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [b'{"ok":true}'] * 4
    assert server.connections == 1


class Interrupted(Exception):
    """What a SIGTERM handler of the pull command raises."""


def test_signal_handler_exception_propagates_unchanged(serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    raised = Interrupted("sigalrm")

    def handler(signum: int, frame: FrameType | None) -> None:
        raise raised

    server, transport = serve(Hang(), http_response(), timeout_ms=10_000)
    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        started = time.monotonic()
        with pytest.raises(Interrupted) as info:
            post(transport)
        assert time.monotonic() - started < 3.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert info.value is raised
    assert server.wait_for(lambda: server.peer_closed == 1), "the half-used connection was closed"
    assert post(transport) == b'{"ok":true}'
    assert [r.connection for r in server.requests] == [1, 2]


def test_signal_during_handshake_leaves_nothing_open(files: WorkerFiles) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted("during handshake")

    with SilentPeer() as peer, files.transport(peer.origin(), timeout_ms=10_000) as transport:
        previous = signal.signal(signal.SIGALRM, handler)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(Interrupted):
                post(transport)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert peer.wait_for(lambda: peer.peer_closed == 1)


# -- rotation (sections 1.2, 1.4) ------------------------------------------------------


def test_credential_rotation_takes_effect_on_the_next_request(files: WorkerFiles,
                                                              serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    server, transport = serve(http_response())
    post(transport)
    first = files.authorization
    files.rotate_credential("worker_rotated")
    post(transport)
    assert [r.header("authorization") for r in server.requests] == [first, files.authorization]
    assert first != files.authorization
    assert server.connections == 1, "the credential is not part of the connection's material"


def test_certificate_rotation_opens_a_new_connection(files: WorkerFiles,
                                                     serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    server, transport = serve(http_response())
    post(transport)
    files.install_client("client-next")
    post(transport)
    post(transport)
    assert server.peer_names == ["edge-1", "edge-1-next"]
    assert [r.connection for r in server.requests] == [1, 2, 2]


def test_anchor_change_opens_a_new_connection(files: WorkerFiles,
                                              serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    server, transport = serve(http_response())
    post(transport)
    # Same configured file, new content (the rogue CA added): new material digest.
    files.replace(files.anchor, files.anchor.read_bytes() + cert_path("rogue-ca.pem").read_bytes(), 0o644)
    post(transport)
    post(transport)
    assert [r.connection for r in server.requests] == [1, 2, 2]


def test_rotation_to_a_refused_certificate_fails_the_next_request(files: WorkerFiles,
                                                                  serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    server, transport = serve(http_response())
    post(transport)
    files.install_client("client-rogue")
    expect_error("request_rejected", post, transport)
    files.install_client("client")
    post(transport)
    assert server.peer_names == ["edge-1", "edge-1"]


# -- OpenWrt packaging (packaging.md: python3 split packages) -----------------------------


def test_exchange_under_the_openwrt_split(files: WorkerFiles,
                                          serve: Callable[..., tuple[TLSServer, IngressTransport]]) -> None:
    """A child limited to the modules of our ``Depends:`` line completes a 503 (with an
    HTTP-date Retry-After) and a 200: every import the transport needs is shipped."""
    from tests.support.openwrt_split import run_code_under_split

    when = email.utils.formatdate(time.time() + 60, usegmt=True)
    server, _ = serve(http_response(503, b'{"code":"x"}', headers=(("Retry-After", when),)), http_response())
    code = f"""
from qinglong_edge.errors import TransportError
from qinglong_edge.worker.ingress.transport import IngressTransport
t = IngressTransport({server.origin()!r}, credential_file={str(files.credential)!r},
    certificate_file={str(files.certificate)!r}, private_key_file={str(files.key)!r},
    trust_anchor_files=[{str(files.anchor)!r}], request_timeout_ms=5000)
try:
    t.post_json({OFFER_PATH!r}, {OFFER_BODY!r}, max_response_bytes=4096)
except TransportError as exc:
    print(exc.code, exc.http_status, exc.retry_after_ms is not None and exc.retry_after_ms > 50000)
print(t.post_json({OFFER_PATH!r}, {OFFER_BODY!r}, max_response_bytes=4096).body.decode())
"""
    result = run_code_under_split(code)
    assert (result.status, result.refused) == (0, []), result.stderr
    assert result.stdout.splitlines() == ["response_rejected 503 True", '{"ok":true}']
