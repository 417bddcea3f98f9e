"""The security audit sink (local-api.md sections 2.2 and 5.3).

Every admission decision writes one row to ``QingLong3SecurityAuditEvents``. A record
is validated before the insert (:func:`normalize_audit_record`); the insert is plain;
on a primary-key conflict an *identical* existing row (every field but the time) is
accepted as the same event, anything else is :class:`AuditUnavailable`. The HTTP layer
answers **503** ``security_audit_unavailable`` for :class:`AuditUnavailable` and for
every other :class:`~qinglong_edge.errors.StoreError` from the write (queue full, closed
store, SQLite failure), overriding the intended status.

``project_id`` has no foreign key (spec README): a request for an unknown project is
audited with the requested id.

Summary rows (:func:`record_refusal_summaries`; our deviation from the reference, spec
README "Decisions for storage on flash"): requests without a valid credential refused
with 429 ``rate_limited`` before any durable write are not audited one by one; each
interval's count per reason becomes ONE row: outcome ``authentication_rejected``,
operation ``request.refused``, reasons ``["rate_limited", <reason>]``, no project, no
subject, no fence, ``occurred_at_ms`` the interval's end, and the two columns of
migration 5: ``refused_count`` and ``refused_since_ms`` (the interval's start). Every
other row has both NULL.

Retention (issue 16, an on-disk deviation: the reference never deletes an audit row):
:func:`prune_audit` deletes the oldest rows, in insertion order (``rowid``), beyond
``localApi.auditMaximumEntries`` or older than ``localApi.auditRetentionMs``, a bounded
batch per call; :mod:`qinglong_edge.local.retention` calls it from ``serve`` and
``admin prune``.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from qinglong_edge.contracts.fields import MAX_INT32, MAX_SAFE_INTEGER, has_control
from qinglong_edge.contracts.ids import UUID4, new_uuid4
from qinglong_edge.errors import StoreError
from qinglong_edge.local.budget import REFUSAL_REASONS, RefusalSummary
from qinglong_edge.local.identity import SUBJECT_TYPES, Subject
from qinglong_edge.local.policy import PolicyFence
from qinglong_edge.local.store import write_transaction

__all__ = [
    "OUTCOMES",
    "PRE_AUTHENTICATION_OUTCOMES",
    "REFUSAL_OPERATION_ID",
    "AuditRecord",
    "AuditUnavailable",
    "audit_usage",
    "normalize_audit_record",
    "prune_audit",
    "record_audit",
    "record_refusal_summaries",
]

OUTCOMES = (
    "authentication_rejected",
    "authentication_unavailable",
    "authorization_unavailable",
    "denied",
    "approval_required",
    "allowed",
)
#: Outcomes written before a principal exists: subject and authentication are null.
PRE_AUTHENTICATION_OUTCOMES = frozenset({"authentication_rejected", "authentication_unavailable"})
_REASON = re.compile(r"[a-z][a-z0-9_]{0,63}")
_MAX_REASONS_JSON = 2048


class AuditUnavailable(StoreError):
    """The audit row could not be written or is invalid: HTTP 503 ``security_audit_unavailable``."""

    code = "audit_unavailable"
    http_status = 503


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One security audit event (section 2.2, ``normalizeSecurityAuditRecord``).

    Attributes:
        event_id: a lowercase UUIDv4 (:func:`qinglong_edge.contracts.ids.new_uuid4`).
        request_id: the ``local:<uuid>`` request id, 1-128 characters.
        operation_id: the route operation id (``run.cancel``...), 1-128 characters.
        project_id: the route's project id (may be unknown), or ``None``.
        subject / authentication_id: both ``None`` (pre-authentication outcomes) or both set.
        outcome: one of :data:`OUTCOMES`.
        reasons: 1-8 codes matching ``^[a-z][a-z0-9_]{0,63}$``.
        fence: the decision's fence, or ``None``.
        occurred_at_ms: the admission clock (epoch ms).
    """

    event_id: str
    request_id: str
    operation_id: str
    project_id: str | None
    subject: Subject | None
    authentication_id: str | None
    outcome: str
    reasons: tuple[str, ...]
    fence: PolicyFence | None
    occurred_at_ms: int


