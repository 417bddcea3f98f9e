"""The plumbing of the runner: durable transitions, events, the lease clocks, retries and
lease-control with its G2 / G15 rules (spec README "Lease clocks", "Decisions for clocks",
"Later calls' errors").

Split from :mod:`qinglong_edge.worker.remote.runner` (the steps T1-T12, whose docstring gives the
decisions) and :mod:`qinglong_edge.worker.remote.runner_end` (the end of a launched job); one
class hierarchy: ``RunnerBase`` <- ``RunnerEnd`` <- ``Runner``.

Clocks: every timer here is on the boot clock (``clock_ms``, ``CLOCK_BOOTTIME``); the wall
clock (``wall_ms``) only stamps the record's ``*AtMs`` fields people read; the cluster's
clock (:class:`~qinglong_edge.worker.delivery.cluster_clock.ClusterClock`) translates its lease
times and the completion's result times. A renewal is kept in memory and in the record's
lease file in the runtime directory (RAM), never written to the journal by itself (issue
23 item 7): the journal takes the current lease with the next state change, and once more
when the job's exit is observed (:meth:`~qinglong_edge.worker.remote.runner_end.RunnerEnd._gone`).
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable

import qinglong_edge.clock as _clock
from qinglong_edge.contracts.clocks import lease_stop_plan, local_lease_expiry_ms, renewal_due_ms
from qinglong_edge.contracts.inbox import renewed_lease, to_recovery_required, with_lease
from qinglong_edge.contracts.residency import LAUNCHED_STATES, local_deadline_ms
from qinglong_edge.crashpoints import crashpoint
from qinglong_edge.errors import JournalError, RemoteCallError
from qinglong_edge.process.cgroups import CgroupManager
from qinglong_edge.worker.delivery.cluster_clock import ClusterClock
from qinglong_edge.worker.delivery.pacing import retry_delay_ms
from qinglong_edge.worker.remote.calls import ExecutionCalls
from qinglong_edge.worker.remote.job import RemoteJob, adopt
from qinglong_edge.worker.remote.job_files import JobFiles, RemoteLimits, job_files
from qinglong_edge.worker.remote.lease import (
    JobLease,
    lease_name,
    read_job_lease,
    stopped_by_wrapper,
    stopped_name,
    write_job_lease,
)
from qinglong_edge.worker.remote.runner_state import RecordEvent, Track

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.worker.journal.runtime import RuntimeDirectory
    from qinglong_edge.worker.journal.store import Journal

__all__ = ["AGAIN_MS", "RETRY_BASE_MS", "RunnerBase"]

#: Base of the retry backoff of a failed call (doubles per failure, full jitter, <= 60 s).
RETRY_BASE_MS = 1000
#: How soon a stop that was not conclusive, or a storage failure, is tried again (ms).
AGAIN_MS = 1000
#: A retried call goes out at least this long (at most a tenth of the grant) before the
#: lease stop or expiry, so that it can still be answered in time.
RETRY_LEAD_MS = 2000


class RunnerBase:
    """The plumbing of :class:`~qinglong_edge.worker.remote.runner.Runner`: journal writes, events, lease
    clocks, retries, lease-control with its G2/G15 rules (worker/remote/runner.py docstring).

    Args:
        journal: the owned journal.
        calls: the seven calls on the pull's transport.
        limits: what remote jobs run under (:func:`~qinglong_edge.worker.remote.job_files.remote_limits`).
        clock_ms: the boot clock (ms): every timer.
        session: the current Worker Session as ``(workerId, sessionId, generation)``, or None.
        emit: called with each :class:`RecordEvent`.
        isolate: the PID level of the isolation jobs run in, or None when they are not
            isolated (asked once, at the first launch).
        prepare: called once before the first launch (the wrapper's program, cgroups).
        random: uniform [0, 1) for the backoff jitter.
        wall_ms: the wall clock, for the record's times (default ``clock.wall_ms``).
        cluster: the cluster's clock (default: one without a runtime directory).
        runtime: the runtime directory for the lease files (None: none are kept, and jobs
            run without the wrapper's lease stop; tests of the runner alone).
    """

    def __init__(
        self,
        journal: Journal,
        calls: ExecutionCalls,
        limits: RemoteLimits,
        *,
        clock_ms: Callable[[], int],
        session: Callable[[], tuple[str, str, int] | None],
        emit: Callable[[RecordEvent], None],
        isolate: Callable[[], str | None] = lambda: None,
        prepare: Callable[[], None] = lambda: None,
        random: Callable[[], float] = _random.random,
        wall_ms: Callable[[], int] = _clock.wall_ms,
        cluster: ClusterClock | None = None,
        runtime: RuntimeDirectory | None = None,
    ) -> None:
        self.journal = journal
        self.calls = calls
        self.limits = limits
        self.clock_ms = clock_ms
        self.wall_ms = wall_ms
        self.cluster = cluster or ClusterClock(None, boot_ms=clock_ms, wall_ms=wall_ms)
        self.runtime = runtime
        self.session = session
        self.emit = emit
        self._isolate = isolate
        self._prepare = prepare
        self._prepared = False
        self._random = random
        self._cgroups: CgroupManager | None = None

    # -- plumbing ------------------------------------------------------------------------------

    def cgroups(self) -> CgroupManager | None:
        if self._cgroups is None:
            self._cgroups = CgroupManager.detect(self.limits.cgroups, pids_max=self.limits.max_run_pids or None,
                                                 memory_max=self.limits.max_run_memory_bytes)
        return self._cgroups if self._cgroups.available else None

    def files(self, t: Track) -> JobFiles:
        return job_files(self.limits.log_directory, self.limits.receipt_directory, t.record)

    def _event(self, t: Track, name: str, **details: Any) -> None:
        self.emit(RecordEvent(name, t.record, details))

    def _write(self, t: Track, record: dict[str, Any], point: str, event: str | None = None, **details: Any) -> None:
        """One durable transition (the journal re-checks it against the stored record);
        ``record`` holds the current lease, so the journal catches up on renewals here."""
        t.record = self.journal.replace_offer(record, t.record["revision"])
        crashpoint(f"runner.{point}")
        if event is not None:
            self._event(t, event, **details)

    def _recover(self, t: Track, reason: str) -> None:
        self._write(t, to_recovery_required(t.record, self.wall_ms(), reason), "recovery_required",
                    "recovery_required", reason=reason)
        t.done = reason not in ("lease_lost_local_execution_unverified", "launch_outcome_unknown")

    def _lease(self, t: Track) -> dict[str, Any]:
        lease: dict[str, Any] = t.record["offer"]["lease"]
        return lease

    # -- the lease's local clock (spec README "Decisions for clocks") -------------------------

    def expiry_ms(self, t: Track) -> int:
        """The local lease expiry (boot ms). Unknown (a record found without its lease file
        or a send instant): ``expiresAtMs`` translated by the cluster's clock minus its
        error; without any clock sample, a third of the grant from now (the lease is then
        renewed at once, which gives it a send instant)."""
        if t.expiry_ms is None:
            lease, now = self._lease(t), self.clock_ms()
            local, error = self.cluster.cluster_to_boot(lease["expiresAtMs"]), self.cluster.error_ms(now)
            t.expiry_ms = local - error if local is not None and error is not None else now + t.duration_ms // 3
        return t.expiry_ms

    def _granted(self, t: Track, sent: int, renewed_at_ms: int, expires_at_ms: int) -> None:
        """A grant sent at boot instant ``sent``: its local expiry (the earlier of the send
        term and the translated term)."""
        t.sent_at_ms = sent
        t.duration_ms = max(0, expires_at_ms - renewed_at_ms)
        t.expiry_ms = local_lease_expiry_ms(sent, renewed_at_ms, expires_at_ms, self.cluster.sample,
                                            self.clock_ms())

    def _stop_plan(self, t: Track) -> tuple[int, int, int]:
        return lease_stop_plan(t.duration_ms, self.limits.terminate_grace_ms, self.limits.kill_grace_ms)

    def stop_at_ms(self, t: Track) -> int:
        """When a job whose lease was not renewed must start being stopped (boot ms), so that
        it is gone by the local expiry; before the launch, the expiry itself."""
        if t.state in LAUNCHED_STATES:
            return self.expiry_ms(t) - self._stop_plan(t)[0]
        return self.expiry_ms(t)

    def _renewal_due(self, t: Track) -> int:
        if not t.renewing:
            return self.expiry_ms(t)
        if t.renew_now or t.sent_at_ms is None:
            return t.due_ms if t.failures else self.clock_ms()  # learned from an offer or found: renew at once
        return renewal_due_ms(t.sent_at_ms, t.duration_ms, self.expiry_ms(t))

    def _deadline(self, t: Track) -> int | None:
        """The local timeout (boot ms): the starting answer's receive time + ``timeoutMs``;
        after a restart the launch instant of the lease file, else ``executorStartedAtMs``
        mapped onto the boot clock through the wall clock as it is now."""
        timeout = t.record["offer"]["executionRevision"].get("timeoutMs")
        if timeout is None or "executorStartedAtMs" not in t.record:
            return None
        base = t.starting_at_ms if t.starting_at_ms is not None else t.started_boot_ms
        if base is None:
            base = t.record["executorStartedAtMs"] - self.wall_ms() + self.clock_ms()
        return local_deadline_ms(timeout, starting_received_at_ms=max(0, base))

    def _retry(self, t: Track, exc: RemoteCallError) -> None:
        """Back off after a failed call: full jitter, never sooner than Retry-After, but
        strictly before the lease stop (a launched job) or the local lease expiry, leaving
        the retry time to be answered (T12 is only there when even that failed)."""
        t.failures += 1
        now = self.clock_ms()
        delay, _ = retry_delay_ms(t.failures, RETRY_BASE_MS, self._random(), exc.retry_after_ms)
        latest = self.stop_at_ms(t) - max(50, min(RETRY_LEAD_MS, t.duration_ms // 10))
        t.due_ms = max(now + 50, min(now + max(delay, 50), latest))
        self._event(t, "call_failed", retryAtMs=self.wall_ms() + (t.due_ms - now), **exc.to_json())

    def _session_replaced(self, t: Track) -> bool:
        worker = t.record["offer"]["worker"]
        return self.session() != (worker["workerId"], worker["sessionId"], worker["generation"])

    # -- the lease file (worker/remote/lease.py) --------------------------------------------------

    def restore(self, t: Track, sent_boot_ms: int | None = None) -> None:
        """Start tracking ``t``: its lease file of this boot (a newer lease than the
        journal's, its boot-clock times), else the offer POST's send instant when this
        process accepted it (``sent_boot_ms``); a lease learned from an offer answer or
        found without a file is renewed at once. Then the lease file is written."""
        if self.runtime is not None:
            found = read_job_lease(self.runtime, t.record, self.cluster.boot_id)
            lease = self._lease(t)
            if found is not None and found.lease_version >= lease["version"]:
                if found.lease_version > lease["version"]:
                    with_file = renewed_lease(lease, lease_version=found.lease_version,
                                              renewed_at_ms=found.renewed_at_ms, expires_at_ms=found.expires_at_ms)
                    t.record = with_lease(t.record, with_file)
                t.sent_at_ms, t.duration_ms, t.expiry_ms = found.sent_boot_ms, found.duration_ms, found.expires_boot_ms
                t.starting_at_ms, t.started_boot_ms = found.starting_boot_ms, found.started_boot_ms
                t.renew_now = found.sent_boot_ms is None
                return
        lease = self._lease(t)
        if sent_boot_ms is not None:
            self._granted(t, sent_boot_ms, lease["renewedAtMs"], lease["expiresAtMs"])
        t.renew_now = True
        self.store_lease(t)

    def store_lease(self, t: Track, *, required: bool = False) -> bool:
        """Write the record's lease file (RAM). A failure keeps the lease in memory, marks
        it to be written again at the next step and returns False; ``required`` (the
        launch: the wrapper needs it) raises the JournalError instead."""
        if self.runtime is None:
            return True
        plan, lease = self._stop_plan(t), self._lease(t)
        offer = t.record["offer"]
        expiry = self.expiry_ms(t)
        try:
            write_job_lease(self.runtime, JobLease(
                offer_id=offer["offerId"], attempt_id=offer["candidate"]["attemptId"],
                lease_generation=lease["leaseGeneration"], lease_version=lease["version"],
                renewed_at_ms=lease["renewedAtMs"], expires_at_ms=lease["expiresAtMs"],
                boot_id=self.cluster.boot_id, sent_boot_ms=t.sent_at_ms, duration_ms=t.duration_ms,
                expires_boot_ms=max(0, expiry), stop_at_boot_ms=max(0, expiry - plan[0]),
                terminate_grace_ms=plan[1], kill_grace_ms=plan[2], starting_boot_ms=t.starting_at_ms,
                started_boot_ms=t.started_boot_ms))
        except JournalError as exc:
            if required:
                raise
            if not t.lease_dirty:
                self._event(t, "storage_failed", code=exc.code, what="lease file")
            t.lease_dirty = True
            return False
        t.lease_dirty = False
        return True

    def lease_paths(self) -> Callable[[Track], tuple[str, str] | None]:
        def paths(t: Track) -> tuple[str, str] | None:
            if self.runtime is None:
                return None
            offer_id = t.offer_id
            return (f"{self.runtime.path}/{lease_name(offer_id)}", f"{self.runtime.path}/{stopped_name(offer_id)}")
        return paths

    def _stopped_by_wrapper(self, t: Track) -> bool:
        return self.runtime is not None and stopped_by_wrapper(self.runtime, t.offer_id)

    # -- lease-control (T11, G2, G15) --------------------------------------------------------

    def _renew(self, t: Track) -> str:
        """One lease-control (with the G2 retry): ``ok``, ``stop``, ``terminal`` or ``lost``.

        A renewal is a clock sample (``renewedAtMs``), gives the lease a new local expiry
        from its send instant, and is kept in memory and in the lease file (RAM), not in
        the journal; a newer version is taken even with an older ``renewedAtMs``.

        Raises:
            RemoteCallError: no usable answer (the record is unchanged).
        """
        offer = t.record["offer"]
        sent = self.clock_ms()
        expected = None
        try:
            result = self.calls.lease_control(offer)
        except RemoteCallError as exc:
            if exc.code != "call_fenced":
                raise
            expected = offer["lease"]["version"] + 1  # a renewal whose answer was lost (G2)
            sent = self.clock_ms()
            try:
                result = self.calls.lease_control(offer, expected_lease_version=expected)
            except RemoteCallError as again:
                if again.code != "call_fenced":
                    raise
                t.lease_lost = True
                t.stop_reason = t.stop_reason or "lease_lost"
                return "lost"
        received = self.clock_ms()
        crashpoint("runner.renewal_answered")
        if result.status == "terminal":
            t.cluster_terminal = True
            t.stop_reason = t.stop_reason or "terminal"
            return "terminal"
        version, renewed_at, expires = result.lease_version, result.renewed_at_ms, result.expires_at_ms
        assert version is not None and renewed_at is not None and expires is not None  # a renewing answer
        self.cluster.observe(renewed_at, sent, received, "lease_control")
        t.record = with_lease(t.record, renewed_lease(self._lease(t), lease_version=version,
                                                      renewed_at_ms=renewed_at, expires_at_ms=expires))
        self._granted(t, sent, renewed_at, expires)
        t.renew_now = False
        self.store_lease(t)
        crashpoint("runner.renewed")
        self._event(t, "renewed", leaseVersion=version, expiresAtMs=expires,
                    **({"resynced": True} if expected is not None else {}))
        if result.status == "stop_requested":
            if t.stop_reason is None or t.stop_reason == "timeout":
                if t.stop_reason is None:
                    self._event(t, "stop_requested", reason=result.stop_reason)
                t.stop_reason = result.stop_reason
            return "stop"
        return "ok"

    def _settled_before_launch(self, t: Track, outcome: str) -> bool:
        """A lost lease or a terminal run before anything ran: recorded at once (T12).
        A ``start_failed`` record's terminal run may be its own start failure (the answer
        was lost): start-failure is sent once more first (``already_terminal`` then)."""
        if outcome not in ("lost", "terminal") or t.state not in ("accepted", "starting_acknowledged", "start_failed"):
            return False
        if outcome == "terminal" and t.state == "start_failed" and not t.terminal_checked:
            t.terminal_checked = True
            return False
        self._recover(t, "lease_lost_local_execution_stopped" if outcome == "lost" else "control_plane_terminal")
        return True

    def _fenced_call(self, t: Track, operation: str, call: Callable[[], Any]) -> Any:
        """A call with G15: on its 409, lease-control once (which also resyncs a renewal
        whose answer was lost, G2) and ask again at once (None: the caller returns). The
        same call fenced again after that is the cluster refusing it for another reason
        (``replay_mismatch``, ``state_mismatch``): completion, artifacts, starting and
        start-failure then stop renewing (the lease runs out and T12 settles the record),
        running is given up (the completion will tell the cluster)."""
        try:
            result = call()
        except RemoteCallError as exc:
            if exc.code != "call_fenced":
                raise
            if operation in t.fenced:
                if operation == "running":
                    t.skip_running = True
                else:
                    t.renewing = False
                raise
            t.fenced.add(operation)
            outcome = self._renew(t)
            if t.state in ("accepted", "starting_acknowledged", "start_failed"):
                self._settled_before_launch(t, outcome)
            elif outcome in ("lost", "terminal") and (t.job is None or not t.job.running()):
                self._gone(t, t.job)
            t.due_ms = self.clock_ms()
            return None
        t.fenced.discard(operation)
        return result

    def _job(self, t: Track) -> RemoteJob | None:
        handle = t.record.get("executorHandle")
        if t.job is None and isinstance(handle, str):
            t.job = adopt(handle, self.cgroups(), t.record["offer"]["candidate"]["attemptId"])
            t.renew_now = t.renew_now or t.sent_at_ms is None  # no send instant known: renew at once
            if t.job is not None:
                self._event(t, "adopted", pid=t.job.identity.pid, running=t.job.running())
        return t.job

    def _gone(self, t: Track, job: RemoteJob | None) -> None:
        """Settle a launched record whose job is gone (:class:`~qinglong_edge.worker.remote.runner_end.RunnerEnd`)."""
        raise NotImplementedError
