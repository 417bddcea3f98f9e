"""What the seven calls share: the path, the fence, CallError and its guard (section 3)."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.ingress import (
    CALL_ERROR_CODES,
    WORKER_CALL_OPERATIONS,
    CallError,
    fence_of,
    guard,
    safe_path,
    worker_call_path,
)
from qinglong_edge.contracts.offer import offers_path
from tests.contracts import vector_rx as vr


@pytest.mark.parametrize("operation", WORKER_CALL_OPERATIONS)
def test_every_call_path(operation: str) -> None:
    path = worker_call_path("edge-1", vr.SESSION, operation)
    assert path == f"/api/v3/worker-ingress/workers/edge-1/sessions/{vr.SESSION}/{operation}"
    assert path.rsplit("/", 1)[0] == offers_path("edge-1", vr.SESSION).rsplit("/", 1)[0]


@pytest.mark.parametrize(
    ("worker", "session", "operation", "path"),
    [
        ("edge/1", vr.SESSION, "starting", "$.workerId"),
        ("edge-1", vr.SESSION.upper(), "starting", "$.sessionId"),
        ("edge-1", vr.SESSION, "offers", "$.operation"),
        ("edge-1", vr.SESSION, "../secrets", "$.operation"),
    ],
)
def test_path_inputs_are_checked(worker: str, session: str, operation: str, path: str) -> None:
    with pytest.raises(ContractError) as info:
        worker_call_path(worker, session, operation)
    assert info.value.path == path


def test_the_error_codes_name_each_call_and_side() -> None:
    assert set(CALL_ERROR_CODES) == {
        "activation_request_invalid", "activation_response_invalid", "secrets_request_invalid",
        "secrets_response_invalid", "lease_control_request_invalid", "lease_control_response_invalid",
        "artifact_request_invalid", "artifact_response_invalid", "completion_request_invalid",
        "completion_response_invalid"}


def test_a_call_error_is_a_contract_error_with_a_reason() -> None:
    error = CallError("lease_control_response_invalid", "$.leaseVersion", "must be expectedLeaseVersion + 1",
                      reason="version_mismatch")
    assert isinstance(error, ContractError) and isinstance(error, ValueError)
    assert (error.code, error.path, error.reason, error.exit_status) == (
        "lease_control_response_invalid", "$.leaseVersion", "version_mismatch", 65)
    assert str(error) == ("lease_control_response_invalid: $.leaseVersion: version_mismatch: "
                          "must be expectedLeaseVersion + 1")
    for clone in (copy.copy(error), pickle.loads(pickle.dumps(error))):  # noqa: S301 (our own object)
        assert (clone.code, clone.path, clone.reason) == (error.code, error.path, error.reason)


def test_the_guard_wraps_contract_errors_and_bugs() -> None:
    with pytest.raises(CallError) as info, guard("completion_response_invalid"):
        raise ContractError("pattern", "$.sha256", "bad")
    assert (info.value.code, info.value.reason, info.value.path) == ("completion_response_invalid", "pattern",
                                                                     "$.sha256")
    for bug in (KeyError("x"), TypeError(), IndexError(), AttributeError(), RecursionError()):
        with pytest.raises(CallError) as info, guard("activation_response_invalid"):
            raise bug
        assert (info.value.reason, info.value.path) == ("malformed", "$")
    with pytest.raises(CallError) as info, guard("secrets_response_invalid"):
        raise CallError("activation_response_invalid", "$", reason="status")
    assert info.value.code == "activation_response_invalid"  # an inner call error passes unchanged
    with pytest.raises(OSError), guard("activation_response_invalid"):
        raise OSError("not a contract failure")


def test_safe_path_keeps_only_known_keys_and_indexes() -> None:
    known = frozenset({"values", "value"})
    assert safe_path("$.values[3].value", known) == "$.values[3].value"
    assert safe_path("$.values[3].s3cr3t", known) == "$.values[3]"
    assert safe_path('$.values["a b"]', known) == "$.values"
    assert safe_path("$.other.values", known) == "$"
    assert safe_path("nonsense", known) == "$"


def test_the_fence_comes_from_the_offer_and_hides_the_token() -> None:
    fence = fence_of(vr.offer())
    assert (fence.worker_id, fence.session_id, fence.worker_generation, fence.project_id, fence.run_id,
            fence.attempt_id, fence.offer_id, fence.lease_generation, fence.expected_lease_version) == (
        "edge-1", vr.SESSION, 2, "project-1", "run-1", "attempt-1", "offer-1", 1, 3)
    assert fence.lease_token == vr.SECRET_TEXTS[0]
    assert vr.SECRET_TEXTS[0] not in repr(fence)
    assert fence_of(vr.offer(), expected_lease_version=4).expected_lease_version == 4
    assert fence.check(short_ids=True) is fence


@pytest.mark.parametrize("missing", ["worker", "candidate", "lease", "offerId", "leaseToken"])
def test_a_missing_offer_part_is_named(missing: str) -> None:
    offer = vr.offer()
    del offer[missing]
    with pytest.raises(ContractError) as info:
        fence_of(offer)
    assert (info.value.code, info.value.path) == ("key_set", f"$.offer.{missing}")


# --- every offer-taking contract on a damaged offer --------------------------------------------------------------

def _paths(value: Any, prefix: tuple[Any, ...] = (), depth: int = 3) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if depth and isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key), depth - 1)
    elif depth and isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index), depth - 1)
    return out


OFFER_PATHS = _paths(vr.api_key_offer())
junk = st.none() | st.booleans() | st.integers(-(2**54), 2**54) | st.text(max_size=8) | st.just([]) | st.just({})


def _damage(path: tuple[Any, ...], value: Any, delete: bool) -> dict[str, Any]:
    offer = vr.api_key_offer()
    target: Any = offer
    for part in path[:-1]:
        target = target[part]
    if delete and isinstance(target, dict):
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return offer


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(OFFER_PATHS), junk, st.booleans())
def test_a_damaged_offer_gives_only_the_named_error(path: tuple[Any, ...], value: Any, delete: bool) -> None:
    from qinglong_edge.contracts import activation, completion, launch, lease_control, secret_delivery

    offer = _damage(path, value, delete)
    only = vr.only_call_errors
    only(lambda: activation.starting_request_body(offer), "activation_request_invalid")
    only(lambda: activation.running_request_body(offer, executor_handle="h", log_artifact_id=None,
                                                 callback_sequence=1, callback_token_digest=vr.TOKEN_DIGEST),
         "activation_request_invalid")
    only(lambda: activation.parse_activation_response(vr.STARTING_APPLIED, offer, operation="starting"),
         "activation_response_invalid")
    only(lambda: secret_delivery.secrets_request(offer), "secrets_request_invalid")
    only(lambda: lease_control.lease_control_request_body(offer), "lease_control_request_invalid")
    only(lambda: lease_control.parse_lease_control_response(vr.RENEWED, offer), "lease_control_response_invalid")
    only(lambda: completion.artifact_upload_preamble(offer, log_artifact_id=vr.LOG_ID, byte_length=6,
                                                     truncated=None), "artifact_request_invalid")
    only(lambda: completion.parse_artifact_response(vr.ARTIFACT_ANSWER, offer, log_artifact_id=vr.LOG_ID,
                                                    byte_length=6, truncated=False, sha256=vr.LOG_SHA256),
         "artifact_response_invalid")
    only(lambda: completion.completion_request_body(
        offer, callback_sequence=1, callback_token_digest=vr.TOKEN_DIGEST, started_at_ms=1, finished_at_ms=2,
        exit_code=0, log_artifact_id=vr.LOG_ID, byte_length=6, sha256=vr.LOG_SHA256, truncated=None),
        "completion_request_invalid")
    only(lambda: completion.parse_completion_response(vr.COMPLETION_APPLIED, offer, callback_sequence=1),
         "completion_response_invalid")
    only(lambda: launch.launch_plan(offer), "launch_invalid")
    only(lambda: launch.materialize_environment(offer, None), "environment_invalid")
