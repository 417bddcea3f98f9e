"""Read side of the worker journal: the opened directories and the lock-free reader.

:class:`JournalReader` serves ``inbox list|show`` while a ``pull`` may own the
journal: records only ever change by ``link`` or ``rename`` (files.py), so a reader
sees a complete old or new file. :class:`RecordReads` is the read logic the owned
:class:`~qinglong_edge.worker.journal.store.Journal` shares. Layout and rules: journal.py
and offer-delivery.md 3.1.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from types import TracebackType

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.journal_records import PendingClaim, parse_inbox_record, parse_pending_claim
from qinglong_edge.errors import JournalError
from qinglong_edge.worker.journal import files

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import TypeVar

    from qinglong_edge.contracts.records import InboxRecord

    T = TypeVar("T")

__all__ = [
    "ABANDONED_DIR",
    "CLAIM_NAME",
    "OFFERS_DIR",
    "InboxRecord",
    "JournalDirs",
    "JournalReader",
    "RecordReads",
    "check_root_path",
    "parse_record",
]

_RECORD_CODES = frozenset({"claim_conflict", "claim_revision_conflict", "offer_conflict", "invalid_configuration"})

CLAIM_NAME = "pending-claim.json"
OFFERS_DIR = "offers"
ABANDONED_DIR = "abandoned"

#: An inbox record: the normalized ``offers/<offerId>.json`` document (contracts.journal_records);
#: for the type checker the TypedDict of contracts/records.py (never imported at run time).
if not TYPE_CHECKING:
    InboxRecord = dict

def check_root_path(root: str) -> None:
    """3.1: absolute, <= 4096 characters, no NUL/CR/LF."""
    if not isinstance(root, str) or not root.startswith("/") or len(root) > 4096 or any(c in root for c in "\0\r\n"):
        raise JournalError("journal root must be an absolute path without NUL/CR/LF", code="invalid_configuration")


def parse_record(parse: Callable[[bytes], T], data: bytes, what: str) -> T:
    """Run a record parser on bytes read from ``what``.

    A record that breaks its contract is ``unsafe_storage`` (3.1: "every other error,
    including bad JSON"), unless the contract names a journal code
    (``claim_conflict``, ``claim_revision_conflict``, ``offer_conflict``,
    ``invalid_configuration``: section 3.3), which is kept.
    """
    try:
        return parse(data)
    except JournalError:
        raise
    except ContractError as exc:
        code = exc.code if exc.code in _RECORD_CODES else "unsafe_storage"
        raise JournalError(f"{what}: {exc.code} at {exc.path}", code=code) from None



class JournalDirs:
    """The opened, checked directories of one journal root."""

    def __init__(self, root: str, root_fd: int, offers_fd: int | None, abandoned_fd: int | None) -> None:
        self.root = root
        self.root_fd = root_fd
        self.offers_fd = offers_fd
        self.abandoned_fd = abandoned_fd

    def close(self) -> None:
        for fd in (self.offers_fd, self.abandoned_fd, self.root_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def what(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)


class RecordReads:
    """Reads shared by the lock-free reader and the owned journal."""

    def __init__(self, dirs: JournalDirs) -> None:
        self._dirs = dirs

    @property
    def root(self) -> str:
        return self._dirs.root

    def _read_claim(self) -> PendingClaim | None:
        what = self._dirs.what(CLAIM_NAME)
        try:
            data = files.read_record(self._dirs.root_fd, CLAIM_NAME, what)
            return None if data is None else parse_record(parse_pending_claim, data, what)
        except JournalError as exc:
            if exc.code not in ("unsafe_storage", "claim_conflict"):
                raise
            # Every cycle stops on it (3.1: fail closed): say the way out and what it costs.
            raise JournalError(f"{exc.message} (this pending claim cannot be used: fix its mode, or remove it with "
                               "no pull running; a claim that is not replayed costs nothing but time: the cluster "
                               "retries its Run once the lease runs out)", code=exc.code) from None

    def _list_offers(self) -> list[str]:
        if self._dirs.offers_fd is None:  # a reader of a journal that never finished opening
            return []
        return files.list_records(self._dirs.offers_fd, self._dirs.what(OFFERS_DIR))

    def _read_offer(self, offer_id: str) -> InboxRecord | None:
        name = files.record_file_name(offer_id)
        if self._dirs.offers_fd is None:
            return None
        what = self._dirs.what(OFFERS_DIR, name)
        try:
            data = files.read_record(self._dirs.offers_fd, name, what)
            if data is None:
                return None
            return parse_record(lambda raw: parse_inbox_record(raw, expected_offer_id=offer_id), data, what)
        except JournalError as exc:
            if exc.code != "unsafe_storage":
                raise
            # One record the agent cannot use stops every cycle (3.1: fail closed); say the
            # way out, which ``inbox discard`` takes for a record it cannot read.
            raise JournalError(f"{exc.message} (this inbox record cannot be used: `qinglong-edge inbox discard "
                               f"{offer_id} --yes --force` removes it)", code=exc.code) from None


class JournalReader(RecordReads):
    """Lock-free, read-only view of a journal (``inbox list|show``).

    Safe while a ``pull`` owns the journal: records only ever change by ``link`` or
    ``rename``, so a reader sees a complete old or new file. Nothing is created.

    Raises (from every method): ``JournalError`` ``unsafe_storage`` /
    ``storage_unavailable`` as :mod:`qinglong_edge.worker.journal.files` says.
    """

    @classmethod
    def open(cls, root: str) -> JournalReader:
        """Open an existing journal root for reading (``unsafe_storage`` if missing or unsafe).

        A root without ``offers/`` (its first open was interrupted) reads as empty.
        """
        check_root_path(root)
        root = os.path.normpath(root)
        root_fd, _ = files.open_private_directory(root, dir_fd=None, what=root, create=False)
        try:
            offers_fd: int | None = None
            if os.path.lexists(os.path.join(root, OFFERS_DIR)):
                offers_fd, _ = files.open_private_directory(
                    OFFERS_DIR, dir_fd=root_fd, what=os.path.join(root, OFFERS_DIR), create=False
                )
        except BaseException:
            os.close(root_fd)
            raise
        return cls(JournalDirs(root, root_fd, offers_fd, None))

    def close(self) -> None:
        self._dirs.close()

    def __enter__(self) -> JournalReader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def read_claim(self) -> PendingClaim | None:
        """The pending claim, or None."""
        return self._read_claim()

    def list_offers(self) -> list[str]:
        """offerIds in the inbox, sorted (JS default string order)."""
        return self._list_offers()

    def read_offer(self, offer_id: str) -> InboxRecord | None:
        """The inbox record of ``offer_id``, or None."""
        return self._read_offer(offer_id)

    def count_abandoned(self) -> int:
        """How many abandoned claims ``abandoned/`` keeps (0 when it does not exist)."""
        path = os.path.join(self._dirs.root, ABANDONED_DIR)
        if not os.path.lexists(path):
            return 0
        fd, _ = files.open_private_directory(ABANDONED_DIR, dir_fd=self._dirs.root_fd, what=path, create=False)
        try:
            return len(files.list_records(fd, path))
        finally:
            os.close(fd)
