"""Runs: the cancellation transaction, task.start, and the readers (local-api.md 6, 8, 9).

Every function takes an open connection and runs as one store operation::

    body = store.run(lambda c: get_run(c, project_id, run_id))
    outcome = store.run(lambda c: request_cancellation(c, command))

The readers (``get_run``, ``list_runs``, ``list_run_events``, ``list_run_steps``) live
in :mod:`qinglong_edge.local.run_reader` and are re-exported here: plain dicts in wire
key order; one row failing the strict projection checks fails the whole read with
:class:`ProjectionInvalid` (HTTP 503).

Error -> HTTP mapping (the route owns the body):

=============================  ==========================================================
:class:`RunNotFound`           404 ``{"code":"run_not_found"}`` (missing or other project)
:class:`FenceRejected`         409 ``{"code":"run_cancellation_fence_rejected","reason":r}``
                               with ``r`` = ``authorization_changed`` | ``state_mismatch``
:class:`TaskNotFound`          404 ``{"code":"task_not_found"}`` (task.start)
:class:`TaskStartRejected`     409 ``{"code":"task_start_fence_rejected","reason":r}``, ``r`` =
                               ``authorization_changed`` | ``definition_changed`` |
                               ``task_disabled`` | ``task_not_executable`` | ``mutation_conflict``
:class:`ProjectionInvalid`     503 ``run_query_unavailable`` / ``run_list_unavailable`` /
                               ``run_event_list_unavailable`` / ``run_step_list_unavailable``
any other ``StoreError``       503 (the route's ``*_unavailable`` code): ``store_busy``,
                               ``store_closed``, ``storage_unavailable``, ``invalid_input``
                               (an invalid command is 503 per section 6 step 1)
=============================  ==========================================================

Outcomes carry ``http_status`` (202 ``accepted``, else 200) and ``to_wire()`` (the
result body of sections 1.2 and 9.5, keys in order).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qinglong_edge.contracts.fields import MAX_INT32, MAX_SAFE_INTEGER
from qinglong_edge.contracts.ids import HEX64, UUID_ANY, new_uuid4
from qinglong_edge.contracts.strictjson import dumps
from qinglong_edge.errors import StoreError
from qinglong_edge.local.identity import CREDENTIAL_SUBJECT_TYPES, Subject
from qinglong_edge.local.policy import PolicyFence, check_fence_at_commit, get_project
from qinglong_edge.local.run_reader import (
    ACTOR_TYPES,
    ATTEMPT_STATUSES,
    CANCEL_REASONS,
    CANCELLATION_SCHEMA,
    RUN_STATUSES,
    TASK_START_SCHEMA,
    TERMINAL_RUN_STATUSES,
    ProjectionInvalid,
    RunNotFound,
    _enum,
    _int,
    _route_id,
    _time,
    get_run,
    list_run_events,
    list_run_steps,
    list_runs,
)
from qinglong_edge.local.store import now_ms as wall_now_ms
from qinglong_edge.local.store import write_transaction
from qinglong_edge.local.tasks import (
    TaskNotFound,
    content_digest,
    execution_revision_digest,
    get_task,
    revision_ref,
)

__all__ = [
    "ACTOR_TYPES",
    "ATTEMPT_STATUSES",
    "CANCELLATION_SCHEMA",
    "RUN_STATUSES",
    "TASK_START_SCHEMA",
    "TERMINAL_RUN_STATUSES",
    "CancellationCommand",
    "CancellationOutcome",
    "FenceRejected",
    "ProjectionInvalid",
    "RunNotFound",
    "TaskNotFound",
    "TaskStartCommand",
    "TaskStartOutcome",
    "TaskStartRejected",
    "get_run",
    "list_run_events",
    "list_run_steps",
    "list_runs",
    "new_task_start_command",
    "request_cancellation",
    "start_task",
]

_EVENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,35}")


class FenceRejected(StoreError):
    """The commit-time re-check failed: 409 with :attr:`reason`.

    Attributes:
        reason: ``authorization_changed``, ``project_mismatch`` or ``state_mismatch``
            (cancellation); task.start adds its reasons (:class:`TaskStartRejected`).
    """

    code = "fence_rejected"
    http_status = 409

    def __init__(self, reason: str, message: str = "") -> None:
        self.reason = reason
        super().__init__(message or f"fence rejected: {reason}")


class TaskStartRejected(FenceRejected):
    """task.start's 409: ``authorization_changed``, ``definition_changed``, ``task_disabled``,
    ``task_not_executable``, ``mutation_conflict``."""

    code = "task_start_rejected"


# -- cancellation ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CancellationCommand:
    """Section 1.4: built by the route; ``event_id`` is a server UUID."""

    project_id: str
    run_id: str
    mutation_id: str
    event_id: str
    subject: Subject
    policy_fence: PolicyFence


@dataclass(frozen=True, slots=True)
class CancellationOutcome:
    """The result of section 1.2 (``status`` accepted | already_requested | already_terminal)."""

    status: str
    project_id: str
    run_id: str
    run_status: str
    run_version: int
    event_sequence: int
    cancel_requested_at_ms: int | None
    cancel_reason: str | None

    @property
    def http_status(self) -> int:
        return 202 if self.status == "accepted" else 200

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "schema": CANCELLATION_SCHEMA,
            "status": self.status,
            "projectId": self.project_id,
            "runId": self.run_id,
            "runStatus": self.run_status,
            "runVersion": self.run_version,
            "eventSequence": self.event_sequence,
        }
        if self.cancel_requested_at_ms is not None:
            body["cancelRequestedAtMs"] = self.cancel_requested_at_ms
            body["cancelReason"] = self.cancel_reason
        return body


def _check_fence(fence: object) -> PolicyFence:
    if (
        not isinstance(fence, PolicyFence)
        or not isinstance(fence.project_version, int)
        or not 1 <= fence.project_version <= MAX_INT32
        or not isinstance(fence.binding_version, int)
        or not 1 <= fence.binding_version <= MAX_INT32
    ):
        raise StoreError("the policy fence is missing or has no binding version", code="invalid_input")
    return fence


def _check_actor(subject: object) -> Subject:
    if not isinstance(subject, Subject) or subject.type not in CREDENTIAL_SUBJECT_TYPES:
        raise StoreError("the command subject is not an authenticated principal's", code="invalid_input")
    return subject


def _normalize_cancellation(command: CancellationCommand) -> None:
    _route_id(command.project_id, "projectId")
    _route_id(command.run_id, "runId")
    _route_id(command.mutation_id, "mutationId")
    if not isinstance(command.event_id, str) or _EVENT_ID.fullmatch(command.event_id) is None:
        raise StoreError("eventId does not match [A-Za-z0-9][A-Za-z0-9._:-]{0,35}", code="invalid_input")
    _check_actor(command.subject)
    _check_fence(command.policy_fence)


def _cancellation_result(status: str, command: CancellationCommand, row: tuple[Any, ...]) -> CancellationOutcome:
    """Normalize a result (section 1.2 invariants); any violation is 503."""
    run_status, version, sequence, requested, reason = row
    try:
        outcome = CancellationOutcome(
            status, command.project_id, command.run_id,
            _enum(run_status, RUN_STATUSES, "runStatus"),
            _int(version, 1, MAX_INT32, "runVersion"),
            _int(sequence, 0, MAX_INT32, "eventSequence"),
            None if requested is None else _time(requested, "cancelRequestedAtMs"),
            None if reason is None else _enum(reason, CANCEL_REASONS, "cancelReason"),
        )
    except ProjectionInvalid as exc:
        raise StoreError(f"invalid cancellation result: {exc.message}", code="storage_unavailable") from None
    has_intent = outcome.cancel_requested_at_ms is not None
    if has_intent != (outcome.cancel_reason is not None):
        raise StoreError("invalid cancellation result: a half-set intent", code="storage_unavailable")
    terminal = outcome.run_status in TERMINAL_RUN_STATUSES
    if status == "already_terminal" and not terminal:
        raise StoreError("invalid cancellation result: not terminal", code="storage_unavailable")
    if status != "already_terminal" and (terminal or not has_intent):
        raise StoreError("invalid cancellation result: no intent", code="storage_unavailable")
    return outcome


def request_cancellation(
    conn: sqlite3.Connection, command: CancellationCommand, *, now_ms: int | None = None
) -> CancellationOutcome:
    """Record a user's durable cancellation intent (section 6, exactly).

    One ``BEGIN IMMEDIATE`` transaction: the authorization fence re-check (before the Run
    read), the Run read (404 masking), then ``already_terminal`` / ``already_requested``
    (any stored intent, never overwritten) / ``state_mismatch`` (half-set intent, counter
    overflow, lost CAS) / ``accepted``: the guarded update (version and event_sequence
    + 1, status unchanged) and the ``run.cancel_requested`` event with dedupe key
    ``user-cancel:{mutationId}``, rolled back together if either fails.

    Args:
        now_ms: the server clock (epoch ms); ``None`` reads the wall clock.

    Raises:
        RunNotFound, FenceRejected, StoreError (503 class; see the module table).
    """
    _normalize_cancellation(command)
    fence = command.policy_fence
    with write_transaction(conn):
        if get_project(conn, command.project_id) is None:
            raise RunNotFound(f"run {command.run_id} not found")
        if not check_fence_at_commit(conn, command.project_id, command.subject, fence):
            raise FenceRejected("authorization_changed")
        row = conn.execute(
            'SELECT project_id, status, version, event_sequence, cancel_requested_at_ms, cancel_reason FROM "Runs"'
            " WHERE id = ?",
            (command.run_id,),
        ).fetchone()
        if row is None or row[0] != command.project_id:
            raise RunNotFound(f"run {command.run_id} not found")
        _project, status, version, sequence, requested, reason = row
        if status in TERMINAL_RUN_STATUSES:
            return _cancellation_result("already_terminal", command, row[1:])
        if requested is not None:
            return _cancellation_result("already_requested", command, row[1:])
        if reason is not None:
            raise FenceRejected("state_mismatch", "the Run has a cancel reason without a request time")
        if not isinstance(version, int) or not isinstance(sequence, int) or max(version, sequence) >= MAX_INT32:
            raise FenceRejected("state_mismatch", "the Run's version or event sequence would overflow")
        now = wall_now_ms() if now_ms is None else now_ms
        if not isinstance(now, int) or isinstance(now, bool) or not 0 <= now <= MAX_SAFE_INTEGER:
            raise StoreError("the server clock is invalid", code="invalid_input")
        updated = conn.execute(
            "UPDATE \"Runs\" SET cancel_requested_at_ms = ?, cancel_reason = 'user', version = version + 1,"
            " event_sequence = event_sequence + 1"
            " WHERE id = ? AND project_id = ? AND version = ? AND cancel_requested_at_ms IS NULL"
            " RETURNING status, version, event_sequence, cancel_requested_at_ms, cancel_reason",
            (now, command.run_id, command.project_id, version),
        ).fetchall()
        if len(updated) != 1:
            raise FenceRejected("state_mismatch", "the Run changed concurrently")
        payload = dumps({
            "reason": "user",
            "mutation_id": command.mutation_id,
            "policy_fence": {"project_version": fence.project_version, "binding_version": fence.binding_version},
        })
        conn.execute(
            'INSERT INTO "RunEvents" (id, run_id, sequence, type, dedupe_key, actor_type, actor_id, attempt_id,'
            " step_run_id, payload, created_at_ms) VALUES (?, ?, ?, 'run.cancel_requested', ?, ?, ?, NULL, NULL, ?, ?)",
            (command.event_id, command.run_id, sequence + 1, f"user-cancel:{command.mutation_id}",
             command.subject.type, command.subject.id, payload, now),
        )
        return _cancellation_result("accepted", command, tuple(updated[0]))


# -- task.start ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskStartCommand:
    """Section 9.5: the body's fields plus the principal, its fence and four server UUIDs."""

    project_id: str
    task_id: str
    mutation_id: str
    expected_revision: int
    expected_content_digest: str
    subject: Subject
    policy_fence: PolicyFence
    run_id: str
    attempt_id: str
    created_event_id: str
    queued_event_id: str


