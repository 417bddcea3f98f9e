"""``qinglong/remote-worker-lease-control@v1``: renewal, stop and terminal (T11).

Sources: remote-execution.md sections 3.5, 5 and 6; reference
``remoteWorkerLeaseControl.ts`` (request and response contract) and
``remoteWorkerLeaseControlHttpsClient.ts`` (echo and version checks) at c699c32;
``workerExecutionControlCoordinator.ts`` (the renewedAtMs ordering).

Request (compact JSON, this key order, at most 8 192 bytes)::

    {schema, workerGeneration, projectId, runId, attemptId, offerId, leaseGeneration,
     leaseToken, expectedLeaseVersion}

Limits: runId/attemptId/offerId dispatch ids only (no 36 limit); projectId 1-128 bytes,
no ctrl; generations int31 >= 1; expectedLeaseVersion int31 >= 0; the lease-token grammar.

Answer (2-4 096 bytes) with exactly ``schema, status, projectId, runId, attemptId,
offerId, leaseGeneration, leaseVersion, renewedAtMs, expiresAtMs, stop, terminalStatus``:

* ``renewed``: leaseVersion int31 >= 1, renewedAtMs/expiresAtMs safe ints >= 0 (no int31
  bound) with expiresAtMs > renewedAtMs, ``stop`` and ``terminalStatus`` null;
* ``stop_requested``: the same with ``stop = {reason, requestedAtMs}`` exactly, reason in
  :data:`STOP_REASONS`, requestedAtMs a safe int >= 0 (no order against renewedAtMs);
* ``terminal``: leaseVersion, renewedAtMs, expiresAtMs and stop null; terminalStatus in
  :data:`TERMINAL_STATUSES`.

Order: size, strict JSON, object, exact keys, ``schema``, ``status``, the ids (dispatch
ids, projectId), leaseGeneration, then the status-specific fields as above. Worker checks
after that: projectId, runId, attemptId, offerId and leaseGeneration echo the request;
non-terminal: ``leaseVersion == expectedLeaseVersion + 1``. Unlike the reference's
coordinator, ``renewedAtMs`` is not compared with the stored lease's (spec README
"Decisions for clocks": a newer version is accepted even when the cluster's clock moved
back).

Errors: :class:`~qinglong_edge.contracts.ingress.CallError` ``lease_control_request_invalid``
or ``lease_control_response_invalid``; ``reason`` is the field code or ``schema``,
``status``, ``null_field`` (a field that must be null), ``lease_order``, ``stop_reason``,
``terminal_status``, ``echo_mismatch``, ``version_mismatch``.
"""

from __future__ import annotations

