"""``qinglong/remote-execution-offer@v1``: claim authority, request body, response parser.

Source: offer-delivery.md sections 1.3 and 2.1-2.8 (ADR-0110); reference
``remoteOfferDelivery.ts`` (``parseRemoteExecutionOfferPullResponse``),
``remoteDispatch.ts`` and ``runDispatchLease.ts``.

:func:`parse_offer_response` runs the worker's checks of section 2.6 in order:

1. 2-131 072 bytes; 2. strict JSON (spec README "Strictness"), claim authority
re-validated; 3. top level is an object; 4. idle: exact five keys, ``schema``,
``reason`` (one of seven), stats, ``truncated``; 5. offered: exact envelope keys,
``schema``, ``status``; 6. ``offer`` has exactly eight keys; 7. ``offerId`` equals the
claim's; 8. ``worker`` has exactly three keys, each equal to the claim's; 9. candidate
(2.3); 10. ``lease`` has exactly six keys; 11. the 13-key lease is rebuilt from the
claim (the token never comes from the wire); 12. the offer is built with the claim's
token and re-checked (``deliveryKind``, lease vs candidate/worker, token digest,
revision normalization and digest, revision vs candidate, ``executionDigest``,
``placementScore``); 13. stats and ``truncated``.

Decisions (spec README and section 2.8): unknown keys are rejected everywhere,
``candidate`` included (README overrides 2.3/2.8); ``deliveryKind`` must be
``new_claim`` or ``lease_recovery``; integral floats (``2.0``) and booleans are never
integers; duplicate keys, NaN, lone surrogates and invalid UTF-8 are rejected by
:mod:`~qinglong_edge.contracts.strictjson`. Descriptions of what the server emits but
the reference worker does not check (``truncated`` per idle reason, zero stats on
``lease_recovery``) are *not* enforced: rejecting them could only lose work.

Error codes (``ContractError.code``; ``path`` is the JSON path of the offending value):

* strict JSON: ``too_small``, ``too_large``, ``invalid_utf8``, ``invalid_json``,
  ``trailing_data``, ``depth_exceeded``, ``duplicate_key``, ``non_finite_number``,
  ``integer_out_of_range``, ``lone_surrogate``;
* shape: ``not_object``, ``not_string``, ``not_integer``, ``not_boolean``, ``key_set``,
  ``length``, ``control_character``, ``pattern``, ``out_of_range``;
* envelope: ``schema``, ``status``, ``idle_reason``, ``stats_range``; ``invalid_authority``
  when the second argument is not a :class:`ClaimAuthority`;
* offer: ``offer_id_mismatch``, ``worker_mismatch``, ``delivery_kind``,
  ``executor_type``, ``lease_order`` (``renewedAtMs < acquiredAtMs``,
  ``expiresAtMs <= renewedAtMs`` or ``updatedAtMs < acquiredAtMs``), ``lease_status``,
  ``lease_mismatch`` (stored lease vs candidate/worker), ``lease_token_digest_mismatch``,
  ``revision_candidate_mismatch``, ``execution_digest_mismatch``;
* execution revision: every code of :mod:`~qinglong_edge.contracts.execution_revision`
  (``digest_mismatch``, ``env_name``, ``secret_ref``, ...) and of
  :mod:`~qinglong_edge.contracts.placement`.
"""

from __future__ import annotations

from qinglong_edge.contracts._shape import Frozen, child, exact_keys, int_value, is_int, object_value
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import MAX_SAFE_INTEGER, dispatch_id, sha256_hex, string
from qinglong_edge.contracts.ids import HEX64, JOURNAL_OFFER_ID, LEASE_TOKEN, SESSION_ID, WORKER_ID
from qinglong_edge.contracts.strictjson import dumps, dumps_bytes, loads

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.contracts.records import InternalOffer, OfferCandidate, OfferWorker

