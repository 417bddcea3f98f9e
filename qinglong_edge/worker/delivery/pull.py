"""The offer pull coordinator (ADR-0110 section 3.7, plus the spec README's decisions).

One call of :meth:`PullCoordinator.pull` is one step of the algorithm::

    read pending-claim.json, and the attempt-in-flight marker (runtime directory, RAM)
      a marker of this claim's revision     -> the last attempt's outcome is unknown (the
                                               process died): count it (claim rewritten)
      bound to another session/generation   -> no attempt counted: drop it (no lease can
                                               exist); else abandon (stale_session), stop
      16 attempts used                      -> abandon (attempt_budget_exhausted), stop
      inbox full (records in flight fill it) -> inbox_full: no claim is made, a kept one
                                               is not sent
      absent                                -> create {offerId=uuid4, leaseToken=32 random bytes}
    not due (nextAttemptAtMs > now)         -> backoff (no I/O at all)
    marker {offerId, revision} -> runtime directory, BEFORE sending (not fsynced: RAM)
    POST {workerGeneration, offerId, leaseToken}; parse (contracts.offer)
      idle      -> the claim is KEPT as it is (nothing written), marker removed  -> idle
      offered   -> accept into the inbox (durable), then clear the claim        -> accepted | replayed
      409 worker_offer_fenced -> abandon (offer_fenced)                          -> abandoned
      other failure -> claim rewritten: nextAttemptAtMs = now + full jitter,
                       never sooner than Retry-After; attemptCount + 1 only when the
                       attempt may have reached the cluster's HTTP layer
                                                    -> unavailable | invalid_response |
                                                       credential_rejected

Storage on flash (spec README "Decisions for storage on flash", issue 16): a claim is
kept across idle answers, so an idle cycle in steady state writes nothing to the journal
(only the RAM marker). That is correct because the reference cluster stores nothing
keyed by the offerId when it answers idle (verified in its source, see
docs/worker/delivery.md "Idle answers and the kept claim"): sending the same offerId and
token again later is a fresh claim attempt, and a lease the cluster did commit is found
again by offerId (``lease_recovery``).

The 16-attempt budget (spec README, issue 18) counts only attempts that may have reached
the cluster's HTTP layer: an answer that was not 200 or not valid, a timeout or reset
after the request was sent, an unknown outcome (a marker found at start). DNS, connect
and TLS handshake failures, and a TLS alert from the server on the first read
(:attr:`~qinglong_edge.errors.TransportError.reached_cluster` False), back off with the
same full jitter but never consume it; an idle answer does not count either. A claim therefore survives any number
of local faults and is replayed byte for byte once the path works.

409 (section 1.7): only ``worker_offer_fenced`` abandons the claim; any other code
keeps it, backs off and is reported (``clusterCode``).

An exception that is not a pull failure (the ``pull`` command raises
:class:`PullAborted` from its SIGTERM/SIGINT handler) propagates unchanged and leaves
the marker in place: the next cycle counts that attempt (its outcome is unknown) and
replays the same offerId and token (field lessons 1: never abandon a claim because of
our own abort).

Aborting (:class:`AbortSignal`, :mod:`qinglong_edge.worker.delivery.abort`): a signal interrupts
a network call or a sleep at once, never a journal write.

Crash points (test-only, :mod:`~qinglong_edge.crashpoints`):
``pull.attempt_counted`` (a marker found at start was counted into the claim, the marker
not yet removed), ``pull.attempt_marked`` (the marker is written, nothing sent),
``pull.response_received`` (a 200 body arrived, nothing parsed or written),
``pull.inbox_published`` (the inbox record is durable, the claim not yet cleared) and
``pull.claim_cleared`` (the claim is gone, the result not yet reported).

Time: the claim's fields are wall-clock ms (the contract stores them). A clock that
steps backwards must not wedge the device, so the coordinator never lets a claim's
times run backwards (``now`` is at least the claim's ``updatedAtMs``) and treats a
``nextAttemptAtMs`` further away (by the raw clock) than any backoff could put it
(1 hour, the longest ``Retry-After`` honoured) as due (:func:`pacing.claim_due`). A
smaller step back only lengthens the wait by the size of the step.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import exact_keys, safe_int
from qinglong_edge.contracts.ids import new_lease_token, new_uuid4
from qinglong_edge.contracts.journal_records import MAX_ATTEMPTS, PendingClaim
from qinglong_edge.contracts.offer import (
    OFFER_RESPONSE_MAX_BYTES,
    ClaimAuthority,
    IdleResponse,
    claim_request_body,
    offers_path,
    parse_offer_response,
)
from qinglong_edge.contracts.strictjson import dumps_bytes, loads
from qinglong_edge.crashpoints import crashpoint
from qinglong_edge.errors import DeliveryError, JournalError, TransportError
from qinglong_edge.worker.delivery.abort import AbortSignal, PullAborted
from qinglong_edge.worker.delivery.pacing import (
    BACKOFF_CAP_MS,
    MAX_RETRY_AFTER_MS,
    backoff_delay_ms,
    claim_due,
    retry_delay_ms,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any, Protocol

    from qinglong_edge.contracts.ports import Transport
    from qinglong_edge.contracts.records import InboxRecord, InternalOffer
    from qinglong_edge.worker.delivery.session import SessionOutcome
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

    class _Journal(Protocol):
        def read_claim(self) -> PendingClaim | None: ...

        def create_claim(self, claim: PendingClaim) -> PendingClaim: ...

        def replace_claim(self, claim: PendingClaim, expected_revision: int) -> PendingClaim: ...

        def clear_claim(self, offer_id: str, expected_revision: int) -> None: ...

        def abandon_claim(self, reason: str, now_ms: int) -> Any: ...

        def accept_offer(self, offer: InternalOffer, now_ms: int) -> tuple[str, InboxRecord]: ...

        def read_offer(self, offer_id: str) -> InboxRecord | None: ...

        def has_capacity(self) -> bool: ...


__all__ = [
    "BACKOFF_CAP_MS",
    "MARKER_NAME",
    "MAX_RETRY_AFTER_MS",
    "OFFER_FENCED",
    "AbortSignal",
    "CycleReport",
    "PullAborted",
    "PullCoordinator",
    "PullResult",
    "SessionAuthority",
    "backoff_delay_ms",
    "inbox_full",
    "parse_marker",
]

#: The attempt-in-flight marker's name in the runtime directory.
MARKER_NAME = "attempt.json"
#: The claim's backoff on the boot clock (RAM): ``{schemaVersion, bootId, offerId, revision,
#: dueBootMs}``, written with each backoff; the claim's own ``nextAttemptAtMs`` (wall clock,
#: its on-disk contract) is the rule only without a note of this boot and revision.
BACKOFF_NAME = "backoff.json"
#: The offer route's fence answer (section 1.7): the only 409 that abandons a claim.
OFFER_FENCED = "worker_offer_fenced"
_MARKER_KEYS = ("schemaVersion", "offerId", "revision", "startedAtMs")


class SessionAuthority(Frozen):
    """The Worker Session a claim is bound to (workerId, sessionId, generation)."""

    __slots__ = ("worker_id", "session_id", "generation")  # noqa: RUF023 (field order)

    worker_id: str
    session_id: str
    generation: int

    def __init__(self, worker_id: str, session_id: str, generation: int) -> None:
        object.__setattr__(self, "worker_id", worker_id)
        object.__setattr__(self, "session_id", session_id)
        object.__setattr__(self, "generation", generation)


class PullResult(Frozen):
    """The outcome of one pull step.

    Attributes:
        status: ``accepted``, ``replayed``, ``idle``, ``backoff``, ``inbox_full``,
            ``abandoned``, ``unavailable``, ``invalid_response`` or ``credential_rejected``.
        offer_id: the claim's offerId (None for ``inbox_full`` without a kept claim).
        run_id: the offered Run (accepted/replayed).
        reason: idle reason, abandon reason, or the failure code (a transport failure's
            typed reason, :attr:`~qinglong_edge.errors.TransportError.reason`).
        next_attempt_at_ms: when the kept claim is due again (backoff and failures).
        http_status: the HTTP status of a failed call, when one was received.
        retry_after_ms: the honoured Retry-After, when the cluster sent one.
        attempt_count: attempts used by the claim after this step.
        cluster_code: the ``code`` of the cluster's error answer (``{"code": ...}``),
            when one was received (e.g. a 409 other than ``worker_offer_fenced``).
        counted: for a failure, whether the attempt counted toward the budget (it may
            have reached the cluster); None otherwise.
        detail: for a failure, its message (the file, host or answer it is about; no
            secrets): what the remedy's "see the message" refers to; None otherwise.
    """

    __slots__ = (  # noqa: RUF023 (field order)
        "status",
        "offer_id",
        "run_id",
        "reason",
        "next_attempt_at_ms",
        "http_status",
        "retry_after_ms",
        "attempt_count",
        "stats",
        "cluster_code",
        "counted",
        "detail",
    )
    _repr_hidden = ("stats",)

    status: str
    offer_id: str | None
    run_id: str | None
    reason: str | None
    next_attempt_at_ms: int | None
    http_status: int | None
    retry_after_ms: int | None
    attempt_count: int | None
    stats: dict[str, int] | None
    cluster_code: str | None
    counted: bool | None
    detail: str | None

    def __init__(  # noqa: PLR0917 (the dataclass signature)
        self,
        status: str,
        offer_id: str | None = None,
        run_id: str | None = None,
        reason: str | None = None,
        next_attempt_at_ms: int | None = None,
        http_status: int | None = None,
        retry_after_ms: int | None = None,
        attempt_count: int | None = None,
        stats: dict[str, int] | None = None,
        cluster_code: str | None = None,
        counted: bool | None = None,
        detail: str | None = None,
    ) -> None:
        _set = object.__setattr__
        _set(self, "status", status)
        _set(self, "offer_id", offer_id)
        _set(self, "run_id", run_id)
        _set(self, "reason", reason)
        _set(self, "next_attempt_at_ms", next_attempt_at_ms)
        _set(self, "http_status", http_status)
        _set(self, "retry_after_ms", retry_after_ms)
        _set(self, "attempt_count", attempt_count)
        _set(self, "stats", stats)
        _set(self, "cluster_code", cluster_code)
        _set(self, "counted", counted)
        _set(self, "detail", detail)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"status": self.status}
        for key, value in (
            ("offerId", self.offer_id),
            ("runId", self.run_id),
            ("reason", self.reason),
            ("nextAttemptAtMs", self.next_attempt_at_ms),
            ("httpStatus", self.http_status),
            ("retryAfterMs", self.retry_after_ms),
            ("attemptCount", self.attempt_count),
            ("clusterCode", self.cluster_code),
            ("counted", self.counted),
            ("detail", self.detail),
        ):
            if value is not None:
                out[key] = value
        if self.stats is not None:
            out["stats"] = dict(self.stats)
        return out


def _marker_bytes(claim: PendingClaim, now_ms: int) -> bytes:
    return dumps_bytes({"schemaVersion": 1, "offerId": claim.offer_id, "revision": claim.revision,
                        "startedAtMs": now_ms}) + b"\n"


def parse_marker(data: bytes) -> tuple[str, int, int]:
    """``(offerId, revision, startedAtMs)`` of a marker. Raises ContractError."""
    value = loads(data, max_bytes=4096, min_bytes=2)
    if not isinstance(value, dict):
        raise ContractError("not_object", "$", "marker must be an object")
    exact_keys(value, _MARKER_KEYS, "$")
    offer_id = value["offerId"]
    if value["schemaVersion"] != 1 or not isinstance(offer_id, str):
        raise ContractError("schema", "$", "not an attempt marker")
    return offer_id, safe_int(value["revision"], "$.revision"), safe_int(value["startedAtMs"], "$.startedAtMs")


class PullCoordinator:
    """Runs pull steps against one owned journal, its runtime directory and one transport.

    Args:
        journal: the owned :class:`~qinglong_edge.worker.journal.store.Journal`.
        transport: the :class:`~qinglong_edge.worker.ingress.transport.IngressTransport`.
        runtime: the journal's :class:`~qinglong_edge.worker.journal.runtime.RuntimeDirectory`
            (the attempt-in-flight marker).
        backoff_base_ms: 100..60 000.
        clock_ms: wall-clock milliseconds.
        random: uniform [0, 1) for the jitter (seedable in tests).
        random_bytes: randomness for new offer ids and lease tokens.
        boot_ms: the boot clock; :attr:`sent` keeps the boot instant each offer POST was
            sent (the local lease expiry of an offered lease starts there, spec README
            "Decisions for clocks").
    """

    def __init__(
        self,
        journal: _Journal,
        transport: Transport,
        *,
        runtime: RuntimeDirectory,
        backoff_base_ms: int = 1000,
        clock_ms: Callable[[], int],
        random: Callable[[], float] = random.random,
        random_bytes: Callable[[int], bytes] = os.urandom,
        boot_ms: Callable[[], int] | None = None,
    ) -> None:
        import qinglong_edge.clock as _clock

        if not 100 <= backoff_base_ms <= 60_000:
            raise DeliveryError("backoff base must be 100..60000 ms", code="invalid_configuration")
        self._journal = journal
        self._transport = transport
        self._runtime = runtime
        self._base_ms = backoff_base_ms
        self._clock_ms = clock_ms
        self._random = random
        self._random_bytes = random_bytes
        self._boot_ms = boot_ms or _clock.boot_ms
        self._boot_id = _clock.boot_id() or "unknown"
        #: The boot-clock due time of the claim's current backoff (after a ``backoff`` or a
        #: failed attempt), or None: what a resident pull waits for.
        self.backoff_due_boot_ms: int | None = None
        #: offerId -> the boot instant its last POST was sent (this process only).
        self.sent: dict[str, int] = {}
        #: Failures in a row that did not reach the cluster (this process: a `--duration`
        #: loop); they grow the jitter ceiling without consuming the budget.
        self._unreached = 0

    def pull(self, session: SessionAuthority) -> PullResult:
        """One pull step for ``session`` (see the module docstring).

        Raises:
            JournalError: storage failures (the claim on disk is intact).
            PullAborted: unchanged, from a signal handler; the claim is kept.
        """
        now = self._clock_ms()
        claim = self.settle_claim(self._settle_marker(self._journal.read_claim(), now))
        if claim is not None:
            if (claim.worker_id, claim.worker_session_id, claim.worker_generation) != (
                session.worker_id,
                session.session_id,
                session.generation,
            ):
                if claim.attempt_count:
                    return self._abandon(claim, "stale_session", now)
                # Every attempt of it was answered idle or never reached the cluster:
                # the cluster holds nothing for it (no lease to lose), so it is simply
                # replaced (a reboot re-registers: this is every reboot's first cycle).
                self._journal.clear_claim(claim.offer_id, claim.revision)
                claim = None
            elif claim.attempt_count >= MAX_ATTEMPTS:
                return self._abandon(claim, "attempt_budget_exhausted", now)
        if not self._journal.has_capacity():
            # No room for the offer the claim could bring (records in flight fill the
            # inbox; the caller made room from finished ones): a kept claim is not sent
            # either (the cluster would answer idle worker_unavailable to 0 slots).
            return PullResult("inbox_full", offer_id=None if claim is None else claim.offer_id,
                              reason="capacity_exhausted", attempt_count=None if claim is None else claim.attempt_count)
        if claim is None:
            authority = ClaimAuthority(
                session.worker_id,
                session.session_id,
                session.generation,
                new_uuid4(self._random_bytes),
                new_lease_token(self._random_bytes),
            )
            claim = self._journal.create_claim(PendingClaim.create(authority, now))
        raw_now, now = now, max(now, claim.updated_at_ms)
        due_boot = self._backoff_due(claim)
        self.backoff_due_boot_ms = due_boot if due_boot is not None and due_boot > self._boot_ms() else None
        if (self.backoff_due_boot_ms is not None if due_boot is not None
                else not claim_due(claim.next_attempt_at_ms, now, raw_now)):
            return PullResult(
                "backoff", offer_id=claim.offer_id, next_attempt_at_ms=claim.next_attempt_at_ms,
                attempt_count=claim.attempt_count,
            )
        self._runtime.write(MARKER_NAME, _marker_bytes(claim, now))
        crashpoint("pull.attempt_marked")
        return self._exchange(claim)

    def settle_claim(self, claim: PendingClaim | None = None) -> PendingClaim | None:
        """A claim whose offer is already in the inbox (the process died after the inbox
        publication, before the claim was cleared) is cleared without being sent again:
        the offer is the inbox's now, and may be executing or done (a replay would meet a
        completed lease: 409). Returns the claim left, or None. Called by every cycle,
        also when no slot is free (nothing is pulled then)."""
        if claim is None:
            claim = self._journal.read_claim()
        if claim is None or self._journal.read_offer(claim.offer_id) is None:
            return claim
        self._journal.clear_claim(claim.offer_id, claim.revision)
        self._runtime.remove(MARKER_NAME)
        return None

    def _settle_marker(self, claim: PendingClaim | None, now: int) -> PendingClaim | None:
        """A marker left by a process that died with a request in flight counts as an
        attempt of unknown outcome (spec README), once: the claim is rewritten with the
        attempt, then the marker removed. A marker of another claim or revision is stale.

        A damaged marker (empty or truncated by a power loss with the runtime directory on
        disk, garbage, a file that breaks the private-file rules) counts as present, of the
        claim on disk: an attempt of unknown outcome (issue 23: never a permanent error)."""
        try:
            data = self._runtime.read(MARKER_NAME)
        except JournalError:
            data = b""  # unreadable: damaged, not absent
        if data is None:
            return claim
        try:
            offer_id, revision, started_at = parse_marker(data)
        except ContractError:
            offer_id, revision, started_at = "", -1, 0
            if claim is not None:
                offer_id, revision, started_at = claim.offer_id, claim.revision, claim.updated_at_ms
        if claim is not None and (offer_id, revision) == (claim.offer_id, claim.revision):
            at = max(now, claim.updated_at_ms)
            counted = claim.replace(
                revision=claim.revision + 1,
                attempt_count=min(MAX_ATTEMPTS, claim.attempt_count + 1),
                last_attempt_at_ms=max(claim.created_at_ms, min(started_at, at)),
                updated_at_ms=at,
                next_attempt_at_ms=at,
            )
            claim = self._journal.replace_claim(counted, claim.revision)
            crashpoint("pull.attempt_counted")
        self._runtime.remove(MARKER_NAME)
        return claim

    # -- one request --------------------------------------------------------------------

    def _exchange(self, claim: PendingClaim) -> PullResult:
        authority = claim.authority
        path = offers_path(authority.worker_id, authority.worker_session_id)
        self.sent[claim.offer_id] = self._boot_ms()
        try:
            response = self._transport.post_json(
                path, claim_request_body(authority), max_response_bytes=OFFER_RESPONSE_MAX_BYTES
            )
            crashpoint("pull.response_received")
            parsed = parse_offer_response(response.body, authority)
        except TransportError as exc:
            code = exc.cluster_code
            if exc.http_status == 409 and code == OFFER_FENCED:
                # The fence answer is returned again for every retry of this claim: give
                # it up now (README, 3.9). Any other 409 is not a fence: kept, backed off.
                self._runtime.remove(MARKER_NAME)
                return self._abandon(claim, "offer_fenced", self._clock_ms(), http_status=409, cluster_code=code)
            status = "credential_rejected" if exc.http_status in (401, 403) else "unavailable"
            return self._back_off(claim, status, exc.reason, exc.http_status, exc.retry_after_ms,
                                  counted=exc.reached_cluster, cluster_code=code, detail=exc.message)
        except ContractError as exc:
            return self._back_off(claim, "invalid_response", exc.code, None, None, counted=True)
        self._unreached = 0
        now = max(self._clock_ms(), claim.updated_at_ms)
        if isinstance(parsed, IdleResponse):
            # Kept as it is: the cluster stored nothing for this offerId (module docstring).
            self._runtime.remove(MARKER_NAME)
            return PullResult(
                "idle", offer_id=claim.offer_id, reason=parsed.reason, attempt_count=claim.attempt_count,
                stats=parsed.stats,
            )
        try:
            outcome, _record = self._journal.accept_offer(parsed.offer, now)
        except JournalError as exc:
            if exc.code not in ("offer_conflict", "capacity_exhausted"):
                raise  # storage trouble: the marker stays; the next cycle counts and replays it
            return self._back_off(claim, "unavailable", exc.code, None, None, counted=True)
        crashpoint("pull.inbox_published")
        self._journal.clear_claim(claim.offer_id, claim.revision)
        crashpoint("pull.claim_cleared")
        self._runtime.remove(MARKER_NAME)
        return PullResult(
            outcome,
            offer_id=claim.offer_id,
            run_id=parsed.run_id,
            reason=parsed.offer["deliveryKind"],
            attempt_count=claim.attempt_count,
            stats=parsed.stats,
        )

    def _back_off(
        self,
        claim: PendingClaim,
        status: str,
        code: str,
        http_status: int | None,
        retry_after_ms: int | None,
        *,
        counted: bool,
        cluster_code: str | None = None,
        detail: str | None = None,
    ) -> PullResult:
        now = max(self._clock_ms(), claim.updated_at_ms)
        attempts = min(MAX_ATTEMPTS, claim.attempt_count + 1) if counted else claim.attempt_count
        self._unreached = 0 if counted else self._unreached + 1
        delay, honoured = retry_delay_ms(max(attempts, self._unreached, 1), self._base_ms, self._random(),
                                         retry_after_ms)
        kept = claim.replace(
            revision=claim.revision + 1,
            attempt_count=attempts,
            last_attempt_at_ms=now if counted else claim.last_attempt_at_ms,
            updated_at_ms=now,
            next_attempt_at_ms=now + delay,
        )
        kept = self._journal.replace_claim(kept, claim.revision)
        self._runtime.remove(MARKER_NAME)
        self._note_backoff(kept, delay)
        return PullResult(
            status,
            offer_id=claim.offer_id,
            reason=code,
            next_attempt_at_ms=kept.next_attempt_at_ms,
            http_status=http_status,
            retry_after_ms=honoured,
            attempt_count=kept.attempt_count,
            cluster_code=cluster_code,
            counted=counted,
            detail=detail,
        )

    def _note_backoff(self, claim: PendingClaim, delay_ms: int) -> None:
        """Remember the backoff on the boot clock (RAM; a wall-clock step must not make a
        claim wait an extra hour, nor come early); lost with the RAM, then the wall rule."""
        self.backoff_due_boot_ms = self._boot_ms() + delay_ms
        try:
            self._runtime.write(BACKOFF_NAME, dumps_bytes({
                "schemaVersion": 1, "bootId": self._boot_id, "offerId": claim.offer_id, "revision": claim.revision,
                "dueBootMs": self.backoff_due_boot_ms}) + b"\n")
        except JournalError:
            pass

    def _backoff_due(self, claim: PendingClaim) -> int | None:
        """The boot-clock due time of ``claim``'s backoff noted in this boot, or None."""
        try:
            data = self._runtime.read(BACKOFF_NAME)
            value = None if data is None else loads(data, max_bytes=1024, min_bytes=2)
        except (JournalError, ContractError):
            return None
        if not isinstance(value, dict) or value.get("schemaVersion") != 1 or value.get("bootId") != self._boot_id:
            return None
        if (value.get("offerId"), value.get("revision")) != (claim.offer_id, claim.revision):
            return None
        due = value.get("dueBootMs")
        return due if type(due) is int else None

    def _abandon(self, claim: PendingClaim, reason: str, now: int, *, http_status: int | None = None,
                 cluster_code: str | None = None) -> PullResult:
        self._journal.abandon_claim(reason, max(now, claim.updated_at_ms))
        return PullResult(
            "abandoned",
            offer_id=claim.offer_id,
            reason=reason,
            http_status=http_status,
            attempt_count=claim.attempt_count,
            cluster_code=cluster_code,
        )


