"""Keep the Worker Session alive: register once, then heartbeat (offer-delivery.md 5.1).

A cron-driven ``pull`` starts a fresh process every minute, so the session lives in a
durable record, ``<journal root>/session.json`` (0600, written with the journal's
update algorithm)::

    {"schemaVersion":1,"workerId":..,"sessionId":<uuidv7>,"generation":<int>,
     "version":<int>,"status":"online","leaseExpiresAtMs":<int>,"leaseDurationMs":<int>,
     "capabilitiesHash":<64 hex>,"registeredAtMs":<int>,"heartbeatAtMs":<int>}

Each cycle :meth:`SessionKeeper.ensure`:

* no record, another workerId, other capabilities, or a lease that has run out by
  our clock -> **register** a new session (a new UUIDv7 session id; the cluster
  assigns the generation);
* otherwise, when ``heartbeat_interval_ms`` has passed since the last heartbeat ->
  **heartbeat** with ``expectedVersion`` = the stored version;
* otherwise the stored session is current: no network I/O.

Failure handling (5.1 "Worker status handling", and our reporting):

* 401/403 on a session call -> :class:`~qinglong_edge.errors.SessionError`
  ``credential_rejected`` (the CLI exits 77); nothing is pulled with the session;
* 409 -> ``session_fenced``: the record is removed (the session failed closed) and a
  new session is registered in the same cycle; a pending claim bound to the old
  session is then abandoned by the pull coordinator (``stale_session``);
* the credential, certificate or key files break their rules -> ``credentials_unavailable``
  (the CLI exits 78: a configuration problem on the device);
* a 429/503 with ``Retry-After``: no session call before that time has passed (spec
  README: never retry sooner than it says; at most 1 h, kept for this process, i.e. a
  ``pull --duration`` loop): the stored session stays usable while its lease runs
  (``stale``), else ``session_unavailable``;
* a response that breaks the contract -> ``invalid_response``; any other transport
  failure -> ``session_unavailable``. A heartbeat that fails this way while the stored
  lease is still running leaves the session usable for this cycle (the offer pull
  then meets the same network on its own terms).

A heartbeat whose response is lost after the cluster committed it leaves our stored
``version`` one behind; the next heartbeat is then fenced (409) and a new session is
registered, as the reference worker does (it fails the session closed on 409). A
pending claim of the old session is abandoned by the pull coordinator.

Cadence: ``pull`` runs from cron once a minute, so with the default 10 s interval every
cron cycle heartbeats; ``pull --duration`` cycles faster than the interval do not.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import exact_keys, safe_int, string
from qinglong_edge.contracts.ids import HEX64, SESSION_ID, WORKER_ID, new_uuid7
from qinglong_edge.contracts.session import (
    MAX_REGISTER_REQUEST_BYTES,
    MAX_SESSION_REQUEST_BYTES,
    MAX_SESSION_RESPONSE_BYTES,
    PROTOCOL_VERSION,
    SessionProjection,
    architecture_for_machine,
    capabilities_snapshot,
    heartbeat_request_body,
    parse_heartbeat_response,
    parse_register_response,
    register_request_body,
    session_path,
    support_tier_for,
)
from qinglong_edge.contracts.strictjson import dumps_bytes, loads
from qinglong_edge.errors import SessionError, TransportError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any, Protocol

    class _Transport(Protocol):
        def post_json(
            self, path: str, body: bytes, *, max_response_bytes: int, max_request_bytes: int = ...
        ) -> Any: ...

    class _SessionStore(Protocol):
        def read_session_record(self) -> bytes | None: ...

        def write_session_record(self, data: bytes) -> None: ...

        def clear_session_record(self) -> bool: ...


__all__ = [
    "SessionKeeper",
    "SessionOutcome",
    "SessionRecord",
    "local_capabilities",
    "parse_session_record",
]

_RECORD_KEYS = (
    "schemaVersion",
    "workerId",
    "sessionId",
    "generation",
    "version",
    "status",
    "leaseExpiresAtMs",
    "leaseDurationMs",
    "capabilitiesHash",
    "registeredAtMs",
    "heartbeatAtMs",
)
MAX_RECORD_BYTES = 4096
#: A lease that ends within this margin is treated as already over (our clock and the
#: cluster's differ a little; re-registering is cheaper than a refused heartbeat).
LEASE_MARGIN_MS = 2000
#: Longest Retry-After of a session call we honour (the pull coordinator's cap).
MAX_RETRY_AFTER_MS = 3_600_000




class SessionRecord(Frozen):
    """The durable Worker Session (see the module docstring). Times are wall ms."""

    __slots__ = (  # noqa: RUF023 (field order)
        "worker_id",
        "session_id",
        "generation",
        "version",
        "status",
        "lease_expires_at_ms",
        "lease_duration_ms",
        "capabilities_hash",
        "registered_at_ms",
        "heartbeat_at_ms",
    )

    worker_id: str
    session_id: str
    generation: int
    version: int
    status: str
    lease_expires_at_ms: int
    lease_duration_ms: int
    capabilities_hash: str
    registered_at_ms: int
    heartbeat_at_ms: int

    def __init__(  # noqa: PLR0917 (the dataclass signature)
        self,
        worker_id: str,
        session_id: str,
        generation: int,
        version: int,
        status: str,
        lease_expires_at_ms: int,
        lease_duration_ms: int,
        capabilities_hash: str,
        registered_at_ms: int,
        heartbeat_at_ms: int,
    ) -> None:
        _set = object.__setattr__
        _set(self, "worker_id", worker_id)
        _set(self, "session_id", session_id)
        _set(self, "generation", generation)
        _set(self, "version", version)
        _set(self, "status", status)
        _set(self, "lease_expires_at_ms", lease_expires_at_ms)
        _set(self, "lease_duration_ms", lease_duration_ms)
        _set(self, "capabilities_hash", capabilities_hash)
        _set(self, "registered_at_ms", registered_at_ms)
        _set(self, "heartbeat_at_ms", heartbeat_at_ms)

    def to_bytes(self) -> bytes:
        """Compact JSON in the record's key order plus ``"\\n"``."""
        return dumps_bytes({
            "schemaVersion": 1,
            "workerId": self.worker_id,
            "sessionId": self.session_id,
            "generation": self.generation,
            "version": self.version,
            "status": self.status,
            "leaseExpiresAtMs": self.lease_expires_at_ms,
            "leaseDurationMs": self.lease_duration_ms,
            "capabilitiesHash": self.capabilities_hash,
            "registeredAtMs": self.registered_at_ms,
            "heartbeatAtMs": self.heartbeat_at_ms,
        }) + b"\n"


