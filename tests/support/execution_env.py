"""A real Local store with a project, an operator and tasks, plus a running controller.

Runs are created with the real ``task.start`` transaction and cancelled with the real
cancellation transaction (local-api.md 6 and 9.5), exactly as the HTTP routes do.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from qinglong_edge.config import ExecutionConfig
from qinglong_edge.contracts.ids import new_uuid4
from qinglong_edge.execution.controller import ExecutionController
from qinglong_edge.local.identity import Subject, create_subject
from qinglong_edge.local.policy import PolicyFence, grant_role
from qinglong_edge.local.runs import CancellationCommand, new_task_start_command, request_cancellation, start_task
from qinglong_edge.local.store import Store
from qinglong_edge.local.tasks import create_task
from qinglong_edge.process.cgroups import CgroupManager
from tests.support.wait import wait_until

OPERATOR = Subject("user", "operator-1")
FENCE = PolicyFence(project_version=1, binding_version=1)


@dataclass
class Env:
    store: Store
    root: str
    log_directory: str

    def task(self, task_id: str, script: str, *, timeout_ms: int | None = None,
             environment: dict[str, str] | None = None, cwd: str | None = None) -> None:
        definition: dict[str, Any] = {"command": {"kind": "shell", "command": script}}
        if timeout_ms is not None:
            definition["timeoutMs"] = timeout_ms
        if environment:
            definition["environment"] = [{"name": k, "value": v} for k, v in environment.items()]
        if cwd is not None:
            definition["workingDirectory"] = cwd
        self.store.run(lambda c: create_task(
            c, project_id="default", task_id=task_id, name=task_id, definition=definition,
            mutation_id=new_uuid4(), created_by=OPERATOR, now_ms=int(time.time() * 1000),
        ))

    def start(self, task_id: str) -> tuple[str, str]:
        """task.start: a queued Run; returns (run_id, attempt_id)."""
        row = self.store.run(lambda c: c.execute(
            'SELECT current_revision, r.content_digest FROM "QingLongEdgeTasks" t JOIN "QingLongEdgeTaskRevisions" r'
            " ON r.project_id = t.project_id AND r.task_id = t.id AND r.revision = t.current_revision"
            " WHERE t.project_id = 'default' AND t.id = ?", (task_id,)).fetchone())
        command = new_task_start_command(
            project_id="default", task_id=task_id, mutation_id=new_uuid4(), expected_revision=row[0],
            expected_content_digest=row[1], subject=OPERATOR, policy_fence=FENCE,
        )
        outcome = self.store.run(lambda c: start_task(c, command))
        return outcome.run_id, outcome.attempt_id

    def cancel(self, run_id: str, mutation_id: str = "cancel-1") -> str:
        command = CancellationCommand("default", run_id, mutation_id, new_uuid4(), OPERATOR, FENCE)
        return self.store.run(lambda c: request_cancellation(c, command)).status

    def run_row(self, run_id: str) -> dict[str, Any]:
        return self._row('SELECT * FROM "Runs" WHERE id = ?', run_id)

    def attempt_row(self, attempt_id: str) -> dict[str, Any]:
        return self._row('SELECT * FROM "RunAttempts" WHERE id = ?', attempt_id)

    def _row(self, sql: str, key: str) -> dict[str, Any]:
        def read(c: Any) -> dict[str, Any]:
            cur = c.execute(sql, (key,))
            names = [d[0] for d in cur.description]
            row = cur.fetchone()
            return dict(zip(names, row, strict=True)) if row else {}
        return self.store.run(read)

    def events(self, run_id: str) -> list[dict[str, Any]]:
        rows = self.store.run(lambda c: c.execute(
            'SELECT sequence, type, dedupe_key, actor_type, actor_id, attempt_id, payload, created_at_ms'
            ' FROM "RunEvents" WHERE run_id = ? ORDER BY sequence', (run_id,)).fetchall())
        return [
            {"sequence": r[0], "type": r[1], "dedupe_key": r[2], "actor": (r[3], r[4]), "attempt_id": r[5],
             "payload": json.loads(r[6]), "payload_text": r[6], "created_at_ms": r[7]}
            for r in rows
        ]

    def status(self, run_id: str) -> str:
        return str(self.run_row(run_id)["status"])

    def wait_status(self, run_id: str, statuses: set[str] | str, timeout: float = 10.0) -> str:
        """The Run's status once it is one of ``statuses``, or its status when ``timeout`` passes."""
        wanted = {statuses} if isinstance(statuses, str) else statuses

        def matching() -> str | None:
            status = self.status(run_id)
            return status if status in wanted else None

        return wait_until(matching, timeout) or self.status(run_id)

    def config(self, **overrides: Any) -> ExecutionConfig:
        values: dict[str, Any] = {
            "max_concurrent_runs": 2, "terminate_grace_ms": 300, "kill_grace_ms": 300,
            "control_interval_ms": 250, "log_directory": self.log_directory, "max_log_bytes": 1024 * 1024,
            "cgroups": "auto",
        }
        values.update(overrides)
        return ExecutionConfig(**values)

    @contextmanager
    def controller(self, cgroups: CgroupManager | None = None, *, launch: dict[str, Any] | None = None,
                   **overrides: Any) -> Iterator[ExecutionController]:
        """A started controller; ``launch``: its ``launch_attempts`` / ``launch_backoff_s``."""
        controller = ExecutionController(self.store, self.config(**overrides), cgroups=cgroups,
                                         work_directory=self.root, **(launch or {}))
        controller.start()
        assert controller.wait_ready(10)
        try:
            yield controller
        finally:
            controller.stop(15)


def make_env(root: str) -> Env:
    store = Store.open(os.path.join(root, "local.db"))
    now = int(time.time() * 1000)
    store.run(lambda c: create_subject(c, OPERATOR, now))
    store.run(lambda c: grant_role(c, "default", OPERATOR, "operator", mutation_id="grant-1", changed_by=OPERATOR,
                                   now_ms=now))
    logs = os.path.join(root, "logs")
    return Env(store, root, logs)
