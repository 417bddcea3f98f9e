"""Strict JSON: bytes in, plain Python values out, or one typed error.

Built on the stdlib decoder (C speed) with hooks and cheap passes around it:

1. size cap, strict UTF-8 (rejects invalid sequences and UTF-8-encoded surrogates);
2. a bracket scan (strings stripped by one linear regex, running depth computed in C)
   that rejects nesting deeper than ``max_depth`` *before* the recursive stdlib
   scanner runs, so ``RecursionError`` cannot happen;
3. fast path: ``json.loads`` with hooks that abort on a duplicate key, ``NaN``/
   ``Infinity``, a non-finite or underflowing float or an integer beyond 2^53-1;
   a valid document costs no Python pass over its values (the surrogate walk runs
   only when the text holds a ``\\uD800``-``\\uDFFF`` escape);
4. slow path, only for a document being rejected: decode again with hooks that leave
   markers, and one iterative walk that reports the first problem in document order
   with its JSON path.

Decisions (spec README, "Strictness"): duplicate keys, ``NaN``/``Infinity``, integers
beyond 2^53-1, invalid UTF-8, lone surrogates, depth > 32 and trailing data are all
rejected. Finite floats are returned as ``float``; contract validators reject them
where an integer is required (see :func:`qinglong_edge.contracts.fields.safe_int`).

Reason codes (``ContractError.code``): ``not_bytes``, ``too_small``, ``too_large``,
``invalid_utf8``, ``depth_exceeded``, ``invalid_json``, ``trailing_data``,
``duplicate_key``, ``non_finite_number``, ``integer_out_of_range``,
``lone_surrogate``.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate

from qinglong_edge.contracts.errors import ContractError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "MAX_DEPTH",
    "MAX_SAFE_INTEGER",
    "StrictJsonError",
    "dumps",
    "dumps_bytes",
    "format_path",
    "loads",
]

#: JS ``Number.MAX_SAFE_INTEGER``; the cluster's integers are all "safe ints".
MAX_SAFE_INTEGER = 2**53 - 1
#: Nesting cap (spec README): the deepest real document (an offer) is 5 levels.
MAX_DEPTH = 32


class StrictJsonError(ContractError):
    """The bytes are not strict JSON (see the module docstring for the codes)."""


class _Bad:
    """Marker left in the decoded tree by a hook; reported by the walk with a path."""

    __slots__ = ("code", "detail")

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        self.detail = detail


class _DupDict(dict[str, "Any"]):  # the string: Any exists only for the type checker
    """A decoded object that had a duplicate key (the hook cannot know its path)."""

    duplicate: str = ""


def _pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            dup = _DupDict(result)
            dup.duplicate = key
            return dup
        result[key] = value
    return result


def _parse_int(text: str) -> int | _Bad:
    # A 17-digit bound avoids int()'s 4300-digit ValueError and quadratic work.
    digits = text.lstrip("-")
    if len(digits) > 16:
        return _Bad("integer_out_of_range", "integer beyond 2^53-1")
    value = int(text)
    if abs(value) > MAX_SAFE_INTEGER:
        return _Bad("integer_out_of_range", "integer beyond 2^53-1")
    return value


#: Regular expressions only some documents need are kept as text and compiled on first
#: use (``re`` caches them): compiling them at import cost every ``pull`` ~0.7 ms.
_NONZERO_MANTISSA = r"-?0*\.?0*[1-9]"


def _parse_float(text: str) -> float | _Bad:
    value = float(text)
    if not math.isfinite(value):
        return _Bad("non_finite_number", "number overflows to infinity")
    if value == 0.0 and re.match(_NONZERO_MANTISSA, text):
        return _Bad("non_finite_number", "number underflows to zero")
    return value


def _parse_constant(text: str) -> _Bad:
    return _Bad("non_finite_number", f"{text} is not JSON")


class _Reject(Exception):  # internal control flow: never escapes loads()
    """Raised by a fast-path hook: leave the fast path and locate the problem."""


def _fast_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)  # C speed; a shorter dict means a duplicate key
    if len(result) != len(pairs):
        raise _Reject
    return result


def _fast_int(text: str) -> int:
    value = _parse_int(text)
    if isinstance(value, _Bad):
        raise _Reject
    return value


def _fast_float(text: str) -> float:
    value = _parse_float(text)
    if isinstance(value, _Bad):
        raise _Reject
    return value


def _fast_constant(text: str) -> float:
    raise _Reject


#: A JSON string, or an unterminated one running to the end of the text. It always
#: matches at a quote, so stripping strings is linear even on hostile input.
_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)'  # with re.DOTALL
_NOT_BRACKET = r"[^\[\]{}]+"
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_SURROGATE = "[\ud800-\udfff]"
#: A ``\uD800``-``\uDFFF`` escape: the only way a decoded string can hold a surrogate
#: (strict UTF-8 decoding already rejected encoded ones). Absent -> no surrogate walk.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _check_depth(text: str, max_depth: int) -> None:
    """Reject nesting deeper than ``max_depth`` before the recursive scanner runs.

    Strings are removed first (their brackets are not structure); the running depth
    over the remaining brackets is computed in C (``accumulate``), no per-character
    Python loop.
    """
    if text.count("[") + text.count("{") <= max_depth:
        return  # cannot nest deeper than the number of openers
    brackets = re.sub(_NOT_BRACKET, "", re.sub(_STRING, "", text, flags=re.DOTALL))
    if brackets and max(accumulate(map(_DEPTH_STEP.__getitem__, brackets))) > max_depth:
        raise StrictJsonError("depth_exceeded", "$", f"nesting deeper than {max_depth}")


def format_path(parts: tuple[str | int, ...]) -> str:
    """Render ``("offer", "lease", 0)`` as ``$.offer.lease[0]``.

    Keys that are not identifiers are quoted: ``$["a b"]``.
    """
    out = ["$"]
    for part in parts:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out.append(f".{part}")
        else:
            out.append("[" + json.dumps(part, ensure_ascii=True) + "]")
    return "".join(out)


def _walk(root: Any) -> None:
    surrogate = re.compile(_SURROGATE)
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(root, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, _Bad):
            raise StrictJsonError(value.code, format_path(path), value.detail)
        if isinstance(value, str):
            if surrogate.search(value):
                raise StrictJsonError("lone_surrogate", format_path(path), "lone surrogate")
        elif isinstance(value, dict):
            if isinstance(value, _DupDict):
                raise StrictJsonError(
                    "duplicate_key", format_path((*path, value.duplicate)), "duplicate key"
                )
            # Reverse so the first problem in document order is reported.
            for key, item in reversed(list(value.items())):
                if surrogate.search(key):
                    raise StrictJsonError(
                        "lone_surrogate", format_path(path), "lone surrogate in a key"
                    )
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            for index in range(len(value) - 1, -1, -1):
                stack.append((value[index], (*path, index)))


def loads(
    data: bytes | bytearray | memoryview,
    *,
    max_bytes: int,
    min_bytes: int = 1,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """Decode ``data`` as strict JSON.

    Args:
        data: the raw bytes, ``bytes``-like (UTF-8, no BOM; callers that must accept one BOM, as the
            Local API does, strip it first).
        max_bytes: size cap in bytes, checked before anything else.
        min_bytes: size floor in bytes (the offer contract uses 2).
        max_depth: nesting cap; 32 by default.

    Returns:
        ``dict`` / ``list`` / ``str`` / ``int`` / ``float`` / ``bool`` / ``None``.
        Objects keep their key order.

    Raises:
        StrictJsonError: for every rejection; nothing else escapes.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise StrictJsonError("not_bytes", "$", "input is not bytes")
    size = len(data)
    if size > max_bytes:
        raise StrictJsonError("too_large", "$", f"{size} bytes exceeds {max_bytes}")
    if size < min_bytes:
        raise StrictJsonError("too_small", "$", f"{size} bytes is below {min_bytes}")
    try:
        # str() decodes straight from the buffer: a bytearray body holding secrets is not
        # copied into an immutable bytes object first (the caller can zero it afterwards).
        text = str(data, "utf-8", "strict")
    except UnicodeDecodeError as exc:
        raise StrictJsonError("invalid_utf8", "$", f"invalid UTF-8 at byte {exc.start}") from None
    _check_depth(text, max_depth)
    try:
        value = _decode(text, fast=True)
    except _Reject:
        # Only for a document being rejected: decode again leaving markers, and walk
        # to report the first problem in document order with its JSON path.
        _walk(_decode(text, fast=False))
        raise StrictJsonError("invalid_json", "$", "rejected value") from None  # unreachable in practice
    if _SURROGATE_ESCAPE.search(text):
        _walk(value)
    return value


