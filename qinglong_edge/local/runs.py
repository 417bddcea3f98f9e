"""Run readers, the cancellation transaction and task.start (local-api.md sections 6, 8, 9).

Every function takes an open connection and runs as one store operation::

    body = store.run(lambda c: get_run(c, project_id, run_id))
    outcome = store.run(lambda c: request_cancellation(c, command))

Readers return plain dicts in wire key order (``strictjson.dumps`` them as they are).
Every row is validated strictly (text 1..max without control characters, integers in
range, known enums, the route's project, strictly increasing cursors); one bad row
fails the whole read with :class:`ProjectionInvalid` (HTTP 503).

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

from qinglong_edge.contracts.fields import MAX_INT32, MAX_SAFE_INTEGER, has_control
from qinglong_edge.contracts.ids import API_ID, HEX64, UUID_ANY, new_uuid4
from qinglong_edge.contracts.strictjson import dumps
from qinglong_edge.errors import StoreError
from qinglong_edge.local.identity import CREDENTIAL_SUBJECT_TYPES, Subject
from qinglong_edge.local.policy import PolicyFence, check_fence_at_commit, get_project
from qinglong_edge.local.store import now_ms as wall_now_ms
from qinglong_edge.local.store import read_transaction, write_transaction
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

CANCELLATION_SCHEMA = "qinglong/run-cancellation@v1"
TASK_START_SCHEMA = "qinglong/task-start@v1"
RUN_STATUSES = frozenset({
    "created", "queued", "dispatching", "running", "waiting_approval", "retry_wait", "lost",
    "succeeded", "failed", "cancelled", "timed_out",
})
#: Terminal for the cancellation contract and the read side (``lost`` is not).
TERMINAL_RUN_STATUSES = frozenset({"succeeded", "failed", "cancelled", "timed_out"})
ATTEMPT_STATUSES = frozenset(
    {"claimed", "starting", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"}
)
EXECUTION_ORIGINS = frozenset({
    "manual", "scheduled_system", "scheduled_node", "once", "boot", "grpc", "subscription", "system", "script",
    "legacy_import",
})
EXECUTION_OWNERS = frozenset({"legacy", "runtime"})
ACTOR_TYPES = frozenset({
    "user", "api_app", "trigger", "agent", "mcp_client", "worker", "executor", "system", "legacy_shell",
    "scheduler", "reconciler", "compatibility",
})
CANCEL_REASONS = frozenset({"user", "policy", "shutdown", "reconcile", "timeout"})
STEP_KINDS = frozenset({"task", "tool", "model", "agent", "condition", "approval", "subworkflow"})
STEP_STATUSES = frozenset({
    "pending", "ready", "waiting_approval", "running", "lost", "succeeded", "failed", "skipped", "cancelled",
    "timed_out",
})
DEFAULT_PAGE = 32
MAX_PAGE = 64
_INT32_MIN = -(2**31)
_EVENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,35}")
_RESULT_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")


# -- errors ----------------------------------------------------------------------------


class RunNotFound(StoreError):
    """The Run is missing or belongs to another project (indistinguishable): 404."""

    code = "run_not_found"
    http_status = 404


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


class ProjectionInvalid(StoreError):
    """A stored row failed the read projection's checks: the whole read is 503."""

    code = "projection_invalid"
    http_status = 503


# -- projection checks -----------------------------------------------------------------


