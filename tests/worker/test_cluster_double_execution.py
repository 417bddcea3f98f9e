"""The cluster double's execution routes behave as the reference cluster's (remote-execution.md
3, checked against the reference repositories; see tests/support/cluster_*.py): the section 6
golden vectors byte for byte over real TLS through the agent's own transport, the replay
answers, the lease version rules, deadline -> stop_requested{timeout}, cancel ->
stop_requested{user}, the terminal answer, start-failure and the completion outcome mapping.
Time moves by advancing the double's clock, never by sleeping.
"""

from __future__ import annotations

import hashlib
import pathlib

import pytest

from tests.support.cluster_calls import TOKEN, WorkerCalls
from tests.support.cluster_double import ClusterDouble
from tests.support.cluster_tasks import PYTHON_SECRET_VALUE, argv_command, secret
from tests.support.cluster_wire import compact
from tests.worker import execution_vectors as V


def claimed(cluster: ClusterDouble, worker: WorkerCalls, command: str = "true", **options: object) -> str:
    """Queue a custom task, claim it; its runId."""
    cluster.add_command_task(command, **options)  # type: ignore[arg-type]
    worker.claim()
    return worker.run_id


# -- section 6, byte for byte ------------------------------------------------------------------

def test_golden_vectors_of_section_6(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    cluster.set_clock(1000)
    assert cluster.define_secret("API_KEY", "s3cr3t") == V.SECRET_REF
    cluster.add_task("custom", task_id="task-1", command=argv_command("/usr/bin/node", "job.js"),
                     environment=[secret("API_KEY", V.SECRET_REF)], source_content_digest="a" * 64, run_id="run-1",
                     attempt_id="attempt-1", timeout_ms=None, placement=None)
    offer = worker.claim("offer-1", TOKEN)
    assert (worker.generation, offer["executionDigest"], worker.version) == (2, V.EXECUTION_DIGEST, 1)
    for version in (2, 3):
        cluster.advance_clock(1)
        assert worker.renew()["leaseVersion"] == version
    post = worker.transport.post_json

    assert compact(worker.fence7()) == V.STARTING
    assert post(worker.path("starting"), V.STARTING, max_response_bytes=16_384).body == V.STARTING_APPLIED
    replay = post(worker.path("starting"), V.STARTING, max_response_bytes=16_384).body
    assert replay == V.STARTING_APPLIED.replace(b'"applied"', b'"already_starting"')

    assert compact(worker.secrets_body()) == V.SECRETS
    assert post(worker.path("secrets"), V.SECRETS, max_response_bytes=262_144,
                max_request_bytes=65_536).body == V.SECRETS_ANSWER

    assert compact(worker.running_body(handle=V.HANDLE)) == V.RUNNING
    started = cluster.advance_clock(4)
    assert post(worker.path("running"), V.RUNNING, max_response_bytes=16_384).body == \
        V.RUNNING_APPLIED.format(started=started).encode()

    assert compact(worker.lease_body()) == V.LEASE_CONTROL
    renewed = cluster.advance_clock(995)
    assert post(worker.path("lease-control"), V.LEASE_CONTROL, max_response_bytes=4096).body == \
        V.LEASE_RENEWED.format(renewed=renewed, expires=renewed + 30_000).encode()
    worker.version = 4

    body = worker.artifact(V.LOG)
    assert body == b"\x00\x00\x01\x65" + V.ARTIFACT_HEADER + V.LOG and len(body) == 367
    assert hashlib.sha256(body).hexdigest() == V.ARTIFACT_BODY_SHA256
    stored = worker.upload(body=body)
    assert (stored.status, stored.body) == (200, V.ARTIFACT_STORED)

    cluster.advance_clock(1000)
    assert compact(worker.completion_body(V.LOG, started=1005, finished=3000)) == V.COMPLETION
    assert post(worker.path("completion"), V.COMPLETION, max_response_bytes=4096,
                max_request_bytes=16_384).body == V.COMPLETION_APPLIED

    attempt = cluster.attempt("run-1")
    assert (attempt.status, attempt.run_status, attempt.exit_code, attempt.error_code) == (
        "succeeded", "succeeded", 0, None)
    assert (attempt.lease.status, cluster.lease_version("run-1")) == ("completed", 5)
    assert [e.type for e in cluster.events("run-1")] == [
        "attempt.starting", "attempt.running", "run.running", "attempt.succeeded", "run.succeeded"]
    assert cluster.events("run-1")[-2].dedupe_key == "remote-completion:attempt-1:1:1:attempt"
    artifact = cluster.artifact("run-1")
    assert artifact is not None and (artifact.data, artifact.sha256, artifact.truncated) == (
        V.LOG, V.LOG_SHA256, False)
    completion = cluster.completion("run-1")
    assert completion is not None and completion["status"] == "succeeded"
    assert completion["result"] == {"outcome": "succeeded", "startedAtMs": 1005, "finishedAtMs": 3000, "exitCode": 0}
    assert cluster.fence_reasons() == []


# -- replays ---------------------------------------------------------------------------------------

def test_starting_replays_and_the_deadline_in_the_snapshot(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    claimed(cluster, worker, timeout_ms=5_000)
    now = cluster.now_ms()
    first = worker.call("starting")
    assert (first["status"], first["snapshot"]["deadlineAtMs"]) == ("applied", now + 5_000)
    again = worker.call("starting")
    assert again == {**first, "status": "already_starting"}
    worker.call("running", worker.running_body())
    late = worker.call("starting")
    assert (late["status"], late["snapshot"]["attemptStatus"], late["snapshot"]["executorHandle"]) == (
        "already_running", "running", "ql3lp1.handle")
    assert [e.type for e in cluster.events(worker.run_id)].count("attempt.starting") == 1


def test_running_replays_only_with_identical_fields(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    claimed(cluster, worker)
    applied = worker.run()
    assert applied["status"] == "applied" and applied["snapshot"]["callbackSequence"] == 1
    assert worker.call("running", worker.running_body())["status"] == "already_running"
    for change in ({"handle": "ql3lp1.other"}, {"sequence": 2}, {"digest": "0" * 64}, {"log_id": None}):
        answer = worker.raw("running", worker.running_body(**change))  # type: ignore[arg-type]
        assert (answer.status, answer.code) == (409, "worker_activation_fenced")
    assert [r.reason for r in cluster.fence_reasons("running")] == ["replay_mismatch"] * 4


def test_running_with_a_skipped_sequence_is_fenced(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    claimed(cluster, worker)
    worker.start()
    answer = worker.raw("running", worker.running_body(sequence=2))
    assert (answer.status, answer.code) == (409, "worker_activation_fenced")
    assert cluster.fence_reasons("running")[-1].reason == "replay_mismatch"
    assert cluster.attempt(worker.run_id).status == "starting"


def test_upload_and_completion_replays(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    claimed(cluster, worker)
    worker.run()
    assert worker.upload(b"log\n").json()["status"] == "stored"
    assert worker.upload(b"log\n").json()["status"] == "already_stored"
    other = worker.upload(b"LOG\n")
    assert (other.status, other.code) == (503, "worker_ingress_unavailable")
    body = worker.completion_body(b"log\n")
    assert worker.call("completion", body)["status"] == "applied"
    assert worker.call("completion", body)["status"] == "already_completed"
    changed = dict(body, result={**body["result"], "finishedAtMs": body["result"]["finishedAtMs"] + 1})
    answer = worker.raw("completion", changed)
    assert (answer.status, answer.code) == (409, "worker_completion_fenced")
    assert cluster.fence_reasons("completion")[-1].reason == "replay_mismatch"
    stale = dict(body, expectedLeaseVersion=body["expectedLeaseVersion"] - 1)
    assert worker.call("completion", stale)["status"] == "already_terminal"
    assert cluster.artifact(worker.run_id).data == b"log\n"  # type: ignore[union-attr]


# -- lease versions ------------------------------------------------------------------------------

def test_only_lease_control_and_the_terminal_calls_move_the_lease_version(cluster: ClusterDouble,
                                                                         worker: WorkerCalls) -> None:
    cluster.define_secret("TOKEN", "t0ken")
    run_id = claimed(cluster, worker, "echo $TOKEN", secrets={"TOKEN": "t0ken"})
    assert cluster.lease_version(run_id) == 1
    worker.start()
    assert worker.call("secrets")["values"][0]["value"] == "t0ken"
    worker.call("running", worker.running_body())
    assert worker.upload(b"").status == 200
    assert cluster.lease_version(run_id) == 1
    answer = worker.renew()
    assert (answer["leaseVersion"], cluster.lease_version(run_id)) == (2, 2)
    assert answer["expiresAtMs"] - answer["renewedAtMs"] == 30_000
    assert worker.call("completion", worker.completion_body(b""))["status"] == "applied"
    lease = cluster.attempt(run_id).lease
    assert (lease.status, lease.version) == ("completed", 3)


def test_lease_control_refuses_a_stale_version_and_an_expired_lease(cluster: ClusterDouble,
                                                                     worker: WorkerCalls) -> None:
    claimed(cluster, worker)
    worker.renew()
    stale = worker.raw("lease-control", worker.lease_body(expectedLeaseVersion=1))
    assert (stale.status, stale.code) == (409, "worker_lease_control_fenced")
    cluster.advance_clock(30_000)
    expired = worker.raw("lease-control")
    assert (expired.status, expired.code) == (409, "worker_lease_control_fenced")
    assert [r.reason for r in cluster.fence_reasons("lease-control")] == ["version_mismatch", "lease_expired"]


def test_renewal_duration_is_configurable(tmp_path: pathlib.Path) -> None:
    with ClusterDouble(renewal_duration_ms=5_000, tasks=("shell",)) as cluster:
        calls = WorkerCalls(cluster, cluster.provision(tmp_path))
        calls.register()
        calls.claim()
        answer = calls.renew()
        calls.close()
    assert answer["expiresAtMs"] - answer["renewedAtMs"] == 5_000
    with pytest.raises(ValueError, match="5000 and 600000"):
        ClusterDouble(renewal_duration_ms=4_999)


# -- stops: deadline, cancel, terminal ------------------------------------------------------------

def test_a_passed_deadline_becomes_stop_requested_timeout(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    run_id = claimed(cluster, worker, timeout_ms=5_000)
    worker.run()
    cluster.advance_clock(4_999)
    assert worker.renew()["status"] == "renewed"
    reached = cluster.advance_clock(1)
    first = worker.renew()
    assert (first["status"], first["stop"]) == ("stop_requested", {"reason": "timeout", "requestedAtMs": reached})
    cluster.advance_clock(2_000)
    second = worker.renew()
    assert (second["status"], second["stop"], second["leaseVersion"]) == ("stop_requested", first["stop"],
                                                                           first["leaseVersion"] + 1)
    event = [e for e in cluster.events(run_id) if e.type == "run.cancel_requested"]
    assert len(event) == 1 and (event[0].actor_type, event[0].actor_id) == ("system", "runtime:timeout")
    assert event[0].payload["deadline_at_ms"] == reached
    worker.upload(b"killed\n")
    assert worker.call("completion", worker.completion_body(b"killed\n", exit_code=143))["status"] == "applied"
    assert cluster.completion(run_id)["status"] == "timed_out"  # type: ignore[index]
    assert cluster.attempt(run_id).error_code == "EXECUTION_TIMED_OUT"


def test_a_cluster_cancel_becomes_stop_requested_user(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    run_id = claimed(cluster, worker)
    worker.run()
    assert worker.renew()["status"] == "renewed"
    assert cluster.request_cancel(run_id) == "accepted"
    requested = cluster.attempt(run_id).cancel_requested_at_ms
    cluster.advance_clock(10)
    assert cluster.request_cancel(run_id, "policy") == "already_requested"
    answer = worker.renew()
    assert (answer["status"], answer["stop"]) == ("stop_requested", {"reason": "user", "requestedAtMs": requested})
    assert worker.renew()["stop"]["reason"] == "user"
    worker.upload(b"")
    worker.call("completion", worker.completion_body(b"", exit_code=0))
    assert cluster.completion(run_id)["status"] == "cancelled"  # type: ignore[index]
    assert cluster.request_cancel(run_id) == "already_terminal"
    terminal = worker.raw("lease-control", worker.lease_body())
    assert terminal.json() == {
        "schema": "qinglong/remote-worker-lease-control@v1", "status": "terminal", "projectId": worker.project_id,
        "runId": run_id, "attemptId": worker.attempt_id, "offerId": "offer-1", "leaseGeneration": 1,
        "leaseVersion": None, "renewedAtMs": None, "expiresAtMs": None, "stop": None, "terminalStatus": "cancelled"}
    assert any(e.type == "run.cancel_requested" and e.actor_type == "user" for e in cluster.events(run_id))


def test_lease_control_works_from_claimed_and_a_cancel_blocks_secrets(cluster: ClusterDouble,
                                                                       worker: WorkerCalls) -> None:
    run_id = claimed(cluster, worker, secrets={"K": "v"})
    assert worker.renew()["status"] == "renewed"  # legal before starting (G3)
    worker.start()
    cluster.request_cancel(run_id, "shutdown")
    answer = worker.raw("secrets")
    assert (answer.status, answer.code) == (409, "worker_secret_delivery_fenced")
    assert cluster.fence_reasons("secrets")[-1].reason == "authority_mismatch"
    assert worker.renew()["stop"]["reason"] == "shutdown"


# -- start-failure ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("cancel", "status", "error"), [
    (None, "failed", "EXECUTOR_START_FAILED"),
    ("user", "cancelled", "EXECUTION_CANCELLED"),
    ("timeout", "timed_out", "EXECUTION_TIMED_OUT"),
])
def test_start_failure_maps_and_replays(cluster: ClusterDouble, worker: WorkerCalls, cancel: str | None,
                                        status: str, error: str) -> None:
    run_id = claimed(cluster, worker)
    worker.start()
    if cancel is not None:
        cluster.request_cancel(run_id, cancel)
    applied = worker.call("start-failure")
    snapshot = applied["snapshot"]
    assert (applied["status"], snapshot["runStatus"], snapshot["attemptStatus"], snapshot["errorCode"]) == (
        "applied", status, status, error)
    assert (snapshot["leaseVersion"], snapshot["callbackSequence"]) == (2, 1)
    assert "finishedAtMs" in snapshot and "executorHandle" not in snapshot
    assert worker.call("start-failure") == {**applied, "status": "already_terminal"}
    assert [e.type for e in cluster.events(run_id)][-2:] == [f"attempt.{status}", f"run.{status}"]
    refused = worker.raw("starting")
    assert (refused.status, refused.code) == (409, "worker_activation_fenced")


def test_start_failure_after_running_is_fenced(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    claimed(cluster, worker)
    worker.run()
    answer = worker.raw("start-failure")
    assert (answer.status, answer.code) == (409, "worker_activation_fenced")
    assert cluster.fence_reasons("start-failure")[-1].reason == "attempt_state_mismatch"


# -- completion -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("exit_code", "cancel", "status"), [
    (0, None, "succeeded"), (3, None, "failed"), (0, "policy", "cancelled"), (137, "user", "cancelled"),
    (143, "timeout", "timed_out"), (0, "timeout", "timed_out"),
])
def test_outcome_mapping(cluster: ClusterDouble, worker: WorkerCalls, exit_code: int, cancel: str | None,
                         status: str) -> None:
    run_id = claimed(cluster, worker)
    worker.run()
    if cancel is not None:
        cluster.request_cancel(run_id, cancel)
    worker.upload(b"out")
    worker.call("completion", worker.completion_body(b"out", exit_code=exit_code))
    attempt = cluster.attempt(run_id)
    assert (attempt.status, attempt.run_status, attempt.exit_code) == (status, status, exit_code)
    assert cluster.events(run_id)[-1].type == f"run.{status}"


def test_completion_from_starting_without_a_running_ack(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    run_id = claimed(cluster, worker)
    worker.start()
    assert worker.upload(b"x").status == 200
    started = cluster.attempt(run_id).created_at_ms + 5
    assert worker.call("completion", worker.completion_body(b"x", started=started))["status"] == "applied"
    attempt = cluster.attempt(run_id)
    assert (attempt.status, attempt.started_at_ms, attempt.callback_sequence, attempt.log_artifact_id) == (
        "succeeded", started, 1, worker.log_id)
    assert cluster.completion(run_id)["fromStatus"] == "starting"  # type: ignore[index]


@pytest.mark.parametrize("case", ["before_upload", "early_start", "future_finish", "truncation_differs"])
def test_completion_evidence_checks(cluster: ClusterDouble, worker: WorkerCalls, case: str) -> None:
    run_id = claimed(cluster, worker)
    worker.run()
    if case != "before_upload":
        worker.upload(b"log")
    created = cluster.attempt(run_id).created_at_ms
    body = {
        "before_upload": worker.completion_body(b"log"),
        "early_start": worker.completion_body(b"log", started=created - 1),
        "future_finish": worker.completion_body(b"log", finished=cluster.now_ms() + 300_001),
        "truncation_differs": worker.completion_body(b"log", truncated=None),
    }[case]
    answer = worker.raw("completion", body)
    if case == "truncation_differs":
        assert (answer.status, answer.code) == (503, "worker_ingress_unavailable")
    else:
        assert (answer.status, answer.code) == (409, "worker_completion_fenced")
        assert cluster.fence_reasons("completion")[-1].reason == "state_mismatch"
    assert cluster.attempt(run_id).status == "running"


def test_tasks_carry_argv_shell_secrets_bundles_and_timeouts(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    task = cluster.add_command_task(["/bin/sh", "-c", "exit 0"], env={"PATH": "/bin"}, secrets={"API_KEY": "k1"},
                                    bundle={"FROM_BUNDLE": "b1"}, timeout_ms=7_000, working_directory="/tmp")
    revision = task.revision
    assert revision["command"] == {"kind": "argv", "file": "/bin/sh", "args": ["-c", "exit 0"]}
    assert [b["kind"] for b in revision["environment"]] == ["secret", "public"]  # ICU order: API_KEY, PATH
    assert (revision["timeoutMs"], revision["workingDirectory"]) == (7_000, "/tmp")
    offer = worker.claim()
    assert offer["executionRevision"] == revision  # the agent's parser recomputed the same digest
    worker.start()
    answer = worker.call("secrets")
    assert [v["value"] for v in answer["values"]] == ["k1"]
    bundle = answer["environmentBundles"][0]
    assert bundle["secretRef"] == revision["environmentBundleRef"]
    assert bundle["value"] == '{"schema":"qinglong/environment-bundle@v1","entries":[{"name":"FROM_BUNDLE","value":"b1"}]}'
    shell = cluster.add_task("python")
    assert PYTHON_SECRET_VALUE in shell.secrets.values()
    assert "k1" not in repr(task) and PYTHON_SECRET_VALUE not in repr(cluster.state.execution.attempts)
