"""Activation (starting / running / start-failure), lease-control and the cluster-side
cancel of the cluster double (tests and the demo only).

Server behaviour of remote-execution.md 3.1-3.3 and 3.5, checked against the reference
(whyour/qinglong at c699c32): the pipeline's key-set checks
(``packages/ql3-cluster-control/src/worker-ingress/workerIngressPipeline.ts``), the
command rules of ``packages/ql3-runtime-core/src/remote-execution/remoteRunActivation.ts``
and ``remoteWorkerLeaseControl.ts`` (any violation: TypeError/RangeError -> 400
``invalid_worker_request``), and the transactions of
``packages/ql3-cluster-postgres/src/remote-execution/remoteRunActivationRepository.ts`` and
``remoteWorkerLeaseControlRepository.ts``:

* **starting**: live authority (session, aggregate, lease projection, ``leased`` at the
  expected version, unexpired); attempt ``starting`` -> ``already_starting``; ``running``
  -> ``already_running``; else it must be ``claimed`` (``attempt_state_mismatch``) with
  the run ``dispatching`` (``run_state_mismatch``): the attempt becomes ``starting``,
  ``deadline_at_ms = now + timeoutMs`` (or none), run version + 1, event
  ``attempt.starting`` -> ``applied``. The lease version does not change; a terminal
  attempt fails the lease check (``version_mismatch``), never ``already_terminal``.
* **running**: already ``running`` with identical handle, logArtifactId, sequence and
  digest -> ``already_running``, any difference ``replay_mismatch``; else ``starting``
  + ``dispatching`` + ``callbackSequence == stored + 1`` (``replay_mismatch``) -> both
  ``running``, handle/logArtifactId/sequence/digest stored, ``started_at_ms = now``, run
  version + 2, events ``attempt.running`` and ``run.running``.
* **start-failure**: the lease may already be ``completed`` at ``expected + 1`` (a
  replay): the same terminal mapping -> ``already_terminal``, another ->
  ``replay_mismatch``. Else live lease, attempt ``starting`` and run ``dispatching``: the
  lease becomes ``completed`` at version + 1, callback sequence + 1, attempt and run
  ``failed`` (``EXECUTOR_START_FAILED``), or ``cancelled`` (``EXECUTION_CANCELLED``) /
  ``timed_out`` (``EXECUTION_TIMED_OUT``) when a cancel was requested.
* **lease-control**: identity (``missing`` first, then the session, run, project,
  worker, lease generation, token, offer); attempt *or* run terminal: both terminal,
  equal, lease ``completed`` -> ``terminal`` (no version check), else
  ``state_mismatch``; then ``leased`` at the expected version (``version_mismatch``),
  unexpired (``lease_expired``), attempt ``claimed|starting|running`` with run
  ``dispatching|running`` (running iff running, else ``state_mismatch``). A deadline
  reached with no cancel intent becomes one: ``cancel_reason = timeout``, event
  ``run.cancel_requested`` by ``system``/``runtime:timeout``. Then renew: version + 1,
  ``renewed_at_ms = now``, ``expires_at_ms = now + lease_duration_ms``; the answer is
  ``stop_requested`` with ``{reason, requestedAtMs}`` while a cancel intent exists
  (every later call repeats it), else ``renewed``.
* **cancel** (the operator's side, ``clusterRunCancellation.ts``): ``accepted`` records
  the intent (event ``run.cancel_requested``), ``already_requested`` keeps the first
  one, ``already_terminal`` for a finished run.
"""

from __future__ import annotations

from typing import Any

from tests.support.cluster_attempts import (
    FENCE7,
    STOP_REASONS,
    TERMINAL,
    Attempt,
    Fence,
    Ledger,
    activation_snapshot,
    parse_fence,
)
from tests.support.cluster_wire import INT31, Failure, dispatch_id, exact_keys, js_int

__all__ = ["ACTIVATION_SCHEMA", "LEASE_CONTROL_SCHEMA", "lease_control", "request_cancel", "running",
           "start_failure", "starting"]

