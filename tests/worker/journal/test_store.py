"""Journal operations: record bytes, revision/replay/conflict rules, capacity, abandonment,
retention, ownership (offer-delivery.md 3.1-3.6, spec README decisions). Real files."""

from __future__ import annotations

import json
import os
import pathlib
import stat
from collections.abc import Iterator
from typing import Any

import pytest

from qinglong_edge.contracts.journal_records import PendingClaim, parse_abandoned_record
from qinglong_edge.errors import JournalError
from qinglong_edge.worker.journal.ownerlock import LOCK_NAME
from qinglong_edge.worker.journal.store import Journal, JournalOptions, JournalReader
from tests.worker import offer_vectors as vectors

ATTEMPT = {"revision": 1, "attempt_count": 1, "last_attempt_at_ms": 1000}


@pytest.fixture
def root(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "state" / "worker"


@pytest.fixture
def journal(root: pathlib.Path) -> Iterator[Journal]:
    with Journal.open(str(root)) as opened:
        yield opened


def _claim(offer_id: str = vectors.OFFER_ID, token: str = vectors.LEASE_TOKEN, now_ms: int = 1000) -> PendingClaim:
    return PendingClaim.create(vectors.authority(offer_id, token), now_ms)


def _offer(offer_id: str = vectors.OFFER_ID, **lease: Any) -> dict[str, Any]:
    return {**vectors.offer(**lease), "offerId": offer_id}


def _code(info: pytest.ExceptionInfo[JournalError]) -> str:
    return info.value.code


# -- layout and golden bytes ------------------------------------------------------------------

def test_open_creates_the_layout_0700(journal: Journal, root: pathlib.Path) -> None:
    assert sorted(os.listdir(root)) == [LOCK_NAME, "abandoned", "offers"]
    for path in (root, root / "offers", root / "abandoned"):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(root / LOCK_NAME).st_mode) == 0o600


def test_claim_and_inbox_bytes_equal_the_section_4_2_vectors(journal: Journal, root: pathlib.Path) -> None:
    claim = journal.create_claim(_claim())
    assert (root / "pending-claim.json").read_bytes() == vectors.CLAIM_T1000
    journal.replace_claim(claim.replace(**ATTEMPT), 0)
    result, record = journal.accept_offer(vectors.offer(), 1001)
    assert result == "accepted" and record["state"] == "accepted"
    data = (root / "offers" / "offer-1.json").read_bytes()
    assert data == vectors.OFFER_RECORD_T1001 and len(data) == 1584
    assert stat.S_IMODE(os.lstat(root / "offers" / "offer-1.json").st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(root / "pending-claim.json").st_mode) == 0o600
    journal.clear_claim(vectors.OFFER_ID, 1)
    assert journal.read_claim() is None
    assert journal.list_offers() == ["offer-1"]


# -- pending claim (3.3) ------------------------------------------------------------------------

def test_create_claim_with_the_same_authority_returns_the_existing(journal: Journal) -> None:
    first = journal.create_claim(_claim())
    again = journal.create_claim(_claim(now_ms=5000))  # same 5-tuple, other times
    assert again == first and again.created_at_ms == 1000


def test_rejects_create_claim_over_a_different_claim(journal: Journal, root: pathlib.Path) -> None:
    journal.create_claim(_claim())
    with pytest.raises(JournalError) as info:
        journal.create_claim(_claim(offer_id="offer-2"))
    assert _code(info) == "offer_conflict"
    assert (root / "pending-claim.json").read_bytes() == vectors.CLAIM_T1000


@pytest.mark.parametrize(
    ("expected", "changes"),
    [
        (1, ATTEMPT),  # stored revision is 0
        (0, {**ATTEMPT, "revision": 2}),  # must be expected + 1
        (0, {**ATTEMPT, "revision": 0}),
    ],
    ids=["wrong_expected", "skips_a_revision", "same_revision"],
)
def test_rejects_replace_claim_at_the_wrong_revision(journal: Journal, root: pathlib.Path, expected: int,
                                                     changes: dict[str, Any]) -> None:
    claim = journal.create_claim(_claim())
    with pytest.raises(JournalError) as info:
        journal.replace_claim(claim.replace(**changes), expected)
    assert _code(info) == "claim_revision_conflict"
    assert (root / "pending-claim.json").read_bytes() == vectors.CLAIM_T1000


