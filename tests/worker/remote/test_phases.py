"""A track's phase (worker/remote/runner_state.py): the table itself, the rules that move a
track along it, and the phases real records pass through in a real ``pull``.

The real runs are the real CLI in a child process against the TLS cluster double, with the
phase setter of :class:`~qinglong_edge.worker.remote.runner_state.Track` wrapped (by the
probe below, before the CLI starts) to append each move to a file.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import pytest

from qinglong_edge.errors import EdgeError
from qinglong_edge.worker.remote import runner_state
from qinglong_edge.worker.remote.runner_state import (
    CLUSTER_TERMINAL,
    DONE,
    LAST_CALL,
    LEASE_LOST,
    LIVE,
    PHASE_NEXT,
    PHASES,
    Track,
)
from tests.support.cli import Entry, repo_entry
from tests.support.cluster_double import ClusterDouble
from tests.support.remote_env import RemoteEnv, dump

PROBE = """
import json, os, sys
from qinglong_edge.worker.remote.runner_state import Track
_trace = os.environ.pop("QLE_TEST_PHASE_TRACE")
_phase = Track.phase
def _moved(self, phase):
    before = self.phase
    _phase.fset(self, phase)
    with open(_trace, "a") as out:
        out.write(json.dumps([self.offer_id, before, phase]) + "\\n")
Track.phase = _phase.setter(_moved)
from qinglong_edge.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _record(offer_id: str = "offer-1") -> dict[str, Any]:
    lease = {"renewedAtMs": 1000, "expiresAtMs": 7000, "version": 1, "leaseGeneration": 1}
    return {"offer": {"offerId": offer_id, "lease": lease, "candidate": {"runId": "r", "attemptId": "a"}},
            "state": "accepted", "revision": 1}


def _track_in(phase: str) -> Track:
    """A track moved to ``phase`` along the table (the shortest way from ``live``)."""
    paths = {LIVE: [LIVE]}
    todo = [LIVE]
    while todo:
        here = todo.pop(0)
        for there in sorted(PHASE_NEXT[here]):
            if there not in paths:
                paths[there] = [*paths[here], there]
                todo.append(there)
    track = Track(_record(), 0)
    for step in paths[phase][1:]:
        track.phase = step
    assert track.phase == phase
    return track


# -- the table ------------------------------------------------------------------------------------

def test_every_allowed_move_is_taken_and_every_other_raises() -> None:
    assert set(PHASE_NEXT) == set(PHASES) and PHASES[0] == LIVE
    for phase in PHASES:
        for to in PHASE_NEXT[phase]:
            track = _track_in(phase)
            track.phase = to
            assert track.phase == to and track.done == (to == DONE)
        for to in set(PHASES) - PHASE_NEXT[phase]:
            track = _track_in(phase)
            with pytest.raises(EdgeError) as caught:
                track.phase = to
            assert caught.value.code == "invalid_phase" and track.phase == phase
    assert [phase for phase in PHASES if not PHASE_NEXT[phase]] == [DONE]


def test_a_new_track_is_live() -> None:
    track = Track(_record(), 5)
    assert (track.phase, track.done) == (LIVE, False)
    assert repr(track) == "<Track offer-1 accepted live>"


def test_a_lost_lease_outranks_a_terminal_run() -> None:
    track = _track_in(LIVE)
    track.run_terminal()
    assert (track.phase, track.stop_reason) == (CLUSTER_TERMINAL, "terminal")
    track.run_terminal()  # said again: nothing moves
    assert track.phase == CLUSTER_TERMINAL
    track.phase = LAST_CALL
    track.run_terminal()  # the last call stays the last call
    assert track.phase == LAST_CALL
    track.lose_lease()
    track.lose_lease()  # lost already: nothing moves
    assert track.phase == LEASE_LOST
    track.run_terminal()  # lost stays lost (the record says lease_lost_local_execution_stopped)
    assert (track.phase, track.stop_reason) == (LEASE_LOST, "terminal")


def test_a_stop_reason_already_set_is_kept_by_a_terminal_run() -> None:
    track = _track_in(LIVE)
    track.stop_reason = "user"
    track.run_terminal()
    assert (track.phase, track.stop_reason) == (CLUSTER_TERMINAL, "user")


