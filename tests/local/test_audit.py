"""The security audit sink (local-api.md 2.2, 5.3) on a real store."""

from __future__ import annotations

import dataclasses
import pathlib
import sqlite3
from collections.abc import Iterator

import pytest

from qinglong_edge.contracts.ids import new_uuid4
from qinglong_edge.local.audit import AuditRecord, AuditUnavailable, record_audit
from qinglong_edge.local.identity import Subject
from qinglong_edge.local.policy import PolicyFence
from qinglong_edge.local.store import Store

ALLOWED = AuditRecord(
    event_id="7f1c2a8e-5b3d-4c1e-9a0f-2d6b8e4c1a33",
    request_id="local:0b0c8d7e-1f2a-4b3c-8d4e-5f6a7b8c9d0e",
    operation_id="run.cancel",
    project_id="default",
    subject=Subject("user", "local-api-user"),
    authentication_id="local_credential:local-api-owner:1",
    outcome="allowed",
    reasons=("role_grant",),
    fence=PolicyFence(1, 1),
    occurred_at_ms=1_800_000_000_000,
)


@pytest.fixture
def store(tmp_path: pathlib.Path) -> Iterator[Store]:
    opened = Store.open(str(tmp_path / "local.db"))
    yield opened
    opened.close()


def _rows(store: Store) -> list[tuple[object, ...]]:
    return store.run(lambda c: c.execute('SELECT * FROM "QingLong3SecurityAuditEvents"').fetchall())


def test_writes_one_row_with_every_field(store: Store) -> None:
    assert store.run(lambda c: record_audit(c, ALLOWED)) == "inserted"
    assert _rows(store) == [(
        ALLOWED.event_id, ALLOWED.request_id, "run.cancel", "default", "user", "local-api-user",
        "local_credential:local-api-owner:1", "allowed", '["role_grant"]', 1, 1, 1_800_000_000_000,
        None, None,  # refused_count, refused_since_ms: only summary rows have them
    )]


def test_pre_authentication_rows_have_no_subject(store: Store) -> None:
    record = dataclasses.replace(
        ALLOWED, subject=None, authentication_id=None, outcome="authentication_rejected",
        reasons=("authentication_rejected",), fence=None)
    assert store.run(lambda c: record_audit(c, record)) == "inserted"
    assert _rows(store)[0][4:7] == (None, None, None)


def test_an_unknown_project_is_audited_without_a_foreign_key(store: Store) -> None:
    """Spec README decision: the requested id is recorded, so the answer can be 403."""
    record = dataclasses.replace(ALLOWED, project_id="no-such-project", outcome="denied",
                                 reasons=("project_not_found",), fence=None)
    assert store.run(lambda c: record_audit(c, record)) == "inserted"
    assert _rows(store)[0][3] == "no-such-project"


def test_an_identical_replay_is_accepted_even_at_another_time(store: Store) -> None:
    store.run(lambda c: record_audit(c, ALLOWED))
    later = dataclasses.replace(ALLOWED, occurred_at_ms=ALLOWED.occurred_at_ms + 5)
    assert store.run(lambda c: record_audit(c, later)) == "existing"
    assert len(_rows(store)) == 1


def test_a_different_row_under_the_same_event_id_is_unavailable(store: Store) -> None:
    store.run(lambda c: record_audit(c, ALLOWED))
    other = dataclasses.replace(ALLOWED, outcome="denied", reasons=("permission_missing",))
    with pytest.raises(AuditUnavailable) as info:
        store.run(lambda c: record_audit(c, other))
    assert info.value.code == "audit_unavailable" and info.value.http_status == 503
    assert _rows(store)[0][7] == "allowed"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"event_id": "not-a-uuid"}, id="event_id_not_uuid"),
        pytest.param({"event_id": "7f1c2a8e-5b3d-7c1e-9a0f-2d6b8e4c1a33"}, id="event_id_uuid7"),
        pytest.param({"event_id": "7F1C2A8E-5B3D-4C1E-9A0F-2D6B8E4C1A33"}, id="event_id_uppercase"),
        pytest.param({"request_id": ""}, id="empty_request_id"),
        pytest.param({"request_id": "x" * 129}, id="long_request_id"),
        pytest.param({"operation_id": "run\ncancel"}, id="control_in_operation"),
        pytest.param({"project_id": "p" * 129}, id="long_project_id"),
        pytest.param({"outcome": "granted"}, id="unknown_outcome"),
        pytest.param({"reasons": ()}, id="no_reasons"),
        pytest.param({"reasons": tuple(f"r{i}" for i in range(9))}, id="nine_reasons"),
        pytest.param({"reasons": ("Role_Grant",)}, id="reason_uppercase"),
        pytest.param({"reasons": ("9lives",)}, id="reason_leading_digit"),
        pytest.param({"reasons": ("r" * 65,)}, id="reason_too_long"),
        pytest.param({"authentication_id": None}, id="subject_without_authentication"),
        pytest.param({"subject": None}, id="authentication_without_subject"),
        pytest.param({"outcome": "authentication_rejected"}, id="pre_auth_outcome_with_subject"),
        pytest.param({"fence": PolicyFence(0, None)}, id="fence_project_zero"),
        pytest.param({"fence": PolicyFence(1, 2**31)}, id="fence_binding_overflow"),
        pytest.param({"occurred_at_ms": -1}, id="negative_time"),
    ],
)
def test_rejects_an_invalid_record(store: Store, change: dict[str, object]) -> None:
    record = dataclasses.replace(ALLOWED, **change)  # type: ignore[arg-type]
    with pytest.raises(AuditUnavailable):
        store.run(lambda c: record_audit(c, record))
    assert _rows(store) == []


def test_a_storage_failure_is_unavailable() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)  # no audit table
    with pytest.raises(AuditUnavailable):
        record_audit(conn, dataclasses.replace(ALLOWED, event_id=new_uuid4()))
    assert not conn.in_transaction
    conn.close()