def parse_session_record(data: bytes) -> SessionRecord:
    """Parse ``session.json``.

    Raises:
        ContractError: strict-JSON codes, ``key_set`` and the field codes.
    """
    value = loads(data, max_bytes=MAX_RECORD_BYTES, min_bytes=2)
    if not isinstance(value, dict):
        raise ContractError("not_object", "$", "session record must be an object")
    exact_keys(value, _RECORD_KEYS, "$")
    if value["schemaVersion"] != 1:
        raise ContractError("schema", "$.schemaVersion", "must be 1")
    return SessionRecord(
        worker_id=string(value["workerId"], "$.workerId", max_length=128, pattern=WORKER_ID),
        session_id=string(value["sessionId"], "$.sessionId", max_length=36, pattern=SESSION_ID),
        generation=safe_int(value["generation"], "$.generation", 1),
        version=safe_int(value["version"], "$.version", 0),
        status=string(value["status"], "$.status", max_length=32),
        lease_expires_at_ms=safe_int(value["leaseExpiresAtMs"], "$.leaseExpiresAtMs"),
        lease_duration_ms=safe_int(value["leaseDurationMs"], "$.leaseDurationMs", 5000, 600_000),
        capabilities_hash=string(value["capabilitiesHash"], "$.capabilitiesHash", max_length=64, pattern=HEX64),
        registered_at_ms=safe_int(value["registeredAtMs"], "$.registeredAtMs"),
        heartbeat_at_ms=safe_int(value["heartbeatAtMs"], "$.heartbeatAtMs"),
    )


def local_capabilities(machine: str | None = None) -> dict[str, Any]:
    """Capabilities of this device (5.1, newer revision): architecture from the real
    platform mapped to the cluster's list, ``executors: ["remote-worker"]``, the
    protocol version and the architecture's support tier.

    Raises:
        SessionError: ``unsupported_platform`` when the machine maps to no cluster
            architecture (e.g. MIPS routers): the cluster could never place work here.
    """
    machine = os.uname().machine if machine is None else machine  # platform.machine(), without the import
    architecture = architecture_for_machine(machine)
    tier = support_tier_for(architecture) if architecture else None
    if architecture is None or tier is None:
        raise SessionError(f"machine {machine!r} maps to no cluster architecture", code="unsupported_platform")
    return {
        "architecture": architecture,
        "executors": ["remote-worker"],
        "protocolVersion": PROTOCOL_VERSION,
        "supportTier": tier,
    }


