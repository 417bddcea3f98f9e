"""Callback token, receipt, wlog id and truncation fact (remote-execution.md 4.2, 4.3, 6)."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong_edge.contracts.inbox import to_launching, to_starting_acknowledged
from qinglong_edge.contracts.launch import LaunchError
from qinglong_edge.contracts.receipt import (
    CallbackToken,
    authenticate_receipt,
    callback_token_digest,
    log_artifact_id,
    log_file_names,
    new_callback_token,
    parse_receipt,
    parse_truncation_fact,
    receipt_file_names,
    receipt_prefix,
    receipt_suffix,
    truncation_fact_prefix,
    truncation_fact_suffix,
)
from tests.contracts import vector_rx as vr

FACT = {"run_id": "run-1", "attempt_id": "attempt-1", "log_artifact_id": vr.LOG_ID, "maximum_bytes": 4194304}


def token() -> CallbackToken:
    return new_callback_token(lambda n: vr.TOKEN_RAW[:n])


def launching() -> dict[str, Any]:
    return to_launching(to_starting_acknowledged(vr.record(), 1002), 1005, executor_started_at_ms=1005,
                        log_artifact_id=vr.LOG_ID, callback_sequence=1, callback_token_digest=vr.TOKEN_DIGEST)


def fails(call: Any, code: str, reason: str | None = None) -> LaunchError:
    with pytest.raises(LaunchError) as info:
        call()
    assert info.value.code == code, (info.value.code, info.value.reason)
    if reason is not None:
        assert info.value.reason == reason, info.value.path
    for text in vr.SECRET_TEXTS:
        assert text not in str(info.value) and text not in repr(info.value)
    return info.value


# --- golden vectors --------------------------------------------------------------------------------------------


def test_the_callback_token_and_its_digest() -> None:
    tok = token()
    assert tok.text() == vr.TOKEN_TEXT and len(tok.text()) == 43
    assert tok.digest == vr.TOKEN_DIGEST == hashlib.sha256(vr.TOKEN_RAW).hexdigest()
    assert callback_token_digest(vr.TOKEN_RAW) == vr.TOKEN_DIGEST
    assert tok.digest != hashlib.sha256(vr.TOKEN_TEXT.encode()).hexdigest()  # over the raw bytes, not the text
    assert vr.TOKEN_TEXT not in repr(tok) and vr.TOKEN_TEXT not in str(tok)
    tok.wipe()
    assert tok.raw == bytearray(32)


def test_a_fresh_token_is_32_random_bytes() -> None:
    a, b = new_callback_token(), new_callback_token()
    assert len(a.raw) == 32 and a.raw != b.raw
    assert base64.urlsafe_b64decode(a.text() + "=") == bytes(a.raw)
    fails(lambda: new_callback_token(lambda n: b"\x00" * 31), "callback_token_invalid")


def test_the_log_id_and_file_names() -> None:
    assert log_artifact_id("project-1", "run-1", "attempt-1", "offer-1") == vr.LOG_ID
    digest = hashlib.sha256(b"qinglong/worker-log-artifact@v1\x00project-1\x00run-1\x00attempt-1\x00offer-1")
    assert "wlog-" + digest.hexdigest()[:30] == vr.LOG_ID
    names = log_file_names(vr.LOG_ID)
    assert (names.shard, names.log, names.fifo, names.truncation_fact) == (
        "68", f"{vr.LOG_ID}.log", f".{vr.LOG_ID}.log.fifo", f".{vr.LOG_ID}.log.truncated.json")
    assert receipt_file_names("attempt-1") == ("at", "attempt-1.json")
    fails(lambda: log_file_names("wlog-1"), "log_artifact_id_invalid")
    fails(lambda: log_artifact_id("", "run-1", "attempt-1", "offer-1"), "log_artifact_id_invalid", "length")
    fails(lambda: log_artifact_id("p", "r\n", "a", "o"), "log_artifact_id_invalid", "control_character")
    fails(lambda: receipt_file_names("../x"), "receipt_invalid")


def test_the_receipt_prefix_plus_suffix_is_section_6() -> None:
    prefix = receipt_prefix(run_id="run-1", attempt_id="attempt-1", callback_sequence=1, token=token(),
                            started_at_ms=1005)
    assert isinstance(prefix, bytearray)
    assert bytes(prefix) == vr.RECEIPT[:vr.RECEIPT.index(b',"finishedAtMs"')]
    assert bytes(prefix) + receipt_suffix(3000, 0) == vr.RECEIPT
    parsed = parse_receipt(vr.RECEIPT)
    assert (parsed.run_id, parsed.attempt_id, parsed.callback_sequence, parsed.started_at_ms,
            parsed.finished_at_ms, parsed.exit_code) == ("run-1", "attempt-1", 1, 1005, 3000, 0)
    assert vr.TOKEN_TEXT not in repr(parsed)


def test_the_truncation_fact_is_section_6() -> None:
    prefix = truncation_fact_prefix(**FACT)
    assert prefix == vr.TRUNCATION_FACT[:vr.TRUNCATION_FACT.index(b',"quotaReached"')]
    assert prefix + truncation_fact_suffix(False, 3000) == vr.TRUNCATION_FACT
    assert parse_truncation_fact(vr.TRUNCATION_FACT, **FACT) is False
    assert parse_truncation_fact(prefix + truncation_fact_suffix(True, 0), **FACT) is True


# --- receipt parse rules ---------------------------------------------------------------------------------------


def receipt(**changes: Any) -> bytes:
    return vr.changed(vr.RECEIPT, **changes)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "too_small"),
        (b" " * 4097, "too_large"),
        (b"\xc3\x28", "invalid_utf8"),
        (vr.duplicated(vr.RECEIPT, "exitCode"), "duplicate_key"),
        (receipt(exitCode=vr.DELETE), "key_set"),
        (receipt(extra=1), "key_set"),
        (receipt(schemaVersion=2), "schema_version"),
        (receipt(schemaVersion=True), "schema_version"),
        (receipt(runId="r" * 37), "length"),
        (receipt(runId="-run"), "pattern"),
        (receipt(attemptId="a b"), "pattern"),
        (receipt(callbackSequence=0), "out_of_range"),
        (receipt(callbackSequence=1.0), "not_integer"),
        (receipt(token="short"), "pattern"),
        (receipt(token="E" * 129), "pattern"),
        (receipt(startedAtMs=-1), "out_of_range"),
        (receipt(finishedAtMs=1004), "time_order"),
        (receipt(exitCode=256), "out_of_range"),
        (receipt(exitCode=-1), "out_of_range"),
        (receipt(exitCode={"nested": 1}), "not_integer"),
        (b"[]", "not_object"),
    ],
)
def test_receipt_parse_rules(data: bytes, reason: str) -> None:
    fails(lambda: parse_receipt(data), "receipt_invalid", reason)


def test_receipt_boundaries_that_pass() -> None:
    assert parse_receipt(receipt(exitCode=255, finishedAtMs=1005, callbackSequence=2**53 - 1)).exit_code == 255
    assert parse_receipt(receipt(runId="r" * 36, token="A" * 128)).run_id == "r" * 36


# --- receipt authentication ------------------------------------------------------------------------------------


def test_the_section_6_receipt_authenticates() -> None:
    parsed = parse_receipt(vr.RECEIPT)
    assert authenticate_receipt(parsed, launching(), 3000) is parsed


@pytest.mark.parametrize(
    ("changes", "now", "reason"),
    [
        ({"runId": "run-2"}, 3000, "run_mismatch"),
        ({"attemptId": "attempt-2"}, 3000, "attempt_mismatch"),
        ({"callbackSequence": 2}, 3000, "sequence_mismatch"),
        ({"startedAtMs": 1004}, 3000, "started_mismatch"),
        ({}, 2999, "finished_in_future"),
        ({"token": "E" * 42 + "F"}, 3000, "token_encoding"),  # non-canonical: low bits set
        ({"token": "E" * 44}, 3000, "token_encoding"),
        ({"token": "E" * 32}, 3000, "token_encoding"),
        ({"token": "A" * 43}, 3000, "token_digest"),  # canonical 32 zero bytes: another token
    ],
)
def test_receipt_authentication(changes: dict[str, Any], now: int, reason: str) -> None:
    parsed = parse_receipt(receipt(**changes))
    fails(lambda: authenticate_receipt(parsed, launching(), now), "receipt_unauthenticated", reason)


def test_a_record_without_the_launch_fields_cannot_authenticate() -> None:
    fails(lambda: authenticate_receipt(parse_receipt(vr.RECEIPT), vr.record(), 3000), "receipt_invalid")


# --- prefix/suffix limits ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "reason"),
    [({"run_id": "r" * 37}, "length"), ({"attempt_id": "a/b"}, "pattern"), ({"callback_sequence": 0}, "out_of_range"),
     ({"started_at_ms": -1}, "out_of_range"), ({"token": "text"}, "not_string")],
)
def test_receipt_prefix_limits(changes: dict[str, Any], reason: str) -> None:
    args = {"run_id": "run-1", "attempt_id": "attempt-1", "callback_sequence": 1, "token": token(),
            "started_at_ms": 1005, **changes}
    fails(lambda: receipt_prefix(**args), "receipt_invalid", reason)


def test_suffix_limits() -> None:
    fails(lambda: receipt_suffix(-1, 0), "receipt_invalid", "out_of_range")
    fails(lambda: receipt_suffix(1, 256), "receipt_invalid", "out_of_range")
    fails(lambda: truncation_fact_suffix(1, 0), "truncation_fact_invalid", "not_boolean")  # type: ignore[arg-type]
    fails(lambda: truncation_fact_prefix(**{**FACT, "log_artifact_id": "wlog-x"}), "truncation_fact_invalid",
          "pattern")


# --- truncation fact rules ------------------------------------------------------------------------------------------


def fact(**changes: Any) -> bytes:
    return vr.changed(vr.TRUNCATION_FACT, **changes)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (fact(maximumBytes=1048576), "echo_mismatch"),
        (fact(runId="run-2"), "echo_mismatch"),
        (fact(attemptId="attempt-2"), "echo_mismatch"),
        (fact(logArtifactId="wlog-" + "0" * 30), "echo_mismatch"),
        (fact(maximumBytes="4194304"), "echo_mismatch"),
        (fact(quotaReached=None), "not_boolean"),
        (fact(quotaReached=0), "not_boolean"),
        (fact(observedAtMs=-1), "out_of_range"),
        (fact(schemaVersion=2), "schema_version"),
        (fact(observedAtMs=vr.DELETE), "key_set"),
        (fact(extra=1), "key_set"),
        (b"", "too_small"),
        (b" " * 4097, "too_large"),
    ],
)
def test_truncation_fact_rules(data: bytes, reason: str) -> None:
    fails(lambda: parse_truncation_fact(data, **FACT), "truncation_fact_invalid", reason)


def test_the_fact_must_carry_the_policy_maximum() -> None:
    fails(lambda: parse_truncation_fact(vr.TRUNCATION_FACT, **{**FACT, "maximum_bytes": 1048576}),
          "truncation_fact_invalid", "echo_mismatch")


# --- properties -----------------------------------------------------------------------------------------------------

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.binary(max_size=300))
def test_arbitrary_bytes(data: bytes) -> None:
    vr.only_call_errors(lambda: parse_receipt(data), "receipt_invalid")
    vr.only_call_errors(lambda: parse_truncation_fact(data, **FACT), "truncation_fact_invalid")


@SETTINGS
@given(st.binary(min_size=32, max_size=32), st.integers(1, 2**31 - 1), st.integers(0, 2**52), st.integers(0, 2**20),
       st.integers(0, 255))
def test_written_receipts_parse_and_authenticate(raw: bytes, sequence: int, started: int, elapsed: int,
                                                 exit_code: int) -> None:
    tok = CallbackToken(bytearray(raw))
    data = bytes(receipt_prefix(run_id="run-1", attempt_id="attempt-1", callback_sequence=sequence, token=tok,
                                started_at_ms=started)) + receipt_suffix(started + elapsed, exit_code)
    assert json.loads(data)["token"] == tok.text()
    parsed = parse_receipt(data)
    record = {"offer": {"candidate": {"runId": "run-1", "attemptId": "attempt-1"}},
              "completionReceiptCallbackSequence": sequence, "completionReceiptTokenDigest": tok.digest,
              "executorStartedAtMs": started}
    assert authenticate_receipt(parsed, record, started + elapsed).exit_code == exit_code
    other = CallbackToken(bytearray(bytes([raw[0] ^ 1]) + raw[1:]))
    fails(lambda: authenticate_receipt(parsed, {**record, "completionReceiptTokenDigest": other.digest},
                                       started + elapsed), "receipt_unauthenticated", "token_digest")
