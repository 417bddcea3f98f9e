"""`--help` and `version` must not pay for ssl/sqlite3/http/socket/subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.cli import REPO

HEAVY = ("ssl", "sqlite3", "http", "socket", "subprocess", "_ssl", "_sqlite3")

PROBE = """
import json, sys
from qinglong_edge.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exc:
    status = exc.code
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
sys.stderr.write("\\nHEAVY=" + json.dumps(heavy) + "\\n")
sys.exit(status)
"""


@pytest.mark.parametrize("argv", [["--help"], ["version"], ["version", "--json"], ["--version"], ["doctor", "--help"]])
def test_light_commands_import_no_heavy_module(argv: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-I", "-c", PROBE.format(heavy=set(HEAVY)), *argv],
        capture_output=True,
        cwd=REPO,
        check=False,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("HEAVY=")][-1]
    assert json.loads(line[len("HEAVY="):]) == []


def test_probe_can_see_a_heavy_import() -> None:
    """The probe itself must be able to fail: a command that loads config+doctor imports ssl."""
    proc = subprocess.run(
        [sys.executable, "-I", "-c", "import ssl\n" + PROBE.format(heavy=set(HEAVY)), "version"],
        capture_output=True, cwd=REPO, check=False, text=True,
    )
    assert '"ssl"' in proc.stderr


def test_a_named_command_builds_only_its_own_parser() -> None:
    """`pull` under cron must not pay for building `admin`'s dozens of sub-parsers."""
    proc = subprocess.run(
        [sys.executable, "-I", "-c",
         "import sys; from qinglong_edge.cli import build_parser\n"
         "build_parser(['--config', '/x', 'version'])\n"
         "print(sorted(m for m in sys.modules if m.startswith('qinglong_edge.commands.')))"],
        capture_output=True, cwd=REPO, check=True, text=True,
    )
    assert proc.stdout.strip() == "['qinglong_edge.commands._output', 'qinglong_edge.commands.version']"
