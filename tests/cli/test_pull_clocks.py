"""Clocks (issue 23 item 2; spec README "Decisions for clocks"): the real CLI in child
processes, real job wrappers, the TLS cluster double with short leases (6 s: a renewal
every 2 s). The device's wall clock is stepped through the test-only shim
(tests/support/wallclock/sitecustomize.py), the cluster's through the double's own clock;
nothing here sleeps to make time pass.

Each test ends with "Never twice": the job started at most once (its trace file), at most
one completion applied by the cluster.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable

import pytest

from tests.support.cluster_double import ClusterDouble, Fault
from tests.support.pull_env import Outcome
from tests.support.remote_env import RemoteEnv, dump
from tests.support.wait import wait_until
from tests.support.wall_clock import WallClock

LEASE_MS = 6_000


def _wall(env: RemoteEnv, offset_ms: int = 0) -> WallClock:
    """The device's wall clock, shimmed (``offset_ms`` from the real time)."""
    wall = WallClock(env.root, offset_ms)
    env.extra_env = wall.env()
    return wall


def _completions(cluster: ClusterDouble, run_id: str) -> int:
    terminal = {"run.succeeded", "run.failed", "run.cancelled", "run.timed_out"}
    return sum(1 for event in cluster.events(run_id) if event.type in terminal)


def _version(env: RemoteEnv, run_id: str) -> int:
    try:
        return env.cluster.lease_version(run_id)
    except KeyError:  # not claimed yet
        return 0


def _renewals_go_on(env: RemoteEnv, run_id: str, more: int = 2) -> None:
    """Wait until the cluster granted ``more`` renewals after now."""
    start = _version(env, run_id)
    assert wait_until(lambda: _version(env, run_id) >= start + more, timeout=30)


def _succeeded_once(env: RemoteEnv, run_id: str, outcome: object) -> None:
    completion = env.cluster.completion(run_id)
    assert completion is not None and completion["status"] == "succeeded", dump(outcome)  # type: ignore[arg-type]
    assert env.starts("job") == 1 and _completions(env.cluster, run_id) == 1


def _through_a_clock_move(env: RemoteEnv, move: Callable[[], object]) -> tuple[str, Outcome]:
    """A gated job running under a resident ``pull``, then ``move()`` moves a clock; three
    more renewals are taken, the job is released and ``pull`` ends 0: the run and its outcome."""
    task = env.gated_job("job")
    run_id = task.candidate["runId"]
    proc = env.spawn_json()
    env.wait_state("running_acknowledged")
    move()
    _renewals_go_on(env, run_id, 3)
    env.release("job")
    outcome = env.finish(proc, timeout=60)
    assert outcome.status == 0, dump(outcome)
    return run_id, outcome


# -- the device's wall clock steps (NTP) ------------------------------------------------------------------

@pytest.mark.parametrize("step_ms", [120_000, -3_600_000], ids=["plus_120s", "minus_1h"])
def test_a_wall_clock_step_while_a_job_runs_changes_nothing(env: RemoteEnv, step_ms: int) -> None:
    """Before: +120 s SIGTERMed the job as lease_lost within a second; -1 h stopped the
    renewals (due an hour later by the wall clock) and the cluster lease ran out."""
    wall = _wall(env)
    run_id, outcome = _through_a_clock_move(env, lambda: wall.step(step_ms))
    assert not outcome.events("stopped") and not outcome.events("recovery_required"), dump(outcome)
    _succeeded_once(env, run_id, outcome)
    # Issue 23 item 7: renewals never touch the journal; its revisions are the state changes
    # (accepted 0, starting 1, launching 2, started 3, running 4, exit observed 5, completion 6).
    assert env.record()["revision"] == 6 and env.record()["state"] == "completion_acknowledged"


# -- the device and the cluster disagree (skew) ------------------------------------------------------------

@pytest.mark.parametrize("offset_ms", [-240_000, -3_000, 240_000], ids=["behind_4min", "behind_3s", "ahead_4min"])
def test_a_skewed_device_completes_with_times_in_the_clusters_clock(env: RemoteEnv, offset_ms: int) -> None:
    """Before: a device behind the cluster sent a startedAtMs before the attempt's creation
    (409 state_mismatch, the Run retried, the job ran twice); 4 min ahead dropped every
    claim unused (the offered lease looked expired by the wall clock)."""
    _wall(env, offset_ms)
    task = env.quick_job("job")
    run_id = task.candidate["runId"]
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    _succeeded_once(env, run_id, outcome)
    completion = env.cluster.completion(run_id)
    assert completion is not None
    result = completion["result"]
    attempt = env.cluster.attempt(run_id)
    assert attempt.created_at_ms <= result["startedAtMs"] <= result["finishedAtMs"] <= env.cluster.now_ms() + 300_000
    # computed once, stored in the record before the completion (a replay sends the same bytes)
    record = env.record()
    assert (record["resultStartedAtMs"], record["resultFinishedAtMs"]) == (result["startedAtMs"],
                                                                           result["finishedAtMs"])
    # and translated: within a second of the cluster's own clock, whatever the device's wall says
    assert abs(result["startedAtMs"] - attempt.created_at_ms) < 10_000


