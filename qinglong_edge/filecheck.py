"""The file and directory rules every command and ``doctor`` share (issue 18 item 5).

One source of truth: the journal (:mod:`qinglong_edge.worker.journal.files`), the Local store's
database directory (:mod:`qinglong_edge.local.store`), ``admin init`` and ``doctor``
judge a private directory with :func:`stat_problem` / :func:`directory_problem`, so a
directory that fails a command fails ``doctor`` with the same words, and one root cause
(say, a state directory owned by another user) is one :class:`Problem` with one remedy.

Private means (offer-delivery.md 3.1): a real directory or regular file (``lstat``: not
a symlink), owned by the effective user, with none of the ``forbidden`` mode bits
(``0o077``: no group/other access; trust anchors use ``0o022``: not writable by others).

No I/O beyond ``lstat``; nothing here raises (the callers raise their own error type
with :attr:`Problem.message`).
"""

from __future__ import annotations

import os
import shlex
import stat

from qinglong_edge.contracts._shape import Frozen

__all__ = ["PRIVATE_BITS", "Problem", "directory_problem", "ownership_remedy", "stat_problem"]

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
            ``foreign_owner``, ``loose_mode`` or ``unreadable``.
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


def stat_problem(st: os.stat_result, path: str, *, directory: bool, forbidden: int = PRIVATE_BITS) -> Problem | None:
    """The rules on an ``lstat``/``fstat`` result (see the module docstring), or None."""
    if stat.S_ISLNK(st.st_mode):
        return Problem("symlink", f"{path}: is a symlink",
                       f"replace the symlink {shlex.quote(path)} with a real {'directory' if directory else 'file'}")
    if directory and not stat.S_ISDIR(st.st_mode):
        return Problem("not_directory", f"{path}: not a directory", f"make {shlex.quote(path)} a real directory")
    if not directory and not stat.S_ISREG(st.st_mode):
        return Problem("not_file", f"{path}: not a regular file", f"make {shlex.quote(path)} a regular file")
    euid = os.geteuid()
    remedy = ownership_remedy(path, directory=directory, uid=euid, forbidden=forbidden)
    if st.st_uid != euid:
        return Problem("foreign_owner",
                       f"{path}: owned by uid {st.st_uid}, not {euid} (the user running qinglong-edge)",
                       f"{remedy} (or run qinglong-edge as uid {st.st_uid})")
    if st.st_mode & forbidden:
        bits = "group/other access" if forbidden == PRIVATE_BITS else "group/other write access"
        return Problem("loose_mode", f"{path}: mode {stat.S_IMODE(st.st_mode):04o} allows {bits}", remedy)
    return None


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
