"""The inbox state machine (remote-execution.md 2.1-2.3 and 5; offer-delivery.md 3.4/3.6).

Every (state, target) pair, the field rules per state, immutability, revision/time rules,
the lease persist rule, and agreement with ``check_inbox_update`` (the journal's check),
including a real journal driven through a whole lifecycle.
"""

from __future__ import annotations

import copy
import itertools
import json
import pathlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.inbox import (
    INBOX_STATES,
    INBOX_TRANSITIONS,
    NEW_FIELDS,
    RECOVERY_REASONS,
    TERMINAL_STATES,
    advance,
    check_inbox_update,
    normalize_inbox_record,
    to_completion_acknowledged,
    to_launching,
    to_recovery_required,
    to_running_acknowledged,
    to_start_failed,
    to_start_failure_acknowledged,
    to_started,
    to_starting_acknowledged,
    with_renewed_lease,
)
from qinglong_edge.contracts.journal_records import inbox_record_bytes
from tests.contracts import vector_rx as vr

LAUNCH = {"executor_started_at_ms": 1005, "log_artifact_id": vr.LOG_ID, "callback_sequence": 1,
          "callback_token_digest": vr.TOKEN_DIGEST}
LAUNCH_FIELDS = {"executorStartedAtMs": 1005, "logArtifactId": vr.LOG_ID, "completionReceiptCallbackSequence": 1,
                 "completionReceiptTokenDigest": vr.TOKEN_DIGEST}


def path_to(state: str, reason: str = "launch_outcome_unknown") -> dict[str, Any]:
    """A valid record in ``state`` reached by legal steps from the fixture (times 1002...)."""
    accepted = vr.record()
    if state == "accepted":
        return accepted
    starting = to_starting_acknowledged(accepted, 1002)
    if state == "starting_acknowledged":
        return starting
    if state in ("start_failed", "start_failure_acknowledged"):
        failed = to_start_failed(starting, 1003)
        return failed if state == "start_failed" else to_start_failure_acknowledged(failed, 1004)
    launching = to_launching(starting, 1005, **LAUNCH)
    if state == "launching":
        return launching
    if state == "recovery_required":
        return to_recovery_required(launching, 1006, reason)
    started = to_started(launching, 1006, executor_handle=vr.HANDLE)
    if state == "started":
        return started
    running = to_running_acknowledged(started, 1007)
    if state == "running_acknowledged":
        return running
    assert state == "completion_acknowledged"
    return to_completion_acknowledged(running, 1008)


def fields_for(source: dict[str, Any], target: str) -> dict[str, Any]:
    """The fields a step into ``target`` must set (none when the source already has them)."""
    if target == "launching" and "executorStartedAtMs" not in source:
        return dict(LAUNCH_FIELDS)
    if target == "started" and "executorHandle" not in source:
        return {"executorHandle": vr.HANDLE}
    if target == "recovery_required" and "recoveryReason" not in source:
        return {"recoveryReason": "control_plane_terminal"}
    return {}


# --- the whole path, byte for byte --------------------------------------------------------------------


def test_the_section_6_path_writes_the_fields_in_file_order() -> None:
    launching = to_launching(to_starting_acknowledged(vr.record(), 1002), 1005, **LAUNCH)
    data = inbox_record_bytes(launching)
    assert data.endswith(b',"acceptedAtMs":1001,"updatedAtMs":1005,"executorStartedAtMs":1005,'
                         b'"logArtifactId":"wlog-68cd94391d043410683fabcde45b2a","completionReceiptCallbackSequence":1,'
                         b'"completionReceiptTokenDigest":"' + vr.TOKEN_DIGEST.encode() + b'"}\n')
    started = to_started(launching, 1006, executor_handle=vr.HANDLE)
    assert inbox_record_bytes(started).endswith(
        b'"updatedAtMs":1006,"executorHandle":"' + vr.HANDLE.encode() + b'","executorStartedAtMs":1005,'
        b'"logArtifactId":"wlog-68cd94391d043410683fabcde45b2a","completionReceiptCallbackSequence":1,'
        b'"completionReceiptTokenDigest":"' + vr.TOKEN_DIGEST.encode() + b'"}\n')
    assert (launching["revision"], started["revision"]) == (2, 3)


