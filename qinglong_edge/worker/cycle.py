"""The cron-driven ``pull`` cycle: keep the Worker Session alive, then pull one offer step.

:func:`run_pull` is what ``qinglong-edge pull`` runs (the command adds signal handling
and printing)::

    capabilities of this platform (unsupported_platform before any I/O)
    splay: sleep uniform 0..splayMaxMs (no lock held; a fleet on one crontab spreads out)
    open the journal (owner lock; another pull -> already_owned, reported as "busy")
    [--duration S] repeat at the profile cadence (edge 2 s) until S seconds passed:
        clock sanity (year >= 2020; a router that booted at 1970 waits for NTP)
        prune terminal inbox records past retention, abandoned claims beyond their bound
        session: register / heartbeat when due (SessionKeeper)
        pull:    one coordinator step (PullCoordinator)
    close the transport, release the journal

``availableSlots`` sent to the cluster is ``min(maxConcurrentRuns, free inbox
entries)``: the inbox is this device's queue, so a full inbox asks for no work (the
cluster then answers ``idle worker_unavailable``) and the coordinator makes no claim.

No timers: besides the owner lock's refresh thread, nothing runs in the background;
between cycles the process sleeps in the foreground.
"""

from __future__ import annotations

import random as _random
import time
from collections.abc import Callable, Iterator

from qinglong_edge.config import WorkerConfig
from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.errors import SessionError
from qinglong_edge.worker.ingress_http import DEFAULT_MAX_REQUEST_BYTES
from qinglong_edge.worker.journal import Journal, JournalOptions
from qinglong_edge.worker.pull import AbortSignal, PullCoordinator, PullResult, SessionAuthority
from qinglong_edge.worker.session import SessionKeeper, SessionOutcome, local_capabilities
from qinglong_edge.worker.transport import IngressTransport, TransportResponse

__all__ = ["CLOCK_FLOOR_MS", "CycleReport", "run_pull", "wall_ms"]

#: 2020-01-01T00:00:00Z: a wall clock before this is "not set yet" (doctor's rule).
CLOCK_FLOOR_MS = 1_577_836_800_000


def wall_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


class CycleReport(Frozen):
    """One cycle: the session step and the pull step (either may be missing on failure).

    Attributes:
        session: what the session keeper did, or None when it failed.
        result: the pull step's result, or None when the cycle stopped before it.
        error: the failure code when the cycle stopped early (``credential_rejected``,
            ``session_unavailable``, ``invalid_response``, ``unsupported_platform``,
            ``clock_not_set``).
        detail: a human-readable line (no secrets).
        reason: the transport reason behind ``error`` (``certificate_expired``...), if any.
        remedy: its one-line remedy ("" without one).
    """

    __slots__ = ("session", "result", "error", "detail", "reason", "remedy")  # noqa: RUF023 (field order)

    session: SessionOutcome | None
    result: PullResult | None
    error: str | None
    detail: str
    reason: str | None
    remedy: str

    def __init__(  # noqa: PLR0917 (the dataclass signature)
        self,
        session: SessionOutcome | None,
        result: PullResult | None,
        error: str | None = None,
        detail: str = "",
        reason: str | None = None,
        remedy: str = "",
    ) -> None:
        _set = object.__setattr__
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


def _slots(journal: Journal, max_runs: int) -> int:
    free = journal.options.maximum_entries - len(journal.list_offers())
    return max(0, min(max_runs, free))


def _cycle(journal: Journal, keeper: SessionKeeper, coordinator: PullCoordinator, worker: WorkerConfig,
           clock_ms: Callable[[], int]) -> CycleReport:
    now = clock_ms()
    if now < CLOCK_FLOOR_MS:
        return CycleReport(None, None, "clock_not_set", "the wall clock is before 2020: waiting for NTP")
    journal.prune_inbox(now)
    journal.prune_abandoned()
    try:
        session = keeper.ensure(_slots(journal, worker.max_concurrent_runs))
    except SessionError as exc:
        return CycleReport(None, None, exc.code, exc.message, reason=exc.reason, remedy=exc.remedy)
    record = session.session
    result = coordinator.pull(SessionAuthority(record.worker_id, record.session_id, record.generation))
    return CycleReport(session, result)


