"""The HTTP grammar both HTTP sides share (contracts/origin.py ``HTTP_*``; issue 27 item 5).

The Local API's request parser (local/http11.py) and the worker ingress client's response
parser (worker/ingress/http_exchange.py) read a field line by the same fragments: checked
byte by byte against RFC 9110, and by source so that neither spells its own again.
"""

from __future__ import annotations

import pathlib
import re

from qinglong_edge.contracts import origin
from qinglong_edge.errors import HttpProtocolError, TransportError
from qinglong_edge.local import http11
from qinglong_edge.worker.ingress import http_exchange

TCHAR = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
FIELD_VCHAR = frozenset(range(0x21, 0x7F)) | frozenset(range(0x80, 0x100))


def test_token_is_one_or_more_tchar() -> None:
    token = re.compile(origin.HTTP_TOKEN)
    assert token.fullmatch(b"") is None
    for byte in range(256):
        assert (token.fullmatch(bytes([byte])) is not None) == (byte in TCHAR), byte


def test_field_value_is_sp_htab_and_field_vchar() -> None:
    vchar = re.compile(b"[" + origin.HTTP_FIELD_VCHAR + b"]")
    assert origin.HTTP_FIELD_VALUE_RE.fullmatch(b"") is not None
    for byte in range(256):
        assert (vchar.fullmatch(bytes([byte])) is not None) == (byte in FIELD_VCHAR), byte
        allowed = byte in FIELD_VCHAR or byte in b" \t"
        assert (origin.HTTP_FIELD_VALUE_RE.fullmatch(bytes([byte])) is not None) == allowed, byte
    assert set(origin.HTTP_OWS) == set(b" \t")


def test_both_sides_read_a_field_line_alike() -> None:
    for line in (b"a: b", b"X-Y:\t v \t", b"a:", b"a b: c", b"a: b\x00", b"a: \x7f", b": b", b"a: \xff\x80"):
        local_error = None
        try:
            http11.parse_head(b"GET / HTTP/1.1\r\nhost: h\r\n" + line + b"\r\n\r\n")
        except HttpProtocolError as exc:
            local_error = exc
        response = b"HTTP/1.1 200 OK\r\n" + line + b"\r\n\r\n"
        try:
            http_exchange.parse_response_head(response)
            ingress_ok = True
        except TransportError:
            ingress_ok = False
        assert (local_error is None) == ingress_ok, (line, local_error)


def test_no_http_side_spells_the_grammar_again() -> None:
    for module in (http11, http_exchange):
        text = pathlib.Path(module.__file__ or "").read_text(encoding="utf-8")
        assert "^_`|~" not in text, module.__name__  # a tchar class of its own
        assert "\\x7e\\x80-\\xff" not in text, module.__name__  # a field-vchar class of its own
