"""Fixtures of the worker tests that talk to the cluster double (tests/support/cluster_double.py).

``cluster`` is the module's ``shared_cluster`` (tests/conftest.py), reset and with its clock
frozen at :data:`FROZEN_MS` (only ``advance_clock`` moves it); ``worker`` is a registered
:class:`~tests.support.cluster_calls.WorkerCalls` of it. A module that needs another start
defines its own ``cluster`` or ``worker``. ``runtime`` is a worker's runtime directory.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from qinglong_edge.worker.journal.runtime import RuntimeDirectory
from tests.support.cluster_calls import WorkerCalls, registered_worker
from tests.support.cluster_double import ClusterDouble

#: The cluster's frozen wall clock (ms since the epoch) at the start of each test.
FROZEN_MS = 1_700_000_000_000


@pytest.fixture
def cluster(shared_cluster: ClusterDouble) -> ClusterDouble:
    """The module's cluster double, reset, its clock frozen at :data:`FROZEN_MS`."""
    shared_cluster.reset()
    shared_cluster.set_clock(FROZEN_MS)
    return shared_cluster


@pytest.fixture
def worker(cluster: ClusterDouble, tmp_path: pathlib.Path) -> Iterator[WorkerCalls]:
    """A registered worker of ``cluster`` (files under ``tmp_path / "files"``)."""
    with registered_worker(cluster, tmp_path / "files") as calls:
        yield calls


@pytest.fixture
def runtime(tmp_path: pathlib.Path) -> Iterator[RuntimeDirectory]:
    """A runtime directory at ``tmp_path / "run"`` (0700), its fallback under the journal
    root ``tmp_path / "worker"``; closed after the test."""
    base = tmp_path / "run"
    base.mkdir(mode=0o700)
    with RuntimeDirectory.open(str(base), str(tmp_path / "worker")) as opened:
        yield opened
