"""What ``serve`` checks before it serves, and keeps checking while it does (issue 17
items 2 and 5): the pepper keyring's modes and owner, and the database file's identity.

Both fail closed. At start-up:

* :func:`check_keyring`: the directory rules of local-api.md 3.3 (a real directory,
  ``0700``, owned by this user) and, for every key file (``*.pepper``), a regular file
  (not a symlink), ``0600``, owned by this user. Anything else is
  :class:`~qinglong_edge.local.pepper.PepperError` ``unsafe_pepper`` (exit 73) with ONE
  line naming the file, its mode and its owner. (Each request re-checks the one key it
  uses anyway; this makes a wrong mode a refusal to start instead of a service that
  answers every request 503 ``authentication_unavailable`` and says nothing.)
* :func:`check_database_present`: the database file is missing (or empty: 0 bytes, which
  SQLite would take for a new database) while the keyring holds keys. ``admin init``
  creates the database before the first key, so keys prove that a database existed:
  creating an empty one would silently lose every credential, role, task and Run.
  :class:`~qinglong_edge.errors.StoreError` ``database_missing`` (exit 73).
* :func:`check_keyring_present`: the other way round. The database's pepper catalog names
  an active key whose file is not in the keyring (the directory moved away, or its key
  files deleted). Every credential's digest is keyed by a pepper, so that key's file is
  the only way to check the credentials issued under it, and ``admin init`` cannot make
  it again. :class:`~qinglong_edge.local.pepper.PepperError` ``keyring_missing`` (exit
  73) with the true remedy (:data:`KEYRING_LOST_REMEDY`): restore it from a backup, or
  lose those credentials (nothing else) and go on with ``admin pepper rotate``. ``serve``,
  ``admin init`` and ``doctor`` say the same line.

While serving (``serve``'s main loop, about once a second):

* :class:`KeyringWatch`: the same keyring check; a change is reported once (the reason,
  and once again when it is safe again). Requests keep failing closed meanwhile: each
  one reads its key file through :func:`qinglong_edge.local.pepper.read_pepper`, which
  refuses the same things (503 ``authentication_unavailable``).
* :class:`DatabaseWatch`: the database path no longer names the file that was opened
  (removed, or replaced by another file). SQLite then refuses writes
  (``SQLITE_READONLY_DBMOVED``) but would keep answering from the old file;
  ``serve`` logs one line and exits with :data:`EX_DATABASE_LOST` (74) so that the
  service manager starts it again on whatever the path names now.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from qinglong_edge.errors import EX_IOERR, StoreError
from qinglong_edge.filecheck import stat_problem
from qinglong_edge.local.pepper import PEPPER_SUFFIX, PepperError, check_keyring_directory, key_file_name

__all__ = [
    "EX_DATABASE_LOST",
    "KEYRING_LOST_REMEDY",
    "DatabaseWatch",
    "KeyringWatch",
    "check_database_present",
    "check_keyring",
    "check_keyring_present",
    "keyring_has_keys",
]

#: What to do when the database's pepper keys are gone from the keyring (one source of
#: truth: serve's and admin init's refusal, doctor's remedy).
KEYRING_LOST_REMEDY = (
    "restore the keyring from a backup (its *.pepper files, mode 0600, in a 0700 directory of the service user); "
    "without one the credentials issued under the lost keys are lost, nothing else (subjects, roles, tasks, Runs "
    "and the audit stay): make a new key with 'qinglong-edge admin pepper rotate --key-id NEW', issue new "
    "credentials ('admin credential issue') and revoke the old ones"
)

#: ``serve``'s exit status when the database was removed or replaced while serving: not
#: in the systemd unit's ``RestartPreventExitStatus`` (64 78), and procd respawns any
#: exit, so the service restarts.
EX_DATABASE_LOST = EX_IOERR


def _mode_and_owner(info: os.stat_result) -> str:
    return f"mode {stat.S_IMODE(info.st_mode):04o}, owner uid {info.st_uid}"


def _key_names(directory: str) -> list[str]:
    try:
        return sorted(name for name in os.listdir(directory) if name.endswith(PEPPER_SUFFIX))
    except OSError as exc:
        raise PepperError(f"{directory}: cannot list the pepper keyring ({exc.strerror})") from None


def check_keyring(directory: str) -> None:
    """The keyring directory and every key file in it (module docstring).

    Raises:
        PepperError: ``pepper_unavailable`` (missing or unreadable) or ``unsafe_pepper``,
            one line naming the file, its mode and owner, and what they must be.
    """
    euid = os.geteuid()
    try:
        info = os.lstat(directory)
    except OSError:
        info = None
    if info is not None and stat.S_ISDIR(info.st_mode) and (
        stat_problem(info, directory, directory=True, mode=0o700) is not None  # the mode or the owner
    ):
        raise PepperError(
            f"{directory}: the pepper keyring directory has {_mode_and_owner(info)}; it must be mode 0700, "
            f"owned by uid {euid} (the user serve runs as)",
            code="unsafe_pepper",
        )
    check_keyring_directory(directory)  # missing, not a directory, symlink, uid checks
    for name in _key_names(directory):
        path = os.path.join(directory, name)
        try:
            entry = os.lstat(path)
        except FileNotFoundError:
            continue  # removed meanwhile (a rotation's temp file never has the suffix)
        except OSError as exc:
            raise PepperError(f"{path}: cannot inspect the pepper key file ({exc.strerror})") from None
        problem = stat_problem(entry, path, directory=False, mode=0o600)
        if problem is not None and problem.kind in ("symlink", "not_file"):
            raise PepperError(f"{path}: the pepper key file is not a regular file (a symlink or other)",
                              code="unsafe_pepper")
        if problem is not None:  # the mode or the owner
            raise PepperError(
                f"{path}: the pepper key file has {_mode_and_owner(entry)}; it must be mode 0600, "
                f"owned by uid {euid} (the user serve runs as)",
                code="unsafe_pepper",
            )


def keyring_has_keys(directory: str) -> bool:
    """The keyring directory holds at least one key file (False when it cannot be listed)."""
    try:
        return bool(_key_names(directory))
    except PepperError:
        return False


def check_database_present(database_file: str, keyring_directory: str) -> None:
    """Refuse to let a database be created where one existed (module docstring): the
    file is missing or is an empty (0-byte) regular file while the keyring holds keys.

    Raises:
        StoreError: ``database_missing`` (exit 73).
    """
    try:
        info = os.lstat(database_file)
    except OSError:
        info = None
    # A regular file of 0 bytes is, to SQLite, a new empty database: opening it would
    # migrate an empty schema into it (and the log sweep would then take every Run log
    # for an orphan). ``admin init`` commits the schema before the first key exists, so
    # with keys it can only be a truncated file (``: > local.db``, a failed copy).
    empty = info is not None and stat.S_ISREG(info.st_mode) and info.st_size == 0
    if (info is not None and not empty) or not keyring_has_keys(keyring_directory):
        return
    what = "is empty (0 bytes)" if empty else "does not exist"
    raise StoreError(
        f"{database_file} {what}, but the pepper keyring {keyring_directory} holds keys, so a database "
        "existed: restore it (or, to start afresh and lose what it held, move the keyring aside and run "
        "'qinglong-edge admin init'); refusing to create an empty one",
        code="database_missing",
    )


def _catalog(database_file: str) -> tuple[str | None, list[str]]:
    """(the active pepper key id, every key id) of the database's catalog, read-only
    (``mode=ro``: nothing created, migrated or written); ``(None, [])`` when there is no
    readable catalog (no file, an empty one, not yet migrated, locked, corrupt: the
    store's own open reports those)."""
    try:  # not at the top: doctor imports this module, and python3-light has neither
        import sqlite3
        import urllib.parse
    except ImportError:
        return None, []  # no catalog to read: doctor's sqlite check names the package

    try:
        if os.path.getsize(database_file) == 0:
            return None, []
        uri = "file:" + urllib.parse.quote(database_file) + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=1.0)
    except (OSError, sqlite3.Error):
        return None, []
    try:
        rows = conn.execute('SELECT pepper_key_id, state FROM "QingLong3LocalOwnerPepperKeys"').fetchall()
    except sqlite3.Error:
        return None, []
    finally:
        conn.close()
    active = next((str(key_id) for key_id, state in rows if state == "active"), None)
    return active, sorted(str(key_id) for key_id, _ in rows)


