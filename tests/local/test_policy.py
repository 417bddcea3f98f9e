"""The policy decision table and the commit fence (local-api.md section 4), on a real store."""

from __future__ import annotations

import pathlib
import sqlite3
from collections.abc import Iterator

import pytest

from qinglong_edge.errors import StoreError
from qinglong_edge.local.identity import Subject
from qinglong_edge.local.policy import (
    AuthorizationUnavailable,
    Decision,
    PolicyFence,
    archive_project,
    bump_project_version,
    check_fence_at_commit,
    create_project,
    decide,
    grant_role,
    revoke_role,
)
from qinglong_edge.local.store import Store

ADMIN = Subject("system", "test-admin")

# The spec's sets, restated literally (local-api.md section 4), not imported from the code.
ALL_PERMISSIONS = [
    "project.read", "project.manage", "task.read", "task.create", "task.update", "task.delete",
    "trigger.read", "trigger.create", "trigger.update", "run.read", "run.start", "run.stop", "run.retry",
    "model.invoke", "artifact.read", "approval.read", "package.manage", "secret.use", "secret.manage",
    "worker.manage", "policy.manage", "approval.decide", "approval.recover", "tool.call:shell.exec",
]
VIEWER_ALLOWED = {"project.read", "task.read", "trigger.read", "run.read", "artifact.read", "approval.read"}
OPERATOR_ALLOWED = VIEWER_ALLOWED | {
    "task.create", "task.update", "trigger.create", "trigger.update", "run.start", "run.stop", "run.retry",
    "model.invoke", "secret.use", "tool.call:shell.exec",
}
ADMIN_ALLOWED = set(ALL_PERMISSIONS) - {"project.manage"}
OWNER_ALLOWED = set(ALL_PERMISSIONS)
ALLOWED_BY_ROLE = {"viewer": VIEWER_ALLOWED, "operator": OPERATOR_ALLOWED, "admin": ADMIN_ALLOWED,
                   "owner": OWNER_ALLOWED}
AGENT_NEEDS_APPROVAL = {
    "project.manage", "task.create", "task.update", "task.delete", "trigger.create", "trigger.update", "run.start",
    "run.stop", "run.retry", "model.invoke", "secret.use", "secret.manage", "package.manage", "worker.manage",
    "policy.manage", "approval.decide", "tool.call:shell.exec",
}


@pytest.fixture(scope="module")
def policy_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    store = Store.open(str(tmp_path_factory.mktemp("policy") / "local.db"))
    store.run(lambda c: create_project(c, "archived", "Archived", "archived", 10))
    for role in ALLOWED_BY_ROLE:
        for kind in ("user", "agent"):
            for project in ("default", "archived"):
                store.run(lambda c, r=role, k=kind, p=project: grant_role(
                    c, p, Subject(k, f"{k}-{r}"), r, mutation_id=f"g-{r}", changed_by=ADMIN, now_ms=20))
    store.run(lambda c: archive_project(c, "archived", 30))
    yield store
    store.close()


def _decide(store: Store, subject: Subject, project: str, permission: str) -> Decision:
    return store.run(lambda c: decide(c, subject, project, permission))


@pytest.mark.parametrize("permission", ALL_PERMISSIONS)
@pytest.mark.parametrize("role", ["viewer", "operator", "admin", "owner"])
def test_role_permission_table_for_users(policy_store: Store, role: str, permission: str) -> None:
    decision = _decide(policy_store, Subject("user", f"user-{role}"), "default", permission)
    if permission in ALLOWED_BY_ROLE[role]:
        assert (decision.outcome, decision.reasons) == ("allow", ("role_grant",))
        assert decision.audit_outcome == "allowed"
    else:
        assert (decision.outcome, decision.reasons) == ("deny", ("permission_missing",))
        assert decision.audit_outcome == "denied"
    assert decision.fence == PolicyFence(1, 1)


