"""Worker Session register / heartbeat / transition bodies (offer-delivery.md section 5.1).

Sources: reference ``workerSessionTransport.ts``, ``workerSession.ts`` (newer revision
with ``protocolVersion``/``supportTier``) and the worker's ``workerSessionHttpsClient.ts``
(the echo checks).

Requests (compact JSON, reference key order)::

    register   {schema, capabilitiesJson, capabilitiesHash, maxConcurrentRuns, availableSlots,
                leaseDurationMs}                                         <= 20 KiB
    heartbeat  {schema, generation, expectedVersion, availableSlots, leaseDurationMs}   <= 4 KiB
    transition {schema, generation, expectedVersion, status: draining|offline}         <= 4 KiB

Responses (<= 4 KiB, at least 2 bytes): ``{schema, workerId, sessionId, generation,
version, status, leaseExpiresAtMs[, replacedSession]}`` with exactly these keys. The
worker then requires: register -- ``workerId``/``sessionId`` echo the request and
``status`` is ``online`` (the cluster assigns ``generation``); heartbeat -- echo of
``workerId``/``sessionId``/``generation``, ``version == expectedVersion + 1``, status
not ``offline``; transition -- the same echo and version, ``status`` equal to the one
requested.

Limits: session lease 5 000-600 000 ms (default 45 000); ``maxConcurrentRuns``
1-1024 with ``0 <= availableSlots <= maxConcurrentRuns``; capabilities JSON 2-16 384
bytes, canonical (re-normalizing gives the same text) with its SHA-256 hex.

Error codes: strict-JSON codes, ``not_object``, ``key_set``, ``not_string``,
``not_integer``, ``not_boolean``, ``pattern``, ``length``, ``out_of_range``, ``schema``,
``session_status``, ``echo_mismatch`` (workerId, sessionId or generation not echoed),
``version_mismatch``, ``capabilities`` (snapshot not canonical / hash mismatch), and the
capability codes of :mod:`qinglong_edge.contracts.placement`.
"""

from __future__ import annotations

import sys

from qinglong_edge.contracts._shape import Frozen, exact_keys, int_value, object_value, utf8_length
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import string
from qinglong_edge.contracts.ids import HEX64, SESSION_ID, WORKER_ID
from qinglong_edge.contracts.placement import (
    ARCHITECTURES,
    PROTOCOL_VERSION,
    canonical_capabilities,
    support_tier_for,
)
from qinglong_edge.contracts.strictjson import StrictJsonError, dumps_bytes, loads

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "ARCHITECTURES",
    "DEFAULT_LEASE_DURATION_MS",
    "HEARTBEAT_SCHEMA",
    "PROTOCOL_VERSION",
    "REGISTER_SCHEMA",
    "SESSION_STATUSES",
    "TRANSITION_SCHEMA",
    "SessionProjection",
    "architecture_for_machine",
    "canonical_capabilities",
    "capabilities_snapshot",
    "heartbeat_request_body",
    "parse_heartbeat_response",
    "parse_register_response",
    "parse_transition_response",
    "register_request_body",
    "session_path",
    "support_tier_for",
    "transition_request_body",
]

REGISTER_SCHEMA = "qinglong/worker-session-register@v1"
HEARTBEAT_SCHEMA = "qinglong/worker-session-heartbeat@v1"
TRANSITION_SCHEMA = "qinglong/worker-session-transition@v1"
MAX_REGISTER_REQUEST_BYTES = 20 * 1024
MAX_SESSION_REQUEST_BYTES = 4 * 1024
MAX_SESSION_RESPONSE_BYTES = 4 * 1024
MAX_CAPABILITIES_BYTES = 16 * 1024
MIN_LEASE_DURATION_MS = 5_000
MAX_LEASE_DURATION_MS = 600_000
DEFAULT_LEASE_DURATION_MS = 45_000
DEFAULT_HEARTBEAT_INTERVAL_MS = 10_000
MAX_CONCURRENT_RUNS = 1024
SESSION_STATUSES: tuple[str, ...] = ("online", "draining", "offline")
_OPERATIONS = ("register", "heartbeat", "transition")
_PROJECTION_KEYS = ("schema", "workerId", "sessionId", "generation", "version", "status", "leaseExpiresAtMs")

