"""Launch the next queued Run: claim it, start its process, record its durable handle.

Three steps, each crash-safe:

1. :func:`claim_next`, ONE transaction that re-checks the cancel intent: a queued Run
   with an intent becomes ``cancelled`` without launching (our decision for the gap of
   local-api.md 7.2, spec README); else Run ``queued -> dispatching`` (``run.dispatching``)
   and attempt ``claimed -> starting`` (``attempt.starting``) with ``deadline_at_ms`` =
   claim time + the task's ``timeoutMs`` and a ``log_artifact_id``.
2. :func:`qinglong_edge.process.spawn.start_job`: the job wrapper starts in a new
   session, enters the Run's cgroup and is held at the start barrier; its identity (the
   Run's durable identity) is captured.
3. :func:`record_running`: attempt ``starting -> running`` with ``executor_handle`` and
   ``pid`` (``attempt.running``), Run ``dispatching -> running`` (``run.running``); only
   then is the job released. If an intent arrived since step 1 the wrapper is discarded
   (the job never ran) and the Run is cancelled through
   :func:`~qinglong_edge.execution.transitions.mark_terminal`.

A crash between 1 and 3 leaves an attempt ``starting`` without a handle whose job never
ran (the barrier); restart recovery marks it ``lost`` (``RECOVERY_UNSTARTED_LAUNCH``) or
``cancelled`` if it has an intent. A failure to start or to own the process is
``EXECUTOR_START_FAILED`` (attempt and Run ``failed``).

A **storage error at step 3** (the handle cannot be recorded: disk full, I/O error,
database locked past the busy timeout), or at step 2 when the job wrapper cannot create
the Run's log because its file system is full
(:class:`~qinglong_edge.errors.LogStorageUnavailable`), is transient, not the Run's fault
(issue 17 item 3): the job is discarded unreleased (it never ran) and the launch is
*deferred*: the controller retries :func:`~qinglong_edge.execution.transitions.requeue_launch` each pass
until storage takes it, which puts the Run back to ``queued`` with a new ``claimed``
attempt (the failed one ``LAUNCH_STORAGE_UNAVAILABLE``). The Run is then launched again
after a backoff (``launch_backoff_s`` doubled per attempt, at most 120 s; kept in memory:
:meth:`Launcher.launch_next` skips it until then). After ``launch_attempts`` (default 8,
about four minutes of backoff in all) the Run is ``failed`` with
``LAUNCH_STORAGE_UNAVAILABLE``. A failed *claim* (step 1) changes nothing and is simply
retried at the next pass. A restart before the requeue was written leaves the attempt to
restart recovery (``lost``, as for a crash).

The job's command comes from the Run's task revision (:mod:`qinglong_edge.local.tasks`):
``argv`` (``file`` + ``args``) or ``shell`` (``<shell or /bin/sh> -c <command>``), the
working directory (default: the controller's work directory, ``<stateDirectory>/work``;
also ``HOME``), and the task's environment on top of the minimal base of
:func:`~qinglong_edge.process.spawn.job_environment`. The job wrapper writes the output
into the capped log named after the Run and the attempt
(``<logDirectory>/<runId>_<attemptId>.log``, :mod:`qinglong_edge.local.run_logs`;
``execution.maxLogBytes``, the head kept, then
:data:`~qinglong_edge.process.logs.TRUNCATION_NOTICE`); the exit status is the
wrapper's, reaped by the controller (no receipt file for Local Runs).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import subprocess
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from qinglong_edge.clock import boot_id, boot_ms
from qinglong_edge.contracts.digest import random_hex
from qinglong_edge.contracts.ids import new_uuid4
from qinglong_edge.contracts.strictjson import dumps
from qinglong_edge.errors import EdgeError, ExecutionError, LogStorageUnavailable, StoreError
from qinglong_edge.execution.phases import RUN_TRANSITIONS
from qinglong_edge.execution.transitions import (
    EXECUTOR,
    Changes,
    Snapshot,
    at_or_after,
    load_in,
    load_snapshot,
    mark_terminal,
    requeue_launch,
    terminate_in,
)
from qinglong_edge.local.run_logs import run_log_paths
from qinglong_edge.local.store import Store, write_transaction
from qinglong_edge.local.tasks import resolve_revision_ref
from qinglong_edge.process.cgroups import CgroupManager, RunCgroup
from qinglong_edge.process.identity import ProcessIdentity
from qinglong_edge.process.jobspec import DEFAULT_KILL_GRACE_MS, DEFAULT_TERMINATE_GRACE_MS
from qinglong_edge.process.logs import TRUNCATION_NOTICE
from qinglong_edge.process.spawn import JobSpec, exit_status_unreaped, job_environment, resolve_executable, start_job
from qinglong_edge.process.stop import check_transition

__all__ = [
    "ActiveRun",
    "Claim",
    "LaunchResult",
    "Launcher",
    "claim_next",
    "command_argv",
    "record_running",
    "record_start_failure",
]

_log = logging.getLogger("qinglong_edge.execution")

#: Attempts a Run may use on storage failures at launch, and the first backoff (seconds).
MAX_LAUNCH_ATTEMPTS = 8
LAUNCH_BACKOFF_S = 2.0
MAX_LAUNCH_BACKOFF_S = 120.0


def new_log_artifact_id() -> str:
    """``local-`` + 30 lowercase hex (the reference's log artifact id grammar)."""
    return "local-" + random_hex(15)


def _unowned_start(snap: Snapshot | None) -> Snapshot | None:
    """``snap`` while it is still ours to start: controllable, its attempt ``starting``
    with no executor handle yet; else None (the rows moved on)."""
    if (
        snap is None
        or not snap.controllable
        or snap.attempt.status != "starting"
        or snap.attempt.executor_handle is not None
    ):
        return None
    return snap


def record_running(
    conn: sqlite3.Connection,
    run_id: str,
    attempt_id: str,
    *,
    handle: str,
    pid: int,
    started_at_ms: int,
    new_id: Callable[[], str] = new_uuid4,
) -> str:
    """Record the durable handle: attempt starting -> running, Run dispatching -> running.

    Returns:
        ``running`` (recorded), ``cancel_requested`` (an intent arrived since the claim:
        nothing written; the caller discards the process and calls :func:`mark_terminal`)
        or ``stale`` (the rows are no longer ours to change).
    """
    with write_transaction(conn):
        snap = _unowned_start(load_in(conn, run_id, attempt_id))
        if snap is None or snap.run.status != "dispatching":
            return "stale"
        if snap.run.cancel_requested_at_ms is not None:
            return "cancel_requested"
        at = at_or_after(started_at_ms, snap.run, snap.attempt)
        ch = Changes(conn, snap, at, new_id)
        cs = snap.attempt.callback_sequence
        ch.event("attempt.running", f"local-execution:attempt:{attempt_id}:{cs}:running", ("executor", EXECUTOR),
                 {"attempt_id": attempt_id, "from_status": "starting", "to_status": "running", "pid": pid,
                  "version": 0})
        ch.event("run.running", f"local-execution:run:{run_id}:{snap.run.version}:running", ("executor", EXECUTOR),
                 {"from_status": "dispatching", "to_status": "running", "version": 0})
        ch.commit_rows(
            {"status": "running", "started_at_ms": at},
            {"status": "running", "executor_handle": handle, "pid": pid, "started_at_ms": at},
        )
        return "running"


def fail_start_in(
    conn: sqlite3.Connection, snap: Snapshot, summary: str, now_ms: int, new_id: Callable[[], str]
) -> None:
    """Attempt and Run ``failed`` with ``EXECUTOR_START_FAILED`` inside the caller's transaction."""
    at = at_or_after(now_ms, snap.run, snap.attempt)
    ch = Changes(conn, snap, at, new_id)
    run_id, attempt_id = snap.run.id, snap.attempt.id
    cs, v0, code = snap.attempt.callback_sequence, snap.run.version, "EXECUTOR_START_FAILED"
    ch.event("attempt.failed", f"local-execution:attempt:{attempt_id}:{cs}:failed", ("executor", EXECUTOR),
             {"attempt_id": attempt_id, "from_status": snap.attempt.status, "to_status": "failed",
              "error_code": code, "version": 0})
    ch.event("run.failed", f"local-execution:run:{run_id}:{v0}:failed", ("executor", EXECUTOR),
             {"from_status": snap.run.status, "to_status": "failed", "error_code": code, "version": 0})
    ch.commit_rows(
        {"status": "failed", "finished_at_ms": at, "error_code": code, "error_summary": summary},
        {"status": "failed", "finished_at_ms": at, "error_code": code, "error_summary": summary},
    )


def record_start_failure(
    conn: sqlite3.Connection,
    run_id: str,
    attempt_id: str,
    *,
    summary: str,
    now_ms: int,
    new_id: Callable[[], str] = new_uuid4,
) -> bool:
    """The process could not be started or owned: attempt and Run ``failed``
    (``EXECUTOR_START_FAILED``). False when the rows moved on meanwhile."""
    with write_transaction(conn):
        snap = _unowned_start(load_in(conn, run_id, attempt_id))
        if snap is None:
            return False
        fail_start_in(conn, snap, summary, now_ms, new_id)
        return True


@dataclass(frozen=True, slots=True)
class Claim:
    """What :func:`claim_next` did with the next queued attempt.

    ``outcome``: ``launch`` (now ``starting``: start ``definition``), ``cancelled`` (it had a
    cancel intent: terminal without launching) or ``failed`` (its task revision is missing
    or altered: ``EXECUTOR_START_FAILED``).
    """

    outcome: str
    run_id: str
    attempt_id: str
    definition: dict[str, Any] | None = None
    deadline_at_ms: int | None = None
    log_artifact_id: str | None = None
    deadline_boot_ms: int | None = None


def claim_next(
    conn: sqlite3.Connection,
    *,
    now_ms: int,
    log_artifact_id: str,
    new_id: Callable[[], str] = new_uuid4,
    exclude: Collection[str] = (),
    boot_ms: int | None = None,
    boot_id: str | None = None,
) -> Claim | None:
    """Claim the next queued attempt in ONE transaction that re-checks the cancel intent.

    Order: Run ``priority`` descending, ``queued_at_ms``, attempt ``created_at_ms``, id;
    Runs in ``exclude`` (a launch backoff not yet over) are skipped.
    A Run with an intent becomes ``cancelled`` here (:func:`mark_terminal`'s events);
    otherwise the Run goes ``queued -> dispatching`` and the attempt ``claimed ->
    starting`` with ``deadline_at_ms = at + timeoutMs`` and ``log_artifact_id``; with
    ``boot_ms``/``boot_id``, also ``deadline_boot_ms = boot_ms + timeoutMs`` of that boot
    (the timer; ``deadline_at_ms`` is for display, spec README "Decisions for clocks").
    """
    with write_transaction(conn):
        row = conn.execute(
            """
            SELECT r.id, a.id FROM "Runs" AS r JOIN "RunAttempts" AS a ON a.run_id = r.id
            WHERE r.execution_owner = 'runtime' AND r.status = 'queued'
              AND a.status = 'claimed' AND a.executor_type = 'local_process'
              AND NOT EXISTS (SELECT 1 FROM "RunAttempts" AS b WHERE b.run_id = r.id AND b.attempt > a.attempt)
              AND r.id NOT IN (SELECT value FROM json_each(?))
            ORDER BY r.priority DESC, r.queued_at_ms, a.created_at_ms, a.id LIMIT 1
            """,
            (dumps(sorted(exclude)),),
        ).fetchone()
        if row is None:
            return None
        snap = load_in(conn, row[0], row[1])
        if snap is None or not snap.controllable:
            return None
        run, attempt = snap.run, snap.attempt
        if run.cancel_requested_at_ms is not None:
            terminate_in(conn, snap, run.cancel_reason or "user", now_ms=now_ms, exit_code=None, new_id=new_id)
            return Claim("cancelled", run.id, attempt.id)
        try:
            definition = resolve_revision_ref(conn, run.project_id, run.task_id, run.task_revision).definition
        except StoreError:
            fail_start_in(conn, snap, "Task definition is missing or altered", now_ms, new_id)
            return Claim("failed", run.id, attempt.id)
        at = at_or_after(now_ms, run, attempt)
        timeout = definition.get("timeoutMs")
        deadline = at + timeout if isinstance(timeout, int) else None
        boot_deadline = boot_ms + timeout if isinstance(timeout, int) and boot_ms is not None and boot_id else None
        ch = Changes(conn, snap, at, new_id)
        ch.event("run.dispatching", f"local-execution:run:{run.id}:{run.version}:dispatching",
                 ("scheduler", "local-execution"), {"from_status": "queued", "to_status": "dispatching", "version": 0})
        payload: dict[str, Any] = {"attempt_id": attempt.id, "from_status": "claimed", "to_status": "starting",
                                   "version": 0}
        if deadline is not None:
            payload["deadline_at_ms"] = deadline
        ch.event("attempt.starting", f"local-execution:attempt:{attempt.id}:{attempt.callback_sequence}:starting",
                 ("worker", EXECUTOR), payload)
        ch.commit_rows(
            {"status": "dispatching"},
            {"status": "starting", "deadline_at_ms": deadline, "log_artifact_id": log_artifact_id,
             "deadline_boot_ms": boot_deadline, "deadline_boot_id": boot_id if boot_deadline is not None else None},
        )
        return Claim("launch", run.id, attempt.id, definition, deadline, log_artifact_id, boot_deadline)


def command_argv(definition: dict[str, Any]) -> list[str]:
    """The argv of a normalized task definition (``argv`` or ``shell`` command)."""
    command = definition["command"]
    if command["kind"] == "argv":
        return [command["file"], *command.get("args", [])]
    return [command.get("shell", "/bin/sh"), "-c", command["command"]]


@dataclass
class ActiveRun:
    """A Run whose process we launched (``process`` set: our child) or adopted after a
    restart (``process`` is ``None``: not our child, its exit status is unknowable).

    Attributes:
        exited_at_ms: wall clock when we first saw the leader exit (our child only).
        phase: ``running``, ``stopping``, ``completing``, ``reconciling`` or ``finished``
            (:data:`qinglong_edge.execution.phases.RUN_TRANSITIONS`; moved by :meth:`move`).
    """

    run_id: str
    attempt_id: str
    handle: str
    identity: ProcessIdentity
    process: subprocess.Popen[bytes] | None
    cgroup: RunCgroup | None
    deadline_at_ms: int | None
    pidfd: int = -1
    exited_at_ms: int | None = None
    retry_at: float = 0.0
    #: The deadline on the boot clock (this boot), the controller's timer; None without one.
    deadline_boot_ms: int | None = None
    phase: str = "running"

    def move(self, phase: str) -> None:
        """Enter ``phase``.

        Raises:
            ExecutionError: ``invalid_phase`` when :data:`RUN_TRANSITIONS
                <qinglong_edge.execution.phases.RUN_TRANSITIONS>` has no such move (a bug).
        """
        check_transition(RUN_TRANSITIONS, f"run {self.run_id}", self.phase, phase)
        self.phase = phase

    def exit_code(self) -> int | None:
        """The leader's exit code if it has exited, without reaping it (``WNOWAIT``).

        A zombie leader keeps its pid and group number pinned, so the group can still be
        checked and signalled safely. Death by signal N is reported as 128 + N. Always
        ``None`` for an adopted process.
        """
        return exit_status_unreaped(self.process)

    def reap(self) -> None:
        """Reap our child (after its stop or completion is recorded)."""
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                self.process.wait(timeout=5)

    def close(self) -> None:
        if self.pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = -1


def open_pidfd(pid: int) -> int:
    """A pidfd (readable once the process exits), or -1 where unavailable/gone."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1


@dataclass(frozen=True, slots=True)
class LaunchResult:
    """``outcome``: ``running`` (``active`` set), ``cancelled``, ``failed``, ``deferred`` (a
    storage error: the Run is put back to ``queued`` once storage works) or ``stale``."""

    outcome: str
    run_id: str
    attempt_id: str
    active: ActiveRun | None = None


class Launcher:
    """Claims and starts queued Runs (module docstring). Used by the controller thread.

    Args:
        store: the Local store.
        cgroups: where per-Run cgroups are created (may be unavailable).
        log_directory: existing directory for ``<runId>_<attemptId>.log``.
        max_log_bytes: cap of each log file.
        work_directory: default working directory and ``HOME`` of jobs.
        clock: wall clock in ms.
        launch_attempts: attempts a Run may use on storage failures (module docstring).
        launch_backoff_s: backoff before the second attempt, doubled for each later one
            (at most :data:`MAX_LAUNCH_BACKOFF_S`).
        terminate_grace_ms, kill_grace_ms: the stop's graces, also given to each job's
            wrapper for the descendants it ends (``JobSpec``).
    """

    def __init__(
        self,
        store: Store,
        *,
        cgroups: CgroupManager,
        log_directory: str,
        max_log_bytes: int,
        work_directory: str,
        clock: Callable[[], int],
        new_id: Callable[[], str] = new_uuid4,
        launch_attempts: int = MAX_LAUNCH_ATTEMPTS,
        launch_backoff_s: float = LAUNCH_BACKOFF_S,
        terminate_grace_ms: int = DEFAULT_TERMINATE_GRACE_MS,
        kill_grace_ms: int = DEFAULT_KILL_GRACE_MS,
    ) -> None:
        self.store = store
        self.cgroups = cgroups
        self.log_directory = log_directory
        self.max_log_bytes = max_log_bytes
        self.work_directory = work_directory
        self.clock = clock
        self.new_id = new_id
        #: Launch failures not yet recorded (the store failed): (run id, attempt id, summary).
        self.unrecorded: set[tuple[str, str, str]] = set()
        self.launch_attempts = max(1, launch_attempts)
        self.launch_backoff_s = launch_backoff_s
        self.terminate_grace_ms = terminate_grace_ms
        self.kill_grace_ms = kill_grace_ms
        #: Launches whose handle could not be recorded (or whose log could not be created:
        #: no handle), not yet requeued: attempt id -> (run id, the unrecorded handle).
        self.deferred: dict[str, tuple[str, str | None]] = {}
        #: Runs requeued after a storage failure: run id -> monotonic time of the next launch.
        self.not_before: dict[str, float] = {}

    def retry_unrecorded(self) -> None:
        """Record launch failures that could not be written before (store back up)."""
        for run_id, attempt_id, summary in sorted(self.unrecorded):
            try:
                self.store.run(lambda c, r=run_id, a=attempt_id, m=summary: record_start_failure(  # type: ignore[misc]
                    c, r, a, summary=m, now_ms=self.clock(), new_id=self.new_id))
            except StoreError:
                return
            self.unrecorded.discard((run_id, attempt_id, summary))

    def retry_deferred(self) -> None:
        """Requeue the launches whose handle could not be recorded (module docstring),
        as far as storage takes it now; the rest stay deferred for the next pass."""
        for attempt_id, (run_id, handle) in sorted(self.deferred.items()):
            try:
                outcome, number = self.store.run(lambda c, r=run_id, a=attempt_id, h=handle: (  # type: ignore[misc]
                    requeue_launch(c, r, a, handle=h, now_ms=self.clock(), max_attempts=self.launch_attempts,
                                   new_id=self.new_id),
                    c.execute('SELECT attempt FROM "RunAttempts" WHERE id = ?', (a,)).fetchone(),
                ))
            except StoreError:
                return
            del self.deferred[attempt_id]
            if outcome == "requeued":
                attempt = int(number[0]) if number else 1
                delay = min(MAX_LAUNCH_BACKOFF_S, self.launch_backoff_s * 2 ** (attempt - 1))
                self.not_before[run_id] = time.monotonic() + delay
                _log.warning("run %s: launched again as attempt %d in %.1f s", run_id, attempt + 1, delay)
            elif outcome == "failed":
                _log.warning("run %s: failed: storage failed at each of its %d launches (%s)", run_id,
                             self.launch_attempts, "LAUNCH_STORAGE_UNAVAILABLE")
            else:
                _log.info("run %s: deferred launch not requeued (%s)", run_id, outcome)

    def launch_next(self) -> LaunchResult | None:
        """Claim and start the next queued attempt; ``None`` when nothing is queued (or
        only Runs whose launch backoff is not over).

        Raises:
            StoreError: the claim transaction failed (nothing changed).
        """
        now = self.clock()
        moment = time.monotonic()
        for run_id in [r for r, due in self.not_before.items() if due <= moment]:
            del self.not_before[run_id]
        waiting = frozenset(self.not_before)
        boot_now, boot = boot_ms(), boot_id()
        claim = self.store.run(lambda c: claim_next(c, now_ms=now, log_artifact_id=new_log_artifact_id(),
                                                    new_id=self.new_id, exclude=waiting, boot_ms=boot_now,
                                                    boot_id=boot))
        if claim is None:
            return None
        if claim.outcome != "launch":
            _log.info("run %s: %s without launching", claim.run_id, claim.outcome)
            return LaunchResult(claim.outcome, claim.run_id, claim.attempt_id)
        return self._start(claim)

    def _fail(self, claim: Claim, summary: str) -> LaunchResult:
        _log.warning("run %s: launch failed: %s", claim.run_id, summary)
        try:
            self.store.run(lambda c: record_start_failure(c, claim.run_id, claim.attempt_id, summary=summary,
                                                          now_ms=self.clock(), new_id=self.new_id))
        except StoreError:
            _log.warning("run %s: the launch failure could not be recorded yet", claim.run_id)
            self.unrecorded.add((claim.run_id, claim.attempt_id, summary))
        return LaunchResult("failed", claim.run_id, claim.attempt_id)

    def _start(self, claim: Claim) -> LaunchResult:
        if claim.definition is None or claim.log_artifact_id is None:
            raise ExecutionError("a launch claim without a definition", code="invalid_input")
        definition = claim.definition
        cwd = definition.get("workingDirectory", self.work_directory)
        env = job_environment(
            {e["name"]: e["value"] for e in definition.get("environment", [])},
            run_id=claim.run_id, attempt_id=claim.attempt_id, home=cwd,
        )
        cgroup: RunCgroup | None = None
        try:
            log_path = run_log_paths(self.log_directory, claim.run_id, claim.attempt_id)[0]
            argv = command_argv(definition)
            argv[0] = resolve_executable(argv[0], env, cwd)
            cgroup = self.cgroups.create(claim.attempt_id)
            spawned = start_job(JobSpec(argv, env, cwd, log_path, self.max_log_bytes, log_notice=TRUNCATION_NOTICE,
                                        terminate_grace_ms=self.terminate_grace_ms, kill_grace_ms=self.kill_grace_ms,
                                        label=claim.attempt_id), cgroup=cgroup)
        except ExecutionError as exc:
            if cgroup is not None:
                cgroup.remove()
            if isinstance(exc, LogStorageUnavailable):
                # The log's file system is full: storage, not the Run's fault; nothing
                # was started (the wrapper refused before its barrier). Requeued as below.
                _log.warning("run %s: the launch could not be prepared (%s); its job never ran; it is launched "
                             "again once storage works", claim.run_id, exc.message)
                self.deferred[claim.attempt_id] = (claim.run_id, None)
                return LaunchResult("deferred", claim.run_id, claim.attempt_id)
            return self._fail(claim, _START_FAILURES.get(exc.code, "Local process failed to start"))
        active = ActiveRun(
            claim.run_id, claim.attempt_id, spawned.handle, spawned.identity, spawned.process, cgroup,
            claim.deadline_at_ms, pidfd=open_pidfd(spawned.pid), deadline_boot_ms=claim.deadline_boot_ms,
        )
        try:
            outcome = self.store.run(lambda c: record_running(
                c, claim.run_id, claim.attempt_id, handle=spawned.handle, pid=spawned.pid,
                started_at_ms=spawned.started_at_ms, new_id=self.new_id,
            ))
        except EdgeError:
            outcome = "unrecorded"
        if outcome == "running":
            with contextlib.suppress(ExecutionError):
                spawned.release()  # if the wrapper died (exit 125), the completion path records it
            _log.info("run %s: attempt %s running as pid %d", claim.run_id, claim.attempt_id, spawned.pid)
            return LaunchResult("running", claim.run_id, claim.attempt_id, active)
        # Never release: the job has not run and never will.
        spawned.abort()
        active.close()
        if cgroup is not None:
            cgroup.remove()
        if outcome == "cancel_requested":
            return self._cancel_unstarted(claim)
        if outcome == "unrecorded":
            # A storage error, not the Run's fault: the job never ran (never released).
            _log.warning("run %s: the launch could not be recorded (storage); its job never ran; it is "
                         "launched again once storage works", claim.run_id)
            self.deferred[claim.attempt_id] = (claim.run_id, spawned.handle)
            return LaunchResult("deferred", claim.run_id, claim.attempt_id)
        return LaunchResult("stale", claim.run_id, claim.attempt_id)

    def _cancel_unstarted(self, claim: Claim) -> LaunchResult:
        snap = self.store.run(lambda c: load_snapshot(c, claim.run_id, claim.attempt_id))
        reason = snap.run.cancel_reason if snap is not None else None
        if snap is None or reason is None:
            return LaunchResult("stale", claim.run_id, claim.attempt_id)
        self.store.run(lambda c: mark_terminal(c, snap, reason=reason, now_ms=self.clock(), new_id=self.new_id))
        _log.info("run %s: cancelled before its job started", claim.run_id)
        return LaunchResult("cancelled", claim.run_id, claim.attempt_id)


_START_FAILURES = {
    "command_not_found": "The command is not an executable file",
    "spawn_failed": "Local process failed to start (working directory or exec error)",
    "identity_unavailable": "Local process failed before durable ownership was established",
    "cgroup_unavailable": "The Run's cgroup could not be created",
    "log_unavailable": "The Run's log could not be created",
}
