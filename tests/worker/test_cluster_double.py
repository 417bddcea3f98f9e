"""The cluster double behaves as the reference worker ingress does (offer-delivery.md 1.2-1.7,
2, 5.1): real TLS 1.3 mutual TLS, route/auth/framing checks in the reference's order, the
response headers of 1.7, session fencing, the (workerId, offerId) claim with replay and
fencing, and each scripted fault. A raw client speaks to it, so malformed requests are
possible; valid offer bodies are checked with the product's own contract parser.
"""

from __future__ import annotations

import http.client
import json
import os
import pathlib
import signal
import socket
import ssl
import subprocess
import sys
import time
from typing import Any

import pytest

from qinglong_edge.contracts.offer import ClaimAuthority, OfferedResponse, claim_request_body, parse_offer_response
from qinglong_edge.contracts.session import (
    capabilities_snapshot,
    heartbeat_request_body,
    register_request_body,
    transition_request_body,
)
from qinglong_edge.worker.delivery.session import local_capabilities
from tests.support.cluster_double import ClusterDouble, Fault
from tests.support.ingress_client import Answer
from tests.support.pull_env import REPO, child_env, cluster_process
from tests.support.tls_server import cert_path

SESSION_1 = "018f0000-0000-7000-8000-000000000001"
SESSION_2 = "018f0000-0000-7000-8000-000000000002"
TOKEN_A = "A" * 43
TOKEN_B = "B" * 43


def _context(*, client_cert: bool = True, tls12: bool = False) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cert_path("root-ca.pem"))
    if client_cert:
        context.load_cert_chain(cert_path("client.pem"), cert_path("client.key"))
    if tls12:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


def call(
    cluster: ClusterDouble,
    target: str,
    body: bytes = b"",
    *,
    method: str = "POST",
    headers: dict[str, str] | None = None,
    authorization: str | None = "default",
    context: ssl.SSLContext | None = None,
    timeout: float = 5.0,
) -> Answer:
    """One request on a fresh TLS connection; the answer, or the error that ended it."""
    fields = {"content-type": "application/json", "content-length": str(len(body))}
    if authorization == "default":
        fields["authorization"] = f"Worker {cluster.token}"
    elif authorization is not None:
        fields["authorization"] = authorization
    fields.update(headers or {})
    head = f"{method} {target} HTTP/1.1\r\nHost: localhost:{cluster.port}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in fields.items()) + "\r\n"
    with socket.create_connection(("127.0.0.1", cluster.port), timeout=timeout) as raw:
        try:
            with (context or _context()).wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(head.encode("latin-1") + body)
                response = http.client.HTTPResponse(tls)  # type: ignore[arg-type]
                response.begin()
                try:
                    data = response.read()
                except http.client.IncompleteRead as exc:
                    return Answer(response.status, dict(response.getheaders()), exc.partial, "incomplete")
                return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
        except (OSError, http.client.HTTPException) as exc:
            return Answer(None, {}, b"", type(exc).__name__)


def path(op: str, session_id: str = SESSION_1, worker_id: str = "edge-1") -> str:
    return f"/api/v3/worker-ingress/workers/{worker_id}/sessions/{session_id}/{op}"


def register_body(*, slots: int = 1, architecture_of: str = "x86_64") -> bytes:
    text, digest = capabilities_snapshot(local_capabilities(architecture_of))
    return register_request_body(capabilities_json=text, capabilities_hash=digest, max_concurrent_runs=4,
                                 available_slots=slots, lease_duration_ms=60_000)


def offers_body(offer_id: str = "offer-1", token: str = TOKEN_A, generation: int = 1) -> bytes:
    return claim_request_body(ClaimAuthority("edge-1", SESSION_1, generation, offer_id, token))


@pytest.fixture
def cluster(shared_cluster: ClusterDouble) -> ClusterDouble:
    shared_cluster.reset(tasks=("shell", "python"))
    return shared_cluster


@pytest.fixture
def registered(cluster: ClusterDouble) -> ClusterDouble:
    answer = call(cluster, path("register"), register_body())
    assert answer.status == 200, answer.body
    return cluster


# -- TLS -----------------------------------------------------------------------------------------

