"""The two clocks (spec README, "Decisions for clocks")."""

from __future__ import annotations

import pathlib
import time

from qinglong_edge import clock


def test_boot_clock_counts_since_boot_and_never_goes_back() -> None:
    first = clock.boot_ms()
    with open("/proc/uptime", encoding="ascii") as handle:
        uptime_ms = float(handle.read().split()[0]) * 1000
    second = clock.boot_ms()
    assert 0 < first <= second
    # CLOCK_BOOTTIME includes suspend, /proc/uptime too: the two agree within a second.
    assert abs(second - uptime_ms) < 1000


def test_wall_clock_is_epoch_milliseconds() -> None:
    assert abs(clock.wall_ms() - time.time() * 1000) < 1000


def test_boot_id_is_the_kernel_value(tmp_path: pathlib.Path) -> None:
    assert clock.boot_id() is not None
    path = tmp_path / "boot_id"
    path.write_bytes(b"  abc-123\n")
    assert clock.boot_id(str(path)) == "abc-123"
    path.write_bytes(b"\n")
    assert clock.boot_id(str(path)) is None
    assert clock.boot_id(str(tmp_path / "missing")) is None
