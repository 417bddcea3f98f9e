"""``qinglong/remote-run-activation@v1``: the starting, start-failure and running calls.

Sources: remote-execution.md sections 3.1-3.3 and 6; reference ``remoteRunActivation.ts``
(command rules), ``remoteRunActivationDelivery.ts`` (response parser, snapshot shapes),
``remoteActivationHttpsClient.ts`` (bodies, echo check) and ``executionInboxProcessor.ts``
(``assertActivation``, ``nextCallbackAuthority``), all at c699c32.

Requests (compact JSON, this key order, at most 4 096 bytes)::

    starting, start-failure   {runId, attemptId, workerGeneration, offerId, leaseGeneration,
                               leaseToken, expectedLeaseVersion}                  (fence7)
    running                   fence7 + {executorHandle, logArtifactId (string or null),
                               callbackSequence, callbackTokenDigest}

Limits: runId/attemptId dispatch ids (1-128, no ctrl) and <= 36 (JS length); offerId
<= 128; generations int31 >= 1; expectedLeaseVersion int31 >= 0; leaseToken
``[A-Za-z0-9_-]{32,128}``; executorHandle 1-512 (JS length), no ctrl; logArtifactId a
dispatch id <= 36; callbackSequence int31 >= 1; callbackTokenDigest 64 lowercase hex.

Response (2-16 384 bytes) ``{schema, status, snapshot}``; validation order:

1. size, strict JSON (duplicate keys and invalid UTF-8 rejected: stricter than the
   reference), an object with exactly these keys, ``schema``;
2. ``status`` in :data:`ACTIVATION_STATUSES`;
3. snapshot: exactly the required keys ``runId, attemptId, runStatus, attemptStatus,
   leaseVersion, leaseGeneration, callbackSequence`` plus optional ``deadlineAtMs,
   startedAtMs, finishedAtMs, executorHandle, logArtifactId, errorCode`` (``null`` is not
   absent: rejected); ``runStatus``/``attemptStatus`` in :data:`RUN_STATUSES` /
   :data:`RUN_ATTEMPT_STATUSES`; ids <= 36; the three numbers int31 >= 0; times safe
   ints >= 0; handle 1-512; errorCode 1-128;
4. shape: *starting* (``dispatching/starting``, no handle, startedAt, finishedAt or
   errorCode), *running* (``running/running`` with handle and startedAt, no finishedAt
   or errorCode) or *terminal* (equal ``failed|cancelled|timed_out``, no handle or
   startedAt, with finishedAt and errorCode); ``already_starting`` => starting,
   ``already_running`` => running, ``already_terminal`` => terminal;
5. worker checks 3-6: runId, attemptId, leaseGeneration echo the request;
   ``lease.version <= leaseVersion <= lease.version`` (``+ 1`` for start-failure);
   callbackSequence int31; ``deadlineAtMs`` present iff the revision has ``timeoutMs``;
6. running and start-failure: ``already_starting`` is invalid (T8; a start failure it
   answers was not applied: retried as any invalid answer, never acknowledged).

A workflow-task attempt whose starting snapshot says ``running/starting`` is rejected,
as the reference does (section 3.1).

Errors: :class:`~qinglong_edge.contracts.ingress.CallError` with code
``activation_request_invalid`` (builders, :func:`parse_activation_request`) or
``activation_response_invalid`` (:func:`parse_activation_response`,
:func:`next_callback_sequence`); ``reason`` is the field code, or one of ``schema``,
``status``, ``run_status``, ``attempt_status``, ``snapshot_shape``, ``status_shape``,
``echo_mismatch``, ``lease_version``, ``deadline``, ``callback_sequence``.
"""

from __future__ import annotations

from qinglong_edge.contracts._shape import Frozen, child, exact_keys, int_value, object_value
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import MAX_INT32, dispatch_id, js_length, string
from qinglong_edge.contracts.ids import HEX64, LEASE_TOKEN
from qinglong_edge.contracts.ingress import (
    CallError,
    Fence,
    echo,
    fence7,
    fence_of,
    guard,
    request_bytes,
    schema_document,
)
from qinglong_edge.contracts.strictjson import loads

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.contracts.records import InternalOffer

__all__ = [
    "ACTIVATION_REQUEST_MAX_BYTES",
    "ACTIVATION_RESPONSE_MAX_BYTES",
    "ACTIVATION_SCHEMA",
    "ACTIVATION_STATUSES",
    "RUN_ATTEMPT_STATUSES",
    "RUN_STATUSES",
    "ActivationResult",
    "next_callback_sequence",
    "parse_activation_request",
    "parse_activation_response",
    "running_request_body",
    "start_failure_request_body",
    "starting_request_body",
]