__all__ = [
    "CANDIDATE_KEYS",
    "DELIVERY_KINDS",
    "IDLE_REASONS",
    "LEASE_KEYS",
    "OFFER_RESPONSE_MAX_BYTES",
    "OFFER_SCHEMA",
    "STATS_KEYS",
    "ClaimAuthority",
    "IdleResponse",
    "OfferedResponse",
    "check_authority_fields",
    "claim_request_body",
    "normalize_internal_offer",
    "offers_path",
    "parse_offer_response",
    "same_offer_authority",
]

OFFER_SCHEMA = "qinglong/remote-execution-offer@v1"
#: ``MAX_REMOTE_EXECUTION_OFFER_RESPONSE_BYTES`` (128 KiB), section 1.6.
OFFER_RESPONSE_MAX_BYTES = 131_072
#: Worker-side request cap (``MAX_REQUEST_BYTES``), section 1.3.
CLAIM_REQUEST_MAX_BYTES = 4096
IDLE_REASONS: tuple[str, ...] = (
    "worker_unavailable",
    "no_candidates",
    "no_match",
    "plans_unavailable",
    "claim_raced",
    "claim_budget_exhausted",
    "scan_budget_exhausted",
)
DELIVERY_KINDS: tuple[str, ...] = ("new_claim", "lease_recovery")
STATS_KEYS: tuple[str, ...] = (
    "pages", "candidates", "plansUnavailable", "placementMismatches", "claimAttempts", "claimRaces",
)
CANDIDATE_KEYS: tuple[str, ...] = (
    "runId", "attemptId", "projectId", "taskId", "taskRevision",
    "priority", "queuedAtMs", "attemptCreatedAtMs", "attemptNumber", "executorType",
)
#: The six lease keys on the wire (section 2.2).
WIRE_LEASE_KEYS: tuple[str, ...] = (
    "version", "leaseGeneration", "acquiredAtMs", "renewedAtMs", "expiresAtMs", "updatedAtMs",
)
#: The rebuilt lease record, in inbox order (section 3.4).
LEASE_KEYS: tuple[str, ...] = (
    "attemptId", "runId", "status", "version", "leaseGeneration", "workerId", "workerSessionId",
    "workerGeneration", "leaseTokenDigest", "acquiredAtMs", "renewedAtMs", "expiresAtMs", "updatedAtMs",
)
#: The internal offer, in inbox order (section 3.4).
OFFER_KEYS: tuple[str, ...] = (
    "offerId", "deliveryKind", "executionDigest", "candidate", "worker", "lease", "leaseToken",
    "executionRevision", "placementScore",
)
_WIRE_OFFER_KEYS = tuple(key for key in OFFER_KEYS if key != "leaseToken")
_IDLE_KEYS = ("schema", "status", "reason", "stats", "truncated")
_OFFERED_KEYS = ("schema", "status", "offer", "stats", "truncated")
_WORKER_KEYS = ("workerId", "sessionId", "generation")


def check_authority_fields(
    worker_id: object,
    worker_session_id: object,
    worker_generation: object,
    offer_id: object,
    lease_token: object,
    *,
    path: str = "$",
) -> None:
    """Validate the five claim-authority values (ADR-0110 1.3 + the journal file-name rule).

    ``offerId`` must also match ``[A-Za-z0-9._:-]{1,128}`` because it names
    ``offers/<offerId>.json`` (section 3.1). Errors are reported at ``<path>.workerId``,
    ``<path>.workerSessionId``, ... with the field codes.
    """
    string(worker_id, child(path, "workerId"), max_length=128, pattern=WORKER_ID)
    string(worker_session_id, child(path, "workerSessionId"), min_length=36, max_length=36, pattern=SESSION_ID)
    int_value(worker_generation, child(path, "workerGeneration"), 1)
    dispatch_id(offer_id, child(path, "offerId"))
    string(offer_id, child(path, "offerId"), max_length=128, pattern=JOURNAL_OFFER_ID)
    string(lease_token, child(path, "leaseToken"), min_length=32, max_length=128, pattern=LEASE_TOKEN)


