"""``run.log.read``: one bounded byte range of a Local attempt's log (issue 26 item 1).

Sources (facts only): the reference's ``runAttemptLogRead.ts`` (the service, 308aa75),
``localRunAttemptLogRangeReader.ts`` (the Local file adapter) and ADR-0377; the later
reference's ``retired`` state (410) for a log that retention removed.

Two steps, so the store's one connection is never held during file I/O:

1. :func:`find_log_target` (one read transaction): the Run must exist in the route's
   project with ``execution_owner = 'runtime'``, the attempt must belong to it with
   ``executor_type = 'local_process'`` and a known status; else ``not_found`` (404
   ``artifact_not_found``, indistinguishable from a denied request). Then:

   ======================================  ============================================
   attempt                                 state
   ======================================  ============================================
   no ``log_artifact_id``, a tombstone     ``retired`` (410): ``maxTotalLogBytes`` pruned it
   no ``log_artifact_id``, not terminal    ``pending`` (202): not launched yet
   no ``log_artifact_id``, terminal        ``not_found`` (404): it never had a log (cancelled
                                           while queued); never 202, a follower would
                                           poll for ever (our decision; the reference
                                           says 202 for any attempt without an id)
   an id outside ``local-[a-f0-9]{30}``    ``not_found`` (404), as the reference
   a ``local-*`` id                        ``bound``: read the file
   ======================================  ============================================

2. :func:`read_log_range`: the file is opened ``O_NOFOLLOW``; it must be a regular file
   with one link, mode 0600, owned by this process's uid, at most 1 GiB (the
   reference's adapter checks); ``start = min(offset, size)``, exactly ``min(length,
   size - start)`` bytes are read with ``pread`` (a short read: the file shrank), and a
   second ``fstat`` must show the same file, not smaller. ``size`` is the snapshot's
   ``totalBytes``: a log still growing is read again from ``endExclusive``.
   A missing file (``ENOENT``): :class:`LogReader` looks at the attempt again; a
   tombstone written meanwhile (the pruner won the race) is ``retired``; an attempt
   still active (``claimed``/``starting``: the wrapper has not created the file yet) is
   ``pending``; otherwise ``missing`` (503 ``artifact_unavailable``, the reference's
   answer for a bound log that is gone). Any failed check raises
   :class:`LogReadUnavailable` (503 ``artifact_unavailable``).

Truncation: Local logs carry the cap's notice in the file itself
(:data:`~qinglong_edge.process.logs.TRUNCATION_NOTICE`) and no separate fact; the
reference forbids inferring truncation from a size or the text, so every Local read
says ``{"truncated":"unknown"}`` (docs/local.md, "Seeing what runs").
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.log_read import (
    LOCAL_LOG_ARTIFACT_ID,
    UNKNOWN_TRUNCATION,
    available_body,
    pending_body,
    retired_body,
)
from qinglong_edge.errors import ExecutionError, StoreError
from qinglong_edge.filecheck import stat_problem
from qinglong_edge.local.run_logs import attempt_log_path, run_log_paths
from qinglong_edge.local.run_reader import ATTEMPT_STATUSES
from qinglong_edge.local.store import Store, read_transaction

__all__ = [
    "ACTIVE_ATTEMPT_STATUSES",
    "LogReadUnavailable",
    "LogReader",
    "LogTarget",
    "RangeRead",
    "find_log_target",
    "read_log_range",
]

#: Attempts whose log may still appear or grow.
ACTIVE_ATTEMPT_STATUSES: Final = frozenset({"claimed", "starting", "running"})
#: The reference adapter's cap on a log file it will read.
MAX_LOG_FILE_BYTES: Final = 1024 * 1024 * 1024


class LogReadUnavailable(StoreError):
    """The log cannot be proven safe or consistent: 503 ``artifact_unavailable``."""

    code = "artifact_unavailable"
    http_status = 503


@dataclass(frozen=True, slots=True)
class LogTarget:
    """What the store says about one attempt's log.

    Attributes:
        state: ``not_found``, ``pending``, ``retired`` or ``bound``.
        active: the attempt is ``claimed``/``starting``/``running``.
        log_artifact_id: set when ``bound``.
        retired_at_ms, byte_length: the tombstone when ``retired``.
    """

    state: str
    active: bool = False
    log_artifact_id: str | None = None
    retired_at_ms: int = 0
    byte_length: int = 0


_NOT_FOUND: Final = LogTarget("not_found")


def find_log_target(conn: sqlite3.Connection, project_id: str, run_id: str, attempt_id: str) -> LogTarget:
    """Step 1 of the module docstring, in one snapshot.

    Raises:
        sqlite3.Error: the store failed (the caller's :meth:`Store.run` maps it).
    """
    with read_transaction(conn):
        run = conn.execute('SELECT project_id, execution_owner FROM "Runs" WHERE id = ?', (run_id,)).fetchone()
        if run is None or run[0] != project_id or run[1] != "runtime":
            return _NOT_FOUND
        attempt = conn.execute(
            'SELECT run_id, executor_type, status, log_artifact_id FROM "RunAttempts" WHERE id = ?', (attempt_id,)
        ).fetchone()
        if (attempt is None or attempt[0] != run_id or attempt[1] != "local_process"
                or attempt[2] not in ATTEMPT_STATUSES):
            return _NOT_FOUND
        active = attempt[2] in ACTIVE_ATTEMPT_STATUSES
        artifact = attempt[3]
        if artifact is None:
            tombstone = conn.execute(
                'SELECT retired_at_ms, byte_length FROM "QingLongEdgeLogRetirements"'
                " WHERE attempt_id = ? AND run_id = ?",
                (attempt_id, run_id),
            ).fetchone()
            if tombstone is not None:
                return LogTarget("retired", active, None, int(tombstone[0]), int(tombstone[1]))
            return LogTarget("pending", True) if active else _NOT_FOUND
    if not isinstance(artifact, str) or LOCAL_LOG_ARTIFACT_ID.fullmatch(artifact) is None:
        return _NOT_FOUND
    return LogTarget("bound", active, artifact)


@dataclass(frozen=True, slots=True)
class RangeRead:
    """``content`` read at ``start`` of a file of ``total_bytes`` bytes (its snapshot)."""

    content: bytes
    start: int
    total_bytes: int


def read_log_range(path: str, offset: int, length: int) -> RangeRead | None:
    """Step 2 of the module docstring; None when the file does not exist.

    Raises:
        LogReadUnavailable: not a private regular file of ours, a short read, or the
            file was replaced or shrank during the read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LogReadUnavailable(f"the log cannot be opened: {exc.strerror}") from None
    try:
        before = os.fstat(fd)
        _check_private(before)
        start = min(offset, before.st_size)
        want = min(length, before.st_size - start)
        chunks, got = [], 0
        while got < want:
            chunk = os.pread(fd, want - got, start + got)
            if not chunk:
                raise LogReadUnavailable("the log shrank while it was read")
            chunks.append(chunk)
            got += len(chunk)
        after = os.fstat(fd)
        _check_private(after)
        if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino) or after.st_size < before.st_size:
            raise LogReadUnavailable("the log changed while it was read")
        return RangeRead(b"".join(chunks), start, before.st_size)
    except OSError as exc:
        raise LogReadUnavailable(f"the log cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)


def _check_private(info: os.stat_result) -> None:
    if (stat_problem(info, "the log", directory=False, mode=0o600, single_link=True) is not None
            or info.st_size > MAX_LOG_FILE_BYTES):
        raise LogReadUnavailable("the log is not a private regular file of this agent")


class LogReader:
    """``run.log.read`` over the store and the log directory.

    Args:
        store: the open Local store.
        log_directory: ``execution.logDirectory`` (None: no Local execution; a bound log
            is then ``missing``).
        timeout_s: the wait for one store operation, seconds.
    """

    def __init__(self, store: Store, log_directory: str | None, *, timeout_s: float | None = 30.0) -> None:
        self._store = store
        self._directory = log_directory
        self._timeout = timeout_s

    def _path(self, run_id: str, attempt_id: str, artifact: str | None) -> str | None:
        """The attempt's log: the file that exists (its name, else its pre-issue-16
        name), else its name (so a symlink planted there fails ``O_NOFOLLOW``: 503)."""
        if self._directory is None:
            return None
        found = attempt_log_path(self._directory, run_id, attempt_id, artifact)
        if found is not None:
            return found
        try:
            return run_log_paths(self._directory, run_id, attempt_id)[0]
        except ExecutionError:
            return None

    def _target(self, project_id: str, run_id: str, attempt_id: str) -> LogTarget:
        return self._store.run(lambda c: find_log_target(c, project_id, run_id, attempt_id), timeout_s=self._timeout)

    def read(self, project_id: str, run_id: str, attempt_id: str, *, offset: int, length: int,
             path_hook: Callable[[str], None] | None = None) -> tuple[int, dict[str, Any]]:
        """``(HTTP status, body)``: 200, 202, 404, 410 or 503 (module docstring).

        ``path_hook`` (tests): called with the log path between the two steps.

        Raises:
            StoreError: the store failed (the route answers 503 ``artifact_unavailable``).
        """
        target = self._target(project_id, run_id, attempt_id)
        for _ in range(2):
            if target.state == "not_found":
                return 404, {"code": "artifact_not_found"}
            if target.state == "pending":
                return 202, pending_body(project_id, run_id, attempt_id)
            if target.state == "retired":
                return 410, retired_body(project_id, run_id, attempt_id, retired_at_ms=target.retired_at_ms,
                                         byte_length=target.byte_length, truncation=dict(UNKNOWN_TRUNCATION))
            path = self._path(run_id, attempt_id, target.log_artifact_id)
            if path is not None:
                if path_hook is not None:
                    path_hook(path)
                got = read_log_range(path, offset, length)
                if got is not None:
                    try:
                        return 200, available_body(
                            project_id, run_id, attempt_id, offset=offset, length=length, content=got.content,
                            total_bytes=got.total_bytes, truncation=dict(UNKNOWN_TRUNCATION))
                    except ContractError:
                        raise LogReadUnavailable("the range read broke an invariant") from None
            # Missing: the pruner may have removed it meanwhile, or the launch has not
            # created it yet; look at the attempt once more.
            again = self._target(project_id, run_id, attempt_id)
            if again.state == "bound":
                if again.active:
                    return 202, pending_body(project_id, run_id, attempt_id)
                return 503, {"code": "artifact_unavailable"}
            target = again
        return 503, {"code": "artifact_unavailable"}

