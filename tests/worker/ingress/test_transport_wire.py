"""Sans-IO response reading of the ingress client (offer-delivery.md 1.3, 1.6, 1.7)."""

from __future__ import annotations

import email.utils

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qinglong_edge.errors import TransportError
from qinglong_edge.worker.ingress.http_exchange import (
    MAX_HEAD_BYTES,
    MAX_RETRY_AFTER_MS,
    ChunkedBody,
    CloseDelimitedBody,
    LengthBody,
    ResponseHead,
    accept_head,
    is_ingress_path,
    parse_response_head,
    retry_after_ms,
)
from tests.support.transport_env import OFFER_PATH, SESSION_ID

NOW_MS = 1_700_000_000_000
JSON = b"Content-Type: application/json; charset=utf-8\r\n"


def head(*lines: str | bytes, status: bytes = b"HTTP/1.1 200 OK") -> bytes:
    encoded = [line.encode("latin-1") if isinstance(line, str) else line for line in lines]
    return b"\r\n".join([status, *encoded]) + b"\r\n\r\n"


def rejected(data: bytes, cap: int = 131_072) -> TransportError:
    with pytest.raises(TransportError) as info:
        accept_head(parse_response_head(data), cap, NOW_MS)
    return info.value


# -- path grammar ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "op", ["register", "heartbeat", "transition", "offers", "starting", "running", "start-failure",
           "secrets", "completion", "lease-control"],
)
def test_accepts_every_json_route(op: str) -> None:
    assert is_ingress_path(f"/api/v3/worker-ingress/workers/edge-1/sessions/{SESSION_ID}/{op}")


@pytest.mark.parametrize(
    "path",
    [
        OFFER_PATH + "?x=1",
        OFFER_PATH + "#f",
        OFFER_PATH + "/",
        OFFER_PATH.replace("/offers", "/artifacts"),
        OFFER_PATH.replace("edge-1", "-edge"),
        OFFER_PATH.replace("edge-1", "edge%2F1"),
        OFFER_PATH.replace(SESSION_ID, SESSION_ID.upper()),
        OFFER_PATH.replace(SESSION_ID, "01890a5d-ac96-474b-bcce-b302099a8057"),  # v4, not v7
        "/api/v3/worker-ingress/workers/edge-1/sessions//offers",
        "https://cluster.test" + OFFER_PATH,
        OFFER_PATH + "\n",
        "",
    ],
    ids=["query", "fragment", "slash", "artifacts", "bad-worker", "percent", "upper-session",
         "uuid4-session", "empty-session", "absolute", "newline", "empty"],
)
def test_rejects_path(path: str) -> None:
    assert not is_ingress_path(path)


def test_rejects_non_string_path() -> None:
    assert not is_ingress_path(OFFER_PATH.encode())


# -- head grammar ----------------------------------------------------------------------


def test_parses_a_cluster_head() -> None:
    parsed = parse_response_head(head("Content-Type: application/json; charset=utf-8", "Content-Length:  12 ",
                                      "X-Request-Id: abc"))
    assert parsed == ResponseHead(
        minor_version=1,
        status=200,
        fields=(("content-type", "application/json; charset=utf-8"), ("content-length", "12"),
                ("x-request-id", "abc")),
    )
    assert parsed.keep_alive


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n \tfolded\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Type : application/json\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\nContent-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n: empty-name\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
        b"HTTP/1.1 200 OK\n\n",
        b"HTTP/1.1 200 OK\r\n\r\nX: not-head",
    ],
    ids=["obs-fold", "space-before-colon", "no-colon", "bare-cr", "bare-lf", "nul", "empty-name",
         "space-in-name", "lf-only", "not-terminated"],
)
def test_rejects_malformed_field(data: bytes) -> None:
    with pytest.raises(TransportError) as info:
        parse_response_head(data)
    assert info.value.code == "response_rejected"


@pytest.mark.parametrize(
    "status_line",
    [b"HTTP/2 200 OK", b"HTTP/1.2 200 OK", b"http/1.1 200 OK", b"HTTP/1.1 20 OK", b"HTTP/1.1 2000 OK",
     b"HTTP/1.1 +20 OK", b"HTTP/1.1  200 OK", b"HTTP/1.1 099 Low", b"ICY 200 OK", b""],
    ids=["h2", "1.2", "lower", "2-digit", "4-digit", "sign", "double-space", "below-100", "icy", "empty"],
)
def test_rejects_malformed_status_line(status_line: bytes) -> None:
    with pytest.raises(TransportError) as info:
        parse_response_head(status_line + b"\r\n\r\n")
    assert info.value.code == "response_rejected"
    assert info.value.http_status is None


