"""docs/openapi.json describes exactly the routes the server resolves."""

from __future__ import annotations

import json
import pathlib
import re

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
        template = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: "{" + {"project": "projectId", "run": "runId", "task": "taskId"}[m.group(1)] + "}", pattern.pattern)
        table.add((method, template, operation))
    assert documented == table


def test_every_operation_documents_admission_errors() -> None:
    doc = load()
    for item in doc["paths"].values():  # type: ignore[attr-defined]
        for operation in item.values():
            responses = operation["responses"]
            for status in ("400", "401", "403", "404", "503"):
                assert status in responses, (operation["operationId"], status)
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
