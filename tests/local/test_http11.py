"""The sans-IO request-head parser and response writer (RFC 9112; local-api.md 2.1)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qinglong_edge.errors import HttpProtocolError
from qinglong_edge.local.http11 import (
    MAX_FIELD_LINES,
    MAX_HEAD_BYTES,
    HeadParser,
    RequestHead,
    parse_head,
    render_bare_response,
    render_json_response,
)

VALID = (
    b"POST /api/v3/projects/default/runs/run_local_api_1/cancellation HTTP/1.1\r\n"
    b"Host: 127.0.0.1:5700\r\n"
    b"Authorization: Bearer ql3c_x_y\r\n"
    b"Content-Type: application/json\r\n"
    b"Content-Length: 75\r\n"
    b"\r\n"
)


def feed_all(data: bytes) -> RequestHead | HttpProtocolError | None:
    parser = HeadParser()
    try:
        return parser.feed(data)
    except HttpProtocolError as exc:
        return exc


def feed_bytewise(data: bytes) -> RequestHead | HttpProtocolError | None:
    parser = HeadParser()
    try:
        for index in range(len(data)):
            head = parser.feed(data[index : index + 1])
            if head is not None:
                return head
    except HttpProtocolError as exc:
        return exc
    return None


def same(a: object, b: object) -> bool:
    if isinstance(a, HttpProtocolError) and isinstance(b, HttpProtocolError):
        return (a.code, a.http_status) == (b.code, b.http_status)
    return a == b


# -- accepted heads ---------------------------------------------------------


def test_parses_a_valid_head_keeping_raw_fields() -> None:
    head = parse_head(VALID + b'{"body"}')
    assert head.method == "POST"
    assert head.target == "/api/v3/projects/default/runs/run_local_api_1/cancellation"
    assert head.fields == (
        ("host", "127.0.0.1:5700"),
        ("authorization", "Bearer ql3c_x_y"),
        ("content-type", "application/json"),
        ("content-length", "75"),
    )
    assert head.head_bytes == len(VALID)
    assert head.content_length == 75
    assert head.has_body
    assert not head.has_transfer_encoding
    assert not head.wants_close


def test_trailing_bytes_after_the_head_are_kept_for_the_body() -> None:
    parser = HeadParser()
    head = parser.feed(VALID + b"abc")
    assert head is not None
    assert parser.trailing == b"abc"


def test_keeps_duplicate_fields_in_order() -> None:
    head = parse_head(b"GET / HTTP/1.1\r\nHost: a\r\nAuthorization: one\r\nX: 1\r\nauthorization: two\r\n\r\n")
    assert head.values("Authorization") == ["one", "two"]
    assert head.count("AUTHORIZATION") == 2


@pytest.mark.parametrize(
    ("line", "value"),
    [
        pytest.param(b"X:  a b \t", "a b", id="ows_trimmed"),
        pytest.param(b"X:\ta", "a", id="htab_ows"),
        pytest.param(b"X:", "", id="empty_value"),
        pytest.param(b"X: caf\xc3\xa9", "caf\xc3\xa9", id="obs_text_latin1"),
    ],
)
def test_field_values(line: bytes, value: str) -> None:
    head = parse_head(b"GET / HTTP/1.1\r\nHost: a\r\n" + line + b"\r\n\r\n")
    assert head.values("x") == [value]


@pytest.mark.parametrize(
    ("fields", "has_body"),
    [
        pytest.param(b"", False, id="none"),
        pytest.param(b"Content-Length: 0\r\n", False, id="cl_0"),
        pytest.param(b"Content-Length: 00\r\n", True, id="cl_00"),
        pytest.param(b"Content-Length: 1\r\n", True, id="cl_1"),
        pytest.param(b"Transfer-Encoding: chunked\r\n", True, id="te"),
    ],
)
def test_has_body_follows_local_api_2_2(fields: bytes, has_body: bool) -> None:
    head = parse_head(b"GET / HTTP/1.1\r\nHost: a\r\n" + fields + b"\r\n")
    assert head.has_body is has_body


def test_content_length_beyond_safe_integers_is_capped() -> None:
    head = parse_head(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n")
    assert head.content_length == 2**53


@pytest.mark.parametrize(
    ("value", "close"),
    [("close", True), ("keep-alive, Close", True), ("keep-alive", False), ("closed", False)],
)
def test_connection_close_option(value: str, close: bool) -> None:
    head = parse_head(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: " + value.encode() + b"\r\n\r\n")
    assert head.wants_close is close


def test_expect_100_continue() -> None:
    head = parse_head(b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 2\r\n\r\n")
    assert head.expects_continue


@pytest.mark.parametrize(
    "host",
    [b"127.0.0.1:5700", b"[::1]:5700", b"localhost", b"", b"example.com:"],
)
def test_accepts_valid_host_values(host: bytes) -> None:
    parse_head(b"GET / HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")


def test_head_exactly_at_the_cap_is_accepted() -> None:
    base = b"GET / HTTP/1.1\r\nHost: a\r\nX: \r\n\r\n"
    pad = MAX_HEAD_BYTES - len(base)
    data = b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"a" * pad + b"\r\n\r\n"
    assert len(data) == MAX_HEAD_BYTES
    assert parse_head(data).head_bytes == MAX_HEAD_BYTES


# -- rejected heads -----------------------------------------------------------

REJECTS = [
    ("bare_lf_request_line", b"GET / HTTP/1.1\nHost: a\r\n\r\n", "bare_lf", 400),
    ("bare_lf_field", b"GET / HTTP/1.1\r\nHost: a\n\r\n", "bare_lf", 400),
    ("bare_lf_terminator", b"GET / HTTP/1.1\r\nHost: a\r\n\n", "bare_lf", 400),
    ("bare_cr_value", b"GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n", "bare_cr", 400),
    ("bare_cr_terminator", b"GET / HTTP/1.1\r\nHost: a\r\n\r{}", "bare_cr", 400),
    ("leading_crlf", b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", "invalid_request_line", 400),
    ("lowercase_version", b"GET / http/1.1\r\nHost: a\r\n\r\n", "invalid_request_line", 400),
    ("two_spaces", b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", "invalid_request_line", 400),
    ("trailing_space", b"GET / HTTP/1.1 \r\nHost: a\r\n\r\n", "invalid_request_line", 400),
    ("tab_separator", b"GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n", "invalid_request_line", 400),
    ("space_in_target", b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", "invalid_request_line", 400),
    ("missing_version", b"GET /\r\nHost: a\r\n\r\n", "invalid_request_line", 400),
    ("bad_method", b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n", "invalid_request_line", 400),
    ("http_1_0", b"GET / HTTP/1.0\r\nHost: a\r\n\r\n", "http_version_not_supported", 505),
    ("http_2_0", b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", "http_version_not_supported", 505),
    ("absolute_form", b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", "unsupported_target_form", 400),
    ("asterisk_form", b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", "unsupported_target_form", 400),
    ("authority_form", b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n", "unsupported_target_form", 400),
    ("fragment", b"GET /a#b HTTP/1.1\r\nHost: a\r\n\r\n", "invalid_request_target", 400),
    ("bad_percent", b"GET /a%zz HTTP/1.1\r\nHost: a\r\n\r\n", "invalid_request_target", 400),
    ("non_ascii_target", b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n", "invalid_request_target", 400),
    ("backslash_target", b"GET /a\\b HTTP/1.1\r\nHost: a\r\n\r\n", "invalid_request_target", 400),
    ("obs_fold", b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n", "obs_fold", 400),
    ("leading_ws", b"GET / HTTP/1.1\r\n Host: a\r\n\r\n", "leading_whitespace", 400),
    ("space_before_colon", b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", "invalid_field_name", 400),
    ("empty_name", b"GET / HTTP/1.1\r\nHost: a\r\n: x\r\n\r\n", "invalid_field_name", 400),
    ("bad_name_char", b"GET / HTTP/1.1\r\nHost: a\r\nFo@: x\r\n\r\n", "invalid_field_name", 400),
    ("no_colon", b"GET / HTTP/1.1\r\nHost: a\r\nX 1\r\n\r\n", "invalid_field_line", 400),
    ("nul_in_value", b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n", "invalid_field_value", 400),
    ("del_in_value", b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x7fb\r\n\r\n", "invalid_field_value", 400),
    ("ctl_in_value", b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01\r\n\r\n", "invalid_field_value", 400),
    ("host_missing", b"GET / HTTP/1.1\r\nX: a\r\n\r\n", "invalid_host", 400),
    ("host_twice", b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", "invalid_host", 400),
    ("host_invalid", b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", "invalid_host", 400),
    ("host_userinfo", b"GET / HTTP/1.1\r\nHost: u@a\r\n\r\n", "invalid_host", 400),
    ("cl_twice_same", b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", "duplicate_content_length", 400),
    ("cl_list", b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 1\r\n\r\n", "invalid_content_length", 400),
    ("cl_plus", b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n", "invalid_content_length", 400),
    ("cl_empty", b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", "invalid_content_length", 400),
    ("cl_and_te", b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", "ambiguous_framing", 400),
    ("expect_other", b"GET / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n", "expectation_failed", 417),
    ("expect_twice", b"GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nExpect: 100-continue\r\n\r\n", "expectation_failed", 417),
    ("request_line_over_cap", b"GET /" + b"a" * MAX_HEAD_BYTES + b" HTTP/1.1\r\nHost: a\r\n\r\n", "uri_too_long", 414),
    ("head_over_cap", b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n", "head_too_large", 431),
    ("too_many_fields", b"GET / HTTP/1.1\r\nHost: a\r\n" + b"X: 1\r\n" * MAX_FIELD_LINES + b"\r\n", "too_many_fields", 431),
]


@pytest.mark.parametrize(("data", "code", "status"), [pytest.param(*r[1:], id=r[0]) for r in REJECTS])
def test_rejects_malformed_heads(data: bytes, code: str, status: int) -> None:
    with pytest.raises(HttpProtocolError) as info:
        parse_head(data)
    assert (info.value.code, info.value.http_status) == (code, status)


@pytest.mark.parametrize(("data", "code", "status"), [pytest.param(*r[1:], id=r[0]) for r in REJECTS])
def test_rejects_the_same_way_byte_at_a_time(data: bytes, code: str, status: int) -> None:
    result = feed_bytewise(data)
    assert isinstance(result, HttpProtocolError)
    assert (result.code, result.http_status) == (code, status)


def test_rejects_incomplete_head_in_parse_head() -> None:
    with pytest.raises(HttpProtocolError) as info:
        parse_head(b"GET / HTTP/1.1\r\nHost: a\r\n")
    assert info.value.code == "incomplete_head"


def test_rejects_oversize_head_before_the_terminator_arrives() -> None:
    parser = HeadParser()
    assert parser.feed(b"GET / HTTP/1.1\r\nX: ") is None
    with pytest.raises(HttpProtocolError) as info:
        parser.feed(b"a" * MAX_HEAD_BYTES)
    assert info.value.http_status == 431


def test_errors_are_sticky() -> None:
    parser = HeadParser()
    with pytest.raises(HttpProtocolError):
        parser.feed(b"GET / HTTP/1.1\n")
    with pytest.raises(HttpProtocolError):
        parser.feed(b"")


def test_rejects_feeding_after_completion() -> None:
    parser = HeadParser()
    assert parser.feed(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n") is not None
    with pytest.raises(RuntimeError):
        parser.feed(b"x")


def test_corpus_heads_are_parsed_identically_whole_and_bytewise(corpora: object) -> None:
    import pathlib

    cases = sorted((pathlib.Path(str(corpora)) / "http-malformed" / "cases").glob("*.http"))
    assert len(cases) > 40
    for case in cases:
        data = case.read_bytes()
        assert same(feed_all(data), feed_bytewise(data)), case.name


# -- properties (hypothesis) ----------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_give_a_head_or_a_typed_error(data: bytes) -> None:
    result = feed_all(data)
    assert result is None or isinstance(result, (RequestHead, HttpProtocolError))


@st.composite
def mutated_requests(draw: st.DrawFn) -> bytes:
    data = bytearray(VALID)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "dup"]))
        pos = draw(st.integers(0, len(data)))
        if op == "flip" and pos < len(data):
            data[pos] = draw(st.sampled_from(b"\x00\r\n \t:%#?/\x7f\xff@aZ0"))
        elif op == "insert":
            data[pos:pos] = draw(st.sampled_from([b"\r", b"\n", b"\r\n", b" ", b"\t", b"\x00", b":", b"\r\n "]))
        elif op == "delete" and pos < len(data):
            del data[pos]
        elif op == "dup":
            lines = bytes(data).split(b"\r\n")
            index = draw(st.integers(0, max(0, len(lines) - 1)))
            lines.insert(index, lines[index])
            data = bytearray(b"\r\n".join(lines))
    return bytes(data)


@settings(max_examples=500, deadline=None)
@given(mutated_requests())
def test_mutations_give_a_head_or_a_typed_error_and_bytewise_agrees(data: bytes) -> None:
    whole = feed_all(data)
    assert whole is None or isinstance(whole, (RequestHead, HttpProtocolError))
    assert same(whole, feed_bytewise(data))


@settings(max_examples=200, deadline=None)
@given(mutated_requests(), st.lists(st.integers(1, 40), max_size=20))
def test_any_chunking_gives_the_same_result(data: bytes, cuts: list[int]) -> None:
    parser = HeadParser()
    result: RequestHead | HttpProtocolError | None = None
    pos = 0
    try:
        for size in [*cuts, len(data)]:
            result = parser.feed(data[pos : pos + size])
            pos += size
            if result is not None or pos >= len(data):
                break
    except HttpProtocolError as exc:
        result = exc
    assert same(result, feed_all(data))


# -- responses --------------------------------------------------------------------


def test_renders_the_local_api_header_set_in_node_order() -> None:
    status, data = render_json_response(
        202, {"b": 1, "a": "é"}, request_id="local:00000000-0000-4000-8000-000000000000", close=False,
        date="Thu, 15 Jan 2027 08:00:00 GMT",
    )
    assert status == 202
    assert data == (
        b"HTTP/1.1 202 Accepted\r\n"
        b"content-type: application/json; charset=utf-8\r\n"
        b"cache-control: no-store\r\n"
        b"x-content-type-options: nosniff\r\n"
        b"x-request-id: local:00000000-0000-4000-8000-000000000000\r\n"
        b"content-length: 16\r\n"  # bytes, not characters
        b"Date: Thu, 15 Jan 2027 08:00:00 GMT\r\n"
        b"Connection: keep-alive\r\n"
        b"Keep-Alive: timeout=5\r\n"
        b"\r\n" + '{"b":1,"a":"é"}'.encode()
    )


def test_renders_connection_close() -> None:
    _, data = render_json_response(403, {"code": "forbidden"}, request_id="local:x", close=True, date="D")
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.endswith(b"content-length: 20\r\nconnection: close\r\nDate: D")
    assert b"Keep-Alive" not in head
    assert json.loads(body) == {"code": "forbidden"}


def test_rejects_oversize_response_body_with_503() -> None:
    status, data = render_json_response(200, {"x": "a" * 70000}, request_id="local:x", close=False)
    assert status == 503
    assert data.endswith(b'\r\n\r\n{"code":"response_unavailable"}')
    assert b"content-length: 31\r\n" in data


def test_rejects_unserialisable_response_body_with_503() -> None:
    status, _ = render_json_response(200, {"x": float("nan")}, request_id="local:x", close=False)
    assert status == 503


def test_bare_response_matches_node() -> None:
    assert render_bare_response(400) == b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n"
