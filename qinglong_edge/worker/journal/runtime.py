"""The runtime directory: small files in RAM for what is not precious.

Spec README, "Decisions for storage on flash": an idle cron cycle writes nothing to
persistent storage. What a cycle must remember but can afford to lose at a reboot lives
here, in a directory on a RAM file system (``/run`` on systemd: ``RuntimeDirectory=``
with ``RuntimeDirectoryPreserve=yes`` keeps it between timer runs; ``/var/run`` on
OpenWrt, where the init script creates it)::

    <worker.runtimeDirectory>/            0700 (made by systemd or the init script)
      journal-<16 hex>/                   0700, one per journal root (sha256 of its path),
                                          so two configurations never share a session
        owner.json                        owner record of the journal lock (ownerlock.py)
        session.json                      the Worker Session: ids, generation, heartbeat
                                          version, Retry-After (session.py)
        attempt.json                      attempt-in-flight marker of the claim (pull.py)
        handover.json                     a resident pull stopped by a signal left jobs
                                          running: the next pull skips its splay (resident.py)
        notice.<key>                      once-per-boot and once-per-day notices
        wrapper-<16 hex>.pyc, isolation.json  the compiled job wrapper and the isolation
                                          answer, kept only while remote jobs are isolated
                                          (worker/remote/job.py; this directory is hidden from them)

A reboot loses all of it, by design (docs/worker/journal.md, "What a reboot loses"): the
next cycle registers a new session, a claim bound to the old one is dropped or
abandoned, and notices are shown again.

Rules:

* the directory is created 0700 (its parent must exist), checked like a journal
  directory (a real directory, ours, no group/other bits) and used through one
  ``O_DIRECTORY`` descriptor, so a path swapped after the check cannot redirect a write;
* a file is written to ``.<name>.<32 hex>.tmp`` (``O_CREAT|O_EXCL|O_NOFOLLOW``, 0600)
  and renamed over the name (:func:`qinglong_edge.filecheck.replace_file`, ``sync=False``):
  a reader sees the old or the new complete file. Nothing
  is fsynced (RAM; on the fallback below a power loss may lose the last write, which
  costs at most a re-registration);
* reads follow the journal's rules (``O_NOFOLLOW``, a regular file of ours, no
  group/other bits, 2..16 384 bytes);
* names are ``[a-z0-9][a-z0-9._-]{0,63}``.

Fallback: when the configured directory cannot be used (its parent is missing or not
ours to write, say a plain install as an ordinary user with the default ``/run``), the
agent uses ``<journal root>/run`` instead and :attr:`RuntimeDirectory.fallback_reason`
says why; everything works, but idle cycles then write to the journal's file system,
and ``doctor`` warns (check ``runtime_dir``).

Errors: :class:`~qinglong_edge.errors.JournalError` ``unsafe_storage`` /
``storage_unavailable`` as :mod:`qinglong_edge.worker.journal.files` maps them.
"""

from __future__ import annotations

import contextlib
import os
import re

from qinglong_edge import clock as _clock
from qinglong_edge import filecheck
from qinglong_edge.config import DEFAULT_RUNTIME_DIRECTORY
from qinglong_edge.contracts.digest import sha256
from qinglong_edge.crashpoints import crashpoint
from qinglong_edge.errors import JournalError
from qinglong_edge.worker.journal import files

__all__ = [
    "DEFAULT_RUNTIME_DIRECTORY",
    "FALLBACK_NAME",
    "HANDOVER_NAME",
    "MAX_RUNTIME_FILE_BYTES",
    "RuntimeDirectory",
    "boot_id",
    "handover_pending",
    "journal_key",
]

#: ``<journal root>/run``: the fallback when the configured directory cannot be used.
FALLBACK_NAME = "run"
MAX_RUNTIME_FILE_BYTES = 16_384
#: Left by a resident pull that a signal stopped while jobs of its records still run
#: (their leases run on meanwhile); the next owner removes it once it holds the journal.
HANDOVER_NAME = "handover.json"
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_DAY_MS = 86_400_000


def boot_id() -> str:
    """:func:`qinglong_edge.clock.boot_id` (new at every boot), or ``"unknown"``."""
    return _clock.boot_id() or "unknown"


def handover_pending(configured: str, journal_root: str) -> bool:
    """Whether a resident pull stopped by a signal left jobs in flight for the next pull
    (:data:`HANDOVER_NAME` in this journal's runtime directory or its fallback). Two
    ``lstat`` calls, nothing created: a cron pull asks this before its splay, so it takes
    over those leases at once instead of at the device's phase in the minute."""
    key = journal_key(journal_root)
    return any(os.path.lexists(os.path.join(directory, HANDOVER_NAME)) for directory in (
        os.path.join(os.path.normpath(configured), key), os.path.join(os.path.normpath(journal_root), FALLBACK_NAME)))


