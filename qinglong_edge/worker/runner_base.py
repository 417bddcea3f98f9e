"""The plumbing of the runner: durable transitions, events, the lease clocks, retries and
lease-control with its G2 / G15 rules (spec README "Lease clocks", "Later calls' errors").

Split from :mod:`qinglong_edge.worker.runner` (the steps T1-T12, whose docstring gives the
decisions) and :mod:`qinglong_edge.worker.runner_end` (the end of a launched job); one
class hierarchy: ``RunnerBase`` <- ``RunnerEnd`` <- ``Runner``.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable

from qinglong_edge.contracts.inbox import to_recovery_required, with_renewed_lease
from qinglong_edge.contracts.residency import local_deadline_ms, local_lease_expiry_ms, renewal_due_ms
from qinglong_edge.errors import RemoteCallError
from qinglong_edge.process.cgroups import CgroupManager
from qinglong_edge.worker.calls import ExecutionCalls
from qinglong_edge.worker.crashpoints import crashpoint
from qinglong_edge.worker.pacing import retry_delay_ms
from qinglong_edge.worker.remote_files import JobFiles, RemoteLimits, job_files
from qinglong_edge.worker.remote_job import RemoteJob, adopt
from qinglong_edge.worker.runner_state import RecordEvent, Track

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.worker.journal import Journal

__all__ = ["AGAIN_MS", "RETRY_BASE_MS", "RunnerBase"]

#: Base of the retry backoff of a failed call (doubles per failure, full jitter, <= 60 s).
RETRY_BASE_MS = 1000
#: How soon a stop that was not conclusive, or a storage failure, is tried again (ms).
AGAIN_MS = 1000


class RunnerBase:
    """The plumbing of :class:`~qinglong_edge.worker.runner.Runner`: journal writes, events, lease
    clocks, retries, lease-control with its G2/G15 rules (worker/runner.py docstring).

    Args:
        journal: the owned journal.
        calls: the seven calls on the pull's transport.
        limits: what remote jobs run under (:func:`~qinglong_edge.worker.remote_files.remote_limits`).
        clock_ms: wall-clock ms.
        session: the current Worker Session as ``(workerId, sessionId, generation)``, or None.
        emit: called with each :class:`RecordEvent`.
        isolate: the PID level of the isolation jobs run in, or None when they are not
            isolated (asked once, at the first launch).
        prepare: called once before the first launch (the wrapper's program, cgroups).
        random: uniform [0, 1) for the backoff jitter.
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
    ) -> None:
        self.journal = journal
        self.calls = calls
        self.limits = limits
        self.clock_ms = clock_ms
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
        """One durable transition (the journal re-checks it against the stored record)."""
        t.record = self.journal.replace_offer(record, t.record["revision"])
        crashpoint(f"runner.{point}")
        if event is not None:
            self._event(t, event, **details)

    def _recover(self, t: Track, reason: str) -> None:
        self._write(t, to_recovery_required(t.record, self.clock_ms(), reason), "recovery_required",
                    "recovery_required", reason=reason)
        t.done = reason not in ("lease_lost_local_execution_unverified", "launch_outcome_unknown")

    def _lease(self, t: Track) -> dict[str, Any]:
        lease: dict[str, Any] = t.record["offer"]["lease"]
        return lease

    def expiry_ms(self, t: Track) -> int:
        lease = self._lease(t)
        return local_lease_expiry_ms(lease["expiresAtMs"], lease["renewedAtMs"], t.sent_at_ms)

    def _renewal_due(self, t: Track) -> int:
        lease = self._lease(t)
        if not t.renewing:
            return self.expiry_ms(t)
        if t.renew_now:
            return t.due_ms if t.failures else self.clock_ms()  # adopted: renew at once (a fresh send time)
        return renewal_due_ms(lease["expiresAtMs"], lease["renewedAtMs"], t.sent_at_ms)

    def _deadline(self, t: Track) -> int | None:
        timeout = t.record["offer"]["executionRevision"].get("timeoutMs")
        if timeout is None or "executorStartedAtMs" not in t.record:
            return None
        return local_deadline_ms(timeout, starting_received_at_ms=t.starting_at_ms,
                                 executor_started_at_ms=t.record["executorStartedAtMs"])

    def _retry(self, t: Track, exc: RemoteCallError) -> None:
        """Back off after a failed call, never past the local lease expiry (T12 is there)."""
        t.failures += 1
        now = self.clock_ms()
        delay, _ = retry_delay_ms(t.failures, RETRY_BASE_MS, self._random(), exc.retry_after_ms)
        t.due_ms = max(now + 50, min(now + max(delay, 50), self.expiry_ms(t)))
        self._event(t, "call_failed", retryAtMs=t.due_ms, **exc.to_json())

    def _session_replaced(self, t: Track) -> bool:
        worker = t.record["offer"]["worker"]
        return self.session() != (worker["workerId"], worker["sessionId"], worker["generation"])

    # -- lease-control (T11, G2, G15) --------------------------------------------------------

    def _renew(self, t: Track) -> str:
        """One lease-control (with the G2 retry): ``ok``, ``stop``, ``terminal`` or ``lost``.

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
            try:
                result = self.calls.lease_control(offer, expected_lease_version=expected)
            except RemoteCallError as again:
                if again.code != "call_fenced":
                    raise
                t.lease_lost = True
                t.stop_reason = t.stop_reason or "lease_lost"
                return "lost"
        crashpoint("runner.renewal_answered")
        if result.status == "terminal":
            t.cluster_terminal = True
            t.stop_reason = t.stop_reason or "terminal"
            return "terminal"
        version, renewed_at, expires = result.lease_version, result.renewed_at_ms, result.expires_at_ms
        assert version is not None and renewed_at is not None and expires is not None  # a renewing answer
        renewed = with_renewed_lease(t.record, lease_version=version, renewed_at_ms=renewed_at, expires_at_ms=expires)
        self._write(t, renewed, "renewed", "renewed", leaseVersion=result.lease_version,
                    expiresAtMs=result.expires_at_ms, **({"resynced": True} if expected is not None else {}))
        t.sent_at_ms = sent
        t.renew_now = False
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
            t.renew_now = t.sent_at_ms is None  # the lease's send time died with the last process
            if t.job is not None:
                self._event(t, "adopted", pid=t.job.identity.pid, running=t.job.running())
        return t.job

    def _gone(self, t: Track, job: RemoteJob | None) -> None:
        """Settle a launched record whose job is gone (:class:`~qinglong_edge.worker.runner_end.RunnerEnd`)."""
        raise NotImplementedError
