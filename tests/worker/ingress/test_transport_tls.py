"""Certificate, TLS-version and peer faults against real servers on loopback.

offer-delivery.md 1.2 (TLS 1.3 only, only the configured anchors, host name checked,
SNI only for host names, mutual TLS) and 1.5 (timeouts). Every fault must fail closed
with ``request_rejected``, within the timeout (1 000 ms here; the trickle case within
the documented hard deadline of 2 x the timeout), without the server seeing a request.
"""

from __future__ import annotations

import time

import pytest

from qinglong_edge.errors import TransportError
from qinglong_edge.worker.ingress.material import build_context, load_material
from qinglong_edge.worker.ingress.transport import DEADLINE_FACTOR, IngressTransport
from tests.support.tls_server import (
    Close,
    Hang,
    OpenSSLServer,
    PlainHTTPServer,
    Request,
    SilentPeer,
    TLSServer,
    Trickle,
    TricklePeer,
    UnacceptingPeer,
    cert_path,
    http_response,
    legacy_tls_server,
    probe_tls_version,
)
from tests.support.transport_env import (
    OFFER_BODY,
    OFFER_CAP,
    OFFER_PATH,
    WorkerFiles,
    expect_error,
)

pytestmark = pytest.mark.usefixtures("no_leaks")

TIMEOUT_MS = 1000
TIMEOUT_S = TIMEOUT_MS / 1000
#: Scheduling slack on a loaded CI machine; a fault must never take longer than this
#: beyond its bound.
SLACK_S = 0.9
#: How a TLS 1.3 refusal of our client certificate shows: the alert is read with the
#: response head, or (when it races the request) the send fails on the closed session.
REFUSED_REASONS = ("TLS error", "reset", "Broken pipe")


def fail(files: WorkerFiles, origin: str, *, bound_s: float = TIMEOUT_S) -> tuple[TransportError, float]:
    """One offer POST that must fail with request_rejected within ``bound_s`` (+ slack)."""
    with files.transport(origin, timeout_ms=TIMEOUT_MS) as transport:
        started = time.monotonic()
        error = expect_error("request_rejected", transport.post_json, OFFER_PATH, OFFER_BODY,
                             max_response_bytes=OFFER_CAP)
        elapsed = time.monotonic() - started
    assert elapsed < bound_s + SLACK_S, f"took {elapsed:.2f}s"
    assert error.http_status is None
    return error, elapsed


def test_valid_server_with_host_name_sends_sni(files: WorkerFiles) -> None:
    with TLSServer() as server, files.transport(server.origin()) as transport:
        response = transport.post_json(OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP)
    assert response.body == b'{"ok":true}'
    assert server.sni == ["localhost"]


def test_ip_literal_origin_sends_no_sni_and_checks_the_ip_san(files: WorkerFiles) -> None:
    with TLSServer() as server, files.transport(server.origin("127.0.0.1")) as transport:
        transport.post_json(OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP)
    assert server.sni == [None]
    assert server.requests[0].header("host") == f"127.0.0.1:{server.port}"


@pytest.mark.parametrize(
    ("identity", "certificate", "reason"),
    [
        ("server-expired", None, "certificate has expired"),
        ("server-not-yet-valid", None, "certificate is not yet valid"),
        ("server-wrong-host", None, "Hostname mismatch"),
        ("server-self-signed", None, "self-signed certificate"),
        ("server-untrusted-root", None, "unable to get local issuer certificate"),
        ("server", "server-leaf-only.pem", "unable to get local issuer certificate"),
        ("server-no-server-auth", None, "certificate purpose"),
        ("server-issuer-not-ca", None, "certificate"),
        ("server-rsa1024", None, "key too weak"),
    ],
    ids=["expired", "not-yet-valid", "wrong-host", "self-signed", "untrusted-root", "incomplete-chain",
         "leaf-without-server-auth", "issuer-not-a-ca", "rsa-1024"],
)
def test_rejects_server_certificate(files: WorkerFiles, identity: str, certificate: str | None, reason: str) -> None:
    with TLSServer(identity=identity, certificate=certificate) as server:
        error, _ = fail(files, server.origin())
        assert server.requests == []
    assert "certificate verify failed" in str(error)
    assert reason in str(error)


def test_rejects_issuer_that_is_not_a_ca_for_the_right_reason(files: WorkerFiles) -> None:
    with TLSServer(identity="server-issuer-not-ca") as server:
        error, _ = fail(files, server.origin())
    assert any(reason in str(error) for reason in ("invalid CA certificate", "certificate purpose"))