#: ``platform.machine()`` values -> cluster architecture (remoteWorkerCompatibility.ts maps
#: Node's ``process.arch``; these are the Linux ``uname -m`` spellings of the same CPUs).
_MACHINE_ARCHITECTURES = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv8l": "arm/v7",  # 32-bit ARM user space on a 64-bit core (Node: arch "arm", v7)
    "armv7l": "arm/v7",
    "armv7": "arm/v7",
    "armv6l": "arm/v6",
    "armv6": "arm/v6",
    "i386": "386",
    "i486": "386",
    "i586": "386",
    "i686": "386",
    "x86": "386",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
}


#: The architecture a 32-bit user space runs on a 64-bit kernel of each 64-bit machine
#: (None: QingLong has no 32-bit architecture for it).
_USER_SPACE_32: dict[str, str | None] = {"amd64": "386", "arm64": "arm/v7", "ppc64le": None, "s390x": None}


def user_space_bits() -> int:
    """The word size of this interpreter's user space: 32 or 64 (``sys.maxsize``)."""
    return 64 if sys.maxsize > 2**32 else 32


def architecture_for_machine(machine: str, pointer_bits: int | None = None) -> str | None:
    """Map a ``platform.machine()`` value to the cluster's architecture name.

    ``x86_64``/``amd64`` -> ``amd64``, ``aarch64``/``arm64`` -> ``arm64``, ``armv7l`` ->
    ``arm/v7``, ``armv6l`` -> ``arm/v6``, ``i386``..``i686`` -> ``386``, ``ppc64le``,
    ``s390x``. Case-insensitive. Returns None for anything else (e.g. ``mips``,
    big-endian ``ppc64``): the cluster has no tier for it.

    ``uname`` names the *kernel's* machine. With a 32-bit user space (``pointer_bits``
    32; default: this interpreter's, :func:`user_space_bits`) on a 64-bit kernel, as
    Raspberry Pi OS 32-bit on a Pi 4/5 boots by default, every program is 32-bit, so the
    architecture is the 32-bit one: ``aarch64`` -> ``arm/v7``, ``x86_64`` -> ``386``
    (what the reference's Node worker announces there: ``process.arch`` is the
    program's, ``arm`` / ``ia32``), and None for ``ppc64le``/``s390x``.
    """
    architecture = _MACHINE_ARCHITECTURES.get(machine.strip().lower())
    bits = user_space_bits() if pointer_bits is None else pointer_bits
    if bits == 32 and architecture in _USER_SPACE_32:
        return _USER_SPACE_32[architecture]
    return architecture


def session_path(worker_id: str, session_id: str, operation: str) -> str:
    """``/api/v3/worker-ingress/workers/{workerId}/sessions/{sessionId}/{operation}``."""
    string(worker_id, "$.workerId", max_length=128, pattern=WORKER_ID)
    string(session_id, "$.sessionId", min_length=36, max_length=36, pattern=SESSION_ID)
    if operation not in _OPERATIONS:
        raise ContractError("pattern", "$.operation", "must be register, heartbeat or transition")
    return f"/api/v3/worker-ingress/workers/{worker_id}/sessions/{session_id}/{operation}"


def capabilities_snapshot(capabilities: object) -> tuple[str, str]:
    """``(capabilitiesJson, capabilitiesHash)`` for a register request.

    Raises:
        ContractError: the capability codes, or ``length`` beyond 16 KiB.
    """
    _, text, digest = canonical_capabilities(capabilities)
    if not 2 <= utf8_length(text) <= MAX_CAPABILITIES_BYTES:
        raise ContractError("length", "$.capabilitiesJson", f"must be 2..{MAX_CAPABILITIES_BYTES} bytes")
    return text, digest


