"""Every example of local-api.md section 10, over a real socket against a real database.

Responses are compared byte for byte except the values of ``x-request-id`` (checked
against ``local:<uuidv4>``) and ``Date`` (checked against IMF-fixdate).
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Iterator

import pytest

from qinglong_edge.local.identity import Subject
from qinglong_edge.local.policy import bump_project_version, create_project, grant_role, revoke_role
from qinglong_edge.local.routes import Route
from tests.support.http_client import RawResponse, request_bytes
from tests.support.local_api import CANCEL_BODY, CANCEL_PATH, RUN_ID, LocalApiServer, local_api
from tests.support.store import AUTHORIZATION, NOW, SYSTEM, USER, insert_run

REQUEST_ID = re.compile(rb"x-request-id: local:[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\r\n")
DATE = re.compile(rb"Date: (Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d\d:\d\d:\d\d GMT\r\n")
REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           409: "Conflict", 413: "Payload Too Large", 503: "Service Unavailable"}


def expected(status: int, body: bytes, content_length: int, *, close: bool = False) -> bytes:
    """The exact response bytes (request id and date normalised)."""
    assert len(body) == content_length, "the spec's content-length must match its body"
    lines = [
        f"HTTP/1.1 {status} {REASONS[status]}",
        "content-type: application/json; charset=utf-8",
        "cache-control: no-store",
        "x-content-type-options: nosniff",
        "x-request-id: local:<ID>",
        f"content-length: {content_length}",
    ]
    if close:
        lines.append("connection: close")
    lines.append("Date: <DATE>")
    if not close:
        lines += ["Connection: keep-alive", "Keep-Alive: timeout=5"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def normalised(response: RawResponse) -> bytes:
    raw = response.raw_head + response.body
    assert len(REQUEST_ID.findall(raw)) == 1, raw
    assert len(DATE.findall(raw)) == 1, raw
    raw = REQUEST_ID.sub(b"x-request-id: local:<ID>\r\n", raw)
    return DATE.sub(b"Date: <DATE>\r\n", raw)


@pytest.fixture
def api(tmp_path: pathlib.Path) -> Iterator[LocalApiServer]:
    with local_api(tmp_path) as server:
        yield server


ACCEPTED = (
    b'{"schema":"qinglong/run-cancellation@v1","status":"accepted","projectId":"default","runId":"run_local_api_1",'
    b'"runStatus":"running","runVersion":2,"eventSequence":2,"cancelRequestedAtMs":1800000000000,"cancelReason":"user"}'
)
ALREADY_REQUESTED = (
    b'{"schema":"qinglong/run-cancellation@v1","status":"already_requested","projectId":"default",'
    b'"runId":"run_local_api_1","runStatus":"running","runVersion":2,"eventSequence":2,'
    b'"cancelRequestedAtMs":1800000000000,"cancelReason":"user"}'
)


def test_10_1_first_cancel_is_202_with_durable_effects(api: LocalApiServer) -> None:
    request = (
        b"POST /api/v3/projects/default/runs/run_local_api_1/cancellation HTTP/1.1\r\n"
        b"Host: 127.0.0.1:5700\r\n"
        b"Authorization: Bearer ql3c_local-api-owner_UVFRUVFRUVFRUVFRUVFRUVFRUVFRUVFRUVFRUVFRUVE\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: 75\r\n"
        b"\r\n" + CANCEL_BODY
    )
    response = api.send(request)
    assert response is not None
    assert normalised(response) == expected(202, ACCEPTED, 222)
    assert api.run_row() == ("running", 2, 2, 1800000000000, "user")
    assert api.events() == [(
        2, "run.cancel_requested", "user-cancel:cancel-local-api-1", "user", "local-api-user",
        '{"reason":"user","mutation_id":"cancel-local-api-1","policy_fence":{"project_version":1,"binding_version":1}}',
        1800000000000,
    )]
    audit = api.audit_rows()
    assert len(audit) == 1
    assert audit[0][:8] == ("run.cancel", "default", "user", "local-api-user", "allowed", '["role_grant"]', 1, 1)
    assert audit[0][8] == response.header("x-request-id")
    assert api.intents == [("run.cancel", RUN_ID)]


def test_10_2_exact_replay_is_200_already_requested(api: LocalApiServer) -> None:
    assert api.cancel().status == 202
    response = api.cancel()
    assert normalised(response) == expected(200, ALREADY_REQUESTED, 231)
    assert api.run_row() == ("running", 2, 2, 1800000000000, "user")
    assert len(api.events()) == 1
    assert [row[4] for row in api.audit_rows()] == ["allowed", "allowed"]
    assert api.intents == [("run.cancel", RUN_ID)]  # no second wake-up


def test_10_2_replay_after_convergence_is_already_terminal(api: LocalApiServer) -> None:
    assert api.cancel().status == 202
    api.write(lambda c: c.execute("UPDATE \"Runs\" SET status = 'cancelled', version = 4, event_sequence = 4"
                                  " WHERE id = ?", (RUN_ID,)))
    response = api.cancel()
    body = (
        b'{"schema":"qinglong/run-cancellation@v1","status":"already_terminal","projectId":"default",'
        b'"runId":"run_local_api_1","runStatus":"cancelled","runVersion":4,"eventSequence":4,'
        b'"cancelRequestedAtMs":1800000000000,"cancelReason":"user"}'
    )
    assert normalised(response) == expected(200, body, len(body))


def test_10_3_other_mutation_id_after_the_intent_is_identical_to_10_2(api: LocalApiServer) -> None:
    assert api.cancel().status == 202
    body = b'{"schema":"qinglong/run-cancellation@v1","mutationId":"cancel-local-api-2"}'
    assert len(body) == 75
    response = api.cancel(body)
    assert normalised(response) == expected(200, ALREADY_REQUESTED, 231)
    assert len(api.events()) == 1


def test_10_4_terminal_run_is_200_already_terminal(api: LocalApiServer) -> None:
    api.write(lambda c: insert_run(c, "run_local_api_done", status="succeeded", version=4, event_sequence=4))
    body = b'{"schema":"qinglong/run-cancellation@v1","mutationId":"cancel-local-api-3"}'
    response = api.cancel(body, run_id="run_local_api_done")
    expected_body = (
        b'{"schema":"qinglong/run-cancellation@v1","status":"already_terminal","projectId":"default",'
        b'"runId":"run_local_api_done","runStatus":"succeeded","runVersion":4,"eventSequence":4}'
    )
    assert normalised(response) == expected(200, expected_body, 177)
    assert api.events("run_local_api_done") == []


def test_10_5_unknown_and_cross_project_runs_are_indistinguishable_404(api: LocalApiServer) -> None:
    api.write(lambda c: create_project(c, "other", "Other", "other", NOW))
    api.write(lambda c: insert_run(c, "run_x", project_id="other"))
    missing = api.cancel(run_id="run_missing")
    cross = api.cancel(run_id="run_x")
    for response in (missing, cross):
        assert normalised(response) == expected(404, b'{"code":"run_not_found"}', 24)
    assert api.run_row("run_x") == ("running", 1, 1, None, None)


def test_10_5_project_without_binding_is_403_subject_unbound(api: LocalApiServer) -> None:
    api.write(lambda c: create_project(c, "other", "Other", "other", NOW))
    api.write(lambda c: insert_run(c, "run_x", project_id="other"))
    response = api.cancel(project="other", run_id="run_x")
    assert normalised(response) == expected(403, b'{"code":"forbidden"}', 20, close=True)
    assert api.audit_rows()[-1][:8] == ("run.cancel", "other", "user", "local-api-user", "denied",
                                         '["subject_unbound"]', 1, None)


def test_unknown_project_is_403_and_audited_with_the_requested_id(api: LocalApiServer) -> None:
    """spec README decision: 403 forbidden, audited without a foreign key (not 503)."""
    response = api.cancel(project="no-such-project")
    assert normalised(response) == expected(403, b'{"code":"forbidden"}', 20, close=True)
    assert api.audit_rows()[-1][:8] == ("run.cancel", "no-such-project", "user", "local-api-user", "denied",
                                         '["project_not_found"]', None, None)


def test_10_6_viewer_is_403_denied_body_unread_and_connection_closed(tmp_path: pathlib.Path) -> None:
    with local_api(tmp_path, role="viewer") as api:
        sock, reader = api.keep_alive()
        with sock:
            sock.sendall(request_bytes("POST", CANCEL_PATH, headers=[
                ("Authorization", AUTHORIZATION), ("Content-Type", "application/json")], body=CANCEL_BODY))
            response = reader.read()
            assert response is not None
            assert normalised(response) == expected(403, b'{"code":"forbidden"}', 20, close=True)
            assert reader.closed_by_server()
        assert api.audit_rows()[-1][4:8] == ("denied", '["permission_missing"]', 1, 1)
        assert api.run_row() == ("running", 1, 1, None, None)
        # the body was never read: the server consumed exactly the head
        assert api.server.bytes_received == len(request_bytes("POST", CANCEL_PATH, headers=[
            ("Authorization", AUTHORIZATION), ("Content-Type", "application/json")], body=CANCEL_BODY)) - 75


def test_10_6_agent_with_operator_is_403_approval_required(tmp_path: pathlib.Path) -> None:
    with local_api(tmp_path, subject=Subject("agent", "local-api-agent")) as api:
        response = api.cancel()
        assert normalised(response) == expected(403, b'{"code":"approval_required"}', 28, close=True)
        assert api.audit_rows()[-1][4:6] == ("approval_required", '["agent_action_requires_approval"]')
        assert api.events() == []


FENCE_409 = b'{"code":"run_cancellation_fence_rejected","reason":"authorization_changed"}'


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda c: revoke_role(c, "default", USER, mutation_id="revoke-1", changed_by=SYSTEM, now_ms=NOW), id="role_revoked"),
        pytest.param(lambda c: bump_project_version(c, "default", NOW), id="project_version_bumped"),
        pytest.param(lambda c: grant_role(c, "default", USER, "admin", mutation_id="promote-1", changed_by=SYSTEM, now_ms=NOW), id="promoted"),
    ],
)
def test_10_7_fence_change_between_admission_and_commit_is_409(api: LocalApiServer, change: object) -> None:
    def race(route: Route) -> None:
        api.hooks.clear()
        api.write(change)  # type: ignore[arg-type]

    api.hooks.append(race)
    response = api.cancel()
    assert normalised(response) == expected(409, FENCE_409, 75)
    assert api.run_row() == ("running", 1, 1, None, None)
    assert api.events() == []
    assert [row[4] for row in api.audit_rows()] == ["allowed"]  # admission saw the old fence
    assert api.intents == []


UNKNOWN_FIELD = b'{"schema":"qinglong/run-cancellation@v1","mutationId":"cancel-local-api-1","reason":"x"}'
INVALID_CANCEL = b'{"code":"invalid_run_cancellation_request","schema":"qinglong/run-cancellation@v1"}'
INVALID_BODY = b'{"code":"invalid_request_body"}'


def test_10_9_unknown_field_example(api: LocalApiServer) -> None:
    request = (
        b"POST /api/v3/projects/default/runs/run_local_api_1/cancellation HTTP/1.1\r\n"
        b"Host: 127.0.0.1:5700\r\n"
        b"Authorization: Bearer ql3c_local-api-owner_UVFRUVFRUVFRUVFRUVFRUVFRUVFRUVFRUVFRUVFRUVE\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: 88\r\n"
        b"\r\n" + UNKNOWN_FIELD
    )
    assert len(UNKNOWN_FIELD) == 88
    response = api.send(request)
    assert response is not None
    assert normalised(response) == expected(400, INVALID_CANCEL, 83)
    assert api.events() == []


def _post(headers: list[tuple[str, str]], body: bytes, *, auth: bool = True, target: str = CANCEL_PATH) -> bytes:
    base = [("Authorization", AUTHORIZATION)] if auth else []
    return request_bytes("POST", target, headers=base + headers, body=body, content_length=False)


CT = ("Content-Type", "application/json")
MALFORMED = [
    ("oversize", _post([CT, ("Content-Length", "513")], b""), 413, b'{"code":"request_body_too_large"}', True),
    ("text_plain", _post([("Content-Type", "text/plain"), ("Content-Length", "75")], CANCEL_BODY), 400, INVALID_BODY, True),
    ("ct_with_parameter", _post([("Content-Type", "application/json; charset=utf-8"), ("Content-Length", "75")], CANCEL_BODY), 400, INVALID_BODY, True),
    ("ct_case_insensitive_ok", _post([("Content-Type", " Application/JSON"), ("Content-Length", "75")], CANCEL_BODY), 202, None, False),
    ("two_content_types", _post([CT, CT, ("Content-Length", "75")], CANCEL_BODY), 400, INVALID_BODY, True),
    ("chunked", _post([CT, ("Transfer-Encoding", "chunked")], b"4b\r\n" + CANCEL_BODY + b"\r\n0\r\n\r\n"), 400, INVALID_BODY, True),
    ("empty_cl_0", _post([CT, ("Content-Length", "0")], b""), 400, INVALID_BODY, False),
    ("missing_cl", _post([CT], b""), 400, INVALID_BODY, False),
    ("leading_zero", _post([CT, ("Content-Length", "075")], CANCEL_BODY), 400, INVALID_BODY, True),
    ("cl_00", _post([CT, ("Content-Length", "00")], b""), 400, INVALID_BODY, True),
    ("truncated_json", _post([CT, ("Content-Length", "1")], b"{"), 400, INVALID_BODY, False),
    ("trailing_json", _post([CT, ("Content-Length", "77")], CANCEL_BODY + b"{}"), 400, INVALID_BODY, False),
    ("non_utf8", _post([CT, ("Content-Length", "75")], CANCEL_BODY.replace(b"api-1", b"api\xff1")), 400, INVALID_BODY, False),
    ("nan", _post([CT, ("Content-Length", "3")], b"NaN"), 400, INVALID_BODY, False),
    ("duplicate_key", _post([CT, ("Content-Length", "100")], b'{"schema":"qinglong/run-cancellation@v1","mutationId":"a","mutationId":"cancel-local-api-1"}'.ljust(100)), 400, INVALID_BODY, False),
    ("unknown_field", _post([CT, ("Content-Length", "88")], UNKNOWN_FIELD), 400, INVALID_CANCEL, False),
    ("wrong_schema", _post([CT, ("Content-Length", "75")], CANCEL_BODY.replace(b"@v1", b"@v2")), 400, INVALID_CANCEL, False),
    ("bad_mutation_id", _post([CT, ("Content-Length", "75")], CANCEL_BODY.replace(b'"cancel-', b'"-ancel-')), 400, INVALID_CANCEL, False),
    ("json_null", _post([CT, ("Content-Length", "4")], b"null"), 400, INVALID_CANCEL, False),
    ("json_array", _post([CT, ("Content-Length", "2")], b"[]"), 400, INVALID_CANCEL, False),
    ("bom_stripped_ok", _post([CT, ("Content-Length", "78")], b"\xef\xbb\xbf" + CANCEL_BODY), 202, None, False),
    ("two_boms", _post([CT, ("Content-Length", "81")], b"\xef\xbb\xbf\xef\xbb\xbf" + CANCEL_BODY), 400, INVALID_BODY, False),
    ("trailing_whitespace_ok", _post([CT, ("Content-Length", "77")], CANCEL_BODY + b" \n"), 202, None, False),
    ("query_string", _post([CT, ("Content-Length", "75")], CANCEL_BODY, target=CANCEL_PATH + "?x=1"), 404, b'{"code":"route_not_found"}', True),
    ("empty_query", _post([CT, ("Content-Length", "75")], CANCEL_BODY, target=CANCEL_PATH + "?"), 404, b'{"code":"route_not_found"}', True),
    ("percent_encoded", _post([CT, ("Content-Length", "75")], CANCEL_BODY, target=CANCEL_PATH.replace("run_local", "run%5Flocal")), 404, b'{"code":"route_not_found"}', True),
    ("no_authorization", _post([CT, ("Content-Length", "75")], CANCEL_BODY, auth=False), 401, b'{"code":"authentication_required"}', True),
    ("unauthenticated_oversize", _post([CT, ("Content-Length", "10000")], b"", auth=False), 401, b'{"code":"authentication_required"}', True),
    ("two_authorizations", _post([("Authorization", AUTHORIZATION), CT, ("Content-Length", "75")], CANCEL_BODY), 401, b'{"code":"authentication_required"}', True),
    ("wrong_secret", _post([CT, ("Content-Length", "75")], CANCEL_BODY, auth=False).replace(b"Content-Type", b"Authorization: Bearer ql3c_local-api-owner_" + b"A" * 43 + b"\r\nContent-Type"), 401, b'{"code":"authentication_required"}', True),
    ("lowercase_bearer", _post([("Authorization", AUTHORIZATION.replace("Bearer", "bearer")), CT, ("Content-Length", "75")], CANCEL_BODY, auth=False), 401, b'{"code":"authentication_required"}', True),
]


@pytest.mark.parametrize(("request_data", "status", "body", "closes"), [pytest.param(*m[1:], id=m[0]) for m in MALFORMED])
def test_10_9_malformed_requests(api: LocalApiServer, request_data: bytes, status: int, body: bytes | None, closes: bool) -> None:
    sock, reader = api.keep_alive()
    with sock:
        sock.sendall(request_data)
        response = reader.read()
        assert response is not None
        assert response.status == status, response.body
        if body is not None:
            assert normalised(response) == expected(status, body, len(body), close=closes)
        assert response.closes is closes
        if closes:
            assert reader.closed_by_server()
    intent = api.run_row()[3]
    assert (intent is not None) is (status == 202)
    assert len(api.events()) == (1 if status == 202 else 0)
    audited = api.audit_rows()
    if status == 404:
        assert audited == []  # route errors come before authentication, never audited
    elif status == 401:
        assert [row[4] for row in audited] == ["authentication_rejected"]
        assert audited[0][2:4] == (None, None)
    else:
        assert [row[4] for row in audited] == ["allowed"]  # body problems come after the audit
    assert api.next_request_served()


def test_10_9_get_with_a_body_is_400_after_the_allowed_audit(api: LocalApiServer) -> None:
    data = request_bytes("GET", f"/api/v3/projects/default/runs/{RUN_ID}", headers=[("Authorization", AUTHORIZATION), ("Content-Length", "1")]) + b"x"
    response = api.send(data)
    assert response is not None
    assert normalised(response) == expected(400, INVALID_BODY, 31, close=True)
    assert [(row[0], row[4]) for row in api.audit_rows()] == [("run.get", "allowed")]


def test_get_with_content_length_0_is_allowed(api: LocalApiServer) -> None:
    data = request_bytes("GET", f"/api/v3/projects/default/runs/{RUN_ID}", headers=[("Authorization", AUTHORIZATION), ("Content-Length", "0")])
    response = api.send(data)
    assert response is not None and response.status == 200 and not response.closes


def test_audit_request_id_equals_the_response_header(api: LocalApiServer) -> None:
    response = api.get("/api/v3/projects/default/runs", authorization=None)
    assert response.status == 401
    assert api.audit_rows()[-1][8] == response.header("x-request-id")
    assert json.loads(response.body) == {"code": "authentication_required"}
    assert response.header("www-authenticate") is None
