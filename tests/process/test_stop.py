"""stop(handle): verified SIGTERM -> grace -> SIGKILL -> cgroup kill, on real processes.

Grace times are short (300 ms) to keep the suite fast; the algorithm is the same.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from qinglong_edge.errors import ExecutionError
from qinglong_edge.process.cgroups import RunCgroup
from qinglong_edge.process.identity import ProcessIdentity, capture, encode_handle
from qinglong_edge.process.stop import StopResult, stop
from tests.support.jobs import alive, descendants_by_marker, kill_pids, read_text, reap, start_job, wait_until

GRACE = {"terminate_grace_ms": 300, "kill_grace_ms": 300, "poll_ms": 10}


def test_stops_a_plain_job_with_sigterm(tmp_path: object) -> None:
    job = start_job("sleep 1000", str(tmp_path))
    try:
        result = stop(job.handle, **GRACE)
        assert result == StopResult("stopped", "SIGTERM") and result.conclusive
        assert not alive(job.pid)
    finally:
        reap(job.process)


def test_grandchild_gets_sigterm_first_and_can_clean_up(tmp_path: object) -> None:
    marker = os.path.join(str(tmp_path), "cleaned-up")
    script = f"sh -c 'trap \"echo bye > {marker}; exit 0\" TERM; sleep 1000 & wait' & wait"
    job = start_job(script, str(tmp_path))
    try:
        assert wait_until(lambda: len(descendants_by_marker("1000")) == 1)
        result = stop(job.handle, **GRACE)
        assert result.conclusive
        assert read_text(marker) == "bye\n"  # the group got SIGTERM before any SIGKILL
    finally:
        reap(job.process)
        kill_pids(descendants_by_marker("1000"))


def test_job_ignoring_term_int_hup_is_killed_after_the_grace(tmp_path: object) -> None:
    job = start_job("trap '' TERM INT HUP; sleep 100021 & wait; while :; do wait; done", str(tmp_path))
    try:
        assert wait_until(lambda: len(descendants_by_marker("100021")) == 1)
        started = time.monotonic()
        result = stop(job.handle, **GRACE)
        elapsed = time.monotonic() - started
        assert result == StopResult("stopped", "SIGKILL")
        assert 0.3 <= elapsed < 0.3 + 0.3 + 0.5  # TERM grace waited, then bounded by the KILL grace
        assert not alive(job.pid) and not descendants_by_marker("100021")
    finally:
        reap(job.process)


def test_setsid_and_double_fork_escapees_die_with_the_cgroup(run_cgroup: RunCgroup, tmp_path: object) -> None:
    marker = "100022.5"
    script = f"setsid sh -c 'sleep {marker} & sleep {marker} & wait' & ( sleep {marker} & ) & wait"
    job = start_job(script, str(tmp_path), cgroup=run_cgroup)
    try:
        assert wait_until(lambda: len(descendants_by_marker(marker)) == 3)
        runs_pids = set(descendants_by_marker(marker))
        assert any(os.getpgid(p) != job.pid for p in runs_pids)  # the setsid ones left the group
        result = stop(job.handle, run_cgroup, **GRACE)
        assert result.conclusive
        # Verified: nothing of the Run survives, inside or outside its process group.
        assert not descendants_by_marker(marker)
        assert not any(alive(p) for p in runs_pids)
        assert not run_cgroup.live_members()
    finally:
        reap(job.process)
        kill_pids(descendants_by_marker(marker))


def test_without_a_cgroup_the_group_dies_but_setsid_escapees_are_out_of_reach(tmp_path: object) -> None:
    """What is verified where no cgroup exists: the double fork stays in the process group
    and dies; a setsid escapee is in no group of ours and survives (the reason we use cgroups)."""
    marker_grouped, marker_escaped = "100023.5", "100023.75"
    script = f"setsid sleep {marker_escaped} & ( sleep {marker_grouped} & ) & wait"
    job = start_job(script, str(tmp_path))
    try:
        assert wait_until(lambda: descendants_by_marker(marker_grouped) and descendants_by_marker(marker_escaped))
        result = stop(job.handle, None, **GRACE)
        assert result.conclusive
        assert not descendants_by_marker(marker_grouped)
        assert descendants_by_marker(marker_escaped)
    finally:
        reap(job.process)
        kill_pids(descendants_by_marker(marker_escaped))


def test_exited_leader_still_pins_its_group_and_leftovers_are_stopped(tmp_path: object) -> None:
    marker = "100024.5"
    job = start_job(f"sleep {marker} & exit 3", str(tmp_path))
    try:
        assert wait_until(lambda: not alive(job.pid) and bool(descendants_by_marker(marker)))
        # The leader is our unreaped zombie: its group number cannot be recycled.
        result = stop(job.handle, **GRACE)
        assert result == StopResult("stopped", "SIGTERM")
        assert not descendants_by_marker(marker)
        assert job.process.wait(timeout=5) == 3
    finally:
        reap(job.process)


def test_already_exited_job_is_not_signalled(tmp_path: object) -> None:
    job = start_job("exit 0", str(tmp_path))
    try:
        assert wait_until(lambda: not alive(job.pid))
        assert stop(job.handle, **GRACE) == StopResult("already_exited")
    finally:
        reap(job.process)


def test_children_exiting_during_enumeration_are_tolerated(run_cgroup: RunCgroup, tmp_path: object) -> None:
    # A job that forks short-lived children all the time: some are enumerated and gone
    # (ESRCH) before the signal; the stop still ends only when everything is verified gone.
    job = start_job("while :; do /bin/true; sleep 0.001; done", str(tmp_path), cgroup=run_cgroup)
    try:
        time.sleep(0.1)
        for _ in range(3):
            result = stop(job.handle, run_cgroup, **GRACE)
            assert result.conclusive
            assert not alive(job.pid)
            assert not run_cgroup.live_members()
    finally:
        reap(job.process)


def test_recycled_pid_is_never_signalled(tmp_path: object) -> None:
    """A handle whose pid now belongs to an unrelated process (other start time)."""
    marker = os.path.join(str(tmp_path), "signalled")
    unrelated = subprocess.Popen(
        ["sh", "-c", f"trap 'echo TERM > {marker}; exit 1' TERM; while :; do sleep 0.05; done"],
        start_new_session=True,
    )
    try:
        real = capture(unrelated.pid)
        assert real is not None
        recorded = ProcessIdentity(real.boot_id, real.pid, real.pgid, str(int(real.start_time) - 1))
        result = stop(encode_handle("h-reused", recorded), **GRACE)
        assert result == StopResult("already_exited")
        time.sleep(0.2)
        assert unrelated.poll() is None and not os.path.exists(marker)
    finally:
        unrelated.kill()
        unrelated.wait()


def test_gone_leader_gives_no_authority_over_a_group_number(tmp_path: object) -> None:
    """The recorded leader is gone; the group number belongs to a live unrelated group."""
    unrelated = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    try:
        real = capture(unrelated.pid)
        assert real is not None
        dead = subprocess.Popen(["true"])
        dead.wait()
        recorded = ProcessIdentity(real.boot_id, dead.pid, real.pgid, "1")
        assert stop(encode_handle("h-gone", recorded), **GRACE) == StopResult("already_exited")
        assert unrelated.poll() is None
    finally:
        unrelated.kill()
        unrelated.wait()


def test_invalid_handle_is_unknown() -> None:
    assert stop("ql3lp1.bm90", **GRACE) == StopResult("unknown", reason="invalid_handle")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"terminate_grace_ms": 0, "kill_grace_ms": 300},
        {"terminate_grace_ms": 300, "kill_grace_ms": 30_001},
        {"terminate_grace_ms": 300, "kill_grace_ms": 300, "poll_ms": 400},
        {"terminate_grace_ms": True, "kill_grace_ms": 300},
    ],
    ids=["zero-grace", "grace-too-long", "poll-over-grace", "bool"],
)
def test_rejects_out_of_range_durations(kwargs: dict[str, int]) -> None:
    with pytest.raises(ExecutionError) as info:
        stop("ql3lp1.x", **kwargs)
    assert info.value.code == "invalid_input"
