"""Shared pytest fixtures. Fixtures that start servers live in tests/support/."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
CORPORA_ENV = "QINGLONG_EDGE_CORPORA"


def corpora_dir() -> pathlib.Path:
    """The external corpora: $QINGLONG_EDGE_CORPORA, else ../shared/corpora next to the clone."""
    env = os.environ.get(CORPORA_ENV)
    candidates = [pathlib.Path(env)] if env else []
    candidates += [REPO.parent / "shared" / "corpora", REPO.parent.parent / "shared" / "corpora"]
    for candidate in candidates:
        if (candidate / "README.md").is_file():
            return candidate
    pytest.fail(
        f"external corpora not found (set {CORPORA_ENV} or place ../shared/corpora beside the clone)"
    )


@pytest.fixture(scope="session")
def corpora() -> pathlib.Path:
    return corpora_dir()


@pytest.fixture
def private_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """A 0700 directory for state that must not be group/other accessible."""
    path = tmp_path / "private"
    path.mkdir(mode=0o700)
    path.chmod(0o700)
    return path


def python_cli() -> list[str]:
    """argv prefix that runs the real CLI in a child interpreter."""
    return [sys.executable, "-m", "qinglong_edge"]
