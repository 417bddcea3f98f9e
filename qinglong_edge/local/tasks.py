"""Local task definitions and their revisions (our own tables; the spec has none).

A task is a head row ``QingLongEdgeTasks(project_id, id, name, status active|disabled,
current_revision, version, ...)`` and immutable revisions
``QingLongEdgeTaskRevisions(project_id, task_id, revision 1..2^31-1, content_digest,
definition_json, executable, mutation_id, ...)``. ``task.start`` (local-api.md 9.5)
turns the current revision into a Run whose ``task_revision`` is the revision ref
``qltd:v1:<revision>:<contentDigest>`` (:func:`revision_ref`).

Definition (camelCase JSON, validated by :func:`normalize_definition`)::

    {
      "command": {"kind": "argv", "file": "/bin/sh", "args": ["-c", "echo hi"]}
               | {"kind": "shell", "command": "echo hi", "shell": "/bin/sh"?},
      "workingDirectory": "/abs/dir"?,
      "environment": [{"name": "K", "value": "V"}, ...],     (may be empty)
      "timeoutMs": 1000..604800000?
    }

Limits: ``file`` an absolute path or a bare program name (no ``/``), 1-4096 bytes;
``args`` at most 256 strings of at most 4096 bytes; ``command`` 1-65536 bytes; ``shell``
and ``workingDirectory`` absolute paths; ``environment`` at most 128 entries, names
``[A-Za-z_][A-Za-z0-9_]{0,127}``, unique, values at most 32768 bytes; no NUL anywhere
(no control characters in paths). The canonical form sorts ``environment`` by name and
every object's keys, compact UTF-8 JSON; ``content_digest`` is its SHA-256 (hex) and it
is at most 64 KiB.

``executable`` is 1 for every definition this module accepts; 0 is reserved for
definitions this agent cannot run (task.start answers ``task_not_executable``).

Errors: :class:`~qinglong_edge.errors.StoreError` ``invalid_input`` (with the JSON path),
``not_found`` (project), ``conflict`` (a mutation id reused for a different definition),
and :class:`TaskNotFound` (``task_not_found``, HTTP 404).
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass
from typing import Any

from qinglong_edge.contracts.digest import sha256_hex
from qinglong_edge.contracts.fields import MAX_INT32, MAX_SAFE_INTEGER, has_control
from qinglong_edge.contracts.ids import API_ID, HEX64
from qinglong_edge.errors import StoreError
from qinglong_edge.local.identity import Subject
from qinglong_edge.local.store import read_transaction, write_transaction

__all__ = [
    "EXECUTION_SCHEMA",
    "REVISION_REF_PREFIX",
    "TaskNotFound",
    "TaskRecord",
    "TaskRevisionRecord",
    "TaskWriteResult",
    "canonical_definition",
    "content_digest",
    "create_task",
    "execution_revision_digest",
    "get_task",
    "get_task_revision",
    "list_tasks",
    "normalize_definition",
    "parse_revision_ref",
    "read_task",
    "resolve_revision_ref",
    "revision_ref",
    "set_task_status",
]

REVISION_REF_PREFIX = "qltd:v1:"
#: Domain tag of :func:`execution_revision_digest`.
EXECUTION_SCHEMA = "qinglong-edge/local-execution@v1"
MAX_DEFINITION_BYTES = 65536
MIN_TIMEOUT_MS = 1000
MAX_TIMEOUT_MS = 604_800_000  # 7 days
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_REF = re.compile(r"qltd:v1:([1-9][0-9]{0,9}):([0-9a-f]{64})")


class TaskNotFound(StoreError):
    """No such task in the project (or the project is missing): HTTP 404 ``task_not_found``."""

    code = "task_not_found"
    http_status = 404


def _bad(path: str, what: str) -> StoreError:
    return StoreError(f"{path}: {what}", code="invalid_input")


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _string(value: object, path: str, *, max_bytes: int, min_bytes: int = 1, control: bool = True) -> str:
    if not isinstance(value, str):
        raise _bad(path, "must be a string")
    if not min_bytes <= _utf8_len(value) <= max_bytes:
        raise _bad(path, f"must be {min_bytes}-{max_bytes} bytes")
    if "\x00" in value or any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
        raise _bad(path, "must not contain NUL or lone surrogates")
    if not control and has_control(value):
        raise _bad(path, "must not contain control characters")
    return value


def _absolute(value: object, path: str) -> str:
    text = _string(value, path, max_bytes=4096, control=False)
    if not text.startswith("/"):
        raise _bad(path, "must be an absolute path")
    return text


def _keys(obj: dict[str, Any], path: str, required: set[str], optional: set[str]) -> None:
    for key in obj:
        if key not in required | optional:
            raise _bad(f"{path}.{key}", "unknown key")
    for key in required:
        if key not in obj:
            raise _bad(f"{path}.{key}", "missing key")


def _command(value: object) -> dict[str, Any]:
    path = "$.command"
    if not isinstance(value, dict):
        raise _bad(path, "must be an object")
    kind = value.get("kind")
    if kind == "argv":
        _keys(value, path, {"kind", "file"}, {"args"})
        file = _string(value["file"], f"{path}.file", max_bytes=4096, control=False)
        if "/" in file and not file.startswith("/"):
            raise _bad(f"{path}.file", "must be an absolute path or a bare program name")
        args = value.get("args", [])
        if not isinstance(args, list) or len(args) > 256:
            raise _bad(f"{path}.args", "must be an array of at most 256 strings")
        return {
            "kind": "argv",
            "file": file,
            "args": [_string(a, f"{path}.args[{i}]", max_bytes=4096, min_bytes=0) for i, a in enumerate(args)],
        }
    if kind == "shell":
        _keys(value, path, {"kind", "command"}, {"shell"})
        result: dict[str, Any] = {
            "kind": "shell",
            "command": _string(value["command"], f"{path}.command", max_bytes=MAX_DEFINITION_BYTES),
        }
        if "shell" in value:
            result["shell"] = _absolute(value["shell"], f"{path}.shell")
        return result
    raise _bad(f"{path}.kind", "must be 'argv' or 'shell'")


def normalize_definition(document: object) -> dict[str, Any]:
    """Validate a definition and return its normalized form (environment sorted by name).

    Raises:
        StoreError: ``invalid_input`` naming the JSON path.
    """
    if not isinstance(document, dict):
        raise _bad("$", "must be an object")
    _keys(document, "$", {"command"}, {"workingDirectory", "environment", "timeoutMs"})
    result: dict[str, Any] = {"command": _command(document["command"])}
    if "workingDirectory" in document:
        result["workingDirectory"] = _absolute(document["workingDirectory"], "$.workingDirectory")
    environment = document.get("environment", [])
    if not isinstance(environment, list) or len(environment) > 128:
        raise _bad("$.environment", "must be an array of at most 128 entries")
    entries: dict[str, str] = {}
    for index, entry in enumerate(environment):
        at = f"$.environment[{index}]"
        if not isinstance(entry, dict):
            raise _bad(at, "must be an object")
        _keys(entry, at, {"name", "value"}, set())
        name = entry["name"]
        if not isinstance(name, str) or _ENV_NAME.fullmatch(name) is None:
            raise _bad(f"{at}.name", "must match [A-Za-z_][A-Za-z0-9_]{0,127}")
        if name in entries:
            raise _bad(f"{at}.name", "duplicate environment name")
        entries[name] = _string(entry["value"], f"{at}.value", max_bytes=32768, min_bytes=0)
    result["environment"] = [{"name": name, "value": entries[name]} for name in sorted(entries)]
    if "timeoutMs" in document:
        timeout = document["timeoutMs"]
        if not isinstance(timeout, int) or isinstance(timeout, bool) or not MIN_TIMEOUT_MS <= timeout <= MAX_TIMEOUT_MS:
            raise _bad("$.timeoutMs", f"must be an integer {MIN_TIMEOUT_MS}-{MAX_TIMEOUT_MS}")
        result["timeoutMs"] = timeout
    if len(canonical_definition(result).encode("utf-8")) > MAX_DEFINITION_BYTES:
        raise _bad("$", f"the definition exceeds {MAX_DEFINITION_BYTES} bytes")
    return result


def canonical_definition(definition: dict[str, Any]) -> str:
    """Compact JSON with every object's keys sorted (the digested and stored form)."""
    return json.dumps(definition, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_digest(definition: dict[str, Any]) -> str:
    """SHA-256 (hex) of :func:`canonical_definition`."""
    return sha256_hex(canonical_definition(definition).encode("utf-8"))


def revision_ref(revision: int, digest: str) -> str:
    """``qltd:v1:<revision>:<contentDigest>`` (a Run's ``task_revision``)."""
    if not isinstance(revision, int) or isinstance(revision, bool) or not 1 <= revision <= MAX_INT32:
        raise StoreError("task revision must be 1..2147483647", code="invalid_input")
    if not isinstance(digest, str) or HEX64.fullmatch(digest) is None:
        raise StoreError("task content digest must be 64 lowercase hex", code="invalid_input")
    return f"{REVISION_REF_PREFIX}{revision}:{digest}"


def parse_revision_ref(text: str) -> tuple[int, str]:
    """Inverse of :func:`revision_ref`.

    Raises:
        StoreError: ``invalid_input``.
    """
    match = _REF.fullmatch(text) if isinstance(text, str) else None
    if match is None or int(match.group(1)) > MAX_INT32:
        raise StoreError("not a qltd:v1 task revision ref", code="invalid_input")
    return int(match.group(1)), match.group(2)


def execution_revision_digest(project_id: str, task_id: str, ref: str, definition: dict[str, Any]) -> str:
    """SHA-256 (hex) of what a ``local_process`` launch executes for this revision.

    Canonical JSON of ``{"schema": EXECUTION_SCHEMA, "projectId", "taskId", "taskRevision":
    ref, "executorType": "local_process", "definition"}``; reported by task.start as
    ``executionRevisionDigest`` and stored in the ``run.created`` event.
    """
    document = {
        "schema": EXECUTION_SCHEMA,
        "projectId": project_id,
        "taskId": task_id,
        "taskRevision": ref,
        "executorType": "local_process",
        "definition": definition,
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return sha256_hex(text.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class TaskRevisionRecord:
    """One immutable revision (the launcher reads ``definition``)."""

    project_id: str
    task_id: str
    revision: int
    content_digest: str
    definition: dict[str, Any]
    executable: bool
    mutation_id: str
    created_at_ms: int

    @property
    def ref(self) -> str:
        return revision_ref(self.revision, self.content_digest)


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A task head with its current revision."""

    project_id: str
    task_id: str
    name: str
    status: str
    version: int
    created_at_ms: int
    updated_at_ms: int
    current: TaskRevisionRecord

    def to_json(self) -> dict[str, Any]:
        """A display form (admin CLI): camelCase, definition included."""
        return {
            "projectId": self.project_id,
            "taskId": self.task_id,
            "name": self.name,
            "status": self.status,
            "revision": self.current.revision,
            "contentDigest": self.current.content_digest,
            "executable": self.current.executable,
            "definition": self.current.definition,
            "createdAtMs": self.created_at_ms,
            "updatedAtMs": self.updated_at_ms,
        }


@dataclass(frozen=True, slots=True)
class TaskWriteResult:
    """``created`` (new task), ``revised`` (new revision) or ``existing`` (nothing changed)."""

    status: str
    task: TaskRecord


_TASK_SELECT = """
SELECT t.project_id, t.id, t.name, t.status, t.version, t.created_at_ms, t.updated_at_ms,
       r.revision, r.content_digest, r.definition_json, r.executable, r.mutation_id, r.created_at_ms
FROM "QingLongEdgeTasks" AS t
JOIN "QingLongEdgeTaskRevisions" AS r
  ON r.project_id = t.project_id AND r.task_id = t.id AND r.revision = t.current_revision
"""


def _revision(row: tuple[Any, ...]) -> TaskRevisionRecord:
    """Row order: project_id, task_id, revision, definition_json, executable, mutation_id,
    created_at_ms, content_digest."""
    try:
        definition = json.loads(row[3])
    except (TypeError, ValueError):
        raise StoreError("stored task definition is not JSON", code="storage_unavailable") from None
    return TaskRevisionRecord(
        project_id=row[0], task_id=row[1], revision=row[2], content_digest=row[7],
        definition=definition, executable=bool(row[4]), mutation_id=row[5], created_at_ms=row[6],
    )


def _task(row: tuple[Any, ...]) -> TaskRecord:
    revision = _revision((row[0], row[1], row[7], row[9], row[10], row[11], row[12], row[8]))
    return TaskRecord(row[0], row[1], row[2], row[3], row[4], row[5], row[6], revision)


def get_task(conn: sqlite3.Connection, project_id: str, task_id: str) -> TaskRecord | None:
    row = conn.execute(_TASK_SELECT + " WHERE t.project_id = ? AND t.id = ?", (project_id, task_id)).fetchone()
    return None if row is None else _task(row)


def list_tasks(
    conn: sqlite3.Connection, project_id: str, *, limit: int = 64, after_task_id: str | None = None
) -> list[TaskRecord]:
    """Tasks of a project ordered by id, at most ``limit`` (1-1000), after ``after_task_id``."""
    if not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise StoreError("limit must be 1-1000", code="invalid_input")
    rows = conn.execute(
        _TASK_SELECT + " WHERE t.project_id = ? AND t.id > ? ORDER BY t.id LIMIT ?",
        (project_id, after_task_id or "", limit),
    ).fetchall()
    return [_task(row) for row in rows]


def get_task_revision(
    conn: sqlite3.Connection, project_id: str, task_id: str, revision: int
) -> TaskRevisionRecord | None:
    row = conn.execute(
        "SELECT project_id, task_id, revision, definition_json, executable, mutation_id, created_at_ms, content_digest"
        ' FROM "QingLongEdgeTaskRevisions" WHERE project_id = ? AND task_id = ? AND revision = ?',
        (project_id, task_id, revision),
    ).fetchone()
    return None if row is None else _revision(row)


def resolve_revision_ref(conn: sqlite3.Connection, project_id: str, task_id: str, ref: str) -> TaskRevisionRecord:
    """The revision a Run's ``task_revision`` names, with its digest verified.

    Raises:
        StoreError: ``invalid_input`` (bad ref), ``not_found`` (no such revision or the
            digest differs: the definition is not what the Run was started with).
    """
    revision, digest = parse_revision_ref(ref)
    record = get_task_revision(conn, project_id, task_id, revision)
    if record is None or record.content_digest != digest or content_digest(record.definition) != digest:
        raise StoreError(f"task {project_id}/{task_id} revision {revision} is missing or altered", code="not_found")
    return record


def _check_ids(project_id: str, task_id: str) -> None:
    if not isinstance(project_id, str) or not 1 <= len(project_id) <= 128 or has_control(project_id):
        raise StoreError("project id must be 1-128 characters without control characters", code="invalid_input")
    if not isinstance(task_id, str) or API_ID.fullmatch(task_id) is None:
        raise StoreError("task id must match [A-Za-z0-9][A-Za-z0-9._:-]{0,127}", code="invalid_input")


def create_task(
    conn: sqlite3.Connection,
    *,
    project_id: str,
    task_id: str,
    name: str,
    definition: object,
    mutation_id: str,
    created_by: Subject,
    now_ms: int,
) -> TaskWriteResult:
    """Create a task, or append a revision when the definition or name changed.

    The same ``mutation_id`` replays (``existing``) when it carried the same definition;
    reused for another definition it is a ``conflict``. An unchanged definition and name
    with a new mutation id is ``existing`` too (no empty revision). A disabled task stays
    disabled.

    Raises:
        StoreError: ``invalid_input``, ``not_found`` (project), ``conflict``.
    """
    _check_ids(project_id, task_id)
    if not isinstance(name, str) or not 1 <= len(name) <= 255 or has_control(name):
        raise StoreError("task name must be 1-255 characters without control characters", code="invalid_input")
    if not isinstance(mutation_id, str) or API_ID.fullmatch(mutation_id) is None:
        raise StoreError("mutation id must match [A-Za-z0-9][A-Za-z0-9._:-]{0,127}", code="invalid_input")
    if not isinstance(now_ms, int) or isinstance(now_ms, bool) or not 0 <= now_ms <= MAX_SAFE_INTEGER:
        raise StoreError("clock value is not a safe non-negative integer", code="invalid_input")
    normalized = normalize_definition(definition)
    text = canonical_definition(normalized)
    digest = content_digest(normalized)
    with write_transaction(conn):
        if conn.execute('SELECT 1 FROM "QingLong3Projects" WHERE id = ?', (project_id,)).fetchone() is None:
            raise StoreError(f"project {project_id} does not exist", code="not_found")
        replay = conn.execute(
            'SELECT content_digest FROM "QingLongEdgeTaskRevisions"'
            " WHERE project_id = ? AND task_id = ? AND mutation_id = ?",
            (project_id, task_id, mutation_id),
        ).fetchone()
        current = get_task(conn, project_id, task_id)
        if replay is not None:
            if replay[0] != digest or current is None:
                raise StoreError(f"mutation {mutation_id} was already used for another definition", code="conflict")
            return TaskWriteResult("existing", current)
        if current is not None and current.current.content_digest == digest and current.name == name:
            return TaskWriteResult("existing", current)
        revision = 1 if current is None else current.current.revision + 1
        if revision > MAX_INT32 or (current is not None and current.version >= MAX_INT32):
            raise StoreError(f"task {task_id} revision space exhausted", code="conflict")
        conn.execute(
            'INSERT INTO "QingLongEdgeTaskRevisions" (project_id, task_id, revision, content_digest, definition_json,'
            " executable, mutation_id, created_by_type, created_by_id, created_at_ms)"
            " VALUES (?, ?, ?, ?, ?, 1, ?, ?, ?, ?)",
            (project_id, task_id, revision, digest, text, mutation_id, created_by.type, created_by.id, now_ms),
        )
        if current is None:
            conn.execute(
                'INSERT INTO "QingLongEdgeTasks" (project_id, id, name, status, current_revision, version,'
                " created_at_ms, updated_at_ms) VALUES (?, ?, ?, 'active', 1, 1, ?, ?)",
                (project_id, task_id, name, now_ms, now_ms),
            )
            status = "created"
        else:
            conn.execute(
                'UPDATE "QingLongEdgeTasks" SET name = ?, current_revision = ?, version = version + 1,'
                " updated_at_ms = max(updated_at_ms, ?) WHERE project_id = ? AND id = ?",
                (name, revision, now_ms, project_id, task_id),
            )
            status = "revised"
        written = get_task(conn, project_id, task_id)
    assert written is not None
    return TaskWriteResult(status, written)


def set_task_status(conn: sqlite3.Connection, project_id: str, task_id: str, status: str, now_ms: int) -> str:
    """Set ``active`` or ``disabled``; ``changed`` or ``unchanged``.

    Raises:
        TaskNotFound: no such task. StoreError ``invalid_input`` for a bad status.
    """
    _check_ids(project_id, task_id)
    if status not in ("active", "disabled"):
        raise StoreError("task status must be active or disabled", code="invalid_input")
    with write_transaction(conn):
        current = get_task(conn, project_id, task_id)
        if current is None:
            raise TaskNotFound(f"task {project_id}/{task_id} does not exist")
        if current.status == status:
            return "unchanged"
        conn.execute(
            'UPDATE "QingLongEdgeTasks" SET status = ?, version = version + 1, updated_at_ms = max(updated_at_ms, ?)'
            " WHERE project_id = ? AND id = ?",
            (status, now_ms, project_id, task_id),
        )
    return "changed"


def read_task(conn: sqlite3.Connection, project_id: str, task_id: str) -> TaskRecord:
    """:func:`get_task` in one snapshot, raising :class:`TaskNotFound` when missing."""
    with read_transaction(conn):
        task = get_task(conn, project_id, task_id)
    if task is None:
        raise TaskNotFound(f"task {project_id}/{task_id} does not exist")
    return task
