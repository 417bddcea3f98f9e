"""Local Run log files: their names, a bounded read, their usage and their removal.

Issue 16 item 3. Layout, flat in ``execution.logDirectory`` (one file per attempt)::

    <logDirectory>/<runId>_<attemptId>.log    the attempt's output (0600, at most maxLogBytes)
    <logDirectory>/<runId>_<attemptId>.fifo   its pipe while it ran, before the job wrapper
                                              wrote logs itself (left by an earlier release)

Run and attempt ids follow the API id grammar ``[A-Za-z0-9][A-Za-z0-9._:-]{0,127}``
(:data:`~qinglong_edge.contracts.ids.API_ID`; ours are UUIDv4): no ``/``, no ``_``,
never a leading ``.``. So a name is one path component, never hidden, never ``..``, and
splits back into its two ids at its only ``_``. A name longer than ``NAME_MAX`` (255
bytes: two ids of more than ~120 characters) is refused with ``log_unavailable``.

Before issue 16 a log was ``<logArtifactId>.log`` (``local-`` + 30 hex, the attempt's
``log_artifact_id``): :func:`attempt_log_path` still finds such a file and
:func:`remove_attempt_logs` removes it, so an upgraded device prunes its old logs too.

Invariant the pruning relies on (:mod:`qinglong_edge.local.retention`): an attempt's
``log_artifact_id`` is committed (the launch claim) *before* its log file or FIFO is
created, and cleared (log pruning) or its row deleted (Run pruning) *before* the files
are removed. So a file whose attempt row is missing or has no ``log_artifact_id`` is an
orphan of a crash between the two and may be removed.

Sizes are the bytes allocated on disk (``st_blocks`` x 512), what fills the flash: a
short log still takes one block (4 KiB on ext4 and tmpfs).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from dataclasses import dataclass

from qinglong_edge.contracts.ids import API_ID
from qinglong_edge.errors import ExecutionError

__all__ = [
    "LEGACY_LOG_NAME",
    "LogFile",
    "LogScan",
    "attempt_log_path",
    "log_name",
    "parse_log_name",
    "read_log",
    "remove_attempt_logs",
    "run_log_paths",
    "scan_logs",
]

_NAME_MAX = 255
_NAME = re.compile(rf"({API_ID.pattern})_({API_ID.pattern})\.(log|fifo)")
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
#: The names :func:`scan_logs` counts and the sweep may remove: ids this agent makes
#: (task.start's UUIDs), so an operator's ``my_notes.log`` in a shared directory is
#: never taken for a Run's log.
_SCANNED = re.compile(rf"{_UUID}_{_UUID}\.(?:log|fifo)")
#: File names of logs written before issue 16 (``<logArtifactId>.log``).
LEGACY_LOG_NAME = re.compile(r"(local-[0-9a-f]{30})\.(log|fifo)")


def log_name(run_id: str, attempt_id: str, suffix: str = ".log") -> str:
    """``<runId>_<attemptId><suffix>`` (``suffix`` ``.log`` or ``.fifo``).

    Raises:
        ExecutionError: ``log_unavailable`` for an id outside the grammar or a name
            longer than 255 bytes (never a path with ``/`` or ``..``).
    """
    if suffix not in (".log", ".fifo"):
        raise ValueError("suffix must be .log or .fifo")
    for value, what in ((run_id, "run id"), (attempt_id, "attempt id")):
        if not isinstance(value, str) or API_ID.fullmatch(value) is None:
            raise ExecutionError(f"the {what} is not a safe log file name part", code="log_unavailable")
    name = f"{run_id}_{attempt_id}{suffix}"
    if len(name.encode("ascii")) > _NAME_MAX:
        raise ExecutionError("the run and attempt ids make a log file name over 255 bytes", code="log_unavailable")
    return name


def run_log_paths(log_directory: str, run_id: str, attempt_id: str) -> tuple[str, str]:
    """``(log path, fifo path)`` of one attempt (module docstring).

    Raises:
        ExecutionError: ``log_unavailable`` (see :func:`log_name`).
    """
    return (os.path.join(log_directory, log_name(run_id, attempt_id, ".log")),
            os.path.join(log_directory, log_name(run_id, attempt_id, ".fifo")))


def parse_log_name(name: str) -> tuple[str, str, str] | None:
    """``(run id, attempt id, "log" | "fifo")`` of a name :func:`log_name` makes, else None."""
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    return match.group(1), match.group(2), match.group(3)


def attempt_log_path(log_directory: str, run_id: str, attempt_id: str, log_artifact_id: str | None) -> str | None:
    """The existing log file of one attempt (its name, else its pre-issue-16 name), or None."""
    candidates = []
    with contextlib.suppress(ExecutionError):
        candidates.append(run_log_paths(log_directory, run_id, attempt_id)[0])
    if isinstance(log_artifact_id, str) and LEGACY_LOG_NAME.fullmatch(log_artifact_id + ".log"):
        candidates.append(os.path.join(log_directory, log_artifact_id + ".log"))
    for path in candidates:
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(path).st_mode):
                return path
    return None


def read_log(path: str, max_bytes: int, *, tail: bool = False) -> tuple[bytes, int]:
    """At most ``max_bytes`` of a log file (its start, or its end with ``tail``).

    Opened ``O_NOFOLLOW``; it must be a regular file.

    Returns:
        ``(data, size)``: the bytes read and the file's size in bytes.

    Raises:
        ExecutionError: ``log_unavailable`` (missing, not a regular file, unreadable).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ExecutionError(f"{path}: {exc.strerror}", code="log_unavailable") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ExecutionError(f"{path}: not a regular file", code="log_unavailable")
        size = info.st_size
        if tail and size > max_bytes:
            os.lseek(fd, size - max_bytes, os.SEEK_SET)
        chunks, left = [], max_bytes
        while left > 0:
            data = os.read(fd, min(left, 1024 * 1024))
            if not data:
                break
            chunks.append(data)
            left -= len(data)
        return b"".join(chunks), size
    except OSError as exc:
        raise ExecutionError(f"{path}: {exc.strerror}", code="log_unavailable") from None
    finally:
        os.close(fd)