def test_rejects_replace_claim_that_changes_the_authority(journal: Journal) -> None:
    journal.create_claim(_claim())
    other = _claim(token="A" * 43).replace(**ATTEMPT)
    with pytest.raises(JournalError) as info:
        journal.replace_claim(other, 0)
    assert _code(info) == "claim_revision_conflict"


def test_rejects_replace_or_clear_without_a_claim(journal: Journal) -> None:
    with pytest.raises(JournalError) as info:
        journal.replace_claim(_claim().replace(**ATTEMPT), 0)
    assert _code(info) == "claim_revision_conflict"
    with pytest.raises(JournalError) as info:
        journal.clear_claim(vectors.OFFER_ID, 0)
    assert _code(info) == "claim_revision_conflict"


@pytest.mark.parametrize(("offer_id", "revision"), [("offer-2", 0), (vectors.OFFER_ID, 1)], ids=["other_offer", "other_revision"])
def test_rejects_clear_claim_of_another_offer_or_revision(journal: Journal, offer_id: str, revision: int) -> None:
    journal.create_claim(_claim())
    with pytest.raises(JournalError) as info:
        journal.clear_claim(offer_id, revision)
    assert _code(info) == "claim_revision_conflict"
    assert journal.read_claim() is not None


def test_rejects_corrupt_claim_as_unsafe_storage(journal: Journal, root: pathlib.Path) -> None:
    path = root / "pending-claim.json"
    path.write_bytes(b'{"schemaVersion":1,')
    path.chmod(0o600)
    with pytest.raises(JournalError) as info:
        journal.read_claim()
    assert _code(info) == "unsafe_storage"


@pytest.mark.parametrize("data", [b'{"schemaVersion":1,', b"", b'{"schemaVersion":1,"extra":1}\n'],
                         ids=["truncated", "empty", "wrong_keys"])
def test_a_damaged_claim_names_the_way_out(journal: Journal, root: pathlib.Path, data: bytes) -> None:
    """Regression (issue 27): a damaged ``pending-claim.json`` made every pull exit 73 (or 65)
    with ``invalid_json at $`` and nothing else, doctor said all was well: the message now
    says what removing it costs, so a device nobody watches can be brought back."""
    path = root / "pending-claim.json"
    path.write_bytes(data)
    path.chmod(0o600)
    with pytest.raises(JournalError) as info:
        journal.read_claim()
    message = str(info.value)
    assert str(path) in message and "remove it with no pull running" in message, message
    assert "the cluster retries" in message


def test_claim_with_a_wrong_key_set_keeps_the_contract_code(journal: Journal, root: pathlib.Path) -> None:
    document = json.loads(vectors.CLAIM_T1000)
    document["extra"] = 1
    path = root / "pending-claim.json"
    path.write_bytes(json.dumps(document).encode() + b"\n")
    path.chmod(0o600)
    with pytest.raises(JournalError) as info:
        journal.read_claim()
    assert _code(info) == "claim_conflict"


# -- accept and replay (3.6) --------------------------------------------------------------------

def test_replay_at_the_same_lease_version_changes_nothing(journal: Journal, root: pathlib.Path) -> None:
    journal.accept_offer(vectors.offer(), 1001)
    result, record = journal.accept_offer(vectors.offer(), 2000)
    assert result == "replayed" and record["revision"] == 0 and record["updatedAtMs"] == 1001
    assert (root / "offers" / "offer-1.json").read_bytes() == vectors.OFFER_RECORD_T1001


def test_replay_with_a_lower_lease_version_changes_nothing(journal: Journal, root: pathlib.Path) -> None:
    journal.accept_offer(vectors.offer(), 1001)
    result, record = journal.accept_offer(vectors.offer(version=2), 2000)
    assert result == "replayed" and record["offer"]["lease"]["version"] == 3
    assert (root / "offers" / "offer-1.json").read_bytes() == vectors.OFFER_RECORD_T1001


def test_replay_with_a_higher_lease_version_updates_the_lease(journal: Journal) -> None:
    journal.accept_offer(vectors.offer(), 1001)
    result, record = journal.accept_offer(vectors.offer(version=4, renewedAtMs=40, expiresAtMs=30040, updatedAtMs=40), 2000)
    assert result == "replayed"
    assert record["revision"] == 1 and record["updatedAtMs"] == 2000 and record["acceptedAtMs"] == 1001
    assert record["offer"]["lease"]["version"] == 4 and record["offer"]["lease"]["expiresAtMs"] == 30040
    assert journal.read_offer(vectors.OFFER_ID) == record