def test_each_step_is_revision_plus_one_and_keeps_acceptance() -> None:
    record = vr.record()
    for step in (lambda r: to_starting_acknowledged(r, 1002), lambda r: to_launching(r, 1005, **LAUNCH),
                 lambda r: to_started(r, 1006, executor_handle=vr.HANDLE), lambda r: to_running_acknowledged(r, 1007),
                 lambda r: to_completion_acknowledged(r, 1008)):
        nxt = step(record)
        assert nxt["revision"] == record["revision"] + 1
        assert nxt["acceptedAtMs"] == 1001
        assert nxt["offer"] == record["offer"]
        check_inbox_update(record, nxt)
        record = nxt
    assert record["state"] == "completion_acknowledged"
    assert record["completionAcknowledgedAtMs"] == record["updatedAtMs"] == 1008


def test_updated_at_is_max_of_now_and_previous() -> None:
    starting = to_starting_acknowledged(vr.record(), 5000)
    assert starting["updatedAtMs"] == 5000
    back = to_start_failed(starting, 10)  # the wall clock stepped back
    assert back["updatedAtMs"] == 5000
    assert to_start_failure_acknowledged(back, 5001)["updatedAtMs"] == 5001


def test_the_input_record_is_not_modified() -> None:
    record = vr.record()
    before = copy.deepcopy(record)
    to_launching(to_starting_acknowledged(record, 1002), 1005, **LAUNCH)
    assert record == before


# --- every (state, target) pair -------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "target"), list(itertools.product(INBOX_STATES, INBOX_STATES)))
def test_every_state_target_pair_follows_the_table(source: str, target: str) -> None:
    old = path_to(source)
    fields = fields_for(old, target)
    legal = target in INBOX_TRANSITIONS[source]
    if legal:
        new = advance(old, target, 2000, fields)
        assert new["state"] == target
        check_inbox_update(old, new)  # the journal's check accepts every step produced here
        return
    with pytest.raises(ContractError) as info:
        advance(old, target, 2000, fields)
    assert (info.value.code, info.value.path) == ("invalid_transition", "$.state")
    # The journal's check rejects the same step written by hand, valid fields and all.
    forged = {**old, **fields, "revision": old["revision"] + 1, "state": target, "updatedAtMs": 2000}
    if target == "completion_acknowledged":
        forged["completionAcknowledgedAtMs"] = 2000
        forged.pop("recoveryReason", None)
    if target != "recovery_required":
        forged.pop("recoveryReason", None)
    with pytest.raises(ContractError) as info:
        check_inbox_update(old, forged)
    try:
        normalize_inbox_record(forged)
    except ContractError:
        assert info.value.code == "invalid_record"  # the forged record is not even valid
    else:
        assert info.value.code == "invalid_transition"


def test_the_table_has_the_two_terminal_states() -> None:
    assert {"start_failure_acknowledged", "completion_acknowledged"} == TERMINAL_STATES


@pytest.mark.parametrize("reason", RECOVERY_REASONS)
def test_only_launch_outcome_unknown_recovers_to_completion(reason: str) -> None:
    recovering = path_to("recovery_required", reason)
    if reason == "launch_outcome_unknown":
        done = to_completion_acknowledged(recovering, 3000)
        assert "recoveryReason" not in done
        assert done["completionAcknowledgedAtMs"] == done["updatedAtMs"] == 3000
        check_inbox_update(recovering, done)
        return
    with pytest.raises(ContractError) as info:
        to_completion_acknowledged(recovering, 3000)
    assert (info.value.code, info.value.path) == ("invalid_transition", "$.state")


@pytest.mark.parametrize("source", ["accepted", "starting_acknowledged", "start_failed", "launching", "started",
                                    "running_acknowledged"])
@pytest.mark.parametrize("reason", RECOVERY_REASONS)
def test_every_non_terminal_state_can_recover_with_every_reason(source: str, reason: str) -> None:
    old = path_to(source)
    new = to_recovery_required(old, 4000, reason)
    assert (new["state"], new["recoveryReason"]) == ("recovery_required", reason)
    for key in ("executorHandle", "executorStartedAtMs", "logArtifactId", "completionReceiptCallbackSequence"):
        assert new.get(key) == old.get(key)  # recover keeps what was set and adds nothing else


