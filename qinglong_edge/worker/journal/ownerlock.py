"""Single-owner lock of the worker journal (spec README "Owner lock"; replaces ADR-0110 3.2).

One process at a time owns a journal root. The lock is ``flock(LOCK_EX|LOCK_NB)`` on
``<root>/.owner.lock``, not proper-lockfile's ``mkdir`` plus mtime heartbeat:

* the kernel drops a ``flock`` when its holder dies (``SIGKILL``, OOM, power), so the
  next process owns at once and nothing ever guesses staleness from file times;
* ``flock`` belongs to the open file description, so a second ``open`` in the same
  process is refused too (``fcntl.lockf`` would be per process, and dropped when *any*
  descriptor of the file is closed);
* the file is opened ``O_RDWR|O_CREAT|O_NOFOLLOW|O_CLOEXEC`` 0600, never truncated
  before the lock is held (a loser must not clobber the holder's record) and never
  unlinked (unlinking a locked file splits later lockers across two inodes);
* after locking, ``st_nlink == 0`` or a path that names another inode means we
  locked a dead file: close and retry (filelock's lessons, style-anchors.md 2).

While held, one daemon thread runs every ``stale/2`` ms: it checks that the lock
path still names our inode ``(st_dev, st_ino)`` and re-writes the owner record
(pid, process start time, boot id, times) for diagnosis. The record goes to the
runtime directory (``owner.json``, in RAM: spec README "Decisions for storage on
flash") when the caller passes one, so holding the lock writes nothing to the lock
file's (flash) file system: the file is opened without truncation and its mode is
changed only when it is not already 0600. Without a runtime directory the record is
written into the lock file itself (how a lock taken by a test or tool records itself). The lock becomes
*compromised* when the lock file was deleted or replaced, or when no refresh
ran for ``stale`` ms (the process was stopped or starved; measured with
``time.monotonic()``: wall-clock steps from NTP or a router booting at 1970 change
nothing; file mtimes are never read). Once
compromised, :meth:`OwnerLock.ensure_owned` (called by every journal operation)
raises ``ownership_compromised``; after release it raises ``not_owned``.

The record is diagnostic only: it is not fsynced, and a failed write (ENOSPC on
a log-structured flash file system, a full RAM disk) is retried without
compromising the lock.

Errors (``JournalError.code``): ``already_owned`` (held by a live process, no
waiting), ``unsafe_storage`` (lock file is a symlink, not a regular file, foreign,
or the file system has no ``flock``), ``storage_unavailable``, ``not_owned``,
``ownership_compromised``, ``invalid_configuration`` (``stale_ms`` out of range).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import threading
import time
from collections.abc import Callable
from types import TracebackType

from qinglong_edge.clock import boot_id, parse_proc_stat
from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.errors import JournalError
from qinglong_edge.worker.journal.files import check_private, journal_error, unsafe

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

__all__ = [
    "DEFAULT_STALE_MS",
    "LOCK_NAME",
    "MAX_STALE_MS",
    "MIN_STALE_MS",
    "OWNER_RECORD_SCHEMA",
    "OwnerLock",
    "OwnerRecord",
    "boot_id",
    "lock_holder",
    "parse_owner_record",
    "parse_proc_stat_start_ticks",
    "process_start_ticks",
    "read_owner_record",
]

LOCK_NAME = ".owner.lock"
#: The owner record's name in the runtime directory.
RECORD_NAME = "owner.json"
OWNER_RECORD_SCHEMA = "qinglong-edge/owner-lock@v1"
#: ``ownershipStaleMs`` (section 3.2: default 30 000; the config allows 5 000-300 000).
DEFAULT_STALE_MS = 30_000
MAX_STALE_MS = 300_000
#: The class accepts down to 100 ms so tests can watch several refresh periods quickly;
#: the configuration file cannot go below 5 000.
MIN_STALE_MS = 100
#: After a failed refresh, try again this soon (proper-lockfile: 1 s) or at stale/2.
_RETRY_S = 1.0
_MAX_ACQUIRE_ROUNDS = 5
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
_CONTENTION = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES})
_NO_FLOCK = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL})
_MAX_RECORD_BYTES = 4096


def parse_proc_stat_start_ticks(data: bytes) -> int:
    """Field 22 (``starttime``, clock ticks since boot) of a ``/proc/<pid>/stat`` line
    (:func:`qinglong_edge.clock.parse_proc_stat`: the fields are counted from the
    **last** ``)``, since the command name may itself hold spaces and ``)``, field
    lessons 4).

    Raises:
        ValueError: the line does not have the shape.
    """
    return int(parse_proc_stat(data)[6])


def process_start_ticks(pid: int | None = None) -> int | None:
    """Start time of ``pid`` (default: this process) in clock ticks since boot, or None."""
    try:
        with open(f"/proc/{'self' if pid is None else pid}/stat", "rb") as handle:
            return parse_proc_stat_start_ticks(handle.read())
    except (OSError, ValueError):
        return None


def _process_name() -> str | None:
    try:
        with open("/proc/self/comm", "rb") as handle:
            return handle.read().rstrip(b"\n").decode("utf-8", "replace")
    except OSError:
        return None


def _wall_ms() -> int:
    # Diagnostic wall-clock stamp only; no decision is taken on it.
    return time.time_ns() // 1_000_000


class OwnerRecord(Frozen):
    """Who holds the lock, for people and ``already_owned`` messages (never for decisions).

    Attributes:
        pid: the owner's process id.
        process_start_ticks: its ``/proc/<pid>/stat`` start time (clock ticks since
            boot), so a reused pid is not mistaken for the owner; None if unknown.
        boot_id: the kernel boot id when it was written; None if unknown.
        process_name: ``/proc/<pid>/comm``; None if unknown.
        acquired_at_ms / refreshed_at_ms: wall-clock ms (diagnostic only).
    """

    __slots__ = (  # noqa: RUF023 (field order)
        "pid",
        "process_start_ticks",
        "boot_id",
        "process_name",
        "acquired_at_ms",
        "refreshed_at_ms",
    )

    pid: int
    process_start_ticks: int | None
    boot_id: str | None
    process_name: str | None
    acquired_at_ms: int
    refreshed_at_ms: int

    def __init__(  # noqa: PLR0917 (the dataclass signature)
        self,
        pid: int,
        process_start_ticks: int | None,
        boot_id: str | None,
        process_name: str | None,
        acquired_at_ms: int,
        refreshed_at_ms: int,
    ) -> None:
        _set = object.__setattr__
        _set(self, "pid", pid)
        _set(self, "process_start_ticks", process_start_ticks)
        _set(self, "boot_id", boot_id)
        _set(self, "process_name", process_name)
        _set(self, "acquired_at_ms", acquired_at_ms)
        _set(self, "refreshed_at_ms", refreshed_at_ms)

    def to_bytes(self) -> bytes:
        document = {
            "schema": OWNER_RECORD_SCHEMA,
            "pid": self.pid,
            "processStartTicks": self.process_start_ticks,
            "bootId": self.boot_id,
            "processName": self.process_name,
            "acquiredAtMs": self.acquired_at_ms,
            "refreshedAtMs": self.refreshed_at_ms,
        }
        return (json.dumps(document, separators=(",", ":"), ensure_ascii=True) + "\n").encode("ascii")

    def is_alive(self) -> bool:
        """True when this boot's process ``pid`` still has the recorded start time."""
        if self.boot_id is None or self.boot_id != boot_id():
            return False
        return self.process_start_ticks is not None and process_start_ticks(self.pid) == self.process_start_ticks


