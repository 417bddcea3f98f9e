"""The agent's two clocks (spec README, "Decisions for clocks").

* :func:`boot_ms`: ``CLOCK_BOOTTIME`` in milliseconds. NTP cannot step it and it keeps
  counting through a suspend. Every local timer runs on it: renewal due, local lease
  expiry, job timeout, Local Run deadlines, backoff, stop graces, splay. A value that must
  outlive the process is stored together with :func:`boot_id` and is void after a reboot.
* :func:`wall_ms`: ``CLOCK_REALTIME`` in milliseconds, only for what the wire or a person
  reads (``*AtMs`` fields, log lines, display columns). Never compare two wall readings to
  decide when something is due.

Standard library only, no import of ours: both the pull path and the Local controller use it.
"""

from __future__ import annotations

import time

__all__ = ["BOOT_ID_PATH", "CLOCK_FLOOR_MS", "boot_id", "boot_ms", "clock_set", "wall_ms"]

#: The kernel's per-boot random id (Linux), a new value at every boot.
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
#: 2026-11-01T00:00:00Z: the date of this source, so no package of it is built earlier (a
#: release moves it on). A wall clock before it is not set yet (a router without an RTC
#: boots at its firmware's build time until NTP steps it): ``clock_not_set``, nothing is
#: claimed (TLS could not judge a certificate's validity either).
CLOCK_FLOOR_MS = 1_793_491_200_000


def boot_ms() -> int:
    """Milliseconds of ``CLOCK_BOOTTIME`` (since boot, suspend included; never stepped)."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1_000_000


def wall_ms() -> int:
    """Milliseconds since the Unix epoch by the wall clock (may jump: wire and display only)."""
    return time.time_ns() // 1_000_000


def clock_set(wall_now_ms: int) -> bool:
    """Whether the wall clock reads a time on or after :data:`CLOCK_FLOOR_MS`."""
    return wall_now_ms >= CLOCK_FLOOR_MS


def boot_id(path: str = BOOT_ID_PATH) -> str | None:
    """The kernel's boot id (``/proc/sys/kernel/random/boot_id``, trimmed), or None when it
    cannot be read. A stored boot-clock value whose boot id differs from this one is void."""
    try:
        with open(path, "rb") as handle:
            text = handle.read(128).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text or None
