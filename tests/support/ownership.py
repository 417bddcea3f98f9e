"""Files of another user, for the tests of the ownership rules (root only)."""

from __future__ import annotations

import os
import pathlib

import pytest

#: nobody's uid and gid: the "another user" of these tests.
NOBODY = 65534


def foreign_directory(path: pathlib.Path) -> pathlib.Path:
    """``path`` made (0700) and given to nobody; the test is skipped unless it runs as root
    (only root may chown to another user)."""
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    path.mkdir(mode=0o700)
    os.chown(path, NOBODY, NOBODY)
    return path
