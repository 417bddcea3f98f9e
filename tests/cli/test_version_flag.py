"""``--version`` is the ``version`` command (issue 26 item 6; it used to exit 64)."""

from __future__ import annotations

import json

import pytest

from qinglong_edge import __version__
from qinglong_edge.cli import main


def test_version_flag_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"qinglong-edge {__version__} (Python ")


@pytest.mark.parametrize("argv", [["--json", "--version"], ["--version", "--json"]])
def test_version_flag_with_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["ok"] is True and payload["version"] == __version__


def test_version_flag_after_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", "/nonexistent.json", "--version"]) == 0
    assert __version__ in capsys.readouterr().out


def test_an_unknown_flag_is_still_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--versions"]) == 64
    assert "unknown option --versions" in capsys.readouterr().err
