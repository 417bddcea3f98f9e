"""The durable state changes of execution control: one function per transaction.

Every function takes a connection on the store thread (``store.run(lambda c: f(c, ...))``),
opens its own ``BEGIN IMMEDIATE`` transaction, re-reads the Run and attempt, checks that
they are still in the state the caller saw, and then changes both rows and appends the
events in one commit. Run ``version`` and ``event_sequence`` rise by one per event.

Events (type / dedupe key / actor type / actor id / payload keys in order; the launch
rows are written by :mod:`qinglong_edge.execution.launcher`). ``cs`` is the attempt's
``callback_sequence`` before the change, ``v0`` the Run version before it; ``version`` in
a payload is the Run version after that event:

=================  ==========================================================  =====================================
launch (claim)     ``run.dispatching``  ``local-execution:run:{runId}:{v0}:dispatching``   scheduler / local-execution
                   ``{from_status, to_status, version}``
                   ``attempt.starting`` ``local-execution:attempt:{attemptId}:{cs}:starting`` worker / local_process
                   ``{attempt_id, from_status, to_status, version[, deadline_at_ms]}``
launch (record)    ``attempt.running``  ``local-execution:attempt:{attemptId}:{cs}:running``  executor / local_process
                   ``{attempt_id, from_status, to_status, pid, version}``
                   ``run.running``      ``local-execution:run:{runId}:{v0}:running``          executor / local_process
                   ``{from_status, to_status, version}``
launch failed      ``attempt.failed`` / ``run.failed`` keys ``local-execution:attempt:{attemptId}:{cs}:failed``,
                   ``local-execution:run:{runId}:{v0}:failed``, executor / local_process,
                   ``{attempt_id, from_status, to_status, error_code, version}`` / ``{from_status, to_status,
                   error_code, version}``; error ``EXECUTOR_START_FAILED``
completion         ``attempt.<s>`` ``local-completion:{attemptId}:{cs+1}:attempt``   executor / local_process
                   ``{attempt_id, from_status, to_status, callback_sequence, exit_code, version}``
                   ``run.<s>``     ``local-completion:{attemptId}:{cs+1}:run``       executor / local_process
                   ``{from_status, to_status, version}``
control intent     ``run.cancel_requested`` ``local-control:{attemptId}:{reason}:{v0}``
                   reconciler / local-deadline | local-shutdown, ``{reason, from_status, version}``
mark terminal      ``attempt.<s>`` ``local-control:{attemptId}:{cs}:attempt`` reconciler / local-execution-control
                   ``{attempt_id, from_status, to_status, reason, version}``
                   ``run.<s>``     ``local-control:{attemptId}:{cs}:run``, ``{from_status, to_status, reason, version}``
requeued launch    ``attempt.failed`` ``local-execution:attempt:{attemptId}:{cs}:failed``     executor / local_process
                   ``{attempt_id, from_status, to_status, error_code, version}``, error ``LAUNCH_STORAGE_UNAVAILABLE``
                   ``run.queued``     ``local-execution:run:{runId}:{v0}:requeued``         scheduler / local-execution
                   ``{from_status, to_status, attempt, version}`` (``attempt``: the new attempt's number);
                   on the last allowed attempt ``run.failed`` (``local-execution:run:{runId}:{v0}:failed``)
                   instead, error ``LAUNCH_STORAGE_UNAVAILABLE``
lost               ``attempt.lost`` ``local-recovery:attempt:{attemptId}:{cs}:{why}``
                   ``run.lost``     ``local-recovery:run:{runId}:{attemptId}:{v0}:{why}``
                   reconciler / local-startup (at start) or local-execution-control (later),
                   ``{attempt_id, from_status, to_status, error_code, version}`` / ``{from_status, to_status,
                   error_code, version}``
=================  ==========================================================  =====================================

These follow local-api.md 7.2 and the reference's launch, completion and recovery
coordinators. Mapping of a completion (7.2 step 1): with a cancel intent the outcome is
``cancelled`` (``timed_out`` for reason ``timeout``) whatever the exit code, error
``EXECUTION_CANCELLED`` / ``EXECUTION_TIMED_OUT``; else exit 0 is ``succeeded`` and anything
else ``failed`` (``EXECUTION_FAILED``). An exit by signal N is recorded as 128 + N.

``finished_at_ms`` (and every event time) is ``max(now, run.created, run.started,
attempt.created, attempt.started)`` so a clock step backwards never makes a Run end before
it began.

Our decision for the gap of 7.2 (spec README): a ``queued`` Run with a cancel intent and
its ``claimed`` attempt go straight to ``cancelled`` through :func:`mark_terminal` (the
same events and keys), without launching.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qinglong_edge.contracts.ids import new_uuid4
from qinglong_edge.contracts.strictjson import dumps
from qinglong_edge.errors import StoreError
from qinglong_edge.local.store import read_transaction, write_transaction

__all__ = [
    "ACTIVE_ATTEMPT",
    "EXECUTOR",
    "LAUNCH_STORAGE_UNAVAILABLE",
    "Candidate",
    "Changes",
    "Snapshot",
    "at_or_after",
    "finished_attempts",
    "list_active",
    "list_candidates",
    "load_in",
    "load_snapshot",
    "mark_lost",
    "mark_terminal",
    "record_completion",
    "request_control_cancellation",
    "requeue_launch",
    "terminal_for",
    "terminate_in",
]

ACTIVE_ATTEMPT = ("claimed", "starting", "running")
#: Run statuses execution control may still move (``queued`` is our 7.2 extension).
CONTROLLABLE_RUN = ("queued", "dispatching", "running")
#: Terminal for execution control (includes ``lost``, unlike the cancellation contract).
CONTROL_TERMINAL = ("succeeded", "failed", "cancelled", "timed_out", "lost")
MAX_PAGE = 64
EXECUTOR = "local_process"

_SELECT_RUN = (
    "SELECT id, project_id, task_id, task_revision, status, version, event_sequence, execution_owner,"
    ' created_at_ms, started_at_ms, cancel_requested_at_ms, cancel_reason FROM "Runs" WHERE id = ?'
)
_SELECT_ATTEMPT = (
    "SELECT id, run_id, attempt, status, executor_type, executor_handle, pid, log_artifact_id, deadline_at_ms,"
    " callback_sequence, created_at_ms, started_at_ms, deadline_boot_ms, deadline_boot_id"
    ' FROM "RunAttempts" WHERE id = ? AND run_id = ?'
)
#: Columns :class:`Changes` may set (its SQL is built from these names only).
_RUN_SETTABLE = frozenset({
    "status", "started_at_ms", "finished_at_ms", "error_code", "error_summary", "cancel_requested_at_ms",
    "cancel_reason",
})
_ATTEMPT_SETTABLE = frozenset({
    "status", "executor_handle", "pid", "started_at_ms", "finished_at_ms", "exit_code", "error_code",
    "error_summary", "deadline_at_ms", "log_artifact_id", "callback_sequence", "deadline_boot_ms",
    "deadline_boot_id",
})


@dataclass(frozen=True, slots=True)
class RunRow:
    id: str
    project_id: str
    task_id: str
    task_revision: str
    status: str
    version: int
    event_sequence: int
    execution_owner: str
    created_at_ms: int
    started_at_ms: int | None
    cancel_requested_at_ms: int | None
    cancel_reason: str | None


@dataclass(frozen=True, slots=True)
class AttemptRow:
    id: str
    run_id: str
    attempt: int
    status: str
    executor_type: str
    executor_handle: str | None
    pid: int | None
    log_artifact_id: str | None
    deadline_at_ms: int | None
    callback_sequence: int
    created_at_ms: int
    started_at_ms: int | None
    #: The deadline on the boot clock of boot ``deadline_boot_id`` (schema 7), or None.
    deadline_boot_ms: int | None = None
    deadline_boot_id: str | None = None

    def deadline_in_boot(self, boot_id: str | None) -> int | None:
        """The boot-clock deadline when it belongs to ``boot_id`` (this boot), else None."""
        return self.deadline_boot_ms if boot_id is not None and self.deadline_boot_id == boot_id else None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A Run and one of its attempts as read in one transaction; ``latest``: no later attempt."""

    run: RunRow
    attempt: AttemptRow
    latest: bool

    @property
    def controllable(self) -> bool:
        """7.2 step 2 (plus ``queued``): runtime-owned, active, local_process, latest."""
        return (
            self.run.execution_owner == "runtime"
            and self.run.status in CONTROLLABLE_RUN
            and self.attempt.status in ACTIVE_ATTEMPT
            and self.attempt.executor_type == EXECUTOR
            and self.latest
        )


