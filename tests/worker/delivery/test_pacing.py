"""worker/delivery/pacing.py: the splay phase, the backoff, Retry-After and the session step (pure
functions; the pull coordinator, the session keeper, the pull command and the fleet
simulation all use them)."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qinglong_edge.worker.delivery.pacing import (
    LEASE_MARGIN_MS,
    MAX_RETRY_AFTER_MS,
    claim_due,
    retry_after_window,
    retry_delay_ms,
    session_step,
    splay_delay_ms,
    splay_offset_ms,
    splay_phase_ms,
    waiting,
)

MINUTE = 60_000
T = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE  # second 0 of a minute


def test_the_phase_is_stable_per_worker_and_differs_between_workers() -> None:
    assert splay_phase_ms("edge-1", 50_000) == splay_phase_ms("edge-1", 50_000)
    assert len({splay_phase_ms(f"edge-{i}", 50_000) for i in range(100)}) > 95
    assert splay_phase_ms("edge-1", 0) == 0


@given(st.text(min_size=1, max_size=128), st.integers(min_value=1, max_value=60_000))
def test_the_phase_is_within_bounds(worker_id: str, splay_max: int) -> None:
    assert 0 <= splay_phase_ms(worker_id, splay_max) < splay_max


def test_phases_of_a_fleet_fill_the_splay_window_evenly() -> None:
    per_second = collections.Counter(splay_phase_ms(f"router-{i:05d}", 50_000) // 1000 for i in range(10_000))
    assert set(per_second) == set(range(50))
    assert max(per_second.values()) < 1.3 * 10_000 / 50  # within the binomial spread


def test_the_offset_is_the_phase_with_a_jitter_of_five_seconds_either_way() -> None:
    phase = splay_phase_ms("edge-1", 60_000)
    assert splay_offset_ms("edge-1", 60_000, 0.5) == phase
    offsets = {splay_offset_ms("edge-1", 60_000, r / 100) for r in range(100)}
    distances = {min((o - phase) % 60_000, (phase - o) % 60_000) for o in offsets}
    assert max(distances) <= 5_000 and len(offsets) == 100
    assert splay_offset_ms("edge-1", 4_000, 0.999) < 4_000  # the jitter never leaves a small window
    assert splay_offset_ms("edge-1", 0, 0.7) == 0


def test_the_delay_waits_for_this_minutes_offset_or_none() -> None:
    offset = splay_offset_ms("edge-1", 60_000, 0.25)
    assert splay_delay_ms("edge-1", 60_000, T, 0.25) == offset
    if offset > 300:
        assert splay_delay_ms("edge-1", 60_000, T + 300, 0.25) == offset - 300
    assert splay_delay_ms("edge-1", 60_000, T + offset + 1, 0.25) == 0  # late: go now, not next minute
    assert splay_delay_ms("edge-1", 0, T + 5, 0.25) == 0


def test_a_fleet_calls_about_once_a_minute() -> None:
    """Consecutive offsets of one device are 60 s +- 10 s apart (except at the window's edge)."""
    import random

    draws = random.Random(3)
    for i in range(200):
        worker = f"router-{i}"
        phase = splay_phase_ms(worker, 60_000)
        if 6_000 <= phase <= 54_000:
            a, b = (splay_offset_ms(worker, 60_000, draws.random()) for _ in range(2))
            assert abs((60_000 + b) - a - 60_000) <= 10_000


def test_retry_after_is_never_undercut_and_capped() -> None:
    assert retry_delay_ms(1, 1000, 0.999, None) == (999, None)
    assert retry_delay_ms(1, 1000, 0.5, 30_000) == (30_000, 30_000)
    assert retry_delay_ms(7, 1000, 0.9, 1_000) == (54_000, 1_000)
    assert retry_delay_ms(1, 1000, 0.0, 10**12) == (MAX_RETRY_AFTER_MS, MAX_RETRY_AFTER_MS)
    assert retry_delay_ms(1, 1000, 0.0, -5) == (0, 0)


def test_a_claim_due_date_beyond_any_backoff_counts_as_due() -> None:
    assert claim_due(1000, 1000, 1000) and claim_due(999, 1000, 1000)
    assert not claim_due(2000, 1000, 1000)
    assert claim_due(1000 + MAX_RETRY_AFTER_MS + 1, 1000, 1000)  # the clock stepped back by hours


def test_retry_after_windows() -> None:
    assert retry_after_window(10, None) is None and retry_after_window(10, 0) is None
    window = retry_after_window(10, 5)
    assert window == (10, 15)
    assert [waiting(window, t) for t in (9, 10, 14, 15)] == [False, True, True, False]


@pytest.mark.parametrize(("lease", "beat", "now", "window", "step"), [
    (None, None, 100, None, "register"),
    (None, None, 100, (50, 150), "wait_unavailable"),
    (100_000, 90_000, 93_000, None, "current"),
    (100_000, 90_000, 95_000, None, "heartbeat"),           # halfway to a lease shorter than the interval
    (400_000, 90_000, 99_999, None, "current"),             # a long lease: the interval decides
    (100_000, 90_000, 100_000, None, "register"),           # the lease is over by our clock
    (100_000, 80_000, 100_000 - LEASE_MARGIN_MS - 1, None, "heartbeat"),
    (100_000, 80_000, 95_000, (94_000, 99_000), "wait_stale"),
    (100_000, 96_000, 95_000, None, "heartbeat"),           # the clock stepped back: do not trust the record
])
def test_the_session_step_table(lease: int | None, beat: int | None, now: int, window: tuple[int, int] | None,
                                step: str) -> None:
    assert session_step(lease, beat, now, 10_000, window) == step
