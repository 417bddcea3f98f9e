"""Queued attempts with real execution revisions for the cluster double (tests, demo).

The revision is built by :func:`qinglong_edge.contracts.execution_revision.normalize_execution_revision`
(canonical key order, ICU environment order), so its ``contentDigest`` is the genuine
digest of offer-delivery.md 2.4 that a worker recomputes.
"""

from __future__ import annotations

import hashlib
from typing import Any

from qinglong_edge.contracts.execution_revision import (
    EXECUTOR_TYPE,
    PLAN_SCHEMA,
    create_secret_ref,
    normalize_execution_revision,
)
from qinglong_edge.contracts.ids import new_uuid4
from tests.support.cluster_state import Candidate, compact, wall_ms

__all__ = ["TASK_KINDS", "build_task"]

TASK_KINDS = ("shell", "python")


def build_task(kind: str, *, project_id: str = "project-1", now_ms: int | None = None,
               placement: dict[str, Any] | None = None) -> Candidate:
    """A queued attempt with a real execution revision (digest computed by the normalizer).

    ``shell``: ``/bin/sh`` runs an ``echo`` with one public variable. ``python``: argv
    ``/usr/bin/python3 -c ...`` in ``/tmp`` with a public and a secret binding given out
    of ICU order (the normalizer sorts them: ``api_key`` before ``API_URL``).
    """
    now = wall_ms() if now_ms is None else now_ms
    if kind == "shell":
        command: dict[str, Any] = {"kind": "shell", "command": 'echo "hello from $GREETING"', "shell": "/bin/sh"}
        environment: list[dict[str, str]] = [{"name": "GREETING", "kind": "public", "value": "qinglong-edge"}]
        extra: dict[str, Any] = {"timeoutMs": 60_000}
    elif kind == "python":
        command = {"kind": "argv", "file": "/usr/bin/python3",
                   "args": ["-c", "import os; print(os.environ['API_URL'])"]}
        environment = [
            {"name": "API_URL", "kind": "public", "value": "https://api.example/v1"},
            {"name": "api_key", "kind": "secret", "secretRef": create_secret_ref(project_id, "api_key", 1)},
        ]
        extra = {"workingDirectory": "/tmp", "timeoutMs": 120_000}
    else:
        raise ValueError(f"unknown task kind {kind!r} (known: {', '.join(TASK_KINDS)})")
    source_digest = hashlib.sha256(compact(command)).hexdigest()
    source = {
        "projectId": project_id,
        "taskId": f"task-{kind}",
        "taskRevision": f"qltd:v1:1:{source_digest}",
        "sourceRevision": 1,
        "sourceContentDigest": source_digest,
        "executorType": EXECUTOR_TYPE,
        "planSchema": PLAN_SCHEMA,
        "command": command,
        "environment": environment,
        **extra,
        "placement": placement if placement is not None else {"required": {"executors": ["remote-worker"]}},
        "createdAtMs": now,
    }
    revision = normalize_execution_revision(source, verify_digest=False)
    candidate = {
        "runId": new_uuid4(),
        "attemptId": new_uuid4(),
        "projectId": project_id,
        "taskId": source["taskId"],
        "taskRevision": revision["taskRevision"],
        "priority": 0,
        "queuedAtMs": now,
        "attemptCreatedAtMs": now,
        "attemptNumber": 1,
        "executorType": EXECUTOR_TYPE,
    }
    return Candidate(candidate, revision)
