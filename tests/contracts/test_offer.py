"""``qinglong/remote-execution-offer@v1``: vector A, I1-I10 and one test per rule of 2.1-2.6."""

from __future__ import annotations

import json
from typing import Any

import pytest

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.offer import (
    IDLE_REASONS,
    LEASE_KEYS,
    OFFER_RESPONSE_MAX_BYTES,
    ClaimAuthority,
    IdleResponse,
    OfferedResponse,
    claim_request_body,
    normalize_internal_offer,
    offers_path,
    parse_offer_response,
    same_offer_authority,
)
from tests.contracts import vector_a as va


def reject(body: bytes, code: str, path: str | None = None, authority: ClaimAuthority = va.AUTHORITY) -> ContractError:
    with pytest.raises(ContractError) as info:
        parse_offer_response(body, authority)
    assert info.value.code == code, (info.value.code, info.value.path)
    if path is not None:
        assert info.value.path == path
    assert va.LEASE_TOKEN not in str(info.value)
    return info.value


def offered_with(change: Any) -> bytes:
    return va.mutate(va.OFFERED, change)


def idle_with(change: Any) -> bytes:
    return va.mutate(va.IDLE, change)


def set_in(*path: str | int, value: Any) -> Any:
    def change(doc: dict[str, Any]) -> None:
        target: Any = doc
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return change


def delete(*path: str) -> Any:
    def change(doc: dict[str, Any]) -> None:
        target: Any = doc
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]

    return change


# --- golden vector A ------------------------------------------------------------------


def test_vector_a_offered_is_valid() -> None:
    result = parse_offer_response(va.OFFERED, va.AUTHORITY)
    assert isinstance(result, OfferedResponse)
    assert result.offer_id == "offer-1"
    assert result.run_id == "run-1"
    assert result.offer["executionDigest"] == va.CONTENT_DIGEST
    assert result.offer["executionRevision"]["contentDigest"] == va.CONTENT_DIGEST
    assert result.offer["lease"]["leaseTokenDigest"] == va.LEASE_TOKEN_DIGEST
    assert result.offer["leaseToken"] == va.LEASE_TOKEN
    assert list(result.offer["lease"]) == list(LEASE_KEYS)
    assert result.stats["claimAttempts"] == 1
    assert result.truncated is False


def test_vector_a_offer_equals_the_inbox_offer_byte_for_byte() -> None:
    result = parse_offer_response(va.OFFERED, va.AUTHORITY)
    assert isinstance(result, OfferedResponse)
    stored = json.loads(va.INBOX_RECORD)["offer"]
    assert va.compact(result.offer) == va.compact(stored)


def test_vector_a_idle_is_valid() -> None:
    result = parse_offer_response(va.IDLE, va.AUTHORITY)
    assert result == IdleResponse("no_candidates", json.loads(va.IDLE)["stats"], False)


def test_request_body_and_path_are_vector_a() -> None:
    assert claim_request_body(va.AUTHORITY) == va.REQUEST_BODY
    assert len(va.REQUEST_BODY) == 108
    assert offers_path(va.WORKER_ID, va.SESSION_ID) == (
        "/api/v3/worker-ingress/workers/edge-1/sessions/018f0000-0000-7000-8000-000000000001/offers"
    )


def test_lease_token_digest_is_of_the_token_text() -> None:
    assert va.AUTHORITY.lease_token_digest == va.LEASE_TOKEN_DIGEST


@pytest.mark.parametrize("variant", va.INVALID_VARIANTS, ids=lambda v: v.name)
def test_rejects_invalid_variant(variant: va.Variant) -> None:
    reject(variant.body, variant.code, variant.path)


def test_offered_repr_hides_the_lease_token() -> None:
    result = parse_offer_response(va.OFFERED, va.AUTHORITY)
    assert va.LEASE_TOKEN not in repr(result)
    assert va.LEASE_TOKEN not in repr(va.AUTHORITY)
    assert "offer-1" in repr(result)


# --- claim authority (1.3) --------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("worker_id", "-edge", "pattern"),
        ("worker_id", "e" * 129, "length"),
        ("worker_session_id", "018f0000-0000-4000-8000-000000000001", "pattern"),
        ("worker_session_id", "018F0000-0000-7000-8000-000000000001", "pattern"),
        ("worker_generation", 0, "out_of_range"),
        ("worker_generation", True, "not_integer"),
        ("offer_id", "", "length"),
        ("offer_id", "offer/1", "pattern"),
        ("offer_id", "offer\x01", "control_character"),
        ("lease_token", "a" * 31, "length"),
        ("lease_token", "a" * 129, "length"),
        ("lease_token", "a" * 31 + "=", "pattern"),
    ],
)
def test_rejects_invalid_claim_authority(field: str, value: object, code: str) -> None:
    values: dict[str, Any] = {
        "worker_id": va.WORKER_ID, "worker_session_id": va.SESSION_ID, "worker_generation": 2,
        "offer_id": va.OFFER_ID, "lease_token": va.LEASE_TOKEN,
    }
    values[field] = value
    with pytest.raises(ContractError) as info:
        ClaimAuthority(**values)
    assert info.value.code == code


