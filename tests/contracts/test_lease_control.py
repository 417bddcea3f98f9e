"""Lease-control (remote-execution.md 3.5, 5, 6): statuses, stop, terminal, null rules,
version and time checks, the G2 retry, and the persist rule end to end."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong_edge.contracts.inbox import with_renewed_lease
from qinglong_edge.contracts.ingress import CallError, worker_call_path
from qinglong_edge.contracts.lease_control import (
    LEASE_CONTROL_RESPONSE_MAX_BYTES,
    STOP_REASONS,
    TERMINAL_STATUSES,
    LeaseControlResult,
    lease_control_request_body,
    parse_lease_control_request,
    parse_lease_control_response,
)
from tests.contracts import vector_rx as vr

CODE = "lease_control_response_invalid"


def parse(data: bytes, offer: dict[str, Any] | None = None, **kwargs: Any) -> LeaseControlResult:
    return parse_lease_control_response(data, vr.offer() if offer is None else offer, **kwargs)


def rejects(data: bytes, reason: str, path: str | None = None, **kwargs: Any) -> None:
    with pytest.raises(CallError) as info:
        parse(data, **kwargs)
    assert (info.value.code, info.value.reason) == (CODE, reason), (info.value.reason, info.value.path)
    if path is not None:
        assert info.value.path == path


change = vr.changed


def test_the_request_is_section_6() -> None:
    data = lease_control_request_body(vr.offer())
    assert data == vr.LEASE_CONTROL
    assert len(data) == 268
    assert parse_lease_control_request(data) == vr.decoded(data)
    assert worker_call_path("edge-1", vr.SESSION, "lease-control") == vr.PATH_PREFIX + "lease-control"


def test_the_g2_retry_sends_expected_plus_one() -> None:
    data = lease_control_request_body(vr.offer(), expected_lease_version=4)
    assert json.loads(data)["expectedLeaseVersion"] == 4
    result = parse(vr.RENEWED.replace(b'"leaseVersion":4', b'"leaseVersion":5'), expected_lease_version=4)
    assert result.lease_version == 5
    rejects(vr.RENEWED, "version_mismatch", "$.leaseVersion", expected_lease_version=4)


def test_the_three_sample_answers() -> None:
    renewed = parse(vr.RENEWED)
    assert (renewed.status, renewed.lease_version, renewed.renewed_at_ms, renewed.expires_at_ms) == (
        "renewed", 4, 1700000002000, 1700000032000)
    assert renewed.renews and renewed.stop_reason is None and renewed.terminal_status is None
    stop = parse(vr.STOP_REQUESTED)
    assert (stop.status, stop.stop_reason, stop.stop_requested_at_ms, stop.lease_version) == (
        "stop_requested", "user", 1700000001500, 4)
    terminal = parse(vr.TERMINAL)
    assert (terminal.status, terminal.terminal_status, terminal.lease_version, terminal.renews) == (
        "terminal", "cancelled", None, False)


def test_a_renewal_persists_as_section_6_says() -> None:
    result = parse(vr.RENEWED)
    assert result.lease_version is not None and result.renewed_at_ms is not None and result.expires_at_ms is not None
    record = with_renewed_lease(vr.record(), lease_version=result.lease_version, renewed_at_ms=result.renewed_at_ms,
                                expires_at_ms=result.expires_at_ms)
    lease = record["offer"]["lease"]
    assert (lease["version"], lease["renewedAtMs"], lease["expiresAtMs"], lease["updatedAtMs"]) == (
        4, 1700000002000, 1700000032000, 1700000002000)
    # The next renewal uses the persisted version: 4, answered 5.
    assert json.loads(lease_control_request_body(record["offer"]))["expectedLeaseVersion"] == 4
    nxt = vr.RENEWED.replace(b'"leaseVersion":4', b'"leaseVersion":5')
    assert parse(nxt, record["offer"]).lease_version == 5


def test_a_newer_version_with_an_older_renewed_at_is_accepted() -> None:
    """Spec README "Decisions for clocks": the cluster's clock moved back between two
    renewals; the answer's version is the expected one, so it is a valid renewal."""
    result = parse(change(vr.RENEWED, renewedAtMs=20, expiresAtMs=30020))
    assert (result.lease_version, result.renewed_at_ms, result.expires_at_ms) == (4, 20, 30020)


@pytest.mark.parametrize("reason", STOP_REASONS)
def test_every_stop_reason(reason: str) -> None:
    data = change(vr.STOP_REQUESTED, stop={"reason": reason, "requestedAtMs": 0})
    assert parse(data).stop_reason == reason


@pytest.mark.parametrize("status", TERMINAL_STATUSES)
def test_every_terminal_status(status: str) -> None:
    assert parse(change(vr.TERMINAL, terminalStatus=status)).terminal_status == status