class ClaimAuthority(Frozen):
    """The five values a worker claims an offer with (``RemoteExecutionOfferClaimAuthority``).

    Validated on construction (ADR-0110 1.3): ``worker_id`` workerId grammar,
    ``worker_session_id`` lowercase UUIDv7, ``worker_generation`` safe int >= 1,
    ``offer_id`` dispatch id that is also a journal file name (``[A-Za-z0-9._:-]{1,128}``),
    ``lease_token`` ``[A-Za-z0-9_-]{32,128}``. ``repr`` never shows the token.

    Raises:
        ContractError: field codes (``pattern``, ``length``, ``not_integer``...) at
            ``$.workerId``, ``$.workerSessionId``, ... (the pending-claim key names).
    """

    __slots__ = ("worker_id", "worker_session_id", "worker_generation", "offer_id", "lease_token")  # noqa: RUF023 (field order)
    _repr_hidden = ("lease_token",)

    worker_id: str
    worker_session_id: str
    worker_generation: int
    offer_id: str
    lease_token: str

    def __init__(self, worker_id: str, worker_session_id: str, worker_generation: int,
                 offer_id: str, lease_token: str) -> None:
        _set = object.__setattr__
        _set(self, "worker_id", worker_id)
        _set(self, "worker_session_id", worker_session_id)
        _set(self, "worker_generation", worker_generation)
        _set(self, "offer_id", offer_id)
        _set(self, "lease_token", lease_token)
        check_authority_fields(
            self.worker_id, self.worker_session_id, self.worker_generation, self.offer_id, self.lease_token
        )

    @property
    def lease_token_digest(self) -> str:
        """``sha256_hex(UTF-8(leaseToken))``: the digest of the token *text*."""
        return sha256_hex(self.lease_token)


def claim_request_body(authority: ClaimAuthority) -> bytes:
    """The offer request body: ``{"workerGeneration":..,"offerId":..,"leaseToken":..}``, compact.

    Raises:
        ContractError: ``too_large`` beyond 4096 bytes (cannot happen for valid authorities).
    """
    body = dumps_bytes({
        "workerGeneration": authority.worker_generation,
        "offerId": authority.offer_id,
        "leaseToken": authority.lease_token,
    })
    if not 2 <= len(body) <= CLAIM_REQUEST_MAX_BYTES:
        raise ContractError("too_large", "$", f"request body exceeds {CLAIM_REQUEST_MAX_BYTES} bytes")
    return body


def offers_path(worker_id: str, session_id: str) -> str:
    """``/api/v3/worker-ingress/workers/{workerId}/sessions/{sessionId}/offers`` (section 1.3).

    Raises:
        ContractError: ``pattern``/``length``/``not_string`` for an invalid id.
    """
    string(worker_id, "$.workerId", max_length=128, pattern=WORKER_ID)
    string(session_id, "$.sessionId", min_length=36, max_length=36, pattern=SESSION_ID)
    return f"/api/v3/worker-ingress/workers/{worker_id}/sessions/{session_id}/offers"


class IdleResponse(Frozen):
    """A valid idle answer: this claim got no work (section 2.1)."""

    __slots__ = ("reason", "stats", "truncated")

    reason: str
    stats: dict[str, int]
    truncated: bool

    def __init__(self, reason: str, stats: dict[str, int], truncated: bool) -> None:
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "stats", stats)
        object.__setattr__(self, "truncated", truncated)


class OfferedResponse(Frozen):
    """A valid offered answer.

    Attributes:
        offer: the full internal offer in inbox key order (section 3.4): ``offerId,
            deliveryKind, executionDigest, candidate, worker, lease`` (13 keys),
            ``leaseToken``, ``executionRevision`` (normalized), ``placementScore``.
            It holds the lease token: never log it; ``repr`` omits it.
    """

    __slots__ = ("offer", "stats", "truncated")
    _repr_hidden = ("offer",)  # and __repr__ below names the offer without its token

    offer: InternalOffer
    stats: dict[str, int]
    truncated: bool

    def __init__(self, offer: InternalOffer, stats: dict[str, int], truncated: bool) -> None:
        object.__setattr__(self, "offer", offer)
        object.__setattr__(self, "stats", stats)
        object.__setattr__(self, "truncated", truncated)

    @property
    def offer_id(self) -> str:
        return str(self.offer["offerId"])

    @property
    def run_id(self) -> str:
        return str(self.offer["candidate"]["runId"])

    def __repr__(self) -> str:
        return (
            f"OfferedResponse(offerId={self.offer_id!r}, runId={self.run_id!r}, "
            f"deliveryKind={self.offer['deliveryKind']!r}, stats={self.stats!r}, truncated={self.truncated!r})"
        )


