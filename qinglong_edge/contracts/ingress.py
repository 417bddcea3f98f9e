"""What the seven worker-ingress calls after acceptance share: path, fence, error type.

Source: remote-execution.md section 3 ("Common to all calls"), offer-delivery.md
section 5; reference ``runDispatchLease.ts`` (``assertRunDispatchLeaseFence``) and the
transport clients under ``packages/ql3-worker-runtime/src/remote-execution/transport``.

* :func:`worker_call_path` -- ``/api/v3/worker-ingress/workers/{workerId}/sessions/{sessionId}/{op}``
  for ``op`` in :data:`WORKER_CALL_OPERATIONS`.
* :class:`Fence` / :func:`fence_of` -- the values every call carries, read from the
  stored internal offer (``record["offer"]``): ``worker.workerId``, ``worker.sessionId``,
  ``worker.generation``, ``candidate.projectId/runId/attemptId``, ``offerId``,
  ``lease.leaseGeneration``, ``leaseToken``, ``expectedLeaseVersion = lease.version``.
* :class:`CallError` -- the one error the call contracts raise: a
  :class:`~qinglong_edge.contracts.errors.ContractError` whose ``code`` names the call and
  the side (:data:`CALL_ERROR_CODES`, e.g. ``lease_control_response_invalid``), whose
  ``path`` is the JSON path of the offending value and whose ``reason`` is the field-level
  code underneath (``key_set``, ``pattern``, ``echo_mismatch``, ``too_large``...).
  Messages and ``repr`` never carry a lease token, a callback token or a secret value:
  details are fixed texts, and paths under a secret-bearing object are redacted.
"""

from __future__ import annotations

import re

from qinglong_edge.contracts._shape import Frozen, child, exact_keys, int_value, object_value
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import MAX_INT32, dispatch_id, js_length, string
from qinglong_edge.contracts.ids import LEASE_TOKEN, SESSION_ID, WORKER_ID
from qinglong_edge.contracts.strictjson import dumps_bytes, loads

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from collections.abc import Collection
    from types import TracebackType
    from typing import Any

__all__ = [
    "CALL_ERROR_CODES",
    "WORKER_CALL_OPERATIONS",
    "CallError",
    "Fence",
    "fence_of",
    "worker_call_path",
]

WORKER_CALL_OPERATIONS: tuple[str, ...] = (
    "starting", "start-failure", "running", "secrets", "lease-control", "artifacts", "completion",
)
#: Every ``CallError.code``: ``<call>_request_invalid`` from a builder (or a server-side
#: request parser), ``<call>_response_invalid`` from a response parser.
CALL_ERROR_CODES: tuple[str, ...] = tuple(
    f"{call}_{side}_invalid"
    for call in ("activation", "secrets", "lease_control", "artifact", "completion")
    for side in ("request", "response")
)
#: Python errors that would mean a bug met malformed input; :class:`guard` turns them into
#: a :class:`CallError` with reason ``malformed`` so nothing else escapes a contract.
_BUG_ERRORS = (KeyError, TypeError, AttributeError, IndexError, ValueError, RecursionError, OverflowError)


class CallError(ContractError):
    """A request or response of a worker-ingress call broke its contract.

    Attributes:
        code: one of :data:`CALL_ERROR_CODES`.
        path: JSON path of the offending value (``$`` for the document).
        reason: the field-level code (``key_set``, ``pattern``, ``out_of_range``,
            ``echo_mismatch``, ``version_mismatch``, strict-JSON codes, ...).
    """

    def __init__(self, code: str, path: str = "$", detail: str = "", *, reason: str = "") -> None:
        self.reason = reason or code
        super().__init__(code, path, f"{self.reason}: {detail}" if detail else self.reason)


class guard:  # lowercase: used as a statement, ``with guard("..."):``
    """Re-raise any contract failure inside the block as a :class:`CallError` named ``code``.

    Args:
        code: the call's code, e.g. ``activation_response_invalid``.
        known_keys: when given, inner paths keep only their leading segments that are
            array indexes or one of these key names (used where a hostile peer could put
            a secret into a key: the secrets answer).
        error: the :class:`CallError` subclass to raise (default :class:`CallError`;
            the launch contracts raise :class:`~qinglong_edge.contracts.launch.LaunchError`).
    """

    __slots__ = ("code", "error", "known_keys")

    def __init__(self, code: str, *, known_keys: frozenset[str] | None = None,
                 error: type[CallError] | None = None) -> None:
        self.code = code
        self.known_keys = known_keys
        self.error = CallError if error is None else error

    def __enter__(self) -> guard:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None or isinstance(exc, CallError):
            return
        if isinstance(exc, ContractError):
            path = exc.path if self.known_keys is None else safe_path(exc.path, self.known_keys)
            raise self.error(self.code, path, exc.detail, reason=exc.code) from None
        if isinstance(exc, _BUG_ERRORS):
            raise self.error(self.code, "$", "malformed input", reason="malformed") from None


_SEGMENT = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[([0-9]+)\]")


