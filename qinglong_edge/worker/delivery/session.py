"""Keep the Worker Session alive: register once, then heartbeat (offer-delivery.md 5.1).

A cron-driven ``pull`` starts a fresh process every minute, so the session lives in a
record in the runtime directory (RAM, :mod:`qinglong_edge.worker.journal.runtime`; spec README
"Decisions for storage on flash": the heartbeat version changes every minute and is not
precious), ``session.json`` (0600)::

    {"schemaVersion":3,"bootId":<boot id>,
     "session":null | {"schemaVersion":1,"workerId":..,"sessionId":<uuidv7>,
                       "generation":<int>,"version":<int>,"status":"online",
                       "leaseExpiresAtMs":<int>,"leaseDurationMs":<int>,
                       "capabilitiesHash":<64 hex>,"registeredAtMs":<int>,"heartbeatAtMs":<int>},
     "retryAfter":null | {"setAtMs":<int>,"untilMs":<int>}}

Clocks (spec README "Decisions for clocks"): ``leaseExpiresAtMs`` is the cluster's;
``registeredAtMs``, ``heartbeatAtMs`` (the send instant of the call) and the Retry-After
window are boot-clock ms (``CLOCK_BOOTTIME``) of the boot ``bootId`` names, void in
another boot (a fallback runtime directory on flash outlives a reboot; the session is
registered again then). A ``schemaVersion`` 2 file (wall-clock times, written by an
older version) is read once, its times mapped onto the boot clock, so an upgrade never
re-registers a session its jobs rely on. The session lease runs out locally at the
earlier of the heartbeat's send instant + ``leaseDurationMs`` and ``leaseExpiresAtMs``
translated by the cluster's clock offset (:mod:`qinglong_edge.worker.delivery.cluster_clock`;
register and heartbeat answers are samples of it: ``leaseExpiresAtMs - leaseDurationMs``).

It is written only when it changes: after a register or a heartbeat (the version moves),
when a fenced session is dropped, and when a session call's ``Retry-After`` sets a new
window. A reboot loses it: the next cycle registers a new session (the cluster's old one
expires; a claim bound to it is dropped or abandoned by the pull coordinator). A record
that cannot be read is treated as absent (a new registration).

Each cycle :meth:`SessionKeeper.ensure`:

* no record, another workerId, an ``offline`` record, other capabilities with no
  record in flight, or a lease that has run out by our clock -> **register** a new
  session (a new UUIDv7 session id; the cluster assigns the generation);
* other capabilities while records are in flight (``in_flight``): the stored session
  is kept as it is (a registration would replace it and fence their leases), announcing
  no free slot (no new work under the old advertisement) until they are done
  (:attr:`SessionKeeper.deferred`); the registration that follows says
  ``capabilities_changed``;
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
  README: never retry sooner than it says; at most 1 h; kept in the record, so the next
  cron run honours it too): the stored session stays usable while its lease runs
  (``stale``), else ``session_unavailable``;
* a response that breaks the contract -> ``invalid_response``; any other transport
  failure -> ``session_unavailable``. A heartbeat that fails this way while the stored
  lease is still running leaves the session usable for this cycle (the offer pull
  then meets the same network on its own terms).

A heartbeat whose response is lost after the cluster committed it leaves our stored
``version`` one behind; the next heartbeat is then fenced (409). Spec README "Lease
clocks": it is sent once more with ``expectedVersion + 1`` (the cluster's version if
the lost answer was the only thing lost); only when that is fenced too is a new session
registered, as the reference worker does on every 409 (a re-registration replaces the
cluster's session row, which fences every lease of the old one: jobs in flight would
lose theirs). A pending claim of the old session is abandoned by the pull coordinator.

Transitions (``drain``, :meth:`SessionKeeper.transition`): ``draining`` and ``offline``
on the stored session, its answer's version and status stored; a keeper made with
``may_register=False`` never registers (a drain must not bring the device back online).

Cadence: ``pull`` runs from cron once a minute, so with the default 10 s interval every
cron cycle heartbeats; ``pull --duration`` cycles faster than the interval do not.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

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
    parse_transition_response,
    register_request_body,
    session_path,
    support_tier_for,
    transition_request_body,
)
from qinglong_edge.contracts.strictjson import dumps_bytes, loads
from qinglong_edge.crashpoints import crashpoint
from qinglong_edge.errors import JournalError, SessionError, TransportError
from qinglong_edge.worker.delivery.cluster_clock import ClusterClock
from qinglong_edge.worker.delivery.identity_guard import IdentityGuard
from qinglong_edge.worker.delivery.pacing import (
    LEASE_MARGIN_MS,
    heartbeat_due_ms,
    retry_after_window,
    session_step,
    waiting,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.contracts.ports import Transport
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory


__all__ = [
    "LEASE_MARGIN_MS",
    "STATE_NAME",
    "SessionKeeper",
    "SessionOutcome",
    "SessionRecord",
    "SessionState",
    "local_capabilities",
    "migrate_legacy_record",
    "parse_session_record",
    "parse_session_state",
    "platform_architecture",
    "unsupported_architecture_message",
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
#: The session state's name in the runtime directory.
STATE_NAME = "session.json"
_STATE_KEYS = ("schemaVersion", "bootId", "session", "retryAfter")
_LEGACY_STATE_KEYS = ("schemaVersion", "session", "retryAfter")
#: availableSlots values a lost session's register replay tries (SessionKeeper._recover).
_RECOVERY_TRIES = 4
_WINDOW_KEYS = ("setAtMs", "untilMs")




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
        return dumps_bytes(self.to_json()) + b"\n"

    def to_json(self) -> dict[str, object]:
        return {
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
        }


def parse_session_record(data: bytes) -> SessionRecord:
    """Parse ``session.json``.

    Raises:
        ContractError: strict-JSON codes, ``key_set`` and the field codes.
    """
    return _record_from(loads(data, max_bytes=MAX_RECORD_BYTES, min_bytes=2), "$")


def _record_from(value: object, path: str) -> SessionRecord:
    if not isinstance(value, dict):
        raise ContractError("not_object", path, "session record must be an object")
    exact_keys(value, _RECORD_KEYS, path)
    if value["schemaVersion"] != 1:
        raise ContractError("schema", f"{path}.schemaVersion", "must be 1")
    return SessionRecord(
        worker_id=string(value["workerId"], f"{path}.workerId", max_length=128, pattern=WORKER_ID),
        session_id=string(value["sessionId"], f"{path}.sessionId", max_length=36, pattern=SESSION_ID),
        generation=safe_int(value["generation"], f"{path}.generation", 1),
        version=safe_int(value["version"], f"{path}.version", 0),
        status=string(value["status"], f"{path}.status", max_length=32),
        lease_expires_at_ms=safe_int(value["leaseExpiresAtMs"], f"{path}.leaseExpiresAtMs"),
        lease_duration_ms=safe_int(value["leaseDurationMs"], f"{path}.leaseDurationMs", 5000, 600_000),
        capabilities_hash=string(value["capabilitiesHash"], f"{path}.capabilitiesHash", max_length=64,
                                 pattern=HEX64),
        registered_at_ms=safe_int(value["registeredAtMs"], f"{path}.registeredAtMs"),
        heartbeat_at_ms=safe_int(value["heartbeatAtMs"], f"{path}.heartbeatAtMs"),
    )


class SessionState(Frozen):
    """The runtime ``session.json``: the session (or None), the Retry-After window
    ``(set at, not before)`` of the last session call that had one (or None), both in
    boot-clock ms of boot ``boot_id``; ``boot_id`` None for a ``schemaVersion`` 2 file,
    whose times are wall-clock ms (see the module docstring)."""

    __slots__ = ("record", "retry_after", "boot_id")  # noqa: RUF023 (field order)

    record: SessionRecord | None
    retry_after: tuple[int, int] | None
    boot_id: str | None

    def __init__(self, record: SessionRecord | None, retry_after: tuple[int, int] | None = None,
                 boot_id: str | None = None) -> None:
        object.__setattr__(self, "record", record)
        object.__setattr__(self, "retry_after", retry_after)
        object.__setattr__(self, "boot_id", boot_id)

    def to_bytes(self) -> bytes:
        window = None if self.retry_after is None else {"setAtMs": self.retry_after[0],
                                                          "untilMs": self.retry_after[1]}
        return dumps_bytes({"schemaVersion": 3, "bootId": self.boot_id or "unknown",
                            "session": None if self.record is None else self.record.to_json(),
                            "retryAfter": window}) + b"\n"


def parse_session_state(data: bytes) -> SessionState:
    """Parse the runtime ``session.json`` (see the module docstring): ``schemaVersion`` 3,
    or 2 (then ``boot_id`` is None and the times are wall-clock ms).

    Raises:
        ContractError: strict-JSON codes, ``key_set``, ``schema`` and the field codes.
    """
    value = loads(data, max_bytes=MAX_RECORD_BYTES, min_bytes=2)
    if not isinstance(value, dict):
        raise ContractError("not_object", "$", "session state must be an object")
    version = value.get("schemaVersion")
    if type(version) is not int or version not in (2, 3):
        raise ContractError("schema", "$.schemaVersion", "must be 3 (or 2)")
    legacy = version == 2
    exact_keys(value, _LEGACY_STATE_KEYS if legacy else _STATE_KEYS, "$")
    boot = None if legacy else string(value["bootId"], "$.bootId", max_length=64)
    record = None if value["session"] is None else _record_from(value["session"], "$.session")
    window = value["retryAfter"]
    if window is None:
        return SessionState(record, None, boot)
    if not isinstance(window, dict):
        raise ContractError("not_object", "$.retryAfter", "must be an object or null")
    exact_keys(window, _WINDOW_KEYS, "$.retryAfter")
    set_at = safe_int(window["setAtMs"], "$.retryAfter.setAtMs")
    until = safe_int(window["untilMs"], "$.retryAfter.untilMs", set_at)
    return SessionState(record, (set_at, until), boot)


def _onto_boot(state: SessionState, boot_now: int, wall_now: int, boot_id: str) -> SessionState:
    """A ``schemaVersion`` 2 state (wall ms) with its times mapped onto this boot's clock."""
    shift = boot_now - wall_now
    record = state.record
    if record is not None:
        record = SessionRecord(record.worker_id, record.session_id, record.generation, record.version,
                               record.status, record.lease_expires_at_ms, record.lease_duration_ms,
                               record.capabilities_hash, max(0, record.registered_at_ms + shift),
                               max(0, record.heartbeat_at_ms + shift))
    window = state.retry_after
    if window is not None:
        window = (max(0, window[0] + shift), max(0, window[1] + shift))
    return SessionState(record, window, boot_id)