def _check_snapshot(capabilities_json: object, capabilities_hash: object) -> None:
    text = string(capabilities_json, "$.capabilitiesJson", min_length=2, max_length=MAX_CAPABILITIES_BYTES,
                  utf8_bytes=True, control=True)
    string(capabilities_hash, "$.capabilitiesHash", min_length=64, max_length=64, pattern=HEX64)
    try:
        parsed = loads(text.encode("utf-8"), max_bytes=MAX_CAPABILITIES_BYTES)
    except StrictJsonError:
        raise ContractError("capabilities", "$.capabilitiesJson", "not strict JSON") from None
    _, canonical, digest = canonical_capabilities(parsed, "$.capabilitiesJson")
    if canonical != text:
        raise ContractError("capabilities", "$.capabilitiesJson", "not the canonical capabilities JSON")
    if digest != capabilities_hash:
        raise ContractError("capabilities", "$.capabilitiesHash", "does not match the capabilities JSON")


def _lease_duration(value: object) -> int:
    return int_value(value, "$.leaseDurationMs", MIN_LEASE_DURATION_MS, MAX_LEASE_DURATION_MS)


def _body(value: dict[str, Any], limit: int) -> bytes:
    data = dumps_bytes(value)
    if len(data) > limit:
        raise ContractError("too_large", "$", f"request body exceeds {limit} bytes")
    return data


def register_request_body(
    *,
    capabilities_json: str,
    capabilities_hash: str,
    max_concurrent_runs: int,
    available_slots: int,
    lease_duration_ms: int = DEFAULT_LEASE_DURATION_MS,
) -> bytes:
    """The register body (<= 20 KiB). The capabilities must be canonical (:func:`capabilities_snapshot`).

    Raises:
        ContractError: codes in the module docstring.
    """
    _check_snapshot(capabilities_json, capabilities_hash)
    int_value(max_concurrent_runs, "$.maxConcurrentRuns", 1, MAX_CONCURRENT_RUNS)
    int_value(available_slots, "$.availableSlots", 0, max_concurrent_runs)
    return _body({
        "schema": REGISTER_SCHEMA,
        "capabilitiesJson": capabilities_json,
        "capabilitiesHash": capabilities_hash,
        "maxConcurrentRuns": max_concurrent_runs,
        "availableSlots": available_slots,
        "leaseDurationMs": _lease_duration(lease_duration_ms),
    }, MAX_REGISTER_REQUEST_BYTES)


def heartbeat_request_body(
    *,
    generation: int,
    expected_version: int,
    available_slots: int,
    lease_duration_ms: int = DEFAULT_LEASE_DURATION_MS,
) -> bytes:
    """The heartbeat body (<= 4 KiB): ``availableSlots`` 0-1024, lease 5-600 s."""
    return _body({
        "schema": HEARTBEAT_SCHEMA,
        "generation": int_value(generation, "$.generation", 1),
        "expectedVersion": int_value(expected_version, "$.expectedVersion"),
        "availableSlots": int_value(available_slots, "$.availableSlots", 0, MAX_CONCURRENT_RUNS),
        "leaseDurationMs": _lease_duration(lease_duration_ms),
    }, MAX_SESSION_REQUEST_BYTES)


def transition_request_body(*, generation: int, expected_version: int, status: str) -> bytes:
    """The transition body (<= 4 KiB): ``status`` ``draining`` or ``offline``."""
    if status not in ("draining", "offline"):
        raise ContractError("session_status", "$.status", "must be draining or offline")
    return _body({
        "schema": TRANSITION_SCHEMA,
        "generation": int_value(generation, "$.generation", 1),
        "expectedVersion": int_value(expected_version, "$.expectedVersion"),
        "status": status,
    }, MAX_SESSION_REQUEST_BYTES)


