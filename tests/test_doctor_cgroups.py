"""doctor's ``cgroups`` check on a device without a writable cgroup (the shipped OpenWrt cron
pull): it says whether the job wrapper can still end processes that leave a Run's group
(a child subreaper needs ``_ctypes``, README "Troubleshooting"). Run as ``nobody`` in the
system interpreter, so no cgroup hierarchy is writable, as on such a device."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.cli import REPO

NOBODY = 65534
PROBE = """
import sys
sys.path.insert(0, {repo!r})
if {block!r}:
    sys.modules["_ctypes"] = None  # python3 without python3-ctypes
from qinglong_edge.doctor import check_cgroups
check = check_cgroups()
print(check.ok, check.required)
print(check.detail)
print(check.remedy)
"""


def _doctor_cgroups(block_ctypes: bool) -> list[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root to act as the unprivileged user")
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK):
        pytest.skip("no /usr/bin/python3 for the unprivileged user")
    result = subprocess.run([python, "-I", "-c", PROBE.format(repo=str(REPO), block=block_ctypes)],
                            user=NOBODY, group=NOBODY, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_without_a_cgroup_it_says_the_wrapper_still_ends_escapees() -> None:
    ok, detail, remedy = _doctor_cgroups(block_ctypes=False)
    assert ok == "False False"  # a warning, not a failure
    assert "no writable cgroup hierarchy" in detail and "no maxRunPids cap" in detail
    assert "still ended by the job wrapper (a child subreaper)" in detail
    assert "python3-ctypes" not in remedy


def test_without_a_cgroup_and_without_ctypes_it_says_escapees_outlive_a_stop() -> None:
    ok, detail, remedy = _doctor_cgroups(block_ctypes=True)
    assert ok == "False False"
    assert "outlive the Run's stop" in detail and "python3-ctypes" in detail
    assert "install python3-ctypes" in remedy
