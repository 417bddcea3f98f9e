"""Local store fixtures: the spec's credential vector provisioned into a real SQLite file.

local-api.md sections 3.2 and 10: credential ``local-api-owner`` v1, secret 32 x 0x51,
pepper key ``local-api-pepper-v1`` = 32 x 0x52, user ``local-api-user`` with an
``operator`` binding at version 1 on ``default``, server clock 1800000000000.
"""

from __future__ import annotations

import os
import pathlib
import sqlite3
from dataclasses import dataclass

from qinglong_edge.local.identity import (
    Subject,
    activate_pepper_key,
    create_subject,
    issue_credential,
    register_pepper_key,
)
from qinglong_edge.local.pepper import ensure_keyring_directory, key_file_name, read_pepper
from qinglong_edge.local.policy import PolicyFence, grant_role
from qinglong_edge.local.store import Store, write_transaction

NOW = 1_800_000_000_000
CREDENTIAL_ID = "local-api-owner"
SECRET = "UVFRUVFRUVFRUVFRUVFRUVFRUVFRUVFRUVFRUVFRUVE"
PEPPER_KEY_ID = "local-api-pepper-v1"
PEPPER_TEXT = b"UlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlI"
SECRET_DIGEST = "0d95c7c52761338308bc7c748d545bfaa3d1de1dcd51b10cfc7df1ed6ddf05dd"
MATERIAL_DIGEST = "4410b694b98570577279001456c8ea6c5a49c514ced7f821c570b445491ef237"
TOKEN = f"ql3c_{CREDENTIAL_ID}_{SECRET}"
AUTHORIZATION = f"Bearer {TOKEN}"
USER = Subject("user", "local-api-user")
SYSTEM = Subject("system", "test-admin")


def write_pepper_file(directory: pathlib.Path, key_id: str, content: bytes, mode: int = 0o600) -> pathlib.Path:
    """Write a key file exactly as given (tests make bad ones on purpose)."""
    path = directory / key_file_name(key_id)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, content)
    finally:
        os.close(fd)
    os.chmod(path, mode)
    return path


@dataclass
class Provisioned:
    store: Store
    keyring: str
    subject: Subject
    fence: PolicyFence


def provision(
    db_path: pathlib.Path,
    keyring: pathlib.Path,
    *,
    subject: Subject = USER,
    role: str | None = "operator",
    profile: str = "edge",
) -> Provisioned:
    """Open a store and provision the spec's vector credential for ``subject``."""
    ensure_keyring_directory(str(keyring))
    write_pepper_file(keyring, PEPPER_KEY_ID, PEPPER_TEXT)
    store = Store.open(str(db_path), profile=profile)
    material = read_pepper(str(keyring), PEPPER_KEY_ID)
    issued_at = NOW - 60_000
    store.run(lambda c: register_pepper_key(c, material, issued_at))
    store.run(lambda c: activate_pepper_key(c, PEPPER_KEY_ID, issued_at))
    store.run(lambda c: create_subject(c, subject, issued_at))
    store.run(lambda c: issue_credential(
        c, credential_id=CREDENTIAL_ID, subject=subject, secret=SECRET, pepper=material,
        now_ms=issued_at, expires_at_ms=NOW + 86_400_000,
    ))
    binding_version = None
    if role is not None:
        result = store.run(lambda c: grant_role(
            c, "default", subject, role, mutation_id="grant-1", changed_by=SYSTEM, now_ms=issued_at
        ))
        binding_version = result.binding.version
    return Provisioned(store, str(keyring), subject, PolicyFence(1, binding_version))


def insert_run(
    conn: sqlite3.Connection,
    run_id: str,
    *,
    project_id: str = "default",
    status: str = "running",
    version: int = 1,
    event_sequence: int = 1,
    created_at_ms: int = NOW - 10_000,
    cancel_requested_at_ms: int | None = None,
    cancel_reason: str | None = None,
    task_id: str = "task-1",
    execution_owner: str = "runtime",
) -> None:
    """A Run row as the integration fixture has it (no events unless the test adds them)."""
    with write_transaction(conn):
        conn.execute(
            'INSERT INTO "Runs" (id, project_id, task_id, task_revision, trigger_type, execution_origin,'
            " execution_owner, status, version, event_sequence, priority, created_at_ms, queued_at_ms,"
            " started_at_ms, cancel_requested_at_ms, cancel_reason)"
            " VALUES (?, ?, ?, 'qltd:v1:1:' || ?, 'task_start', 'manual', ?, ?, ?, ?, 0, ?, ?, ?, ?, ?)",
            (run_id, project_id, task_id, "a" * 64, execution_owner, status, version, event_sequence,
             created_at_ms, created_at_ms, created_at_ms + 1 if status != "queued" else None,
             cancel_requested_at_ms, cancel_reason),
        )
