"""The inbox record ``offers/<offerId>.json`` and its state machine: pure, no I/O.

Sources: remote-execution.md sections 2.1-2.3 and 5 ("Persist means"); offer-delivery.md
sections 3.4 and 3.6; reference ``executionInbox.ts`` (``normalizeWorkerRemoteExecutionInboxRecord``,
``assertWorkerRemoteExecutionInboxTransition``) and ``executionInboxProcessor.ts``
(``replace``: revision + 1, ``updatedAtMs = max(now, previous)``). The file bytes
(``inbox_record_bytes``, ``parse_inbox_record``) live in
:mod:`qinglong_edge.contracts.journal_records`, which re-exports this module's names.

Record (a ``dict`` in file key order): ``schemaVersion (1), revision (>= 0), state, offer
(the internal offer, offer-delivery.md 3.4), acceptedAtMs, updatedAtMs (>= acceptedAtMs)``,
then the optional ``executorHandle (1-512 bytes, no ctrl), executorStartedAtMs (ms),
logArtifactId (1-36 bytes, no ctrl), completionReceiptCallbackSequence (1..2^31-1) +
completionReceiptTokenDigest (64 lowercase hex; a pair), completionAcknowledgedAtMs (ms),
recoveryReason`` (:data:`RECOVERY_REASONS`). Which state requires (R), allows (O) or forbids
each optional field is :data:`INBOX_FIELD_STATES` (section 2.1 table).

Every step is a pure function from the current record to the next one (T1-T12 of
section 2.2)::

    accepted --to_starting_acknowledged--> starting_acknowledged --to_launching--> launching
    launching --to_started--> started --to_running_acknowledged--> running_acknowledged
    starting_acknowledged | launching --to_start_failed--> start_failed
    start_failed --to_start_failure_acknowledged--> start_failure_acknowledged   (terminal)
    launching | started | running_acknowledged | recovery_required(launch_outcome_unknown)
        --to_completion_acknowledged--> completion_acknowledged                   (terminal)
    any non-terminal --to_recovery_required(reason)--> recovery_required
    any non-terminal --with_renewed_lease--> the same state with the renewed lease

Each step: the target is in :data:`INBOX_TRANSITIONS` (offer-delivery.md 3.4); ``revision``
+ 1; ``updatedAtMs = max(now_ms, previous.updatedAtMs)``; it sets only the fields its
target introduces (:data:`NEW_FIELDS`), never changes a set one; the move to
``completion_acknowledged`` drops ``recoveryReason`` and sets ``completionAcknowledgedAtMs =
updatedAtMs``. The result is re-checked with :func:`check_inbox_update`, so the journal's
own check accepts every step produced here.

Our tightenings over the reference's inbox check (it never writes them either, section
2.2): a step may only set the fields its target introduces; ``recovery_required`` reaches
``completion_acknowledged`` only with ``launch_outcome_unknown`` (T10); on that move
``completionAcknowledgedAtMs`` equals ``updatedAtMs``.

Error codes (``ContractError.code``): record validation -- ``not_object``, ``key_set``,
``schema_version``, ``inbox_state``, ``record_order``, ``invalid_record``,
``recovery_reason``, field codes, every code of
:func:`~qinglong_edge.contracts.offer.normalize_internal_offer` under ``$.offer``; steps --
``offer_conflict`` (authority changed), ``offer_revision_conflict`` (revision, accepted
time, ``updatedAtMs`` or lease version going back, a different lease at the same version, a
renewal that does not raise the version), ``lease_order`` (a renewal's times),
``invalid_transition`` (target not allowed, a set field changed, a field the target does
not introduce, recovery-to-completion with another reason), ``not_integer`` /
``out_of_range`` (a time argument).
"""

from __future__ import annotations

from qinglong_edge.contracts._shape import child, exact_keys, int_value, is_int, object_value, utf8_length
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import MAX_INT32, has_control
from qinglong_edge.contracts.ids import HEX64
from qinglong_edge.contracts.offer import normalize_internal_offer, same_offer_authority
from qinglong_edge.contracts.strictjson import dumps

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from qinglong_edge.contracts.records import InboxOptionalKey, InboxRecord, InternalOffer, OfferLease