def test_tls_1_3_with_a_client_certificate_is_required(cluster: ClusterDouble) -> None:
    ok = call(cluster, path("register"), register_body())
    assert ok.status == 200
    refused = len(cluster.server.handshake_errors)
    assert call(cluster, path("register"), register_body(), context=_context(client_cert=False)).status is None
    assert call(cluster, path("register"), register_body(), context=_context(tls12=True)).status is None
    # the server refused both (not a client quirk); the TLS 1.3 alert may land after the client's send
    assert cluster.server.wait_for(lambda: len(cluster.server.handshake_errors) >= refused + 2)
    assert len(cluster.exchanges) == 1


# -- routes, authentication and framing, in the reference's order ------------------------------

@pytest.mark.parametrize(("method", "target", "status", "code"), [
    ("POST", "/v1/offers", 404, "not_found"),
    ("OPTIONS", path("offers"), 405, "method_not_allowed"),
    ("GET", path("offers"), 404, "worker_route_not_found"),
    ("PUT", path("offers"), 404, "worker_route_not_found"),
    ("POST", path("offers") + "?x=1", 404, "worker_route_not_found"),
    ("POST", path("offers", session_id="018f0000-0000-4000-8000-000000000001"), 404, "worker_route_not_found"),
    ("POST", path("reboot"), 404, "worker_route_not_found"),
    ("POST", path("offers", worker_id="-edge"), 404, "worker_route_not_found"),
])
def test_rejects_requests_outside_the_worker_routes(cluster: ClusterDouble, method: str, target: str, status: int,
                                                    code: str) -> None:
    answer = call(cluster, target, offers_body(), method=method)
    assert (answer.status, answer.code) == (status, code)
    if status == 405:
        assert answer.headers["allow"] == "DELETE, GET, PATCH, POST, PUT"


def _non_canonical(secret: str) -> str:
    alphabet = "AEIMQUYcgkosw048"
    return secret[:-1] + ("B" if secret[-1] in alphabet else "A")


@pytest.mark.parametrize(("case", "status", "code"), [
    ("missing", 401, "worker_authentication_required"),
    ("bearer", 401, "worker_authentication_required"),
    ("lowercase_scheme", 401, "worker_authentication_required"),
    ("unknown_credential", 401, "worker_authentication_required"),
    ("wrong_secret", 401, "worker_authentication_required"),
    ("non_canonical_secret", 503, "worker_authentication_unavailable"),
    ("other_worker", 401, "worker_authentication_required"),
    ("revoked", 401, "worker_authentication_required"),
    ("expired", 401, "worker_authentication_required"),
    ("not_yet_valid", 401, "worker_authentication_required"),
])
def test_rejects_bad_credentials(cluster: ClusterDouble, case: str, status: int, code: str) -> None:
    token = cluster.token
    credential = cluster.state.credentials[cluster.credential_id]
    now = cluster.state.clock_ms()
    authorization: str | None = f"Worker {token}"
    target = path("register")
    if case == "missing":
        authorization = None
    elif case == "bearer":
        authorization = f"Bearer {token}"
    elif case == "lowercase_scheme":
        authorization = f"worker {token}"
    elif case == "unknown_credential":
        authorization = f"Worker ql3w_someone_{cluster.secret}"
    elif case == "wrong_secret":
        authorization = f"Worker ql3w_{cluster.credential_id}_{'Q' * 42}A"
    elif case == "non_canonical_secret":
        authorization = f"Worker ql3w_{cluster.credential_id}_{_non_canonical(cluster.secret)}"
    elif case == "other_worker":
        target = path("register", worker_id="edge-2")
    elif case == "revoked":
        credential.state = "revoked"
    elif case == "expired":
        credential.expires_at_ms = now - 1
    elif case == "not_yet_valid":
        credential.not_before_at_ms = now + 60_000
    answer = call(cluster, target, register_body(), authorization=authorization)
    assert (answer.status, answer.code) == (status, code)
    assert cluster.state.sessions == {}