@dataclass(frozen=True, slots=True)
class Candidate:
    """One row of the 7.1 union: ``kind`` ``cancellation`` or ``deadline``."""

    kind: str
    due_at_ms: int
    run_id: str
    attempt_id: str
    cancel_reason: str | None


def terminal_for(reason: str) -> tuple[str, str, str]:
    """(status, error_code, error_summary) for a control stop with ``reason``."""
    if reason == "timeout":
        return "timed_out", "EXECUTION_TIMED_OUT", "Execution exceeded its configured timeout"
    return "cancelled", "EXECUTION_CANCELLED", "Execution was cancelled"


def at_or_after(now_ms: int, run: RunRow, attempt: AttemptRow | None = None) -> int:
    times = [now_ms, run.created_at_ms, run.started_at_ms or 0]
    if attempt is not None:
        times += [attempt.created_at_ms, attempt.started_at_ms or 0]
    return max(times)


def load_in(conn: sqlite3.Connection, run_id: str, attempt_id: str) -> Snapshot | None:
    run = conn.execute(_SELECT_RUN, (run_id,)).fetchone()
    attempt = conn.execute(_SELECT_ATTEMPT, (attempt_id, run_id)).fetchone()
    if run is None or attempt is None:
        return None
    later = conn.execute(
        'SELECT 1 FROM "RunAttempts" WHERE run_id = ? AND attempt > ? LIMIT 1', (run_id, attempt[2])
    ).fetchone()
    return Snapshot(RunRow(*run), AttemptRow(*attempt), later is None)


