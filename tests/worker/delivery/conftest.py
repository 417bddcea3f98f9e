"""Fixtures of the cron-side delivery tests."""

from __future__ import annotations

import pytest

from tests.support.manual_clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    """The wall clock of the test, at ``T0_MS`` until the test moves it."""
    return ManualClock()
