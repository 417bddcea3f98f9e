"""Crash-safe file primitives of the worker journal (ADR-0110 sections 3.1 and 3.5).

Everything works relative to directory file descriptors that were opened once and
checked (:func:`open_private_directory`), so a path component swapped for a symlink
after the check cannot redirect a write.

Guarantees, in words (the durability contract the journal builds on):

* :func:`publish_first`: after it returns, ``<dir>/<name>`` holds exactly ``data``
  and survives power loss; it never replaces an existing file (``link()``), so two
  publications of one name cannot both succeed. On any failure ``<dir>/<name>`` is
  untouched (absent, or the earlier file).
* :func:`publish_replace`: after it returns, ``<dir>/<name>`` holds exactly ``data``
  and survives power loss; a crash at any instant leaves either the old or the new
  complete file (``rename()``), never a partial or empty one.
* :func:`remove_durably`: after it returns the name is gone, and stays gone after
  power loss.

The order, per the contract (section 3.5) and field lessons 8: temp file
``<root>/.<name>.<32 hex>.tmp`` opened ``O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW`` 0600,
``fchmod 0600``, write, ``fsync(file)``, close, then ``link``/``rename``, then
``fsync(directory)``, then unlink the temp name (ignoring errors). ``fchmod`` comes
before the fsync (the reference does it after) so the mode is made durable by the
same fsync; the resulting file is the same.

The steps themselves are :mod:`qinglong_edge.filecheck`'s (``publish_file``,
``replace_file``, ``remove_file``, the one durable-write module); this module fires the
crash points at their step boundaries and maps their errors.

Errors: ``ENOSPC``, ``EDQUOT``, ``EIO`` and ``EROFS`` are
``JournalError(code="storage_unavailable")`` (retry later: field lessons 8); any
other ``OSError`` and every unsafe condition (symlink, wrong type, mode or owner, bad
size) is ``JournalError(code="unsafe_storage")``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Callable

from qinglong_edge import crashpoints, filecheck
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import dispatch_id
from qinglong_edge.contracts.ids import JOURNAL_OFFER_ID
from qinglong_edge.crashpoints import crashpoint
from qinglong_edge.errors import JournalError
from qinglong_edge.filecheck import stat_problem

__all__ = [
    "MAX_RECORD_BYTES",
    "MIN_RECORD_BYTES",
    "RECORD_FILE",
    "TEMP_NAME",
    "check_private",
    "fsync_directory",
    "fsync_parent",
    "journal_error",
    "list_records",
    "open_private_directory",
    "probe_file_system",
    "publish_first",
    "publish_replace",
    "read_record",
    "record_file_name",
    "remove_durably",
    "remove_stray_temp_files",
    "temp_name",
    "unsafe",
]

#: Record size bounds in bytes, including the trailing newline (section 3.1: 160 KiB).
MIN_RECORD_BYTES = 2
MAX_RECORD_BYTES = 163_840
#: ``.<target basename>.<16 random bytes as 32 hex>.tmp`` (section 3.5).
TEMP_NAME = re.compile(r"\.(.+)\.[0-9a-f]{32}\.tmp")

_UNAVAILABLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_FLAGS = filecheck.TEMP_FLAGS
# O_NONBLOCK: a FIFO planted under a record's name must not hang the reader; the
# fstat check then rejects it.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK

Guard = Callable[[], None]


def journal_error(exc: OSError, what: str) -> JournalError:
    """Map an ``OSError`` to the journal's code; the message names only ``what`` and errno."""
    code = "storage_unavailable" if exc.errno in _UNAVAILABLE else "unsafe_storage"
    name = errno.errorcode.get(exc.errno or 0, "error")
    return JournalError(f"{what}: {name} ({exc.strerror})", code=code)


def unsafe(message: str) -> JournalError:
    return JournalError(message, code="unsafe_storage")


def check_private(st: os.stat_result, what: str, *, directory: bool) -> None:
    """Require a real file/directory owned by us with no group/other bits (section 3.1;
    the rules and words are :func:`qinglong_edge.filecheck.stat_problem`'s, which
    ``doctor`` uses too)."""
    problem = stat_problem(st, what, directory=directory)
    if problem is not None:
        raise unsafe(problem.message)