def load_snapshot(conn: sqlite3.Connection, run_id: str, attempt_id: str) -> Snapshot | None:
    """Read a Run and attempt in one snapshot (7.2 step 2); ``None`` if either is missing."""
    with read_transaction(conn):
        return load_in(conn, run_id, attempt_id)


class Changes:
    """Appends events to one Run inside an open transaction and writes both rows once."""

    def __init__(self, conn: sqlite3.Connection, snap: Snapshot, at_ms: int, new_id: Callable[[], str]) -> None:
        self.conn = conn
        self.snap = snap
        self.at_ms = at_ms
        self.new_id = new_id
        self.version = snap.run.version
        self.sequence = snap.run.event_sequence

    def event(self, kind: str, dedupe: str, actor: tuple[str, str], payload: dict[str, Any]) -> None:
        self.version += 1
        self.sequence += 1
        if self.version > 2**31 - 1 or self.sequence > 2**31 - 1:
            raise StoreError("run version or event sequence overflowed", code="conflict")
        if "version" in payload:
            payload["version"] = self.version
        self.conn.execute(
            'INSERT INTO "RunEvents" (id, run_id, sequence, type, dedupe_key, actor_type, actor_id, attempt_id,'
            " payload, created_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (self.new_id(), self.snap.run.id, self.sequence, kind, dedupe, actor[0], actor[1],
             self.snap.attempt.id, dumps(payload), self.at_ms),
        )

    def commit_rows(self, run: dict[str, object], attempt: dict[str, object]) -> None:
        if not set(run) <= _RUN_SETTABLE or not set(attempt) <= _ATTEMPT_SETTABLE:
            raise StoreError("not a settable column", code="invalid_input")
        run_sets = "".join(f", {k} = ?" for k in run)
        updated = self.conn.execute(
            f'UPDATE "Runs" SET version = ?, event_sequence = ?{run_sets} WHERE id = ? AND version = ?',  # noqa: S608
            (self.version, self.sequence, *run.values(), self.snap.run.id, self.snap.run.version),
        ).rowcount
        if updated != 1:
            raise StoreError("the Run changed concurrently", code="conflict")
        if attempt:
            sets = ", ".join(f"{k} = ?" for k in attempt)
            self.conn.execute(
                f'UPDATE "RunAttempts" SET {sets} WHERE id = ? AND status = ? AND callback_sequence = ?',  # noqa: S608
                (*attempt.values(), self.snap.attempt.id, self.snap.attempt.status,
                 self.snap.attempt.callback_sequence),
            )


