"""Every typed transport reason, proven against a real peer (issue 18 item 1).

Each case makes a real fault -- a real server with a committed certificate (
tests/support/make_certs.py), ``openssl s_server``, a raw socket peer, a refused port,
an unresolvable name -- and checks the reason, its remedy, ``reached_cluster`` (the
attempt-budget rule of the spec README's offer delivery decisions) and that the
reason reaches ``str(error)`` (the log line). ``test_every_reason_the_issue_names_is_proven``
checks that the cases below cover the issue's list.
"""

from __future__ import annotations

import contextlib
import pathlib
import socket
import ssl
import threading

import pytest

from qinglong_edge.errors import TRANSPORT_REASONS, TransportError, transport_remedy
from tests.support.tls_server import (
    CERTS,
    Close,
    Hang,
    OpenSSLServer,
    PlainHTTPServer,
    SilentPeer,
    TLSServer,
    UnacceptingPeer,
    cert_path,
    http_response,
    legacy_tls_server,
    probe_tls_version,
)
from tests.support.transport_env import OFFER_BODY, OFFER_CAP, OFFER_PATH, WorkerFiles

pytestmark = pytest.mark.usefixtures("no_leaks")

TIMEOUT_MS = 1000
ARTIFACT_PATH = OFFER_PATH.replace("/offers", "/artifacts")

#: The reasons issue 18 names; each must be produced by a real peer below.
ISSUE_REASONS = {
    "dns_failure", "connection_refused", "connect_timeout", "tls_handshake_timeout", "read_timeout",
    "certificate_expired", "certificate_not_yet_valid", "hostname_mismatch", "untrusted_issuer",
    "weak_certificate", "protocol_version", "plaintext_peer", "client_certificate_rejected", "unexpected_status",
}
PROVEN: set[str] = set()


def reason_of(files: WorkerFiles, origin: str, reason: str, *, reached: bool, timeout_ms: int = TIMEOUT_MS,
              http_status: int | None = None) -> TransportError:
    """One offer POST to ``origin`` must fail with ``reason``."""
    with files.transport(origin, timeout_ms=timeout_ms) as transport:
        with pytest.raises(TransportError) as info:
            transport.post_json(OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP)
    return check(info.value, reason, reached=reached, http_status=http_status)


def check(error: TransportError, reason: str, *, reached: bool, http_status: int | None = None) -> TransportError:
    assert error.reason == reason, f"expected {reason}, got {error.reason}: {error}"
    assert error.reached_cluster is reached
    assert error.http_status == http_status
    assert error.remedy and error.remedy == transport_remedy(reason, http_status)
    assert reason in str(error)  # the log line names it
    PROVEN.add(reason)
    return error


# -- before TCP, TCP ---------------------------------------------------------------------


def test_dns_failure(files: WorkerFiles) -> None:
    # RFC 6761: names under .invalid never resolve.
    error = reason_of(files, "https://qinglong-edge-test.invalid:7443", "dns_failure", reached=False)
    assert str(error).startswith("request_rejected (dns_failure): resolve:")


def test_connection_refused(files: WorkerFiles) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: the kernel answers RST
        reason_of(files, f"https://127.0.0.1:{port}", "connection_refused", reached=False)


def test_connect_timeout(files: WorkerFiles) -> None:
    with UnacceptingPeer() as peer:
        if not peer.connect_blocks():
            pytest.skip("this kernel answers SYNs to a full accept queue")
        reason_of(files, peer.origin(), "connect_timeout", reached=False)


# -- the handshake ------------------------------------------------------------------------


def test_silent_peer_is_a_handshake_timeout(files: WorkerFiles) -> None:
    with SilentPeer() as peer:
        reason_of(files, peer.origin(), "tls_handshake_timeout", reached=False)