def test_rejects_wrong_ip(files: WorkerFiles) -> None:
    with TLSServer(identity="server-wrong-host") as server:
        error, _ = fail(files, server.origin("127.0.0.1"))
    assert "IP address mismatch" in str(error)


def test_trusts_only_the_configured_anchors(files: WorkerFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    # Even if the environment points OpenSSL's default store at the rogue CA, it is not used.
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_path("rogue-ca.pem")))
    monkeypatch.setenv("SSL_CERT_DIR", str(cert_path("rogue-ca.pem").parent))
    with TLSServer(identity="server-untrusted-root") as server:
        fail(files, server.origin())
    files.set_anchor("client-ca")
    with TLSServer() as server:
        error, _ = fail(files, server.origin())
    assert "unable to get local issuer certificate" in str(error)


def test_any_configured_anchor_is_trusted(files: WorkerFiles) -> None:
    files.set_anchor("client-ca", "rogue-ca")
    with TLSServer(identity="server-untrusted-root") as server, files.transport(server.origin()) as transport:
        assert transport.post_json(OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP).status == 200


def test_context_holds_only_the_anchors_and_tls_1_3(files: WorkerFiles) -> None:
    import ssl

    files.set_anchor("root-ca", "rogue-ca")
    material = load_material(str(files.credential), str(files.certificate), str(files.key), files.anchor_paths)
    context = build_context(material, str(files.certificate), str(files.key))
    subjects = sorted(dict(item[0] for item in cert["subject"])["commonName"] for cert in context.get_ca_certs())
    assert subjects == ["qinglong-edge rogue root CA", "qinglong-edge test root CA"]
    assert context.minimum_version == context.maximum_version == ssl.TLSVersion.TLSv1_3
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    assert context.security_level == 2


@pytest.mark.parametrize("version", ["1.2", "1.1", "1.0"])
def test_rejects_old_tls_in_process_server(files: WorkerFiles, version: str) -> None:
    try:
        with legacy_tls_server(version) as server:
            error, _ = fail(files, server.origin())
            assert server.requests == []
    except RuntimeError as exc:
        pytest.skip(str(exc))
    assert "TLS error" in str(error)


@pytest.mark.parametrize(
    ("version", "flag"), [("1.2", "-tls1_2"), ("1.1", "-tls1_1"), ("1.0", "-tls1")], ids=["1.2", "1.1", "1.0"],
)
def test_rejects_old_tls_openssl_s_server(files: WorkerFiles, version: str, flag: str) -> None:
    with OpenSSLServer([flag, "-cipher", "DEFAULT@SECLEVEL=0"]) as server:
        if probe_tls_version(server.port, version) is None:
            pytest.skip(f"openssl s_server cannot speak TLS {version} on this system")
        error, _ = fail(files, server.origin())
    assert "TLS error" in str(error)


def test_openssl_s_server_tls_1_3_handshake_succeeds(files: WorkerFiles) -> None:
    """Another TLS stack: the handshake and both verifications pass. s_server -www does
    not answer a POST (it waits for a GET), so the call fails while reading the head:
    the stage in the message proves the handshake completed and the request was sent."""
    with OpenSSLServer(["-tls1_3", "-www", "-Verify", "1", "-verify_return_error",
                        "-CAfile", str(cert_path("client-ca.pem"))]) as server:
        error, _ = fail(files, server.origin())
    assert "read response head" in str(error)


def test_rejects_client_certificate_refused_by_openssl_s_server(files: WorkerFiles) -> None:
    with OpenSSLServer(["-tls1_3", "-www", "-Verify", "1", "-verify_return_error",
                        "-CAfile", str(cert_path("rogue-ca.pem"))]) as server:
        error, elapsed = fail(files, server.origin())
    assert any(reason in str(error) for reason in REFUSED_REASONS), str(error)
    assert elapsed < TIMEOUT_S * 0.8, "a refused certificate must fail at once, not at the timeout"


@pytest.mark.parametrize(
    ("client_ca", "client_identity"), [("rogue-ca", "client"), ("client-ca", "client-rogue")],
    ids=["server-requires-another-ca", "client-cert-from-another-ca"],
)
def test_rejects_refused_client_certificate(files: WorkerFiles, client_ca: str, client_identity: str) -> None:
    """TLS 1.3: the client's handshake completes before the server checks the client
    certificate; the refusal (an alert) only shows when the response is read."""
    files.install_client(client_identity)
    with TLSServer(client_ca=client_ca) as server:
        error, elapsed = fail(files, server.origin())
        assert server.wait_for(lambda: len(server.handshake_errors) == 1)
        assert server.requests == [] and server.handshakes == 0
    assert elapsed < TIMEOUT_S * 0.8
    assert any(reason in str(error) for reason in REFUSED_REASONS), str(error)