_CANDIDATES = """
SELECT kind, due, run_id, attempt_id, reason FROM (
  SELECT 'cancellation' AS kind, r.cancel_requested_at_ms AS due, r.id AS run_id, a.id AS attempt_id,
         r.cancel_reason AS reason
  FROM "Runs" AS r JOIN "RunAttempts" AS a ON a.run_id = r.id
  WHERE r.execution_owner = 'runtime'
    AND r.status NOT IN ('succeeded', 'failed', 'cancelled', 'timed_out')
    AND r.cancel_requested_at_ms IS NOT NULL
    AND a.status IN ('claimed', 'starting', 'running') AND a.executor_type = 'local_process'
    AND NOT EXISTS (SELECT 1 FROM "RunAttempts" AS b WHERE b.run_id = r.id AND b.attempt > a.attempt)
  UNION ALL
  SELECT 'deadline', a.deadline_at_ms, r.id, a.id, NULL
  FROM "Runs" AS r JOIN "RunAttempts" AS a ON a.run_id = r.id
  WHERE r.execution_owner = 'runtime' AND r.status IN ('dispatching', 'running')
    AND r.cancel_requested_at_ms IS NULL
    AND a.status IN ('starting', 'running') AND a.executor_type = 'local_process'
    AND a.deadline_at_ms IS NOT NULL
    AND CASE WHEN a.deadline_boot_ms IS NOT NULL AND a.deadline_boot_id = ? THEN a.deadline_boot_ms <= ?
             ELSE a.deadline_at_ms <= ? END
    AND NOT EXISTS (SELECT 1 FROM "RunAttempts" AS b WHERE b.run_id = r.id AND b.attempt > a.attempt)
)
WHERE (due, kind, attempt_id) > (?, ?, ?)
ORDER BY due, kind, attempt_id LIMIT ?
"""


def list_candidates(
    conn: sqlite3.Connection, now_ms: int, *, after: tuple[int, str, str] | None = None, limit: int = MAX_PAGE,
    boot_ms: int | None = None, boot_id: str | None = None,
) -> list[Candidate]:
    """One page of the 7.1 union (cancellation + deadline), ordered by (due, kind, attempt id).

    ``after`` is the cursor ``(due, kind, attempt_id)`` of the previous page's last row.

    Decision: a cancellation is due as soon as its intent exists (no
    ``cancel_requested_at_ms <= now`` filter), so a wall clock stepped backwards (NTP on a
    router) cannot delay a stop. A deadline set in this boot (``deadline_boot_id ==
    boot_id``) compares its boot-clock value with ``boot_ms`` (spec README "Decisions for
    clocks": a wall-clock step can neither time a Run out nor keep it running); any other
    compares ``deadline_at_ms`` with ``now_ms`` (the wall clock). Includes ``queued``
    Runs with an intent (their ``claimed`` attempt), our 7.2 extension.
    """
    cursor = after if after is not None else (-1, "", "")
    rows = conn.execute(_CANDIDATES, (boot_id, boot_ms if boot_ms is not None else -1, now_ms, *cursor,
                                      limit)).fetchall()
    return [Candidate(*row) for row in rows]


def list_active(conn: sqlite3.Connection) -> list[Snapshot]:
    """Active executions (attempt ``starting``/``running`` of a runtime Run in dispatching/
    running), ordered by attempt ``created_at_ms``, ``id`` (the shutdown drain order)."""
    with read_transaction(conn):
        rows = conn.execute(
            """
            SELECT a.run_id, a.id FROM "RunAttempts" AS a JOIN "Runs" AS r ON r.id = a.run_id
            WHERE r.execution_owner = 'runtime' AND r.status IN ('dispatching', 'running')
              AND a.status IN ('starting', 'running') AND a.executor_type = 'local_process'
            ORDER BY a.created_at_ms, a.id
            """
        ).fetchall()
        snaps = [load_in(conn, run_id, attempt_id) for run_id, attempt_id in rows]
    return [s for s in snaps if s is not None and s.latest]


def finished_attempts(conn: sqlite3.Connection, attempt_ids: list[str]) -> list[str]:
    """Those of ``attempt_ids`` that are attempts of this database and no longer active."""
    found = []
    for attempt_id in attempt_ids:
        row = conn.execute('SELECT status FROM "RunAttempts" WHERE id = ?', (attempt_id,)).fetchone()
        if row is not None and row[0] not in ACTIVE_ATTEMPT:
            found.append(attempt_id)
    return found