__all__ = [
    "INBOX_FIELD_STATES",
    "INBOX_OPTIONAL_KEYS",
    "INBOX_STATES",
    "INBOX_TRANSITIONS",
    "NEW_FIELDS",
    "RECOVERY_REASONS",
    "TERMINAL_STATES",
    "advance",
    "check_inbox_update",
    "inbox_record",
    "normalize_inbox_record",
    "renewed_lease",
    "to_completion_acknowledged",
    "to_launching",
    "to_recovery_required",
    "to_running_acknowledged",
    "to_start_failed",
    "to_start_failure_acknowledged",
    "to_started",
    "to_starting_acknowledged",
    "with_lease",
    "with_renewed_lease",
    "with_result_times",
]

INBOX_STATES: tuple[str, ...] = (
    "accepted",
    "starting_acknowledged",
    "launching",
    "started",
    "running_acknowledged",
    "start_failed",
    "start_failure_acknowledged",
    "completion_acknowledged",
    "recovery_required",
)


def _to(state: str, *targets: str) -> frozenset[str]:
    return frozenset((state, *targets))  # same-state is always allowed


#: Allowed inbox transitions (offer-delivery.md 3.4); every state may also stay where it is.
INBOX_TRANSITIONS: dict[str, frozenset[str]] = {
    "accepted": _to("accepted", "starting_acknowledged", "recovery_required"),
    "starting_acknowledged": _to("starting_acknowledged", "launching", "start_failed", "recovery_required"),
    "launching": _to("launching", "started", "start_failed", "completion_acknowledged", "recovery_required"),
    "started": _to("started", "running_acknowledged", "completion_acknowledged", "recovery_required"),
    "running_acknowledged": _to("running_acknowledged", "completion_acknowledged", "recovery_required"),
    "start_failed": _to("start_failed", "start_failure_acknowledged", "recovery_required"),
    "start_failure_acknowledged": _to("start_failure_acknowledged"),
    "completion_acknowledged": _to("completion_acknowledged"),
    "recovery_required": _to("recovery_required", "completion_acknowledged"),
}
#: States no transition leaves (what inbox retention may prune; ``recovery_required`` may
#: also be terminal for residency, see :mod:`qinglong_edge.contracts.residency`).
TERMINAL_STATES = frozenset(state for state, targets in INBOX_TRANSITIONS.items() if targets == {state})

RECOVERY_REASONS: tuple[str, ...] = (
    "launch_outcome_unknown",
    "control_plane_already_running",
    "control_plane_terminal",
    "lease_lost_local_execution_stopped",
    "lease_lost_local_execution_unverified",
)
_BASE_KEYS = ("schemaVersion", "revision", "state", "offer", "acceptedAtMs", "updatedAtMs")
INBOX_OPTIONAL_KEYS: tuple[InboxOptionalKey, ...] = (
    "executorHandle",
    "executorStartedAtMs",
    "logArtifactId",
    "completionReceiptCallbackSequence",
    "completionReceiptTokenDigest",
    "completionAcknowledgedAtMs",
    "recoveryReason",
    "resultStartedAtMs",
    "resultFinishedAtMs",
)
_LAUNCHED = frozenset({"launching", "started", "running_acknowledged", "completion_acknowledged"})
_RESULT_STATES = frozenset({"launching", "started", "running_acknowledged", "completion_acknowledged",
                            "recovery_required"})