def safe_path(path: str, known_keys: frozenset[str]) -> str:
    """``path`` cut before its first segment that is neither an index nor a known key name."""
    if not path.startswith("$"):
        return "$"
    out, position = ["$"], 1
    while position < len(path):
        match = _SEGMENT.match(path, position)
        if match is None or (match.group(1) is not None and match.group(1) not in known_keys):
            break
        out.append(match.group(0))
        position = match.end()
    return "".join(out)


def worker_call_path(worker_id: str, session_id: str, operation: str) -> str:
    """``/api/v3/worker-ingress/workers/{workerId}/sessions/{sessionId}/{operation}`` (section 3).

    Args:
        worker_id / session_id: from ``offer.worker`` (workerId grammar, lowercase UUIDv7).
        operation: one of :data:`WORKER_CALL_OPERATIONS`.

    Raises:
        ContractError: ``pattern`` / ``length`` / ``not_string`` at ``$.workerId`` /
            ``$.sessionId``, ``pattern`` at ``$.operation``.
    """
    string(worker_id, "$.workerId", max_length=128, pattern=WORKER_ID)
    string(session_id, "$.sessionId", min_length=36, max_length=36, pattern=SESSION_ID)
    if operation not in WORKER_CALL_OPERATIONS:
        raise ContractError("pattern", "$.operation", "not a worker-ingress call")
    return f"/api/v3/worker-ingress/workers/{worker_id}/sessions/{session_id}/{operation}"


class Fence(Frozen):
    """The authority every call carries (fence7 + workerId, sessionId, projectId).

    Built by :func:`fence_of`; the builders validate it with each call's limits.
    ``repr`` never shows the lease token.
    """

    __slots__ = (  # noqa: RUF023 (field order)
        "worker_id",
        "session_id",
        "worker_generation",
        "project_id",
        "run_id",
        "attempt_id",
        "offer_id",
        "lease_generation",
        "lease_token",
        "expected_lease_version",
    )
    _repr_hidden = ("lease_token",)

    worker_id: str
    session_id: str
    worker_generation: int
    project_id: str
    run_id: str
    attempt_id: str
    offer_id: str
    lease_generation: int
    lease_token: str
    expected_lease_version: int

    def __init__(  # noqa: PLR0917 (one value per fence key)
        self,
        worker_id: str,
        session_id: str,
        worker_generation: int,
        project_id: str,
        run_id: str,
        attempt_id: str,
        offer_id: str,
        lease_generation: int,
        lease_token: str,
        expected_lease_version: int,
    ) -> None:
        _set = object.__setattr__
        _set(self, "worker_id", worker_id)
        _set(self, "session_id", session_id)
        _set(self, "worker_generation", worker_generation)
        _set(self, "project_id", project_id)
        _set(self, "run_id", run_id)
        _set(self, "attempt_id", attempt_id)
        _set(self, "offer_id", offer_id)
        _set(self, "lease_generation", lease_generation)
        _set(self, "lease_token", lease_token)
        _set(self, "expected_lease_version", expected_lease_version)

    def check(self, *, short_ids: bool = False, project: bool = True) -> Fence:
        """Validate with the runtime-core limits (section 3.1; 3.4/3.5/3.7 for the others).

        ``workerId`` grammar, ``sessionId`` UUIDv7; ``runId``/``attemptId``/``offerId``
        dispatch ids (1-128, no ctrl), and ``runId``/``attemptId`` <= 36 (JS length) when
        ``short_ids`` (activation only); ``projectId`` 1-128 bytes without ctrl when
        ``project``; generations int31 >= 1, ``expectedLeaseVersion`` int31 >= 0, lease
        token ``[A-Za-z0-9_-]{32,128}``. Paths are the body keys (``$.runId``...).

        Raises:
            ContractError: the field codes.
        """
        string(self.worker_id, "$.workerId", max_length=128, pattern=WORKER_ID)
        string(self.session_id, "$.sessionId", min_length=36, max_length=36, pattern=SESSION_ID)
        for key, value in (("runId", self.run_id), ("attemptId", self.attempt_id)):
            dispatch_id(value, child("$", key))
            if short_ids and js_length(value) > 36:
                raise ContractError("length", child("$", key), "must be at most 36 characters")
        dispatch_id(self.offer_id, "$.offerId")
        if project:
            string(self.project_id, "$.projectId", max_length=128, utf8_bytes=True)
        int_value(self.worker_generation, "$.workerGeneration", 1, MAX_INT32)
        int_value(self.lease_generation, "$.leaseGeneration", 1, MAX_INT32)
        int_value(self.expected_lease_version, "$.expectedLeaseVersion", 0, MAX_INT32)
        string(self.lease_token, "$.leaseToken", min_length=32, max_length=128, pattern=LEASE_TOKEN)
        return self


def member(source: dict[str, Any], key: str, path: str) -> Any:
    """``source[key]``, or ``key_set`` at ``path.key`` when it is missing."""
    if key not in source:
        raise ContractError("key_set", child(path, key), "missing key")
    return source[key]


