"""The cron-driven ``pull`` cycle: keep the Worker Session alive, then pull one offer step.

:func:`run_pull` is what ``qinglong-edge pull`` runs (the command adds signal handling
and printing)::

    open the journal (owner lock; another pull -> already_owned, reported as "busy")
    [--duration S] repeat at the profile cadence (edge 2 s) until S seconds passed:
        clock sanity (year >= 2020; a router that booted at 1970 waits for NTP)
        prune terminal inbox records past retention
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

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from qinglong_edge.config import WorkerConfig
from qinglong_edge.errors import SessionError
from qinglong_edge.worker.journal import Journal, JournalOptions
from qinglong_edge.worker.pull import PullCoordinator, PullResult, SessionAuthority
from qinglong_edge.worker.session import SessionKeeper, SessionOutcome
from qinglong_edge.worker.transport import IngressTransport

__all__ = ["CLOCK_FLOOR_MS", "CycleReport", "run_pull", "wall_ms"]

#: 2020-01-01T00:00:00Z: a wall clock before this is "not set yet" (doctor's rule).
CLOCK_FLOOR_MS = 1_577_836_800_000


def wall_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class CycleReport:
    """One cycle: the session step and the pull step (either may be missing on failure).

    Attributes:
        session: what the session keeper did, or None when it failed.
        result: the pull step's result, or None when the cycle stopped before it.
        error: the failure code when the cycle stopped early (``credential_rejected``,
            ``session_unavailable``, ``invalid_response``, ``unsupported_platform``,
            ``clock_not_set``).
        detail: a human-readable line (no secrets).
    """

    session: SessionOutcome | None
    result: PullResult | None
    error: str | None = None
    detail: str = ""

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
        if self.detail:
            out["detail"] = self.detail
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
    try:
        session = keeper.ensure(_slots(journal, worker.max_concurrent_runs))
    except SessionError as exc:
        return CycleReport(None, None, exc.code, exc.message)
    record = session.session
    result = coordinator.pull(SessionAuthority(record.worker_id, record.session_id, record.generation))
    return CycleReport(session, result)


def run_pull(
    worker: WorkerConfig,
    *,
    duration_s: float | None = None,
    splay: bool = True,
    clock_ms: Callable[[], int] = wall_ms,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    transport: IngressTransport | None = None,
) -> Iterator[CycleReport]:
    """Run one cycle, or cycles at ``worker.pull_interval_ms`` for ``duration_s`` seconds.

    Yields each :class:`CycleReport` as it completes. Stops early after a
    ``credential_rejected`` cycle (every later one would fail the same way).

    Raises:
        JournalError: ``already_owned`` (another pull holds the journal) and storage
            failures; TransportError ``invalid_configuration``; whatever a signal
            handler raises (e.g. PullAborted), unchanged.
    """
    rng = rng or random.Random()
    journal = Journal.open(worker.journal_directory, JournalOptions.from_config(worker))
    try:
        own_transport = transport is None
        transport = transport or IngressTransport.from_config(worker)
        try:
            keeper = SessionKeeper(
                journal,
                transport,
                worker_id=worker.worker_id,
                max_concurrent_runs=worker.max_concurrent_runs,
                lease_duration_ms=worker.session_lease_duration_ms,
                clock_ms=clock_ms,
            )
            coordinator = PullCoordinator(
                journal, transport, backoff_base_ms=worker.backoff_base_ms, clock_ms=clock_ms, random=rng.random
            )
            if splay and worker.splay_max_ms > 0:
                sleep(rng.uniform(0, worker.splay_max_ms) / 1000)
            started = time.monotonic()
            while True:
                report = _cycle(journal, keeper, coordinator, worker, clock_ms)
                yield report
                if report.error == "credential_rejected" or (
                    report.result is not None and report.result.status == "credential_rejected"
                ):
                    return
                if duration_s is None:
                    return
                remaining = duration_s - (time.monotonic() - started)
                if remaining <= 0:
                    return
                sleep(min(remaining, worker.pull_interval_ms / 1000))
                if time.monotonic() - started >= duration_s:
                    return
        finally:
            if own_transport:
                transport.close()
    finally:
        journal.close()