_MAYBE_LAUNCHED = frozenset({"start_failed", "start_failure_acknowledged", "recovery_required"})
#: Per optional field: (states that require it, states that allow it without requiring it).
#: Derived from ``normalizeWorkerRemoteExecutionInboxRecord``; every other state forbids it.
#: The receipt pair (callback sequence + token digest) shares one rule.
INBOX_FIELD_STATES: dict[InboxOptionalKey, tuple[frozenset[str], frozenset[str]]] = {
    "executorHandle": (
        frozenset({"started", "running_acknowledged"}),
        frozenset({"completion_acknowledged", "recovery_required"}),
    ),
    "executorStartedAtMs": (_LAUNCHED, _MAYBE_LAUNCHED),
    "logArtifactId": (_LAUNCHED, _MAYBE_LAUNCHED),
    "completionReceiptCallbackSequence": (_LAUNCHED, _MAYBE_LAUNCHED),
    "completionAcknowledgedAtMs": (frozenset({"completion_acknowledged"}), frozenset()),
    "recoveryReason": (frozenset({"recovery_required"}), frozenset()),
    "resultStartedAtMs": (frozenset(), _RESULT_STATES),
}
_PAIR = ("completionReceiptCallbackSequence", "completionReceiptTokenDigest")
#: Our on-disk extension (spec README "Decisions for clocks", "Wire timestamps"): the
#: completion's ``result.startedAtMs`` / ``finishedAtMs`` in the cluster's clock, computed
#: once when the job's exit is observed and stored before the first completion, so every
#: replay sends the same bytes. A pair; set by a step that keeps a launched state (or by
#: the move to ``completion_acknowledged`` / ``recovery_required``), never changed after.
_RESULT = ("resultStartedAtMs", "resultFinishedAtMs")
#: The optional fields a step into each state may set (section 2.2: T5 sets the launch
#: barrier, T7 the handle, T10 the acknowledgement time, ``recover`` the reason). Any other
#: step sets none; a field once set never changes.
NEW_FIELDS: dict[str, frozenset[str]] = {
    "launching": frozenset({"executorStartedAtMs", "logArtifactId", *_PAIR, *_RESULT}),
    "started": frozenset({"executorHandle", *_RESULT}),
    "running_acknowledged": frozenset(_RESULT),
    "completion_acknowledged": frozenset({"completionAcknowledgedAtMs", *_RESULT}),
    "recovery_required": frozenset({"recoveryReason", *_RESULT}),
}


def _bounded_text(value: object, path: str, max_bytes: int) -> str:
    if not isinstance(value, str):
        raise ContractError("not_string", path, "must be a string")
    if not value or utf8_length(value) > max_bytes:
        raise ContractError("length", path, f"must be 1..{max_bytes} UTF-8 bytes")
    if has_control(value):
        raise ContractError("control_character", path, "control characters are not allowed")
    return value


def _optional_value(key: str, value: object, path: str) -> object:
    if key == "executorHandle":
        return _bounded_text(value, path, 512)
    if key == "logArtifactId":
        return _bounded_text(value, path, 36)
    if key == "completionReceiptCallbackSequence":
        return int_value(value, path, 1, MAX_INT32)
    if key == "completionReceiptTokenDigest":
        if not isinstance(value, str) or HEX64.fullmatch(value) is None:
            raise ContractError("pattern", path, "must be 64 lowercase hex characters")
        return value
    if key == "recoveryReason":
        if not isinstance(value, str) or value not in RECOVERY_REASONS:
            raise ContractError("recovery_reason", path, "not a known recovery reason")
        return value
    return int_value(value, path)  # executorStartedAtMs, completionAcknowledgedAtMs