def fence_of(offer: object, *, expected_lease_version: int | None = None, path: str = "$.offer") -> Fence:
    """Read the fence from a stored internal offer (``record["offer"]``), section 5.

    The offer is not re-normalized (records from the journal already are); every value
    is type-checked by :meth:`Fence.check` in the builder that uses it.

    Args:
        expected_lease_version: override ``lease.version`` (the G2 retry of a renewal
            whose answer was lost sends ``stored + 1``; spec README "Lease clocks").

    Raises:
        ContractError: ``not_object`` / ``key_set`` for a part that is missing.
    """
    source = object_value(offer, path)
    worker = object_value(member(source, "worker", path), child(path, "worker"))
    candidate = object_value(member(source, "candidate", path), child(path, "candidate"))
    lease = object_value(member(source, "lease", path), child(path, "lease"))
    lease_path = child(path, "lease")
    version = member(lease, "version", lease_path) if expected_lease_version is None else expected_lease_version
    return Fence(
        worker_id=member(worker, "workerId", child(path, "worker")),
        session_id=member(worker, "sessionId", child(path, "worker")),
        worker_generation=member(worker, "generation", child(path, "worker")),
        project_id=member(candidate, "projectId", child(path, "candidate")),
        run_id=member(candidate, "runId", child(path, "candidate")),
        attempt_id=member(candidate, "attemptId", child(path, "candidate")),
        offer_id=member(source, "offerId", path),
        lease_generation=member(lease, "leaseGeneration", lease_path),
        lease_token=member(source, "leaseToken", path),
        expected_lease_version=version,
    )


def fence7(fence: Fence) -> dict[str, Any]:
    """The activation fence body ``{runId, attemptId, workerGeneration, offerId, leaseGeneration,
    leaseToken, expectedLeaseVersion}`` in the reference's key order (section 3.1)."""
    return {
        "runId": fence.run_id,
        "attemptId": fence.attempt_id,
        "workerGeneration": fence.worker_generation,
        "offerId": fence.offer_id,
        "leaseGeneration": fence.lease_generation,
        "leaseToken": fence.lease_token,
        "expectedLeaseVersion": fence.expected_lease_version,
    }


def execution_fence(schema: str, fence: Fence) -> dict[str, Any]:
    """``{schema, workerGeneration, projectId, runId, attemptId, offerId, leaseGeneration,
    leaseToken, expectedLeaseVersion}``: the head of lease-control, artifact and completion."""
    return {
        "schema": schema,
        "workerGeneration": fence.worker_generation,
        "projectId": fence.project_id,
        "runId": fence.run_id,
        "attemptId": fence.attempt_id,
        "offerId": fence.offer_id,
        "leaseGeneration": fence.lease_generation,
        "leaseToken": fence.lease_token,
        "expectedLeaseVersion": fence.expected_lease_version,
    }


def check_execution_fence(value: dict[str, Any]) -> None:
    """The server-side ``fence()`` of ``remoteWorkerCompletion.ts`` over a decoded body
    holding :func:`execution_fence`'s fields (artifact, completion and lease-control
    requests), in the reference's order."""
    for key in ("runId", "attemptId", "offerId"):
        dispatch_id(value[key], child("$", key))
    string(value["leaseToken"], "$.leaseToken", min_length=32, max_length=128, pattern=LEASE_TOKEN)
    int_value(value["workerGeneration"], "$.workerGeneration", 1, MAX_INT32)
    string(value["projectId"], "$.projectId", max_length=128, utf8_bytes=True)
    int_value(value["leaseGeneration"], "$.leaseGeneration", 1, MAX_INT32)
    int_value(value["expectedLeaseVersion"], "$.expectedLeaseVersion", 0, MAX_INT32)


def schema_document(body: bytes | bytearray, *, max_bytes: int, keys: Collection[str], schema: str) -> dict[str, Any]:
    """The first checks every call document gets, in the spec's order: strict JSON of 2 to
    ``max_bytes`` bytes, an object, exactly ``keys``, ``schema`` equal to ``schema``.
    Raises ContractError (inside the caller's :class:`guard`, which names the call)."""
    value = object_value(loads(body, max_bytes=max_bytes, min_bytes=2), "$")
    exact_keys(value, keys, "$")
    if value["schema"] != schema:
        raise ContractError("schema", "$.schema", f"must be {schema}")
    return value


def request_bytes(body: dict[str, Any], limit: int) -> bytes:
    """``JSON.stringify(body)`` as UTF-8, at most ``limit`` bytes (code ``too_large``)."""
    data = dumps_bytes(body)
    if len(data) > limit:
        raise ContractError("too_large", "$", f"request body exceeds {limit} bytes")
    return data


def equal(value: object, expected: object) -> bool:
    """JS ``===`` on parsed JSON scalars: never ``True == 1`` or ``1.0 == 1``."""
    return type(value) is type(expected) and value == expected


def echo(value: object, expected: object, path: str) -> None:
    """Require a response value to echo the request (code ``echo_mismatch``)."""
    if not equal(value, expected):
        raise ContractError("echo_mismatch", path, "does not echo the request")
