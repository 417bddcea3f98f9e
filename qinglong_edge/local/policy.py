"""Projects, append-only role bindings, the policy decision and its fence.

Source: local-api.md section 4 (``ProjectPolicyEngine.decide``, the permission sets, the
commit-time fence re-check) and section 5.1-5.2 (tables).

Decision order of :func:`decide` (first match wins):

1. project missing -> ``deny ["project_not_found"]``, fence ``None``
2. no binding, or the latest binding ``revoked`` -> ``deny ["subject_unbound"]``,
   fence ``(project.version, binding.version or None)``
3. project ``archived`` and the permission is not read-only -> ``deny ["project_archived"]``
4. the role lacks the permission -> ``deny ["permission_missing"]``
5. subject type ``agent`` and the permission needs approval (or is ``tool.call:*``) ->
   ``require_approval ["agent_action_requires_approval"]``
6. ``allow ["role_grant"]``, fence ``(project.version, binding.version)``

HTTP mapping (admission, section 2.2): ``deny`` -> 403 ``forbidden``,
``require_approval`` -> 403 ``approval_required``; :class:`AuthorizationUnavailable`
-> 503 ``authorization_unavailable``. The audit outcome of a decision is
:attr:`Decision.audit_outcome`.

:func:`check_fence_at_commit` is the re-check repositories run inside their write
transaction (cancellation, task.start): project ``active`` with the fence's version, the
latest binding with the fence's version, ``active``, role owner/admin/operator.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

from qinglong_edge.contracts.fields import MAX_INT32, MAX_SAFE_INTEGER, has_control
from qinglong_edge.contracts.ids import API_ID
from qinglong_edge.errors import StoreError
from qinglong_edge.local.identity import Subject
from qinglong_edge.local.store import read_transaction, write_transaction

__all__ = [
    "AGENT_APPROVAL_PERMISSIONS",
    "MUTATING_ROLES",
    "OPERATOR_PERMISSIONS",
    "PERMISSIONS",
    "READ_ONLY_PERMISSIONS",
    "ROLES",
    "AuthorizationUnavailable",
    "BindingRecord",
    "Decision",
    "PolicyFence",
    "ProjectRecord",
    "archive_project",
    "bump_project_version",
    "check_fence_at_commit",
    "create_project",
    "current_binding",
    "decide",
    "get_project",
    "grant_role",
    "normalize_permission",
    "revoke_role",
]

ROLES = ("owner", "admin", "operator", "viewer")
#: Roles the commit-time fence accepts (local-api.md section 4).
MUTATING_ROLES = frozenset({"owner", "admin", "operator"})
PERMISSIONS = (
    "project.read", "project.manage", "task.read", "task.create", "task.update", "task.delete",
    "trigger.read", "trigger.create", "trigger.update", "run.read", "run.start", "run.stop", "run.retry",
    "model.invoke", "artifact.read", "approval.read", "package.manage", "secret.use", "secret.manage",
    "worker.manage", "policy.manage", "approval.decide", "approval.recover",
)
READ_ONLY_PERMISSIONS = frozenset(
    {"project.read", "task.read", "trigger.read", "run.read", "artifact.read", "approval.read"}
)
OPERATOR_PERMISSIONS = READ_ONLY_PERMISSIONS | {
    "task.create", "task.update", "trigger.create", "trigger.update", "run.start", "run.stop", "run.retry",
    "model.invoke", "secret.use",
}
AGENT_APPROVAL_PERMISSIONS = frozenset({
    "project.manage", "task.create", "task.update", "task.delete", "trigger.create", "trigger.update",
    "run.start", "run.stop", "run.retry", "model.invoke", "secret.use", "secret.manage", "package.manage",
    "worker.manage", "policy.manage", "approval.decide",
})
_TOOL_PERMISSION = re.compile(r"tool\.call:[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_SLUG = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,126}[a-z0-9])?")
_MUTATION = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_AUDIT_OUTCOME = {"allow": "allowed", "deny": "denied", "require_approval": "approval_required"}


class AuthorizationUnavailable(StoreError):
    """The policy could not be evaluated (storage, invalid stored row): HTTP 503."""

    code = "authorization_unavailable"
    http_status = 503


@dataclass(frozen=True, slots=True)
class PolicyFence:
    """``{projectVersion, bindingVersion|null}`` of a decision (local-api.md section 4)."""

    project_version: int
    binding_version: int | None


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy decision.

    Attributes:
        outcome: ``allow``, ``deny`` or ``require_approval``.
        reasons: one reason code (tuple for the audit's 1-8 items).
        fence: ``None`` only for ``project_not_found``.
    """

    outcome: str
    reasons: tuple[str, ...]
    fence: PolicyFence | None

    @property
    def audit_outcome(self) -> str:
        """``allowed`` / ``denied`` / ``approval_required`` for the security audit."""
        return _AUDIT_OUTCOME[self.outcome]


