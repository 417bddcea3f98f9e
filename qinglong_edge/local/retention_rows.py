"""The SQL of the storage caps (issue 16): usage, Run deletion, log ownership.

Every function takes an open connection and runs as (part of) one store operation;
:mod:`qinglong_edge.local.retention` composes them into bounded steps and says what is
pruned when and why the order converges after a crash. Only constants and ``?``
placeholders go into the SQL text; every value is bound.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from qinglong_edge.crashpoints import crashpoint
from qinglong_edge.errors import StoreError
from qinglong_edge.local.audit import audit_usage
from qinglong_edge.local.run_logs import LogFile
from qinglong_edge.local.store import foreign_keys_off, read_transaction, write_transaction

__all__ = [
    "PRUNABLE_RUN_STATUSES",
    "DeletedRuns",
    "StoreUsage",
    "attempts_of",
    "clear_log_artifacts",
    "delete_runs",
    "disk_full",
    "incremental_vacuum",
    "log_owners",
    "measure_store",
    "oldest_terminal_runs",
]

#: Terminal Runs the caps may remove (execution control's terminal set, see retention.py).
PRUNABLE_RUN_STATUSES = ("succeeded", "failed", "cancelled", "timed_out", "lost")

_TERMINAL_SQL = "(" + ", ".join(f"'{status}'" for status in PRUNABLE_RUN_STATUSES) + ")"
_ENDED_SQL = "coalesce(finished_at_ms, created_at_ms)"


def _marks(values: Sequence[object]) -> str:
    return ", ".join("?" * len(values))


@dataclass(frozen=True, slots=True)
class StoreUsage:
    """What the Local store holds now (one read transaction).

    Attributes:
        audit_rows, audit_oldest_ms: audit rows and the time of the oldest (or None).
        runs, terminal_runs: every Run; those the caps may remove.
        oldest_terminal_created_ms, oldest_terminal_ended_ms: of the oldest terminal
            Run (first created), or None.
        page_size, page_count, freelist_count: the database file's pages.
        auto_vacuum: 0 none, 1 full, 2 incremental.
    """

    audit_rows: int
    audit_oldest_ms: int | None
    runs: int
    terminal_runs: int
    oldest_terminal_created_ms: int | None
    oldest_terminal_ended_ms: int | None
    page_size: int
    page_count: int
    freelist_count: int
    auto_vacuum: int

    @property
    def used_bytes(self) -> int:
        """Pages in use x page size: what the rows take (free pages excluded)."""
        return (self.page_count - self.freelist_count) * self.page_size

    @property
    def file_bytes(self) -> int:
        """The main database file's size (the rollback journal or WAL not included)."""
        return self.page_count * self.page_size

    def to_json(self) -> dict[str, Any]:
        return {
            "auditRows": self.audit_rows, "auditOldestMs": self.audit_oldest_ms, "runs": self.runs,
            "terminalRuns": self.terminal_runs, "oldestTerminalRunEndedMs": self.oldest_terminal_ended_ms,
            "databaseUsedBytes": self.used_bytes, "databaseFileBytes": self.file_bytes,
            "autoVacuum": ("none", "full", "incremental")[self.auto_vacuum] if 0 <= self.auto_vacuum <= 2 else "?",
        }


def measure_store(conn: sqlite3.Connection) -> StoreUsage:
    """Read :class:`StoreUsage` in one snapshot; writes nothing.

    Each figure is an index walk (``count(*)``) or a pragma: milliseconds for the edge
    caps' row counts.
    """
    with read_transaction(conn):
        audit_rows, audit_oldest = audit_usage(conn)
        runs = int(conn.execute('SELECT count(*) FROM "Runs"').fetchone()[0])
        terminal = int(conn.execute(f'SELECT count(*) FROM "Runs" WHERE status IN {_TERMINAL_SQL}').fetchone()[0])
        oldest = conn.execute(
            f'SELECT created_at_ms, {_ENDED_SQL} FROM "Runs" NOT INDEXED WHERE status IN {_TERMINAL_SQL}'
            " ORDER BY rowid LIMIT 1"
        ).fetchone()
        pragmas = [int(conn.execute(f"PRAGMA {name}").fetchone()[0])
                   for name in ("page_size", "page_count", "freelist_count", "auto_vacuum")]
    return StoreUsage(
        audit_rows, audit_oldest, runs, terminal,
        None if oldest is None else int(oldest[0]), None if oldest is None else int(oldest[1]),
        *pragmas,
    )


