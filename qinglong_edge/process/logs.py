"""Bounded job output and what the job wrapper publishes when a job ends.

The job wrapper (:mod:`qinglong_edge.process.wrapper`) writes each job's output itself:
stdout and stderr merged, raw, into the log file given in the job's
:class:`~qinglong_edge.process.spawn.JobSpec`, head first up to ``log_cap`` bytes
(existing bytes count), then ``log_notice`` once; the rest is read, counted and
discarded, so a job never blocks on a full log and never fills the flash (issue 9:
``RLIMIT_FSIZE`` would cap every file the job writes, and kill it with SIGXFSZ). The
wrapper outlives the agent, so nothing is lost while no agent runs.

At the end the wrapper publishes, if asked, the truncation fact and then the receipt
(temp file, fsync, ``link``, fsync of the directory). This module reads them back for the
caller, as raw bytes: their formats belong to the caller (the remote contracts parse
them; ``contracts/``).
"""

from __future__ import annotations

import errno
import os

from qinglong_edge.errors import ExecutionError
from qinglong_edge.filecheck import stat_problem

__all__ = ["MAX_PUBLICATION_BYTES", "TRUNCATION_NOTICE", "read_publication", "read_receipt", "read_truncation_fact"]

#: What Local Runs append once when their output is cut (inside ``execution.maxLogBytes``).
TRUNCATION_NOTICE = b"\n[qinglong-edge: output truncated]\n"
#: Receipts and truncation facts are 1..4096 bytes (remote-execution.md 4.2, 4.3).
MAX_PUBLICATION_BYTES = 4096
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def read_publication(path: str, what: str = "publication") -> bytes | None:
    """The bytes of a file the wrapper published, or ``None`` when there is none (yet).

    Checks what the wrapper guarantees: a regular file (not a symlink, not a FIFO),
    owned by us, mode without group/other bits, one link, 1..4096 bytes.

    Raises:
        ExecutionError: ``publication_invalid`` (any check failed; the message names
            ``what`` and the path, never the content) or ``publication_unavailable``
            (an I/O error other than ENOENT).
    """
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        code = "publication_invalid" if exc.errno in (errno.ELOOP, errno.ENXIO) else "publication_unavailable"
        raise ExecutionError(f"{what} {path}: {exc.strerror}", code=code) from None
    try:
        st = os.fstat(fd)
        if stat_problem(st, path, directory=False, single_link=True) is not None:
            raise ExecutionError(f"{what} {path}: not a private regular file", code="publication_invalid")
        if not 1 <= st.st_size <= MAX_PUBLICATION_BYTES:
            raise ExecutionError(f"{what} {path}: size {st.st_size} outside 1..{MAX_PUBLICATION_BYTES}",
                                 code="publication_invalid")
        data = os.read(fd, MAX_PUBLICATION_BYTES + 1)
    except OSError as exc:
        raise ExecutionError(f"{what} {path}: {exc.strerror}", code="publication_unavailable") from None
    finally:
        os.close(fd)
    if not 1 <= len(data) <= MAX_PUBLICATION_BYTES:
        raise ExecutionError(f"{what} {path}: size outside 1..{MAX_PUBLICATION_BYTES}", code="publication_invalid")
    return data


def read_receipt(path: str) -> bytes | None:
    """The receipt the wrapper published (``prefix + ,"finishedAtMs":N,"exitCode":E}``),
    raw, or ``None``: not yet, or never (the wrapper was killed: "No receipt").

    Raises:
        ExecutionError: as :func:`read_publication`.
    """
    return read_publication(path, "receipt")


def read_truncation_fact(path: str) -> bytes | None:
    """The truncation fact (``prefix + ,"quotaReached":B,"observedAtMs":N}`` by default),
    raw, or ``None``.

    Raises:
        ExecutionError: as :func:`read_publication`.
    """
    return read_publication(path, "truncation fact")
