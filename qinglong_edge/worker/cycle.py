"""The cron-driven ``pull`` cycle: keep the Worker Session alive, then pull one offer step.

:func:`run_pull` is what ``qinglong-edge pull`` runs (the command adds signal handling
and printing)::

    the platform's architecture (unsupported_architecture before any I/O)
    open the runtime directory (RAM); the advertisement: the capabilities file, else
      the probes (worker/delivery/capabilities.py; invalid_capabilities before any network I/O)
    open the journal (owner lock; another pull ->
      already_owned, reported as "busy"); a session record of an older version moves
      from the journal root to the runtime directory
    once a UTC day: the client certificate's expiry warning (worker/delivery/expiry.py)
    [--duration S] repeat at the profile cadence (edge 2 s) until S seconds passed:
        clock sanity (not before the package's date; a router that booted at 1970 waits for NTP)
        prune terminal inbox records past retention, abandoned claims beyond their bound
        session: register / heartbeat when due (SessionKeeper; changed capabilities wait
                 while records are in flight: then no_slot capabilities_changed)
        pull:    one coordinator step (PullCoordinator)
    close the transport, release the journal

``availableSlots`` sent to the cluster is ``min(maxConcurrentRuns, free inbox
entries)``: the inbox is this device's queue, so a full inbox asks for no work (the
cluster then answers ``idle worker_unavailable``) and the coordinator makes no claim.

No timers: besides the owner lock's refresh thread, nothing runs in the background;
between cycles the process sleeps in the foreground. The splay (the device's phase in
the minute, :func:`qinglong_edge.worker.delivery.pacing.splay_delay_ms`) is slept by the ``pull``
command before it even imports this module.

Storage (spec README "Decisions for storage on flash"): an idle cycle in steady state
writes only to the runtime directory: the owner record, the session record after a
heartbeat, the attempt marker (see :mod:`qinglong_edge.worker.delivery.pull`).
"""

from __future__ import annotations

import contextlib
import os
import random as _random
import time
from collections.abc import Callable, Iterator

import qinglong_edge.clock as _clock
from qinglong_edge.config import EdgeConfig, WorkerConfig
from qinglong_edge.errors import JournalError, SessionError
from qinglong_edge.worker.delivery.cluster_clock import ClusterClock
from qinglong_edge.worker.delivery.expiry import daily_expiry_warning
from qinglong_edge.worker.delivery.pull import (
    AbortSignal,
    CycleReport,
    PullCoordinator,
    PullResult,
    SessionAuthority,
    inbox_full,
)
from qinglong_edge.worker.delivery.session import (
    SessionKeeper,
    local_capabilities,
    migrate_legacy_record,
)
from qinglong_edge.worker.ingress.http_exchange import DEFAULT_MAX_REQUEST_BYTES
from qinglong_edge.worker.ingress.transport import IngressTransport, TransportResponse
from qinglong_edge.worker.journal.runtime import HANDOVER_NAME, RuntimeDirectory
from qinglong_edge.worker.journal.store import Journal, JournalOptions

__all__ = ["CLOCK_FLOOR_MS", "run_pull", "wall_ms"]

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.contracts.records import InboxRecord

#: A wall clock before this is "not set yet" (:data:`qinglong_edge.clock.CLOCK_FLOOR_MS`,
#: the source's date; doctor's rule too).
CLOCK_FLOOR_MS = _clock.CLOCK_FLOOR_MS