ACTIVATION_SCHEMA = "qinglong/remote-run-activation@v1"
#: The default worker-ingress client request cap (section 3.1).
ACTIVATION_REQUEST_MAX_BYTES = 4096
#: ``MAX_REMOTE_RUN_ACTIVATION_RESPONSE_BYTES``.
ACTIVATION_RESPONSE_MAX_BYTES = 16 * 1024
ACTIVATION_STATUSES: tuple[str, ...] = ("applied", "already_starting", "already_running", "already_terminal")
#: ``run/run.ts`` ``RUN_STATUSES`` / ``RUN_ATTEMPT_STATUSES``.
RUN_STATUSES: tuple[str, ...] = (
    "created", "queued", "dispatching", "running", "waiting_approval", "retry_wait", "lost", "succeeded",
    "failed", "cancelled", "timed_out",
)
RUN_ATTEMPT_STATUSES: tuple[str, ...] = (
    "claimed", "starting", "running", "succeeded", "failed", "cancelled", "timed_out", "lost",
)
_OPERATIONS = ("starting", "start-failure", "running")
_FENCE7 = ("runId", "attemptId", "workerGeneration", "offerId", "leaseGeneration", "leaseToken",
           "expectedLeaseVersion")
_RUNNING_KEYS = (*_FENCE7, "executorHandle", "logArtifactId", "callbackSequence", "callbackTokenDigest")
_SNAPSHOT_REQUIRED = ("runId", "attemptId", "runStatus", "attemptStatus", "leaseVersion", "leaseGeneration",
                      "callbackSequence")
_SNAPSHOT_OPTIONAL = ("deadlineAtMs", "startedAtMs", "finishedAtMs", "executorHandle", "logArtifactId", "errorCode")
_TERMINAL = ("failed", "cancelled", "timed_out")


def _short_id(value: object, path: str) -> str:
    text = dispatch_id(value, path)
    if js_length(text) > 36:
        raise ContractError("length", path, "must be at most 36 characters")
    return text


def _handle(value: object, path: str) -> str:
    return string(value, path, max_length=512)


def _running_fields(
    executor_handle: object, log_artifact_id: object, callback_sequence: object, callback_token_digest: object
) -> None:
    _handle(executor_handle, "$.executorHandle")
    if log_artifact_id is not None:
        _short_id(log_artifact_id, "$.logArtifactId")
    int_value(callback_sequence, "$.callbackSequence", 1, MAX_INT32)
    string(callback_token_digest, "$.callbackTokenDigest", min_length=64, max_length=64, pattern=HEX64)


def _fence(offer: object) -> Fence:
    return fence_of(offer).check(short_ids=True, project=False)


def starting_request_body(offer: InternalOffer) -> bytes:
    """The starting body (fence7, section 3.1) for the stored internal offer; T1 and T2.

    Raises:
        CallError: ``activation_request_invalid``.
    """
    with guard("activation_request_invalid"):
        return request_bytes(fence7(_fence(offer)), ACTIVATION_REQUEST_MAX_BYTES)


def start_failure_request_body(offer: InternalOffer) -> bytes:
    """The start-failure body (fence7, section 3.2; the same bytes as starting); T9.

    Raises:
        CallError: ``activation_request_invalid``.
    """
    return starting_request_body(offer)


def running_request_body(
    offer: InternalOffer,
    *,
    executor_handle: str,
    log_artifact_id: str | None,
    callback_sequence: int,
    callback_token_digest: str,
) -> bytes:
    """The running body (section 3.3), T8: fence7 + the launch barrier's stored values.

    Args:
        executor_handle: the record's ``executorHandle`` (1-512 chars, no ctrl).
        log_artifact_id: the record's ``logArtifactId`` (<= 36), or None: sent as ``null``.
        callback_sequence: the record's ``completionReceiptCallbackSequence``.
        callback_token_digest: the record's ``completionReceiptTokenDigest``.

    Raises:
        CallError: ``activation_request_invalid``.
    """
    with guard("activation_request_invalid"):
        body = fence7(_fence(offer))
        _running_fields(executor_handle, log_artifact_id, callback_sequence, callback_token_digest)
        body.update(executorHandle=executor_handle, logArtifactId=log_artifact_id,
                    callbackSequence=callback_sequence, callbackTokenDigest=callback_token_digest)
        return request_bytes(body, ACTIVATION_REQUEST_MAX_BYTES)