@pytest.mark.parametrize(
    ("identity", "certificate", "reason"),
    [
        ("server-expired", None, "certificate_expired"),
        ("server-not-yet-valid", None, "certificate_not_yet_valid"),
        ("server-wrong-host", None, "hostname_mismatch"),
        ("server-self-signed", None, "untrusted_issuer"),
        ("server-untrusted-root", None, "untrusted_issuer"),
        ("server", "server-leaf-only.pem", "untrusted_issuer"),
        ("server-issuer-not-ca", None, "untrusted_issuer"),
        ("server-rsa1024", None, "weak_certificate"),
        ("server-no-server-auth", None, "certificate_rejected"),
    ],
    ids=["expired", "not-yet-valid", "wrong-host", "self-signed", "untrusted-root", "incomplete-chain",
         "issuer-not-a-ca", "rsa-1024", "no-server-auth"],
)
def test_server_certificate_reasons(files: WorkerFiles, identity: str, certificate: str | None, reason: str) -> None:
    with TLSServer(identity=identity, certificate=certificate) as server:
        reason_of(files, server.origin(), reason, reached=False)
        assert server.requests == []


def test_wrong_ip_is_a_hostname_mismatch(files: WorkerFiles) -> None:
    with TLSServer(identity="server-wrong-host") as server:
        reason_of(files, server.origin("127.0.0.1"), "hostname_mismatch", reached=False)


def test_tls_1_2_only_python_server_is_protocol_version(files: WorkerFiles) -> None:
    try:
        with legacy_tls_server("1.2") as server:
            reason_of(files, server.origin(), "protocol_version", reached=False)
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize(("version", "flag"), [("1.2", "-tls1_2"), ("1.0", "-tls1")], ids=["1.2", "1.0"])
def test_old_tls_openssl_s_server_is_protocol_version(files: WorkerFiles, version: str, flag: str) -> None:
    with OpenSSLServer([flag, "-cipher", "DEFAULT@SECLEVEL=0"]) as server:
        if probe_tls_version(server.port, version) is None:
            pytest.skip(f"openssl s_server cannot speak TLS {version} on this system")
        reason_of(files, server.origin(), "protocol_version", reached=False)


def test_plaintext_http_server_is_plaintext_peer(files: WorkerFiles) -> None:
    with PlainHTTPServer() as server:
        reason_of(files, server.origin(), "plaintext_peer", reached=False)


def test_peer_closing_during_the_handshake(files: WorkerFiles) -> None:
    class Hangup(SilentPeer):
        def _serve(self, conn: socket.socket, index: int) -> None:
            conn.recv(1)  # the ClientHello's first byte, then close

    with Hangup() as peer:
        reason_of(files, peer.origin(), "tls_handshake_failed", reached=False)


# -- the client certificate: TLS 1.3 refuses it after the client's handshake -------------


@pytest.mark.parametrize("attempt", range(4))
@pytest.mark.parametrize(
    ("client_ca", "client_identity"), [("rogue-ca", "client"), ("client-ca", "client-rogue")],
    ids=["server-requires-another-ca", "client-cert-from-another-ca"],
)
def test_client_certificate_rejected(files: WorkerFiles, client_ca: str, client_identity: str, attempt: int) -> None:
    """Repeated: the alert either arrives before our request is written (read path) or
    after (the send fails, then the alert is read): both are the same reason."""
    files.install_client(client_identity)
    with TLSServer(client_ca=client_ca) as server:
        reason_of(files, server.origin(), "client_certificate_rejected", reached=False)
        assert server.requests == []


def test_client_certificate_rejected_by_openssl_s_server(files: WorkerFiles) -> None:
    with OpenSSLServer(["-tls1_3", "-www", "-Verify", "1", "-verify_return_error",
                        "-CAfile", str(cert_path("rogue-ca.pem"))]) as server:
        error = reason_of(files, server.origin(), "client_certificate_rejected", reached=False)
    assert "ALERT" in str(error)