def test_rejects_a_forged_authority_at_step_2() -> None:
    forged = ClaimAuthority(va.WORKER_ID, va.SESSION_ID, 2, va.OFFER_ID, va.LEASE_TOKEN)
    object.__setattr__(forged, "lease_token", "short")
    reject(va.OFFERED, "length", "$.leaseToken", authority=forged)


def test_rejects_a_non_authority() -> None:
    with pytest.raises(ContractError) as info:
        parse_offer_response(va.IDLE, object())  # type: ignore[arg-type]
    assert info.value.code == "invalid_authority"


# --- 2.6 steps 1-3: size, JSON, top level -----------------------------------------------


def test_rejects_a_body_below_two_bytes() -> None:
    reject(b"{", "too_small", "$")


def test_rejects_a_body_over_128_kib() -> None:
    body = va.IDLE[:-1] + b" " * (OFFER_RESPONSE_MAX_BYTES - len(va.IDLE) + 1) + b"}"
    assert len(body) == OFFER_RESPONSE_MAX_BYTES + 1
    reject(body, "too_large", "$")


def test_accepts_a_body_of_exactly_128_kib() -> None:
    body = va.IDLE[:-1] + b" " * (OFFER_RESPONSE_MAX_BYTES - len(va.IDLE)) + b"}"
    assert len(body) == OFFER_RESPONSE_MAX_BYTES
    assert isinstance(parse_offer_response(body, va.AUTHORITY), IdleResponse)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{]", "invalid_json"),
        (va.IDLE + b"{}", "trailing_data"),
        (va.IDLE.replace(b'"truncated"', b'"reason"'), "duplicate_key"),
        (va.IDLE.replace(b'"pages":1', b'"pages":NaN'), "non_finite_number"),
        (va.IDLE.replace(b"no_candidates", b"no_\xffcandidates"), "invalid_utf8"),
        (b"\xef\xbb\xbf" + va.IDLE, "invalid_json"),
    ],
    ids=["syntax", "trailing", "duplicate-key", "nan", "utf8", "bom"],
)
def test_rejects_bodies_that_are_not_strict_json(body: bytes, code: str) -> None:
    reject(body, code)


@pytest.mark.parametrize("body", [b"[]", b"null", b'"idle"', b"42", b"true"])
def test_rejects_a_top_level_that_is_not_an_object(body: bytes) -> None:
    reject(body, "not_object", "$")


# --- 2.1 idle ------------------------------------------------------------------------------


@pytest.mark.parametrize("reason", IDLE_REASONS)
def test_accepts_each_idle_reason(reason: str) -> None:
    result = parse_offer_response(idle_with(set_in("reason", value=reason)), va.AUTHORITY)
    assert isinstance(result, IdleResponse)
    assert result.reason == reason


def test_rejects_idle_with_an_extra_key() -> None:
    reject(idle_with(set_in("offer", value={})), "key_set", "$.offer")


def test_rejects_idle_with_a_missing_key() -> None:
    reject(idle_with(delete("truncated")), "key_set", "$.truncated")


def test_rejects_idle_with_a_wrong_schema() -> None:
    reject(idle_with(set_in("schema", value="qinglong/remote-execution-offer@v2")), "schema", "$.schema")


def test_rejects_idle_with_a_non_string_reason() -> None:
    reject(idle_with(set_in("reason", value=1)), "idle_reason", "$.reason")


def test_rejects_idle_with_a_non_boolean_truncated() -> None:
    reject(idle_with(set_in("truncated", value=0)), "not_boolean", "$.truncated")


def test_accepts_idle_truncated_flag_independent_of_the_reason() -> None:
    # The 2.1 table describes what the server sends; the worker does not check it.
    result = parse_offer_response(idle_with(set_in("truncated", value=True)), va.AUTHORITY)
    assert isinstance(result, IdleResponse)
    assert result.truncated is True


# --- 2.2 offered envelope and offer shape -------------------------------------------------


def test_rejects_offered_with_a_missing_key() -> None:
    reject(offered_with(delete("stats")), "key_set", "$.stats")