def parse_activation_request(body: bytes, operation: str) -> dict[str, Any]:
    """The server-side view of a request body (what the cluster double accepts).

    Exactly fence7 (plus the four running keys for ``running``), every limit of the
    builders, strict JSON, at most 4 096 bytes.

    Returns:
        The decoded body (key order as received).

    Raises:
        CallError: ``activation_request_invalid``.
    """
    with guard("activation_request_invalid"):
        if operation not in _OPERATIONS:
            raise ContractError("pattern", "$.operation", "not an activation call")
        value = object_value(loads(body, max_bytes=ACTIVATION_REQUEST_MAX_BYTES, min_bytes=2), "$")
        exact_keys(value, _RUNNING_KEYS if operation == "running" else _FENCE7, "$")
        _short_id(value["runId"], "$.runId")
        _short_id(value["attemptId"], "$.attemptId")
        dispatch_id(value["offerId"], "$.offerId")
        int_value(value["workerGeneration"], "$.workerGeneration", 1, MAX_INT32)
        int_value(value["leaseGeneration"], "$.leaseGeneration", 1, MAX_INT32)
        int_value(value["expectedLeaseVersion"], "$.expectedLeaseVersion", 0, MAX_INT32)
        string(value["leaseToken"], "$.leaseToken", min_length=32, max_length=128, pattern=LEASE_TOKEN)
        if operation == "running":
            _running_fields(value["executorHandle"], value["logArtifactId"], value["callbackSequence"],
                            value["callbackTokenDigest"])
        return value


class ActivationResult(Frozen):
    """A valid activation answer.

    Attributes:
        status: one of :data:`ACTIVATION_STATUSES`.
        shape: ``starting``, ``running`` or ``terminal`` (the snapshot's consistent shape).
        snapshot: the snapshot keys present, as received (``runId, attemptId, runStatus,
            attemptStatus, leaseVersion, leaseGeneration, callbackSequence`` and any of
            ``deadlineAtMs, startedAtMs, finishedAtMs, executorHandle, logArtifactId,
            errorCode``).
    """

    __slots__ = ("status", "shape", "snapshot")  # noqa: RUF023 (field order)

    status: str
    shape: str
    snapshot: dict[str, Any]

    def __init__(self, status: str, shape: str, snapshot: dict[str, Any]) -> None:
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "snapshot", snapshot)

    @property
    def callback_sequence(self) -> int:
        """The attempt's stored callback sequence (int31 >= 0)."""
        return int(self.snapshot["callbackSequence"])

    @property
    def lease_version(self) -> int:
        return int(self.snapshot["leaseVersion"])

    @property
    def deadline_at_ms(self) -> int | None:
        """The cluster's deadline (DB clock, ms) when the revision has ``timeoutMs``."""
        value = self.snapshot.get("deadlineAtMs")
        return None if value is None else int(value)


def _snapshot(value: object) -> dict[str, Any]:
    snapshot = object_value(value, "$.snapshot")
    exact_keys(snapshot, _SNAPSHOT_REQUIRED, "$.snapshot", _SNAPSHOT_OPTIONAL)
    run_status, attempt_status = snapshot["runStatus"], snapshot["attemptStatus"]
    if not isinstance(run_status, str) or run_status not in RUN_STATUSES:
        raise ContractError("run_status", "$.snapshot.runStatus", "not a Run status")
    if not isinstance(attempt_status, str) or attempt_status not in RUN_ATTEMPT_STATUSES:
        raise ContractError("attempt_status", "$.snapshot.attemptStatus", "not an attempt status")
    _short_id(snapshot["runId"], "$.snapshot.runId")
    _short_id(snapshot["attemptId"], "$.snapshot.attemptId")
    for key in ("leaseVersion", "leaseGeneration", "callbackSequence"):
        int_value(snapshot[key], child("$.snapshot", key), 0, MAX_INT32)
    for key in ("deadlineAtMs", "startedAtMs", "finishedAtMs"):
        if key in snapshot:
            int_value(snapshot[key], child("$.snapshot", key))
    if "executorHandle" in snapshot:
        _handle(snapshot["executorHandle"], "$.snapshot.executorHandle")
    if "logArtifactId" in snapshot:
        _short_id(snapshot["logArtifactId"], "$.snapshot.logArtifactId")
    if "errorCode" in snapshot:
        string(snapshot["errorCode"], "$.snapshot.errorCode", max_length=128)
    return snapshot


