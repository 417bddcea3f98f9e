"""The ``code`` of a non-200 answer (offer-delivery.md 1.7: every non-200 body is
``{"code":"<code>"}``): read only from a small JSON body, kept only when it is a plain
code, never the rest of the body (worker/ingress_http.py); the offer route needs it to
tell ``worker_offer_fenced`` from other 409s."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qinglong_edge.worker.ingress_http import (
    MAX_ERROR_BODY_BYTES,
    error_body_decoder,
    parse_error_code,
    parse_response_head,
)


def _head(*fields: str, status: int = 409) -> bytes:
    return (f"HTTP/1.1 {status} Conflict\r\n" + "".join(f"{f}\r\n" for f in fields) + "\r\n").encode()


@pytest.mark.parametrize(("body", "code"), [
    (b'{"code":"worker_offer_fenced"}', "worker_offer_fenced"),
    (b'{"code":"claim_in_progress","extra":1}', "claim_in_progress"),
    (b'{"code":"Not A Code"}', None),
    (b'{"code":1}', None),
    (b'["code"]', None),
    (b"not json", None),
    (b'{"code":"' + b"a" * 65 + b'"}', None),
])
def test_only_a_plain_code_is_kept(body: bytes, code: str | None) -> None:
    assert parse_error_code(body) == code


@given(st.binary(max_size=200))
def test_the_code_parser_never_raises(data: bytes) -> None:
    code = parse_error_code(data)
    assert code is None or (code.isascii() and len(code) <= 64)


@pytest.mark.parametrize(("fields", "readable"), [
    (("content-type: application/json; charset=utf-8", "content-length: 30"), True),
    (("content-type: text/html", "content-length: 30"), False),
    (("content-type: application/json", "transfer-encoding: chunked"), False),
    (("content-type: application/json",), False),  # EOF-delimited: never read
    (("content-type: application/json", f"content-length: {MAX_ERROR_BODY_BYTES + 1}"), False),
    (("content-type: application/json", "content-length: 30", "content-encoding: gzip"), False),
])
def test_the_body_is_read_only_when_small_json_with_a_length(fields: tuple[str, ...], readable: bool) -> None:
    head = parse_response_head(_head(*fields))
    assert (error_body_decoder(head) is not None) is readable


def test_a_200_is_never_an_error_body() -> None:
    head = parse_response_head(_head("content-type: application/json", "content-length: 30", status=200))
    assert error_body_decoder(head) is None