ACTIVATION_SCHEMA = "qinglong/remote-run-activation@v1"
LEASE_CONTROL_SCHEMA = "qinglong/remote-worker-lease-control@v1"
RUNNING_KEYS = (*FENCE7, "executorHandle", "logArtifactId", "callbackSequence", "callbackTokenDigest")
LEASE_CONTROL_KEYS = ("schema", "workerGeneration", "projectId", "runId", "attemptId", "offerId", "leaseGeneration",
                      "leaseToken", "expectedLeaseVersion")
_HEX64 = frozenset("0123456789abcdef")


def _answer(status: str, attempt: Attempt) -> dict[str, Any]:
    return {"schema": ACTIVATION_SCHEMA, "status": status, "snapshot": activation_snapshot(attempt)}


def _activation_fence(worker_id: str, session_id: str, body: dict[str, Any]) -> Fence:
    try:
        return parse_fence(worker_id, session_id, body, id_max=36)
    except TypeError:
        raise Failure(400, "invalid_worker_request") from None


def _live(ledger: Ledger, op: str, fence: Fence, now: int, *, completed_replay: bool = False) -> Attempt:
    """``assertLiveAuthority`` (``completed_replay``: start-failure's projection, which lets a
    lease ``completed`` at ``expected + 1`` through, and checks no expiry then)."""
    reason = ledger.session_reason(fence, now)
    if reason is not None:
        raise ledger.fence(op, reason, fence)
    attempt = ledger.aggregate(fence)
    if attempt is None:
        raise ledger.fence(op, "missing", fence)
    reason = ledger.identity_reason(attempt, fence)
    if reason is not None:
        raise ledger.fence(op, reason, fence)
    lease = attempt.lease
    if completed_replay and lease.status == "completed" and lease.version == fence.expected_lease_version + 1:
        return attempt
    reason = ledger.live_lease_reason(attempt, fence, now)
    if reason is not None:
        raise ledger.fence(op, reason, fence)
    return attempt


def _payload(attempt: Attempt, **fields: Any) -> dict[str, Any]:
    return {"attempt_id": attempt.attempt_id, "lease_generation": attempt.lease.lease_generation,
            "execution_scope": "run", **fields}


def starting(ledger: Ledger, worker_id: str, session_id: str, document: object) -> dict[str, Any]:
    """POST starting (remote-execution.md 3.1)."""
    fence = _activation_fence(worker_id, session_id, exact_keys(document, FENCE7))
    now = ledger.clock_ms()
    attempt = _live(ledger, "starting", fence, now)
    if attempt.status == "starting":
        if attempt.run_status != "dispatching":
            raise ledger.fence("starting", "run_state_mismatch", fence)
        return _answer("already_starting", attempt)
    if attempt.status == "running":
        if attempt.run_status != "running":
            raise ledger.fence("starting", "run_state_mismatch", fence)
        return _answer("already_running", attempt)
    if attempt.status != "claimed":
        raise ledger.fence("starting", "attempt_state_mismatch", fence)
    if attempt.run_status != "dispatching":
        raise ledger.fence("starting", "run_state_mismatch", fence)
    timeout_ms = attempt.revision.get("timeoutMs")
    attempt.status = "starting"
    attempt.deadline_at_ms = None if timeout_ms is None else now + int(timeout_ms)
    attempt.run_version += 1
    attempt.add_event("attempt.starting", f"remote-activation:{attempt.attempt_id}:{fence.lease_generation}:starting",
                      _payload(attempt, from_status="claimed", to_status="starting",
                               deadline_at_ms=attempt.deadline_at_ms), now)
    return _answer("applied", attempt)


