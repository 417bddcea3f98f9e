"""Fixtures of the CLI tests: a cluster double per module and a device beside it.

``cluster`` is the module's short-lease double (``shared_remote_cluster`` of tests/conftest.py),
reset for each test; ``env`` is a :class:`~tests.support.remote_env.RemoteEnv` device
provisioned against it. A module whose device or cluster differs defines its own ``env`` or
``cluster`` (pytest takes the module's over these). ``site`` is a Local API site for
``serve`` tests, ``worker_config`` a config whose worker's cluster nobody runs.
"""

from __future__ import annotations

import json
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


@pytest.fixture
def worker_config(tmp_path: pathlib.Path) -> pathlib.Path:
    """A config with a worker of a cluster nobody runs (files that do not exist): for the
    commands that only read the journal under ``tmp_path / "state"``."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "schema": "qinglong/edge-agent@v1",
        "stateDirectory": str(tmp_path / "state"),
        "worker": {"origin": "https://cluster.example:7443", "workerId": "edge-1",
                   "credentialFile": "/etc/qe/worker.credential", "certificateFile": "/etc/qe/worker.crt",
                   "privateKeyFile": "/etc/qe/worker.key", "trustAnchorFiles": ["/etc/qe/ca.crt"]},
    }))
    return path
