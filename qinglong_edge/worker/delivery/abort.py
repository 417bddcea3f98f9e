"""Aborting a ``pull`` from a signal handler without tearing a journal write.

The ``pull`` command's SIGTERM/SIGINT/SIGHUP handler calls :meth:`AbortSignal.trip`. While a
network call (or a sleep) is in progress it raises :class:`PullAborted` at once;
anywhere else -- in the middle of a journal write -- it only records the request, and
the next network call (or the cycle loop) raises it. Kept apart from
:mod:`qinglong_edge.worker.delivery.pull` so the command can sleep its splay (and be stopped
during it) before it imports the TLS client and the journal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["AbortSignal", "PullAborted"]


class PullAborted(BaseException):
    """Raised by the ``pull`` command's signal handler to abort a blocked request.

    A ``BaseException`` so that no ``except Exception`` on the way swallows it.
    """

    def __init__(self, signal_name: str = "SIGTERM") -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


class AbortSignal:
    """How a signal handler stops a pull without tearing a journal write.

    ``trip(reason)`` (from the handler) records the first reason and raises
    :class:`PullAborted` only while the main thread is inside :meth:`interruptible`
    (a network call or a sleep); :meth:`interruptible` raises at entry once tripped, so
    no new request starts after a signal; :meth:`check` raises at a step boundary.
    """

    def __init__(self) -> None:
        self.reason: str | None = None
        self._depth = 0

    @property
    def tripped(self) -> bool:
        return self.reason is not None

    def trip(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        if self._depth:
            raise PullAborted(self.reason)

    def check(self) -> None:
        if self.reason is not None:
            raise PullAborted(self.reason)

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        self.check()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