def running(ledger: Ledger, worker_id: str, session_id: str, document: object) -> dict[str, Any]:
    """POST running (remote-execution.md 3.3)."""
    body = exact_keys(document, RUNNING_KEYS)
    log_artifact_id = body["logArtifactId"]
    if log_artifact_id is not None and not isinstance(log_artifact_id, str):
        raise Failure(400, "invalid_worker_request")
    fence = _activation_fence(worker_id, session_id, body)
    try:
        handle = dispatch_id(body["executorHandle"], 512)
        if log_artifact_id is not None:
            dispatch_id(log_artifact_id, 36)
        sequence = js_int(body["callbackSequence"], 1, INT31)
        digest = body["callbackTokenDigest"]
        if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX64:
            raise TypeError("callbackTokenDigest")
    except TypeError:
        raise Failure(400, "invalid_worker_request") from None
    now = ledger.clock_ms()
    attempt = _live(ledger, "running", fence, now)
    if attempt.status == "running":
        if (attempt.run_status != "running" or attempt.executor_handle != handle
                or attempt.log_artifact_id != log_artifact_id or attempt.callback_sequence != sequence
                or attempt.callback_token_digest != digest):
            raise ledger.fence("running", "replay_mismatch", fence)
        return _answer("already_running", attempt)
    if attempt.status != "starting":
        raise ledger.fence("running", "attempt_state_mismatch", fence)
    if attempt.run_status != "dispatching":
        raise ledger.fence("running", "run_state_mismatch", fence)
    if sequence != attempt.callback_sequence + 1:
        raise ledger.fence("running", "replay_mismatch", fence)
    attempt.status = attempt.run_status = "running"
    attempt.executor_handle = handle
    attempt.log_artifact_id = log_artifact_id
    attempt.callback_sequence = sequence
    attempt.callback_token_digest = digest
    attempt.started_at_ms = now
    if attempt.run_started_at_ms is None:
        attempt.run_started_at_ms = now
    attempt.run_version += 2
    key = f"remote-activation:{attempt.attempt_id}:{fence.lease_generation}"
    attempt.add_event("attempt.running", f"{key}:running-attempt",
                      _payload(attempt, from_status="starting", to_status="running", callback_sequence=sequence), now)
    attempt.add_event("run.running", f"{key}:running-run",
                      _payload(attempt, from_status="dispatching", to_status="running"), now)
    return _answer("applied", attempt)


def _start_failure_mapping(attempt: Attempt) -> tuple[str, str]:
    if attempt.cancel_requested_at_ms is not None:
        if attempt.cancel_reason == "timeout":
            return "timed_out", "EXECUTION_TIMED_OUT"
        return "cancelled", "EXECUTION_CANCELLED"
    return "failed", "EXECUTOR_START_FAILED"


def start_failure(ledger: Ledger, worker_id: str, session_id: str, document: object) -> dict[str, Any]:
    """POST start-failure (remote-execution.md 3.2)."""
    fence = _activation_fence(worker_id, session_id, exact_keys(document, FENCE7))
    now = ledger.clock_ms()
    attempt = _live(ledger, "start-failure", fence, now, completed_replay=True)
    status, error_code = _start_failure_mapping(attempt)
    if attempt.lease.status == "completed":
        if (attempt.run_status != status or attempt.status != status or attempt.run_error_code != error_code
                or attempt.error_code != error_code or attempt.finished_at_ms is None):
            raise ledger.fence("start-failure", "replay_mismatch", fence)
        return _answer("already_terminal", attempt)
    if attempt.status != "starting":
        raise ledger.fence("start-failure", "attempt_state_mismatch", fence)
    if attempt.run_status != "dispatching":
        raise ledger.fence("start-failure", "run_state_mismatch", fence)
    ledger.complete_lease(attempt, fence.expected_lease_version + 1, now)
    attempt.status = attempt.run_status = status
    attempt.callback_sequence += 1
    attempt.finished_at_ms = now
    attempt.error_code = attempt.run_error_code = error_code
    attempt.run_version += 2
    key = f"remote-activation:{attempt.attempt_id}:{fence.lease_generation}"
    attempt.add_event(f"attempt.{status}", f"{key}:start-failed-attempt",
                      _payload(attempt, from_status="starting", to_status=status, error_code=error_code), now)
    attempt.add_event(f"run.{status}", f"{key}:start-failed-run",
                      _payload(attempt, from_status="dispatching", to_status=status, error_code=error_code), now)
    return _answer("applied", attempt)


def _lease_answer(fence: Fence, status: str, **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "schema": LEASE_CONTROL_SCHEMA, "status": status, "projectId": fence.project_id, "runId": fence.run_id,
        "attemptId": fence.attempt_id, "offerId": fence.offer_id, "leaseGeneration": fence.lease_generation,
        "leaseVersion": None, "renewedAtMs": None, "expiresAtMs": None, "stop": None, "terminalStatus": None,
    }
    out.update(fields)
    return out