@pytest.mark.parametrize(
    ("source", "changes", "reason", "path"),
    [
        ("renewed", {"status": "expired"}, "status", "$.status"),
        ("renewed", {"schema": "x"}, "schema", "$.schema"),
        ("renewed", {"stop": {"reason": "user", "requestedAtMs": 1}}, "null_field", "$.stop"),
        ("renewed", {"terminalStatus": "failed"}, "null_field", "$.terminalStatus"),
        ("renewed", {"leaseVersion": None}, "not_integer", "$.leaseVersion"),
        ("renewed", {"leaseVersion": 0}, "out_of_range", "$.leaseVersion"),
        ("renewed", {"leaseVersion": 2**31}, "out_of_range", "$.leaseVersion"),
        ("renewed", {"leaseVersion": 3}, "version_mismatch", "$.leaseVersion"),
        ("renewed", {"leaseVersion": 2}, "version_mismatch", "$.leaseVersion"),
        ("renewed", {"leaseVersion": 5}, "version_mismatch", "$.leaseVersion"),
        ("renewed", {"renewedAtMs": None}, "not_integer", "$.renewedAtMs"),
        ("renewed", {"renewedAtMs": 2**53}, "integer_out_of_range", "$.renewedAtMs"),
        ("renewed", {"renewedAtMs": -1}, "out_of_range", "$.renewedAtMs"),
        ("renewed", {"expiresAtMs": 1700000002000}, "lease_order", "$.expiresAtMs"),
        ("renewed", {"projectId": "project-2"}, "echo_mismatch", "$.projectId"),
        ("renewed", {"runId": "run-2"}, "echo_mismatch", "$.runId"),
        ("renewed", {"attemptId": "attempt-2"}, "echo_mismatch", "$.attemptId"),
        ("renewed", {"offerId": "offer-2"}, "echo_mismatch", "$.offerId"),
        ("renewed", {"leaseGeneration": 2}, "echo_mismatch", "$.leaseGeneration"),
        ("renewed", {"leaseGeneration": 0}, "out_of_range", "$.leaseGeneration"),
        ("renewed", {"runId": "r" * 129}, "length", "$.runId"),
        ("renewed", {"projectId": ""}, "length", "$.projectId"),
        ("renewed", {"extra": 1}, "key_set", "$.extra"),
        ("renewed", {"stop": vr.DELETE}, "key_set", "$.stop"),
        ("stop", {"stop": None}, "not_object", "$.stop"),
        ("stop", {"stop": {"reason": "user"}}, "key_set", "$.stop.requestedAtMs"),
        ("stop", {"stop": {"reason": "user", "requestedAtMs": 1, "x": 1}}, "key_set", "$.stop.x"),
        ("stop", {"stop": {"reason": "bored", "requestedAtMs": 1}}, "stop_reason", "$.stop.reason"),
        ("stop", {"stop": {"reason": "user", "requestedAtMs": -1}}, "out_of_range", "$.stop.requestedAtMs"),
        ("stop", {"stop": {"reason": "user", "requestedAtMs": None}}, "not_integer", "$.stop.requestedAtMs"),
        ("stop", {"terminalStatus": "lost"}, "null_field", "$.terminalStatus"),
        ("terminal", {"terminalStatus": None}, "terminal_status", "$.terminalStatus"),
        ("terminal", {"terminalStatus": "running"}, "terminal_status", "$.terminalStatus"),
        ("terminal", {"leaseVersion": 4}, "null_field", "$.leaseVersion"),
        ("terminal", {"renewedAtMs": 1}, "null_field", "$.renewedAtMs"),
        ("terminal", {"expiresAtMs": 1}, "null_field", "$.expiresAtMs"),
        ("terminal", {"stop": {"reason": "user", "requestedAtMs": 1}}, "null_field", "$.stop"),
        ("terminal", {"runId": "run-2"}, "echo_mismatch", "$.runId"),
    ],
)
def test_answer_rules(source: str, changes: dict[str, Any], reason: str, path: str) -> None:
    data = {"renewed": vr.RENEWED, "stop": vr.STOP_REQUESTED, "terminal": vr.TERMINAL}[source]
    rejects(change(data, **changes), reason, path)


def test_time_bounds_that_pass() -> None:
    # renewedAtMs has no int31 bound; requestedAtMs has no order against renewedAtMs.
    data = change(vr.STOP_REQUESTED, renewedAtMs=2**53 - 2, expiresAtMs=2**53 - 1,
                  stop={"reason": "timeout", "requestedAtMs": 2**53 - 1})
    assert parse(data).expires_at_ms == 2**53 - 1
    assert parse(change(vr.RENEWED, renewedAtMs=21, expiresAtMs=22)).renewed_at_ms == 21  # = stored renewedAtMs