def migrate_legacy_record(data: bytes | None, store: RuntimeDirectory) -> bool:
    """Carry a ``session.json`` of the journal root (versions before the runtime
    directory) into the runtime directory, unless it already has a session there.
    Returns whether it was carried over (an unreadable one is dropped)."""
    if data is None:
        return False
    try:
        record = parse_session_record(data)
        if store.read(STATE_NAME) is not None:
            return False
    except (ContractError, OSError):
        return False
    # As a schemaVersion 2 state (its times are wall ms): the keeper maps it onto the boot clock.
    store.write(STATE_NAME, dumps_bytes({"schemaVersion": 2, "session": record.to_json(), "retryAfter": None}) + b"\n")
    return True


def platform_architecture(machine: str | None = None) -> tuple[str, str | None, str | None]:
    """``(uname machine, cluster architecture or None, support tier or None)`` of this
    device (offer-delivery.md 5.1; ``os.uname().machine`` unless ``machine`` is given)."""
    machine = os.uname().machine if machine is None else machine  # platform.machine(), without the import
    architecture = architecture_for_machine(machine)
    tier = support_tier_for(architecture) if architecture else None
    return machine, architecture, tier if architecture else None


def unsupported_architecture_message(machine: str) -> str:
    """The one line ``pull`` and ``doctor`` say on a machine QingLong cannot place work on."""
    return (f"this device's architecture ({machine!r}) is not one QingLong can place work on (its worker "
            "architectures are amd64, arm64, arm/v7, arm/v6, 386, ppc64le and s390x; mips has none): the Remote "
            "Worker role cannot work here; remove the worker section (the Local run API still works)")


