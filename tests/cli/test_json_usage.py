"""``--json`` promises one JSON line, also when a command or a command group is missing."""

from __future__ import annotations

import pytest

from tests.support.cli import run_cli


@pytest.mark.parametrize("args", [("--json",), ("--json", "admin"), ("admin", "--json")],
                         ids=["no_command", "admin_without_group", "admin_json_after"])
def test_missing_command_with_json_is_one_usage_line(args: tuple[str, ...]) -> None:
    result = run_cli(*args)
    assert result.status == 64
    assert result.json() == {"ok": False, "code": "usage", "message": result.json()["message"], "exitStatus": 64}
    assert "Traceback" not in result.stderr


def test_missing_command_without_json_still_shows_the_help() -> None:
    result = run_cli("admin")
    assert result.status == 64
    assert "GROUP" in result.stdout + result.stderr
