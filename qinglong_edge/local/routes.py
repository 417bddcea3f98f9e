"""The Local API route table and raw-URL rules (local-api.md 2.3), before authentication.

:func:`resolve` takes the method and the raw request-target (never decoded) and
returns a :class:`Route` or raises :class:`~qinglong_edge.errors.ApiError`:

* 404 ``route_not_found`` for any URL that is empty or over 512 bytes, contains
  ``#`` or ``%`` or more than one ``?``, is not exactly one of the paths below (a
  trailing slash, ``//``, ``.``/``..`` segments or a bad id all miss), any other
  method (HEAD and OPTIONS included), or a ``?`` on a route that takes no query;
* 400 with the route's code (``invalid_run_list_query``,
  ``invalid_run_event_list_query``, ``invalid_run_step_list_query``,
  ``invalid_run_log_read_query``, ``invalid_task_list_query``) for a query
  that breaks the shared grammar: present but empty, a field without exactly one
  ``=`` or with an empty value, a duplicate or unknown name, a non-canonical
  integer (``08``, ``+8``, ``8e0``, ``0x8``, ``-0``), a value out of range, or half
  of a two-part cursor.

Both happen before authentication and are never audited (section 2.2 step 3).

======  ====================================================  ===============  ==========
method  path                                                  operationId      permission
======  ====================================================  ===============  ==========
GET     /api/v3/projects/{projectId}/runs                     run.list         run.read
GET     /api/v3/projects/{projectId}/runs/{runId}             run.get          run.read
GET     /api/v3/projects/{projectId}/runs/{runId}/events      run.events.list  run.read
GET     /api/v3/projects/{projectId}/runs/{runId}/steps       run.steps.list   run.read
POST    /api/v3/projects/{projectId}/runs/{runId}/cancellation run.cancel      run.stop
POST    /api/v3/projects/{projectId}/tasks/{taskId}/runs      task.start       run.start
GET     .../runs/{runId}/attempts/{attemptId}/log              run.log.read     artifact.read
GET     /api/v3/projects/{projectId}/tasks                    task.list        task.read
GET     /api/v3/projects/{projectId}/tasks/{taskId}           task.get         task.read
GET     /api/v3/projects/{projectId}/edge-worker              edge.worker.get  project.read
======  ====================================================  ===============  ==========

``run.log.read`` takes ``offset`` (0..2^53-1, default 0) and ``length`` (1..32768,
default the profile's window) and answers a bad one 400 ``invalid_run_log_read_query``;
``task.list`` takes ``limit`` (1..64, default 32) and ``after_task_id`` (400
``invalid_task_list_query``), as the reference at 308aa75. ``edge.worker.get`` is ours
(the Remote Worker's state for the status console; no query).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from qinglong_edge.errors import ApiError

__all__ = [
    "MAX_SAFE_INTEGER",
    "MAX_URL_BYTES",
    "Route",
    "resolve",
]

#: Raw URL cap in bytes (local-api.md 2.1).
MAX_URL_BYTES: Final = 512
MAX_SAFE_INTEGER: Final = 2**53 - 1
MAX_INT32: Final = 2_147_483_647
#: The largest ``length`` of ``run.log.read`` (ADR-0377: Local edge and standalone).
MAX_LOG_READ_BYTES: Final = 32 * 1024
#: List page sizes (local-api.md 9.2-9.4).
DEFAULT_LIMIT: Final = 32
MAX_LIMIT: Final = 64

# ID segment grammar (local-api.md 2.3).
_ID = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}"
_ID_RE = re.compile(_ID)
_CANONICAL_INT_RE = re.compile(r"0|[1-9][0-9]{0,15}")

_PATHS: Final = (
    ("GET", re.compile(rf"/api/v3/projects/(?P<project>{_ID})/runs"), "run.list"),
    ("GET", re.compile(rf"/api/v3/projects/(?P<project>{_ID})/runs/(?P<run>{_ID})"), "run.get"),
    ("GET", re.compile(rf"/api/v3/projects/(?P<project>{_ID})/runs/(?P<run>{_ID})/events"), "run.events.list"),
    ("GET", re.compile(rf"/api/v3/projects/(?P<project>{_ID})/runs/(?P<run>{_ID})/steps"), "run.steps.list"),
    ("POST", re.compile(rf"/api/v3/projects/(?P<project>{_ID})/runs/(?P<run>{_ID})/cancellation"), "run.cancel"),
    ("POST", re.compile(rf"/api/v3/projects/(?P<project>{_ID})/tasks/(?P<task>{_ID})/runs"), "task.start"),
    ("GET", re.compile(rf"/api/v3/projects/(?P<project>{_ID})/runs/(?P<run>{_ID})/attempts/(?P<attempt>{_ID})/log"),
     "run.log.read"),
    ("GET", re.compile(rf"/api/v3/projects/(?P<project>{_ID})/tasks"), "task.list"),
    ("GET", re.compile(rf"/api/v3/projects/(?P<project>{_ID})/tasks/(?P<task>{_ID})"), "task.get"),
    ("GET", re.compile(rf"/api/v3/projects/(?P<project>{_ID})/edge-worker"), "edge.worker.get"),
)

#: operationId -> permission (local-api.md 2.2 step 5.3).
PERMISSIONS: Final[Mapping[str, str]] = {
    "run.list": "run.read",
    "run.get": "run.read",
    "run.events.list": "run.read",
    "run.steps.list": "run.read",
    "run.cancel": "run.stop",
    "task.start": "run.start",
    "run.log.read": "artifact.read",
    "task.list": "task.read",
    "task.get": "task.read",
    "edge.worker.get": "project.read",
}

#: Routes whose body is strict JSON (local-api.md 2.2 step 5.9); the rest take none.
JSON_BODY_ROUTES: Final = frozenset({"run.cancel", "task.start"})

_QUERY_CODES: Final[Mapping[str, str]] = {
    "run.list": "invalid_run_list_query",
    "run.events.list": "invalid_run_event_list_query",
    "run.steps.list": "invalid_run_step_list_query",
    "run.log.read": "invalid_run_log_read_query",
    "task.list": "invalid_task_list_query",
}


@dataclass(frozen=True, slots=True)
class Route:
    """A resolved request.

    Attributes:
        operation_id: ``run.list`` ... ``task.start`` (also the audit ``operationId``).
        permission: the policy permission it needs.
        project_id: the ``{projectId}`` segment.
        run_id: ``{runId}`` for run routes, else None.
        task_id: ``{taskId}`` for ``task.start`` and ``task.get``, else None.
        attempt_id: ``{attemptId}`` for ``run.log.read``, else None.
        query: parsed query values with defaults applied: ``limit`` (int) and the
            route's cursor fields (int or str; None when absent).
    """

    operation_id: str
    permission: str
    project_id: str
    run_id: str | None = None
    task_id: str | None = None
    attempt_id: str | None = None
    query: Mapping[str, int | str | None] = field(default_factory=dict)

    @property
    def json_body(self) -> bool:
        """The route reads a JSON body (``bodyMode: json``, at most 512 bytes)."""
        return self.operation_id in JSON_BODY_ROUTES


def _not_found() -> ApiError:
    return ApiError(404, "route_not_found")


def resolve(method: str, target: str) -> Route:
    """Resolve ``method`` + raw ``target`` to a route (local-api.md 2.3).

    Args:
        method: the request method, case-sensitive.
        target: the raw request-target exactly as received.

    Raises:
        ApiError: 404 ``route_not_found``, or 400 with the route's query code.
    """
    raw = target.encode("utf-8", "surrogateescape")
    if not raw or len(raw) > MAX_URL_BYTES or "#" in target or "%" in target or target.count("?") > 1:
        raise _not_found()
    path, question, query = target.partition("?")
    for route_method, pattern, operation in _PATHS:
        match = pattern.fullmatch(path)
        if match is None:
            continue
        if method != route_method:
            raise _not_found()
        groups = match.groupdict()
        if operation in _QUERY_CODES:
            values = _parse_query(operation, query if question else None)
        elif question:
            raise _not_found()
        else:
            values = {}
        return Route(
            operation_id=operation,
            permission=PERMISSIONS[operation],
            project_id=groups["project"],
            run_id=groups.get("run"),
            task_id=groups.get("task"),
            attempt_id=groups.get("attempt"),
            query=values,
        )
    raise _not_found()


# Per-route query fields: name -> (kind, low, high); kind "int" or "id".
_QUERY_FIELDS: Final[Mapping[str, Mapping[str, tuple[str, int, int]]]] = {
    "run.list": {
        "limit": ("int", 1, MAX_LIMIT),
        "after_created_at_ms": ("int", 0, MAX_SAFE_INTEGER),
        "after_run_id": ("id", 0, 0),
    },
    "run.events.list": {
        "limit": ("int", 1, MAX_LIMIT),
        "after_sequence": ("int", 0, MAX_INT32),
    },
    "run.steps.list": {
        "limit": ("int", 1, MAX_LIMIT),
        "after_step_key": ("id", 0, 0),
        "after_step_run_id": ("id", 0, 0),
    },
    "run.log.read": {
        "offset": ("int", 0, MAX_SAFE_INTEGER),
        "length": ("int", 1, MAX_LOG_READ_BYTES),
    },
    "task.list": {
        "limit": ("int", 1, MAX_LIMIT),
        "after_task_id": ("id", 0, 0),
    },
}
# Cursor fields that must come together.
_PAIRS: Final[Mapping[str, tuple[str, str]]] = {
    "run.list": ("after_created_at_ms", "after_run_id"),
    "run.steps.list": ("after_step_key", "after_step_run_id"),
}
_DEFAULTS: Final[Mapping[str, Mapping[str, int | str | None]]] = {
    "run.list": {"limit": DEFAULT_LIMIT, "after_created_at_ms": None, "after_run_id": None},
    "run.events.list": {"limit": DEFAULT_LIMIT, "after_sequence": 0},
    "run.steps.list": {"limit": DEFAULT_LIMIT, "after_step_key": None, "after_step_run_id": None},
    # length None: the profile's window (edge 16 KiB, standalone 32 KiB), applied by the API.
    "run.log.read": {"offset": 0, "length": None},
    "task.list": {"limit": DEFAULT_LIMIT, "after_task_id": None},
}


def _parse_query(operation: str, query: str | None) -> dict[str, int | str | None]:
    """The shared list-query grammar (local-api.md 2.3); None means no ``?`` at all."""
    values = dict(_DEFAULTS[operation])
    if query is None:
        return values
    error = ApiError(400, _QUERY_CODES[operation])
    if not query:
        raise error
    fields = _QUERY_FIELDS[operation]
    seen: set[str] = set()
    for part in query.split("&"):
        name, equals, value = part.partition("=")
        if not equals or "=" in value or not value or name in seen or name not in fields:
            raise error
        seen.add(name)
        kind, low, high = fields[name]
        if kind == "int":
            if _CANONICAL_INT_RE.fullmatch(value) is None:
                raise error
            number = int(value)
            if not low <= number <= high:
                raise error
            values[name] = number
        else:
            if _ID_RE.fullmatch(value) is None:
                raise error
            values[name] = value
    pair = _PAIRS.get(operation)
    if pair is not None and (values[pair[0]] is None) != (values[pair[1]] is None):
        raise error
    return values