@dataclass(frozen=True, slots=True)
class ProjectRecord:
    id: str
    name: str
    slug: str
    status: str
    version: int
    created_at_ms: int
    updated_at_ms: int


@dataclass(frozen=True, slots=True)
class BindingRecord:
    project_id: str
    subject: Subject
    version: int
    state: str
    role: str | None
    mutation_id: str
    changed_by: Subject
    created_at_ms: int


def normalize_permission(permission: str) -> str:
    """A static permission or ``tool.call:<id>``.

    Raises:
        StoreError: ``invalid_input``.
    """
    if permission in PERMISSIONS or (isinstance(permission, str) and _TOOL_PERMISSION.fullmatch(permission)):
        return permission
    raise StoreError(f"unknown permission {permission!r}", code="invalid_input")


def _role_allows(role: str, permission: str) -> bool:
    if role == "owner":
        return True
    if role == "admin":
        return permission != "project.manage"
    if role == "operator":
        return permission.startswith("tool.call:") or permission in OPERATOR_PERMISSIONS
    return permission in READ_ONLY_PERMISSIONS


def _check_project_id(project_id: str) -> str:
    if not isinstance(project_id, str) or not 1 <= len(project_id) <= 128 or has_control(project_id):
        raise StoreError("project id must be 1-128 characters without control characters", code="invalid_input")
    return project_id


def _now(now_ms: int) -> int:
    if not isinstance(now_ms, int) or isinstance(now_ms, bool) or not 0 <= now_ms <= MAX_SAFE_INTEGER:
        raise StoreError("clock value is not a safe non-negative integer", code="invalid_input")
    return now_ms


# -- reads -----------------------------------------------------------------------------


def get_project(conn: sqlite3.Connection, project_id: str) -> ProjectRecord | None:
    row = conn.execute(
        'SELECT id, name, slug, status, version, created_at_ms, updated_at_ms FROM "QingLong3Projects" WHERE id = ?',
        (project_id,),
    ).fetchone()
    return None if row is None else ProjectRecord(*row)


def current_binding(conn: sqlite3.Connection, project_id: str, subject: Subject) -> BindingRecord | None:
    """The latest binding version of ``subject`` on ``project_id``, or ``None``."""
    row = conn.execute(
        "SELECT project_id, subject_type, subject_id, version, state, role, mutation_id, changed_by_type,"
        ' changed_by_id, created_at_ms FROM "QingLong3ProjectRoleBindings"'
        " WHERE project_id = ? AND subject_type = ? AND subject_id = ? ORDER BY version DESC LIMIT 1",
        (project_id, subject.type, subject.id),
    ).fetchone()
    if row is None:
        return None
    return BindingRecord(
        project_id=row[0], subject=Subject(row[1], row[2]), version=row[3], state=row[4], role=row[5],
        mutation_id=row[6], changed_by=Subject(row[7], row[8]), created_at_ms=row[9],
    )


