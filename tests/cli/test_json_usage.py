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


@pytest.mark.parametrize(("args", "named"), [
    (("--confg", "x", "doctor"), "--confg"),       # issue 18: argparse said "invalid choice: 'x'"
    (("--json", "--jsn", "doctor"), "--jsn"),
    (("-x", "doctor"), "-x"),
    (("--config=/x", "--bogus=1", "doctor"), "--bogus"),
    (("doctor", "--confg", "x"), "--confg"),       # after the command argparse names it itself
    (("pull", "--no-spaly"), "--no-spaly"),
])
def test_an_unknown_option_is_named(args: tuple[str, ...], named: str) -> None:
    result = run_cli(*args)
    assert result.status == 64
    text = result.stdout + result.stderr
    assert named in text and "invalid choice" not in text
    if args[:1] == ("--confg",):
        assert "did you mean --config?" in text


def test_unique_prefixes_of_global_options_still_work() -> None:
    result = run_cli("--conf", "/no/such/config.json", "--json", "doctor")
    assert result.status == 78 and result.json()["code"] == "invalid_configuration"
