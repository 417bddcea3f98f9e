"""Issue 23 item 3 at the command: a hand-run pull with a job in flight stopped by Ctrl-C
(SIGINT), SIGTERM or SIGHUP (its terminal closed) says how many seconds the job's lease
has left and what to run; SIGHUP behaves as SIGTERM (summary, handover.json, exit 0; the
job goes on); the next pull takes the job over at once. Real CLI, real job wrapper, the
TLS cluster double (30 s leases, as the reference)."""

from __future__ import annotations

import json
import re
import signal

import pytest

from tests.support.cluster_double import ClusterDouble
from tests.support.remote_env import RemoteEnv, dump
from tests.support.wait import wait_until


@pytest.fixture
def cluster(shared_cluster: ClusterDouble) -> ClusterDouble:
    """The reference's 30 s run lease (not the short leases of tests/cli/conftest.py)."""
    shared_cluster.reset()
    return shared_cluster


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stopped_hand_run_pull_says_how_long_its_jobs_have_and_what_to_run(env: RemoteEnv,
                                                                             signum: signal.Signals) -> None:
    task = env.gated_job("job")
    proc = env.spawn()  # human output, as by hand
    try:
        env.wait_state("running_acknowledged", timeout=30)
        stopped = RemoteEnv.stop(proc, signum)
    finally:
        env.release("job")
    assert stopped.status == 0, (stopped.stdout, stopped.stderr)
    assert "Traceback" not in stopped.stderr
    (summary,) = [line for line in stopped.stdout.splitlines() if line.startswith("pull: resident ")]
    assert f"stopped by {signum.name}, 1 left running for the next pull" in summary, summary
    left = re.search(r"their leases run out in (\d+) s unless a pull renews them", summary)
    assert left is not None and 0 < int(left.group(1)) <= 30, summary
    assert f"run `qinglong-edge --config {env.config_path} pull` now" in summary
    handover = json.loads((env.runtime / "handover.json").read_bytes())
    assert (handover["inFlight"], handover["signal"]) == (1, signum.name)
    # The job went on; the next pull takes it over at once and completes it, once.
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    assert env.record()["state"] == "completion_acknowledged" and env.starts("job") == 1
    assert env.cluster.completion(task.candidate["runId"]) is not None


def test_the_json_summary_carries_the_lease_time_left(env: RemoteEnv) -> None:
    env.gated_job("job")
    proc = env.spawn_json()
    try:
        assert wait_until(lambda: env.state() == "running_acknowledged", timeout=30)
        stopped = RemoteEnv.stop(proc, signal.SIGHUP)
    finally:
        env.release("job")
    summary = stopped.summary()
    assert summary is not None and summary["aborted"] == "SIGHUP" and summary["exitStatus"] == 0
    assert 0 < summary["leaseLeftMs"] <= 30_000
    assert env.run_to_end().status == 0
