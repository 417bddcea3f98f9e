"""Worker Session bodies and response checks (offer-delivery.md 5.1)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.session import (
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
from tests.contracts import vector_a as va

CAPS = {"architecture": "arm64", "executors": ["remote-worker"], "protocolVersion": "1.0.0", "supportTier": "tier1"}
CAPS_JSON = '{"architecture":"arm64","executors":["remote-worker"],"protocolVersion":"1.0.0","supportTier":"tier1"}'
CAPS_HASH = "b3d79017d91c477ffdf4a4dcc4ce9135ca053c921922ce0221920f905d8a2aa4"


def response(schema: str, /, **changes: Any) -> bytes:
    value: dict[str, Any] = {"schema": schema, "workerId": va.WORKER_ID, "sessionId": va.SESSION_ID,
                             "generation": 2, "version": 6, "status": "online", "leaseExpiresAtMs": 50_000}
    if schema.endswith("register@v1"):
        value["replacedSession"] = False
    for key, new in changes.items():
        if new is DROP:
            value.pop(key)
        else:
            value[key] = new
    return va.compact(value)


DROP = object()
REGISTER = "qinglong/worker-session-register@v1"
HEARTBEAT = "qinglong/worker-session-heartbeat@v1"
TRANSITION = "qinglong/worker-session-transition@v1"


def test_capabilities_snapshot_is_the_ingress_vector() -> None:
    assert capabilities_snapshot(CAPS) == (CAPS_JSON, CAPS_HASH)


def test_register_body() -> None:
    body = register_request_body(capabilities_json=CAPS_JSON, capabilities_hash=CAPS_HASH, max_concurrent_runs=2,
                                 available_slots=2)
    assert list(json.loads(body)) == ["schema", "capabilitiesJson", "capabilitiesHash", "maxConcurrentRuns",
                                      "availableSlots", "leaseDurationMs"]
    assert json.loads(body)["leaseDurationMs"] == 45_000
    assert b" " not in body.replace(b"remote-worker", b"")


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"capabilities_json": CAPS_JSON.replace(",", ", ")}, "capabilities"),
        ({"capabilities_json": '{"executors":["remote-worker"],' + CAPS_JSON[1:].replace(
            ',"executors":["remote-worker"]', "")}, "capabilities"),
        ({"capabilities_hash": "0" * 64}, "capabilities"),
        ({"capabilities_hash": CAPS_HASH.upper()}, "pattern"),
        ({"capabilities_json": "[]"}, "not_object"),
        ({"capabilities_json": "{]"}, "capabilities"),
        ({"capabilities_json": "{"}, "length"),
        ({"max_concurrent_runs": 0}, "out_of_range"),
        ({"max_concurrent_runs": 1025}, "out_of_range"),
        ({"available_slots": 3}, "out_of_range"),
        ({"available_slots": -1}, "out_of_range"),
        ({"lease_duration_ms": 4_999}, "out_of_range"),
        ({"lease_duration_ms": 600_001}, "out_of_range"),
    ],
)
def test_rejects_an_invalid_register_request(kwargs: dict[str, Any], code: str) -> None:
    args: dict[str, Any] = {"capabilities_json": CAPS_JSON, "capabilities_hash": CAPS_HASH,
                            "max_concurrent_runs": 2, "available_slots": 2}
    args.update(kwargs)
    with pytest.raises(ContractError) as info:
        register_request_body(**args)
    assert info.value.code == code


def test_heartbeat_and_transition_bodies() -> None:
    assert heartbeat_request_body(generation=2, expected_version=5, available_slots=1) == (
        b'{"schema":"qinglong/worker-session-heartbeat@v1","generation":2,"expectedVersion":5,'
        b'"availableSlots":1,"leaseDurationMs":45000}')
    assert transition_request_body(generation=2, expected_version=5, status="draining") == (
        b'{"schema":"qinglong/worker-session-transition@v1","generation":2,"expectedVersion":5,"status":"draining"}')
    with pytest.raises(ContractError):
        transition_request_body(generation=2, expected_version=5, status="online")
    with pytest.raises(ContractError):
        heartbeat_request_body(generation=0, expected_version=5, available_slots=1)
    with pytest.raises(ContractError):
        heartbeat_request_body(generation=1, expected_version=-1, available_slots=1)


def test_session_path() -> None:
    assert session_path(va.WORKER_ID, va.SESSION_ID, "heartbeat") == (
        "/api/v3/worker-ingress/workers/edge-1/sessions/018f0000-0000-7000-8000-000000000001/heartbeat")
    with pytest.raises(ContractError):
        session_path(va.WORKER_ID, va.SESSION_ID, "offers")


def test_register_response_is_validated() -> None:
    projection = parse_register_response(response(REGISTER, generation=7, replacedSession=True),
                                         worker_id=va.WORKER_ID, session_id=va.SESSION_ID)
    assert projection == SessionProjection(va.WORKER_ID, va.SESSION_ID, 7, 6, "online", 50_000, True)


@pytest.mark.parametrize(
    ("changes", "code", "path"),
    [
        ({"workerId": "edge-2"}, "echo_mismatch", "$.workerId"),
        ({"sessionId": "018f0000-0000-7000-8000-000000000002"}, "echo_mismatch", "$.sessionId"),
        ({"status": "draining"}, "session_status", "$.status"),
        ({"status": "busy"}, "session_status", "$.status"),
        ({"replacedSession": DROP}, "key_set", "$.replacedSession"),
        ({"replacedSession": 0}, "not_boolean", "$.replacedSession"),
        ({"schema": HEARTBEAT}, "schema", "$.schema"),
        ({"generation": 0}, "out_of_range", "$.generation"),
        ({"leaseExpiresAtMs": 1.5}, "not_integer", "$.leaseExpiresAtMs"),
        ({"extra": None}, "key_set", "$.extra"),
    ],
)
def test_rejects_an_invalid_register_response(changes: dict[str, Any], code: str, path: str) -> None:
    with pytest.raises(ContractError) as info:
        parse_register_response(response(REGISTER, **changes), worker_id=va.WORKER_ID, session_id=va.SESSION_ID)
    assert (info.value.code, info.value.path) == (code, path)


def test_rejects_an_oversize_or_tiny_session_response() -> None:
    with pytest.raises(ContractError) as info:
        parse_register_response(b"{" + b" " * 4096 + b"}", worker_id=va.WORKER_ID, session_id=va.SESSION_ID)
    assert info.value.code == "too_large"
    with pytest.raises(ContractError) as info:
        parse_register_response(b"{", worker_id=va.WORKER_ID, session_id=va.SESSION_ID)
    assert info.value.code == "too_small"


def heartbeat(body: bytes) -> SessionProjection:
    return parse_heartbeat_response(body, worker_id=va.WORKER_ID, session_id=va.SESSION_ID, generation=2,
                                    expected_version=5)


def test_heartbeat_response_is_validated() -> None:
    assert heartbeat(response(HEARTBEAT)).version == 6
    assert heartbeat(response(HEARTBEAT, status="draining")).status == "draining"


@pytest.mark.parametrize(
    ("changes", "code", "path"),
    [
        ({"version": 5}, "version_mismatch", "$.version"),
        ({"version": 7}, "version_mismatch", "$.version"),
        ({"generation": 3}, "echo_mismatch", "$.generation"),
        ({"status": "offline"}, "session_status", "$.status"),
        ({"replacedSession": True}, "key_set", "$.replacedSession"),
    ],
)
def test_rejects_an_invalid_heartbeat_response(changes: dict[str, Any], code: str, path: str) -> None:
    with pytest.raises(ContractError) as info:
        heartbeat(response(HEARTBEAT, **changes))
    assert (info.value.code, info.value.path) == (code, path)


def test_transition_response_must_carry_the_requested_status() -> None:
    kwargs: dict[str, Any] = {"worker_id": va.WORKER_ID, "session_id": va.SESSION_ID, "generation": 2,
                              "expected_version": 5, "status": "offline"}
    assert parse_transition_response(response(TRANSITION, status="offline"), **kwargs).status == "offline"
    with pytest.raises(ContractError) as info:
        parse_transition_response(response(TRANSITION, status="draining"), **kwargs)
    assert info.value.code == "session_status"


@pytest.mark.parametrize(
    ("machine", "architecture"),
    [("x86_64", "amd64"), ("AMD64", "amd64"), ("aarch64", "arm64"), ("arm64", "arm64"), ("armv7l", "arm/v7"),
     ("armv6l", "arm/v6"), ("i386", "386"), ("i686", "386"), ("ppc64le", "ppc64le"), ("s390x", "s390x"),
     ("mips", None), ("ppc64", None), ("riscv64", None), ("", None)],
)
def test_architecture_for_machine(machine: str, architecture: str | None) -> None:
    assert architecture_for_machine(machine) == architecture
    if architecture is not None:
        assert support_tier_for(architecture) is not None


@pytest.mark.parametrize(
    ("machine", "architecture"),
    [("aarch64", "arm/v7"), ("arm64", "arm/v7"), ("armv8l", "arm/v7"), ("armv7l", "arm/v7"), ("armv6l", "arm/v6"),
     ("x86_64", "386"), ("i686", "386"), ("ppc64le", None), ("s390x", None), ("mips", None)],
)
def test_a_32_bit_user_space_on_a_64_bit_kernel_is_its_32_bit_architecture(machine: str,
                                                                          architecture: str | None) -> None:
    """Review (issue 18 item 4): ``uname -m`` names the kernel's machine. Raspberry Pi OS
    32-bit on a Pi 4/5 boots a 64-bit kernel by default, so it says ``aarch64`` while
    every program, the agent's Python and a job's, is 32-bit ARM: announcing arm64/tier1
    would bring offers built for a user space the device does not have (the reference's
    Node worker takes ``process.arch``, the program's own: ``arm``)."""
    assert architecture_for_machine(machine, pointer_bits=32) == architecture
    assert architecture_for_machine(machine, pointer_bits=64) == architecture_for_machine(machine)