def test_lease_recovery_with_a_higher_version_over_new_claim_updates_the_lease(journal: Journal) -> None:
    # Spec README decision (the reference answers offer_conflict here, section 3.9 item 4).
    journal.accept_offer(vectors.offer(), 1001)
    recovery = {**vectors.offer(version=5, renewedAtMs=50, expiresAtMs=30050, updatedAtMs=50),
                "deliveryKind": "lease_recovery", "placementScore": 0}
    result, record = journal.accept_offer(recovery, 3000)
    assert result == "replayed" and record["revision"] == 1
    assert record["offer"]["lease"]["version"] == 5
    assert record["offer"]["deliveryKind"] == "new_claim"  # how it first arrived
    assert journal.read_offer(vectors.OFFER_ID) == record


def test_lease_recovery_at_the_same_version_is_a_plain_replay(journal: Journal, root: pathlib.Path) -> None:
    journal.accept_offer(vectors.offer(), 1001)
    result, _ = journal.accept_offer({**vectors.offer(), "deliveryKind": "lease_recovery"}, 3000)
    assert result == "replayed"
    assert (root / "offers" / "offer-1.json").read_bytes() == vectors.OFFER_RECORD_T1001


def test_update_never_moves_updated_at_backwards_when_the_wall_clock_did(journal: Journal) -> None:
    journal.accept_offer(vectors.offer(), 1001)
    _, record = journal.accept_offer(vectors.offer(version=4), 5)  # clock stepped back to 1970
    assert record["updatedAtMs"] == 1001 and record["offer"]["lease"]["version"] == 4


def test_rejects_replay_with_another_authority(journal: Journal, root: pathlib.Path) -> None:
    journal.accept_offer(vectors.offer(), 1001)
    other = vectors.offer()
    other = {**other, "candidate": {**other["candidate"], "priority": 7}}
    with pytest.raises(JournalError) as info:
        journal.accept_offer(other, 2000)
    assert _code(info) == "offer_conflict"
    assert (root / "offers" / "offer-1.json").read_bytes() == vectors.OFFER_RECORD_T1001


def test_rejects_offer_that_does_not_normalize(journal: Journal) -> None:
    bad = {**vectors.offer(), "leaseToken": "B" * 43}  # digest no longer matches the lease
    with pytest.raises(ValueError):
        journal.accept_offer(bad, 1001)
    assert journal.list_offers() == []


# -- capacity (3.1) -------------------------------------------------------------------------------

def test_full_inbox_refuses_new_offers_but_replays_work(root: pathlib.Path) -> None:
    with Journal.open(str(root), JournalOptions(maximum_entries=2)) as journal:
        assert journal.has_capacity()
        journal.accept_offer(_offer("offer-a"), 1)
        journal.accept_offer(_offer("offer-b"), 2)
        assert not journal.has_capacity()
        with pytest.raises(JournalError) as info:
            journal.accept_offer(_offer("offer-c"), 3)
        assert _code(info) == "capacity_exhausted"
        assert journal.accept_offer(_offer("offer-a"), 4)[0] == "replayed"
        assert journal.accept_offer(_offer("offer-b", version=9), 5)[0] == "replayed"
        assert journal.list_offers() == ["offer-a", "offer-b"]
        assert journal.discard_offer("offer-a")
        assert journal.has_capacity()
        assert journal.accept_offer(_offer("offer-c"), 6)[0] == "accepted"


@pytest.mark.parametrize(
    "options",
    [
        JournalOptions(maximum_entries=0),
        JournalOptions(maximum_entries=1025),
        JournalOptions(abandoned_maximum_entries=0),
        JournalOptions(ownership_stale_ms=99),
        JournalOptions(retention_ms=-1),
    ],
    ids=["capacity_0", "capacity_over_hard_limit", "abandoned_0", "stale_too_small", "negative_retention"],
)
def test_rejects_options_out_of_range(root: pathlib.Path, options: JournalOptions) -> None:
    with pytest.raises(JournalError) as info:
        Journal.open(str(root), options)
    assert _code(info) == "invalid_configuration"
    assert not root.exists()


