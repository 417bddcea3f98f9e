"""The artifact stream upload and the completion call (T10).

Sources: remote-execution.md sections 3.6, 3.7 and 6; reference
``remoteWorkerCompletion.ts`` and ``remoteWorkerCompletionHttpsClient.ts`` at c699c32;
spec README "Artifact" (we check the echoed sha256 against our own).

**Artifact upload** ``POST .../artifacts`` with ``content-type:``
:data:`ARTIFACT_CONTENT_TYPE`, ``accept: application/json`` and an exact
``content-length = 4 + H + N`` (no chunking). Body: a 4-byte big-endian ``H``, ``H`` bytes
of header JSON (2-4 096), then the ``N`` raw log bytes (0-67 108 864). Header keys, in
this order: ``schema, workerGeneration, projectId, runId, attemptId, offerId,
leaseGeneration, leaseToken, expectedLeaseVersion, logArtifactId (^wlog-[a-f0-9]{30}$),
byteLength (= N), truncated (true | false | null: null when no truncation fact)``.
:func:`artifact_upload_preamble` gives the prefix and header; the log is streamed after it.

Artifact answer (2-4 096 bytes), keys exactly ``schema, status (stored | already_stored),
projectId, runId, attemptId, logArtifactId, byteLength, sha256, truncated``; order:
size, JSON, object, keys, schema, ``truncated`` boolean or null, status, runId/attemptId
dispatch ids, logArtifactId (<= 36 bytes, the wlog grammar), sha256 (64 lowercase hex),
projectId (1-128 bytes), byteLength (0-64 MiB); then projectId, runId, attemptId,
logArtifactId, byteLength and truncated echo the header, and ``sha256`` equals the
digest of the bytes we streamed (reason ``sha256_mismatch``).

**Completion** ``POST .../completion`` (request <= 16 384 bytes, answer <= 4 096), keys in
this order: ``schema, workerGeneration, projectId, runId, attemptId, offerId,
leaseGeneration, leaseToken, expectedLeaseVersion, callbackSequence (int31 >= 1),
callbackTokenDigest (64 hex), result {outcome, startedAtMs, finishedAtMs, exitCode},
artifact {logArtifactId, byteLength, sha256, truncated}``. ``outcome`` is ``succeeded``
iff ``exitCode == 0`` (else ``failed``; the cluster alone decides cancelled/timed_out);
exitCode 0-255; times safe ints with ``finishedAtMs >= startedAtMs``. Answer keys exactly
``schema, status (applied | already_completed | already_terminal), runId, attemptId,
callbackSequence (int31 >= 1)``, echoing the request's runId, attemptId and sequence.

Fence limits for both: runId/attemptId/offerId dispatch ids (no 36 limit); projectId
1-128 bytes; generations int31 >= 1; expectedLeaseVersion int31 >= 0; lease-token grammar.

Errors: :class:`~qinglong_edge.contracts.ingress.CallError` ``artifact_request_invalid``,
``artifact_response_invalid``, ``completion_request_invalid``,
``completion_response_invalid``; ``reason`` is the field code or ``schema``, ``status``,
``outcome`` (outcome/exitCode disagree), ``time_order``, ``framing``, ``echo_mismatch``,
``sha256_mismatch``.
"""

from __future__ import annotations

import re

from qinglong_edge.contracts._shape import Frozen, child, exact_keys, int_value, object_value
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import MAX_INT32, dispatch_id, string
from qinglong_edge.contracts.ids import HEX64
from qinglong_edge.contracts.ingress import (
    check_execution_fence,
    echo,
    equal,
    execution_fence,
    fence_of,
    guard,
    request_bytes,
    schema_document,
)
from qinglong_edge.contracts.strictjson import dumps_bytes, loads

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.contracts.records import InternalOffer

__all__ = [
    "ARTIFACT_CONTENT_TYPE",
    "ARTIFACT_HEADER_MAX_BYTES",
    "ARTIFACT_RESPONSE_MAX_BYTES",
    "ARTIFACT_SCHEMA",
    "COMPLETION_REQUEST_MAX_BYTES",
    "COMPLETION_RESPONSE_MAX_BYTES",
    "COMPLETION_SCHEMA",
    "LOG_ARTIFACT_ID",
    "MAX_ARTIFACT_BYTES",
    "ArtifactReceipt",
    "CompletionResult",
    "artifact_upload_preamble",
    "completion_outcome",
    "completion_request_body",
    "parse_artifact_header",
    "parse_artifact_response",
    "parse_completion_request",
    "parse_completion_response",
]

