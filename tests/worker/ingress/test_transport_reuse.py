"""Connection and TLS-session reuse within one process (issue 15: a renewal every ~10 s
against a cluster that closes idle connections after 5 s).

The context is kept while the material's digest is the same; the newest TLS 1.3 ticket
is offered on the next connection; the material is still re-read for every request,
so a rotation takes effect at once and never rides on an old session.
"""

from __future__ import annotations

import ssl

import pytest

import qinglong_edge.worker.ingress.transport as transport_module
from tests.support.tls_server import Respond, TLSServer, cert_path, http_response
from tests.support.transport_env import OFFER_BODY, OFFER_CAP, OFFER_PATH, WorkerFiles, expect_error

pytestmark = pytest.mark.usefixtures("no_leaks")

#: Every connection ends after one answer (what a renewal every 10 s meets when the
#: cluster closes idle connections after 5 s), so each request needs a new handshake.
CLOSE_AFTER_ANSWER = Respond(http_response(headers=(("Connection", "close"),)), close=True)


def post(transport: transport_module.IngressTransport) -> transport_module.TransportResponse:
    return transport.post_json(OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP)


def test_a_new_connection_resumes_the_session(files: WorkerFiles) -> None:
    with TLSServer(lambda request: CLOSE_AFTER_ANSWER) as server, files.transport(server.origin()) as transport:
        first, second, third = post(transport), post(transport), post(transport)
        assert server.wait_for(lambda: len(server.resumed) == 3)
    assert (first.resumed, second.resumed, third.resumed) == (False, True, True)
    assert server.resumed == [False, True, True]
    assert [r.connection for r in server.requests] == [1, 2, 3]
    assert transport.stats == {"connections": 3, "resumed": 2, "reused": 0}
    assert server.peer_names == ["edge-1"] * 3  # a resumed session keeps the client identity


def test_resumes_after_the_idle_connection_got_too_old(files: WorkerFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_module, "IDLE_REUSE_MAX_S", 0.0)
    with TLSServer() as server, files.transport(server.origin()) as transport:
        post(transport)
        assert post(transport).resumed
    assert server.resumed == [False, True]


def test_keep_alive_still_comes_first(files: WorkerFiles) -> None:
    with TLSServer() as server, files.transport(server.origin()) as transport:
        post(transport)
        post(transport)
    assert transport.stats == {"connections": 1, "resumed": 0, "reused": 1}


def test_new_client_certificate_never_rides_on_the_old_session(files: WorkerFiles) -> None:
    with TLSServer(lambda request: CLOSE_AFTER_ANSWER) as server, files.transport(server.origin()) as transport:
        post(transport)
        files.install_client("client-next")
        assert not post(transport).resumed
        assert post(transport).resumed
    assert server.peer_names == ["edge-1", "edge-1-next", "edge-1-next"]


def test_changed_anchors_verify_the_server_again(files: WorkerFiles) -> None:
    """A resumed handshake skips the server certificate check, so a session must not
    survive the anchors it was verified with: without root-ca the server is refused."""
    with TLSServer(lambda request: CLOSE_AFTER_ANSWER) as server, files.transport(server.origin()) as transport:
        post(transport)
        files.set_anchor("client-ca")
        error = expect_error("request_rejected", post, transport)
    assert error.reason == "untrusted_issuer"


def test_a_rotated_credential_is_read_on_the_resumed_connection(files: WorkerFiles) -> None:
    with TLSServer(lambda request: CLOSE_AFTER_ANSWER) as server, files.transport(server.origin()) as transport:
        post(transport)
        files.rotate_credential()
        assert post(transport).resumed
    assert server.requests[1].header("authorization") == files.authorization


def test_a_server_without_tickets_gets_full_handshakes(files: WorkerFiles) -> None:
    with TLSServer(lambda request: CLOSE_AFTER_ANSWER, num_tickets=0) as server, \
            files.transport(server.origin()) as transport:
        post(transport)
        assert not post(transport).resumed
    assert server.resumed == [False, False]


def test_a_server_with_new_ticket_keys_falls_back_to_a_full_handshake(files: WorkerFiles) -> None:
    """The cluster restarted (new ticket keys): the old ticket is refused, the handshake
    is a full one and verifies the certificate again."""
    with TLSServer(lambda request: CLOSE_AFTER_ANSWER) as server, files.transport(server.origin()) as transport:
        post(transport)
        fresh = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        fresh.minimum_version = ssl.TLSVersion.TLSv1_3
        fresh.load_cert_chain(cert_path("server.pem"), cert_path("server.key"))
        fresh.verify_mode = ssl.CERT_REQUIRED
        fresh.load_verify_locations(cert_path("client-ca.pem"))
        server.context = fresh
        assert not post(transport).resumed
        assert post(transport).resumed
    assert server.resumed == [False, False, True]


def test_a_restarted_server_with_an_expired_certificate_is_refused(files: WorkerFiles) -> None:
    with TLSServer(lambda request: CLOSE_AFTER_ANSWER) as server, files.transport(server.origin()) as transport:
        post(transport)
        replacement = TLSServer(identity="server-expired")
        server.context = replacement.context
        replacement.stop()
        error = expect_error("request_rejected", post, transport)
        assert error.reason == "certificate_expired"
        # The failed handshake dropped the ticket: the next one is full as well.
        assert transport._session is None


def test_tls_context_reloaded_drops_the_ticket(files: WorkerFiles) -> None:
    answers = [CLOSE_AFTER_ANSWER, Respond(http_response(503, b'{"code":"tls_context_reloaded"}',
                                                    headers=(("Connection", "close"),)), close=True),
               CLOSE_AFTER_ANSWER]
    with TLSServer(lambda request: answers.pop(0)) as server, files.transport(server.origin()) as transport:
        post(transport)
        error = expect_error("response_rejected", post, transport)
        assert error.cluster_code == "tls_context_reloaded"
        assert not post(transport).resumed
    assert server.resumed == [False, True, False]