@pytest.mark.parametrize("permission", ALL_PERMISSIONS)
@pytest.mark.parametrize("role", ["viewer", "operator", "admin", "owner"])
def test_agents_need_approval_for_mutations_they_hold(policy_store: Store, role: str, permission: str) -> None:
    decision = _decide(policy_store, Subject("agent", f"agent-{role}"), "default", permission)
    if permission not in ALLOWED_BY_ROLE[role]:
        assert decision.reasons == ("permission_missing",)  # step 4 precedes step 5
    elif permission in AGENT_NEEDS_APPROVAL:
        assert (decision.outcome, decision.reasons) == ("require_approval", ("agent_action_requires_approval",))
        assert decision.audit_outcome == "approval_required"
    else:
        assert decision.outcome == "allow"


@pytest.mark.parametrize("permission", ALL_PERMISSIONS)
def test_archived_project_allows_only_read_only_permissions(policy_store: Store, permission: str) -> None:
    decision = _decide(policy_store, Subject("user", "user-owner"), "archived", permission)
    if permission in VIEWER_ALLOWED:
        assert decision.outcome == "allow"
    else:
        assert (decision.outcome, decision.reasons) == ("deny", ("project_archived",))
    assert decision.fence == PolicyFence(2, 1)  # archiving bumped the project version


def test_unknown_project_is_denied_without_fence(policy_store: Store) -> None:
    decision = _decide(policy_store, Subject("user", "user-owner"), "no-such-project", "run.read")
    assert decision == Decision("deny", ("project_not_found",), None)


def test_unbound_subject_is_denied_with_a_null_binding_version(policy_store: Store) -> None:
    decision = _decide(policy_store, Subject("user", "stranger"), "default", "run.read")
    assert decision == Decision("deny", ("subject_unbound",), PolicyFence(1, None))


def test_revoked_binding_is_unbound_with_its_version(tmp_path: pathlib.Path) -> None:
    with Store.open(str(tmp_path / "local.db")) as store:
        user = Subject("user", "u")
        store.run(lambda c: grant_role(c, "default", user, "owner", mutation_id="m1", changed_by=ADMIN, now_ms=1))
        store.run(lambda c: revoke_role(c, "default", user, mutation_id="m2", changed_by=ADMIN, now_ms=2))
        assert _decide(store, user, "default", "run.read") == Decision("deny", ("subject_unbound",), PolicyFence(1, 2))
        store.run(lambda c: grant_role(c, "default", user, "viewer", mutation_id="m3", changed_by=ADMIN, now_ms=3))
        assert _decide(store, user, "default", "run.stop") == Decision(
            "deny", ("permission_missing",), PolicyFence(1, 3))


def test_rejects_an_unknown_permission(policy_store: Store) -> None:
    with pytest.raises(StoreError) as info:
        _decide(policy_store, Subject("user", "user-owner"), "default", "run.explode")
    assert info.value.code == "invalid_input"


def test_a_corrupt_stored_row_makes_the_policy_unavailable(tmp_path: pathlib.Path) -> None:
    with Store.open(str(tmp_path / "local.db")) as store:
        def corrupt(c: sqlite3.Connection) -> None:
            c.execute("PRAGMA ignore_check_constraints = ON")
            c.execute("UPDATE \"QingLong3Projects\" SET status = 'frozen' WHERE id = 'default'")
            c.execute("PRAGMA ignore_check_constraints = OFF")
        store.run(corrupt)
        with pytest.raises(AuthorizationUnavailable) as info:
            _decide(store, Subject("user", "u"), "default", "run.read")
        assert info.value.code == "authorization_unavailable"


# -- the commit fence ------------------------------------------------------------------


@pytest.fixture
def fenced(tmp_path: pathlib.Path) -> Iterator[tuple[Store, Subject, PolicyFence]]:
    store = Store.open(str(tmp_path / "local.db"))
    user = Subject("user", "op")
    store.run(lambda c: grant_role(c, "default", user, "operator", mutation_id="m1", changed_by=ADMIN, now_ms=1))
    decision = _decide(store, user, "default", "run.stop")
    assert decision.outcome == "allow" and decision.fence is not None
    yield store, user, decision.fence
    store.close()


def _holds(store: Store, user: Subject, fence: PolicyFence) -> bool:
    return store.run(lambda c: check_fence_at_commit(c, "default", user, fence))