def wall_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def _cycle(journal: Journal, keeper: SessionKeeper, coordinator: PullCoordinator, worker: WorkerConfig,
           clock_ms: Callable[[], int], *, runtime: RuntimeDirectory) -> tuple[CycleReport, int]:
    """One cycle; returns its report and the number of records in flight afterwards."""
    now = clock_ms()
    if now < CLOCK_FLOOR_MS:
        return CycleReport(None, None, "clock_not_set", "the wall clock is before this package's build date: "
                           "waiting for NTP (nothing is claimed)"), 0
    kept: list[InboxRecord] = []
    journal.prune_inbox(now, process_gone=_process_gone, remove_files=lambda r: _remove_files(worker, runtime, r),
                        kept=kept)
    journal.prune_abandoned()
    busy = 0
    finished: set[str] = set()
    sessions: list[tuple[str, str, int]] = []  # of the records in flight (a lost session record)
    if kept:
        # Imported only with records in the inbox: an idle cycle on an empty inbox does
        # not load the job files' names (contracts.receipt, launch, ingress).
        from qinglong_edge.worker.remote.job_files import in_flight
    for stored in kept:
        if in_flight(stored, now):
            busy += 1
            bound = stored["offer"]["worker"]
            sessions.append((bound["workerId"], bound["sessionId"], bound["generation"]))
            continue
        finished.add(stored["offer"]["offerId"])
        if stored["state"] == "completion_acknowledged":
            _leftovers(worker, stored)  # a crash between T10 and the files' removal
    # Spec README "Slots": records in flight hold slots; never more than free inbox entries,
    # and only records in flight hold entries (issue 23: a finished record makes room).
    free = journal.options.maximum_entries - busy
    slots = max(0, min(worker.max_concurrent_runs - busy, free))
    try:
        session = keeper.ensure(slots, in_flight=busy, sessions_in_flight=sessions)
    except SessionError as exc:
        return CycleReport(None, None, exc.code, exc.message, reason=exc.reason, remedy=exc.remedy), busy
    record = session.session
    states: dict[str, int] = {}
    for stored in kept:
        states[stored["state"]] = states.get(stored["state"], 0) + 1
    if keeper.deferred:  # no new work under the old advertisement; re-registered once these are done
        coordinator.settle_claim()
        return CycleReport(session, PullResult("no_slot", reason="capabilities_changed"), inbox=states), busy
    if busy and worker.max_concurrent_runs <= busy:
        coordinator.settle_claim()
        return CycleReport(session, PullResult("no_slot", reason="slots_in_use"), inbox=states), busy
    if slots:
        journal.make_room(lambda r: r["offer"]["offerId"] in finished, records=kept,
                          remove_files=lambda r: _remove_files(worker, runtime, r))
    result = coordinator.pull(SessionAuthority(record.worker_id, record.session_id, record.generation))
    if result.status == "inbox_full":
        result = inbox_full(result, busy, journal.options.maximum_entries)
    if result.status in ("accepted", "replayed"):
        busy += 1  # executed by the resident loop at once (a replay of a finished one leaves it)
        if result.status == "accepted":
            states["accepted"] = states.get("accepted", 0) + 1
    return CycleReport(session, result, inbox=states), busy


def _process_gone(record: InboxRecord) -> bool:
    from qinglong_edge.worker.remote.job_files import process_gone

    return process_gone(record)


def _leftovers(worker: WorkerConfig, record: InboxRecord) -> None:
    """The files of an acknowledged completion are removed right after it; a crash in
    between leaves them, found here (two ``lstat`` per such record, no write otherwise)."""
    from qinglong_edge.worker.remote.job_files import remove_job_files, worker_record_files

    files = worker_record_files(worker, record)
    if files is not None and (os.path.lexists(files.receipt_path) or os.path.lexists(files.log_path)):
        remove_job_files(files)


def _remove_files(worker: WorkerConfig, runtime: RuntimeDirectory, record: InboxRecord) -> None:
    """A pruned record's log, receipt, truncation fact, scratch directory and outcome note."""
    from qinglong_edge.worker.remote.job_files import outcome_name, remove_job_files, worker_record_files

    files = worker_record_files(worker, record)
    if files is not None:
        remove_job_files(files)
    try:
        runtime.remove(outcome_name(record["offer"]["offerId"]))
    except JournalError:
        pass


def _discards_pending(runtime: RuntimeDirectory) -> bool:
    """A forced ``inbox discard`` waits for an owner (names only: nothing is read)."""
    try:
        return any(name.startswith("discard.") and name.endswith(".request") for name in runtime.names())
    except JournalError:
        return False


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

    def post_stream(self, path: str, prefix: bytes, source: object, length: int, *,
                    max_response_bytes: int) -> TransportResponse:
        with self._abort.interruptible():
            return self._transport.post_stream(path, prefix, source, length, max_response_bytes=max_response_bytes)


