"""docs/openapi.json describes exactly the routes the server resolves."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

from qinglong_edge.local import routes

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def load() -> dict[str, object]:
    return json.loads(DOC.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def test_is_openapi_3_1() -> None:
    doc = load()
    assert doc["openapi"] == "3.1.0"


def test_every_route_is_documented_with_its_operation_id() -> None:
    doc = load()
    paths = doc["paths"]
    assert isinstance(paths, dict)
    documented = {
        (method.upper(), path, operation["operationId"])
        for path, item in paths.items()
        for method, operation in item.items()
    }
    table = set()
    for method, pattern, operation in routes._PATHS:
        template = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: "{" + {"project": "projectId", "run": "runId", "task": "taskId", "attempt": "attemptId"}[m.group(1)] + "}", pattern.pattern)
        table.add((method, template, operation))
    assert documented == table


def test_every_operation_documents_admission_errors() -> None:
    doc = load()
    for item in doc["paths"].values():  # type: ignore[attr-defined]
        for operation in item.values():
            responses = operation["responses"]
            # run.log.read answers a refusal 404 artifact_not_found, never 403.
            refused = ("404",) if operation["operationId"] == "run.log.read" else ("403",)
            for status in ("400", "401", *refused, "404", "429", "503"):
                assert status in responses, (operation["operationId"], status)
            limited = responses["429"]["content"]["application/json; charset=utf-8"]["schema"]
            assert limited["properties"]["code"]["enum"] == ["rate_limited"]
            assert "retry-after" in responses["429"]["headers"]
            codes = responses["503"]["content"]["application/json; charset=utf-8"]["schema"]["properties"]["code"]["enum"]
            assert "security_audit_unavailable" in codes
            assert "server_overloaded" in codes


def test_every_ref_resolves() -> None:
    doc = load()
    text = DOC.read_text(encoding="utf-8")
    for ref in set(re.findall(r'"\$ref": "#/([^"]+)"', text)):
        node: object = doc
        for part in ref.split("/"):
            assert isinstance(node, dict) and part in node, ref
            node = node[part]


# -- the documented schemas match what the server really sends ---------------------------


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        node: Any = doc
        for part in schema["$ref"].lstrip("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def conforms(doc: dict[str, Any], schema: dict[str, Any], value: Any, path: str = "$") -> None:
    """A small JSON Schema subset: the keywords docs/openapi.json uses."""
    schema = _resolve(doc, schema)
    if "oneOf" in schema:
        matches = 0
        for option in schema["oneOf"]:
            try:
                conforms(doc, option, value, path)
                matches += 1
            except AssertionError:
                pass
        assert matches == 1, f"{path}: matches {matches} of oneOf"
        return
    if "const" in schema:
        assert value == schema["const"], path
    if "enum" in schema:
        assert value in schema["enum"], f"{path}: {value!r}"
    kinds = schema.get("type")
    if kinds is not None:
        kinds = kinds if isinstance(kinds, list) else [kinds]
        python = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
        ok = any(
            (kind == "integer" and isinstance(value, int) and not isinstance(value, bool))
            or (kind in python and isinstance(value, python[kind]))
            for kind in kinds
        )
        assert ok, f"{path}: {value!r} is not {kinds}"
    if isinstance(value, dict):
        for key in schema.get("required", []):
            assert key in value, f"{path}: missing {key}"
        properties = schema.get("properties", {})
        if schema.get("additionalProperties") is False:
            assert set(value) <= set(properties), f"{path}: extra {set(value) - set(properties)}"
        for key, item in value.items():
            if key in properties:
                conforms(doc, properties[key], item, f"{path}.{key}")
    if isinstance(value, list):
        assert len(value) <= schema.get("maxItems", len(value)), path
        for index, item in enumerate(value):
            conforms(doc, schema.get("items", {}), item, f"{path}[{index}]")
    if isinstance(value, int) and not isinstance(value, bool):
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value), path
    if isinstance(value, str) and "pattern" in schema:
        assert re.search(schema["pattern"], value), f"{path}: {value!r}"


def test_live_responses_match_the_documented_schemas(tmp_path: pathlib.Path) -> None:
    from tests.local.test_runs import _step
    from tests.support.local_api import RUN_ID, local_api
    from tests.support.store import NOW, insert_run

    doc = load()
    paths: Any = doc["paths"]
    prefix = "/api/v3/projects/{projectId}"
    with local_api(tmp_path) as api:
        api.write(lambda c: insert_run(c, "done", status="succeeded", version=4, event_sequence=4))
        api.write(lambda c: _step(c, RUN_ID, "s1", "build"))
        api.write(lambda c: c.execute(
            'INSERT INTO "RunAttempts" (id, run_id, attempt, status, executor_type, callback_sequence, created_at_ms)'
            " VALUES ('a1', ?, 1, 'running', 'local_process', 0, ?)", (RUN_ID, NOW)))
        checks = [
            (prefix + "/runs/{runId}/cancellation", "post", api.cancel()),
            (prefix + "/runs/{runId}/cancellation", "post", api.cancel()),
            (prefix + "/runs/{runId}/cancellation", "post", api.cancel(run_id="done")),
            (prefix + "/runs/{runId}/cancellation", "post", api.cancel(run_id="missing")),
            (prefix + "/runs/{runId}/cancellation", "post", api.cancel(b'{"schema":1}')),
            (prefix + "/runs/{runId}/cancellation", "post", api.cancel(authorization=None)),
            (prefix + "/runs", "get", api.get("/api/v3/projects/default/runs?limit=1")),
            (prefix + "/runs", "get", api.get("/api/v3/projects/default/runs?limit=x")),
            (prefix + "/runs/{runId}", "get", api.get(f"/api/v3/projects/default/runs/{RUN_ID}")),
            (prefix + "/runs/{runId}/events", "get", api.get(f"/api/v3/projects/default/runs/{RUN_ID}/events")),
            (prefix + "/runs/{runId}/steps", "get", api.get(f"/api/v3/projects/default/runs/{RUN_ID}/steps")),
            (prefix + "/runs/{runId}/steps", "get", api.get("/api/v3/projects/default/runs/missing/steps")),
        ]
        # issue 26: the log read (200, 202, 404, 410, 400 query), the task reads, the worker state
        import os

        from qinglong_edge.local.retention_rows import clear_log_artifacts
        from qinglong_edge.local.tasks import create_task
        from tests.support.store import SYSTEM

        logs = tmp_path / "logs"
        logs.mkdir()
        api.api.logs._directory = str(logs)
        log_path = f"/api/v3/projects/default/runs/{RUN_ID}/attempts/a1/log"
        checks.append((prefix + "/runs/{runId}/attempts/{attemptId}/log", "get", api.get(log_path)))  # 202
        fd = os.open(logs / f"{RUN_ID}_a1.log", os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"hello\n")
        os.close(fd)
        api.write(lambda c: c.execute("UPDATE \"RunAttempts\" SET log_artifact_id = ? WHERE id = 'a1'",
                                      ("local-" + "b" * 30,)))
        checks.append((prefix + "/runs/{runId}/attempts/{attemptId}/log", "get", api.get(log_path + "?length=2")))
        checks.append((prefix + "/runs/{runId}/attempts/{attemptId}/log", "get", api.get(log_path + "?length=0")))
        checks.append((prefix + "/runs/{runId}/attempts/{attemptId}/log", "get",
                       api.get("/api/v3/projects/default/runs/x/attempts/a1/log")))
        api.write(lambda c: c.execute("UPDATE \"Runs\" SET status = 'succeeded' WHERE id = ?", (RUN_ID,)))
        api.write(lambda c: c.execute("UPDATE \"RunAttempts\" SET status = 'succeeded' WHERE id = 'a1'"))
        api.write(lambda c: clear_log_artifacts(c, ["a1"], sizes={"a1": 6}, now_ms=NOW))
        checks.append((prefix + "/runs/{runId}/attempts/{attemptId}/log", "get", api.get(log_path)))  # 410
        api.write(lambda c: create_task(c, project_id="default", task_id="t1", name="T", mutation_id="m1",
                                        definition={"command": {"kind": "shell", "command": "true"}},
                                        created_by=SYSTEM, now_ms=NOW))
        checks += [
            (prefix + "/tasks", "get", api.get("/api/v3/projects/default/tasks")),
            (prefix + "/tasks", "get", api.get("/api/v3/projects/default/tasks?limit=0")),
            (prefix + "/tasks/{taskId}", "get", api.get("/api/v3/projects/default/tasks/t1")),
            (prefix + "/tasks/{taskId}", "get", api.get("/api/v3/projects/default/tasks/none")),
            (prefix + "/edge-worker", "get", api.get("/api/v3/projects/default/edge-worker")),
        ]
        statuses = {(path, response.status) for path, _, response in checks}
        assert (prefix + "/runs/{runId}/attempts/{attemptId}/log", 410) in statuses
        assert (prefix + "/runs/{runId}/attempts/{attemptId}/log", 202) in statuses
        for path, method, response in checks:
            documented = paths[path][method]["responses"][str(response.status)]
            media = documented["content"]["application/json; charset=utf-8"]
            conforms(doc, media["schema"], response.json())


def test_a_live_429_matches_the_documented_schema(tmp_path: pathlib.Path) -> None:
    from qinglong_edge.local.budget import RequestBudget
    from tests.support.local_api import local_api

    doc = load()
    budget = RequestBudget(burst=1, per_minute=1.0)
    with local_api(tmp_path, budget=budget) as api:
        assert api.get("/api/v3/projects/default/runs", authorization=None).status == 401
        response = api.get("/api/v3/projects/default/runs", authorization=None)
    assert response.status == 429
    documented: Any = doc["paths"]["/api/v3/projects/{projectId}/runs"]["get"]["responses"]["429"]  # type: ignore[index]
    conforms(doc, documented["content"]["application/json; charset=utf-8"]["schema"], response.json())
    assert int(response.header("retry-after") or 0) >= 1
