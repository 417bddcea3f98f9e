"""The worker journal's record formats: pure bytes <-> values, no I/O.

Sources: offer-delivery.md sections 3.3-3.6 and 4.2; reference
``remoteOfferDelivery.ts`` (worker: ``normalizeWorkerRemoteOfferClaimRecord``) and
``executionInbox.ts``; spec README ("abandoned" claims).

Files (each ``JSON.stringify(record) + "\\n"``, 2-163 840 bytes):

``pending-claim.json``
    12 keys in order ``schemaVersion (1), revision, workerId, workerSessionId,
    workerGeneration, offerId, leaseToken, attemptCount (0-16), createdAtMs,
    updatedAtMs (>= createdAtMs), lastAttemptAtMs (null or createdAtMs..updatedAtMs),
    nextAttemptAtMs (>= createdAtMs)``. Codes as the reference: ``claim_conflict``
    (not an object, key set, ``schemaVersion``, ``attemptCount``, ordering, a bad
    ``lastAttemptAtMs``), ``claim_revision_conflict`` (``revision``),
    ``invalid_configuration`` (a negative or unsafe ``createdAtMs``/``updatedAtMs``/
    ``nextAttemptAtMs``), the field codes of :class:`ClaimAuthority` for the authority.
``offers/<offerId>.json`` (inbox record)
    The record rules and the state machine are :mod:`qinglong_edge.contracts.inbox`
    (re-exported here: :func:`normalize_inbox_record`, :func:`check_inbox_update`,
    :func:`inbox_record`, the state tables); this module adds the file bytes
    (:func:`inbox_record_bytes`, :func:`parse_inbox_record`; code ``offer_conflict``
    when the record names another offer than its file).
``abandoned/<offerId>.json`` (our decision, spec README)
    A claim given up, *without* its plaintext lease token: ``schemaVersion (1),
    offerId, reason, abandonedAtMs, workerId, workerSessionId, workerGeneration,
    leaseTokenDigest, revision, attemptCount, createdAtMs, updatedAtMs,
    lastAttemptAtMs, nextAttemptAtMs``; ``reason`` is one of :data:`ABANDON_REASONS`
    (code ``abandon_reason``).

Update rules (section 3.6): :func:`~qinglong_edge.contracts.inbox.check_inbox_update`.
"""

from __future__ import annotations

from qinglong_edge.contracts._shape import Frozen, exact_keys, int_value, is_int, object_value
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import MAX_SAFE_INTEGER
from qinglong_edge.contracts.ids import HEX64

# The inbox record rules and state machine live in contracts/inbox.py; these names are
# re-exported so existing callers (worker/journal/store.py, commands, tests) keep working.
from qinglong_edge.contracts.inbox import (
    INBOX_FIELD_STATES,
    INBOX_OPTIONAL_KEYS,
    INBOX_STATES,
    INBOX_TRANSITIONS,
    RECOVERY_REASONS,
    check_inbox_update,
    inbox_record,
    normalize_inbox_record,
)
from qinglong_edge.contracts.offer import ClaimAuthority, check_authority_fields
from qinglong_edge.contracts.strictjson import dumps, loads

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from qinglong_edge.contracts.records import AbandonedRecord, ClaimRecord, InboxRecord

__all__ = [
    "ABANDON_REASONS",
    "INBOX_FIELD_STATES",
    "INBOX_OPTIONAL_KEYS",
    "INBOX_STATES",
    "INBOX_TRANSITIONS",
    "MAX_ATTEMPTS",
    "MAX_RECORD_BYTES",
    "RECOVERY_REASONS",
    "AbandonedClaim",
    "PendingClaim",
    "abandoned_record_bytes",
    "check_inbox_update",
    "inbox_record",
    "inbox_record_bytes",
    "normalize_inbox_record",
    "parse_abandoned_record",
    "parse_inbox_record",
    "parse_pending_claim",
]

#: Per-file size cap (``MAX_WORKER_REMOTE_OFFER_RECORD_BYTES``, 160 KiB), section 3.1.
MAX_RECORD_BYTES = 160 * 1024
#: ``MAX_WORKER_REMOTE_OFFER_ATTEMPTS``: sends per claim before it is given up.
MAX_ATTEMPTS = 16

_CLAIM_KEYS = (
    "schemaVersion", "revision", "workerId", "workerSessionId", "workerGeneration", "offerId", "leaseToken",
    "attemptCount", "createdAtMs", "updatedAtMs", "lastAttemptAtMs", "nextAttemptAtMs",
)

