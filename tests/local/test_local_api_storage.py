"""Storage and security-subsystem failures answer 503 and leave nothing half-written.

local-api.md 10.8 and 2.2: the database read-only, the disk full, the database locked
by another process past the busy timeout, the audit write failing (503
``security_audit_unavailable`` wins), the policy or the credential confirm failing,
the event insert failing (rollback). Each failure is real: a second process holding
the SQLite lock, ``chattr +i`` (root cannot write either), a full tmpfs, SQLite
triggers that abort an insert. After each, the same mutation succeeds with 202.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess
from collections.abc import Callable, Iterator

import pytest

from qinglong_edge.local.routes import Route
from tests.support.local_api import LocalApiServer, local_api
from tests.support.lock_holder import exclusive_lock
from tests.support.mounts import tmpfs

ACCEPTED_STATUS = 202
UNCHANGED = ("running", 1, 1, None, None)


def assert_nothing_written(api: LocalApiServer) -> None:
    assert api.run_row() == UNCHANGED
    assert api.events() == []
    assert api.query("PRAGMA integrity_check") == [("ok",)]


def assert_recovers(api: LocalApiServer) -> None:
    """The same mutation later succeeds with 202 and exactly one event."""
    response = api.cancel()
    assert response.status == ACCEPTED_STATUS, response.body
    assert api.run_row() == ("running", 2, 2, 1800000000000, "user")
    assert len(api.events()) == 1


@contextlib.contextmanager
def locked(db_path: pathlib.Path) -> Iterator[None]:
    """Another process holds an EXCLUSIVE lock on the database until exit."""
    with exclusive_lock(db_path):
        yield


# -- locked by another process past the busy timeout ---------------------------------


def test_locked_before_the_request_is_503_and_recovers(tmp_path: pathlib.Path) -> None:
    with local_api(tmp_path, busy_timeout_ms=100) as api:
        with locked(api.db_path):
            response = api.cancel()
        # authentication cannot read and its audit row cannot be written: the audit 503 wins
        assert (response.status, response.json()) == (503, {"code": "security_audit_unavailable"})
        assert_nothing_written(api)
        assert api.audit_rows() == []
        assert_recovers(api)


def test_locked_between_admission_and_commit_is_503_cancellation_unavailable(tmp_path: pathlib.Path) -> None:
    with local_api(tmp_path, busy_timeout_ms=100) as api, contextlib.ExitStack() as stack:
        def hook(route: Route) -> None:
            api.hooks.clear()
            stack.enter_context(locked(api.db_path))

        api.hooks.append(hook)
        response = api.cancel()
        assert response.raw_head.endswith(b"\r\n\r\n")
        assert (response.status, response.body) == (503, b'{"code":"run_cancellation_unavailable"}')
        assert response.header("content-length") == "39"
        stack.close()
        assert_nothing_written(api)
        assert [row[4] for row in api.audit_rows()] == ["allowed"]
        assert api.intents == []
        assert_recovers(api)


# -- the database made read-only -------------------------------------------------------


def _chattr(flag: str, *paths: pathlib.Path) -> bool:
    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True).returncode == 0


@pytest.fixture
def immutable(tmp_path: pathlib.Path) -> Iterator[Callable[[pathlib.Path], None]]:
    """Make the database directory and file immutable (``chattr +i``: not even root writes)."""
    if os.geteuid() != 0:
        pytest.skip("chattr +i needs root")
    probe = tmp_path / "probe"
    probe.mkdir()
    if not _chattr("+i", probe):
        pytest.skip("this filesystem does not support chattr +i")
    _chattr("-i", probe)
    made: list[pathlib.Path] = []

    def make(db_path: pathlib.Path) -> None:
        targets = [db_path.parent, db_path]
        assert _chattr("+i", *targets)
        made.extend(targets)

    yield make
    if made:
        _chattr("-i", *made)


def test_read_only_before_the_request_is_503_and_recovers(
    tmp_path: pathlib.Path, immutable: Callable[[pathlib.Path], None]
) -> None:
    db_dir = tmp_path / "db"
    db_dir.mkdir()
    with local_api(tmp_path, db_dir=db_dir) as api:
        immutable(api.db_path)
        response = api.cancel()
        assert (response.status, response.json()) == (503, {"code": "security_audit_unavailable"})
        _chattr("-i", db_dir, api.db_path)
        assert_nothing_written(api)
        assert_recovers(api)


def test_read_only_between_admission_and_commit_is_503_and_recovers(
    tmp_path: pathlib.Path, immutable: Callable[[pathlib.Path], None]
) -> None:
    db_dir = tmp_path / "db"
    db_dir.mkdir()
    with local_api(tmp_path, db_dir=db_dir) as api:
        def hook(route: Route) -> None:
            api.hooks.clear()
            immutable(api.db_path)

        api.hooks.append(hook)
        response = api.cancel()
        assert (response.status, response.json()) == (503, {"code": "run_cancellation_unavailable"})
        _chattr("-i", db_dir, api.db_path)
        assert_nothing_written(api)
        assert_recovers(api)


# -- disk full ---------------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    with tmpfs(tmp_path / "small", "2m", lazy=True) as mount:
        yield mount


def fill(directory: pathlib.Path) -> pathlib.Path:
    """Fill the filesystem until ENOSPC; returns the filler file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * 4096):
                pass
    finally:
        os.close(fd)
    return filler


