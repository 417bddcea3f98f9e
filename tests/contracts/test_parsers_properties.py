"""Property tests: every parser returns a value or raises ContractError, never anything else.

Inputs: random JSON values, random byte strings, and random mutations of golden vector A
(structural: replace / delete / insert at a random JSON path; and byte-level edits).
Accepted mutations must still satisfy the offer invariants.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong_edge.contracts.cancellation import (
    decode_local_api_body,
    parse_run_cancellation_request,
    parse_task_start_request,
)
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.execution_revision import normalize_execution_revision, revision_content_digest
from qinglong_edge.contracts.journal_records import normalize_inbox_record, parse_inbox_record, parse_pending_claim
from qinglong_edge.contracts.offer import (
    OfferedResponse,
    normalize_internal_offer,
    parse_offer_response,
)
from qinglong_edge.contracts.placement import effective_placement, normalize_capabilities
from qinglong_edge.contracts.session import parse_heartbeat_response
from qinglong_edge.contracts.strictjson import loads
from tests.contracts import vector_a as va

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["idle", "offered", "offer-1", "edge-1", va.SESSION_ID, "new_claim", "remote_worker",
                       "qinglong/remote-execution-offer@v1", va.CONTENT_DIGEST, "qlsecret:v1:e30"])
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)


def encode(value: Any) -> bytes:
    # ensure_ascii keeps lone surrogates encodable (as \udxxx escapes, which strict JSON rejects).
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def only_contract_errors(call: Callable[[], object]) -> object | None:
    try:
        return call()
    except ContractError as exc:
        assert exc.code and exc.path.startswith("$")
        assert va.LEASE_TOKEN not in str(exc)
        return None


def all_parsers(data: bytes) -> None:
    only_contract_errors(lambda: parse_offer_response(data, va.AUTHORITY))
    only_contract_errors(lambda: parse_pending_claim(data))
    only_contract_errors(lambda: parse_inbox_record(data, "offer-1"))
    only_contract_errors(lambda: parse_run_cancellation_request(decode_local_api_body(data)))
    only_contract_errors(lambda: parse_task_start_request(decode_local_api_body(data)))
    only_contract_errors(lambda: parse_heartbeat_response(data, worker_id=va.WORKER_ID, session_id=va.SESSION_ID,
                                                          generation=2, expected_version=1))


def all_value_validators(value: Any) -> None:
    only_contract_errors(lambda: normalize_execution_revision(value))
    only_contract_errors(lambda: normalize_execution_revision(value, verify_digest=False))
    only_contract_errors(lambda: normalize_internal_offer(value))
    only_contract_errors(lambda: normalize_inbox_record(value))
    only_contract_errors(lambda: effective_placement(value))
    only_contract_errors(lambda: normalize_capabilities(value))
    only_contract_errors(lambda: parse_run_cancellation_request(value))
    only_contract_errors(lambda: parse_task_start_request(value))


@given(json_values)
@SETTINGS
def test_random_json_values(value: Any) -> None:
    all_parsers(encode(value))
    all_value_validators(value)


@given(st.binary(max_size=600))
@SETTINGS
def test_random_bytes(data: bytes) -> None:
    all_parsers(data)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


OFFERED_PATHS = _paths(va.offered())


@st.composite
def structural_mutations(draw: st.DrawFn) -> bytes:
    doc = va.offered()
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths[1:]))
        parent: Any = doc
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "delete", "insert"]))
        last = path[-1]
        if action == "replace":
            parent[last] = draw(json_values)
        elif action == "delete":
            del parent[last]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=6))] = draw(json_values)
        else:
            parent.insert(last, draw(json_values))
    return encode(doc)


def check_offer_invariants(data: bytes) -> None:
    result = only_contract_errors(lambda: parse_offer_response(data, va.AUTHORITY))
    if isinstance(result, OfferedResponse):
        offer = result.offer
        assert offer["offerId"] == va.OFFER_ID
        assert offer["worker"] == {"workerId": va.WORKER_ID, "sessionId": va.SESSION_ID, "generation": 2}
        assert offer["lease"]["leaseTokenDigest"] == va.LEASE_TOKEN_DIGEST
        assert offer["executionDigest"] == revision_content_digest(offer["executionRevision"])
        assert normalize_internal_offer(json.loads(encode(offer))) == offer


@given(structural_mutations())
@SETTINGS
def test_structural_mutations_of_vector_a(data: bytes) -> None:
    check_offer_invariants(data)
    all_parsers(data)


@given(st.data())
@SETTINGS
def test_byte_mutations_of_vector_a(data: st.DataObject) -> None:
    body = bytearray(va.OFFERED)
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        position = data.draw(st.integers(min_value=0, max_value=len(body) - 1))
        action = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        if action == "flip":
            body[position] = data.draw(st.integers(min_value=0, max_value=255))
        elif action == "delete":
            del body[position]
        else:
            body[position:position] = data.draw(st.binary(min_size=1, max_size=4))
    check_offer_invariants(bytes(body))


@given(st.sampled_from(OFFERED_PATHS[1:]), json_values)
@SETTINGS
def test_mutating_any_single_value_keeps_the_contract(path: tuple[Any, ...], new: Any) -> None:
    doc = va.offered()
    parent: Any = doc
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = new
    check_offer_invariants(encode(doc))


@given(json_values)
@SETTINGS
def test_strict_json_round_trips_what_it_accepts(value: Any) -> None:
    data = encode(value)
    decoded = only_contract_errors(lambda: loads(data, max_bytes=1 << 20))
    if decoded is not None:
        assert encode(decoded) == data
