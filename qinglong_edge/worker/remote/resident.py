"""The resident ``pull``: one journal owner drives every record until none needs local action.

Spec README "One resident owner, not a runner per job": while any inbox record is in
flight (:func:`qinglong_edge.contracts.residency.needs_local_action`), the ``pull`` that
owns the journal stays and does, in one thread::

    loop:
        forced discards asked for (request file + SIGUSR1, worker/remote/discard.py)
        each record that is due, or whose job just exited: Runner.step (worker/remote/runner.py)
        the session: a heartbeat when due (SessionKeeper: a lost answer is retried with
            expectedVersion + 1 before anything is re-registered)
        free slots (maxConcurrentRuns - records in flight, at most the free inbox entries):
            pull; an accepted offer is processed at once
        sleep until the next due time, a job's exit (its pidfd) or a signal (wakeup fd)
    then exit: nothing is resident once every record is terminal

Nothing polls: the wait is one ``poll(2)`` on the jobs' pidfds and the signal wakeup pipe
with the earliest due time as its timeout (a lease renewal at 1/3 of the grant, a
heartbeat every ``heartbeatIntervalMs``, a local deadline, a retry). While every slot is
busy nothing is pulled; an idle answer makes the next pull wait ``heartbeatIntervalMs``
(the cron cadence would be a minute; the profile's ``pullIntervalMs`` of ``--duration``
would hammer the cluster from every busy device).

SIGTERM/SIGINT/SIGHUP (``AbortSignal``): the call in flight is abandoned (a journal write
is finished first), nothing is stopped: jobs go on under their wrappers, their leases run
on, and the next ``pull`` re-adopts them by their identity; this one leaves
``handover.json`` (the next pull skips its splay) and exits 0 after its summary, which
says how long the jobs' leases have left. SIGUSR1 only wakes it (forced discards).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from collections.abc import Callable, Iterator

from qinglong_edge.clock import boot_ms
from qinglong_edge.config import EdgeConfig, WorkerConfig
from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.strictjson import dumps_bytes
from qinglong_edge.errors import JournalError, SessionError
from qinglong_edge.worker.delivery.abort import AbortSignal, PullAborted
from qinglong_edge.worker.delivery.cluster_clock import ClusterClock
from qinglong_edge.worker.delivery.pacing import MAX_RETRY_AFTER_MS, retry_delay_ms
from qinglong_edge.worker.delivery.pull import CycleReport, PullCoordinator, SessionAuthority, inbox_full
from qinglong_edge.worker.delivery.session import SessionKeeper
from qinglong_edge.worker.journal.runtime import HANDOVER_NAME, RuntimeDirectory, boot_id
from qinglong_edge.worker.remote.calls import ExecutionCalls
from qinglong_edge.worker.remote.discard import advertise, pending_requests, retract, write_result
from qinglong_edge.worker.remote.job import forget_caches, isolation_available, prime_wrapper
from qinglong_edge.worker.remote.job_files import in_flight, outcome_name, record_files, remote_limits, remove_job_files
from qinglong_edge.worker.remote.lease import remove_job_lease
from qinglong_edge.worker.remote.runner import Runner
from qinglong_edge.worker.remote.runner_state import RecordEvent, Track

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.contracts.records import InboxRecord
    from qinglong_edge.worker.journal.store import Journal

__all__ = ["Resident", "ResidentSummary"]

#: The longest single wait (s): a clock step or a lost wake-up costs at most this.
MAX_WAIT_S = 30.0
#: The wait when a live job has no pidfd (Linux < 5.3): its exit is noticed by polling.
NO_PIDFD_WAIT_S = 1.0


class ResidentSummary(Frozen):
    """The summary line at exit: time resident, events, the records' final states."""

    __slots__ = ("resident_ms", "events", "states", "in_flight", "aborted", "lease_left_ms")  # noqa: RUF023

    resident_ms: int
    events: int
    states: dict[str, int]
    in_flight: int
    aborted: str | None
    #: Stopped with jobs in flight: the shortest time their leases have left (ms), else None.
    lease_left_ms: int | None

    def __init__(self, resident_ms: int, events: int, states: dict[str, int], in_flight: int,  # noqa: PLR0917
                 aborted: str | None, lease_left_ms: int | None = None) -> None:
        _set = object.__setattr__
        _set(self, "resident_ms", resident_ms)
        _set(self, "events", events)
        _set(self, "states", states)
        _set(self, "in_flight", in_flight)
        _set(self, "aborted", aborted)
        _set(self, "lease_left_ms", lease_left_ms)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"event": "summary", "residentMs": self.resident_ms, "events": self.events,
                               "records": dict(self.states), "inFlight": self.in_flight}
        if self.aborted is not None:
            out["aborted"] = self.aborted
        if self.lease_left_ms is not None:
            out["leaseLeftMs"] = self.lease_left_ms
        return out

    def describe(self, resume: str = "qinglong-edge pull") -> str:
        """The human line; ``resume`` is the command that takes the jobs over (issue 23: a
        hand-run pull stopped with jobs in flight says how long their leases last)."""
        states = ", ".join(f"{count} {state}" for state, count in sorted(self.states.items())) or "none"
        tail = f"; stopped by {self.aborted}, {self.in_flight} left running for the next pull" if self.aborted else ""
        if self.aborted and self.in_flight and self.lease_left_ms is not None:
            tail += (f": their leases run out in {max(0, self.lease_left_ms) // 1000} s unless a pull renews them: "
                     f"run `{resume}` now (the next cron or timer pull also takes them over, if it comes in time)")
        return f"pull: resident {self.resident_ms / 1000:.1f} s, {self.events} events; records: {states}{tail}"