def test_offers_are_listed_in_js_default_order(journal: Journal) -> None:
    for offer_id in ("b", "B", "a", "_", "0", "a.b", "a-b"):
        journal.accept_offer(_offer(offer_id), 1)
    assert journal.list_offers() == sorted(["b", "B", "a", "_", "0", "a.b", "a-b"])


# -- abandoned claims (spec README) ----------------------------------------------------------------

def test_abandon_moves_the_claim_with_its_reason(journal: Journal, root: pathlib.Path) -> None:
    journal.create_claim(_claim())
    returned = journal.abandon_claim("offer_fenced", 7000)
    assert journal.read_claim() is None
    stored = (root / "abandoned" / "offer-1.json").read_bytes()
    assert vectors.LEASE_TOKEN.encode() not in stored  # the capability is not kept
    record = parse_abandoned_record(stored)
    assert record == returned
    assert record.reason == "offer_fenced" and record.abandoned_at_ms == 7000 and record.offer_id == "offer-1"
    assert journal.list_abandoned() == [record]
    assert stat.S_IMODE(os.lstat(root / "abandoned" / "offer-1.json").st_mode) == 0o600
    journal.create_claim(_claim(offer_id="offer-2"))  # the next cycle starts a new claim


def test_abandoned_records_are_bounded_oldest_pruned(root: pathlib.Path) -> None:
    with Journal.open(str(root), JournalOptions(abandoned_maximum_entries=2)) as journal:
        for i, at in enumerate((300, 100, 200)):
            journal.create_claim(_claim(offer_id=f"o{i}"))
            journal.abandon_claim("stale_session", at)
        assert sorted(os.listdir(root / "abandoned")) == ["o0.json", "o2.json"]  # o1 (t=100) pruned
        journal.create_claim(_claim(offer_id="o3"))
        journal.abandon_claim("attempt_budget_exhausted", 50)  # clock behind: still kept, being new
        assert sorted(os.listdir(root / "abandoned")) == ["o0.json", "o3.json"]
        assert [r.offer_id for r in journal.list_abandoned()] == ["o3", "o0"]


def test_a_lowered_abandoned_bound_holds_from_the_next_cycle(root: pathlib.Path) -> None:
    """Issue 16: a bound set lower than what is stored prunes down to it at the next
    cycle (prune_abandoned, called by every cycle), oldest first, not only at the next
    abandon; within the bound nothing is removed."""
    with Journal.open(str(root), JournalOptions(abandoned_maximum_entries=8)) as journal:
        for i, at in enumerate((500, 100, 400, 200, 300)):
            journal.create_claim(_claim(offer_id=f"o{i}"))
            journal.abandon_claim("stale_session", at)
        assert journal.prune_abandoned() == []
    with Journal.open(str(root), JournalOptions(abandoned_maximum_entries=2)) as journal:
        assert journal.prune_abandoned() == ["o1", "o3", "o4"]  # t=100, 200, 300
        assert sorted(os.listdir(root / "abandoned")) == ["o0.json", "o2.json"]
        assert journal.prune_abandoned() == []


def test_rejects_abandon_without_a_claim_or_with_an_unknown_reason(journal: Journal) -> None:
    with pytest.raises(JournalError) as info:
        journal.abandon_claim("offer_fenced", 1)
    assert _code(info) == "claim_revision_conflict"
    journal.create_claim(_claim())
    with pytest.raises(ValueError):
        journal.abandon_claim("bored", 1)
    assert journal.read_claim() is not None


def test_abandon_finishes_after_a_crash_between_publication_and_clear(journal: Journal, root: pathlib.Path) -> None:
    claim = journal.create_claim(_claim())
    from qinglong_edge.contracts.journal_records import abandoned_record_bytes

    path = root / "abandoned" / "offer-1.json"
    path.write_bytes(abandoned_record_bytes(claim, "offer_fenced", 10))
    path.chmod(0o600)
    assert journal.abandon_claim("offer_fenced", 20).abandoned_at_ms == 10  # the first record stays
    assert journal.read_claim() is None
    assert parse_abandoned_record(path.read_bytes()).abandoned_at_ms == 10


def test_rejects_abandon_over_a_foreign_abandoned_record(journal: Journal, root: pathlib.Path) -> None:
    from qinglong_edge.contracts.journal_records import abandoned_record_bytes

    path = root / "abandoned" / "offer-1.json"
    path.write_bytes(abandoned_record_bytes(_claim(token="Z" * 43), "offer_fenced", 10))
    path.chmod(0o600)
    journal.create_claim(_claim())
    with pytest.raises(JournalError) as info:
        journal.abandon_claim("offer_fenced", 20)
    assert _code(info) == "offer_conflict"
    assert journal.read_claim() is not None


