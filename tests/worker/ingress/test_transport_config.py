"""IngressTransport construction, call arguments and credential file rules.

Sources: offer-delivery.md 1.1 (origin), 1.2 (material sizes, 1-8 anchors), 1.3 (path,
body 2-4096), 1.4 (credential file), 1.5 (timeout 1 000-60 000). Every rule that refuses
a request is checked against a live server that must then have seen no connection.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from qinglong_edge.config import parse_config
from qinglong_edge.contracts.origin import Origin, parse_origin
from qinglong_edge.errors import TransportError
from qinglong_edge.worker.ingress import material as ingress_material
from qinglong_edge.worker.ingress.transport import IngressTransport, TransportResponse
from tests.support.tls_server import TLSServer, cert_path
from tests.support.transport_env import (
    OFFER_BODY,
    OFFER_CAP,
    OFFER_PATH,
    LeakGuard,
    WorkerFiles,
    expect_error,
    leak_guard,
)

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture(scope="module")
def server() -> Iterator[TLSServer]:
    with TLSServer() as running:
        yield running


def arguments(files: WorkerFiles, **overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "credential_file": str(files.credential),
        "certificate_file": str(files.certificate),
        "private_key_file": str(files.key),
        "trust_anchor_files": [str(files.anchor)],
    }
    values.update(overrides)
    return values


# -- construction ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "origin",
    ["http://cluster.test", "https://user@cluster.test", "https://u:p@cluster.test", "https://cluster.test/api",
     "https://cluster.test/?x=1", "https://cluster.test/#f", "https://cluster.test:0", "https://cluster.test:65536",
     "https://cluster.test:08443", "https://", "cluster.test", "https://clus ter.test", "https://[::1",
     "https://-bad.test", ""],
    ids=["http", "user", "userinfo", "path", "query", "fragment", "port-0", "port-65536", "port-leading-zero",
         "no-host", "no-scheme", "space", "open-bracket", "label-hyphen", "empty"],
)
def test_rejects_origin(files: WorkerFiles, origin: str) -> None:
    error = expect_error("invalid_configuration", IngressTransport, origin, **arguments(files))
    assert "origin" in str(error)


@pytest.mark.parametrize(
    ("origin", "host", "port", "is_ip"),
    [("https://Cluster.Test", "cluster.test", 443, False), ("https://cluster.test:7443/", "cluster.test", 7443, False),
     ("https://127.0.0.1:7443", "127.0.0.1", 7443, True), ("https://[::1]:7443", "::1", 7443, True)],
)
def test_accepts_origin(files: WorkerFiles, origin: str, host: str, port: int, is_ip: bool) -> None:
    transport = IngressTransport(origin, **arguments(files))
    assert (transport.origin.host, transport.origin.port, transport.origin.is_ip) == (host, port, is_ip)


def test_accepts_parsed_origin_and_rejects_forged_one(files: WorkerFiles) -> None:
    parsed = parse_origin("https://cluster.test:7443")
    assert IngressTransport(parsed, **arguments(files)).origin == parsed
    forged = Origin(host="evil test", port=7443, is_ip=False, text="https://cluster.test:7443")
    expect_error("invalid_configuration", IngressTransport, forged, **arguments(files))
    expect_error("invalid_configuration", IngressTransport, 7443, **arguments(files))


@pytest.mark.parametrize(
    ("name", "value"),
    [("credential_file", "relative/credential"), ("credential_file", "/"), ("credential_file", "/a/../credential"),
     ("credential_file", "/a//credential"), ("credential_file", "/a/credential/"), ("certificate_file", "/a\0b"),
     ("private_key_file", "/" + "k" * 4096), ("private_key_file", "/a/\udcff"), ("certificate_file", None),
     ("certificate_file", pathlib.Path("/abs/client.pem"))],
    ids=["relative", "root", "dotdot", "double-slash", "trailing-slash", "nul", "too-long", "surrogate", "none",
         "pathlib"],
)
def test_rejects_file_path(files: WorkerFiles, name: str, value: object) -> None:
    error = expect_error("invalid_configuration", IngressTransport, "https://cluster.test",
                         **arguments(files, **{name: value}))
    assert name in str(error)


@pytest.mark.parametrize(
    "anchors",
    [[], ["/a"] * 9, "/anchors/root-ca.pem", [b"/anchors/root-ca.pem"], ["anchors/root-ca.pem"], None],
    ids=["none", "nine", "bare-string", "bytes-item", "relative", "null"],
)
def test_rejects_trust_anchor_files(files: WorkerFiles, anchors: object) -> None:
    expect_error("invalid_configuration", IngressTransport, "https://cluster.test",
                 **arguments(files, trust_anchor_files=anchors))


def test_accepts_eight_anchors(files: WorkerFiles) -> None:
    IngressTransport("https://cluster.test", **arguments(files, trust_anchor_files=(str(files.anchor),) * 8))


@pytest.mark.parametrize("timeout", [999, 60_001, 0, -1, True, 15_000.0, "15000", None])
def test_rejects_request_timeout(files: WorkerFiles, timeout: object) -> None:
    expect_error("invalid_configuration", IngressTransport, "https://cluster.test",
                 **arguments(files, request_timeout_ms=timeout))


@pytest.mark.parametrize("timeout", [1000, 15_000, 60_000])
def test_accepts_request_timeout(files: WorkerFiles, timeout: int) -> None:
    IngressTransport("https://cluster.test", **arguments(files, request_timeout_ms=timeout))


def test_from_config(files: WorkerFiles, server: TLSServer) -> None:
    config = parse_config({
        "schema": "qinglong/edge-agent@v1",
        "stateDirectory": "/var/lib/qinglong-edge",
        "worker": {
            "origin": server.origin(),
            "workerId": "edge-1",
            "credentialFile": str(files.credential),
            "certificateFile": str(files.certificate),
            "privateKeyFile": str(files.key),
            "trustAnchorFiles": [str(files.anchor)],
            "requestTimeoutMs": 2000,
        },
    })
    assert config.worker is not None
    with IngressTransport.from_config(config.worker) as transport:
        assert transport.origin == config.worker.origin
        response = transport.post_json(OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP)
    assert response.status == 200 and response.body == b'{"ok":true}'
    assert server.requests[-1].header("authorization") == files.authorization


def test_repr_shows_no_files_or_secrets(files: WorkerFiles) -> None:
    transport = IngressTransport("https://cluster.test", **arguments(files))
    assert repr(transport) == "IngressTransport(origin='https://cluster.test', closed=False)"
    response = TransportResponse(status=200, body=b'{"secret":1}', content_type="application/json", request_id=None)
    assert "secret" not in repr(response)


# -- call arguments ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "kwargs"),
    [
        (OFFER_PATH + "?x=1", OFFER_BODY, {}),
        ("/api/v3/health", OFFER_BODY, {}),
        (OFFER_PATH, b"{", {}),
        (OFFER_PATH, b"", {}),
        (OFFER_PATH, b"[]", {}),
        (OFFER_PATH, b'{"a":1,"a":2}', {}),
        (OFFER_PATH, b'{"a":"' + b"x" * 4090 + b'"}', {}),
        (OFFER_PATH, '{"a":1}', {}),
        (OFFER_PATH, OFFER_BODY, {"max_response_bytes": 1}),
        (OFFER_PATH, OFFER_BODY, {"max_response_bytes": 262_145}),
        (OFFER_PATH, OFFER_BODY, {"max_response_bytes": True}),
        (OFFER_PATH, OFFER_BODY, {"max_request_bytes": 65_537}),
        (OFFER_PATH, OFFER_BODY, {"max_request_bytes": 1}),
    ],
    ids=["query", "other-route", "bad-json", "empty", "array", "duplicate-key", "4097-bytes", "str-body",
         "cap-1", "cap-over-ceiling", "cap-bool", "request-cap-over", "request-cap-1"],
)
def test_rejects_call(files: WorkerFiles, server: TLSServer, path: str, body: Any, kwargs: dict[str, Any]) -> None:
    before = server.connections
    options = {"max_response_bytes": OFFER_CAP, **kwargs}
    with files.transport(server.origin()) as transport:
        expect_error("request_rejected", transport.post_json, path, body, **options)
    assert server.connections == before


def test_accepts_larger_body_when_the_route_raises_the_cap(files: WorkerFiles, server: TLSServer) -> None:
    body = b'{"a":"' + b"x" * 8000 + b'"}'
    with files.transport(server.origin()) as transport:
        expect_error("request_rejected", transport.post_json, OFFER_PATH, body, max_response_bytes=OFFER_CAP)
        response = transport.post_json(OFFER_PATH, body, max_response_bytes=OFFER_CAP, max_request_bytes=65_536)
    assert response.status == 200 and server.requests[-1].body == body


def test_rejects_call_after_close(files: WorkerFiles, server: TLSServer) -> None:
    transport = files.transport(server.origin())
    transport.close()
    transport.close()  # idempotent
    assert transport.closed
    expect_error("closed", transport.post_json, OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP)


# -- credential file (section 1.4) -------------------------------------------------------


def post(files: WorkerFiles, server: TLSServer) -> TransportResponse:
    with files.transport(server.origin()) as transport:
        return transport.post_json(OFFER_PATH, OFFER_BODY, max_response_bytes=OFFER_CAP)


def refused(files: WorkerFiles, server: TLSServer, reason: str) -> None:
    before = server.connections
    with files.transport(server.origin()) as transport:
        error = expect_error("credentials_unavailable", transport.post_json, OFFER_PATH, OFFER_BODY,
                             max_response_bytes=OFFER_CAP)
    assert reason in str(error)
    assert server.connections == before, "nothing may be sent with unusable credentials"


def test_credential_with_and_without_newline(files: WorkerFiles, server: TLSServer) -> None:
    post(files, server)
    assert server.requests[-1].header("authorization") == files.authorization
    files.replace(files.credential, files.authorization.removeprefix("Worker ").encode())
    post(files, server)
    assert server.requests[-1].header("authorization") == files.authorization


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"ql3w_worker_primary_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwd\n", "non-canonical secret"),
        (b"ql3w_worker_primary_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBw\n", "not a ql3w token"),
        (b"Worker ql3w_w_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc", "not a ql3w token"),
        (b"ql3c_w_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc", "not a ql3w token"),
        (b"ql3w_w_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc\n\n", "single ASCII"),
        (b"ql3w_w_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc\r\n", "not a ql3w token"),
        (b" ql3w_w_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc", "not a ql3w token"),
        ("ql3w_wé_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc".encode(), "single ASCII"),
        (b"\n", "not a ql3w token"),
        (b"x" * 257, "size 257"),
    ],
    ids=["non-canonical", "short-secret", "scheme-inside", "ql3c", "two-newlines", "crlf", "leading-space",
         "non-ascii", "only-newline", "257-bytes"],
)
def test_rejects_credential_content(files: WorkerFiles, server: TLSServer, content: bytes, reason: str) -> None:
    files.replace(files.credential, content)
    refused(files, server, reason)


def test_rejects_empty_credential(files: WorkerFiles, server: TLSServer) -> None:
    files.replace(files.credential, b"")
    refused(files, server, "size 0")


def test_accepts_longest_credential_id(files: WorkerFiles, server: TLSServer) -> None:
    files.rotate_credential("w_" + "x" * 62)  # 64 characters, with an underscore (section 1.4)
    post(files, server)
    assert server.requests[-1].header("authorization") == files.authorization


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o601])
def test_rejects_credential_mode(files: WorkerFiles, server: TLSServer, mode: int) -> None:
    os.chmod(files.credential, mode)
    refused(files, server, f"mode {mode:04o}")


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o701, 0o710])
def test_rejects_credential_parent_mode(files: WorkerFiles, server: TLSServer, mode: int) -> None:
    os.chmod(files.private, mode)
    refused(files, server, "parent directory mode")


def test_rejects_credential_symlink(files: WorkerFiles, server: TLSServer, tmp_path: pathlib.Path) -> None:
    real = files.private / "real-credential"
    os.replace(files.credential, real)
    os.symlink(real, files.credential)
    refused(files, server, "is a symlink")


def test_rejects_credential_in_symlinked_directory(files: WorkerFiles, server: TLSServer,
                                                   tmp_path: pathlib.Path) -> None:
    link = tmp_path / "linked-dir"
    os.symlink(files.private, link)
    with IngressTransport(server.origin(), **arguments(files, credential_file=str(link / "credential"))) as t:
        error = expect_error("credentials_unavailable", t.post_json, OFFER_PATH, OFFER_BODY,
                             max_response_bytes=OFFER_CAP)
    assert "parent directory is a symlink" in str(error)


def test_rejects_missing_credential_and_fifo(files: WorkerFiles, server: TLSServer) -> None:
    os.unlink(files.credential)
    refused(files, server, "cannot open")
    os.mkfifo(files.credential, 0o600)
    refused(files, server, "not a regular file")  # and the open did not block


def test_rejects_credential_directory(files: WorkerFiles, server: TLSServer) -> None:
    os.unlink(files.credential)
    os.mkdir(files.credential, 0o700)
    refused(files, server, "not a regular file")


# -- TLS material files (section 1.2) ----------------------------------------------------


@pytest.mark.parametrize("which", ["certificate", "key"])
def test_rejects_group_readable_client_material(files: WorkerFiles, server: TLSServer, which: str) -> None:
    os.chmod(getattr(files, which), 0o640)
    refused(files, server, "mode 0640")


@pytest.mark.parametrize("which", ["certificate", "key"])
def test_rejects_symlinked_client_material(files: WorkerFiles, server: TLSServer, which: str) -> None:
    path: pathlib.Path = getattr(files, which)
    os.replace(path, path.with_name("real"))
    os.symlink(path.with_name("real"), path)
    refused(files, server, "is a symlink")


def test_rejects_oversized_and_empty_client_material(files: WorkerFiles, server: TLSServer) -> None:
    pem = files.certificate.read_bytes()
    files.replace(files.certificate, pem + b"\n" * (1024 * 1024 + 1 - len(pem)))
    refused(files, server, "size 1048577")
    files.replace(files.certificate, b"")
    refused(files, server, "size 0")


def test_accepts_client_chain_of_exactly_one_mebibyte(files: WorkerFiles, server: TLSServer) -> None:
    pem = files.certificate.read_bytes()
    files.replace(files.certificate, pem + b"\n" * (1024 * 1024 - len(pem)))
    assert post(files, server).status == 200


@pytest.mark.parametrize(
    ("certificate", "key", "reason"),
    [("client.pem", "client-rogue.key", "rejected by OpenSSL"), ("root-ca.pem", "client.key", "rejected"),
     ("client.key", "client.key", "rejected"), ("client.pem", "client.pem", "rejected")],
    ids=["key-mismatch", "ca-cert-with-client-key", "key-as-cert", "cert-as-key"],
)
def test_rejects_unusable_client_material(files: WorkerFiles, server: TLSServer, certificate: str, key: str,
                                          reason: str) -> None:
    files.replace(files.certificate, cert_path(certificate).read_bytes())
    files.replace(files.key, cert_path(key).read_bytes())
    refused(files, server, reason)


def test_rejects_encrypted_key_without_prompting(files: WorkerFiles, server: TLSServer,
                                                 tmp_path: pathlib.Path) -> None:
    import subprocess

    encrypted = tmp_path / "encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", str(files.key), "-aes256", "-passout", "pass:secret-pass",
                    "-out", str(encrypted)], check=True, capture_output=True, stdin=subprocess.DEVNULL)
    files.replace(files.key, encrypted.read_bytes())
    refused(files, server, "rejected by OpenSSL")


@pytest.mark.parametrize(
    ("content", "mode", "reason"),
    [(b"not a certificate", 0o644, "no usable certificate"), (b"", 0o644, "size 0"),
     (b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", 0o644, "no usable certificate"),
     (None, 0o664, "mode 0664"), (None, 0o646, "mode 0646")],
    ids=["garbage", "empty", "broken-pem", "group-writable", "other-writable"],
)
def test_rejects_trust_anchor(files: WorkerFiles, server: TLSServer, content: bytes | None, mode: int,
                              reason: str) -> None:
    files.replace(files.anchor, cert_path("root-ca.pem").read_bytes() if content is None else content, mode)
    refused(files, server, reason)


def test_rejects_anchor_in_world_writable_directory(files: WorkerFiles, server: TLSServer) -> None:
    os.chmod(files.anchors_dir, 0o777)  # noqa: S103 -- the unsafe mode is the point
    refused(files, server, "parent directory mode")


def test_rejects_symlinked_anchor(files: WorkerFiles, server: TLSServer) -> None:
    os.replace(files.anchor, files.anchors_dir / "real.pem")
    os.symlink(files.anchors_dir / "real.pem", files.anchor)
    refused(files, server, "is a symlink")


def test_accepts_der_anchor(files: WorkerFiles, server: TLSServer) -> None:
    import ssl

    der = ssl.PEM_cert_to_DER_cert(cert_path("root-ca.pem").read_text())
    files.replace(files.anchor, der, 0o644)
    assert post(files, server).status == 200


def test_fallback_loader_without_memfd(files: WorkerFiles, server: TLSServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingress_material, "_memfd_usable", lambda: False)
    assert post(files, server).status == 200
    files.replace(files.key, cert_path("client-rogue.key").read_bytes())
    refused(files, server, "rejected by OpenSSL")


def test_leak_guard_detects_a_planted_secret(files: WorkerFiles, no_leaks: LeakGuard) -> None:
    """The guard used by every test here must be able to fail."""
    with pytest.MonkeyPatch.context() as patch, pytest.raises(AssertionError, match="leaked"):
        with leak_guard(patch):
            TransportError(f"oops {files.secret}", code="request_rejected")
    no_leaks.errors.clear()  # the planted error was also seen by this test's own guard
