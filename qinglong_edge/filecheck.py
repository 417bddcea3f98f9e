"""The file and directory rules every command and ``doctor`` share (issue 18 item 5).

One source of truth: the journal (:mod:`qinglong_edge.worker.journal.files`), ``admin
init`` and ``doctor`` judge a private directory with :func:`stat_problem` /
:func:`directory_problem`, so a directory that fails a command fails ``doctor`` with the
same words, and one root cause (say, a state directory owned by another user) is one
:class:`Problem` with one remedy. Every other reader that checks a file's type, owner,
mode or links decides with :func:`stat_problem` too (its options below), keeping its own
words for the message: the runtime files (:mod:`qinglong_edge.worker.runtime_files`),
the TLS material and its directory (:mod:`qinglong_edge.worker.ingress.material`), the
capabilities file, the job's private directories and log, the wrapper's publications
(:mod:`qinglong_edge.process.logs`), the store's database file, the pepper keyring
(:mod:`qinglong_edge.local.pepper`, :mod:`qinglong_edge.local.guards`) and the Run logs
read back (:mod:`qinglong_edge.local.log_read`).

Private means (offer-delivery.md 3.1): a real directory or regular file (``lstat``: not
a symlink), owned by the effective user, with none of the ``forbidden`` mode bits
(``0o077``: no group/other access; trust anchors use ``0o022``: not writable by others).
The options: ``forbidden=0`` (any mode), ``mode=`` (exactly these bits: the pepper
keyring's 0700/0600), ``owner=False`` (root may own it: the TLS material, the
capabilities file), ``single_link=True`` (one name only: a file another directory's
owner could change through a second name is refused).

The rules do no I/O beyond ``lstat`` and never raise (the callers raise their own error
type with :attr:`Problem.message`).

The durable writes (issue 27 item 5): every writer of the package (the journal, the
runtime directory, the metrics textfile, the pepper keyring, the store's database file,
``config render-uci``) writes a file through the primitives below, and only the
self-contained job wrapper (:mod:`qinglong_edge.process.wrapper`) has its own copy:

* :func:`write_temp`: ``.<name>.<32 hex>.tmp`` opened :data:`TEMP_FLAGS` (``O_WRONLY|
  O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC``) with ``mode``, ``fchmod(mode)`` (the umask
  must not narrow it; skipped with ``chmod=False``), every byte written
  (:func:`write_all`), ``fsync`` (skipped with ``sync=False``: RAM), close. On any
  failure the temp file is removed;
* :func:`replace_file`: :func:`write_temp`, ``rename()`` over the name, ``fsync`` of the
  directory: a crash leaves the old or the new complete file;
* :func:`publish_file`: :func:`write_temp`, ``link()`` (never replaces a file: an
  existing name is ``FileExistsError``), ``fsync`` of the directory, then the temp name is
  unlinked (that unlink is not fsynced: a temp name that comes back after a power loss
  is a stray temp file);
* :func:`create_file`: an empty file created exclusively, fsynced, its directory fsynced;
* :func:`remove_file`: ``unlink()``, ``fsync`` of the directory.

Each works relative to a directory descriptor (``dir_fd``) or, with ``dir_fd=None``, on
a path (the temp file beside it, the directory of ``os.path.abspath(path)`` fsynced).
``step`` is called at each step boundary with the step's name (``tmp_created``,
``tmp_partial``, ``tmp_written``, ``tmp_synced``, ``renamed``/``linked``/``unlinked``,
``dir_synced``, ``tmp_removed``): the journal and the runtime directory fire their
crash points (:mod:`qinglong_edge.crashpoints`) from it, so the points stay where they
were. A failing system call's ``OSError`` propagates unchanged (the caller maps it to
its own error type), and :func:`failed_step` says which step it was (``create``,
``write``, ``close``, ``link``, ``rename``, ``unlink``, ``sync_directory``,
``open_directory``); an exception raised by ``step`` or ``before`` is not tagged.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import stat

from qinglong_edge.contracts._shape import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "PRIVATE_BITS",
    "TEMP_FLAGS",
    "Problem",
    "create_file",
    "directory_problem",
    "exists_at",
    "failed_step",
    "fsync_directory_of",
    "ownership_remedy",
    "publish_file",
    "remove_file",
    "replace_file",
    "stat_problem",
    "temp_name",
    "write_all",
    "write_temp",
]

PRIVATE_BITS = 0o077
#: Kinds of :class:`Problem` that make every probe inside the directory pointless (a
#: probe would fail with EACCES and name the wrong cause): report the directory alone.
#: A loose mode is not one: the probes still work, and on FAT/exFAT (every file 0777)
#: they tell the real cause (no hard links).
ROOT_CAUSES = frozenset({"foreign_owner", "symlink", "not_directory", "unreadable"})


class Problem(Frozen):
    """Why a path breaks the private rules.

    Attributes:
        kind: ``missing``, ``symlink``, ``not_directory``, ``not_file``,
            ``hard_linked``, ``foreign_owner``, ``loose_mode`` or ``unreadable``.
        message: ``"<path>: <what is wrong>"``, one line.
        remedy: a command to run (paths shell-quoted).
    """

    __slots__ = ("kind", "message", "remedy")

    kind: str
    message: str
    remedy: str

    def __init__(self, kind: str, message: str, remedy: str) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "message", message)
        object.__setattr__(self, "remedy", remedy)

    @property
    def root_cause(self) -> bool:
        """Whether probes inside the directory should be skipped (see ROOT_CAUSES)."""
        return self.kind in ROOT_CAUSES


def ownership_remedy(path: str, *, directory: bool, uid: int | None = None, forbidden: int = PRIVATE_BITS) -> str:
    """``chown <uid> PATH && chmod <mode> PATH`` (the mode clears ``forbidden``)."""
    uid = os.geteuid() if uid is None else uid
    mode = (0o777 if directory else 0o666) & ~forbidden & ~(0o111 if not directory else 0)
    quoted = shlex.quote(path)
    return f"chown {uid} {quoted} && chmod {mode:04o} {quoted}"


def stat_problem(
    st: os.stat_result, path: str, *, directory: bool, forbidden: int = PRIVATE_BITS, mode: int | None = None,
    owner: bool = True, single_link: bool = False,
) -> Problem | None:
    """The rules on an ``lstat``/``fstat`` result (see the module docstring), or None.

    Checked in this order: the type (``symlink``, ``not_directory``, ``not_file``), then
    ``hard_linked`` (``single_link``), ``foreign_owner`` (``owner``), ``loose_mode``.

    Args:
        forbidden: mode bits that must be clear (``0``: any mode).
        mode: the exact permission bits required instead (the pepper keyring's ``0700`` /
            ``0600``, a Run log's ``0600``); ``forbidden`` is then not used.
        owner: the effective user must own it (False: any owner, as for the TLS
            material and the capabilities file, which root may own).
        single_link: a file must have one name only (``st_nlink == 1``): a second name
            would let another directory's owner change what we read.
    """
    if stat.S_ISLNK(st.st_mode):
        return Problem("symlink", f"{path}: is a symlink",
                       f"replace the symlink {shlex.quote(path)} with a real {'directory' if directory else 'file'}")
    if directory and not stat.S_ISDIR(st.st_mode):
        return Problem("not_directory", f"{path}: not a directory", f"make {shlex.quote(path)} a real directory")
    if not directory and not stat.S_ISREG(st.st_mode):
        return Problem("not_file", f"{path}: not a regular file", f"make {shlex.quote(path)} a regular file")
    if single_link and not directory and st.st_nlink != 1:
        quoted = shlex.quote(path)
        return Problem("hard_linked", f"{path}: has {st.st_nlink} names (hard links)",
                       f"replace it with a copy of its own: cp -p {quoted} {quoted}.new && mv {quoted}.new {quoted}")
    euid = os.geteuid()
    foreign = owner and st.st_uid != euid
    current = stat.S_IMODE(st.st_mode)
    loose = current != mode if mode is not None else bool(current & forbidden)
    if not foreign and not loose:
        return None
    quoted = shlex.quote(path)
    if mode is not None:
        chmod = f"chmod {mode:04o} {quoted}"
        remedy = f"chown {euid} {quoted} && {chmod}" if owner else chmod
    elif owner:
        remedy = ownership_remedy(path, directory=directory, uid=euid, forbidden=forbidden)
    else:
        remedy = f"chmod go-w {quoted}" if forbidden == 0o022 else f"chmod go-rwx {quoted}"
    if foreign:
        return Problem("foreign_owner",
                       f"{path}: owned by uid {st.st_uid}, not {euid} (the user running qinglong-edge)",
                       f"{remedy} (or run qinglong-edge as uid {st.st_uid})")
    if mode is not None:
        return Problem("loose_mode", f"{path}: mode {current:04o}, not {mode:04o}", remedy)
    bits = "group/other access" if forbidden == PRIVATE_BITS else "group/other write access"
    return Problem("loose_mode", f"{path}: mode {current:04o} allows {bits}", remedy)


def directory_problem(path: str, *, forbidden: int = PRIVATE_BITS, creator: str = "") -> Problem | None:
    """``lstat`` ``path`` and apply the directory rules; None when it is fine.

    Args:
        creator: the remedy when it is missing (default ``mkdir -p -m 0700 PATH``).
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Problem("missing", f"{path}: missing", creator or f"mkdir -p -m 0700 {shlex.quote(path)}")
    except OSError as exc:
        parent = os.path.dirname(path) or "/"
        return Problem("unreadable", f"{path}: {exc.strerror or type(exc).__name__}",
                       f"check the permissions of {shlex.quote(parent)} (the agent's user must be able to enter it)")
    return stat_problem(st, path, directory=True, forbidden=forbidden)


# -- durable writes (the module docstring) -------------------------------------------------------

#: Every temp file and exclusively created file: never an existing file, never through a symlink.
TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: ``link()`` errors of a file system without hard links (FAT-like): see ``rename_without_links``.
_NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK})
_STEP = "qinglong_edge_failed_step"


