"""starting / start-failure / running (remote-execution.md 3.1-3.3, 6): golden bytes, the
parser's order and limits, the worker checks 3-6, mutations and properties."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong_edge.contracts.activation import (
    ACTIVATION_RESPONSE_MAX_BYTES,
    ACTIVATION_STATUSES,
    RUN_ATTEMPT_STATUSES,
    RUN_STATUSES,
    ActivationResult,
    next_callback_sequence,
    parse_activation_request,
    parse_activation_response,
    running_request_body,
    start_failure_request_body,
    starting_request_body,
)
from qinglong_edge.contracts.ingress import CallError, worker_call_path
from tests.contracts import vector_rx as vr

CODE = "activation_response_invalid"
RUNNING_ARGS = {"executor_handle": vr.HANDLE, "log_artifact_id": vr.LOG_ID, "callback_sequence": 1,
                "callback_token_digest": vr.TOKEN_DIGEST}


def parse(data: bytes, operation: str = "starting", offer: dict[str, Any] | None = None) -> ActivationResult:
    return parse_activation_response(data, vr.offer() if offer is None else offer, operation=operation)


def rejects(data: bytes, reason: str, path: str | None = None, operation: str = "starting",
            offer: dict[str, Any] | None = None) -> None:
    with pytest.raises(CallError) as info:
        parse(data, operation, offer)
    assert (info.value.code, info.value.reason) == (CODE, reason), (info.value.reason, info.value.path)
    if path is not None:
        assert info.value.path == path


def snapshot(**changes: Any) -> bytes:
    doc = vr.decoded(vr.STARTING_APPLIED)
    for key, value in changes.items():
        if value is vr.DELETE:
            doc["snapshot"].pop(key)
        else:
            doc["snapshot"][key] = value
    return vr.body(doc)


def answer(status: str, snap: dict[str, Any]) -> bytes:
    return vr.body({"schema": "qinglong/remote-run-activation@v1", "status": status, "snapshot": snap})


BASE = {"runId": "run-1", "attemptId": "attempt-1", "leaseVersion": 3, "leaseGeneration": 1, "callbackSequence": 0}
SHAPES: dict[str, dict[str, Any]] = {
    "starting": {**BASE, "runStatus": "dispatching", "attemptStatus": "starting"},
    "running": {**BASE, "runStatus": "running", "attemptStatus": "running", "executorHandle": "h",
                "startedAtMs": 5},
    "failed": {**BASE, "runStatus": "failed", "attemptStatus": "failed", "finishedAtMs": 9,
               "errorCode": "EXECUTOR_START_FAILED"},
    "cancelled": {**BASE, "runStatus": "cancelled", "attemptStatus": "cancelled", "finishedAtMs": 9,
                  "errorCode": "EXECUTION_CANCELLED"},
    "timed_out": {**BASE, "runStatus": "timed_out", "attemptStatus": "timed_out", "finishedAtMs": 9,
                  "errorCode": "EXECUTION_TIMED_OUT"},
    # not a valid shape:
    "workflow_starting": {**BASE, "runStatus": "running", "attemptStatus": "starting"},
    "succeeded": {**BASE, "runStatus": "succeeded", "attemptStatus": "succeeded", "finishedAtMs": 9,
                  "errorCode": "X"},
    "lost": {**BASE, "runStatus": "lost", "attemptStatus": "lost", "finishedAtMs": 9, "errorCode": "X"},
    "mixed_terminal": {**BASE, "runStatus": "failed", "attemptStatus": "cancelled", "finishedAtMs": 9,
                       "errorCode": "X"},
    "starting_with_handle": {**BASE, "runStatus": "dispatching", "attemptStatus": "starting", "executorHandle": "h"},
    "starting_with_error": {**BASE, "runStatus": "dispatching", "attemptStatus": "starting", "errorCode": "E"},
    "running_without_start": {**BASE, "runStatus": "running", "attemptStatus": "running", "executorHandle": "h"},
    "running_finished": {**BASE, "runStatus": "running", "attemptStatus": "running", "executorHandle": "h",
                         "startedAtMs": 5, "finishedAtMs": 6},
    "terminal_without_error": {**BASE, "runStatus": "failed", "attemptStatus": "failed", "finishedAtMs": 9},
    "terminal_with_handle": {**BASE, "runStatus": "failed", "attemptStatus": "failed", "finishedAtMs": 9,
                             "errorCode": "X", "executorHandle": "h"},
}
SHAPE_OF = {"starting": "starting", "running": "running", "failed": "terminal", "cancelled": "terminal",
            "timed_out": "terminal"}
PAIRING = {"already_starting": "starting", "already_running": "running", "already_terminal": "terminal"}


# --- golden vectors ------------------------------------------------------------------------------------


def test_starting_and_start_failure_bodies_are_section_6() -> None:
    assert starting_request_body(vr.offer()) == vr.STARTING
    assert len(vr.STARTING) == 193
    assert start_failure_request_body(vr.offer()) == vr.STARTING
    assert worker_call_path("edge-1", vr.SESSION, "starting") == vr.PATH_PREFIX + "starting"
    assert worker_call_path("edge-1", vr.SESSION, "start-failure") == vr.PATH_PREFIX + "start-failure"
    assert worker_call_path("edge-1", vr.SESSION, "running") == vr.PATH_PREFIX + "running"


def test_running_body_is_section_6() -> None:
    data = running_request_body(vr.offer(), **RUNNING_ARGS)
    assert data == vr.RUNNING
    assert len(data) == 550


def test_the_handle_encodes_the_section_6_identity() -> None:
    import base64

    payload = vr.HANDLE.removeprefix("ql3lp1.")
    assert base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)) == vr.HANDLE_JSON


def test_the_sample_answers_are_accepted() -> None:
    first = parse(vr.STARTING_APPLIED)
    assert (first.status, first.shape, first.callback_sequence, first.lease_version) == ("applied", "starting", 0, 3)
    replay = parse(vr.STARTING_REPLAY)
    assert replay.status == "already_starting"
    assert next_callback_sequence(replay) == 1
    running = parse(vr.RUNNING_APPLIED, "running")
    assert (running.status, running.shape) == ("applied", "running")
    assert running.snapshot["executorHandle"] == vr.HANDLE
    assert running.deadline_at_ms is None


def test_server_side_view_round_trips() -> None:
    assert parse_activation_request(vr.STARTING, "starting") == vr.decoded(vr.STARTING)
    assert parse_activation_request(vr.STARTING, "start-failure") == vr.decoded(vr.STARTING)
    assert parse_activation_request(vr.RUNNING, "running") == vr.decoded(vr.RUNNING)
    nulled = running_request_body(vr.offer(), **{**RUNNING_ARGS, "log_artifact_id": None})
    assert vr.decoded(nulled)["logArtifactId"] is None
    assert parse_activation_request(nulled, "running")["logArtifactId"] is None
    with pytest.raises(CallError) as info:
        parse_activation_request(vr.STARTING, "running")
    assert (info.value.code, info.value.reason) == ("activation_request_invalid", "key_set")
    with pytest.raises(CallError):
        parse_activation_request(vr.RUNNING, "starting")


# --- status x shape ------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ACTIVATION_STATUSES)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_status_and_shape_pairing(status: str, shape: str) -> None:
    data = answer(status, SHAPES[shape])
    kind = SHAPE_OF.get(shape)
    if kind is None:
        rejects(data, "snapshot_shape", "$.snapshot")
    elif status in PAIRING and PAIRING[status] != kind:
        rejects(data, "status_shape", "$.status")
    elif status == "already_starting":
        rejects(data, "status", "$.status", operation="start-failure")  # issue 23 item 8
    else:
        result = parse(data, "start-failure")
        assert (result.status, result.shape) == (status, kind)


def test_start_failure_never_accepts_already_starting() -> None:
    """Issue 23 item 8: a start-failure report answered ``already_starting`` did not apply
    the failure (the reference treats that answer as invalid and retries), so it is never
    taken as acknowledged."""
    rejects(answer("already_starting", SHAPES["starting"]), "status", "$.status", operation="start-failure")
    assert parse(answer("already_terminal", SHAPES["failed"]), "start-failure").status == "already_terminal"


def test_running_never_accepts_already_starting() -> None:
    rejects(answer("already_starting", SHAPES["starting"]), "status", "$.status", operation="running")
    assert parse(answer("already_terminal", SHAPES["failed"]), "running").status == "already_terminal"


@pytest.mark.parametrize("status", ["already_running", "already_terminal"])
def test_the_sequence_replay_needs_applied_or_already_starting(status: str) -> None:
    shape = "running" if status == "already_running" else "failed"
    with pytest.raises(CallError) as info:
        next_callback_sequence(parse(answer(status, SHAPES[shape])))
    assert (info.value.code, info.value.reason) == (CODE, "status")


def test_the_next_sequence_stays_int31() -> None:
    result = parse(snapshot(callbackSequence=2**31 - 1))
    with pytest.raises(CallError) as info:
        next_callback_sequence(result)
    assert info.value.reason == "callback_sequence"
    assert next_callback_sequence(parse(snapshot(callbackSequence=2**31 - 2))) == 2**31 - 1


# --- the envelope and snapshot fields -------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["runId", "attemptId", "runStatus", "attemptStatus", "leaseVersion",
                                 "leaseGeneration", "callbackSequence"])
def test_a_missing_snapshot_key_is_rejected(key: str) -> None:
    rejects(snapshot(**{key: vr.DELETE}), "key_set", f"$.snapshot.{key}")


@pytest.mark.parametrize("key", ["schema", "status", "snapshot"])
def test_a_missing_envelope_key_is_rejected(key: str) -> None:
    rejects(vr.with_key(vr.STARTING_APPLIED, (key,), vr.DELETE), "key_set", f"$.{key}")


def test_unknown_keys_and_duplicates_are_rejected() -> None:
    rejects(vr.with_key(vr.STARTING_APPLIED, ("extra",), 1), "key_set", "$.extra")
    rejects(snapshot(extra=1), "key_set", "$.snapshot.extra")
    rejects(vr.duplicated(vr.STARTING_APPLIED, "status"), "duplicate_key", "$.status")


@pytest.mark.parametrize("key", ["deadlineAtMs", "startedAtMs", "finishedAtMs", "executorHandle", "logArtifactId",
                                 "errorCode"])
def test_an_optional_key_set_to_null_is_not_absent(key: str) -> None:
    with pytest.raises(CallError) as info:
        parse(snapshot(**{key: None}))
    assert info.value.reason in ("not_integer", "not_string")
    assert info.value.path == f"$.snapshot.{key}"


@pytest.mark.parametrize(
    ("changes", "reason", "path"),
    [
        ({"schema": "qinglong/remote-run-activation@v2"}, "schema", "$.schema"),
        ({"status": "running"}, "status", "$.status"),
        ({"status": None}, "status", "$.status"),
        ({"snapshot": []}, "not_object", "$.snapshot"),
    ],
)
def test_envelope_values(changes: dict[str, Any], reason: str, path: str) -> None:
    doc = {**vr.decoded(vr.STARTING_APPLIED), **changes}
    rejects(vr.body(doc), reason, path)


@pytest.mark.parametrize("field", ["runStatus", "attemptStatus"])
@pytest.mark.parametrize("value", ["bogus", None, 1, "RUNNING"])
def test_statuses_come_from_the_run_lists(field: str, value: Any) -> None:
    rejects(snapshot(**{field: value}), "run_status" if field == "runStatus" else "attempt_status")


def test_every_listed_status_is_known() -> None:
    assert len(RUN_STATUSES) == 11
    assert len(RUN_ATTEMPT_STATUSES) == 8


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("leaseVersion", 2**31, "out_of_range"),
        ("leaseVersion", 2**53 - 1, "out_of_range"),
        ("leaseVersion", 2**53, "integer_out_of_range"),
        ("leaseVersion", -1, "out_of_range"),
        ("leaseVersion", 3.0, "not_integer"),
        ("leaseVersion", "3", "not_integer"),
        ("leaseVersion", True, "not_integer"),
        ("leaseGeneration", 2**31, "out_of_range"),
        ("leaseGeneration", 0, "echo_mismatch"),  # the parser takes 0; check 3 refuses it
        ("callbackSequence", 2**31, "out_of_range"),
        ("callbackSequence", -1, "out_of_range"),
        ("leaseVersion", 0, "lease_version"),
        ("leaseVersion", 2**31 - 1, "lease_version"),
        ("runId", "run-2", "echo_mismatch"),
        ("runId", "r" * 37, "length"),
        ("runId", "r" * 36, "echo_mismatch"),
        ("runId", "", "length"),
        ("runId", "run\n1", "control_character"),
        ("attemptId", "a" * 37, "length"),
        ("attemptId", 7, "not_string"),
    ],
)
def test_snapshot_values_and_boundaries(field: str, value: Any, reason: str) -> None:
    rejects(snapshot(**{field: value}), reason, f"$.snapshot.{field}")


def test_integer_boundaries_that_pass() -> None:
    assert parse(snapshot(callbackSequence=2**31 - 1)).callback_sequence == 2**31 - 1
    assert parse(snapshot(callbackSequence=0)).callback_sequence == 0


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("executorHandle", "h" * 512, None),
        ("executorHandle", "h" * 513, "length"),
        ("executorHandle", "", "length"),
        ("executorHandle", "h\x00", "control_character"),
        ("logArtifactId", "l" * 36, None),
        ("logArtifactId", "l" * 37, "length"),
        ("startedAtMs", 2**53 - 1, None),
        ("startedAtMs", 2**53, "integer_out_of_range"),
        ("startedAtMs", -1, "out_of_range"),
    ],
)
def test_running_snapshot_fields(field: str, value: Any, reason: str | None) -> None:
    data = answer("applied", {**SHAPES["running"], field: value})
    if reason is None:
        assert parse(data, "running").snapshot[field] == value
    else:
        rejects(data, reason, f"$.snapshot.{field}", operation="running")


@pytest.mark.parametrize(("value", "reason"), [("E" * 128, None), ("E" * 129, "length"), ("", "length"),
                                               ("E\x1f", "control_character")])
def test_terminal_error_code(value: str, reason: str | None) -> None:
    data = answer("already_terminal", {**SHAPES["failed"], "errorCode": value})
    if reason is None:
        assert parse(data, "start-failure").shape == "terminal"
    else:
        rejects(data, reason, "$.snapshot.errorCode", operation="start-failure")


# --- worker checks 4 and 6 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("operation", "version", "ok"), [
    ("starting", 3, True), ("starting", 4, False), ("starting", 2, False),
    ("running", 3, True), ("running", 4, False),
    ("start-failure", 3, True), ("start-failure", 4, True), ("start-failure", 5, False), ("start-failure", 2, False),
])
def test_lease_version_bounds(operation: str, version: int, ok: bool) -> None:
    shape = {"starting": "starting", "running": "running", "start-failure": "failed"}[operation]
    data = answer("applied", {**SHAPES[shape], "leaseVersion": version})
    if ok:
        assert parse(data, operation).lease_version == version
    else:
        rejects(data, "lease_version", "$.snapshot.leaseVersion", operation=operation)


def test_deadline_iff_timeout() -> None:
    timed = vr.offer_with_revision(timeoutMs=60_000)
    with_deadline = snapshot(deadlineAtMs=1700000060000)
    assert parse(with_deadline, offer=timed).deadline_at_ms == 1700000060000
    rejects(vr.STARTING_APPLIED, "deadline", "$.snapshot.deadlineAtMs", offer=timed)
    rejects(with_deadline, "deadline", "$.snapshot.deadlineAtMs")


# --- size, bytes, request limits ------------------------------------------------------------------------------


def test_response_size_cap() -> None:
    assert parse(vr.padded(vr.STARTING_APPLIED, ACTIVATION_RESPONSE_MAX_BYTES)).status == "applied"
    rejects(vr.padded(vr.STARTING_APPLIED, ACTIVATION_RESPONSE_MAX_BYTES + 1), "too_large", "$")
    rejects(b"{", "too_small")
    rejects(b"\xff\xfe", "invalid_utf8")
    rejects(vr.STARTING_APPLIED + b"x", "trailing_data")
    rejects(b"[]", "not_object")


def test_an_unknown_operation_is_rejected() -> None:
    rejects(vr.STARTING_APPLIED, "pattern", "$.operation", operation="lease-control")


def offer_with(**changes: Any) -> dict[str, Any]:
    value = vr.offer()
    for dotted, new in changes.items():
        target = value
        parts = dotted.split("__")
        for part in parts[:-1]:
            target = target[part]
        target[parts[-1]] = new
    return value


@pytest.mark.parametrize(
    ("changes", "reason", "path"),
    [
        ({"candidate__runId": "r" * 37}, "length", "$.runId"),
        ({"candidate__attemptId": "a" * 37}, "length", "$.attemptId"),
        ({"offerId": "o" * 129}, "length", "$.offerId"),
        ({"worker__generation": 2**31}, "out_of_range", "$.workerGeneration"),
        ({"worker__generation": 0}, "out_of_range", "$.workerGeneration"),
        ({"lease__leaseGeneration": 0}, "out_of_range", "$.leaseGeneration"),
        ({"lease__version": -1}, "out_of_range", "$.expectedLeaseVersion"),
        ({"lease__version": 2**31}, "out_of_range", "$.expectedLeaseVersion"),
        ({"leaseToken": "short"}, "length", "$.leaseToken"),
        ({"leaseToken": "x" * 31 + "!"}, "pattern", "$.leaseToken"),
        ({"worker__workerId": "-bad"}, "pattern", "$.workerId"),
        ({"worker__sessionId": "not-a-session"}, "length", "$.sessionId"),
    ],
)
def test_request_limits(changes: dict[str, Any], reason: str, path: str) -> None:
    with pytest.raises(CallError) as info:
        starting_request_body(offer_with(**changes))
    assert (info.value.code, info.value.reason, info.value.path) == ("activation_request_invalid", reason, path)
    assert vr.SECRET_TEXTS[0] not in str(info.value)


def test_request_boundaries_that_pass() -> None:
    body = starting_request_body(offer_with(candidate__runId="r" * 36, lease__version=2**31 - 1,
                                            worker__generation=2**31 - 1))
    assert json.loads(body)["expectedLeaseVersion"] == 2**31 - 1


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"executor_handle": "h" * 513}, "$.executorHandle"),
        ({"executor_handle": ""}, "$.executorHandle"),
        ({"log_artifact_id": "l" * 37}, "$.logArtifactId"),
        ({"callback_sequence": 0}, "$.callbackSequence"),
        ({"callback_sequence": 2**31}, "$.callbackSequence"),
        ({"callback_token_digest": "A" * 64}, "$.callbackTokenDigest"),
    ],
)
def test_running_request_limits(changes: dict[str, Any], path: str) -> None:
    with pytest.raises(CallError) as info:
        running_request_body(vr.offer(), **{**RUNNING_ARGS, **changes})
    assert (info.value.code, info.value.path) == ("activation_request_invalid", path)


def test_a_missing_offer_part_is_a_request_error() -> None:
    broken = vr.offer()
    del broken["lease"]
    with pytest.raises(CallError) as info:
        starting_request_body(broken)
    assert (info.value.reason, info.value.path) == ("key_set", "$.offer.lease")
    with pytest.raises(CallError):
        starting_request_body("not an offer")  # type: ignore[arg-type]


# --- properties -------------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**54), 2**54) | st.text(max_size=12)
    | st.sampled_from(["applied", "already_running", "running", "dispatching", "starting", "run-1", "attempt-1"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["schema", "status", "snapshot", "runId", "attemptId", "runStatus", "attemptStatus",
                         "leaseVersion", "leaseGeneration", "callbackSequence", "startedAtMs", "x"]),
        children, max_size=8),
    max_leaves=25,
)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.binary(max_size=300))
def test_arbitrary_bytes_give_only_the_call_error(data: bytes) -> None:
    for operation in ("starting", "start-failure", "running"):
        vr.only_call_errors(lambda op=operation: parse(data, op), CODE)
        vr.only_call_errors(lambda op=operation: parse_activation_request(data, op), "activation_request_invalid")


@SETTINGS
@given(json_values)
def test_arbitrary_json_gives_only_the_call_error(value: Any) -> None:
    data = json.dumps(value).encode()
    vr.only_call_errors(lambda: parse(data), CODE)
    vr.only_call_errors(lambda: parse_activation_response(vr.STARTING_APPLIED, value, operation="starting"), CODE)
    vr.only_call_errors(lambda: starting_request_body(value), "activation_request_invalid")


@SETTINGS
@given(st.sampled_from([*sorted(BASE), "runStatus", "attemptStatus"]), json_values)
def test_mutated_snapshots_are_valid_or_refused(key: str, value: Any) -> None:
    result = vr.only_call_errors(lambda: parse(snapshot(**{key: value})), CODE)
    if result is not None:
        assert result.snapshot["runId"] == "run-1" and result.snapshot["leaseGeneration"] == 1
        assert result.lease_version == 3


ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._:", min_size=1, max_size=36)


@SETTINGS
@given(ids, ids, st.integers(1, 2**31 - 1), st.integers(1, 2**31 - 1), st.integers(0, 2**31 - 1),
       st.text(alphabet="AZaz09_-", min_size=32, max_size=128), st.integers(1, 2**31 - 1))
def test_built_requests_round_trip_through_the_server_view(  # noqa: PLR0917 (hypothesis arguments)
    run_id: str, attempt_id: str, generation: int, lease_generation: int, version: int, token: str, sequence: int,
) -> None:
    offer = vr.offer()
    offer["candidate"].update(runId=run_id, attemptId=attempt_id)
    offer["worker"]["generation"] = generation
    offer["lease"].update(leaseGeneration=lease_generation, version=version)
    offer["leaseToken"] = token
    body = starting_request_body(offer)
    assert parse_activation_request(body, "starting") == {
        "runId": run_id, "attemptId": attempt_id, "workerGeneration": generation, "offerId": "offer-1",
        "leaseGeneration": lease_generation, "leaseToken": token, "expectedLeaseVersion": version}
    running = running_request_body(offer, **{**RUNNING_ARGS, "callback_sequence": sequence})
    assert parse_activation_request(running, "running")["callbackSequence"] == sequence