def test_accepts_status_line_without_reason() -> None:
    assert parse_response_head(b"HTTP/1.1 200\r\n\r\n").status == 200


def test_rejects_oversized_head() -> None:
    data = head("X: " + "a" * MAX_HEAD_BYTES)
    with pytest.raises(TransportError) as info:
        parse_response_head(data)
    assert info.value.code == "response_rejected"


def test_rejects_too_many_fields() -> None:
    with pytest.raises(TransportError) as info:
        parse_response_head(head(*[f"X-{i}: {i}" for i in range(101)]))
    assert info.value.http_status == 200


@pytest.mark.parametrize(
    ("data", "keep"),
    [
        (head("Connection: close"), False),
        (head("Connection: Keep-Alive, CLOSE"), False),
        (head("Connection: keep-alive"), True),
        (head(status=b"HTTP/1.0 200 OK"), False),
    ],
    ids=["close", "close-in-list", "keep-alive", "http-1.0"],
)
def test_keep_alive(data: bytes, keep: bool) -> None:
    assert parse_response_head(data).keep_alive is keep


@given(st.binary(max_size=600))
@settings(max_examples=300, deadline=None)
def test_head_parser_raises_only_transport_errors(data: bytes) -> None:
    for candidate in (data, data + b"\r\n\r\n", b"HTTP/1.1 200 OK\r\n" + data + b"\r\n\r\n"):
        try:
            parsed = parse_response_head(candidate)
        except TransportError as exc:
            assert exc.code == "response_rejected"
            continue
        for name, value in parsed.fields:
            assert name == name.lower() and "\r" not in value and "\n" not in value


_TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12)
_VALUE = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=20)


@given(st.lists(st.tuples(_TOKEN, _VALUE), max_size=20))
@settings(max_examples=200, deadline=None)
def test_head_parser_round_trips_valid_fields(fields: list[tuple[str, str]]) -> None:
    data = head(*[f"{name}: {value}" for name, value in fields])
    assert parse_response_head(data).fields == tuple((name, value) for name, value in fields)


# -- acceptance rules (section 1.6) ----------------------------------------------------


@pytest.mark.parametrize("status", [201, 204, 302, 401, 404, 409, 500, 101, 100])
def test_rejects_status_other_than_200(status: int) -> None:
    error = rejected(head("Location: https://elsewhere/", status=f"HTTP/1.1 {status} X".encode()))
    assert (error.code, error.http_status, error.retry_after_ms) == ("response_rejected", status, None)


@pytest.mark.parametrize(
    "value",
    ["text/plain", "application/jsonx", "application/json-seq", "text/json", "application/problem+json", ""],
)
def test_rejects_content_type(value: str) -> None:
    error = rejected(head(f"Content-Type: {value}", "Content-Length: 2"))
    assert (error.code, error.http_status) == ("response_rejected", 200)


@pytest.mark.parametrize("value", ["application/json", "APPLICATION/JSON", "application/json;charset=utf-8",
                                   "application/json ; charset=utf-8", "Application/Json; x=y"])
def test_accepts_json_media_type(value: str) -> None:
    decoder = accept_head(parse_response_head(head(f"Content-Type: {value}", "Content-Length: 2")), 10, NOW_MS)
    assert isinstance(decoder, LengthBody)


def test_rejects_missing_and_duplicate_content_type() -> None:
    assert rejected(head("Content-Length: 2")).code == "response_rejected"
    assert rejected(head("Content-Type: application/json", "Content-Type: application/json")).http_status == 200


@pytest.mark.parametrize("values", [["gzip"], ["identity", "identity"], ["Identity"], ["br"], [""]],
                         ids=["gzip", "twice", "case", "br", "empty"])
def test_rejects_content_encoding(values: list[str]) -> None:
    error = rejected(head(JSON.decode().strip(), *[f"Content-Encoding: {v}" for v in values]))
    assert (error.code, error.http_status) == ("response_rejected", 200)


def test_accepts_identity_content_encoding() -> None:
    accept_head(parse_response_head(head(JSON.decode().strip(), "Content-Encoding: identity")), 10, NOW_MS)


