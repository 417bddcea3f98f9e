"""Run histories for the storage-cap tests: real transactions, real log files.

Each Run goes through the transactions the API and the controller use (task.start,
the launch claim, record_running, record_completion, or the cancellation of a queued
Run), with the clock the test chooses, so ages and order are exact. Its output is
written to the file the launcher names (``<runId>_<attemptId>.log``); no process runs
(the process side is tested in tests/execution), so thousands of Runs take seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from dataclasses import dataclass
from typing import Any

from qinglong_edge.contracts.ids import new_uuid4
from qinglong_edge.execution.launcher import claim_next, new_log_artifact_id, record_running
from qinglong_edge.execution.transitions import record_completion
from qinglong_edge.local.audit import AuditRecord, record_audit
from qinglong_edge.local.identity import Subject, create_subject
from qinglong_edge.local.policy import PolicyFence, grant_role
from qinglong_edge.local.run_logs import run_log_paths
from qinglong_edge.local.runs import CancellationCommand, new_task_start_command, request_cancellation, start_task
from qinglong_edge.local.store import Store, write_transaction
from qinglong_edge.local.tasks import create_task
from qinglong_edge.process.identity import capture, encode_handle

OPERATOR = Subject("user", "operator-1")
FENCE = PolicyFence(project_version=1, binding_version=1)
T0 = 1_800_000_000_000
DAY = 86_400_000


@dataclass
class History:
    """A store with one operator and one task, and a log directory."""

    store: Store
    log_directory: str
    digest: str = ""
    handle: str = ""

    @classmethod
    def create(cls, root: str, *, profile: str = "edge") -> History:
        store = Store.open(os.path.join(root, "local.db"), profile=profile)
        logs = os.path.join(root, "logs")
        os.makedirs(logs, mode=0o700, exist_ok=True)
        store.run(lambda c: create_subject(c, OPERATOR, T0 - DAY * 400))
        store.run(lambda c: grant_role(c, "default", OPERATOR, "operator", mutation_id="grant-1",
                                       changed_by=OPERATOR, now_ms=T0 - DAY * 400))
        result = store.run(lambda c: create_task(
            c, project_id="default", task_id="job", name="job",
            definition={"command": {"kind": "shell", "command": "echo hi"}},
            mutation_id=new_uuid4(), created_by=OPERATOR, now_ms=T0 - DAY * 400,
        ))
        identity = capture(os.getpid())
        assert identity is not None
        return cls(store, logs, result.task.current.content_digest, encode_handle("history", identity))

    def _start(self, at_ms: int) -> tuple[str, str]:
        command = new_task_start_command(
            project_id="default", task_id="job", mutation_id=new_uuid4(), expected_revision=1,
            expected_content_digest=self.digest, subject=OPERATOR, policy_fence=FENCE,
        )
        outcome = self.store.run(lambda c: start_task(c, command, now_ms=at_ms))
        return outcome.run_id, outcome.attempt_id

    def queued(self, at_ms: int) -> tuple[str, str]:
        """A Run left ``queued`` (not terminal)."""
        return self._start(at_ms)

    def running(self, at_ms: int, output: bytes = b"") -> tuple[str, str]:
        """A Run left ``running`` with its log file (not terminal)."""
        run_id, attempt_id = self._start(at_ms)
        claim = self.store.run(lambda c: claim_next(c, now_ms=at_ms, log_artifact_id=new_log_artifact_id(),
                                                    exclude=self._other_queued(c, run_id)))
        assert claim is not None and claim.run_id == run_id
        self._write_log(run_id, attempt_id, output)
        assert self.store.run(lambda c: record_running(c, run_id, attempt_id, handle=self.handle, pid=os.getpid(),
                                                       started_at_ms=at_ms)) == "running"
        return run_id, attempt_id

    def finished(self, at_ms: int, output: bytes = b"output\n", *, ended_ms: int | None = None,
                 exit_code: int = 0) -> tuple[str, str]:
        """A Run that ran and ended (``succeeded``, or ``failed`` with another exit code)."""
        run_id, attempt_id = self.running(at_ms, output)
        end = at_ms + 1000 if ended_ms is None else ended_ms
        assert self.store.run(lambda c: record_completion(c, run_id, attempt_id, exit_code=exit_code,
                                                          finished_at_ms=end, now_ms=end)) is not None
        return run_id, attempt_id

    @staticmethod
    def _other_queued(conn: sqlite3.Connection, run_id: str) -> list[str]:
        """Queued Runs other than ``run_id``: claim_next launches the oldest queued Run
        first, and a Run may be left queued on purpose (``queued()``) or by a fault (a
        full disk after its task.start committed); the helper launches its own."""
        return [str(r[0]) for r in conn.execute(
            'SELECT id FROM "Runs" WHERE status = ? AND id <> ?', ("queued", run_id)).fetchall()]

    def cancelled_before_launch(self, at_ms: int) -> tuple[str, str]:
        """A queued Run cancelled before it launched (terminal, no log)."""
        run_id, attempt_id = self._start(at_ms)
        command = CancellationCommand("default", run_id, new_uuid4(), new_uuid4(), OPERATOR, FENCE)
        self.store.run(lambda c: request_cancellation(c, command, now_ms=at_ms))
        claim = self.store.run(lambda c: claim_next(c, now_ms=at_ms, log_artifact_id=new_log_artifact_id(),
                                                    exclude=self._other_queued(c, run_id)))
        assert claim is not None and claim.outcome == "cancelled"
        return run_id, attempt_id

    def _write_log(self, run_id: str, attempt_id: str, output: bytes) -> str:
        path = run_log_paths(self.log_directory, run_id, attempt_id)[0]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, output)
        finally:
            os.close(fd)
        return path

    def log_path(self, run_id: str, attempt_id: str) -> str:
        return run_log_paths(self.log_directory, run_id, attempt_id)[0]

    def audit(self, at_ms: int, count: int = 1) -> None:
        """``count`` audit rows at ``at_ms``: the first through the real sink, the rest as
        the same rows in one transaction (thousands would otherwise take one fsync each)."""
        record = AuditRecord(new_uuid4(), f"local:{new_uuid4()}", "run.get", "default", OPERATOR,
                             "local_credential:cred:1", "allowed", ("role_grant",), FENCE, at_ms)
        self.store.run(lambda c: record_audit(c, record))

        def more(c: sqlite3.Connection) -> None:
            with write_transaction(c):
                c.executemany(
                    'INSERT INTO "QingLong3SecurityAuditEvents" (event_id, request_id, operation_id, project_id,'
                    " subject_type, subject_id, authentication_id, outcome, reasons_json, fence_project_version,"
                    " fence_binding_version, occurred_at_ms)"
                    " SELECT ?, ?, operation_id, project_id, subject_type,"
                    " subject_id, authentication_id, outcome, reasons_json, fence_project_version,"
                    ' fence_binding_version, occurred_at_ms FROM "QingLong3SecurityAuditEvents" WHERE event_id = ?',
                    [(new_uuid4(), f"local:{new_uuid4()}", record.event_id) for _ in range(count - 1)],
                )
        if count > 1:
            self.store.run(more)

    # -- reading back -------------------------------------------------------------------

    def run_ids(self) -> list[str]:
        return [str(r[0]) for r in self.store.run(lambda c: c.execute('SELECT id FROM "Runs" ORDER BY rowid').fetchall())]

    def rows_of(self, run_id: str) -> dict[str, int]:
        """How many rows each table holds for ``run_id``."""
        def count(c: sqlite3.Connection) -> dict[str, int]:
            return {
                table: int(c.execute(f'SELECT count(*) FROM "{table}" WHERE {column} = ?',  # noqa: S608
                                     (run_id,)).fetchone()[0])
                for table, column in (("Runs", "id"), ("RunAttempts", "run_id"), ("RunEvents", "run_id"),
                                      ("StepRuns", "run_id"), ("StepRunMutations", "run_id"))
            }
        return self.store.run(count)

    def checks(self) -> tuple[list[Any], list[Any]]:
        """``(PRAGMA integrity_check, PRAGMA foreign_key_check)`` rows."""
        return self.store.run(lambda c: (c.execute("PRAGMA integrity_check").fetchall(),
                                         c.execute("PRAGMA foreign_key_check").fetchall()))

    def log_names(self) -> set[str]:
        return set(os.listdir(self.log_directory))


def insert_step_runs(conn: sqlite3.Connection, run_id: str, *, now_ms: int) -> None:
    """A parent step run, a child step run and one mutation (StepRuns, local-api.md 5.8):
    nothing in the agent writes them yet, but pruning a Run must remove them."""
    event_id = new_uuid4()
    with write_transaction(conn):
        sequence = int(conn.execute('SELECT event_sequence FROM "Runs" WHERE id = ?', (run_id,)).fetchone()[0]) + 1
        conn.execute('UPDATE "Runs" SET event_sequence = ?, version = version + 1 WHERE id = ?', (sequence, run_id))
        conn.execute(
            'INSERT INTO "RunEvents" (id, run_id, sequence, type, actor_type, payload, created_at_ms)'
            " VALUES (?, ?, ?, 'step.ready', 'system', '{}', ?)", (event_id, run_id, sequence, now_ms))
        for step_id, parent in ((f"{run_id}-s1", None), (f"{run_id}-s2", f"{run_id}-s1")):
            mirror = {
                "schema": "qinglong/step-run@v1", "id": step_id, "runId": run_id, "parentStepRunId": parent,
                "stepKey": step_id[-2:], "kind": "task", "definitionRef": "def", "definitionDigest": "a" * 64,
                "required": 1, "status": "succeeded", "version": 1, "attemptCount": 1, "inputRef": None,
                "outputRef": None, "approvalRequestId": None, "readyAtMs": now_ms, "startedAtMs": now_ms,
                "finishedAtMs": now_ms, "resultCode": None, "errorSummary": None, "createdAtMs": now_ms,
                "updatedAtMs": now_ms, "lastMutationId": f"m-{step_id}", "stepRunDigest": "b" * 64,
            }
            conn.execute(
                'INSERT INTO "StepRuns" (id, run_id, parent_step_run_id, step_key, kind, definition_ref,'
                " definition_digest, required, status, version, attempt_count, ready_at_ms, started_at_ms,"
                " finished_at_ms, created_at_ms, updated_at_ms, last_mutation_id, step_run_digest, step_run_json)"
                " VALUES (?, ?, ?, ?, 'task', 'def', ?, 1, 'succeeded', 1, 1, ?, ?, ?, ?, ?, ?, ?, ?)",
                (step_id, run_id, parent, step_id[-2:], "a" * 64, now_ms, now_ms, now_ms, now_ms, now_ms,
                 f"m-{step_id}", "b" * 64, json.dumps(mirror)),
            )
        conn.execute(
            'INSERT INTO "StepRunMutations" (mutation_id, mutation_digest, run_id, step_run_id, step_run_digest,'
            " event_id, event_sequence, run_version, step_run_json, committed_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, ?)",
            (f"m-{run_id}-s2", hashlib.sha256(run_id.encode()).hexdigest(), run_id, f"{run_id}-s2", "b" * 64, event_id,
             sequence, json.dumps({"schema": "qinglong/step-run@v1", "id": f"{run_id}-s2", "runId": run_id,
                                   "lastMutationId": f"m-{run_id}-s2", "stepRunDigest": "b" * 64}), now_ms),
        )
