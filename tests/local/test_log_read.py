"""``run.log.read`` over a real server and a real SQLite file (issue 26 item 1).

Golden vectors from the reference: ``sqliteHttp.integration.test.cjs`` (a 19-byte log
``local-api-log-line\\n`` of attempt ``attempt_local_api_1`` read with
``offset=0&length=8``), ``runAttemptLogReadRoute.test.cjs`` (the body shapes and the
state -> status table), ``httpSurface.ts`` at 308aa75 (the query grammar).
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import sqlite3
from collections.abc import Iterator

import pytest

from qinglong_edge.local.log_read import LogReadUnavailable, read_log_range
from qinglong_edge.local.retention_rows import clear_log_artifacts
from qinglong_edge.local.store import write_transaction
from tests.support.local_api import RUN_ID, LocalApiServer, local_api
from tests.support.store import NOW, insert_run

ATTEMPT_ID = "attempt_local_api_1"
ARTIFACT = "local-" + "a" * 30
LOG = b"local-api-log-line\n"
BASE = f"/api/v3/projects/default/runs/{RUN_ID}/attempts/{ATTEMPT_ID}/log"
SCHEMA = "qinglong/run-attempt-log-read-result@v1"


def _attempt(conn: sqlite3.Connection, run_id: str = RUN_ID, attempt_id: str = ATTEMPT_ID, *,
             status: str = "running", artifact: str | None = ARTIFACT, executor: str = "local_process") -> None:
    with write_transaction(conn):
        conn.execute(
            'INSERT INTO "RunAttempts" (id, run_id, attempt, status, executor_type, log_artifact_id,'
            " callback_sequence, created_at_ms, started_at_ms) VALUES (?, ?, 1, ?, ?, ?, 0, ?, ?)",
            (attempt_id, run_id, status, executor, artifact, NOW - 90, NOW - 80),
        )


def _write_log(directory: pathlib.Path, data: bytes = LOG, run_id: str = RUN_ID,
               attempt_id: str = ATTEMPT_ID) -> pathlib.Path:
    path = directory / f"{run_id}_{attempt_id}.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(path, 0o600)
    return path


@pytest.fixture
def logs(tmp_path: pathlib.Path) -> pathlib.Path:
    directory = tmp_path / "logs"
    directory.mkdir(mode=0o700)
    return directory


@pytest.fixture
def api(tmp_path: pathlib.Path, logs: pathlib.Path) -> Iterator[LocalApiServer]:
    with local_api(tmp_path, log_directory=logs) as fixture:
        fixture.write(_attempt)
        yield fixture


def _body(response: object) -> dict[str, object]:
    value = json.loads(response.body)  # type: ignore[attr-defined]
    assert isinstance(value, dict)
    return value


def test_golden_vector_of_the_reference(api: LocalApiServer, logs: pathlib.Path) -> None:
    _write_log(logs)
    response = api.get(BASE + "?offset=0&length=8")
    assert response.status == 200
    assert response.body == (
        b'{"schema":"qinglong/run-attempt-log-read-result@v1","status":"available","projectId":"default",'
        b'"runId":"run_local_api_1","attemptId":"attempt_local_api_1","range":{"start":0,"endExclusive":8,'
        b'"totalBytes":19,"nextOffset":8},"encoding":"base64","content":"bG9jYWwtYXA=",'
        b'"truncation":{"truncated":"unknown"}}'
    )
    assert base64.b64decode(_body(response)["content"]) == b"local-ap"  # type: ignore[arg-type]
    assert response.header("content-type") == "application/json; charset=utf-8"
    rows = api.audit_rows()
    assert [(r[0], r[4], json.loads(r[5])) for r in rows] == [("run.log.read", "allowed", ["role_grant"])]


def test_reading_on_from_end_exclusive_to_the_end(api: LocalApiServer, logs: pathlib.Path) -> None:
    _write_log(logs)
    first = _body(api.get(BASE + "?offset=0&length=8"))
    rest = _body(api.get(BASE + f"?offset={first['range']['nextOffset']}"))  # type: ignore[index]
    assert rest["range"] == {"start": 8, "endExclusive": 19, "totalBytes": 19}  # no nextOffset at the end
    assert base64.b64decode(str(rest["content"])) == LOG[8:]


@pytest.mark.parametrize("offset", [19, 20, 2**53 - 1])
def test_an_offset_at_or_past_the_end_is_an_empty_available_range(api: LocalApiServer, logs: pathlib.Path,
                                                                  offset: int) -> None:
    _write_log(logs)
    response = api.get(BASE + f"?offset={offset}")
    assert response.status == 200
    body = _body(response)
    assert body["range"] == {"start": 19, "endExclusive": 19, "totalBytes": 19}
    assert body["content"] == ""


def test_default_window_is_16_kib_on_edge_and_32_kib_is_the_cap(api: LocalApiServer, logs: pathlib.Path) -> None:
    _write_log(logs, b"x" * 40_000)
    default = _body(api.get(BASE))
    assert default["range"] == {"start": 0, "endExclusive": 16_384, "totalBytes": 40_000, "nextOffset": 16_384}
    full = api.get(BASE + "?length=32768")
    assert full.status == 200 and len(full.body) < 64 * 1024
    assert _body(full)["range"]["endExclusive"] == 32_768  # type: ignore[index]


def test_default_window_is_32_kib_standalone(tmp_path: pathlib.Path, logs: pathlib.Path) -> None:
    with local_api(tmp_path, log_directory=logs, profile="standalone") as fixture:
        fixture.write(_attempt)
        _write_log(logs, b"y" * 40_000)
        assert _body(fixture.get(BASE))["range"]["endExclusive"] == 32_768  # type: ignore[index]


@pytest.mark.parametrize("query", [
    "?", "?offset=", "?offset=-1", "?offset=01", "?offset=+1", "?offset=1e3", "?offset=0x10", "?offset=abc",
    "?offset=9007199254740992", "?offset=99999999999999999999", "?length=0", "?length=32769", "?length=-5",
    "?length=1.5", "?offset=1&offset=2", "?limit=1", "?offset", "?offset==1", "?offset=1&", "?length=08",
])
def test_a_bad_query_is_400_before_authentication(api: LocalApiServer, query: str) -> None:
    response = api.get(BASE + query, authorization=None)
    assert (response.status, response.body) == (400, b'{"code":"invalid_run_log_read_query"}')
    assert api.audit_rows() == []


def test_states_pending_missing_and_not_found(api: LocalApiServer, logs: pathlib.Path) -> None:
    # bound, running, no file yet (the wrapper has not created it): 202 pending
    pending = api.get(BASE)
    assert pending.status == 202
    assert pending.body == (b'{"schema":"qinglong/run-attempt-log-read-result@v1","status":"pending",'
                            b'"projectId":"default","runId":"run_local_api_1","attemptId":"attempt_local_api_1"}')
    # terminal with a bound log that is gone: 503 artifact_unavailable (the reference's "missing")
    api.write(lambda c: c.execute("UPDATE \"RunAttempts\" SET status = 'failed' WHERE id = ?", (ATTEMPT_ID,)))
    missing = api.get(BASE)
    assert (missing.status, missing.body) == (503, b'{"code":"artifact_unavailable"}')
    for target in (
        f"/api/v3/projects/default/runs/{RUN_ID}/attempts/nope/log",
        f"/api/v3/projects/default/runs/run_missing/attempts/{ATTEMPT_ID}/log",
    ):
        response = api.get(target)
        assert (response.status, response.body) == (404, b'{"code":"artifact_not_found"}')


def test_an_attempt_not_yet_claimed_for_launch_is_pending(api: LocalApiServer) -> None:
    api.write(lambda c: c.execute("UPDATE \"RunAttempts\" SET status = 'claimed', log_artifact_id = NULL"))
    assert api.get(BASE).status == 202


def test_a_terminal_attempt_that_never_had_a_log_is_404(api: LocalApiServer) -> None:
    api.write(lambda c: c.execute("UPDATE \"RunAttempts\" SET status = 'cancelled', log_artifact_id = NULL"))
    response = api.get(BASE)
    assert (response.status, response.body) == (404, b'{"code":"artifact_not_found"}')


def test_another_projects_run_and_a_foreign_executor_are_404(api: LocalApiServer, logs: pathlib.Path) -> None:
    api.provisioned.store.run(lambda c: c.execute(
        "INSERT INTO \"QingLong3Projects\" (id, name, slug, status, version, created_at_ms, updated_at_ms)"
        " VALUES ('other', 'Other', 'other', 'active', 1, 0, 0)"))
    api.write(lambda c: insert_run(c, "run_other", project_id="other"))
    api.write(lambda c: _attempt(c, "run_other", "attempt_other"))
    _write_log(logs, run_id="run_other", attempt_id="attempt_other")
    # the Run exists, but in another project: masked as missing
    response = api.get("/api/v3/projects/default/runs/run_other/attempts/attempt_other/log")
    assert (response.status, response.body) == (404, b'{"code":"artifact_not_found"}')
    # an attempt of another Run under this Run's path
    response = api.get(f"/api/v3/projects/default/runs/{RUN_ID}/attempts/attempt_other/log")
    assert response.status == 404
    api.write(lambda c: insert_run(c, "run_remote"))
    api.write(lambda c: _attempt(c, "run_remote", "attempt_remote", executor="remote_worker"))
    assert api.get("/api/v3/projects/default/runs/run_remote/attempts/attempt_remote/log").status == 404
    api.write(lambda c: insert_run(c, "run_legacy", execution_owner="legacy"))
    api.write(lambda c: _attempt(c, "run_legacy", "attempt_legacy"))
    assert api.get("/api/v3/projects/default/runs/run_legacy/attempts/attempt_legacy/log").status == 404


def test_an_artifact_id_outside_the_local_grammar_is_404(api: LocalApiServer, logs: pathlib.Path) -> None:
    api.write(lambda c: c.execute("UPDATE \"RunAttempts\" SET log_artifact_id = 'wlog-0123'"))
    _write_log(logs)
    assert api.get(BASE).status == 404


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_read_only_roles_may_read(tmp_path: pathlib.Path, logs: pathlib.Path, role: str) -> None:
    with local_api(tmp_path, log_directory=logs, role=role) as fixture:
        fixture.write(_attempt)
        _write_log(logs)
        assert fixture.get(BASE).status == 200


def test_denied_and_approval_required_are_404_artifact_not_found(tmp_path: pathlib.Path,
                                                                logs: pathlib.Path) -> None:
    with local_api(tmp_path, log_directory=logs, role=None) as fixture:  # no binding: deny subject_unbound
        fixture.write(_attempt)
        _write_log(logs)
        response = fixture.get(BASE)
        assert (response.status, response.body) == (404, b'{"code":"artifact_not_found"}')
        rows = fixture.audit_rows()
        assert [(r[0], r[4], json.loads(r[5])) for r in rows] == [("run.log.read", "denied", ["subject_unbound"])]
    unauthenticated = None
    with local_api(tmp_path / "b", log_directory=logs) as fixture:
        unauthenticated = fixture.get(BASE, authorization=None)
    assert (unauthenticated.status, unauthenticated.body) == (401, b'{"code":"authentication_required"}')


def test_a_get_with_a_body_is_400_after_the_audit(api: LocalApiServer, logs: pathlib.Path) -> None:
    from tests.support.http_client import request_bytes
    from tests.support.store import AUTHORIZATION

    _write_log(logs)
    response = api.send(request_bytes("GET", BASE, headers=[("Authorization", AUTHORIZATION)], body=b"x"))
    assert response is not None and (response.status, response.body) == (400, b'{"code":"invalid_request_body"}')


def test_a_pruned_log_is_410_retired_with_its_tombstone(api: LocalApiServer, logs: pathlib.Path) -> None:
    path = _write_log(logs)
    api.write(lambda c: c.execute("UPDATE \"Runs\" SET status = 'succeeded', finished_at_ms = ?", (NOW,)))
    api.write(lambda c: c.execute("UPDATE \"RunAttempts\" SET status = 'succeeded'"))
    cleared = api.write(lambda c: clear_log_artifacts(c, [ATTEMPT_ID], sizes={ATTEMPT_ID: 19}, now_ms=NOW + 5))
    assert cleared == [(RUN_ID, ATTEMPT_ID, ARTIFACT)]
    path.unlink()
    response = api.get(BASE)
    assert response.status == 410
    assert response.body == (
        b'{"schema":"qinglong/run-attempt-log-read-result@v1","status":"retired","projectId":"default",'
        b'"runId":"run_local_api_1","attemptId":"attempt_local_api_1","retiredAtMs":1800000000005,'
        b'"byteLength":19,"truncation":{"truncated":"unknown"}}'
    )


def test_a_log_removed_during_the_read_answers_retired_not_a_traceback(api: LocalApiServer,
                                                                       logs: pathlib.Path) -> None:
    """The pruner wins the race between the row read and the open: the second look sees
    the tombstone."""
    path = _write_log(logs)
    api.write(lambda c: c.execute("UPDATE \"Runs\" SET status = 'succeeded', finished_at_ms = ?", (NOW,)))
    api.write(lambda c: c.execute("UPDATE \"RunAttempts\" SET status = 'succeeded'"))

    def prune_now(seen: str) -> None:
        assert seen == str(path)
        api.write(lambda c: clear_log_artifacts(c, [ATTEMPT_ID], sizes={ATTEMPT_ID: 19}, now_ms=NOW))
        path.unlink()

    status, body = api.api.logs.read("default", RUN_ID, ATTEMPT_ID, offset=0, length=8, path_hook=prune_now)
    assert (status, body["status"]) == (410, "retired")


def test_an_unsafe_file_is_503(api: LocalApiServer, logs: pathlib.Path, tmp_path: pathlib.Path) -> None:
    path = _write_log(logs)
    os.chmod(path, 0o644)
    assert (api.get(BASE).status, api.get(BASE).body) == (503, b'{"code":"artifact_unavailable"}')
    os.chmod(path, 0o600)
    os.link(path, tmp_path / "second-link")
    assert api.get(BASE).status == 503
    (tmp_path / "second-link").unlink()
    path.unlink()
    target = tmp_path / "elsewhere"
    target.write_bytes(b"secret")
    path.symlink_to(target)
    assert api.get(BASE).status in (202, 503)  # running: a symlink is refused (O_NOFOLLOW), never read
    api.write(lambda c: c.execute("UPDATE \"RunAttempts\" SET status = 'failed'"))
    response = api.get(BASE)
    assert response.status == 503 and b"secret" not in response.body


def test_read_log_range_snapshot_rules(tmp_path: pathlib.Path) -> None:
    path = _write_log(tmp_path, b"0123456789")
    got = read_log_range(str(path), 3, 4)
    assert got is not None and (got.content, got.start, got.total_bytes) == (b"3456", 3, 10)
    got = read_log_range(str(path), 50, 4)
    assert got is not None and (got.content, got.start, got.total_bytes) == (b"", 10, 10)
    assert read_log_range(str(tmp_path / "absent.log"), 0, 1) is None
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(LogReadUnavailable):
        read_log_range(str(fifo), 0, 1)