# -- Run deletion ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeletedRuns:
    """What :func:`delete_runs` removed.

    Attributes:
        run_ids: the Runs whose rows are gone.
        attempts: ``(run id, attempt id, log_artifact_id)`` of their attempts (their
            log files still exist: the caller removes them).
        pinned: Runs kept because another Run names them as parent or retry.
    """

    run_ids: tuple[str, ...]
    attempts: tuple[tuple[str, str, str | None], ...]
    pinned: tuple[str, ...]


def delete_runs(conn: sqlite3.Connection, run_ids: Sequence[str]) -> DeletedRuns:
    """Delete terminal Runs with every row that belongs to them, in one transaction.

    Order: ``StepRunMutations``, ``StepRuns``, ``RunEvents``, ``RunAttempts``, ``Runs``
    (children first, so no key is ever left dangling), with foreign key enforcement off
    for the transaction (:func:`~qinglong_edge.local.store.foreign_keys_off`: otherwise
    each deleted attempt and Run costs a scan of the unindexed ``RunEvents.attempt_id``
    and ``Runs.parent_run_id``/``retry_of_run_id``). Inside the transaction the ids are
    re-read: a Run that is missing or not terminal is skipped, one named by another
    Run's ``parent_run_id``/``retry_of_run_id`` is kept (``pinned``).

    Raises:
        sqlite3.Error: the transaction failed and was rolled back.
    """
    ids = list(dict.fromkeys(run_ids))
    if not ids:
        return DeletedRuns((), (), ())
    with foreign_keys_off(conn), write_transaction(conn):
        marks = _marks(ids)
        found = [str(row[0]) for row in conn.execute(
            f'SELECT id FROM "Runs" WHERE id IN ({marks}) AND status IN {_TERMINAL_SQL}', ids)]
        pinned: set[str] = set()
        if found:
            fm = _marks(found)
            for parent, retry in conn.execute(
                f'SELECT parent_run_id, retry_of_run_id FROM "Runs" WHERE parent_run_id IN ({fm})'
                f" OR retry_of_run_id IN ({fm})", found + found,
            ):
                pinned.update(str(v) for v in (parent, retry) if v is not None)
        doomed = [run_id for run_id in found if run_id not in pinned]
        if not doomed:
            return DeletedRuns((), (), tuple(sorted(pinned & set(found))))
        dm = _marks(doomed)
        attempts = tuple(
            (str(run_id), str(attempt_id), None if artifact is None else str(artifact))
            for run_id, attempt_id, artifact in conn.execute(
                f'SELECT run_id, id, log_artifact_id FROM "RunAttempts" WHERE run_id IN ({dm})'
                " ORDER BY run_id, attempt",
                doomed,
            )
        )
        for table, column in (("StepRunMutations", "run_id"), ("StepRuns", "run_id"), ("RunEvents", "run_id"),
                              ("QingLongEdgeLogRetirements", "run_id"), ("RunAttempts", "run_id"), ("Runs", "id")):
            conn.execute(f'DELETE FROM "{table}" WHERE {column} IN ({dm})', doomed)
        crashpoint("store_prune.rows_deleted")
    crashpoint("store_prune.rows_committed")
    return DeletedRuns(tuple(doomed), attempts, tuple(sorted(pinned & set(found))))


def oldest_terminal_runs(
    conn: sqlite3.Connection, limit: int, *, ended_before_ms: int | None, skip: Iterable[str]
) -> list[str]:
    """Ids of the oldest terminal Runs (first created), optionally only those that ended
    before ``ended_before_ms``. A scan in ``rowid`` (insertion) order that stops after
    ``limit`` matches."""
    skipped = sorted(skip)
    where = f"status IN {_TERMINAL_SQL}"
    params: list[object] = []
    if ended_before_ms is not None:
        where += f" AND created_at_ms < ? AND {_ENDED_SQL} < ?"
        params += [ended_before_ms, ended_before_ms]
    if skipped:
        where += f" AND id NOT IN ({_marks(skipped)})"
        params += skipped
    rows = conn.execute(f'SELECT id FROM "Runs" NOT INDEXED WHERE {where} ORDER BY rowid LIMIT ?', [*params, limit])
    return [str(row[0]) for row in rows]