def test_rejects_offered_with_a_wrong_schema() -> None:
    reject(offered_with(set_in("schema", value="x")), "schema", "$.schema")


def test_rejects_an_unknown_status() -> None:
    reject(offered_with(set_in("status", value="busy")), "status", "$.status")


def test_rejects_an_offer_that_is_not_an_object() -> None:
    reject(offered_with(set_in("offer", value=[])), "not_object", "$.offer")


def test_rejects_an_offer_with_an_extra_key() -> None:
    reject(offered_with(set_in("offer", "leaseToken", value=va.LEASE_TOKEN)), "key_set", "$.offer.leaseToken")


def test_rejects_an_offer_with_a_missing_key() -> None:
    reject(offered_with(delete("offer", "placementScore")), "key_set", "$.offer.placementScore")


def test_rejects_a_worker_with_an_extra_key() -> None:
    reject(offered_with(set_in("offer", "worker", "status", value="online")), "key_set", "$.offer.worker.status")


def test_rejects_a_lease_with_a_missing_key() -> None:
    reject(offered_with(delete("offer", "lease", "updatedAtMs")), "key_set", "$.offer.lease.updatedAtMs")


@pytest.mark.parametrize("key", ["attemptId", "runId", "status", "workerId", "workerSessionId", "workerGeneration"])
def test_rejects_a_lease_carrying_server_side_fields(key: str) -> None:
    reject(offered_with(set_in("offer", "lease", key, value="x")), "key_set", f"$.offer.lease.{key}")


def test_accepts_lease_recovery() -> None:
    result = parse_offer_response(offered_with(set_in("offer", "deliveryKind", value="lease_recovery")), va.AUTHORITY)
    assert isinstance(result, OfferedResponse)
    assert result.offer["deliveryKind"] == "lease_recovery"


def test_accepts_lease_recovery_with_nonzero_stats() -> None:
    # 2.2 says the server sends zero stats on recovery; the worker does not check it
    # (rejecting could only lose a recovered lease).
    body = offered_with(set_in("offer", "deliveryKind", value="lease_recovery"))
    assert isinstance(parse_offer_response(body, va.AUTHORITY), OfferedResponse)


@pytest.mark.parametrize("kind", ["", "replay", None, 1, "NEW_CLAIM"])
def test_rejects_an_unknown_delivery_kind(kind: object) -> None:
    reject(offered_with(set_in("offer", "deliveryKind", value=kind)), "delivery_kind", "$.offer.deliveryKind")


@pytest.mark.parametrize(
    ("score", "code"), [(-1, "out_of_range"), (1.5, "not_integer"), (0.0, "not_integer"), (True, "not_integer"),
                        ("0", "not_integer")],
)
def test_rejects_an_invalid_placement_score(score: object, code: str) -> None:
    reject(offered_with(set_in("offer", "placementScore", value=score)), code, "$.offer.placementScore")


def test_accepts_a_positive_placement_score() -> None:
    result = parse_offer_response(offered_with(set_in("offer", "placementScore", value=1600)), va.AUTHORITY)
    assert isinstance(result, OfferedResponse)
    assert result.offer["placementScore"] == 1600


def test_rejects_a_non_boolean_truncated_on_offered() -> None:
    reject(offered_with(set_in("truncated", value="false")), "not_boolean", "$.truncated")


def test_rejects_an_execution_digest_that_is_not_lowercase_hex() -> None:
    reject(offered_with(set_in("offer", "executionDigest", value=va.CONTENT_DIGEST.upper())), "pattern",
           "$.offer.executionDigest")


# --- 2.3 candidate ---------------------------------------------------------------------------

ID_KEYS = ("runId", "attemptId", "projectId", "taskId", "taskRevision")


@pytest.mark.parametrize("key", ID_KEYS)
@pytest.mark.parametrize(("value", "code"), [("", "length"), ("x" * 129, "length"), ("a\tb", "control_character"),
                                             ("a\x7fb", "control_character"), (7, "not_string")])
def test_rejects_an_invalid_candidate_id(key: str, value: object, code: str) -> None:
    reject(offered_with(set_in("offer", "candidate", key, value=value)), code, f"$.offer.candidate.{key}")


def test_accepts_a_negative_priority() -> None:
    result = parse_offer_response(offered_with(set_in("offer", "candidate", "priority", value=-5)), va.AUTHORITY)
    assert isinstance(result, OfferedResponse)
    assert result.offer["candidate"]["priority"] == -5


