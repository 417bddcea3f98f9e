"""The Local SQLite store: one connection per process behind one bounded FIFO queue.

Sources: local-api.md section 5 (connection policy, ``LocalSqliteOperationAuthority``:
one connection, a FIFO queue of at most 256 pending operations, a close fence) and
section 11 item 6; spec README ("SQLite": ``synchronous=FULL``, ``journal_mode=DELETE``
on the edge profile because WAL needs a writable shared-memory mmap that JFFS2 lacks,
WAL on standalone).

Public API (stable; the HTTP server and the execution controller build on it)::

    store = Store.open("/var/lib/qinglong-edge/local.db", profile="edge", busy_timeout_ms=5000)
    result = store.run(lambda conn: ..., timeout_s=5.0)    # fn runs on the store thread
    future = store.submit(lambda conn: ...)                # non-blocking variant
    store.close()

    with write_transaction(conn):      # BEGIN IMMEDIATE ... COMMIT / ROLLBACK
        ...
    with read_transaction(conn):       # BEGIN (deferred) ... COMMIT: one snapshot
        ...

Rules for an operation ``fn(conn)``:

* It runs on the single store thread, in queue order, and must not block on anything
  but SQLite (no network, no sleeping, no nested ``store.run``: that raises
  ``RuntimeError``).
* ``conn`` is in autocommit mode (``isolation_level=None``); a write uses
  :func:`write_transaction` (``BEGIN IMMEDIATE``, so the busy timeout applies to the lock
  up front). An operation that returns with a transaction still open is a bug: it is
  rolled back and reported as ``storage_unavailable``.
* Rows are plain tuples (the default row factory); do not change connection settings.
* The repository writers (:mod:`~qinglong_edge.local.identity`, ``policy``, ``audit``,
  ``tasks``, ``runs``) open their own transaction: call them one per operation (or
  one after another), never inside another :func:`write_transaction`.
* Callers serving requests should pass ``timeout_s`` so a wedged database cannot hold a
  request thread forever (queue wait included).
* **Time bound**: the lock waits of ONE operation add up to at most ``busy_timeout_ms``
  (plus 10 ms of slack), however many statements it runs. SQLite's busy timeout applies
  per lock attempt, so an operation of four statements could otherwise wait four times
  as long on a database another process holds locked; the connection
  (:class:`_BoundedConnection`) lowers ``PRAGMA busy_timeout`` to what is left of the
  operation's budget before each statement, and to 0 once it is spent (a statement then
  fails at once if, and only if, the database is still locked). Use ``conn.execute`` /
  ``executemany`` / ``executescript`` or ``conn.cursor()``: all are bounded.
* Any ``sqlite3.Error`` escaping ``fn`` becomes :class:`StoreError` code
  ``storage_unavailable`` (busy past the timeout, I/O error, read-only, disk full,
  constraint failure); a :class:`StoreError` raised by ``fn`` passes through unchanged,
  as does any other exception (a bug). The transaction, if any, is rolled back first.

Error codes (:class:`qinglong_edge.errors.StoreError`):

``store_busy``          256 operations already pending; refused immediately (HTTP 503)
``store_closed``        after :meth:`Store.close`, and for operations still queued by then
``storage_unavailable`` SQLite failed (see above), an operation timed out, the directory or
                        file cannot be created, or the open-time write probe failed
``database_corrupt``    ``PRAGMA quick_check`` is not ``ok`` or the file is not a database;
                        nothing is written
``database_newer``      the database has a migration newer than this code
``schema_mismatch``     an applied migration differs from this code's (another branch/build)
``database_foreign``    the file is another application's SQLite database
``unsafe_storage``      the database path is a symlink or not a regular file

Connection policy applied by :meth:`Store.open` (local-api.md section 5):
``foreign_keys=ON``, ``trusted_schema=OFF`` (see below), ``recursive_triggers=OFF``,
``cell_size_check=ON``, ``synchronous=FULL``, ``busy_timeout`` (100-30000 ms, default
5000), and per profile ``journal_size_limit``/``cache_size``/``mmap_size`` =
8 MiB/-4096/0 (edge) or 64 MiB/-16384/64 MiB plus ``wal_autocheckpoint=1000``
(standalone). SQLite's defensive mode and the double-quoted-string-literal switches
are set through ``Connection.setconfig`` where Python has it (3.12+); Python 3.11's
``sqlite3`` cannot reach ``sqlite3_db_config``, so there we rely on
``trusted_schema=OFF``, never enabling extension loading or ``writable_schema``, and
single-quoted literals in all our SQL (:attr:`Store.defensive` reports which applies).

``trusted_schema``: our CHECK constraints use the JSON functions (as the reference's
do), and SQLite builds before the JSON functions were marked ``SQLITE_INNOCUOUS``
(3.40.1, for one) refuse them in the schema under ``trusted_schema=OFF`` ("unsafe use of
json_valid()"). :func:`json_needs_trusted_schema` probes the linked SQLite once on an
in-memory database; where it answers ``True`` the store keeps ``trusted_schema=ON``
(:attr:`Store.trusted_schema`). The database file is ours (``0600`` in a ``0700``
directory), so a hostile schema would already mean a compromised account.

Journal mode: edge uses ``DELETE``. Standalone asks for ``WAL`` and then does a real
write transaction (the probe); if WAL cannot be entered or the probe fails in WAL, the
store falls back to ``DELETE`` and probes again. :attr:`Store.journal_mode` is the mode
in effect and :attr:`Store.journal_fallback` the reason for a fallback (else ``None``).
Every open performs the probe: a committed one-row write to ``store_probe``, which is
also what detects a read-only database or directory before serving. An existing database
on a full file system (``SQLITE_FULL``) still opens, so that ``serve`` and ``admin
prune`` can prune their way out of the full disk; its writes fail with
``storage_unavailable`` until there is room (a new database, or a pending migration,
still fails the open).

New databases use ``auto_vacuum=INCREMENTAL`` (set before the first table), so pruning
can shrink the file (:mod:`qinglong_edge.local.retention`); one created before keeps
``none`` (freed pages are reused, the file does not shrink).

Files: a missing parent directory is created ``0700``; a missing database file is
created ``0600`` (``O_EXCL|O_NOFOLLOW``) before SQLite opens it, so SQLite's journal
files inherit ``0600``. Existing directories and files keep their modes.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Self, TypeVar

from qinglong_edge import filecheck
from qinglong_edge.errors import StoreError
from qinglong_edge.local.schema import (
    APPLICATION_ID,
    MIGRATIONS,
    SCHEMA_MIGRATIONS_DDL,
    SCHEMA_VERSION,
    STORE_PROBE_DDL,
    Migration,
)

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_MS",
    "MAX_PENDING",
    "Store",
    "foreign_keys_off",
    "now_ms",
    "read_transaction",
    "write_transaction",
]

T = TypeVar("T")

#: Pending operations the queue holds before refusing with ``store_busy`` (section 5).
MAX_PENDING = 256
DEFAULT_BUSY_TIMEOUT_MS = 5000
MIN_BUSY_TIMEOUT_MS = 100
MAX_BUSY_TIMEOUT_MS = 30_000

_PROFILE_PRAGMAS: dict[str, tuple[tuple[str, int], ...]] = {
    "edge": (("journal_size_limit", 8 * 1024 * 1024), ("cache_size", -4096), ("mmap_size", 0)),
    "standalone": (
        ("journal_size_limit", 64 * 1024 * 1024),
        ("cache_size", -16384),
        ("mmap_size", 64 * 1024 * 1024),
        ("wal_autocheckpoint", 1000),
    ),
}

# Primary result codes (sqlite3.h) that mean "the file is damaged or not a database".
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26
_SQLITE_FULL = 13


#: Lock-wait slack of one operation before its busy timeout is lowered (ms).
_BUSY_SLACK_MS = 10


class _BoundedConnection(sqlite3.Connection):
    """A connection whose lock waits within one store operation stay within one busy
    timeout in total (module docstring, "Time bound"). Outside an operation (open,
    migrations) each statement has the whole busy timeout, as SQLite has it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: float | None = None
        self._applied_ms = -1

    def _set_busy(self, milliseconds: int) -> None:
        super().execute(f"PRAGMA busy_timeout = {int(milliseconds)}")
        self._applied_ms = milliseconds

    def begin_operation(self, busy_timeout_ms: int) -> None:
        """The operation's lock waits may add up to ``busy_timeout_ms`` from now."""
        if self._applied_ms != busy_timeout_ms:
            self._set_busy(busy_timeout_ms)
        self._deadline = time.monotonic() + busy_timeout_ms / 1000

    def end_operation(self) -> None:
        self._deadline = None

    def bound(self) -> None:
        """Before a statement: lower the busy timeout to what is left of the budget."""
        if self._deadline is None:
            return
        left = max(0, int((self._deadline - time.monotonic()) * 1000))
        if left < self._applied_ms - _BUSY_SLACK_MS or (left == 0 and self._applied_ms != 0):
            self._set_busy(left)

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        self.bound()
        return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        self.bound()
        return super().executemany(sql, parameters)

    def executescript(self, sql_script: str, /) -> sqlite3.Cursor:
        self.bound()
        return super().executescript(sql_script)

    def cursor(self, factory: Any = None) -> Any:
        return super().cursor(factory or _BoundedCursor)


