"""tests/support/local_site.alive() on a process that exits while it reads /proc/<pid>/stat:
the read fails with ESRCH (ProcessLookupError), not ENOENT; alive() must say "gone" then
(seen as a flaky `make test` failure in test_ipk_unpack's cancel check)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.local_site import alive


def test_reading_stat_of_a_process_reaped_after_open_is_esrch() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    with open(f"/proc/{child.pid}/stat") as handle:
        child.wait()
        with pytest.raises(ProcessLookupError):
            handle.read()
    assert not alive(child.pid)