@pytest.mark.parametrize(("headers", "body", "status", "code"), [
    ({"content-encoding": "gzip"}, None, 415, "unsupported_content_encoding"),
    ({"content-type": "text/plain"}, None, 415, "unsupported_content_type"),
    ({"content-type": "Application/JSON"}, None, 415, "unsupported_content_type"),
    ({}, b"{not json", 400, "invalid_json"),
    ({}, b"", 400, "invalid_worker_request"),
    ({}, b'{"workerGeneration":1,"offerId":"o"}', 400, "invalid_worker_request"),
    ({}, b'{"workerGeneration":1,"offerId":"o","leaseToken":"short"}', 400, "invalid_worker_request"),
    ({}, b'{"workerGeneration":0,"offerId":"o","leaseToken":"' + TOKEN_A.encode() + b'"}', 400,
     "invalid_worker_request"),
    ({}, b"[]", 400, "invalid_worker_request"),
])
def test_rejects_badly_framed_bodies(registered: ClusterDouble, headers: dict[str, str], body: bytes | None,
                                     status: int, code: str) -> None:
    answer = call(registered, path("offers"), offers_body() if body is None else body, headers=headers)
    assert (answer.status, answer.code) == (status, code)
    assert registered.state.leases == {}


def test_rejects_a_body_over_the_cap_and_closes(registered: ClusterDouble) -> None:
    answer = call(registered, path("offers"), b" " * (64 * 1024 + 1))
    assert (answer.status, answer.code, answer.headers["connection"]) == (413, "request_too_large", "close")


def test_media_type_parameters_are_accepted(registered: ClusterDouble) -> None:
    answer = call(registered, path("offers"), offers_body(),
                  headers={"content-type": "application/json; charset=utf-8"})
    assert answer.status == 200


def test_response_headers_of_section_1_7(registered: ClusterDouble) -> None:
    echoed = call(registered, path("offers"), offers_body(), headers={"x-request-id": "req.42:a-b"})
    assert echoed.headers["x-request-id"] == "req.42:a-b"
    assert echoed.headers["cache-control"] == "no-store"
    assert echoed.headers["content-type"] == "application/json; charset=utf-8"
    assert echoed.headers["x-content-type-options"] == "nosniff"
    assert int(echoed.headers["content-length"]) == len(echoed.body)
    generated = call(registered, path("offers"), offers_body("offer-2"), headers={"x-request-id": "bad id!"})
    assert len(generated.headers["x-request-id"]) == 36


# -- sessions --------------------------------------------------------------------------------------

def test_register_assigns_generations_and_replays_idempotently(cluster: ClusterDouble) -> None:
    first = call(cluster, path("register"), register_body()).json()
    assert {k: first[k] for k in ("generation", "version", "status", "replacedSession")} == {
        "generation": 1, "version": 0, "status": "online", "replacedSession": False}
    assert first["schema"] == "qinglong/worker-session-register@v1"
    assert call(cluster, path("register"), register_body()).json() == first  # lost answer, same session
    # A replay with another snapshot (here availableSlots) is a conflict, as in the reference.
    other = json.loads(register_body())
    other["availableSlots"] = 0
    refused = call(cluster, path("register"), json.dumps(other).encode())
    assert (refused.status, refused.code) == (409, "worker_session_fenced")
    second = call(cluster, path("register", SESSION_2), register_body()).json()
    assert (second["generation"], second["replacedSession"], second["sessionId"]) == (2, True, SESSION_2)
    cluster.state.sessions[second["workerId"]].lease_expires_at_ms = 0  # expired: a replay is fenced
    expired = call(cluster, path("register", SESSION_2), register_body())
    assert (expired.status, expired.code) == (409, "worker_session_fenced")


@pytest.mark.parametrize("case", ["bad_schema", "hash_mismatch", "slots_over_max", "lease_too_short"])
def test_rejects_invalid_register_bodies(cluster: ClusterDouble, case: str) -> None:
    body = json.loads(register_body())
    if case == "bad_schema":
        body["schema"] = "qinglong/worker-session-register@v2"
    elif case == "hash_mismatch":
        body["capabilitiesHash"] = "0" * 64
    elif case == "slots_over_max":
        body["availableSlots"] = 5
    else:
        body["leaseDurationMs"] = 4999
    answer = call(cluster, path("register"), json.dumps(body).encode())
    assert (answer.status, answer.code) == (400, "invalid_worker_request")


