"""doctor's worker TLS checks (issue 18 items 1 and 7): a real TLS 1.3 handshake with
the configured origin and client certificate, with the transport's reasons and
remedies, and the validity window of the client chain and of every trust anchor."""

from __future__ import annotations

import json
import pathlib
import subprocess
from typing import Any

import pytest

from qinglong_edge.contracts.x509 import certificate_validities
from qinglong_edge.doctor import check_certificate_validity
from qinglong_edge.errors import transport_remedy
from qinglong_edge.worker.ingress.certificates import expiring_certificate
from tests.support.cli import run_cli
from tests.support.tls_server import OpenSSLServer, SilentPeer, TLSServer, cert_path
from tests.support.transport_env import WorkerFiles

DAY = 86_400_000
CLIENT = certificate_validities(cert_path("client.pem").read_bytes())[0]  # 2025-01-01 .. 2099-12-31


@pytest.fixture
def files(tmp_path: pathlib.Path) -> WorkerFiles:
    return WorkerFiles(tmp_path)


def _doctor(tmp_path: pathlib.Path, files: WorkerFiles, origin: str, *, timeout_ms: int = 1000) -> dict[str, Any]:
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "schema": "qinglong/edge-agent@v1", "stateDirectory": str(state),
        "worker": {"origin": origin, "workerId": "edge-1", "credentialFile": str(files.credential),
                   "certificateFile": str(files.certificate), "privateKeyFile": str(files.key),
                   "trustAnchorFiles": files.anchor_paths, "requestTimeoutMs": timeout_ms},
    }))
    result = run_cli("--config", str(config), "doctor", "--json")
    data = json.loads(result.stdout)
    data["status"] = result.status
    data["by_name"] = {check["name"]: check for check in data["checks"]}
    human = run_cli("--config", str(config), "doctor")
    data["human"] = human.stdout
    return data


def test_a_good_cluster_passes_and_no_request_is_sent(tmp_path: pathlib.Path, files: WorkerFiles) -> None:
    with TLSServer() as server:
        data = _doctor(tmp_path, files, server.origin())
        assert server.requests == [] and server.handshakes == 2  # --json and the human run
    handshake = data["by_name"]["worker_tls_handshake"]
    assert handshake["ok"] and handshake["required"], handshake
    assert "TLSv1.3" in handshake["detail"] and "client certificate accepted" in handshake["detail"]
    assert "server certificate CN=localhost 2025-01-01T00:00:00Z .. 2099-12-31T23:59:59Z" in handshake["detail"]
    validity = data["by_name"]["worker_certificate_validity"]
    assert validity["ok"] and "[0] CN=edge-1 2025-01-01T00:00:00Z .. 2099-12-31T23:59:59Z" in validity["detail"]
    anchor = data["by_name"]["trust_anchor_validity_0"]
    assert anchor["ok"] and "CN=qinglong-edge test root CA" in anchor["detail"]
    assert data["status"] == 0 and data["ok"] is True
    assert "doctor: all required checks passed" in data["human"]


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: TLSServer(identity="server-expired"), "certificate_expired"),
        (lambda: TLSServer(identity="server-wrong-host"), "hostname_mismatch"),
        (lambda: TLSServer(identity="server-untrusted-root"), "untrusted_issuer"),
        (lambda: TLSServer(client_ca="rogue-ca"), "client_certificate_rejected"),
        (lambda: OpenSSLServer(["-tls1_2", "-cipher", "DEFAULT@SECLEVEL=0"]), "protocol_version"),
        (SilentPeer, "tls_handshake_timeout"),
    ],
    ids=["expired", "wrong-host", "untrusted", "client-refused", "tls-1.2", "silent"],
)
def test_handshake_faults_fail_with_the_transport_reason(tmp_path: pathlib.Path, files: WorkerFiles,
                                                         make: Any, reason: str) -> None:
    with make() as server:
        data = _doctor(tmp_path, files, server.origin())
    check = data["by_name"]["worker_tls_handshake"]
    assert (check["ok"], check["required"]) == (False, True)
    assert check["detail"].split(": ", 2)[1] == reason, check["detail"]
    assert check["remedy"] == transport_remedy(reason)
    assert data["status"] == 69
    line = next(ln for ln in data["human"].splitlines() if " worker_tls_handshake " in ln)
    assert line.startswith("FAIL") and reason in line and transport_remedy(reason) in line


def test_unresolvable_origin(tmp_path: pathlib.Path, files: WorkerFiles) -> None:
    data = _doctor(tmp_path, files, "https://qinglong-edge-test.invalid:7443")
    assert "dns_failure" in data["by_name"]["worker_tls_handshake"]["detail"]