def normalize_inbox_record(value: object, path: str = "$") -> InboxRecord:
    """Validate an inbox record (``normalizeWorkerRemoteExecutionInboxRecord``, section 2.1).

    Returns:
        A new dict in file key order (base keys, then the present optional keys in
        their order) with the offer re-normalized.

    Raises:
        ContractError: codes in the module docstring.
    """
    source = object_value(value, path)
    exact_keys(source, _BASE_KEYS, path, INBOX_OPTIONAL_KEYS)
    if source["schemaVersion"] != 1 or not is_int(source["schemaVersion"]):
        raise ContractError("schema_version", child(path, "schemaVersion"), "must be 1")
    state = source["state"]
    if not isinstance(state, str) or state not in INBOX_TRANSITIONS:
        raise ContractError("inbox_state", child(path, "state"), "not a known inbox state")
    revision = int_value(source["revision"], child(path, "revision"))
    accepted_at = int_value(source["acceptedAtMs"], child(path, "acceptedAtMs"))
    updated_at = int_value(source["updatedAtMs"], child(path, "updatedAtMs"))
    if updated_at < accepted_at:
        raise ContractError("record_order", child(path, "updatedAtMs"), "must be >= acceptedAtMs")
    offer = normalize_internal_offer(source["offer"], child(path, "offer"))
    out: dict[str, Any] = {
        "schemaVersion": 1,
        "revision": revision,
        "state": state,
        "offer": offer,
        "acceptedAtMs": accepted_at,
        "updatedAtMs": updated_at,
    }
    for key in INBOX_OPTIONAL_KEYS:
        if key in source:
            out[key] = _optional_value(key, source[key], child(path, key))
    if (_PAIR[0] in out) != (_PAIR[1] in out):
        raise ContractError("invalid_record", child(path, _PAIR[1]),
                            "the completion receipt sequence and token digest come as a pair")
    if (_RESULT[0] in out) != (_RESULT[1] in out):
        raise ContractError("invalid_record", child(path, _RESULT[1]), "the result times come as a pair")
    if _RESULT[0] in out and out[_RESULT[1]] < out[_RESULT[0]]:
        raise ContractError("record_order", child(path, _RESULT[1]), "must be >= resultStartedAtMs")
    if "executorHandle" in out and "executorStartedAtMs" not in out:
        raise ContractError("invalid_record", child(path, "executorStartedAtMs"),
                            "an executor handle needs its start time")
    for key, (required, allowed) in INBOX_FIELD_STATES.items():
        present = key in out
        if state in required and not present:
            raise ContractError("invalid_record", child(path, key), f"required in state {state}")
        if present and state not in required and state not in allowed:
            raise ContractError("invalid_record", child(path, key), f"not allowed in state {state}")
    return out  # type: ignore[return-value]  # the validator: checked above


def inbox_record(offer: InternalOffer, now_ms: int) -> InboxRecord:
    """A new inbox record for an accepted offer: state ``accepted``, revision 0.

    Args:
        offer: an internal offer (``OfferedResponse.offer``); it is re-normalized.
        now_ms: wall-clock ms; becomes ``acceptedAtMs`` and ``updatedAtMs``.
    """
    int_value(now_ms, "$.acceptedAtMs")
    return normalize_inbox_record({
        "schemaVersion": 1,
        "revision": 0,
        "state": "accepted",
        "offer": offer,
        "acceptedAtMs": now_ms,
        "updatedAtMs": now_ms,
    })


def check_inbox_update(old: InboxRecord, new: InboxRecord, *, compare_delivery_kind: bool = False) -> None:
    """Check that ``new`` may replace ``old`` (offer-delivery.md 3.6; ``assertWorkerRemoteExecutionInboxTransition``).

    Both records are re-normalized first. ``deliveryKind`` is not part of the authority
    unless ``compare_delivery_kind`` (spec README: a ``lease_recovery`` replay with a
    higher lease version over a stored ``new_claim`` updates the lease). Besides the
    reference's rules it enforces the tightenings of the module docstring.

    Raises:
        ContractError: ``offer_conflict``, ``offer_revision_conflict``,
            ``invalid_transition`` (or a validation code for an invalid record).
    """
    _check_normalized(normalize_inbox_record(old), normalize_inbox_record(new),
                      compare_delivery_kind=compare_delivery_kind)