class SessionOutcome(Frozen):
    """What :meth:`SessionKeeper.ensure` did: ``registered``, ``heartbeat``, ``current``
    or ``stale`` (heartbeat failed but the stored lease still runs); ``replaced`` is
    True when a fenced or expired session was replaced by a new registration."""

    __slots__ = ("session", "action", "replaced", "detail")  # noqa: RUF023 (field order)

    session: SessionRecord
    action: str
    replaced: bool
    detail: str

    def __init__(self, session: SessionRecord, action: str, replaced: bool = False, detail: str = "") -> None:
        _set = object.__setattr__
        _set(self, "session", session)
        _set(self, "action", action)
        _set(self, "replaced", replaced)
        _set(self, "detail", detail)


class SessionKeeper:
    """Registers and heartbeats the Worker Session; persists it through ``store``.

    Args:
        store: the owned journal (``read/write/clear_session_record``).
        transport: an ingress transport with ``post_json``.
        worker_id: the configured workerId.
        max_concurrent_runs: 1..1024 (5.1).
        lease_duration_ms: 5 000..600 000; the cron default 180 000 outlives a missed minute.
        heartbeat_interval_ms: heartbeat when this much time has passed (default 10 000;
            2 x interval must not exceed the lease).
        clock_ms: wall-clock milliseconds.
        random_bytes: randomness for the UUIDv7 session id.
        capabilities: the capabilities object (default :func:`local_capabilities`).
    """

    def __init__(
        self,
        store: _SessionStore,
        transport: _Transport,
        *,
        worker_id: str,
        max_concurrent_runs: int,
        lease_duration_ms: int,
        heartbeat_interval_ms: int = 10_000,
        clock_ms: Callable[[], int],
        random_bytes: Callable[[int], bytes] = os.urandom,
        capabilities: dict[str, Any] | None = None,
    ) -> None:
        if 2 * heartbeat_interval_ms > lease_duration_ms:
            heartbeat_interval_ms = lease_duration_ms // 2
        self._store = store
        self._transport = transport
        self._worker_id = worker_id
        self._max_runs = max_concurrent_runs
        self._lease_ms = lease_duration_ms
        self._heartbeat_ms = heartbeat_interval_ms
        self._clock_ms = clock_ms
        self._random_bytes = random_bytes
        caps = local_capabilities() if capabilities is None else capabilities
        self._capabilities_json, self._capabilities_hash = capabilities_snapshot(caps)
        # (set at, not before) in wall ms from a 429/503 Retry-After of a session call;
        # kept for this process (a `pull --duration` loop), never trusted across a step back.
        self._retry_after: tuple[int, int] | None = None

    @property
    def capabilities_hash(self) -> str:
        return self._capabilities_hash

    def current(self) -> SessionRecord | None:
        """The stored session record, or None (absent, unreadable or another worker's)."""
        data = self._store.read_session_record()
        if data is None:
            return None
        try:
            record = parse_session_record(data)
        except ContractError:
            return None  # a record we cannot read is replaced by a new registration
        if record.worker_id != self._worker_id or record.capabilities_hash != self._capabilities_hash:
            return None
        return record

    def ensure(self, available_slots: int) -> SessionOutcome:
        """Make sure an online session with a running lease exists (see module docstring).

        Args:
            available_slots: 0..max_concurrent_runs; what the cluster may place here.

        Raises:
            SessionError: ``credential_rejected``, ``credentials_unavailable``,
                ``invalid_response`` or ``session_unavailable`` when no usable session
                exists afterwards.
        """
        slots = max(0, min(available_slots, self._max_runs))
        record = self.current()
        now = self._clock_ms()
        waiting = self._retry_after is not None and self._retry_after[0] <= now < self._retry_after[1]
        if record is not None and record.lease_expires_at_ms - LEASE_MARGIN_MS > now:
            if now - record.heartbeat_at_ms < self._heartbeat_ms and now >= record.heartbeat_at_ms:
                return SessionOutcome(record, "current")
            if waiting:  # README: never sooner than the cluster's Retry-After
                return SessionOutcome(record, "stale", detail="retry_after")
            try:
                return SessionOutcome(self._heartbeat(record, slots), "heartbeat")
            except SessionError as exc:
                if exc.code == "session_fenced":
                    self._store.clear_session_record()
                    return SessionOutcome(self._register(slots), "registered", replaced=True, detail=exc.code)
                if exc.code in ("credential_rejected", "credentials_unavailable", "invalid_configuration"):
                    raise
                return SessionOutcome(record, "stale", detail=exc.code)
        if waiting:
            raise SessionError("the cluster asked to retry the session call later (Retry-After)",
                               code="session_unavailable")
        replaced = record is not None or self._store.read_session_record() is not None
        return SessionOutcome(self._register(slots), "registered", replaced=replaced)

    # -- calls -----------------------------------------------------------------------------

    def _post(self, session_id: str, operation: str, body: bytes) -> bytes:
        path = session_path(self._worker_id, session_id, operation)
        limit = MAX_REGISTER_REQUEST_BYTES if operation == "register" else MAX_SESSION_REQUEST_BYTES
        try:
            response = self._transport.post_json(
                path, body, max_response_bytes=MAX_SESSION_RESPONSE_BYTES, max_request_bytes=limit
            )
        except TransportError as exc:
            if exc.retry_after_ms is not None and exc.retry_after_ms > 0:
                now = self._clock_ms()
                self._retry_after = (now, now + min(exc.retry_after_ms, MAX_RETRY_AFTER_MS))
            if exc.code in ("credentials_unavailable", "invalid_configuration"):
                raise SessionError(f"{operation}: {exc.message}", code=exc.code, cause=exc) from None
            if exc.http_status in (401, 403):
                raise SessionError(
                    f"{operation}: the cluster rejected the worker credential (HTTP {exc.http_status})",
                    code="credential_rejected", cause=exc,
                ) from None
            if exc.http_status == 409:
                raise SessionError(f"{operation}: session fenced (HTTP 409)", code="session_fenced",
                                   cause=exc) from None
            raise SessionError(f"{operation}: {exc}", code="session_unavailable", cause=exc) from None
        body_bytes: bytes = response.body
        return body_bytes

    def _register(self, slots: int) -> SessionRecord:
        now = self._clock_ms()
        session_id = new_uuid7(now, self._random_bytes)
        body = register_request_body(
            capabilities_json=self._capabilities_json,
            capabilities_hash=self._capabilities_hash,
            max_concurrent_runs=self._max_runs,
            available_slots=slots,
            lease_duration_ms=self._lease_ms,
        )
        raw = self._post(session_id, "register", body)
        try:
            projection = parse_register_response(raw, worker_id=self._worker_id, session_id=session_id)
        except ContractError as exc:
            raise SessionError(f"register: response rejected ({exc.code} at {exc.path})",
                               code="invalid_response") from None
        record = self._record(projection, registered_at_ms=now, heartbeat_at_ms=now)
        self._store.write_session_record(record.to_bytes())
        return record

    def _heartbeat(self, record: SessionRecord, slots: int) -> SessionRecord:
        now = self._clock_ms()
        body = heartbeat_request_body(
            generation=record.generation,
            expected_version=record.version,
            available_slots=slots,
            lease_duration_ms=self._lease_ms,
        )
        raw = self._post(record.session_id, "heartbeat", body)
        try:
            projection = parse_heartbeat_response(
                raw,
                worker_id=self._worker_id,
                session_id=record.session_id,
                generation=record.generation,
                expected_version=record.version,
            )
        except ContractError as exc:
            raise SessionError(f"heartbeat: response rejected ({exc.code} at {exc.path})",
                               code="invalid_response") from None
        updated = self._record(projection, registered_at_ms=record.registered_at_ms, heartbeat_at_ms=now)
        self._store.write_session_record(updated.to_bytes())
        return updated

    def _record(self, projection: SessionProjection, *, registered_at_ms: int, heartbeat_at_ms: int) -> SessionRecord:
        return SessionRecord(
            worker_id=projection.worker_id,
            session_id=projection.session_id,
            generation=projection.generation,
            version=projection.version,
            status=projection.status,
            lease_expires_at_ms=projection.lease_expires_at_ms,
            lease_duration_ms=self._lease_ms,
            capabilities_hash=self._capabilities_hash,
            registered_at_ms=registered_at_ms,
            heartbeat_at_ms=heartbeat_at_ms,
        )
