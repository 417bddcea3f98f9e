"""Executing one inbox record: T1-T12 of remote-execution.md 2.2 with our decisions.

:meth:`Runner.step` does what is due for one :class:`~qinglong_edge.worker.runner_state.Track`
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
"""

from __future__ import annotations

import os
import random as _random
from collections.abc import Callable

from qinglong_edge.contracts.activation import next_callback_sequence
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.inbox import (
    to_completion_acknowledged,
    to_launching,
    to_recovery_required,
    to_running_acknowledged,
    to_start_failed,
    to_start_failure_acknowledged,
    to_started,
    to_starting_acknowledged,
    with_renewed_lease,
)
from qinglong_edge.contracts.launch import launch_plan, materialize_environment
from qinglong_edge.contracts.receipt import new_callback_token
from qinglong_edge.contracts.residency import local_deadline_ms, local_lease_expiry_ms, renewal_due_ms
from qinglong_edge.errors import ExecutionError, JournalError, RemoteCallError
from qinglong_edge.process.cgroups import CgroupManager
from qinglong_edge.worker.calls import ExecutionCalls
from qinglong_edge.worker.crashpoints import crashpoint
from qinglong_edge.worker.pacing import retry_delay_ms
from qinglong_edge.worker.remote_files import JobFiles, RemoteLimits, job_files, remove_job_files
from qinglong_edge.worker.remote_job import (
    LaunchFailure,
    RemoteJob,
    adopt,
    allocate_log,
    cgroup_name,
    launch,
    open_log,
    read_outcome,
    read_truncated,
    stop_job,
)
from qinglong_edge.worker.runner_state import RecordEvent, Track

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.worker.journal import Journal

__all__ = ["RETRY_BASE_MS", "Runner"]


def _file_sha256(fd: int, size: int) -> str:
    """SHA-256 (hex) of the first ``size`` bytes of ``fd``, 64 KiB at a time."""
    from qinglong_edge.contracts.digest import sha256

    hasher, offset = sha256(), 0
    while offset < size:
        chunk = os.pread(fd, min(65536, size - offset), offset)
        if not chunk:
            break
        hasher.update(chunk)
        offset += len(chunk)
    return hasher.hexdigest()

#: Base of the retry backoff of a failed call (doubles per failure, full jitter, <= 60 s).
RETRY_BASE_MS = 1000
#: How soon a stop that was not conclusive, or a storage failure, is tried again (ms).
AGAIN_MS = 1000
#: Before launching, the lease must have at least this long left, else renew first (G3).
LAUNCH_MARGIN_MS = 10_000
_STORAGE_FATAL = frozenset({"not_owned", "ownership_compromised", "unsafe_storage", "invalid_configuration"})


