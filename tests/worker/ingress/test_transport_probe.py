"""``probe_handshake``: a real TLS 1.3 handshake with the configured material and no
request (what ``doctor`` runs), with the same reasons as a request (issue 18 item 1)."""

from __future__ import annotations

import pytest

from qinglong_edge.contracts.x509 import iso_utc
from qinglong_edge.errors import TransportError
from tests.support.tls_server import OpenSSLServer, PlainHTTPServer, SilentPeer, TLSServer, cert_path
from tests.support.transport_env import WorkerFiles

pytestmark = pytest.mark.usefixtures("no_leaks")


def probe_error(files: WorkerFiles, origin: str) -> TransportError:
    with files.transport(origin) as transport, pytest.raises(TransportError) as info:
        transport.probe_handshake()
    return info.value


def test_a_good_cluster_accepts_the_client_certificate_and_gets_no_request(files: WorkerFiles) -> None:
    with TLSServer() as server, files.transport(server.origin()) as transport:
        report = transport.probe_handshake()
        assert server.wait_for(lambda: server.handshakes == 1)
    assert report.tls_version == "TLSv1.3" and report.cipher.startswith("TLS_")
    assert report.client_certificate_accepted is True
    assert report.server_certificate is not None
    assert report.server_certificate.subject == "localhost"
    assert (iso_utc(report.server_certificate.not_before_ms), iso_utc(report.server_certificate.not_after_ms)) == (
        "2025-01-01T00:00:00Z", "2099-12-31T23:59:59Z")
    assert server.requests == []
    assert server.peer_names == ["edge-1"]


def test_openssl_s_server_accepts_the_client_certificate(files: WorkerFiles) -> None:
    with OpenSSLServer(["-tls1_3", "-www", "-Verify", "1", "-verify_return_error",
                        "-CAfile", str(cert_path("client-ca.pem"))]) as server:
        with files.transport(server.origin()) as transport:
            assert transport.probe_handshake().client_certificate_accepted is True


@pytest.mark.parametrize("server_kind", ["python", "openssl"])
def test_a_refused_client_certificate_is_reported(files: WorkerFiles, server_kind: str) -> None:
    if server_kind == "python":
        with TLSServer(client_ca="rogue-ca") as server:
            error = probe_error(files, server.origin())
    else:
        with OpenSSLServer(["-tls1_3", "-www", "-Verify", "1", "-verify_return_error",
                            "-CAfile", str(cert_path("rogue-ca.pem"))]) as server:
            error = probe_error(files, server.origin())
    assert (error.reason, error.reached_cluster) == ("client_certificate_rejected", False)
    assert "worker.certificateFile" in error.remedy


def test_a_server_sending_no_ticket_leaves_acceptance_unconfirmed(files: WorkerFiles) -> None:
    with TLSServer(num_tickets=0) as server, files.transport(server.origin()) as transport:
        report = transport.probe_handshake(confirm_s=0.3)
    assert report.client_certificate_accepted is None


@pytest.mark.parametrize(
    ("identity", "reason"),
    [("server-expired", "certificate_expired"), ("server-wrong-host", "hostname_mismatch"),
     ("server-untrusted-root", "untrusted_issuer")],
)
def test_server_certificate_faults(files: WorkerFiles, identity: str, reason: str) -> None:
    with TLSServer(identity=identity) as server:
        assert probe_error(files, server.origin()).reason == reason


def test_peers_that_are_not_the_cluster(files: WorkerFiles) -> None:
    with PlainHTTPServer() as plain:
        assert probe_error(files, plain.origin()).reason == "plaintext_peer"
    with SilentPeer() as silent:
        assert probe_error(files, silent.origin()).reason == "tls_handshake_timeout"
    assert probe_error(files, "https://qinglong-edge-test.invalid").reason == "dns_failure"


def test_probe_never_resumes(files: WorkerFiles) -> None:
    with TLSServer() as server, files.transport(server.origin()) as transport:
        transport.probe_handshake()
        transport.probe_handshake()
        assert server.wait_for(lambda: len(server.resumed) == 2)
    assert server.resumed == [False, False]