def _shape(snapshot: dict[str, Any]) -> str:
    run, attempt = snapshot["runStatus"], snapshot["attemptStatus"]
    handle, started = "executorHandle" in snapshot, "startedAtMs" in snapshot
    finished, error = "finishedAtMs" in snapshot, "errorCode" in snapshot
    if (run, attempt) == ("dispatching", "starting") and not (handle or started or finished or error):
        return "starting"
    if (run, attempt) == ("running", "running") and handle and started and not (finished or error):
        return "running"
    if run == attempt and run in _TERMINAL and finished and error and not (handle or started):
        return "terminal"
    raise ContractError("snapshot_shape", "$.snapshot", "not a starting, running or terminal snapshot")


_PAIRING = {"already_starting": "starting", "already_running": "running", "already_terminal": "terminal"}


def parse_activation_response(body: bytes, offer: InternalOffer, *, operation: str) -> ActivationResult:
    """Validate a 200 answer to starting, start-failure or running (module docstring order).

    Args:
        body: the raw response body (the transport applied the acceptance rules).
        offer: the stored internal offer the request was built from (its
            ``lease.version``, ids and ``executionRevision.timeoutMs``).
        operation: ``starting``, ``start-failure`` or ``running``.

    Returns:
        :class:`ActivationResult`.

    Raises:
        CallError: ``activation_response_invalid`` (nothing else; no body text in it).
    """
    with guard("activation_response_invalid"):
        if operation not in _OPERATIONS:
            raise ContractError("pattern", "$.operation", "not an activation call")
        value = schema_document(body, max_bytes=ACTIVATION_RESPONSE_MAX_BYTES, schema=ACTIVATION_SCHEMA,
                                keys=("schema", "status", "snapshot"))
        status = value["status"]
        if not isinstance(status, str) or status not in ACTIVATION_STATUSES:
            raise ContractError("status", "$.status", "not an activation status")
        snapshot = _snapshot(value["snapshot"])
        shape = _shape(snapshot)
        if status in _PAIRING and _PAIRING[status] != shape:
            raise ContractError("status_shape", "$.status", f"{status} with a {shape} snapshot")
        # Worker checks 3-6 against the offer the request was built from.
        fence = fence_of(offer)
        echo(snapshot["runId"], fence.run_id, "$.snapshot.runId")
        echo(snapshot["attemptId"], fence.attempt_id, "$.snapshot.attemptId")
        echo(snapshot["leaseGeneration"], fence.lease_generation, "$.snapshot.leaseGeneration")
        stored = int_value(fence.expected_lease_version, "$.offer.lease.version")
        upper = stored + 1 if operation == "start-failure" else stored
        if not stored <= snapshot["leaseVersion"] <= upper:
            raise ContractError("lease_version", "$.snapshot.leaseVersion", "outside the stored lease version bounds")
        revision = object_value(object_value(offer, "$.offer").get("executionRevision"), "$.offer.executionRevision")
        if ("timeoutMs" in revision) != ("deadlineAtMs" in snapshot):
            raise ContractError("deadline", "$.snapshot.deadlineAtMs", "present iff the revision has timeoutMs")
        if operation in ("running", "start-failure") and status == "already_starting":
            # T8; and a start failure answered already_starting was not applied (issue 23
            # item 8: invalid, retried, as the reference does; never taken as acknowledged).
            raise ContractError("status", "$.status", f"{operation} cannot answer already_starting")
        return ActivationResult(status, shape, snapshot)


def next_callback_sequence(result: ActivationResult) -> int:
    """T2: the starting replay's ``snapshot.callbackSequence + 1`` (int31 >= 1).

    Raises:
        CallError: ``activation_response_invalid`` (reason ``status``) unless the replay
            answered ``applied`` or ``already_starting``; reason ``callback_sequence``
            when the next sequence leaves int31.
    """
    if result.status not in ("applied", "already_starting"):
        raise CallError("activation_response_invalid", "$.status",
                        "the starting replay must answer applied or already_starting", reason="status")
    sequence = result.callback_sequence + 1
    if not 1 <= sequence <= MAX_INT32:
        raise CallError("activation_response_invalid", "$.snapshot.callbackSequence", "next sequence leaves int31",
                        reason="callback_sequence")
    return sequence
