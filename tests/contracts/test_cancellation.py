"""Local API bodies: run-cancellation@v1 and task-start@v1 (local-api.md 1.1-1.2, 2.4, 9.5, 10)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qinglong_edge.contracts.cancellation import (
    RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    RunCancellationRequest,
    TaskStartRequest,
    decode_local_api_body,
    invalid_request_body,
    parse_run_cancellation_request,
    parse_task_start_request,
    run_cancellation_result,
    task_start_result,
)
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.strictjson import dumps

BODY = b'{"schema":"qinglong/run-cancellation@v1","mutationId":"cancel-local-api-1"}'
CANCEL_CODE = "invalid_run_cancellation_request"


def cancel(body: bytes) -> RunCancellationRequest:
    return parse_run_cancellation_request(decode_local_api_body(body))


# --- decoding (2.4) ------------------------------------------------------------------------------


def test_section_10_1_request() -> None:
    assert len(BODY) == 75
    assert cancel(BODY) == RunCancellationRequest("cancel-local-api-1")


def test_strips_exactly_one_bom() -> None:
    assert cancel(b"\xef\xbb\xbf" + BODY).mutation_id == "cancel-local-api-1"
    with pytest.raises(ContractError) as info:
        decode_local_api_body(b"\xef\xbb\xbf\xef\xbb\xbf" + BODY)
    assert info.value.code == "invalid_json"


def test_accepts_whitespace_inside_the_body() -> None:
    assert cancel(b' \r\n\t{ "mutationId" : "m", "schema":"qinglong/run-cancellation@v1" }\n').mutation_id == "m"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"", "too_small"),
        (b"{" + b" " * 511 + b"}", "too_large"),
        (b"{", "invalid_json"),
        (BODY + b"{}", "trailing_data"),
        (BODY.replace(b"cancel-local-api-1", b"cancel-\xff"), "invalid_utf8"),
        (b'{"schema":NaN}', "non_finite_number"),
        (b'{"schema":"qinglong/run-cancellation@v1","mutationId":"a","mutationId":"b"}', "duplicate_key"),
    ],
    ids=["empty", "oversize", "truncated", "trailing-json", "non-utf8", "nan", "duplicate-key"],
)
def test_rejects_bodies_that_are_not_strict_json(body: bytes, code: str) -> None:
    with pytest.raises(ContractError) as info:
        decode_local_api_body(body)
    assert info.value.code == code


def test_the_512_byte_cap_counts_the_bom() -> None:
    exact = b'{"schema":"qinglong/run-cancellation@v1","mutationId":"m"}'
    padded = exact[:-1] + b" " * (512 - len(exact)) + b"}"
    assert len(padded) == 512
    assert cancel(padded).mutation_id == "m"
    with pytest.raises(ContractError) as info:
        decode_local_api_body(b"\xef\xbb\xbf" + padded)
    assert info.value.code == "too_large"


# --- run-cancellation request (1.1) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (None, "$"),
        ([], "$"),
        ("x", "$"),
        (1, "$"),
        (True, "$"),
        ({"schema": "qinglong/run-cancellation@v1"}, "$.mutationId"),
        ({"schema": "qinglong/run-cancellation@v1", "mutationId": "m", "reason": "x"}, "$.reason"),
        ({"schema": "qinglong/run-cancellation@v2", "mutationId": "m"}, "$.schema"),
        ({"schema": "qinglong/run-cancellation@v1", "mutationId": ""}, "$.mutationId"),
        ({"schema": "qinglong/run-cancellation@v1", "mutationId": "-m"}, "$.mutationId"),
        ({"schema": "qinglong/run-cancellation@v1", "mutationId": "m" * 129}, "$.mutationId"),
        ({"schema": "qinglong/run-cancellation@v1", "mutationId": "m/1"}, "$.mutationId"),
        ({"schema": "qinglong/run-cancellation@v1", "mutationId": "m\n"}, "$.mutationId"),
        ({"schema": "qinglong/run-cancellation@v1", "mutationId": 5}, "$.mutationId"),
    ],
)
def test_rejects_an_invalid_cancellation_request(value: object, path: str) -> None:
    with pytest.raises(ContractError) as info:
        parse_run_cancellation_request(value)
    assert (info.value.code, info.value.path) == (CANCEL_CODE, path)


def test_accepts_the_mutation_id_grammar_limits() -> None:
    for mutation_id in ("a", "A" * 128, "0a._:-Z", "6f1c2a8e-5b3d-4c1e-9a0f-2d6b8e4c1a33"):
        value = {"mutationId": mutation_id, "schema": "qinglong/run-cancellation@v1"}
        assert parse_run_cancellation_request(value).mutation_id == mutation_id


def test_invalid_request_bodies() -> None:
    assert dumps(invalid_request_body("qinglong/run-cancellation@v1")) == (
        '{"code":"invalid_run_cancellation_request","schema":"qinglong/run-cancellation@v1"}')
    assert invalid_request_body("qinglong/task-start@v1")["code"] == "invalid_task_start_request"


# --- run-cancellation result (1.2) -------------------------------------------------------------------


def result(**changes: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"status": "accepted", "project_id": "default", "run_id": "run_local_api_1",
                            "run_status": "running", "run_version": 2, "event_sequence": 2,
                            "cancel_requested_at_ms": 1_800_000_000_000, "cancel_reason": "user"}
    args.update(changes)
    return run_cancellation_result(**args)


def test_section_10_examples_are_byte_identical() -> None:
    assert dumps(result()) == (
        '{"schema":"qinglong/run-cancellation@v1","status":"accepted","projectId":"default","runId":"run_local_api_1",'
        '"runStatus":"running","runVersion":2,"eventSequence":2,"cancelRequestedAtMs":1800000000000,'
        '"cancelReason":"user"}')
    assert len(dumps(result()).encode()) == 222
    assert len(dumps(result(status="already_requested")).encode()) == 231
    terminal = result(status="already_terminal", run_id="run_local_api_done", run_status="succeeded", run_version=4,
                      event_sequence=4, cancel_requested_at_ms=None, cancel_reason=None)
    assert dumps(terminal) == (
        '{"schema":"qinglong/run-cancellation@v1","status":"already_terminal","projectId":"default",'
        '"runId":"run_local_api_done","runStatus":"succeeded","runVersion":4,"eventSequence":4}')
    assert len(dumps(terminal).encode()) == 177


def test_a_lost_run_is_not_terminal_for_cancellation() -> None:
    assert "lost" not in TERMINAL_RUN_STATUSES
    assert result(run_status="lost")["status"] == "accepted"


def test_already_terminal_may_carry_the_stored_intent() -> None:
    body = result(status="already_terminal", run_status="cancelled", run_version=4, event_sequence=4)
    assert list(body)[-2:] == ["cancelRequestedAtMs", "cancelReason"]


@pytest.mark.parametrize(
    "changes",
    [
        {"status": "done"},
        {"run_status": "cancel_requested"},
        {"cancel_requested_at_ms": None, "cancel_reason": None},
        {"cancel_reason": None},
        {"cancel_requested_at_ms": None},
        {"run_status": "succeeded"},
        {"status": "already_requested", "run_status": "failed"},
        {"status": "already_terminal", "run_status": "running"},
        {"status": "already_terminal", "run_status": "lost"},
        {"cancel_reason": "bored"},
        {"cancel_requested_at_ms": -1},
        {"cancel_requested_at_ms": 2**53},
        {"run_version": 0},
        {"run_version": 2**31},
        {"event_sequence": -1},
        {"event_sequence": True},
        {"project_id": "de fault"},
        {"run_id": ""},
    ],
)
def test_rejects_a_result_that_breaks_an_invariant(changes: dict[str, Any]) -> None:
    with pytest.raises(ContractError) as info:
        result(**changes)
    assert info.value.code == "invalid_run_cancellation_result"


@given(
    status=st.sampled_from(["accepted", "already_requested", "already_terminal", "x"]),
    run_status=st.sampled_from([*RUN_STATUSES, "x"]),
    intent=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_result_invariants_hold_for_every_combination(status: str, run_status: str, intent: bool) -> None:
    try:
        body = result(status=status, run_status=run_status, cancel_requested_at_ms=1 if intent else None,
                      cancel_reason="user" if intent else None)
    except ContractError as exc:
        assert exc.code == "invalid_run_cancellation_result"
        return
    terminal = body["runStatus"] in TERMINAL_RUN_STATUSES
    assert (body["status"] == "already_terminal") == terminal
    assert body["status"] == "already_terminal" or "cancelReason" in body
    assert ("cancelRequestedAtMs" in body) == ("cancelReason" in body)


# --- task.start (9.5) ----------------------------------------------------------------------------------

START = {"schema": "qinglong/task-start@v1", "mutationId": "6f1c2a8e-5b3d-4c1e-9a0f-2d6b8e4c1a33",
         "expectedRevision": 3, "expectedContentDigest": "a" * 64}


def test_parses_a_task_start_request() -> None:
    assert parse_task_start_request(START) == TaskStartRequest(START["mutationId"], 3, "a" * 64)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"schema": "qinglong/run-cancellation@v1"}, "$.schema"),
        ({"mutationId": "cancel-1"}, "$.mutationId"),
        ({"mutationId": "6F1C2A8E-5B3D-4C1E-9A0F-2D6B8E4C1A33"}, "$.mutationId"),
        ({"expectedRevision": 0}, "$.expectedRevision"),
        ({"expectedRevision": 2**31}, "$.expectedRevision"),
        ({"expectedRevision": 3.0}, "$.expectedRevision"),
        ({"expectedContentDigest": "A" * 64}, "$.expectedContentDigest"),
        ({"extra": 1}, "$.extra"),
    ],
)
def test_rejects_an_invalid_task_start_request(changes: dict[str, Any], path: str) -> None:
    with pytest.raises(ContractError) as info:
        parse_task_start_request({**START, **changes})
    assert (info.value.code, info.value.path) == ("invalid_task_start_request", path)


def test_task_start_result_key_order() -> None:
    body = task_start_result(
        status="accepted", project_id="default", task_id="task-1", task_revision=3, task_content_digest="b" * 64,
        run_id="6f1c2a8e-5b3d-4c1e-9a0f-2d6b8e4c1a33", attempt_id="7f1c2a8e-5b3d-4c1e-9a0f-2d6b8e4c1a33",
        executor_type="local_process", execution_revision_digest="c" * 64, created_at_ms=5,
    )
    assert list(body) == ["schema", "status", "projectId", "taskId", "taskRevision", "taskContentDigest", "runId",
                          "attemptId", "runStatus", "runVersion", "eventSequence", "executorType",
                          "executionRevisionDigest", "createdAtMs"]
    assert (body["runStatus"], body["runVersion"], body["eventSequence"]) == ("queued", 2, 2)
    with pytest.raises(ContractError) as info:
        task_start_result(**{**_start_args(), "run_id": "run-1"})
    assert info.value.code == "invalid_task_start_result"
    with pytest.raises(ContractError):
        task_start_result(**{**_start_args(), "status": "replayed"})


def _start_args() -> dict[str, Any]:
    return {"status": "existing", "project_id": "p", "task_id": "t", "task_revision": 1,
            "task_content_digest": "b" * 64, "run_id": "6f1c2a8e-5b3d-4c1e-9a0f-2d6b8e4c1a33",
            "attempt_id": "7f1c2a8e-5b3d-4c1e-9a0f-2d6b8e4c1a33", "executor_type": "remote_worker",
            "execution_revision_digest": "c" * 64, "created_at_ms": 0}
