"""Run reads (local-api.md 9.1-9.4) and task.start (9.5) over HTTP, against a real store."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from qinglong_edge.local.policy import create_project
from qinglong_edge.local.tasks import create_task, set_task_status
from tests.local.test_runs import _step
from tests.support.http_client import request_bytes
from tests.support.local_api import RUN_ID, LocalApiServer, local_api
from tests.support.store import AUTHORIZATION, NOW, SYSTEM, insert_run

P = "/api/v3/projects/default"


@pytest.fixture
def api(tmp_path: pathlib.Path) -> Iterator[LocalApiServer]:
    with local_api(tmp_path) as server:
        yield server


def body(api: LocalApiServer, target: str, status: int = 200) -> Any:
    response = api.get(target)
    assert response.status == status, response.body
    assert not response.closes
    return json.loads(response.body)


# -- run.list ---------------------------------------------------------------------------


def test_run_list_pages_newest_first_with_a_cursor(api: LocalApiServer) -> None:
    for index, created in enumerate((NOW - 5, NOW - 3, NOW - 3, NOW - 1)):
        api.write(lambda c, i=index, t=created: insert_run(c, f"r{i}", created_at_ms=t))
    api.write(lambda c: create_project(c, "other", "Other", "other", NOW))
    api.write(lambda c: insert_run(c, "foreign", project_id="other", created_at_ms=NOW))
    first = body(api, f"{P}/runs?limit=2")
    assert [r["id"] for r in first["runs"]] == ["r3", "r2"]
    assert first["hasMore"] is True
    assert first["next"] == {"createdAtMs": NOW - 3, "runId": "r2"}
    assert list(first) == ["runs", "hasMore", "next"]
    assert "projectId" not in first["runs"][0]
    second = body(api, f"{P}/runs?limit=2&after_created_at_ms={NOW - 3}&after_run_id=r2")
    assert [r["id"] for r in second["runs"]] == ["r1", "r0"]
    third = body(api, f"{P}/runs?after_run_id=r0&after_created_at_ms={NOW - 5}")
    assert [r["id"] for r in third["runs"]] == [RUN_ID]
    assert third == {"runs": third["runs"], "hasMore": False}


def test_run_list_default_and_maximum_page(api: LocalApiServer) -> None:
    for index in range(70):
        api.write(lambda c, i=index: insert_run(c, f"bulk-{i:02d}", created_at_ms=NOW - 100 + i))
    assert len(body(api, f"{P}/runs")["runs"]) == 32
    page = body(api, f"{P}/runs?limit=64")
    assert len(page["runs"]) == 64 and page["hasMore"] is True


def test_bad_queries_are_400_before_authentication_and_not_audited(api: LocalApiServer) -> None:
    for target, code in (
        (f"{P}/runs?limit=08", "invalid_run_list_query"),
        (f"{P}/runs/{RUN_ID}/events?after_sequence=-1", "invalid_run_event_list_query"),
        (f"{P}/runs/{RUN_ID}/steps?after_step_key=k", "invalid_run_step_list_query"),
    ):
        response = api.get(target, authorization=None)
        assert (response.status, response.json()) == (400, {"code": code})
    assert api.audit_rows() == []


# -- run.get, events, steps -------------------------------------------------------------


def test_run_get_body(api: LocalApiServer) -> None:
    run = body(api, f"{P}/runs/{RUN_ID}")
    assert run == {"run": {
        "projectId": "default", "id": RUN_ID, "taskId": "task-1", "taskRevision": "qltd:v1:1:" + "a" * 64,
        "status": "running", "version": 1, "eventSequence": 1, "priority": 0, "executionOrigin": "manual",
        "executionOwner": "runtime", "createdAtMs": NOW - 10_000, "queuedAtMs": NOW - 10_000,
        "startedAtMs": NOW - 9_999, "latestAttempt": None,
    }}
    assert list(run["run"])[:5] == ["projectId", "id", "taskId", "taskRevision", "status"]


@pytest.mark.parametrize("suffix", ["", "/events", "/steps"])
def test_missing_and_foreign_runs_are_404(api: LocalApiServer, suffix: str) -> None:
    api.write(lambda c: create_project(c, "other", "Other", "other", NOW))
    api.write(lambda c: insert_run(c, "foreign", project_id="other"))
    for run_id in ("missing", "foreign"):
        response = api.get(f"{P}/runs/{run_id}{suffix}")
        assert (response.status, response.body) == (404, b'{"code":"run_not_found"}')


def test_run_events_after_a_cancel(api: LocalApiServer) -> None:
    assert api.cancel().status == 202
    events = body(api, f"{P}/runs/{RUN_ID}/events")
    assert events == {
        "events": [{"sequence": 2, "type": "run.cancel_requested", "actorType": "user", "createdAtMs": NOW}],
        "hasMore": False,
        "nextAfterSequence": 2,
    }
    assert body(api, f"{P}/runs/{RUN_ID}/events?after_sequence=2&limit=1") == {
        "events": [], "hasMore": False, "nextAfterSequence": 2,
    }


def test_run_steps_cursor(api: LocalApiServer) -> None:
    for step_id, key in (("s2", "build"), ("s1", "test"), ("s3", "deploy")):
        api.write(lambda c, s=step_id, k=key: _step(c, RUN_ID, s, k))
    first = body(api, f"{P}/runs/{RUN_ID}/steps?limit=2")
    assert [s["id"] for s in first["steps"]] == ["s2", "s3"]
    assert first["next"] == {"stepKey": "deploy", "stepRunId": "s3"}
    rest = body(api, f"{P}/runs/{RUN_ID}/steps?after_step_key=deploy&after_step_run_id=s3")
    assert [s["id"] for s in rest["steps"]] == ["s1"] and rest["next"] is None


def test_projection_failure_is_503_with_the_route_code(api: LocalApiServer) -> None:
    api.write(lambda c: c.execute("UPDATE \"Runs\" SET task_id = 'bad' || char(1) WHERE id = ?", (RUN_ID,)))
    for target, code in (
        (f"{P}/runs", "run_list_unavailable"),
        (f"{P}/runs/{RUN_ID}", "run_query_unavailable"),
    ):
        response = api.get(target)
        assert (response.status, response.json()) == (503, {"code": code})


def test_reads_are_audited_once_each(api: LocalApiServer) -> None:
    body(api, f"{P}/runs")
    body(api, f"{P}/runs/{RUN_ID}")
    assert [(r[0], r[4]) for r in api.audit_rows()] == [("run.list", "allowed"), ("run.get", "allowed")]


def test_viewer_may_read_but_not_cancel(tmp_path: pathlib.Path) -> None:
    with local_api(tmp_path, role="viewer") as api:
        assert api.get(f"{P}/runs").status == 200
        assert api.cancel().status == 403


# -- task.start -------------------------------------------------------------------------

DEFINITION = {"command": {"kind": "argv", "file": "/bin/echo", "args": ["hi"]}, "timeoutMs": 30_000}
MUTATION = "0198a7c4-1b2c-7d3e-8f40-123456789abc"


def start(api: LocalApiServer, document: dict[str, Any] | bytes, task_id: str = "nightly") -> Any:
    raw = document if isinstance(document, bytes) else json.dumps(document).encode()
    response = api.send(request_bytes("POST", f"{P}/tasks/{task_id}/runs", headers=[
        ("Authorization", AUTHORIZATION), ("Content-Type", "application/json")], body=raw))
    assert response is not None
    return response


@pytest.fixture
def task(api: LocalApiServer) -> Any:
    return api.write(lambda c: create_task(c, project_id="default", task_id="nightly", name="Nightly",
                                           definition=DEFINITION, mutation_id="t1", created_by=SYSTEM,
                                           now_ms=NOW - 1000)).task


def start_body(task: Any, **changes: Any) -> dict[str, Any]:
    document = {
        "schema": "qinglong/task-start@v1",
        "mutationId": MUTATION,
        "expectedRevision": task.current.revision,
        "expectedContentDigest": task.current.content_digest,
    }
    document.update(changes)
    return document


def test_task_start_creates_a_queued_run_then_replays(api: LocalApiServer, task: Any) -> None:
    first = start(api, start_body(task))
    assert first.status == 202, first.body
    result = first.json()
    assert list(result) == [
        "schema", "status", "projectId", "taskId", "taskRevision", "taskContentDigest", "runId", "attemptId",
        "runStatus", "runVersion", "eventSequence", "executorType", "executionRevisionDigest", "createdAtMs",
    ]
    assert (result["status"], result["runStatus"], result["runVersion"], result["eventSequence"]) == (
        "accepted", "queued", 2, 2)
    assert result["createdAtMs"] == NOW
    assert api.intents == [("task.start", result["runId"])]
    assert api.run_row(result["runId"])[:3] == ("queued", 2, 2)
    assert [e[1] for e in api.events(result["runId"])] == ["run.created", "run.queued"]
    replay = start(api, start_body(task))
    assert replay.status == 200
    assert replay.json() == {**result, "status": "existing"}
    assert api.intents == [("task.start", result["runId"])]
    assert [(r[0], r[4]) for r in api.audit_rows()] == [("task.start", "allowed")] * 2


def test_task_start_errors(api: LocalApiServer, task: Any) -> None:
    missing = start(api, start_body(task), task_id="nope")
    assert (missing.status, missing.json()) == (404, {"code": "task_not_found"})
    stale = start(api, start_body(task, expectedRevision=task.current.revision + 1))
    assert (stale.status, stale.json()) == (409, {"code": "task_start_fence_rejected", "reason": "definition_changed"})
    api.write(lambda c: set_task_status(c, "default", "nightly", "disabled", NOW))
    disabled = start(api, start_body(task))
    assert disabled.json() == {"code": "task_start_fence_rejected", "reason": "task_disabled"}
    invalid = start(api, start_body(task, mutationId="Not-A-UUID"))
    assert (invalid.status, invalid.body) == (
        400, b'{"code":"invalid_task_start_request","schema":"qinglong/task-start@v1"}')
    assert api.intents == []


def test_task_start_needs_run_start(tmp_path: pathlib.Path) -> None:
    with local_api(tmp_path, role="viewer") as api:
        response = start(api, {"schema": "qinglong/task-start@v1"})
        assert (response.status, response.json()) == (403, {"code": "forbidden"})
        assert api.audit_rows()[-1][0] == "task.start"


def test_task_start_fence_race_is_409_and_creates_nothing(api: LocalApiServer, task: Any) -> None:
    from qinglong_edge.local.policy import revoke_role
    from tests.support.store import USER

    def race(route: Any) -> None:
        api.hooks.clear()
        api.write(lambda c: revoke_role(c, "default", USER, mutation_id="revoke-1", changed_by=SYSTEM, now_ms=NOW))

    api.hooks.append(race)
    response = start(api, start_body(task))
    assert (response.status, response.json()) == (
        409, {"code": "task_start_fence_rejected", "reason": "authorization_changed"})
    assert api.query('SELECT count(*) FROM "Runs" WHERE task_id = ?', ("nightly",)) == [(0,)]
    assert api.intents == []