# -- inbox updates, retention, discard -------------------------------------------------------------

def _advance(journal: Journal, offer_id: str, states: list[str], now_ms: int) -> dict[str, Any]:
    record = journal.read_offer(offer_id)
    assert record is not None
    for state in states:
        record = journal.replace_offer({**record, "state": state, "revision": record["revision"] + 1,
                                        "updatedAtMs": now_ms}, record["revision"])
    return record


def test_replace_offer_follows_the_transition_table(journal: Journal) -> None:
    journal.accept_offer(vectors.offer(), 1001)
    record = _advance(journal, "offer-1", ["starting_acknowledged", "start_failed"], 1100)
    assert record["revision"] == 2 and journal.read_offer("offer-1") == record
    with pytest.raises(JournalError) as info:
        journal.replace_offer({**record, "state": "accepted", "revision": 3}, 2)
    assert _code(info) == "invalid_transition"
    with pytest.raises(JournalError) as info:
        journal.replace_offer({**record, "state": "start_failure_acknowledged", "revision": 4}, 2)
    assert _code(info) == "offer_revision_conflict"


def test_retention_prunes_only_old_terminal_records(root: pathlib.Path) -> None:
    with Journal.open(str(root), JournalOptions(retention_ms=1000)) as journal:
        journal.accept_offer(_offer("done"), 10)
        _advance(journal, "done", ["starting_acknowledged", "start_failed", "start_failure_acknowledged"], 100)
        journal.accept_offer(_offer("open"), 10)  # not terminal: kept however old
        assert journal.prune_inbox(1100) == []  # exactly at the retention boundary
        assert journal.prune_inbox(5) == []  # wall clock behind (1970 boot)
        assert journal.prune_inbox(1101) == ["done"]
        assert journal.list_offers() == ["open"]


def test_retention_prunes_by_the_residency_rule_files_first(root: pathlib.Path) -> None:
    """Spec README "Terminal for residency and pruning": a recovery_required record is
    pruned once no local action remains; its files go before the record."""
    from qinglong_edge.contracts.inbox import to_recovery_required

    def recover(journal: Journal, offer_id: str, reason: str) -> None:
        record = _advance(journal, offer_id, ["starting_acknowledged"], 100)
        journal.replace_offer(to_recovery_required(record, 100, reason), record["revision"])

    with Journal.open(str(root), JournalOptions(retention_ms=1000)) as journal:
        for offer_id, reason in (("terminal", "control_plane_terminal"),
                                 ("unverified", "lease_lost_local_execution_unverified"),
                                 ("stopped", "lease_lost_local_execution_stopped")):
            journal.accept_offer(_offer(offer_id), 10)
            recover(journal, offer_id, reason)
        removed: list[str] = []
        gone: dict[str, bool] = {"unverified": False}

        def remove_files(record: dict[str, Any]) -> None:
            assert journal.read_offer(record["offer"]["offerId"]) is not None  # the record is still there
            removed.append(record["offer"]["offerId"])

        kept: list[dict[str, Any]] = []
        pruned = journal.prune_inbox(5000, process_gone=lambda r: gone[r["offer"]["offerId"]],
                                     remove_files=remove_files, kept=kept)
        assert sorted(pruned) == ["stopped", "terminal"] and sorted(removed) == ["stopped", "terminal"]
        assert [r["offer"]["offerId"] for r in kept] == ["unverified"]  # its process may still run
        assert journal.prune_inbox(5000) == []  # by default a stop is never taken as verified
        gone["unverified"] = True
        assert journal.prune_inbox(5000, process_gone=lambda r: gone[r["offer"]["offerId"]]) == ["unverified"]
        assert journal.list_offers() == []


def test_discard_offer_is_durable_and_idempotent(journal: Journal, root: pathlib.Path) -> None:
    journal.accept_offer(vectors.offer(), 1001)
    assert journal.discard_offer("offer-1") is True
    assert journal.discard_offer("offer-1") is False
    assert os.listdir(root / "offers") == []


