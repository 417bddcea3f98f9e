"""``run.log.read`` bodies: ``qinglong/run-attempt-log-read-result@v1`` (issue 26 item 1).

Sources (read for facts): the reference's ``runAttemptLogReadRoute.ts`` and
``runAttemptLogRead.ts`` at 308aa75, ``localRunAttemptLogRangeReader.ts`` (the Local
file adapter), ADR-0377 (profile windows, states), and the later route test that adds
the ``retired`` state (410).

Bodies, keys in wire order (``strictjson.dumps`` them as they are):

* 200 ``available``: ``schema``, ``status``, ``projectId``, ``runId``, ``attemptId``,
  ``range`` {``start``, ``endExclusive``, ``totalBytes``, ``nextOffset`` (only when
  ``endExclusive < totalBytes``)}, ``encoding`` ``"base64"``, ``content`` (standard
  base64 with padding, as Node's ``Buffer.toString('base64')``), ``truncation``;
* 202 ``pending``: ``schema``, ``status``, ``projectId``, ``runId``, ``attemptId``;
* 410 ``retired``: ``schema``, ``status``, ``projectId``, ``runId``, ``attemptId``,
  ``retiredAtMs``, ``byteLength``, ``truncation``;
* errors ``{"code": ...}``: 400 ``invalid_run_log_read_query`` (before authentication),
  400 ``invalid_run_log_read_request``, 404 ``artifact_not_found``, 503
  ``artifact_unavailable``.

``truncation`` is ``{"truncated": true|false, "maximumBytes"?: n >= 1, "observedAtMs"?:
n >= 0}`` or exactly ``{"truncated": "unknown"}`` (no other key with ``unknown``).

Range rules (the reference's ``available`` invariants): ``start = min(offset,
totalBytes)``, ``endExclusive = start + len(content) <= totalBytes``, ``len(content) <=
length``; an offset at or past the end is an empty ``available`` range with ``start =
totalBytes`` and no ``nextOffset`` (polling never meets a 416). A broken invariant
raises :class:`~qinglong_edge.contracts.errors.ContractError`
``invalid_run_log_read_result``: the route answers 503, never a malformed 200.
"""

from __future__ import annotations

import base64
import re
from typing import Any, Final

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import MAX_SAFE_INTEGER

__all__ = [
    "DEFAULT_READ_BYTES",
    "LOCAL_LOG_ARTIFACT_ID",
    "MAX_READ_BYTES",
    "RUN_LOG_READ_SCHEMA",
    "UNKNOWN_TRUNCATION",
    "available_body",
    "pending_body",
    "retired_body",
    "truncation_view",
]

RUN_LOG_READ_SCHEMA: Final = "qinglong/run-attempt-log-read-result@v1"
#: The largest window one request may ask for (``length``), every Local profile.
MAX_READ_BYTES: Final = 32 * 1024
#: The window when ``length`` is absent: edge 16 KiB, standalone 32 KiB (ADR-0377 3).
DEFAULT_READ_BYTES: Final = {"edge": 16 * 1024, "standalone": 32 * 1024}
#: A Local attempt's ``log_artifact_id`` (the reference's ``local-*`` grammar).
LOCAL_LOG_ARTIFACT_ID: Final = re.compile(r"local-[a-f0-9]{30}")
UNKNOWN_TRUNCATION: Final = {"truncated": "unknown"}
_RESULT = "invalid_run_log_read_result"


def _bad(message: str) -> ContractError:
    return ContractError(_RESULT, "$", message)


