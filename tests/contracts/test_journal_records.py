"""Worker journal record formats (offer-delivery.md 3.3-3.6, 4.2; spec README "abandoned")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.journal_records import (
    INBOX_FIELD_STATES,
    INBOX_STATES,
    INBOX_TRANSITIONS,
    MAX_RECORD_BYTES,
    PendingClaim,
    abandoned_record_bytes,
    check_inbox_update,
    inbox_record,
    inbox_record_bytes,
    normalize_inbox_record,
    parse_abandoned_record,
    parse_inbox_record,
    parse_pending_claim,
)
from qinglong_edge.contracts.offer import OfferedResponse, parse_offer_response
from tests.contracts import vector_a as va

# --- section 4.2 byte equality ---------------------------------------------------------------------


def test_pending_claim_created_at_1000_is_byte_identical_to_section_4_2() -> None:
    claim = PendingClaim.create(va.AUTHORITY, 1000)
    assert claim.to_bytes() == va.PENDING_CLAIM
    assert claim.to_bytes().endswith(b"}\n")


def test_inbox_record_accepted_at_1001_is_byte_identical_to_section_4_2() -> None:
    result = parse_offer_response(va.OFFERED, va.AUTHORITY)
    assert isinstance(result, OfferedResponse)
    data = inbox_record_bytes(inbox_record(result.offer, 1001))
    assert len(data) == 1584
    assert data == va.INBOX_RECORD


def test_pending_claim_round_trips() -> None:
    claim = parse_pending_claim(va.PENDING_CLAIM)
    assert claim == PendingClaim.create(va.AUTHORITY, 1000)
    assert claim.authority == va.AUTHORITY
    assert va.LEASE_TOKEN not in repr(claim)


def test_claim_revisions_of_section_4_2_are_valid() -> None:
    claim = PendingClaim.create(va.AUTHORITY, 1000)
    rev1 = claim.replace(revision=1, attempt_count=1, last_attempt_at_ms=1000, updated_at_ms=1000,
                         next_attempt_at_ms=1000)
    rev2 = rev1.replace(revision=2, updated_at_ms=1000, next_attempt_at_ms=1500)
    parsed = parse_pending_claim(rev2.to_bytes())
    assert (parsed.revision, parsed.attempt_count, parsed.next_attempt_at_ms) == (2, 1, 1500)


def test_inbox_record_round_trips() -> None:
    record = parse_inbox_record(va.INBOX_RECORD, "offer-1")
    assert record["state"] == "accepted"
    assert inbox_record_bytes(record) == va.INBOX_RECORD


# --- pending claim rules (3.3) -------------------------------------------------------------------------


def claim_bytes(**changes: Any) -> bytes:
    value = json.loads(va.PENDING_CLAIM)
    for key, new in changes.items():
        if new is DELETE:
            del value[key]
        else:
            value[key] = new
    return va.compact(value) + b"\n"


DELETE = object()


@pytest.mark.parametrize(
    ("changes", "code", "path"),
    [
        ({"extra": 1}, "claim_conflict", "$.extra"),
        ({"attemptCount": DELETE}, "claim_conflict", "$.attemptCount"),
        ({"schemaVersion": 2}, "claim_conflict", "$.schemaVersion"),
        ({"schemaVersion": True}, "claim_conflict", "$.schemaVersion"),
        ({"schemaVersion": 1.0}, "claim_conflict", "$.schemaVersion"),
        ({"attemptCount": 17}, "claim_conflict", "$.attemptCount"),
        ({"attemptCount": -1}, "claim_conflict", "$.attemptCount"),
        ({"revision": -1}, "claim_revision_conflict", "$.revision"),
        ({"revision": "0"}, "claim_revision_conflict", "$.revision"),
        ({"createdAtMs": -1}, "invalid_configuration", "$.createdAtMs"),
        ({"updatedAtMs": 1.5}, "invalid_configuration", "$.updatedAtMs"),
        ({"nextAttemptAtMs": None}, "invalid_configuration", "$.nextAttemptAtMs"),
        ({"updatedAtMs": 999}, "claim_conflict", "$.updatedAtMs"),
        ({"nextAttemptAtMs": 999}, "claim_conflict", "$.nextAttemptAtMs"),
        ({"lastAttemptAtMs": 999}, "claim_conflict", "$.lastAttemptAtMs"),
        ({"lastAttemptAtMs": 1001}, "claim_conflict", "$.lastAttemptAtMs"),
        ({"lastAttemptAtMs": "1000"}, "claim_conflict", "$.lastAttemptAtMs"),
        ({"workerId": "edge 1"}, "pattern", "$.workerId"),
        ({"workerSessionId": "x"}, "length", "$.workerSessionId"),
        ({"workerGeneration": 0}, "out_of_range", "$.workerGeneration"),
        ({"offerId": "a/b"}, "pattern", "$.offerId"),
        ({"leaseToken": "short"}, "length", "$.leaseToken"),
    ],
)
def test_rejects_an_invalid_pending_claim(changes: dict[str, Any], code: str, path: str) -> None:
    with pytest.raises(ContractError) as info:
        parse_pending_claim(claim_bytes(**changes))
    assert (info.value.code, info.value.path) == (code, path)
    assert va.LEASE_TOKEN not in str(info.value)


@pytest.mark.parametrize("data", [b"[]", b"null", b'"x"'])
def test_rejects_a_pending_claim_that_is_not_an_object(data: bytes) -> None:
    with pytest.raises(ContractError) as info:
        parse_pending_claim(data)
    assert info.value.code == "claim_conflict"


@pytest.mark.parametrize(("data", "code"), [(b"{", "too_small"), (b"{}" + b" " * MAX_RECORD_BYTES, "too_large"),
                                            (va.PENDING_CLAIM[:-3], "invalid_json")])
def test_rejects_a_pending_claim_that_is_not_json(data: bytes, code: str) -> None:
    with pytest.raises(ContractError) as info:
        parse_pending_claim(data)
    assert info.value.code == code


def test_replace_revalidates_the_claim() -> None:
    claim = PendingClaim.create(va.AUTHORITY, 1000)
    with pytest.raises(ContractError) as info:
        claim.replace(attempt_count=17)
    assert info.value.code == "claim_conflict"


# --- inbox record (3.4) ---------------------------------------------------------------------------------


def record(**changes: Any) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(va.INBOX_RECORD)
    value.update(changes)
    return value


LAUNCH = {"executorStartedAtMs": 1002, "logArtifactId": "wlog-1", "completionReceiptCallbackSequence": 1,
          "completionReceiptTokenDigest": "a" * 64}
STARTED = {**LAUNCH, "executorHandle": "pid:42"}


@pytest.mark.parametrize(
    ("state", "fields"),
    [
        ("accepted", {}),
        ("starting_acknowledged", {}),
        ("launching", LAUNCH),
        ("started", STARTED),
        ("running_acknowledged", STARTED),
        ("start_failed", {}),
        ("start_failed", LAUNCH),
        ("start_failure_acknowledged", {}),
        ("completion_acknowledged", {**LAUNCH, "completionAcknowledgedAtMs": 1003}),
        ("completion_acknowledged", {**STARTED, "completionAcknowledgedAtMs": 1003}),
        ("recovery_required", {"recoveryReason": "launch_outcome_unknown"}),
        ("recovery_required", {**STARTED, "recoveryReason": "lease_lost_local_execution_stopped"}),
    ],
)
def test_accepts_each_state_with_its_fields(state: str, fields: dict[str, Any]) -> None:
    normalized = normalize_inbox_record(record(state=state, **fields))
    optional = [key for key in normalized if key not in ("schemaVersion", "revision", "state", "offer",
                                                          "acceptedAtMs", "updatedAtMs")]
    order = [key for key in ("executorHandle", "executorStartedAtMs", "logArtifactId",
                             "completionReceiptCallbackSequence", "completionReceiptTokenDigest",
                             "completionAcknowledgedAtMs", "recoveryReason") if key in fields]
    assert optional == order


@pytest.mark.parametrize(
    ("state", "fields", "path"),
    [
        ("accepted", {"logArtifactId": "wlog-1"}, "$.logArtifactId"),
        ("starting_acknowledged", {"executorStartedAtMs": 1}, "$.executorStartedAtMs"),
        ("launching", {}, "$.executorStartedAtMs"),
        ("started", LAUNCH, "$.executorHandle"),
        ("launching", {**LAUNCH, "completionReceiptTokenDigest": None}, "pattern"),
        ("launching", {k: v for k, v in LAUNCH.items() if k != "completionReceiptTokenDigest"},
         "$.completionReceiptTokenDigest"),
        ("completion_acknowledged", LAUNCH, "$.completionAcknowledgedAtMs"),
        ("accepted", {"completionAcknowledgedAtMs": 1}, "$.completionAcknowledgedAtMs"),
        ("recovery_required", {}, "$.recoveryReason"),
        ("accepted", {"recoveryReason": "launch_outcome_unknown"}, "$.recoveryReason"),
        ("start_failed", {"executorHandle": "h", "executorStartedAtMs": 1}, "$.executorHandle"),
        ("recovery_required", {"executorHandle": "h", "recoveryReason": "control_plane_terminal"},
         "$.executorStartedAtMs"),
    ],
)
def test_rejects_optional_fields_the_state_does_not_allow(state: str, fields: dict[str, Any], path: str) -> None:
    with pytest.raises(ContractError) as info:
        normalize_inbox_record(record(state=state, **fields))
    if path == "pattern":  # the value itself is invalid before the state rules run
        assert info.value.code == "pattern"
    else:
        assert (info.value.code, info.value.path) == ("invalid_record", path)


@pytest.mark.parametrize(
    ("changes", "code", "path"),
    [
        ({"schemaVersion": 2}, "schema_version", "$.schemaVersion"),
        ({"state": "running"}, "inbox_state", "$.state"),
        ({"unexpected": 1}, "key_set", "$.unexpected"),
        ({"revision": -1}, "out_of_range", "$.revision"),
        ({"updatedAtMs": 1000}, "record_order", "$.updatedAtMs"),
        ({"state": "started", **STARTED, "executorHandle": "x" * 513}, "length", "$.executorHandle"),
        ({"state": "started", **STARTED, "executorHandle": "a\nb"}, "control_character", "$.executorHandle"),
        ({"state": "launching", **LAUNCH, "logArtifactId": "x" * 37}, "length", "$.logArtifactId"),
        ({"state": "launching", **LAUNCH, "completionReceiptCallbackSequence": 2**31}, "out_of_range",
         "$.completionReceiptCallbackSequence"),
        ({"state": "launching", **LAUNCH, "completionReceiptTokenDigest": "A" * 64}, "pattern",
         "$.completionReceiptTokenDigest"),
        ({"state": "recovery_required", "recoveryReason": "oops"}, "recovery_reason", "$.recoveryReason"),
    ],
)
def test_rejects_an_invalid_inbox_record(changes: dict[str, Any], code: str, path: str) -> None:
    with pytest.raises(ContractError) as info:
        normalize_inbox_record(record(**changes))
    assert (info.value.code, info.value.path) == (code, path)


def test_rejects_an_inbox_record_with_a_corrupt_offer() -> None:
    value = record()
    value["offer"]["executionRevision"]["command"]["args"] = ["evil.js"]
    with pytest.raises(ContractError) as info:
        parse_inbox_record(va.compact(value) + b"\n")
    assert (info.value.code, info.value.path) == ("digest_mismatch", "$.offer.executionRevision.contentDigest")


def test_rejects_an_inbox_record_under_another_file_name() -> None:
    with pytest.raises(ContractError) as info:
        parse_inbox_record(va.INBOX_RECORD, "offer-2")
    assert info.value.code == "offer_conflict"


def test_rejects_an_inbox_record_over_160_kib() -> None:
    big = va.INBOX_RECORD[:-2] + b" " * MAX_RECORD_BYTES + b"}\n"
    with pytest.raises(ContractError) as info:
        parse_inbox_record(big)
    assert info.value.code == "too_large"


def test_inbox_record_rejects_a_negative_time() -> None:
    result = parse_offer_response(va.OFFERED, va.AUTHORITY)
    assert isinstance(result, OfferedResponse)
    with pytest.raises(ContractError):
        inbox_record(result.offer, -1)


# --- transitions and updates (3.4, 3.6) --------------------------------------------------------------------


def test_transition_table_is_section_3_4() -> None:
    assert set(INBOX_TRANSITIONS) == set(INBOX_STATES)
    for state, targets in INBOX_TRANSITIONS.items():
        assert state in targets
    assert INBOX_TRANSITIONS["start_failure_acknowledged"] == {"start_failure_acknowledged"}
    assert INBOX_TRANSITIONS["completion_acknowledged"] == {"completion_acknowledged"}
    assert INBOX_TRANSITIONS["recovery_required"] == {"recovery_required", "completion_acknowledged"}
    assert INBOX_TRANSITIONS["launching"] == {"launching", "started", "start_failed", "completion_acknowledged",
                                              "recovery_required"}
    assert set(INBOX_FIELD_STATES) <= {"executorHandle", "executorStartedAtMs", "logArtifactId",
                                       "completionReceiptCallbackSequence", "completionAcknowledgedAtMs",
                                       "recoveryReason", "resultStartedAtMs"}


def base() -> dict[str, Any]:
    return parse_inbox_record(va.INBOX_RECORD)


def test_accepts_a_valid_update() -> None:
    old = base()
    new = {**old, "revision": 1, "state": "starting_acknowledged", "updatedAtMs": 1002}
    check_inbox_update(old, new)


def test_accepts_a_lease_renewal_update() -> None:
    old = base()
    offer = json.loads(va.compact(old["offer"]))
    offer["lease"].update(version=4, renewedAtMs=25, expiresAtMs=40000, updatedAtMs=25)
    check_inbox_update(old, {**old, "revision": 1, "offer": offer, "updatedAtMs": 1005})


def test_accepts_a_lease_recovery_replay_over_a_new_claim() -> None:
    # spec README: authority compared without deliveryKind.
    old = base()
    offer = json.loads(va.compact(old["offer"]))
    offer["deliveryKind"] = "lease_recovery"
    offer["lease"].update(version=4)
    new = {**old, "revision": 1, "offer": offer, "updatedAtMs": 1005}
    check_inbox_update(old, new)
    with pytest.raises(ContractError) as info:
        check_inbox_update(old, new, compare_delivery_kind=True)
    assert info.value.code == "offer_conflict"


def with_lease(old: dict[str, Any], **lease: Any) -> dict[str, Any]:
    offer = json.loads(va.compact(old["offer"]))
    offer["lease"].update(lease)
    return offer


@pytest.mark.parametrize(
    ("make", "code"),
    [
        (lambda o: {**o, "revision": 2}, "offer_revision_conflict"),
        (lambda o: {**o, "revision": 0}, "offer_revision_conflict"),
        (lambda o: {**o, "revision": 1, "acceptedAtMs": 1000, "updatedAtMs": 1001}, "offer_revision_conflict"),
        (lambda o: {**o, "revision": 1, "updatedAtMs": 1001, "acceptedAtMs": 1001, "state": "launching"},
         "invalid_record"),
        (lambda o: {**o, "revision": 1, "offer": with_lease(o, version=2)}, "offer_revision_conflict"),
        (lambda o: {**o, "revision": 1, "offer": with_lease(o, renewedAtMs=22, updatedAtMs=22)},
         "offer_revision_conflict"),
        (lambda o: {**o, "revision": 1, "state": "running_acknowledged", **STARTED}, "invalid_transition"),
        (lambda o: {**o, "revision": 1, "offer": with_lease(o, leaseGeneration=2)}, "offer_conflict"),
    ],
    ids=["revision-skip", "revision-same", "accepted-changed", "invalid-new", "lease-regress",
         "same-version-different-lease", "state-skip", "authority"],
)
def test_rejects_an_invalid_update(make: Any, code: str) -> None:
    old = base()
    with pytest.raises(ContractError) as info:
        check_inbox_update(old, make(old))
    assert info.value.code == code


def test_rejects_an_updated_at_that_goes_back() -> None:
    old = {**base(), "revision": 3, "updatedAtMs": 1005}
    with pytest.raises(ContractError) as info:
        check_inbox_update(old, {**old, "revision": 4, "updatedAtMs": 1004})
    assert (info.value.code, info.value.path) == ("offer_revision_conflict", "$.updatedAtMs")


def test_rejects_a_changed_optional_field() -> None:
    old = {**base(), "state": "launching", **LAUNCH}
    with pytest.raises(ContractError) as info:
        check_inbox_update(old, {**old, "revision": 1, "logArtifactId": "wlog-2"})
    assert (info.value.code, info.value.path) == ("invalid_transition", "$.logArtifactId")


def test_recovery_reason_may_go_away_on_completion() -> None:
    old = {**base(), "state": "recovery_required", **LAUNCH, "recoveryReason": "launch_outcome_unknown"}
    new = {k: v for k, v in old.items() if k != "recoveryReason"}
    check_inbox_update(old, {**new, "revision": 1, "state": "completion_acknowledged", "updatedAtMs": 1009,
                             "completionAcknowledgedAtMs": 1009})


def test_only_a_launch_outcome_unknown_recovery_completes() -> None:
    # Tightening (remote-execution.md 2.2 T10; contracts/inbox.py): the other reasons are terminal.
    old = {**base(), "state": "recovery_required", **LAUNCH, "recoveryReason": "control_plane_terminal"}
    new = {k: v for k, v in old.items() if k != "recoveryReason"}
    with pytest.raises(ContractError) as info:
        check_inbox_update(old, {**new, "revision": 1, "state": "completion_acknowledged", "updatedAtMs": 1009,
                                 "completionAcknowledgedAtMs": 1009})
    assert (info.value.code, info.value.path) == ("invalid_transition", "$.state")


# --- abandoned claims (spec README) ---------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["stale_session", "attempt_budget_exhausted", "offer_fenced"])
def test_abandoned_record_round_trips_without_the_token(reason: str) -> None:
    claim = PendingClaim.create(va.AUTHORITY, 1000).replace(revision=5, attempt_count=16, last_attempt_at_ms=1200,
                                                            updated_at_ms=1200, next_attempt_at_ms=1300)
    data = abandoned_record_bytes(claim, reason, 2000)
    assert va.LEASE_TOKEN.encode() not in data
    assert data.endswith(b"}\n")
    parsed = parse_abandoned_record(data)
    assert (parsed.reason, parsed.abandoned_at_ms, parsed.offer_id) == (reason, 2000, "offer-1")
    assert parsed.lease_token_digest == va.LEASE_TOKEN_DIGEST
    assert (parsed.attempt_count, parsed.next_attempt_at_ms) == (16, 1300)
    assert json.loads(data)["reason"] == reason


def test_rejects_an_unknown_abandon_reason() -> None:
    with pytest.raises(ContractError) as info:
        abandoned_record_bytes(PendingClaim.create(va.AUTHORITY, 1000), "bored", 1)
    assert info.value.code == "abandon_reason"


@pytest.mark.parametrize(
    ("key", "value", "code"),
    [("reason", "bored", "abandon_reason"), ("leaseTokenDigest", "x", "pattern"), ("extra", 1, "key_set"),
     ("schemaVersion", 0, "schema_version"), ("attemptCount", 99, "claim_conflict"),
     ("abandonedAtMs", -1, "out_of_range")],
)
def test_rejects_an_invalid_abandoned_record(key: str, value: object, code: str) -> None:
    data = abandoned_record_bytes(PendingClaim.create(va.AUTHORITY, 1000), "offer_fenced", 1)
    doc = json.loads(data)
    doc[key] = value
    with pytest.raises(ContractError) as info:
        parse_abandoned_record(va.compact(doc))
    assert info.value.code == code
