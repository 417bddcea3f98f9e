"""Fixtures of the ingress transport tests.

``no_leaks`` records every :class:`~qinglong_edge.errors.TransportError` and log line of a
test and fails it if a written secret or key body shows in any
(:func:`tests.support.transport_env.leak_guard`); a module that wants it on every test says
``pytestmark = pytest.mark.usefixtures("no_leaks")``. ``files`` is a worker's credential,
key, certificate and trust anchor under ``tmp_path``.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from tests.support.transport_env import LeakGuard, WorkerFiles, leak_guard


@pytest.fixture
def no_leaks(monkeypatch: pytest.MonkeyPatch) -> Iterator[LeakGuard]:
    """The test under a :class:`LeakGuard`, checked after it."""
    with leak_guard(monkeypatch) as guard:
        yield guard


@pytest.fixture
def files(tmp_path: pathlib.Path) -> WorkerFiles:
    return WorkerFiles(tmp_path)