ARTIFACT_SCHEMA = "qinglong/remote-worker-artifact-upload@v1"
COMPLETION_SCHEMA = "qinglong/remote-worker-completion@v1"
ARTIFACT_CONTENT_TYPE = "application/vnd.qinglong.worker-artifact"
MAX_ARTIFACT_BYTES = 64 * 1024 * 1024
ARTIFACT_HEADER_MAX_BYTES = 4 * 1024
ARTIFACT_RESPONSE_MAX_BYTES = 4 * 1024
COMPLETION_REQUEST_MAX_BYTES = 16 * 1024
COMPLETION_RESPONSE_MAX_BYTES = 4 * 1024
LOG_ARTIFACT_ID = re.compile(r"wlog-[a-f0-9]{30}")
_HEADER_KEYS = ("schema", "workerGeneration", "projectId", "runId", "attemptId", "offerId", "leaseGeneration",
                "leaseToken", "expectedLeaseVersion", "logArtifactId", "byteLength", "truncated")
_ARTIFACT_RESPONSE_KEYS = ("schema", "status", "projectId", "runId", "attemptId", "logArtifactId", "byteLength",
                           "sha256", "truncated")
_COMPLETION_KEYS = ("schema", "workerGeneration", "projectId", "runId", "attemptId", "offerId", "leaseGeneration",
                    "leaseToken", "expectedLeaseVersion", "callbackSequence", "callbackTokenDigest", "result",
                    "artifact")
_RESULT_KEYS = ("outcome", "startedAtMs", "finishedAtMs", "exitCode")
_ARTIFACT_KEYS = ("logArtifactId", "byteLength", "sha256", "truncated")


def _log_artifact_id(value: object, path: str) -> str:
    return string(value, path, max_length=36, utf8_bytes=True, pattern=LOG_ARTIFACT_ID)


def _sha256(value: object, path: str) -> str:
    return string(value, path, min_length=64, max_length=64, pattern=HEX64)