def _check_normalized(before: InboxRecord, after: InboxRecord, *, compare_delivery_kind: bool = False) -> None:
    """:func:`check_inbox_update` over two records that are already normalized."""
    if not same_offer_authority(before["offer"], after["offer"], compare_delivery_kind=compare_delivery_kind):
        raise ContractError("offer_conflict", "$.offer", "the offer authority changed")
    lease_before, lease_after = before["offer"]["lease"], after["offer"]["lease"]
    for ok, at, detail in (
        (after["revision"] == before["revision"] + 1, "$.revision", "must be the stored revision + 1"),
        (after["acceptedAtMs"] == before["acceptedAtMs"], "$.acceptedAtMs", "must not change"),
        (after["updatedAtMs"] >= before["updatedAtMs"], "$.updatedAtMs", "must not decrease"),
        (lease_after["version"] >= lease_before["version"], "$.offer.lease.version", "must not decrease"),
        (lease_after["version"] != lease_before["version"] or dumps(lease_after) == dumps(lease_before),
         "$.offer.lease", "same version, different lease"),
    ):
        if not ok:
            raise ContractError("offer_revision_conflict", at, detail)
    state_before, state_after = before["state"], after["state"]
    if state_after not in INBOX_TRANSITIONS[state_before]:
        raise ContractError("invalid_transition", "$.state", f"{state_before} cannot become {state_after}")
    completing = state_after == "completion_acknowledged" and state_before != state_after
    if completing and state_before == "recovery_required" and before["recoveryReason"] != "launch_outcome_unknown":
        raise ContractError("invalid_transition", "$.state",
                            "only a launch_outcome_unknown recovery can be completed")
    introduced = NEW_FIELDS.get(state_after, frozenset())
    for key in INBOX_OPTIONAL_KEYS:
        if key == "recoveryReason" and state_after == "completion_acknowledged":
            continue  # the one field that may go away (recovery_required -> completion_acknowledged)
        if key in before:
            if before[key] != after.get(key):
                raise ContractError("invalid_transition", child("$", key), "a set optional field may not change")
        elif key in after and key not in introduced:
            raise ContractError("invalid_transition", child("$", key), f"a move to {state_after} does not set it")
    if completing and after["completionAcknowledgedAtMs"] != after["updatedAtMs"]:
        raise ContractError("invalid_transition", "$.completionAcknowledgedAtMs", "must equal updatedAtMs")


def advance(
    record: InboxRecord,
    state: str,
    now_ms: int,
    fields: Mapping[str, object] | None = None,
) -> InboxRecord:
    """The next record: ``record`` moved to ``state`` at ``now_ms``, with ``fields`` set.

    The generic step under the ``to_*`` functions (prefer those: they name the step and
    its fields). ``revision`` + 1, ``updatedAtMs = max(now_ms, record.updatedAtMs)``; the
    move to ``completion_acknowledged`` drops ``recoveryReason`` and sets
    ``completionAcknowledgedAtMs = updatedAtMs``. The lease is unchanged (see
    :func:`with_renewed_lease`).

    Args:
        record: the current record (re-validated here).
        state: the target state (may equal the current one).
        now_ms: wall-clock ms, safe int >= 0.
        fields: camelCase optional fields to set (only those the target introduces).

    Returns:
        The validated next record (a new dict in file key order).

    Raises:
        ContractError: codes in the module docstring.
    """
    int_value(now_ms, "$.updatedAtMs")
    old = normalize_inbox_record(record)
    if not isinstance(state, str) or state not in INBOX_TRANSITIONS[old["state"]]:
        raise ContractError("invalid_transition", "$.state", f"{old['state']} cannot become {state!s:.40}")
    new = dict(old)
    new["revision"] = old["revision"] + 1
    new["state"] = state
    new["updatedAtMs"] = max(now_ms, old["updatedAtMs"])
    for key, value in (fields or {}).items():
        if key not in INBOX_OPTIONAL_KEYS:
            raise ContractError("key_set", child("$", key), "unknown key")
        new[key] = value
    if state == "completion_acknowledged" and old["state"] != state:
        new.pop("recoveryReason", None)
        new["completionAcknowledgedAtMs"] = new["updatedAtMs"]
    ordered = normalize_inbox_record({key: new[key] for key in (*_BASE_KEYS, *INBOX_OPTIONAL_KEYS) if key in new})
    _check_normalized(old, ordered)  # the journal's own check: it accepts every step made here
    return ordered


def to_starting_acknowledged(record: InboxRecord, now_ms: int) -> InboxRecord:
    """T1: ``accepted`` -> ``starting_acknowledged`` after starting answered ``applied``/``already_starting``."""
    return advance(record, "starting_acknowledged", now_ms)


