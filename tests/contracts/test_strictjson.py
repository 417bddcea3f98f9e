"""Strict JSON decoding: every reason code, JSON paths, the depth and integer boundaries."""

from __future__ import annotations

import pytest

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.strictjson import (
    MAX_DEPTH,
    MAX_SAFE_INTEGER,
    StrictJsonError,
    dumps,
    dumps_bytes,
    format_path,
    loads,
)


def code_of(data: object, **kwargs: int) -> tuple[str, str]:
    kwargs.setdefault("max_bytes", 1 << 20)
    with pytest.raises(StrictJsonError) as info:
        loads(data, **kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ContractError)
    return info.value.code, info.value.path


@pytest.mark.parametrize(
    ("data", "kwargs", "code", "path"),
    [
        ("{}", {}, "not_bytes", "$"),
        (b"{}", {"max_bytes": 1}, "too_large", "$"),
        (b"1", {"min_bytes": 2}, "too_small", "$"),
        (b"", {}, "too_small", "$"),
        (b'{"a":"\xff"}', {}, "invalid_utf8", "$"),
        (b'"\xed\xa0\x80"', {}, "invalid_utf8", "$"),  # UTF-8-encoded surrogate
        (b"[" * 33 + b"]" * 33, {}, "depth_exceeded", "$"),
        (b'{"a":}', {}, "invalid_json", "$"),
        (b"{} {}", {}, "trailing_data", "$"),
        (b'{"a":{"b":1,"b":2}}', {}, "duplicate_key", "$.a.b"),
        (b'{"a":[1,NaN]}', {}, "non_finite_number", "$.a[1]"),
        (b'{"a":-Infinity}', {}, "non_finite_number", "$.a"),
        (b'{"a":1e400}', {}, "non_finite_number", "$.a"),
        (b'{"a":1e-400}', {}, "non_finite_number", "$.a"),
        (b'{"a":[0,9007199254740992]}', {}, "integer_out_of_range", "$.a[1]"),
        (b'{"a":"x\\ud800"}', {}, "lone_surrogate", "$.a"),
        (b'{"\\udc00":1}', {}, "lone_surrogate", "$"),
        (b"\xef\xbb\xbf{}", {}, "invalid_json", "$"),  # a BOM is not JSON (the Local API strips it first)
    ],
    ids=[
        "not-bytes", "too-large", "too-small", "empty", "invalid-utf8", "utf8-surrogate", "depth", "syntax",
        "trailing", "duplicate", "nan", "infinity", "overflow", "underflow", "big-int", "lone-surrogate",
        "surrogate-key", "bom",
    ],
)
def test_rejects_with_reason_and_path(data: object, kwargs: dict[str, int], code: str, path: str) -> None:
    assert code_of(data, **kwargs) == (code, path)


def test_depth_32_is_accepted_and_33_rejected() -> None:
    assert MAX_DEPTH == 32
    assert loads(b"[" * 32 + b"]" * 32, max_bytes=100) == eval("[" * 32 + "]" * 32)  # noqa: S307 - literal
    assert code_of(b"[" * 33 + b"]" * 33)[0] == "depth_exceeded"
    assert code_of(b'{"a":' * 33 + b"1" + b"}" * 33)[0] == "depth_exceeded"


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    text = b'["' + b"[" * 100 + b'\\"' + b"{" * 100 + b'"]'
    assert loads(text, max_bytes=1000) == ["[" * 100 + '"' + "{" * 100]


def test_deep_nesting_never_raises_recursion_error() -> None:
    assert code_of(b"[" * 100_000)[0] == "depth_exceeded"


@pytest.mark.parametrize("value", [MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, 0, -0])
def test_accepts_safe_integer_boundaries(value: int) -> None:
    assert loads(str(value).encode(), max_bytes=100) == value


@pytest.mark.parametrize("text", [b"9007199254740992", b"-9007199254740992", b"1" * 5000, b"-" + b"9" * 17])
def test_rejects_integers_beyond_2_53(text: bytes) -> None:
    assert code_of(text)[0] == "integer_out_of_range"


def test_floats_are_returned_as_floats_for_the_contracts_to_reject() -> None:
    assert loads(b"[1.0,1e0,-0.5]", max_bytes=100) == [1.0, 1.0, -0.5]
    assert all(type(v) is float for v in loads(b"[1.0,1e0]", max_bytes=100))


def test_reports_the_first_problem_in_document_order() -> None:
    assert code_of(b'{"a":NaN,"b":"\\ud800"}') == ("non_finite_number", "$.a")


def test_keeps_key_order_and_unicode() -> None:
    value = loads('{"z":1,"a":"é\u2028/"}'.encode(), max_bytes=100)
    assert list(value) == ["z", "a"]
    assert dumps(value) == '{"z":1,"a":"é\u2028/"}'


def test_dumps_matches_js_escaping() -> None:
    assert dumps({"s": "\b\t\n\f\r\x01\x7f\"\\/"}) == '{"s":"\\b\\t\\n\\f\\r\\u0001\x7f\\"\\\\/"}'


def test_dumps_rejects_values_json_cannot_hold() -> None:
    with pytest.raises(StrictJsonError) as info:
        dumps({"a": float("nan")})
    assert info.value.code == "non_finite_number"
    with pytest.raises(StrictJsonError) as info:
        dumps({"a": object()})
    assert info.value.code == "invalid_json"
    with pytest.raises(StrictJsonError) as info:
        dumps_bytes({"a": "\ud800"})
    assert info.value.code == "lone_surrogate"


def test_format_path_quotes_non_identifiers() -> None:
    assert format_path(("offer", "lease", 0)) == "$.offer.lease[0]"
    assert format_path(("a b",)) == '$["a b"]'


def test_unterminated_strings_are_rejected_whatever_they_hold() -> None:
    assert code_of(b'"' + b'\\"' * 50_000)[0] == "invalid_json"
    assert code_of(b'["' + b"[" * 100)[0] == "invalid_json"
    assert code_of(b"[" * 40 + b'"' + b"]" * 40)[0] == "depth_exceeded"
    assert code_of(b'["abc\\')[0] == "invalid_json"


def test_surrogate_escapes_pass_only_as_pairs() -> None:
    assert loads(b'["\\ud83d\\ude00", "\\\\ud800"]', max_bytes=100) == ["\U0001f600", "\\ud800"]
    assert code_of(b'{"a":["ok","\\uDBFF"]}') == ("lone_surrogate", "$.a[1]")


def test_a_nested_problem_is_reported_after_the_duplicate_that_holds_it() -> None:
    # Document order: the duplicate key of the outer object comes before its values.
    assert code_of(b'{"a":1,"a":{"x":NaN}}') == ("duplicate_key", "$.a")
    assert code_of(b'{"a":{"x":NaN},"b":1,"b":2}') == ("duplicate_key", "$.b")
    assert code_of(b'[{"x":[1e999]},{"y":1,"y":1}]') == ("non_finite_number", "$[0].x[0]")


@pytest.mark.parametrize("text", [b"0.0e-400", b"-0.0", b"0e5", b"0.000"])
def test_zero_is_not_an_underflow(text: bytes) -> None:
    assert loads(text, max_bytes=100) == 0.0


@pytest.mark.parametrize("text", [b"1e-400", b"-0.5e-400", b"0.00001e-330", b"10E-400"])
def test_rejects_a_float_that_underflows(text: bytes) -> None:
    assert code_of(text)[0] == "non_finite_number"
