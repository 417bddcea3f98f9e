"""Fixtures for execution tests: real cgroups where the machine allows them."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from qinglong_edge.contracts.ids import new_uuid4
from qinglong_edge.execution.cgroups import CgroupManager, RunCgroup


@pytest.fixture(scope="session")
def cgroup_manager() -> CgroupManager:
    """The machine's per-Run cgroups; tests needing them skip (with the reason) elsewhere."""
    if os.geteuid() != 0:
        pytest.skip("cgroups need root (CI runs as root)")
    manager = CgroupManager.detect("auto")
    if not manager.available:
        pytest.skip(f"no usable cgroup hierarchy: {manager.reason}")
    return manager


@pytest.fixture
def run_cgroup(cgroup_manager: CgroupManager) -> Iterator[RunCgroup]:
    """A fresh cgroup for one test; killed and removed afterwards."""
    group = cgroup_manager.create(f"test-{new_uuid4()}")
    assert group is not None
    yield group
    group.kill()
    for _ in range(200):
        if group.remove():
            break
        import time

        time.sleep(0.01)


@pytest.fixture
def env(tmp_path: object) -> Iterator[object]:
    """A real Local store (tests/support/execution_env.py)."""
    from tests.support.execution_env import make_env

    root = os.path.join(str(tmp_path), "state")
    os.makedirs(root)
    environment = make_env(root)
    yield environment
    environment.store.close()
