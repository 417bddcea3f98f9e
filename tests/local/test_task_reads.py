"""``task.list`` and ``task.get`` (issue 26 item 2), shapes from the reference's
``sqliteHttp.integration.test.cjs`` and the bounded task projections."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator

import pytest

from qinglong_edge.local.tasks import create_task
from tests.support.local_api import LocalApiServer, local_api
from tests.support.store import NOW, SYSTEM

DEFINITION = {"command": {"kind": "argv", "file": "/bin/echo", "args": ["private-command"]}}


@pytest.fixture
def api(tmp_path: pathlib.Path) -> Iterator[LocalApiServer]:
    with local_api(tmp_path, role="viewer") as fixture:
        for index, task_id in enumerate(("task-1", "task-2", "task-3")):
            fixture.write(lambda c, t=task_id, i=index: create_task(
                c, project_id="default", task_id=t, name="Local API Task", definition=DEFINITION,
                mutation_id=f"m-{t}", created_by=SYSTEM, now_ms=NOW - 200 + i))
        yield fixture


def test_task_list_shape_order_and_cursor(api: LocalApiServer) -> None:
    first = api.get("/api/v3/projects/default/tasks?limit=1")
    assert first.status == 200
    assert first.body == (b'{"tasks":[{"taskId":"task-1","revision":1,"name":"Local API Task","kind":"command",'
                          b'"specSchema":"qinglong/command@v1","enabled":true,"updatedAtMs":1799999999800}],'
                          b'"hasMore":true,"next":{"taskId":"task-1"}}')
    rest = api.get("/api/v3/projects/default/tasks?limit=64&after_task_id=task-1").json()
    assert [t["taskId"] for t in rest["tasks"]] == ["task-2", "task-3"] and rest["hasMore"] is False
    assert "next" not in rest
    assert b"private" not in first.body and b"/bin/echo" not in first.body
    assert [(r[0], r[4]) for r in api.audit_rows()] == [("task.list", "allowed"), ("task.list", "allowed")]


def test_task_get_has_what_task_start_needs(api: LocalApiServer) -> None:
    response = api.get("/api/v3/projects/default/tasks/task-1")
    assert response.status == 200
    task = response.json()["task"]
    assert list(task) == ["taskId", "revision", "name", "kind", "specSchema", "enabled", "contentDigest",
                          "createdAtMs", "updatedAtMs"]
    rows = api.query('SELECT content_digest FROM "QingLongEdgeTaskRevisions" WHERE task_id = ?', ("task-1",))
    assert task["contentDigest"] == rows[0][0] and task["revision"] == 1 and task["enabled"] is True
    assert b"private" not in response.body


def test_a_disabled_task_is_listed_not_enabled(api: LocalApiServer) -> None:
    api.write(lambda c: c.execute("UPDATE \"QingLongEdgeTasks\" SET status = 'disabled' WHERE id = 'task-2'"))
    assert api.get("/api/v3/projects/default/tasks/task-2").json()["task"]["enabled"] is False


def test_missing_task_and_queries(api: LocalApiServer) -> None:
    response = api.get("/api/v3/projects/default/tasks/task-absent")
    assert (response.status, response.body) == (404, b'{"code":"task_not_found"}')
    for query in ("?", "?limit=0", "?limit=65", "?limit=01", "?after_task_id=", "?after_task_id=%41", "?x=1"):
        bad = api.get("/api/v3/projects/default/tasks" + query, authorization=None)
        assert bad.status in (400, 404), query
        if "%" not in query:
            assert bad.body == b'{"code":"invalid_task_list_query"}', query
    assert api.get("/api/v3/projects/default/tasks/task-1?x=1").status == 404  # task.get takes no query


def test_a_broken_row_is_503_task_list_unavailable(api: LocalApiServer) -> None:
    def corrupt(conn: object) -> None:  # a row the CHECKs would refuse, as a damaged file could hold
        conn.execute("PRAGMA ignore_check_constraints = ON")  # type: ignore[attr-defined]
        conn.execute("UPDATE \"QingLongEdgeTasks\" SET updated_at_ms = -5 WHERE id = 'task-1'")  # type: ignore[attr-defined]
        conn.execute("PRAGMA ignore_check_constraints = OFF")  # type: ignore[attr-defined]

    api.write(corrupt)
    assert api.get("/api/v3/projects/default/tasks").body == b'{"code":"task_list_unavailable"}'
    assert api.get("/api/v3/projects/default/tasks/task-1").body == b'{"code":"task_query_unavailable"}'


def test_another_project_without_a_binding_is_403(api: LocalApiServer) -> None:
    response = api.get("/api/v3/projects/other/tasks")
    assert (response.status, json.loads(response.body)) == (403, {"code": "forbidden"})