class CycleReport(Frozen):
    """One cycle: the session step and the pull step (either may be missing on failure).

    Attributes:
        session: what the session keeper did, or None when it failed.
        result: the pull step's result, or None when the cycle stopped before it.
        error: the failure code when the cycle stopped early (``credential_rejected``,
            ``session_unavailable``, ``invalid_response``, ``clock_not_set``).
        detail: a human-readable line (no secrets).
        reason: the transport reason behind ``error`` (``certificate_expired``...), if any.
        remedy: its one-line remedy ("" without one).
        inbox: inbox records by state as the cycle saw them (an offer it accepted
            included), for the metrics textfile; None when the cycle stopped before.
    """

    __slots__ = ("session", "result", "error", "detail", "reason", "remedy", "inbox")  # noqa: RUF023 (field order)

    session: SessionOutcome | None
    result: PullResult | None
    error: str | None
    detail: str
    reason: str | None
    remedy: str
    inbox: dict[str, int] | None

    def __init__(  # noqa: PLR0917 (the dataclass signature)
        self,
        session: SessionOutcome | None,
        result: PullResult | None,
        error: str | None = None,
        detail: str = "",
        reason: str | None = None,
        remedy: str = "",
        inbox: dict[str, int] | None = None,
    ) -> None:
        _set = object.__setattr__
        _set(self, "inbox", inbox)
        _set(self, "session", session)
        _set(self, "result", result)
        _set(self, "error", error)
        _set(self, "detail", detail)
        _set(self, "reason", reason)
        _set(self, "remedy", remedy)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.session is not None:
            out["session"] = {
                "action": self.session.action,
                "sessionId": self.session.session.session_id,
                "generation": self.session.session.generation,
                "version": self.session.session.version,
            }
            if self.session.detail:  # capabilities_changed, session_fenced, version_resynced...
                out["session"]["detail"] = self.session.detail  # type: ignore[index]
        if self.result is not None:
            out.update(self.result.to_json())
        if self.error is not None:
            out["status"] = "failed"
            out["code"] = self.error
            if self.reason is not None:
                out["reason"] = self.reason
        if self.detail:
            out["detail"] = self.detail
        if self.error is not None and self.remedy:
            out["remedy"] = self.remedy
        return out


def inbox_full(result: PullResult, in_flight: int, maximum_entries: int) -> PullResult:
    """The ``inbox_full`` result with its true reason: how many entries records that still
    need this device hold (finished records never do: they make room)."""
    return PullResult("inbox_full", offer_id=result.offer_id, reason="capacity_exhausted",
                      attempt_count=result.attempt_count,
                      detail=f"{in_flight} of {maximum_entries} entries held by records that need this device")
