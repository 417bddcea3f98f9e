"""Test-only wall-clock shim (never on a production path: only tests put this directory on
``PYTHONPATH``). It offsets this interpreter's wall clock -- ``time.time``, ``time.time_ns``
and ``time.clock_gettime[_ns](CLOCK_REALTIME)`` -- by the integer milliseconds written in
the file ``$QLE_TEST_WALL_OFFSET_FILE`` names, re-read whenever that file is replaced, so a
test steps a running agent's wall clock (NTP stepping a router's clock) without sleeping.
``CLOCK_BOOTTIME`` and ``CLOCK_MONOTONIC`` are untouched, as NTP leaves them. OpenSSL's
certificate checks keep the real time (a shimmed clock years off still talks TLS).
Programs run with ``python -I -S`` (the job wrapper) never load it.
"""

from __future__ import annotations

import os
import time

_PATH = os.environ.get("QLE_TEST_WALL_OFFSET_FILE")

if _PATH:
    _offset_file: str = _PATH
    _real_time_ns = time.time_ns
    _real_clock_gettime_ns = time.clock_gettime_ns
    _seen: list[tuple[int, int, int] | None] = [None]  # (inode, mtime, size) of the file read last
    _offset: list[int] = [0]  # what it said, in ns

    def _offset_ns() -> int:
        try:
            st = os.stat(_offset_file)
        except OSError:
            return _offset[0]
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != _seen[0]:
            try:
                with open(_offset_file, encoding="ascii") as handle:
                    _offset[0] = int(handle.read().strip() or "0") * 1_000_000
                _seen[0] = key
            except (OSError, ValueError):
                pass
        return _offset[0]

    def _time_ns() -> int:
        return _real_time_ns() + _offset_ns()

    def _time() -> float:
        return _time_ns() / 1e9

    def _clock_gettime_ns(clock: int) -> int:
        value = _real_clock_gettime_ns(clock)
        return value + _offset_ns() if clock == time.CLOCK_REALTIME else value

    def _clock_gettime(clock: int) -> float:
        return _clock_gettime_ns(clock) / 1e9

    time.time_ns = _time_ns
    time.time = _time
    time.clock_gettime_ns = _clock_gettime_ns
    time.clock_gettime = _clock_gettime
