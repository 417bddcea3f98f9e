"""What a remote job must not see, from the configuration (spec README, "Isolation").

A remote task's author is not the device owner; the job runs as the agent's user. With
isolation (:class:`qinglong_edge.process.spawn.Isolation`, where
:func:`qinglong_edge.process.isolation.probe_isolation` says it works) these paths are
hidden from it; without, ``doctor`` lists them as what a remote job can read.
"""

from __future__ import annotations

import os
import stat

from qinglong_edge.config import EdgeConfig

__all__ = ["CGROUP_ROOT", "remote_hidden_paths"]

CGROUP_ROOT = "/sys/fs/cgroup"


def _private_directory(path: str) -> bool:
    """A directory of the agent's alone (ours, no group/other bits): safe to hide whole."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def _file_or_directory(path: str) -> str:
    directory = os.path.dirname(os.path.normpath(path))
    return directory if directory != "/" and _private_directory(directory) else os.path.normpath(path)


def remote_hidden_paths(config: EdgeConfig) -> tuple[str, ...]:
    """The absolute paths to hide from a remote job, sorted, without duplicates.

    * the worker credential and private key: their directory when it is the agent's
      private directory (README "Remote Worker setup": 0700, the agent's), which also
      survives a rotation of the files by rename, else the files themselves; the
      certificate and trust anchors are public and stay visible where they are elsewhere;
    * the journal (claims, inbox records with lease tokens, receipts with callback
      tokens) and the state directory (logs of other runs);
    * with a Local API: its database (its directory when private: SQLite's ``-journal``
      and ``-wal`` files sit beside it), pepper keyring and Run logs;
    * ``/sys/fs/cgroup``: the agent's user may write the ``cgroup.procs`` of its delegated
      subtree, so a job seeing it could move itself out of its own cgroup (out of reach
      of ``cgroup.kill`` and its pids cap).

    A job's working directory below a hidden one is kept visible by the wrapper.
    """
    paths: set[str] = {os.path.normpath(config.state_directory), CGROUP_ROOT}
    worker = config.worker
    if worker is not None:
        paths.add(os.path.normpath(worker.journal_directory))
        paths.add(_file_or_directory(worker.credential_file))
        paths.add(_file_or_directory(worker.private_key_file))
    local = config.local_api
    if local is not None:
        paths.add(_file_or_directory(local.database_file))
        paths.add(os.path.normpath(local.pepper_keyring_directory))
    if config.execution is not None:
        paths.add(os.path.normpath(config.execution.log_directory))
    return tuple(sorted(p for p in paths if os.path.isabs(p) and p != "/"))