def test_expired_client_certificate_rejected_by_openssl_s_server(files: WorkerFiles) -> None:
    """A server that trusts our certificate's CA but refuses the certificate itself
    (expired, and not a clientAuth one): still the client-certificate reason."""
    files.replace(files.certificate, cert_path("server-expired.pem").read_bytes())
    files.replace(files.key, cert_path("server-expired.key").read_bytes())
    with OpenSSLServer(["-tls1_3", "-www", "-Verify", "1", "-verify_return_error",
                        "-CAfile", str(cert_path("root-ca.pem"))]) as server:
        reason_of(files, server.origin(), "client_certificate_rejected", reached=False)


# -- after the request was sent ----------------------------------------------------------


def test_server_that_never_answers_is_a_read_timeout(files: WorkerFiles) -> None:
    with TLSServer(lambda request: Hang()) as server:
        reason_of(files, server.origin(), "read_timeout", reached=True)
        assert len(server.requests) == 1


def test_server_closing_without_answer_is_connection_closed(files: WorkerFiles) -> None:
    with TLSServer(lambda request: Close()) as server:
        reason_of(files, server.origin(), "connection_closed", reached=True)


@pytest.mark.parametrize(
    ("status", "body", "cluster_code", "retry"),
    [
        (409, b'{"code":"worker_offer_fenced"}', "worker_offer_fenced", None),
        (409, b'{"code":"claim_in_progress"}', "claim_in_progress", None),
        (503, b'{"code":"tls_context_reloaded"}', "tls_context_reloaded", 5000),
        (401, b'{"code":"worker_authentication_required"}', "worker_authentication_required", None),
        (500, b'{"code":"internal_error","extra":1}', None, None),  # not exactly {"code"}: dropped
        (502, b"<html>bad gateway</html>", None, None),
        (404, b'{"code":"Not A Code!"}', None, None),
    ],
)
def test_non_200_is_unexpected_status_with_the_cluster_code(
    files: WorkerFiles, status: int, body: bytes, cluster_code: str | None, retry: int | None
) -> None:
    headers = (("Retry-After", "5"),) if retry else ()
    answer = http_response(status, body, headers=headers)
    with TLSServer(lambda request: answer) as server:
        error = reason_of(files, server.origin(), "unexpected_status", reached=True, http_status=status)
    assert error.code == "response_rejected"
    assert error.cluster_code == cluster_code
    assert error.retry_after_ms == retry
    assert "html" not in str(error) and "bad gateway" not in repr(vars(error))  # never the body


def test_status_remedies_differ_by_class(files: WorkerFiles) -> None:
    assert "credential" in transport_remedy("unexpected_status", 401)
    assert "Retry-After" in transport_remedy("unexpected_status", 503)
    assert "5xx" in transport_remedy("unexpected_status", 502)
    assert transport_remedy("unexpected_status", 299) == TRANSPORT_REASONS["unexpected_status"][0]


def test_malformed_response(files: WorkerFiles) -> None:
    answer = http_response(200, b'{"ok":true}', content_type="text/html")
    with TLSServer(lambda request: answer) as server:
        reason_of(files, server.origin(), "malformed_response", reached=True, http_status=200)


def test_response_too_large(files: WorkerFiles) -> None:
    answer = http_response(200, b"[" + b"1," * 70_000 + b"1]")
    with TLSServer(lambda request: answer) as server:
        error = reason_of(files, server.origin(), "malformed_response", reached=True, http_status=200)
    assert "content-length over" in str(error)
    chunked = http_response(200, b"", content_length=False, headers=(("Transfer-Encoding", "chunked"),))
    chunked += b"20000\r\n" + b" " * 0x20000 + b"\r\n0\r\n\r\n"
    with TLSServer(lambda request: chunked) as server, files.transport(server.origin()) as transport:
        with pytest.raises(TransportError) as info:
            transport.post_json(OFFER_PATH, OFFER_BODY, max_response_bytes=1000)
    check(info.value, "response_too_large", reached=True, http_status=200)