def local_capabilities(machine: str | None = None) -> dict[str, Any]:
    """Capabilities of this device (5.1, newer revision): architecture from the real
    platform mapped to the cluster's list, ``executors: ["remote-worker"]``, the
    protocol version and the architecture's support tier.

    Raises:
        SessionError: ``unsupported_architecture`` when the machine maps to no cluster
            architecture (e.g. MIPS routers): the cluster could never place work here.
    """
    machine, architecture, tier = platform_architecture(machine)
    if architecture is None or tier is None:
        raise SessionError(unsupported_architecture_message(machine), code="unsupported_architecture")
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
    """Registers and heartbeats the Worker Session; keeps it in ``store``.

    Args:
        store: the runtime directory (``read``/``write`` of :data:`STATE_NAME`).
        transport: an ingress transport with ``post_json``.
        worker_id: the configured workerId.
        max_concurrent_runs: 1..1024 (5.1).
        lease_duration_ms: 5 000..600 000; the cron default 180 000 outlives a missed minute.
        heartbeat_interval_ms: heartbeat when this much time has passed (default 10 000;
            2 x interval must not exceed the lease).
        clock_ms: the boot clock (``CLOCK_BOOTTIME`` ms): every timer of the session.
        random_bytes: randomness for the UUIDv7 session id.
        capabilities: the capabilities object (default :func:`local_capabilities`).
        cluster: the cluster's clock (:class:`~qinglong_edge.worker.delivery.cluster_clock.ClusterClock`),
            fed by every register and heartbeat answer; None: the cluster's times are
            taken to be on ``clock_ms`` (tests of the keeper alone).
        wall_ms: the wall clock, for the UUIDv7 timestamp only (default: ``clock.wall_ms``).
        boot_id: this boot's id (default: the cluster clock's, else ``clock.boot_id``).
        may_register: False for a keeper that only keeps (and transitions) the stored
            session, whatever its capabilities (``drain``): where a registration would be
            needed, :meth:`ensure` raises ``session_lost`` instead.
    """

    def __init__(
        self,
        store: RuntimeDirectory,
        transport: Transport,
        *,
        worker_id: str,
        max_concurrent_runs: int,
        lease_duration_ms: int,
        heartbeat_interval_ms: int = 10_000,
        clock_ms: Callable[[], int],
        random_bytes: Callable[[int], bytes] = os.urandom,
        capabilities: dict[str, Any] | None = None,
        cluster: ClusterClock | None = None,
        wall_ms: Callable[[], int] | None = None,
        boot_id: str | None = None,
        may_register: bool = True,
        identity: IdentityGuard | None = None,
    ) -> None:
        import qinglong_edge.clock as _clock

        if 2 * heartbeat_interval_ms > lease_duration_ms:
            heartbeat_interval_ms = lease_duration_ms // 2
        self._store = store
        self._transport = transport
        self._worker_id = worker_id
        self._max_runs = max_concurrent_runs
        self._lease_ms = lease_duration_ms
        self._heartbeat_ms = heartbeat_interval_ms
        self._clock_ms = clock_ms
        self._cluster = cluster
        self._wall_ms = wall_ms or _clock.wall_ms
        self._boot_id = boot_id or (cluster.boot_id if cluster is not None else None) or _clock.boot_id() or "unknown"
        self._random_bytes = random_bytes
        self._may_register = may_register
        self._capabilities_json: str | None = None
        self._capabilities_hash: str | None = None
        if may_register:
            caps = local_capabilities() if capabilities is None else capabilities
            self._capabilities_json, self._capabilities_hash = capabilities_snapshot(caps)
        #: Records in flight at the last :meth:`ensure` (a capability change waits for 0).
        self._in_flight = 0
        #: The stored session advertises other capabilities and is kept for the records in
        #: flight (module docstring): no free slot is announced, nothing is claimed.
        self.deferred = False
        #: ``availableSlots`` of this process's last successful register or heartbeat.
        self.announced_slots: int | None = None
        # (set at, not before) in boot ms from a 429/503 Retry-After of a session call;
        # kept in the state file for this boot only.
        self._retry_after: tuple[int, int] | None = None
        self._saved: SessionState | None = None
        self._found = False
        self._lost = False
        #: Replacements of our session by another device (issue 23 item 6).
        self.identity = identity if identity is not None else IdentityGuard(store, worker_id)

    @property
    def capabilities_hash(self) -> str | None:
        return self._capabilities_hash

    def _load(self) -> SessionState:
        data: bytes | None = None
        bad = False
        try:
            data = self._store.read(STATE_NAME)
            state = SessionState(None, None, self._boot_id) if data is None else parse_session_state(data)
        except (ContractError, OSError):
            state, bad = SessionState(None, None, self._boot_id), True  # unreadable: a new registration
        #: The record is gone or damaged (not a session we dropped ourselves after a fence).
        self._lost = bad or data is None
        if state.boot_id is None:  # schemaVersion 2 (an older version): wall times onto this boot, once
            state = _onto_boot(state, self._clock_ms(), self._wall_ms(), self._boot_id)
            try:
                self._store.write(STATE_NAME, state.to_bytes())
            except (JournalError, OSError):
                bad = True  # rewritten at the next save (mapped again meanwhile)
        elif state.boot_id != self._boot_id:  # another boot's (a fallback directory on flash)
            state = SessionState(state.record, None, "void")
        self._saved = None if bad else state  # an unreadable or converted file is rewritten at the next save
        self._found = bad or data is not None
        return state

    def _usable(self, record: SessionRecord | None, boot_id: str | None = None) -> SessionRecord | None:
        if record is None or record.worker_id != self._worker_id or record.status == "offline":
            return None
        if self._capabilities_hash not in (None, record.capabilities_hash) and not self._in_flight:
            return None  # other capabilities and nothing in flight: register them
        if boot_id is not None and boot_id != self._boot_id:
            return None  # its times are another boot's: the session is registered again
        return record

    def lease_end_ms(self, record: SessionRecord) -> int:
        """When the session lease runs out by this device's boot clock (module docstring)."""
        by_send = record.heartbeat_at_ms + record.lease_duration_ms
        if self._cluster is None:
            return min(by_send, record.lease_expires_at_ms)
        local = self._cluster.cluster_to_boot(record.lease_expires_at_ms)
        error = self._cluster.error_ms()
        return by_send if local is None or error is None else min(by_send, local - error)

    def _save(self, record: SessionRecord | None) -> None:
        """Write the state when it differs from what is stored (spec: only when it changes)."""
        state = SessionState(record, self._retry_after, self._boot_id)
        if state != self._saved:
            self._store.write(STATE_NAME, state.to_bytes())
            self._saved = state

    def next_call_ms(self, now_ms: int) -> int:
        """When :meth:`ensure` would next call the cluster (boot ms; ``now_ms`` when due):
        the stored session's next heartbeat, or now (register), never inside a
        Retry-After window. For a resident ``pull``, which keeps no other timer."""
        state = self._load()
        record = self._usable(state.record, state.boot_id)
        end = None if record is None else self.lease_end_ms(record)
        due = now_ms if record is None or end is None else heartbeat_due_ms(end, record.heartbeat_at_ms,
                                                                             self._heartbeat_ms)
        if end is not None and end - LEASE_MARGIN_MS <= now_ms:
            due = now_ms
        window = state.retry_after
        if waiting(window, now_ms) and window is not None:
            due = max(due, window[1])
        return due

    def current(self) -> SessionRecord | None:
        """The stored session record, or None (absent, unreadable or another worker's)."""
        state = self._load()
        return self._usable(state.record, state.boot_id)

    def ensure(self, available_slots: int, *, announce: bool = False, in_flight: int = 0,
               sessions_in_flight: Sequence[tuple[str, str, int]] = ()) -> SessionOutcome:
        """Make sure an online session with a running lease exists (see module docstring).

        Args:
            available_slots: 0..max_concurrent_runs; what the cluster may place here.
            announce: heartbeat now (unless Retry-After forbids it) when ``available_slots``
                is more than this process last announced: a resident ``pull`` whose job
                ended frees its slot at the cluster before it pulls (the cluster answers
                ``idle worker_unavailable`` to a session that announced none free).
            in_flight: the records in flight (their leases are bound to the stored
                session: a capability change does not replace it while any is).
            sessions_in_flight: ``(workerId, sessionId, generation)`` of those records. When
                the session record is gone or damaged while records are in flight, the
                session of the newest of them is registered again (a register replay, which
                the cluster answers with its current row unchanged when that session is
                still current: nothing is fenced), never a blind new session (issue 23).

        Raises:
            SessionError: ``credential_rejected``, ``credentials_unavailable``,
                ``invalid_response`` or ``session_unavailable`` when no usable session
                exists afterwards; ``identity_conflict`` while another device uses this
                worker id (:mod:`qinglong_edge.worker.delivery.identity_guard`: no call is made).
            JournalError: the runtime directory cannot be written.
        """
        self.identity.check()
        slots = max(0, min(available_slots, self._max_runs))
        self._in_flight = max(0, in_flight)
        state = self._load()
        stored = state.record
        record = self._usable(stored, state.boot_id)
        self.deferred = record is not None and self._capabilities_hash not in (None, record.capabilities_hash)
        if self.deferred:
            slots = 0
        self._retry_after = state.retry_after
        now = self._clock_ms()
        step = session_step(None if record is None else self.lease_end_ms(record),
                            None if record is None else record.heartbeat_at_ms,
                            now, self._heartbeat_ms, self._retry_after)
        if (record is not None and step == "current" and announce and self.announced_slots is not None
                and slots > self.announced_slots):
            step = "heartbeat"
        if record is not None and step == "current":
            return SessionOutcome(record, "current")
        if record is not None and step == "wait_stale":  # README: never sooner than Retry-After
            return SessionOutcome(record, "stale", detail="retry_after")
        if record is not None and step == "heartbeat":
            try:
                beat = self._heartbeat(record, slots)
            except SessionError as exc:
                if exc.code == "session_fenced":
                    # Spec README "Lease clocks": a heartbeat whose answer was lost left the
                    # stored version one behind the cluster's; try once with
                    # expectedVersion + 1 before the session counts as fenced, so a lost
                    # answer never fences in-flight work.
                    try:
                        beat = self._heartbeat(record, slots, expected_version=record.version + 1)
                    except SessionError as again:
                        exc = again
                    else:
                        return SessionOutcome(beat, "heartbeat", detail="version_resynced")
                if exc.code == "session_fenced":
                    self._save(None)  # the session failed closed
                    self.deferred = False
                    if self.identity.fenced():
                        self.identity.check()  # another device's third replacement: quiet, not registered
                    return SessionOutcome(self._register(slots), "registered", replaced=True, detail=exc.code)
                self._save(record)  # a new Retry-After window, if any
                if exc.code in ("credential_rejected", "credentials_unavailable", "invalid_configuration"):
                    raise
                return SessionOutcome(record, "stale", detail=exc.code)
            return SessionOutcome(beat, "heartbeat")
        if step == "wait_unavailable":
            raise SessionError("the cluster asked to retry the session call later (Retry-After)",
                               code="session_unavailable")
        ours = [item for item in sessions_in_flight if item[0] == self._worker_id]
        if stored is None and self._lost and ours:
            _, session_id, generation = max(ours, key=lambda item: item[2])
            recovered = self._recover(slots, session_id)
            return SessionOutcome(recovered, "registered", replaced=recovered.generation != generation,
                                  detail="recovered")
        changed = (stored is not None and stored.worker_id == self._worker_id and stored.status != "offline"
                   and stored.capabilities_hash != self._capabilities_hash)
        return SessionOutcome(self._register(slots), "registered",
                              replaced=stored is not None or (record is None and self._found and stored is None),
                              detail="capabilities_changed" if changed else "")

    # -- calls -----------------------------------------------------------------------------

    def _post(self, session_id: str, operation: str, body: bytes) -> bytes:
        path = session_path(self._worker_id, session_id, operation)
        limit = MAX_REGISTER_REQUEST_BYTES if operation == "register" else MAX_SESSION_REQUEST_BYTES
        try:
            response = self._transport.post_json(
                path, body, max_response_bytes=MAX_SESSION_RESPONSE_BYTES, max_request_bytes=limit
            )
        except TransportError as exc:
            window = retry_after_window(self._clock_ms(), exc.retry_after_ms)
            if window is not None:
                self._retry_after = window
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

    def _observe(self, projection: SessionProjection, sent: int, operation: str) -> None:
        """A register or heartbeat answer is a sample of the cluster's clock (spec README
        "Decisions for clocks"): its lease was granted now, ``leaseExpiresAtMs -
        leaseDurationMs``. Never a register replay (:meth:`_recover`: the row unchanged)."""
        if self._cluster is not None:
            self._cluster.observe(projection.lease_expires_at_ms - self._lease_ms, sent, self._clock_ms(), operation)

    def _recover(self, slots: int, session_id: str) -> SessionRecord:
        """Register ``session_id`` again (the session of a record in flight, whose record
        was lost): the reference answers a register of its current session with the row
        unchanged, but only for the same snapshot, ``availableSlots`` included
        (workerSessionRepository.ts ``register``), and the value last announced is lost
        with the record. So a few values are tried, the likeliest first (what is free now,
        then one more, as before the accept that filled it): each refusal is a 409 that
        changes nothing. All refused: ``session_fenced`` (the records' own calls go on; the
        next cycle tries again; once none is in flight a new session is registered)."""
        values = sorted(range(self._max_runs + 1), key=lambda value: (value < slots, abs(value - slots)))
        for value in values[:_RECOVERY_TRIES]:
            try:
                return self._register(value, session_id=session_id)
            except SessionError as exc:
                if exc.code != "session_fenced" or value == values[:_RECOVERY_TRIES][-1]:
                    raise
        raise SessionError("register: no value to try", code="session_fenced")  # unreachable: range has 0

    def _register(self, slots: int, session_id: str | None = None) -> SessionRecord:
        if not self._may_register or self._capabilities_json is None or self._capabilities_hash is None:
            raise SessionError("no live session to keep (none stored, fenced or its lease ran out): nothing is "
                               "registered", code="session_lost")
        now = self._clock_ms()
        replay = session_id is not None  # a lost record's session registered again (_recover)
        session_id = session_id or new_uuid7(self._wall_ms(), self._random_bytes)
        body = register_request_body(
            capabilities_json=self._capabilities_json,
            capabilities_hash=self._capabilities_hash,
            max_concurrent_runs=self._max_runs,
            available_slots=slots,
            lease_duration_ms=self._lease_ms,
        )
        try:
            raw = self._post(session_id, "register", body)
        except SessionError:
            self._save(None)  # a new Retry-After window, if any; no session
            raise
        try:
            projection = parse_register_response(raw, worker_id=self._worker_id, session_id=session_id)
        except ContractError as exc:
            raise SessionError(f"register: response rejected ({exc.code} at {exc.path})",
                               code="invalid_response") from None
        if not replay:  # a replay's row is unchanged, its times stored ones: never a clock sample
            self._observe(projection, now, "register")
        record = self._record(projection, registered_at_ms=now, heartbeat_at_ms=now,
                              capabilities_hash=self._capabilities_hash)
        self._retry_after = None
        self._save(record)
        self.announced_slots = slots
        if self.identity.registered(projection.generation):
            self.identity.check()  # the third replacement by another device: quiet from now on
        return record

    def _heartbeat(self, record: SessionRecord, slots: int, expected_version: int | None = None) -> SessionRecord:
        now = self._clock_ms()
        expected = record.version if expected_version is None else expected_version
        body = heartbeat_request_body(
            generation=record.generation,
            expected_version=expected,
            available_slots=slots,
            lease_duration_ms=self._lease_ms,
        )
        raw = self._post(record.session_id, "heartbeat", body)
        crashpoint("session.heartbeat_answered")
        try:
            projection = parse_heartbeat_response(
                raw,
                worker_id=self._worker_id,
                session_id=record.session_id,
                generation=record.generation,
                expected_version=expected,
            )
        except ContractError as exc:
            raise SessionError(f"heartbeat: response rejected ({exc.code} at {exc.path})",
                               code="invalid_response") from None
        self._observe(projection, now, "heartbeat")
        updated = self._record(projection, registered_at_ms=record.registered_at_ms, heartbeat_at_ms=now,
                               capabilities_hash=record.capabilities_hash)
        self._retry_after = None
        self._save(updated)
        self.announced_slots = slots
        return updated

    def transition(self, status: str) -> SessionRecord:
        """Send ``status`` (``draining`` or ``offline``) for the stored session and store
        the answer (offer-delivery.md 5.1; ``drain``). A 409 is tried once more with
        ``expectedVersion + 1`` (an earlier answer lost after the cluster committed it,
        as for heartbeats; ``draining`` again is the reference's replay).

        Raises:
            SessionError: ``session_lost`` (no live stored session), ``session_fenced``
                (the record is then removed), ``credential_rejected``,
                ``credentials_unavailable``, ``invalid_response``, ``session_unavailable``.
            JournalError: the runtime directory cannot be written.
        """
        state = self._load()
        self._retry_after = state.retry_after
        record = self._usable(state.record, state.boot_id)
        if record is None or self.lease_end_ms(record) <= self._clock_ms():
            raise SessionError("no live session to transition (none stored, offline or its lease ran out)",
                               code="session_lost")
        try:
            return self._transition(record, status, record.version)
        except SessionError as exc:
            if exc.code != "session_fenced":
                self._save(record)  # a new Retry-After window, if any
                raise
        try:
            return self._transition(record, status, record.version + 1)
        except SessionError as exc:
            if exc.code == "session_fenced":
                self._save(None)  # the session failed closed
            else:
                self._save(record)
            raise

    def _transition(self, record: SessionRecord, status: str, expected: int) -> SessionRecord:
        body = transition_request_body(generation=record.generation, expected_version=expected, status=status)
        raw = self._post(record.session_id, "transition", body)
        try:
            projection = parse_transition_response(raw, worker_id=self._worker_id, session_id=record.session_id,
                                                   generation=record.generation, expected_version=expected,
                                                   status=status)
        except ContractError as exc:
            raise SessionError(f"transition: response rejected ({exc.code} at {exc.path})",
                               code="invalid_response") from None
        updated = self._record(projection, registered_at_ms=record.registered_at_ms,
                               heartbeat_at_ms=record.heartbeat_at_ms, capabilities_hash=record.capabilities_hash)
        self._retry_after = None
        self._save(updated)
        if status != "online":
            self.announced_slots = 0
        return updated

    def _record(self, projection: SessionProjection, *, registered_at_ms: int, heartbeat_at_ms: int,
                capabilities_hash: str) -> SessionRecord:
        return SessionRecord(
            worker_id=projection.worker_id,
            session_id=projection.session_id,
            generation=projection.generation,
            version=projection.version,
            status=projection.status,
            lease_expires_at_ms=projection.lease_expires_at_ms,
            lease_duration_ms=self._lease_ms,
            capabilities_hash=capabilities_hash,
            registered_at_ms=registered_at_ms,
            heartbeat_at_ms=heartbeat_at_ms,
        )
