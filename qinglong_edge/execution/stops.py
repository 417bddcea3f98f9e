"""The stops under way on the execution controller's one thread (issue 27 item 4).

A stop never blocks the thread: each is a :class:`~qinglong_edge.process.stop.Stopping`
(the one stop algorithm of :mod:`qinglong_edge.process.stop`, as timed steps), kept here
by attempt id, with what follows it (``then``: the terminal write, the completion,
``lost``). :meth:`StopBook.begin` runs the first step at once (look, SIGTERM): where the
stop is decided, so the SIGTERM goes out in the same turn as the decision. A stop that
ends in that step (nothing alive, nothing to wait for) is never booked, and its ``then``
runs right there, as a blocking stop's follow-up did. The loop asks :meth:`StopBook.wait_s`
how long it may wait, and :meth:`StopBook.advance` steps each stop that is due (every
``poll_ms``, and at a grace's end: re-verify, SIGKILL) and runs the ``then`` of each one
that is over.

At most one stop per attempt is under way (the controller checks ``attempt_id in book``
before it begins one). Only the controller's thread uses a book.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from qinglong_edge.process.cgroups import RunCgroup
from qinglong_edge.process.stop import Stopping, StopResult

__all__ = ["StopBook"]


class _StopWork:
    """A stop under way and what follows it (``then``, called once with its result)."""

    __slots__ = ("stopping", "then")

    def __init__(self, stopping: Stopping, then: Callable[[StopResult], None]) -> None:
        self.stopping = stopping
        self.then = then


class StopBook:
    """The stops under way, by attempt id (module docstring).

    Args:
        terminate_grace_ms, kill_grace_ms, poll_ms: every stop's graces and poll interval
            (:class:`~qinglong_edge.process.stop.Stopping`; 1..30000, poll at most either).
    """

    def __init__(self, *, terminate_grace_ms: int, kill_grace_ms: int, poll_ms: int) -> None:
        self.terminate_grace_ms = terminate_grace_ms
        self.kill_grace_ms = kill_grace_ms
        self.poll_ms = poll_ms
        self._works: dict[str, _StopWork] = {}

    def __contains__(self, attempt_id: object) -> bool:
        return attempt_id in self._works

    def __len__(self) -> int:
        return len(self._works)

    def begin(self, attempt_id: str, handle: str, cgroup: RunCgroup | None,
              then: Callable[[StopResult], None]) -> None:
        """Begin the stop of ``attempt_id`` (``handle``, ``cgroup``): its first step now;
        ``then`` runs with the result once it is over, right here if that first step ends
        it (what ``then`` raises then reaches the caller), else from :meth:`advance`."""
        stopping = Stopping(handle, cgroup, terminate_grace_ms=self.terminate_grace_ms,
                            kill_grace_ms=self.kill_grace_ms, poll_ms=self.poll_ms)
        if stopping.step() is None:
            assert stopping.result is not None  # done
            then(stopping.result)
            return
        self._works[attempt_id] = _StopWork(stopping, then)

    def wait_s(self) -> float | None:
        """Seconds until the earliest stop wants its next step (0.0: due now); None if
        no stop is under way."""
        waits = [w for w in (work.stopping.wait_s() for work in self._works.values()) if w is not None]
        return min(waits) if waits else None

    def advance(self, run: Callable[[str, Callable[[], None]], None]) -> None:
        """Step every stop that is due; for each one that is over, unbook it and call
        ``run(attempt_id, follow_up)``: the controller runs the follow-up (its ``then``
        with the result) guarded, so that what one raises is logged and the others go on."""
        for attempt_id, work in list(self._works.items()):
            wait = work.stopping.wait_s()
            if wait is not None and wait <= 0:
                work.stopping.step()
            result = work.stopping.result
            if result is None:
                continue
            del self._works[attempt_id]
            run(attempt_id, functools.partial(work.then, result))

    def close(self) -> None:
        """Release what the stops under way hold (their leaders' pidfds); they are dropped
        unfinished (the thread ends: the next start adopts or reconciles their Runs)."""
        for work in self._works.values():
            work.stopping.close()
        self._works.clear()
