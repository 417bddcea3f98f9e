"""The call client's typed errors (worker/remote/calls.py): every failure names its call, none
carries a body, a token or a secret; against the golden-vector offer of remote-execution.md 6."""

from __future__ import annotations

import json
from typing import Any

import pytest

from qinglong_edge.errors import RemoteCallError, TransportError
from qinglong_edge.worker.remote.calls import ExecutionCalls, call_error
from tests.contracts import vector_rx as rx

SECRET = "a-secret-value-in-a-spoiled-answer"


@pytest.mark.parametrize(("status", "reason", "code"), [
    (409, "unexpected_status", "call_fenced"),
    (503, "unexpected_status", "call_unavailable"),
    (500, "unexpected_status", "call_unavailable"),
    (429, "unexpected_status", "call_unavailable"),
    (None, "read_timeout", "call_unavailable"),
    (None, "connection_closed", "call_unavailable"),
    (400, "unexpected_status", "call_rejected"),
    (401, "unexpected_status", "call_rejected"),
    (200, "malformed_response", "call_response_invalid"),
    (None, "response_too_large", "call_response_invalid"),
])
def test_transport_failures_become_typed_errors_naming_the_call(status: int | None, reason: str, code: str) -> None:
    exc = TransportError("failed", code="response_rejected", http_status=status, reason=reason,
                         retry_after_ms=2000 if status == 503 else None,
                         cluster_code="worker_lease_control_fenced" if status == 409 else None)
    error = call_error("lease-control", exc)
    assert (error.code, error.operation, error.http_status) == (code, "lease-control", status)
    assert str(error).startswith(f"{code}: lease-control: ")
    shown = error.to_json()
    assert shown["operation"] == "lease-control" and shown["code"] == code
    if status == 409:
        assert shown["clusterCode"] == "worker_lease_control_fenced"
    if status == 503:
        assert error.retry_after_ms == 2000 and shown["retryAfterMs"] == 2000


class _Answer:
    def __init__(self, body: bytes) -> None:
        self.body = body
        self.source_sha256 = "0" * 64


class _Transport:
    """Answers every call with ``body`` (a spoiled answer)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.paths: list[str] = []

    def post_json(self, path: str, body: bytes, *, max_response_bytes: int, max_request_bytes: int = 4096) -> Any:
        assert len(body) <= max_request_bytes
        self.paths.append(path)
        return _Answer(self.body)

    def post_stream(self, path: str, prefix: bytes, source: object, length: int, *, max_response_bytes: int) -> Any:
        self.paths.append(path)
        return _Answer(self.body)


def test_a_spoiled_answer_is_call_response_invalid_without_its_content() -> None:
    offer = rx.offer()
    spoiled = json.dumps({"schema": "qinglong/remote-worker-lease-control@v1", "status": SECRET}).encode()
    calls = ExecutionCalls(_Transport(spoiled))
    with pytest.raises(RemoteCallError) as info:
        calls.lease_control(offer)
    error = info.value
    assert (error.code, error.operation) == ("call_response_invalid", "lease-control")
    for text in (str(error), repr(error), json.dumps(error.to_json())):
        assert SECRET not in text and offer["leaseToken"] not in text
    with pytest.raises(RemoteCallError) as info:
        calls.starting(offer)
    assert (info.value.code, info.value.operation) == ("call_response_invalid", "starting")


def test_the_path_is_the_offers_own_session() -> None:
    offer = rx.offer()
    transport = _Transport(b"{}")
    with pytest.raises(RemoteCallError):
        ExecutionCalls(transport).completion(
            offer, callback_sequence=1, callback_token_digest="a" * 64, started_at_ms=1005, finished_at_ms=3000,
            exit_code=0, log_artifact_id="wlog-68cd94391d043410683fabcde45b2a", byte_length=6, sha256="b" * 64,
            truncated=False)
    worker = offer["worker"]
    assert transport.paths == [
        f"/api/v3/worker-ingress/workers/{worker['workerId']}/sessions/{worker['sessionId']}/completion"]