def _opt_int(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError("not a non-negative integer")
    return value


def _opt_str(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ValueError("not a string")


def parse_owner_record(data: bytes) -> OwnerRecord:
    """Parse an owner record written by :meth:`OwnerRecord.to_bytes`.

    Raises:
        ValueError: anything else (the record is diagnostic; callers treat this as
            "unknown owner").
    """
    if len(data) > _MAX_RECORD_BYTES:
        raise ValueError("owner record too large")
    document = json.loads(data.decode("ascii"))
    if not isinstance(document, dict) or document.get("schema") != OWNER_RECORD_SCHEMA:
        raise ValueError("not an owner record")
    pid = _opt_int(document.get("pid"))
    acquired = _opt_int(document.get("acquiredAtMs"))
    refreshed = _opt_int(document.get("refreshedAtMs"))
    if pid is None or acquired is None or refreshed is None:
        raise ValueError("owner record lacks pid or times")
    return OwnerRecord(
        pid=pid,
        process_start_ticks=_opt_int(document.get("processStartTicks")),
        boot_id=_opt_str(document.get("bootId")),
        process_name=_opt_str(document.get("processName")),
        acquired_at_ms=acquired,
        refreshed_at_ms=refreshed,
    )


def read_owner_record(root: str, runtime: RuntimeDirectory | None = None) -> OwnerRecord | None:
    """The current owner record of ``root`` without taking the lock, or None.

    ``runtime``: where a holder that was given one keeps its record (tried first).
    """
    if runtime is not None:
        try:
            data = runtime.read(RECORD_NAME)
            if data is not None:
                return parse_owner_record(data)
        except (OSError, ValueError, UnicodeDecodeError):
            pass
    try:
        fd = os.open(os.path.join(root, LOCK_NAME), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return parse_owner_record(os.pread(fd, _MAX_RECORD_BYTES + 1, 0))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def lock_holder(root: str, runtime: RuntimeDirectory | None = None) -> tuple[bool, OwnerRecord | None]:
    """``(held, record)``: whether a process holds ``root``'s owner lock right now, and its
    owner record when held and readable. Nothing is created or written: the lock file
    is opened read-only and, when free, locked and unlocked at once (the record alone
    proves nothing: a released lock leaves its last record behind).
    """
    try:
        fd = os.open(os.path.join(root, LOCK_NAME), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in _CONTENTION:
            return True, read_owner_record(root, runtime)
        return False, None
    finally:
        os.close(fd)  # drops a lock this probe took
    return False, None


class OwnerLock:
    """The held owner lock of one journal root. Create with :meth:`acquire`.

    Thread-safe. Use as a context manager or call :meth:`release`.
    """

    def __init__(self, *, path: str, fd: int, stale_ms: int, clock: Callable[[], float], record: OwnerRecord,
                 runtime: RuntimeDirectory | None = None) -> None:
        # Private: use OwnerLock.acquire().
        self.path = path
        self._runtime = runtime
        self.stale_ms = stale_ms
        self._fd = fd
        self._clock = clock
        self._record = record
        st = os.fstat(fd)
        self._identity = (st.st_dev, st.st_ino)
        self._state = threading.Lock()
        self._stop = threading.Event()
        self._last_refresh = clock()
        self.acquired_at = self._last_refresh
        self._compromise: str | None = None
        self._released = False
        #: Owner-record rewrites that failed (diagnostic; they do not compromise the lock).
        self.record_write_failures = 0
        self._thread = threading.Thread(target=self._refresh_loop, name="qinglong-edge-owner-lock", daemon=True)
        self._thread.start()

    @classmethod
    def acquire(
        cls,
        root: str,
        *,
        stale_ms: int = DEFAULT_STALE_MS,
        clock: Callable[[], float] | None = None,
        runtime: RuntimeDirectory | None = None,
    ) -> OwnerLock:
        """Take the lock on ``<root>/.owner.lock`` now, or fail at once.

        Args:
            root: the journal root, already checked (0700, ours, not a symlink).
            stale_ms: a refresh runs every ``stale_ms // 2``; no successful refresh
                for ``stale_ms`` compromises the lock. 100..300 000 ms.
            clock: monotonic seconds; default ``time.monotonic`` (looked up at call
                time, never the wall clock).
            runtime: where the owner record goes (``owner.json``); None: into the
                lock file.

        Raises:
            JournalError: ``already_owned`` when another open file description holds
                it (another process, or this one again); ``unsafe_storage`` /
                ``storage_unavailable`` as the module says; ``invalid_configuration``.
        """
        if not MIN_STALE_MS <= stale_ms <= MAX_STALE_MS:
            raise JournalError(
                f"stale_ms must be {MIN_STALE_MS}..{MAX_STALE_MS}", code="invalid_configuration"
            )
        path = os.path.join(root, LOCK_NAME)
        for _ in range(_MAX_ACQUIRE_ROUNDS):
            fd = _open_lock_file(path)
            try:
                if not _lock(fd, path, runtime):
                    os.close(fd)  # we locked a dead or replaced inode; try the current one
                    continue
                # Only now that we hold it (never before: filelock #591), and only when
                # needed: an fchmod dirties the inode on flash even when nothing changes.
                if stat.S_IMODE(os.fstat(fd).st_mode) != 0o600:
                    os.fchmod(fd, 0o600)
                check_private(os.fstat(fd), path, directory=False)
                now_ms = _wall_ms()
                record = OwnerRecord(
                    pid=os.getpid(),
                    process_start_ticks=process_start_ticks(),
                    boot_id=boot_id(),
                    process_name=_process_name(),
                    acquired_at_ms=now_ms,
                    refreshed_at_ms=now_ms,
                )
                lock = cls(path=path, fd=fd, stale_ms=stale_ms, clock=clock or time.monotonic, record=record,
                           runtime=runtime)
            except BaseException as exc:
                os.close(fd)
                if isinstance(exc, OSError) and not isinstance(exc, JournalError):
                    raise journal_error(exc, path) from None
                raise
            try:
                lock._store(record)
            except OSError:
                lock.record_write_failures += 1  # diagnostic only: the refresh tries again
            except BaseException:
                lock.release()
                raise
            return lock
        raise JournalError(f"{path}: the lock file kept changing while being locked", code="already_owned")

    def _store(self, record: OwnerRecord) -> None:
        if self._runtime is not None:
            self._runtime.write(RECORD_NAME, record.to_bytes())
        else:
            _write_record(self._fd, record)

    # -- state -------------------------------------------------------------------------

    @property
    def held(self) -> bool:
        """True until :meth:`release`, even when compromised."""
        return not self._released

    @property
    def compromised(self) -> bool:
        with self._state:
            return self._compromise is not None

    @property
    def record(self) -> OwnerRecord:
        return self._record

    def ensure_owned(self) -> None:
        """Raise unless this process still safely owns the journal.

        Cheap (one ``stat`` and one ``fstat``), so every journal operation calls it at
        its start and again right before its commit step (link/rename/unlink): a
        deleted or replaced lock file is noticed before the next write, not only at
        the next refresh.

        Raises:
            JournalError: ``not_owned`` after release; ``ownership_compromised`` when
                the lock file was deleted or replaced, or no refresh succeeded for
                ``stale_ms`` (monotonic clock).
        """
        with self._state:
            if self._released:
                raise JournalError("the journal owner lock is not held", code="not_owned")
            if self._compromise is None:
                self._check_locked()
            if self._compromise is not None:
                raise JournalError(self._compromise, code="ownership_compromised")

    def _check_locked(self) -> None:
        """With ``_state`` held: mark compromised on a stale refresh or a changed lock file."""
        elapsed_ms = (self._clock() - self._last_refresh) * 1000.0
        if elapsed_ms > self.stale_ms:
            self._compromise = f"{self.path}: no refresh for {int(elapsed_ms)} ms (stale {self.stale_ms} ms)"
            return
        problem = self._identity_problem()
        if problem is not None:
            self._compromise = f"{self.path}: {problem}"

    def _identity_problem(self) -> str | None:
        try:
            held = os.fstat(self._fd)
            current = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return "lock file was deleted"
        except OSError as exc:
            return f"lock file cannot be checked ({errno.errorcode.get(exc.errno or 0, 'error')})"
        if held.st_nlink == 0:
            return "lock file was deleted"
        if (current.st_dev, current.st_ino) != self._identity:
            return "lock file was replaced"
        return None

    # -- refresh thread ------------------------------------------------------------------

    def _refresh_loop(self) -> None:
        interval = self.stale_ms / 2000.0
        wait = interval
        while not self._stop.wait(wait):
            wait = interval if self._refresh_once() else min(_RETRY_S, interval)

    def _refresh_once(self) -> bool:
        """One heartbeat. Returns False only when the record could not be re-written
        (retried sooner); the lock itself stays trusted as long as the check passes.

        The heartbeat *is* the check: the path still names our inode and we were not
        stalled past ``stale_ms``. The record is diagnostic, so a failed write (ENOSPC
        on a log-structured flash file system, EIO) must not turn a storage problem
        into ``ownership_compromised``.
        """
        with self._state:
            if self._released or self._compromise is not None:
                return True
            self._check_locked()
            if self._compromise is not None:
                return True
            self._last_refresh = self._clock()
            record = OwnerRecord(
                pid=self._record.pid,
                process_start_ticks=self._record.process_start_ticks,
                boot_id=self._record.boot_id,
                process_name=self._record.process_name,
                acquired_at_ms=self._record.acquired_at_ms,
                refreshed_at_ms=_wall_ms(),
            )
            try:
                self._store(record)
            except OSError:
                self.record_write_failures += 1
                return False
            self._record = record
            return True

    # -- release -------------------------------------------------------------------------

    def release(self) -> None:
        """Stop the refresh thread, unlock and close. Idempotent; never unlinks the file."""
        with self._state:
            if self._released:
                return
            self._released = True
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with contextlib.suppress(OSError):
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def __enter__(self) -> OwnerLock:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else ("compromised" if self._compromise else "held")
        return f"<OwnerLock {self.path!r} {state}>"


def _open_lock_file(path: str) -> int:
    try:
        try:
            # An existing lock file is opened without O_CREAT: an idle cycle asks the
            # (flash) file system for nothing it could write.
            return os.open(path, _OPEN_FLAGS & ~os.O_CREAT)
        except FileNotFoundError:
            return os.open(path, _OPEN_FLAGS, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise unsafe(f"{path}: is a symlink") from None
        raise journal_error(exc, path) from None


def _lock(fd: int, path: str, runtime: RuntimeDirectory | None = None) -> bool:
    """flock ``fd``; False when the locked inode is no longer the one at ``path``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in _CONTENTION:
            owner = _describe(read_owner_record(os.path.dirname(path), runtime))
            raise JournalError(f"{path}: held by {owner}", code="already_owned") from None
        if exc.errno in _NO_FLOCK:
            raise unsafe(f"{path}: this file system does not support flock") from None
        raise journal_error(exc, f"{path}: flock") from None
    held = os.fstat(fd)
    if held.st_nlink == 0:
        return False
    try:
        current = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(current.st_mode):
        raise unsafe(f"{path}: is a symlink")
    return (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino)


def _describe(record: OwnerRecord | None) -> str:
    if record is None:
        return "another process"
    name = f" ({record.process_name})" if record.process_name else ""
    return f"pid {record.pid}{name}"


def _write_record(fd: int, record: OwnerRecord) -> None:
    data = record.to_bytes()
    # Write first, then trim: the file is never empty (a concurrent reader may see a
    # new record followed by the old one's tail for an instant; it is diagnostic).
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