def open_private_directory(name: str, *, dir_fd: int | None, what: str, create: bool) -> tuple[int, bool]:
    """Open (creating if allowed and missing) a 0700 directory owned by us.

    Args:
        name: directory name relative to ``dir_fd``, or an absolute path when
            ``dir_fd`` is None.
        what: how messages name it (a path; never a secret).
        create: create it with mode 0700 when missing.

    Returns:
        ``(fd, created)``: an ``O_DIRECTORY`` descriptor and whether it was created now.

    Raises:
        JournalError: ``unsafe_storage`` for a symlink, a non-directory, a foreign
            owner or group/other mode bits on an existing directory;
            ``storage_unavailable`` / ``unsafe_storage`` for I/O errors.
    """
    created = False
    try:
        try:
            before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            if not create:
                raise
            if dir_fd is None:
                # Missing parents of an absolute root are created too (0700, umask applies).
                os.makedirs(os.path.dirname(name) or "/", 0o700, exist_ok=True)
            try:
                os.mkdir(name, 0o700, dir_fd=dir_fd)
                created = True
            except FileExistsError:
                pass  # another process (a concurrent pull) created it first: check it as existing
            before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(before.st_mode):
            raise unsafe(f"{what}: is a symlink")
        if not created:
            check_private(before, what, directory=True)
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except JournalError:
        raise
    except FileNotFoundError as exc:
        raise journal_error(exc, f"{what}: missing") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise unsafe(f"{what}: not a real directory") from None
        raise journal_error(exc, what) from None
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise unsafe(f"{what}: replaced while being opened")
        if created:
            # mkdir's mode is filtered by the umask; make it exactly 0700.
            os.fchmod(fd, 0o700)
            st = os.fstat(fd)
        check_private(st, what, directory=True)
    except BaseException as exc:
        os.close(fd)
        if isinstance(exc, OSError) and not isinstance(exc, JournalError):
            raise journal_error(exc, what) from None
        raise
    return fd, created


def fsync_directory(dir_fd: int, what: str) -> None:
    try:
        os.fsync(dir_fd)
    except OSError as exc:
        raise journal_error(exc, f"{what}: fsync") from None


def temp_name(target: str) -> str:
    """``.<target>.<32 random hex>.tmp`` (section 3.5; :func:`qinglong_edge.filecheck.temp_name`)."""
    return filecheck.temp_name(target)


def _check_size(data: bytes, what: str) -> None:
    if not MIN_RECORD_BYTES <= len(data) <= MAX_RECORD_BYTES:
        raise unsafe(f"{what}: record of {len(data)} bytes is outside {MIN_RECORD_BYTES}..{MAX_RECORD_BYTES}")


#: :func:`qinglong_edge.filecheck.failed_step` -> how a message names the step.
_STEP_WORDS = {"create": "create temp file", "write": "write temp file", "close": "close temp file",
               "link": "link", "rename": "rename", "unlink": "unlink", "sync_directory": "fsync"}


def _failed(exc: OSError, what: str) -> JournalError:
    """A durable write's OSError as the journal's error (a JournalError of a guard as it is)."""
    if isinstance(exc, JournalError):
        return exc
    return journal_error(exc, f"{what}: {_STEP_WORDS.get(filecheck.failed_step(exc), 'write')}")


def _points(op: str) -> Callable[[str], None]:
    """The step callback that fires ``<op>.<step>`` (:mod:`qinglong_edge.crashpoints`)."""
    return lambda step: crashpoint(f"{op}.{step}")