class _InterruptibleTransport:
    """The transport with every call inside :meth:`AbortSignal.interruptible`."""

    def __init__(self, transport: IngressTransport, abort: AbortSignal) -> None:
        self._transport = transport
        self._abort = abort

    def post_json(
        self, path: str, body: bytes, *, max_response_bytes: int, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    ) -> TransportResponse:
        with self._abort.interruptible():
            return self._transport.post_json(
                path, body, max_response_bytes=max_response_bytes, max_request_bytes=max_request_bytes
            )


def run_pull(
    worker: WorkerConfig,
    *,
    duration_s: float | None = None,
    splay: bool = True,
    abort: AbortSignal | None = None,
    clock_ms: Callable[[], int] = wall_ms,
    sleep: Callable[[float], None] = time.sleep,
    random: Callable[[], float] = _random.random,
    transport: IngressTransport | None = None,
) -> Iterator[CycleReport]:
    """Run one cycle, or cycles at ``worker.pull_interval_ms`` for ``duration_s`` seconds.

    Yields each :class:`CycleReport` as it completes. Stops early after a
    ``credential_rejected`` cycle (every later one would fail the same way). The splay
    (uniform 0..``splayMaxMs``) is slept before the journal is opened, so a sleeping
    process holds no lock.

    Args:
        random: uniform [0, 1) for the splay and the backoff jitter (seedable in tests).
        abort: tripped by the caller's signal handler (see :class:`AbortSignal`);
            network calls and sleeps are interrupted, journal writes finish first,
            and no cycle starts after it tripped.

    Raises:
        JournalError: ``already_owned`` (another pull holds the journal) and storage
            failures; TransportError ``invalid_configuration`` /
            ``credentials_unavailable`` from the transport's construction;
            SessionError ``unsupported_platform``; PullAborted once ``abort`` tripped.
    """
    abort = abort or AbortSignal()

    def pause(seconds: float) -> None:
        with abort.interruptible():
            sleep(seconds)

    capabilities = local_capabilities()  # unsupported_platform before any I/O
    if splay and worker.splay_max_ms > 0:
        pause(random() * worker.splay_max_ms / 1000)
    abort.check()
    journal = Journal.open(worker.journal_directory, JournalOptions.from_config(worker))
    try:
        own_transport = transport is None
        transport = transport or IngressTransport.from_config(worker)
        try:
            wire = _InterruptibleTransport(transport, abort)
            keeper = SessionKeeper(
                journal,
                wire,
                worker_id=worker.worker_id,
                max_concurrent_runs=worker.max_concurrent_runs,
                lease_duration_ms=worker.session_lease_duration_ms,
                heartbeat_interval_ms=worker.heartbeat_interval_ms,
                clock_ms=clock_ms,
                capabilities=capabilities,
            )
            coordinator = PullCoordinator(
                journal, wire, backoff_base_ms=worker.backoff_base_ms, clock_ms=clock_ms, random=random
            )
            started = time.monotonic()
            while True:
                abort.check()
                report = _cycle(journal, keeper, coordinator, worker, clock_ms)
                yield report
                abort.check()
                if report.error == "credential_rejected" or (
                    report.result is not None and report.result.status == "credential_rejected"
                ):
                    return
                if duration_s is None:
                    return
                remaining = duration_s - (time.monotonic() - started)
                if remaining <= 0:
                    return
                pause(min(remaining, worker.pull_interval_ms / 1000))
                if time.monotonic() - started >= duration_s:
                    return
        finally:
            if own_transport:
                transport.close()
    finally:
        journal.close()