def to_launching(
    record: InboxRecord,
    now_ms: int,
    *,
    executor_started_at_ms: int,
    log_artifact_id: str,
    callback_sequence: int,
    callback_token_digest: str,
) -> InboxRecord:
    """T5: ``starting_acknowledged`` -> ``launching``, the durable pre-spawn barrier.

    Args:
        executor_started_at_ms: local wall clock when the barrier is written (ms).
        log_artifact_id: the ``wlog-`` id (1-36 bytes, no ctrl).
        callback_sequence: starting replay's ``snapshot.callbackSequence + 1`` (1..2^31-1).
        callback_token_digest: sha256 hex of the 32 raw callback-token bytes.
    """
    return advance(record, "launching", now_ms, {
        "executorStartedAtMs": executor_started_at_ms,
        "logArtifactId": log_artifact_id,
        "completionReceiptCallbackSequence": callback_sequence,
        "completionReceiptTokenDigest": callback_token_digest,
    })


def to_started(record: InboxRecord, now_ms: int, *, executor_handle: str) -> InboxRecord:
    """T7: ``launching`` -> ``started`` with the executor handle (1-512 bytes, no ctrl)."""
    return advance(record, "started", now_ms, {"executorHandle": executor_handle})


def to_running_acknowledged(record: InboxRecord, now_ms: int) -> InboxRecord:
    """T8: ``started`` -> ``running_acknowledged`` after running answered ``applied``/``already_running``."""
    return advance(record, "running_acknowledged", now_ms)


def to_start_failed(record: InboxRecord, now_ms: int) -> InboxRecord:
    """T3/T4/T6: ``starting_acknowledged`` (no fields) or ``launching`` (keeps them) -> ``start_failed``."""
    return advance(record, "start_failed", now_ms)


def to_start_failure_acknowledged(record: InboxRecord, now_ms: int) -> InboxRecord:
    """T9: ``start_failed`` -> ``start_failure_acknowledged`` (terminal) after ``applied``/``already_terminal``."""
    return advance(record, "start_failure_acknowledged", now_ms)


def to_completion_acknowledged(record: InboxRecord, now_ms: int) -> InboxRecord:
    """T10: -> ``completion_acknowledged`` (terminal) after completion answered ``applied``/``already_completed``.

    From ``launching``, ``started``, ``running_acknowledged`` or
    ``recovery_required(launch_outcome_unknown)``; drops ``recoveryReason`` and sets
    ``completionAcknowledgedAtMs = updatedAtMs``. The receipt file is deleted after this
    write, not before.
    """
    return advance(record, "completion_acknowledged", now_ms)


def to_recovery_required(record: InboxRecord, now_ms: int, reason: str) -> InboxRecord:
    """``recover(reason)``: any non-terminal state -> ``recovery_required`` with ``recoveryReason``.

    Args:
        reason: one of :data:`RECOVERY_REASONS` (code ``recovery_reason`` otherwise).
    """
    if not isinstance(reason, str) or reason not in RECOVERY_REASONS:
        raise ContractError("recovery_reason", "$.recoveryReason", "not a known recovery reason")
    return advance(record, "recovery_required", now_ms, {"recoveryReason": reason})


def renewed_lease(lease: OfferLease, *, lease_version: int, renewed_at_ms: int,
                  expires_at_ms: int) -> OfferLease:
    """T11 "Persist means" (section 5) for the lease alone: ``{version, renewedAtMs,
    expiresAtMs, updatedAtMs = renewedAtMs}`` from a lease-control answer.

    Spec README "Decisions for clocks": a renewal whose version is newer is accepted even
    when its ``renewedAtMs`` is older than the stored one (the cluster's clock moved back);
    only the version fences calls. The stored times stay a valid lease of the internal
    offer: ``renewedAtMs``/``updatedAtMs`` at least ``acquiredAtMs``, ``expiresAtMs`` above
    them (the local lease expiry comes from the answer itself, never from these).

    Raises:
        ContractError: ``offer_revision_conflict`` (version not raised), ``lease_order``
            (``expiresAtMs <= renewedAtMs`` in the answer), ``not_integer``/``out_of_range``.
    """
    version = int_value(lease_version, "$.offer.lease.version", 1, MAX_INT32)
    renewed = int_value(renewed_at_ms, "$.offer.lease.renewedAtMs")
    expires = int_value(expires_at_ms, "$.offer.lease.expiresAtMs")
    if version <= lease["version"]:
        raise ContractError("offer_revision_conflict", "$.offer.lease.version", "a renewal raises the version")
    if expires <= renewed:
        raise ContractError("lease_order", "$.offer.lease.expiresAtMs", "must be > renewedAtMs")
    stored_renewed = max(renewed, lease["acquiredAtMs"])
    return {**lease, "version": version, "renewedAtMs": stored_renewed,
            "expiresAtMs": max(expires, stored_renewed + 1), "updatedAtMs": stored_renewed}