def clear_log_artifacts(
    conn: sqlite3.Connection, attempt_ids: Sequence[str], *, sizes: Mapping[str, int] | None = None,
    now_ms: int = 0,
) -> list[tuple[str, str, str]]:
    """Clear ``log_artifact_id`` of terminal Runs' attempts (log pruning), one transaction,
    and write each one's tombstone in ``QingLongEdgeLogRetirements`` (``byte_length`` from
    ``sizes``, attempt id -> the file's size in bytes, else 0; ``retired_at_ms`` =
    ``now_ms``, wall-clock epoch ms): run.log.read then answers 410 ``retired``.

    Returns ``(run id, attempt id, old log_artifact_id)`` of the attempts changed.
    """
    ids = list(dict.fromkeys(attempt_ids))
    if not ids:
        return []
    with write_transaction(conn):
        rows = [
            (str(run_id), str(attempt_id), str(artifact))
            for run_id, attempt_id, artifact in conn.execute(
                f'SELECT a.run_id, a.id, a.log_artifact_id FROM "RunAttempts" AS a JOIN "Runs" AS r ON r.id = a.run_id'
                f" WHERE a.id IN ({_marks(ids)}) AND a.log_artifact_id IS NOT NULL"
                f" AND r.status IN {_TERMINAL_SQL} AND a.status NOT IN ('claimed', 'starting', 'running')",
                ids,
            )
        ]
        if rows:
            changed = [attempt_id for _, attempt_id, _ in rows]
            conn.execute(f'UPDATE "RunAttempts" SET log_artifact_id = NULL WHERE id IN ({_marks(changed)})', changed)
            conn.executemany(
                'INSERT OR REPLACE INTO "QingLongEdgeLogRetirements" (attempt_id, run_id, log_artifact_id,'
                " byte_length, retired_at_ms) VALUES (?, ?, ?, ?, ?)",
                [(attempt_id, run_id, artifact, max(0, int((sizes or {}).get(attempt_id, 0))), max(0, now_ms))
                 for run_id, attempt_id, artifact in rows],
            )
        crashpoint("log_prune.rows_updated")
    crashpoint("log_prune.rows_committed")
    return rows


def _attempt_logs(conn: sqlite3.Connection, column: str, values: list[str]) -> dict[str, tuple[str, str, str, bool]]:
    """``column`` value -> ``(run id, attempt id, log_artifact_id, terminal)`` of the attempts
    whose ``column`` (``id`` or ``log_artifact_id``) is one of ``values`` and that still have
    a log (no query for no value)."""
    if not values:
        return {}
    keys = list(dict.fromkeys(values))
    rows = conn.execute(
        f'SELECT a.id, a.run_id, a.log_artifact_id, r.status FROM "RunAttempts" AS a'
        f' JOIN "Runs" AS r ON r.id = a.run_id WHERE a.{column} IN ({_marks(keys)})'
        " AND a.log_artifact_id IS NOT NULL",
        keys,
    )
    by = 0 if column == "id" else 2
    return {
        str(row[by]): (str(row[1]), str(row[0]), str(row[2]), row[3] in PRUNABLE_RUN_STATUSES) for row in rows
    }


def log_owners(conn: sqlite3.Connection, files: Sequence[LogFile]) -> dict[str, tuple[str, str, str, bool]]:
    """file name -> ``(run id, attempt id, log_artifact_id, terminal)`` for the files whose
    attempt row exists and still has a ``log_artifact_id``; the others are orphans."""
    owners: dict[str, tuple[str, str, str, bool]] = {}
    named = [f for f in files if f.attempt_id is not None]
    legacy = [f for f in files if f.legacy_artifact_id is not None]
    with read_transaction(conn):
        by_id = _attempt_logs(conn, "id", [str(f.attempt_id) for f in named])
        by_artifact = _attempt_logs(conn, "log_artifact_id", [str(f.legacy_artifact_id) for f in legacy])
    for f in named:
        owner = by_id.get(str(f.attempt_id))
        if owner is not None and owner[0] == f.run_id:
            owners[f.name] = owner
    for f in legacy:
        owner = by_artifact.get(str(f.legacy_artifact_id))
        if owner is not None:
            owners[f.name] = owner
    return owners


def attempts_of(conn: sqlite3.Connection, run_ids: Sequence[str]) -> list[tuple[str, str, str | None]]:
    """``(run id, attempt id, log_artifact_id)`` of the attempts of ``run_ids`` (a read)."""
    rows = conn.execute(
        f'SELECT run_id, id, log_artifact_id FROM "RunAttempts" WHERE run_id IN ({_marks(run_ids)})', list(run_ids))
    return [(str(r), str(a), None if x is None else str(x)) for r, a, x in rows]


def disk_full(exc: StoreError) -> bool:
    """SQLite said SQLITE_FULL (no room for the rollback journal or a new page)."""
    return "SQLITE_FULL" in exc.message


def incremental_vacuum(conn: sqlite3.Connection, pages: int) -> int:
    """Give at most ``pages`` free pages back to the file system; how many went."""
    with write_transaction(conn):
        before = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        conn.execute(f"PRAGMA incremental_vacuum({int(pages)})").fetchall()
        after = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    return before - after