def _truncated(value: object, path: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ContractError("not_boolean", path, "must be true, false or null")
    return value


def _byte_length(value: object, path: str) -> int:
    return int_value(value, path, 0, MAX_ARTIFACT_BYTES)


def artifact_upload_preamble(
    offer: InternalOffer,
    *,
    log_artifact_id: str,
    byte_length: int,
    truncated: bool | None,
) -> bytes:
    """The first ``4 + H`` bytes of the upload: the big-endian length ``H`` and the header.

    The caller sends ``content-length: len(preamble) + byte_length`` and then exactly
    ``byte_length`` log bytes. The preamble holds the lease token: never log it.

    Args:
        log_artifact_id: the record's ``wlog-`` id.
        byte_length: the log file's size in bytes (0-67 108 864).
        truncated: the truncation fact's ``quotaReached``, or None without a fact.

    Raises:
        CallError: ``artifact_request_invalid``.
    """
    with guard("artifact_request_invalid"):
        header = execution_fence(ARTIFACT_SCHEMA, fence_of(offer).check())
        header.update(logArtifactId=_log_artifact_id(log_artifact_id, "$.logArtifactId"),
                      byteLength=_byte_length(byte_length, "$.byteLength"),
                      truncated=_truncated(truncated, "$.truncated"))
        data = dumps_bytes(header)
        if not 2 <= len(data) <= ARTIFACT_HEADER_MAX_BYTES:
            raise ContractError("too_large", "$", f"header exceeds {ARTIFACT_HEADER_MAX_BYTES} bytes")
        return len(data).to_bytes(4, "big") + data


def parse_artifact_header(body_prefix: bytes, *, content_length: int | None = None) -> tuple[dict[str, Any], int]:
    """The server-side view of an upload's start: ``(header, 4 + H)``.

    ``body_prefix`` is at least the first ``4 + H`` bytes of the body (more is ignored).

    Args:
        content_length: the request's ``content-length``; when given it must be at least 6
            and equal ``4 + H + header["byteLength"]`` (the cluster answers 400 otherwise).

    Raises:
        CallError: ``artifact_request_invalid`` (reason ``framing`` for the length prefix
            or the content length).
    """
    with guard("artifact_request_invalid"):
        if not isinstance(body_prefix, (bytes, bytearray)) or len(body_prefix) < 6:
            raise ContractError("framing", "$", "an upload starts with 4 length bytes and a header")
        size = int.from_bytes(body_prefix[:4], "big")
        if not 2 <= size <= ARTIFACT_HEADER_MAX_BYTES or len(body_prefix) < 4 + size:
            raise ContractError("framing", "$", f"header length outside 2..{ARTIFACT_HEADER_MAX_BYTES}")
        value = object_value(loads(bytes(body_prefix[4:4 + size]), max_bytes=ARTIFACT_HEADER_MAX_BYTES,
                                   min_bytes=2), "$")
        exact_keys(value, _HEADER_KEYS, "$")
        if value["schema"] != ARTIFACT_SCHEMA:
            raise ContractError("schema", "$.schema", f"must be {ARTIFACT_SCHEMA}")
        _truncated(value["truncated"], "$.truncated")
        check_execution_fence(value)
        _log_artifact_id(value["logArtifactId"], "$.logArtifactId")
        _byte_length(value["byteLength"], "$.byteLength")
        if content_length is not None and content_length != 4 + size + value["byteLength"]:
            raise ContractError("framing", "$", "content-length is not 4 + H + byteLength")
        return value, 4 + size


class ArtifactReceipt(Frozen):
    """A valid artifact answer: ``status`` (``stored``/``already_stored``), ``sha256`` (ours)."""

    __slots__ = ("status", "log_artifact_id", "byte_length", "sha256", "truncated")  # noqa: RUF023

    status: str
    log_artifact_id: str
    byte_length: int
    sha256: str
    truncated: bool | None

    def __init__(self, status: str, log_artifact_id: str, byte_length: int, sha256: str,
                 truncated: bool | None) -> None:
        _set = object.__setattr__
        _set(self, "status", status)
        _set(self, "log_artifact_id", log_artifact_id)
        _set(self, "byte_length", byte_length)
        _set(self, "sha256", sha256)
        _set(self, "truncated", truncated)


def parse_artifact_response(
    body: bytes,
    offer: InternalOffer,
    *,
    log_artifact_id: str,
    byte_length: int,
    truncated: bool | None,
    sha256: str,
) -> ArtifactReceipt:
    """Validate a 200 artifact answer against what was uploaded (module docstring order).

    Args:
        offer: the stored internal offer the header was built from.
        log_artifact_id / byte_length / truncated: the header's values.
        sha256: our own SHA-256 hex over the ``byte_length`` bytes streamed.

    Raises:
        CallError: ``artifact_response_invalid``.
    """
    with guard("artifact_response_invalid"):
        value = schema_document(body, max_bytes=ARTIFACT_RESPONSE_MAX_BYTES, schema=ARTIFACT_SCHEMA,
                                keys=_ARTIFACT_RESPONSE_KEYS)
        received_truncated = _truncated(value["truncated"], "$.truncated")
        if value["status"] not in ("stored", "already_stored"):
            raise ContractError("status", "$.status", "must be stored or already_stored")
        dispatch_id(value["runId"], "$.runId")
        dispatch_id(value["attemptId"], "$.attemptId")
        received_id = _log_artifact_id(value["logArtifactId"], "$.logArtifactId")
        received_sha = _sha256(value["sha256"], "$.sha256")
        string(value["projectId"], "$.projectId", max_length=128, utf8_bytes=True)
        received_length = _byte_length(value["byteLength"], "$.byteLength")
        fence = fence_of(offer)
        echo(value["projectId"], fence.project_id, "$.projectId")
        echo(value["runId"], fence.run_id, "$.runId")
        echo(value["attemptId"], fence.attempt_id, "$.attemptId")
        echo(received_id, log_artifact_id, "$.logArtifactId")
        echo(received_length, byte_length, "$.byteLength")
        if not equal(received_truncated, truncated):
            raise ContractError("echo_mismatch", "$.truncated", "does not echo the request")
        if received_sha != sha256:
            raise ContractError("sha256_mismatch", "$.sha256", "is not the digest of the bytes uploaded")
        return ArtifactReceipt(value["status"], received_id, received_length, received_sha, received_truncated)


def completion_outcome(exit_code: int) -> str:
    """``succeeded`` for exit code 0, else ``failed`` (section 3.7)."""
    return "succeeded" if exit_code == 0 else "failed"


def _check_result(result: dict[str, Any], path: str) -> None:
    exact_keys(result, _RESULT_KEYS, path)
    outcome = result["outcome"]
    if outcome not in ("succeeded", "failed"):
        raise ContractError("outcome", child(path, "outcome"), "must be succeeded or failed")
    started = int_value(result["startedAtMs"], child(path, "startedAtMs"))
    finished = int_value(result["finishedAtMs"], child(path, "finishedAtMs"))
    exit_code = int_value(result["exitCode"], child(path, "exitCode"), 0, 255)
    if finished < started:
        raise ContractError("time_order", child(path, "finishedAtMs"), "must be >= startedAtMs")
    if (outcome == "succeeded") != (exit_code == 0):
        raise ContractError("outcome", child(path, "outcome"), "succeeded iff exitCode is 0")


def _check_completion(value: dict[str, Any]) -> None:
    """``normalizeRemoteWorkerCompletionCommand`` over a decoded body, in its order."""
    check_execution_fence(value)
    _check_result(object_value(value["result"], "$.result"), "$.result")
    artifact = object_value(value["artifact"], "$.artifact")
    exact_keys(artifact, _ARTIFACT_KEYS, "$.artifact")
    _log_artifact_id(artifact["logArtifactId"], "$.artifact.logArtifactId")
    _sha256(artifact["sha256"], "$.artifact.sha256")
    _sha256(value["callbackTokenDigest"], "$.callbackTokenDigest")
    _truncated(artifact["truncated"], "$.artifact.truncated")
    int_value(value["callbackSequence"], "$.callbackSequence", 1, MAX_INT32)
    _byte_length(artifact["byteLength"], "$.artifact.byteLength")


def completion_request_body(
    offer: InternalOffer,
    *,
    callback_sequence: int,
    callback_token_digest: str,
    started_at_ms: int,
    finished_at_ms: int,
    exit_code: int,
    log_artifact_id: str,
    byte_length: int,
    sha256: str,
    truncated: bool | None,
    outcome: str | None = None,
) -> bytes:
    """The completion body (section 3.7) for the stored internal offer.

    Args:
        callback_sequence / callback_token_digest: the record's stored pair.
        started_at_ms: the record's ``executorStartedAtMs``; finished_at_ms >= it.
        exit_code: 0-255 (143/137 after SIGTERM/SIGKILL, 255 "outcome lost").
        log_artifact_id, byte_length, sha256, truncated: the stored artifact (the upload's
            receipt; our digest).
        outcome: derived from ``exit_code`` when None; an explicit one must agree.

    Raises:
        CallError: ``completion_request_invalid`` (e.g. reason ``outcome`` for
            ``failed`` with exit code 0).
    """
    with guard("completion_request_invalid"):
        body = execution_fence(COMPLETION_SCHEMA, fence_of(offer).check())
        body.update(
            callbackSequence=callback_sequence,
            callbackTokenDigest=callback_token_digest,
            result={
                "outcome": completion_outcome(exit_code) if outcome is None else outcome,
                "startedAtMs": started_at_ms,
                "finishedAtMs": finished_at_ms,
                "exitCode": exit_code,
            },
            artifact={"logArtifactId": log_artifact_id, "byteLength": byte_length, "sha256": sha256,
                      "truncated": truncated},
        )
        _check_completion(body)
        return request_bytes(body, COMPLETION_REQUEST_MAX_BYTES)


def parse_completion_request(body: bytes) -> dict[str, Any]:
    """The server-side view of a completion body (``parseRemoteWorkerCompletionRequestBody``).

    Raises:
        CallError: ``completion_request_invalid``.
    """
    with guard("completion_request_invalid"):
        value = schema_document(body, max_bytes=COMPLETION_REQUEST_MAX_BYTES, schema=COMPLETION_SCHEMA,
                                keys=_COMPLETION_KEYS)
        _check_completion(value)
        return value


class CompletionResult(Frozen):
    """A valid completion answer: ``status`` (``applied``, ``already_completed``, ``already_terminal``)."""

    __slots__ = ("status", "callback_sequence")  # noqa: RUF023

    status: str
    callback_sequence: int

    def __init__(self, status: str, callback_sequence: int) -> None:
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "callback_sequence", callback_sequence)


def parse_completion_response(body: bytes, offer: InternalOffer, *, callback_sequence: int) -> CompletionResult:
    """Validate a 200 completion answer: exact keys, schema, status, ids, sequence, echo.

    Raises:
        CallError: ``completion_response_invalid``.
    """
    with guard("completion_response_invalid"):
        value = schema_document(body, max_bytes=COMPLETION_RESPONSE_MAX_BYTES, schema=COMPLETION_SCHEMA,
                                keys=("schema", "status", "runId", "attemptId", "callbackSequence"))
        status = value["status"]
        if status not in ("applied", "already_completed", "already_terminal"):
            raise ContractError("status", "$.status", "not a completion status")
        dispatch_id(value["runId"], "$.runId")
        dispatch_id(value["attemptId"], "$.attemptId")
        sequence = int_value(value["callbackSequence"], "$.callbackSequence", 1, MAX_INT32)
        fence = fence_of(offer)
        echo(value["runId"], fence.run_id, "$.runId")
        echo(value["attemptId"], fence.attempt_id, "$.attemptId")
        echo(sequence, callback_sequence, "$.callbackSequence")
        return CompletionResult(status, sequence)