def test_stream_to_a_server_that_stops_reading_is_a_send_timeout(files: WorkerFiles, tmp_path: pathlib.Path) -> None:
    """A TLS peer that completes the handshake and then reads nothing: the upload's
    sends block once the socket buffers are full."""
    source = tmp_path / "big.log"
    with source.open("wb") as handle:
        handle.truncate(32 * 1024 * 1024)  # sparse: zeros, no disk
    with _StalledReader() as peer, files.transport(peer.origin(), timeout_ms=TIMEOUT_MS) as transport:
        with source.open("rb") as handle, pytest.raises(TransportError) as info:
            transport.post_stream(ARTIFACT_PATH, b"\x00\x00\x00\x02{}", handle, 32 * 1024 * 1024,
                                  max_response_bytes=4096)
    check(info.value, "send_timeout", reached=True)


class _StalledReader:
    """TLS 1.3 server (valid certificate) that never reads after the handshake; its
    receive buffer is shrunk so a sender stalls after a few KiB."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.port = self.listener.getsockname()[1]
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_3
        self.context.load_cert_chain(CERTS / "server.pem", CERTS / "server.key")
        self.context.verify_mode = ssl.CERT_REQUIRED
        self.context.load_verify_locations(CERTS / "client-ca.pem")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def origin(self) -> str:
        return f"https://localhost:{self.port}"

    def __enter__(self) -> _StalledReader:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(timeout=10)

    def _run(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(10)
            with contextlib.suppress(OSError), self.context.wrap_socket(conn, server_side=True):
                self.stop.wait(30)


# -- local faults ------------------------------------------------------------------------


def test_unreadable_credential_is_local_and_never_reached(files: WorkerFiles) -> None:
    files.credential.chmod(0o644)
    with TLSServer() as server:
        error = reason_of(files, server.origin(), "credentials_unavailable", reached=False)
        assert server.connections == 0
    assert error.code == "credentials_unavailable"


def test_closed_transport_was_never_reached(files: WorkerFiles) -> None:
    transport = files.transport("https://127.0.0.1:9")
    transport.close()
    with pytest.raises(TransportError) as info:
        transport.post_json(OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP)
    assert (info.value.code, info.value.reason, info.value.reached_cluster) == ("closed", "closed", False)


def test_bad_call_is_an_invalid_request(files: WorkerFiles) -> None:
    with files.transport("https://127.0.0.1:9") as transport, pytest.raises(TransportError) as info:
        transport.post_json(OFFER_PATH, b"[1]", max_response_bytes=OFFER_CAP)
    assert (info.value.code, info.value.reason, info.value.reached_cluster) == (
        "request_rejected", "invalid_request", False)


# -- the table itself ------------------------------------------------------------------------


def test_every_reason_has_a_one_line_remedy() -> None:
    for reason, (remedy, reached) in TRANSPORT_REASONS.items():
        assert remedy and "\n" not in remedy and isinstance(reached, bool), reason


def test_an_error_made_without_a_reason_keeps_its_code_and_is_counted() -> None:
    """Callers (and test doubles) that build a TransportError the old way still work:
    the reason is the code, and an unknown origin counts toward the attempt budget."""
    error = TransportError("down", code="request_rejected")
    assert (error.reason, error.reached_cluster, str(error)) == ("request_rejected", True, "request_rejected: down")
    assert error.remedy == ""
    fenced = TransportError("x", code="response_rejected", http_status=409, reason="unexpected_status")
    assert fenced.remedy == transport_remedy("unexpected_status", 409)


def test_every_reason_the_issue_names_is_proven(request: pytest.FixtureRequest) -> None:
    """Runs last in this file (pytest keeps file order): the cases above proved each."""
    selected = {item.name.split("[")[0] for item in request.session.items if item.fspath == request.node.fspath}
    if len(selected) < 10:
        pytest.skip("only part of this file was selected")
    missing = ISSUE_REASONS - PROVEN
    assert _skipped_only(missing), f"no real peer proved {sorted(missing)}"


def _skipped_only(missing: set[str]) -> bool:
    # connect_timeout and protocol_version are skipped where the kernel or OpenSSL cannot
    # make the fault; anything else missing is a failure.
    return missing <= {"connect_timeout", "protocol_version"}

