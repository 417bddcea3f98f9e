"""A clock a test moves by hand, for code that takes a clock as a callable."""

from __future__ import annotations

#: 2023-11-14T22:13:20Z in ms: where a test's wall clock starts unless it says otherwise.
T0_MS = 1_700_000_000_000


class ManualClock:
    """Milliseconds that move only when the test moves them (``clock.now += ms``);
    calling the clock says ``now``."""

    def __init__(self, now: int = T0_MS) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now
