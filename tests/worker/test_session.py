"""SessionKeeper (offer-delivery.md 5.1): register, heartbeat cadence, fencing, expiry, the
durable session.json in the real journal; the double's state machine answers in-process.
Also the session record parser and the heartbeatIntervalMs configuration rule."""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qinglong_edge.config import parse_config
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.errors import ConfigError, SessionError, TransportError
from qinglong_edge.worker.journal import Journal
from qinglong_edge.worker.session import (
    LEASE_MARGIN_MS,
    SessionKeeper,
    local_capabilities,
    parse_session_record,
)
from tests.support.cluster_state import ClusterState
from tests.support.direct_ingress import DirectIngress, Response

T0 = 1_700_000_000_000
LEASE_MS = 60_000
HEARTBEAT_MS = 10_000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ingress(clock: Clock) -> DirectIngress:
    return DirectIngress(ClusterState(os.urandom(32), clock_ms=clock))


@pytest.fixture
def journal(tmp_path: pathlib.Path) -> Iterator[Journal]:
    opened = Journal.open(str(tmp_path / "worker"))
    yield opened
    opened.close()


def _keeper(journal: Journal, ingress: Any, clock: Clock, **kwargs: Any) -> SessionKeeper:
    options: dict[str, Any] = {
        "worker_id": "edge-1", "max_concurrent_runs": 2, "lease_duration_ms": LEASE_MS,
        "heartbeat_interval_ms": HEARTBEAT_MS, "clock_ms": clock, "capabilities": local_capabilities("aarch64"),
    }
    options.update(kwargs)
    return SessionKeeper(journal, ingress, **options)


def _ops(ingress: DirectIngress) -> list[str]:
    return [path.rsplit("/", 1)[1] for path, _ in ingress.calls]


def test_first_ensure_registers_and_persists_the_session(journal: Journal, ingress: DirectIngress,
                                                         clock: Clock) -> None:
    outcome = _keeper(journal, ingress, clock).ensure(available_slots=5)
    assert (outcome.action, outcome.replaced) == ("registered", False)
    record = outcome.session
    assert (record.generation, record.version, record.status) == (1, 0, "online")
    assert record.lease_expires_at_ms == T0 + LEASE_MS
    assert int(record.session_id[:8] + record.session_id[9:13], 16) == T0  # UUIDv7 carries the time
    body = json.loads(ingress.calls[0][1])
    assert json.loads(body["capabilitiesJson"]) == {"architecture": "arm64", "executors": ["remote-worker"],
                                                    "protocolVersion": "1.0.0", "supportTier": "tier1"}
    assert (body["maxConcurrentRuns"], body["availableSlots"], body["leaseDurationMs"]) == (2, 2, LEASE_MS)
    stored = journal.read_session_record()
    assert stored is not None and parse_session_record(stored) == record


def test_within_the_interval_the_session_is_current_without_network_io(journal: Journal, ingress: DirectIngress,
                                                                       clock: Clock) -> None:
    keeper = _keeper(journal, ingress, clock)
    keeper.ensure(1)
    clock.now += HEARTBEAT_MS - 1
    assert keeper.ensure(1).action == "current"
    assert _ops(ingress) == ["register"]


def test_heartbeat_after_the_interval_increments_the_version(journal: Journal, ingress: DirectIngress,
                                                             clock: Clock) -> None:
    keeper = _keeper(journal, ingress, clock)
    first = keeper.ensure(1).session
    clock.now += HEARTBEAT_MS
    beat = _keeper(journal, ingress, clock).ensure(0)  # a new process: state comes from session.json
    assert (beat.action, beat.session.version, beat.session.session_id) == ("heartbeat", 1, first.session_id)
    assert beat.session.heartbeat_at_ms == clock.now and beat.session.registered_at_ms == T0
    assert json.loads(ingress.calls[-1][1]) == {"schema": "qinglong/worker-session-heartbeat@v1", "generation": 1,
                                                "expectedVersion": 0, "availableSlots": 0,
                                                "leaseDurationMs": LEASE_MS}
    assert ingress.state.sessions["edge-1"].version == 1


def test_a_clock_that_stepped_back_heartbeats_rather_than_trusting_the_record(
    journal: Journal, ingress: DirectIngress, clock: Clock
) -> None:
    keeper = _keeper(journal, ingress, clock)
    keeper.ensure(1)
    clock.now -= 1
    assert keeper.ensure(1).action == "heartbeat"


def test_fenced_heartbeat_registers_a_new_session(journal: Journal, ingress: DirectIngress, clock: Clock) -> None:
    keeper = _keeper(journal, ingress, clock)
    old = keeper.ensure(1).session
    ingress.state.expire_session("edge-1")
    clock.now += HEARTBEAT_MS
    outcome = keeper.ensure(1)
    assert (outcome.action, outcome.replaced, outcome.detail) == ("registered", True, "session_fenced")
    assert outcome.session.generation == old.generation + 1
    assert outcome.session.session_id != old.session_id
    assert _ops(ingress) == ["register", "heartbeat", "register"]