class _Wakeup:
    """The signal wakeup pipe (``signal.set_wakeup_fd``) a wait polls besides the pidfds."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self._previous: int | None = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        except ValueError:  # not the main thread (tests): no signal wakes the wait early
            self._previous = None

    def drain(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self.read_fd, 512):
                pass

    def close(self) -> None:
        if self._previous is not None:
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(self._previous)
        os.close(self.read_fd)
        os.close(self.write_fd)


class Resident:
    """One resident run over an owned journal (module docstring)."""

    def __init__(
        self,
        *,
        config: EdgeConfig,
        worker: WorkerConfig,
        journal: Journal,
        runtime: RuntimeDirectory,
        wire: Any,
        keeper: SessionKeeper,
        coordinator: PullCoordinator,
        abort: AbortSignal,
        clock_ms: Callable[[], int],
        random: Callable[[], float],
        wall_ms: Callable[[], int] | None = None,
        cluster: ClusterClock | None = None,
        draining: bool = False,
        deadline_boot_ms: int | None = None,
        notice: Callable[[str], None] | None = None,
    ) -> None:
        """``clock_ms`` is the boot clock (every timer), ``wall_ms`` the wall clock (the
        record's and the events' times), ``cluster`` the cluster's clock of the cycle."""
        import qinglong_edge.clock as _clock

        #: ``drain``: nothing is pulled, heartbeats announce no free slot.
        self.draining = draining
        #: ``drain``'s bound (clock.boot_ms): the loop stops then, whatever is left.
        self.deadline_boot_ms = deadline_boot_ms
        self.worker = worker
        self.notice = notice
        self.journal = journal
        self.runtime = runtime
        self.keeper = keeper
        self.coordinator = coordinator
        self.abort = abort
        self.clock_ms = clock_ms
        self.wall_ms = wall_ms or _clock.wall_ms
        self.cluster = cluster or ClusterClock(runtime, boot_ms=clock_ms, wall_ms=self.wall_ms)
        self.limits = remote_limits(config)
        self._events: list[RecordEvent] = []
        #: The PID level of remote jobs' isolation ("" until asked; None: not isolated).
        self._isolated: str | None = ""
        self.runner = Runner(journal, ExecutionCalls(wire), self.limits, clock_ms=clock_ms, session=self._session,
                             emit=self._emit, isolate=self._isolate, prepare=self._prepare, random=random,
                             wall_ms=self.wall_ms, cluster=self.cluster, runtime=runtime)
        self.tracks: dict[str, Track] = {}
        self._forgotten: set[str] = set()
        self._random = random
        self._session_failures = 0
        #: No session call before this (boot ms): the backoff after a failed one.
        self._session_retry_at = 0

    # -- callbacks of the runner -----------------------------------------------------------------

    def _session(self) -> tuple[str, str, int] | None:
        record = self.keeper.current()
        return None if record is None else (record.worker_id, record.session_id, record.generation)

    def _emit(self, event: RecordEvent) -> None:
        self._events.append(event)
        if event.event == "exited":  # for `inbox list/show` once the receipt is gone (RAM: lost at a reboot)
            with contextlib.suppress(JournalError):
                self.runtime.write(outcome_name(event.offer_id), dumps_bytes(
                    {"offerId": event.offer_id, **{k: event.details.get(k) for k in
                                                   ("exitCode", "finishedAtMs", "source")}}) + b"\n")

    def _prepare(self) -> None:
        # The isolation answer first: the cached wrapper program is trusted only when no
        # job can see the runtime directory (issue 24: nothing a job can write is trusted).
        prime_wrapper(self.runtime, trusted=self._isolate() is not None, notice=self.notice)

    def _isolate(self) -> str | None:
        if self._isolated == "":
            with contextlib.suppress(OSError):
                os.makedirs(self.limits.log_directory, 0o700, exist_ok=True)
            self._isolated, _ = isolation_available(self.runtime, self.limits.log_directory, boot_id(),
                                                    self.notice)
        return self._isolated

    # -- records -------------------------------------------------------------------------------

    def _track(self, record: InboxRecord) -> Track:
        """A new track, its lease restored (the lease file, or the offer POST's send
        instant when this process accepted it; a lease from an offer is renewed at once)."""
        track = Track(record, self.clock_ms())
        self.tracks[track.offer_id] = track
        self.runner.lease.restore(track, self.coordinator.sent.get(track.offer_id))
        return track

    def _forget(self) -> None:
        """The lease files of records that need nothing more go (RAM)."""
        for track in self.tracks.values():
            if track.done and track.discard is None and track.offer_id not in self._forgotten:
                remove_job_lease(self.runtime, track.offer_id)
                self._forgotten.add(track.offer_id)

    def load(self) -> None:
        """Track every record in flight; remove the files a crash after T10 left behind."""
        now = self.cluster.cluster_now()
        for offer_id in self.journal.list_offers():
            record = self.journal.read_offer(offer_id)
            if record is None or offer_id in self.tracks:
                continue
            if in_flight(record, now):
                self._track(record)
            elif record["state"] == "completion_acknowledged":
                files = record_files(self.limits, record)
                if files is not None and os.path.lexists(files.receipt_path):
                    remove_job_files(files)

    def _free_entries(self) -> int:
        # Only records in flight hold inbox entries (issue 23): finished ones make room.
        free = self.journal.options.maximum_entries - len(self._live())
        return max(0, min(self.worker.max_concurrent_runs, free))

    def _live(self) -> list[Track]:
        return [t for t in self.tracks.values() if not t.done]

    def slots(self) -> int:
        if self.draining or self.keeper.deferred:
            return 0  # drain; or changed capabilities wait for these records (worker/delivery/session.py)
        # Only records in flight hold inbox entries (issue 23): finished ones make room.
        live = len(self._live())
        return max(0, min(self.worker.max_concurrent_runs - live, self.journal.options.maximum_entries - live))

    def _make_room(self) -> None:
        """Before a pull: the oldest finished records go when the inbox files fill it."""
        live = {t.offer_id for t in self._live()}
        now = self.clock_ms()
        self.journal.make_room(lambda r: r["offer"]["offerId"] not in live and not in_flight(r, now),
                               remove_files=self._remove_finished)

    def _remove_finished(self, record: InboxRecord) -> None:
        files = record_files(self.limits, record)
        if files is not None:
            remove_job_files(files)
        with contextlib.suppress(JournalError):
            self.runtime.remove(outcome_name(record["offer"]["offerId"]))

    def _discards(self) -> None:
        for offer_id, request_id in pending_requests(self.runtime):
            track = self.tracks.get(offer_id)
            if track is not None and not track.done:
                if track.discard is None:
                    track.discard = request_id
                    track.stop_reason = track.stop_reason or "discard"
                    track.due_ms = self.clock_ms()
                continue
            record = self.journal.read_offer(offer_id) if track is None else track.record
            self._discard(offer_id, request_id, record)

    def _discard(self, offer_id: str, request_id: str, record: InboxRecord | None) -> None:
        if record is None:
            write_result(self.runtime, offer_id, request_id, {"discarded": False, "reason": "not_found"})
            return
        files = record_files(self.limits, record)
        if files is not None:
            remove_job_files(files)
        self.journal.discard_offer(offer_id)
        remove_job_lease(self.runtime, offer_id)
        with contextlib.suppress(JournalError):
            self.runtime.remove(outcome_name(offer_id))
        self._events.append(RecordEvent("discarded", record))
        track = self.tracks.pop(offer_id, None)
        outcome = track.outcome if track is not None else None
        write_result(self.runtime, offer_id, request_id, {
            "discarded": True, "state": record["state"], "exitCode": None if outcome is None else outcome.exit_code,
            "finishedAtMs": self.wall_ms()})

    def _settle(self) -> None:
        for track in [t for t in self.tracks.values() if t.done and t.discard is not None]:
            self._discard(track.offer_id, track.discard or "", track.record)

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> Iterator[RecordEvent | CycleReport | ResidentSummary]:
        """Drive every record until none is in flight (or a signal); yields each event and
        each notable pull or session result, then the summary."""
        started = self.clock_ms()
        count = 0
        aborted: str | None = None
        pull_due = self.clock_ms()
        wakeup = _Wakeup()
        self.load()
        if not self._live() and not pending_requests(self.runtime):
            wakeup.close()
            return  # e.g. a replay of a record that is already done: nothing resident
        advertise(self.runtime, self.journal.lock.record)
        try:
            while True:
                self.abort.check()
                self._discards()
                now = self.clock_ms()
                for track in sorted(self._live(), key=lambda t: t.due_ms):
                    if track.due_ms <= now:
                        self.runner.step(track)
                    count += len(self._events)
                    yield from self._drain()
                self._settle()
                self._forget()
                count += len(self._events)
                yield from self._drain()
                if not self._live() and not pending_requests(self.runtime):
                    report = self._session_step(self.clock_ms(), final=True)  # the freed slots, announced
                    if report is not None:
                        yield report
                    break
                if self._past_deadline():
                    break
                now = self.clock_ms()
                report = self._session_step(now)
                if report is not None:
                    yield report
                if self.slots() > 0 and pull_due <= now:
                    report, pull_due = self._pull(now)
                    if report is not None:
                        yield report
                    if self._live() and any(t.due_ms <= self.clock_ms() for t in self._live()):
                        continue
                self._wait(wakeup, pull_due if self.slots() > 0 else None)
        except PullAborted as exc:
            aborted = exc.signal_name
            if self._live():
                # The next pull must renew these leases soon: it skips its splay (the leases
                # run on meanwhile; a 30 s lease does not wait for a phase late in the minute).
                with contextlib.suppress(JournalError):
                    self.runtime.write(HANDOVER_NAME, dumps_bytes({
                        "schemaVersion": 1, "inFlight": len(self._live()), "atMs": self.wall_ms(),
                        "signal": aborted}) + b"\n")
        finally:
            if self._isolated is None:
                forget_caches(self.runtime)  # what the unisolated jobs may have left there
            retract(self.runtime)
            wakeup.close()
            for track in self.tracks.values():
                if track.job is not None:
                    track.job.close()  # never stopped: re-adopted by the next pull
        states: dict[str, int] = {}
        for track in self.tracks.values():
            states[track.state] = states.get(track.state, 0) + 1
        live = self._live()
        left = None
        if aborted is not None and live:
            now = self.clock_ms()
            left = min(self.runner.lease.expiry_ms(track) - now for track in live)
        yield ResidentSummary(self.clock_ms() - started, count, states, len(live), aborted, left)

    def _drain(self) -> Iterator[RecordEvent]:
        events, self._events[:] = list(self._events), []
        yield from events

    def _past_deadline(self) -> bool:
        return self.deadline_boot_ms is not None and boot_ms() >= self.deadline_boot_ms

    def _session_step(self, now: int, *, final: bool = False) -> CycleReport | None:
        """A heartbeat when due, or when a slot came free since the last one announced
        (a job ended: the cluster must know before this or the next pull asks for work);
        at the end, the registration of changed capabilities that waited for the records."""
        slots = self.slots()
        announced = self.keeper.announced_slots
        freed = announced is not None and slots > announced
        changed = final and self.keeper.deferred and not self.draining
        if not changed and ((self._session_due(now) > now and not freed) or (final and not freed)
                            or now < self._session_retry_at):
            return None
        bound = [t.record["offer"]["worker"] for t in self._live()]
        try:
            outcome = self.keeper.ensure(self.slots() if not changed else self._free_entries(), announce=True,
                                         in_flight=len(self._live()), sessions_in_flight=[
                                             (b["workerId"], b["sessionId"], b["generation"]) for b in bound])
        except SessionError as exc:
            self._session_failed(now)
            return CycleReport(None, None, exc.code, exc.message, reason=exc.reason, remedy=exc.remedy)
        except JournalError as exc:  # the runtime directory is full or read-only: retried, jobs go on
            self._session_failed(now)
            return CycleReport(None, None, exc.code, exc.message)
        if outcome.action == "stale":  # the heartbeat failed; the stored lease still runs
            self._session_failed(now)
        else:
            self._session_failures, self._session_retry_at = 0, 0
        return CycleReport(outcome, None) if outcome.action == "registered" else None

    def _session_due(self, now: int) -> int:
        return max(self.keeper.next_call_ms(now), self._session_retry_at)

    def _session_failed(self, now: int) -> None:
        """A failed session call waits (full jitter from 1 s, at most 60 s) before the next
        one: the wait loop would otherwise find it due at every wake."""
        self._session_failures += 1
        delay, _ = retry_delay_ms(self._session_failures, 1000, self._random(), None)
        self._session_retry_at = now + max(delay, 500)

    def _pull(self, now: int) -> tuple[CycleReport | None, int]:
        record = self.keeper.current()
        if record is None:
            return None, now + self.worker.heartbeat_interval_ms
        self._make_room()
        result = self.coordinator.pull(SessionAuthority(record.worker_id, record.session_id, record.generation))
        if result.status == "inbox_full":
            result = inbox_full(result, len(self._live()), self.journal.options.maximum_entries)
        if result.status in ("accepted", "replayed") and result.offer_id is not None:
            stored = self.journal.read_offer(result.offer_id)
            if stored is not None and result.offer_id not in self.tracks and in_flight(stored,
                                                                                     self.cluster.cluster_now()):
                self._track(stored)
            return CycleReport(None, result), self.clock_ms()
        if result.status == "idle":
            return None, self.clock_ms() + self.worker.heartbeat_interval_ms
        due = self.coordinator.backoff_due_boot_ms  # the backoff on the boot clock, when noted
        if result.status == "backoff" and result.next_attempt_at_ms is not None:
            return None, due if due is not None else self._boot_of(result.next_attempt_at_ms)
        later = (due if due is not None else self._boot_of(result.next_attempt_at_ms) if result.next_attempt_at_ms
                 else self.clock_ms() + self.worker.heartbeat_interval_ms)
        return CycleReport(None, result), later

    def _boot_of(self, wall_ms: int) -> int:
        """A claim's stored due time (wall ms, its contract's clock) as a boot instant,
        at most an hour away (the longest Retry-After honoured; pacing.claim_due)."""
        return self.clock_ms() + max(0, min(wall_ms - self.wall_ms(), MAX_RETRY_AFTER_MS))

    def _wait(self, wakeup: _Wakeup, pull_due: int | None) -> None:
        now = self.clock_ms()
        live = self._live()
        due = [t.due_ms for t in live] + [self._session_due(now)]
        if pull_due is not None:
            due.append(pull_due)
        timeout = max(0.0, min(MAX_WAIT_S, (min(due) - now) / 1000))
        if self.deadline_boot_ms is not None:
            timeout = min(timeout, max(0.0, (self.deadline_boot_ms - boot_ms()) / 1000))
        poller = select.poll()
        poller.register(wakeup.read_fd, select.POLLIN)
        watched: dict[int, Track] = {}
        for track in live:
            job = track.job
            if job is None or track.outcome is not None:
                continue
            if job.pidfd >= 0:
                poller.register(job.pidfd, select.POLLIN)
                watched[job.pidfd] = track
            else:
                timeout = min(timeout, NO_PIDFD_WAIT_S)
        with self.abort.interruptible():
            ready = poller.poll(int(timeout * 1000) + 1)
        wakeup.drain()
        for fd, _ in ready:
            if fd in watched:
                watched[fd].due_ms = self.clock_ms()