def _text(value: object, max_length: int, what: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= max_length or has_control(value):
        raise ProjectionInvalid(f"{what} is not 1-{max_length} characters without control characters")
    return value


def _int(value: object, low: int, high: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ProjectionInvalid(f"{what} is not an integer {low}..{high}")
    return value


def _enum(value: object, allowed: frozenset[str], what: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ProjectionInvalid(f"{what} is not a known value")
    return value


def _time(value: object, what: str) -> int:
    return _int(value, 0, MAX_SAFE_INTEGER, what)


def _optional_times(target: dict[str, Any], names: tuple[str, ...], values: tuple[object, ...]) -> None:
    for name, value in zip(names, values, strict=True):
        if value is not None:
            target[name] = _time(value, name)


def _page(limit: int) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
        raise StoreError(f"limit must be 1..{MAX_PAGE}", code="invalid_input")
    return limit


def _route_id(value: object, what: str) -> str:
    if not isinstance(value, str) or API_ID.fullmatch(value) is None:
        raise StoreError(f"{what} does not match the id grammar", code="invalid_input")
    return value


_RUN_COLUMNS = (
    "project_id, id, task_id, task_revision, trigger_id, status, version, event_sequence, priority,"
    " execution_origin, execution_owner, created_at_ms, queued_at_ms, started_at_ms, finished_at_ms"
)


def _run_item(row: tuple[Any, ...], project_id: str, *, with_project: bool) -> dict[str, Any]:
    (row_project, run_id, task_id, task_rev, trigger_id, status, version, sequence, priority, origin, owner,
     created, queued, started, finished) = row
    if row_project != project_id:
        raise ProjectionInvalid("a Run row belongs to another project")
    item: dict[str, Any] = {"projectId": project_id} if with_project else {}
    item["id"] = _text(run_id, 128, "id")
    item["taskId"] = _text(task_id, 255, "taskId")
    item["taskRevision"] = _text(task_rev, 255, "taskRevision")
    if not with_project and trigger_id is not None:
        item["triggerId"] = _text(trigger_id, 128, "triggerId")
    item["status"] = _enum(status, RUN_STATUSES, "status")
    item["version"] = _int(version, 0, MAX_INT32, "version")
    item["eventSequence"] = _int(sequence, 0, MAX_INT32, "eventSequence")
    item["priority"] = _int(priority, _INT32_MIN, MAX_INT32, "priority")
    item["executionOrigin"] = _enum(origin, EXECUTION_ORIGINS, "executionOrigin")
    item["executionOwner"] = _enum(owner, EXECUTION_OWNERS, "executionOwner")
    item["createdAtMs"] = _time(created, "createdAtMs")
    _optional_times(item, ("queuedAtMs", "startedAtMs", "finishedAtMs"), (queued, started, finished))
    return item


def _latest_attempt(conn: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    row = conn.execute(
        'SELECT id, attempt, status, log_artifact_id, created_at_ms, started_at_ms, finished_at_ms FROM "RunAttempts"'
        " WHERE run_id = ? ORDER BY attempt DESC LIMIT 1",
        (run_id,),
    ).fetchone()
    if row is None:
        return None
    attempt: dict[str, Any] = {
        "id": _text(row[0], 128, "latestAttempt.id"),
        "attempt": _int(row[1], 1, MAX_INT32, "latestAttempt.attempt"),
        "status": _enum(row[2], ATTEMPT_STATUSES, "latestAttempt.status"),
        "logAvailable": row[3] is not None,
        "createdAtMs": _time(row[4], "latestAttempt.createdAtMs"),
    }
    _optional_times(attempt, ("startedAtMs", "finishedAtMs"), (row[5], row[6]))
    return attempt


# -- readers ---------------------------------------------------------------------------


def get_run(
    conn: sqlite3.Connection, project_id: str, run_id: str, *, include_latest_attempt: bool = True
) -> dict[str, Any]:
    """``run.get`` (section 9.1): ``{"run": {...}}``.

    Args:
        include_latest_attempt: add ``latestAttempt`` (``null`` or an object), as the
            later reference (57953ec8) does; ``False`` gives the baseline body.

    Raises:
        RunNotFound, ProjectionInvalid.
    """
    with read_transaction(conn):
        row = conn.execute(f'SELECT {_RUN_COLUMNS} FROM "Runs" WHERE id = ?', (run_id,)).fetchone()  # noqa: S608
        if row is None or row[0] != project_id:
            raise RunNotFound(f"run {run_id} not found")
        run = _run_item(row, project_id, with_project=True)
        if include_latest_attempt:
            run["latestAttempt"] = _latest_attempt(conn, run_id)
    return {"run": run}


def list_runs(
    conn: sqlite3.Connection,
    project_id: str,
    *,
    limit: int = DEFAULT_PAGE,
    after_created_at_ms: int | None = None,
    after_run_id: str | None = None,
) -> dict[str, Any]:
    """``run.list`` (section 9.2): newest first; ``next`` only when ``hasMore``.

    Raises:
        StoreError: ``invalid_input`` (limit, half a cursor). ProjectionInvalid.
    """
    limit = _page(limit)
    if (after_created_at_ms is None) != (after_run_id is None):
        raise StoreError("after_created_at_ms and after_run_id go together", code="invalid_input")
    sql = f'SELECT {_RUN_COLUMNS} FROM "Runs" WHERE project_id = ?'  # noqa: S608
    params: list[object] = [project_id]
    if after_created_at_ms is not None:
        sql += " AND (created_at_ms < ? OR (created_at_ms = ? AND id < ?))"
        params += [after_created_at_ms, after_created_at_ms, after_run_id]
    sql += " ORDER BY created_at_ms DESC, id DESC LIMIT ?"
    params.append(limit + 1)
    rows = conn.execute(sql, params).fetchall()
    items = [_run_item(row, project_id, with_project=False) for row in rows]
    previous = None if after_created_at_ms is None else (after_created_at_ms, after_run_id)
    for item in items:
        key = (item["createdAtMs"], item["id"])
        if previous is not None and not key < previous:
            raise ProjectionInvalid("run list order is not strictly descending")
        previous = key
    has_more = len(items) > limit
    page = items[:limit]
    body: dict[str, Any] = {"runs": page, "hasMore": has_more}
    if has_more:
        body["next"] = {"createdAtMs": page[-1]["createdAtMs"], "runId": page[-1]["id"]}
    return body


def _require_run(conn: sqlite3.Connection, project_id: str, run_id: str) -> None:
    row = conn.execute('SELECT project_id FROM "Runs" WHERE id = ?', (run_id,)).fetchone()
    if row is None or row[0] != project_id:
        raise RunNotFound(f"run {run_id} not found")


def list_run_events(
    conn: sqlite3.Connection, project_id: str, run_id: str, *, after_sequence: int = 0, limit: int = DEFAULT_PAGE
) -> dict[str, Any]:
    """``run.events.list`` (section 9.3); payloads, dedupe keys and actor ids stay hidden.

    Raises:
        RunNotFound, ProjectionInvalid, StoreError ``invalid_input``.
    """
    limit = _page(limit)
    if not isinstance(after_sequence, int) or isinstance(after_sequence, bool) or not 0 <= after_sequence <= MAX_INT32:
        raise StoreError("after_sequence must be 0..2147483647", code="invalid_input")
    with read_transaction(conn):
        _require_run(conn, project_id, run_id)
        rows = conn.execute(
            'SELECT sequence, type, actor_type, created_at_ms FROM "RunEvents"'
            " WHERE run_id = ? AND sequence > ? ORDER BY sequence, id LIMIT ?",
            (run_id, after_sequence, limit + 1),
        ).fetchall()
    events = []
    previous = after_sequence
    for sequence, kind, actor, created in rows:
        value = _int(sequence, 1, MAX_INT32, "sequence")
        if value <= previous:
            raise ProjectionInvalid("event sequences are not strictly increasing")
        previous = value
        events.append({
            "sequence": value,
            "type": _text(kind, 128, "type"),
            "actorType": _enum(actor, ACTOR_TYPES, "actorType"),
            "createdAtMs": _time(created, "createdAtMs"),
        })
    has_more = len(events) > limit
    page = events[:limit]
    return {
        "events": page,
        "hasMore": has_more,
        "nextAfterSequence": page[-1]["sequence"] if page else after_sequence,
    }


def list_run_steps(
    conn: sqlite3.Connection,
    project_id: str,
    run_id: str,
    *,
    limit: int = DEFAULT_PAGE,
    after_step_key: str | None = None,
    after_step_run_id: str | None = None,
) -> dict[str, Any]:
    """``run.steps.list`` (section 9.4): ordered by ``step_key``, ``id``.

    Raises:
        RunNotFound, ProjectionInvalid, StoreError ``invalid_input``.
    """
    limit = _page(limit)
    if (after_step_key is None) != (after_step_run_id is None):
        raise StoreError("after_step_key and after_step_run_id go together", code="invalid_input")
    sql = (
        "SELECT id, parent_step_run_id, step_key, kind, required, status, version, attempt_count, ready_at_ms,"
        ' started_at_ms, finished_at_ms, result_code, created_at_ms, updated_at_ms FROM "StepRuns" WHERE run_id = ?'
    )
    params: list[object] = [run_id]
    if after_step_key is not None:
        sql += " AND (step_key > ? OR (step_key = ? AND id > ?))"
        params += [after_step_key, after_step_key, after_step_run_id]
    sql += " ORDER BY step_key, id LIMIT ?"
    params.append(limit + 1)
    with read_transaction(conn):
        _require_run(conn, project_id, run_id)
        rows = conn.execute(sql, params).fetchall()
    steps = []
    previous: tuple[str, str | None] | None = (
        None if after_step_key is None else (after_step_key, after_step_run_id)
    )
    for row in rows:
        (step_id, parent, key, kind, required, status, version, attempts, ready, started, finished, result,
         created, updated) = row
        result_code = None if result is None else _text(result, 64, "resultCode")
        if result_code is not None and _RESULT_CODE.fullmatch(result_code) is None:
            raise ProjectionInvalid("resultCode does not match the grammar")
        step: dict[str, Any] = {
            "id": _text(step_id, 128, "id"),
            "parentStepRunId": None if parent is None else _text(parent, 128, "parentStepRunId"),
            "stepKey": _text(key, 128, "stepKey"),
            "kind": _enum(kind, STEP_KINDS, "kind"),
            "required": bool(_int(required, 0, 1, "required")),
            "status": _enum(status, STEP_STATUSES, "status"),
            "version": _int(version, 1, MAX_INT32, "version"),
            "attemptCount": _int(attempts, 0, 64, "attemptCount"),
            "readyAtMs": None if ready is None else _time(ready, "readyAtMs"),
            "startedAtMs": None if started is None else _time(started, "startedAtMs"),
            "finishedAtMs": None if finished is None else _time(finished, "finishedAtMs"),
            "resultCode": result_code,
            "createdAtMs": _time(created, "createdAtMs"),
            "updatedAtMs": _time(updated, "updatedAtMs"),
        }
        position: tuple[str, str | None] = (step["stepKey"], step["id"])
        if previous is not None and not position > previous:
            raise ProjectionInvalid("step order is not strictly ascending")
        previous = position
        steps.append(step)
    has_more = len(steps) > limit
    page = steps[:limit]
    return {
        "steps": page,
        "hasMore": has_more,
        "next": {"stepKey": page[-1]["stepKey"], "stepRunId": page[-1]["id"]} if has_more else None,
    }


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
