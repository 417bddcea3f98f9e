"""worker/remote/job_files.py: removing a remote run's files (real files, a real unprivileged user)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
NOBODY = 65534


@pytest.fixture
def nobody_dir() -> Iterator[pathlib.Path]:
    """A directory owned by the unprivileged ``nobody`` (as the shipped agent's user owns
    its log directory); root's tmp_path is 0700, so this one lives in /tmp."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    base = pathlib.Path(tempfile.mkdtemp(prefix="qinglong-remote-files-", dir="/tmp"))
    os.chown(base, NOBODY, NOBODY)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _as_nobody(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in the system interpreter (the venv's lives under root's 0700 home) as nobody."""
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK):
        pytest.skip("no /usr/bin/python3 for the unprivileged user")
    return subprocess.run([python, "-I", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n{code}"],
                          user=NOBODY, group=NOBODY, capture_output=True, text=True, timeout=60, check=False)


def test_a_scratch_directory_with_read_only_and_closed_subdirectories_is_removed(nobody_dir: pathlib.Path) -> None:
    """Regression: a job that leaves ``chmod 555`` (a Go module cache) or ``chmod 0``
    directories in its scratch working directory left the whole tree behind after
    ``completion_acknowledged`` for an agent that is not root (unlink needs the write bit,
    the scan the read bit). Each directory of the tree (never a symlink's target) is now
    made 0700 for its owner first."""
    outside = nobody_dir / "outside"
    script = f"""
import os, pathlib
from qinglong_edge.worker.remote.job_files import JobFiles, remove_job_files
base = pathlib.Path({str(nobody_dir)!r})
work = base / "work"
(work / "cache" / "mod").mkdir(parents=True)
(work / "cache" / "mod" / "file").write_text("x")
(work / "closed").mkdir()
(work / "closed" / "secret").write_text("y")
outside = pathlib.Path({str(outside)!r})
outside.mkdir()
(outside / "keep").write_text("z")
os.chmod(outside, 0o500)
os.symlink(outside, work / "link")
os.chmod(work / "cache" / "mod", 0o555)
os.chmod(work / "cache", 0o555)
os.chmod(work / "closed", 0)
os.chmod(work, 0o500)
missing = str(base / "none")
removed = remove_job_files(JobFiles("wlog-x", missing + "/l", missing + "/f", missing + "/r", str(work)))
print(removed, work.exists(), oct(outside.stat().st_mode & 0o777))
"""
    done = _as_nobody(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [f"['{nobody_dir / 'work'}']", "False", "0o500"], done.stdout
    assert (outside / "keep").read_text() == "z"  # a symlink in the tree is removed, its target untouched
