"""The offer pull coordinator (ADR-0110 section 3.7, plus the spec README's decisions).

One call of :meth:`PullCoordinator.pull` is one step of the reference algorithm::

    read pending-claim.json
      bound to another session/generation  -> abandon (stale_session), report, stop
      16 attempts used                     -> abandon (attempt_budget_exhausted), report, stop
      absent, inbox full                   -> inbox_full: no claim is made
      absent                               -> create {offerId=uuid4, leaseToken=32 random bytes}
    nextAttemptAtMs > now                  -> backoff (no network I/O)
    persist the attempt (revision+1, attemptCount+1) BEFORE sending
    POST {workerGeneration, offerId, leaseToken}; parse (contracts.offer)
      idle     -> clear the claim                                  -> idle
      offered  -> accept into the inbox (durable), then clear       -> accepted | replayed
      409      -> abandon (offer_fenced)                            -> abandoned
      other    -> nextAttemptAtMs = now + floor(r * min(60000, base * 2^(attempts-1)))
                  never sooner than Retry-After                     -> unavailable |
                                                                       invalid_response |
                                                                       credential_rejected

An exception that is not a pull failure (the ``pull`` command raises
:class:`PullAborted` from its SIGTERM/SIGINT handler) propagates unchanged and leaves
the claim at its persisted-attempt revision: the same offerId and token are replayed
by the next cycle (field lessons 1: never abandon a claim because of our own abort).

Aborting (:class:`AbortSignal`): the ``pull`` command's SIGTERM/SIGINT handler calls
:meth:`AbortSignal.trip`. While a network call (or a sleep) is in progress it raises
:class:`PullAborted` at once; anywhere else -- in the middle of a journal write -- it
only records the request, and the next network call (or the cycle loop) raises it, so
a signal never interrupts a journal operation halfway (they are crash-safe anyway, see
:mod:`~qinglong_edge.worker.journal`, but finishing them is simpler to reason about).

Crash points (test-only, :mod:`~qinglong_edge.worker.crashpoints`) mark the step
boundaries of one pull: ``pull.attempt_persisted`` (the attempt revision is durable,
nothing sent), ``pull.response_received`` (a 200 body arrived, nothing parsed or
written), ``pull.inbox_published`` (the inbox record is durable, the claim not yet
cleared) and ``pull.claim_cleared`` (the claim is gone, the result not yet reported).

Time: the claim's fields are wall-clock ms (the contract stores them). A clock that
steps backwards must not wedge the device, so the coordinator never lets a claim's
times run backwards (``now`` is at least the claim's ``updatedAtMs``) and treats a
``nextAttemptAtMs`` further away (by the raw clock) than any backoff could put it
(1 hour, the longest ``Retry-After`` honoured) as due. A smaller step back only
lengthens the wait by the size of the step.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable, Iterator

from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.errors import ContractError
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
from qinglong_edge.errors import DeliveryError, JournalError, TransportError
from qinglong_edge.worker.crashpoints import crashpoint

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any, Protocol

    class _Transport(Protocol):
        def post_json(self, path: str, body: bytes, *, max_response_bytes: int) -> Any: ...

    class _Journal(Protocol):
        def read_claim(self) -> PendingClaim | None: ...

        def create_claim(self, claim: PendingClaim) -> PendingClaim: ...

        def replace_claim(self, claim: PendingClaim, expected_revision: int) -> PendingClaim: ...

        def clear_claim(self, offer_id: str, expected_revision: int) -> None: ...

        def abandon_claim(self, reason: str, now_ms: int) -> Any: ...

        def accept_offer(self, offer: dict[str, Any], now_ms: int) -> tuple[str, dict[str, Any]]: ...

        def has_capacity(self) -> bool: ...


__all__ = [
    "BACKOFF_CAP_MS",
    "AbortSignal",
    "PullAborted",
    "PullCoordinator",
    "PullResult",
    "SessionAuthority",
    "backoff_delay_ms",
]

#: Full-jitter ceiling (section 3.7): base x 2^(attempt-1), capped at 60 s.
BACKOFF_CAP_MS = 60_000
#: Longest Retry-After we honour (a broken header must not park the device for days).
MAX_RETRY_AFTER_MS = 3_600_000


class PullAborted(BaseException):
    """Raised by the ``pull`` command's signal handler to abort a blocked request.

    A ``BaseException`` so that no ``except Exception`` on the way swallows it.
    """

    def __init__(self, signal_name: str = "SIGTERM") -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


class AbortSignal:
    """How a signal handler stops a pull without tearing a journal write.

    ``trip(reason)`` (from the handler) records the first reason and raises
    :class:`PullAborted` only while the main thread is inside :meth:`interruptible`
    (a network call or a sleep); :meth:`interruptible` raises at entry once tripped, so
    no new request starts after a signal; :meth:`check` raises at a step boundary.
    """

    def __init__(self) -> None:
        self.reason: str | None = None
        self._depth = 0

    @property
    def tripped(self) -> bool:
        return self.reason is not None

    def trip(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        if self._depth:
            raise PullAborted(self.reason)

    def check(self) -> None:
        if self.reason is not None:
            raise PullAborted(self.reason)

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        self.check()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1




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
        offer_id: the claim's offerId (None for ``inbox_full``).
        run_id: the offered Run (accepted/replayed).
        reason: idle reason, abandon reason, or the failure code (a transport failure's
            typed reason, :attr:`~qinglong_edge.errors.TransportError.reason`).
        next_attempt_at_ms: when the kept claim is due again (backoff and failures).
        http_status: the HTTP status of a failed call, when one was received.
        retry_after_ms: the honoured Retry-After, when the cluster sent one.
        attempt_count: attempts used by the claim after this step.
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
        ):
            if value is not None:
                out[key] = value
        if self.stats is not None:
            out["stats"] = dict(self.stats)
        return out


def backoff_delay_ms(attempt_count: int, base_ms: int, r: float) -> int:
    """Full-jitter delay of section 3.7: ``floor(r * min(60000, base * 2^max(0, n-1)))``.

    Args:
        attempt_count: the claim's attempt count *after* persisting the attempt (>= 1).
        base_ms: backoff base, 100..60 000 (default 1 000).
        r: a random number in [0, 1).
    """
    exponent = max(0, attempt_count - 1)
    ceiling = BACKOFF_CAP_MS if exponent >= 16 else min(BACKOFF_CAP_MS, base_ms * (1 << exponent))
    return int(r * ceiling)


class PullCoordinator:
    """Runs pull steps against one owned journal and one transport.

    Args:
        journal: the owned :class:`~qinglong_edge.worker.journal.Journal`.
        transport: the :class:`~qinglong_edge.worker.transport.IngressTransport`.
        backoff_base_ms: 100..60 000.
        clock_ms: wall-clock milliseconds.
        random: uniform [0, 1) for the jitter (seedable in tests).
        random_bytes: randomness for new offer ids and lease tokens.
    """

    def __init__(
        self,
        journal: _Journal,
        transport: _Transport,
        *,
        backoff_base_ms: int = 1000,
        clock_ms: Callable[[], int],
        random: Callable[[], float] = random.random,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        if not 100 <= backoff_base_ms <= 60_000:
            raise DeliveryError("backoff base must be 100..60000 ms", code="invalid_configuration")
        self._journal = journal
        self._transport = transport
        self._base_ms = backoff_base_ms
        self._clock_ms = clock_ms
        self._random = random
        self._random_bytes = random_bytes

    def pull(self, session: SessionAuthority) -> PullResult:
        """One pull step for ``session`` (see the module docstring).

        Raises:
            JournalError: storage failures (the claim on disk is intact).
            PullAborted: unchanged, from a signal handler; the claim is kept.
        """
        claim = self._journal.read_claim()
        now = self._clock_ms()
        if claim is not None:
            if (claim.worker_id, claim.worker_session_id, claim.worker_generation) != (
                session.worker_id,
                session.session_id,
                session.generation,
            ):
                return self._abandon(claim, "stale_session", now)
            if claim.attempt_count >= MAX_ATTEMPTS:
                return self._abandon(claim, "attempt_budget_exhausted", now)
        else:
            if not self._journal.has_capacity():
                return PullResult("inbox_full", reason="capacity_exhausted")
            authority = ClaimAuthority(
                session.worker_id,
                session.session_id,
                session.generation,
                new_uuid4(self._random_bytes),
                new_lease_token(self._random_bytes),
            )
            claim = self._journal.create_claim(PendingClaim.create(authority, now))
        raw_now, now = now, max(now, claim.updated_at_ms)
        due = claim.next_attempt_at_ms
        # Measured from the raw clock: after a big step back the stored due date is
        # further away than any backoff or Retry-After could have put it -> due now.
        if due > now and due - raw_now <= MAX_RETRY_AFTER_MS:
            return PullResult(
                "backoff", offer_id=claim.offer_id, next_attempt_at_ms=due, attempt_count=claim.attempt_count
            )
        attempt = claim.replace(
            revision=claim.revision + 1,
            attempt_count=claim.attempt_count + 1,
            last_attempt_at_ms=now,
            updated_at_ms=now,
            next_attempt_at_ms=now,
        )
        attempt = self._journal.replace_claim(attempt, claim.revision)
        crashpoint("pull.attempt_persisted")
        return self._exchange(attempt)

    # -- one request --------------------------------------------------------------------

    def _exchange(self, claim: PendingClaim) -> PullResult:
        authority = claim.authority
        path = offers_path(authority.worker_id, authority.worker_session_id)
        try:
            response = self._transport.post_json(
                path, claim_request_body(authority), max_response_bytes=OFFER_RESPONSE_MAX_BYTES
            )
            crashpoint("pull.response_received")
            parsed = parse_offer_response(response.body, authority)
        except TransportError as exc:
            if exc.http_status == 409:
                # worker_offer_fenced is the only 409 of this route (section 1.7): every
                # retry would get it again, so give the claim up now (README, 3.9).
                return self._abandon(claim, "offer_fenced", self._clock_ms(), http_status=409)
            status = "credential_rejected" if exc.http_status in (401, 403) else "unavailable"
            return self._back_off(claim, status, exc.reason, exc.http_status, exc.retry_after_ms)
        except ContractError as exc:
            return self._back_off(claim, "invalid_response", exc.code, None, None)
        now = max(self._clock_ms(), claim.updated_at_ms)
        if isinstance(parsed, IdleResponse):
            self._journal.clear_claim(claim.offer_id, claim.revision)
            crashpoint("pull.claim_cleared")
            return PullResult(
                "idle", offer_id=claim.offer_id, reason=parsed.reason, attempt_count=claim.attempt_count,
                stats=parsed.stats,
            )
        try:
            outcome, _record = self._journal.accept_offer(parsed.offer, now)
        except JournalError as exc:
            if exc.code not in ("offer_conflict", "capacity_exhausted"):
                raise  # storage trouble: the claim stays at its attempt revision, retried next cycle
            return self._back_off(claim, "unavailable", exc.code, None, None)
        crashpoint("pull.inbox_published")
        self._journal.clear_claim(claim.offer_id, claim.revision)
        crashpoint("pull.claim_cleared")
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
    ) -> PullResult:
        now = max(self._clock_ms(), claim.updated_at_ms)
        delay = backoff_delay_ms(claim.attempt_count, self._base_ms, self._random())
        honoured = None
        if retry_after_ms is not None:
            honoured = min(max(0, retry_after_ms), MAX_RETRY_AFTER_MS)
            delay = max(delay, honoured)
        kept = claim.replace(revision=claim.revision + 1, updated_at_ms=now, next_attempt_at_ms=now + delay)
        kept = self._journal.replace_claim(kept, claim.revision)
        return PullResult(
            status,
            offer_id=claim.offer_id,
            reason=code,
            next_attempt_at_ms=kept.next_attempt_at_ms,
            http_status=http_status,
            retry_after_ms=honoured,
            attempt_count=kept.attempt_count,
        )

    def _abandon(self, claim: PendingClaim, reason: str, now: int, *, http_status: int | None = None) -> PullResult:
        self._journal.abandon_claim(reason, max(now, claim.updated_at_ms))
        return PullResult(
            "abandoned",
            offer_id=claim.offer_id,
            reason=reason,
            http_status=http_status,
            attempt_count=claim.attempt_count,
        )