def new_task_start_command(
    *,
    project_id: str,
    task_id: str,
    mutation_id: str,
    expected_revision: int,
    expected_content_digest: str,
    subject: Subject,
    policy_fence: PolicyFence,
    new_id: Callable[[], str] = new_uuid4,
) -> TaskStartCommand:
    """A :class:`TaskStartCommand` with fresh UUIDv4 run, attempt and event ids."""
    return TaskStartCommand(
        project_id, task_id, mutation_id, expected_revision, expected_content_digest, subject, policy_fence,
        new_id(), new_id(), new_id(), new_id(),
    )


@dataclass(frozen=True, slots=True)
class TaskStartOutcome:
    """The task.start result (section 9.5); ``status`` accepted (202) or existing (200)."""

    status: str
    project_id: str
    task_id: str
    task_revision: int
    task_content_digest: str
    run_id: str
    attempt_id: str
    execution_revision_digest: str
    created_at_ms: int
    run_status: str = "queued"
    run_version: int = 2
    event_sequence: int = 2
    executor_type: str = "local_process"

    @property
    def http_status(self) -> int:
        return 202 if self.status == "accepted" else 200

    def to_wire(self) -> dict[str, Any]:
        return {
            "schema": TASK_START_SCHEMA,
            "status": self.status,
            "projectId": self.project_id,
            "taskId": self.task_id,
            "taskRevision": self.task_revision,
            "taskContentDigest": self.task_content_digest,
            "runId": self.run_id,
            "attemptId": self.attempt_id,
            "runStatus": self.run_status,
            "runVersion": self.run_version,
            "eventSequence": self.event_sequence,
            "executorType": self.executor_type,
            "executionRevisionDigest": self.execution_revision_digest,
            "createdAtMs": self.created_at_ms,
        }


