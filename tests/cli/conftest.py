"""Fixtures of the CLI tests: a cluster double per module and a device beside it.

``cluster`` is the module's short-lease double (``shared_remote_cluster`` of tests/conftest.py),
reset for each test; ``env`` is a :class:`~tests.support.remote_env.RemoteEnv` device
provisioned against it. A module whose device or cluster differs defines its own ``env`` or
``cluster`` (pytest takes the module's over these). ``site`` is a Local API site for
``serve`` tests.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from tests.support.cluster_double import ClusterDouble
from tests.support.remote_env import RemoteEnv
from tests.support.serve_site import provision


@pytest.fixture
def cluster(shared_remote_cluster: ClusterDouble) -> ClusterDouble:
    """The module's short-lease cluster double, reset: fresh state, no task queued."""
    shared_remote_cluster.reset()
    return shared_remote_cluster


@pytest.fixture
def env(tmp_path: pathlib.Path, cluster: ClusterDouble) -> RemoteEnv:
    """A device (config, credential, directories under ``tmp_path``) of ``cluster``."""
    return RemoteEnv(tmp_path, cluster)


@pytest.fixture
def site(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A Local API site for ``serve`` (``tmp_path``): ``state/`` (0700) with the section 10
    identities (:func:`tests.support.serve_site.provision`)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    provision(state)
    yield tmp_path