ABANDON_REASONS: tuple[str, ...] = ("stale_session", "attempt_budget_exhausted", "offer_fenced")
_ABANDONED_KEYS = (
    "schemaVersion", "offerId", "reason", "abandonedAtMs", "workerId", "workerSessionId", "workerGeneration",
    "leaseTokenDigest", "revision", "attemptCount", "createdAtMs", "updatedAtMs", "lastAttemptAtMs",
    "nextAttemptAtMs",
)


def _record_bytes(record: Mapping[str, object]) -> bytes:
    data = (dumps(record) + "\n").encode("utf-8")
    if not 2 <= len(data) <= MAX_RECORD_BYTES:
        raise ContractError("too_large", "$", f"record exceeds {MAX_RECORD_BYTES} bytes")
    return data


def _load(data: bytes) -> Any:
    return loads(data, max_bytes=MAX_RECORD_BYTES, min_bytes=2)


def _time(value: object, path: str, code: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_SAFE_INTEGER:
        raise ContractError(code, path, "must be a safe integer >= 0")
    return value


def _check_claim(values: Mapping[str, Any]) -> None:
    """The rules of section 3.3 in the reference's order (codes: module docstring)."""
    if values["schemaVersion"] != 1 or not is_int(values["schemaVersion"]):
        raise ContractError("claim_conflict", "$.schemaVersion", "must be 1")
    check_authority_fields(values["workerId"], values["workerSessionId"], values["workerGeneration"],
                     values["offerId"], values["leaseToken"])
    _time(values["revision"], "$.revision", "claim_revision_conflict")
    attempts = values["attemptCount"]
    if not is_int(attempts) or not 0 <= attempts <= MAX_ATTEMPTS:
        raise ContractError("claim_conflict", "$.attemptCount", f"must be 0..{MAX_ATTEMPTS}")
    created = _time(values["createdAtMs"], "$.createdAtMs", "invalid_configuration")
    updated = _time(values["updatedAtMs"], "$.updatedAtMs", "invalid_configuration")
    next_at = _time(values["nextAttemptAtMs"], "$.nextAttemptAtMs", "invalid_configuration")
    if updated < created:
        raise ContractError("claim_conflict", "$.updatedAtMs", "must be >= createdAtMs")
    if next_at < created:
        raise ContractError("claim_conflict", "$.nextAttemptAtMs", "must be >= createdAtMs")
    last = values["lastAttemptAtMs"]
    if last is not None and (not is_int(last) or not created <= last <= updated):
        raise ContractError("claim_conflict", "$.lastAttemptAtMs", "must be null or createdAtMs..updatedAtMs")


class PendingClaim(Frozen):
    """``pending-claim.json`` (section 3.3): at most one outstanding claim.

    Validated on construction (so :meth:`replace` re-checks a new revision). Keyword
    arguments only. ``repr`` never shows the lease token.

    Raises:
        ContractError: codes in the module docstring.
    """

    __slots__ = (  # noqa: RUF023 (field order)
        "schema_version",
        "revision",
        "worker_id",
        "worker_session_id",
        "worker_generation",
        "offer_id",
        "lease_token",
        "attempt_count",
        "created_at_ms",
        "updated_at_ms",
        "last_attempt_at_ms",
        "next_attempt_at_ms",
    )
    _repr_hidden = ("lease_token",)

    schema_version: int
    revision: int
    worker_id: str
    worker_session_id: str
    worker_generation: int
    offer_id: str
    lease_token: str
    attempt_count: int
    created_at_ms: int
    updated_at_ms: int
    last_attempt_at_ms: int | None
    next_attempt_at_ms: int

    def __init__(
        self,
        *,
        schema_version: int = 1,
        revision: int,
        worker_id: str,
        worker_session_id: str,
        worker_generation: int,
        offer_id: str,
        lease_token: str,
        attempt_count: int,
        created_at_ms: int,
        updated_at_ms: int,
        last_attempt_at_ms: int | None,
        next_attempt_at_ms: int,
    ) -> None:
        _set = object.__setattr__
        _set(self, "schema_version", schema_version)
        _set(self, "revision", revision)
        _set(self, "worker_id", worker_id)
        _set(self, "worker_session_id", worker_session_id)
        _set(self, "worker_generation", worker_generation)
        _set(self, "offer_id", offer_id)
        _set(self, "lease_token", lease_token)
        _set(self, "attempt_count", attempt_count)
        _set(self, "created_at_ms", created_at_ms)
        _set(self, "updated_at_ms", updated_at_ms)
        _set(self, "last_attempt_at_ms", last_attempt_at_ms)
        _set(self, "next_attempt_at_ms", next_attempt_at_ms)
        _check_claim(self.to_dict())

    @classmethod
    def create(cls, authority: ClaimAuthority, now_ms: int) -> PendingClaim:
        """A fresh claim: revision 0, no attempt yet, due at ``now_ms`` (section 3.7 step 2)."""
        return cls(
            revision=0,
            worker_id=authority.worker_id,
            worker_session_id=authority.worker_session_id,
            worker_generation=authority.worker_generation,
            offer_id=authority.offer_id,
            lease_token=authority.lease_token,
            attempt_count=0,
            created_at_ms=now_ms,
            updated_at_ms=now_ms,
            last_attempt_at_ms=None,
            next_attempt_at_ms=now_ms,
        )

    @property
    def authority(self) -> ClaimAuthority:
        return ClaimAuthority(self.worker_id, self.worker_session_id, self.worker_generation, self.offer_id,
                              self.lease_token)

    def replace(self, **changes: Any) -> PendingClaim:
        """A validated copy with ``changes`` (snake_case field names), as
        :func:`dataclasses.replace` did: an unknown name is a ``TypeError``."""
        values: dict[str, Any] = {name: getattr(self, name) for name in self.__slots__}
        values.update(changes)
        return self.__class__(**values)

    def to_dict(self) -> ClaimRecord:
        """The 12 keys in file order."""
        return {
            "schemaVersion": self.schema_version,
            "revision": self.revision,
            "workerId": self.worker_id,
            "workerSessionId": self.worker_session_id,
            "workerGeneration": self.worker_generation,
            "offerId": self.offer_id,
            "leaseToken": self.lease_token,
            "attemptCount": self.attempt_count,
            "createdAtMs": self.created_at_ms,
            "updatedAtMs": self.updated_at_ms,
            "lastAttemptAtMs": self.last_attempt_at_ms,
            "nextAttemptAtMs": self.next_attempt_at_ms,
        }

    def to_bytes(self) -> bytes:
        """``JSON.stringify(record) + "\\n"``, compact, in file key order."""
        return _record_bytes(self.to_dict())


def parse_pending_claim(data: bytes) -> PendingClaim:
    """Parse ``pending-claim.json`` bytes (2-163 840, strict JSON).

    Raises:
        ContractError: strict-JSON codes, or the codes of the module docstring.
    """
    value = _load(data)
    if not isinstance(value, dict):
        raise ContractError("claim_conflict", "$", "must be an object")
    exact_keys(value, _CLAIM_KEYS, "$", code="claim_conflict")
    return PendingClaim(
        schema_version=value["schemaVersion"],
        revision=value["revision"],
        worker_id=value["workerId"],
        worker_session_id=value["workerSessionId"],
        worker_generation=value["workerGeneration"],
        offer_id=value["offerId"],
        lease_token=value["leaseToken"],
        attempt_count=value["attemptCount"],
        created_at_ms=value["createdAtMs"],
        updated_at_ms=value["updatedAtMs"],
        last_attempt_at_ms=value["lastAttemptAtMs"],
        next_attempt_at_ms=value["nextAttemptAtMs"],
    )


def inbox_record_bytes(record: InboxRecord) -> bytes:
    """Validate ``record`` and serialize it: file key order, compact, ``"\\n"``, 2-163 840 bytes."""
    return _record_bytes(normalize_inbox_record(record))


def parse_inbox_record(data: bytes, expected_offer_id: str | None = None) -> InboxRecord:
    """Parse ``offers/<offerId>.json`` bytes.

    Args:
        expected_offer_id: the offerId of the file name; the record must name the same
            offer (code ``offer_conflict``).
    """
    record = normalize_inbox_record(_load(data))
    if expected_offer_id is not None and record["offer"]["offerId"] != expected_offer_id:
        raise ContractError("offer_conflict", "$.offer.offerId", "does not match the file name")
    return record


class AbandonedClaim(Frozen):
    """A parsed ``abandoned/<offerId>.json``: the claim minus its token, plus why and when."""

    __slots__ = (  # noqa: RUF023 (field order)
        "reason",
        "abandoned_at_ms",
        "offer_id",
        "worker_id",
        "worker_session_id",
        "worker_generation",
        "lease_token_digest",
        "revision",
        "attempt_count",
        "created_at_ms",
        "updated_at_ms",
        "last_attempt_at_ms",
        "next_attempt_at_ms",
    )

    reason: str
    abandoned_at_ms: int
    offer_id: str
    worker_id: str
    worker_session_id: str
    worker_generation: int
    lease_token_digest: str
    revision: int
    attempt_count: int
    created_at_ms: int
    updated_at_ms: int
    last_attempt_at_ms: int | None
    next_attempt_at_ms: int

    def __init__(  # noqa: PLR0917 (the dataclass signature)
        self,
        reason: str,
        abandoned_at_ms: int,
        offer_id: str,
        worker_id: str,
        worker_session_id: str,
        worker_generation: int,
        lease_token_digest: str,
        revision: int,
        attempt_count: int,
        created_at_ms: int,
        updated_at_ms: int,
        last_attempt_at_ms: int | None,
        next_attempt_at_ms: int,
    ) -> None:
        _set = object.__setattr__
        _set(self, "reason", reason)
        _set(self, "abandoned_at_ms", abandoned_at_ms)
        _set(self, "offer_id", offer_id)
        _set(self, "worker_id", worker_id)
        _set(self, "worker_session_id", worker_session_id)
        _set(self, "worker_generation", worker_generation)
        _set(self, "lease_token_digest", lease_token_digest)
        _set(self, "revision", revision)
        _set(self, "attempt_count", attempt_count)
        _set(self, "created_at_ms", created_at_ms)
        _set(self, "updated_at_ms", updated_at_ms)
        _set(self, "last_attempt_at_ms", last_attempt_at_ms)
        _set(self, "next_attempt_at_ms", next_attempt_at_ms)


def _abandon_reason(reason: object) -> str:
    if not isinstance(reason, str) or reason not in ABANDON_REASONS:
        raise ContractError("abandon_reason", "$.reason", "not a known abandon reason")
    return reason


def abandoned_record_bytes(claim: PendingClaim, reason: str, abandoned_at_ms: int) -> bytes:
    """Serialize a given-up claim for ``abandoned/<offerId>.json`` (spec README).

    The plaintext lease token is replaced by its digest: the record is for the operator,
    a new claim is made with a new token.

    Args:
        reason: ``stale_session``, ``attempt_budget_exhausted`` or ``offer_fenced``.
        abandoned_at_ms: wall-clock ms, safe int >= 0.

    Raises:
        ContractError: ``abandon_reason``, ``not_integer``/``out_of_range``.
    """
    record: AbandonedRecord = {
        "schemaVersion": 1,
        "offerId": claim.offer_id,
        "reason": _abandon_reason(reason),
        "abandonedAtMs": int_value(abandoned_at_ms, "$.abandonedAtMs"),
        "workerId": claim.worker_id,
        "workerSessionId": claim.worker_session_id,
        "workerGeneration": claim.worker_generation,
        "leaseTokenDigest": claim.authority.lease_token_digest,
        "revision": claim.revision,
        "attemptCount": claim.attempt_count,
        "createdAtMs": claim.created_at_ms,
        "updatedAtMs": claim.updated_at_ms,
        "lastAttemptAtMs": claim.last_attempt_at_ms,
        "nextAttemptAtMs": claim.next_attempt_at_ms,
    }
    return _record_bytes(record)


_PLACEHOLDER_TOKEN = "0" * 43  # stands in for the dropped token when re-checking claim rules


def parse_abandoned_record(data: bytes) -> AbandonedClaim:
    """Parse ``abandoned/<offerId>.json`` bytes written by :func:`abandoned_record_bytes`.

    Raises:
        ContractError: strict-JSON codes, ``key_set``, ``schema_version``,
            ``abandon_reason``, ``pattern`` (digest), and the claim codes.
    """
    value = object_value(_load(data), "$")
    exact_keys(value, _ABANDONED_KEYS, "$")
    if value["schemaVersion"] != 1 or not is_int(value["schemaVersion"]):
        raise ContractError("schema_version", "$.schemaVersion", "must be 1")
    reason = _abandon_reason(value["reason"])
    abandoned_at = int_value(value["abandonedAtMs"], "$.abandonedAtMs")
    digest = value["leaseTokenDigest"]
    if not isinstance(digest, str) or HEX64.fullmatch(digest) is None:
        raise ContractError("pattern", "$.leaseTokenDigest", "must be 64 lowercase hex characters")
    claim_values = {key: value.get(key) for key in _CLAIM_KEYS}
    claim_values["leaseToken"] = _PLACEHOLDER_TOKEN
    _check_claim(claim_values)
    return AbandonedClaim(
        reason=reason,
        abandoned_at_ms=abandoned_at,
        offer_id=value["offerId"],
        worker_id=value["workerId"],
        worker_session_id=value["workerSessionId"],
        worker_generation=value["workerGeneration"],
        lease_token_digest=digest,
        revision=value["revision"],
        attempt_count=value["attemptCount"],
        created_at_ms=value["createdAtMs"],
        updated_at_ms=value["updatedAtMs"],
        last_attempt_at_ms=value["lastAttemptAtMs"],
        next_attempt_at_ms=value["nextAttemptAtMs"],
    )