def _no_step(step: str) -> None:
    return None


def _tag(exc: OSError, step: str) -> OSError:
    if not hasattr(exc, _STEP):
        setattr(exc, _STEP, step)
    return exc


def failed_step(exc: BaseException) -> str:
    """The step of a durable write whose system call raised ``exc`` (module docstring), or
    ``""`` for an exception that did not come from one."""
    return str(getattr(exc, _STEP, ""))


def temp_name(target: str) -> str:
    """``.<target>.<32 random hex>.tmp``: a temp file's name beside ``target`` (a base name)."""
    return f".{target}.{os.urandom(16).hex()}.tmp"  # not secrets.token_hex: no import on the pull path


def write_all(fd: int, data: bytes, *, torn: Callable[[], None] | None = None) -> None:
    """``write()`` until every byte of ``data`` is written.

    Args:
        torn: when given, the first half is written, ``torn()`` is called, then the rest
            (a test's torn-write crash point between the two writes).
    """
    view = memoryview(data)
    if torn is not None and len(view) > 1:
        half = len(view) // 2
        write_all(fd, view[:half].tobytes())
        torn()
        view = view[half:]
    while view:
        view = view[os.write(fd, view):]


def _split(name: str, dir_fd: int | None) -> tuple[str, str]:
    """(the directory part to put beside, the base name) of a target."""
    if dir_fd is not None:
        return "", name
    return os.path.split(name)


