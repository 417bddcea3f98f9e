"""Debian's chromium, promtool and prometheus for the status console and metrics tests.

``.ci/run`` installs them with apt (packages ``chromium`` and ``prometheus``) and sets
``QINGLONG_EDGE_REQUIRE_OBSERVABILITY_TOOLS=1``: there a missing tool fails the test
instead of skipping it, so CI can never pass with the browser or Prometheus checks
skipped. Elsewhere the tests skip and say how to get the tools. Nothing is downloaded:
the browser is Debian's, driven by the ``playwright`` package's bundled driver.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

__all__ = ["CHROMIUM", "CHROMIUM_FLAGS", "REQUIRE_ENV", "require_tool"]

REQUIRE_ENV = "QINGLONG_EDGE_REQUIRE_OBSERVABILITY_TOOLS"
CHROMIUM = "/usr/bin/chromium"
#: Launch flags: headless, no sandbox (root in CI), nothing that phones out.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")
_HOW = {
    "chromium": "apt-get install chromium",
    "promtool": "apt-get install prometheus",
    "prometheus": "apt-get install prometheus",
    "playwright": "make .venv/.installed (requirements-dev.txt pins playwright)",
}


def require_tool(name: str) -> str:
    """The tool's path (``playwright``: its module name), or skip (fail under CI)."""
    if name == "playwright":
        found = "playwright" if importlib.util.find_spec("playwright") is not None else None
    elif name == "chromium":
        found = CHROMIUM if os.access(CHROMIUM, os.X_OK) else None
    else:
        found = shutil.which(name)
    if found is None:
        message = f"{name} is not installed ({_HOW[name]})"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{message}; {REQUIRE_ENV}=1 requires it")
        pytest.skip(message)
    return found
