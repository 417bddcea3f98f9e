"""``qinglong/run-attempt-log-read-result@v1`` bodies (contracts/log_read.py): the
reference route test's shapes and the range invariants."""

from __future__ import annotations

import pytest

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.log_read import available_body, pending_body, retired_body, truncation_view
from qinglong_edge.contracts.strictjson import dumps_bytes

UNKNOWN = {"truncated": "unknown"}


def test_the_reference_route_vector() -> None:
    # runAttemptLogReadRoute.test.cjs: offset 2, length 16, 'hello' of a 9-byte log
    body = available_body("prj_default", "run_123", "attempt_123", offset=2, length=16, content=b"hello",
                          total_bytes=9, truncation=UNKNOWN)
    assert dumps_bytes(body) == (
        b'{"schema":"qinglong/run-attempt-log-read-result@v1","status":"available","projectId":"prj_default",'
        b'"runId":"run_123","attemptId":"attempt_123","range":{"start":2,"endExclusive":7,"totalBytes":9,'
        b'"nextOffset":7},"encoding":"base64","content":"aGVsbG8=","truncation":{"truncated":"unknown"}}')
    assert dumps_bytes(pending_body("prj_default", "run_123", "attempt_123")) == (
        b'{"schema":"qinglong/run-attempt-log-read-result@v1","status":"pending","projectId":"prj_default",'
        b'"runId":"run_123","attemptId":"attempt_123"}')
    assert dumps_bytes(retired_body("prj_default", "run_123", "attempt_123", retired_at_ms=30, byte_length=42,
                                    truncation=UNKNOWN)) == (
        b'{"schema":"qinglong/run-attempt-log-read-result@v1","status":"retired","projectId":"prj_default",'
        b'"runId":"run_123","attemptId":"attempt_123","retiredAtMs":30,"byteLength":42,'
        b'"truncation":{"truncated":"unknown"}}')


def test_past_the_end_is_empty_and_starts_at_the_end() -> None:
    body = available_body("p", "r", "a", offset=50, length=10, content=b"", total_bytes=9, truncation=UNKNOWN)
    assert body["range"] == {"start": 9, "endExclusive": 9, "totalBytes": 9} and body["content"] == ""


@pytest.mark.parametrize(("offset", "length", "content", "total"), [
    (0, 4, b"hello", 9),        # more than the window
    (6, 16, b"hello", 9),       # past the log's end
    (-1, 4, b"", 9),
    (0, 0, b"", 9),
    (0, 32769, b"", 9),
    (0, 4, b"", 2**53),
])
def test_a_broken_range_is_a_contract_error(offset: int, length: int, content: bytes, total: int) -> None:
    with pytest.raises(ContractError) as info:
        available_body("p", "r", "a", offset=offset, length=length, content=content, total_bytes=total,
                       truncation=UNKNOWN)
    assert info.value.code == "invalid_run_log_read_result"


def test_truncation_views() -> None:
    assert truncation_view(True, maximum_bytes=65536, observed_at_ms=5) == {
        "truncated": True, "maximumBytes": 65536, "observedAtMs": 5}
    assert truncation_view(False) == {"truncated": False}
    assert truncation_view("unknown") == UNKNOWN
    for bad in (lambda: truncation_view("unknown", maximum_bytes=1), lambda: truncation_view("yes"),
                lambda: truncation_view(True, maximum_bytes=0), lambda: truncation_view(False, observed_at_ms=-1)):
        with pytest.raises(ContractError):
            bad()