def test_an_unknown_recovery_reason_is_rejected() -> None:
    with pytest.raises(ContractError) as info:
        to_recovery_required(vr.record(), 1002, "bored")
    assert info.value.code == "recovery_reason"


# --- field rules per state and immutability ------------------------------------------------------------------


def test_start_failed_from_starting_has_no_optional_fields_and_from_launching_keeps_them() -> None:
    early = to_start_failed(path_to("starting_acknowledged"), 2000)
    assert not {"executorStartedAtMs", "logArtifactId", "completionReceiptCallbackSequence"} & set(early)
    late = to_start_failed(path_to("launching"), 2000)
    assert {k: late[k] for k in LAUNCH_FIELDS} == LAUNCH_FIELDS


@pytest.mark.parametrize(
    ("source", "target", "fields", "code", "path"),
    [
        ("starting_acknowledged", "launching", {}, "invalid_record", "$.executorStartedAtMs"),
        ("starting_acknowledged", "launching", {**LAUNCH_FIELDS, "completionReceiptTokenDigest": "A" * 64},
         "pattern", "$.completionReceiptTokenDigest"),
        ("starting_acknowledged", "launching", {**LAUNCH_FIELDS, "logArtifactId": "x" * 37}, "length",
         "$.logArtifactId"),
        ("starting_acknowledged", "launching", {**LAUNCH_FIELDS, "completionReceiptCallbackSequence": 0},
         "out_of_range", "$.completionReceiptCallbackSequence"),
        ("starting_acknowledged", "launching", {**LAUNCH_FIELDS, "completionReceiptCallbackSequence": 2**31},
         "out_of_range", "$.completionReceiptCallbackSequence"),
        ("launching", "started", {}, "invalid_record", "$.executorHandle"),
        ("launching", "started", {"executorHandle": "x" * 513}, "length", "$.executorHandle"),
        ("launching", "started", {"executorHandle": "a\x7fb"}, "control_character", "$.executorHandle"),
        ("starting_acknowledged", "start_failed", LAUNCH_FIELDS, "invalid_transition", "$.executorStartedAtMs"),
        ("accepted", "recovery_required", {"recoveryReason": "control_plane_terminal", **LAUNCH_FIELDS},
         "invalid_transition", "$.executorStartedAtMs"),
        ("launching", "completion_acknowledged", {"executorHandle": vr.HANDLE}, "invalid_transition",
         "$.executorHandle"),
        ("launching", "launching", {"logArtifactId": "wlog-2"}, "invalid_transition", "$.logArtifactId"),
        ("started", "started", {"executorHandle": "other"}, "invalid_transition", "$.executorHandle"),
        ("launching", "recovery_required", {"recoveryReason": "control_plane_terminal",
                                            "executorStartedAtMs": 7}, "invalid_transition",
         "$.executorStartedAtMs"),
        ("accepted", "starting_acknowledged", {"bogus": 1}, "key_set", "$.bogus"),
    ],
)
def test_field_rules_and_immutability(source: str, target: str, fields: dict[str, Any], code: str,
                                      path: str) -> None:
    with pytest.raises(ContractError) as info:
        advance(path_to(source), target, 3000, fields)
    assert (info.value.code, info.value.path) == (code, path)


def test_a_recovery_reason_never_changes() -> None:
    recovering = path_to("recovery_required", "control_plane_terminal")
    again = advance(recovering, "recovery_required", 3000)
    assert again["recoveryReason"] == "control_plane_terminal"
    with pytest.raises(ContractError) as info:
        advance(recovering, "recovery_required", 3000, {"recoveryReason": "launch_outcome_unknown"})
    assert (info.value.code, info.value.path) == ("invalid_transition", "$.recoveryReason")


def test_check_rejects_fields_a_step_does_not_introduce() -> None:
    starting = path_to("starting_acknowledged")
    forged = {**starting, **LAUNCH_FIELDS, "revision": starting["revision"] + 1, "state": "start_failed"}
    with pytest.raises(ContractError) as info:
        check_inbox_update(starting, forged)
    assert (info.value.code, info.value.path) == ("invalid_transition", "$.executorStartedAtMs")
    assert set(LAUNCH_FIELDS) | {"resultStartedAtMs", "resultFinishedAtMs"} == NEW_FIELDS["launching"]
    assert "start_failed" not in NEW_FIELDS


