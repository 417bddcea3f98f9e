"""Run readers, the cancellation transaction (section 6) and task.start (9.5) on a real store."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

from qinglong_edge.contracts.strictjson import dumps
from qinglong_edge.errors import StoreError
from qinglong_edge.local.identity import Subject
from qinglong_edge.local.policy import PolicyFence, create_project, decide, grant_role
from qinglong_edge.local.runs import (
    CancellationCommand,
    FenceRejected,
    ProjectionInvalid,
    RunNotFound,
    TaskNotFound,
    TaskStartRejected,
    get_run,
    list_run_events,
    list_run_steps,
    list_runs,
    new_task_start_command,
    request_cancellation,
    start_task,
)
from qinglong_edge.local.store import write_transaction
from qinglong_edge.local.tasks import create_task, execution_revision_digest, set_task_status
from tests.support.store import NOW, SYSTEM, USER, Provisioned, insert_run, provision

EVENT_ID = "3b6a8f7e-2d1c-4e5f-8a9b-0c1d2e3f4a5b"


@pytest.fixture
def env(tmp_path: pathlib.Path) -> Iterator[Provisioned]:
    provisioned = provision(tmp_path / "local.db", tmp_path / "pepper")
    yield provisioned
    provisioned.store.close()


def _command(env: Provisioned, run_id: str = "run_local_api_1", mutation: str = "cancel-local-api-1",
             **changes: Any) -> CancellationCommand:
    command = CancellationCommand("default", run_id, mutation, EVENT_ID, env.subject, env.fence)
    return dataclasses.replace(command, **changes)


def _cancel(env: Provisioned, command: CancellationCommand, now: int = NOW) -> Any:
    return env.store.run(lambda c: request_cancellation(c, command, now_ms=now))


def _run_row(env: Provisioned, run_id: str) -> tuple[Any, ...]:
    return env.store.run(lambda c: c.execute(
        'SELECT status, version, event_sequence, cancel_requested_at_ms, cancel_reason FROM "Runs" WHERE id = ?',
        (run_id,)).fetchone())


def _events(env: Provisioned, run_id: str) -> list[tuple[Any, ...]]:
    return env.store.run(lambda c: c.execute(
        'SELECT id, sequence, type, dedupe_key, actor_type, actor_id, attempt_id, step_run_id, payload, created_at_ms'
        ' FROM "RunEvents" WHERE run_id = ? ORDER BY sequence', (run_id,)).fetchall())


# -- cancellation ----------------------------------------------------------------------


def test_first_cancel_is_accepted_with_the_exact_body_and_durable_effects(env: Provisioned) -> None:
    env.store.run(lambda c: insert_run(c, "run_local_api_1"))
    outcome = _cancel(env, _command(env))
    assert outcome.http_status == 202
    body = dumps(outcome.to_wire())
    assert body == (
        '{"schema":"qinglong/run-cancellation@v1","status":"accepted","projectId":"default",'
        '"runId":"run_local_api_1","runStatus":"running","runVersion":2,"eventSequence":2,'
        '"cancelRequestedAtMs":1800000000000,"cancelReason":"user"}'
    )
    assert len(body.encode()) == 222  # local-api.md 10.1 content-length
    assert _run_row(env, "run_local_api_1") == ("running", 2, 2, NOW, "user")
    assert _events(env, "run_local_api_1") == [(
        EVENT_ID, 2, "run.cancel_requested", "user-cancel:cancel-local-api-1", "user", "local-api-user", None, None,
        '{"reason":"user","mutation_id":"cancel-local-api-1","policy_fence":{"project_version":1,"binding_version":1}}',
        NOW,
    )]


def test_exact_replay_and_another_mutation_are_already_requested(env: Provisioned) -> None:
    env.store.run(lambda c: insert_run(c, "run_local_api_1"))
    _cancel(env, _command(env))
    expected = (
        '{"schema":"qinglong/run-cancellation@v1","status":"already_requested","projectId":"default",'
        '"runId":"run_local_api_1","runStatus":"running","runVersion":2,"eventSequence":2,'
        '"cancelRequestedAtMs":1800000000000,"cancelReason":"user"}'
    )
    for mutation, event_id in (("cancel-local-api-1", "e-2"), ("cancel-local-api-2", "e-3")):
        outcome = _cancel(env, _command(env, mutation=mutation, event_id=event_id), now=NOW + 500)
        assert outcome.http_status == 200
        assert dumps(outcome.to_wire()) == expected
        assert len(expected.encode()) == 231  # 10.2
    assert _run_row(env, "run_local_api_1") == ("running", 2, 2, NOW, "user")  # time and reason never overwritten
    assert len(_events(env, "run_local_api_1")) == 1


def test_a_stored_intent_of_another_reason_is_reported_as_is(env: Provisioned) -> None:
    env.store.run(lambda c: insert_run(c, "r1", cancel_requested_at_ms=NOW - 5, cancel_reason="timeout"))
    outcome = _cancel(env, _command(env, "r1"))
    assert (outcome.status, outcome.cancel_requested_at_ms, outcome.cancel_reason) == (
        "already_requested", NOW - 5, "timeout")


def test_terminal_run_is_already_terminal(env: Provisioned) -> None:
    env.store.run(lambda c: insert_run(c, "run_local_api_done", status="succeeded", version=4, event_sequence=4))
    outcome = _cancel(env, _command(env, "run_local_api_done", "cancel-local-api-3"))
    body = dumps(outcome.to_wire())
    assert body == (
        '{"schema":"qinglong/run-cancellation@v1","status":"already_terminal","projectId":"default",'
        '"runId":"run_local_api_done","runStatus":"succeeded","runVersion":4,"eventSequence":4}'
    )
    assert len(body.encode()) == 177 and outcome.http_status == 200  # 10.4


def test_terminal_run_with_an_intent_carries_the_stored_fields(env: Provisioned) -> None:
    env.store.run(lambda c: insert_run(c, "r1", status="cancelled", version=4, event_sequence=4,
                                       cancel_requested_at_ms=NOW - 9, cancel_reason="user"))
    wire = _cancel(env, _command(env, "r1")).to_wire()
    assert (wire["status"], wire["runStatus"], wire["cancelRequestedAtMs"], wire["cancelReason"]) == (
        "already_terminal", "cancelled", NOW - 9, "user")


def test_a_lost_run_can_still_be_cancelled(env: Provisioned) -> None:
    env.store.run(lambda c: insert_run(c, "r1", status="lost"))
    assert _cancel(env, _command(env, "r1")).status == "accepted"


def test_a_queued_run_is_accepted_and_keeps_its_status(env: Provisioned) -> None:
    env.store.run(lambda c: insert_run(c, "r1", status="queued", version=2, event_sequence=2))
    outcome = _cancel(env, _command(env, "r1"))
    assert (outcome.status, outcome.run_status, outcome.run_version) == ("accepted", "queued", 3)


def test_missing_and_cross_project_runs_are_indistinguishable(env: Provisioned) -> None:
    env.store.run(lambda c: create_project(c, "other", "Other", "other", 1))
    env.store.run(lambda c: insert_run(c, "run_x", project_id="other"))
    errors = []
    for run_id in ("run_missing", "run_x"):
        with pytest.raises(RunNotFound) as info:
            _cancel(env, _command(env, run_id))
        errors.append((info.value.code, info.value.http_status))
    assert errors == [("run_not_found", 404)] * 2
    assert _run_row(env, "run_x") == ("running", 1, 1, None, None)


def test_a_missing_project_is_not_found(env: Provisioned) -> None:
    with pytest.raises(RunNotFound):
        _cancel(env, _command(env, project_id="ghost"))


def test_fence_race_between_decision_and_commit_is_authorization_changed(env: Provisioned) -> None:
    """A binding version appended after admission (direct row insert) fails the commit check."""
    env.store.run(lambda c: insert_run(c, "run_local_api_1"))
    decision = env.store.run(lambda c: decide(c, env.subject, "default", "run.stop"))
    assert decision.outcome == "allow" and decision.fence == PolicyFence(1, 1)
    env.store.run(lambda c: c.execute(
        'INSERT INTO "QingLong3ProjectRoleBindings" VALUES'
        " ('default', 'user', 'local-api-user', 2, 'revoked', NULL, 'revoke-1', 'system', 'test-admin', ?)", (NOW,)))
    with pytest.raises(FenceRejected) as info:
        _cancel(env, _command(env, policy_fence=decision.fence))
    assert (info.value.reason, info.value.http_status) == ("authorization_changed", 409)
    assert _run_row(env, "run_local_api_1") == ("running", 1, 1, None, None)
    assert _events(env, "run_local_api_1") == []


@pytest.mark.parametrize("change", ["project_bump", "archive", "promotion"])
def test_other_fence_changes_are_authorization_changed(env: Provisioned, change: str) -> None:
    env.store.run(lambda c: insert_run(c, "r1"))
    if change == "project_bump":
        env.store.run(lambda c: c.execute('UPDATE "QingLong3Projects" SET version = 2'))
    elif change == "archive":
        env.store.run(lambda c: c.execute("UPDATE \"QingLong3Projects\" SET status = 'archived'"))
    else:
        env.store.run(lambda c: grant_role(c, "default", USER, "owner", mutation_id="up", changed_by=SYSTEM, now_ms=1))
    with pytest.raises(FenceRejected) as info:
        _cancel(env, _command(env, "r1"))
    assert info.value.reason == "authorization_changed"
    assert _run_row(env, "r1") == ("running", 1, 1, None, None)


def test_a_half_set_intent_is_state_mismatch(env: Provisioned) -> None:
    env.store.run(lambda c: insert_run(c, "r1", cancel_reason="user"))
    with pytest.raises(FenceRejected) as info:
        _cancel(env, _command(env, "r1"))
    assert info.value.reason == "state_mismatch"


@pytest.mark.parametrize(("version", "sequence"), [(2**31 - 1, 1), (1, 2**31 - 1)])
def test_counter_overflow_is_state_mismatch(env: Provisioned, version: int, sequence: int) -> None:
    env.store.run(lambda c: insert_run(c, "r1", version=version, event_sequence=sequence))
    with pytest.raises(FenceRejected) as info:
        _cancel(env, _command(env, "r1"))
    assert info.value.reason == "state_mismatch"
    assert _run_row(env, "r1") == ("running", version, sequence, None, None)


@pytest.mark.parametrize("collision", ["event_id", "dedupe_key", "sequence"])
def test_event_failure_rolls_back_the_run_update(env: Provisioned, collision: str) -> None:
    env.store.run(lambda c: insert_run(c, "r1"))
    env.store.run(lambda c: insert_run(c, "r2"))
    target = "r2" if collision == "event_id" else "r1"
    dedupe = "user-cancel:cancel-local-api-1" if collision == "dedupe_key" else None
    sequence = 2 if collision == "sequence" else 1
    event_id = EVENT_ID if collision == "event_id" else "pre-existing"
    env.store.run(lambda c: c.execute(
        'INSERT INTO "RunEvents" (id, run_id, sequence, type, dedupe_key, actor_type, payload, created_at_ms)'
        " VALUES (?, ?, ?, 'run.created', ?, 'system', '{}', 1)", (event_id, target, sequence, dedupe)))
    with pytest.raises(StoreError) as info:
        _cancel(env, _command(env, "r1"))
    assert not isinstance(info.value, (FenceRejected, RunNotFound))
    assert info.value.http_status == 503
    assert _run_row(env, "r1") == ("running", 1, 1, None, None)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"policy_fence": PolicyFence(1, None)}, id="fence_without_binding"),
        pytest.param({"event_id": "x" * 37}, id="event_id_too_long"),
        pytest.param({"mutation_id": "bad id"}, id="bad_mutation_id"),
        pytest.param({"subject": Subject("system", "x")}, id="system_subject"),
    ],
)
def test_an_invalid_command_is_the_503_class(env: Provisioned, change: dict[str, Any]) -> None:
    env.store.run(lambda c: insert_run(c, "run_local_api_1"))
    with pytest.raises(StoreError) as info:
        _cancel(env, _command(env, **change))
    assert info.value.code == "invalid_input" and info.value.http_status == 503
    assert _run_row(env, "run_local_api_1") == ("running", 1, 1, None, None)


def test_an_impossible_stored_result_is_503(env: Provisioned) -> None:
    env.store.run(lambda c: insert_run(c, "r1", status="failed", version=0))  # runVersion must be >= 1
    with pytest.raises(StoreError) as info:
        _cancel(env, _command(env, "r1"))
    assert info.value.http_status == 503 and not isinstance(info.value, FenceRejected)


# -- readers ---------------------------------------------------------------------------


def test_get_run_projection(env: Provisioned) -> None:
    env.store.run(lambda c: insert_run(c, "r1", created_at_ms=1000))
    body = env.store.run(lambda c: get_run(c, "default", "r1"))
    assert json.dumps(body, separators=(",", ":")) == (
        '{"run":{"projectId":"default","id":"r1","taskId":"task-1","taskRevision":"qltd:v1:1:' + "a" * 64 + '",'
        '"status":"running","version":1,"eventSequence":1,"priority":0,"executionOrigin":"manual",'
        '"executionOwner":"runtime","createdAtMs":1000,"queuedAtMs":1000,"startedAtMs":1001,"latestAttempt":null}}'
    )
    baseline = env.store.run(lambda c: get_run(c, "default", "r1", include_latest_attempt=False))
    assert "latestAttempt" not in baseline["run"]
    with pytest.raises(RunNotFound):
        env.store.run(lambda c: get_run(c, "other", "r1"))


def test_get_run_rejects_an_invalid_row(env: Provisioned) -> None:
    env.store.run(lambda c: insert_run(c, "r1", task_id="bad\ttask"))
    with pytest.raises(ProjectionInvalid) as info:
        env.store.run(lambda c: get_run(c, "default", "r1"))
    assert info.value.http_status == 503


def test_list_runs_orders_newest_first_and_pages(env: Provisioned) -> None:
    for run_id, created in (("a", 10), ("b", 30), ("c", 20), ("d", 30)):
        env.store.run(lambda c, r=run_id, t=created: insert_run(c, r, created_at_ms=t))
    first = env.store.run(lambda c: list_runs(c, "default", limit=2))
    assert [r["id"] for r in first["runs"]] == ["d", "b"]
    assert first["hasMore"] is True and first["next"] == {"createdAtMs": 30, "runId": "b"}
    assert "projectId" not in first["runs"][0]
    second = env.store.run(lambda c: list_runs(c, "default", limit=2, after_created_at_ms=30, after_run_id="b"))
    assert [r["id"] for r in second["runs"]] == ["c", "a"]
    assert second == {"runs": second["runs"], "hasMore": False}  # no "next" key
    with pytest.raises(StoreError):
        env.store.run(lambda c: list_runs(c, "default", after_created_at_ms=1))
    with pytest.raises(StoreError):
        env.store.run(lambda c: list_runs(c, "default", limit=65))


def test_list_runs_fails_whole_on_one_bad_row(env: Provisioned) -> None:
    env.store.run(lambda c: insert_run(c, "good"))
    env.store.run(lambda c: c.execute(
        "INSERT INTO \"Runs\" (id, project_id, task_id, task_revision, trigger_type, execution_origin,"
        " execution_owner, status, priority, created_at_ms) VALUES ('bad', 'default', 't', 'r', 'x', 'manual',"
        " 'runtime', 'queued', 2147483648, 5)"))
    with pytest.raises(ProjectionInvalid):
        env.store.run(lambda c: list_runs(c, "default"))


def test_run_events_page_and_hide_payloads(env: Provisioned) -> None:
    env.store.run(lambda c: insert_run(c, "run_local_api_1"))
    _cancel(env, _command(env))
    body = env.store.run(lambda c: list_run_events(c, "default", "run_local_api_1"))
    assert body == {
        "events": [{"sequence": 2, "type": "run.cancel_requested", "actorType": "user", "createdAtMs": NOW}],
        "hasMore": False,
        "nextAfterSequence": 2,
    }
    empty = env.store.run(lambda c: list_run_events(c, "default", "run_local_api_1", after_sequence=2))
    assert empty == {"events": [], "hasMore": False, "nextAfterSequence": 2}
    with pytest.raises(RunNotFound):
        env.store.run(lambda c: list_run_events(c, "default", "missing"))


def _step(conn: sqlite3.Connection, run_id: str, step_id: str, key: str) -> None:
    document = {
        "schema": "qinglong/step-run@v1", "id": step_id, "runId": run_id, "parentStepRunId": None, "stepKey": key,
        "kind": "task", "definitionRef": "def", "definitionDigest": "b" * 64, "required": 1, "status": "pending",
        "version": 1, "attemptCount": 0, "inputRef": None, "outputRef": None, "approvalRequestId": None,
        "readyAtMs": None, "startedAtMs": None, "finishedAtMs": None, "resultCode": None, "errorSummary": None,
        "createdAtMs": 5, "updatedAtMs": 5, "lastMutationId": "m", "stepRunDigest": "c" * 64,
    }
    with write_transaction(conn):
        conn.execute(
            'INSERT INTO "StepRuns" (id, run_id, step_key, kind, definition_ref, definition_digest, required, status,'
            " version, attempt_count, created_at_ms, updated_at_ms, last_mutation_id, step_run_digest, step_run_json)"
            " VALUES (?, ?, ?, 'task', 'def', ?, 1, 'pending', 1, 0, 5, 5, 'm', ?, ?)",
            (step_id, run_id, key, "b" * 64, "c" * 64, json.dumps(document)))


def test_run_steps_page_by_step_key_and_id(env: Provisioned) -> None:
    env.store.run(lambda c: insert_run(c, "r1"))
    for step_id, key in (("s2", "build"), ("s1", "test"), ("s3", "deploy")):
        env.store.run(lambda c, s=step_id, k=key: _step(c, "r1", s, k))
    first = env.store.run(lambda c: list_run_steps(c, "default", "r1", limit=2))
    assert [s["stepKey"] for s in first["steps"]] == ["build", "deploy"]
    assert first["next"] == {"stepKey": "deploy", "stepRunId": "s3"} and first["hasMore"] is True
    assert list(first["steps"][0]) == [
        "id", "parentStepRunId", "stepKey", "kind", "required", "status", "version", "attemptCount", "readyAtMs",
        "startedAtMs", "finishedAtMs", "resultCode", "createdAtMs", "updatedAtMs"]
    assert first["steps"][0]["required"] is True
    rest = env.store.run(lambda c: list_run_steps(c, "default", "r1", after_step_key="deploy", after_step_run_id="s3"))
    assert [s["id"] for s in rest["steps"]] == ["s1"] and rest["next"] is None


# -- task.start ------------------------------------------------------------------------

DEFINITION = {"command": {"kind": "argv", "file": "/bin/echo", "args": ["hi"]}, "timeoutMs": 30_000}
MUTATION = "0198a7c4-1b2c-7d3e-8f40-123456789abc"


@pytest.fixture
def task(env: Provisioned) -> Any:
    return env.store.run(lambda c: create_task(c, project_id="default", task_id="nightly", name="Nightly",
                                               definition=DEFINITION, mutation_id="t1", created_by=SYSTEM,
                                               now_ms=NOW - 1000)).task


def _start(env: Provisioned, task: Any, **changes: Any) -> Any:
    args: dict[str, Any] = {
        "project_id": "default", "task_id": "nightly", "mutation_id": MUTATION,
        "expected_revision": task.current.revision, "expected_content_digest": task.current.content_digest,
        "subject": env.subject, "policy_fence": env.fence,
    }
    args.update(changes)
    command = new_task_start_command(**args)
    return env.store.run(lambda c: start_task(c, command, now_ms=NOW))


def test_task_start_creates_a_queued_run_then_replays(env: Provisioned, task: Any) -> None:
    outcome = _start(env, task)
    assert outcome.http_status == 202
    wire = outcome.to_wire()
    assert list(wire) == [
        "schema", "status", "projectId", "taskId", "taskRevision", "taskContentDigest", "runId", "attemptId",
        "runStatus", "runVersion", "eventSequence", "executorType", "executionRevisionDigest", "createdAtMs"]
    ref = f"qltd:v1:1:{task.current.content_digest}"
    assert wire["executionRevisionDigest"] == execution_revision_digest("default", "nightly", ref,
                                                                        task.current.definition)
    assert (wire["status"], wire["taskRevision"], wire["runStatus"], wire["runVersion"], wire["eventSequence"],
            wire["executorType"], wire["createdAtMs"]) == ("accepted", 1, "queued", 2, 2, "local_process", NOW)
    run = env.store.run(lambda c: c.execute(
        "SELECT task_revision, task_name, task_snapshot_ref, trigger_type, execution_origin, execution_owner,"
        " triggered_by, request_id, status, version, event_sequence, priority, idempotency_key, queued_at_ms"
        ' FROM "Runs" WHERE id = ?', (outcome.run_id,)).fetchone())
    assert run == (ref, "Nightly", ref, "task_start", "manual", "runtime", "local-api-user", MUTATION, "queued", 2, 2,
                   0, f"ql3:task-start:v1:{MUTATION}", NOW)
    attempt = env.store.run(lambda c: c.execute(
        'SELECT id, attempt, status, executor_type, deadline_at_ms, pid FROM "RunAttempts" WHERE run_id = ?',
        (outcome.run_id,)).fetchall())
    assert attempt == [(outcome.attempt_id, 1, "claimed", "local_process", None, None)]
    events = _events(env, outcome.run_id)
    assert [(e[1], e[2], e[3], e[4], e[6]) for e in events] == [
        (1, "run.created", f"task-start-created:{MUTATION}", "user", outcome.attempt_id),
        (2, "run.queued", f"task-start-queued:{MUTATION}", "user", outcome.attempt_id),
    ]
    assert list(json.loads(events[0][8])) == [
        "status", "version", "execution_owner", "executor_type", "execution_revision_digest", "task_revision",
        "task_content_digest", "mutation_id", "policy_fence"]
    assert events[1][8] == '{"from_status":"created","to_status":"queued","version":2}'
    replay = _start(env, task)
    assert (replay.status, replay.http_status, replay.run_id, replay.attempt_id) == (
        "existing", 200, outcome.run_id, outcome.attempt_id)
    assert replay.to_wire() == {**wire, "status": "existing"}
    assert env.store.run(lambda c: c.execute('SELECT count(*) FROM "Runs"').fetchone()[0]) == 1


def test_task_start_definition_changed(env: Provisioned, task: Any) -> None:
    env.store.run(lambda c: create_task(c, project_id="default", task_id="nightly", name="Nightly",
                                        definition={**DEFINITION, "timeoutMs": 1000}, mutation_id="t2",
                                        created_by=SYSTEM, now_ms=NOW))
    with pytest.raises(TaskStartRejected) as info:
        _start(env, task)
    assert (info.value.reason, info.value.http_status) == ("definition_changed", 409)
    with pytest.raises(TaskStartRejected) as info:
        _start(env, task, expected_revision=2)  # right revision, stale digest
    assert info.value.reason == "definition_changed"


def test_task_start_disabled_and_not_executable(env: Provisioned, task: Any) -> None:
    env.store.run(lambda c: set_task_status(c, "default", "nightly", "disabled", NOW))
    with pytest.raises(TaskStartRejected) as info:
        _start(env, task)
    assert info.value.reason == "task_disabled"
    env.store.run(lambda c: set_task_status(c, "default", "nightly", "active", NOW))
    env.store.run(lambda c: c.execute('UPDATE "QingLongEdgeTaskRevisions" SET executable = 0'))
    with pytest.raises(TaskStartRejected) as info:
        _start(env, task)
    assert info.value.reason == "task_not_executable"
    assert env.store.run(lambda c: c.execute('SELECT count(*) FROM "Runs"').fetchone()[0]) == 0


def test_task_start_mutation_conflict(env: Provisioned, task: Any) -> None:
    _start(env, task)
    env.store.run(lambda c: create_task(c, project_id="default", task_id="nightly", name="Nightly",
                                        definition={**DEFINITION, "timeoutMs": 1000}, mutation_id="t2",
                                        created_by=SYSTEM, now_ms=NOW))
    current = env.store.run(lambda c: c.execute(
        'SELECT content_digest FROM "QingLongEdgeTaskRevisions" WHERE revision = 2').fetchone()[0])
    with pytest.raises(TaskStartRejected) as info:
        _start(env, task, expected_revision=2, expected_content_digest=current)
    assert info.value.reason == "mutation_conflict"


def test_task_start_not_found_and_authorization_changed(env: Provisioned, task: Any) -> None:
    with pytest.raises(TaskNotFound) as info:
        _start(env, task, task_id="missing")
    assert (info.value.code, info.value.http_status) == ("task_not_found", 404)
    with pytest.raises(TaskNotFound):
        _start(env, task, project_id="ghost")
    with pytest.raises(TaskStartRejected) as rejected:
        _start(env, task, policy_fence=PolicyFence(1, 7))
    assert rejected.value.reason == "authorization_changed"


def test_task_start_rejects_a_non_uuid_mutation(env: Provisioned, task: Any) -> None:
    with pytest.raises(StoreError) as info:
        _start(env, task, mutation_id="not-a-uuid")
    assert info.value.code == "invalid_input"