class _BoundedCursor(sqlite3.Cursor):
    """A cursor of :class:`_BoundedConnection` (its statements are bounded too)."""

    def execute(self, sql: str, parameters: Any = (), /) -> Self:
        connection = self.connection
        if isinstance(connection, _BoundedConnection):
            connection.bound()
        return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> Self:
        connection = self.connection
        if isinstance(connection, _BoundedConnection):
            connection.bound()
        return super().executemany(sql, parameters)


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch (what the contract stores)."""
    return time.time_ns() // 1_000_000


def _error_name(exc: sqlite3.Error) -> str:
    return str(getattr(exc, "sqlite_errorname", "") or type(exc).__name__)


def _unavailable(what: str, exc: BaseException) -> StoreError:
    detail = _error_name(exc) if isinstance(exc, sqlite3.Error) else type(exc).__name__
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return StoreError(f"{what}: {detail}" + (f" ({text})" if text else ""), code="storage_unavailable")


def _rollback_quietly(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection, begin: str) -> Iterator[sqlite3.Connection]:
    """``begin`` ... ``COMMIT``; ``ROLLBACK`` on any exception, the commit's too (re-raised)."""
    conn.execute(begin)
    try:
        yield conn
    except BaseException:
        _rollback_quietly(conn)
        raise
    try:
        conn.execute("COMMIT")
    except BaseException:
        _rollback_quietly(conn)
        raise