def _heartbeat(cluster: ClusterDouble, expected: int, *, generation: int = 1, session_id: str = SESSION_1) -> Answer:
    body = heartbeat_request_body(generation=generation, expected_version=expected, available_slots=1,
                                  lease_duration_ms=60_000)
    return call(cluster, path("heartbeat", session_id), body)


def test_heartbeat_bumps_the_version_and_extends_the_lease(registered: ClusterDouble) -> None:
    before = registered.state.sessions["edge-1"].lease_expires_at_ms
    registered.advance_clock(10)  # the double's clock, not a sleep
    beat = _heartbeat(registered, 0)
    assert beat.status == 200
    assert (beat.json()["version"], beat.json()["schema"]) == (1, "qinglong/worker-session-heartbeat@v1")
    assert "replacedSession" not in beat.json()
    assert beat.json()["leaseExpiresAtMs"] > before
    assert _heartbeat(registered, 1).json()["version"] == 2


@pytest.mark.parametrize("case", ["stale_version", "other_generation", "other_session", "expired", "offline"])
def test_heartbeat_is_fenced(registered: ClusterDouble, case: str) -> None:
    kwargs: dict[str, Any] = {}
    expected = 0
    if case == "stale_version":
        expected = 7
    elif case == "other_generation":
        kwargs["generation"] = 2
    elif case == "other_session":
        kwargs["session_id"] = SESSION_2
    elif case == "expired":
        registered.state.expire_session("edge-1")
    else:
        registered.state.sessions["edge-1"].status = "offline"
    answer = _heartbeat(registered, expected, **kwargs)
    assert (answer.status, answer.code) == (409, "worker_session_fenced")


# -- offers -------------------------------------------------------------------------------------------

def _parse(answer: Answer, offer_id: str = "offer-1", token: str = TOKEN_A) -> Any:
    return parse_offer_response(answer.body, ClaimAuthority("edge-1", SESSION_1, 1, offer_id, token))


def test_new_claim_carries_a_genuine_revision_and_replays_as_lease_recovery(registered: ClusterDouble) -> None:
    first = call(registered, path("offers"), offers_body())
    offered = _parse(first)  # the product's parser recomputes the digest
    assert isinstance(offered, OfferedResponse)
    assert offered.offer["deliveryKind"] == "new_claim"
    assert offered.stats["claimAttempts"] == 1
    assert offered.offer["executionRevision"]["taskId"] == "task-shell"
    replay = call(registered, path("offers"), offers_body())
    recovered = _parse(replay)
    assert recovered.offer["deliveryKind"] == "lease_recovery"
    assert recovered.offer["placementScore"] == 0 and not recovered.truncated
    assert set(recovered.stats.values()) == {0}
    assert recovered.offer["lease"] == offered.offer["lease"]
    assert len(registered.state.leases) == 1 and len(registered.state.candidates) == 1


def test_python_task_environment_is_in_icu_order(registered: ClusterDouble) -> None:
    call(registered, path("offers"), offers_body("offer-1"))
    offered = _parse(call(registered, path("offers"), offers_body("offer-2", TOKEN_B)), "offer-2", TOKEN_B)
    revision = offered.offer["executionRevision"]
    assert [binding["name"] for binding in revision["environment"]] == ["api_key", "API_URL"]
    assert revision["command"]["kind"] == "argv"


@pytest.mark.parametrize("case", ["other_token", "released", "lease_expired", "session_replaced",
                                  "session_expired"])
def test_claim_replays_are_fenced(registered: ClusterDouble, case: str) -> None:
    assert call(registered, path("offers"), offers_body()).status == 200
    token = TOKEN_A
    if case == "other_token":
        token = TOKEN_B
    elif case == "released":
        registered.state.set_lease_status("offer-1", "released")
    elif case == "lease_expired":
        registered.state.expire_lease("offer-1")
    elif case == "session_replaced":
        call(registered, path("register", SESSION_2), register_body())
    else:
        registered.state.expire_session("edge-1")
    answer = call(registered, path("offers"), offers_body(token=token))
    assert (answer.status, answer.code) == (409, "worker_offer_fenced")