def test_a_terminal_answer_has_no_version_check() -> None:
    assert parse(vr.TERMINAL, expected_lease_version=9).status == "terminal"


def test_size_cap_and_bytes() -> None:
    assert parse(vr.padded(vr.RENEWED, LEASE_CONTROL_RESPONSE_MAX_BYTES)).status == "renewed"
    rejects(vr.padded(vr.RENEWED, LEASE_CONTROL_RESPONSE_MAX_BYTES + 1), "too_large")
    rejects(vr.duplicated(vr.RENEWED, "leaseVersion"), "duplicate_key", "$.leaseVersion")
    rejects(b"", "too_small")


@pytest.mark.parametrize(
    ("changes", "reason", "path"),
    [
        ({"candidate__projectId": "p" * 129}, "length", "$.projectId"),
        ({"candidate__runId": "r" * 129}, "length", "$.runId"),
        ({"lease__version": 2**31}, "out_of_range", "$.expectedLeaseVersion"),
        ({"leaseToken": "?" * 43}, "pattern", "$.leaseToken"),
    ],
)
def test_request_limits(changes: dict[str, Any], reason: str, path: str) -> None:
    value = vr.offer()
    for dotted, new in changes.items():
        target = value
        *parts, last = dotted.split("__")
        for part in parts:
            target = target[part]
        target[last] = new
    with pytest.raises(CallError) as info:
        lease_control_request_body(value)
    assert (info.value.code, info.value.reason, info.value.path) == ("lease_control_request_invalid", reason, path)


def test_request_ids_have_no_36_limit() -> None:
    value = vr.offer()
    value["candidate"]["runId"] = "r" * 128
    assert json.loads(lease_control_request_body(value))["runId"] == "r" * 128


def test_server_side_request_rules() -> None:
    assert parse_lease_control_request(change(vr.LEASE_CONTROL, runId="r" * 128))["runId"] == "r" * 128
    for changes in ({"schema": "x"}, {"extra": 1}, {"leaseGeneration": 0}, {"workerGeneration": 2**31},
                    {"expectedLeaseVersion": -1}, {"leaseToken": "t"}, {"projectId": ""}, {"offerId": None}):
        with pytest.raises(CallError) as info:
            parse_lease_control_request(change(vr.LEASE_CONTROL, **changes))
        assert info.value.code == "lease_control_request_invalid"


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**54), 2**54) | st.text(max_size=10)
    | st.sampled_from(["renewed", "stop_requested", "terminal", "user", "cancelled", "run-1", "project-1"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(
        st.sampled_from(["reason", "requestedAtMs", "status", "x"]), children, max_size=3),
    max_leaves=15,
)


@SETTINGS
@given(st.binary(max_size=300))
def test_arbitrary_bytes(data: bytes) -> None:
    vr.only_call_errors(lambda: parse(data), CODE)
    vr.only_call_errors(lambda: parse_lease_control_request(data), "lease_control_request_invalid")


@SETTINGS
@given(st.sampled_from(list(vr.decoded(vr.RENEWED))), json_values, st.sampled_from([vr.RENEWED, vr.STOP_REQUESTED,
                                                                                   vr.TERMINAL]))
def test_mutated_answers_are_valid_or_refused(key: str, value: Any, source: bytes) -> None:
    result = vr.only_call_errors(lambda: parse(change(source, **{key: value})), CODE)
    if result is not None and result.renews:
        assert result.lease_version == 4
        assert result.expires_at_ms is not None and result.renewed_at_ms is not None
        # renewedAtMs is not ordered against the stored lease (spec README "Decisions for clocks")
        assert result.expires_at_ms > result.renewed_at_ms >= 0
    vr.only_call_errors(lambda: lease_control_request_body(value), "lease_control_request_invalid")


@SETTINGS
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=128),
       st.integers(1, 2**31 - 1), st.integers(0, 2**31 - 2), st.integers(21, 2**52))
def test_requests_round_trip_and_answers_persist(project_id: str, lease_generation: int, version: int,
                                                 renewed: int) -> None:
    offer = vr.offer()
    offer["candidate"]["projectId"] = project_id
    offer["lease"].update(leaseGeneration=lease_generation, version=version)
    parsed = parse_lease_control_request(lease_control_request_body(offer))
    assert (parsed["projectId"], parsed["leaseGeneration"], parsed["expectedLeaseVersion"]) == (
        project_id, lease_generation, version)
    answer = change(vr.RENEWED, projectId=project_id, leaseGeneration=lease_generation, leaseVersion=version + 1,
                    renewedAtMs=renewed, expiresAtMs=renewed + 30_000)
    result = parse(answer, offer)
    assert (result.lease_version, result.renewed_at_ms) == (version + 1, renewed)