def test_a_device_ahead_by_more_than_a_third_of_the_lease_renews_once_per_third(env: RemoteEnv) -> None:
    """Before: 256 lease-control calls (and 256 fsync'd record rewrites) in about a second."""
    _wall(env, 240_000)
    task = env.gated_job("job")
    run_id = task.candidate["runId"]
    proc = env.spawn_json()
    env.wait_state("running_acknowledged")  # (the offered lease was renewed at once, and before the launch)
    running = _version(env, run_id)
    assert wait_until(lambda: _version(env, run_id) >= running + 1, timeout=30)
    first = time.monotonic()
    assert wait_until(lambda: _version(env, run_id) >= running + 3, timeout=30)
    elapsed = time.monotonic() - first
    # two renewals at a third of the 6 s lease each: 4 s (load only makes it longer)
    assert elapsed >= 3.5, elapsed
    assert len(env.cluster.exchanges_for("lease-control")) <= _version(env, run_id)  # none refused, no storm
    env.release("job")
    outcome = env.finish(proc, timeout=60)
    assert outcome.status == 0, dump(outcome)
    _succeeded_once(env, run_id, outcome)


def test_a_skew_over_a_minute_is_said_once_per_boot_and_by_doctor(env: RemoteEnv) -> None:
    _wall(env, 240_000)
    first = env.pull("--json")
    assert first.status == 0, first.stderr
    lines = [line for line in first.stderr.splitlines() if "cluster's" in line]
    assert len(lines) == 1 and "240 s ahead of the cluster's" in lines[0] and "work goes on" in lines[0]
    assert "Traceback" not in first.stderr
    second = env.pull("--json")
    assert second.status == 0 and "cluster's" not in second.stderr  # once per boot (a notice in RAM)
    doctor = env.cli("doctor", "--json")
    checks = {check["name"]: check for check in doctor.lines()[0]["checks"]}
    skew = checks["clock_skew"]
    assert (skew["ok"], skew["required"]) == (False, False) and "240 s ahead of" in skew["detail"]
    assert "NTP" in skew["remedy"]


def test_a_wall_clock_after_2100_is_one_line_and_work_goes_on(env: RemoteEnv) -> None:
    """Bad input: a clock years off. TLS still works (OpenSSL keeps the real time in the
    shim); the skew is said once; the job runs once and its completion is accepted."""
    _wall(env, 4_200_000_000_000 - int(time.time() * 1000))  # 2103
    task = env.quick_job("job")
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    assert "Traceback" not in outcome.stderr
    assert len([line for line in outcome.stderr.splitlines() if "cluster's" in line]) == 1
    _succeeded_once(env, task.candidate["runId"], outcome)


def test_a_wall_clock_before_the_build_date_claims_nothing(env: RemoteEnv) -> None:
    _wall(env, 1_000_000_000 - int(time.time() * 1000))  # 1970-01-12: a router without an RTC
    env.quick_job("job")
    outcome = env.pull("--json")
    assert outcome.last()["code"] == "clock_not_set", dump(outcome)
    assert "Traceback" not in outcome.stderr
    assert env.cluster.exchanges_for("offers") == [] and env.claim() is None and env.starts("job") == 0


# -- the cluster's clock moves -----------------------------------------------------------------------------

def test_a_renewal_whose_renewed_at_went_back_is_accepted(env: RemoteEnv) -> None:
    """The cluster's clock went back 2 minutes between two renewals: the newer version is
    taken (before: 'before the stored lease's renewal', every renewal refused, lease lost),
    and the completion's times, translated by the new offset and clamped to the attempt's
    creation, are accepted."""
    run_id, outcome = _through_a_clock_move(env, lambda: env.cluster.clock.shift(-120_000))
    assert not outcome.events("call_failed") and not outcome.events("stopped"), dump(outcome)
    _succeeded_once(env, run_id, outcome)


@pytest.mark.parametrize("jump_ms", [600_000, -600_000], ids=["ahead_10min", "back_10min"])
def test_a_cluster_clock_jumping_far_ends_the_record_without_running_twice(env: RemoteEnv, jump_ms: int) -> None:
    """Bad input, a cluster whose time jumps 10 minutes. Ahead: by its own clock the lease
    ran out, it refuses the renewal (409). Back: its own check (startedAtMs at or after the
    attempt's creation and at most 5 minutes ahead of it) can accept no completion. Either
    way the record ends recovery_required (the cluster retries the Run once its lease is
    over), nothing runs twice and nothing is printed as a traceback."""
    task = env.gated_job("job")
    run_id = task.candidate["runId"]
    proc = env.spawn_json()
    env.wait_state("running_acknowledged")
    env.cluster.clock.shift(jump_ms)
    if jump_ms < 0:
        _renewals_go_on(env, run_id, 2)  # renewals are still taken
        env.release("job")
    outcome = env.finish(proc, timeout=60)
    assert outcome.status == 0, dump(outcome)
    assert "Traceback" not in outcome.stderr
    record = env.record()
    assert (record["state"], record["recoveryReason"]) == ("recovery_required", "lease_lost_local_execution_stopped")
    assert env.cluster.completion(run_id) is None and env.starts("job") == 1