def record_completion(
    conn: sqlite3.Connection,
    run_id: str,
    attempt_id: str,
    *,
    exit_code: int,
    finished_at_ms: int,
    now_ms: int,
    new_id: Callable[[], str] = new_uuid4,
    reason: str | None = None,
) -> str | None:
    """The process exited by itself (observed by its parent, us): the completion path.

    ``reason`` (``out_of_memory``: the kernel's OOM killer ended a process of the job in
    its memory leaf) goes into the stored ``attempt.<status>`` event's payload; the wire's
    RunEvent fields are unchanged (payloads are never served).

    Returns:
        the terminal status written, or ``None`` when the attempt was not ``running``
        any more (already terminal or moved on).
    """
    with write_transaction(conn):
        snap = load_in(conn, run_id, attempt_id)
        if snap is None or not snap.controllable or snap.attempt.status != "running":
            return None
        run, attempt = snap.run, snap.attempt
        if run.cancel_requested_at_ms is not None:
            status, code, summary = terminal_for(run.cancel_reason or "user")
        elif exit_code == 0:
            status, code, summary = "succeeded", None, None
        else:
            status, code, summary = "failed", "EXECUTION_FAILED", "Execution completed without success"
        at = max(at_or_after(now_ms, run, attempt), finished_at_ms)
        ch = Changes(conn, snap, at, new_id)
        sequence = attempt.callback_sequence + 1
        ch.event(f"attempt.{status}", f"local-completion:{attempt_id}:{sequence}:attempt", ("executor", EXECUTOR),
                 {"attempt_id": attempt_id, "from_status": attempt.status, "to_status": status,
                  "callback_sequence": sequence, "exit_code": exit_code, "version": 0,
                  **({"reason": reason} if reason is not None else {})})
        ch.event(f"run.{status}", f"local-completion:{attempt_id}:{sequence}:run", ("executor", EXECUTOR),
                 {"from_status": run.status, "to_status": status, "version": 0})
        ch.commit_rows(
            {"status": status, "finished_at_ms": at, "error_code": code, "error_summary": summary},
            {"status": status, "callback_sequence": sequence, "finished_at_ms": at, "exit_code": exit_code,
             "error_code": code, "error_summary": summary},
        )
        return status


def request_control_cancellation(
    conn: sqlite3.Connection,
    run_id: str,
    attempt_id: str,
    *,
    reason: str,
    requested_at_ms: int,
    require_deadline: bool,
    new_id: Callable[[], str] = new_uuid4,
) -> bool:
    """Write a deadline (``timeout``) or shutdown intent (7.2, "Deadlines and shutdown").

    Returns:
        True when an intent with ``reason`` now exists (written here or before); False
        when the attempt is no longer active, another reason is stored, or (deadline) the
        deadline is not due at ``requested_at_ms``.
    """
    with write_transaction(conn):
        snap = load_in(conn, run_id, attempt_id)
        if snap is None or not snap.controllable or snap.run.status == "queued":
            return False
        run = snap.run
        if run.cancel_requested_at_ms is not None:
            return run.cancel_reason == reason
        deadline = snap.attempt.deadline_at_ms
        if require_deadline and (deadline is None or deadline > requested_at_ms):
            return False
        at = at_or_after(requested_at_ms, run, snap.attempt)
        ch = Changes(conn, snap, at, new_id)
        actor = "local-deadline" if require_deadline else "local-shutdown"
        ch.event("run.cancel_requested", f"local-control:{attempt_id}:{reason}:{run.version}", ("reconciler", actor),
                 {"reason": reason, "from_status": run.status, "version": 0})
        ch.commit_rows({"cancel_requested_at_ms": at, "cancel_reason": reason}, {})
        return True


