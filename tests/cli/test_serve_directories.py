"""``serve`` and the directories of the execution controller: the Run log directory and
the Runs' work directory (review of issues 16/17).

* a directory ``serve`` cannot create at start is ONE line and a storage exit status:
  74 ``storage_unavailable`` when its file system is full or failing (ENOSPC, EDQUOT,
  EIO, EROFS: it may heal), 73 ``unsafe_storage`` for anything else (EACCES, a file in
  the way: the operator must fix it), never 70 "internal error";

Real child processes, real file systems (a full tmpfs), real modes.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile
from typing import Any

import pytest

from tests.support.cli import REPO, run_cli, unprivileged_python
from tests.support.mounts import tmpfs
from tests.support.serve_site import free_port, one_line, provision, start


def _config(site: pathlib.Path, execution: dict[str, Any]) -> pathlib.Path:
    document = {"schema": "qinglong/edge-agent@v1", "stateDirectory": str(site / "state"),
                "localApi": {"listener": {"host": "127.0.0.1", "port": free_port()}, "busyTimeoutMs": 1000},
                "execution": execution}
    path = site / "config.json"
    path.write_text(json.dumps(document))
    return path


def test_a_log_directory_on_a_full_file_system_is_exit_74_in_one_line(site: pathlib.Path) -> None:
    with tmpfs(site / "full", "64k", inodes=1) as full:  # no inode left: mkdir gets ENOSPC
        logs = full / "logs"
        result = run_cli("--config", str(_config(site, {"logDirectory": str(logs)})), "serve", timeout=60)
    line = one_line(result.stderr)
    assert result.status == 74, line
    assert "storage_unavailable" in line and str(logs) in line and "ENOSPC" in line, line
    assert "execution.logDirectory" in line, line


def test_a_file_in_the_way_of_the_log_directory_is_exit_73_in_one_line(site: pathlib.Path) -> None:
    blocker = site / "not-a-directory"
    blocker.write_text("")
    logs = blocker / "logs"
    result = run_cli("--config", str(_config(site, {"logDirectory": str(logs)})), "serve", timeout=60)
    line = one_line(result.stderr)
    assert result.status == 73, line
    assert "unsafe_storage" in line and str(logs) in line and "ENOTDIR" in line, line


def test_a_work_directory_that_cannot_be_made_is_exit_73_in_one_line(site: pathlib.Path) -> None:
    logs = site / "logs"
    work = site / "state" / "work"  # the default work directory: a regular file in its way
    work.write_text("")
    result = run_cli("--config", str(_config(site, {"logDirectory": str(logs)})), "serve", timeout=60)
    line = one_line(result.stderr)
    assert result.status == 73, line
    assert "unsafe_storage" in line and str(work) in line and "EEXIST" in line, line


def test_a_log_directory_the_service_user_may_not_create_is_exit_73(tmp_path: pathlib.Path) -> None:
    """EACCES needs a real unprivileged user (root passes every mode check): uid 65534
    owns its state and runs ``serve``; the log directory's parent is root's, mode 0755."""
    if os.geteuid() != 0:
        pytest.skip("running serve as another user needs root")
    python = unprivileged_python()
    base = pathlib.Path(tempfile.mkdtemp(prefix="qle-eacces-", dir="/tmp"))
    try:
        base.chmod(0o755)
        state = base / "state"
        state.mkdir(mode=0o700)
        provision(state)
        for root, dirs, files in os.walk(state):
            for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                os.chown(name, 65534, 65534)
        parent = base / "root-owned"
        parent.mkdir(mode=0o755)
        logs = parent / "logs"
        config = _config(base, {"logDirectory": str(logs)})
        config.chmod(0o644)
        proc = subprocess.run([python, "-m", "qinglong_edge", "--config", str(config), "serve"],
                              user=65534, group=65534, extra_groups=[], cwd="/", capture_output=True, text=True,
                              env={"PYTHONPATH": REPO, "PATH": "/usr/bin:/bin"}, timeout=60, check=False)
        line = one_line(proc.stderr)
        assert proc.returncode == 73, line
        assert "unsafe_storage" in line and str(logs) in line and "EACCES" in line, line
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)





def _serve_and_stop(config: pathlib.Path) -> None:
    proc = start(config)
    proc.send_signal(15)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr


def test_the_work_directory_is_not_derived_from_the_log_directory(site: pathlib.Path) -> None:
    """The review's case: the log directory's parent is not the agent's (``/tmp``); the
    work directory beside it was ``/work``. By default it is ``<stateDirectory>/work``."""
    logs = site / "ram"  # its parent is the site, as /tmp's is /
    _serve_and_stop(_config(site, {"logDirectory": str(logs)}))
    assert logs.is_dir()
    work = site / "state" / "work"
    assert work.is_dir() and (work.stat().st_mode & 0o777) == 0o700
    assert not (site / "work").exists()


def test_an_explicit_work_directory_is_made_0700_and_used(site: pathlib.Path) -> None:
    work = site / "jobs" / "work"
    _serve_and_stop(_config(site, {"logDirectory": str(site / "logs"), "workDirectory": str(work)}))
    assert work.is_dir() and (work.stat().st_mode & 0o777) == 0o700
    assert not (site / "work").exists() and not (site / "state" / "work").exists()


def test_a_work_directory_on_a_full_file_system_is_exit_74_naming_its_key(site: pathlib.Path) -> None:
    with tmpfs(site / "full", "64k", inodes=1) as full:
        work = full / "work"
        config = _config(site, {"logDirectory": str(site / "logs"), "workDirectory": str(work)})
        result = run_cli("--config", str(config), "serve", timeout=60)
    line = one_line(result.stderr)
    assert result.status == 74, line
    assert "storage_unavailable" in line and str(work) in line and "execution.workDirectory" in line, line