def _normalize_task_start(command: TaskStartCommand) -> None:
    _route_id(command.project_id, "projectId")
    _route_id(command.task_id, "taskId")
    if not isinstance(command.mutation_id, str) or UUID_ANY.fullmatch(command.mutation_id) is None:
        raise StoreError("mutationId must be a lowercase canonical UUID", code="invalid_input")
    revision = command.expected_revision
    if not isinstance(revision, int) or isinstance(revision, bool) or not 1 <= revision <= MAX_INT32:
        raise StoreError("expectedRevision must be 1..2147483647", code="invalid_input")
    if not isinstance(command.expected_content_digest, str) or HEX64.fullmatch(command.expected_content_digest) is None:
        raise StoreError("expectedContentDigest must be 64 lowercase hex", code="invalid_input")
    for value, what in ((command.run_id, "runId"), (command.attempt_id, "attemptId"),
                        (command.created_event_id, "createdEventId"), (command.queued_event_id, "queuedEventId")):
        if not isinstance(value, str) or _EVENT_ID.fullmatch(value) is None:
            raise StoreError(f"{what} does not match the server id grammar", code="invalid_input")
    if len({command.created_event_id, command.queued_event_id}) != 2:
        raise StoreError("the two event ids must differ", code="invalid_input")
    _check_actor(command.subject)
    _check_fence(command.policy_fence)


