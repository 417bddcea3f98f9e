"""Artifact upload and completion (remote-execution.md 3.6, 3.7, 6): framing bytes, header
order, our sha256 check, outcome/exit-code and time rules, echoes, server-side views."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong_edge.contracts.completion import (
    ARTIFACT_CONTENT_TYPE,
    ARTIFACT_HEADER_MAX_BYTES,
    MAX_ARTIFACT_BYTES,
    artifact_upload_preamble,
    completion_outcome,
    completion_request_body,
    parse_artifact_header,
    parse_artifact_response,
    parse_completion_request,
    parse_completion_response,
)
from qinglong_edge.contracts.ingress import CallError, worker_call_path
from tests.contracts import vector_rx as vr

UPLOAD = {"log_artifact_id": vr.LOG_ID, "byte_length": 6, "truncated": False}
COMPLETE = {"callback_sequence": 1, "callback_token_digest": vr.TOKEN_DIGEST, "started_at_ms": 1005,
            "finished_at_ms": 3000, "exit_code": 0, "log_artifact_id": vr.LOG_ID, "byte_length": 6,
            "sha256": vr.LOG_SHA256, "truncated": False}


def offer() -> dict[str, Any]:
    return vr.renewed_offer()


def preamble(**changes: Any) -> bytes:
    return artifact_upload_preamble(offer(), **{**UPLOAD, **changes})


def receipt(data: bytes, **changes: Any) -> Any:
    return parse_artifact_response(data, offer(), **{**UPLOAD, "sha256": vr.LOG_SHA256, **changes})


change = vr.changed


def code_reason(call: Any) -> tuple[str, str, str]:
    with pytest.raises(CallError) as info:
        call()
    for text in vr.SECRET_TEXTS:
        assert text not in str(info.value)
    return info.value.code, info.value.reason, info.value.path


# --- golden vectors ---------------------------------------------------------------------------------------


def test_the_upload_is_section_6_byte_for_byte() -> None:
    head = preamble()
    assert head[:4] == bytes.fromhex("00000165")
    assert head[4:] == vr.ARTIFACT_HEADER
    assert len(vr.ARTIFACT_HEADER) == 357
    assert len(head) + len(vr.LOG) == 367  # content-length = 4 + H + N
    assert hashlib.sha256(head + vr.LOG).hexdigest() == vr.ARTIFACT_BODY_SHA256
    assert hashlib.sha256(vr.LOG).hexdigest() == vr.LOG_SHA256
    assert ARTIFACT_CONTENT_TYPE == "application/vnd.qinglong.worker-artifact"
    assert worker_call_path("edge-1", vr.SESSION, "artifacts") == vr.PATH_PREFIX + "artifacts"


def test_the_artifact_answer_is_accepted_and_our_digest_is_checked() -> None:
    stored = receipt(vr.ARTIFACT_ANSWER)
    assert (stored.status, stored.byte_length, stored.sha256, stored.truncated) == ("stored", 6, vr.LOG_SHA256, False)
    assert receipt(change(vr.ARTIFACT_ANSWER, status="already_stored")).status == "already_stored"
    assert code_reason(lambda: receipt(vr.ARTIFACT_ANSWER, sha256="0" * 64)) == (
        "artifact_response_invalid", "sha256_mismatch", "$.sha256")


def test_the_completion_is_section_6_byte_for_byte() -> None:
    data = completion_request_body(offer(), **COMPLETE)
    assert data == vr.COMPLETION
    assert len(data) == 636
    result = parse_completion_response(vr.COMPLETION_APPLIED, offer(), callback_sequence=1)
    assert (result.status, result.callback_sequence) == ("applied", 1)
    assert worker_call_path("edge-1", vr.SESSION, "completion") == vr.PATH_PREFIX + "completion"


def test_server_side_views_round_trip() -> None:
    head = preamble()
    header, offset = parse_artifact_header(head + vr.LOG)
    assert header == vr.decoded(vr.ARTIFACT_HEADER)
    assert offset == 361 and offset + header["byteLength"] == 367
    assert parse_completion_request(vr.COMPLETION) == vr.decoded(vr.COMPLETION)


# --- artifact header ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("truncated", [True, False, None])
def test_truncated_is_true_false_or_null(truncated: bool | None) -> None:
    header, _ = parse_artifact_header(preamble(truncated=truncated))
    assert header["truncated"] is truncated
    answer = change(vr.ARTIFACT_ANSWER, truncated=truncated)
    assert receipt(answer, truncated=truncated).truncated is truncated
    other = {True: False, False: None, None: True}[truncated]
    assert code_reason(lambda: receipt(answer, truncated=other))[1] == "echo_mismatch"


@pytest.mark.parametrize(
    ("changes", "reason", "path"),
    [
        ({"log_artifact_id": "wlog-XYZ"}, "pattern", "$.logArtifactId"),
        ({"log_artifact_id": "local-68cd94391d043410683fabcde45b2a"}, "pattern", "$.logArtifactId"),
        ({"log_artifact_id": "wlog-" + "0" * 32}, "length", "$.logArtifactId"),
        ({"byte_length": -1}, "out_of_range", "$.byteLength"),
        ({"byte_length": MAX_ARTIFACT_BYTES + 1}, "out_of_range", "$.byteLength"),
        ({"truncated": 0}, "not_boolean", "$.truncated"),
    ],
)
def test_header_limits(changes: dict[str, Any], reason: str, path: str) -> None:
    assert code_reason(lambda: preamble(**changes)) == ("artifact_request_invalid", reason, path)


def test_header_byte_length_boundaries() -> None:
    assert parse_artifact_header(preamble(byte_length=MAX_ARTIFACT_BYTES))[0]["byteLength"] == MAX_ARTIFACT_BYTES
    assert parse_artifact_header(preamble(byte_length=0))[0]["byteLength"] == 0


def test_the_largest_valid_header_fits_4_kib() -> None:
    big = offer()
    big["candidate"]["projectId"] = "p" * 128
    big["candidate"]["runId"] = "r" * 128
    big["candidate"]["attemptId"] = "a" * 128
    big["offerId"] = "o" * 128
    assert len(preamble()) < ARTIFACT_HEADER_MAX_BYTES  # 128-byte ids still fit
    assert parse_artifact_header(artifact_upload_preamble(big, **UPLOAD))[1] < ARTIFACT_HEADER_MAX_BYTES


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x00\x00\x00", "framing"),
        (b"\x00\x00\x00\x01{}", "framing"),
        (b"\x00\x00\x10\x01" + b"{}", "framing"),
        (b"\x00\x00\x00\x05{}", "framing"),
        (b"\x00\x00\x00\x02{}", "key_set"),
        (b"\x00\x00\x00\x02[]", "not_object"),
    ],
)
def test_server_side_framing(data: bytes, reason: str) -> None:
    assert code_reason(lambda: parse_artifact_header(data))[:2] == ("artifact_request_invalid", reason)


@pytest.mark.parametrize("content_length", [366, 368, 361, 0])
def test_content_length_must_be_4_plus_h_plus_n(content_length: int) -> None:
    data = preamble() + vr.LOG
    assert parse_artifact_header(data, content_length=367)[1] == 361
    assert code_reason(lambda: parse_artifact_header(data, content_length=content_length)) == (
        "artifact_request_invalid", "framing", "$")


def test_server_side_header_rules() -> None:
    doc = vr.decoded(vr.ARTIFACT_HEADER)
    for key, value in (("schema", "x"), ("truncated", "no"), ("byteLength", 2**53), ("leaseToken", "t"),
                       ("logArtifactId", "wlog-1"), ("expectedLeaseVersion", -1), ("extra", 1)):
        header = vr.body({**doc, key: value})
        data = len(header).to_bytes(4, "big") + header
        assert code_reason(lambda d=data: parse_artifact_header(d))[0] == "artifact_request_invalid"


# --- artifact answer ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "reason", "path"),
    [
        ({"schema": "qinglong/remote-worker-completion@v1"}, "schema", "$.schema"),
        ({"status": "applied"}, "status", "$.status"),
        ({"truncated": "false"}, "not_boolean", "$.truncated"),
        ({"runId": ""}, "length", "$.runId"),
        ({"logArtifactId": "wlog-1"}, "pattern", "$.logArtifactId"),
        ({"sha256": "A" * 64}, "pattern", "$.sha256"),
        ({"sha256": None}, "not_string", "$.sha256"),
        ({"projectId": "p" * 129}, "length", "$.projectId"),
        ({"byteLength": MAX_ARTIFACT_BYTES + 1}, "out_of_range", "$.byteLength"),
        ({"projectId": "project-2"}, "echo_mismatch", "$.projectId"),
        ({"runId": "run-2"}, "echo_mismatch", "$.runId"),
        ({"attemptId": "attempt-2"}, "echo_mismatch", "$.attemptId"),
        ({"logArtifactId": "wlog-" + "0" * 30}, "echo_mismatch", "$.logArtifactId"),
        ({"byteLength": 7}, "echo_mismatch", "$.byteLength"),
        ({"truncated": None}, "echo_mismatch", "$.truncated"),
        ({"truncated": vr.DELETE}, "key_set", "$.truncated"),
        ({"extra": 1}, "key_set", "$.extra"),
    ],
)
def test_artifact_answer_rules(changes: dict[str, Any], reason: str, path: str) -> None:
    assert code_reason(lambda: receipt(change(vr.ARTIFACT_ANSWER, **changes))) == (
        "artifact_response_invalid", reason, path)


def test_artifact_answer_size() -> None:
    assert receipt(vr.padded(vr.ARTIFACT_ANSWER, 4096)).status == "stored"
    assert code_reason(lambda: receipt(vr.padded(vr.ARTIFACT_ANSWER, 4097)))[1] == "too_large"


# --- completion ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exit_code", [0, 1, 2, 137, 143, 255])
def test_outcome_follows_the_exit_code(exit_code: int) -> None:
    body = json.loads(completion_request_body(offer(), **{**COMPLETE, "exit_code": exit_code}))
    assert body["result"]["outcome"] == ("succeeded" if exit_code == 0 else "failed") == completion_outcome(exit_code)


@pytest.mark.parametrize(
    ("changes", "reason", "path"),
    [
        ({"outcome": "failed"}, "outcome", "$.result.outcome"),  # section 6 negative: failed with exit 0
        ({"outcome": "succeeded", "exit_code": 1}, "outcome", "$.result.outcome"),
        ({"outcome": "cancelled"}, "outcome", "$.result.outcome"),
        ({"exit_code": 256}, "out_of_range", "$.result.exitCode"),
        ({"exit_code": -1}, "out_of_range", "$.result.exitCode"),
        ({"finished_at_ms": 1004}, "time_order", "$.result.finishedAtMs"),
        ({"started_at_ms": 2**53}, "out_of_range", "$.result.startedAtMs"),
        ({"callback_sequence": 0}, "out_of_range", "$.callbackSequence"),
        ({"callback_sequence": 2**31}, "out_of_range", "$.callbackSequence"),
        ({"callback_token_digest": "a" * 63}, "length", "$.callbackTokenDigest"),
        ({"sha256": "G" * 64}, "pattern", "$.artifact.sha256"),
        ({"log_artifact_id": "wlog-short"}, "pattern", "$.artifact.logArtifactId"),
        ({"byte_length": MAX_ARTIFACT_BYTES + 1}, "out_of_range", "$.artifact.byteLength"),
        ({"truncated": "yes"}, "not_boolean", "$.artifact.truncated"),
    ],
)
def test_completion_request_rules(changes: dict[str, Any], reason: str, path: str) -> None:
    assert code_reason(lambda: completion_request_body(offer(), **{**COMPLETE, **changes})) == (
        "completion_request_invalid", reason, path)


def test_completion_boundaries_that_pass() -> None:
    body = completion_request_body(offer(), **{**COMPLETE, "finished_at_ms": 1005, "truncated": None,
                                               "callback_sequence": 2**31 - 1, "byte_length": 0})
    doc = json.loads(body)
    assert doc["artifact"]["truncated"] is None and doc["result"]["finishedAtMs"] == 1005
    assert parse_completion_request(body)["callbackSequence"] == 2**31 - 1


def test_server_side_completion_rules() -> None:
    doc = vr.decoded(vr.COMPLETION)
    for mutate in (
        lambda d: d["result"].update(outcome="failed"),
        lambda d: d["result"].pop("exitCode"),
        lambda d: d["result"].update(extra=1),
        lambda d: d["artifact"].pop("truncated"),
        lambda d: d.update(schema="x"),
        lambda d: d.update(extra=1),
        lambda d: d["result"].update(finishedAtMs=1),
    ):
        copy = json.loads(json.dumps(doc))
        mutate(copy)
        assert code_reason(lambda c=copy: parse_completion_request(vr.body(c)))[0] == "completion_request_invalid"


@pytest.mark.parametrize("status", ["applied", "already_completed", "already_terminal"])
def test_every_completion_status(status: str) -> None:
    data = change(vr.COMPLETION_APPLIED, status=status)
    assert parse_completion_response(data, offer(), callback_sequence=1).status == status


@pytest.mark.parametrize(
    ("changes", "reason", "path"),
    [
        ({"status": "stored"}, "status", "$.status"),
        ({"schema": "x"}, "schema", "$.schema"),
        ({"runId": "run-2"}, "echo_mismatch", "$.runId"),
        ({"attemptId": "attempt-2"}, "echo_mismatch", "$.attemptId"),
        ({"callbackSequence": 2}, "echo_mismatch", "$.callbackSequence"),
        ({"callbackSequence": 0}, "out_of_range", "$.callbackSequence"),
        ({"callbackSequence": 2**31}, "out_of_range", "$.callbackSequence"),
        ({"runId": "r" * 129}, "length", "$.runId"),
        ({"extra": 1}, "key_set", "$.extra"),
        ({"callbackSequence": vr.DELETE}, "key_set", "$.callbackSequence"),
    ],
)
def test_completion_answer_rules(changes: dict[str, Any], reason: str, path: str) -> None:
    data = change(vr.COMPLETION_APPLIED, **changes)
    assert code_reason(lambda: parse_completion_response(data, offer(), callback_sequence=1)) == (
        "completion_response_invalid", reason, path)


# --- properties ----------------------------------------------------------------------------------------------

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**54), 2**54) | st.text(max_size=10)
    | st.sampled_from(["stored", "applied", vr.LOG_ID, vr.LOG_SHA256, "run-1", "succeeded"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=15,
)


@SETTINGS
@given(st.binary(max_size=300))
def test_arbitrary_bytes(data: bytes) -> None:
    vr.only_call_errors(lambda: receipt(data), "artifact_response_invalid")
    vr.only_call_errors(lambda: parse_completion_response(data, offer(), callback_sequence=1),
                        "completion_response_invalid")
    vr.only_call_errors(lambda: parse_artifact_header(data), "artifact_request_invalid")
    vr.only_call_errors(lambda: parse_completion_request(data), "completion_request_invalid")


@SETTINGS
@given(json_values, st.sampled_from(list(COMPLETE)))
def test_arbitrary_values(value: Any, argument: str) -> None:
    vr.only_call_errors(lambda: completion_request_body(offer(), **{**COMPLETE, argument: value}),
                        "completion_request_invalid")
    vr.only_call_errors(lambda: completion_request_body(value, **COMPLETE), "completion_request_invalid")
    vr.only_call_errors(lambda: artifact_upload_preamble(value, **UPLOAD), "artifact_request_invalid")
    for key in vr.decoded(vr.ARTIFACT_ANSWER):
        vr.only_call_errors(lambda k=key: receipt(change(vr.ARTIFACT_ANSWER, **{k: value})),
                            "artifact_response_invalid")


@SETTINGS
@given(st.integers(0, 255), st.integers(0, 2**52), st.integers(0, 2**20))
def test_built_completions_parse_server_side(exit_code: int, started: int, elapsed: int) -> None:
    body = completion_request_body(offer(), **{**COMPLETE, "exit_code": exit_code, "started_at_ms": started,
                                               "finished_at_ms": started + elapsed})
    parsed = parse_completion_request(body)
    assert parsed["result"]["exitCode"] == exit_code
    assert (parsed["result"]["outcome"] == "succeeded") is (exit_code == 0)