@pytest.mark.parametrize("offer_id", ["", "a/b", "x" * 129, "a b", "a\nb"], ids=["empty", "slash", "too_long", "space", "newline"])
def test_rejects_offer_ids_that_cannot_be_file_names(journal: Journal, offer_id: str) -> None:
    with pytest.raises(JournalError) as info:
        journal.read_offer(offer_id)
    assert _code(info) == "offer_conflict"


def test_dot_dot_offer_id_is_a_plain_file_name(journal: Journal, root: pathlib.Path) -> None:
    journal.accept_offer(_offer(".."), 1)
    assert os.listdir(root / "offers") == ["...json"]
    assert journal.list_offers() == [".."]
    assert journal.read_offer("..") is not None


# -- ownership -----------------------------------------------------------------------------------

def test_second_open_is_already_owned(journal: Journal, root: pathlib.Path) -> None:
    with pytest.raises(JournalError) as info:
        Journal.open(str(root))
    assert _code(info) == "already_owned"
    journal.create_claim(_claim())  # the first owner is unaffected


def test_closed_journal_is_not_owned(root: pathlib.Path) -> None:
    journal = Journal.open(str(root))
    journal.close()
    journal.close()
    with pytest.raises(JournalError) as info:
        journal.create_claim(_claim())
    assert _code(info) == "not_owned"


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_compromised_lock_fails_closed_before_the_next_write(journal: Journal, root: pathlib.Path, how: str) -> None:
    journal.create_claim(_claim())
    journal.replace_claim(_claim().replace(**ATTEMPT), 0)
    lock = root / LOCK_NAME
    os.unlink(lock)
    if how == "replaced":
        lock.write_bytes(b"")
        lock.chmod(0o600)
    before = sorted(os.listdir(root))
    for call in (lambda: journal.accept_offer(vectors.offer(), 1001), lambda: journal.clear_claim("offer-1", 1),
                 journal.read_claim, journal.has_capacity):
        with pytest.raises(JournalError) as info:
            call()
        assert _code(info) == "ownership_compromised"
    assert sorted(os.listdir(root)) == before and os.listdir(root / "offers") == []


def test_reader_works_while_another_owns(journal: Journal, root: pathlib.Path) -> None:
    journal.create_claim(_claim())
    journal.accept_offer(vectors.offer(), 1001)
    with JournalReader.open(str(root)) as reader:
        assert reader.list_offers() == ["offer-1"]
        assert reader.read_offer("offer-1") == journal.read_offer("offer-1")
        assert reader.read_claim() == journal.read_claim()


def test_reader_of_a_root_without_offers_reads_empty(root: pathlib.Path) -> None:
    root.mkdir(parents=True, mode=0o700)  # a first open interrupted before offers/ existed
    with JournalReader.open(str(root)) as reader:
        assert reader.list_offers() == []
        assert reader.read_offer("offer-1") is None
        assert reader.read_claim() is None


# -- open-time checks (3.1) -------------------------------------------------------------------------

def test_open_removes_stray_temp_files_and_keeps_other_files(root: pathlib.Path) -> None:
    Journal.open(str(root)).close()
    stray = [root / ".pending-claim.json.0123456789abcdef0123456789abcdef.tmp",
             root / ".offer-1.json.fedcba9876543210fedcba9876543210.tmp"]
    for path in stray:
        path.write_bytes(b"{")
    (root / "notes.txt").write_bytes(b"operator's")
    with Journal.open(str(root)):
        assert sorted(os.listdir(root)) == [LOCK_NAME, "abandoned", "notes.txt", "offers"]


@pytest.mark.parametrize(
    "make",
    ["root_0755", "offers_0755", "abandoned_0750", "root_symlink", "offers_symlink", "offers_stray_temp",
     "offers_symlink_entry", "offers_subdirectory", "offers_wrong_suffix", "lock_symlink"],
)
def test_rejects_unsafe_layout_at_open(tmp_path: pathlib.Path, root: pathlib.Path, make: str) -> None:
    Journal.open(str(root)).close()
    offers = root / "offers"
    if make == "root_0755":
        root.chmod(0o755)
    elif make == "offers_0755":
        offers.chmod(0o755)
    elif make == "abandoned_0750":
        (root / "abandoned").chmod(0o750)
    elif make == "root_symlink":
        os.rename(root, tmp_path / "real")
        os.symlink(tmp_path / "real", root)
    elif make == "offers_symlink":
        os.rmdir(offers)
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        os.symlink(tmp_path / "elsewhere", offers)
    elif make == "offers_stray_temp":
        (offers / ".offer-1.json.0123456789abcdef0123456789abcdef.tmp").write_bytes(b"{}")
    elif make == "offers_symlink_entry":
        os.symlink("/etc/passwd", offers / "x.json")
    elif make == "offers_subdirectory":
        (offers / "x.json").mkdir()
    elif make == "offers_wrong_suffix":
        (offers / "x.txt").write_bytes(b"{}")
    elif make == "lock_symlink":
        os.unlink(root / LOCK_NAME)
        os.symlink(tmp_path / "lock-target", root / LOCK_NAME)
    with pytest.raises(JournalError) as info:
        Journal.open(str(root))
    assert _code(info) == "unsafe_storage"


