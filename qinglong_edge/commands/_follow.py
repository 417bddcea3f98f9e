"""Follow a growing log by offset until its run ends (issue 26 item 3).

``admin runs log --follow`` (a Local Run) and ``inbox log OFFER_ID --follow`` (a remote
job) share this loop: the log is opened once (``O_NOFOLLOW``, a regular file; a log
pruned or discarded meanwhile stays readable through the open descriptor), read with
``pread`` from the last offset, written to stdout as raw bytes, and polled every
:data:`POLL_S` seconds on the boot clock. It ends once ``ended()`` said so *and* a read
after that found nothing new (so the last bytes a job wrote before it ended are never
lost). A log that does not exist yet is waited for while the run has not ended.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable
from typing import BinaryIO

from qinglong_edge.clock import boot_ms
from qinglong_edge.errors import EdgeError

__all__ = ["POLL_S", "follow_log"]

POLL_S = 0.5
_CHUNK = 64 * 1024


def _open(path: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise EdgeError(f"{path}: {exc.strerror}", code="log_unavailable") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise EdgeError(f"{path}: not a regular file", code="log_unavailable")
    return fd


def follow_log(
    path: Callable[[], str | None],
    ended: Callable[[], bool],
    out: BinaryIO,
    *,
    start: int = 0,
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Copy the log to ``out`` from ``start`` until the run ended; returns the end offset.

    Args:
        path: the log's path now (None: not known yet), asked until the file opens.
        ended: whether the run has ended (no more bytes will come).
        start: the first offset (a ``--tail`` window), clamped to the file's size.
        poll_s: seconds between reads while nothing new came.

    Raises:
        EdgeError: ``log_unavailable`` (not a regular file, unreadable).
    """
    fd: int | None = None
    offset = start
    try:
        while True:
            done = ended()
            if fd is None:
                where = path()
                fd = None if where is None else _open(where)
                if fd is not None:
                    offset = min(offset, os.fstat(fd).st_size)
            wrote = False
            while fd is not None:
                data = os.pread(fd, _CHUNK, offset)
                if not data:
                    break
                out.write(data)
                offset += len(data)
                wrote = True
            if wrote:
                out.flush()
            elif done:
                return offset
            if not wrote:
                due = boot_ms() + int(poll_s * 1000)
                while boot_ms() < due:
                    sleep(max(0.0, (due - boot_ms()) / 1000))
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