def publish_first(
    root_fd: int, dir_fd: int, name: str, data: bytes, *, op: str, what: str, guard: Guard,
) -> None:
    """First publication (``writeFirst``): temp file, fsync, ``link()``, fsync(dir)
    (:func:`qinglong_edge.filecheck.publish_file`).

    Args:
        root_fd: the journal root (where the temp file lives).
        dir_fd: the target's directory (the root itself, ``offers/`` or ``abandoned/``).
        name: target file name inside ``dir_fd``.
        data: the complete record, 2..163 840 bytes.
        op: crash-point operation name (:mod:`qinglong_edge.crashpoints`).
        what: how messages name the target.
        guard: called right before ``link()``; raises to abort (owner lock check).

    Raises:
        JournalError: ``offer_conflict`` when ``name`` already exists (nothing is
            replaced); ``storage_unavailable`` / ``unsafe_storage`` as the module says.
            The target is untouched on every failure.
    """
    _check_size(data, what)
    crashpoint(f"{op}.begin")
    try:
        # The root is not fsynced after the temp name's unlink (section 3.5): a temp name
        # that reappears after power loss is cleaned at the next open.
        filecheck.publish_file(name, data, dir_fd=dir_fd, temp_dir_fd=root_fd,
                               torn=crashpoints.armed(f"{op}.tmp_partial"), step=_points(op), before=guard)
    except OSError as exc:
        if isinstance(exc, FileExistsError) and filecheck.failed_step(exc) == "link":
            raise JournalError(f"{what}: already exists", code="offer_conflict") from None
        raise _failed(exc, what) from None


def publish_replace(
    root_fd: int, dir_fd: int, name: str, data: bytes, *, op: str, what: str, guard: Guard,
) -> None:
    """Update (``writeReplacement``): temp file, fsync, ``rename()``, fsync(dir)
    (:func:`qinglong_edge.filecheck.replace_file`).

    Arguments as :func:`publish_first`. A crash leaves the old or the new complete
    file. Raises ``storage_unavailable`` / ``unsafe_storage``; the target keeps its
    old content on every failure before the rename.
    """
    _check_size(data, what)
    crashpoint(f"{op}.begin")
    try:
        filecheck.replace_file(name, data, dir_fd=dir_fd, temp_dir_fd=root_fd,
                               torn=crashpoints.armed(f"{op}.tmp_partial"), step=_points(op), before=guard)
    except OSError as exc:
        raise _failed(exc, what) from None


def remove_durably(dir_fd: int, name: str, *, op: str, what: str, guard: Guard) -> bool:
    """Unlink ``name`` and fsync its directory (:func:`qinglong_edge.filecheck.remove_file`).
    Returns False if it was already absent."""
    crashpoint(f"{op}.begin")
    guard()
    try:
        return filecheck.remove_file(name, dir_fd=dir_fd, step=_points(op))
    except OSError as exc:
        raise _failed(exc, what) from None


def read_record(dir_fd: int, name: str, what: str) -> bytes | None:
    """Read a record with the section 3.1 rules; ``None`` when absent.

    ``O_RDONLY|O_NOFOLLOW``, then ``fstat``: a regular file owned by us, no
    group/other bits, 2..163 840 bytes.

    Raises:
        JournalError: ``unsafe_storage`` for a symlink or any rule broken;
            ``storage_unavailable`` for ``EIO`` and friends.
    """
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise unsafe(f"{what}: is a symlink") from None
        raise journal_error(exc, what) from None
    try:
        st = os.fstat(fd)
        check_private(st, what, directory=False)
        if not MIN_RECORD_BYTES <= st.st_size <= MAX_RECORD_BYTES:
            raise unsafe(f"{what}: size {st.st_size} is outside {MIN_RECORD_BYTES}..{MAX_RECORD_BYTES}")
        chunks = []
        remaining = st.st_size + 1  # one more, to notice a file that grew
        while remaining > 0:
            chunk = os.read(fd, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except OSError as exc:
        if isinstance(exc, JournalError):
            raise
        raise journal_error(exc, what) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) != st.st_size:
        raise unsafe(f"{what}: changed while being read")
    return data


# -- directory-level helpers of the journal (3.1) ----------------------------------------------

#: ``<offerId>.json`` in ``offers/`` and ``abandoned/`` (3.1 listing rule).
RECORD_FILE = re.compile(r"([A-Za-z0-9._:-]{1,128})\.json")
_PROBE = "journal-probe"