def _count(value: object, low: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= MAX_SAFE_INTEGER:
        raise _bad(f"{what} is not an integer {low}..2^53-1")
    return value


def truncation_view(
    truncated: bool | str, *, maximum_bytes: int | None = None, observed_at_ms: int | None = None
) -> dict[str, Any]:
    """The ``truncation`` object: ``truncated`` true/false with the optional facts, or
    exactly ``{"truncated":"unknown"}``.

    Raises:
        ContractError: ``invalid_run_log_read_result`` (a value out of range, or a fact
            given with ``"unknown"``).
    """
    if truncated == "unknown":
        if maximum_bytes is not None or observed_at_ms is not None:
            raise _bad("an unknown truncation carries no facts")
        return dict(UNKNOWN_TRUNCATION)
    if not isinstance(truncated, bool):
        raise _bad("truncated must be true, false or 'unknown'")
    view: dict[str, Any] = {"truncated": truncated}
    if maximum_bytes is not None:
        view["maximumBytes"] = _count(maximum_bytes, 1, "maximumBytes")
    if observed_at_ms is not None:
        view["observedAtMs"] = _count(observed_at_ms, 0, "observedAtMs")
    return view


def _checked_truncation(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad("truncation must be an object")
    extra = set(value) - {"truncated", "maximumBytes", "observedAtMs"}
    if extra or "truncated" not in value:
        raise _bad("truncation has unknown or missing keys")
    return truncation_view(value["truncated"], maximum_bytes=value.get("maximumBytes"),
                           observed_at_ms=value.get("observedAtMs"))


def _head(status: str, project_id: str, run_id: str, attempt_id: str) -> dict[str, Any]:
    for value, what in ((project_id, "projectId"), (run_id, "runId"), (attempt_id, "attemptId")):
        if not isinstance(value, str) or not value:
            raise _bad(f"{what} must be a non-empty string")
    return {"schema": RUN_LOG_READ_SCHEMA, "status": status, "projectId": project_id, "runId": run_id,
            "attemptId": attempt_id}


def available_body(
    project_id: str,
    run_id: str,
    attempt_id: str,
    *,
    offset: int,
    length: int,
    content: bytes,
    total_bytes: int,
    truncation: dict[str, Any],
) -> dict[str, Any]:
    """The 200 body for ``content`` read at ``min(offset, total_bytes)`` of a log of
    ``total_bytes`` bytes (``length``: the window asked for, 1..:data:`MAX_READ_BYTES`).

    Raises:
        ContractError: ``invalid_run_log_read_result`` (see the module docstring).
    """
    _count(offset, 0, "offset")
    if _count(length, 1, "length") > MAX_READ_BYTES:
        raise _bad(f"length exceeds {MAX_READ_BYTES}")
    total = _count(total_bytes, 0, "totalBytes")
    if not isinstance(content, bytes | bytearray | memoryview):
        raise _bad("content must be bytes")
    start = min(offset, total)
    end = start + len(content)
    if end > total or len(content) > length:
        raise _bad("content exceeds the log or the window")
    body = _head("available", project_id, run_id, attempt_id)
    window: dict[str, int] = {"start": start, "endExclusive": end, "totalBytes": total}
    if end < total:
        window["nextOffset"] = end
    body["range"] = window
    body["encoding"] = "base64"
    body["content"] = base64.b64encode(bytes(content)).decode("ascii")
    body["truncation"] = _checked_truncation(truncation)
    return body


def pending_body(project_id: str, run_id: str, attempt_id: str) -> dict[str, Any]:
    """The 202 body: the attempt has no log yet (it has not started writing one)."""
    return _head("pending", project_id, run_id, attempt_id)


def retired_body(
    project_id: str, run_id: str, attempt_id: str, *, retired_at_ms: int, byte_length: int,
    truncation: dict[str, Any],
) -> dict[str, Any]:
    """The 410 body: the log was removed by retention (``retiredAtMs``, the size it had).

    Raises:
        ContractError: ``invalid_run_log_read_result``.
    """
    body = _head("retired", project_id, run_id, attempt_id)
    body["retiredAtMs"] = _count(retired_at_ms, 0, "retiredAtMs")
    body["byteLength"] = _count(byte_length, 0, "byteLength")
    body["truncation"] = _checked_truncation(truncation)
    return body
