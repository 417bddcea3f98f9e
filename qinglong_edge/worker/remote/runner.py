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

Decisions (spec README "Decisions for remote execution"; docs/worker/remote.md, "The life
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
"""

from __future__ import annotations

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
from qinglong_edge.crashpoints import crashpoint
from qinglong_edge.errors import ExecutionError, JournalError, RemoteCallError
from qinglong_edge.worker.remote.job import (
    LaunchFailure,
    RemoteJob,
    allocate_log,
    cgroup_name,
    launch,
    stop_job,
)
from qinglong_edge.worker.remote.job_files import remove_job_files
from qinglong_edge.worker.remote.runner_base import AGAIN_MS
from qinglong_edge.worker.remote.runner_end import RunnerEnd
from qinglong_edge.worker.remote.runner_state import Track

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any


__all__ = ["LAUNCH_MARGIN_MS", "Runner"]

#: Before launching, the lease must have at least this long left, else renew first (G3).
LAUNCH_MARGIN_MS = 10_000
_STORAGE_FATAL = frozenset({"not_owned", "ownership_compromised", "unsafe_storage", "invalid_configuration"})


class Runner(RunnerEnd):
    """Drives the records of one owned journal (module docstring; the constructor is
    :class:`~qinglong_edge.worker.remote.runner_base.RunnerBase`'s)."""

    # -- one step ------------------------------------------------------------------------------

    def step(self, t: Track) -> None:
        """Do what is due for ``t`` now (module docstring); set ``t.due_ms`` / ``t.done``.

        Raises:
            JournalError: storage that cannot be trusted (``ownership_compromised``...);
                ``storage_unavailable`` is retried after :data:`AGAIN_MS`.
            PullAborted: a signal; the record is as last written.
        """
        if t.lease_dirty:
            self.store_lease(t)  # a renewal the RAM could not take before: kept, written now
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
                self._event(t, "storage_failed", code=exc.code)
                return
            if t.done or before == (t.record["revision"], t.stop_reason, t.outcome is not None, t.done):
                return
            t.failures = 0

    def _step(self, t: Track) -> None:
        state, now = t.state, self.clock_ms()
        reason = t.record.get("recoveryReason")
        if state in ("completion_acknowledged", "start_failure_acknowledged"):
            t.done = True
        elif state == "recovery_required" and reason != "launch_outcome_unknown":
            self._unverified(t) if reason == "lease_lost_local_execution_unverified" else setattr(t, "done", True)
        elif state in ("accepted", "starting_acknowledged", "start_failed"):
            if now >= self.expiry_ms(t) or self._session_replaced(t):
                self._recover(t, "lease_lost_local_execution_stopped")  # T12, nothing runs
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
        due = self._renewal_due(t)
        if t.state == "starting_acknowledged":
            due = min(due, self.expiry_ms(t) - LAUNCH_MARGIN_MS)
        if now >= due and self._settled_before_launch(t, self._renew(t)):
            return False
        t.due_ms = min(self._renewal_due(t), self.expiry_ms(t))
        return True

    # -- before the launch -------------------------------------------------------------------

    def _t1(self, t: Track) -> None:
        result = self._fenced_call(t, "starting", lambda: self.calls.starting(t.record["offer"]))
        if result is None:
            return
        crashpoint("runner.starting_answered")
        if not self._starting_answer(t, result.status):
            return
        t.starting_at_ms = self.clock_ms()
        self._write(t, to_starting_acknowledged(t.record, self.wall_ms()), "starting_acknowledged",
                    "starting_acknowledged")

    def _starting_answer(self, t: Track, status: str) -> bool:
        if status == "already_running":
            self._recover(t, "control_plane_already_running")
            return False
        if status == "already_terminal":
            self._recover(t, "control_plane_terminal")
            return False
        return True

    def _launch(self, t: Track) -> None:
        """T2-T7, then T8 (module docstring)."""
        result = self._fenced_call(t, "starting", lambda: self.calls.starting(t.record["offer"]))
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
                files = self.files(t)
                allocate_log(self.limits, files)
            except (ContractError, LaunchFailure) as exc:
                self._start_failed(t, exc.code, detail=getattr(exc, "reason", exc.message))
                return
            finally:
                if secrets is not None:
                    secrets.wipe()
            now = self.wall_ms()
            self._write(t, to_launching(t.record, now, executor_started_at_ms=now, log_artifact_id=files.log_id,
                                        callback_sequence=sequence, callback_token_digest=token.digest),
                        "launching", "launching", logPath=files.log_path)
            t.started_boot_ms = self.clock_ms()
            try:
                self.store_lease(t, required=True)  # the wrapper reads it: no job runs unprotected
            except JournalError as exc:
                self._start_failed(t, "runtime_unavailable", detail=f"the lease file: {exc.message}")
                return
            try:
                held, cgroup = launch(t.record, files, plan=plan, environment=environment, token=token,
                                      limits=self.limits, cgroups=self.cgroups(), isolate=self._isolate(),
                                      lease_files=self.lease_paths()(t))
            except LaunchFailure as exc:
                self._start_failed(t, exc.code, detail=exc.message)
                return
        finally:
            token.wipe()
            if environment is not None:
                environment.wipe()
        crashpoint("runner.held")
        try:
            self._write(t, to_started(t.record, self.wall_ms(), executor_handle=held.handle), "started")
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
        self._event(t, "started", pid=held.pid, isolated=self._isolate() is not None)
        self._running(t)

    def _start_failed(self, t: Track, code: str, **details: Any) -> None:
        self._write(t, to_start_failed(t.record, self.wall_ms()), "start_failed", "start_failed", code=code, **details)

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
        result = self._fenced_call(t, "start-failure", lambda: self.calls.start_failure(t.record["offer"]))
        if result is None:
            return
        crashpoint("runner.start_failure_answered")
        if result.status == "already_running":
            self._recover(t, "control_plane_already_running")
            return
        self._write(t, to_start_failure_acknowledged(t.record, self.wall_ms()), "start_failure_acknowledged",
                    "start_failure_acknowledged", status=result.status)
        t.done = True
        remove_job_files(self.files(t))  # an empty log a wrapper opened at its barrier, a scratch directory

    # -- a launched job ----------------------------------------------------------------------

    def _running(self, t: Track) -> None:
        """T8 while the job runs (a 409: G15)."""
        if t.state != "started" or t.skip_running or t.job is None or not t.job.running():
            return
        record = t.record
        result = self._fenced_call(t, "running", lambda: self.calls.running(
            record["offer"], executor_handle=record["executorHandle"], log_artifact_id=record["logArtifactId"],
            callback_sequence=record["completionReceiptCallbackSequence"],
            callback_token_digest=record["completionReceiptTokenDigest"]))
        if result is None:
            return
        crashpoint("runner.running_answered")
        if result.status == "already_terminal":
            t.cluster_terminal = True
            t.stop_reason = t.stop_reason or "terminal"
            return
        self._write(t, to_running_acknowledged(t.record, self.wall_ms()), "running_acknowledged",
                    "running_acknowledged", status=result.status)

    def _supervise(self, t: Track) -> None:
        """A launched record: stop when asked, renew, T8, then complete once the job is gone.

        T12 for a job: from the lease stop's start (:meth:`stop_at_ms`, so that the job is
        gone by the local expiry) the lease counts as lost, and so it does when the job's
        wrapper stopped the job for its lease itself (its mark: this process was frozen or
        away); either ends the record ``recovery_required``, never a completion."""
        now = self.clock_ms()
        job = self._job(t)
        alive = job is not None and job.running()
        if not t.lease_lost and (self._stopped_by_wrapper(t) or now >= self.expiry_ms(t)
                                 or (alive and now >= self.stop_at_ms(t))):
            t.lease_lost = True  # T12
            t.stop_reason = "lease_lost"
        if alive and t.stop_reason is None:
            deadline = self._deadline(t)
            if deadline is not None and now >= deadline:
                t.stop_reason, t.ask_after_timeout = "timeout", True
        if alive and job is not None and t.stop_reason is not None:
            graces = self._stop_plan(t)[1:] if t.lease_lost else None
            result = stop_job(job, self.limits, graces)
            crashpoint("runner.stopped")
            self._event(t, "stopped", reason=t.stop_reason, result=result.status, signal=result.signal)
            alive = job.running()
            if alive or not result.conclusive:
                if t.lease_lost:
                    self._recover(t, "lease_lost_local_execution_unverified")
                    return
                t.due_ms = self.clock_ms() + AGAIN_MS
                return
        if not alive:
            if (t.outcome is not None and t.renewing and not t.lease_lost and not t.cluster_terminal
                    and now >= self._renewal_due(t)):
                # The job is gone but its end is not reported yet (storage or the network
                # failed): the lease must outlast that, so it is renewed as while it ran.
                self._renew(t)
            self._gone(t, job)
            return
        if t.state == "started":
            self._running(t)
            if t.stop_reason is not None:
                t.due_ms = self.clock_ms()
                return
        if self.clock_ms() >= self._renewal_due(t):
            self._renew(t)
            if t.stop_reason is not None:
                t.due_ms = self.clock_ms()
                return
        deadline = self._deadline(t)
        due = min(self._renewal_due(t), self.expiry_ms(t))
        t.due_ms = due if deadline is None else min(due, deadline)

