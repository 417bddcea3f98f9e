"""The artifact stream upload and the completion route of the cluster double (tests and
the demo only): remote-execution.md 3.6-3.7.

Checked against the reference (whyour/qinglong): the stream framing of
``packages/ql3-cluster-control/src/transport/httpSurface.ts`` ``prepareStreamingBody``
(c699c32) and ``packages/ql3-cluster-control/src/remote-execution/remoteWorkerCompletionService.ts``
``ClusterRemoteWorkerArtifactService.upload`` / ``ClusterRemoteWorkerCompletionService.complete``
(308aa75), the header and request parsers of
``packages/ql3-runtime-core/src/remote-execution/remoteWorkerCompletion.ts`` (c699c32), the
authority and completion transactions of
``packages/ql3-cluster-postgres/src/remote-execution/remoteWorkerCompletionRepository.ts``
(c699c32) and the put-if-absent of the S3 artifact store (``S3ClusterRemoteWorkerArtifactStore``).

**artifacts**, in order (every failure before the body is consumed adds ``Connection: close``):

=====================================================================  ===================================
content-encoding other than identity                                   415 ``unsupported_content_encoding``
content-length missing, not digits or < 1                               400 ``invalid_content_length``
content-length > 4 + 4 096 + 67 108 864                                 413 ``request_too_large``
media type (before ``;``, trimmed, lower-cased) not the artifact type   415 ``unsupported_content_type``
content-length < 6                                                      400 ``invalid_worker_request``
body ends inside the prefix or the header (client half-closed)          400 ``content_length_mismatch``
header length H outside 2-4 096; header not JSON, not the 12 keys,
wrong schema, a field out of its rules                                  400 ``invalid_worker_request``
content-length != 4 + H + byteLength                                    400 ``invalid_worker_request``
session not current                                                     409 ``worker_completion_fenced`` (``worker_unavailable``)
attempt unknown / a fence field differs / lease not ``leased`` at the
expected version / expired                                              409 (``missing`` / ``authority_mismatch`` / ``lease_expired``)
attempt not ``starting``+``dispatching`` or ``running``+``running``;
a stored logArtifactId differs; running without one                     409 (``state_mismatch``)
body ends inside the content                                            503 ``worker_ingress_unavailable``
the id already stored with other bytes, length or truncation            503 ``worker_ingress_unavailable``
=====================================================================  ===================================

Then ``stored`` (or ``already_stored`` for the same bytes again). An upload changes no
lease version and no attempt field.

**completion**, in order: the request parser (13 keys, ``artifact`` with its 4 keys,
``result`` with its 4, ``(outcome == succeeded) == (exitCode == 0)``, ``finishedAtMs >=
startedAtMs``...: 400); the store must hold the artifact (else 409 ``state_mismatch``)
with equal byteLength and truncated (else 503) and sha256 (else 409 ``replay_mismatch``);
the session (``worker_unavailable``), identity (``missing`` / ``authority_mismatch``);
an attempt already terminal: lease ``completed`` at ``expected + 1`` with the same
mapping, sequence, digest, logArtifactId, exit code, error codes and stored event payload
-> ``already_completed``, a difference -> ``replay_mismatch``, another lease version ->
``already_terminal``; otherwise a live lease (``authority_mismatch`` / ``lease_expired``),
an active state (``state_mismatch``), ``startedAtMs >= attempt created`` and both times <=
now + 300 000 (``state_mismatch``), the callback evidence (``replay_mismatch``: from
starting ``sequence == stored + 1`` and digest/logArtifactId unset or equal; from running
all three equal). Applied: the lease ``completed`` at ``expected + 1``; attempt and run
**timed_out** if a cancel was requested with reason ``timeout``, else **cancelled** if any
cancel was requested, else **succeeded** for exit code 0, else **failed**; exit code
stored; events ``attempt.<status>`` and ``run.<status>`` keyed
``remote-completion:{attemptId}:{leaseGeneration}:{callbackSequence}:attempt|run``.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from tests.support.cluster_attempts import TERMINAL, Attempt, Fence, Ledger, StoredArtifact, parse_fence
from tests.support.cluster_wire import INT31, MAX_SAFE, Failure, exact_keys, header, identifier, js_int

__all__ = ["ARTIFACT_CONTENT_TYPE", "ARTIFACT_SCHEMA", "COMPLETION_SCHEMA", "MAX_ARTIFACT_BODY_BYTES",
           "complete", "upload"]

ARTIFACT_SCHEMA = "qinglong/remote-worker-artifact-upload@v1"
COMPLETION_SCHEMA = "qinglong/remote-worker-completion@v1"
ARTIFACT_CONTENT_TYPE = "application/vnd.qinglong.worker-artifact"
MAX_ARTIFACT_BYTES = 64 * 1024 * 1024
MAX_HEADER_BYTES = 4096
MAX_ARTIFACT_BODY_BYTES = 4 + MAX_HEADER_BYTES + MAX_ARTIFACT_BYTES
MAX_CLOCK_SKEW_MS = 5 * 60_000
HEADER_KEYS = ("schema", "workerGeneration", "projectId", "runId", "attemptId", "offerId", "leaseGeneration",
               "leaseToken", "expectedLeaseVersion", "logArtifactId", "byteLength", "truncated")
COMPLETION_KEYS = ("schema", "workerGeneration", "projectId", "runId", "attemptId", "offerId", "leaseGeneration",
                   "leaseToken", "expectedLeaseVersion", "callbackSequence", "callbackTokenDigest", "result",
                   "artifact")
_LOG_ARTIFACT_ID = re.compile(r"wlog-[a-f0-9]{30}")
_SHA256 = re.compile(r"[a-f0-9]{64}")
_DIGITS = re.compile(r"[0-9]+")
_INVALID = (400, "invalid_worker_request")
_UNAVAILABLE = (503, "worker_ingress_unavailable")


def _nullable_bool(value: object) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise TypeError("not a boolean or null")


def _log_artifact_id(value: object) -> str:
    text = identifier(value, 36)
    if _LOG_ARTIFACT_ID.fullmatch(text) is None:
        raise TypeError("logArtifactId")
    return text


def _sha256(value: object) -> str:
    text = identifier(value, 64)
    if _SHA256.fullmatch(text) is None:
        raise TypeError("sha256")
    return text


def _header_command(worker_id: str, session_id: str, raw: bytes) -> tuple[Fence, str, int, bool | None]:
    """``parseRemoteWorkerArtifactUploadHeader``; TypeError/ValueError on any violation."""
    document = json.loads(raw.decode("utf-8", errors="replace"))
    body = exact_keys(document, HEADER_KEYS)
    if body["schema"] != ARTIFACT_SCHEMA:
        raise TypeError("schema")
    truncated = _nullable_bool(body["truncated"])
    fence = parse_fence(worker_id, session_id, body, project=True)
    return fence, _log_artifact_id(body["logArtifactId"]), js_int(body["byteLength"], 0, MAX_ARTIFACT_BYTES), truncated


def _active_state(ledger: Ledger, op: str, attempt: Attempt, fence: Fence) -> str:
    if attempt.status == "starting" and attempt.run_status == "dispatching":
        return "starting"
    if attempt.status == "running" and attempt.run_status == "running":
        return "running"
    raise ledger.fence(op, "state_mismatch", fence, close=op == "artifacts")


def _authority(ledger: Ledger, op: str, fence: Fence, now: int, *, live: bool = True) -> Attempt:
    """``assertWorkerCurrent`` + ``assertAuthorityIdentity`` (+ ``assertLiveLease``)."""
    close = op == "artifacts"
    if ledger.session_reason(fence, now) is not None:
        raise ledger.fence(op, "worker_unavailable", fence, close=close)
    attempt = ledger.aggregate(fence)
    if attempt is None:
        raise ledger.fence(op, "missing", fence, close=close)
    if ledger.identity_reason(attempt, fence) is not None:
        raise ledger.fence(op, "authority_mismatch", fence, close=close)
    if live:
        _live_lease(ledger, op, attempt, fence, now)
    return attempt


def _live_lease(ledger: Ledger, op: str, attempt: Attempt, fence: Fence, now: int) -> None:
    reason = ledger.live_lease_reason(attempt, fence, now)
    if reason is not None:
        raise ledger.fence(op, "authority_mismatch" if reason == "version_mismatch" else reason, fence,
                           close=op == "artifacts")


def upload(ledger: Ledger, worker_id: str, session_id: str, headers: tuple[tuple[str, str], ...],
           body: bytes | None, *, complete: bool = True) -> dict[str, Any]:
    """POST artifacts (see the module docstring). ``body`` None: not read (its
    content-length is over the cap); ``complete`` False: the client ended the request
    before content-length bytes came."""
    encoding = header(headers, "content-encoding")
    if encoding and encoding != "identity":
        raise Failure(415, "unsupported_content_encoding", close=True)
    length_text = header(headers, "content-length")
    if length_text is None or _DIGITS.fullmatch(length_text) is None or not 1 <= int(length_text) <= MAX_SAFE:
        raise Failure(400, "invalid_content_length", close=True)
    content_length = int(length_text)
    if content_length > MAX_ARTIFACT_BODY_BYTES:
        raise Failure(413, "request_too_large", close=True)
    media = (header(headers, "content-type") or "").split(";", 1)[0].strip().lower()
    if media != ARTIFACT_CONTENT_TYPE:
        raise Failure(415, "unsupported_content_type", close=True)
    data = body or b""
    if content_length < 6:
        raise Failure(*_INVALID, close=True)
    if len(data) < 4:
        raise Failure(400, "content_length_mismatch", close=True)
    header_length = int.from_bytes(data[:4], "big")
    if not 2 <= header_length <= MAX_HEADER_BYTES:
        raise Failure(*_INVALID, close=True)
    if len(data) < 4 + header_length:
        raise Failure(400, "content_length_mismatch", close=True)
    try:
        fence, log_artifact_id, byte_length, truncated = _header_command(
            worker_id, session_id, data[4:4 + header_length])
    except (TypeError, ValueError, Failure):
        raise Failure(*_INVALID, close=True) from None
    if content_length != 4 + header_length + byte_length:
        raise Failure(*_INVALID, close=True)
    now = ledger.clock_ms()
    attempt = _authority(ledger, "artifacts", fence, now)
    state = _active_state(ledger, "artifacts", attempt, fence)
    if ((attempt.log_artifact_id is not None and attempt.log_artifact_id != log_artifact_id)
            or (state == "running" and attempt.log_artifact_id is None)):
        raise ledger.fence("artifacts", "state_mismatch", fence, close=True)
    content = data[4 + header_length:]
    if not complete or len(content) != byte_length:
        raise Failure(*_UNAVAILABLE, close=True)
    assert fence.project_id is not None
    key = (fence.project_id, fence.run_id, fence.attempt_id, log_artifact_id)
    sha256 = hashlib.sha256(content).hexdigest()
    existing = ledger.artifacts.get(key)
    if existing is not None:
        if (existing.byte_length, existing.truncated, existing.sha256) != (byte_length, truncated, sha256):
            raise Failure(*_UNAVAILABLE)
        status = "already_stored"
    else:
        ledger.artifacts[key] = StoredArtifact(*key, byte_length=byte_length, sha256=sha256, truncated=truncated,
                                               stored_at_ms=now, data=bytes(content))
        status = "stored"
    return {"schema": ARTIFACT_SCHEMA, "status": status, "projectId": fence.project_id, "runId": fence.run_id,
            "attemptId": fence.attempt_id, "logArtifactId": log_artifact_id, "byteLength": byte_length,
            "sha256": sha256, "truncated": truncated}


def _completion_command(worker_id: str, session_id: str, document: object) -> tuple[Fence, dict[str, Any]]:
    """``parseRemoteWorkerCompletionRequestBody``; TypeError on any violation."""
    body = exact_keys(document, COMPLETION_KEYS)
    if body["schema"] != COMPLETION_SCHEMA:
        raise TypeError("schema")
    artifact = exact_keys(body["artifact"], ("logArtifactId", "byteLength", "sha256", "truncated"))
    result = exact_keys(body["result"], ("outcome", "startedAtMs", "finishedAtMs", "exitCode"))
    fence = parse_fence(worker_id, session_id, body, project=True)
    if result["outcome"] not in ("succeeded", "failed"):
        raise TypeError("outcome")
    started, finished = js_int(result["startedAtMs"]), js_int(result["finishedAtMs"])
    exit_code = js_int(result["exitCode"], 0, 255)
    if finished < started or (result["outcome"] == "succeeded") != (exit_code == 0):
        raise TypeError("result inconsistent")
    digest = body["callbackTokenDigest"]
    if not isinstance(digest, str) or _SHA256.fullmatch(digest) is None:
        raise TypeError("callbackTokenDigest")
    return fence, {
        "callbackSequence": js_int(body["callbackSequence"], 1, INT31),
        "callbackTokenDigest": digest,
        "result": {"outcome": result["outcome"], "startedAtMs": started, "finishedAtMs": finished,
                   "exitCode": exit_code},
        "artifact": {"logArtifactId": _log_artifact_id(artifact["logArtifactId"]),
                     "byteLength": js_int(artifact["byteLength"], 0, MAX_ARTIFACT_BYTES),
                     "sha256": _sha256(artifact["sha256"]), "truncated": _nullable_bool(artifact["truncated"])},
    }


def _mapping(attempt: Attempt, exit_code: int) -> tuple[str, str | None]:
    if attempt.cancel_requested_at_ms is not None:
        if attempt.cancel_reason == "timeout":
            return "timed_out", "EXECUTION_TIMED_OUT"
        return "cancelled", "EXECUTION_CANCELLED"
    return ("succeeded", None) if exit_code == 0 else ("failed", "EXECUTION_FAILED")


def _payload(attempt: Attempt, command: dict[str, Any], status: str, error: str | None,
             from_status: str) -> dict[str, Any]:
    """``completionEventPayload``."""
    result, artifact = command["result"], command["artifact"]
    return {
        "attempt_id": attempt.attempt_id, "lease_generation": attempt.lease.lease_generation,
        "from_status": from_status, "to_status": status, "callback_sequence": command["callbackSequence"],
        "callback_token_digest": command["callbackTokenDigest"], "worker_started_at_ms": result["startedAtMs"],
        "worker_finished_at_ms": result["finishedAtMs"], "exit_code": result["exitCode"],
        "log_artifact_id": artifact["logArtifactId"], "artifact_byte_length": artifact["byteLength"],
        "artifact_sha256": artifact["sha256"], "artifact_truncated": artifact["truncated"], "error_code": error,
    }


def _answer(status: str, fence: Fence, command: dict[str, Any]) -> dict[str, Any]:
    return {"schema": COMPLETION_SCHEMA, "status": status, "runId": fence.run_id, "attemptId": fence.attempt_id,
            "callbackSequence": command["callbackSequence"]}


def complete(ledger: Ledger, worker_id: str, session_id: str, document: object) -> dict[str, Any]:
    """POST completion (see the module docstring)."""
    op = "completion"
    try:
        fence, command = _completion_command(worker_id, session_id, document)
    except (TypeError, Failure):
        raise Failure(*_INVALID) from None
    artifact, result = command["artifact"], command["result"]
    assert fence.project_id is not None
    stored = ledger.artifacts.get((fence.project_id, fence.run_id, fence.attempt_id, artifact["logArtifactId"]))
    if stored is None:
        raise ledger.fence(op, "state_mismatch", fence)
    if (stored.byte_length, stored.truncated) != (artifact["byteLength"], artifact["truncated"]):
        raise Failure(*_UNAVAILABLE)
    if stored.sha256 != artifact["sha256"]:
        raise ledger.fence(op, "replay_mismatch", fence)
    now = ledger.clock_ms()
    attempt = _authority(ledger, op, fence, now, live=False)
    lease = attempt.lease
    status, error = _mapping(attempt, result["exitCode"])
    sequence = command["callbackSequence"]
    dedupe = f"remote-completion:{attempt.attempt_id}:{fence.lease_generation}:{sequence}"
    if attempt.status in TERMINAL or attempt.run_status in TERMINAL:
        if attempt.status not in TERMINAL or attempt.run_status not in TERMINAL:
            raise ledger.fence(op, "state_mismatch", fence)
        if lease.status != "completed" or lease.version != fence.expected_lease_version + 1:
            return _answer("already_terminal", fence, command)
        event = attempt.event(f"{dedupe}:attempt")
        from_status = event.payload.get("from_status") if event is not None else None
        if (attempt.run_status != status or attempt.status != status or attempt.callback_sequence != sequence
                or attempt.callback_token_digest != command["callbackTokenDigest"]
                or attempt.log_artifact_id != artifact["logArtifactId"] or attempt.finished_at_ms is None
                or attempt.exit_code != result["exitCode"] or attempt.error_code != error
                or attempt.run_error_code != error or event is None or from_status not in ("starting", "running")
                or event.payload != _payload(attempt, command, status, error, str(from_status))):
            raise ledger.fence(op, "replay_mismatch", fence)
        return _answer("already_completed", fence, command)
    _live_lease(ledger, op, attempt, fence, now)
    state = _active_state(ledger, op, attempt, fence)
    if (result["startedAtMs"] < attempt.created_at_ms or result["startedAtMs"] > now + MAX_CLOCK_SKEW_MS
            or result["finishedAtMs"] > now + MAX_CLOCK_SKEW_MS):
        raise ledger.fence(op, "state_mismatch", fence)
    digest, log_id = command["callbackTokenDigest"], artifact["logArtifactId"]
    if state == "starting":
        evidence_ok = (sequence == attempt.callback_sequence + 1
                       and attempt.callback_token_digest in (None, digest) and attempt.log_artifact_id in (None, log_id))
    else:
        evidence_ok = (sequence == attempt.callback_sequence and attempt.callback_token_digest == digest
                       and attempt.log_artifact_id == log_id)
    if not evidence_ok:
        raise ledger.fence(op, "replay_mismatch", fence)
    started = attempt.started_at_ms if attempt.started_at_ms is not None else result["startedAtMs"]
    terminal_at = max(now, result["finishedAtMs"], started, attempt.run_created_at_ms, attempt.created_at_ms)
    ledger.complete_lease(attempt, fence.expected_lease_version + 1, terminal_at)
    attempt.status = attempt.run_status = status
    attempt.callback_sequence = sequence
    attempt.callback_token_digest = attempt.callback_token_digest or digest
    attempt.log_artifact_id = attempt.log_artifact_id or log_id
    attempt.started_at_ms = started
    if attempt.run_started_at_ms is None:
        attempt.run_started_at_ms = started
    attempt.finished_at_ms = terminal_at
    attempt.exit_code = result["exitCode"]
    attempt.error_code = attempt.run_error_code = error
    attempt.run_version += 2
    attempt.completion = {"status": status, "errorCode": error, "terminalAtMs": terminal_at, "fromStatus": state,
                          "callbackSequence": sequence, "result": dict(result), "artifact": dict(artifact)}
    attempt.add_event(f"attempt.{status}", f"{dedupe}:attempt", _payload(attempt, command, status, error, state),
                      terminal_at)
    attempt.add_event(f"run.{status}", f"{dedupe}:run",
                      {"attempt_id": attempt.attempt_id, "lease_generation": fence.lease_generation,
                       "from_status": "dispatching" if state == "starting" else "running", "to_status": status,
                       "callback_sequence": sequence, "error_code": error}, terminal_at)
    return _answer("applied", fence, command)
