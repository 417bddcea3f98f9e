"""Secrets @v2 (remote-execution.md 3.4 and 6 with its corrections): the request built from
the offer, the answer's order and limits, the echo, and that no value leaks."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong_edge.contracts.ingress import CallError, worker_call_path
from qinglong_edge.contracts.secret_delivery import (
    MAX_SECRET_REFS,
    SECRETS_RESPONSE_MAX_BYTES,
    SecretsRequest,
    parse_secrets_request,
    parse_secrets_response,
    secret_refs_of,
    secrets_request,
)
from tests.contracts import vector_rx as vr

CODE = "secrets_response_invalid"


def request(offer: dict[str, Any] | None = None) -> SecretsRequest:
    built = secrets_request(vr.api_key_offer() if offer is None else offer)
    assert built is not None
    return built


def answer(**changes: Any) -> bytes:
    doc = vr.decoded(vr.SECRETS_ANSWER)
    doc.update(changes)
    return vr.body(doc)


def rejects(data: bytes | bytearray, reason: str, path: str | None = None,
            req: SecretsRequest | None = None) -> CallError:
    with pytest.raises(CallError) as info:
        parse_secrets_response(data, request() if req is None else req)
    assert (info.value.code, info.value.reason) == (CODE, reason), (info.value.reason, info.value.path)
    if path is not None:
        assert info.value.path == path
    assert "s3cr3t" not in str(info.value) and "s3cr3t" not in repr(info.value)
    return info.value


def bindings(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"name": name, "kind": "secret", "secretRef": ref} for name, ref in pairs]


# --- golden vector ----------------------------------------------------------------------------------------


def test_the_request_is_the_corrected_section_6_body() -> None:
    built = request()
    assert built.body == vr.SECRETS
    assert len(built.body) == 571
    assert built.secret_refs == (vr.API_KEY_REF,)
    assert built.bundle_refs == ()
    assert built.execution_digest == vr.DIGEST_WITH_API_KEY
    assert list(json.loads(built.body))[:2] == ["schema", "workerGeneration"]
    assert vr.SECRET_TEXTS[0] not in repr(built)
    assert worker_call_path("edge-1", vr.SESSION, "secrets") == vr.PATH_PREFIX + "secrets"


def test_the_secret_ref_encoding_is_section_6() -> None:
    assert vr.secret("API_KEY") == vr.API_KEY_REF


def test_the_sample_answer_is_accepted_with_the_corrected_digest() -> None:
    values = parse_secrets_response(vr.SECRETS_ANSWER, request())
    assert bytes(values.value_for(vr.API_KEY_REF)) == b"s3cr3t"
    assert "s3cr3t" not in repr(values) and "s3cr3t" not in str(values)
    # As printed, the answer echoes the digest of the revision without the binding.
    rejects(vr.SECRETS_ANSWER_PRINTED, "echo_mismatch", "$.executionDigest")


def test_the_printed_answer_matches_a_request_with_the_old_digest() -> None:
    old = request()
    stale = SecretsRequest(old.body, old.secret_refs, old.bundle_refs, old.run_id, old.attempt_id, old.offer_id,
                           vr.decoded(vr.SECRETS_ANSWER_PRINTED)["executionDigest"])
    assert bytes(parse_secrets_response(vr.SECRETS_ANSWER_PRINTED, stale).value_for(vr.API_KEY_REF)) == b"s3cr3t"


def test_server_side_view_round_trips() -> None:
    assert parse_secrets_request(vr.SECRETS) == vr.decoded(vr.SECRETS)


def test_a_bytearray_body_and_the_values_are_wiped() -> None:
    data = bytearray(vr.SECRETS_ANSWER)
    values = parse_secrets_response(data, request())
    assert data == bytearray(len(data))
    held = values.value_for(vr.API_KEY_REF)
    values.wipe()
    assert held == bytearray(6)
    with pytest.raises(KeyError):
        values.value_for(vr.API_KEY_REF)
    bad = bytearray(answer(runId="run-2"))
    rejects(bad, "echo_mismatch")
    assert bad == bytearray(len(bad))


# --- the request from the offer ---------------------------------------------------------------------------------


def test_no_refs_skips_the_call() -> None:
    assert secrets_request(vr.offer()) is None
    public = vr.offer_with_revision(environment=[{"name": "A", "kind": "public", "value": "1"}])
    assert secrets_request(public) is None


def test_refs_are_unique_in_binding_order() -> None:
    a, b = vr.secret("A"), vr.secret("B")
    offer = vr.offer_with_revision(environment=bindings(("Z_FIRST", b), ("A_SECOND", a), ("M_THIRD", b)))
    order = [binding["name"] for binding in offer["executionRevision"]["environment"]]
    assert order == ["A_SECOND", "M_THIRD", "Z_FIRST"]  # normalized (ICU) revision order
    assert request(offer).secret_refs == (a, b)
    assert secret_refs_of(offer["executionRevision"]) == ((a, b), ())


def test_a_bundle_ref_goes_to_its_own_list() -> None:
    bundle = vr.secret("BUNDLE", version=1)
    offer = vr.offer_with_revision(environmentBundleRef=bundle)
    built = request(offer)
    assert (built.secret_refs, built.bundle_refs) == ((), (bundle,))
    assert json.loads(built.body)["environmentBundleRefs"] == [bundle]


def test_at_most_64_refs() -> None:
    refs = [vr.secret(f"S{index}") for index in range(MAX_SECRET_REFS + 1)]
    ok = vr.offer_with_revision(environment=bindings(*((f"V{i}", ref) for i, ref in enumerate(refs[:64]))))
    assert len(request(ok).secret_refs) == 64
    too_many = vr.offer_with_revision(environment=bindings(*((f"V{i}", ref) for i, ref in enumerate(refs))))
    with pytest.raises(CallError) as info:
        secrets_request(too_many)
    assert (info.value.code, info.value.reason, info.value.path) == ("secrets_request_invalid", "length",
                                                                     "$.secretRefs")


def server_body(**changes: Any) -> bytes:
    doc = vr.decoded(vr.SECRETS)
    doc.update(changes)
    return vr.body(doc)


@pytest.mark.parametrize(
    ("changes", "reason", "path"),
    [
        ({"secretRefs": [], "environmentBundleRefs": []}, "no_refs", "$.secretRefs"),
        ({"environmentBundleRefs": [vr.API_KEY_REF]}, "overlapping_refs", "$.environmentBundleRefs"),
        ({"secretRefs": [vr.API_KEY_REF, vr.API_KEY_REF]}, "duplicate_ref", "$.secretRefs[1]"),
        ({"secretRefs": ["qlsecret:v1:!!"]}, "secret_ref", "$.secretRefs[0]"),
        ({"secretRefs": [vr.secret("A", project="project-2")]}, "secret_ref_project", "$.secretRefs[0]"),
        ({"environmentBundleRefs": [vr.secret("B"), vr.secret("C")]}, "length", "$.environmentBundleRefs"),
        ({"runId": "r" * 129}, "length", "$.runId"),
        ({"taskId": "t" * 129}, "length", "$.taskId"),
        ({"taskRevision": ""}, "length", "$.taskRevision"),
        ({"projectId": "p\x01"}, "control_character", "$.projectId"),
        ({"executionDigest": "A" * 64}, "pattern", "$.executionDigest"),
        ({"executionDigest": "a" * 65}, "length", "$.executionDigest"),
        ({"workerGeneration": 2**31}, "out_of_range", "$.workerGeneration"),
        ({"expectedLeaseVersion": -1}, "out_of_range", "$.expectedLeaseVersion"),
        ({"leaseToken": "x" * 31}, "length", "$.leaseToken"),
        ({"schema": "qinglong/remote-secret-delivery@v1"}, "schema", "$.schema"),
        ({"extra": 1}, "key_set", "$"),  # a peer's key name is cut from the path
    ],
)
def test_request_rules_server_side(changes: dict[str, Any], reason: str, path: str) -> None:
    with pytest.raises(CallError) as info:
        parse_secrets_request(server_body(**changes))
    assert (info.value.code, info.value.reason, info.value.path) == ("secrets_request_invalid", reason, path)


def test_the_36_limit_is_not_applied_to_request_ids() -> None:
    assert parse_secrets_request(server_body(runId="r" * 128))["runId"] == "r" * 128


# --- the answer -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "reason", "path"),
    [
        ({"schema": "qinglong/remote-secret-delivery@v1"}, "schema", "$.schema"),
        ({"runId": "r" * 37}, "length", "$.runId"),
        ({"attemptId": ""}, "length", "$.attemptId"),
        ({"offerId": "o" * 129}, "length", "$.offerId"),
        ({"runId": "run-2"}, "echo_mismatch", "$.runId"),
        ({"attemptId": "attempt-2"}, "echo_mismatch", "$.attemptId"),
        ({"offerId": "offer-2"}, "echo_mismatch", "$.offerId"),
        ({"executionDigest": "A" * 64}, "pattern", "$.executionDigest"),
        ({"values": []}, "ref_mismatch", "$.values"),
        ({"values": {}}, "ref_mismatch", "$.values"),
        ({"values": [{"secretRef": vr.secret("OTHER"), "value": "x"}]}, "ref_mismatch", "$.values[0].secretRef"),
        ({"values": [{"secretRef": vr.API_KEY_REF}]}, "key_set", "$.values[0].value"),
        ({"values": [{"secretRef": vr.API_KEY_REF, "value": 1}]}, "secret_value", "$.values[0].value"),
        ({"values": [{"secretRef": vr.API_KEY_REF, "value": "a\x00b"}]}, "secret_value", "$.values[0].value"),
        ({"values": [{"secretRef": vr.API_KEY_REF, "value": "v" * 16385}]}, "secret_value", "$.values[0].value"),
        ({"environmentBundles": [{"secretRef": vr.API_KEY_REF, "value": "x"}]}, "ref_mismatch",
         "$.environmentBundles"),
    ],
)
def test_answer_rules(changes: dict[str, Any], reason: str, path: str) -> None:
    rejects(answer(**changes), reason, path)


def test_values_may_be_empty_or_hold_ctrl_other_than_nul() -> None:
    for text in ("", "a\nb\x01", "v" * 16384, "秘密"):
        values = parse_secrets_response(answer(values=[{"secretRef": vr.API_KEY_REF, "value": text}]), request())
        assert bytes(values.value_for(vr.API_KEY_REF)) == text.encode()


def test_the_64_kib_total() -> None:
    refs = [vr.secret(f"S{index}") for index in range(5)]
    offer = vr.offer_with_revision(environment=bindings(*((f"V{i}", ref) for i, ref in enumerate(refs))))
    req = request(offer)
    entries = [{"secretRef": ref, "value": "v" * 16384} for ref in req.secret_refs]
    doc = {**vr.decoded(vr.SECRETS_ANSWER), "executionDigest": req.execution_digest}
    rejects(vr.body({**doc, "values": entries[:5]}), "budget", "$.values", req)
    four = parse_secrets_response(vr.body({**doc, "values": [*entries[:4], {**entries[4], "value": ""}]}), req)
    assert len(four.values) == 5


def test_a_bundle_value_cap() -> None:
    bundle = vr.secret("BUNDLE", version=1)
    req = request(vr.offer_with_revision(environmentBundleRef=bundle))
    doc = {**vr.decoded(vr.SECRETS_ANSWER), "executionDigest": req.execution_digest, "values": []}
    ok = parse_secrets_response(vr.body({**doc, "environmentBundles": [{"secretRef": bundle, "value": "b" * 98304}]}),
                                req)
    assert len(ok.bundles[0]) == 98304
    rejects(vr.body({**doc, "environmentBundles": [{"secretRef": bundle, "value": "b" * 98305}]}), "secret_value",
            "$.environmentBundles[0].value", req)


def test_peer_key_names_never_reach_the_error() -> None:
    error = rejects(answer(values=[{"secretRef": vr.API_KEY_REF, "value": "x", "s3cr3t": 1}]), "key_set")
    assert error.path == "$.values[0]"
    error = rejects(vr.duplicated(vr.SECRETS_ANSWER, "values"), "duplicate_key")
    assert error.path == "$.values"
    error = rejects(answer(s3cr3t=1), "key_set")
    assert error.path == "$"


def test_size_cap() -> None:
    assert parse_secrets_response(vr.padded(vr.SECRETS_ANSWER, SECRETS_RESPONSE_MAX_BYTES), request())
    rejects(vr.padded(vr.SECRETS_ANSWER, SECRETS_RESPONSE_MAX_BYTES + 1), "too_large", "$")


# --- properties -------------------------------------------------------------------------------------------------

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**54), 2**54) | st.text(max_size=10)
    | st.sampled_from([vr.API_KEY_REF, "run-1", vr.DIGEST_WITH_API_KEY, "s3cr3t"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["schema", "runId", "attemptId", "offerId", "executionDigest", "values",
                         "environmentBundles", "secretRef", "value", "s3cr3t"]), children, max_size=8),
    max_leaves=25,
)


@SETTINGS
@given(st.binary(max_size=300))
def test_arbitrary_bytes(data: bytes) -> None:
    vr.only_call_errors(lambda: parse_secrets_response(data, request()), CODE)
    vr.only_call_errors(lambda: parse_secrets_request(data), "secrets_request_invalid")


@SETTINGS
@given(json_values)
def test_arbitrary_json(value: Any) -> None:
    vr.only_call_errors(lambda: parse_secrets_response(json.dumps(value).encode(), request()), CODE)
    vr.only_call_errors(lambda: secrets_request(value), "secrets_request_invalid")
    doc = vr.decoded(vr.SECRETS_ANSWER)
    for key in doc:
        mutated = vr.body({**doc, key: value})
        vr.only_call_errors(lambda data=mutated: parse_secrets_response(data, request()), CODE)