def journal_key(journal_root: str) -> str:
    """``journal-<16 hex>``: the runtime subdirectory of one journal root."""
    digest = sha256()
    digest.update(os.path.normpath(journal_root).encode("utf-8", "surrogateescape"))
    return "journal-" + digest.hexdigest()[:16]


def _unwritable(exc: OSError, what: str) -> JournalError:
    """A failed write here, with what to do (a full or read-only RAM directory): nothing
    that needed the file was done (the attempt marker goes first: no claim is sent)."""
    error = files.journal_error(exc, what)
    return JournalError(f"{error.message} (the runtime directory, worker.runtimeDirectory: free space in it or make "
                        "it writable for the agent's user)", code=error.code)


#: filecheck's step -> this write's crash point (RUNTIME_STEPS: ``tmp_written`` is after the close).
_RUNTIME_POINTS = {"tmp_synced": "runtime_write.tmp_written", "renamed": "runtime_write.renamed"}


def _runtime_points(step: str) -> None:
    point = _RUNTIME_POINTS.get(step)
    if point is not None:
        crashpoint(point)


def _check_name(name: str) -> str:
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise JournalError(f"runtime file name {name!r} is not allowed", code="invalid_configuration")
    return name


class RuntimeDirectory:
    """One journal's runtime directory, open. Use :meth:`open`; close when done.

    Attributes:
        path: the directory in use.
        configured: the configured base (``worker.runtimeDirectory``).
        fallback_reason: why the configured base is not used (then ``path`` is
            ``<journal root>/run``), or None.
    """

    def __init__(self, path: str, fd: int, configured: str, fallback_reason: str | None) -> None:
        self.path = path
        self.configured = configured
        self.fallback_reason = fallback_reason
        self._fd: int | None = fd
        self._boot_id: str | None = None

    @classmethod
    def open(cls, configured: str, journal_root: str) -> RuntimeDirectory:
        """Open (creating it 0700 if missing) the runtime directory of ``journal_root``.

        Tries ``<configured>/journal-<key>``; when that fails, ``<journal_root>/run``
        (creating the journal root 0700 if needed, as the journal itself would).

        Raises:
            JournalError: neither can be used (``unsafe_storage`` /
                ``storage_unavailable``): the fallback's problem is the one reported.
        """
        preferred = os.path.join(os.path.normpath(configured), journal_key(journal_root))
        try:
            if not os.path.isdir(os.path.dirname(preferred)):
                raise JournalError(f"{os.path.dirname(preferred)}: missing", code="unsafe_storage")
            fd, _ = files.open_private_directory(preferred, dir_fd=None, what=preferred, create=True)
        except JournalError as exc:
            reason = exc.message
        else:
            return cls(preferred, fd, configured, None)
        root = os.path.normpath(journal_root)
        root_fd, created = files.open_private_directory(root, dir_fd=None, what=root, create=True)
        try:
            if created:
                files.fsync_parent(root)  # as Journal.open does for a root it creates
            fallback = os.path.join(root, FALLBACK_NAME)
            fd, _ = files.open_private_directory(FALLBACK_NAME, dir_fd=root_fd, what=fallback, create=True)
        finally:
            os.close(root_fd)
        return cls(fallback, fd, configured, reason)

    @classmethod
    def existing(cls, path: str) -> RuntimeDirectory:
        """An existing runtime directory opened as it is, for reading (``doctor``): nothing
        is created or checked. Raises OSError when it cannot be opened."""
        return cls(path, os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), path, None)

    @property
    def on_fallback(self) -> bool:
        return self.fallback_reason is not None

    def _dir(self) -> int:
        if self._fd is None:
            raise JournalError(f"{self.path}: the runtime directory is closed", code="not_owned")
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> RuntimeDirectory:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RuntimeDirectory {self.path!r}{' (fallback)' if self.on_fallback else ''}>"

    # -- files --------------------------------------------------------------------------------

    def read(self, name: str, *, max_bytes: int = MAX_RUNTIME_FILE_BYTES) -> bytes | None:
        """The file's bytes, or None when absent (journal read rules, 2..``max_bytes``,
        default 16 384; the cached job wrapper program is larger).

        Raises:
            JournalError: ``unsafe_storage`` for a symlink, a foreign or loose file, a bad
                size; ``storage_unavailable`` for I/O errors.
        """
        what = os.path.join(self.path, _check_name(name))
        data = files.read_record(self._dir(), name, what)
        if data is not None and len(data) > max_bytes:
            raise JournalError(f"{what}: larger than {max_bytes} bytes", code="unsafe_storage")
        return data

    def names(self) -> list[str]:
        """The names of the files in the directory (temp files excluded), sorted."""
        try:
            with os.scandir(self._dir()) as entries:
                found = [e.name for e in entries if _NAME.fullmatch(e.name) and e.is_file(follow_symlinks=False)]
        except OSError as exc:
            raise files.journal_error(exc, f"{self.path}: list") from None
        return sorted(found)

    def write(self, name: str, data: bytes, *, max_bytes: int = MAX_RUNTIME_FILE_BYTES) -> None:
        """Replace ``name`` with ``data`` (temp file + rename, no fsync).

        Raises:
            JournalError: ``storage_unavailable`` (ENOSPC...) / ``unsafe_storage``; the
                old file is intact on every failure.
        """
        what = os.path.join(self.path, _check_name(name))
        if not 2 <= len(data) <= max_bytes:
            raise JournalError(f"{what}: {len(data)} bytes is outside 2..{max_bytes}",
                               code="unsafe_storage")
        dir_fd = self._dir()
        crashpoint("runtime_write.begin")
        try:
            # No fchmod (0600 as the umask leaves it) and no fsync of file or directory (RAM).
            filecheck.replace_file(name, data, dir_fd=dir_fd, chmod=False, sync=False, step=_runtime_points)
        except OSError as exc:
            if filecheck.failed_step(exc) == "create" and self._made_again(exc):
                self.write(name, data, max_bytes=max_bytes)
                return
            step = "create temp file" if filecheck.failed_step(exc) == "create" else "write"
            raise _unwritable(exc, f"{what}: {step}") from None

    def _made_again(self, exc: OSError) -> bool:
        """Whether the directory was removed under us (``rm -rf``: its descriptor has no link
        left) and is now made again at its path, 0700 (only where its parent still is): else
        every later write would fail, a job's lease file among them, whose wrapper would then
        stop the job at its old lease's end although the agent renews it."""
        if not isinstance(exc, FileNotFoundError) or self._fd is None:
            return False
        try:
            if os.fstat(self._fd).st_nlink != 0 or not os.path.isdir(os.path.dirname(self.path)):
                return False
            fd, _ = files.open_private_directory(self.path, dir_fd=None, what=self.path, create=True)
        except (OSError, JournalError):
            return False
        old, self._fd = self._fd, fd
        with contextlib.suppress(OSError):
            os.close(old)
        return True

    def overwrite(self, name: str, data: bytes) -> None:
        """Replace the bytes of an existing file of exactly ``len(data)`` bytes in place
        (one ``pwrite``: no new block, so it works on a full tmpfs; a concurrent reader may
        see a torn copy, which the per-job lease file's readers treat as damaged).

        Raises:
            JournalError: ``storage_unavailable`` when the file is absent, of another size
                or the write fails (then use :meth:`write`); ``unsafe_storage`` for a
                symlink or a file that is not ours.
        """
        what = os.path.join(self.path, _check_name(name))
        try:
            fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=self._dir())
        except OSError as exc:
            raise files.journal_error(exc, f"{what}: open") from None
        try:
            st = os.fstat(fd)
            files.check_private(st, what, directory=False)
            if st.st_size != len(data):
                raise JournalError(f"{what}: {st.st_size} bytes, not {len(data)}", code="storage_unavailable")
            if os.pwrite(fd, data, 0) != len(data):
                raise JournalError(f"{what}: short write", code="storage_unavailable")
        except JournalError:
            raise
        except OSError as exc:
            raise files.journal_error(exc, f"{what}: write") from None
        finally:
            os.close(fd)

    def remove(self, name: str) -> bool:
        """Unlink ``name`` (no fsync). False when it was absent."""
        what = os.path.join(self.path, _check_name(name))
        try:
            return filecheck.remove_file(name, dir_fd=self._dir(), sync=False)
        except OSError as exc:
            raise files.journal_error(exc, f"{what}: unlink") from None

    # -- notices ------------------------------------------------------------------------------

    def _notice(self, key: str, stamp: str) -> bool:
        name = f"notice.{key}"
        try:
            if self.read(name) == stamp.encode("ascii") + b"\n":
                return False
            self.write(name, stamp.encode("ascii") + b"\n")
        except JournalError:
            return True  # a notice we cannot remember is shown again: never hidden
        return True

    def once_per_boot(self, key: str) -> bool:
        """True the first time ``key`` is asked for in this boot (then remembered).

        Keyed by the kernel's boot id, so it holds on the fallback directory too. A
        failure to remember says True (a notice is shown again rather than hidden).
        """
        if self._boot_id is None:
            self._boot_id = boot_id()
        return self._notice(key, f"boot {self._boot_id}")

    def once_per_day(self, key: str, now_ms: int) -> bool:
        """True the first time ``key`` is asked for on this UTC day (then remembered)."""
        return self._notice(key, f"day {now_ms // _DAY_MS}")
