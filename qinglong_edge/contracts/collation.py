"""The two orderings the cluster's digests depend on, reproduced in Python.

1. :func:`icu_sort_key`: JS ``a.localeCompare(b)`` under Node 20's ICU root collation,
   for the ASCII alphabets our contracts allow (environment names, label keys, runtime
   names). offer-delivery.md Appendix A; verified there against Node 20 with 0
   mismatches. Example: ``api_key < API_URL < HOME`` (code points would give
   ``API_URL, HOME, api_key``, and a different digest).
2. :func:`js_own_key_order`: the order ``JSON.stringify`` emits an object's keys in.
   JS objects list *array-index* keys (``"0"``, ``"42"``; canonical decimal integers
   up to 2^32-2) first, in ascending numeric order, then the other string keys in
   insertion order. Label maps are built by the reference with
   ``Object.fromEntries(sorted entries)``, so a label key such as ``"10"`` is emitted
   before ``"9"`` is not, and before every non-numeric key: the digest depends on it.

Plain JS ``.sort()`` (executors, features, architectures, support tiers) compares
UTF-16 code units, which is Python ``sorted()`` for the ASCII strings involved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["icu_sort_key", "is_array_index", "js_own_key_order"]

#: Punctuation with a primary weight below digits and letters, in ICU root order.
_PUNCTUATION = "_-:./+"
_MAX_ARRAY_INDEX = 2**32 - 2

IcuKey = tuple[str, str]


def _primary(char: str) -> str:
    """Two code points per character: (group, weight), compared like Appendix A's tuples."""
    index = _PUNCTUATION.find(char)
    if index >= 0:
        return "\x00" + chr(index)
    if char.isdigit():
        return "\x01" + char
    lowered = char.lower()
    # A few characters lower-case to two code points ("İ"); keep the key total.
    return "\x02" + (lowered if len(lowered) == 1 else char)


class _Weights(dict[int, str]):
    """A ``str.translate`` table: ASCII precomputed, anything else computed on demand."""

    def __init__(self, weigh: Callable[[str], str]) -> None:
        super().__init__((code, weigh(chr(code))) for code in range(128))
        self._weigh = weigh

    def __missing__(self, code: int) -> str:
        return self._weigh(chr(code))


_PRIMARY = _Weights(_primary)
_TERTIARY = _Weights(lambda char: "\x01" if char.isupper() else "\x00")


def icu_sort_key(text: str) -> IcuKey:
    """Sort key equal to ICU root ``localeCompare`` order (offer-delivery.md Appendix A).

    Primary weights: ``_ - : . / +`` (in that order) < digits < letters compared
    case-insensitively; a shorter primary prefix sorts first. Only when the primaries
    are equal does the tertiary sequence decide: lowercase (and non-letters) 0,
    uppercase 1, so ``a < A`` and ``aB < Ab``.

    The appendix's per-character ``(group, weight)`` tuples are encoded as two code
    points each and built with ``str.translate`` (C speed), so comparing keys compares
    exactly the appendix's sequences.

    Args:
        text: any string; the order is only guaranteed to match ICU for the ASCII
            alphabets of the contracts (``[A-Za-z0-9_.:/+-]``).

    Returns:
        ``(primary, tertiary)`` strings; compare keys with ``<``.
    """
    return (text.translate(_PRIMARY), text.translate(_TERTIARY))


def is_array_index(key: str) -> bool:
    """True when JS treats ``key`` as an array index: canonical decimal, 0..2^32-2."""
    if not key or not key.isascii() or not key.isdigit():
        return False
    if len(key) > 1 and key[0] == "0":
        return False
    return len(key) <= 10 and int(key) <= _MAX_ARRAY_INDEX


def js_own_key_order(keys: Iterable[str]) -> list[str]:
    """Reorder ``keys`` (given in insertion order) the way a JS object enumerates them.

    Array-index keys first in ascending numeric order, then the rest in the given order.
    """
    ordered = list(keys)
    indices = [key for key in ordered if is_array_index(key)]
    if not indices:
        return ordered
    indices.sort(key=int)
    return indices + [key for key in ordered if not is_array_index(key)]
