"""`make test-foreign`'s runner (tests/foreign/run.py) still imports and parses its arguments:
it runs outside `make test` (root, qemu-user, debootstrap), so this keeps it from rotting
when the tests/support helpers it drives change."""

from __future__ import annotations

import subprocess
import sys

from tests.support.cli import REPO


def _runner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tests.foreign.run", *args], capture_output=True, text=True,
                          cwd=REPO, check=False, timeout=60)


def test_help_lists_the_architectures() -> None:
    result = _runner("--help")
    assert result.returncode == 0, result.stderr
    assert "arm64, armhf, mipsel" in result.stdout


def test_an_unknown_architecture_is_a_usage_error() -> None:
    result = _runner("--arch", "sparc64")
    assert result.returncode == 2
    assert "unknown architecture(s) ['sparc64']" in result.stderr