# -- retries before the local expiry (regression) ----------------------------------------------------------

def test_a_503_with_retry_after_past_the_expiry_is_retried_before_it(env: RemoteEnv) -> None:
    """Regression (issue 23, "One 503 kills a running job"): lease-control answered 503
    with Retry-After: 120. The retry was scheduled exactly at the local lease expiry,
    where the expiry check fires first: the job was stopped as lease_lost. Retry-After is
    honoured only up to a point strictly before the lease stop."""
    task = env.gated_job("job")
    run_id = task.candidate["runId"]
    proc = env.spawn_json()
    env.wait_state("running_acknowledged")
    env.cluster.push_fault(Fault.unavailable("lease-control", retry_after="120"))
    assert wait_until(lambda: any(x.op == "lease-control" and x.status == 503 for x in env.cluster.exchanges), timeout=30)
    _renewals_go_on(env, run_id, 2)
    env.release("job")
    outcome = env.finish(proc, timeout=60)
    assert outcome.status == 0, dump(outcome)
    failed = outcome.events("call_failed")
    assert [(e["operation"], e["httpStatus"]) for e in failed] == [("lease-control", 503)], dump(outcome)
    assert not outcome.events("stopped"), dump(outcome)
    _succeeded_once(env, run_id, outcome)


# -- a frozen or killed agent (issue 23 item 4) -------------------------------------------------------------

def _lease_file(env: RemoteEnv) -> dict[str, object]:
    (path,) = env.runtime.glob("job.*.json")
    data: dict[str, object] = json.loads(path.read_bytes())
    return data


def _receipt(env: RemoteEnv) -> dict[str, object]:
    (path,) = env.receipts()
    data: dict[str, object] = json.loads(path.read_bytes())
    return data


@pytest.mark.parametrize("how", ["sigstop", "sigkill"])
def test_a_frozen_or_killed_agent_never_leaves_the_job_running_past_its_lease(env: RemoteEnv, how: str) -> None:
    """Before: a pull frozen for 15 s let the job run 7 s past its cluster lease. The job
    wrapper reads the per-job lease file (RAM) and stops the job itself so that it is gone
    by the lease's local expiry; the record then ends recovery_required (lease lost),
    never a completion."""
    task = env.gated_job("job")
    run_id = task.candidate["runId"]
    proc = env.spawn_json()
    env.wait_state("running_acknowledged")
    lease = env.cluster.state.lease(env.record()["offer"]["offerId"])
    os.kill(proc.pid, signal.SIGSTOP if how == "sigstop" else signal.SIGKILL)
    frozen_at = time.monotonic()
    assert wait_until(env.receipts, timeout=30)  # the wrapper stopped the job and wrote its receipt
    stopped = list(env.runtime.glob("job.*.stopped"))
    assert len(stopped) == 1  # the wrapper's mark
    receipt = _receipt(env)
    # gone by the lease's expiry (the cluster's clock is the real one here, as is the wrapper's)
    assert receipt["exitCode"] == 143 and receipt["finishedAtMs"] <= env.cluster.state.lease(
        env.record()["offer"]["offerId"]).expires_at_ms
    assert time.monotonic() - frozen_at < LEASE_MS / 1000 + 5
    assert lease.expires_at_ms >= receipt["finishedAtMs"] - 10_000  # sanity: the same lease, not a later one
    if how == "sigstop":
        os.kill(proc.pid, signal.SIGCONT)
        outcome = env.finish(proc, timeout=60)
    else:
        env.finish(proc, timeout=10)
        outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    record = env.record()
    assert (record["state"], record["recoveryReason"]) == ("recovery_required", "lease_lost_local_execution_stopped")
    assert env.cluster.completion(run_id) is None and env.starts("job") == 1
    assert list(env.runtime.glob("job.*")) == []  # nothing more to do: the lease files are gone



def test_a_completion_replayed_after_a_wall_step_sends_the_same_times(env: RemoteEnv) -> None:
    """The result times are computed once, when the exit is observed, and stored in the
    record before the first completion: the pull dies right after the cluster applied it
    (its answer lost), the wall clock steps an hour, and the replay sends the same bytes."""
    wall = _wall(env)
    task = env.quick_job("job")
    run_id = task.candidate["runId"]
    crashed = env.pull("--json", env={"QINGLONG_EDGE_CRASHPOINT": "runner.completion_answered"})
    assert crashed.status == 137, dump(crashed)
    stored = env.record()
    wall.step(3_600_000)
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    sent = [x.json()["result"] for x in env.cluster.exchanges_for("completion")]
    assert len(sent) >= 2 and all(result == sent[0] for result in sent), sent
    assert (sent[0]["startedAtMs"], sent[0]["finishedAtMs"]) == (stored["resultStartedAtMs"],
                                                                 stored["resultFinishedAtMs"])
    assert env.record()["state"] == "completion_acknowledged" and _completions(env.cluster, run_id) == 1
