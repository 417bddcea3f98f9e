"""Small shape helpers shared by the wire-contract modules (private).

Every helper takes the value and its JSON path and returns the value or raises
:class:`~qinglong_edge.contracts.errors.ContractError`. They complement
:mod:`qinglong_edge.contracts.fields` with what the offer, session and journal
contracts need on top: JSON paths for arbitrary keys, exact key sets with proper
paths, "text without NUL within N UTF-8 bytes" (the reference's ``assertBoundedText``)
and strict type checks that never let ``True == 1`` or ``2.0 == 2`` through.

:class:`Frozen` is the base of the immutable value classes on the ``pull`` path (what
``@dataclass(frozen=True, slots=True)`` gave them, without importing :mod:`dataclasses`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import MAX_SAFE_INTEGER

#: ``typing.TYPE_CHECKING`` without importing :mod:`typing` (~3 ms of a ``pull``); mypy
#: treats this name the same way.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

__all__ = [
    "Frozen",
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


class Frozen:
    """Base of an immutable value class: ``@dataclass(frozen=True, slots=True)`` by hand.

    A cron-run ``pull`` on a router pays for every import each cycle: importing
    :mod:`dataclasses` (it pulls ``inspect``, ``ast``, ``dis``, ``tokenize``) and
    generating the methods of two dozen classes cost ~20 ms CPU and ~1.4 MiB peak RSS
    (benchmarks/bench_pull.py). A subclass names its fields, in declaration order, in
    ``__slots__`` and stores them in its own ``__init__`` with ``object.__setattr__``;
    it gets what the dataclass generated, with the same semantics:

    * ``__eq__``: equal when the other object has the *same* class and equal field
      tuples, else ``NotImplemented``; ``__hash__``: the hash of the field tuple (so a
      class holding a ``dict`` field is unhashable, as before).
    * ``__repr__``: ``QualName(field=value, ...)`` without the fields named in
      ``_repr_hidden`` (the dataclass ``field(repr=False)``: lease tokens, credential
      secrets, bodies). A subclass may still define its own ``__repr__``.
    * ``__setattr__`` / ``__delattr__`` raise :class:`dataclasses.FrozenInstanceError`
      (imported only then, on that error path) with the dataclass message.
    * ``__getstate__`` / ``__setstate__``: :mod:`copy` and :mod:`pickle` still work.
    """

    __slots__: tuple[str, ...] = ()

    #: Fields left out of ``repr`` (they may hold a secret).
    _repr_hidden: ClassVar[tuple[str, ...]] = ()

    def _values(self) -> tuple[object, ...]:
        return tuple([getattr(self, name) for name in self.__slots__])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._values() == other._values()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        hidden = self._repr_hidden
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__ if name not in hidden)
        return f"{self.__class__.__qualname__}({shown})"

    def __setattr__(self, name: str, value: object) -> None:
        from dataclasses import FrozenInstanceError

        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        from dataclasses import FrozenInstanceError

        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __getstate__(self) -> list[object]:
        return list(self._values())

    def __setstate__(self, state: list[object]) -> None:
        for name, value in zip(self.__slots__, state, strict=False):  # as the dataclass did
            object.__setattr__(self, name, value)


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
