"""``qinglong-edge drain`` against the TLS cluster double: draining, every record settled,
then offline; never offline while a record is in flight; on the bound the session stays
draining and the command says what is left (real CLI, real resident pull and jobs)."""

from __future__ import annotations

import json

from tests.support.cluster_double import ClusterDouble
from tests.support.remote_env import RemoteEnv, dump
from tests.support.wait import wait_until


def _lines(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _transitions(cluster: ClusterDouble) -> list[tuple[str, int | None]]:
    return [(e.json()["status"], e.status) for e in cluster.exchanges_for("transition")]


def _row(cluster: ClusterDouble) -> object:
    return cluster.state.sessions[cluster.worker_id]


def test_an_idle_worker_goes_draining_then_offline_at_once(env: RemoteEnv) -> None:
    assert env.pull("--json").status == 0  # registers, idle
    result = env.cli("--json", "drain")
    assert result.status == 0, dump(result)
    lines = _lines(result.stdout)
    assert [line["status"] for line in lines] == ["draining", "offline"]
    assert lines[-1]["exitStatus"] == 0 and lines[-1]["left"] == []
    assert _transitions(env.cluster) == [("draining", 200), ("offline", 200)]
    row = _row(env.cluster)
    assert (row.status, row.available_slots) == ("offline", 0)  # type: ignore[attr-defined]
    assert row.lease_expires_at_ms <= env.cluster.now_ms()  # type: ignore[attr-defined]
    human = env.cli("drain")  # nothing live any more: nothing to send
    assert human.status == 0 and "no live session to take offline" in human.stdout, dump(human)
    assert len(env.cluster.exchanges_for("transition")) == 2


def test_a_running_job_is_reported_before_offline(env: RemoteEnv) -> None:
    """The resident pull is released (its job goes on), drain takes the job over; while it
    runs the session is draining (heartbeats say 0 slots, offers answer idle
    worker_unavailable), offline comes only after its completion was acknowledged."""
    task = env.gated_job("job")
    env.cluster.add_command_task("echo second")  # must not be claimed while draining
    resident = env.spawn_json()
    env.wait_state("running_acknowledged")
    drain = env.spawn_json_cli("drain")
    assert wait_until(lambda: _transitions(env.cluster)[:1] == [("draining", 200)], timeout=20)
    assert env.finish(resident).status == 0  # released like pull --release: its job goes on
    row = _row(env.cluster)
    assert row.status == "draining" and row.available_slots == 0  # type: ignore[attr-defined]
    offers = len(env.cluster.exchanges_for("offers"))
    env.release("job")
    outcome = env.finish(drain, timeout=60)
    assert outcome.status == 0, dump(outcome)
    assert env.cluster.completion(task.candidate["runId"])["status"] == "succeeded"
    assert _transitions(env.cluster) == [("draining", 200), ("offline", 200)]
    completion = max(i for i, e in enumerate(env.cluster.exchanges) if e.op == "completion")
    offline = max(i for i, e in enumerate(env.cluster.exchanges) if e.op == "transition")
    assert completion < offline  # never offline with an unreported completion
    assert len(env.cluster.exchanges_for("offers")) == offers  # nothing pulled while draining
    assert env.starts("job") == 1 and env.record()["state"] == "completion_acknowledged"
    assert len(env.cluster.state.candidates) == 1  # the second task is still queued


def test_on_the_bound_the_session_stays_draining_and_what_is_left_is_said(env: RemoteEnv) -> None:
    env.write_config(drainTimeoutMs=1500)
    env.gated_job("job")
    resident = env.spawn_json()
    record = env.wait_state("running_acknowledged")
    result = env.cli("--json", "drain")
    assert result.status == 75, dump(result)
    last = _lines(result.stdout)[-1]
    assert last["status"] == "timed_out" and last["exitStatus"] == 75
    assert last["left"] == [{"offerId": record["offer"]["offerId"], "runId": record["offer"]["candidate"]["runId"],
                             "state": "running_acknowledged"}]
    assert _transitions(env.cluster) == [("draining", 200)]  # no offline while it runs
    assert _row(env.cluster).status == "draining"  # type: ignore[attr-defined]
    human = env.cli("drain")  # again: draining -> draining is the cluster's replay
    assert human.status == 75 and "stays draining; still in flight: offer" in human.stdout, dump(human)
    assert _transitions(env.cluster) == [("draining", 200), ("draining", 200)]
    env.finish(resident)
    env.release("job")
    env.write_config(drainTimeoutMs=30_000)
    final = env.cli("--json", "drain")
    assert final.status == 0, dump(final)
    assert _transitions(env.cluster)[-1] == ("offline", 200)


def test_a_pull_against_a_draining_session_claims_nothing(env: RemoteEnv) -> None:
    """After a drain that timed out (the session stays draining) a cron pull gets idle
    worker_unavailable from the cluster and claims nothing."""
    assert env.pull().status == 0
    env.cluster.state.sessions[env.cluster.worker_id].status = "draining"
    env.cluster.add_command_task("echo never")
    result = env.pull("--json")
    assert result.status == 0, dump(result)
    assert result.cycles()[-1]["reason"] == "worker_unavailable"
    assert env.inbox() == {}


def test_without_a_worker_section_it_is_a_configuration_error(env: RemoteEnv) -> None:
    document = json.loads(env.config_path.read_text())
    del document["worker"]
    document["localApi"] = {"listener": {"host": "127.0.0.1", "port": 5799}}
    env.config_path.write_text(json.dumps(document))
    result = env.cli("drain")
    assert result.status == 78 and "the Remote Worker role is not configured" in result.stderr, dump(result)