class Runner:
    """Drives the records of one owned journal (module docstring).

    Args:
        journal: the owned journal.
        calls: the seven calls on the pull's transport.
        limits: what remote jobs run under (:func:`~qinglong_edge.worker.remote_files.remote_limits`).
        clock_ms: wall-clock ms.
        session: the current Worker Session as ``(workerId, sessionId, generation)``, or None.
        emit: called with each :class:`RecordEvent`.
        isolate: whether jobs run isolated (asked once, at the first launch).
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
        isolate: Callable[[], bool] = lambda: False,
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
            self._cgroups = CgroupManager.detect(self.limits.cgroups, pids_max=self.limits.max_run_pids or None)
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

    # -- one step ------------------------------------------------------------------------------

    def step(self, t: Track) -> None:
        """Do what is due for ``t`` now (module docstring); set ``t.due_ms`` / ``t.done``.

        Raises:
            JournalError: storage that cannot be trusted (``ownership_compromised``...);
                ``storage_unavailable`` is retried after :data:`AGAIN_MS`.
            PullAborted: a signal; the record is as last written.
        """
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

    # -- lease-control (T11, G2, G15) --------------------------------------------------------

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

    # -- before the launch -------------------------------------------------------------------

    def _t1(self, t: Track) -> None:
        result = self._fenced_call(t, "starting", lambda: self.calls.starting(t.record["offer"]))
        if result is None:
            return
        crashpoint("runner.starting_answered")
        if not self._starting_answer(t, result.status):
            return
        t.starting_at_ms = self.clock_ms()
        self._write(t, to_starting_acknowledged(t.record, self.clock_ms()), "starting_acknowledged",
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
            now = self.clock_ms()
            self._write(t, to_launching(t.record, now, executor_started_at_ms=now, log_artifact_id=files.log_id,
                                        callback_sequence=sequence, callback_token_digest=token.digest),
                        "launching", "launching", logPath=files.log_path)
            try:
                held, cgroup = launch(t.record, files, plan=plan, environment=environment, token=token,
                                      limits=self.limits, cgroups=self.cgroups(), isolate=self._isolate())
            except LaunchFailure as exc:
                self._start_failed(t, exc.code, detail=exc.message)
                return
        finally:
            token.wipe()
            if environment is not None:
                environment.wipe()
        crashpoint("runner.held")
        try:
            self._write(t, to_started(t.record, self.clock_ms(), executor_handle=held.handle), "started")
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
        self._event(t, "started", pid=held.pid, isolated=self._isolate())
        self._running(t)

    def _start_failed(self, t: Track, code: str, **details: Any) -> None:
        self._write(t, to_start_failed(t.record, self.clock_ms()), "start_failed", "start_failed", code=code, **details)

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
        self._write(t, to_start_failure_acknowledged(t.record, self.clock_ms()), "start_failure_acknowledged",
                    "start_failure_acknowledged", status=result.status)
        t.done = True
        remove_job_files(self.files(t))  # an empty log a wrapper opened at its barrier, a scratch directory

    # -- a launched job ----------------------------------------------------------------------

    def _job(self, t: Track) -> RemoteJob | None:
        handle = t.record.get("executorHandle")
        if t.job is None and isinstance(handle, str):
            t.job = adopt(handle, self.cgroups(), t.record["offer"]["candidate"]["attemptId"])
            t.renew_now = t.sent_at_ms is None  # the lease's send time died with the last process
            if t.job is not None:
                self._event(t, "adopted", pid=t.job.identity.pid, running=t.job.running())
        return t.job

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
        self._write(t, to_running_acknowledged(t.record, self.clock_ms()), "running_acknowledged",
                    "running_acknowledged", status=result.status)

    def _supervise(self, t: Track) -> None:
        """A launched record: stop when asked, renew, T8, then complete once the job is gone."""
        now = self.clock_ms()
        job = self._job(t)
        alive = job is not None and job.running()
        if now >= self.expiry_ms(t) and not t.lease_lost:
            t.lease_lost = True  # T12
            t.stop_reason = "lease_lost"
        if alive and t.stop_reason is None:
            deadline = self._deadline(t)
            if deadline is not None and now >= deadline:
                t.stop_reason, t.ask_after_timeout = "timeout", True
        if alive and job is not None and t.stop_reason is not None:
            result = stop_job(job, self.limits)
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

    def _gone(self, t: Track, job: RemoteJob | None) -> None:
        """The job is gone (or there never was one to see): settle the record."""
        if t.lease_lost:
            if job is not None:
                job.finish()
            self._recover(t, "lease_lost_local_execution_stopped")
            return
        if t.cluster_terminal and (t.outcome is None or t.terminal_checked):
            if job is not None:
                job.finish()
            self._recover(t, "control_plane_terminal")
            return
        files = self.files(t)
        if t.outcome is None:
            if job is None and t.state == "recovery_required":
                # launch_outcome_unknown without a handle: complete only from a receipt.
                from qinglong_edge.process.logs import read_receipt

                if read_receipt(files.receipt_path) is None:
                    t.due_ms = self.expiry_ms(t)
                    return
            t.outcome = read_outcome(t.record, files, job, self.clock_ms())
            if job is not None:
                job.finish()
            crashpoint("runner.exited")
            self._event(t, "exited", **t.outcome.to_json())
        if t.ask_after_timeout:
            outcome = self._renew(t)  # the cluster records timed_out (its deadline passed too)
            t.ask_after_timeout = False
            if outcome in ("lost", "terminal"):
                self._gone(t, None)
                return
        self._complete(t, files)

    def _complete(self, t: Track, files: JobFiles) -> None:
        """T10: upload the log (once per process), then completion.

        A fenced upload asks lease-control first: a lease one renewal behind (G2) is
        resynced and the upload sent again; a lease already over with a terminal run may
        be ours -- a completion whose answer was lost -- so the completion is sent once
        with our own digest of the log (the cluster answers ``already_completed`` when it
        holds exactly this outcome) before the record is closed as ``control_plane_terminal``.
        """
        offer = t.record["offer"]
        if t.artifact is None:
            fd = open_log(files)
            try:
                size = os.fstat(fd).st_size
                truncated = read_truncated(files, t.record, self.limits.max_log_bytes)
                try:
                    stored = self.calls.upload(offer, log_artifact_id=files.log_id, source=fd, byte_length=size,
                                               truncated=truncated)
                except RemoteCallError as exc:
                    if exc.code != "call_fenced":
                        raise
                    answer = self._renew(t)
                    if answer in ("ok", "stop"):
                        t.due_ms = self.clock_ms()  # resynced: upload again at once
                        return
                    if answer == "lost":
                        self._recover(t, "lease_lost_local_execution_stopped")
                        return
                    t.terminal_checked = True
                    t.artifact = (size, _file_sha256(fd, size), truncated)
                else:
                    t.artifact = (size, stored.sha256, truncated)
                    crashpoint("runner.uploaded")
                    self._event(t, "uploaded", byteLength=size, sha256=stored.sha256, truncated=truncated,
                                status=stored.status)
            finally:
                os.close(fd)
        size, digest, truncated = t.artifact
        outcome = t.outcome
        assert outcome is not None
        record = t.record
        started = record["executorStartedAtMs"]

        def send() -> Any:
            return self.calls.completion(
                offer, callback_sequence=record["completionReceiptCallbackSequence"],
                callback_token_digest=record["completionReceiptTokenDigest"], started_at_ms=started,
                finished_at_ms=max(started, outcome.finished_at_ms), exit_code=outcome.exit_code,
                log_artifact_id=files.log_id, byte_length=size, sha256=digest, truncated=truncated)

        if t.terminal_checked:
            try:
                result = send()
            except RemoteCallError as exc:
                if exc.code != "call_fenced":
                    raise
                self._recover(t, "control_plane_terminal")
                return
        else:
            result = self._fenced_call(t, "completion", send)
            if result is None:
                return
        crashpoint("runner.completion_answered")
        if result.status == "already_terminal":
            self._recover(t, "control_plane_terminal")
            return
        self._write(t, to_completion_acknowledged(t.record, self.clock_ms()), "completion_acknowledged",
                    "completion_acknowledged", status=result.status, exitCode=outcome.exit_code)
        t.done = True
        remove_job_files(files)
        crashpoint("runner.files_removed")

    def _unverified(self, t: Track) -> None:
        """``lease_lost_local_execution_unverified``: stop until the job is verified gone."""
        job = self._job(t)
        if job is None or not job.running():
            if job is not None:
                job.finish()
            self._event(t, "process_gone")
            t.done = True
            return
        result = stop_job(job, self.limits)
        self._event(t, "stopped", reason="lease_lost", result=result.status, signal=result.signal)
        t.due_ms = self.clock_ms() + AGAIN_MS
