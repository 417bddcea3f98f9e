"""Shared pieces of the cluster double (tests and the demo only): JSON bytes, the
double's clock, the failure that becomes a ``{"code":...}`` answer, and the reference's
scalar checks in the server's own terms (JS semantics, not our client contracts).

The checks mirror the reference's runtime-core helpers (whyour/qinglong at c699c32):
``assertRunDispatchId`` / ``assertRunDispatchLeaseToken`` / ``assertRunDispatchLeaseFence``
(``packages/ql3-runtime-core/src/run/runDispatchLease.ts``) and the ``identifier`` /
``integer`` helpers of ``remote-execution/remoteWorkerCompletion.ts``. "JS length" is the
UTF-16 code-unit count JavaScript's ``String.length`` gives; ``Number.isSafeInteger``
accepts ``1.0`` (JSON has one number type).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "INT31",
    "MAX_SAFE",
    "Clock",
    "Failure",
    "Reply",
    "compact",
    "dispatch_id",
    "exact_keys",
    "header",
    "identifier",
    "js_int",
    "js_length",
    "lease_token",
    "wall_ms",
]

MAX_SAFE = 2**53 - 1
INT31 = 2**31 - 1
_LEASE_TOKEN = re.compile(r"[A-Za-z0-9_-]{32,128}")
_CTRL = re.compile(r"[\x00-\x1f\x7f]")


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Clock:
    """The double's clock (ms): a source (the wall clock by default) plus an offset, or a
    frozen value. Callable, so it is what ``ClusterState.clock_ms`` holds.

    ``advance(ms)`` moves it forward (lease expiry, deadlines, without sleeping);
    ``set(ms)`` freezes it at ``ms`` until ``release()`` returns to source + offset.
    Thread-safe.
    """

    def __init__(self, source: Callable[[], int] = wall_ms) -> None:
        self._source = source
        self._offset = 0
        self._frozen: int | None = None
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            if self._frozen is not None:
                return self._frozen
            return self._source() + self._offset

    def advance(self, ms: int) -> int:
        """Move the clock ``ms`` forward (>= 0); returns the new time."""
        if not isinstance(ms, int) or isinstance(ms, bool) or ms < 0:
            raise ValueError("advance by a non-negative integer number of ms")
        return self.shift(ms)

    def shift(self, ms: int) -> int:
        """Move the clock by ``ms``, back when negative (a cluster whose time jumps, or a
        cluster ahead of or behind its workers); returns the new time."""
        if not isinstance(ms, int) or isinstance(ms, bool):
            raise ValueError("shift by an integer number of ms")
        with self._lock:
            if self._frozen is not None:
                self._frozen += ms
            else:
                self._offset += ms
        return self()

    def set(self, ms: int) -> None:
        """Freeze the clock at ``ms``."""
        with self._lock:
            self._frozen = ms

    def release(self) -> None:
        """Unfreeze: the clock runs from its source again, keeping the offset."""
        with self._lock:
            self._frozen = None


def compact(value: Any) -> bytes:
    """``JSON.stringify``: compact, insertion order, non-ASCII kept."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class Failure(Exception):
    """An error answer ``status {"code": code}``; ``close`` adds ``Connection: close``
    (the reference closes a connection whose request body it did not consume)."""

    def __init__(self, status: int, code: str, *, close: bool = False) -> None:
        super().__init__(code)
        self.status = status
        self.code = code
        self.close = close


@dataclass(frozen=True)
class Reply:
    """What the double answers. ``committed`` is True when the call changed state."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...]
    close: bool = False
    op: str | None = None
    committed: bool = False


def header(headers: Iterable[tuple[str, str]], name: str) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def js_length(value: str) -> int:
    return len(value.encode("utf-16-le", "surrogatepass")) // 2


def js_int(value: object, low: int = 0, high: int = MAX_SAFE) -> int:
    """A JS safe integer in ``low..high`` (``1.0`` counts, as ``Number.isSafeInteger``
    says); else TypeError."""
    if isinstance(value, bool):
        raise TypeError("not an integer")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or not low <= value <= high:
        raise TypeError("not a safe integer in range")
    return value


def dispatch_id(value: object, max_length: int = 128) -> str:
    """``assertRunDispatchId``: a string of JS length 1-128 without ctrl; ``max_length``
    tightens it (activation's ``boundedId`` 36). Else TypeError."""
    if not isinstance(value, str) or not 1 <= js_length(value) <= max_length or _CTRL.search(value):
        raise TypeError("bad id")
    return value


def identifier(value: object, max_bytes: int = 128) -> str:
    """The runtime-core ``identifier``: JS length >= 1, <= ``max_bytes`` UTF-8 bytes, no
    ctrl. Else TypeError."""
    if (
        not isinstance(value, str)
        or not value
        or len(value.encode("utf-8", "surrogatepass")) > max_bytes
        or _CTRL.search(value)
    ):
        raise TypeError("bad identifier")
    return value


def lease_token(value: object) -> str:
    """``assertRunDispatchLeaseToken``: ``^[A-Za-z0-9_-]{32,128}$``. Else TypeError."""
    if not isinstance(value, str) or _LEASE_TOKEN.fullmatch(value) is None:
        raise TypeError("bad lease token")
    return value


def exact_keys(body: object, keys: Iterable[str]) -> dict[str, Any]:
    """The pipeline's ``objectBody``: an object whose key *set* is ``keys``, else 400
    ``invalid_worker_request``."""
    if not isinstance(body, dict) or sorted(body) != sorted(keys):
        raise Failure(400, "invalid_worker_request")
    return body