@pytest.mark.parametrize("make", ["record_0644", "record_symlink", "claim_0644", "claim_symlink"])
def test_rejects_unsafe_records(tmp_path: pathlib.Path, journal: Journal, root: pathlib.Path, make: str) -> None:
    journal.create_claim(_claim())
    journal.accept_offer(vectors.offer(), 1001)
    target = root / ("offers/offer-1.json" if make.startswith("record") else "pending-claim.json")
    if make.endswith("0644"):
        target.chmod(0o644)
    else:
        copy = tmp_path / "copy.json"
        copy.write_bytes(target.read_bytes())
        copy.chmod(0o600)
        os.unlink(target)
        os.symlink(copy, target)
    read = (lambda: journal.read_offer("offer-1")) if make.startswith("record") else journal.read_claim
    with pytest.raises(JournalError) as info:
        read()
    assert _code(info) == "unsafe_storage"
    with pytest.raises(JournalError) as info:  # a replay must not paper over it either
        journal.accept_offer(vectors.offer(), 2000) if make.startswith("record") else journal.create_claim(_claim())
    assert _code(info) == "unsafe_storage"


@pytest.mark.root
@pytest.mark.parametrize("which", ["root", "offers", "abandoned", "record"])
def test_rejects_foreign_owned_storage(root: pathlib.Path, which: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    with Journal.open(str(root)) as journal:
        journal.accept_offer(vectors.offer(), 1001)
    path = {"root": root, "offers": root / "offers", "abandoned": root / "abandoned",
            "record": root / "offers" / "offer-1.json"}[which]
    os.chown(path, 65534, 65534)
    with pytest.raises(JournalError) as info:
        with Journal.open(str(root)) as journal:
            journal.read_offer("offer-1")
    assert _code(info) == "unsafe_storage"


@pytest.mark.parametrize("path", ["relative/dir", "/a\nb", "/" + "a" * 4096], ids=["relative", "newline", "too_long"])
def test_rejects_bad_root_paths(path: str) -> None:
    with pytest.raises(JournalError) as info:
        Journal.open(path)
    assert _code(info) == "invalid_configuration"


def test_make_room_removes_the_oldest_finished_records_files_first(root: pathlib.Path) -> None:
    """Issue 23: only records in flight count against the cap; when the files fill it, the
    oldest finished records go first (by updatedAtMs), never one in flight."""
    with Journal.open(str(root), JournalOptions(maximum_entries=3)) as journal:
        for offer_id, at in (("old", 300), ("older", 200), ("busy", 100)):
            journal.accept_offer(_offer(offer_id), 10)
            if offer_id != "busy":
                _advance(journal, offer_id, ["starting_acknowledged", "start_failed",
                                             "start_failure_acknowledged"], at)
        assert not journal.has_capacity()
        removed: list[str] = []

        def remove_files(record: dict[str, Any]) -> None:
            assert journal.read_offer(record["offer"]["offerId"]) is not None  # files before the record
            removed.append(record["offer"]["offerId"])

        def finished(record: dict[str, Any]) -> bool:
            return bool(record["state"] == "start_failure_acknowledged")

        assert journal.make_room(finished, remove_files=remove_files) == ["older"]
        assert removed == ["older"] and journal.has_capacity()
        assert journal.make_room(finished) == []  # an entry is free: nothing read or removed
        journal.accept_offer(_offer("new"), 20)
        assert journal.make_room(finished) == ["old"]
        journal.accept_offer(_offer("newer"), 30)
        assert journal.make_room(finished) == []  # only records in flight left: the inbox stays full
        assert sorted(journal.list_offers()) == ["busy", "new", "newer"] and not journal.has_capacity()