def test_disk_full_before_the_request_is_503_and_recovers(tmp_path: pathlib.Path, small_tmpfs: pathlib.Path) -> None:
    with local_api(tmp_path, db_dir=small_tmpfs) as api:
        filler = fill(small_tmpfs)
        response = api.cancel()
        assert (response.status, response.json()) == (503, {"code": "security_audit_unavailable"})
        filler.unlink()
        assert_nothing_written(api)
        assert_recovers(api)


def test_disk_full_between_admission_and_commit_is_503_and_recovers(tmp_path: pathlib.Path, small_tmpfs: pathlib.Path) -> None:
    with local_api(tmp_path, db_dir=small_tmpfs) as api:
        fillers: list[pathlib.Path] = []

        def hook(route: Route) -> None:
            api.hooks.clear()
            fillers.append(fill(small_tmpfs))

        api.hooks.append(hook)
        response = api.cancel()
        assert (response.status, response.json()) == (503, {"code": "run_cancellation_unavailable"})
        fillers[0].unlink()
        assert_nothing_written(api)
        assert_recovers(api)


# -- subsystem failures inside SQLite (triggers) ------------------------------------------


def trigger(api: LocalApiServer, table: str, body: str = "SELECT RAISE(ABORT, 'injected failure');", when: str = "BEFORE") -> None:
    api.write(lambda c: c.execute(f'CREATE TRIGGER injected {when} INSERT ON "{table}" BEGIN {body} END'))


def drop_trigger(api: LocalApiServer) -> None:
    api.write(lambda c: c.execute("DROP TRIGGER injected"))


@pytest.mark.parametrize(
    "authorization",
    [pytest.param(None, id="would_be_401"), pytest.param("default", id="would_be_202")],
)
def test_audit_failure_is_503_security_audit_unavailable_and_wins(tmp_path: pathlib.Path, authorization: str | None) -> None:
    with local_api(tmp_path) as api:
        trigger(api, "QingLong3SecurityAuditEvents")
        kwargs = {} if authorization else {"authorization": None}
        response = api.cancel(**kwargs)  # type: ignore[arg-type]
        assert (response.status, response.body) == (503, b'{"code":"security_audit_unavailable"}')
        assert response.closes  # the body was not read
        assert_nothing_written(api)
        drop_trigger(api)
        assert_recovers(api)


def test_event_insert_failure_rolls_the_run_back_and_is_503(tmp_path: pathlib.Path) -> None:
    with local_api(tmp_path) as api:
        trigger(api, "RunEvents")
        response = api.cancel()
        assert (response.status, response.json()) == (503, {"code": "run_cancellation_unavailable"})
        assert_nothing_written(api)
        drop_trigger(api)
        assert_recovers(api)


def test_policy_failure_is_503_authorization_unavailable_and_audited(tmp_path: pathlib.Path) -> None:
    with local_api(tmp_path) as api:
        api.write(lambda c: c.execute('ALTER TABLE "QingLong3ProjectRoleBindings" RENAME TO "hidden_bindings"'))
        response = api.cancel()
        assert (response.status, response.json()) == (503, {"code": "authorization_unavailable"})
        rows = api.audit_rows()
        assert [(r[2], r[4], r[5], r[6], r[7]) for r in rows] == [
            ("user", "authorization_unavailable", '["authorization_unavailable"]', None, None)
        ]
        api.write(lambda c: c.execute('ALTER TABLE "hidden_bindings" RENAME TO "QingLong3ProjectRoleBindings"'))
        assert_nothing_written(api)
        assert_recovers(api)


def test_missing_pepper_file_is_503_authentication_unavailable_and_audited(tmp_path: pathlib.Path) -> None:
    with local_api(tmp_path) as api:
        pepper = next((tmp_path / "pepper").iterdir())
        hidden = pepper.with_name("hidden")
        pepper.rename(hidden)
        response = api.cancel()
        assert (response.status, response.json()) == (503, {"code": "authentication_unavailable"})
        assert [(r[2], r[4]) for r in api.audit_rows()] == [(None, "authentication_unavailable")]
        hidden.rename(pepper)
        assert_recovers(api)


def test_confirm_failure_is_503_authentication_unavailable_not_audited(tmp_path: pathlib.Path) -> None:
    """The credential is revoked right after the audit row commits (a trigger), so the
    confirm step sees a changed fence."""
    with local_api(tmp_path) as api:
        trigger(api, "QingLong3SecurityAuditEvents",
                "UPDATE \"QingLong3ApiCredentials\" SET state = 'revoked';", when="AFTER")
        response = api.cancel()
        assert (response.status, response.json()) == (503, {"code": "authentication_unavailable"})
        assert response.closes
        assert [r[4] for r in api.audit_rows()] == ["allowed"]  # the confirm itself writes nothing
        assert_nothing_written(api)


def test_closed_store_is_503(tmp_path: pathlib.Path) -> None:
    with local_api(tmp_path) as api:
        api.store.close()
        response = api.get("/api/v3/projects/default/runs")
        assert (response.status, response.json()) == (503, {"code": "security_audit_unavailable"})
