"""The agent's two clocks (spec README, "Decisions for clocks").

* :func:`boot_ms`: ``CLOCK_BOOTTIME`` in milliseconds. NTP cannot step it and it keeps
  counting through a suspend. Every local timer runs on it: renewal due, local lease
  expiry, job timeout, Local Run deadlines, backoff, stop graces, splay. A value that must
  outlive the process is stored together with :func:`boot_id` and is void after a reboot.
* :func:`wall_ms`: ``CLOCK_REALTIME`` in milliseconds, only for what the wire or a person
  reads (``*AtMs`` fields, log lines, display columns). Never compare two wall readings to
  decide when something is due.

The boot clock's two kernel facts have their one reader and parser here, so every
layer reads them alike: :func:`boot_id` (the only reader of
``/proc/sys/kernel/random/boot_id``; :func:`parse_boot_id` is its sans-IO half) and
:func:`parse_proc_stat` (a ``/proc/<pid>/stat`` line, whose field 22 is a process's start
time in boot-clock ticks: ``process/identity.py`` and the journal's owner lock both read
it through this parser).

Standard library only, no import of ours: both the pull path and the Local controller use it.
"""

from __future__ import annotations

import time

__all__ = [
    "BOOT_ID_PATH",
    "CLOCK_FLOOR_MS",
    "boot_id",
    "boot_ms",
    "clock_set",
    "is_boot_id",
    "parse_boot_id",
    "parse_proc_stat",
    "wall_ms",
]

#: The kernel's per-boot random id (Linux), a new value at every boot.
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
#: 2026-11-01T00:00:00Z: the date of this source, so no package of it is built earlier (a
#: release moves it on). A wall clock before it is not set yet (a router without an RTC
#: boots at its firmware's build time until NTP steps it): ``clock_not_set``, nothing is
#: claimed (TLS could not judge a certificate's validity either).
CLOCK_FLOOR_MS = 1_793_491_200_000
#: A boot id is ``^[A-Za-z0-9-]{1,64}$`` (the kernel writes a UUID: 36 characters).
_BOOT_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")
_MAX_BOOT_ID_CHARS = 64
#: Fields after the comm field that :func:`parse_proc_stat` needs (state .. starttime).
_MIN_FIELDS_AFTER_COMM = 20
#: The largest integer a JSON reader keeps exactly (2^53 - 1).
_MAX_SAFE_INTEGER = 2**53 - 1


def boot_ms() -> int:
    """Milliseconds of ``CLOCK_BOOTTIME`` (since boot, suspend included; never stepped)."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1_000_000


def wall_ms() -> int:
    """Milliseconds since the Unix epoch by the wall clock (may jump: wire and display only)."""
    return time.time_ns() // 1_000_000


def clock_set(wall_now_ms: int) -> bool:
    """Whether the wall clock reads a time on or after :data:`CLOCK_FLOOR_MS`."""
    return wall_now_ms >= CLOCK_FLOOR_MS


def is_boot_id(text: str) -> bool:
    """Whether ``text`` has a boot id's shape: ``^[A-Za-z0-9-]{1,64}$``."""
    return 0 < len(text) <= _MAX_BOOT_ID_CHARS and _BOOT_ID_CHARS.issuperset(text)


def parse_boot_id(data: bytes) -> str | None:
    """The boot id in ``data`` (trimmed), or None unless it is :func:`is_boot_id`."""
    text = data.decode("ascii", "replace").strip()
    return text if is_boot_id(text) else None


def boot_id(path: str = BOOT_ID_PATH) -> str | None:
    """The kernel's boot id (``/proc/sys/kernel/random/boot_id``, trimmed), or None when it
    cannot be read or is not a boot id (:func:`parse_boot_id`). A stored boot-clock value
    whose boot id differs from this one is void."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(128)
    except OSError:
        return None
    return parse_boot_id(data)


def _json_int(text: bytes) -> int | None:
    """A decimal field of at most 16 digits and at most 2^53 - 1, else None."""
    if not text.isdigit() or len(text) > 16:
        return None
    value = int(text)
    return value if value <= _MAX_SAFE_INTEGER else None


def parse_proc_stat(data: bytes, pid: int | None = None) -> tuple[int, str, str, int, int, int, str]:
    """The identity fields of one ``/proc/<pid>/stat`` line (bytes in, fields out).

    The line is ``pid (comm) state ppid pgrp session ... starttime ...``. ``comm`` is up
    to 15 arbitrary bytes chosen by the process and may itself hold ``)``, ``(``, spaces
    or newlines, so the fields are split only after the **last** ``)``; the text before
    the first ``(`` must be the pid (``pid`` when given). ``pgrp``/``session`` may be 0
    (kernel threads).

    Returns:
        ``(pid, comm, state, ppid, pgrp, session, starttime)``: ``comm`` decoded UTF-8
        with ``surrogateescape``, ``state`` one letter, ``starttime`` (field 22, clock
        ticks since boot) the decimal text as the kernel wrote it.

    Raises:
        ValueError: the line is malformed; the message says how.
    """
    open_at = data.find(b"(")
    close_at = data.rfind(b")")
    if open_at < 1 or close_at <= open_at:
        raise ValueError("no command field")
    head = _json_int(data[:open_at].strip())
    if head is None or (pid is not None and head != pid):
        raise ValueError("pid does not match")
    fields = data[close_at + 1 :].split()
    if len(fields) < _MIN_FIELDS_AFTER_COMM:
        raise ValueError("missing fields")
    state = fields[0]
    ppid, pgrp, session = (_json_int(f) for f in fields[1:4])
    start_time = fields[19]
    if (
        len(state) != 1
        or not state.isalpha()
        or ppid is None
        or pgrp is None
        or session is None
        or not start_time.isdigit()
        or len(start_time) > 32
    ):
        raise ValueError("invalid identity fields")
    comm = data[open_at + 1 : close_at].decode("utf-8", "surrogateescape")
    return head, comm, state.decode("ascii"), ppid, pgrp, session, start_time.decode("ascii")
