"""Executing one inbox record: T1-T12 of remote-execution.md 2.2 with our decisions.

:meth:`Runner.step` does what is due for one :class:`~qinglong_edge.worker.remote.runner_state.Track`
now and sets when to look again; every state change is one durable journal update
(``Journal.replace_offer``: fsync'd rename, revision + 1, the lease version never
decreasing) of a record produced by the pure steps of :mod:`qinglong_edge.contracts.inbox`,
which enforce the allowed transitions::

    accepted              T1  starting (fence7)                    -> starting_acknowledged
    starting_acknowledged T2  starting replay -> callbackSequence + 1
                          T3  32 random bytes -> callback token; secrets (only if bound);
                              the environment; the log (space guard) -- any failure:  -> start_failed
                          T5  the durable pre-spawn barrier        -> launching
                          T6  start_job: the wrapper, held         (refused: -> start_failed)
                          T7  the handle                           -> started, then release
    started               T8  running                              -> running_acknowledged
    launched              T11 lease-control at 1/3 of the grant; stop on stop_requested,
                              terminal, the local deadline, a lost lease, a forced discard
                          T10 job gone: receipt (authenticated) or what was observed ->
                              artifacts (streamed, sha256 checked) -> completion
                                                                   -> completion_acknowledged,
                                                                      then the files go
    start_failed          T9  start-failure                        -> start_failure_acknowledged
    any non-terminal      T12 the lease expired locally (or the session was replaced
                              before launch): stop what runs       -> recovery_required

Decisions (spec README "Decisions for remote execution"; docs/architecture.md, "The life
of a remote run"):

* ``target_ok`` before T1/T2: the record's session must be the current one (else T12).
* A 409 on starting, running, start-failure, artifacts or completion: lease-control once
  (G15); a 409 on lease-control: once more with ``expectedLeaseVersion + 1`` (G2: a lost
  renewal answer), then the lease counts as lost. A lost answer never fences in-flight work.
* Every other failure leaves the record unchanged and is retried with full-jitter backoff
  (never sooner than Retry-After) but never later than the local lease expiry, where T12
  takes over. Only the T3/T4 failures (secrets, environment, log) go to ``start_failed``.
* A starting replay (T2) answering ``already_terminal``/``already_running`` is recorded
  as such (the reference throws and waits for the lease to run out).
* ``launching`` found at a start (written by a process now dead) is a start failure: the
  start barrier proves the command never ran (the wrapper exits 125 when its agent dies
  before the release).
* Timeout: the local deadline (starting answer + ``timeoutMs``, after a restart
  ``executorStartedAtMs`` + ``timeoutMs``) stops the job; one lease-control before the
  completion lets the cluster record ``timed_out``.
* A stop request before the launch never launches: ``start_failed`` (cancelled on the cluster).

One class, three parts it composes: :class:`Runner` keeps the steps (T1-T9, the launch,
the supervision of a running job, the verified stop), the G15 rule for every call and the
retry schedule; :class:`~qinglong_edge.worker.remote.lease_keeper.LeaseKeeper` the lease's
local clock, its lease file and lease-control (G2);
:class:`~qinglong_edge.worker.remote.ending.Ending` the end of a launched job (outcome,
upload, completion T10); :class:`~qinglong_edge.worker.remote.runner_state.Transitions` the
journal writes and events all three share. What this process has established about a
record's fate is its track's phase (:mod:`qinglong_edge.worker.remote.runner_state`: ``live``
-> ``cluster_terminal`` -> ``last_call``, ``lease_lost``, ``done``).

Clocks: every timer is on the boot clock (``clock_ms``, ``CLOCK_BOOTTIME``); the wall
clock (``wall_ms``) only stamps the record's ``*AtMs`` fields people read; the cluster's
clock (:class:`~qinglong_edge.worker.delivery.cluster_clock.ClusterClock`) translates its
lease times and the completion's result times.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable

import qinglong_edge.clock as _clock
from qinglong_edge.contracts.activation import next_callback_sequence
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.inbox import (
    to_launching,
    to_running_acknowledged,
    to_start_failed,
    to_start_failure_acknowledged,
    to_started,
    to_starting_acknowledged,
)
from qinglong_edge.contracts.launch import launch_plan, materialize_environment
from qinglong_edge.contracts.receipt import new_callback_token
from qinglong_edge.contracts.residency import local_deadline_ms
from qinglong_edge.crashpoints import crashpoint
from qinglong_edge.errors import ExecutionError, JournalError, RemoteCallError
from qinglong_edge.process.cgroups import CgroupManager
from qinglong_edge.worker.delivery.cluster_clock import ClusterClock
from qinglong_edge.worker.delivery.pacing import retry_delay_ms
from qinglong_edge.worker.remote.calls import ExecutionCalls
from qinglong_edge.worker.remote.ending import Ending
from qinglong_edge.worker.remote.job import (
    LaunchFailure,
    RemoteJob,
    adopt,
    allocate_log,
    cgroup_name,
    launch,
    stop_job,
)
from qinglong_edge.worker.remote.job_files import RemoteLimits, remove_job_files
from qinglong_edge.worker.remote.lease_keeper import LeaseKeeper
from qinglong_edge.worker.remote.runner_state import (
    CLUSTER_TERMINAL,
    DONE,
    LAST_CALL,
    LEASE_LOST,
    LIVE,
    RecordEvent,
    Track,
    Transitions,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.worker.journal.runtime import RuntimeDirectory
    from qinglong_edge.worker.journal.store import Journal


__all__ = ["AGAIN_MS", "LAUNCH_MARGIN_MS", "RETRY_BASE_MS", "Runner"]

#: Before launching, the lease must have at least this long left, else renew first (G3).
LAUNCH_MARGIN_MS = 10_000
#: Base of the retry backoff of a failed call (doubles per failure, full jitter, <= 60 s).
RETRY_BASE_MS = 1000
#: How soon a stop that was not conclusive, or a storage failure, is tried again (ms).
AGAIN_MS = 1000
#: A retried call goes out at least this long (at most a tenth of the grant) before the
#: lease stop or expiry, so that it can still be answered in time.
RETRY_LEAD_MS = 2000
_STORAGE_FATAL = frozenset({"not_owned", "ownership_compromised", "unsafe_storage", "invalid_configuration"})


class Runner:
    """Drives the records of one owned journal (module docstring).

    Args:
        journal: the owned journal.
        calls: the seven calls on the pull's transport.
        limits: what remote jobs run under (:func:`~qinglong_edge.worker.remote.job_files.remote_limits`).
        clock_ms: the boot clock (ms): every timer.
        session: the current Worker Session as ``(workerId, sessionId, generation)``, or None.
        emit: called with each :class:`~qinglong_edge.worker.remote.runner_state.RecordEvent`.
        isolate: the PID level of the isolation jobs run in, or None when they are not
            isolated (asked once, at the first launch).
        prepare: called once before the first launch (the wrapper's program, cgroups).
        random: uniform [0, 1) for the backoff jitter.
        wall_ms: the wall clock, for the record's times (default ``clock.wall_ms``).
        cluster: the cluster's clock (default: one without a runtime directory).
        runtime: the runtime directory for the lease files (None: none are kept, and jobs
            run without the wrapper's lease stop; tests of the runner alone).

    Attributes:
        lease: its :class:`~qinglong_edge.worker.remote.lease_keeper.LeaseKeeper`
            (``restore``, ``expiry_ms``: what the resident loop asks of a track's lease).
        ending: its :class:`~qinglong_edge.worker.remote.ending.Ending`.
        transitions: the journal writes and events the parts share.
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
        self.calls = calls
        self.limits = limits
        self.clock_ms = clock_ms
        self.wall_ms = wall_ms
        self.session = session
        cluster = cluster or ClusterClock(None, boot_ms=clock_ms, wall_ms=wall_ms)
        self.transitions = Transitions(journal, emit, wall_ms)
        self.lease = LeaseKeeper(calls, limits, self.transitions, clock_ms=clock_ms, cluster=cluster,
                                 runtime=runtime)
        self.ending = Ending(calls, limits, self.transitions, self.lease, self.fenced_call, clock_ms=clock_ms,
                             wall_ms=wall_ms, cluster=cluster)
        self._isolate = isolate
        self._prepare = prepare
        self._prepared = False
        self._random = random
        self._cgroups: CgroupManager | None = None

    # -- what the steps share ----------------------------------------------------------------

    def cgroups(self) -> CgroupManager | None:
        """The remote jobs' cgroups (detected once), or None where there are none."""
        if self._cgroups is None:
            self._cgroups = CgroupManager.detect(self.limits.cgroups, pids_max=self.limits.max_run_pids or None,
                                                 memory_max=self.limits.max_run_memory_bytes)
        return self._cgroups if self._cgroups.available else None

    def _job(self, t: Track) -> RemoteJob | None:
        handle = t.record.get("executorHandle")
        if t.job is None and isinstance(handle, str):
            t.job = adopt(handle, self.cgroups(), t.record["offer"]["candidate"]["attemptId"])
            t.renew_now = t.renew_now or t.sent_at_ms is None  # no send instant known: renew at once
            if t.job is not None:
                self.transitions.event(t, "adopted", pid=t.job.identity.pid, running=t.job.running())
        return t.job

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
        latest = self.lease.stop_at_ms(t) - max(50, min(RETRY_LEAD_MS, t.duration_ms // 10))
        t.due_ms = max(now + 50, min(now + max(delay, 50), latest))
        self.transitions.event(t, "call_failed", retryAtMs=self.wall_ms() + (t.due_ms - now), **exc.to_json())

    def _session_replaced(self, t: Track) -> bool:
        worker = t.record["offer"]["worker"]
        return self.session() != (worker["workerId"], worker["sessionId"], worker["generation"])

    def _settled_before_launch(self, t: Track, outcome: str) -> bool:
        """A lost lease or a terminal run before anything ran: recorded at once (T12).
        A ``start_failed`` record's terminal run may be its own start failure (the answer
        was lost): start-failure is sent once more first (phase ``last_call``;
        ``already_terminal`` then)."""
        if outcome not in ("lost", "terminal") or t.state not in ("accepted", "starting_acknowledged", "start_failed"):
            return False
        if outcome == "terminal" and t.state == "start_failed" and t.phase == CLUSTER_TERMINAL:
            t.phase = LAST_CALL
            return False
        self.transitions.recover(t, "lease_lost_local_execution_stopped" if outcome == "lost"
                                 else "control_plane_terminal")
        return True

    def fenced_call(self, t: Track, operation: str, call: Callable[[], Any]) -> Any:
        """A call with G15: on its 409, lease-control once (which also resyncs a renewal
        whose answer was lost, G2) and ask again at once (None: the caller returns). The
        same call fenced again after that is the cluster refusing it for another reason
        (``replay_mismatch``, ``state_mismatch``): completion, artifacts, starting and
        start-failure then stop renewing (the lease runs out and T12 settles the record),
        running is given up (the completion will tell the cluster).

        Raises:
            RemoteCallError: the call failed otherwise, or was fenced again.
        """
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
            outcome = self.lease.renew(t)
            if t.state in ("accepted", "starting_acknowledged", "start_failed"):
                self._settled_before_launch(t, outcome)
            elif outcome in ("lost", "terminal") and (t.job is None or not t.job.running()):
                self.ending.gone(t, t.job)
            t.due_ms = self.clock_ms()
            return None
        t.fenced.discard(operation)
        return result

    # -- one step ------------------------------------------------------------------------------

    def step(self, t: Track) -> None:
        """Do what is due for ``t`` now (module docstring); set ``t.due_ms`` and its phase.

        Raises:
            JournalError: storage that cannot be trusted (``ownership_compromised``...);
                ``storage_unavailable`` is retried after :data:`AGAIN_MS`.
            PullAborted: a signal; the record is as last written.
        """
        if t.lease_dirty:
            self.lease.store(t)  # a renewal the RAM could not take before: kept, written now
        for _ in range(8):  # a few transitions in a row (T1 -> T8) without waiting
            before = (t.record["revision"], t.stop_reason, t.outcome is not None, t.done)
            try:
                self._step(t)
            except RemoteCallError as exc:
                self._retry(t, exc)
                return
            except JournalError as exc:
                if exc.code in _STORAGE_FATAL:
                    raise
                t.due_ms = self.clock_ms() + AGAIN_MS
                self.transitions.event(t, "storage_failed", code=exc.code)
                return
            if t.done or before == (t.record["revision"], t.stop_reason, t.outcome is not None, t.done):
                return
            t.failures = 0

    def _step(self, t: Track) -> None:
        state, now = t.state, self.clock_ms()
        reason = t.record.get("recoveryReason")
        if state in ("completion_acknowledged", "start_failure_acknowledged"):
            t.phase = DONE
        elif state == "recovery_required" and reason != "launch_outcome_unknown":
            if reason == "lease_lost_local_execution_unverified":
                self._unverified(t)
            else:
                t.phase = DONE
        elif state in ("accepted", "starting_acknowledged", "start_failed"):
            if now >= self.lease.expiry_ms(t) or self._session_replaced(t):
                self.transitions.recover(t, "lease_lost_local_execution_stopped")  # T12, nothing runs
            elif self._renew_if_due(t):
                {"accepted": self._t1, "starting_acknowledged": self._launch, "start_failed": self._t9}[state](t)
        elif state == "launching" and t.job is None:
            self._launching_found(t)
        else:
            self._supervise(t)

    def _renew_if_due(self, t: Track) -> bool:
        """Renew when due (and before a launch with less than 10 s left, G3); False when
        the record was moved on by the answer (recovery) and the caller must stop."""
        now = self.clock_ms()
        due = self.lease.renewal_due(t)
        if t.state == "starting_acknowledged":
            due = min(due, self.lease.expiry_ms(t) - LAUNCH_MARGIN_MS)
        if now >= due and self._settled_before_launch(t, self.lease.renew(t)):
            return False
        t.due_ms = min(self.lease.renewal_due(t), self.lease.expiry_ms(t))
        return True

    # -- before the launch -------------------------------------------------------------------

    def _t1(self, t: Track) -> None:
        result = self.fenced_call(t, "starting", lambda: self.calls.starting(t.record["offer"]))
        if result is None:
            return
        crashpoint("runner.starting_answered")
        if not self._starting_answer(t, result.status):
            return
        t.starting_at_ms = self.clock_ms()
        self.transitions.write(t, to_starting_acknowledged(t.record, self.wall_ms()), "starting_acknowledged",
                               "starting_acknowledged")

    def _starting_answer(self, t: Track, status: str) -> bool:
        if status == "already_running":
            self.transitions.recover(t, "control_plane_already_running")
            return False
        if status == "already_terminal":
            self.transitions.recover(t, "control_plane_terminal")
            return False
        return True

    def _launch(self, t: Track) -> None:
        """T2-T7, then T8 (module docstring)."""
        result = self.fenced_call(t, "starting", lambda: self.calls.starting(t.record["offer"]))
        if result is None:
            return
        crashpoint("runner.replay_answered")
        if not self._starting_answer(t, result.status):
            return
        try:
            sequence = next_callback_sequence(result)
        except ContractError as exc:
            raise RemoteCallError("starting", f"{exc.code} ({exc.reason if hasattr(exc, 'reason') else exc.code})",
                                  code="call_response_invalid", reason=getattr(exc, "reason", exc.code)) from None
        if t.starting_at_ms is None:
            t.starting_at_ms = self.clock_ms()
        if t.stop_reason is not None:  # cancelled (or timed out) before it ran: never launch it
            self._start_failed(t, "stop_requested", reason=t.stop_reason)
            return
        if not self._prepared:
            self._prepare()
            self._prepared = True
        token = new_callback_token()
        environment = None
        try:
            try:
                secrets = self.calls.secrets(t.record["offer"])
            except RemoteCallError as exc:
                details = exc.to_json()
                details["callCode"] = details.pop("code")
                self._start_failed(t, "secrets_failed", **details)
                return
            crashpoint("runner.secrets_received")
            try:
                plan = launch_plan(t.record["offer"])
                environment = materialize_environment(t.record["offer"], secrets)
                files = self.ending.files(t)
                allocate_log(self.limits, files)
            except (ContractError, LaunchFailure) as exc:
                self._start_failed(t, exc.code, detail=getattr(exc, "reason", exc.message))
                return
            finally:
                if secrets is not None:
                    secrets.wipe()
            now = self.wall_ms()
            launching = to_launching(t.record, now, executor_started_at_ms=now, log_artifact_id=files.log_id,
                                     callback_sequence=sequence, callback_token_digest=token.digest)
            self.transitions.write(t, launching, "launching", "launching", logPath=files.log_path)
            t.started_boot_ms = self.clock_ms()
            try:
                self.lease.store(t, required=True)  # the wrapper reads it: no job runs unprotected
            except JournalError as exc:
                self._start_failed(t, "runtime_unavailable", detail=f"the lease file: {exc.message}")
                return
            try:
                held, cgroup = launch(t.record, files, plan=plan, environment=environment, token=token,
                                      limits=self.limits, cgroups=self.cgroups(), isolate=self._isolate(),
                                      lease_files=self.lease.paths(t))
            except LaunchFailure as exc:
                self._start_failed(t, exc.code, detail=exc.message)
                return
        finally:
            token.wipe()
            if environment is not None:
                environment.wipe()
        crashpoint("runner.held")
        try:
            self.transitions.write(t, to_started(t.record, self.wall_ms(), executor_handle=held.handle), "started")
        except JournalError:
            held.abort()  # never released: the command did not run and never will
            if cgroup is not None:
                cgroup.remove()
            raise
        t.job = RemoteJob(held.handle, held.identity, held.process, cgroup)
        try:
            held.release()
        except ExecutionError:
            pass  # the wrapper is gone already: supervision completes it with its status (125)
        crashpoint("runner.released")
        self.transitions.event(t, "started", pid=held.pid, isolated=self._isolate() is not None)
        self._running(t)

    def _start_failed(self, t: Track, code: str, **details: Any) -> None:
        self.transitions.write(t, to_start_failed(t.record, self.wall_ms()), "start_failed", "start_failed", code=code,
                               **details)

    def _launching_found(self, t: Track) -> None:
        """``launching`` written by a dead process: the barrier proves nothing ran."""
        cgroups = self.cgroups()
        leftover = cgroups.open(cgroup_name(t.record["offer"]["candidate"]["attemptId"])) if cgroups else None
        if leftover is not None:
            try:
                leftover.kill()
            except ExecutionError:
                pass
            leftover.remove()
        self._start_failed(t, "launch_interrupted")

    def _t9(self, t: Track) -> None:
        result = self.fenced_call(t, "start-failure", lambda: self.calls.start_failure(t.record["offer"]))
        if result is None:
            return
        crashpoint("runner.start_failure_answered")
        if result.status == "already_running":
            self.transitions.recover(t, "control_plane_already_running")
            return
        self.transitions.write(t, to_start_failure_acknowledged(t.record, self.wall_ms()),
                               "start_failure_acknowledged", "start_failure_acknowledged", status=result.status)
        t.phase = DONE
        remove_job_files(self.ending.files(t))  # an empty log a wrapper opened at its barrier, a scratch directory

    # -- a launched job ----------------------------------------------------------------------

    def _running(self, t: Track) -> None:
        """T8 while the job runs (a 409: G15)."""
        if t.state != "started" or t.skip_running or t.job is None or not t.job.running():
            return
        record = t.record
        result = self.fenced_call(t, "running", lambda: self.calls.running(
            record["offer"], executor_handle=record["executorHandle"], log_artifact_id=record["logArtifactId"],
            callback_sequence=record["completionReceiptCallbackSequence"],
            callback_token_digest=record["completionReceiptTokenDigest"]))
        if result is None:
            return
        crashpoint("runner.running_answered")
        if result.status == "already_terminal":
            t.run_terminal()
            return
        self.transitions.write(t, to_running_acknowledged(t.record, self.wall_ms()), "running_acknowledged",
                               "running_acknowledged", status=result.status)

    def _supervise(self, t: Track) -> None:
        """A launched record: stop when asked, renew, T8, then complete once the job is gone.

        T12 for a job: from the lease stop's start
        (:meth:`~qinglong_edge.worker.remote.lease_keeper.LeaseKeeper.stop_at_ms`, so that the
        job is gone by the local expiry) the lease counts as lost (phase ``lease_lost``), and so it does when the job's
        wrapper stopped the job for its lease itself (its mark: this process was frozen or
        away); either ends the record ``recovery_required``, never a completion."""
        now = self.clock_ms()
        job = self._job(t)
        alive = job is not None and job.running()
        if t.phase != LEASE_LOST and (self.lease.stopped_by_wrapper(t) or now >= self.lease.expiry_ms(t)
                                      or (alive and now >= self.lease.stop_at_ms(t))):
            t.lose_lease()  # T12
            t.stop_reason = "lease_lost"
        if alive and t.stop_reason is None:
            deadline = self._deadline(t)
            if deadline is not None and now >= deadline:
                t.stop_reason, t.ask_after_timeout = "timeout", True
        if alive and job is not None and t.stop_reason is not None:
            graces = self.lease.stop_plan(t)[1:] if t.phase == LEASE_LOST else None
            result = stop_job(job, self.limits, graces)
            crashpoint("runner.stopped")
            self.transitions.event(t, "stopped", reason=t.stop_reason, result=result.status, signal=result.signal)
            alive = job.running()
            if alive or not result.conclusive:
                if t.phase == LEASE_LOST:
                    self.transitions.recover(t, "lease_lost_local_execution_unverified")
                    return
                t.due_ms = self.clock_ms() + AGAIN_MS
                return
        if not alive:
            if (t.outcome is not None and t.renewing and t.phase == LIVE
                    and now >= self.lease.renewal_due(t)):
                # The job is gone but its end is not reported yet (storage or the network
                # failed): the lease must outlast that, so it is renewed as while it ran.
                self.lease.renew(t)
            self.ending.gone(t, job)
            return
        if t.state == "started":
            self._running(t)
            if t.stop_reason is not None:
                t.due_ms = self.clock_ms()
                return
        if self.clock_ms() >= self.lease.renewal_due(t):
            self.lease.renew(t)
            if t.stop_reason is not None:
                t.due_ms = self.clock_ms()
                return
        deadline = self._deadline(t)
        due = min(self.lease.renewal_due(t), self.lease.expiry_ms(t))
        t.due_ms = due if deadline is None else min(due, deadline)


    def _unverified(self, t: Track) -> None:
        """``lease_lost_local_execution_unverified``: stop until the job is verified gone."""
        job = self._job(t)
        if job is None or not job.running():
            if job is not None:
                job.finish(self.limits)
            self.transitions.event(t, "process_gone")
            t.phase = DONE
            return
        result = stop_job(job, self.limits)
        self.transitions.event(t, "stopped", reason="lease_lost", result=result.status, signal=result.signal)
        t.due_ms = self.clock_ms() + AGAIN_MS
