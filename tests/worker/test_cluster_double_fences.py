"""The cluster double refuses what the reference cluster refuses (remote-execution.md 3): every
route's 409 code for each fence reason (the reason itself is never sent; the double keeps it),
state fences, the common ingress errors of the JSON routes, the artifact stream's framing
checks, and the secrets route's 503s. Real TLS; the raw client shows the error bodies.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.cluster_calls import SESSION_1, WorkerCalls
from tests.support.cluster_double import ClusterDouble
from tests.support.cluster_wire import compact
from tests.support.ingress_client import artifact_body

SESSION_2 = "018f0000-0000-7000-8000-000000000002"
OTHER_TOKEN = "X" * 43
OTHER_LOG = "wlog-" + "0" * 30


def prepare(cluster: ClusterDouble, worker: WorkerCalls, op: str) -> None:
    """The state in which ``op`` would succeed, with the lease at version 2."""
    cluster.add_command_task("echo $K", secrets={"K": "v"})
    worker.claim()
    worker.renew()
    if op in ("start-failure", "running", "secrets", "artifacts", "completion"):
        worker.start()
    if op in ("artifacts", "completion"):
        worker.call("running", worker.running_body())
    if op == "completion":
        assert worker.upload(b"log").status == 200


def send(worker: WorkerCalls, op: str, **changes: Any) -> Any:
    """``op`` with fence fields changed (header fields for artifacts)."""
    if op == "artifacts":
        return worker.upload(body=worker.artifact(b"log", **changes))
    body = worker.completion_body(b"log") if op == "completion" else worker.body(op)
    body.update(changes)
    return worker.raw(op, body)


CODES = {"starting": "worker_activation_fenced", "start-failure": "worker_activation_fenced",
         "running": "worker_activation_fenced", "lease-control": "worker_lease_control_fenced",
         "secrets": "worker_secret_delivery_fenced", "artifacts": "worker_completion_fenced",
         "completion": "worker_completion_fenced"}
#: scenario -> (activation reason, lease-control, artifacts, completion, secrets)
REASONS = {
    "session_replaced": ("worker_session_mismatch", "worker_session_mismatch", "worker_unavailable",
                         "worker_unavailable", "authority_mismatch"),
    "session_expired": ("worker_unavailable",) * 4 + ("authority_mismatch",),
    "other_token": ("lease_token_mismatch", "lease_token_mismatch", "authority_mismatch", "authority_mismatch",
                    "authority_mismatch"),
    "other_offer": ("offer_mismatch", "offer_mismatch", "authority_mismatch", "authority_mismatch",
                    "authority_mismatch"),
    "unknown_attempt": ("missing", "missing", "missing", "state_mismatch", "authority_mismatch"),
    "stale_version": ("version_mismatch", "version_mismatch", "authority_mismatch", "authority_mismatch",
                      "authority_mismatch"),
    "lease_expired": ("lease_expired",) * 4 + ("authority_mismatch",),
}
_COLUMN = {"starting": 0, "start-failure": 0, "running": 0, "lease-control": 1, "artifacts": 2, "completion": 3,
           "secrets": 4}


@pytest.mark.parametrize("scenario", sorted(REASONS))
@pytest.mark.parametrize("op", sorted(CODES))
def test_every_route_fences_with_its_code(cluster: ClusterDouble, worker: WorkerCalls, op: str,
                                          scenario: str) -> None:
    prepare(cluster, worker, op)
    attempt = cluster.attempt(worker.run_id)
    before = (attempt.status, attempt.lease.version, len(attempt.events), attempt.cancel_requested_at_ms)
    changes: dict[str, Any] = {}
    if scenario == "session_replaced":
        worker.register((SESSION_2,))
        worker.session_id, worker.generation = SESSION_1, 2  # keep speaking for the old session
    elif scenario == "session_expired":
        cluster.state.expire_session("edge-1")
    elif scenario == "other_token":
        changes["leaseToken"] = OTHER_TOKEN
    elif scenario == "other_offer":
        changes["offerId"] = "offer-2"
    elif scenario == "unknown_attempt":
        changes["attemptId"] = "attempt-unknown"
    elif scenario == "stale_version":
        changes["expectedLeaseVersion"] = 1
    else:
        cluster.advance_clock(30_000)
    answer = send(worker, op, **changes)
    assert (answer.status, answer.code) == (409, CODES[op])
    assert set(answer.json()) == {"code"}
    assert cluster.fence_reasons()[-1].reason == REASONS[scenario][_COLUMN[op]]
    assert (attempt.status, attempt.lease.version, len(attempt.events), attempt.cancel_requested_at_ms) == before


@pytest.mark.parametrize(("op", "setup", "reason"), [
    ("running", "claimed", "attempt_state_mismatch"),
    ("start-failure", "claimed", "attempt_state_mismatch"),
    ("artifacts", "claimed", "state_mismatch"),
    ("artifacts", "other_log", "state_mismatch"),
    ("completion", "claimed", "state_mismatch"),
    ("secrets", "claimed", "authority_mismatch"),
    ("secrets", "running", "authority_mismatch"),
    ("secrets", "other_refs", "secret_scope_mismatch"),
    ("starting", "terminal", "version_mismatch"),
    ("artifacts", "running_without_log", "state_mismatch"),
])
def test_state_fences(cluster: ClusterDouble, worker: WorkerCalls, op: str, setup: str, reason: str) -> None:
    cluster.define_secret("OTHER", "x")
    cluster.add_command_task("true", secrets={"K": "v"})
    worker.claim()
    if setup in ("running", "other_log", "terminal"):
        worker.run()
    if setup == "running_without_log":
        worker.run(log_id=None)  # the key is mandatory, null allowed
    if setup == "other_refs":
        worker.start()
    if setup == "terminal":
        worker.upload(b"")
        worker.call("completion", worker.completion_body(b""))
    if op == "artifacts":
        answer = worker.upload(body=worker.artifact(b"x", logArtifactId=OTHER_LOG)) if setup == "other_log" \
            else worker.upload(b"x")
        assert answer.headers.get("connection") == "close"
    elif op == "completion":
        answer = worker.raw(op, worker.completion_body(b""))
    elif setup == "other_refs":
        ref = cluster.define_secret("OTHER", "x")
        answer = worker.raw(op, worker.secrets_body(secretRefs=[ref]))
    else:
        answer = worker.raw(op)
    assert (answer.status, answer.code) == (409, CODES[op])
    assert cluster.fence_reasons()[-1].reason == reason


@pytest.mark.parametrize(("op", "expected"), [
    ("lease-control", (409, "worker_lease_control_fenced", "project_mismatch")),
    ("artifacts", (409, "worker_completion_fenced", "authority_mismatch")),
    ("completion", (409, "worker_completion_fenced", "state_mismatch")),  # the store is keyed by project
    ("secrets", (503, "worker_ingress_unavailable", None)),  # its refs are project-1's: invalid
])
def test_another_project(cluster: ClusterDouble, worker: WorkerCalls, op: str,
                         expected: tuple[int, str, str | None]) -> None:
    prepare(cluster, worker, op)
    answer = send(worker, op, projectId="project-2")
    assert (answer.status, answer.code) == expected[:2]
    assert [r.reason for r in cluster.fence_reasons()] == ([expected[2]] if expected[2] else [])


def test_lease_control_with_an_inconsistent_terminal_state_is_fenced(cluster: ClusterDouble,
                                                                      worker: WorkerCalls) -> None:
    cluster.add_command_task("true")
    worker.claim()
    cluster.attempt(worker.run_id).status = "lost"  # the attempt lost, the lease still leased
    answer = worker.raw("lease-control")
    assert (answer.status, answer.code) == (409, "worker_lease_control_fenced")
    assert cluster.fence_reasons()[-1].reason == "state_mismatch"


# -- the secrets route's 503s --------------------------------------------------------------------

@pytest.mark.parametrize("case", ["undefined_secret", "ref_of_another_project", "no_refs", "bad_digest",
                                  "duplicate_ref", "value_too_large"])
def test_secrets_503(cluster: ClusterDouble, worker: WorkerCalls, case: str) -> None:
    task = cluster.add_command_task("true", secrets={"K": "v"})
    ref = task.revision["environment"][0]["secretRef"]
    if case == "undefined_secret":
        cluster.state.execution.secret_values.pop(ref)
    if case == "value_too_large":
        cluster.state.execution.secret_values[ref] = "v" * (16 * 1024 + 1)
    worker.claim()
    worker.start()
    other = cluster.define_secret("K", "v", project_id="project-2")
    body = worker.secrets_body(**{
        "ref_of_another_project": {"secretRefs": [other]}, "no_refs": {"secretRefs": []},
        "bad_digest": {"executionDigest": "A" * 64}, "duplicate_ref": {"secretRefs": [ref, ref]},
    }.get(case, {}))
    answer = worker.raw("secrets", body)
    assert (answer.status, answer.code) == (503, "worker_ingress_unavailable")
    assert cluster.fence_reasons() == []


# -- common ingress errors of the JSON routes ---------------------------------------------------------

JSON_OPS = ("starting", "start-failure", "running", "secrets", "lease-control", "completion")


@pytest.mark.parametrize("op", JSON_OPS)
@pytest.mark.parametrize("case", ["unknown_key", "missing_key", "not_json", "not_object", "wrong_type",
                                  "no_credential", "too_large", "shuffled"])
def test_json_routes_common_errors(cluster: ClusterDouble, worker: WorkerCalls, op: str, case: str) -> None:
    prepare(cluster, worker, op)
    body = worker.completion_body(b"log") if op == "completion" else worker.body(op)
    options: dict[str, Any] = {}
    data = compact(body)
    expected: tuple[int, str] = (400, "invalid_worker_request")
    if case == "unknown_key":
        data = compact({**body, "extra": 1})
    elif case == "missing_key":
        data = compact({k: v for k, v in body.items() if k != "offerId"})
    elif case == "not_json":
        data, expected = b"{not json", (400, "invalid_json")
    elif case == "not_object":
        data = b"[]"
    elif case == "wrong_type":
        options["content_type"], expected = "text/plain", (415, "unsupported_content_type")
    elif case == "no_credential":
        options["authorization"], expected = None, (401, "worker_authentication_required")
    elif case == "too_large":
        data, expected = data + b" " * (64 * 1024), (413, "request_too_large")
    else:
        data = compact(dict(reversed(list(body.items()))))  # key sets are compared, not order
        expected = (200, "")
    answer = worker.raw(op, data, **options)
    assert answer.status == expected[0]
    if expected[0] != 200:
        assert answer.code == expected[1]


@pytest.mark.parametrize(("op", "change"), [
    ("starting", {"runId": "r" * 37}),
    ("starting", {"expectedLeaseVersion": -1}),
    ("starting", {"workerGeneration": 2**31}),
    ("starting", {"leaseToken": "short"}),
    ("running", {"executorHandle": ""}),
    ("running", {"logArtifactId": 7}),
    ("running", {"callbackTokenDigest": "A" * 64}),
    ("lease-control", {"schema": "qinglong/remote-worker-lease-control@v2"}),
    ("lease-control", {"projectId": ""}),
    ("completion", {"result": {"outcome": "failed", "startedAtMs": 1, "finishedAtMs": 2, "exitCode": 0}}),
    ("completion", {"result": {"outcome": "succeeded", "startedAtMs": 3, "finishedAtMs": 2, "exitCode": 0}}),
    ("completion", {"artifact": {"logArtifactId": "wlog-x", "byteLength": 0, "sha256": "0" * 64,
                                 "truncated": None}}),
    ("completion", {"artifact": {"logArtifactId": OTHER_LOG, "byteLength": 0, "sha256": "0" * 64}}),
    ("secrets", {"schema": "qinglong/remote-secret-delivery@v1"}),
])
def test_request_field_rules_answer_400(cluster: ClusterDouble, worker: WorkerCalls, op: str,
                                        change: dict[str, Any]) -> None:
    prepare(cluster, worker, op)
    body = worker.completion_body(b"log") if op == "completion" else worker.body(op)
    body.update(change)
    answer = worker.raw(op, body)
    assert (answer.status, answer.code) == (400, "invalid_worker_request")


# -- the artifact stream's framing -------------------------------------------------------------------

def _framing(worker: WorkerCalls, case: str) -> tuple[bytes, dict[str, Any]]:
    good = worker.artifact(b"hello\n")
    header = json.loads(good[4:-6])
    return {
        "five_bytes": (b"\x00\x00\x00\x01{", {}),
        "header_too_short": (b"\x00\x00\x00\x01{" + b"x" * 8, {}),
        "header_too_long": (b"\x00\x00\x10\x01" + b" " * 4097, {}),
        "header_not_json": (artifact_body(b"{nope", b""), {}),
        "header_keys": (artifact_body({k: v for k, v in header.items() if k != "truncated"}, b"hello\n"), {}),
        "header_schema": (artifact_body({**header, "schema": "x"}, b"hello\n"), {}),
        "header_bad_id": (artifact_body({**header, "logArtifactId": "wlog-X"}, b"hello\n"), {}),
        "byte_length_mismatch": (artifact_body({**header, "byteLength": 5}, b"hello\n"), {}),
        "short_in_header": (good, {"send_bytes": 10, "content_length": str(len(good))}),
        "short_in_content": (good, {"send_bytes": len(good) - 2, "content_length": str(len(good))}),
        "no_content_length": (good, {"content_length": None}),
        "zero_content_length": (b"", {}),
        "content_encoding": (good, {"headers": {"content-encoding": "gzip"}}),
        "json_content_type": (good, {"content_type": "application/json"}),
        "over_the_cap": (good, {"content_length": str(4 + 4096 + 64 * 1024 * 1024 + 1)}),
        "no_credential": (good, {"authorization": None}),
    }[case]


@pytest.mark.parametrize(("case", "status", "code"), [
    ("five_bytes", 400, "invalid_worker_request"),
    ("header_too_short", 400, "invalid_worker_request"),
    ("header_too_long", 400, "invalid_worker_request"),
    ("header_not_json", 400, "invalid_worker_request"),
    ("header_keys", 400, "invalid_worker_request"),
    ("header_schema", 400, "invalid_worker_request"),
    ("header_bad_id", 400, "invalid_worker_request"),
    ("byte_length_mismatch", 400, "invalid_worker_request"),
    ("short_in_header", 400, "content_length_mismatch"),
    ("short_in_content", 503, "worker_ingress_unavailable"),
    ("no_content_length", 400, "invalid_content_length"),
    ("zero_content_length", 400, "invalid_content_length"),
    ("content_encoding", 415, "unsupported_content_encoding"),
    ("json_content_type", 415, "unsupported_content_type"),
    ("over_the_cap", 413, "request_too_large"),
    ("no_credential", 401, "worker_authentication_required"),
])
def test_artifact_framing(cluster: ClusterDouble, worker: WorkerCalls, case: str, status: int, code: str) -> None:
    prepare(cluster, worker, "artifacts")
    body, options = _framing(worker, case)
    answer = worker.upload(body=body, **options)
    assert (answer.status, answer.code) == (status, code)
    assert cluster.artifact(worker.run_id) is None
    if case != "no_credential":
        assert answer.headers.get("connection") == "close"


def test_artifact_content_type_parameters_and_case_are_accepted(cluster: ClusterDouble,
                                                                worker: WorkerCalls) -> None:
    prepare(cluster, worker, "artifacts")
    answer = worker.upload(b"x", content_type="Application/Vnd.Qinglong.Worker-Artifact; v=1")
    assert answer.status == 200 and answer.json()["status"] == "stored"


def test_truncated_null_is_stored_and_must_match(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    prepare(cluster, worker, "artifacts")
    stored = worker.upload(body=worker.artifact(b"head", truncated=None))
    assert stored.json()["truncated"] is None
    assert cluster.artifact(worker.run_id).truncated is None  # type: ignore[union-attr]
    assert worker.call("completion", worker.completion_body(b"head", truncated=None))["status"] == "applied"


def test_a_64_mib_header_claim_is_refused_before_the_body(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    prepare(cluster, worker, "artifacts")
    count = len(cluster.exchanges)
    answer = worker.upload(body=b"", content_length=str(70 * 1024 * 1024))  # nothing sent: never read
    assert (answer.status, answer.code, answer.headers["connection"]) == (413, "request_too_large", "close")
    assert len(cluster.exchanges) == count + 1