def _text(value: object, max_length: int, what: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= max_length or has_control(value):
        raise AuditUnavailable(f"audit {what} is invalid")
    return value


def _version(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_INT32:
        raise AuditUnavailable(f"audit {what} is invalid")
    return value


def normalize_audit_record(record: AuditRecord) -> AuditRecord:
    """Validate every field; returns the record (reasons as a tuple).

    Raises:
        AuditUnavailable: the record breaks a rule of section 2.2 / 5.3.
    """
    if not isinstance(record.event_id, str) or UUID4.fullmatch(record.event_id) is None:
        raise AuditUnavailable("audit event id must be a lowercase UUIDv4")
    _text(record.request_id, 128, "request id")
    _text(record.operation_id, 128, "operation id")
    if record.project_id is not None:
        _text(record.project_id, 128, "project id")
    if record.outcome not in OUTCOMES:
        raise AuditUnavailable("audit outcome is invalid")
    if (record.subject is None) != (record.authentication_id is None):
        raise AuditUnavailable("audit subject and authentication id must be both set or both null")
    if record.subject is not None:
        if record.subject.type not in SUBJECT_TYPES:
            raise AuditUnavailable("audit subject type is invalid")
        _text(record.subject.id, 255, "subject id")
        _text(record.authentication_id, 128, "authentication id")
    if (record.outcome in PRE_AUTHENTICATION_OUTCOMES) != (record.subject is None):
        raise AuditUnavailable(f"audit outcome {record.outcome} does not match the subject's presence")
    reasons = tuple(record.reasons) if isinstance(record.reasons, (tuple, list)) else ()
    if not 1 <= len(reasons) <= 8 or any(
        not isinstance(reason, str) or _REASON.fullmatch(reason) is None for reason in reasons
    ):
        raise AuditUnavailable("audit reasons must be 1-8 codes of ^[a-z][a-z0-9_]{0,63}$")
    if len(_reasons_json(reasons)) > _MAX_REASONS_JSON:
        raise AuditUnavailable("audit reasons are too long")
    if record.fence is not None:
        _version(record.fence.project_version, "fence project version")
        if record.fence.binding_version is not None:
            _version(record.fence.binding_version, "fence binding version")
    occurred = record.occurred_at_ms
    if not isinstance(occurred, int) or isinstance(occurred, bool) or not 0 <= occurred <= MAX_SAFE_INTEGER:
        raise AuditUnavailable("audit time is invalid")
    if reasons is record.reasons:
        return record
    return AuditRecord(
        record.event_id, record.request_id, record.operation_id, record.project_id, record.subject,
        record.authentication_id, record.outcome, reasons, record.fence, record.occurred_at_ms,
    )


def _reasons_json(reasons: tuple[str, ...]) -> str:
    return json.dumps(list(reasons), separators=(",", ":"))


def _row(record: AuditRecord) -> tuple[object, ...]:
    return (
        record.event_id,
        record.request_id,
        record.operation_id,
        record.project_id,
        None if record.subject is None else record.subject.type,
        None if record.subject is None else record.subject.id,
        record.authentication_id,
        record.outcome,
        _reasons_json(record.reasons),
        None if record.fence is None else record.fence.project_version,
        None if record.fence is None else record.fence.binding_version,
    )


def record_audit(conn: sqlite3.Connection, record: AuditRecord) -> str:
    """Write one audit event durably; ``inserted`` or ``existing`` (identical replay).

    Raises:
        AuditUnavailable: invalid record, a different row under the same event id, or a
            storage failure.
    """
    record = normalize_audit_record(record)
    values = _row(record)
    try:
        with write_transaction(conn):
            inserted = conn.execute(
                'INSERT INTO "QingLong3SecurityAuditEvents" (event_id, request_id, operation_id, project_id,'
                " subject_type, subject_id, authentication_id, outcome, reasons_json, fence_project_version,"
                " fence_binding_version, occurred_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (event_id) DO NOTHING",
                (*values, record.occurred_at_ms),
            ).rowcount
            if inserted == 1:
                return "inserted"
            existing = conn.execute(
                "SELECT event_id, request_id, operation_id, project_id, subject_type, subject_id, authentication_id,"
                " outcome, reasons_json, fence_project_version, fence_binding_version"
                ' FROM "QingLong3SecurityAuditEvents" WHERE event_id = ?',
                (record.event_id,),
            ).fetchone()
    except sqlite3.Error as exc:
        raise AuditUnavailable(f"audit write failed: {getattr(exc, 'sqlite_errorname', type(exc).__name__)}") from None
    if existing is None or not _same_event(tuple(existing), values):
        raise AuditUnavailable(f"audit event {record.event_id} exists with different content")
    return "existing"


def _same_event(stored: tuple[object, ...], wanted: tuple[object, ...]) -> bool:
    """Semantic equality ignoring the time; reasons compared as decoded JSON."""
    try:
        reasons = json.loads(str(stored[8]))
    except ValueError:
        return False
    return stored[:8] == wanted[:8] and stored[9:] == wanted[9:] and reasons == json.loads(str(wanted[8]))


#: The operation id of a summary row of refused requests.
REFUSAL_OPERATION_ID = "request.refused"


def record_refusal_summaries(
    conn: sqlite3.Connection, summaries: Sequence[RefusalSummary], *, new_id: Callable[[], str] = new_uuid4
) -> int:
    """Write one summary row per :class:`~qinglong_edge.local.budget.RefusalSummary`, all
    in ONE transaction (one commit, one fsync); returns the rows written.

    Raises:
        AuditUnavailable: an invalid summary (unknown reason, count < 1, interval
            backwards) or a storage failure; nothing is written then.
    """
    rows = []
    for summary in summaries:
        if summary.reason not in REFUSAL_REASONS:
            raise AuditUnavailable("refusal summary reason is invalid")
        if not isinstance(summary.count, int) or not 1 <= summary.count <= MAX_SAFE_INTEGER:
            raise AuditUnavailable("refusal summary count is invalid")
        if not 0 <= summary.since_ms <= summary.until_ms <= MAX_SAFE_INTEGER:
            raise AuditUnavailable("refusal summary interval is invalid")
        rows.append((new_id(), f"local:{new_id()}", REFUSAL_OPERATION_ID, None, None, None, None,
                     "authentication_rejected", _reasons_json(("rate_limited", summary.reason)), None, None,
                     summary.until_ms, summary.count, summary.since_ms))
    if not rows:
        return 0
    try:
        with write_transaction(conn):
            conn.executemany(
                'INSERT INTO "QingLong3SecurityAuditEvents" (event_id, request_id, operation_id, project_id,'
                " subject_type, subject_id, authentication_id, outcome, reasons_json, fence_project_version,"
                " fence_binding_version, occurred_at_ms, refused_count, refused_since_ms)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
    except sqlite3.Error as exc:
        raise AuditUnavailable(
            f"audit summary write failed: {getattr(exc, 'sqlite_errorname', type(exc).__name__)}"
        ) from None
    return len(rows)


# -- retention (issue 16) ------------------------------------------------------------------

def audit_usage(conn: sqlite3.Connection) -> tuple[int, int | None]:
    """``(rows, occurred_at_ms of the oldest row)`` (oldest: first inserted); read-only.

    ``count(*)`` walks the smallest index of the table: O(rows), about a millisecond
    per 100 000 rows here.
    """
    count = int(conn.execute('SELECT count(*) FROM "QingLong3SecurityAuditEvents"').fetchone()[0])
    oldest = conn.execute('SELECT occurred_at_ms FROM "QingLong3SecurityAuditEvents" ORDER BY rowid LIMIT 1').fetchone()
    return count, None if oldest is None else int(oldest[0])


def prune_audit(conn: sqlite3.Connection, *, maximum_entries: int, older_than_ms: int | None, limit: int) -> int:
    """Delete at most ``limit`` of the oldest audit rows; returns how many went.

    A row goes when more than ``maximum_entries`` rows are stored, or when it and every
    row inserted before it occurred before ``older_than_ms`` (``None``: no age limit).
    Only a prefix in insertion order (``rowid``) is ever deleted, so the rows kept are
    always the newest: a row written under a clock that stepped back waits for the rows
    before it. One ``BEGIN IMMEDIATE`` transaction.

    Raises:
        sqlite3.Error: the delete failed (rolled back; :meth:`Store.run` maps it).
    """
    if limit < 1:
        return 0
    with write_transaction(conn):
        count = int(conn.execute('SELECT count(*) FROM "QingLong3SecurityAuditEvents"').fetchone()[0])
        rows = conn.execute(
            'SELECT rowid, occurred_at_ms FROM "QingLong3SecurityAuditEvents" ORDER BY rowid LIMIT ?', (limit,)
        ).fetchall()
        n = min(max(0, count - maximum_entries), len(rows))
        if older_than_ms is not None:
            while n < len(rows) and int(rows[n][1]) < older_than_ms:
                n += 1
        if n == 0:
            return 0
        deleted = conn.execute('DELETE FROM "QingLong3SecurityAuditEvents" WHERE rowid <= ?', (rows[n - 1][0],))
        return int(deleted.rowcount)