@pytest.mark.parametrize(
    ("key", "value", "code"),
    [
        ("priority", 1.0, "not_integer"),
        ("priority", "1", "not_integer"),
        ("queuedAtMs", -1, "out_of_range"),
        ("attemptCreatedAtMs", -1, "out_of_range"),
        ("attemptNumber", 0, "out_of_range"),
        ("attemptNumber", 1e0, "not_integer"),
        ("executorType", "local_process", "executor_type"),
    ],
)
def test_rejects_an_invalid_candidate_value(key: str, value: object, code: str) -> None:
    reject(offered_with(set_in("offer", "candidate", key, value=value)), code, f"$.offer.candidate.{key}")


def test_rejects_a_candidate_with_an_unknown_key() -> None:
    # spec README "Strictness" overrides the reference's leniency (2.3/2.8).
    reject(offered_with(set_in("offer", "candidate", "stepRunId", value="s")), "key_set", "$.offer.candidate.stepRunId")


def test_rejects_a_candidate_that_disagrees_with_the_revision() -> None:
    reject(offered_with(set_in("offer", "candidate", "taskId", value="task-2")), "revision_candidate_mismatch",
           "$.offer.executionRevision.taskId")


# --- 2.5 stats ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"pages": 17}, "pages"),
        ({"candidates": 1025}, "candidates"),
        ({"plansUnavailable": 2}, "plansUnavailable"),
        ({"placementMismatches": 2}, "placementMismatches"),
        ({"claimAttempts": 65, "claimRaces": 0}, "claimAttempts"),
        ({"claimRaces": 2}, "claimRaces"),
    ],
)
def test_rejects_stats_beyond_their_budget(changes: dict[str, int], key: str) -> None:
    def change(doc: dict[str, Any]) -> None:
        doc["stats"].update(changes)

    reject(offered_with(change), "stats_range", f"$.stats.{key}")


def test_accepts_stats_at_their_budget() -> None:
    def change(doc: dict[str, Any]) -> None:
        doc["stats"] = {"pages": 16, "candidates": 1024, "plansUnavailable": 1024, "placementMismatches": 1024,
                        "claimAttempts": 64, "claimRaces": 64}

    assert isinstance(parse_offer_response(offered_with(change), va.AUTHORITY), OfferedResponse)


@pytest.mark.parametrize(("value", "code"), [(-1, "out_of_range"), (1.0, "not_integer"), (None, "not_integer")])
def test_rejects_a_stat_that_is_not_a_non_negative_integer(value: object, code: str) -> None:
    reject(idle_with(set_in("stats", "pages", value=value)), code, "$.stats.pages")


def test_rejects_stats_with_an_extra_key() -> None:
    reject(idle_with(set_in("stats", "retries", value=0)), "key_set", "$.stats.retries")


# --- 2.6 steps 7-12 ---------------------------------------------------------------------------------


def test_rejects_an_offer_id_of_another_type() -> None:
    reject(offered_with(set_in("offer", "offerId", value=1)), "offer_id_mismatch", "$.offer.offerId")


@pytest.mark.parametrize(
    ("key", "value", "code"),
    [
        ("workerId", "edge-2", "worker_mismatch"),
        ("sessionId", "018f0000-0000-7000-8000-000000000002", "worker_mismatch"),
        ("generation", 2.0, "not_integer"),
        ("generation", "2", "not_integer"),
        ("generation", 3, "worker_mismatch"),
    ],
)
def test_rejects_a_worker_target_other_than_the_claim(key: str, value: object, code: str) -> None:
    reject(offered_with(set_in("offer", "worker", key, value=value)), code, f"$.offer.worker.{key}")


@pytest.mark.parametrize(
    ("key", "value", "code"),
    [
        ("version", -1, "out_of_range"),
        ("version", 3.0, "not_integer"),
        ("leaseGeneration", 0, "out_of_range"),
        ("acquiredAtMs", -1, "out_of_range"),
        ("renewedAtMs", 19, "lease_order"),
        ("expiresAtMs", 20, "lease_order"),
        ("updatedAtMs", 19, "lease_order"),
    ],
)
def test_rejects_an_inconsistent_lease(key: str, value: object, code: str) -> None:
    reject(offered_with(set_in("offer", "lease", key, value=value)), code, f"$.offer.lease.{key}")


def test_accepts_an_updated_at_before_renewed_at() -> None:
    # Only updatedAtMs >= acquiredAtMs is required (runDispatchLease.ts).
    body = offered_with(set_in("offer", "lease", "updatedAtMs", value=20))
    assert isinstance(parse_offer_response(body, va.AUTHORITY), OfferedResponse)