def _unlink(path: str) -> int:
    """Remove ``path`` if it is ours to remove (a file, not a directory); bytes freed."""
    try:
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):
            return 0
        os.unlink(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return 0
        raise
    return info.st_blocks * 512 if stat.S_ISREG(info.st_mode) else 0


def remove_attempt_logs(log_directory: str, run_id: str, attempt_id: str, log_artifact_id: str | None) -> int:
    """Remove an attempt's log and FIFO (and its pre-issue-16 files); bytes freed.

    Missing files are fine (idempotent: a pruning that crashed is simply repeated).

    Raises:
        OSError: a file exists and cannot be removed (permissions, I/O error).
    """
    freed = 0
    with contextlib.suppress(ExecutionError):
        for path in run_log_paths(log_directory, run_id, attempt_id):
            freed += _unlink(path)
    if isinstance(log_artifact_id, str) and LEGACY_LOG_NAME.fullmatch(log_artifact_id + ".log"):
        for suffix in (".log", ".fifo"):
            freed += _unlink(os.path.join(log_directory, log_artifact_id + suffix))
    return freed


@dataclass(frozen=True, slots=True)
class LogFile:
    """One file of the log directory that is ours.

    Attributes:
        name: the file name.
        run_id, attempt_id: from the name; both ``None`` for a pre-issue-16 name.
        legacy_artifact_id: the ``log_artifact_id`` a pre-issue-16 name carries, else None.
        fifo: a FIFO (``.fifo``), not a log.
        bytes: allocated bytes (``st_blocks`` x 512; 0 for a FIFO).
        mtime_ns: last modification (oldest logs are pruned first).
        size: the file's length in bytes (``st_size``; a pruned log's tombstone keeps it).
    """

    name: str
    run_id: str | None
    attempt_id: str | None
    legacy_artifact_id: str | None
    fifo: bool
    bytes: int
    mtime_ns: int
    size: int = 0


@dataclass(frozen=True, slots=True)
class LogScan:
    """Every file of ours in the log directory, and their total allocated bytes."""

    files: tuple[LogFile, ...]
    total_bytes: int

    @property
    def logs(self) -> int:
        return sum(1 for f in self.files if not f.fifo)


def scan_logs(log_directory: str) -> LogScan:
    """List and ``lstat`` the log directory: one ``getdents`` pass plus one ``lstat`` per file.

    Only names this agent makes are listed: ``<uuid>_<uuid>.log|.fifo`` and the
    pre-issue-16 ``local-<30 hex>.log|.fifo``; anything else (an operator's file, a
    directory, a Run id that is not a UUID) is ignored, never counted and never swept (a
    Run's own files still go with it). A missing directory is an empty scan.

    Raises:
        OSError: the directory cannot be read.
    """
    files = []
    try:
        entries = os.scandir(log_directory)
    except FileNotFoundError:
        return LogScan((), 0)
    with entries:
        for entry in entries:
            parsed = parse_log_name(entry.name) if _SCANNED.fullmatch(entry.name) else None
            legacy = LEGACY_LOG_NAME.fullmatch(entry.name) if parsed is None else None
            if parsed is None and legacy is None:
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed meanwhile
            fifo = stat.S_ISFIFO(info.st_mode)
            if not (fifo or stat.S_ISREG(info.st_mode)):
                continue
            files.append(LogFile(
                entry.name,
                parsed[0] if parsed else None,
                parsed[1] if parsed else None,
                legacy.group(1) if legacy else None,
                fifo,
                0 if fifo else info.st_blocks * 512,
                info.st_mtime_ns,
                0 if fifo else info.st_size,
            ))
    return LogScan(tuple(files), sum(f.bytes for f in files))