@pytest.mark.parametrize(
    "lengths",
    [["131073"], ["12a"], ["1_0"], ["+12"], ["-1"], ["0x10"], ["12", "12"], ["12, 12"], [""],
     ["1" + "0" * 5000], ["00000000000000000131073"]],
    ids=["over-cap", "12a", "underscore", "plus", "negative", "hex", "duplicate", "list", "empty",
         "huge", "zero-padded-over-cap"],
)
def test_rejects_content_length(lengths: list[str]) -> None:
    error = rejected(head(JSON.decode().strip(), *[f"Content-Length: {v}" for v in lengths]))
    assert (error.code, error.http_status) == ("response_rejected", 200)


def test_accepts_content_length_at_cap_with_leading_zeros() -> None:
    decoder = accept_head(parse_response_head(head(JSON.decode().strip(), "Content-Length: 000131072")),
                          131_072, NOW_MS)
    assert isinstance(decoder, LengthBody) and decoder.remaining == 131_072


@pytest.mark.parametrize(
    "lines",
    [["Transfer-Encoding: gzip, chunked"], ["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"],
     ["Transfer-Encoding: chunked", "Content-Length: 5"], ["Transfer-Encoding: identity"]],
    ids=["gzip-chunked", "twice", "with-content-length", "identity"],
)
def test_rejects_transfer_encoding(lines: list[str]) -> None:
    assert rejected(head(JSON.decode().strip(), *lines)).code == "response_rejected"


def test_rejects_chunked_http_1_0() -> None:
    data = head(JSON.decode().strip(), "Transfer-Encoding: chunked", status=b"HTTP/1.0 200 OK")
    assert rejected(data).code == "response_rejected"


def test_framing_choice() -> None:
    chunked = accept_head(parse_response_head(head(JSON.decode().strip(), "Transfer-Encoding: Chunked")), 9, 0)
    close = accept_head(parse_response_head(head(JSON.decode().strip())), 9, 0)
    assert isinstance(chunked, ChunkedBody) and chunked.reusable
    assert isinstance(close, CloseDelimitedBody) and not close.reusable


# -- Retry-After -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "value", "expected"),
    [
        (503, "7", 7000),
        (429, "0", 0),
        (503, "86401", MAX_RETRY_AFTER_MS),
        (503, "9" * 40, MAX_RETRY_AFTER_MS),
        (503, email.utils.formatdate((NOW_MS + 90_000) / 1000, usegmt=True), 90_000),
        (429, email.utils.formatdate((NOW_MS - 90_000) / 1000, usegmt=True), 0),
        (503, "Tuesday, 14-Nov-23 22:15:00 GMT", 1_700_000_100_000 - NOW_MS),
        (503, "Tue Nov 14 22:15:00 2023", 1_700_000_100_000 - NOW_MS),
        (503, "soon", None),
        (503, "-5", None),
        (503, "1.5", None),
        (409, "7", None),
        (500, "7", None),
    ],
    ids=["seconds", "zero", "clamped", "huge", "imf-date", "past-date", "rfc850", "asctime", "garbage",
         "negative", "fraction", "409-ignored", "500-ignored"],
)
def test_retry_after(status: int, value: str, expected: int | None) -> None:
    parsed = parse_response_head(head(f"Retry-After: {value}", status=f"HTTP/1.1 {status} X".encode()))
    assert retry_after_ms(parsed, NOW_MS) == expected


def test_retry_after_twice_is_ignored() -> None:
    parsed = parse_response_head(head("Retry-After: 1", "Retry-After: 2", status=b"HTTP/1.1 503 X"))
    assert retry_after_ms(parsed, NOW_MS) is None


def test_rejection_carries_retry_after() -> None:
    error = rejected(head("Retry-After: 3", status=b"HTTP/1.1 429 Too Many Requests"))
    assert (error.code, error.http_status, error.retry_after_ms) == ("response_rejected", 429, 3000)


# -- body decoders ---------------------------------------------------------------------


def feed_all(decoder: LengthBody | ChunkedBody | CloseDelimitedBody, data: bytes, step: int) -> None:
    for offset in range(0, len(data), step):
        decoder.feed(data[offset : offset + step])


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_length_body(step: int) -> None:
    decoder = LengthBody(11, 100)
    feed_all(decoder, b'{"ok":true}', step)
    assert decoder.done and decoder.finish() == b'{"ok":true}'


def test_rejects_length_body_longer_than_declared() -> None:
    decoder = LengthBody(2, 100)
    with pytest.raises(TransportError) as info:
        decoder.feed(b"{}x")
    assert info.value.code == "response_too_large"


def test_rejects_truncated_length_body() -> None:
    decoder = LengthBody(5, 100)
    decoder.feed(b"{}")
    with pytest.raises(TransportError) as info:
        decoder.eof()
    assert (info.value.code, info.value.http_status) == ("response_rejected", 200)