def write_transaction(conn: sqlite3.Connection) -> contextlib.AbstractContextManager[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``; ``ROLLBACK`` on any exception (re-raised).

    The write lock is taken up front, so a busy database fails here after the busy
    timeout (``sqlite3.OperationalError``, mapped by :meth:`Store.run`).
    """
    return _transaction(conn, "BEGIN IMMEDIATE")


@contextlib.contextmanager
def foreign_keys_off(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """Foreign key enforcement off for one operation, back on afterwards (always).

    For the Run pruning only (:mod:`qinglong_edge.local.retention`): it deletes a Run's
    rows child tables first, so no key is left dangling, and without enforcement SQLite
    does not scan the unindexed child columns (``RunEvents.attempt_id``,
    ``Runs.parent_run_id``...) once per deleted row. The pragma is a no-op inside a
    transaction, so this must be entered in autocommit mode, around the transaction.

    Raises:
        RuntimeError: a transaction is open (a caller bug).
    """
    if conn.in_transaction:
        raise RuntimeError("foreign_keys_off inside a transaction")
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
        yield conn
    finally:
        _rollback_quietly(conn)
        conn.execute("PRAGMA foreign_keys = ON")


def read_transaction(conn: sqlite3.Connection) -> contextlib.AbstractContextManager[sqlite3.Connection]:
    """``BEGIN`` (deferred) ... ``COMMIT``: several reads see one snapshot."""
    return _transaction(conn, "BEGIN")


def _other_owner(what: str, uid: int, euid: int) -> StoreError:
    # An operator who runs `admin` as root beside a service user would otherwise leave
    # files the service cannot open (SQLITE_CANTOPEN later, far from the cause).
    return StoreError(
        f"{what} is owned by uid {uid}, not by this user (uid {euid}): run qinglong-edge as the user that owns it",
        code="unsafe_storage",
    )


def _prepare_file(path: str) -> None:
    """Create the parent directory (0700) and an empty database file (0600) if missing.

    The file, or the directory it would be created in, must belong to the effective
    user (as the journal and the pepper keyring require): ``unsafe_storage`` otherwise,
    with nothing created.
    """
    directory = os.path.dirname(path) or "."
    euid = os.geteuid()
    try:
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=0o700, exist_ok=True)
            os.chmod(directory, 0o700)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            info = None
        except PermissionError:
            # A directory of another user that we cannot even look into: that is the
            # cause (unsafe_storage, 73), not an I/O failure of the file (issue 18).
            directory_uid = os.stat(directory).st_uid
            if directory_uid != euid:
                raise _other_owner(f"{directory}: the database directory", directory_uid, euid) from None
            raise
        if info is not None:
            # Any mode: an existing database file keeps its own.
            problem = filecheck.stat_problem(info, path, directory=False, forbidden=0)
            if problem is not None and problem.kind == "foreign_owner":
                raise _other_owner(f"{path}: the database", info.st_uid, euid)
            if problem is not None:
                raise StoreError(f"{path}: database path is not a regular file", code="unsafe_storage")
            return
        directory_uid = os.stat(directory).st_uid
        if directory_uid != euid:
            raise _other_owner(f"{directory}: the database directory", directory_uid, euid)
        try:
            filecheck.create_file(path, mode=0o600)  # O_EXCL|O_NOFOLLOW, fsync of it and its directory
        except FileExistsError:
            _prepare_file(path)  # created concurrently: check it like an existing one
            return
    except OSError as exc:
        raise StoreError(
            f"{path}: cannot prepare the database file ({exc.strerror or type(exc).__name__})",
            code="storage_unavailable",
        ) from None


class Store:
    """One SQLite connection owned by one thread behind one bounded FIFO queue.

    Create with :meth:`open`; see the module docstring for the rules and error codes.

    Attributes:
        path: absolute database path.
        profile: ``edge`` or ``standalone``.
        busy_timeout_ms: the SQLite busy timeout in milliseconds.
        journal_mode: journal mode in effect (``delete`` or ``wal``).
        journal_fallback: why WAL was not used on standalone, else ``None``.
        defensive: ``True`` when SQLite's defensive mode could be enabled.
        trusted_schema: ``True`` when this SQLite needed ``trusted_schema=ON``.
        schema_version: the schema version after migrations.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        path: str,
        profile: str,
        busy_timeout_ms: int,
        journal_mode: str,
        journal_fallback: str | None,
        defensive: bool,
        max_pending: int,
    ) -> None:
        self._conn = conn
        self.path = path
        self.profile = profile
        self.busy_timeout_ms = busy_timeout_ms
        self.journal_mode = journal_mode
        self.journal_fallback = journal_fallback
        self.defensive = defensive
        self.trusted_schema = json_needs_trusted_schema()
        self.schema_version = SCHEMA_VERSION
        self._max_pending = max_pending
        self._queue: collections.deque[tuple[Future[Any], Callable[[sqlite3.Connection], Any]]] = (
            collections.deque()
        )
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._worker, name="qinglong-store", daemon=True)
        self._thread.start()

    # -- opening -----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str,
        *,
        profile: str = "edge",
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        max_pending: int = MAX_PENDING,
    ) -> Store:
        """Open (creating if needed), check, probe and migrate the database.

        Order: prepare the file; connect; connection pragmas; ``PRAGMA quick_check``
        (nothing has been written yet); schema identity (newer / foreign / mismatched);
        journal mode and the write probe; pending migrations, each in one transaction.

        Args:
            path: database file path.
            profile: ``edge`` (``DELETE`` journal) or ``standalone`` (``WAL``, with fallback).
            busy_timeout_ms: 100-30000.
            max_pending: queue bound (tests may lower it; production uses 256).

        Raises:
            StoreError: ``database_corrupt``, ``database_newer``, ``schema_mismatch``,
                ``database_foreign``, ``unsafe_storage``, ``storage_unavailable``.
            ValueError: a bad ``profile``/``busy_timeout_ms``/``max_pending`` (a caller bug).
        """
        if profile not in _PROFILE_PRAGMAS:
            raise ValueError("profile must be 'edge' or 'standalone'")
        if not MIN_BUSY_TIMEOUT_MS <= busy_timeout_ms <= MAX_BUSY_TIMEOUT_MS:
            raise ValueError("busy_timeout_ms must be 100..30000")
        if max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        path = os.path.abspath(path)
        _prepare_file(path)
        try:
            conn = sqlite3.connect(
                path,
                timeout=busy_timeout_ms / 1000,
                isolation_level=None,
                check_same_thread=False,
                factory=_BoundedConnection,
            )
        except sqlite3.Error as exc:
            raise _unavailable(f"{path}: cannot open the database", exc) from None
        try:
            defensive = _configure(conn, path, profile, busy_timeout_ms)
            _quick_check(conn, path)
            _check_identity(conn, path)
            _choose_auto_vacuum(conn, path)
            journal_mode, fallback = _journal_and_probe(conn, profile, path)
            _migrate(conn, path)
        except BaseException:
            conn.close()
            raise
        return cls(
            conn,
            path=path,
            profile=profile,
            busy_timeout_ms=busy_timeout_ms,
            journal_mode=journal_mode,
            journal_fallback=fallback,
            defensive=defensive,
            max_pending=max_pending,
        )

    # -- the queue ---------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def pending(self) -> int:
        """Operations queued and not yet started."""
        with self._cond:
            return len(self._queue)

    def submit(self, fn: Callable[[sqlite3.Connection], T]) -> Future[T]:
        """Queue ``fn`` and return its future without waiting.

        Raises:
            StoreError: ``store_closed`` after :meth:`close`; ``store_busy`` when
                :data:`MAX_PENDING` operations are already waiting (refused at once).
        """
        future: Future[T] = Future()
        with self._cond:
            if self._closed:
                raise StoreError("the store is closed", code="store_closed")
            if len(self._queue) >= self._max_pending:
                raise StoreError(
                    f"{self._max_pending} store operations are already pending", code="store_busy"
                )
            self._queue.append((future, fn))
            self._cond.notify()
        return future

    def run(self, fn: Callable[[sqlite3.Connection], T], *, timeout_s: float | None = None) -> T:
        """Run ``fn(conn)`` on the store thread and return its result.

        Args:
            fn: the operation (see the module rules).
            timeout_s: how long to wait for the result, ``None`` for no limit. An operation
                still queued at the deadline is withdrawn and never runs; one already
                running finishes (its result is discarded).

        Raises:
            StoreError: ``store_closed``, ``store_busy``, ``storage_unavailable`` (SQLite
                error or timeout), or whatever ``StoreError`` ``fn`` raised.
            RuntimeError: when called from the store thread itself (would deadlock).
        """
        if threading.current_thread() is self._thread:
            raise RuntimeError("Store.run called from inside a store operation")
        future = self.submit(fn)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            if future.done():
                raise  # fn itself raised TimeoutError
            with self._cond:
                if future.cancel():
                    for item in self._queue:
                        if item[0] is future:
                            self._queue.remove(item)
                            break
            raise StoreError(
                f"store operation did not finish within {timeout_s} s", code="storage_unavailable"
            ) from None

    def close(self, timeout_s: float | None = None) -> None:
        """Fence the store: refuse new operations, fail queued ones, finish the running one.

        Queued operations fail with ``store_closed``; the running one completes; then the
        connection is closed. Idempotent. From inside an operation it only fences (the
        connection closes when that operation returns).
        """
        with self._cond:
            if not self._closed:
                self._closed = True
                while self._queue:
                    future, _fn = self._queue.popleft()
                    if future.set_running_or_notify_cancel():
                        future.set_exception(StoreError("the store was closed", code="store_closed"))
                self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _worker(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    break
                future, fn = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = self._execute(fn)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                future.set_exception(exc)
            else:
                future.set_result(result)
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()

    def _execute(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        bounded = conn if isinstance(conn, _BoundedConnection) else None
        try:
            if bounded is not None:
                bounded.begin_operation(self.busy_timeout_ms)
            result = fn(conn)
        except StoreError:
            _rollback_quietly(conn)
            raise
        except sqlite3.Error as exc:
            _rollback_quietly(conn)
            raise _unavailable("store operation failed", exc) from exc
        except BaseException:
            _rollback_quietly(conn)
            raise
        finally:
            if bounded is not None:
                bounded.end_operation()
        if conn.in_transaction:
            _rollback_quietly(conn)
            raise StoreError("store operation left a transaction open", code="storage_unavailable")
        return result


# -- open helpers ----------------------------------------------------------------------


@functools.cache
def json_needs_trusted_schema() -> bool:
    """Whether this SQLite refuses JSON functions in CHECKs under ``trusted_schema=OFF``.

    SQLite marked the JSON functions ``SQLITE_INNOCUOUS`` only in later releases (3.40.1
    still reports "unsafe use of json_valid()"), and our CHECK constraints use them.
    """
    probe = sqlite3.connect(":memory:", isolation_level=None)
    try:
        probe.execute("PRAGMA trusted_schema = OFF")
        probe.execute("CREATE TABLE t (x TEXT CHECK (json_valid(x)))")
        probe.execute("INSERT INTO t VALUES ('{}')")
    except sqlite3.Error:
        return True
    finally:
        probe.close()
    return False


def _configure(conn: sqlite3.Connection, path: str, profile: str, busy_timeout_ms: int) -> bool:
    """Connection pragmas that write nothing; returns whether defensive mode is on."""
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA trusted_schema = {'ON' if json_needs_trusted_schema() else 'OFF'}")
        conn.execute("PRAGMA recursive_triggers = OFF")
        conn.execute("PRAGMA cell_size_check = ON")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        for name, value in _PROFILE_PRAGMAS[profile]:
            conn.execute(f"PRAGMA {name} = {int(value)}")
    except sqlite3.Error as exc:
        raise _open_failure(exc, path, "cannot configure the database connection") from None
    defensive = False
    setconfig = getattr(conn, "setconfig", None)  # Python 3.12+
    if setconfig is not None:
        for constant, enable in (
            ("SQLITE_DBCONFIG_DEFENSIVE", True),
            ("SQLITE_DBCONFIG_DQS_DML", False),
            ("SQLITE_DBCONFIG_DQS_DDL", False),
        ):
            op = getattr(sqlite3, constant, None)
            if op is not None:
                with contextlib.suppress(sqlite3.Error):
                    setconfig(op, enable)
                    defensive = defensive or constant == "SQLITE_DBCONFIG_DEFENSIVE"
    return defensive


def _open_failure(exc: sqlite3.Error, path: str, what: str) -> StoreError:
    """``database_corrupt`` for a damaged file / not a database, else ``storage_unavailable``."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return StoreError(
            f"{path}: the database is damaged or not a SQLite database ({_error_name(exc)}); "
            "it was left untouched: restore it from a backup or move it aside",
            code="database_corrupt",
        )
    return _unavailable(f"{path}: {what}", exc)


def _quick_check(conn: sqlite3.Connection, path: str) -> None:
    """``PRAGMA quick_check``: refuse a damaged database before anything is written."""
    try:
        rows = conn.execute("PRAGMA quick_check").fetchall()
    except sqlite3.Error as exc:
        raise _open_failure(exc, path, "integrity check could not run") from None
    if rows != [("ok",)]:
        first = str(rows[0][0]).splitlines()[0][:160] if rows else "no result"
        raise StoreError(
            f"{path}: PRAGMA quick_check failed ({first}); the database was left untouched: "
            "restore it from a backup or move it aside",
            code="database_corrupt",
        )


def _applied(conn: sqlite3.Connection) -> dict[int, str]:
    rows = conn.execute("SELECT version, checksum FROM schema_migrations ORDER BY version").fetchall()
    return {int(version): str(checksum) for version, checksum in rows}


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
    return row is not None


def _verify_applied(applied: dict[int, str], path: str) -> None:
    known = {migration.version: migration for migration in MIGRATIONS}
    newest = max(applied, default=0)
    if newest > SCHEMA_VERSION:
        raise StoreError(
            f"{path}: the database schema is version {newest}, newer than this agent's "
            f"{SCHEMA_VERSION}; upgrade qinglong-edge",
            code="database_newer",
        )
    for version, checksum in applied.items():
        migration = known.get(version)
        if migration is None or migration.checksum != checksum:
            raise StoreError(
                f"{path}: applied migration {version} differs from this agent's schema",
                code="schema_mismatch",
            )


def _check_identity(conn: sqlite3.Connection, path: str) -> None:
    """Read-only: refuse a foreign, newer or mismatched database before writing.

    One read transaction: without it, a concurrent first open could commit its probe and
    first migration between "no schema_migrations" and the table count, and the file
    would look foreign (seen under load in test_concurrent_opens_migrate_exactly_once).
    """
    try:
        with read_transaction(conn):
            _check_identity_in(conn, path)
    except sqlite3.Error as exc:
        raise _open_failure(exc, path, "cannot read the schema") from None


def _check_identity_in(conn: sqlite3.Connection, path: str) -> None:
    application_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
    if application_id not in (0, APPLICATION_ID):
        raise StoreError(f"{path}: another application's SQLite database", code="database_foreign")
    if not _has_table(conn, "schema_migrations"):
        # ``store_probe`` is ours: a concurrent first open may have probed (which
        # creates it) before migrating, so it does not make the file foreign.
        user_tables = conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%' "
            "AND name <> 'store_probe'"
        ).fetchone()[0]
        if user_tables:
            raise StoreError(
                f"{path}: a SQLite database without qinglong-edge migrations", code="database_foreign"
            )
        return
    _verify_applied(_applied(conn), path)


def _probe(conn: sqlite3.Connection) -> None:
    """A real committed write: creates the bookkeeping tables, rewrites the probe row."""
    with write_transaction(conn):
        conn.execute(SCHEMA_MIGRATIONS_DDL)
        conn.execute(STORE_PROBE_DDL)
        conn.execute(
            "INSERT INTO store_probe (id, pid, probed_at_ms) VALUES (1, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET pid = excluded.pid, probed_at_ms = excluded.probed_at_ms",
            (os.getpid(), now_ms()),
        )
        if int(conn.execute("PRAGMA application_id").fetchone()[0]) == 0:
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")


def _choose_auto_vacuum(conn: sqlite3.Connection, path: str) -> None:
    """A new (empty) database gets ``auto_vacuum=INCREMENTAL``: the pruner can then give
    freed pages back to the file system (``PRAGMA incremental_vacuum``). It can only be
    chosen before the first write (before WAL is entered too); an older database keeps
    ``none``."""
    try:
        if int(conn.execute("PRAGMA page_count").fetchone()[0]) == 0:
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    except sqlite3.Error as exc:
        raise _open_failure(exc, path, "cannot configure auto-vacuum") from None


def _set_journal_mode(conn: sqlite3.Connection, mode: str) -> str:
    row = conn.execute(f"PRAGMA journal_mode = {mode}").fetchone()
    return str(row[0]).lower() if row else ""


def _probe_unless_full(conn: sqlite3.Connection) -> None:
    """:func:`_probe`, except that an existing database on a full file system
    (``SQLITE_FULL``) passes: the file system is writable, it has no room now. Refusing
    to open it would leave ``serve`` and ``admin prune`` unable to start on the full
    disk, and so unable to prune their way out of it (the pruner empties the logs it
    deletes first, :mod:`qinglong_edge.local.retention`); every write meanwhile fails
    with ``storage_unavailable`` as it would have anyway. A new database (no
    ``schema_migrations`` yet) must still be written, so there it fails."""
    try:
        _probe(conn)
    except sqlite3.Error as exc:
        full = getattr(exc, "sqlite_errorcode", 0) & 0xFF == _SQLITE_FULL
        if not (full and _has_table(conn, "schema_migrations")):
            raise


def _journal_and_probe(conn: sqlite3.Connection, profile: str, path: str) -> tuple[str, str | None]:
    fallback: str | None = None
    if profile == "standalone":
        try:
            mode = _set_journal_mode(conn, "WAL")
            if mode != "wal":
                fallback = f"journal_mode=WAL gave {mode or 'nothing'}"
            else:
                _probe_unless_full(conn)
                return "wal", None
        except sqlite3.Error as exc:
            fallback = f"WAL write probe failed: {_error_name(exc)}"
    try:
        mode = _set_journal_mode(conn, "DELETE")
        if mode != "delete":
            raise StoreError(f"{path}: journal_mode=DELETE gave {mode or 'nothing'}", code="storage_unavailable")
        _probe_unless_full(conn)
    except sqlite3.Error as exc:
        raise _unavailable(f"{path}: the database is not writable", exc) from None
    return "delete", fallback


def _apply(conn: sqlite3.Connection, migration: Migration, path: str) -> None:
    with write_transaction(conn):
        applied = _applied(conn)  # another process may have migrated meanwhile
        _verify_applied(applied, path)
        if migration.version in applied:
            return
        for statement in migration.statements:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO schema_migrations (version, name, checksum, applied_at_ms) VALUES (?, ?, ?, ?)",
            (migration.version, migration.name, migration.checksum, now_ms()),
        )
        conn.execute(f"PRAGMA user_version = {int(migration.version)}")


def _migrate(conn: sqlite3.Connection, path: str) -> None:
    try:
        applied = _applied(conn)
        _verify_applied(applied, path)
        for migration in MIGRATIONS:
            if migration.version not in applied:
                try:
                    _apply(conn, migration, path)
                except sqlite3.Error as exc:
                    raise _unavailable(f"{path}: migration {migration.name} failed", exc) from None
    except sqlite3.Error as exc:
        raise _unavailable(f"{path}: cannot read the applied migrations", exc) from None