def _valid_version(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_INT32


def decide(conn: sqlite3.Connection, subject: Subject, project_id: str, permission: str) -> Decision:
    """Evaluate the policy for one request (decision order in the module docstring).

    Raises:
        StoreError: ``invalid_input`` for a bad project id or permission (caller bug).
        AuthorizationUnavailable: storage failure or an invalid stored row.
    """
    _check_project_id(project_id)
    permission = normalize_permission(permission)
    try:
        with read_transaction(conn):
            project = get_project(conn, project_id)
            binding = None if project is None else current_binding(conn, project_id, subject)
    except (sqlite3.Error, StoreError):
        raise AuthorizationUnavailable("the project policy is unavailable") from None
    if project is None:
        return Decision("deny", ("project_not_found",), None)
    if project.status not in ("active", "archived") or not _valid_version(project.version):
        raise AuthorizationUnavailable(f"project {project_id} row is invalid")
    if binding is not None and (
        not _valid_version(binding.version)
        or (binding.state, binding.role in ROLES) not in (("active", True), ("revoked", False))
    ):
        raise AuthorizationUnavailable(f"role binding of project {project_id} is invalid")
    fence = PolicyFence(project.version, None if binding is None else binding.version)
    if binding is None or binding.state == "revoked" or binding.role is None:
        return Decision("deny", ("subject_unbound",), fence)
    if project.status == "archived" and permission not in READ_ONLY_PERMISSIONS:
        return Decision("deny", ("project_archived",), fence)
    if not _role_allows(binding.role, permission):
        return Decision("deny", ("permission_missing",), fence)
    if subject.type == "agent" and (permission.startswith("tool.call:") or permission in AGENT_APPROVAL_PERMISSIONS):
        return Decision("require_approval", ("agent_action_requires_approval",), fence)
    return Decision("allow", ("role_grant",), fence)


def check_fence_at_commit(conn: sqlite3.Connection, project_id: str, subject: Subject, fence: PolicyFence) -> bool:
    """The commit-time re-check (section 4); run it inside the write transaction.

    Returns ``False`` when the project is missing too; callers that must tell a missing
    project apart (404 vs 409) read :func:`get_project` first.
    """
    project = get_project(conn, project_id)
    if project is None or project.status != "active" or project.version != fence.project_version:
        return False
    binding = current_binding(conn, project_id, subject)
    return (
        binding is not None
        and fence.binding_version is not None
        and binding.version == fence.binding_version
        and binding.state == "active"
        and binding.role in MUTATING_ROLES
    )


# -- projects --------------------------------------------------------------------------


def create_project(conn: sqlite3.Connection, project_id: str, name: str, slug: str, now_ms: int) -> str:
    """Create an ``active`` project at version 1; ``created`` or ``existing`` (same name/slug).

    Raises:
        StoreError: ``invalid_input`` (id, name 1-255, slug grammar), ``conflict`` (the id
            exists with another name/slug, or the slug is taken).
    """
    if not isinstance(project_id, str) or API_ID.fullmatch(project_id) is None:
        # Stricter than the column: a project must be addressable by the Local API routes.
        raise StoreError("project id must match [A-Za-z0-9][A-Za-z0-9._:-]{0,127}", code="invalid_input")
    if not isinstance(name, str) or not 1 <= len(name) <= 255 or has_control(name):
        raise StoreError("project name must be 1-255 characters without control characters", code="invalid_input")
    if not isinstance(slug, str) or _SLUG.fullmatch(slug) is None:
        raise StoreError("project slug must be lowercase [a-z0-9-] with alphanumeric ends", code="invalid_input")
    now = _now(now_ms)
    with write_transaction(conn):
        current = get_project(conn, project_id)
        if current is not None:
            if (current.name, current.slug) == (name, slug):
                return "existing"
            raise StoreError(f"project {project_id} exists with another name or slug", code="conflict")
        taken = conn.execute('SELECT id FROM "QingLong3Projects" WHERE slug = ?', (slug,)).fetchone()
        if taken is not None:
            raise StoreError(f"project slug {slug} is used by project {taken[0]}", code="conflict")
        conn.execute(
            'INSERT INTO "QingLong3Projects" (id, name, slug, status, version, created_at_ms, updated_at_ms)'
            " VALUES (?, ?, ?, 'active', 1, ?, ?)",
            (project_id, name, slug, now, now),
        )
    return "created"


def _update_project(conn: sqlite3.Connection, project_id: str, status: str | None, now_ms: int) -> ProjectRecord:
    now = _now(now_ms)
    with write_transaction(conn):
        current = get_project(conn, project_id)
        if current is None:
            raise StoreError(f"project {project_id} does not exist", code="not_found")
        if current.version >= MAX_INT32:
            raise StoreError(f"project {project_id} version space exhausted", code="conflict")
        conn.execute(
            'UPDATE "QingLong3Projects" SET status = coalesce(?, status), version = version + 1,'
            " updated_at_ms = max(updated_at_ms, ?) WHERE id = ?",
            (status, now, project_id),
        )
        updated = get_project(conn, project_id)
    assert updated is not None
    return updated


def archive_project(conn: sqlite3.Connection, project_id: str, now_ms: int) -> ProjectRecord:
    """Set ``archived`` and bump the version (every in-flight fence on it turns stale)."""
    return _update_project(conn, project_id, "archived", now_ms)


def bump_project_version(conn: sqlite3.Connection, project_id: str, now_ms: int) -> ProjectRecord:
    """Bump the project version without other change (invalidates in-flight fences)."""
    return _update_project(conn, project_id, None, now_ms)


# -- role bindings ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BindingResult:
    """``inserted`` (a new version) or ``existing`` (the mutation id was already applied)."""

    status: str
    binding: BindingRecord


def _append_binding(
    conn: sqlite3.Connection,
    project_id: str,
    subject: Subject,
    *,
    role: str | None,
    mutation_id: str,
    changed_by: Subject,
    now_ms: int,
) -> BindingResult:
    _check_project_id(project_id)
    if not isinstance(mutation_id, str) or _MUTATION.fullmatch(mutation_id) is None:
        raise StoreError("mutation id must be 1-64 characters of [A-Za-z0-9._:-]", code="invalid_input")
    state = "revoked" if role is None else "active"
    now = _now(now_ms)
    with write_transaction(conn):
        if get_project(conn, project_id) is None:
            raise StoreError(f"project {project_id} does not exist", code="not_found")
        replay = conn.execute(
            'SELECT version, state, role FROM "QingLong3ProjectRoleBindings"'
            " WHERE project_id = ? AND subject_type = ? AND subject_id = ? AND mutation_id = ?",
            (project_id, subject.type, subject.id, mutation_id),
        ).fetchone()
        if replay is not None:
            if (replay[1], replay[2]) != (state, role):
                raise StoreError(f"mutation {mutation_id} was already used for another change", code="conflict")
            existing = conn.execute(
                "SELECT project_id, subject_type, subject_id, version, state, role, mutation_id, changed_by_type,"
                ' changed_by_id, created_at_ms FROM "QingLong3ProjectRoleBindings"'
                " WHERE project_id = ? AND subject_type = ? AND subject_id = ? AND version = ?",
                (project_id, subject.type, subject.id, replay[0]),
            ).fetchone()
            return BindingResult("existing", BindingRecord(
                existing[0], Subject(existing[1], existing[2]), existing[3], existing[4], existing[5], existing[6],
                Subject(existing[7], existing[8]), existing[9],
            ))
        latest = current_binding(conn, project_id, subject)
        version = 1 if latest is None else latest.version + 1
        if version > MAX_INT32:
            raise StoreError("role binding version space exhausted", code="conflict")
        conn.execute(
            'INSERT INTO "QingLong3ProjectRoleBindings" (project_id, subject_type, subject_id, version, state, role,'
            " mutation_id, changed_by_type, changed_by_id, created_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (project_id, subject.type, subject.id, version, state, role, mutation_id, changed_by.type,
             changed_by.id, now),
        )
    return BindingResult(
        "inserted", BindingRecord(project_id, subject, version, state, role, mutation_id, changed_by, now)
    )


def grant_role(
    conn: sqlite3.Connection,
    project_id: str,
    subject: Subject,
    role: str,
    *,
    mutation_id: str,
    changed_by: Subject,
    now_ms: int,
) -> BindingResult:
    """Append an ``active`` binding version with ``role``.

    The same ``mutation_id`` for the same subject replays (``existing``); reused for a
    different change it is a ``conflict``.

    Raises:
        StoreError: ``invalid_input``, ``not_found`` (project), ``conflict``.
    """
    if role not in ROLES:
        raise StoreError(f"role must be one of {', '.join(ROLES)}", code="invalid_input")
    return _append_binding(
        conn, project_id, subject, role=role, mutation_id=mutation_id, changed_by=changed_by, now_ms=now_ms
    )


def revoke_role(
    conn: sqlite3.Connection,
    project_id: str,
    subject: Subject,
    *,
    mutation_id: str,
    changed_by: Subject,
    now_ms: int,
) -> BindingResult:
    """Append a ``revoked`` binding version (role ``NULL``); same idempotency as grant."""
    return _append_binding(
        conn, project_id, subject, role=None, mutation_id=mutation_id, changed_by=changed_by, now_ms=now_ms
    )
