"""Field validators shared by every contract: bytes-free, pure, typed errors only.

Every function takes the value and its JSON path (for the error) and returns the
validated value or raises :class:`~qinglong_edge.contracts.errors.ContractError`
with a stable code:

``not_object``, ``not_array``, ``not_string``, ``not_integer``, ``not_boolean``,
``key_set`` (missing or unknown keys), ``out_of_range``, ``length``, ``control_character``,
``pattern``.

Integers follow the cluster's "safe int" (offer-delivery.md section 0): a JSON integer
with ``|x| <= 2^53-1``; booleans and floats (even integral ones such as ``1.0``) are
rejected: a deliberate tightening (spec README, "Strictness").
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from qinglong_edge.contracts.digest import sha256_hex as _sha256_hex
from qinglong_edge.contracts.errors import ContractError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "MAX_INT32",
    "MAX_SAFE_INTEGER",
    "boolean",
    "dispatch_id",
    "exact_keys",
    "has_control",
    "js_length",
    "require_array",
    "require_object",
    "safe_int",
    "sha256_hex",
    "string",
]

MAX_SAFE_INTEGER = 2**53 - 1
MAX_INT32 = 2**31 - 1
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def js_length(text: str) -> int:
    """JS ``string.length``: UTF-16 code units (astral characters count 2)."""
    if text.isascii():
        return len(text)
    # C speed; surrogatepass keeps a (rejected elsewhere) lone surrogate countable.
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def has_control(text: str) -> bool:
    """True when ``text`` holds U+0000-U+001F or U+007F ("ctrl" in the spec)."""
    return _CONTROL.search(text) is not None


def require_object(value: object, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ContractError("not_object", path, "must be an object")
    return value


def require_array(value: object, path: str, max_items: int | None = None) -> list[Any]:
    if not isinstance(value, list):
        raise ContractError("not_array", path, "must be an array")
    if max_items is not None and len(value) > max_items:
        raise ContractError("length", path, f"at most {max_items} entries")
    return value


def exact_keys(obj: Mapping[str, Any], keys: Collection[str], path: str, optional: Collection[str] = ()) -> None:
    """Require ``obj`` to hold every key of ``keys``, and nothing outside ``keys | optional``."""
    allowed = set(keys) | set(optional)
    for key in obj:
        if key not in allowed:
            raise ContractError("key_set", f"{path}.{key}", "unknown key")
    for key in keys:
        if key not in obj:
            raise ContractError("key_set", f"{path}.{key}", "missing key")


def safe_int(value: object, path: str, low: int = 0, high: int = MAX_SAFE_INTEGER) -> int:
    """A JSON integer (not bool, not float) within ``low..high`` inclusive."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ContractError("not_integer", path, "must be an integer")
    if not low <= value <= high:
        raise ContractError("out_of_range", path, f"must be {low}..{high}")
    return value


def boolean(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise ContractError("not_boolean", path, "must be a boolean")
    return value


def string(
    value: object,
    path: str,
    *,
    min_length: int = 1,
    max_length: int,
    pattern: re.Pattern[str] | None = None,
    control: bool = False,
    utf8_bytes: bool = False,
) -> str:
    """A string whose length is within bounds.

    Args:
        min_length / max_length: bounds in JS length (UTF-16 units), or in UTF-8 bytes
            when ``utf8_bytes``.
        pattern: if given, must ``fullmatch``.
        control: allow control characters (default: reject them).
    """
    if not isinstance(value, str):
        raise ContractError("not_string", path, "must be a string")
    size = len(value.encode("utf-8", "surrogatepass")) if utf8_bytes else js_length(value)
    if not min_length <= size <= max_length:
        unit = "bytes" if utf8_bytes else "characters"
        raise ContractError("length", path, f"must be {min_length}..{max_length} {unit}")
    if not control and has_control(value):
        raise ContractError("control_character", path, "control characters are not allowed")
    if pattern is not None and pattern.fullmatch(value) is None:
        raise ContractError("pattern", path, "does not match the grammar")
    return value


def dispatch_id(value: object, path: str) -> str:
    """``assertRunDispatchId``: string, 1-128 (JS length), no control characters."""
    return string(value, path, max_length=128)


def sha256_hex(data: str | bytes) -> str:
    """Lowercase hex SHA-256 of ``data`` (UTF-8 for text)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return _sha256_hex(raw)