def terminate_in(
    conn: sqlite3.Connection, snap: Snapshot, reason: str, *, now_ms: int, exit_code: int | None,
    new_id: Callable[[], str],
) -> None:
    """:func:`mark_terminal`'s writes, inside the caller's transaction (no checks)."""
    run, attempt = snap.run, snap.attempt
    status, code, summary = terminal_for(reason)
    at = at_or_after(now_ms, run, attempt)
    ch = Changes(conn, snap, at, new_id)
    cs = attempt.callback_sequence
    actor = ("reconciler", "local-execution-control")
    ch.event(f"attempt.{status}", f"local-control:{attempt.id}:{cs}:attempt", actor,
             {"attempt_id": attempt.id, "from_status": attempt.status, "to_status": status, "reason": reason,
              "version": 0})
    ch.event(f"run.{status}", f"local-control:{attempt.id}:{cs}:run", actor,
             {"from_status": run.status, "to_status": status, "reason": reason, "version": 0})
    attempt_changes: dict[str, object] = {
        "status": status, "finished_at_ms": at, "error_code": code, "error_summary": summary,
    }
    if exit_code is not None:
        attempt_changes["exit_code"] = exit_code
    ch.commit_rows({"status": status, "finished_at_ms": at, "error_code": code, "error_summary": summary},
                   attempt_changes)


def mark_terminal(
    conn: sqlite3.Connection,
    expected: Snapshot,
    *,
    reason: str,
    now_ms: int,
    exit_code: int | None = None,
    new_id: Callable[[], str] = new_uuid4,
) -> bool:
    """7.2 step 7: after a conclusive stop (or for a never-launched attempt).

    Aborts (returns whether the Run is terminal anyway) unless the Run and attempt still
    match ``expected``: version >= snapshot, same ``callback_sequence``, ``executor_handle``,
    ``pid`` and reason, still active and latest. ``exit_code`` (our own child's, when we
    reaped it) is stored on the attempt; the events are exactly those of 7.2.
    """
    with write_transaction(conn):
        snap = load_in(conn, expected.run.id, expected.attempt.id)
        if (
            snap is None
            or snap.run.version < expected.run.version
            or not snap.controllable
            or snap.attempt.callback_sequence != expected.attempt.callback_sequence
            or snap.attempt.executor_handle != expected.attempt.executor_handle
            or snap.attempt.pid != expected.attempt.pid
            or snap.run.cancel_requested_at_ms is None
            or snap.run.cancel_reason != reason
        ):
            return snap is not None and snap.run.status in CONTROL_TERMINAL
        terminate_in(conn, snap, reason, now_ms=now_ms, exit_code=exit_code, new_id=new_id)
        return True


#: Reasons of :func:`mark_lost`: (error_code, error_summary).
LOST_REASONS = {
    "process_not_running": (
        "RECOVERY_PROCESS_NOT_RUNNING", "Durable process identity proves the execution is not running",
    ),
    "unstarted_launch": (
        "RECOVERY_UNSTARTED_LAUNCH", "The launch was interrupted before the process was recorded; the job never ran",
    ),
}


def mark_lost(
    conn: sqlite3.Connection,
    expected: Snapshot,
    *,
    why: str,
    actor_id: str,
    now_ms: int,
    new_id: Callable[[], str] = new_uuid4,
) -> bool:
    """Attempt and Run ``lost`` (recovery, after a restart: exit status unknown).

    Only without a cancel intent (with one, the control path terminalises as
    ``cancelled``); ``why`` is a key of :data:`LOST_REASONS`. The Run gets no
    ``finished_at_ms``, like the reference (``lost`` is not terminal for the cancellation
    contract).
    """
    code, summary = LOST_REASONS[why]
    with write_transaction(conn):
        snap = load_in(conn, expected.run.id, expected.attempt.id)
        if (
            snap is None
            or snap.run.version != expected.run.version
            or not snap.controllable
            or snap.run.status == "queued"
            or snap.run.cancel_requested_at_ms is not None
            or snap.attempt != expected.attempt
        ):
            return False
        run, attempt = snap.run, snap.attempt
        at = at_or_after(now_ms, run, attempt)
        ch = Changes(conn, snap, at, new_id)
        actor = ("reconciler", actor_id)
        ch.event("attempt.lost", f"local-recovery:attempt:{attempt.id}:{attempt.callback_sequence}:{why}", actor,
                 {"attempt_id": attempt.id, "from_status": attempt.status, "to_status": "lost", "error_code": code,
                  "version": 0})
        ch.event("run.lost", f"local-recovery:run:{run.id}:{attempt.id}:{run.version}:{why}", actor,
                 {"from_status": run.status, "to_status": "lost", "error_code": code, "version": 0})
        ch.commit_rows({"status": "lost", "error_code": code, "error_summary": summary},
                       {"status": "lost", "finished_at_ms": at, "error_code": code, "error_summary": summary})
        return True