_REPLAY = """
SELECT run.id, run.project_id, run.task_id, run.task_revision, run.trigger_type, run.execution_origin,
       run.execution_owner, run.triggered_by, run.request_id, run.priority, run.created_at_ms,
       attempt.id, attempt.executor_type,
       created.actor_type, created.actor_id, created.payload,
       queued.actor_type, queued.actor_id, queued.payload
FROM "Runs" AS run
JOIN "RunAttempts" AS attempt ON attempt.run_id = run.id AND attempt.attempt = 1
JOIN "RunEvents" AS created ON created.run_id = run.id AND created.sequence = 1 AND created.type = 'run.created'
JOIN "RunEvents" AS queued ON queued.run_id = run.id AND queued.sequence = 2 AND queued.type = 'run.queued'
WHERE run.project_id = ? AND run.idempotency_key = ?
"""


def _json_object(text: object) -> dict[str, Any]:
    from qinglong_edge.contracts.strictjson import StrictJsonError, loads

    try:
        value = loads(str(text).encode("utf-8"), max_bytes=65536)
    except StrictJsonError:
        value = None
    if not isinstance(value, dict):
        raise TaskStartRejected("mutation_conflict", "a stored task.start event payload is not an object")
    return value


def _replay(command: TaskStartCommand, row: tuple[Any, ...]) -> TaskStartOutcome:
    (run_id, project_id, task_id, task_rev, trigger_type, origin, owner, triggered_by, request_id, priority,
     created_at, attempt_id, executor_type, c_actor_type, c_actor_id, c_payload, q_actor_type, q_actor_id,
     q_payload) = row
    created = _json_object(c_payload)
    queued = _json_object(q_payload)
    fence = created.get("policy_fence")
    subject = command.subject
    expected = (
        command.project_id, command.task_id,
        revision_ref(command.expected_revision, command.expected_content_digest),
        "task_start", "manual", "runtime", subject.id, command.mutation_id, 0, "local_process",
        subject.type, subject.id, subject.type, subject.id,
    )
    actual = (project_id, task_id, task_rev, trigger_type, origin, owner, triggered_by, request_id, priority,
              executor_type, c_actor_type, c_actor_id, q_actor_type, q_actor_id)
    digest = created.get("execution_revision_digest")
    if (
        actual != expected
        or created.get("mutation_id") != command.mutation_id
        or created.get("task_revision") != command.expected_revision
        or created.get("task_content_digest") != command.expected_content_digest
        or created.get("executor_type") != "local_process"
        or not isinstance(digest, str)
        or HEX64.fullmatch(digest) is None
        or not isinstance(fence, dict)
        or fence.get("project_version") != command.policy_fence.project_version
        or fence.get("binding_version") != command.policy_fence.binding_version
        or queued.get("from_status") != "created"
        or queued.get("to_status") != "queued"
        or queued.get("version") != 2
        or not isinstance(created_at, int)
    ):
        raise TaskStartRejected("mutation_conflict", "the mutation id was used for a different start")
    return TaskStartOutcome(
        "existing", command.project_id, command.task_id, command.expected_revision, command.expected_content_digest,
        str(run_id), str(attempt_id), digest, created_at,
    )