def with_lease(record: InboxRecord, lease: OfferLease) -> InboxRecord:
    """``record`` holding ``lease`` (of a higher or the same version), at the *same*
    revision: the record as this process knows it between journal writes (renewals live
    in the runtime directory, issue 23 item 7); the next state change writes it.

    Raises:
        ContractError: ``invalid_transition`` (a terminal record), ``offer_revision_conflict``
            (a lower version, or a different lease at the same version), validation codes.
    """
    old = normalize_inbox_record(record)
    if old["state"] in TERMINAL_STATES:
        raise ContractError("invalid_transition", "$.state", f"a {old['state']} record holds no lease")
    current = old["offer"]["lease"]
    if lease.get("version", -1) < current["version"] or (
            lease.get("version") == current["version"] and dumps(lease) != dumps(current)):
        raise ContractError("offer_revision_conflict", "$.offer.lease", "an older or different lease")
    return normalize_inbox_record({**old, "offer": {**old["offer"], "lease": lease}})


def with_renewed_lease(
    record: InboxRecord,
    *,
    lease_version: int,
    renewed_at_ms: int,
    expires_at_ms: int,
) -> InboxRecord:
    """T11 "Persist means" (section 5) as one journal write: :func:`renewed_lease` stored,
    the state unchanged, ``revision + 1``, ``updatedAtMs = max(record.updatedAtMs,
    renewedAtMs)``. The times are the cluster's (DB clock, ms) from the lease-control answer.

    Args:
        lease_version: the answer's ``leaseVersion``; must exceed the stored version
            (expected + 1, or + 2 after the G2 retry with ``expectedLeaseVersion + 1``).
        renewed_at_ms: the answer's (older than the stored one is accepted, see
            :func:`renewed_lease`).
        expires_at_ms: > ``renewed_at_ms``.

    Raises:
        ContractError: ``invalid_transition`` (a terminal record), ``offer_revision_conflict``
            (version not raised), ``lease_order`` (times), ``not_integer``/``out_of_range``.
    """
    old = normalize_inbox_record(record)
    if old["state"] in TERMINAL_STATES:
        raise ContractError("invalid_transition", "$.state", f"a {old['state']} record holds no lease")
    new_lease = renewed_lease(old["offer"]["lease"], lease_version=lease_version, renewed_at_ms=renewed_at_ms,
                              expires_at_ms=expires_at_ms)
    new = {
        **old,
        "revision": old["revision"] + 1,
        "offer": {**old["offer"], "lease": new_lease},
        "updatedAtMs": max(old["updatedAtMs"], new_lease["renewedAtMs"]),
    }
    normalized = normalize_inbox_record(new)
    _check_normalized(old, normalized)
    return normalized


def with_result_times(record: InboxRecord, now_ms: int, *, started_at_ms: int,
                      finished_at_ms: int) -> InboxRecord:
    """The job's exit observed: the completion's result times (cluster clock, frozen; see
    ``_RESULT``) and the current lease stored in one write; the state is unchanged.

    Raises:
        ContractError: ``invalid_transition`` (not a launched record, or times already set),
            ``record_order`` (finished before started), validation codes.
    """
    old = normalize_inbox_record(record)
    if old["state"] not in ("launching", "started", "running_acknowledged", "recovery_required"):
        raise ContractError("invalid_transition", "$.state", f"a {old['state']} record has no job to time")
    return advance(old, old["state"], now_ms, {"resultStartedAtMs": started_at_ms,
                                               "resultFinishedAtMs": finished_at_ms})