def run_pull(
    worker: WorkerConfig,
    *,
    duration_s: float | None = None,
    abort: AbortSignal | None = None,
    clock_ms: Callable[[], int] = wall_ms,
    boot_ms: Callable[[], int] = _clock.boot_ms,
    sleep: Callable[[float], None] = time.sleep,
    random: Callable[[], float] = _random.random,
    transport: IngressTransport | None = None,
    notice: Callable[[str], None] | None = None,
    runtime: RuntimeDirectory | None = None,
    config: EdgeConfig | None = None,
) -> Iterator[CycleReport | Any]:
    """Run one cycle, or cycles at ``worker.pull_interval_ms`` for ``duration_s`` seconds.

    Yields each :class:`CycleReport` as it completes. Stops early after a
    ``credential_rejected`` cycle (every later one would fail the same way).

    Args:
        clock_ms: the wall clock (the clock floor, the claim's stored times, the record
            times people read); boot_ms: the boot clock (every timer: session, leases,
            backoff of the resident loop). Spec README "Decisions for clocks".
        random: uniform [0, 1) for the backoff jitter (seedable in tests).
        abort: tripped by the caller's signal handler (see :class:`AbortSignal`);
            network calls and sleeps are interrupted, journal writes finish first,
            and no cycle starts after it tripped.
        notice: called with a warning line (the certificate's expiry, once a day).
        runtime: the runtime directory, when the caller opened it already (it stays
            open); default: opened (and closed) here.
        config: the whole configuration (what remote jobs must not see, their limits);
            default: the worker section alone, with its journal's parent as the state
            directory.

    After a cycle that leaves a record in flight (an accepted offer, a job re-adopted),
    the resident loop (:mod:`qinglong_edge.worker.remote.resident`, imported only then) drives
    every record to its end, yielding each
    :class:`~qinglong_edge.worker.remote.runner_state.RecordEvent` and notable
    :class:`CycleReport` and finally one
    :class:`~qinglong_edge.worker.remote.resident.ResidentSummary`; ``--duration`` bounds only
    the idle cycles.

    Raises:
        JournalError: ``already_owned`` (another pull holds the journal) and storage
            failures; TransportError ``invalid_configuration`` /
            ``credentials_unavailable`` from the transport's construction;
            SessionError ``unsupported_architecture``; ConfigError ``invalid_capabilities``
            (the capabilities file, before any network I/O); PullAborted once ``abort`` tripped.
    """
    abort = abort or AbortSignal()

    def pause(seconds: float) -> None:
        with abort.interruptible():
            sleep(seconds)

    base = local_capabilities()  # unsupported_architecture before any I/O
    abort.check()
    own_runtime = runtime is None
    runtime = runtime or RuntimeDirectory.open(worker.runtime_directory, worker.journal_directory)
    try:
        from qinglong_edge.worker.delivery.capabilities import advertisement

        # Read once, here: a resident pull keeps this advertisement for its whole life.
        capabilities = advertisement(worker, base, runtime).capabilities  # invalid_capabilities: exit 78
        yield from _run_journal(worker, runtime, capabilities, duration_s=duration_s, abort=abort, pause=pause,
                                clock_ms=clock_ms, boot_ms=boot_ms, random=random, transport=transport, notice=notice,
                                config=config or EdgeConfig("edge", os.path.dirname(worker.journal_directory), worker,
                                                            None, None))
    finally:
        if own_runtime:
            runtime.close()


def _run_journal(
    worker: WorkerConfig,
    runtime: RuntimeDirectory,
    capabilities: dict[str, object],
    *,
    duration_s: float | None,
    abort: AbortSignal,
    pause: Callable[[float], None],
    clock_ms: Callable[[], int],
    boot_ms: Callable[[], int],
    random: Callable[[], float],
    transport: IngressTransport | None,
    notice: Callable[[str], None] | None,
    config: EdgeConfig,
) -> Iterator[CycleReport | Any]:
    journal = Journal.open(worker.journal_directory, JournalOptions.from_config(worker), runtime=runtime)
    with contextlib.suppress(JournalError):
        runtime.remove(HANDOVER_NAME)  # ours now (RAM; absent in the steady state: one ENOENT)
    try:
        migrate_legacy_record(journal.take_legacy_session_record(), runtime)
        if notice is not None and runtime.on_fallback and runtime.once_per_boot("runtime-fallback"):
            # A runtime directory that is not a private directory of ours (a symlink, a FIFO,
            # a file put in its place) is never followed: say so once, use the fallback.
            notice(f"runtime directory refused ({runtime.fallback_reason}); using {runtime.path}")
        if notice is not None:
            warning = daily_expiry_warning(worker.certificate_file, worker.trust_anchor_files, runtime, clock_ms())
            if warning is not None:
                notice(warning)
        own_transport = transport is None
        transport = transport or IngressTransport.from_config(worker)
        try:
            wire = _InterruptibleTransport(transport, abort)
            cluster = ClusterClock(runtime, boot_ms=boot_ms, wall_ms=clock_ms)
            keeper = SessionKeeper(
                runtime,
                wire,
                worker_id=worker.worker_id,
                max_concurrent_runs=worker.max_concurrent_runs,
                lease_duration_ms=worker.session_lease_duration_ms,
                heartbeat_interval_ms=worker.heartbeat_interval_ms,
                clock_ms=boot_ms,
                capabilities=capabilities,
                cluster=cluster,
                wall_ms=clock_ms,
            )
            coordinator = PullCoordinator(
                journal, wire, runtime=runtime, backoff_base_ms=worker.backoff_base_ms, clock_ms=clock_ms,
                random=random, boot_ms=boot_ms,
            )
            started = time.monotonic()
            while True:
                abort.check()
                report, busy = _cycle(journal, keeper, coordinator, worker, clock_ms, runtime=runtime)
                if notice is not None:
                    skew = cluster.skew_notice()  # once per boot (spec README "Skew"); work goes on
                    if skew is not None:
                        notice(skew)
                yield report
                abort.check()
                if busy or _discards_pending(runtime):
                    from qinglong_edge.worker.remote.resident import Resident

                    yield from Resident(config=config, worker=worker, journal=journal, runtime=runtime, wire=wire,
                                        keeper=keeper, coordinator=coordinator, abort=abort, clock_ms=boot_ms,
                                        wall_ms=clock_ms, cluster=cluster, random=random, notice=notice).run()
                    if abort.tripped:
                        return
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
