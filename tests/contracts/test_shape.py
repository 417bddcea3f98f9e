"""Shared shape helpers: JSON paths, JS string length, exact key sets."""

from __future__ import annotations

import pytest

from qinglong_edge.contracts._shape import child, exact_keys, int_value, nul_free_text, utf8_length
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import js_length


@pytest.mark.parametrize(
    ("key", "path"),
    [("a", "$.a"), ("_a1", "$._a1"), (3, "$[3]"), ("a b", '$["a b"]'), ("1a", '$["1a"]'), ("é", '$["\\u00e9"]'),
     ("", '$[""]'), ("x" * 200, '$["' + "x" * 128 + '..."]')],
)
def test_child_paths(key: str | int, path: str) -> None:
    assert child("$", key) == path


@pytest.mark.parametrize(("text", "length"), [("", 0), ("abc", 3), ("é", 1), ("\U0001f600", 2), ("a\U0001f600b", 4)])
def test_js_length_counts_utf16_units(text: str, length: int) -> None:
    assert js_length(text) == length


def test_utf8_length() -> None:
    assert [utf8_length(t) for t in ("", "a", "é", "\U0001f600")] == [0, 1, 2, 4]


def test_exact_keys_reports_unknown_before_missing() -> None:
    with pytest.raises(ContractError) as info:
        exact_keys({"b": 1, "x": 2}, ("a", "b"), "$")
    assert (info.value.code, info.value.path) == ("key_set", "$.x")
    with pytest.raises(ContractError) as info:
        exact_keys({"b": 1}, ("a", "b"), "$", code="claim_conflict")
    assert (info.value.code, info.value.path) == ("claim_conflict", "$.a")
    exact_keys({"a": 1}, ("a",), "$", ("b",))


@pytest.mark.parametrize(("value", "code"), [(True, "not_integer"), (1.0, "not_integer"), (-1, "out_of_range"),
                                             (2**53, "out_of_range")])
def test_int_value_is_strict(value: object, code: str) -> None:
    with pytest.raises(ContractError) as info:
        int_value(value, "$.n")
    assert info.value.code == code


def test_nul_free_text_allows_other_controls() -> None:
    assert nul_free_text("a\tb\n", "$", min_bytes=0, max_bytes=10) == "a\tb\n"
    with pytest.raises(ContractError) as info:
        nul_free_text("a\x00", "$", min_bytes=0, max_bytes=10)
    assert info.value.code == "control_character"
    with pytest.raises(ContractError) as info:
        nul_free_text("éé", "$", min_bytes=0, max_bytes=3)
    assert info.value.code == "length"