def test_check_requires_the_acknowledgement_time_to_be_updated_at() -> None:
    running = path_to("running_acknowledged")
    forged = {**running, "revision": running["revision"] + 1, "state": "completion_acknowledged",
              "updatedAtMs": 2000, "completionAcknowledgedAtMs": 1999}
    with pytest.raises(ContractError) as info:
        check_inbox_update(running, forged)
    assert (info.value.code, info.value.path) == ("invalid_transition", "$.completionAcknowledgedAtMs")


@pytest.mark.parametrize("now", [-1, 2**53, 1.5, True, "1"])
def test_a_bad_now_is_a_contract_error(now: Any) -> None:
    with pytest.raises(ContractError) as info:
        to_starting_acknowledged(vr.record(), now)
    assert info.value.code in ("not_integer", "out_of_range")


def test_a_corrupt_record_is_rejected_before_any_step() -> None:
    record = vr.record()
    record["offer"]["executionRevision"]["command"]["args"] = ["evil.js"]
    with pytest.raises(ContractError) as info:
        to_starting_acknowledged(record, 1002)
    assert info.value.code == "digest_mismatch"


# --- the lease persist rule (section 5) ---------------------------------------------------------------------


RENEWAL = {"lease_version": 4, "renewed_at_ms": 1700000002000, "expires_at_ms": 1700000032000}


@pytest.mark.parametrize("state", ["accepted", "starting_acknowledged", "launching", "started",
                                   "running_acknowledged", "start_failed", "recovery_required"])
def test_a_renewal_persists_version_times_and_updated_at(state: str) -> None:
    old = path_to(state)
    new = with_renewed_lease(old, **RENEWAL)
    assert new["state"] == state
    assert new["revision"] == old["revision"] + 1
    assert new["offer"]["lease"] == {**old["offer"]["lease"], "version": 4, "renewedAtMs": 1700000002000,
                                     "expiresAtMs": 1700000032000, "updatedAtMs": 1700000002000}
    assert new["updatedAtMs"] == 1700000002000  # max(record.updatedAtMs, renewedAtMs)
    check_inbox_update(old, new)


def test_a_renewal_keeps_a_later_record_time() -> None:
    old = to_starting_acknowledged(vr.record(), 1800000000000)
    new = with_renewed_lease(old, **RENEWAL)
    assert new["updatedAtMs"] == 1800000000000


def test_a_renewal_after_the_g2_retry_jumps_two_versions() -> None:
    new = with_renewed_lease(vr.record(), lease_version=5, renewed_at_ms=1700000002000, expires_at_ms=1700000032000)
    assert new["offer"]["lease"]["version"] == 5


@pytest.mark.parametrize(
    ("changes", "code", "path"),
    [
        ({"lease_version": 3}, "offer_revision_conflict", "$.offer.lease.version"),
        ({"lease_version": 2}, "offer_revision_conflict", "$.offer.lease.version"),
        ({"lease_version": 2**31}, "out_of_range", "$.offer.lease.version"),
        ({"expires_at_ms": 1700000002000}, "lease_order", "$.offer.lease.expiresAtMs"),
        ({"renewed_at_ms": 2**53}, "out_of_range", "$.offer.lease.renewedAtMs"),
        ({"expires_at_ms": None}, "not_integer", "$.offer.lease.expiresAtMs"),
    ],
)
def test_a_bad_renewal_is_refused(changes: dict[str, Any], code: str, path: str) -> None:
    with pytest.raises(ContractError) as info:
        with_renewed_lease(vr.record(), **{**RENEWAL, **changes})
    assert (info.value.code, info.value.path) == (code, path)


