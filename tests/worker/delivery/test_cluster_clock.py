"""The kept sample of the cluster's clock in a real runtime directory (worker/delivery/cluster_clock.py)."""

from __future__ import annotations

import json
import pathlib

import pytest

from qinglong_edge.worker.delivery.cluster_clock import CLOCK_NAME, ClusterClock
from qinglong_edge.worker.journal.runtime import RuntimeDirectory

BOOT = "6f1c0e2a-1b2c-4d3e-8f40-123456789abc"
CLUSTER = 1_800_000_000_000


class Ticks:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _clock(runtime: RuntimeDirectory | None, boot: Ticks, wall: Ticks, boot_id: str = BOOT) -> ClusterClock:
    return ClusterClock(runtime, boot_ms=boot, wall_ms=wall, boot_id=boot_id)


def test_a_sample_is_kept_in_ram_for_the_next_process_of_this_boot(runtime: RuntimeDirectory) -> None:
    boot, wall = Ticks(10_000), Ticks(CLUSTER - 240_000)  # the device is 4 min behind
    first = _clock(runtime, boot, wall)
    assert not first.known() and first.cluster_now() == wall.now and first.skew_ms() is None
    first.observe(CLUSTER, 9_990, 10_010, "heartbeat")
    stored = json.loads(runtime.read(CLOCK_NAME) or b"{}")
    assert (stored["offsetMs"], stored["errorMs"], stored["bootId"], stored["source"]) == (
        CLUSTER - 10_000, 10, BOOT, "heartbeat")
    later = _clock(runtime, boot, wall)
    assert later.cluster_now() == CLUSTER and later.skew_ms() == 240_000
    assert later.cluster_to_boot(CLUSTER + 5000) == 15_000 and later.boot_to_cluster(12_000) == CLUSTER + 2000
    assert later.wall_to_cluster(wall.now - 1000) == CLUSTER - 1000
    assert _clock(runtime, boot, wall, boot_id="another-boot").sample is None  # void after a reboot


def test_a_worse_sample_is_not_written_a_moved_clock_is(runtime: RuntimeDirectory) -> None:
    boot, wall = Ticks(10_000), Ticks(CLUSTER)
    clock = _clock(runtime, boot, wall)
    clock.observe(CLUSTER, 9_999, 10_001, "lease_control")
    before = runtime.read(CLOCK_NAME)
    boot.now = 20_000
    clock.observe(CLUSTER + 10_000, 19_900, 20_100, "heartbeat")  # consistent, a longer trip
    assert runtime.read(CLOCK_NAME) == before
    clock.observe(CLUSTER - 600_000 + 20_000, 19_999, 20_001, "lease_control")  # the cluster went back 10 min
    assert _clock(runtime, boot, wall).cluster_now() == CLUSTER - 600_000 + 20_000


@pytest.mark.parametrize("data", [b"", b"{}", b"garbage\n", b'{"schemaVersion":1}', b"\xff" * 100])
def test_a_damaged_copy_is_ignored(runtime: RuntimeDirectory, data: bytes) -> None:
    path = pathlib.Path(runtime.path) / CLOCK_NAME
    path.write_bytes(data)
    path.chmod(0o600)
    assert _clock(runtime, Ticks(1), Ticks(CLUSTER)).sample is None


def test_a_skew_is_said_once_per_boot(runtime: RuntimeDirectory) -> None:
    boot, wall = Ticks(10_000), Ticks(CLUSTER + 240_000)
    clock = _clock(runtime, boot, wall)
    assert clock.skew_notice() is None  # nothing measured yet
    clock.observe(CLUSTER, 10_000, 10_000, "register")
    line = clock.skew_notice()
    assert line is not None and "240 s ahead of the cluster's" in line
    assert _clock(runtime, boot, wall).skew_notice() is None
    near = _clock(None, boot, Ticks(CLUSTER + 30_000))
    near.observe(CLUSTER, 10_000, 10_000, "register")
    assert near.skew_notice() is None  # within a minute: nothing to say