@pytest.mark.parametrize("body", [b"", b"{"], ids=["empty", "one-byte"])
def test_rejects_short_body(body: bytes) -> None:
    decoder = LengthBody(len(body), 100)
    decoder.feed(body)
    with pytest.raises(TransportError) as info:
        decoder.finish()
    assert info.value.code == "response_rejected"


def test_close_delimited_body_caps_as_it_streams() -> None:
    decoder = CloseDelimitedBody(4)
    decoder.feed(b"{}")
    decoder.feed(b"  ")
    with pytest.raises(TransportError) as info:
        decoder.feed(b" ")
    assert info.value.code == "response_too_large"


def chunked(*chunks: bytes, trailer: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n" + trailer + b"\r\n"


@pytest.mark.parametrize("step", [1, 2, 7, 10_000])
def test_chunked_body(step: int) -> None:
    decoder = ChunkedBody(100)
    feed_all(decoder, chunked(b'{"o', b'k":', b"true}", trailer=b"X-Trailer: 1\r\n"), step)
    assert decoder.done and decoder.finish() == b'{"ok":true}'


def test_chunked_body_with_extension_and_upper_hex() -> None:
    decoder = ChunkedBody(100)
    decoder.feed(b"B;name=value\r\n{\"ok\":true}\r\n0\r\n\r\n")
    assert decoder.finish() == b'{"ok":true}'


@pytest.mark.parametrize(
    "data",
    [b"0x2\r\n{}\r\n0\r\n\r\n", b"+2\r\n{}\r\n0\r\n\r\n", b"1_0\r\n", b" 2\r\n{}\r\n0\r\n\r\n",
     b"2\r\n{}XX0\r\n\r\n", b"\r\n", b"2\n{}\r\n0\r\n\r\n", b"2\r\n{}\r\n0\r\nbad trailer\r\n\r\n",
     b"g\r\n"],
    ids=["0x", "plus", "underscore", "leading-space", "no-crlf-after-data", "empty-size", "bare-lf",
         "bad-trailer", "not-hex"],
)
def test_rejects_malformed_chunked(data: bytes) -> None:
    decoder = ChunkedBody(100)
    with pytest.raises(TransportError) as info:
        decoder.feed(data)
    assert info.value.code == "response_rejected"


def test_rejects_chunk_size_line_without_end() -> None:
    decoder = ChunkedBody(100)
    with pytest.raises(TransportError):
        decoder.feed(b"2;" + b"x" * 5000)


def test_rejects_chunk_larger_than_cap_before_reading_it() -> None:
    decoder = ChunkedBody(131_072)
    with pytest.raises(TransportError) as info:
        decoder.feed(b"20001\r\n")  # 131 073 declared, no data sent yet
    assert info.value.code == "response_too_large"


def test_rejects_chunked_body_longer_than_cap() -> None:
    decoder = ChunkedBody(10)
    decoder.feed(b"6\r\n{\"a\":1\r\n")
    with pytest.raises(TransportError) as info:
        decoder.feed(b"6\r\n")
    assert info.value.code == "response_too_large"


def test_rejects_bytes_after_last_chunk() -> None:
    decoder = ChunkedBody(100)
    with pytest.raises(TransportError) as info:
        decoder.feed(chunked(b"{}") + b"HTTP/1.1 200 OK\r\n")
    assert info.value.code == "response_too_large"


def test_rejects_endless_empty_extensions() -> None:
    decoder = ChunkedBody(100)
    with pytest.raises(TransportError) as info:
        for _ in range(10_000):
            decoder.feed(b"1;" + b"e" * 60 + b"\r\nx\r\n")
    assert info.value.code == "response_too_large"


@given(st.lists(st.binary(min_size=1, max_size=40), max_size=12), st.integers(min_value=1, max_value=64))
@settings(max_examples=200, deadline=None)
def test_chunked_round_trip(chunks: list[bytes], step: int) -> None:
    decoder = ChunkedBody(10_000)
    feed_all(decoder, chunked(*chunks), step)
    assert decoder.done
    joined = b"".join(chunks)
    if len(joined) >= 2:
        assert decoder.finish() == joined


@given(st.binary(max_size=300), st.integers(min_value=2, max_value=64))
@settings(max_examples=300, deadline=None)
def test_chunked_decoder_raises_only_transport_errors(data: bytes, cap: int) -> None:
    decoder = ChunkedBody(cap)
    try:
        decoder.feed(data)
    except TransportError as exc:
        assert exc.code in ("response_rejected", "response_too_large")
