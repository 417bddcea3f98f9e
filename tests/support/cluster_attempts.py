"""What the cluster double records per claimed attempt, and the fence checks every
execution route shares (tests and the demo only).

One :class:`Attempt` row per lease the offers route granted (made lazily by
:meth:`Ledger.sync`, so the offers route is untouched): the attempt and run statuses
(RUN_ATTEMPT_STATUSES / RUN_STATUSES of ``packages/ql3-runtime-core/src/run/run.ts``),
the run version and event sequence, ``deadline_at_ms`` (set at starting), the callback
sequence/digest, executor handle and log artifact id (stored at running), the cancel
intent (``cancel_requested_at_ms`` + ``cancel_reason``), exit code and error codes, and
the run's :class:`Event` list. The lease itself is the offers route's
:class:`~tests.support.cluster_state.LeaseRow` (status ``leased``/``completed``,
``version``, ``renewed_at_ms``/``expires_at_ms`` at the double's clock); the reference
keeps ``run_attempts.lease_version`` equal to ``run_dispatch_leases.version`` in every
transaction, so one field stands for both.

Fence checks, in the order of the reference repositories (whyour/qinglong at c699c32,
``packages/ql3-cluster-postgres/src/remote-execution/``):

* session (``assertWorkerCurrent``): no session row -> ``worker_unavailable``; another
  session id -> ``worker_session_mismatch``; another generation ->
  ``worker_generation_mismatch``; not online/draining or its lease expired ->
  ``worker_unavailable``. The completion repository reports every one of them as
  ``worker_unavailable``, the secret authority repository as ``authority_mismatch``.
* aggregate (``assertAggregateIdentity``): run or attempt unknown -> ``missing``; the
  attempt belongs to another run -> ``run_mismatch``; (lease-control:) another project
  -> ``project_mismatch``.
* lease projection (``assertAuthorityProjection``): ``worker_mismatch``,
  ``worker_session_mismatch``, ``worker_generation_mismatch``,
  ``lease_generation_mismatch``, ``lease_token_mismatch`` (sha256 of the token text),
  ``offer_mismatch``; then the lease must be ``leased`` at ``version ==
  expectedLeaseVersion`` (``version_mismatch``) and unexpired at the double's clock
  (``lease_expired``).

A fence answers 409 with the route's code only (the reason is never sent, section 3);
the double keeps every reason in :attr:`Ledger.fences` so a test can assert it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.support.cluster_wire import INT31, Failure, dispatch_id, identifier, js_int, lease_token

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.cluster_state import ClusterState, LeaseRow

__all__ = [
    "FENCE7",
    "FENCE_CODES",
    "TERMINAL",
    "Attempt",
    "Event",
    "Fence",
    "FenceRecord",
    "Fenced",
    "Ledger",
    "StoredArtifact",
    "activation_snapshot",
    "parse_fence",
]

FENCE7 = ("runId", "attemptId", "workerGeneration", "offerId", "leaseGeneration", "leaseToken",
          "expectedLeaseVersion")
#: The 409 code of each route (``workerIngressPipeline.ts`` ``mapIngressFailure``).
FENCE_CODES = {
    "starting": "worker_activation_fenced",
    "start-failure": "worker_activation_fenced",
    "running": "worker_activation_fenced",
    "secrets": "worker_secret_delivery_fenced",
    "lease-control": "worker_lease_control_fenced",
    "artifacts": "worker_completion_fenced",
    "completion": "worker_completion_fenced",
}
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost"})
STOP_REASONS = ("user", "policy", "shutdown", "reconcile", "timeout")


class Fenced(Failure):
    """409 with the route's code; ``reason`` is the reference's fence reason (kept, not sent)."""

    def __init__(self, op: str, reason: str, *, close: bool = False) -> None:
        super().__init__(409, FENCE_CODES[op], close=close)
        self.op = op
        self.reason = reason


@dataclass(frozen=True)
class FenceRecord:
    """One 409 the double answered: the route, the reason and the ids the body named."""

    op: str
    reason: str
    run_id: str | None
    attempt_id: str | None
    at_ms: int


@dataclass(frozen=True)
class Event:
    """One ``run_events`` row (type, dedupe key, actor, payload as the reference writes them)."""

    type: str
    sequence: int
    dedupe_key: str
    actor_type: str
    actor_id: str
    payload: dict[str, Any]
    created_at_ms: int


@dataclass(frozen=True)
class StoredArtifact:
    """One immutable artifact of the store, keyed (projectId, runId, attemptId, logArtifactId)."""

    project_id: str
    run_id: str
    attempt_id: str
    log_artifact_id: str
    byte_length: int
    sha256: str
    truncated: bool | None
    stored_at_ms: int
    data: bytes = field(repr=False)


@dataclass(frozen=True)
class Fence:
    """The authority a request carries (path worker/session + body fields)."""

    worker_id: str
    session_id: str
    worker_generation: int
    run_id: str
    attempt_id: str
    offer_id: str
    lease_generation: int
    lease_token: str = field(repr=False)
    expected_lease_version: int
    project_id: str | None = None

    @property
    def token_digest(self) -> str:
        return hashlib.sha256(self.lease_token.encode("utf-8")).hexdigest()


def parse_fence(worker_id: str, session_id: str, body: dict[str, Any], *, id_max: int = 128,
                project: bool = False) -> Fence:
    """The fence fields of a request body (keys already checked). ``id_max`` 36 is the
    activation's ``boundedId`` for runId/attemptId. Raises TypeError on a bad value
    (the pipeline answers 400 ``invalid_worker_request``)."""
    return Fence(
        worker_id=worker_id,
        session_id=session_id,
        worker_generation=js_int(body["workerGeneration"], 1, INT31),
        run_id=dispatch_id(body["runId"], id_max),
        attempt_id=dispatch_id(body["attemptId"], id_max),
        offer_id=dispatch_id(body["offerId"]),
        lease_generation=js_int(body["leaseGeneration"], 1, INT31),
        lease_token=lease_token(body["leaseToken"]),
        expected_lease_version=js_int(body["expectedLeaseVersion"], 0, INT31),
        project_id=identifier(body["projectId"]) if project else None,
    )


@dataclass
class Attempt:
    """The run + attempt rows of one claimed attempt (see the module docstring)."""

    lease: LeaseRow = field(repr=False)
    revision: dict[str, Any] = field(repr=False)
    run_id: str
    attempt_id: str
    project_id: str
    task_id: str
    task_revision: str
    created_at_ms: int
    run_created_at_ms: int
    status: str = "claimed"
    run_status: str = "dispatching"
    run_version: int = 1
    event_sequence: int = 0
    deadline_at_ms: int | None = None
    callback_sequence: int = 0
    callback_token_digest: str | None = None
    executor_handle: str | None = None
    log_artifact_id: str | None = None
    started_at_ms: int | None = None
    run_started_at_ms: int | None = None
    finished_at_ms: int | None = None
    exit_code: int | None = None
    error_code: str | None = None
    run_error_code: str | None = None
    cancel_requested_at_ms: int | None = None
    cancel_reason: str | None = None
    #: The accepted completion: the worker's ``result`` and ``artifact`` plus the
    #: cluster's ``status`` (its outcome mapping) and ``terminalAtMs``.
    completion: dict[str, Any] | None = None
    events: list[Event] = field(default_factory=list)

    @property
    def offer_id(self) -> str:
        return self.lease.offer_id

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL or self.run_status in TERMINAL

    def add_event(self, type_: str, dedupe_key: str, payload: dict[str, Any], at_ms: int, *,
                  actor: tuple[str, str] | None = None) -> None:
        self.event_sequence += 1
        actor_type, actor_id = actor if actor is not None else ("worker", self.lease.worker_id)
        self.events.append(Event(type_, self.event_sequence, dedupe_key, actor_type, actor_id, payload, at_ms))

    def event(self, dedupe_key: str) -> Event | None:
        return next((e for e in self.events if e.dedupe_key == dedupe_key), None)

    def view(self) -> dict[str, Any]:
        """A JSON-able view (no token, no secret value; the state file and tests)."""
        lease = self.lease
        return {
            "runId": self.run_id, "attemptId": self.attempt_id, "offerId": lease.offer_id,
            "projectId": self.project_id, "taskId": self.task_id,
            "runStatus": self.run_status, "attemptStatus": self.status, "runVersion": self.run_version,
            "lease": {"status": lease.status, "version": lease.version, "leaseGeneration": lease.lease_generation,
                      "renewedAtMs": lease.renewed_at_ms, "expiresAtMs": lease.expires_at_ms},
            "deadlineAtMs": self.deadline_at_ms, "callbackSequence": self.callback_sequence,
            "executorHandle": self.executor_handle, "logArtifactId": self.log_artifact_id,
            "startedAtMs": self.started_at_ms, "finishedAtMs": self.finished_at_ms, "exitCode": self.exit_code,
            "errorCode": self.error_code,
            "cancel": None if self.cancel_requested_at_ms is None else
            {"reason": self.cancel_reason, "requestedAtMs": self.cancel_requested_at_ms},
            "completion": self.completion,
            "events": [e.type for e in self.events],
        }


def activation_snapshot(attempt: Attempt) -> dict[str, Any]:
    """The ``qinglong/remote-run-activation@v1`` snapshot, keys in the reference's order
    (``remoteRunActivationRepository.ts`` ``snapshot``); optional keys only when set."""
    out: dict[str, Any] = {
        "runId": attempt.run_id,
        "attemptId": attempt.attempt_id,
        "runStatus": attempt.run_status,
        "attemptStatus": attempt.status,
        "leaseVersion": attempt.lease.version,
        "leaseGeneration": attempt.lease.lease_generation,
        "callbackSequence": attempt.callback_sequence,
    }
    for key, value in (("deadlineAtMs", attempt.deadline_at_ms), ("startedAtMs", attempt.started_at_ms),
                       ("finishedAtMs", attempt.finished_at_ms), ("executorHandle", attempt.executor_handle),
                       ("logArtifactId", attempt.log_artifact_id), ("errorCode", attempt.error_code)):
        if value is not None:
            out[key] = value
    return out


class Ledger:
    """The execution rows of one double: attempts, runs, the artifact store, the secret
    store and the fence log. Callers hold ``state.lock``.

    Args:
        state: the double's :class:`~tests.support.cluster_state.ClusterState` (sessions,
            leases, clock).
        lease_duration_ms: what lease-control grants (``remoteWorkerLeaseControlService``
            option, default 30 000, 5 000-600 000 by ``assertRunDispatchLeaseDuration``).
    """

    def __init__(self, state: ClusterState, *, lease_duration_ms: int = 30_000) -> None:
        self.state = state
        self.lease_duration_ms = check_lease_duration(lease_duration_ms)
        self.attempts: dict[str, Attempt] = {}
        self.runs: dict[str, Attempt] = {}
        self.artifacts: dict[tuple[str, str, str, str], StoredArtifact] = {}
        self.secret_values: dict[str, str] = {}
        self.fences: list[FenceRecord] = []

    @property
    def clock_ms(self) -> Callable[[], int]:
        return self.state.clock_ms

    def sync(self) -> None:
        """Give every lease the offers route granted its attempt row (idempotent)."""
        for lease in list(self.state.leases.values()):
            source = getattr(lease, "source", None)
            if source is None:
                continue
            candidate = source.candidate
            attempt_id = str(candidate["attemptId"])
            if attempt_id in self.attempts:
                continue
            attempt = Attempt(
                lease=lease, revision=source.revision, run_id=str(candidate["runId"]), attempt_id=attempt_id,
                project_id=str(candidate["projectId"]), task_id=str(candidate["taskId"]),
                task_revision=str(candidate["taskRevision"]),
                created_at_ms=int(candidate.get("attemptCreatedAtMs", lease.acquired_at_ms)),
                run_created_at_ms=int(candidate.get("queuedAtMs", lease.acquired_at_ms)),
            )
            self.attempts[attempt_id] = attempt
            self.runs[attempt.run_id] = attempt

    def find(self, run_id: str | None = None, *, attempt_id: str | None = None,
             offer_id: str | None = None) -> Attempt:
        """The attempt of a run, an attempt id or an offer id; KeyError when none."""
        self.sync()
        for attempt in self.attempts.values():
            if ((run_id is None or attempt.run_id == run_id)
                    and (attempt_id is None or attempt.attempt_id == attempt_id)
                    and (offer_id is None or attempt.offer_id == offer_id)):
                return attempt
        raise KeyError(run_id or attempt_id or offer_id)

    def fence(self, op: str, reason: str, fence: Fence | None, *, close: bool = False) -> Fenced:
        """Record the reason and return the 409 to raise."""
        self.fences.append(FenceRecord(op, reason, fence.run_id if fence else None,
                                       fence.attempt_id if fence else None, self.clock_ms()))
        return Fenced(op, reason, close=close)

    # -- the shared checks (module docstring) ----------------------------------------------

    def session_reason(self, fence: Fence, now: int) -> str | None:
        row = self.state.sessions.get(fence.worker_id)
        if row is None:
            return "worker_unavailable"
        if row.session_id != fence.session_id:
            return "worker_session_mismatch"
        if row.generation != fence.worker_generation:
            return "worker_generation_mismatch"
        if row.status not in ("online", "draining") or row.lease_expires_at_ms <= now:
            return "worker_unavailable"
        return None

    def aggregate(self, fence: Fence) -> Attempt | None:
        """The attempt when both the run and the attempt exist (the reference joins them)."""
        if fence.run_id not in self.runs:
            return None
        return self.attempts.get(fence.attempt_id)

    @staticmethod
    def identity_reason(attempt: Attempt, fence: Fence) -> str | None:
        lease = attempt.lease
        if attempt.run_id != fence.run_id:
            return "run_mismatch"
        if fence.project_id is not None and attempt.project_id != fence.project_id:
            return "project_mismatch"
        if lease.worker_id != fence.worker_id:
            return "worker_mismatch"
        if lease.worker_session_id != fence.session_id:
            return "worker_session_mismatch"
        if lease.worker_generation != fence.worker_generation:
            return "worker_generation_mismatch"
        if lease.lease_generation != fence.lease_generation:
            return "lease_generation_mismatch"
        if lease.lease_token_digest != fence.token_digest:
            return "lease_token_mismatch"
        if lease.offer_id != fence.offer_id:
            return "offer_mismatch"
        return None

    @staticmethod
    def live_lease_reason(attempt: Attempt, fence: Fence, now: int) -> str | None:
        lease = attempt.lease
        if lease.status != "leased" or lease.version != fence.expected_lease_version:
            return "version_mismatch"
        if lease.expires_at_ms <= now:
            return "lease_expired"
        return None

    def complete_lease(self, attempt: Attempt, version: int, at_ms: int) -> None:
        lease = attempt.lease
        lease.status = "completed"
        lease.version = version
        lease.updated_at_ms = at_ms


def check_lease_duration(value: int) -> int:
    """``assertRunDispatchLeaseDuration``: a safe integer 5 000-600 000 ms, else ValueError."""
    if not isinstance(value, int) or isinstance(value, bool) or not 5_000 <= value <= 600_000:
        raise ValueError("leaseDurationMs must be between 5000 and 600000")
    return value
