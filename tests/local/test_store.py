"""The Store on real SQLite files: migrations, refusal cases, pragmas, the bounded queue."""

from __future__ import annotations

import hashlib
import os
import pathlib
import sqlite3
import stat
import subprocess
import threading
from collections.abc import Callable, Iterator

import pytest

from qinglong_edge.errors import StoreError
from qinglong_edge.local import schema
from qinglong_edge.local.store import (
    MAX_PENDING,
    Store,
    _journal_and_probe,
    write_transaction,
)
from tests.support.mounts import tmpfs
from tests.support.wait import wait_until


def _sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _open_refused_untouched(db_path: pathlib.Path, code: str, says: str = "") -> None:
    """``Store.open`` refuses the database with ``code`` (its message saying ``says``) and
    leaves the file as it was, byte for byte."""
    before = _sha256(db_path)
    with pytest.raises(StoreError) as info:
        Store.open(str(db_path))
    assert info.value.code == code
    assert says in info.value.message
    assert _sha256(db_path) == before


@pytest.fixture
def db_path(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "state" / "local.db"


@pytest.fixture
def store(db_path: pathlib.Path) -> Iterator[Store]:
    with Store.open(str(db_path)) as opened:
        yield opened


# -- migrations ------------------------------------------------------------------------


def test_migrates_an_empty_database_and_records_every_migration(db_path: pathlib.Path) -> None:
    with Store.open(str(db_path)) as opened:
        rows = opened.run(lambda c: c.execute("SELECT version, name, checksum FROM schema_migrations").fetchall())
        user_version = opened.run(lambda c: c.execute("PRAGMA user_version").fetchone()[0])
        tables = opened.run(lambda c: {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")})
        project = opened.run(lambda c: c.execute('SELECT * FROM "QingLong3Projects"').fetchall())
    assert [(v, n, cs) for v, n, cs in rows] == [(m.version, m.name, m.checksum) for m in schema.MIGRATIONS]
    assert user_version == schema.SCHEMA_VERSION
    for table in (
        "QingLong3Projects", "QingLong3ProjectRoleBindings", "QingLong3SecurityAuditEvents",
        "QingLong3IdentitySubjects", "QingLong3ApiCredentials", "QingLong3ApiCredentialPepperBindings",
        "QingLong3LocalOwnerPepperKeys", "QingLong3LocalOwnerPepperActivations", "Runs", "RunAttempts",
        "RunEvents", "StepRuns", "StepRunMutations", "QingLongEdgeTasks", "QingLongEdgeTaskRevisions",
    ):
        assert table in tables
    assert project == [("default", "Default", "default", "active", 1, 0, 0)]


def test_reopen_applies_nothing_twice_and_keeps_data(db_path: pathlib.Path) -> None:
    with Store.open(str(db_path)) as first:
        first.run(lambda c: c.execute(
            "INSERT INTO \"QingLong3Projects\" VALUES ('p2','P2','p2','active',1,5,5)"))
        applied_at = first.run(lambda c: c.execute("SELECT applied_at_ms FROM schema_migrations").fetchall())
    with Store.open(str(db_path)) as second:
        assert second.run(lambda c: c.execute("SELECT applied_at_ms FROM schema_migrations").fetchall()) == applied_at
        assert second.run(lambda c: c.execute('SELECT count(*) FROM "QingLong3Projects"').fetchone()[0]) == 2


def test_each_migration_is_one_transaction(db_path: pathlib.Path) -> None:
    """A database stopped after migration 2 resumes at 3; a partial step never shows."""
    with Store.open(str(db_path)):
        pass
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys=OFF")
    for name in ("StepRunMutations", "StepRuns", "RunEvents", "RunAttempts", "Runs",
                 "QingLongEdgeTaskRevisions", "QingLongEdgeTasks", "QingLongEdgeLogRetirements"):
        conn.execute(f'DROP TABLE "{name}"')
    for column in ("refused_since_ms", "refused_count"):  # migration 5 (its CHECK names the other first)
        conn.execute(f'ALTER TABLE "QingLong3SecurityAuditEvents" DROP COLUMN {column}')
    conn.execute("DELETE FROM schema_migrations WHERE version >= 3")
    conn.close()
    with Store.open(str(db_path)) as reopened:
        versions = reopened.run(lambda c: [r[0] for r in c.execute("SELECT version FROM schema_migrations")])
        assert versions == list(range(1, schema.SCHEMA_VERSION + 1))
        assert reopened.run(lambda c: c.execute('SELECT count(*) FROM "Runs"').fetchone()[0]) == 0


def test_migration_7_adds_the_boot_clock_deadline_and_keeps_the_runs(db_path: pathlib.Path) -> None:
    """Issue 23: a database of schema 6 (Runs with wall-clock deadlines) moves to the boot
    clock's columns; the rows stay, their boot deadline unknown (the wall one then counts)."""
    with Store.open(str(db_path)):
        pass
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute('ALTER TABLE "RunAttempts" DROP COLUMN deadline_boot_id')
    conn.execute('ALTER TABLE "RunAttempts" DROP COLUMN deadline_boot_ms')
    conn.execute("DELETE FROM schema_migrations WHERE version = 7")
    conn.close()
    with Store.open(str(db_path)) as reopened:
        columns = reopened.run(lambda c: [r[1] for r in c.execute('PRAGMA table_info("RunAttempts")')])
        assert columns[-2:] == ["deadline_boot_ms", "deadline_boot_id"]
        with pytest.raises(StoreError, match="qle_attempts_deadline_boot_id_check"):  # a boot deadline names its boot
            reopened.run(lambda c: c.execute(
                'INSERT INTO "RunAttempts" (id, run_id, attempt, status, executor_type, created_at_ms,'
                " deadline_boot_ms) VALUES ('a', 'r', 1, 'claimed', 'local_process', 0, 5)"))


def test_rejects_a_database_newer_than_the_code(db_path: pathlib.Path) -> None:
    with Store.open(str(db_path)):
        pass
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("INSERT INTO schema_migrations VALUES (?, 'future', ?, 1)", (schema.SCHEMA_VERSION + 1, "0" * 64))
    conn.close()
    _open_refused_untouched(db_path, "database_newer", "upgrade")


def test_rejects_a_database_whose_applied_migration_differs(db_path: pathlib.Path) -> None:
    with Store.open(str(db_path)):
        pass
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("UPDATE schema_migrations SET checksum = ? WHERE version = 2", ("f" * 64,))
    conn.close()
    with pytest.raises(StoreError) as info:
        Store.open(str(db_path))
    assert info.value.code == "schema_mismatch"


@pytest.mark.parametrize("kind", ["other_application_id", "tables_without_migrations"])
def test_rejects_a_foreign_database(db_path: pathlib.Path, kind: str) -> None:
    db_path.parent.mkdir(parents=True)
    conn = sqlite3.connect(db_path, isolation_level=None)
    if kind == "other_application_id":
        conn.execute("PRAGMA application_id = 1234")
    conn.execute("CREATE TABLE crons (id INTEGER)")
    conn.close()
    _open_refused_untouched(db_path, "database_foreign")


# -- corruption ------------------------------------------------------------------------


def _populated(db_path: pathlib.Path) -> None:
    with Store.open(str(db_path)) as opened:
        def fill(c: sqlite3.Connection) -> None:
            with write_transaction(c):
                for i in range(300):
                    c.execute(
                        "INSERT INTO \"QingLong3Projects\" VALUES (?, ?, ?, 'active', 1, 0, 0)",
                        (f"p{i}", f"Project {i} " + "x" * 100, f"p{i}"),
                    )
        opened.run(fill)


@pytest.mark.parametrize("damage", ["btree_page", "header"])
def test_rejects_a_corrupted_database_and_leaves_it_untouched(db_path: pathlib.Path, damage: str) -> None:
    _populated(db_path)
    conn = sqlite3.connect(db_path)
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'QingLong3Projects'").fetchone()[0]
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    data = bytearray(db_path.read_bytes())
    if damage == "btree_page":
        offset = (root - 1) * page_size
        data[offset : offset + 12] = b"\xff" * 12  # page type and cell pointers: garbage
    else:
        data[0:16] = b"not a database!\x00"
    db_path.write_bytes(bytes(data))
    _open_refused_untouched(db_path, "database_corrupt", "untouched")
    assert sorted(os.listdir(db_path.parent)) == ["local.db"]


# -- files and permissions -------------------------------------------------------------


def test_creates_missing_directory_0700_and_file_0600(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "new" / "dir" / "local.db"
    with Store.open(str(path)):
        pass
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_rejects_a_symlinked_database_path(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "real.db"
    with Store.open(str(target)):
        pass
    link = tmp_path / "link.db"
    link.symlink_to(target)
    with pytest.raises(StoreError) as info:
        Store.open(str(link))
    assert info.value.code == "unsafe_storage"


def test_connection_policy_pragmas(store: Store) -> None:
    def read(c: sqlite3.Connection) -> dict[str, object]:
        names = ("foreign_keys", "recursive_triggers", "synchronous", "busy_timeout", "journal_mode",
                 "cache_size", "mmap_size", "journal_size_limit", "trusted_schema")
        return {n: c.execute(f"PRAGMA {n}").fetchone()[0] for n in names}
    values = read_values = store.run(read)
    assert values["foreign_keys"] == 1
    assert values["recursive_triggers"] == 0
    assert values["synchronous"] == 2  # FULL
    assert values["busy_timeout"] == 5000
    assert values["journal_mode"] == "delete" and store.journal_mode == "delete"
    assert (values["cache_size"], values["mmap_size"], values["journal_size_limit"]) == (-4096, 0, 8 * 1024 * 1024)
    assert read_values["trusted_schema"] == (1 if store.trusted_schema else 0)


def test_foreign_keys_are_enforced(store: Store) -> None:
    with pytest.raises(StoreError) as info:
        store.run(lambda c: c.execute(
            "INSERT INTO \"RunAttempts\" (id, run_id, attempt, status, executor_type, created_at_ms) "
            "VALUES ('a', 'missing-run', 1, 'claimed', 'local_process', 0)"))
    assert info.value.code == "storage_unavailable"
    assert "SQLITE_CONSTRAINT" in info.value.message


def test_standalone_uses_wal(tmp_path: pathlib.Path) -> None:
    with Store.open(str(tmp_path / "s.db"), profile="standalone") as opened:
        assert opened.journal_mode == "wal"
        assert opened.journal_fallback is None
        assert opened.run(lambda c: c.execute("PRAGMA journal_mode").fetchone()[0]) == "wal"
        assert opened.run(lambda c: c.execute("PRAGMA mmap_size").fetchone()[0]) == 64 * 1024 * 1024


def test_wal_falls_back_to_delete_where_shared_memory_is_missing(tmp_path: pathlib.Path) -> None:
    """The ``unix-none`` VFS has no shared-memory support, like a JFFS2 mount: WAL is refused."""
    path = tmp_path / "nowal.db"
    conn = sqlite3.connect(f"file:{path}?vfs=unix-none", uri=True, isolation_level=None)
    try:
        mode, reason = _journal_and_probe(conn, "standalone", str(path))
        assert mode == "delete"
        assert reason is not None and "WAL" in reason
        assert conn.execute("SELECT count(*) FROM store_probe").fetchone()[0] == 1
    finally:
        conn.close()


# -- read-only storage -----------------------------------------------------------------


@pytest.fixture
def readonly_bind(tmp_path: pathlib.Path) -> Iterator[tuple[pathlib.Path, pathlib.Path]]:
    """(writable source dir, its bind mount) the test can flip to read-only with remount."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root (chattr is unavailable)")
    source = tmp_path / "rw"
    mount = tmp_path / "ro"
    source.mkdir(mode=0o700)
    mount.mkdir(mode=0o700)
    if subprocess.run(["mount", "--bind", str(source), str(mount)], capture_output=True).returncode != 0:
        pytest.skip("bind mounts are not permitted here")
    try:
        yield source, mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _remount(mount: pathlib.Path, mode: str) -> None:
    proc = subprocess.run(["mount", "-o", f"remount,{mode},bind", str(mount)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot remount {mode}: {proc.stderr.decode().strip()}")


@pytest.mark.root
def test_a_read_only_database_refuses_to_open_as_storage_unavailable(
    readonly_bind: tuple[pathlib.Path, pathlib.Path],
) -> None:
    _source, mount = readonly_bind
    with Store.open(str(mount / "local.db")):
        pass
    _remount(mount, "ro")
    with pytest.raises(StoreError) as info:
        Store.open(str(mount / "local.db"))
    assert info.value.code == "storage_unavailable"


@pytest.fixture
def small_tmpfs(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    with tmpfs(tmp_path / "small", "1m", lazy=True) as mount:
        yield mount


@pytest.mark.root
def test_a_full_disk_is_storage_unavailable_and_rolls_back(small_tmpfs: pathlib.Path) -> None:
    """The Local API answers 503 on ENOSPC (local-api.md 10.8); the row is not half-written."""
    with Store.open(str(small_tmpfs / "local.db")) as opened:
        free = os.statvfs(small_tmpfs).f_bavail * os.statvfs(small_tmpfs).f_frsize
        (small_tmpfs / "filler").write_bytes(b"\0" * max(0, free - 8192))

        def insert_many(c: sqlite3.Connection) -> None:
            with write_transaction(c):
                for i in range(200):
                    c.execute("INSERT INTO \"QingLong3Projects\" VALUES (?, ?, ?, 'active', 1, 0, 0)",
                              (f"full{i}", "n" * 250, f"full{i}"))

        with pytest.raises(StoreError) as info:
            opened.run(insert_many)
        assert info.value.code == "storage_unavailable"
        assert "SQLITE_FULL" in info.value.message
        (small_tmpfs / "filler").unlink()
        assert opened.run(lambda c: c.execute('SELECT count(*) FROM "QingLong3Projects"').fetchone()[0]) == 1
        opened.run(insert_many)  # space again: the store recovers without reopening
        assert opened.run(lambda c: c.execute('SELECT count(*) FROM "QingLong3Projects"').fetchone()[0]) == 201


# -- the operation queue ---------------------------------------------------------------


def _blocker(store: Store) -> tuple[threading.Event, threading.Event]:
    """Occupy the store thread until ``release`` is set; ``started`` fires when it runs."""
    started, release = threading.Event(), threading.Event()

    def hold(_c: sqlite3.Connection) -> str:
        started.set()
        release.wait(10)
        return "held"

    store.submit(hold)
    assert started.wait(5)
    return started, release


def test_rejects_the_257th_pending_operation(store: Store) -> None:
    _started, release = _blocker(store)
    futures = [store.submit(lambda c, i=i: i) for i in range(MAX_PENDING)]
    assert store.pending() == MAX_PENDING == 256
    with pytest.raises(StoreError) as info:
        store.submit(lambda c: "one too many")
    assert info.value.code == "store_busy"
    release.set()
    assert [f.result(5) for f in futures] == list(range(MAX_PENDING))  # FIFO
    assert store.run(lambda c: "room again") == "room again"


def test_close_while_busy_finishes_the_running_operation_and_fails_the_queued(store: Store) -> None:
    started, release = threading.Event(), threading.Event()

    def slow(c: sqlite3.Connection) -> int:
        started.set()
        release.wait(10)
        with write_transaction(c):
            c.execute("INSERT INTO \"QingLong3Projects\" VALUES ('late','Late','late','active',1,0,0)")
        return 7

    running = store.submit(slow)
    assert started.wait(5)
    queued = [store.submit(lambda c: "never") for _ in range(3)]
    closer = threading.Thread(target=store.close)
    closer.start()
    assert wait_until(lambda: all(future.done() for future in queued))  # close() fenced the store
    with pytest.raises(StoreError) as after:
        store.run(lambda c: "after close")
    assert after.value.code == "store_closed"
    for future in queued:
        with pytest.raises(StoreError) as info:
            future.result(5)
        assert info.value.code == "store_closed"
    release.set()
    closer.join(5)
    assert running.result(5) == 7
    conn = sqlite3.connect(store.path)
    assert conn.execute("SELECT count(*) FROM \"QingLong3Projects\" WHERE id = 'late'").fetchone()[0] == 1
    conn.close()


def test_a_timed_out_queued_operation_never_runs(store: Store) -> None:
    _started, release = _blocker(store)
    ran = threading.Event()
    with pytest.raises(StoreError) as info:
        store.run(lambda c: ran.set(), timeout_s=0.05)
    assert info.value.code == "storage_unavailable"
    assert store.pending() == 0
    release.set()
    store.run(lambda c: None)
    assert not ran.is_set()


def _refused_and_rolled_back(store: Store, operation: Callable[[sqlite3.Connection], None], project_id: str) -> None:
    """``operation`` fails as ``storage_unavailable`` and the project row it inserted is gone."""
    with pytest.raises(StoreError) as info:
        store.run(operation)
    assert info.value.code == "storage_unavailable"
    assert store.run(lambda c: c.execute("SELECT count(*) FROM \"QingLong3Projects\" WHERE id=?", (project_id,))
                     .fetchone()[0]) == 0


def test_sqlite_errors_become_storage_unavailable_and_roll_back(store: Store) -> None:
    def half_then_fail(c: sqlite3.Connection) -> None:
        c.execute("BEGIN IMMEDIATE")
        c.execute("INSERT INTO \"QingLong3Projects\" VALUES ('half','Half','half','active',1,0,0)")
        c.execute("INSERT INTO \"QingLong3Projects\" VALUES ('bad','Bad','NOT A SLUG','active',1,0,0)")

    _refused_and_rolled_back(store, half_then_fail, "half")


def test_an_operation_that_leaves_a_transaction_open_is_rolled_back(store: Store) -> None:
    def leak(c: sqlite3.Connection) -> None:
        c.execute("BEGIN IMMEDIATE")
        c.execute("INSERT INTO \"QingLong3Projects\" VALUES ('leak','Leak','leak','active',1,0,0)")

    _refused_and_rolled_back(store, leak, "leak")


def test_busy_database_past_the_timeout_is_storage_unavailable(db_path: pathlib.Path) -> None:
    with Store.open(str(db_path), busy_timeout_ms=100) as opened:
        other = sqlite3.connect(db_path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            def write(c: sqlite3.Connection) -> None:
                with write_transaction(c):
                    c.execute("INSERT INTO \"QingLong3Projects\" VALUES ('w','W','w','active',1,0,0)")
            with pytest.raises(StoreError) as info:
                opened.run(write)
            assert info.value.code == "storage_unavailable"
            assert "SQLITE_BUSY" in info.value.message
        finally:
            other.execute("ROLLBACK")
            other.close()


def test_rejects_a_nested_run_from_the_store_thread(store: Store) -> None:
    with pytest.raises(RuntimeError):
        store.run(lambda c: store.run(lambda c2: 1))


def test_store_error_from_an_operation_passes_through(store: Store) -> None:
    def refuse(_c: sqlite3.Connection) -> None:
        raise StoreError("no such thing", code="not_found")

    with pytest.raises(StoreError) as info:
        store.run(refuse)
    assert info.value.code == "not_found"


def test_close_is_idempotent_and_fences(store: Store) -> None:
    store.close()
    store.close()
    assert store.closed
    with pytest.raises(StoreError) as info:
        store.submit(lambda c: 1)
    assert info.value.code == "store_closed"


@pytest.mark.parametrize("kwargs", [{"profile": "router"}, {"busy_timeout_ms": 99}, {"busy_timeout_ms": 30001}])
def test_rejects_bad_open_arguments(tmp_path: pathlib.Path, kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Store.open(str(tmp_path / "x.db"), **kwargs)  # type: ignore[arg-type]


def test_concurrent_opens_migrate_exactly_once(tmp_path: pathlib.Path) -> None:
    """Several processes (here threads with their own connections) opening a new file race safely."""
    path = str(tmp_path / "race" / "local.db")
    stores: list[Store] = []
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            stores.append(Store.open(path))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        assert errors == []
        assert len(stores) == 4
        versions = stores[0].run(lambda c: [r[0] for r in c.execute("SELECT version FROM schema_migrations")])
        assert versions == [m.version for m in schema.MIGRATIONS]
    finally:
        for opened in stores:
            opened.close()


def test_file_probed_but_not_yet_migrated_is_ours(tmp_path: pathlib.Path) -> None:
    """Regression: a second opener that looks between a first opener's write probe and its
    first migration saw only ``store_probe`` and refused the file as ``database_foreign``."""
    import sqlite3

    from qinglong_edge.local.store import STORE_PROBE_DDL

    path = tmp_path / "local.db"
    conn = sqlite3.connect(path)
    conn.execute(STORE_PROBE_DDL)
    conn.commit()
    conn.close()
    path.chmod(0o600)
    store = Store.open(str(path))
    try:
        versions = store.run(lambda c: [r[0] for r in c.execute("SELECT version FROM schema_migrations")])
        assert versions == [m.version for m in schema.MIGRATIONS]
    finally:
        store.close()


# -- ownership (found following the README: `admin` run as root beside a service user) -----


@pytest.fixture
def root_only() -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")


@pytest.mark.root
def test_rejects_a_database_owned_by_another_user(root_only: None, tmp_path: pathlib.Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    with Store.open(str(state / "local.db")):
        pass
    os.chown(state / "local.db", 65534, 65534)
    with pytest.raises(StoreError) as info:
        Store.open(str(state / "local.db"))
    assert info.value.code == "unsafe_storage"
    assert "owned by uid 65534" in info.value.message
    assert sorted(p.name for p in state.iterdir()) == ["local.db"]  # no journal file of ours beside it


@pytest.mark.root
def test_rejects_creating_a_database_in_another_users_directory(root_only: None, tmp_path: pathlib.Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, 65534, 65534)
    with pytest.raises(StoreError) as info:
        Store.open(str(state / "local.db"))
    assert info.value.code == "unsafe_storage"
    assert "uid 65534" in info.value.message
    assert list(state.iterdir()) == []  # nothing planted that the owner could not open