def write_temp(
    dir_fd: int | None, target: str, data: bytes, *, mode: int = 0o600, chmod: bool = True, sync: bool = True,
    torn: bool = False, step: Callable[[str], None] = _no_step,
) -> str:
    """Write ``data`` to a new temp file for ``target``; return the temp file's name.

    Args:
        dir_fd: the directory to create it in; None: ``target`` is a path and the temp
            file goes beside it (the name returned is then a path too).
        target: the base name of the file the temp file is for (or its path).
        mode: the temp file's mode (``open`` and then ``fchmod``).
        chmod: ``fchmod(mode)`` after the open (False: the umask applies).
        sync: ``fsync`` the file before closing it.
        torn: write it in two halves with step ``tmp_partial`` between them.
        step: called with ``tmp_created`` (open, empty), ``tmp_partial``, ``tmp_written``
            (every byte written), ``tmp_synced`` (fsynced when ``sync``, and closed).

    Raises:
        OSError: the failing call's (:func:`failed_step`: ``create``, ``write`` or
            ``close``); the temp file is removed.
    """
    directory, base = _split(target, dir_fd)
    tmp = os.path.join(directory, temp_name(base))
    try:
        fd = os.open(tmp, TEMP_FLAGS, mode, dir_fd=dir_fd)
    except OSError as exc:
        raise _tag(exc, "create") from None
    try:
        step("tmp_created")
        try:
            if chmod:
                os.fchmod(fd, mode)
            write_all(fd, data, torn=(lambda: step("tmp_partial")) if torn else None)
        except OSError as exc:
            raise _tag(exc, "write") from None
        step("tmp_written")
        if sync:
            try:
                os.fsync(fd)
            except OSError as exc:
                raise _tag(exc, "write") from None
    except BaseException:
        os.close(fd)
        _discard(tmp, dir_fd)
        raise
    try:
        os.close(fd)
    except OSError as exc:  # close can report a deferred write error (NFS, some FUSE)
        _discard(tmp, dir_fd)
        raise _tag(exc, "close") from None
    step("tmp_synced")
    return tmp