def test_a_done_track_moves_no_more() -> None:
    track = _track_in(DONE)
    with pytest.raises(EdgeError):
        track.lose_lease()
    assert track.done


def test_the_module_names_every_phase_it_exports() -> None:
    assert {name for name in runner_state.__all__ if getattr(runner_state, name, None) in PHASES} == {
        "LIVE", "CLUSTER_TERMINAL", "LAST_CALL", "LEASE_LOST", "DONE"}


# -- real runs ------------------------------------------------------------------------------------

@pytest.fixture
def env(tmp_path: pathlib.Path, shared_remote_cluster: ClusterDouble) -> RemoteEnv:
    shared_remote_cluster.reset()
    base = repo_entry()
    entry = Entry("phases", (sys.executable, "-c", PROBE), base.env, base.cwd)
    device = RemoteEnv(tmp_path, shared_remote_cluster, entry=entry)
    device.extra_env["QLE_TEST_PHASE_TRACE"] = str(tmp_path / "phases.jsonl")
    return device


def _phases(env: RemoteEnv) -> list[str]:
    """The phases the one record passed through (``live`` first), checked against the table."""
    path = env.root / "phases.jsonl"
    moves = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    assert len({offer for offer, _, _ in moves}) <= 1, moves
    phases = [LIVE]
    for _, before, after in moves:
        assert before == phases[-1] and after in PHASE_NEXT[before], moves
        phases.append(after)
    return phases


def test_a_job_that_runs_to_its_end_goes_from_live_to_done(env: RemoteEnv) -> None:
    env.quick_job("job", exit_code=3)
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    assert env.record()["state"] == "completion_acknowledged"
    assert _phases(env) == [LIVE, DONE]


def test_a_cluster_side_cancel_ends_live_then_done(env: RemoteEnv) -> None:
    task = env.gated_job("job")
    proc = env.spawn_json()
    env.wait_state("running_acknowledged")
    assert env.cluster.request_cancel(task.candidate["runId"]) == "accepted"
    outcome = env.finish(proc, timeout=30)
    assert outcome.status == 0, dump(outcome)
    completion = env.cluster.completion(task.candidate["runId"])
    assert completion is not None and completion["status"] == "cancelled"
    assert _phases(env) == [LIVE, DONE]


def test_a_lost_lease_passes_through_lease_lost(env: RemoteEnv) -> None:
    env.gated_job("job")
    proc = env.spawn_json()
    record = env.wait_state("running_acknowledged")
    env.cluster.state.expire_lease(record["offer"]["offerId"])
    outcome = env.finish(proc, timeout=30)
    assert outcome.status == 0, dump(outcome)
    final = env.record()
    assert (final["state"], final["recoveryReason"]) == ("recovery_required", "lease_lost_local_execution_stopped")
    assert _phases(env) == [LIVE, LEASE_LOST, DONE]


def test_a_start_failure_goes_from_live_to_done(env: RemoteEnv, tmp_path: pathlib.Path) -> None:
    env.quick_job("job", working_directory=str(tmp_path / "missing"))
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    assert env.record()["state"] == "start_failure_acknowledged"
    assert _phases(env) == [LIVE, DONE]


def test_a_run_the_cluster_ended_meanwhile_passes_through_cluster_terminal(env: RemoteEnv) -> None:
    task = env.gated_job("job")
    run_id = task.candidate["runId"]
    proc = env.spawn_json()
    env.wait_state("running_acknowledged")
    with env.cluster.state.lock:  # the run ended on the cluster without this worker (an operator, a reaper)
        attempt = env.cluster.attempt(run_id)
        attempt.status = attempt.run_status = "failed"
        attempt.lease.status = "completed"
    outcome = env.finish(proc, timeout=30)
    assert outcome.status == 0, dump(outcome)
    assert outcome.events("stopped")[0]["reason"] == "terminal"
    final = env.record()
    assert (final["state"], final["recoveryReason"]) == ("recovery_required", "control_plane_terminal")
    assert _phases(env) == [LIVE, CLUSTER_TERMINAL, DONE]
