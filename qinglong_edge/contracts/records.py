"""The journal's records as ``TypedDict``s: annotations only, never imported at run time.

Import this module only under the project's idiom (it imports :mod:`typing`, which the
pull path never loads; ``tests/cli/test_pull_imports.py`` checks that no cycle imports it)::

    TYPE_CHECKING = False
    if TYPE_CHECKING:
        from qinglong_edge.contracts.records import InboxRecord

Each shape mirrors its validator, which is the one place a parsed ``dict`` becomes the
typed record (a ``# type: ignore[return-value]`` there, nowhere else):

* :class:`InboxRecord` -- ``offers/<offerId>.json``,
  :func:`~qinglong_edge.contracts.inbox.normalize_inbox_record`: the six base keys are
  required, every optional key (``INBOX_OPTIONAL_KEYS``) is ``NotRequired`` (which state
  requires, allows or forbids each is ``INBOX_FIELD_STATES``, not expressible here);
* :class:`InternalOffer` (and its :class:`OfferCandidate`, :class:`OfferWorker`,
  :class:`OfferLease`) -- the record's ``offer``,
  :func:`~qinglong_edge.contracts.offer.normalize_internal_offer` (offer-delivery.md 3.4);
  ``executionRevision`` stays a ``dict[str, Any]``: a wire document with its own
  normalizer (:mod:`~qinglong_edge.contracts.execution_revision`), not a journal record;
* :class:`ClaimRecord` -- ``pending-claim.json`` (``PendingClaim.to_dict``);
* :class:`AbandonedRecord` -- ``abandoned/<offerId>.json`` (``abandoned_record_bytes``).

States and reasons are ``str`` (the validators check them against ``INBOX_STATES``,
``RECOVERY_REASONS``, ``ABANDON_REASONS``; a ``Literal`` would need a cast at every step
that takes a state argument).
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

__all__ = [
    "AbandonedRecord",
    "ClaimRecord",
    "InboxOptionalKey",
    "InboxRecord",
    "InternalOffer",
    "OfferCandidate",
    "OfferLease",
    "OfferWorker",
]


class OfferCandidate(TypedDict):
    """``offer.candidate`` (offer-delivery.md 2.3), canonical order."""

    runId: str
    attemptId: str
    projectId: str
    taskId: str
    taskRevision: str
    priority: int
    queuedAtMs: int
    attemptCreatedAtMs: int
    attemptNumber: int
    executorType: str


class OfferWorker(TypedDict):
    """``offer.worker``: the claim's worker identity."""

    workerId: str
    sessionId: str
    generation: int


class OfferLease(TypedDict):
    """``offer.lease``: the 13-key lease rebuilt from the claim (section 3.4)."""

    attemptId: str
    runId: str
    status: str
    version: int
    leaseGeneration: int
    workerId: str
    workerSessionId: str
    workerGeneration: int
    leaseTokenDigest: str
    acquiredAtMs: int
    renewedAtMs: int
    expiresAtMs: int
    updatedAtMs: int


class InternalOffer(TypedDict):
    """The internal offer (``OfferedResponse.offer``, an inbox record's ``offer``)."""

    offerId: str
    deliveryKind: str
    executionDigest: str
    candidate: OfferCandidate
    worker: OfferWorker
    lease: OfferLease
    leaseToken: str
    executionRevision: dict[str, Any]
    placementScore: int


#: The optional keys of an inbox record (``INBOX_OPTIONAL_KEYS``, in file order).
InboxOptionalKey = Literal[
    "executorHandle",
    "executorStartedAtMs",
    "logArtifactId",
    "completionReceiptCallbackSequence",
    "completionReceiptTokenDigest",
    "completionAcknowledgedAtMs",
    "recoveryReason",
    "resultStartedAtMs",
    "resultFinishedAtMs",
]


class InboxRecord(TypedDict):
    """``offers/<offerId>.json`` (remote-execution.md 2.1, offer-delivery.md 3.4)."""

    schemaVersion: int
    revision: int
    state: str
    offer: InternalOffer
    acceptedAtMs: int
    updatedAtMs: int
    executorHandle: NotRequired[str]
    executorStartedAtMs: NotRequired[int]
    logArtifactId: NotRequired[str]
    completionReceiptCallbackSequence: NotRequired[int]
    completionReceiptTokenDigest: NotRequired[str]
    completionAcknowledgedAtMs: NotRequired[int]
    recoveryReason: NotRequired[str]
    resultStartedAtMs: NotRequired[int]
    resultFinishedAtMs: NotRequired[int]


class ClaimRecord(TypedDict):
    """``pending-claim.json`` (offer-delivery.md 3.3): the 12 keys in file order."""

    schemaVersion: int
    revision: int
    workerId: str
    workerSessionId: str
    workerGeneration: int
    offerId: str
    leaseToken: str
    attemptCount: int
    createdAtMs: int
    updatedAtMs: int
    lastAttemptAtMs: int | None
    nextAttemptAtMs: int


class AbandonedRecord(TypedDict):
    """``abandoned/<offerId>.json`` (spec README): the claim without its token."""

    schemaVersion: int
    offerId: str
    reason: str
    abandonedAtMs: int
    workerId: str
    workerSessionId: str
    workerGeneration: int
    leaseTokenDigest: str
    revision: int
    attemptCount: int
    createdAtMs: int
    updatedAtMs: int
    lastAttemptAtMs: int | None
    nextAttemptAtMs: int