def test_lease_over_by_our_clock_registers_without_a_heartbeat(journal: Journal, ingress: DirectIngress,
                                                               clock: Clock) -> None:
    keeper = _keeper(journal, ingress, clock)
    keeper.ensure(1)
    clock.now = T0 + LEASE_MS - LEASE_MARGIN_MS
    outcome = keeper.ensure(1)
    assert (outcome.action, outcome.replaced, outcome.session.generation) == ("registered", True, 2)
    assert _ops(ingress) == ["register", "register"]


def test_transient_heartbeat_failure_keeps_the_running_session(journal: Journal, ingress: DirectIngress,
                                                               clock: Clock) -> None:
    keeper = _keeper(journal, ingress, clock)
    old = keeper.ensure(1).session
    clock.now += HEARTBEAT_MS
    ingress.script.append(TransportError("timed out", code="request_rejected"))
    outcome = keeper.ensure(1)
    assert (outcome.action, outcome.detail, outcome.session) == ("stale", "session_unavailable", old)


def test_retry_after_on_a_heartbeat_is_honoured(journal: Journal, ingress: DirectIngress, clock: Clock) -> None:
    # spec README: 429/503 with Retry-After never retry sooner than it says (a `pull
    # --duration` loop cycles every 2 s; field-lessons 7: no 429 loops).
    keeper = _keeper(journal, ingress, clock)
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


def test_retry_after_on_a_registration_is_honoured(journal: Journal, ingress: DirectIngress, clock: Clock) -> None:
    keeper = _keeper(journal, ingress, clock)
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


@pytest.mark.parametrize("case", [
    ("register", 401, "credential_rejected"),
    ("register", 403, "credential_rejected"),
    ("register", 503, "session_unavailable"),
    ("heartbeat", 401, "credential_rejected"),
], ids=lambda case: f"{case[0]}-{case[1]}")
def test_rejects_session_calls_with_the_mapped_code(journal: Journal, ingress: DirectIngress, clock: Clock,
                                                    case: tuple[str, int, str]) -> None:
    operation, status, code = case
    keeper = _keeper(journal, ingress, clock)
    if operation == "heartbeat":
        keeper.ensure(1)
        clock.now += HEARTBEAT_MS
    ingress.script.append(TransportError("no", code="response_rejected", http_status=status))
    with pytest.raises(SessionError) as info:
        keeper.ensure(1)
    assert info.value.code == code
    assert ingress.secret not in str(info.value)


@pytest.mark.parametrize("code", ["credentials_unavailable", "invalid_configuration"])
def test_credential_file_problems_are_configuration_errors(journal: Journal, ingress: DirectIngress,
                                                           clock: Clock, code: str) -> None:
    ingress.script.append(TransportError("credential file has group bits", code=code))
    with pytest.raises(SessionError) as info:
        _keeper(journal, ingress, clock).ensure(1)
    assert info.value.code == code


@pytest.mark.parametrize("answer", [
    b'{"schema":"qinglong/worker-session-register@v1"}',
    b"not json",
])
def test_rejects_a_register_response_that_breaks_the_contract(journal: Journal, clock: Clock,
                                                              answer: bytes) -> None:
    class Broken:
        def post_json(self, path: str, body: bytes, **_: Any) -> Response:
            return Response(answer)

    with pytest.raises(SessionError) as info:
        _keeper(journal, Broken(), clock).ensure(1)
    assert info.value.code == "invalid_response"
    assert journal.read_session_record() is None


def test_register_echo_mismatch_is_invalid(journal: Journal, ingress: DirectIngress, clock: Clock) -> None:
    class OtherSession:
        def post_json(self, path: str, body: bytes, **kwargs: Any) -> Response:
            other = path.replace(path.split("/")[-2], "018f0000-0000-7000-8000-00000000beef")
            return ingress.post_json(other, body, **kwargs)

    with pytest.raises(SessionError) as info:
        _keeper(journal, OtherSession(), clock).ensure(1)
    assert info.value.code == "invalid_response"


@pytest.mark.parametrize("change", ["corrupt", "other_worker", "other_capabilities"])
def test_an_unusable_record_is_replaced_by_a_registration(journal: Journal, ingress: DirectIngress, clock: Clock,
                                                          change: str) -> None:
    _keeper(journal, ingress, clock).ensure(1)
    if change == "corrupt":
        journal.write_session_record(b'{"schemaVersion":1}\n')
        keeper = _keeper(journal, ingress, clock)
    elif change == "other_worker":
        ingress.state.add_credential("edge-2.primary", "edge-2", ingress.secret)
        keeper = _keeper(journal, ingress, clock, worker_id="edge-2")
        ingress.authorization = f"Worker ql3w_edge-2.primary_{ingress.secret}"
    else:
        keeper = _keeper(journal, ingress, clock, capabilities=local_capabilities("x86_64"))
    outcome = keeper.ensure(1)
    assert (outcome.action, outcome.replaced) == ("registered", True)


def test_heartbeat_interval_is_bounded_by_half_the_lease(journal: Journal, ingress: DirectIngress,
                                                         clock: Clock) -> None:
    keeper = _keeper(journal, ingress, clock, lease_duration_ms=10_000, heartbeat_interval_ms=9_000)
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
    assert info.value.code == "unsupported_platform"


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
