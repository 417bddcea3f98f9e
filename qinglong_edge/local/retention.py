"""Storage caps of the Local store and the Run logs: pruning in bounded steps (issue 16).

Spec README, "Decisions for storage on flash": every store is bounded by a configured
cap; pruning never touches a Run that is not terminal. The caps (``config.py``):

=================================  ==========================================================
``localApi.auditMaximumEntries``   security audit rows kept; the oldest (first inserted) go
``localApi.auditRetentionMs``      audit rows older than this go
``localApi.runMaximumEntries``     terminal Runs kept; the oldest (first created) go, with
                                   their attempts, events, step runs and log files
``localApi.runRetentionMs``        terminal Runs that ended longer ago than this go
``localApi.databaseMaximumBytes``  used bytes of the database (pages in use x page size):
                                   beyond it the oldest audit rows or terminal Runs go,
                                   whichever is older, then free pages are given back
``execution.maxTotalLogBytes``     bytes of all Run logs: beyond it the logs of the oldest
                                   terminal Runs go (least recently written first); the
                                   Runs stay, their attempt's ``log_artifact_id`` is
                                   cleared (``logAvailable`` false)
=================================  ==========================================================

"Terminal" here is execution control's set (``succeeded``, ``failed``, ``cancelled``,
``timed_out`` and ``lost``, local-api.md 8.1): nothing on this device moves a ``lost``
Run again, and without it every crash would leave Runs no cap could remove. A Run that
another Run names as ``parent_run_id`` or ``retry_of_run_id`` (nothing here writes those
columns yet) is kept while that Run exists.

Bounded steps: :meth:`Pruner.step` does at most one write transaction (at most
:data:`RUN_BATCH` Runs, :data:`AUDIT_BATCH` audit rows, :data:`LOG_BATCH` logs or
:data:`VACUUM_PAGES` pages) after one short read of the store's usage, so the store's
queue is never held for long and the operations of the API and the controller run in
between. :meth:`Pruner.run` repeats steps until every cap holds; ``serve`` calls it at
start and every :data:`MAINTENANCE_INTERVAL_S` seconds (``commands/serve.py``), ``admin
prune`` once. With nothing to prune a pass only reads (no write, no fsync).

Crash safety: rows go first, files second. A Run's rows are deleted in one transaction,
child tables first (step-run mutations, step runs, events, attempts, the Run); then its
log files are removed. A log is pruned the same way: its ``log_artifact_id`` is cleared
in one transaction, then the file goes. A crash between the two leaves a file whose
attempt row is gone or has no ``log_artifact_id``; the first step of every new
:class:`Pruner` (a restarted ``serve``, ``admin prune``) sweeps such orphans
(:data:`SWEEP_BATCH` names per step). No row ever points at a deleted file, and every
file left behind is found again: the order converges. A crash inside the transaction
rolls back (SQLite's journal). See :mod:`qinglong_edge.local.run_logs` for the launch
side of the invariant.

Public API::

    caps = RetentionCaps.from_config(config)
    pruner = Pruner(store, caps)
    report = pruner.run(should_stop=stop.is_set)        # PruneReport: what was removed
    usage = store.run(measure_store)                     # StoreUsage, read-only
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from qinglong_edge.config import EdgeConfig
from qinglong_edge.crashpoints import crashpoint
from qinglong_edge.errors import StoreError
from qinglong_edge.local.audit import prune_audit
from qinglong_edge.local.retention_rows import (
    PRUNABLE_RUN_STATUSES,
    DeletedRuns,
    StoreUsage,
    attempts_of,
    clear_log_artifacts,
    delete_runs,
    disk_full,
    incremental_vacuum,
    log_owners,
    measure_store,
    oldest_terminal_runs,
)
from qinglong_edge.local.run_logs import LogFile, LogScan, attempt_log_path, remove_attempt_logs, scan_logs
from qinglong_edge.local.store import Store, now_ms

__all__ = [
    "AUDIT_BATCH",
    "LOG_BATCH",
    "MAINTENANCE_INTERVAL_S",
    "PRUNABLE_RUN_STATUSES",
    "RUN_BATCH",
    "SWEEP_BATCH",
    "VACUUM_PAGES",
    "PruneReport",
    "Pruner",
    "RetentionCaps",
    "StoreUsage",
    "delete_runs",
    "measure_store",
]

_log = logging.getLogger("qinglong_edge.retention")

#: Most Runs deleted by one step (one transaction: ~12 rows each).
RUN_BATCH = 32
#: Most audit rows deleted by one step.
AUDIT_BATCH = 512
#: Most logs pruned by one step.
LOG_BATCH = 64
#: Log directory names checked for orphans by one step.
SWEEP_BATCH = 256
#: Free pages given back to the file system by one step (1 MiB at 4 KiB pages).
VACUUM_PAGES = 256
#: How often ``serve`` runs a pruning pass, in seconds.
MAINTENANCE_INTERVAL_S = 10.0
#: The log directory is listed again after this many seconds, or when Runs ended.
LOG_RESCAN_S = 60.0
#: Runs kept because another Run refers to them, remembered so the next steps skip them.
_MAX_PINNED = 1024


@dataclass(frozen=True, slots=True)
class RetentionCaps:
    """The caps of one device (module docstring). Times in ms, sizes in bytes.

    ``log_directory`` and ``max_total_log_bytes`` are ``None`` without an ``execution``
    section (no Run logs are written then).
    """

    audit_maximum_entries: int
    audit_retention_ms: int
    run_maximum_entries: int
    run_retention_ms: int
    database_maximum_bytes: int
    log_directory: str | None = None
    max_total_log_bytes: int | None = None

    @classmethod
    def from_config(cls, config: EdgeConfig) -> RetentionCaps:
        """The caps of ``config`` (which must have a ``localApi`` section).

        Raises:
            ValueError: no ``localApi`` section (a caller bug).
        """
        local = config.local_api
        if local is None:
            raise ValueError("the configuration has no localApi section")
        execution = config.execution
        return cls(
            local.audit_maximum_entries, local.audit_retention_ms, local.run_maximum_entries,
            local.run_retention_ms, local.database_maximum_bytes,
            execution.log_directory if execution is not None else None,
            execution.max_total_log_bytes if execution is not None else None,
        )


# -- the pruner ----------------------------------------------------------------------------


@dataclass
class PruneReport:
    """What a :meth:`Pruner.run` (or several) removed.

    Attributes:
        audit_rows: audit rows deleted, by reason (``count``, ``age``, ``database``).
        runs: terminal Runs deleted (with their rows and logs), by reason.
        logs: attempt logs deleted by ``maxTotalLogBytes`` (their Runs kept).
        log_bytes: bytes of log files removed (with Runs and by the log cap).
        orphan_files: log files or FIFOs without their row, removed by the sweep.
        vacuum_pages: free database pages given back to the file system.
        unremoved_files: files that could not be removed (retried by the next sweep).
        truncated_bytes: bytes of logs being pruned that were emptied first, the disk
            being full (SQLite's rollback journal needs room).
        pinned_runs: Runs kept because another Run refers to them.
        steps: bounded steps done; max_step_ms: the longest one.
    """

    audit_rows: dict[str, int] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)
    logs: int = 0
    log_bytes: int = 0
    orphan_files: int = 0
    vacuum_pages: int = 0
    unremoved_files: int = 0
    truncated_bytes: int = 0
    pinned_runs: int = 0
    steps: int = 0
    max_step_ms: float = 0.0

    @property
    def removed_anything(self) -> bool:
        return bool(sum(self.audit_rows.values()) or sum(self.runs.values()) or self.logs or self.orphan_files
                    or self.vacuum_pages)

    def to_json(self) -> dict[str, Any]:
        return {
            "auditRows": sum(self.audit_rows.values()), "auditRowsBy": dict(sorted(self.audit_rows.items())),
            "runs": sum(self.runs.values()), "runsBy": dict(sorted(self.runs.items())),
            "logs": self.logs, "logBytes": self.log_bytes, "orphanFiles": self.orphan_files,
            "vacuumPages": self.vacuum_pages, "unremovedFiles": self.unremoved_files,
            "truncatedBytes": self.truncated_bytes,
            "pinnedRuns": self.pinned_runs, "steps": self.steps, "maxStepMs": round(self.max_step_ms, 3),
        }


def _add(counter: dict[str, int], reason: str, n: int) -> None:
    if n:
        counter[reason] = counter.get(reason, 0) + n


class Pruner:
    """Keeps one Local store and its log directory within :class:`RetentionCaps`.

    Args:
        store: the opened store (its queue is shared with the API and the controller).
        caps: the caps.
        clock: wall clock in ms (the retention ages).
        timeout_s: the limit of each store operation.

    Not thread-safe: one thread calls :meth:`step`/:meth:`run` (``serve``'s main thread).
    """

    def __init__(self, store: Store, caps: RetentionCaps, *, clock: Callable[[], int] = now_ms,
                 timeout_s: float = 60.0) -> None:
        self.store = store
        self.caps = caps
        self.clock = clock
        self.timeout_s = timeout_s
        self._pinned: set[str] = set()
        self._sweep: list[LogFile] | None = None if caps.log_directory else []
        self._scan: LogScan | None = None
        self._scan_at = 0.0
        self._scan_key: tuple[int, int] | None = None
        self.last_usage: StoreUsage | None = None

    # -- one step ------------------------------------------------------------------------

    def step(self, report: PruneReport | None = None) -> str | None:
        """Do one bounded unit of pruning; what it did (``sweep``, ``audit``, ``runs``,
        ``database``, ``logs``, ``vacuum``), or None when every cap holds.

        Raises:
            StoreError: the store failed (nothing half-done: the next step retries).
            OSError: the log directory cannot be listed.
        """
        report = report if report is not None else PruneReport()
        started = time.monotonic()
        did = self._step(report)
        if did is not None:
            report.steps += 1
            report.max_step_ms = max(report.max_step_ms, (time.monotonic() - started) * 1000)
        return did

    def _step(self, report: PruneReport) -> str | None:
        if self._sweep is None or self._sweep:
            return self._sweep_step(report)
        usage = self._run(measure_store)
        self.last_usage = usage
        caps, now = self.caps, self.clock()
        deferred: StoreError | None = None
        audit_cutoff = now - caps.audit_retention_ms
        if usage.audit_rows > caps.audit_maximum_entries or (
            usage.audit_oldest_ms is not None and usage.audit_oldest_ms < audit_cutoff
        ):
            count_excess = usage.audit_rows - caps.audit_maximum_entries
            try:
                n = self._run(lambda c: prune_audit(c, maximum_entries=caps.audit_maximum_entries,
                                                    older_than_ms=audit_cutoff, limit=AUDIT_BATCH))
            except StoreError as exc:
                if not disk_full(exc):
                    raise
                deferred = exc  # the Run steps below can make room (their logs); then retry
                n = 0
            if n:
                _add(report.audit_rows, "count" if count_excess > 0 else "age", n)
                return "audit"
        excess = usage.terminal_runs - caps.run_maximum_entries
        if excess > 0 and self._delete_runs(report, "count", min(excess, RUN_BATCH), None):
            return "runs"
        run_cutoff = now - caps.run_retention_ms
        if (usage.oldest_terminal_created_ms is not None and usage.oldest_terminal_created_ms < run_cutoff
                and self._delete_runs(report, "age", RUN_BATCH, run_cutoff)):
            return "runs"
        if usage.used_bytes > caps.database_maximum_bytes and self._database_step(report, usage):
            return "database"
        if self._logs_step(report, usage):
            return "logs"
        if (usage.auto_vacuum == 2 and usage.freelist_count > 0
                and usage.file_bytes > caps.database_maximum_bytes):
            n = self._run(lambda c: incremental_vacuum(c, VACUUM_PAGES))
            if n > 0:
                report.vacuum_pages += n
                return "vacuum"
        if deferred is not None:
            raise deferred
        return None

    def _run(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        return self.store.run(fn, timeout_s=self.timeout_s)

    def _delete_runs(self, report: PruneReport, reason: str, limit: int, ended_before_ms: int | None) -> bool:
        skip = set(self._pinned)
        ids: list[str] = self._run(lambda c: oldest_terminal_runs(c, limit, ended_before_ms=ended_before_ms,
                                                                   skip=skip))
        if not ids:
            return False
        deleted = self._delete_making_room(report, ids)
        remembered = False
        new = set(deleted.pinned) - self._pinned
        if new and len(self._pinned) + len(new) <= _MAX_PINNED:
            self._pinned |= new
            report.pinned_runs += len(new)
            remembered = True
            _log.info("kept %d terminal Run(s) another Run refers to", len(new))
        _add(report.runs, reason, len(deleted.run_ids))
        for run_id, attempt_id, artifact in deleted.attempts:
            self._remove_logs(report, run_id, attempt_id, artifact)
        crashpoint("store_prune.files_removed")
        # Progress only if rows went or newly pinned Runs are now skipped (no endless loop).
        return bool(deleted.run_ids) or remembered

    def _delete_making_room(self, report: PruneReport, ids: list[str]) -> DeletedRuns:
        """:func:`delete_runs`; on a full disk (no room for SQLite's rollback journal) the
        logs of these Runs, which go anyway, are emptied first (the files stay, so no row
        points at a missing file), then smaller transactions are tried: all, 4, 1 Run."""
        try:
            first: DeletedRuns = self._run(lambda c: delete_runs(c, ids))
        except StoreError as exc:
            if not disk_full(exc):
                raise
        else:
            return first
        self._make_room(report, self._run(lambda c: attempts_of(c, ids)))
        failure: StoreError | None = None
        for size in dict.fromkeys((len(ids), min(4, len(ids)), 1)):
            batch = ids[:size]
            try:
                result: DeletedRuns = self._run(lambda c, b=batch: delete_runs(c, b))  # type: ignore[misc]
            except StoreError as exc:
                if not disk_full(exc):
                    raise
                failure = exc
                continue
            return result
        assert failure is not None
        raise failure

    def _make_room(self, report: PruneReport, attempts: Iterable[tuple[str, str, str | None]]) -> None:
        """Disk full: truncate to 0 the logs that this step deletes anyway, so SQLite's
        rollback journal fits. Each file stays (emptied), so nothing ever points at a
        missing file; a crash here leaves Runs with empty logs, pruned by the next step.
        """
        directory, freed = self.caps.log_directory, 0
        for run_id, attempt_id, artifact in attempts:
            path = None if directory is None else attempt_log_path(directory, run_id, attempt_id, artifact)
            if path is None:
                continue
            with contextlib.suppress(OSError):
                size = os.lstat(path).st_blocks * 512
                os.truncate(path, 0)
                freed += size
        report.truncated_bytes += freed
        self._scan = None
        if freed:
            _log.warning("the disk is full: emptied %d bytes of logs being pruned to make room", freed)

    def _remove_logs(self, report: PruneReport, run_id: str, attempt_id: str, artifact: str | None) -> None:
        directory = self.caps.log_directory
        if directory is None:
            return
        try:
            report.log_bytes += remove_attempt_logs(directory, run_id, attempt_id, artifact)
        except OSError as exc:
            report.unremoved_files += 1
            _log.warning("run %s: its log could not be removed (%s); the next sweep retries", run_id,
                         exc.strerror or type(exc).__name__)
        self._scan = None

    def _database_step(self, report: PruneReport, usage: StoreUsage) -> bool:
        """Over ``databaseMaximumBytes``: delete a batch of the oldest records, audit rows or
        terminal Runs, whichever is older."""
        audit_at = usage.audit_oldest_ms
        run_at = usage.oldest_terminal_ended_ms
        audit_first = audit_at is not None and (run_at is None or audit_at <= run_at)
        if audit_first:
            n = self._run(lambda c: prune_audit(c, maximum_entries=0, older_than_ms=None, limit=AUDIT_BATCH))
            _add(report.audit_rows, "database", n)
            if n:
                return True
        if run_at is not None and self._delete_runs(report, "database", RUN_BATCH, None):
            return True
        if not audit_first and audit_at is not None:
            late: int = self._run(lambda c: prune_audit(c, maximum_entries=0, older_than_ms=None, limit=AUDIT_BATCH))
            _add(report.audit_rows, "database", late)
            return late > 0
        return False

    # -- logs ------------------------------------------------------------------------------

    def log_scan(self, usage: StoreUsage | None = None) -> LogScan | None:
        """The log directory's files (listed again after :data:`LOG_RESCAN_S` or when the
        number of Runs changed), or None without a log directory."""
        directory = self.caps.log_directory
        if directory is None:
            return None
        key = None if usage is None else (usage.runs, usage.terminal_runs)
        if (self._scan is None or time.monotonic() - self._scan_at > LOG_RESCAN_S
                or (key is not None and key != self._scan_key)):
            self._scan = scan_logs(directory)
            self._scan_at = time.monotonic()
            self._scan_key = key
        return self._scan

    def _logs_step(self, report: PruneReport, usage: StoreUsage) -> bool:
        cap, directory = self.caps.max_total_log_bytes, self.caps.log_directory
        if cap is None or directory is None:
            return False
        scan = self.log_scan(usage)
        if scan is None or scan.total_bytes <= cap:
            return False
        oldest = sorted((f for f in scan.files if not f.fifo and f.bytes > 0), key=lambda f: (f.mtime_ns, f.name))
        window = oldest[: LOG_BATCH * 4]
        owners = self._run(lambda c: log_owners(c, window))
        over, chosen, sizes = scan.total_bytes - cap, [], {}
        for f in window:
            owner = owners.get(f.name)
            if owner is None or not owner[3]:
                continue  # an orphan (the sweep's) or a Run still in flight: never pruned
            chosen.append(owner[1])
            sizes[owner[1]] = f.size
            over -= f.bytes
            if over <= 0 or len(chosen) >= LOG_BATCH:
                break
        if not chosen:
            return False
        try:
            cleared = self._run(lambda c: clear_log_artifacts(c, chosen, sizes=sizes, now_ms=now_ms()))
        except StoreError as exc:
            if not disk_full(exc):
                raise
            self._make_room(report, [(o[0], o[1], o[2]) for o in owners.values() if o[1] in set(chosen)])
            cleared = self._run(lambda c: clear_log_artifacts(c, chosen, sizes=sizes, now_ms=now_ms()))
        for run_id, attempt_id, artifact in cleared:
            before = report.log_bytes
            self._remove_logs(report, run_id, attempt_id, artifact)
            if report.log_bytes > before:
                report.logs += 1
        return bool(cleared)

    def _sweep_step(self, report: PruneReport) -> str:
        """Remove log files and FIFOs whose attempt row is gone or has no
        ``log_artifact_id`` (a crash between the rows and the files), a batch per step."""
        directory = self.caps.log_directory
        if self._sweep is None:
            self._sweep = list(scan_logs(directory).files) if directory is not None else []
        batch, self._sweep = self._sweep[:SWEEP_BATCH], self._sweep[SWEEP_BATCH:]
        if not batch or directory is None:
            return "sweep"
        owners = self._run(lambda c: log_owners(c, batch))
        for f in batch:
            if f.name in owners:
                continue
            try:
                os.unlink(os.path.join(directory, f.name))
            except FileNotFoundError:
                continue
            except OSError as exc:
                report.unremoved_files += 1
                _log.warning("orphan log %s could not be removed (%s)", f.name, exc.strerror or type(exc).__name__)
                continue
            report.orphan_files += 1
            report.log_bytes += f.bytes
            self._scan = None
        return "sweep"

    # -- passes ----------------------------------------------------------------------------

    def run(self, *, should_stop: Callable[[], bool] | None = None, max_steps: int = 1_000_000,
            report: PruneReport | None = None) -> PruneReport:
        """Steps until every cap holds (or ``should_stop()``, or ``max_steps``).

        Raises:
            StoreError, OSError: as :meth:`step` (what the earlier steps removed stays removed).
        """
        report = report if report is not None else PruneReport()
        for _ in range(max_steps):
            if should_stop is not None and should_stop():
                break
            if self.step(report) is None:
                break
        return report