def _discard(tmp: str, dir_fd: int | None) -> None:
    with contextlib.suppress(OSError):
        os.unlink(tmp, dir_fd=dir_fd)


def _sync_directory(name: str, dir_fd: int | None, step: Callable[[str], None]) -> None:
    if dir_fd is not None:
        try:
            os.fsync(dir_fd)
        except OSError as exc:
            raise _tag(exc, "sync_directory") from None
    else:
        fsync_directory_of(name)
    step("dir_synced")


def fsync_directory_of(path: str) -> None:
    """``fsync`` the directory holding ``path`` (that of ``os.path.abspath(path)``).

    Raises:
        OSError: :func:`failed_step` ``open_directory`` or ``sync_directory``.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd = os.open(directory, _DIR_FLAGS)
    except OSError as exc:
        raise _tag(exc, "open_directory") from None
    try:
        os.fsync(fd)
    except OSError as exc:
        raise _tag(exc, "sync_directory") from None
    finally:
        os.close(fd)


def replace_file(
    name: str, data: bytes, *, dir_fd: int | None = None, temp_dir_fd: int | None = None, mode: int = 0o600,
    chmod: bool = True, sync: bool = True, torn: bool = False, step: Callable[[str], None] = _no_step,
    before: Callable[[], None] | None = None,
) -> None:
    """Replace ``name`` with ``data``: :func:`write_temp`, ``rename()``, ``fsync`` of the directory.

    Args:
        name: the target, relative to ``dir_fd`` (or a path when ``dir_fd`` is None).
        temp_dir_fd: where the temp file goes (default ``dir_fd``; the same file system).
        sync: fsync the file and the directory (False: RAM, neither).
        before: called right before the ``rename()``; raises to abort.
        mode, chmod, torn, step: as :func:`write_temp`; then step ``renamed`` and, when
            ``sync``, ``dir_synced``.

    Raises:
        OSError: as :func:`write_temp`, or :func:`failed_step` ``rename`` /
            ``sync_directory``. ``name`` keeps its old content on every failure before the
            rename; the temp file is then removed.
    """
    source_fd = dir_fd if temp_dir_fd is None else temp_dir_fd
    tmp = write_temp(source_fd, name, data, mode=mode, chmod=chmod, sync=sync, torn=torn, step=step)
    try:
        if before is not None:
            before()
        try:
            os.rename(tmp, name, src_dir_fd=source_fd, dst_dir_fd=dir_fd)
        except OSError as exc:
            raise _tag(exc, "rename") from None
    except BaseException:
        _discard(tmp, source_fd)
        raise
    step("renamed")
    if sync:
        _sync_directory(name, dir_fd, step)


def publish_file(
    name: str, data: bytes, *, dir_fd: int | None = None, temp_dir_fd: int | None = None, mode: int = 0o600,
    torn: bool = False, step: Callable[[str], None] = _no_step, before: Callable[[], None] | None = None,
    rename_without_links: bool = False,
) -> None:
    """Publish ``data`` as the new file ``name``, never replacing one: :func:`write_temp`
    (fsynced), ``link()``, ``fsync`` of the directory, unlink of the temp name.

    Args:
        rename_without_links: when ``link()`` fails because the file system has no hard
            links (EPERM, EOPNOTSUPP, EMLINK), ``rename()`` after a fresh check that
            ``name`` is absent (not atomic against a concurrent publisher).
        name, dir_fd, temp_dir_fd, mode, torn, before: as :func:`replace_file`; step as
            :func:`write_temp`, then ``linked``, ``dir_synced`` and ``tmp_removed``.

    Raises:
        FileExistsError: ``name`` exists (nothing replaced).
        OSError: as :func:`write_temp`, or :func:`failed_step` ``link`` / ``rename`` /
            ``sync_directory``. ``name`` is untouched on every failure before the link.
    """
    source_fd = dir_fd if temp_dir_fd is None else temp_dir_fd
    tmp = write_temp(source_fd, name, data, mode=mode, torn=torn, step=step)
    try:
        if before is not None:
            before()
        try:
            os.link(tmp, name, src_dir_fd=source_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        except FileExistsError as exc:
            raise _tag(exc, "link") from None
        except OSError as exc:
            if not rename_without_links or exc.errno not in _NO_LINKS:
                raise _tag(exc, "link") from None
            if os.path.lexists(name) if dir_fd is None else exists_at(name, dir_fd):
                raise _tag(FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST)), "link") from None
            try:
                os.rename(tmp, name, src_dir_fd=source_fd, dst_dir_fd=dir_fd)
            except OSError as exc2:
                raise _tag(exc2, "rename") from None
        step("linked")
        _sync_directory(name, dir_fd, step)
    finally:
        # Not fsynced: a temp name that reappears after a power loss is a stray temp file.
        _discard(tmp, source_fd)
    step("tmp_removed")


def exists_at(name: str, dir_fd: int) -> bool:
    """Whether ``name`` exists in the directory ``dir_fd`` (``lstat``: a dangling symlink
    exists). Raises the ``OSError`` of any other failure than ``ENOENT``."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def create_file(name: str, *, dir_fd: int | None = None, mode: int = 0o600) -> None:
    """Create the empty file ``name`` exclusively (:data:`TEMP_FLAGS`, ``fchmod(mode)``),
    fsync it and its directory.

    Raises:
        FileExistsError: it exists (nothing touched).
        OSError: :func:`failed_step` ``create``, ``write``, ``close`` or the directory's.
    """
    try:
        fd = os.open(name, TEMP_FLAGS, mode, dir_fd=dir_fd)
    except OSError as exc:
        raise _tag(exc, "create") from None
    try:
        os.fchmod(fd, mode)
        os.fsync(fd)
    except OSError as exc:
        raise _tag(exc, "write") from None
    finally:
        os.close(fd)
    _sync_directory(name, dir_fd, _no_step)


def remove_file(name: str, *, dir_fd: int | None = None, sync: bool = True,
                step: Callable[[str], None] = _no_step) -> bool:
    """``unlink()`` ``name`` and (``sync``) fsync its directory; False when it was absent.

    Steps: ``unlinked``, then ``dir_synced`` when ``sync``.

    Raises:
        OSError: :func:`failed_step` ``unlink`` or ``sync_directory``.
    """
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise _tag(exc, "unlink") from None
    step("unlinked")
    if sync:
        _sync_directory(name, dir_fd, step)
    return True
