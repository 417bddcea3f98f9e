"""One identity, one device (issue 23 item 6): the counting rule on a real runtime
directory, with the boot clock passed in (10 minutes are not slept)."""

from __future__ import annotations

import json
import pathlib

import pytest

from qinglong_edge.errors import SessionError
from qinglong_edge.worker.delivery.identity_guard import IDENTITY_NAME, THRESHOLD, WINDOW_MS, IdentityGuard
from qinglong_edge.worker.journal.runtime import RuntimeDirectory
from tests.support.manual_clock import ManualClock


@pytest.fixture
def runtime(tmp_path: pathlib.Path) -> RuntimeDirectory:
    (tmp_path / "run").mkdir(mode=0o700)
    return RuntimeDirectory.open(str(tmp_path / "run"), str(tmp_path / "journal"))


def _guard(runtime: RuntimeDirectory, clock: ManualClock, boot: str = "boot-1") -> IdentityGuard:
    return IdentityGuard(runtime, "edge-1", boot_clock=clock, wall_clock=lambda: 1_800_000_000_000, boot=boot)


def test_our_own_re_registrations_never_count(runtime: RuntimeDirectory) -> None:
    clock = ManualClock(5_000_000)
    guard = _guard(runtime, clock)
    for generation in range(1, 20):  # fences, capability changes, expired leases: each the next generation
        assert guard.registered(generation) is False
        clock.now += 1000
    guard.check()
    assert guard.describe() == {"quietMs": 0, "foreignReplacements": 0}


def test_three_replacements_by_another_device_within_ten_minutes_start_a_quiet_window(
        runtime: RuntimeDirectory) -> None:
    clock = ManualClock(5_000_000)
    guard = _guard(runtime, clock)
    guard.registered(1)
    generation = 1
    for count in range(1, THRESHOLD + 1):
        generation += 2  # the other device registered in between
        clock.now += 60_000
        assert guard.registered(generation) is True
        if count < THRESHOLD:
            guard.check()  # not yet
    with pytest.raises(SessionError) as info:
        guard.check()
    assert info.value.code == "identity_conflict"
    assert "another device uses worker id edge-1" in info.value.message and "10 more minutes" in info.value.message
    assert info.value.remedy
    clock.now += WINDOW_MS - 1
    with pytest.raises(SessionError):
        guard.check()
    clock.now += 1  # the window ends by itself: not a latch
    guard.check()
    assert guard.describe() == {"quietMs": 0, "foreignReplacements": 0}


def test_replacements_spread_over_more_than_ten_minutes_do_not_add_up(runtime: RuntimeDirectory) -> None:
    clock = ManualClock(5_000_000)
    guard = _guard(runtime, clock)
    guard.registered(1)
    for generation in (3, 5, 7, 9):
        clock.now += WINDOW_MS // 2 + 1  # two fit in a window, never three
        guard.registered(generation)
        guard.check()
    assert guard.describe()["foreignReplacements"] == 2


def test_a_reboot_or_a_damaged_file_forgets_everything(runtime: RuntimeDirectory) -> None:
    clock = ManualClock(5_000_000)
    guard = _guard(runtime, clock)
    guard.registered(1)
    assert _guard(runtime, clock, boot="boot-2").registered(5) is False  # another boot: nothing compared
    path = pathlib.Path(runtime.path) / IDENTITY_NAME
    for damage in (b"", b"{", b'{"schemaVersion":1}', b"\xff\xfe"):
        path.write_bytes(damage)
        path.chmod(0o600)
        fresh = _guard(runtime, clock)
        fresh.check()  # no window from a damaged file
        assert fresh.registered(9) is False  # no baseline: not counted
        assert json.loads(path.read_bytes())["generation"] == 9  # rewritten whole


def test_the_third_replacement_seen_as_a_fenced_heartbeat_goes_quiet_before_registering(
        runtime: RuntimeDirectory) -> None:
    clock = ManualClock(5_000_000)
    guard = _guard(runtime, clock)
    guard.registered(1)
    assert guard.fenced() is False  # none proved yet: register again
    guard.registered(3)
    clock.now += 1000
    assert guard.fenced() is False  # one proved
    guard.registered(5)
    clock.now += 1000
    assert guard.fenced() is True  # two proved: this is the third, before any registration
    with pytest.raises(SessionError):
        guard.check()