def record_file_name(offer_id: str) -> str:
    """``<offerId>.json``; an id that cannot be a file name is ``offer_conflict`` (3.1).

    The id must be a dispatch id (1-128 JS characters, no control characters) and match
    ``[A-Za-z0-9._:-]{1,128}``, so it can never contain ``/`` or be ``.``/``..``.
    """
    try:
        dispatch_id(offer_id, "$.offerId")
    except ContractError:
        raise JournalError("offerId is not a valid dispatch id", code="offer_conflict") from None
    if JOURNAL_OFFER_ID.fullmatch(offer_id) is None:
        raise JournalError("offerId cannot be a journal file name", code="offer_conflict")
    return f"{offer_id}.json"


def list_records(dir_fd: int, what: str) -> list[str]:
    """offerIds of a records directory, in JS default order (3.1 listing rules).

    Every entry must be a regular file ``<offerId>.json``; anything else (a symlink, a
    temp file, a directory) is ``unsafe_storage``.
    """
    ids = []
    try:
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                match = RECORD_FILE.fullmatch(entry.name)
                if match is None or not entry.is_file(follow_symlinks=False):
                    raise unsafe(f"{what}: unexpected entry {entry.name!r}")
                ids.append(match.group(1))
    except JournalError:
        raise
    except OSError as exc:
        raise journal_error(exc, what) from None
    for offer_id in ids:
        record_file_name(offer_id)
    return sorted(ids)


def fsync_parent(path: str) -> None:
    """fsync the directory holding ``path`` (a just-created journal root)."""
    parent = os.path.dirname(path) or "/"
    try:
        filecheck.fsync_directory_of(path)
    except OSError as exc:
        what = parent if filecheck.failed_step(exc) == "open_directory" else f"{parent}: fsync"
        raise journal_error(exc, what) from None


def remove_stray_temp_files(root_fd: int, root: str) -> list[str]:
    """Unlink every ``.<name>.<32 hex>.tmp`` in the root; return their names.

    The journal calls this right after taking the owner lock and before it creates any
    temp file itself, so every temp file found is older than the lock's acquisition
    and belongs to a dead owner: no file times are compared.
    """
    try:
        with os.scandir(root_fd) as entries:
            names = [e.name for e in entries if TEMP_NAME.fullmatch(e.name) and not e.is_dir(follow_symlinks=False)]
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=root_fd)
    except OSError as exc:
        raise journal_error(exc, f"{root}: remove stray temp files") from None
    return names


def probe_file_system(root_fd: int, root: str) -> None:
    """Refuse a file system without ``O_EXCL`` or hard links (FAT, exFAT, some FUSE).

    Creates ``.journal-probe.<32 hex>.tmp`` twice with ``O_EXCL`` (the second must fail),
    hard-links it and checks ``st_nlink == 2``, then removes both names.

    Raises:
        JournalError: ``unsafe_storage`` naming what is missing; ``storage_unavailable``
            for ENOSPC/EIO/EROFS.
    """
    probe = temp_name(_PROBE)
    link = temp_name(f"{_PROBE}-link")
    try:
        fd = os.open(probe, _TEMP_FLAGS, 0o600, dir_fd=root_fd)
    except OSError as exc:
        raise journal_error(exc, f"{root}: create probe file") from None
    try:
        os.close(fd)
        try:
            again = os.open(probe, _TEMP_FLAGS, 0o600, dir_fd=root_fd)
        except FileExistsError:
            pass
        else:
            os.close(again)
            raise unsafe(f"{root}: this file system ignores O_EXCL")
        try:
            os.link(probe, link, src_dir_fd=root_fd, dst_dir_fd=root_fd, follow_symlinks=False)
            links = os.stat(probe, dir_fd=root_fd, follow_symlinks=False).st_nlink
        except OSError as exc:
            if exc.errno in _UNAVAILABLE:
                raise journal_error(exc, f"{root}: hard link probe") from None
            name = errno.errorcode.get(exc.errno or 0, "error")
            raise unsafe(f"{root}: this file system has no hard links ({name})") from None
        if links != 2:
            raise unsafe(f"{root}: this file system does not count hard links")
    finally:
        for name in (link, probe):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=root_fd)
