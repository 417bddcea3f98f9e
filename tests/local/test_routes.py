"""Route table and raw-URL rules of local-api.md 2.3 (before authentication)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qinglong_edge.errors import ApiError
from qinglong_edge.local.routes import Route, resolve

P = "/api/v3/projects/default"


@pytest.mark.parametrize(
    ("method", "target", "operation", "run_id", "task_id"),
    [
        ("GET", f"{P}/runs", "run.list", None, None),
        ("GET", f"{P}/runs/run_local_api_1", "run.get", "run_local_api_1", None),
        ("GET", f"{P}/runs/r.1:2-3/events", "run.events.list", "r.1:2-3", None),
        ("GET", f"{P}/runs/r/steps", "run.steps.list", "r", None),
        ("POST", f"{P}/runs/r/cancellation", "run.cancel", "r", None),
        ("POST", f"{P}/tasks/t1/runs", "task.start", None, "t1"),
        ("GET", f"{P}/tasks", "task.list", None, None),
        ("GET", f"{P}/tasks/t1", "task.get", None, "t1"),
        ("GET", f"{P}/runs/r/attempts/a1/log", "run.log.read", "r", None),
        ("GET", f"{P}/edge-worker", "edge.worker.get", None, None),
    ],
)
def test_resolves_each_route(method: str, target: str, operation: str, run_id: str | None, task_id: str | None) -> None:
    route = resolve(method, target)
    assert (route.operation_id, route.project_id, route.run_id, route.task_id) == (operation, "default", run_id, task_id)
    assert route.json_body is (method == "POST")


def test_permissions() -> None:
    assert resolve("GET", f"{P}/runs").permission == "run.read"
    assert resolve("POST", f"{P}/runs/r/cancellation").permission == "run.stop"
    assert resolve("POST", f"{P}/tasks/t/runs").permission == "run.start"
    assert resolve("GET", f"{P}/runs/r/attempts/a/log").permission == "artifact.read"
    assert resolve("GET", f"{P}/tasks").permission == "task.read"
    assert resolve("GET", f"{P}/tasks/t").permission == "task.read"
    assert resolve("GET", f"{P}/edge-worker").permission == "project.read"


def test_log_read_query_defaults_and_attempt() -> None:
    route = resolve("GET", f"{P}/runs/r/attempts/a.1/log")
    assert (route.attempt_id, dict(route.query)) == ("a.1", {"offset": 0, "length": None})
    route = resolve("GET", f"{P}/runs/r/attempts/a/log?length=32768&offset=9007199254740991")
    assert dict(route.query) == {"offset": 9007199254740991, "length": 32768}
    assert dict(resolve("GET", f"{P}/tasks?after_task_id=t.1").query) == {"limit": 32, "after_task_id": "t.1"}


NOT_FOUND = [
    ("query_on_cancel", "POST", f"{P}/runs/r/cancellation?x=1"),
    ("empty_query_on_cancel", "POST", f"{P}/runs/r/cancellation?"),
    ("query_on_get", "GET", f"{P}/runs/r?"),
    ("query_on_task_start", "POST", f"{P}/tasks/t/runs?a=1"),
    ("percent_encoded", "POST", f"{P}/runs/run%5Flocal_api_1/cancellation"),
    ("percent_in_query", "GET", f"{P}/runs?limit=%31"),
    ("hash", "GET", f"{P}/runs#x"),
    ("two_questions", "GET", f"{P}/runs?limit=1?"),
    ("trailing_slash", "GET", f"{P}/runs/"),
    ("double_slash", "GET", "/api/v3/projects//runs"),
    ("dot_segment", "GET", "/api/v3/projects/./runs"),
    ("dotdot_segment", "GET", "/api/v3/projects/default/runs/../runs"),
    ("project_list", "GET", "/api/v3/projects"),
    ("wrong_method_get_cancel", "GET", f"{P}/runs/r/cancellation"),
    ("wrong_method_post_get", "POST", f"{P}/runs/r"),
    ("head", "HEAD", f"{P}/runs"),
    ("options", "OPTIONS", f"{P}/runs"),
    ("lowercase_method", "get", f"{P}/runs"),
    ("query_on_task_get", "GET", f"{P}/tasks/t?x=1"),
    ("wrong_method_get_task_start", "GET", f"{P}/tasks/t/runs"),
    ("post_task_list", "POST", f"{P}/tasks"),
    ("log_without_attempt", "GET", f"{P}/runs/r/attempts/log"),
    ("log_trailing_slash", "GET", f"{P}/runs/r/attempts/a/log/"),
    ("query_on_edge_worker", "GET", f"{P}/edge-worker?x=1"),
    ("bad_id_first_char", "GET", "/api/v3/projects/-x/runs"),
    ("id_too_long", "GET", f"/api/v3/projects/{'a' * 129}/runs"),
    ("url_over_512", "GET", f"{P}/runs?after_run_id={'a' * 128}&limit=1" + "x" * 400),
    ("root", "GET", "/"),
    ("case", "GET", "/API/v3/projects/default/runs"),
]


@pytest.mark.parametrize(("method", "target"), [pytest.param(m, t, id=i) for i, m, t in NOT_FOUND])
def test_rejects_with_route_not_found(method: str, target: str) -> None:
    with pytest.raises(ApiError) as info:
        resolve(method, target)
    assert (info.value.http_status, info.value.body) == (404, {"code": "route_not_found"})


def test_url_of_exactly_512_bytes_is_routed() -> None:
    base = f"{P}/runs?after_created_at_ms=1&after_run_id="
    target = base + "a" * (512 - len(base))
    assert len(target) == 512
    # the id grammar caps ids at 128 chars, so this is a 400 (routed), not a 404
    with pytest.raises(ApiError) as info:
        resolve("GET", target)
    assert info.value.http_status == 400


def test_run_list_query_defaults_and_values() -> None:
    assert resolve("GET", f"{P}/runs").query == {"limit": 32, "after_created_at_ms": None, "after_run_id": None}
    route = resolve("GET", f"{P}/runs?after_run_id=r9&limit=64&after_created_at_ms=9007199254740991")
    assert route.query == {"limit": 64, "after_created_at_ms": 9007199254740991, "after_run_id": "r9"}


def test_events_and_steps_query_values() -> None:
    assert resolve("GET", f"{P}/runs/r/events").query == {"limit": 32, "after_sequence": 0}
    assert resolve("GET", f"{P}/runs/r/events?after_sequence=2147483647&limit=1").query == {
        "limit": 1,
        "after_sequence": 2147483647,
    }
    assert resolve("GET", f"{P}/runs/r/steps?after_step_key=k&after_step_run_id=s").query == {
        "limit": 32,
        "after_step_key": "k",
        "after_step_run_id": "s",
    }


BAD_QUERIES = [
    ("runs", "", "empty"),
    ("runs", "limit", "no_equals"),
    ("runs", "limit=", "empty_value"),
    ("runs", "limit=1=2", "two_equals"),
    ("runs", "=1", "empty_name"),
    ("runs", "limit=1&limit=2", "duplicate"),
    ("runs", "limit=1&", "trailing_ampersand"),
    ("runs", "x=1", "unknown"),
    ("runs", "LIMIT=1", "name_case"),
    ("runs", "limit=0", "limit_zero"),
    ("runs", "limit=65", "limit_too_big"),
    ("runs", "limit=08", "leading_zero"),
    ("runs", "limit=+8", "plus"),
    ("runs", "limit=8e0", "exponent"),
    ("runs", "limit=0x8", "hex"),
    ("runs", "limit=-1", "negative"),
    ("runs", "limit=1.0", "fraction"),
    ("runs", "after_created_at_ms=1", "half_cursor_ms"),
    ("runs", "after_run_id=r", "half_cursor_id"),
    ("runs", "after_created_at_ms=-0&after_run_id=r", "minus_zero"),
    ("runs", "after_created_at_ms=9007199254740992&after_run_id=r", "beyond_safe"),
    ("runs", "after_created_at_ms=1&after_run_id=-r", "bad_id"),
    ("runs/r/events", "", "events_empty"),
    ("runs/r/events", "after_sequence=2147483648", "events_seq_too_big"),
    ("runs/r/events", "after_run_id=r", "events_unknown"),
    ("runs/r/steps", "after_step_key=k", "steps_half_cursor"),
    ("runs/r/steps", "limit=100", "steps_limit"),
]
CODES = {"runs": "invalid_run_list_query", "runs/r/events": "invalid_run_event_list_query", "runs/r/steps": "invalid_run_step_list_query"}


@pytest.mark.parametrize(("path", "query"), [pytest.param(p, q, id=i) for p, q, i in BAD_QUERIES])
def test_rejects_bad_queries_with_the_route_code(path: str, query: str) -> None:
    with pytest.raises(ApiError) as info:
        resolve("GET", f"{P}/{path}?{query}")
    assert (info.value.http_status, info.value.body) == (400, {"code": CODES[path]})


def test_route_is_immutable() -> None:
    route = resolve("GET", f"{P}/runs")
    assert isinstance(route, Route)
    with pytest.raises(AttributeError):
        route.project_id = "x"  # type: ignore[misc]


@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from(["GET", "POST", "HEAD", "PUT"]),
    st.one_of(
        st.text(max_size=600),
        st.builds(
            lambda tail, query: f"{P}/{tail}" + (f"?{query}" if query is not None else ""),
            st.sampled_from(["runs", "runs/r", "runs/r/events", "runs/r/steps", "runs/r/cancellation", "tasks/t/runs"]),
            st.one_of(st.none(), st.text(alphabet="abcdefghijklmnopqrstuvwxyz_=&0123456789+-.%?#", max_size=80)),
        ),
    ),
)
def test_resolve_is_total(method: str, target: str) -> None:
    """Any method and target: a Route, or ApiError 404/400 with a known code; nothing else."""
    try:
        route = resolve(method, target)
    except ApiError as exc:
        assert exc.http_status in (400, 404)
        assert exc.body["code"] in {"route_not_found", *CODES.values()}
        if exc.http_status == 400:
            assert "?" in target
        return
    assert route.permission in ("run.read", "run.stop", "run.start")
    limit = route.query.get("limit")
    assert limit is None or 1 <= int(limit) <= 64