def test_a_newer_version_with_an_older_renewal_time_is_accepted() -> None:
    """Spec README "Decisions for clocks": the cluster's clock moved back; the version
    fences, the times are the cluster's, kept a valid lease (>= acquiredAtMs)."""
    record = vr.record()
    record["offer"]["lease"].update(updatedAtMs=500, renewedAtMs=400, expiresAtMs=30400)
    new = with_renewed_lease(record, lease_version=4, renewed_at_ms=450, expires_at_ms=30450)
    assert new["offer"]["lease"]["version"] == 4
    assert (new["offer"]["lease"]["renewedAtMs"], new["offer"]["lease"]["expiresAtMs"]) == (450, 30450)
    back = with_renewed_lease(vr.record(), lease_version=4, renewed_at_ms=20, expires_at_ms=30)
    lease = back["offer"]["lease"]
    assert lease["renewedAtMs"] == lease["updatedAtMs"] == lease["acquiredAtMs"] and lease["expiresAtMs"] > lease["renewedAtMs"]
    check_inbox_update(vr.record(), back)


@pytest.mark.parametrize("state", sorted(TERMINAL_STATES))
def test_a_terminal_record_holds_no_lease_to_renew(state: str) -> None:
    with pytest.raises(ContractError) as info:
        with_renewed_lease(path_to(state), **RENEWAL)
    assert info.value.code == "invalid_transition"


def test_a_lease_change_at_equal_version_is_refused_by_the_check() -> None:
    old = vr.record()
    new = with_renewed_lease(old, **RENEWAL)
    tampered = json.loads(json.dumps(new))
    tampered["offer"]["lease"]["expiresAtMs"] += 1
    tampered["revision"] += 1
    with pytest.raises(ContractError) as info:
        check_inbox_update(new, tampered)
    assert (info.value.code, info.value.path) == ("offer_revision_conflict", "$.offer.lease")


# --- the real journal agrees -------------------------------------------------------------------------------


def test_a_real_journal_stores_the_whole_lifecycle(tmp_path: pathlib.Path) -> None:
    from qinglong_edge.worker.journal.store import Journal

    journal = Journal.open(str(tmp_path / "worker"))
    try:
        status, record = journal.accept_offer(vr.offer(), 1001)
        assert status == "accepted"
        steps = [
            lambda r: to_starting_acknowledged(r, 1002),
            lambda r: with_renewed_lease(r, **RENEWAL),
            lambda r: to_launching(r, 1700000002100, **LAUNCH),
            lambda r: to_started(r, 1700000002200, executor_handle=vr.HANDLE),
            lambda r: to_running_acknowledged(r, 1700000002300),
            lambda r: to_completion_acknowledged(r, 1700000003000),
        ]
        for step in steps:
            nxt = step(record)
            journal.replace_offer(nxt, record["revision"])
            record = nxt
        assert journal.read_offer("offer-1") == record
        assert record["completionAcknowledgedAtMs"] == 1700000003000
    finally:
        journal.close()


# --- properties ----------------------------------------------------------------------------------------------

_STEP_NAMES = ("starting", "launching", "started", "running", "failed", "failure_ack", "completed", "recover",
               "renew", "stay")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_STEP_NAMES), st.integers(0, 2**40), st.sampled_from(RECOVERY_REASONS)),
                max_size=8))
def test_any_sequence_of_steps_is_accepted_by_the_check_or_refused_with_a_contract_error(
    steps: list[tuple[str, int, str]],
) -> None:
    record = vr.record()
    version = 3
    for name, now, reason in steps:
        try:
            if name == "starting":
                nxt = to_starting_acknowledged(record, now)
            elif name == "launching":
                nxt = to_launching(record, now, **LAUNCH)
            elif name == "started":
                nxt = to_started(record, now, executor_handle=vr.HANDLE)
            elif name == "running":
                nxt = to_running_acknowledged(record, now)
            elif name == "failed":
                nxt = to_start_failed(record, now)
            elif name == "failure_ack":
                nxt = to_start_failure_acknowledged(record, now)
            elif name == "completed":
                nxt = to_completion_acknowledged(record, now)
            elif name == "recover":
                nxt = to_recovery_required(record, now, reason)
            elif name == "renew":
                nxt = with_renewed_lease(record, lease_version=version + 1, renewed_at_ms=now + 21,
                                         expires_at_ms=now + 30_021)
            else:
                nxt = advance(record, record["state"], now)
        except ContractError:
            continue
        check_inbox_update(record, nxt)
        assert nxt["revision"] == record["revision"] + 1
        assert nxt["updatedAtMs"] >= record["updatedAtMs"]
        assert nxt["state"] in INBOX_TRANSITIONS[record["state"]]
        version = nxt["offer"]["lease"]["version"]
        record = nxt
