"""Fixtures for execution tests: a real Local store (cgroup fixtures: tests/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture
def env(tmp_path: object) -> Iterator[object]:
    """A real Local store (tests/support/execution_env.py)."""
    from tests.support.execution_env import make_env

    root = os.path.join(str(tmp_path), "state")
    os.makedirs(root)
    environment = make_env(root)
    yield environment
    environment.store.close()