from qinglong_edge.contracts._shape import Frozen, child, exact_keys, int_value, object_value
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import MAX_INT32, dispatch_id, string
from qinglong_edge.contracts.ingress import (
    Fence,
    check_execution_fence,
    echo,
    execution_fence,
    fence_of,
    guard,
    request_bytes,
    schema_document,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.contracts.records import InternalOffer

__all__ = [
    "DEFAULT_LEASE_DURATION_MS",
    "LEASE_CONTROL_REQUEST_MAX_BYTES",
    "LEASE_CONTROL_RESPONSE_MAX_BYTES",
    "LEASE_CONTROL_SCHEMA",
    "LEASE_CONTROL_STATUSES",
    "STOP_REASONS",
    "TERMINAL_STATUSES",
    "LeaseControlResult",
    "lease_control_request_body",
    "parse_lease_control_request",
    "parse_lease_control_response",
]

LEASE_CONTROL_SCHEMA = "qinglong/remote-worker-lease-control@v1"
LEASE_CONTROL_REQUEST_MAX_BYTES = 8 * 1024
LEASE_CONTROL_RESPONSE_MAX_BYTES = 4 * 1024
#: The cluster's renewal grant when its service option is not set (section 3.5 step 6).
DEFAULT_LEASE_DURATION_MS = 30_000
LEASE_CONTROL_STATUSES: tuple[str, ...] = ("renewed", "stop_requested", "terminal")
STOP_REASONS: tuple[str, ...] = ("user", "policy", "shutdown", "reconcile", "timeout")
TERMINAL_STATUSES: tuple[str, ...] = ("succeeded", "failed", "cancelled", "timed_out", "lost")
_REQUEST_KEYS = ("schema", "workerGeneration", "projectId", "runId", "attemptId", "offerId", "leaseGeneration",
                 "leaseToken", "expectedLeaseVersion")
_RESPONSE_KEYS = ("schema", "status", "projectId", "runId", "attemptId", "offerId", "leaseGeneration",
                  "leaseVersion", "renewedAtMs", "expiresAtMs", "stop", "terminalStatus")


def _fence(offer: object, expected_lease_version: int | None) -> Fence:
    return fence_of(offer, expected_lease_version=expected_lease_version).check()


def lease_control_request_body(offer: InternalOffer, *, expected_lease_version: int | None = None) -> bytes:
    """The lease-control body for the stored internal offer.

    Args:
        expected_lease_version: defaults to the stored ``lease.version``; the G2 retry
            (spec README "Lease clocks") sends ``stored + 1`` once after a 409.

    Raises:
        CallError: ``lease_control_request_invalid``.
    """
    with guard("lease_control_request_invalid"):
        return request_bytes(execution_fence(LEASE_CONTROL_SCHEMA, _fence(offer, expected_lease_version)),
                             LEASE_CONTROL_REQUEST_MAX_BYTES)


def parse_lease_control_request(body: bytes) -> dict[str, Any]:
    """The server-side view of a lease-control body (``parseRemoteWorkerLeaseControlRequestBody``).

    Raises:
        CallError: ``lease_control_request_invalid``.
    """
    with guard("lease_control_request_invalid"):
        value = schema_document(body, max_bytes=LEASE_CONTROL_REQUEST_MAX_BYTES, schema=LEASE_CONTROL_SCHEMA,
                                keys=_REQUEST_KEYS)
        check_execution_fence(value)
        return value


class LeaseControlResult(Frozen):
    """A valid lease-control answer.

    Attributes:
        status: ``renewed``, ``stop_requested`` or ``terminal``.
        lease_version, renewed_at_ms, expires_at_ms: the renewed lease (DB clock, ms);
            None for ``terminal``.
        stop_reason, stop_requested_at_ms: set for ``stop_requested`` only.
        terminal_status: set for ``terminal`` only.
    """

    __slots__ = ("status", "lease_version", "renewed_at_ms", "expires_at_ms", "stop_reason",  # noqa: RUF023
                 "stop_requested_at_ms", "terminal_status")

    status: str
    lease_version: int | None
    renewed_at_ms: int | None
    expires_at_ms: int | None
    stop_reason: str | None
    stop_requested_at_ms: int | None
    terminal_status: str | None

    def __init__(  # noqa: PLR0917 (one value per answer field)
        self,
        status: str,
        lease_version: int | None = None,
        renewed_at_ms: int | None = None,
        expires_at_ms: int | None = None,
        stop_reason: str | None = None,
        stop_requested_at_ms: int | None = None,
        terminal_status: str | None = None,
    ) -> None:
        _set = object.__setattr__
        _set(self, "status", status)
        _set(self, "lease_version", lease_version)
        _set(self, "renewed_at_ms", renewed_at_ms)
        _set(self, "expires_at_ms", expires_at_ms)
        _set(self, "stop_reason", stop_reason)
        _set(self, "stop_requested_at_ms", stop_requested_at_ms)
        _set(self, "terminal_status", terminal_status)

    @property
    def renews(self) -> bool:
        """True when the answer carries a renewed lease to persist (``renewed``/``stop_requested``)."""
        return self.status != "terminal"


def _null(value: dict[str, Any], key: str) -> None:
    if value[key] is not None:
        raise ContractError("null_field", child("$", key), f"must be null for status {value['status']}")


def _result(value: dict[str, Any]) -> LeaseControlResult:
    """``normalizeRemoteWorkerLeaseControlResult`` after the envelope checks."""
    status = value["status"]
    if not isinstance(status, str) or status not in LEASE_CONTROL_STATUSES:
        raise ContractError("status", "$.status", "not a lease-control status")
    for key in ("runId", "attemptId", "offerId"):
        dispatch_id(value[key], child("$", key))
    string(value["projectId"], "$.projectId", max_length=128, utf8_bytes=True)
    int_value(value["leaseGeneration"], "$.leaseGeneration", 1, MAX_INT32)
    if status == "terminal":
        for key in ("leaseVersion", "renewedAtMs", "expiresAtMs", "stop"):
            _null(value, key)
        terminal = value["terminalStatus"]
        if not isinstance(terminal, str) or terminal not in TERMINAL_STATUSES:
            raise ContractError("terminal_status", "$.terminalStatus", "not a terminal status")
        return LeaseControlResult("terminal", terminal_status=terminal)
    _null(value, "terminalStatus")
    version = int_value(value["leaseVersion"], "$.leaseVersion", 1, MAX_INT32)
    renewed = int_value(value["renewedAtMs"], "$.renewedAtMs")
    expires = int_value(value["expiresAtMs"], "$.expiresAtMs")
    if expires <= renewed:
        raise ContractError("lease_order", "$.expiresAtMs", "must be > renewedAtMs")
    if status == "renewed":
        _null(value, "stop")
        return LeaseControlResult("renewed", version, renewed, expires)
    stop = object_value(value["stop"], "$.stop")
    exact_keys(stop, ("reason", "requestedAtMs"), "$.stop")
    reason = stop["reason"]
    if not isinstance(reason, str) or reason not in STOP_REASONS:
        raise ContractError("stop_reason", "$.stop.reason", "not a stop reason")
    requested = int_value(stop["requestedAtMs"], "$.stop.requestedAtMs")
    return LeaseControlResult("stop_requested", version, renewed, expires, reason, requested)


def parse_lease_control_response(
    body: bytes,
    offer: InternalOffer,
    *,
    expected_lease_version: int | None = None,
) -> LeaseControlResult:
    """Validate a 200 lease-control answer (module docstring order).

    Args:
        body: the raw response body.
        offer: the stored internal offer the request was built from (its ids and the
            stored lease's ``version``).
        expected_lease_version: what the request sent when it was not ``lease.version``
            (the G2 retry).

    Returns:
        :class:`LeaseControlResult`; persist a renewal with
        :func:`qinglong_edge.contracts.inbox.with_renewed_lease`.

    Raises:
        CallError: ``lease_control_response_invalid``.
    """
    with guard("lease_control_response_invalid"):
        value = schema_document(body, max_bytes=LEASE_CONTROL_RESPONSE_MAX_BYTES, schema=LEASE_CONTROL_SCHEMA,
                                keys=_RESPONSE_KEYS)
        result = _result(value)
        fence = fence_of(offer, expected_lease_version=expected_lease_version)
        echo(value["projectId"], fence.project_id, "$.projectId")
        echo(value["runId"], fence.run_id, "$.runId")
        echo(value["attemptId"], fence.attempt_id, "$.attemptId")
        echo(value["offerId"], fence.offer_id, "$.offerId")
        echo(value["leaseGeneration"], fence.lease_generation, "$.leaseGeneration")
        if result.renews:
            expected = int_value(fence.expected_lease_version, "$.expectedLeaseVersion", 0, MAX_INT32)
            if result.lease_version != expected + 1:
                raise ContractError("version_mismatch", "$.leaseVersion", "must be expectedLeaseVersion + 1")
            # Not checked (spec README "Decisions for clocks", unlike the reference's
            # coordinator): renewedAtMs against the stored one. A newer version with an
            # older renewedAtMs is the cluster's clock moving back; the version fences.
        return result