def test_fence_holds_while_nothing_changed(fenced: tuple[Store, Subject, PolicyFence]) -> None:
    store, user, fence = fenced
    assert _holds(store, user, fence)


@pytest.mark.parametrize("change", ["promotion", "revocation", "demotion", "project_bump", "archive"])
def test_fence_fails_after_any_change(fenced: tuple[Store, Subject, PolicyFence], change: str) -> None:
    store, user, fence = fenced
    if change == "promotion":
        store.run(lambda c: grant_role(c, "default", user, "owner", mutation_id="m2", changed_by=ADMIN, now_ms=2))
    elif change == "revocation":
        store.run(lambda c: revoke_role(c, "default", user, mutation_id="m2", changed_by=ADMIN, now_ms=2))
    elif change == "demotion":
        store.run(lambda c: grant_role(c, "default", user, "viewer", mutation_id="m2", changed_by=ADMIN, now_ms=2))
    elif change == "project_bump":
        store.run(lambda c: bump_project_version(c, "default", 2))
    else:
        store.run(lambda c: archive_project(c, "default", 2))
    assert not _holds(store, user, fence)


def test_fence_requires_a_binding_version(fenced: tuple[Store, Subject, PolicyFence]) -> None:
    store, user, _fence = fenced
    assert not _holds(store, user, PolicyFence(1, None))


def test_viewer_fence_fails_at_commit(fenced: tuple[Store, Subject, PolicyFence]) -> None:
    store, _user, _fence = fenced
    viewer = Subject("user", "viewer")
    store.run(lambda c: grant_role(c, "default", viewer, "viewer", mutation_id="v", changed_by=ADMIN, now_ms=1))
    assert not _holds(store, viewer, PolicyFence(1, 1))


# -- bindings and projects -------------------------------------------------------------


def test_grant_replays_by_mutation_id_and_conflicts_on_reuse(fenced: tuple[Store, Subject, PolicyFence]) -> None:
    store, user, _fence = fenced
    again = store.run(lambda c: grant_role(c, "default", user, "operator", mutation_id="m1", changed_by=ADMIN,
                                           now_ms=5))
    assert (again.status, again.binding.version) == ("existing", 1)
    with pytest.raises(StoreError) as info:
        store.run(lambda c: grant_role(c, "default", user, "owner", mutation_id="m1", changed_by=ADMIN, now_ms=5))
    assert info.value.code == "conflict"
    appended = store.run(lambda c: revoke_role(c, "default", user, mutation_id="m9", changed_by=ADMIN, now_ms=6))
    assert (appended.status, appended.binding.version, appended.binding.role) == ("inserted", 2, None)
    rows = store.run(lambda c: c.execute(
        'SELECT version, state, role FROM "QingLong3ProjectRoleBindings" WHERE subject_id = ? ORDER BY version',
        (user.id,)).fetchall())
    assert rows == [(1, "active", "operator"), (2, "revoked", None)]  # append-only: v1 untouched


@pytest.mark.parametrize(
    ("project_id", "name", "slug"),
    [("", "N", "n"), ("p", "", "p"), ("p", "N", "Upper"), ("p", "N", "-x"), ("p", "N", "x-"), ("p\x01", "N", "p")],
)
def test_rejects_a_bad_project(tmp_path: pathlib.Path, project_id: str, name: str, slug: str) -> None:
    with Store.open(str(tmp_path / "local.db")) as store:
        with pytest.raises(StoreError) as info:
            store.run(lambda c: create_project(c, project_id, name, slug, 1))
        assert info.value.code == "invalid_input"


def test_project_creation_is_idempotent_and_slugs_are_unique(tmp_path: pathlib.Path) -> None:
    with Store.open(str(tmp_path / "local.db")) as store:
        assert store.run(lambda c: create_project(c, "p1", "P", "p1", 1)) == "created"
        assert store.run(lambda c: create_project(c, "p1", "P", "p1", 2)) == "existing"
        for args in (("p1", "Other", "p1"), ("p2", "P", "p1")):
            with pytest.raises(StoreError) as info:
                store.run(lambda c, a=args: create_project(c, *a, 3))
            assert info.value.code == "conflict"