def test_an_expired_client_certificate_fails_its_validity(tmp_path: pathlib.Path, files: WorkerFiles) -> None:
    files.replace(files.certificate, cert_path("server-expired.pem").read_bytes())
    files.replace(files.key, cert_path("server-expired.key").read_bytes())
    with TLSServer() as server:
        data = _doctor(tmp_path, files, server.origin())
    validity = data["by_name"]["worker_certificate_validity"]
    assert (validity["ok"], validity["required"]) == (False, True)
    assert "[0] CN=localhost 2020-01-01T00:00:00Z .. 2021-01-01T00:00:00Z (expired " in validity["detail"]
    assert "[1] CN=qinglong-edge test intermediate CA" in validity["detail"]  # every certificate of the chain
    assert "renew the client certificate" in validity["remedy"]


def test_a_not_yet_valid_anchor_fails_and_points_at_the_clock(tmp_path: pathlib.Path, files: WorkerFiles) -> None:
    files.anchor_paths.append(str(files.anchors_dir / "future.pem"))
    files.replace(files.anchors_dir / "future.pem", cert_path("server-not-yet-valid.pem").read_bytes(), 0o644)
    with TLSServer() as server:
        data = _doctor(tmp_path, files, server.origin())
    future = data["by_name"]["trust_anchor_validity_1"]
    assert (future["ok"], future["required"]) == (False, True)
    assert "not valid for" in future["detail"] and "clock" in future["remedy"]
    assert data["by_name"]["trust_anchor_validity_0"]["ok"]
    assert data["by_name"]["worker_tls_handshake"]["ok"]  # the other anchor verifies the server


def test_a_certificate_ending_within_30_days_warns(tmp_path: pathlib.Path, files: WorkerFiles) -> None:
    """A certificate made now for 10 days (the only one not from the pinned set: its
    dates must be relative to the clock doctor reads)."""
    key, pem = tmp_path / "short.key", tmp_path / "short.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(key), "-out", str(pem), "-days", "10", "-subj", "/CN=short-lived"],
                   check=True, capture_output=True)
    files.replace(files.certificate, pem.read_bytes())
    files.replace(files.key, key.read_bytes())
    with TLSServer(client_ca=None) as server:
        data = _doctor(tmp_path, files, server.origin())
    validity = data["by_name"]["worker_certificate_validity"]
    assert (validity["ok"], validity["required"]) == (False, False), validity
    assert "CN=short-lived" in validity["detail"] and "days left" in validity["detail"]
    assert validity["remedy"].startswith("renew it before ")
    line = next(ln for ln in data["human"].splitlines() if " worker_certificate_validity " in ln)
    assert line.startswith("warn")
    assert data["status"] == 0  # a warning, not a failure


@pytest.mark.parametrize(
    ("now_ms", "ok", "required"),
    [
        (CLIENT.not_before_ms - 1, False, True),          # not yet valid
        (CLIENT.not_before_ms, True, True),
        (CLIENT.not_after_ms - 30 * DAY, True, True),     # exactly 30 days left: fine
        (CLIENT.not_after_ms - 30 * DAY + 1, False, False),  # inside 30 days: warn
        (CLIENT.not_after_ms, False, False),              # the last millisecond: still a warning
        (CLIENT.not_after_ms + 1, False, True),           # expired
    ],
)
def test_validity_boundaries(files: WorkerFiles, now_ms: int, ok: bool, required: bool) -> None:
    check = check_certificate_validity(str(files.certificate), "worker_certificate_validity",
                                       role="client certificate", private=True, now_ms=now_ms)
    assert (check.ok, check.required) == (ok, required), check


def test_missing_files_are_reported_once(tmp_path: pathlib.Path, files: WorkerFiles) -> None:
    files.certificate.unlink()
    data = _doctor(tmp_path, files, "https://127.0.0.1:9")
    assert data["by_name"]["worker_certificate"]["ok"] is False
    skipped = data["by_name"]["worker_certificate_validity"]
    assert (skipped["ok"], skipped["required"], skipped["detail"]) == (
        False, False, "not checked: worker_certificate failed")
    assert data["by_name"]["worker_tls_handshake"]["detail"] == "not checked: worker_certificate failed"


def test_the_pull_side_reader(files: WorkerFiles) -> None:
    """expiring_certificate: what pull calls once a day (engineer worker-pull)."""
    anchors = files.anchor_paths
    assert expiring_certificate(str(files.certificate), anchors, CLIENT.not_after_ms - 15 * DAY) is None
    soon = expiring_certificate(str(files.certificate), anchors, CLIENT.not_after_ms - 13 * DAY)
    assert soon is not None and soon.role == "client certificate" and soon.index == 0
    assert "13 days left" in soon.describe(CLIENT.not_after_ms - 13 * DAY)
    files.replace(files.certificate, cert_path("server-expired.pem").read_bytes())
    broken = expiring_certificate(str(files.certificate), anchors, CLIENT.not_before_ms + DAY)
    assert broken is not None and broken.validity.subject == "localhost"
    assert broken.state(CLIENT.not_before_ms + DAY, 0) == "expired"
    files.certificate.chmod(0o644)  # unreadable by the rules: skipped, never raised
    assert expiring_certificate(str(files.certificate), anchors, CLIENT.not_before_ms + DAY) is None