def start_task(conn: sqlite3.Connection, command: TaskStartCommand, *, now_ms: int | None = None) -> TaskStartOutcome:
    """Create a queued Run from the task's current revision (section 9.5).

    One ``BEGIN IMMEDIATE`` transaction, in the reference's order: project (missing ->
    :class:`TaskNotFound`), the authorization fence (``authorization_changed``), the
    idempotency key ``ql3:task-start:v1:{mutationId}`` (an exact replay -> ``existing``,
    a different one -> ``mutation_conflict``), the task (missing -> TaskNotFound), its
    revision/digest (``definition_changed``), ``task_disabled``, ``task_not_executable``;
    then the Run (``queued``, version 2, event_sequence 2, priority 0, ``task_start`` /
    ``manual`` / ``runtime``), attempt 1 (``claimed``, ``local_process``, no deadline: the
    launcher sets ``deadline_at_ms`` from ``timeoutMs`` when it starts the process) and
    the events ``run.created`` (1) and ``run.queued`` (2).

    Raises:
        TaskNotFound, TaskStartRejected, StoreError (503 class).
    """
    _normalize_task_start(command)
    fence = command.policy_fence
    idempotency_key = f"ql3:task-start:v1:{command.mutation_id}"
    with write_transaction(conn):
        if get_project(conn, command.project_id) is None:
            raise TaskNotFound(f"task {command.task_id} not found")
        if not check_fence_at_commit(conn, command.project_id, command.subject, fence):
            raise TaskStartRejected("authorization_changed")
        replay = conn.execute(_REPLAY, (command.project_id, idempotency_key)).fetchone()
        if replay is not None:
            return _replay(command, tuple(replay))
        task = get_task(conn, command.project_id, command.task_id)
        if task is None:
            raise TaskNotFound(f"task {command.task_id} not found")
        current = task.current
        if current.revision != command.expected_revision or current.content_digest != command.expected_content_digest:
            raise TaskStartRejected("definition_changed")
        if task.status != "active":
            raise TaskStartRejected("task_disabled")
        if not current.executable:
            raise TaskStartRejected("task_not_executable")
        if content_digest(current.definition) != current.content_digest:
            raise StoreError(f"task {command.task_id} definition does not match its digest", code="storage_unavailable")
        ref = revision_ref(current.revision, current.content_digest)
        execution_digest = execution_revision_digest(command.project_id, command.task_id, ref, current.definition)
        created_at = wall_now_ms() if now_ms is None else now_ms
        if not isinstance(created_at, int) or isinstance(created_at, bool) or not 0 <= created_at <= MAX_SAFE_INTEGER:
            raise StoreError("the server clock is invalid", code="invalid_input")
        subject = command.subject
        conn.execute(
            'INSERT INTO "Runs" (id, project_id, task_id, task_revision, task_name, task_snapshot_ref, trigger_type,'
            " execution_origin, execution_owner, triggered_by, request_id, status, version, event_sequence, priority,"
            " idempotency_key, created_at_ms, queued_at_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, 'task_start', 'manual', 'runtime', ?, ?, 'queued', 2, 2, 0, ?, ?, ?)",
            (command.run_id, command.project_id, command.task_id, ref, task.name, ref, subject.id,
             command.mutation_id, idempotency_key, created_at, created_at),
        )
        conn.execute(
            'INSERT INTO "RunAttempts" (id, run_id, attempt, status, executor_type, callback_sequence, created_at_ms)'
            " VALUES (?, ?, 1, 'claimed', 'local_process', 0, ?)",
            (command.attempt_id, command.run_id, created_at),
        )
        created_payload = dumps({
            "status": "created",
            "version": 1,
            "execution_owner": "runtime",
            "executor_type": "local_process",
            "execution_revision_digest": execution_digest,
            "task_revision": current.revision,
            "task_content_digest": current.content_digest,
            "mutation_id": command.mutation_id,
            "policy_fence": {"project_version": fence.project_version, "binding_version": fence.binding_version},
        })
        queued_payload = dumps({"from_status": "created", "to_status": "queued", "version": 2})
        for event_id, sequence, kind, dedupe, payload in (
            (command.created_event_id, 1, "run.created", f"task-start-created:{command.mutation_id}", created_payload),
            (command.queued_event_id, 2, "run.queued", f"task-start-queued:{command.mutation_id}", queued_payload),
        ):
            conn.execute(
                'INSERT INTO "RunEvents" (id, run_id, sequence, type, dedupe_key, actor_type, actor_id, attempt_id,'
                " payload, created_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (event_id, command.run_id, sequence, kind, dedupe, subject.type, subject.id, command.attempt_id,
                 payload, created_at),
            )
        return TaskStartOutcome(
            "accepted", command.project_id, command.task_id, current.revision, current.content_digest,
            command.run_id, command.attempt_id, execution_digest, created_at,
        )