def _decode(text: str, *, fast: bool) -> Any:
    """``json.loads`` with the fast (raising) or locating (marker) hooks; errors mapped."""
    try:
        if fast:
            return json.loads(text, object_pairs_hook=_fast_pairs, parse_int=_fast_int,
                              parse_float=_fast_float, parse_constant=_fast_constant)
        return json.loads(text, object_pairs_hook=_pairs_hook, parse_int=_parse_int,
                          parse_float=_parse_float, parse_constant=_parse_constant)
    except json.JSONDecodeError as exc:
        code = "trailing_data" if exc.msg.startswith("Extra data") else "invalid_json"
        raise StrictJsonError(code, "$", f"{exc.msg} at offset {exc.pos}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # defensive: never escape
        raise StrictJsonError("invalid_json", "$", type(exc).__name__) from None


def dumps(value: Any) -> str:
    """Serialize like JS ``JSON.stringify``: compact, keys in insertion order.

    Byte-identical to Node for the values our contracts hold (offer-delivery.md
    section 2.4: escapes ``"``, ``\\``, ``\\b \\t \\n \\f \\r`` and other C0 controls as
    ``\\u00xx``; no escaping of ``/``, U+007F, U+2028/2029 or non-ASCII).

    Raises:
        StrictJsonError: ``non_finite_number`` for NaN/Infinity, ``invalid_json`` for
            values JSON cannot hold.
    """
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise StrictJsonError("non_finite_number", "$", "NaN or Infinity") from None
    except (TypeError, RecursionError):
        raise StrictJsonError("invalid_json", "$", "value is not JSON-serializable") from None


def dumps_bytes(value: Any) -> bytes:
    """:func:`dumps` encoded as UTF-8 (strict: a lone surrogate raises).

    Raises:
        StrictJsonError: as :func:`dumps`, or ``lone_surrogate``.
    """
    try:
        return dumps(value).encode("utf-8")
    except UnicodeEncodeError:
        raise StrictJsonError("lone_surrogate", "$", "lone surrogate") from None