@pytest.mark.parametrize(("case", "reason"), [
    ("no_session", "worker_unavailable"),
    ("other_generation", "worker_unavailable"),
    ("no_slots", "worker_unavailable"),
    ("draining", "worker_unavailable"),
    ("empty", "no_candidates"),
    ("plans", "plans_unavailable"),
    ("placement", "no_match"),
])
def test_idle_reasons(cluster: ClusterDouble, case: str, reason: str) -> None:
    generation = 1
    if case != "no_session":
        call(cluster, path("register"), register_body(slots=0 if case == "no_slots" else 1))
    if case == "other_generation":
        generation = 2
    elif case == "draining":
        cluster.state.sessions["edge-1"].status = "draining"
    elif case == "empty":
        cluster.state.candidates.clear()
    elif case == "plans":
        for candidate in cluster.state.candidates:
            candidate.plan_available = False
    elif case == "placement":
        cluster.state.candidates.clear()
        cluster.add_task("shell", placement={"required": {"executors": ["remote-worker"],
                                                          "architectures": ["s390x"]}})
    answer = call(cluster, path("offers"), offers_body(generation=generation))
    assert answer.status == 200
    body = answer.json()
    assert (body["status"], body["reason"], body["truncated"]) == ("idle", reason, False)
    assert cluster.state.leases == {}
    parse_offer_response(answer.body, ClaimAuthority("edge-1", SESSION_1, generation, "offer-1", TOKEN_A))


def test_an_idle_answer_stores_nothing_for_the_offer_id(cluster: ClusterDouble) -> None:
    """As the reference (docs/worker/delivery.md, "Idle answers and the kept claim"): the
    same offerId and token answered idle, again and again, and then claimed as new."""
    call(cluster, path("register"), register_body())
    cluster.state.candidates.clear()
    before = cluster.state.snapshot()
    for _ in range(3):
        answer = call(cluster, path("offers"), offers_body())
        assert (answer.status, answer.json()["status"]) == (200, "idle")
    assert cluster.state.snapshot() == before and cluster.state.leases == {}
    cluster.add_task("shell")
    claimed = call(cluster, path("offers"), offers_body())
    assert claimed.json()["offer"]["deliveryKind"] == "new_claim"
    assert list(cluster.state.leases_by_offer()) == ["offer-1"]


# -- faults --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("fault", "status", "error"), [
    (Fault.drop(), None, "RemoteDisconnected"),
    (Fault.error_500(), 500, None),
    (Fault.mid_body(), 200, "incomplete"),
    (Fault.garbage(), 200, None),
    (Fault.delay(0.3), 200, None),
])
def test_committing_faults_lose_the_answer_after_the_commit(registered: ClusterDouble, fault: Fault,
                                                           status: int | None, error: str | None) -> None:
    registered.push_fault(fault)
    started = time.monotonic()
    answer = call(registered, path("offers"), offers_body())
    assert (answer.status, answer.error) == (status, error)
    assert len(registered.state.leases) == 1
    exchange = registered.exchanges_for("offers")[-1]
    assert (exchange.fault, exchange.committed, exchange.body) == (fault.kind, True, offers_body())
    if fault.kind == "garbage":
        with pytest.raises(ValueError):
            json.loads(answer.body)
    if fault.kind == "delay":
        assert time.monotonic() - started >= 0.3
    assert call(registered, path("offers"), offers_body()).json()["offer"]["deliveryKind"] == "lease_recovery"


def test_hang_commits_and_never_answers(registered: ClusterDouble) -> None:
    registered.push_fault(Fault.hang())
    answer = call(registered, path("offers"), offers_body(), timeout=0.5)
    assert answer.status is None and answer.error in ("TimeoutError", "timeout")
    assert len(registered.state.leases) == 1


@pytest.mark.parametrize(("status", "code", "retry_after"), [
    (429, "authentication_rate_limited", "30"), (503, "admission_capacity_exhausted", "7"),
    (401, "worker_authentication_required", None), (409, "worker_offer_fenced", None),
])
def test_status_faults_answer_without_processing(registered: ClusterDouble, status: int, code: str,
                                                 retry_after: str | None) -> None:
    registered.push_fault(Fault.status_answer(status, code, retry_after=retry_after))
    answer = call(registered, path("offers"), offers_body())
    assert (answer.status, answer.code, answer.headers.get("retry-after")) == (status, code, retry_after)
    assert registered.state.leases == {}
    assert registered.exchanges_for("offers")[-1].committed is False


