"""The crash-safe worker journal: pending claim, inbox, abandoned claims (ADR-0110 section 3).

On-disk layout (offer-delivery.md 3.1; the lock per the spec README)::

    <root>/                           0700, a real directory owned by us
    <root>/.owner.lock                0600, flock owner lock + owner record (ownerlock.py)
    <root>/pending-claim.json         0600, at most one outstanding claim (3.3)
    <root>/offers/                    0700
    <root>/offers/<offerId>.json      0600, one inbox record per accepted offer (3.4)
    <root>/abandoned/                 0700
    <root>/abandoned/<offerId>.json   0600, claims given up, with the reason (README, 3.9)
    <root>/.<basename>.<32 hex>.tmp   transient temp files (3.5)

The Worker Session record, the owner record and the attempt-in-flight marker are not
here: they live in the runtime directory in RAM (:mod:`qinglong_edge.worker.journal.runtime`;
spec README "Decisions for storage on flash"), so an idle cycle writes nothing here.
A ``session.json`` left in the root by an older version is read once and removed
(:meth:`Journal.take_legacy_session_record`).

The record formats are :mod:`qinglong_edge.contracts.journal_records`; this module
does the files: which algorithm publishes what (files.py), the revision, replay
and conflict rules of 3.3 and 3.6, capacity, retention and abandonment.

Every operation first checks the owner lock (``not_owned`` /
``ownership_compromised``) and checks it again right before its commit step. Within
one process operations run one at a time (a mutex), in call order.

Crash safety, the invariant tests/worker/journal/test_journal_crash.py checks at every
crash point: a fresh process finds the old or the new complete state, never a
partial or empty record; the inbox record's directory entry is durable before the
claim is cleared (field lessons 8).

Errors are :class:`~qinglong_edge.errors.JournalError` with the codes of section 3.8
plus ``storage_unavailable`` (ENOSPC/EIO/EROFS: retry later, the claim is intact).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from types import TracebackType

from qinglong_edge.config import WorkerConfig
from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.journal_records import (
    INBOX_TRANSITIONS,
    AbandonedClaim,
    PendingClaim,
    abandoned_record_bytes,
    check_inbox_update,
    inbox_record,
    inbox_record_bytes,
    parse_abandoned_record,
)
from qinglong_edge.contracts.offer import normalize_internal_offer, same_offer_authority
from qinglong_edge.contracts.residency import lease_expired_locally, needs_local_action
from qinglong_edge.errors import JournalError
from qinglong_edge.worker.journal import files
from qinglong_edge.worker.journal.ownerlock import DEFAULT_STALE_MS, MAX_STALE_MS, MIN_STALE_MS, OwnerLock
from qinglong_edge.worker.journal.view import (
    ABANDONED_DIR,
    CLAIM_NAME,
    OFFERS_DIR,
    InboxRecord,
    JournalDirs,
    JournalReader,
    RecordReads,
    check_root_path,
    parse_record,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Literal

    from qinglong_edge.contracts.records import InboxRecord, InternalOffer
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

#: Where versions before the runtime directory kept the Worker Session record.
SESSION_NAME = "session.json"
#: Publication failures that say nothing about the file system (no probe after them).
_NOT_STORAGE = frozenset({"offer_conflict", "not_owned", "ownership_compromised", "invalid_configuration"})

__all__ = [
    "ABANDONED_DIR",
    "CLAIM_NAME",
    "HARD_MAXIMUM_ENTRIES",
    "OFFERS_DIR",
    "SESSION_NAME",
    "TERMINAL_STATES",
    "AcceptResult",
    "InboxRecord",
    "Journal",
    "JournalOptions",
    "JournalReader",
]

#: Inbox capacity (3.1): default 64 (edge profile), allowed 1..1024.
DEFAULT_MAXIMUM_ENTRIES = 64
HARD_MAXIMUM_ENTRIES = 1024

if TYPE_CHECKING:
    AcceptResult = tuple[Literal["accepted", "replayed"], InboxRecord]
else:
    AcceptResult = tuple  # at run time ``Literal`` would need typing (not imported by pull)
#: States no transition leaves (3.4): what inbox retention may prune.
TERMINAL_STATES = frozenset(state for state, targets in INBOX_TRANSITIONS.items() if targets == {state})


class JournalOptions(Frozen):
    """Limits of one journal. Times in ms.

    Attributes:
        maximum_entries: inbox capacity, 1..1024 (3.1; default 64).
        abandoned_maximum_entries: abandoned claims kept, 1..1024; oldest pruned.
        retention_ms: terminal inbox records older than this are pruned by
            :meth:`Journal.prune_inbox`; >= 0.
        ownership_stale_ms: owner lock staleness (100..300 000; config: 5 000..300 000).
    """

    __slots__ = (  # noqa: RUF023 (field order)
        "maximum_entries",
        "abandoned_maximum_entries",
        "retention_ms",
        "ownership_stale_ms",
    )

    maximum_entries: int
    abandoned_maximum_entries: int
    retention_ms: int
    ownership_stale_ms: int

    def __init__(
        self,
        maximum_entries: int = DEFAULT_MAXIMUM_ENTRIES,
        abandoned_maximum_entries: int = 32,
        retention_ms: int = 604_800_000,
        ownership_stale_ms: int = DEFAULT_STALE_MS,
    ) -> None:
        _set = object.__setattr__
        _set(self, "maximum_entries", maximum_entries)
        _set(self, "abandoned_maximum_entries", abandoned_maximum_entries)
        _set(self, "retention_ms", retention_ms)
        _set(self, "ownership_stale_ms", ownership_stale_ms)

    @classmethod
    def from_config(cls, worker: WorkerConfig) -> JournalOptions:
        return cls(
            maximum_entries=worker.inbox_maximum_entries,
            abandoned_maximum_entries=worker.abandoned_maximum_entries,
            retention_ms=worker.inbox_retention_ms,
            ownership_stale_ms=worker.ownership_stale_ms,
        )

    def validate(self) -> None:
        for name, value, low, high in (
            ("maximum_entries", self.maximum_entries, 1, HARD_MAXIMUM_ENTRIES),
            ("abandoned_maximum_entries", self.abandoned_maximum_entries, 1, HARD_MAXIMUM_ENTRIES),
            ("retention_ms", self.retention_ms, 0, 2**53 - 1),
            ("ownership_stale_ms", self.ownership_stale_ms, MIN_STALE_MS, MAX_STALE_MS),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise JournalError(f"{name} must be {low}..{high}", code="invalid_configuration")


_UPDATE_CODES = frozenset({"invalid_transition", "offer_conflict", "offer_revision_conflict"})


def _claim_key(claim: PendingClaim) -> tuple[object, ...]:
    return (claim.offer_id, claim.worker_id, claim.worker_session_id, claim.worker_generation,
            claim.authority.lease_token_digest)


def _abandoned_key(record: AbandonedClaim) -> tuple[object, ...]:
    return (record.offer_id, record.worker_id, record.worker_session_id, record.worker_generation,
            record.lease_token_digest)


class Journal(RecordReads):
    """The owned, writable journal. Open with :meth:`open`; close to release the lock."""

    def __init__(self, dirs: JournalDirs, lock: OwnerLock, options: JournalOptions,
                 runtime: RuntimeDirectory | None = None) -> None:
        super().__init__(dirs)
        self._lock = lock
        self.options = options
        #: The runtime directory the owner record went to (None: the lock file).
        self.runtime = runtime
        self._mutex = threading.RLock()
        self._closed = False

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open(cls, root: str, options: JournalOptions | None = None,
             runtime: RuntimeDirectory | None = None) -> Journal:
        """Create/check the root, take the owner lock, clean up, probe a new journal.

        Steps: root created 0700 if missing (an existing one must be a real 0700
        directory of ours), owner lock taken (``already_owned`` at once if held; its
        owner record goes to ``runtime``), stray temp files removed (every temp file
        that exists now predates our lock, so it belongs to a dead owner: no file
        times are compared), ``offers/`` and ``abandoned/`` created or checked, the
        listings validated. Only when this open created the root, ``offers/`` or
        ``abandoned/``, ``O_EXCL`` and hard links are probed in the root (FAT/exFAT and
        some FUSE mounts have no hard links: ``unsafe_storage``); an existing journal
        is probed again only when a publication fails (so an idle open writes nothing).

        Raises:
            JournalError: ``invalid_configuration``, ``already_owned``,
                ``unsafe_storage``, ``storage_unavailable``.
        """
        options = options or JournalOptions()
        options.validate()
        check_root_path(root)
        root = os.path.normpath(root)
        root_fd, created = files.open_private_directory(root, dir_fd=None, what=root, create=True)
        lock: OwnerLock | None = None
        dirs: JournalDirs | None = None
        try:
            if created:
                files.fsync_parent(root)
            lock = OwnerLock.acquire(root, stale_ms=options.ownership_stale_ms, runtime=runtime)
            files.remove_stray_temp_files(root_fd, root)
            new = created or not all(
                os.path.lexists(os.path.join(root, name)) for name in (OFFERS_DIR, ABANDONED_DIR)
            )
            if new:
                files.probe_file_system(root_fd, root)
            offers_fd, made_offers = files.open_private_directory(
                OFFERS_DIR, dir_fd=root_fd, what=os.path.join(root, OFFERS_DIR), create=True
            )
            dirs = JournalDirs(root, root_fd, offers_fd, None)
            dirs.abandoned_fd, made_abandoned = files.open_private_directory(
                ABANDONED_DIR, dir_fd=root_fd, what=os.path.join(root, ABANDONED_DIR), create=True
            )
            if made_offers or made_abandoned:
                files.fsync_directory(root_fd, root)
            files.list_records(offers_fd, dirs.what(OFFERS_DIR))
            files.list_records(dirs.abandoned_fd, dirs.what(ABANDONED_DIR))
        except BaseException:
            if lock is not None:
                lock.release()
            if dirs is not None:
                dirs.close()
            else:
                os.close(root_fd)
            raise
        return cls(dirs, lock, options, runtime)

    def close(self) -> None:
        """Release the owner lock and close the directories. Idempotent."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            self._lock.release()
            self._dirs.close()

    @property
    def lock(self) -> OwnerLock:
        return self._lock

    @property
    def _abandoned_fd(self) -> int:
        fd = self._dirs.abandoned_fd
        if fd is None:  # cannot happen: open() always opens abandoned/
            raise JournalError("abandoned/ is not open", code="unsafe_storage")
        return fd

    @property
    def _offers_fd(self) -> int:
        fd = self._dirs.offers_fd
        if fd is None:  # cannot happen: open() always opens offers/
            raise JournalError("offers/ is not open", code="unsafe_storage")
        return fd

    @contextlib.contextmanager
    def _owned(self) -> Iterator[None]:
        with self._mutex:
            if self._closed:
                raise JournalError("the journal is closed", code="not_owned")
            self._lock.ensure_owned()
            yield

    def _guard(self) -> None:
        self._lock.ensure_owned()

    # -- reads (owned) --------------------------------------------------------------------

    def read_claim(self) -> PendingClaim | None:
        with self._owned():
            return self._read_claim()

    def list_offers(self) -> list[str]:
        with self._owned():
            return self._list_offers()

    def read_offer(self, offer_id: str) -> InboxRecord | None:
        with self._owned():
            return self._read_offer(offer_id)

    def has_capacity(self) -> bool:
        """Whether a *new* offer would fit: the pull layer makes no new claim otherwise."""
        with self._owned():
            return len(self._list_offers()) < self.options.maximum_entries

    # -- pending claim (3.3) ------------------------------------------------------------------

    def create_claim(self, claim: PendingClaim) -> PendingClaim:
        """Publish ``claim`` as ``pending-claim.json`` (first publication, durable on return).

        Returns:
            The claim on disk: ``claim``, or the existing one when it has the same
            authority (workerId, session, generation, offerId, leaseToken).

        Raises:
            JournalError: ``offer_conflict`` when a different claim exists.
        """
        with self._owned():
            existing = self._read_claim()
            if existing is not None:
                if existing.authority == claim.authority:
                    return existing
                raise JournalError("a different pending claim exists", code="offer_conflict")
            self._publish_first(self._dirs.root_fd, CLAIM_NAME, claim.to_bytes(), "claim_create")
            return claim

    def replace_claim(self, claim: PendingClaim, expected_revision: int) -> PendingClaim:
        """Write the next revision of the claim (update algorithm, durable on return).

        Raises:
            JournalError: ``claim_revision_conflict`` unless the claim exists at
                ``expected_revision``, ``claim.revision == expected_revision + 1`` and
                the authority is unchanged.
        """
        with self._owned():
            existing = self._read_claim()
            if (
                existing is None
                or existing.revision != expected_revision
                or claim.revision != expected_revision + 1
                or existing.authority != claim.authority
            ):
                raise JournalError("pending claim is not at the expected revision", code="claim_revision_conflict")
            self._publish_replace(self._dirs.root_fd, CLAIM_NAME, claim.to_bytes(), "claim_replace")
            return claim

    def clear_claim(self, offer_id: str, expected_revision: int) -> None:
        """Remove the claim (unlink, fsync root).

        Raises:
            JournalError: ``claim_revision_conflict`` unless the claim exists with
                ``offer_id`` at ``expected_revision``.
        """
        with self._owned():
            existing = self._read_claim()
            if existing is None or existing.offer_id != offer_id or existing.revision != expected_revision:
                raise JournalError("pending claim is not at the expected revision", code="claim_revision_conflict")
            self._remove(self._dirs.root_fd, CLAIM_NAME, "claim_clear")

    def abandon_claim(self, reason: str, now_ms: int) -> AbandonedClaim:
        """Move the pending claim to ``abandoned/<offerId>.json`` with ``reason``.

        Spec README (offer delivery gaps): a claim bound to another session or
        generation (``stale_session``), one that used its 16 attempts
        (``attempt_budget_exhausted``), or one answered ``worker_offer_fenced``
        (``offer_fenced``) is abandoned so nothing wedges the device. The abandoned
        record (the claim without its lease token) is published first (fsynced),
        then the claim is removed (unlink, fsync root); then the oldest abandoned
        records beyond ``abandoned_maximum_entries`` are pruned (by ``abandonedAtMs``,
        then offerId; the new one is never pruned). After a crash between the two,
        the next call finds its own record and finishes the removal.

        Args:
            reason: one of ``journal_records.ABANDON_REASONS``.
            now_ms: wall-clock ms (``abandonedAtMs``).

        Returns:
            The abandoned record as stored.

        Raises:
            JournalError: ``claim_revision_conflict`` when there is no claim;
                ``offer_conflict`` when an abandoned record of that offerId with
                another authority exists.
            ContractError: ``abandon_reason`` for an unknown reason (nothing changed).
        """
        with self._owned():
            claim = self._read_claim()
            if claim is None:
                raise JournalError("there is no pending claim to abandon", code="claim_revision_conflict")
            abandoned_fd = self._abandoned_fd
            data = abandoned_record_bytes(claim, reason, now_ms)
            name = files.record_file_name(claim.offer_id)
            what = self._dirs.what(ABANDONED_DIR, name)
            try:
                self._publish_first(abandoned_fd, name, data, "claim_abandon")
            except JournalError as exc:
                if exc.code != "offer_conflict":
                    raise
                # Our own earlier abandon of this very claim crashed before the removal?
                old = files.read_record(abandoned_fd, name, what)
                if old is None or _abandoned_key(parse_record(parse_abandoned_record, old, what)) != _claim_key(claim):
                    raise
                data = old
            self._remove(self._dirs.root_fd, CLAIM_NAME, "claim_clear")
            self._prune_abandoned(keep=name)
            return parse_record(parse_abandoned_record, data, what)

    def list_abandoned(self) -> list[AbandonedClaim]:
        """The abandoned claims kept, oldest first (``abandonedAtMs``, then offerId)."""
        with self._owned():
            return sorted(self._read_abandoned(), key=lambda item: (item.abandoned_at_ms, item.offer_id))

    def _read_abandoned(self) -> list[AbandonedClaim]:
        fd = self._abandoned_fd
        records = []
        for offer_id in files.list_records(fd, self._dirs.what(ABANDONED_DIR)):
            name = f"{offer_id}.json"
            what = self._dirs.what(ABANDONED_DIR, name)
            data = files.read_record(fd, name, what)
            if data is not None:
                records.append(parse_record(parse_abandoned_record, data, what))
        return records

    def prune_abandoned(self) -> list[str]:
        """Remove the oldest abandoned claims beyond ``abandoned_maximum_entries``.

        Called by every cycle (and ``admin prune``), so a bound lowered below what is
        stored holds from the next cycle on, not only after the next abandon. Within the
        bound it only lists ``abandoned/`` (no record is read, nothing is written).
        Returns the offerIds removed, oldest first.
        """
        with self._owned():
            return self._prune_abandoned(keep=None)

    def _prune_abandoned(self, keep: str | None) -> list[str]:
        fd = self._abandoned_fd
        if len(files.list_records(fd, self._dirs.what(ABANDONED_DIR))) <= self.options.abandoned_maximum_entries:
            return []
        records = self._read_abandoned()
        excess = len(records) - self.options.abandoned_maximum_entries
        if excess <= 0:
            return []
        aged = sorted((r.abandoned_at_ms, r.offer_id) for r in records if f"{r.offer_id}.json" != keep)
        removed = []
        for _, offer_id in aged[:excess]:
            self._remove(fd, files.record_file_name(offer_id), "abandoned_prune")
            removed.append(offer_id)
        return removed

    # -- inbox (3.4, 3.6) ------------------------------------------------------------------

    def accept_offer(self, offer: InternalOffer, now_ms: int) -> AcceptResult:
        """Durably accept a delivered internal offer, or recognise its replay (3.6).

        The offer is normalized again (the full section 2.6 step 12 checks). Then:

        * no record: capacity check (``capacity_exhausted`` when the inbox holds
          ``maximum_entries``), then first publication of a ``state: accepted``
          record, revision 0, ``acceptedAtMs = updatedAtMs = now_ms``: ``accepted``.
        * a record with another authority: ``offer_conflict``.
        * a record with the same authority and a delivered ``lease.version`` higher
          than the stored one: the lease is updated (revision + 1, update
          algorithm), ``replayed``. Same ``deliveryKind``: the delivered offer is
          stored, as the reference does. A ``lease_recovery`` over a stored
          ``new_claim`` (spec README decision; the reference says ``offer_conflict``):
          the stored offer is kept with the delivered lease, so ``deliveryKind``
          still records how the offer first arrived. ``updatedAtMs`` is
          ``max(now_ms, stored)``: a wall clock that stepped back must not break
          the "never decreases" rule.
        * otherwise: ``replayed`` with the stored record unchanged.

        Replays work even when the inbox is full.

        Returns:
            ``("accepted" | "replayed", record)``.

        Raises:
            JournalError: ``capacity_exhausted``, ``offer_conflict``,
                ``unsafe_storage``, ``storage_unavailable`` (nothing was changed);
            ContractError: the offer does not normalize.
        """
        with self._owned():
            delivered = normalize_internal_offer(offer, "$.offer")
            offer_id = delivered["offerId"]
            name = files.record_file_name(offer_id)
            existing = self._read_offer(offer_id)
            if existing is None:
                if len(self._list_offers()) >= self.options.maximum_entries:
                    raise JournalError("the inbox is full", code="capacity_exhausted")
                record = inbox_record(delivered, now_ms)
                self._publish_first(self._offers_fd, name, inbox_record_bytes(record), "offer_accept")
                return "accepted", record
            stored = existing["offer"]
            if not same_offer_authority(stored, delivered):
                raise JournalError("a different offer is stored under this offerId", code="offer_conflict")
            if delivered["lease"]["version"] <= stored["lease"]["version"]:
                return "replayed", existing
            if stored["deliveryKind"] == delivered["deliveryKind"]:
                new_offer = delivered
            else:
                new_offer = {**stored, "lease": delivered["lease"]}
            updated: InboxRecord = {
                **existing,
                "revision": existing["revision"] + 1,
                "offer": new_offer,
                "updatedAtMs": max(now_ms, existing["updatedAtMs"]),
            }
            self._check_update(existing, updated)
            self._publish_replace(self._offers_fd, name, inbox_record_bytes(updated), "offer_update")
            return "replayed", updated

    def replace_offer(self, record: InboxRecord, expected_revision: int) -> InboxRecord:
        """Write the next revision of an inbox record (3.6 "other replace operations").

        Raises:
            JournalError: ``offer_revision_conflict`` unless the stored record is at
                ``expected_revision`` and ``record.revision == expected_revision + 1``;
                ``invalid_transition`` / ``offer_conflict`` from the inbox rules.
        """
        with self._owned():
            offer_id = record["offer"]["offerId"]
            name = files.record_file_name(offer_id)
            existing = self._read_offer(offer_id)
            if (
                existing is None
                or existing["revision"] != expected_revision
                or record["revision"] != expected_revision + 1
            ):
                raise JournalError("inbox record is not at the expected revision", code="offer_revision_conflict")
            self._check_update(existing, record)
            self._publish_replace(self._offers_fd, name, inbox_record_bytes(record), "offer_update")
            return record

    @staticmethod
    def _check_update(old: InboxRecord, new: InboxRecord) -> None:
        try:
            check_inbox_update(old, new)
        except ContractError as exc:
            code = exc.code if exc.code in _UPDATE_CODES else "offer_conflict"
            raise JournalError(f"inbox update refused: {exc.code} at {exc.path}", code=code) from None

    def discard_offer(self, offer_id: str) -> bool:
        """Remove ``offers/<offerId>.json`` (unlink + fsync). False if it did not exist."""
        with self._owned():
            return self._remove(self._offers_fd, files.record_file_name(offer_id), "offer_discard")

    def prune_inbox(
        self,
        now_ms: int,
        *,
        process_gone: Callable[[InboxRecord], bool] | None = None,
        remove_files: Callable[[InboxRecord], object] | None = None,
        kept: list[InboxRecord] | None = None,
    ) -> list[str]:
        """Remove the records that are terminal for residency and pruning and whose
        ``updatedAtMs`` is older than ``now_ms - retention_ms`` (spec README "Terminal for
        residency and pruning": :func:`~qinglong_edge.contracts.residency.needs_local_action`
        is False -- ``completion_acknowledged``, ``start_failure_acknowledged``, and
        ``recovery_required`` once no local action remains). Returns their ids.

        Args:
            process_gone: whether a ``lease_lost_local_execution_unverified`` record's
                process is verified gone (default: never: such a record is kept).
            remove_files: called with each record before it is removed (its log, receipt
                and truncation fact go first: a crash in between leaves a record whose
                files are gone, pruned again next time, never a file without its record).
            kept: when given, every record read and not pruned is appended to it (so a
                caller that needs them all reads each file once a cycle).

        A wall clock that is behind (router booted at 1970) prunes nothing; a record
        that does not parse is left for the operator (``inbox show``/``discard``).
        """
        with self._owned():
            pruned = []
            for offer_id in self._list_offers():
                record = self._read_offer(offer_id)
                if record is None:
                    continue
                if record["updatedAtMs"] >= now_ms - self.options.retention_ms:
                    if kept is not None:
                        kept.append(record)
                    continue
                gone = bool(process_gone(record)) if (
                    process_gone is not None and record.get("recoveryReason") == "lease_lost_local_execution_unverified"
                ) else False
                if needs_local_action(record, process_gone=gone,
                                      lease_expired=lease_expired_locally(record["offer"]["lease"], now_ms)):
                    if kept is not None:
                        kept.append(record)
                    continue
                if remove_files is not None:
                    remove_files(record)
                self._remove(self._offers_fd, files.record_file_name(offer_id), "offer_discard")
                pruned.append(offer_id)
            return pruned

    def make_room(
        self,
        finished: Callable[[InboxRecord], bool],
        *,
        remove_files: Callable[[InboxRecord], object] | None = None,
        records: list[InboxRecord] | None = None,
    ) -> list[str]:
        """Make one inbox entry free for a new offer by removing the oldest finished records.

        Issue 23, "Finished records never block work": only records that still need this
        device count against ``maximum_entries``; when the inbox files fill it, the oldest
        records for which ``finished`` is True (terminal for residency and pruning) go first,
        by ``updatedAtMs`` then offerId, their files first (``remove_files``, as
        :meth:`prune_inbox`). A record in flight is never removed, so the inbox stays full
        when records in flight fill it (then no claim is made: ``inbox_full``).

        Args:
            finished: whether a record is terminal for residency and pruning (the caller's
                :func:`~qinglong_edge.worker.remote.job_files.in_flight` negated).
            remove_files: called with each record before it is removed.
            records: the records as the caller read them this cycle (each file is read
                again only when this is None); only used when the inbox is full.

        Returns:
            The offerIds removed, oldest first (none while an entry is free: nothing is read).
        """
        with self._owned():
            names = self._list_offers()
            excess = len(names) - self.options.maximum_entries + 1
            if excess <= 0:
                return []
            if records is None:
                records = [r for r in (self._read_offer(name) for name in names) if r is not None]
            present = set(names)
            candidates = sorted(
                ((r["updatedAtMs"], r["offer"]["offerId"], r) for r in records
                 if r["offer"]["offerId"] in present and finished(r)),
                key=lambda item: (item[0], item[1]))
            removed = []
            for _, offer_id, record in candidates[:excess]:
                if remove_files is not None:
                    remove_files(record)
                self._remove(self._offers_fd, files.record_file_name(offer_id), "offer_discard")
                removed.append(offer_id)
            return removed

    # -- a Worker Session record left by an older version -----------------------------------

    def take_legacy_session_record(self) -> bytes | None:
        """Read and durably remove ``session.json`` from the root (versions before the
        runtime directory kept it here). Returns its bytes, or None when absent."""
        with self._owned():
            what = self._dirs.what(SESSION_NAME)
            data = files.read_record(self._dirs.root_fd, SESSION_NAME, what)
            if data is not None:
                self._remove(self._dirs.root_fd, SESSION_NAME, "session_clear")
            return data

    # -- primitives bound to this journal -----------------------------------------------------

    def _publish_first(self, dir_fd: int, name: str, data: bytes, op: str) -> None:
        try:
            files.publish_first(
                self._dirs.root_fd, dir_fd, name, data, op=op, what=self._what(dir_fd, name), guard=self._guard
            )
        except JournalError as exc:
            self._diagnose(exc)
            raise

    def _publish_replace(self, dir_fd: int, name: str, data: bytes, op: str) -> None:
        try:
            files.publish_replace(
                self._dirs.root_fd, dir_fd, name, data, op=op, what=self._what(dir_fd, name), guard=self._guard
            )
        except JournalError as exc:
            self._diagnose(exc)
            raise

    def _diagnose(self, exc: JournalError) -> None:
        """After a failed publication, probe the file system: when it lacks ``O_EXCL``
        or hard links (the journal was moved to FAT, say), raise that instead."""
        if exc.code in _NOT_STORAGE:
            return
        try:
            files.probe_file_system(self._dirs.root_fd, self._dirs.root)
        except JournalError as probe:
            if probe.code == "unsafe_storage":
                raise probe from None

    def _remove(self, dir_fd: int, name: str, op: str) -> bool:
        return files.remove_durably(dir_fd, name, op=op, what=self._what(dir_fd, name), guard=self._guard)

    def _what(self, dir_fd: int, name: str) -> str:
        if dir_fd == self._dirs.offers_fd:
            return self._dirs.what(OFFERS_DIR, name)
        if dir_fd == self._dirs.abandoned_fd:
            return self._dirs.what(ABANDONED_DIR, name)
        return self._dirs.what(name)

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Journal {self._dirs.root!r} {'closed' if self._closed else 'open'}>"