def test_rejects_plaintext_server_on_the_port(files: WorkerFiles) -> None:
    with PlainHTTPServer() as server:
        error, elapsed = fail(files, server.origin())
    assert "TLS error" in str(error) and elapsed < TIMEOUT_S * 0.8


def test_rejects_connect_that_never_completes_at_the_timeout(files: WorkerFiles) -> None:
    with UnacceptingPeer() as peer:
        if not peer.connect_blocks():
            pytest.skip("this kernel answers SYNs to a full accept queue")
        error, elapsed = fail(files, peer.origin())
    assert "connect: timed out" in str(error)
    assert elapsed >= TIMEOUT_S * 0.9


def test_rejects_silent_peer_at_the_timeout(files: WorkerFiles) -> None:
    with SilentPeer() as server:
        error, elapsed = fail(files, server.origin())
        assert server.wait_for(lambda: server.peer_closed == 1), "the client must close the socket"
    assert "TLS handshake: timed out" in str(error)
    assert elapsed >= TIMEOUT_S * 0.9


def test_rejects_trickling_peer_before_tls(files: WorkerFiles) -> None:
    with TricklePeer(interval_s=0.3) as server:
        error, elapsed = fail(files, server.origin())
    assert "TLS handshake" in str(error)
    assert elapsed >= TIMEOUT_S * 0.9


def test_rejects_response_trickled_one_byte_per_second_at_the_hard_deadline(files: WorkerFiles) -> None:
    """One byte a second never trips a 1.5 s inactivity timeout: the hard deadline
    (DEADLINE_FACTOR x the timeout) ends the call."""
    trickle = Trickle(http_response(body=b'{"ok":true}' + b" " * 100), interval_s=1.0)
    timeout_ms = 1500
    bound = timeout_ms / 1000 * DEADLINE_FACTOR
    with TLSServer(lambda request: trickle) as server, files.transport(server.origin(), timeout_ms=timeout_ms) as t:
        started = time.monotonic()
        error = expect_error("request_rejected", t.post_json, OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP)
        elapsed = time.monotonic() - started
        assert server.wait_for(lambda: server.requests != [])
    assert "deadline" in str(error)
    assert bound * 0.95 <= elapsed < bound + SLACK_S


def test_rejects_server_that_never_answers(files: WorkerFiles) -> None:
    with TLSServer(lambda request: Hang()) as server:
        error, elapsed = fail(files, server.origin())
        assert server.wait_for(lambda: server.peer_closed == 1)
    assert "timed out" in str(error) and elapsed >= TIMEOUT_S * 0.9


def test_rejects_connection_closed_without_answer(files: WorkerFiles) -> None:
    with TLSServer(lambda request: Close()) as server:
        error, elapsed = fail(files, server.origin())
    assert "closed" in str(error) and elapsed < TIMEOUT_S * 0.8


def test_rejects_refused_connection(files: WorkerFiles) -> None:
    server = SilentPeer()
    port = server.port
    server.stop()
    error, _ = fail(files, f"https://127.0.0.1:{port}")
    assert "refused" in str(error).lower()


def test_request_after_fault_opens_a_new_connection(files: WorkerFiles) -> None:
    calls: list[Request] = []

    def first_hangs_then_answers(request: Request) -> bytes | Hang:
        calls.append(request)
        return Hang() if len(calls) == 1 else http_response()

    with TLSServer(first_hangs_then_answers) as server, files.transport(server.origin()) as transport:
        expect_error("request_rejected", transport.post_json, OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP)
        assert transport.post_json(OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP).status == 200
    assert [request.connection for request in calls] == [1, 2]


def test_transport_type_is_a_connection_error(files: WorkerFiles) -> None:
    with SilentPeer() as server, IngressTransport(server.origin(), credential_file=str(files.credential),
                                                  certificate_file=str(files.certificate),
                                                  private_key_file=str(files.key),
                                                  trust_anchor_files=files.anchor_paths,
                                                  request_timeout_ms=TIMEOUT_MS) as transport:
        with pytest.raises(ConnectionError):
            transport.post_json(OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP)