def test_the_lease_is_rebuilt_from_the_claim_not_the_wire() -> None:
    result = parse_offer_response(va.OFFERED, va.AUTHORITY)
    assert isinstance(result, OfferedResponse)
    lease = result.offer["lease"]
    assert (lease["workerId"], lease["workerSessionId"], lease["workerGeneration"]) == (
        va.WORKER_ID, va.SESSION_ID, va.GENERATION)
    assert (lease["runId"], lease["attemptId"], lease["status"]) == ("run-1", "attempt-1", "leased")


def test_a_different_token_yields_a_different_stored_digest() -> None:
    other = ClaimAuthority(va.WORKER_ID, va.SESSION_ID, 2, va.OFFER_ID, "B" * 43)
    result = parse_offer_response(va.OFFERED, other)
    assert isinstance(result, OfferedResponse)
    assert result.offer["lease"]["leaseTokenDigest"] == other.lease_token_digest != va.LEASE_TOKEN_DIGEST


def test_rejects_an_execution_revision_that_is_not_an_object() -> None:
    reject(offered_with(set_in("offer", "executionRevision", value="rev")), "not_object", "$.offer.executionRevision")


def test_checks_run_in_the_order_of_section_2_6() -> None:
    # Both the offerId (step 7) and the stats (step 13) are wrong: step 7 is reported.
    def change(doc: dict[str, Any]) -> None:
        doc["offer"]["offerId"] = "other"
        doc["stats"]["claimRaces"] = 9

    reject(offered_with(change), "offer_id_mismatch")


# --- the stored offer (3.4-3.6) ----------------------------------------------------------------------


def stored_offer() -> dict[str, Any]:
    return json.loads(va.INBOX_RECORD)["offer"]


def test_normalize_internal_offer_accepts_the_vector_a_inbox_offer() -> None:
    offer = normalize_internal_offer(stored_offer())
    assert va.compact(offer) == va.compact(stored_offer())


@pytest.mark.parametrize(
    ("path", "value", "code"),
    [
        (("lease", "leaseTokenDigest"), "0" * 64, "lease_token_digest_mismatch"),
        (("leaseToken",), "C" * 43, "lease_token_digest_mismatch"),
        (("lease", "status"), "released", "lease_status"),
        (("lease", "runId"), "run-2", "lease_mismatch"),
        (("lease", "workerGeneration"), 3, "lease_mismatch"),
        (("worker", "sessionId"), "018f0000-0000-4000-8000-000000000001", "pattern"),
        (("lease", "expiresAtMs"), 21, "lease_order"),
        (("executionRevision", "createdAtMs"), -1, "out_of_range"),
        (("deliveryKind",), "other", "delivery_kind"),
    ],
)
def test_rejects_a_corrupt_stored_offer(path: tuple[str, ...], value: object, code: str) -> None:
    offer = stored_offer()
    target = offer
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    with pytest.raises(ContractError) as info:
        normalize_internal_offer(offer)
    assert info.value.code == code


def test_rejects_a_stored_offer_without_its_token() -> None:
    offer = stored_offer()
    del offer["leaseToken"]
    with pytest.raises(ContractError) as info:
        normalize_internal_offer(offer)
    assert (info.value.code, info.value.path) == ("key_set", "$.offer.leaseToken")


def test_same_authority_ignores_lease_version_and_times() -> None:
    a = normalize_internal_offer(stored_offer())
    b = normalize_internal_offer(stored_offer())
    b["lease"] = {**b["lease"], "version": 4, "renewedAtMs": 25, "expiresAtMs": 40000, "updatedAtMs": 25}
    assert same_offer_authority(a, b)


def test_same_authority_compares_delivery_kind_only_when_asked() -> None:
    a = normalize_internal_offer(stored_offer())
    b = {**a, "deliveryKind": "lease_recovery"}
    assert same_offer_authority(a, b)
    assert not same_offer_authority(a, b, compare_delivery_kind=True)


@pytest.mark.parametrize(
    "change",
    [
        lambda o: o.update(leaseToken="D" * 43),
        lambda o: o.update(executionDigest="f" * 64),
        lambda o: o["candidate"].update(priority=2),
        lambda o: o["worker"].update(generation=3),
        lambda o: o["lease"].update(leaseGeneration=2),
        lambda o: o["executionRevision"].update(createdAtMs=2),
    ],
    ids=["token", "digest", "candidate", "worker", "lease-generation", "revision"],
)
def test_same_authority_detects_each_compared_part(change: Any) -> None:
    a = normalize_internal_offer(stored_offer())
    b = json.loads(va.compact(a))
    change(b)
    assert not same_offer_authority(a, b)
