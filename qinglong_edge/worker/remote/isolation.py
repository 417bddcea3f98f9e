"""What a remote job must not see or change, from the configuration (spec README, "Isolation").

A remote task's author is not the device owner; the job runs as the agent's user. With
isolation (:class:`qinglong_edge.process.spawn.Isolation`, where
:func:`qinglong_edge.process.isolation.probe_isolation` says it works) the paths of
:func:`remote_hidden_paths` are empty for it and those of :func:`remote_readonly_paths`
read-only; without, ``doctor`` lists them as what a remote job can read and change.
Everything the agent reads back is one of them, or belongs to root (docs/worker/remote.md,
"What the agent reads back": nothing a job can write is trusted later).
"""

from __future__ import annotations

import os
import sys

from qinglong_edge.config import EdgeConfig
from qinglong_edge.filecheck import stat_problem

__all__ = ["CGROUP_ROOT", "agent_code_paths", "remote_hidden_paths", "remote_readonly_paths"]

CGROUP_ROOT = "/sys/fs/cgroup"


def _private_directory(path: str) -> bool:
    """A directory of the agent's alone (ours, no group/other bits): safe to hide whole."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat_problem(st, path, directory=True) is None


def _file_or_directory(path: str) -> str:
    directory = os.path.dirname(os.path.normpath(path))
    return directory if directory != "/" and _private_directory(directory) else os.path.normpath(path)


def remote_hidden_paths(config: EdgeConfig) -> tuple[str, ...]:
    """The absolute paths to hide from a remote job, sorted, without duplicates.

    * the worker credential and private key: their directory when it is the agent's
      private directory (README "Remote Worker setup": 0700, the agent's), which also
      survives a rotation of the files by rename, else the files themselves; the
      certificate and trust anchors are public and stay visible where they are elsewhere
      (read-only when the agent's user could write them: :func:`remote_readonly_paths`);
    * the journal (claims, inbox records with lease tokens, receipts with callback
      tokens), the state directory (logs of other runs) and the runtime directory
      (``worker.runtimeDirectory``: the session, the owner record, the cached job
      wrapper program and isolation answer, discard requests);
    * with a Local API: its database (its directory when private: SQLite's ``-journal``
      and ``-wal`` files sit beside it), pepper keyring, Run logs and the Local Runs'
      working directory (``execution.workDirectory``, their ``HOME``);
    * ``/sys/fs/cgroup``: the agent's user may write the ``cgroup.procs`` of its delegated
      subtree, so a job seeing it could move itself out of its own cgroup (out of reach
      of ``cgroup.kill``, its pids cap and its memory limit).

    A job's working directory below a hidden one is kept visible by the wrapper.
    """
    paths: set[str] = {os.path.normpath(config.state_directory), CGROUP_ROOT}
    worker = config.worker
    if worker is not None:
        paths.add(os.path.normpath(worker.journal_directory))
        paths.add(os.path.normpath(worker.runtime_directory))
        paths.add(_file_or_directory(worker.credential_file))
        paths.add(_file_or_directory(worker.private_key_file))
    local = config.local_api
    if local is not None:
        paths.add(_file_or_directory(local.database_file))
        paths.add(os.path.normpath(local.pepper_keyring_directory))
    if config.execution is not None:
        paths.add(os.path.normpath(config.execution.log_directory))
        if config.execution.work_directory:
            paths.add(os.path.normpath(config.execution.work_directory))
    return tuple(sorted(p for p in paths if os.path.isabs(p) and p != "/"))


def _ours_to_change(path: str) -> bool:
    """The agent's user (hence an unisolated job) could change what stands at ``path``:
    it may write it, or the directory that holds its name."""
    try:
        return os.access(path, os.W_OK) or os.access(os.path.dirname(path) or "/", os.W_OK)
    except OSError:
        return False


def agent_code_paths() -> tuple[str, ...]:
    """The agent's own code and the interpreter's directory (what the next ``pull``,
    ``serve`` and job wrapper execute): the ``qinglong_edge`` package directory (or the
    zipapp file), and the directory of ``sys.executable`` (a virtualenv's ``bin``)."""
    archive = getattr(globals().get("__loader__"), "archive", None)
    paths = {archive if isinstance(archive, str) else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    if sys.executable:
        paths.add(os.path.dirname(os.path.abspath(sys.executable)))
    return tuple(sorted(paths))


def remote_readonly_paths(config: EdgeConfig) -> tuple[str, ...]:
    """What the agent reads back that a remote job may see but must not change: each
    path here that exists and that the agent's user could change (else root's file
    permissions already keep a job out) and is not hidden anyway. The isolated job
    gets each bound onto itself read-only.

    * the configuration file (``config.source``);
    * the worker certificate and trust anchors (a job that could swap the anchors could
      make the agent trust its own server, then send it the credential);
    * the agent's code and the interpreter's directory (:func:`agent_code_paths`).
    """
    hidden = remote_hidden_paths(config)
    candidates: set[str] = set(agent_code_paths())
    if config.source:
        candidates.add(os.path.abspath(config.source))
    worker = config.worker
    if worker is not None:
        candidates.add(os.path.normpath(worker.certificate_file))
        candidates.update(os.path.normpath(p) for p in worker.trust_anchor_files)
    found = []
    for path in sorted(candidates):
        if any(path == h or path.startswith(h.rstrip("/") + "/") for h in hidden):
            continue
        if os.path.isabs(path) and path != "/" and os.path.lexists(path) and _ours_to_change(path):
            found.append(path)
    return tuple(found)
