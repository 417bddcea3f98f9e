"""Run the real CLI in a child process and capture what a user would see."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Result:
    status: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        assert len(lines) == 1, self.stdout
        return json.loads(lines[0])


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
            input_bytes: bytes | None = None) -> Result:
    """Run ``python -m qinglong_edge ARGS`` with the repo on the path."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.pop("QINGLONG_EDGE_CONFIG", None)
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-m", "qinglong_edge", *args],
        capture_output=True,
        env=full_env,
        timeout=timeout,
        input=input_bytes,
        check=False,
    )
    return Result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def unprivileged_python() -> str:
    """An interpreter that uid 65534 can execute (pyenv under /root is not).

    Returns the path, or calls ``pytest.skip`` with the reason.
    """
    import pytest

    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if not os.path.exists(candidate):
            continue
        try:
            proc = subprocess.run(
                [candidate, "-c", "import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)"],
                user=65534, group=65534, extra_groups=[], capture_output=True, check=False, cwd="/",
            )
        except PermissionError:
            continue
        if proc.returncode == 0:
            return candidate
    pytest.skip("no Python >= 3.11 executable by an unprivileged user")
    raise AssertionError("unreachable")
