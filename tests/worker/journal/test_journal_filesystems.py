"""The journal on real small/odd file systems: a full tmpfs (ENOSPC) and exFAT (no hard
links). Root only: skipped with the reason elsewhere."""

from __future__ import annotations

import errno
import os
import pathlib

import pytest

from qinglong_edge.contracts.journal_records import PendingClaim
from qinglong_edge.errors import JournalError, exit_status_for
from qinglong_edge.worker.journal.files import TEMP_NAME
from qinglong_edge.worker.journal.store import Journal
from tests.support.mounts import exfat, tmpfs
from tests.worker import offer_vectors as vectors

pytestmark = pytest.mark.root


def _fill(path: pathlib.Path) -> None:
    """Write until the file system is full."""
    with open(path, "wb", buffering=0) as handle:
        chunk = b"\0" * 4096
        while True:
            try:
                handle.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break


def test_enospc_keeps_the_claim_and_the_same_offer_publishes_once_after_space_is_freed(tmp_path: pathlib.Path) -> None:
    with tmpfs(tmp_path / "mnt", "64k") as mnt:
        root = mnt / "worker"
        with Journal.open(str(root)) as journal:
            claim = journal.create_claim(PendingClaim.create(vectors.authority(), 1000))
            claim = journal.replace_claim(claim.replace(revision=1, attempt_count=1, last_attempt_at_ms=1000), 0)
            claim_bytes = (root / "pending-claim.json").read_bytes()
            filler = mnt / "filler"
            _fill(filler)

            with pytest.raises(JournalError) as info:
                journal.accept_offer(vectors.offer(), 1001)
            assert info.value.code == "storage_unavailable"
            assert exit_status_for(info.value) == 74
            assert (root / "pending-claim.json").read_bytes() == claim_bytes  # the claim is intact
            assert os.listdir(root / "offers") == []
            assert not [n for n in os.listdir(root) if TEMP_NAME.fullmatch(n)]  # no torn temp left

            os.unlink(filler)
            assert journal.accept_offer(vectors.offer(), 1001)[0] == "accepted"
            assert journal.accept_offer(vectors.offer(), 1002)[0] == "replayed"
            journal.clear_claim(claim.offer_id, claim.revision)
        assert os.listdir(root / "offers") == ["offer-1.json"]
        assert (root / "offers" / "offer-1.json").read_bytes() == vectors.OFFER_RECORD_T1001


def test_enospc_on_a_claim_revision_keeps_the_old_revision(tmp_path: pathlib.Path) -> None:
    with tmpfs(tmp_path / "mnt", "64k") as mnt:
        root = mnt / "worker"
        with Journal.open(str(root)) as journal:
            claim = journal.create_claim(PendingClaim.create(vectors.authority(), 1000))
            _fill(mnt / "filler")
            with pytest.raises(JournalError) as info:
                journal.replace_claim(claim.replace(revision=1, attempt_count=1, last_attempt_at_ms=1000), 0)
            assert info.value.code == "storage_unavailable"
            assert (root / "pending-claim.json").read_bytes() == vectors.CLAIM_T1000
            assert journal.read_claim() == claim


def test_file_system_without_hard_links_is_refused_at_open(tmp_path: pathlib.Path) -> None:
    with exfat(tmp_path / "mnt", tmp_path / "exfat.img") as mnt:
        with pytest.raises(JournalError) as info:
            Journal.open(str(mnt / "worker"))
        assert info.value.code == "unsafe_storage"
        assert "hard links" in info.value.message
        # The probe cleaned up after itself; only the never-unlinked lock file remains.
        assert os.listdir(mnt / "worker") == [".owner.lock"]
