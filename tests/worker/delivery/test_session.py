"""SessionKeeper (offer-delivery.md 5.1): register, heartbeat cadence, fencing, expiry,
Retry-After remembered across processes, the session state in a real runtime directory;
the double's state machine answers in-process. Also the record parsers, the legacy
record's migration and the heartbeatIntervalMs configuration rule."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qinglong_edge.config import parse_config
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.errors import ConfigError, SessionError, TransportError
from qinglong_edge.worker.delivery.session import (
    LEASE_MARGIN_MS,
    STATE_NAME,
    SessionKeeper,
    SessionRecord,
    SessionState,
    local_capabilities,
    migrate_legacy_record,
    parse_session_record,
    parse_session_state,
)
from qinglong_edge.worker.journal.runtime import RuntimeDirectory
from qinglong_edge.worker.journal.store import Journal
from tests.support.cluster_state import ClusterState
from tests.support.direct_ingress import DirectIngress, Response
from tests.support.manual_clock import T0_MS, ManualClock

T0 = T0_MS  # where the clock fixture starts
LEASE_MS = 60_000
HEARTBEAT_MS = 10_000
BOOT = "6f1c0e2a-1b2c-4d3e-8f40-123456789abc"


@pytest.fixture
def ingress(clock: ManualClock) -> DirectIngress:
    return DirectIngress(ClusterState(os.urandom(32), clock_ms=clock))


@pytest.fixture
def store(runtime: RuntimeDirectory) -> RuntimeDirectory:
    assert not runtime.on_fallback
    return runtime


def _stored(store: RuntimeDirectory) -> SessionState | None:
    data = store.read(STATE_NAME)
    return None if data is None else parse_session_state(data)


def _keeper(store: RuntimeDirectory, ingress: Any, clock: ManualClock, **kwargs: Any) -> SessionKeeper:
    options: dict[str, Any] = {
        "worker_id": "edge-1", "max_concurrent_runs": 2, "lease_duration_ms": LEASE_MS,
        "heartbeat_interval_ms": HEARTBEAT_MS, "clock_ms": clock, "wall_ms": clock, "boot_id": BOOT,
        "capabilities": local_capabilities("aarch64"),
    }
    options.update(kwargs)
    return SessionKeeper(store, ingress, **options)


def _ops(ingress: DirectIngress) -> list[str]:
    return [path.rsplit("/", 1)[1] for path, _ in ingress.calls]


def test_first_ensure_registers_and_persists_the_session(store: RuntimeDirectory, ingress: DirectIngress,
                                                         clock: ManualClock) -> None:
    outcome = _keeper(store, ingress, clock).ensure(available_slots=5)
    assert (outcome.action, outcome.replaced) == ("registered", False)
    record = outcome.session
    assert (record.generation, record.version, record.status) == (1, 0, "online")
    assert record.lease_expires_at_ms == T0 + LEASE_MS
    assert int(record.session_id[:8] + record.session_id[9:13], 16) == T0  # UUIDv7 carries the time
    body = json.loads(ingress.calls[0][1])
    assert json.loads(body["capabilitiesJson"]) == {"architecture": "arm64", "executors": ["remote-worker"],
                                                    "protocolVersion": "1.0.0", "supportTier": "tier1"}
    assert (body["maxConcurrentRuns"], body["availableSlots"], body["leaseDurationMs"]) == (2, 2, LEASE_MS)
    stored = _stored(store)
    assert stored is not None and stored == SessionState(record, None, BOOT)


def test_within_the_interval_the_session_is_current_without_network_io(store: RuntimeDirectory, ingress: DirectIngress,
                                                                       clock: ManualClock) -> None:
    keeper = _keeper(store, ingress, clock)
    keeper.ensure(1)
    clock.now += HEARTBEAT_MS - 1
    assert keeper.ensure(1).action == "current"
    assert _ops(ingress) == ["register"]


def test_heartbeat_after_the_interval_increments_the_version(store: RuntimeDirectory, ingress: DirectIngress,
                                                             clock: ManualClock) -> None:
    keeper = _keeper(store, ingress, clock)
    first = keeper.ensure(1).session
    clock.now += HEARTBEAT_MS
    beat = _keeper(store, ingress, clock).ensure(0)  # a new process: state comes from the runtime record
    assert (beat.action, beat.session.version, beat.session.session_id) == ("heartbeat", 1, first.session_id)
    assert beat.session.heartbeat_at_ms == clock.now and beat.session.registered_at_ms == T0
    assert json.loads(ingress.calls[-1][1]) == {"schema": "qinglong/worker-session-heartbeat@v1", "generation": 1,
                                                "expectedVersion": 0, "availableSlots": 0,
                                                "leaseDurationMs": LEASE_MS}
    assert ingress.state.sessions["edge-1"].version == 1


def test_a_clock_that_stepped_back_heartbeats_rather_than_trusting_the_record(
    store: RuntimeDirectory, ingress: DirectIngress, clock: ManualClock
) -> None:
    keeper = _keeper(store, ingress, clock)
    keeper.ensure(1)
    clock.now -= 1
    assert keeper.ensure(1).action == "heartbeat"


def test_fenced_heartbeat_registers_a_new_session(store: RuntimeDirectory, ingress: DirectIngress, clock: ManualClock) -> None:
    keeper = _keeper(store, ingress, clock)
    old = keeper.ensure(1).session
    ingress.state.expire_session("edge-1")
    clock.now += HEARTBEAT_MS
    outcome = keeper.ensure(1)
    assert (outcome.action, outcome.replaced, outcome.detail) == ("registered", True, "session_fenced")
    assert outcome.session.generation == old.generation + 1
    assert outcome.session.session_id != old.session_id
    # the fenced heartbeat is tried once more with expectedVersion + 1 (a lost answer), then
    # the session is given up
    assert _ops(ingress) == ["register", "heartbeat", "heartbeat", "register"]


def test_a_lost_heartbeat_answer_is_resynced_with_expected_version_plus_one(
    store: RuntimeDirectory, ingress: DirectIngress, clock: ManualClock
) -> None:
    """Spec README "Lease clocks": the cluster committed a heartbeat whose answer was lost;
    the next one is fenced (version_mismatch), retried once with expectedVersion + 1 and
    accepted: the same session goes on (nothing in flight is fenced by a re-registration)."""
    keeper = _keeper(store, ingress, clock)
    first = keeper.ensure(1).session
    clock.now += HEARTBEAT_MS
    ingress.script.append("commit_then_lose")
    assert keeper.ensure(1).action == "stale"  # the answer was lost: the stored version is one behind
    clock.now += HEARTBEAT_MS
    outcome = keeper.ensure(1)
    assert (outcome.action, outcome.detail, outcome.replaced) == ("heartbeat", "version_resynced", False)
    assert (outcome.session.session_id, outcome.session.version) == (first.session_id, first.version + 2)
    bodies = [json.loads(body) for path, body in ingress.calls if path.endswith("/heartbeat")]
    assert [b["expectedVersion"] for b in bodies] == [0, 0, 1]
    assert _ops(ingress) == ["register", "heartbeat", "heartbeat", "heartbeat"]


def test_lease_over_by_our_clock_registers_without_a_heartbeat(store: RuntimeDirectory, ingress: DirectIngress,
                                                               clock: ManualClock) -> None:
    keeper = _keeper(store, ingress, clock)
    keeper.ensure(1)
    clock.now = T0 + LEASE_MS - LEASE_MARGIN_MS
    outcome = keeper.ensure(1)
    assert (outcome.action, outcome.replaced, outcome.session.generation) == ("registered", True, 2)
    assert _ops(ingress) == ["register", "register"]


def test_transient_heartbeat_failure_keeps_the_running_session(store: RuntimeDirectory, ingress: DirectIngress,
                                                               clock: ManualClock) -> None:
    keeper = _keeper(store, ingress, clock)
    old = keeper.ensure(1).session
    clock.now += HEARTBEAT_MS
    ingress.script.append(TransportError("timed out", code="request_rejected"))
    outcome = keeper.ensure(1)
    assert (outcome.action, outcome.detail, outcome.session) == ("stale", "session_unavailable", old)


def test_retry_after_on_a_heartbeat_is_honoured(store: RuntimeDirectory, ingress: DirectIngress, clock: ManualClock) -> None:
    # spec README: 429/503 with Retry-After never retry sooner than it says (a `pull
    # --duration` loop cycles every 2 s; field-lessons 7: no 429 loops).
    keeper = _keeper(store, ingress, clock)
    old = keeper.ensure(1).session
    clock.now += HEARTBEAT_MS
    ingress.script.append(TransportError("busy", code="response_rejected", http_status=429, retry_after_ms=30_000))
    assert keeper.ensure(1).action == "stale"
    calls = len(ingress.calls)
    clock.now += 29_999
    outcome = keeper.ensure(1)
    assert (outcome.action, outcome.session) == ("stale", old)
    assert len(ingress.calls) == calls  # no request before Retry-After has passed
    clock.now += 1
    assert keeper.ensure(1).action == "heartbeat"


def test_retry_after_on_a_registration_is_honoured(store: RuntimeDirectory, ingress: DirectIngress, clock: ManualClock) -> None:
    keeper = _keeper(store, ingress, clock)
    ingress.script.append(TransportError("busy", code="response_rejected", http_status=503, retry_after_ms=20_000))
    with pytest.raises(SessionError):
        keeper.ensure(1)
    clock.now += 10_000
    with pytest.raises(SessionError) as info:
        keeper.ensure(1)
    assert info.value.code == "session_unavailable"
    assert len(ingress.calls) == 1
    clock.now += 10_000
    assert keeper.ensure(1).action == "registered"


def test_retry_after_outlives_the_process_that_got_it(store: RuntimeDirectory, ingress: DirectIngress,
                                                      clock: ManualClock) -> None:
    """Issue 18 item 6: the next cron run (a new keeper) honours a session call's
    Retry-After; the window is in the session record."""
    _keeper(store, ingress, clock).ensure(1)
    clock.now += HEARTBEAT_MS
    ingress.script.append(TransportError("busy", code="response_rejected", http_status=503, retry_after_ms=30_000))
    assert _keeper(store, ingress, clock).ensure(1).action == "stale"
    stored = _stored(store)
    assert stored is not None and stored.retry_after == (clock.now, clock.now + 30_000)
    calls = len(ingress.calls)
    clock.now += 20_000  # a later cycle, a new process (the stored lease still runs)
    outcome = _keeper(store, ingress, clock).ensure(1)
    assert (outcome.action, outcome.detail) == ("stale", "retry_after")
    assert len(ingress.calls) == calls
    clock.now += 10_000
    assert _keeper(store, ingress, clock).ensure(1).action == "heartbeat"
    after = _stored(store)
    assert after is not None and after.retry_after is None  # cleared by the answered call


def test_retry_after_on_a_registration_is_remembered_without_a_session(store: RuntimeDirectory,
                                                                        ingress: DirectIngress, clock: ManualClock) -> None:
    ingress.script.append(TransportError("busy", code="response_rejected", http_status=429, retry_after_ms=30_000))
    with pytest.raises(SessionError):
        _keeper(store, ingress, clock).ensure(1)
    assert _stored(store) == SessionState(None, (T0, T0 + 30_000), BOOT)
    clock.now += 29_999
    with pytest.raises(SessionError) as info:
        _keeper(store, ingress, clock).ensure(1)  # another process
    assert info.value.code == "session_unavailable" and len(ingress.calls) == 1
    clock.now += 1
    assert _keeper(store, ingress, clock).ensure(1).action == "registered"


class CountingStore:
    """The runtime directory, counting writes (a rename can reuse an inode number, so
    the file's identity cannot tell a rewrite)."""

    def __init__(self, inner: RuntimeDirectory) -> None:
        self.inner = inner
        self.writes = 0  # of session.json
        self.others: list[str] = []  # every other name written (identity.json at a registration)

    def read(self, name: str) -> bytes | None:
        return self.inner.read(name)

    def write(self, name: str, data: bytes) -> None:
        if name == "session.json":
            self.writes += 1
        else:
            self.others.append(name)
        self.inner.write(name, data)


def test_the_record_is_written_only_when_it_changes(store: RuntimeDirectory, ingress: DirectIngress,
                                                    clock: ManualClock) -> None:
    counting = CountingStore(store)

    def ensure() -> str:
        return SessionKeeper(counting, ingress, worker_id="edge-1", max_concurrent_runs=2,
                             lease_duration_ms=LEASE_MS, heartbeat_interval_ms=HEARTBEAT_MS, clock_ms=clock,
                             capabilities=local_capabilities("aarch64")).ensure(1).action

    assert ensure() == "registered" and counting.writes == 1
    clock.now += 1
    assert ensure() == "current" and counting.writes == 1
    clock.now += HEARTBEAT_MS
    ingress.script.append(TransportError("reset", code="request_rejected"))
    assert ensure() == "stale" and counting.writes == 1  # no Retry-After: nothing new to keep
    assert ensure() == "heartbeat" and counting.writes == 2  # the version moved
    clock.now += HEARTBEAT_MS
    ingress.script.append(TransportError("busy", code="response_rejected", http_status=503, retry_after_ms=5_000))
    assert ensure() == "stale" and counting.writes == 3  # a new Retry-After window is a change
    assert ensure() == "stale" and counting.writes == 3  # waiting: nothing written
    assert counting.others == ["identity.json"]  # the registration's generation, once (issue 23)


@pytest.mark.parametrize("case", [
    ("register", 401, "credential_rejected"),
    ("register", 403, "credential_rejected"),
    ("register", 503, "session_unavailable"),
    ("heartbeat", 401, "credential_rejected"),
], ids=lambda case: f"{case[0]}-{case[1]}")
def test_rejects_session_calls_with_the_mapped_code(store: RuntimeDirectory, ingress: DirectIngress, clock: ManualClock,
                                                    case: tuple[str, int, str]) -> None:
    operation, status, code = case
    keeper = _keeper(store, ingress, clock)
    if operation == "heartbeat":
        keeper.ensure(1)
        clock.now += HEARTBEAT_MS
    ingress.script.append(TransportError("no", code="response_rejected", http_status=status))
    with pytest.raises(SessionError) as info:
        keeper.ensure(1)
    assert info.value.code == code
    assert ingress.secret not in str(info.value)


@pytest.mark.parametrize("code", ["credentials_unavailable", "invalid_configuration"])
def test_credential_file_problems_are_configuration_errors(store: RuntimeDirectory, ingress: DirectIngress,
                                                           clock: ManualClock, code: str) -> None:
    ingress.script.append(TransportError("credential file has group bits", code=code))
    with pytest.raises(SessionError) as info:
        _keeper(store, ingress, clock).ensure(1)
    assert info.value.code == code


@pytest.mark.parametrize("answer", [
    b'{"schema":"qinglong/worker-session-register@v1"}',
    b"not json",
])
def test_rejects_a_register_response_that_breaks_the_contract(store: RuntimeDirectory, clock: ManualClock,
                                                              answer: bytes) -> None:
    class Broken:
        def post_json(self, path: str, body: bytes, **_: Any) -> Response:
            return Response(answer)

    with pytest.raises(SessionError) as info:
        _keeper(store, Broken(), clock).ensure(1)
    assert info.value.code == "invalid_response"
    assert _stored(store) is None


def test_register_echo_mismatch_is_invalid(store: RuntimeDirectory, ingress: DirectIngress, clock: ManualClock) -> None:
    class OtherSession:
        def post_json(self, path: str, body: bytes, **kwargs: Any) -> Response:
            other = path.replace(path.split("/")[-2], "018f0000-0000-7000-8000-00000000beef")
            return ingress.post_json(other, body, **kwargs)

    with pytest.raises(SessionError) as info:
        _keeper(store, OtherSession(), clock).ensure(1)
    assert info.value.code == "invalid_response"


@pytest.mark.parametrize("change", ["corrupt", "other_worker", "other_capabilities"])
def test_an_unusable_record_is_replaced_by_a_registration(store: RuntimeDirectory, ingress: DirectIngress, clock: ManualClock,
                                                          change: str) -> None:
    _keeper(store, ingress, clock).ensure(1)
    if change == "corrupt":
        store.write(STATE_NAME, b'{"schemaVersion":1}\n')
        keeper = _keeper(store, ingress, clock)
    elif change == "other_worker":
        ingress.state.add_credential("edge-2.primary", "edge-2", ingress.secret)
        keeper = _keeper(store, ingress, clock, worker_id="edge-2")
        ingress.authorization = f"Worker ql3w_edge-2.primary_{ingress.secret}"
    else:
        keeper = _keeper(store, ingress, clock, capabilities=local_capabilities("x86_64"))
    outcome = keeper.ensure(1)
    assert (outcome.action, outcome.replaced) == ("registered", True)


def test_heartbeat_interval_is_bounded_by_half_the_lease(store: RuntimeDirectory, ingress: DirectIngress,
                                                         clock: ManualClock) -> None:
    keeper = _keeper(store, ingress, clock, lease_duration_ms=10_000, heartbeat_interval_ms=9_000)
    keeper.ensure(1)
    clock.now += 5_000
    assert keeper.ensure(1).action == "heartbeat"


@pytest.mark.parametrize(("machine", "architecture", "tier"), [
    ("x86_64", "amd64", "tier1"), ("aarch64", "arm64", "tier1"), ("armv7l", "arm/v7", "experimental"),
    ("i686", "386", "legacy-only"), ("ppc64le", "ppc64le", "candidate"),
])
def test_local_capabilities_map_the_platform(machine: str, architecture: str, tier: str) -> None:
    capabilities = local_capabilities(machine)
    assert (capabilities["architecture"], capabilities["supportTier"]) == (architecture, tier)
    assert capabilities["executors"] == ["remote-worker"]


@pytest.mark.parametrize("machine", ["mips", "mipsel", "ppc64", "riscv64", ""])
def test_rejects_platforms_the_cluster_cannot_place_work_on(machine: str) -> None:
    with pytest.raises(SessionError) as info:
        local_capabilities(machine)
    assert info.value.code == "unsupported_architecture"
    assert "mips has none" in info.value.message


# -- the record ----------------------------------------------------------------------------------

RECORD = (b'{"schemaVersion":1,"workerId":"edge-1","sessionId":"018f0000-0000-7000-8000-000000000001",'
          b'"generation":2,"version":5,"status":"online","leaseExpiresAtMs":1700000060000,"leaseDurationMs":60000,'
          b'"capabilitiesHash":"' + b"a" * 64 + b'","registeredAtMs":1700000000000,"heartbeatAtMs":1700000000000}\n')


def test_record_round_trips_byte_for_byte() -> None:
    assert parse_session_record(RECORD).to_bytes() == RECORD


@pytest.mark.parametrize(("mutation", "code"), [
    ({"extra": 1}, "key_set"),
    ({"schemaVersion": 2}, "schema"),
    ({"generation": 0}, "out_of_range"),
    ({"sessionId": "018f0000-0000-4000-8000-000000000001"}, "pattern"),
    ({"leaseDurationMs": 1000}, "out_of_range"),
])
def test_rejects_invalid_session_records(mutation: dict[str, Any], code: str) -> None:
    value = json.loads(RECORD)
    value.update(mutation)
    with pytest.raises(ContractError) as info:
        parse_session_record(json.dumps(value).encode())
    assert info.value.code == code


@given(st.binary(max_size=600))
def test_record_parser_is_total_over_bytes(data: bytes) -> None:
    try:
        parse_session_record(data)
    except ContractError:
        pass


@given(st.integers(min_value=0, max_value=len(RECORD) - 1), st.integers(min_value=0, max_value=255))
def test_record_parser_survives_single_byte_corruption(position: int, value: int) -> None:
    data = bytearray(RECORD)
    data[position] = value
    try:
        parse_session_record(bytes(data))
    except ContractError:
        pass


# -- the runtime session state and the legacy record ----------------------------------------------

def test_state_round_trips_byte_for_byte() -> None:
    record = parse_session_record(RECORD)
    for state in (SessionState(record, (5, 10), BOOT), SessionState(None, None, BOOT), SessionState(record, None, BOOT)):
        data = state.to_bytes()
        assert parse_session_state(data) == state and parse_session_state(data).to_bytes() == data


@pytest.mark.parametrize(("document", "code"), [
    ({"schemaVersion": 1, "session": None, "retryAfter": None}, "schema"),
    ({"schemaVersion": 2, "session": None}, "key_set"),
    ({"schemaVersion": 2, "session": None, "retryAfter": {"setAtMs": 10, "untilMs": 5}}, "out_of_range"),
    ({"schemaVersion": 2, "session": None, "retryAfter": [1, 2]}, "not_object"),
    ({"schemaVersion": 2, "session": {"schemaVersion": 1}, "retryAfter": None}, "key_set"),
])
def test_rejects_invalid_session_states(document: dict[str, Any], code: str) -> None:
    with pytest.raises(ContractError) as info:
        parse_session_state(json.dumps(document).encode())
    assert info.value.code == code


@given(st.binary(max_size=600))
def test_state_parser_is_total_over_bytes(data: bytes) -> None:
    try:
        parse_session_state(data)
    except ContractError:
        pass


def test_a_legacy_record_moves_from_the_journal_root_once(tmp_path: pathlib.Path, store: RuntimeDirectory) -> None:
    """Versions before the runtime directory kept session.json in the journal root: it
    is carried over (no new registration after an upgrade) and removed from flash."""
    with Journal.open(str(tmp_path / "worker")) as journal:
        (tmp_path / "worker" / "session.json").write_bytes(RECORD)
        (tmp_path / "worker" / "session.json").chmod(0o600)
        assert migrate_legacy_record(journal.take_legacy_session_record(), store)
        assert not (tmp_path / "worker" / "session.json").exists()
        assert journal.take_legacy_session_record() is None
    assert _stored(store) == SessionState(parse_session_record(RECORD), None)
    assert not migrate_legacy_record(RECORD, store)  # a session in the runtime directory wins
    assert not migrate_legacy_record(b"{}", store)


def test_record_from_a_state_is_a_session_record() -> None:
    state = parse_session_state(SessionState(parse_session_record(RECORD)).to_bytes())
    assert isinstance(state.record, SessionRecord) and state.record.version == 5


# -- configuration -------------------------------------------------------------------------------

def _config(**worker: Any) -> dict[str, Any]:
    return {"schema": "qinglong/edge-agent@v1", "stateDirectory": "/var/lib/q", "worker": {
        "origin": "https://cluster.example:7443", "workerId": "edge-1", "credentialFile": "/c",
        "certificateFile": "/p", "privateKeyFile": "/k", "trustAnchorFiles": ["/a"], **worker}}


def test_heartbeat_interval_defaults_to_ten_seconds() -> None:
    worker = parse_config(_config()).worker
    assert worker is not None and worker.heartbeat_interval_ms == 10_000


@pytest.mark.parametrize(("worker", "path"), [
    ({"heartbeatIntervalMs": 4999}, "$.worker.heartbeatIntervalMs"),
    ({"heartbeatIntervalMs": 300_001}, "$.worker.heartbeatIntervalMs"),
    ({"heartbeatIntervalMs": 30_000, "sessionLeaseDurationMs": 59_999}, "$.worker.heartbeatIntervalMs"),
])
def test_rejects_heartbeat_intervals_outside_the_rules(worker: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_config(**worker))
    assert info.value.path == path


# -- clocks (issue 23; spec README "Decisions for clocks") ----------------------------------------------

class Boot:
    """A boot clock that starts near 0, unrelated to the wall and cluster clocks."""

    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def _boot_keeper(store: RuntimeDirectory, ingress: DirectIngress, boot: Boot, wall: ManualClock,
                 **kwargs: Any) -> tuple[SessionKeeper, Any]:
    from qinglong_edge.worker.delivery.cluster_clock import ClusterClock

    cluster = ClusterClock(store, boot_ms=boot, wall_ms=wall, boot_id=BOOT)
    return _keeper(store, ingress, wall, clock_ms=boot, cluster=cluster, **kwargs), cluster


def test_the_session_runs_on_the_boot_clock_and_feeds_the_cluster_clock(store: RuntimeDirectory,
                                                                        ingress: DirectIngress, clock: ManualClock) -> None:
    boot, wall = Boot(), ManualClock()
    keeper, cluster = _boot_keeper(store, ingress, boot, wall)
    record = keeper.ensure(1).session
    assert record.heartbeat_at_ms == boot.now  # boot ms: the send instant
    assert cluster.sample is not None and cluster.sample.to_cluster(boot.now) == T0  # a register answer
    wall.now += 86_400_000  # the device's wall clock steps a day ahead: the session does not care
    assert keeper.ensure(1).action == "current"
    boot.now += HEARTBEAT_MS
    assert keeper.ensure(1).action == "heartbeat"
    assert _ops(ingress) == ["register", "heartbeat"]


def test_a_device_far_ahead_of_the_cluster_keeps_its_session(store: RuntimeDirectory, ingress: DirectIngress,
                                                             clock: ManualClock) -> None:
    """Before: the cluster's leaseExpiresAtMs was compared with the device's wall clock, so
    a device minutes ahead re-registered every cycle (fencing the leases of its jobs)."""
    boot = Boot()
    wall = ManualClock()
    wall.now = T0 + 240_000
    keeper, _ = _boot_keeper(store, ingress, boot, wall)
    keeper.ensure(1)
    for _ in range(5):
        boot.now += HEARTBEAT_MS
        assert keeper.ensure(1).action == "heartbeat"
    assert _ops(ingress).count("register") == 1


def test_the_session_lease_ends_at_the_earlier_of_send_plus_duration_and_the_translated_expiry(
        store: RuntimeDirectory, ingress: DirectIngress, clock: ManualClock) -> None:
    boot = Boot()
    keeper, _ = _boot_keeper(store, ingress, boot, clock)
    record = keeper.ensure(1).session
    assert keeper.lease_end_ms(record) == boot.now + LEASE_MS  # both terms agree (zero round trip)
    boot.now += LEASE_MS - LEASE_MARGIN_MS  # the session lease is over by the boot clock
    assert keeper.ensure(1).action == "registered"


def test_a_schema_version_2_file_is_mapped_onto_the_boot_clock(store: RuntimeDirectory, ingress: DirectIngress,
                                                               clock: ManualClock) -> None:
    """An upgrade with a session in RAM (wall-clock times, schemaVersion 2) never re-registers
    the session its jobs rely on: the times are mapped onto the boot clock once."""
    record = _keeper(store, ingress, clock).ensure(1).session  # registered (its lease from the double)
    legacy = {"schemaVersion": 2, "session": {**record.to_json(), "heartbeatAtMs": clock.now,
                                              "registeredAtMs": clock.now}, "retryAfter": None}
    store.write(STATE_NAME, json.dumps(legacy, separators=(",", ":")).encode() + b"\n")
    boot = Boot()
    keeper, _ = _boot_keeper(store, ingress, boot, clock)
    boot.now += 1000
    clock.now += 1000
    outcome = keeper.ensure(1)
    assert outcome.action == "current" and outcome.session.session_id == record.session_id
    assert json.loads(store.read(STATE_NAME) or b"{}")["schemaVersion"] == 3  # mapped once, rewritten
    boot.now += HEARTBEAT_MS
    assert keeper.ensure(1).action == "heartbeat"
    assert json.loads(store.read(STATE_NAME) or b"{}")["schemaVersion"] == 3
    assert _ops(ingress) == ["register", "heartbeat"]


def test_a_session_of_another_boot_is_registered_again(store: RuntimeDirectory, ingress: DirectIngress,
                                                       clock: ManualClock) -> None:
    """A fallback runtime directory on flash outlives a reboot: its boot-clock times are void."""
    _keeper(store, ingress, clock, boot_id="00000000-0000-4000-8000-000000000000").ensure(1)
    outcome = _keeper(store, ingress, clock).ensure(1)
    assert outcome.action == "registered" and outcome.session.generation == 2


@pytest.mark.parametrize("damage", ["missing", "empty", "garbage"])
def test_a_lost_session_record_with_records_in_flight_replays_their_session(
        store: RuntimeDirectory, ingress: DirectIngress, clock: ManualClock, damage: str) -> None:
    """Issue 23: never a blind new registration while records are in flight (it would fence
    their leases): the session of the newest record in flight is registered again, a
    replay the cluster answers with its row unchanged. The availableSlots the row holds is
    lost with the record: the values are tried, the free slots first."""
    first = _keeper(store, ingress, clock).ensure(available_slots=2)  # the row holds 2 free slots
    path = pathlib.Path(store.path) / STATE_NAME
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(b"" if damage == "empty" else b"\x00 garbage")
    clock.now += 1000
    ingress.calls.clear()
    in_flight = [("edge-1", first.session.session_id, first.session.generation), ("other", "x", 9)]
    outcome = _keeper(store, ingress, clock).ensure(available_slots=1, in_flight=1,
                                                    sessions_in_flight=in_flight)
    assert (outcome.action, outcome.detail, outcome.replaced) == ("registered", "recovered", False)
    assert outcome.session.session_id == first.session.session_id
    assert outcome.session.generation == first.session.generation
    assert _ops(ingress) == ["register", "register"]  # 1 refused (409: not the row's slots), then 2
    assert ingress.state.replaced_sessions == []  # nothing fenced
    assert ingress.state.sessions["edge-1"].session_id == first.session.session_id


def test_a_session_we_dropped_after_a_fence_is_not_replayed(store: RuntimeDirectory, ingress: DirectIngress,
                                                            clock: ManualClock) -> None:
    """A session record of ours that says "none" (dropped when the cluster fenced it) is
    not lost: the next registration is a new session, as before."""
    first = _keeper(store, ingress, clock).ensure(available_slots=1)
    store.write(STATE_NAME, SessionState(None).to_bytes())
    outcome = _keeper(store, ingress, clock).ensure(
        available_slots=1, in_flight=1,
        sessions_in_flight=[("edge-1", first.session.session_id, first.session.generation)])
    assert outcome.action == "registered" and outcome.session.session_id != first.session.session_id