class SessionProjection(Frozen):
    """A validated session response (the cluster's wire projection of the session row)."""

    __slots__ = (  # noqa: RUF023 (field order)
        "worker_id",
        "session_id",
        "generation",
        "version",
        "status",
        "lease_expires_at_ms",
        "replaced_session",
    )

    worker_id: str
    session_id: str
    generation: int
    version: int
    status: str
    lease_expires_at_ms: int
    replaced_session: bool | None

    def __init__(  # noqa: PLR0917 (the dataclass signature)
        self,
        worker_id: str,
        session_id: str,
        generation: int,
        version: int,
        status: str,
        lease_expires_at_ms: int,
        replaced_session: bool | None = None,
    ) -> None:
        _set = object.__setattr__
        _set(self, "worker_id", worker_id)
        _set(self, "session_id", session_id)
        _set(self, "generation", generation)
        _set(self, "version", version)
        _set(self, "status", status)
        _set(self, "lease_expires_at_ms", lease_expires_at_ms)
        _set(self, "replaced_session", replaced_session)


def _projection(body: bytes, schema: str, *, replacement: bool) -> SessionProjection:
    value = object_value(loads(body, max_bytes=MAX_SESSION_RESPONSE_BYTES, min_bytes=2), "$")
    exact_keys(value, (*_PROJECTION_KEYS, "replacedSession") if replacement else _PROJECTION_KEYS, "$")
    if value["schema"] != schema:
        raise ContractError("schema", "$.schema", f"must be {schema}")
    worker_id = string(value["workerId"], "$.workerId", max_length=128, pattern=WORKER_ID)
    session_id = string(value["sessionId"], "$.sessionId", min_length=36, max_length=36, pattern=SESSION_ID)
    status = value["status"]
    if not isinstance(status, str) or status not in SESSION_STATUSES:
        raise ContractError("session_status", "$.status", "must be online, draining or offline")
    replaced: bool | None = None
    if replacement:
        replaced = value["replacedSession"]
        if not isinstance(replaced, bool):
            raise ContractError("not_boolean", "$.replacedSession", "must be a boolean")
    return SessionProjection(
        worker_id=worker_id,
        session_id=session_id,
        generation=int_value(value["generation"], "$.generation", 1),
        version=int_value(value["version"], "$.version"),
        status=status,
        lease_expires_at_ms=int_value(value["leaseExpiresAtMs"], "$.leaseExpiresAtMs"),
        replaced_session=replaced,
    )


def _echo(projection: SessionProjection, worker_id: str, session_id: str, generation: int | None) -> None:
    if projection.worker_id != worker_id:
        raise ContractError("echo_mismatch", "$.workerId", "does not echo the request")
    if projection.session_id != session_id:
        raise ContractError("echo_mismatch", "$.sessionId", "does not echo the request")
    if generation is not None and projection.generation != generation:
        raise ContractError("echo_mismatch", "$.generation", "does not echo the request")


def parse_register_response(body: bytes, *, worker_id: str, session_id: str) -> SessionProjection:
    """Validate a register response: echo of the ids, ``status`` ``online``.

    Returns:
        The projection; ``generation`` is the one the cluster assigned.
    """
    projection = _projection(body, REGISTER_SCHEMA, replacement=True)
    _echo(projection, worker_id, session_id, None)
    if projection.status != "online":
        raise ContractError("session_status", "$.status", "a registered session must be online")
    return projection


def parse_heartbeat_response(
    body: bytes, *, worker_id: str, session_id: str, generation: int, expected_version: int
) -> SessionProjection:
    """Validate a heartbeat response: echo, ``version == expected_version + 1``, not offline."""
    projection = _projection(body, HEARTBEAT_SCHEMA, replacement=False)
    _echo(projection, worker_id, session_id, generation)
    if projection.version != expected_version + 1:
        raise ContractError("version_mismatch", "$.version", "must be expectedVersion + 1")
    if projection.status == "offline":
        raise ContractError("session_status", "$.status", "the session went offline")
    return projection


def parse_transition_response(
    body: bytes, *, worker_id: str, session_id: str, generation: int, expected_version: int, status: str
) -> SessionProjection:
    """Validate a transition response: echo, ``version == expected_version + 1``, the requested status."""
    projection = _projection(body, TRANSITION_SCHEMA, replacement=False)
    _echo(projection, worker_id, session_id, generation)
    if projection.version != expected_version + 1:
        raise ContractError("version_mismatch", "$.version", "must be expectedVersion + 1")
    if projection.status != status:
        raise ContractError("session_status", "$.status", "is not the requested status")
    return projection