def _boolean(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise ContractError("not_boolean", path, "must be a boolean")
    return value


def _stats(value: object, path: str) -> dict[str, int]:
    """Section 2.5: exactly six safe ints >= 0 within the reviewed budget."""
    source = object_value(value, path)
    exact_keys(source, STATS_KEYS, path)
    stats = {key: int_value(source[key], child(path, key)) for key in STATS_KEYS}
    for key, cap in (
        ("pages", 16),
        ("candidates", 1024),
        ("plansUnavailable", stats["candidates"]),
        ("placementMismatches", stats["candidates"]),
        ("claimAttempts", 64),
        ("claimRaces", stats["claimAttempts"]),
    ):
        if stats[key] > cap:
            raise ContractError("stats_range", child(path, key), f"must be at most {cap}")
    return stats


def _candidate(value: object, path: str) -> OfferCandidate:
    """Section 2.3, with unknown keys rejected (spec README); rebuilt in canonical order."""
    source = object_value(value, path)
    exact_keys(source, CANDIDATE_KEYS, path)
    out: dict[str, Any] = {key: dispatch_id(source[key], child(path, key)) for key in CANDIDATE_KEYS[:5]}
    out["priority"] = int_value(source["priority"], child(path, "priority"), -MAX_SAFE_INTEGER)
    out["queuedAtMs"] = int_value(source["queuedAtMs"], child(path, "queuedAtMs"))
    out["attemptCreatedAtMs"] = int_value(source["attemptCreatedAtMs"], child(path, "attemptCreatedAtMs"))
    out["attemptNumber"] = int_value(source["attemptNumber"], child(path, "attemptNumber"), 1)
    # Imported where an offer is parsed: an idle pull (most cycles) never needs it.
    from qinglong_edge.contracts.execution_revision import EXECUTOR_TYPE

    if source["executorType"] != EXECUTOR_TYPE:
        raise ContractError("executor_type", child(path, "executorType"), f"must be {EXECUTOR_TYPE}")
    out["executorType"] = EXECUTOR_TYPE
    return out  # type: ignore[return-value]  # the validator: checked above


def _lease_times(source: dict[str, Any], path: str, out: dict[str, Any]) -> None:
    """Copy the four timestamps (safe ints >= 0) into ``out`` and check their order."""
    for key in ("acquiredAtMs", "renewedAtMs", "expiresAtMs", "updatedAtMs"):
        out[key] = int_value(source[key], child(path, key))
    if out["renewedAtMs"] < out["acquiredAtMs"]:
        raise ContractError("lease_order", child(path, "renewedAtMs"), "must be >= acquiredAtMs")
    if out["expiresAtMs"] <= out["renewedAtMs"]:
        raise ContractError("lease_order", child(path, "expiresAtMs"), "must be > renewedAtMs")
    if out["updatedAtMs"] < out["acquiredAtMs"]:
        raise ContractError("lease_order", child(path, "updatedAtMs"), "must be >= acquiredAtMs")


def _build_offer(
    *,
    offer_id: str,
    delivery_kind: object,
    execution_digest: object,
    candidate: OfferCandidate,
    worker: OfferWorker,
    lease: dict[str, Any],
    lease_token: str,
    revision: object,
    placement_score: object,
    path: str,
) -> InternalOffer:
    """Step 12 (``createClusterRemoteExecutionOffer``) over validated parts."""
    if not isinstance(delivery_kind, str) or delivery_kind not in DELIVERY_KINDS:
        raise ContractError("delivery_kind", child(path, "deliveryKind"), "must be new_claim or lease_recovery")
    lease_path = child(path, "lease")
    for lease_key, expected in (
        ("attemptId", candidate["attemptId"]),
        ("runId", candidate["runId"]),
        ("workerId", worker["workerId"]),
        ("workerSessionId", worker["sessionId"]),
        ("workerGeneration", worker["generation"]),
    ):
        if lease[lease_key] != expected:
            raise ContractError("lease_mismatch", child(lease_path, lease_key), "does not match the offer")
    if sha256_hex(lease_token) != lease["leaseTokenDigest"]:
        raise ContractError("lease_token_digest_mismatch", child(lease_path, "leaseTokenDigest"),
                            "is not sha256(leaseToken)")
    revision_path = child(path, "executionRevision")
    from qinglong_edge.contracts.execution_revision import normalize_execution_revision

    normalized = normalize_execution_revision(revision, revision_path)
    for key in ("projectId", "taskId", "taskRevision"):
        if normalized[key] != candidate[key]:
            raise ContractError("revision_candidate_mismatch", child(revision_path, key),
                                "does not match the candidate")
    digest_path = child(path, "executionDigest")
    if not isinstance(execution_digest, str):
        raise ContractError("not_string", digest_path, "must be a string")
    if HEX64.fullmatch(execution_digest) is None:
        raise ContractError("pattern", digest_path, "must be 64 lowercase hex characters")
    if execution_digest != normalized["contentDigest"]:
        raise ContractError("execution_digest_mismatch", digest_path, "does not equal contentDigest")
    score = int_value(placement_score, child(path, "placementScore"))
    return {
        "offerId": offer_id,
        "deliveryKind": delivery_kind,
        "executionDigest": execution_digest,
        "candidate": candidate,
        "worker": worker,
        "lease": lease,  # type: ignore[typeddict-item]  # rebuilt and checked (steps 11-12)
        "leaseToken": lease_token,
        "executionRevision": normalized,
        "placementScore": score,
    }


def _authority_of(authority: object) -> ClaimAuthority:
    if not isinstance(authority, ClaimAuthority):
        raise ContractError("invalid_authority", "$", "a ClaimAuthority is required")
    # Step 2: re-validate (a frozen dataclass can still be forged with object.__setattr__).
    check_authority_fields(authority.worker_id, authority.worker_session_id, authority.worker_generation,
                     authority.offer_id, authority.lease_token)
    return authority


def _equal(value: object, expected: str | int) -> bool:
    # JS strict equality on strings/safe ints: never True == 1 or 2.0 == 2.
    return type(value) is type(expected) and value == expected


def parse_offer_response(body: bytes, authority: ClaimAuthority) -> IdleResponse | OfferedResponse:
    """Validate a 200 offer-pull response body against the claim (section 2.6, in order).

    Args:
        body: the raw response body (the transport has applied section 1.6).
        authority: the claim the request was sent with (from ``pending-claim.json``).

    Returns:
        :class:`IdleResponse` or :class:`OfferedResponse`.

    Raises:
        ContractError: the first violation, with its code and JSON path (module
            docstring). Nothing else escapes; messages never contain the body or token.
    """
    value = loads(body, max_bytes=OFFER_RESPONSE_MAX_BYTES, min_bytes=2)  # steps 1-2
    claim = _authority_of(authority)
    response = object_value(value, "$")  # step 3
    if response.get("status") == "idle":  # step 4
        exact_keys(response, _IDLE_KEYS, "$")
        if response["schema"] != OFFER_SCHEMA:
            raise ContractError("schema", "$.schema", f"must be {OFFER_SCHEMA}")
        reason = response["reason"]
        if not isinstance(reason, str) or reason not in IDLE_REASONS:
            raise ContractError("idle_reason", "$.reason", "not a known idle reason")
        stats = _stats(response["stats"], "$.stats")
        return IdleResponse(reason, stats, _boolean(response["truncated"], "$.truncated"))
    exact_keys(response, _OFFERED_KEYS, "$")  # step 5
    if response["schema"] != OFFER_SCHEMA:
        raise ContractError("schema", "$.schema", f"must be {OFFER_SCHEMA}")
    if response["status"] != "offered":
        raise ContractError("status", "$.status", "must be idle or offered")
    wire = object_value(response["offer"], "$.offer")  # step 6
    exact_keys(wire, _WIRE_OFFER_KEYS, "$.offer")
    if not _equal(wire["offerId"], claim.offer_id):  # step 7
        raise ContractError("offer_id_mismatch", "$.offer.offerId", "does not equal the claim's offerId")
    worker_wire = object_value(wire["worker"], "$.offer.worker")  # step 8
    exact_keys(worker_wire, _WORKER_KEYS, "$.offer.worker")
    for key, expected in (
        ("workerId", claim.worker_id),
        ("sessionId", claim.worker_session_id),
        ("generation", claim.worker_generation),
    ):
        if not _equal(worker_wire[key], expected):
            if isinstance(expected, int) and not is_int(worker_wire[key]):
                raise ContractError("not_integer", f"$.offer.worker.{key}", "must be an integer")
            raise ContractError("worker_mismatch", f"$.offer.worker.{key}", "does not match the claim")
    candidate = _candidate(wire["candidate"], "$.offer.candidate")  # step 9
    lease_wire = object_value(wire["lease"], "$.offer.lease")  # step 10
    exact_keys(lease_wire, WIRE_LEASE_KEYS, "$.offer.lease")
    lease: dict[str, Any] = {  # step 11: rebuilt from the claim, never from the wire
        "attemptId": candidate["attemptId"],
        "runId": candidate["runId"],
        "status": "leased",
        "version": int_value(lease_wire["version"], "$.offer.lease.version"),
        "leaseGeneration": int_value(lease_wire["leaseGeneration"], "$.offer.lease.leaseGeneration", 1),
        "workerId": claim.worker_id,
        "workerSessionId": claim.worker_session_id,
        "workerGeneration": claim.worker_generation,
        "leaseTokenDigest": claim.lease_token_digest,
    }
    _lease_times(lease_wire, "$.offer.lease", lease)
    worker: OfferWorker = {"workerId": claim.worker_id, "sessionId": claim.worker_session_id,
                           "generation": claim.worker_generation}
    offer = _build_offer(  # step 12
        offer_id=claim.offer_id,
        delivery_kind=wire["deliveryKind"],
        execution_digest=wire["executionDigest"],
        candidate=candidate,
        worker=worker,
        lease=lease,
        lease_token=claim.lease_token,
        revision=wire["executionRevision"],
        placement_score=wire["placementScore"],
        path="$.offer",
    )
    stats = _stats(response["stats"], "$.stats")  # step 13
    return OfferedResponse(offer, stats, _boolean(response["truncated"], "$.truncated"))


def normalize_internal_offer(value: object, path: str = "$.offer") -> InternalOffer:
    """Re-validate a stored internal offer (an inbox record's ``offer``).

    Every check of step 12 runs again: the 13-key lease (``status`` ``leased``, grammars,
    timestamp order, ``leaseTokenDigest == sha256(leaseToken)``, run/attempt/worker
    equal to the candidate and worker), the revision normalized and its digest
    recomputed, ``executionDigest``, ``placementScore``.

    Returns:
        A new dict in inbox key order (section 3.4).

    Raises:
        ContractError: as :func:`parse_offer_response`.
    """
    source = object_value(value, path)
    exact_keys(source, OFFER_KEYS, path)
    offer_id = dispatch_id(source["offerId"], child(path, "offerId"))
    candidate = _candidate(source["candidate"], child(path, "candidate"))
    worker_path = child(path, "worker")
    worker_source = object_value(source["worker"], worker_path)
    exact_keys(worker_source, _WORKER_KEYS, worker_path)
    worker: OfferWorker = {
        "workerId": string(worker_source["workerId"], child(worker_path, "workerId"), max_length=128,
                           pattern=WORKER_ID),
        "sessionId": string(worker_source["sessionId"], child(worker_path, "sessionId"), min_length=36,
                            max_length=36, pattern=SESSION_ID),
        "generation": int_value(worker_source["generation"], child(worker_path, "generation"), 1),
    }
    lease_path = child(path, "lease")
    lease_source = object_value(source["lease"], lease_path)
    exact_keys(lease_source, LEASE_KEYS, lease_path)
    lease: dict[str, Any] = {
        "attemptId": dispatch_id(lease_source["attemptId"], child(lease_path, "attemptId")),
        "runId": dispatch_id(lease_source["runId"], child(lease_path, "runId")),
    }
    if lease_source["status"] != "leased":
        raise ContractError("lease_status", child(lease_path, "status"), "an offer's lease must be leased")
    lease["status"] = "leased"
    lease["version"] = int_value(lease_source["version"], child(lease_path, "version"))
    lease["leaseGeneration"] = int_value(lease_source["leaseGeneration"], child(lease_path, "leaseGeneration"), 1)
    lease["workerId"] = string(lease_source["workerId"], child(lease_path, "workerId"), max_length=128,
                               pattern=WORKER_ID)
    lease["workerSessionId"] = string(lease_source["workerSessionId"], child(lease_path, "workerSessionId"),
                                      min_length=36, max_length=36, pattern=SESSION_ID)
    lease["workerGeneration"] = int_value(lease_source["workerGeneration"], child(lease_path, "workerGeneration"), 1)
    lease["leaseTokenDigest"] = string(lease_source["leaseTokenDigest"], child(lease_path, "leaseTokenDigest"),
                                       min_length=64, max_length=64, pattern=HEX64)
    _lease_times(lease_source, lease_path, lease)
    token = string(source["leaseToken"], child(path, "leaseToken"), min_length=32, max_length=128,
                   pattern=LEASE_TOKEN)
    return _build_offer(
        offer_id=offer_id,
        delivery_kind=source["deliveryKind"],
        execution_digest=source["executionDigest"],
        candidate=candidate,
        worker=worker,
        lease=lease,
        lease_token=token,
        revision=source["executionRevision"],
        placement_score=source["placementScore"],
        path=path,
    )


def same_offer_authority(a: InternalOffer, b: InternalOffer, *, compare_delivery_kind: bool = False) -> bool:
    """Whether two *normalized* internal offers carry the same authority (section 3.6).

    Compares ``offerId``, ``executionDigest``, the JSON of ``candidate``, ``worker`` and
    ``executionRevision``, ``lease.runId``, ``lease.attemptId``, ``lease.leaseGeneration``,
    ``lease.leaseTokenDigest`` and ``leaseToken``. Never the lease version or timestamps.
    ``deliveryKind`` only when ``compare_delivery_kind`` (spec README: a ``lease_recovery``
    replay with a higher lease version over a stored ``new_claim`` updates the lease).

    Args:
        a, b: offers from :func:`normalize_internal_offer` or ``OfferedResponse.offer``
            (not re-normalized here).
    """
    la, lb = a["lease"], b["lease"]
    return (
        a["offerId"] == b["offerId"]
        and a["executionDigest"] == b["executionDigest"]
        and (not compare_delivery_kind or a["deliveryKind"] == b["deliveryKind"])
        and dumps(a["candidate"]) == dumps(b["candidate"])
        and dumps(a["worker"]) == dumps(b["worker"])
        and la["runId"] == lb["runId"]
        and la["attemptId"] == lb["attemptId"]
        and la["leaseGeneration"] == lb["leaseGeneration"]
        and la["leaseTokenDigest"] == lb["leaseTokenDigest"]
        and a["leaseToken"] == b["leaseToken"]
        and dumps(a["executionRevision"]) == dumps(b["executionRevision"])
    )
