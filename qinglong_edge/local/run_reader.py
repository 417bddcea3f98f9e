"""Run read projections (local-api.md sections 8 and 9.1-9.4).

Readers return plain dicts in wire key order (``strictjson.dumps`` them as they are);
every row is validated strictly (text 1..max without control characters, integers in
range, known enums, the route's project, strictly increasing order). One bad row fails
the whole read with :class:`ProjectionInvalid` (HTTP 503 ``run_query_unavailable``,
``run_list_unavailable``, ``run_event_list_unavailable``, ``run_step_list_unavailable``);
a missing Run or one in another project is :class:`RunNotFound` (404 ``run_not_found``).

Import these from :mod:`qinglong_edge.local.runs`, which re-exports them.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from qinglong_edge.contracts.fields import MAX_INT32, MAX_SAFE_INTEGER, has_control
from qinglong_edge.contracts.ids import API_ID
from qinglong_edge.errors import StoreError
from qinglong_edge.local.store import read_transaction

__all__ = [
    "ACTOR_TYPES",
    "ATTEMPT_STATUSES",
    "CANCELLATION_SCHEMA",
    "CANCEL_REASONS",
    "EXECUTION_ORIGINS",
    "EXECUTION_OWNERS",
    "RUN_STATUSES",
    "STEP_KINDS",
    "STEP_STATUSES",
    "TASK_START_SCHEMA",
    "TERMINAL_RUN_STATUSES",
    "ProjectionInvalid",
    "RunNotFound",
    "get_run",
    "list_run_events",
    "list_run_steps",
    "list_runs",
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
_RESULT_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")


# -- errors ----------------------------------------------------------------------------


class RunNotFound(StoreError):
    """The Run is missing or belongs to another project (indistinguishable): 404."""

    code = "run_not_found"
    http_status = 404

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
