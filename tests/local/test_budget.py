"""The budget of requests without a valid credential: buckets, peers, refusal summaries
(qinglong_edge.local.budget; spec README "Decisions for storage on flash").

A pure in-memory object: the clocks are pinned, nothing else is faked.
"""

from __future__ import annotations

import pytest

from qinglong_edge.local.budget import LOOPBACK_PEER, RefusalSummary, RequestBudget, peer_key


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.wall = 1_800_000_000_000

    def monotonic(self) -> float:
        return self.now

    def wall_ms(self) -> int:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall += int(seconds * 1000)


def budget(clock: Clock, **kwargs: object) -> RequestBudget:
    options: dict[str, object] = {"burst": 3, "per_minute": 6.0, "interval_s": 60.0}
    options.update(kwargs)
    return RequestBudget(clock=clock.monotonic, wall_clock=clock.wall_ms, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("address", "key"), [
    (("127.0.0.1", 4000), LOOPBACK_PEER),
    (("127.8.9.10", 4000), LOOPBACK_PEER),
    (("::1", 4000, 0, 0), LOOPBACK_PEER),
    (("::ffff:127.0.0.1", 4000, 0, 0), LOOPBACK_PEER),
    (("192.0.2.7", 4000), "192.0.2.7"),
    (("2001:db8::1", 4000, 0, 0), "2001:db8::1"),
    (("not an address", 1), "unknown"),
    ("", "unknown"),
    (None, "unknown"),
])
def test_every_loopback_client_is_one_peer(address: object, key: str) -> None:
    assert peer_key(address) == key


def test_a_full_bucket_pays_burst_requests_then_refills_at_the_rate() -> None:
    clock = Clock()
    b = budget(clock)
    assert [b.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = b.take()
    assert wait == pytest.approx(10.0)  # 6 a minute: one token every 10 s
    assert b.wait_s() == pytest.approx(10.0)
    clock.advance(9.0)
    assert b.take() == pytest.approx(1.0)  # nothing taken while short
    clock.advance(1.0)
    assert b.take() == 0.0
    assert b.take() > 0
    clock.advance(3600)
    assert [b.take() for _ in range(4)][:3] == [0.0, 0.0, 0.0]  # capped at burst, however long idle
    assert b.taken_total == 7


def test_wait_s_takes_nothing() -> None:
    b = budget(Clock(), burst=1)
    assert b.wait_s() == 0.0 and b.wait_s() == 0.0
    assert b.take() == 0.0
    assert b.wait_s() > 0


def test_other_addresses_also_have_their_own_bucket_and_share_the_global_one() -> None:
    clock = Clock()
    b = budget(clock, burst=4, peer_burst=2)
    assert [b.take("192.0.2.1") for _ in range(3)][:2] == [0.0, 0.0]
    assert b.take("192.0.2.1") > 0  # its own bucket is empty
    assert b.take("192.0.2.2") == 0.0  # another peer still has its own tokens
    assert b.take(LOOPBACK_PEER) == 0.0  # loopback uses only the global bucket: its last token
    assert b.take("192.0.2.3") > 0  # the global bucket is empty now, whatever the peer's


def test_refusals_become_one_summary_per_reason_per_interval() -> None:
    clock = Clock()
    b = budget(clock)
    start = clock.wall
    for _ in range(5):
        b.refuse("credential_missing")
    b.refuse("authentication_rejected")
    assert b.take_summaries() == []  # the interval has not ended
    clock.advance(60)
    summaries = b.take_summaries()
    assert summaries == [
        RefusalSummary("authentication_rejected", 1, start, start + 60_000),
        RefusalSummary("credential_missing", 5, start, start + 60_000),
    ]
    assert b.pending() == {} and b.refused_total == 6
    clock.advance(60)
    assert b.take_summaries() == []  # a quiet interval writes nothing
    b.refuse("credential_missing")
    clock.advance(1)
    assert b.take_summaries() == []
    assert b.take_summaries(force=True)[0].count == 1  # shutdown: whatever is pending


def test_unknown_refusal_reasons_are_a_bug() -> None:
    with pytest.raises(ValueError, match="unknown refusal reason"):
        budget(Clock()).refuse("rate_limited")


def test_summaries_that_could_not_be_written_are_merged_back() -> None:
    clock = Clock()
    b = budget(clock)
    start = clock.wall
    b.refuse("credential_missing")
    clock.advance(60)
    failed = b.take_summaries()
    b.refuse("credential_missing")
    b.restore(failed)
    clock.advance(60)
    (merged,) = b.take_summaries()
    assert (merged.count, merged.since_ms, merged.until_ms) == (2, start, start + 120_000)


def test_invalid_settings_are_refused() -> None:
    for kwargs in ({"burst": 0}, {"per_minute": 0}, {"interval_s": 0}):
        with pytest.raises(ValueError):
            budget(Clock(), **kwargs)


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert [RequestBudget.retry_after_s(w) for w in (0.0, 0.01, 1.0, 1.2, 5.99)] == [1, 1, 1, 2, 6]