def test_a_fault_waits_for_a_request_of_its_operation(cluster: ClusterDouble) -> None:
    cluster.push_fault(Fault.error_500())
    assert call(cluster, path("register"), register_body()).status == 200
    assert cluster.pending_faults() == 1
    assert call(cluster, path("offers"), offers_body()).status == 500
    assert cluster.pending_faults() == 0


# -- process mode (the demo) -------------------------------------------------------------------------

def test_runs_as_its_own_process_and_provisions_the_worker(tmp_path: pathlib.Path) -> None:
    state = tmp_path / "cluster"
    with cluster_process(state, "python") as (proc, info):
        assert len(info["serverCertificateSha256"]) == 64 and info["origin"].endswith(str(info["port"]))
        for key in ("credentialFile", "certificateFile", "privateKeyFile"):
            assert os.stat(info[key]).st_mode & 0o077 == 0
        assert os.stat(pathlib.Path(info["credentialFile"]).parent).st_mode & 0o077 == 0
        config = json.loads(pathlib.Path(info["configFile"]).read_text())
        assert config["worker"]["origin"] == info["origin"]
        run = subprocess.run([sys.executable, "-m", "qinglong_edge", "pull", "--config", info["configFile"],
                              "--json"], capture_output=True, cwd=REPO, env=child_env(), timeout=30, check=False)
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout.splitlines()[0])["status"] == "accepted"
        snapshot = json.loads((state / "cluster-state.json").read_text())
        # register, offers, then the execution: the renewal of the offered lease (at once), starting
        # twice, secrets, running, artifacts, completion
        assert len(snapshot["leases"]) == 1 and snapshot["requests"] == 9
        assert info["credentialFile"] not in json.dumps(snapshot)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


# -- transitions (the reference's rules, no stricter) ----------------------------------------------

def _transition(cluster: ClusterDouble, status: str, expected: int, generation: int = 1) -> Answer:
    return call(cluster, path("transition"), transition_request_body(generation=generation,
                                                                     expected_version=expected, status=status))


def test_draining_then_a_replay_then_offline(registered: ClusterDouble) -> None:
    first = _transition(registered, "draining", 0)
    assert first.status == 200 and (first.json()["status"], first.json()["version"]) == ("draining", 1)
    replay = _transition(registered, "draining", 1)  # draining -> draining: allowed
    assert replay.status == 200 and replay.json()["version"] == 2
    row = registered.state.sessions["edge-1"]
    beat = call(registered, path("heartbeat"), heartbeat_request_body(generation=1, expected_version=2,
                                                                      available_slots=3, lease_duration_ms=60_000))
    assert beat.status == 200 and beat.json()["status"] == "draining"
    assert row.available_slots == 0  # a draining session's heartbeat advertises no slot
    idle = call(registered, path("offers"), offers_body())
    assert idle.status == 200 and (idle.json()["status"], idle.json()["reason"]) == ("idle", "worker_unavailable")
    offline = _transition(registered, "offline", 3)
    assert offline.status == 200 and offline.json()["status"] == "offline"
    assert row.lease_expires_at_ms <= registered.now_ms()
    assert _transition(registered, "draining", 4).code == "worker_session_fenced"  # nothing leaves offline
    assert call(registered, path("heartbeat"), heartbeat_request_body(
        generation=1, expected_version=4, available_slots=1, lease_duration_ms=60_000)).status == 409


def test_online_to_offline_directly_is_allowed(registered: ClusterDouble) -> None:
    answer = _transition(registered, "offline", 0)
    assert answer.status == 200 and answer.json()["status"] == "offline"


@pytest.mark.parametrize(("expected", "generation"), [(1, 1), (0, 2)])
def test_a_transition_takes_the_heartbeat_fence(registered: ClusterDouble, expected: int, generation: int) -> None:
    assert _transition(registered, "draining", expected, generation).code == "worker_session_fenced"


def test_a_transition_with_another_status_is_a_bad_request(registered: ClusterDouble) -> None:
    body = json.dumps({"schema": "qinglong/worker-session-transition@v1", "generation": 1, "expectedVersion": 0,
                       "status": "online"}).encode()
    assert call(registered, path("transition"), body).status == 400