def check_keyring_present(database_file: str, keyring_directory: str) -> None:
    """Refuse to go on when the database names an active pepper key whose file is not in
    the keyring (module docstring). Safe and unsafe key files alike count as present
    (:func:`check_keyring` judges those).

    Raises:
        PepperError: ``keyring_missing`` (exit 73), one line: what is missing, the
            database that names it, and :data:`KEYRING_LOST_REMEDY`.
    """
    active, keys = _catalog(database_file)
    if active is None or os.path.lexists(os.path.join(keyring_directory, key_file_name(active))):
        return
    missing = [key for key in keys if not os.path.lexists(os.path.join(keyring_directory, key_file_name(key)))]
    if not os.path.lexists(keyring_directory):
        what = "the pepper keyring directory is missing"
    else:
        what = f"the pepper keyring lacks {len(missing)} of the {len(keys)} key files"
    raise PepperError(
        f"{keyring_directory}: {what}, but the database {database_file} names {len(keys)} pepper "
        f"key{'s' if len(keys) != 1 else ''} (active: {active}), which 'admin init' cannot make again: "
        f"{KEYRING_LOST_REMEDY}",
        code="keyring_missing",
    )


class KeyringWatch:
    """Re-runs :func:`check_keyring`; :meth:`check` returns a line to log when the verdict
    changed (``None`` otherwise), so each change is reported once."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.problem: str | None = None

    def check(self) -> str | None:
        try:
            check_keyring(self.directory)
            problem = None
        except PepperError as exc:
            problem = f"{exc.code}: {exc.message}"
        if problem == self.problem:
            return None
        self.problem = problem
        if problem is None:
            return "the pepper keyring is safe again; credentials are checked again"
        return f"the pepper keyring became unusable ({problem}); every credential check fails closed (503) until fixed"


@dataclass(frozen=True, slots=True)
class _Identity:
    device: int
    inode: int


def _identity(path: str) -> _Identity | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return _Identity(info.st_dev, info.st_ino)


class DatabaseWatch:
    """Remembers which file ``path`` named when it was opened; :meth:`check` says
    ``removed`` or ``replaced`` once it names none or another (``None`` while the same).

    Create it right after :meth:`qinglong_edge.local.store.Store.open` returned.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.opened = _identity(path)

    def check(self) -> str | None:
        if self.opened is None:
            return None
        now = _identity(self.path)
        if now is None:
            return "removed"
        if now != self.opened:
            return "replaced"
        return None