def lease_control(ledger: Ledger, worker_id: str, session_id: str, document: object) -> dict[str, Any]:
    """POST lease-control (remote-execution.md 3.5)."""
    body = exact_keys(document, LEASE_CONTROL_KEYS)
    try:
        if body["schema"] != LEASE_CONTROL_SCHEMA:
            raise TypeError("schema")
        fence = parse_fence(worker_id, session_id, body, project=True)
    except TypeError:
        raise Failure(400, "invalid_worker_request") from None
    op = "lease-control"
    now = ledger.clock_ms()
    attempt = ledger.aggregate(fence)
    if attempt is None:
        raise ledger.fence(op, "missing", fence)
    reason = ledger.session_reason(fence, now) or ledger.identity_reason(attempt, fence)
    if reason is not None:
        raise ledger.fence(op, reason, fence)
    lease = attempt.lease
    if attempt.status in TERMINAL or attempt.run_status in TERMINAL:
        if (attempt.run_status != attempt.status or attempt.status not in TERMINAL
                or attempt.run_status not in TERMINAL or lease.status != "completed"):
            raise ledger.fence(op, "state_mismatch", fence)
        return _lease_answer(fence, "terminal", terminalStatus=attempt.status)
    reason = ledger.live_lease_reason(attempt, fence, now)
    if reason is not None:
        raise ledger.fence(op, reason, fence)
    if (attempt.status not in ("claimed", "starting", "running")
            or attempt.run_status not in ("dispatching", "running")
            or (attempt.status == "running") != (attempt.run_status == "running")):
        raise ledger.fence(op, "state_mismatch", fence)
    if attempt.cancel_requested_at_ms is None and attempt.deadline_at_ms is not None and attempt.deadline_at_ms <= now:
        attempt.cancel_requested_at_ms = now
        attempt.cancel_reason = "timeout"
        attempt.run_version += 1
        attempt.add_event("run.cancel_requested", f"remote-timeout:{attempt.attempt_id}:{fence.lease_generation}",
                          {"attempt_id": attempt.attempt_id, "lease_generation": fence.lease_generation,
                           "reason": "timeout", "deadline_at_ms": attempt.deadline_at_ms}, now,
                          actor=("system", "runtime:timeout"))
    lease.version = fence.expected_lease_version + 1
    lease.renewed_at_ms = lease.updated_at_ms = now
    lease.expires_at_ms = now + ledger.lease_duration_ms
    fields: dict[str, Any] = {"leaseVersion": lease.version, "renewedAtMs": now, "expiresAtMs": lease.expires_at_ms}
    if attempt.cancel_requested_at_ms is None:
        return _lease_answer(fence, "renewed", **fields)
    stop = {"reason": attempt.cancel_reason, "requestedAtMs": attempt.cancel_requested_at_ms}
    return _lease_answer(fence, "stop_requested", **fields, stop=stop)


def request_cancel(ledger: Ledger, run_id: str, reason: str = "user", *, actor_id: str = "operator") -> str:
    """Record an operator's cancel intent on a claimed run (see the module docstring).

    Returns ``accepted``, ``already_requested`` or ``already_terminal``.

    Raises:
        KeyError: no claimed run ``run_id``.
        ValueError: ``reason`` is not user, policy, shutdown, reconcile or timeout.
    """
    if reason not in STOP_REASONS:
        raise ValueError(f"reason must be one of {', '.join(STOP_REASONS)}")
    attempt = ledger.find(run_id)
    if attempt.run_status in TERMINAL:
        return "already_terminal"
    if attempt.cancel_requested_at_ms is not None:
        return "already_requested"
    now = ledger.clock_ms()
    attempt.cancel_requested_at_ms = now
    attempt.cancel_reason = reason
    attempt.run_version += 1
    attempt.add_event("run.cancel_requested", f"run-cancel:{run_id}",
                      {"attempt_id": attempt.attempt_id, "reason": reason}, now,
                      actor=("system" if reason != "user" else "user", actor_id))
    return "accepted"
