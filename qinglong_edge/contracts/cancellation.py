"""Local API bodies: ``qinglong/run-cancellation@v1`` and ``qinglong/task-start@v1``.

Sources: local-api.md sections 1.1-1.2, 2.4, 8.1 and 9.5; reference
``clusterRunCancellation.ts`` and ``taskStart.ts``.

Decoding (:func:`decode_local_api_body`): the HTTP layer hands over the exact
``Content-Length`` bytes (<= 512). One leading UTF-8 BOM is stripped (Node's
``TextDecoder`` does so), then :mod:`~qinglong_edge.contracts.strictjson` decodes.
**Decision:** local-api.md 1.1 notes that the reference keeps the last of duplicate
keys; the spec README rejects duplicate JSON keys everywhere with a typed error, and we
follow the README: ``{"schema":..,"mutationId":"a","mutationId":"b"}`` is a
``duplicate_key`` decode error (the route answers 400 ``invalid_request_body``, as for
any other JSON failure). NaN/Infinity, lone surrogates, invalid UTF-8, depth > 32 and
trailing data are decode errors too.

Request parsing raises :class:`~qinglong_edge.contracts.errors.ContractError` whose
``code`` is the route's 400 code (``invalid_run_cancellation_request`` /
``invalid_task_start_request``) and whose ``path`` names the offending value. Result
builders raise ``invalid_run_cancellation_result`` / ``invalid_task_start_result``
when an invariant breaks: the route must answer 503 (never a malformed 2xx).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from qinglong_edge.contracts._shape import child
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import MAX_INT32, MAX_SAFE_INTEGER
from qinglong_edge.contracts.ids import API_ID, HEX64, UUID_ANY
from qinglong_edge.contracts.strictjson import loads

__all__ = [
    "CANCELLATION_STATUSES",
    "CANCEL_REASONS",
    "LOCAL_API_MAX_BODY_BYTES",
    "RUN_CANCELLATION_SCHEMA",
    "RUN_STATUSES",
    "TASK_START_SCHEMA",
    "TERMINAL_RUN_STATUSES",
    "RunCancellationRequest",
    "TaskStartRequest",
    "decode_local_api_body",
    "invalid_request_body",
    "parse_run_cancellation_request",
    "parse_task_start_request",
    "run_cancellation_result",
    "task_start_result",
]

RUN_CANCELLATION_SCHEMA = "qinglong/run-cancellation@v1"
TASK_START_SCHEMA = "qinglong/task-start@v1"
#: ``maximumBodyBytes`` for the JSON routes (local-api.md 2.2 step 5.9).
LOCAL_API_MAX_BODY_BYTES = 512
_BOM = b"\xef\xbb\xbf"

#: RunStatus (local-api.md 8.1).
RUN_STATUSES: tuple[str, ...] = (
    "created", "queued", "dispatching", "running", "waiting_approval", "retry_wait", "lost",
    "succeeded", "failed", "cancelled", "timed_out",
)
#: Terminal *for this contract*: ``lost`` is not (a lost Run can still be cancelled).
TERMINAL_RUN_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "timed_out"})
CANCELLATION_STATUSES: tuple[str, ...] = ("accepted", "already_requested", "already_terminal")
CANCEL_REASONS: tuple[str, ...] = ("user", "policy", "shutdown", "reconcile", "timeout")
TASK_START_STATUSES: tuple[str, ...] = ("accepted", "existing")
TASK_START_EXECUTOR_TYPES: tuple[str, ...] = ("local_process", "remote_worker")

_CANCEL_REQUEST = "invalid_run_cancellation_request"
_CANCEL_RESULT = "invalid_run_cancellation_result"
_START_REQUEST = "invalid_task_start_request"
_START_RESULT = "invalid_task_start_result"


def decode_local_api_body(body: bytes) -> object:
    """Decode a Local API JSON body: at most 512 bytes, one leading BOM stripped, strict JSON.

    Raises:
        ContractError: strict-JSON codes (``too_large``, ``too_small``, ``invalid_json``,
            ``duplicate_key``...): the route answers 400 ``invalid_request_body``.
    """
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise ContractError("not_bytes", "$", "input is not bytes")
    if len(body) > LOCAL_API_MAX_BODY_BYTES:
        raise ContractError("too_large", "$", f"body exceeds {LOCAL_API_MAX_BODY_BYTES} bytes")
    data = bytes(body)
    if data.startswith(_BOM):
        data = data[len(_BOM):]
    return loads(data, max_bytes=LOCAL_API_MAX_BODY_BYTES)


def invalid_request_body(schema: str) -> dict[str, str]:
    """The 400 body of a schema failure: ``{"code": ..., "schema": ...}`` (local-api.md 1.3, 9.5)."""
    code = _CANCEL_REQUEST if schema == RUN_CANCELLATION_SCHEMA else _START_REQUEST
    return {"code": code, "schema": schema}


def _object(value: object, code: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ContractError(code, "$", "body must be a JSON object")
    return value


def _exact(value: dict[str, Any], keys: tuple[str, ...], code: str) -> None:
    for key in value:
        if key not in keys:
            raise ContractError(code, child("$", key), "unknown key")
    for key in keys:
        if key not in value:
            raise ContractError(code, child("$", key), "missing key")


def _match(value: object, pattern: re.Pattern[str], path: str, code: str) -> str:
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise ContractError(code, path, "does not match the grammar")
    return value


def _int(value: object, path: str, low: int, high: int, code: str) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ContractError(code, path, f"must be an integer {low}..{high}")
    return value


@dataclass(frozen=True, slots=True)
class RunCancellationRequest:
    """A valid ``qinglong/run-cancellation@v1`` request."""

    mutation_id: str


def parse_run_cancellation_request(value: object) -> RunCancellationRequest:
    """Validate a decoded cancellation body (local-api.md 1.1).

    Exactly ``schema`` (``qinglong/run-cancellation@v1``) and ``mutationId``
    (``[A-Za-z0-9][A-Za-z0-9._:-]{0,127}``), in any order.

    Raises:
        ContractError: code ``invalid_run_cancellation_request`` (route: 400 with
            :func:`invalid_request_body`), path of the offending value.
    """
    body = _object(value, _CANCEL_REQUEST)
    _exact(body, ("schema", "mutationId"), _CANCEL_REQUEST)
    if body["schema"] != RUN_CANCELLATION_SCHEMA:
        raise ContractError(_CANCEL_REQUEST, "$.schema", f"must be {RUN_CANCELLATION_SCHEMA}")
    return RunCancellationRequest(_match(body["mutationId"], API_ID, "$.mutationId", _CANCEL_REQUEST))


def run_cancellation_result(
    *,
    status: str,
    project_id: str,
    run_id: str,
    run_status: str,
    run_version: int,
    event_sequence: int,
    cancel_requested_at_ms: int | None = None,
    cancel_reason: str | None = None,
) -> dict[str, Any]:
    """The cancellation result body in wire key order (local-api.md 1.2).

    ``schema, status, projectId, runId, runStatus, runVersion, eventSequence`` then,
    only when the Run has an intent, ``cancelRequestedAtMs, cancelReason``.
    Invariants: ``accepted``/``already_requested`` carry the cancel pair and a
    non-terminal ``runStatus``; ``already_terminal`` has a terminal ``runStatus``
    (``succeeded, failed, cancelled, timed_out``; ``lost`` is not terminal here).

    Returns:
        A dict ready for ``strictjson.dumps`` (keys in wire order).

    Raises:
        ContractError: ``invalid_run_cancellation_result``; the route answers 503
            ``run_cancellation_unavailable``.
    """
    code = _CANCEL_RESULT
    if status not in CANCELLATION_STATUSES:
        raise ContractError(code, "$.status", "unknown cancellation status")
    if run_status not in RUN_STATUSES:
        raise ContractError(code, "$.runStatus", "unknown run status")
    has_intent = cancel_requested_at_ms is not None
    if has_intent != (cancel_reason is not None):
        raise ContractError(code, "$.cancelReason", "cancelRequestedAtMs and cancelReason come as a pair")
    terminal = run_status in TERMINAL_RUN_STATUSES
    if status in ("accepted", "already_requested") and (not has_intent or terminal):
        raise ContractError(code, "$.status", f"{status} needs a cancel intent on a non-terminal run")
    if status == "already_terminal" and not terminal:
        raise ContractError(code, "$.runStatus", "already_terminal needs a terminal run status")
    body: dict[str, Any] = {
        "schema": RUN_CANCELLATION_SCHEMA,
        "status": status,
        "projectId": _match(project_id, API_ID, "$.projectId", code),
        "runId": _match(run_id, API_ID, "$.runId", code),
        "runStatus": run_status,
        "runVersion": _int(run_version, "$.runVersion", 1, MAX_INT32, code),
        "eventSequence": _int(event_sequence, "$.eventSequence", 0, MAX_INT32, code),
    }
    if has_intent:
        body["cancelRequestedAtMs"] = _int(cancel_requested_at_ms, "$.cancelRequestedAtMs", 0, MAX_SAFE_INTEGER, code)
        if cancel_reason not in CANCEL_REASONS:
            raise ContractError(code, "$.cancelReason", "unknown cancel reason")
        body["cancelReason"] = cancel_reason
    return body


@dataclass(frozen=True, slots=True)
class TaskStartRequest:
    """A valid ``qinglong/task-start@v1`` request."""

    mutation_id: str
    expected_revision: int
    expected_content_digest: str


def parse_task_start_request(value: object) -> TaskStartRequest:
    """Validate a decoded task.start body (local-api.md 9.5).

    Exactly ``schema``, ``mutationId`` (lowercase canonical UUID), ``expectedRevision``
    (1..2^31-1) and ``expectedContentDigest`` (64 lowercase hex).

    Raises:
        ContractError: code ``invalid_task_start_request`` (route: 400).
    """
    code = _START_REQUEST
    body = _object(value, code)
    _exact(body, ("schema", "mutationId", "expectedRevision", "expectedContentDigest"), code)
    if body["schema"] != TASK_START_SCHEMA:
        raise ContractError(code, "$.schema", f"must be {TASK_START_SCHEMA}")
    return TaskStartRequest(
        mutation_id=_match(body["mutationId"], UUID_ANY, "$.mutationId", code),
        expected_revision=_int(body["expectedRevision"], "$.expectedRevision", 1, MAX_INT32, code),
        expected_content_digest=_match(body["expectedContentDigest"], HEX64, "$.expectedContentDigest", code),
    )


def task_start_result(
    *,
    status: str,
    project_id: str,
    task_id: str,
    task_revision: int,
    task_content_digest: str,
    run_id: str,
    attempt_id: str,
    executor_type: str,
    execution_revision_digest: str,
    created_at_ms: int,
) -> dict[str, Any]:
    """The task.start result body in wire key order (local-api.md 9.5).

    ``schema, status, projectId, taskId, taskRevision, taskContentDigest, runId,
    attemptId, runStatus ("queued"), runVersion (2), eventSequence (2), executorType,
    executionRevisionDigest, createdAtMs``.

    Raises:
        ContractError: ``invalid_task_start_result`` (route: 503 ``task_start_unavailable``).
    """
    code = _START_RESULT
    if status not in TASK_START_STATUSES:
        raise ContractError(code, "$.status", "must be accepted or existing")
    if executor_type not in TASK_START_EXECUTOR_TYPES:
        raise ContractError(code, "$.executorType", "unknown executor type")
    return {
        "schema": TASK_START_SCHEMA,
        "status": status,
        "projectId": _match(project_id, API_ID, "$.projectId", code),
        "taskId": _match(task_id, API_ID, "$.taskId", code),
        "taskRevision": _int(task_revision, "$.taskRevision", 1, MAX_INT32, code),
        "taskContentDigest": _match(task_content_digest, HEX64, "$.taskContentDigest", code),
        "runId": _match(run_id, UUID_ANY, "$.runId", code),
        "attemptId": _match(attempt_id, UUID_ANY, "$.attemptId", code),
        "runStatus": "queued",
        "runVersion": 2,
        "eventSequence": 2,
        "executorType": executor_type,
        "executionRevisionDigest": _match(execution_revision_digest, HEX64, "$.executionRevisionDigest", code),
        "createdAtMs": _int(created_at_ms, "$.createdAtMs", 0, MAX_SAFE_INTEGER, code),
    }
