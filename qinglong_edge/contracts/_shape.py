"""Small shape helpers shared by the wire-contract modules (private).

Every helper takes the value and its JSON path and returns the value or raises
:class:`~qinglong_edge.contracts.errors.ContractError`. They complement
:mod:`qinglong_edge.contracts.fields` with what the offer, session and journal
contracts need on top: JSON paths for arbitrary keys, exact key sets with proper
paths, "text without NUL within N UTF-8 bytes" (the reference's ``assertBoundedText``)
and strict type checks that never let ``True == 1`` or ``2.0 == 2`` through.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import MAX_SAFE_INTEGER

__all__ = [
    "child",
    "exact_keys",
    "int_value",
    "is_int",
    "nul_free_text",
    "object_value",
    "utf8_length",
]

#: Longest key rendered verbatim in an error path; longer keys are cut (paths are
#: diagnostics printed to operators, not a channel for a peer's megabyte key).
_MAX_PATH_KEY = 128


def child(path: str, key: str | int) -> str:
    """The JSON path of ``key`` under ``path``: ``$.a``, ``$.a[3]``, ``$["x y"]``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if len(key) <= _MAX_PATH_KEY and key.isascii() and key.isidentifier():  # [A-Za-z_][A-Za-z0-9_]*
        return f"{path}.{key}"
    shown = key if len(key) <= _MAX_PATH_KEY else key[:_MAX_PATH_KEY] + "..."
    return f"{path}[{json.dumps(shown, ensure_ascii=True)}]"


def is_int(value: object) -> bool:
    """True for a Python ``int`` that is not a ``bool`` (strict JSON integers only)."""
    return type(value) is int


def object_value(value: object, path: str) -> dict[str, Any]:
    """Require a JSON object (``dict``). Code ``not_object``."""
    if not isinstance(value, dict):
        raise ContractError("not_object", path, "must be an object")
    return value


def exact_keys(
    obj: Mapping[str, Any],
    required: Collection[str],
    path: str,
    optional: Collection[str] = (),
    *,
    code: str = "key_set",
) -> None:
    """Require every key of ``required`` and nothing outside ``required | optional``.

    Unknown keys are reported first (in document order), then the first missing one.
    """
    for key in obj:
        if key not in required and key not in optional:
            raise ContractError(code, child(path, key), "unknown key")
    if len(obj) < len(required) or any(key not in obj for key in required):
        for key in required:
            if key not in obj:
                raise ContractError(code, child(path, key), "missing key")


def int_value(
    value: object,
    path: str,
    low: int = 0,
    high: int = MAX_SAFE_INTEGER,
    *,
    code: str = "out_of_range",
) -> int:
    """A JSON integer (never bool, never float) in ``low..high``.

    Codes: ``not_integer``, then ``code`` (default ``out_of_range``) for the range.
    """
    if type(value) is not int:
        raise ContractError("not_integer", path, "must be an integer")
    if not low <= value <= high:
        raise ContractError(code, path, f"must be {low}..{high}")
    return value


def utf8_length(text: str) -> int:
    """UTF-8 byte length (Node ``Buffer.byteLength``), ASCII fast path."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def nul_free_text(value: object, path: str, *, min_bytes: int, max_bytes: int) -> str:
    """A string without U+0000 whose UTF-8 length is ``min_bytes..max_bytes``.

    The reference's ``assertBoundedText`` (other control characters are allowed).
    Codes: ``not_string``, ``length``, ``control_character``.
    """
    if not isinstance(value, str):
        raise ContractError("not_string", path, "must be a string")
    size = utf8_length(value)
    if not min_bytes <= size <= max_bytes:
        raise ContractError("length", path, f"must be {min_bytes}..{max_bytes} UTF-8 bytes")
    if "\x00" in value:
        raise ContractError("control_character", path, "NUL is not allowed")
    return value
