"""Waiting in tests: poll a condition with a deadline (the one helper; never a bare sleep).

``wait_until(predicate)`` calls ``predicate`` every ``interval`` seconds until it returns
something truthy and returns that value. When ``timeout`` passes first it returns the last
(falsy) value, so a caller writes ``assert wait_until(...)``; with ``what=`` it raises an
``AssertionError`` naming what it waited for instead (for support code whose callers use
the value). A predicate's exception propagates at once (a child that died, say).

A check that something does *not* happen is not a sleep either: wait for a positive event
that proves the system got past the point (an exchange with the cluster double, a log
line, a file), then assert. ``tests/test_test_style.py`` keeps ``time.sleep`` out of the
tests except the sleeps it lists (part of the scenario, each with its reason).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_until"]

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 5.0, interval: float = 0.01, *,
               what: str | None = None) -> T:
    """Poll ``predicate`` until it returns a truthy value (returned) or ``timeout`` s pass.

    Returns:
        The predicate's first truthy value; on timeout its last value (evaluated at or
        after the deadline), unless ``what`` is given.

    Raises:
        AssertionError: on timeout when ``what`` names the condition.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            if what is not None:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            return value
        time.sleep(interval)