#: The error of an attempt whose launch could not be recorded (storage), and of a Run
#: whose every allowed attempt failed that way.
LAUNCH_STORAGE_UNAVAILABLE = "LAUNCH_STORAGE_UNAVAILABLE"


def requeue_launch(
    conn: sqlite3.Connection,
    run_id: str,
    attempt_id: str,
    *,
    handle: str | None,
    now_ms: int,
    max_attempts: int,
    new_id: Callable[[], str] = new_uuid4,
) -> str:
    """A launch whose durable handle could not be recorded (a storage error) and whose job
    was therefore never released (the start barrier): the Run goes back to ``queued``
    with a new ``claimed`` attempt, so the launcher starts it again (issue 17 item 3).

    The attempt becomes ``failed`` (``LAUNCH_STORAGE_UNAVAILABLE``, event
    ``attempt.failed``), the Run ``queued`` (event ``run.queued`` with the new attempt's
    number), and attempt ``n + 1`` is inserted ``claimed``. When ``n`` is already
    ``max_attempts``, the Run becomes ``failed`` (``LAUNCH_STORAGE_UNAVAILABLE``) instead.
    A Run that got a cancel intent meanwhile is ``cancelled`` (its job never ran).

    Args:
        handle: the handle the launcher failed to record (the write may have committed
            after all, the answer being lost: that handle, or none, is accepted).
        max_attempts: attempts a Run may use on storage failures (>= 1).

    Returns:
        ``requeued``, ``failed``, ``cancelled``, or ``stale`` (the rows moved on: nothing
        written).
    """
    with write_transaction(conn):
        snap = load_in(conn, run_id, attempt_id)
        if (
            snap is None
            or not snap.controllable
            or snap.run.status not in ("dispatching", "running")
            or snap.attempt.status not in ("starting", "running")
            or snap.attempt.executor_handle not in (None, handle)
        ):
            return "stale"
        run, attempt = snap.run, snap.attempt
        if run.cancel_requested_at_ms is not None:
            terminate_in(conn, snap, run.cancel_reason or "user", now_ms=now_ms, exit_code=None, new_id=new_id)
            return "cancelled"
        at = at_or_after(now_ms, run, attempt)
        ch = Changes(conn, snap, at, new_id)
        code, cs, v0 = LAUNCH_STORAGE_UNAVAILABLE, attempt.callback_sequence, run.version
        last = attempt.attempt >= max_attempts
        summary = (f"Storage failed while each of {attempt.attempt} launches was recorded; the job never ran"
                   if last else "Storage failed while the launch was recorded; the job never ran; launched again")
        ch.event("attempt.failed", f"local-execution:attempt:{attempt.id}:{cs}:failed", ("executor", EXECUTOR),
                 {"attempt_id": attempt.id, "from_status": attempt.status, "to_status": "failed",
                  "error_code": code, "version": 0})
        attempt_changes: dict[str, object] = {
            "status": "failed", "finished_at_ms": at, "error_code": code, "error_summary": summary,
        }
        if last:
            ch.event("run.failed", f"local-execution:run:{run.id}:{v0}:failed", ("executor", EXECUTOR),
                     {"from_status": run.status, "to_status": "failed", "error_code": code, "version": 0})
            ch.commit_rows({"status": "failed", "finished_at_ms": at, "error_code": code, "error_summary": summary},
                           attempt_changes)
            return "failed"
        ch.event("run.queued", f"local-execution:run:{run.id}:{v0}:requeued", ("scheduler", "local-execution"),
                 {"from_status": run.status, "to_status": "queued", "attempt": attempt.attempt + 1, "version": 0})
        ch.commit_rows({"status": "queued", "started_at_ms": None}, attempt_changes)
        conn.execute(
            'INSERT INTO "RunAttempts" (id, run_id, attempt, status, executor_type, callback_sequence, created_at_ms)'
            " VALUES (?, ?, ?, 'claimed', ?, 0, ?)",
            (new_id(), run.id, attempt.attempt + 1, EXECUTOR, at),
        )
        return "requeued"
