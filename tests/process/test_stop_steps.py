"""Stopping: the one stop algorithm as timed steps (process/stop.py), on real processes.

:func:`stop` is a loop over the same steps (tests/process/test_stop.py covers its
outcomes); here: the phases, that a step never sleeps, and when the next one is due.
"""

from __future__ import annotations

import time

import pytest

from qinglong_edge.errors import ExecutionError
from qinglong_edge.process.stop import STOP_TRANSITIONS, Stopping, StopResult
from tests.support.jobs import alive, descendants_by_marker, reap, start_job
from tests.support.wait import wait_until

GRACE = {"terminate_grace_ms": 300, "kill_grace_ms": 300, "poll_ms": 10}


def _walk(stopping: Stopping) -> tuple[list[str], list[float]]:
    """Step ``stopping`` to its end, sleeping as it asks; its phases (each once) and how
    long each step took."""
    phases, took = [stopping.phase], []
    while True:
        started = time.monotonic()
        delay = stopping.step()
        took.append(time.monotonic() - started)
        if stopping.phase != phases[-1]:
            phases.append(stopping.phase)
        if delay is None:
            return phases, took
        assert 0 <= delay <= 0.010 + 1e-9  # at most poll_ms
        wait = stopping.wait_s()
        assert wait is not None and wait <= delay
        time.sleep(delay)  # the scenario: the controller's loop waits what the step asks


def test_a_job_ignoring_term_walks_new_terminating_killing_done_and_no_step_sleeps(tmp_path: object) -> None:
    job = start_job("trap '' TERM INT HUP; exec sleep 100025", str(tmp_path))
    try:
        assert wait_until(lambda: bool(descendants_by_marker("100025")))
        stopping = Stopping(job.handle, **GRACE)
        assert (stopping.phase, stopping.result, stopping.wait_s()) == ("new", None, 0.0)
        started = time.monotonic()
        phases, took = _walk(stopping)
        elapsed = time.monotonic() - started
        # The SIGKILL and the kill grace's first poll are one step: a job that dies at once
        # is "done" by the end of that step, and "killing" is never seen between steps.
        assert phases in (["new", "terminating", "killing", "done"], ["new", "terminating", "done"])
        assert stopping.result == StopResult("stopped", "SIGKILL")  # only a stop past "killing" says so
        assert 0.3 <= elapsed < 0.3 + 0.3 + 0.5
        assert max(took) < 0.25  # a step does what is due and returns: the waiting is the caller's
        assert len(took) >= 10  # polled through the grace (300 ms at 10 ms), not slept through
        assert not alive(job.pid)
        assert stopping.step() is None and stopping.wait_s() is None  # done stays done
    finally:
        reap(job.process)


def test_a_plain_job_ends_in_the_terminate_grace(tmp_path: object) -> None:
    job = start_job("exec sleep 100026", str(tmp_path))
    try:
        assert wait_until(lambda: bool(descendants_by_marker("100026")))
        stopping = Stopping(job.handle, **GRACE)
        phases, _ = _walk(stopping)
        assert phases == ["new", "terminating", "done"]
        assert stopping.result == StopResult("stopped", "SIGTERM")
    finally:
        reap(job.process)


def test_nothing_alive_or_a_bad_handle_ends_in_the_first_step(tmp_path: object) -> None:
    job = start_job("exit 0", str(tmp_path))
    try:
        assert wait_until(lambda: not alive(job.pid))
        gone = Stopping(job.handle, **GRACE)
        assert gone.step() is None and gone.phase == "done"
        assert gone.result == StopResult("already_exited")
    finally:
        reap(job.process)
    bad = Stopping("ql3lp1.not-a-handle", **GRACE)
    assert bad.step() is None and bad.result == StopResult("unknown", reason="invalid_handle")


def test_durations_are_checked_when_the_stop_is_made() -> None:
    with pytest.raises(ExecutionError) as refused:
        Stopping("ql3lp1.x", terminate_grace_ms=10, kill_grace_ms=10, poll_ms=25)
    assert refused.value.code == "invalid_input"


def test_the_phase_table_is_the_one_the_docstring_draws() -> None:
    drawn = {"new": {"terminating", "done"}, "terminating": {"killing", "done"}, "killing": {"done"}, "done": set()}
    assert drawn == STOP_TRANSITIONS
