"""``task.list`` and ``task.get`` projections (issue 26 item 2; permission ``task.read``).

Sources (facts only): the reference's ``taskListRoute.ts``, ``taskReadRoute.ts`` and
the bounded task list/read projections (runtime-core), query grammar from
``httpSurface.ts`` at 308aa75.

Bodies, keys in wire order:

* ``task.list`` 200: ``{"tasks":[item...],"hasMore":bool}`` plus ``"next":{"taskId":..}``
  only when ``hasMore`` (the last item's id); items ordered by ``taskId``, strictly after
  ``after_task_id``; item: ``taskId``, ``revision``, ``name``, ``kind``, ``specSchema``,
  ``enabled``, ``updatedAtMs``;
* ``task.get`` 200: ``{"task":{taskId, revision, name, kind, specSchema, enabled,
  contentDigest, createdAtMs, updatedAtMs}}``; 404 ``task_not_found`` (missing, or
  another project's).

``revision`` and ``contentDigest`` are what ``task.start`` needs as ``expectedRevision``
and ``expectedContentDigest``. Our task definitions are Local commands
(:mod:`qinglong_edge.local.tasks`, ``argv``/``shell``): ``kind`` ``command`` and
``specSchema`` ``qinglong/command@v1``, as the reference's integration test shows for
its command tasks; ``enabled`` is ``status == 'active'``.

Every row is checked (text 1..max without control characters, revision 1..2^31-1, a
64-hex digest, times 0..2^53-1 with ``updatedAtMs >= createdAtMs``, order); one bad row
fails the request with :class:`TaskProjectionInvalid` (503 ``task_list_unavailable`` /
``task_query_unavailable``).
"""

from __future__ import annotations

import sqlite3
from typing import Any, Final

from qinglong_edge.contracts.fields import MAX_INT32, MAX_SAFE_INTEGER, has_control
from qinglong_edge.contracts.ids import HEX64
from qinglong_edge.errors import StoreError
from qinglong_edge.local.store import read_transaction
from qinglong_edge.local.tasks import TaskNotFound, TaskRecord, get_task, list_tasks

__all__ = ["TASK_KIND", "TASK_SPEC_SCHEMA", "TaskProjectionInvalid", "get_task_body", "list_tasks_body"]

TASK_KIND: Final = "command"
TASK_SPEC_SCHEMA: Final = "qinglong/command@v1"
DEFAULT_PAGE: Final = 32
MAX_PAGE: Final = 64


class TaskProjectionInvalid(StoreError):
    """A stored task failed the projection's checks: the whole read is 503."""

    code = "projection_invalid"
    http_status = 503


def _text(value: object, max_bytes: int, what: str) -> str:
    if (not isinstance(value, str) or not value or len(value.encode("utf-8", "surrogatepass")) > max_bytes
            or has_control(value)):
        raise TaskProjectionInvalid(f"{what} is not 1-{max_bytes} bytes without control characters")
    return value


def _int(value: object, low: int, high: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise TaskProjectionInvalid(f"{what} is not an integer {low}..{high}")
    return value


def _item(task: TaskRecord, project_id: str, *, full: bool) -> dict[str, Any]:
    if task.project_id != project_id or task.status not in ("active", "disabled"):
        raise TaskProjectionInvalid("a task row is not of this project or has an unknown status")
    item: dict[str, Any] = {
        "taskId": _text(task.task_id, 128, "taskId"),
        "revision": _int(task.current.revision, 1, MAX_INT32, "revision"),
        "name": _text(task.name, 255, "name"),
        "kind": TASK_KIND,
        "specSchema": TASK_SPEC_SCHEMA,
        "enabled": task.status == "active",
    }
    created = _int(task.created_at_ms, 0, MAX_SAFE_INTEGER, "createdAtMs")
    updated = _int(task.updated_at_ms, created, MAX_SAFE_INTEGER, "updatedAtMs")
    if full:
        digest = task.current.content_digest
        if not isinstance(digest, str) or HEX64.fullmatch(digest) is None:
            raise TaskProjectionInvalid("contentDigest is not 64 lowercase hex")
        item["contentDigest"] = digest
        item["createdAtMs"] = created
    item["updatedAtMs"] = updated
    return item


def list_tasks_body(
    conn: sqlite3.Connection, project_id: str, *, limit: int = DEFAULT_PAGE, after_task_id: str | None = None
) -> dict[str, Any]:
    """``task.list`` (module docstring), one snapshot.

    Raises:
        StoreError: ``invalid_input`` (limit outside 1..64). TaskProjectionInvalid.
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
        raise StoreError(f"limit must be 1..{MAX_PAGE}", code="invalid_input")
    with read_transaction(conn):
        rows = list_tasks(conn, project_id, limit=limit + 1, after_task_id=after_task_id)
    items, previous = [], after_task_id
    for task in rows:
        if previous is not None and not task.task_id > previous:
            raise TaskProjectionInvalid("task order is not strictly ascending")
        previous = task.task_id
        items.append(_item(task, project_id, full=False))
    has_more = len(items) > limit
    page = items[:limit]
    body: dict[str, Any] = {"tasks": page, "hasMore": has_more}
    if has_more:
        body["next"] = {"taskId": page[-1]["taskId"]}
    return body


def get_task_body(conn: sqlite3.Connection, project_id: str, task_id: str) -> dict[str, Any]:
    """``task.get`` (module docstring).

    Raises:
        TaskNotFound: 404 ``task_not_found``. TaskProjectionInvalid.
    """
    with read_transaction(conn):
        task = get_task(conn, project_id, task_id)
    if task is None:
        raise TaskNotFound(f"task {project_id}/{task_id} does not exist")
    return {"task": _item(task, project_id, full=True)}
