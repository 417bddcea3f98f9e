"""The cluster's clock seen from the device (contracts/clocks.py; spec README "Decisions
for clocks"): samples, the kept one, the local lease expiry, renewal, wire times, the
lease stop. Pure functions: examples and properties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qinglong_edge.contracts.clocks import (
    LEASE_STOP_MARGIN_MS,
    MAX_AHEAD_MS,
    ClockSample,
    better_sample,
    lease_stop_plan,
    local_lease_expiry_ms,
    renewal_due_ms,
    result_times,
    sample_from,
)
from qinglong_edge.contracts.errors import ContractError

CLUSTER = 1_800_000_000_000  # the cluster's DB clock (ms)


def test_a_sample_is_the_cluster_time_minus_the_midpoint() -> None:
    sample = sample_from(CLUSTER, 1000, 1100)  # sent at boot 1000, answered at 1100
    assert (sample.offset_ms, sample.error_ms, sample.at_boot_ms) == (CLUSTER - 1050, 50, 1100)
    assert sample.to_cluster(1050) == CLUSTER and sample.to_boot(CLUSTER) == 1050
    assert sample_from(CLUSTER, 1000, 990).error_ms == 0  # a receive "before" the send: a zero trip


def test_the_lowest_round_trip_is_kept_and_a_moved_cluster_clock_replaces_it() -> None:
    good = sample_from(CLUSTER, 1000, 1010)
    worse = sample_from(CLUSTER + 9195, 10_000, 10_400)  # consistent (the same offset), a longer trip
    assert better_sample(good, worse) is good
    assert better_sample(worse, good) is good
    assert better_sample(None, worse) is worse
    jumped = sample_from(CLUSTER - 600_000 + 20_000, 20_000, 20_300)  # the cluster's clock went back 10 min
    assert better_sample(good, jumped) is jumped


def test_an_old_sample_ages_by_the_drift() -> None:
    old = ClockSample(CLUSTER, 5, 0)
    assert old.effective_error_ms(0) == 5
    assert old.effective_error_ms(86_400_000) == 5 + 8640  # 100 ppm of a day
    fresh = ClockSample(CLUSTER + 100, 400, 86_400_000)  # consistent with the old one, a longer trip
    assert better_sample(old, fresh) is fresh  # a day old, the old one is the worse


def test_the_local_expiry_is_the_earlier_term() -> None:
    offset = CLUSTER - 1000  # boot 1000 is cluster CLUSTER
    sample = ClockSample(offset, 20, 1000)
    # a fresh grant: renewed now, 30 s: the send term (boot 900 + 30 s) wins
    assert local_lease_expiry_ms(900, CLUSTER, CLUSTER + 30_000, sample) == 30_900
    # a replayed lease (lease_recovery) with old times: the translated term wins
    assert local_lease_expiry_ms(900, CLUSTER - 25_000, CLUSTER + 5_000, sample) == 6000 - 20
    assert local_lease_expiry_ms(900, CLUSTER - 25_000, CLUSTER + 5_000, None) == 30_900  # no sample yet


@pytest.mark.parametrize("offset_min", range(-10, 11))
def test_renewals_come_once_per_third_whatever_the_skew(offset_min: int) -> None:
    """The boot clock runs the lease; a device whose wall clock is minutes off renews on
    the same schedule (issue 23: 256 renewals a second when ahead by more than a third)."""
    boot, duration = 50_000, 30_000
    offset = CLUSTER + offset_min * 60_000 - boot  # whatever the wall clock, the sample maps boot -> cluster
    sample = sample_from(CLUSTER + offset_min * 60_000, boot - 10, boot + 10)
    assert abs(sample.offset_ms - offset) <= 10
    sent = boot
    renewed = sample.to_cluster(sent)
    for _ in range(9):
        expiry = local_lease_expiry_ms(sent, renewed, renewed + duration, sample, sent)
        sent = renewal_due_ms(sent, duration, expiry)
        renewed = sample.to_cluster(sent)
    assert sent - boot == pytest.approx(9 * (duration // 3), abs=9 * 25)


def test_renewal_due_is_bounded_below() -> None:
    assert renewal_due_ms(0, 30_000, 30_000) == 10_000
    assert renewal_due_ms(0, 30_000, 25_000) == 5000  # the translated expiry is earlier
    assert renewal_due_ms(0, 30_000, 0) == 5000  # never sooner than a sixth (no storm)


def test_wire_times_are_clamped() -> None:
    now = CLUSTER
    assert result_times(now - 9000, now - 1000, attempt_created_at_ms=now - 10_000, cluster_now_ms=now) == (
        now - 9000, now - 1000)
    assert result_times(now - 20_000, now - 30_000, attempt_created_at_ms=now - 10_000, cluster_now_ms=now) == (
        now - 10_000, now - 10_000)
    far = now + 10 * MAX_AHEAD_MS
    assert result_times(far, far, attempt_created_at_ms=0, cluster_now_ms=now) == (now + MAX_AHEAD_MS,) * 2
    # the cluster's clock went back more than 5 minutes: started >= created wins
    assert result_times(0, 0, attempt_created_at_ms=now + MAX_AHEAD_MS + 1, cluster_now_ms=now)[0] == (
        now + MAX_AHEAD_MS + 1)


@given(st.integers(-(2**40), 2**40), st.integers(0, 2**40), st.integers(0, 2**44), st.integers(0, 2**44))
def test_wire_time_properties(started: int, finished_after: int, created: int, now: int) -> None:
    s, f = result_times(started, started + finished_after, attempt_created_at_ms=created, cluster_now_ms=now)
    assert s >= created and f >= s
    if created <= now + MAX_AHEAD_MS:
        assert s <= now + MAX_AHEAD_MS and f <= now + MAX_AHEAD_MS


@given(st.integers(0, 600_000), st.integers(0, 30_000), st.integers(0, 30_000))
def test_the_lease_stop_fits_in_half_the_grant(duration: int, term: int, kill: int) -> None:
    lead, t, k = lease_stop_plan(duration, term, kill)
    assert lead == t + k + LEASE_STOP_MARGIN_MS and 0 <= t <= term and 0 <= k <= kill
    assert t + k <= max(0, duration // 2 - LEASE_STOP_MARGIN_MS)


def test_the_lease_stop_at_the_edge_default_keeps_the_configured_graces() -> None:
    assert lease_stop_plan(30_000, 5000, 1000) == (6500, 5000, 1000)
    assert lease_stop_plan(6000, 5000, 1000) == (3000, 1875, 625)


@given(st.integers(0, 2**40), st.integers(0, 2**30), st.integers(0, 2**30), st.integers(-(2**40), 2**40))
def test_the_expiry_is_never_later_than_the_send_term(sent: int, renewed: int, duration: int, offset: int) -> None:
    sample = ClockSample(offset, 7, sent)
    expiry = local_lease_expiry_ms(sent, renewed, renewed + duration, sample)
    assert expiry <= sent + duration
    due = renewal_due_ms(sent, duration, expiry)
    assert sent + duration // 6 <= due <= max(sent + duration // 6, sent + duration // 3)


@pytest.mark.parametrize("bad", [1.0, True, None, "5", 2**63])
def test_arguments_are_checked(bad: Any) -> None:
    with pytest.raises(ContractError):
        sample_from(bad, 0, 0)
    with pytest.raises(ContractError):
        local_lease_expiry_ms(0, 0, bad, None)
