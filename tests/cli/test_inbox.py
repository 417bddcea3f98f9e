"""``qinglong-edge inbox list|show|discard`` through the real CLI in a child process."""

from __future__ import annotations

import json
import pathlib

import pytest

from qinglong_edge.worker.journal.store import Journal
from tests.support.cli import run_cli
from tests.worker import offer_vectors as vectors


@pytest.fixture
def config(worker_config: pathlib.Path) -> pathlib.Path:
    return worker_config


@pytest.fixture
def journal_root(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "state" / "worker"


def _accept(root: pathlib.Path, *offer_ids: str) -> None:
    with Journal.open(str(root)) as journal:
        for offer_id in offer_ids:
            journal.accept_offer({**vectors.offer(), "offerId": offer_id}, 1001)


def test_list_of_a_missing_journal_is_empty(config: pathlib.Path, journal_root: pathlib.Path) -> None:
    result = run_cli("--config", str(config), "inbox", "list", "--json")
    assert result.status == 0, result.stderr
    assert result.json() == {"ok": True, "offers": [],
                             "capacity": {"maximumEntries": 64, "inFlight": 0, "finished": 0}}
    assert not journal_root.exists()  # reading creates nothing


def test_list_shows_id_state_run_and_acceptance(config: pathlib.Path, journal_root: pathlib.Path) -> None:
    _accept(journal_root, "offer-b", "offer-a")
    result = run_cli("--config", str(config), "inbox", "list", "--json")
    assert result.status == 0, result.stderr
    # not run yet: no exit code, no log; in flight (its lease is live), so it holds an entry
    none = {"exitCode": None, "logPath": None, "logBytes": None, "inFlight": True}
    assert result.json()["offers"] == [
        {"offerId": "offer-a", "state": "accepted", "runId": "run-1", "attemptId": "attempt-1", "acceptedAtMs": 1001,
         **none},
        {"offerId": "offer-b", "state": "accepted", "runId": "run-1", "attemptId": "attempt-1", "acceptedAtMs": 1001,
         **none},
    ]
    human = run_cli("--config", str(config), "inbox", "list")
    assert human.status == 0
    lines = human.stdout.splitlines()
    assert lines[0].split() == ["OFFER_ID", "STATE", "RUN_ID", "ATTEMPT_ID", "EXIT", "LOG_BYTES", "LOG"]
    assert lines[1].split() == ["offer-a", "accepted", "run-1", "attempt-1", "-", "-", "-"]
    assert lines[-1] == "inbox: 2 records of 64: 2 need this device, 0 finished"


def test_list_works_while_a_pull_owns_the_journal(config: pathlib.Path, journal_root: pathlib.Path) -> None:
    _accept(journal_root, "offer-1")
    with Journal.open(str(journal_root)):
        result = run_cli("--config", str(config), "inbox", "list", "--json")
    assert result.status == 0, result.stderr
    assert [row["offerId"] for row in result.json()["offers"]] == ["offer-1"]


@pytest.mark.parametrize("json_mode", [True, False], ids=["json", "human"])
def test_show_redacts_the_lease_token(config: pathlib.Path, journal_root: pathlib.Path, json_mode: bool) -> None:
    _accept(journal_root, "offer-1")
    result = run_cli("--config", str(config), "inbox", "show", "offer-1", *(["--json"] if json_mode else []))
    assert result.status == 0, result.stderr
    assert vectors.LEASE_TOKEN not in result.stdout + result.stderr
    if json_mode:
        record = result.json()["record"]
        local = result.json()["local"]
        assert local["logPath"].endswith("/68/wlog-68cd94391d043410683fabcde45b2a.log")  # where it goes (4.3)
        assert {k: v for k, v in local.items() if k != "logPath"} == {
            "exitCode": None, "outcomeSource": None, "logBytes": None, "inFlight": True}
    else:
        document, _, local = result.stdout.rpartition("\n# ")
        record = json.loads(document)
        assert local.startswith("exit code: none yet; log: none; in flight: yes")
    assert record["offer"]["leaseToken"] == "[redacted]"
    expected = json.loads(vectors.OFFER_RECORD_T1001)
    expected["offer"]["leaseToken"] = "[redacted]"
    assert record == expected


def test_show_of_an_unknown_offer_is_not_found(config: pathlib.Path, journal_root: pathlib.Path) -> None:
    _accept(journal_root, "offer-1")
    result = run_cli("--config", str(config), "inbox", "show", "offer-2", "--json")
    assert result.status == 65
    assert result.json()["code"] == "not_found"


def test_rejects_discard_without_yes(config: pathlib.Path, journal_root: pathlib.Path) -> None:
    _accept(journal_root, "offer-1")
    result = run_cli("--config", str(config), "inbox", "discard", "offer-1")
    assert result.status == 64
    assert "--yes" in result.stderr
    assert (journal_root / "offers" / "offer-1.json").exists()


def test_discard_with_yes_removes_the_record(config: pathlib.Path, journal_root: pathlib.Path) -> None:
    _accept(journal_root, "offer-1", "offer-2")
    result = run_cli("--config", str(config), "inbox", "discard", "offer-1", "--yes", "--json")
    assert result.status == 0, result.stderr
    assert result.json() == {"ok": True, "discarded": "offer-1"}
    assert sorted(p.name for p in (journal_root / "offers").iterdir()) == ["offer-2.json"]
    again = run_cli("--config", str(config), "inbox", "discard", "offer-1", "--yes", "--json")
    assert again.status == 65 and again.json()["code"] == "not_found"


def test_rejects_discard_while_a_pull_owns_the_journal(config: pathlib.Path, journal_root: pathlib.Path) -> None:
    _accept(journal_root, "offer-1")
    with Journal.open(str(journal_root)):
        result = run_cli("--config", str(config), "inbox", "discard", "offer-1", "--yes", "--json")
    assert result.status == 75
    assert result.json()["code"] == "already_owned"
    assert (journal_root / "offers" / "offer-1.json").exists()


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_a_damaged_record_names_its_remedy_and_a_forced_discard_removes_it(
        config: pathlib.Path, journal_root: pathlib.Path, damage: str) -> None:
    """Regression (issue 27, a device nobody watches): one damaged inbox record (a flash
    file system that lost its tail, a stray edit) made every ``pull``, ``admin prune``,
    ``inbox list`` and even ``inbox discard`` exit 73 ``invalid_json at $`` with no way out
    but deleting journal files by hand. The message now names the remedy, and a forced
    discard removes the record it cannot read (the others stay)."""
    _accept(journal_root, "offer-1", "offer-2")
    path = journal_root / "offers" / "offer-1.json"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"")
    listing = run_cli("--config", str(config), "inbox", "list")
    assert listing.status == 73
    assert "inbox discard offer-1 --yes --force" in listing.stderr, listing.stderr
    plain = run_cli("--config", str(config), "inbox", "discard", "offer-1", "--yes", "--json")
    assert plain.status == 73 and plain.json()["code"] == "unsafe_storage"
    assert path.exists()
    forced = run_cli("--config", str(config), "inbox", "discard", "offer-1", "--yes", "--force", "--json")
    assert forced.status == 0, forced.stderr
    assert forced.json() == {"ok": True, "discarded": "offer-1", "damaged": True}
    assert sorted(p.name for p in (journal_root / "offers").iterdir()) == ["offer-2.json"]
    after = run_cli("--config", str(config), "inbox", "list", "--json")
    assert after.status == 0, after.stderr
    assert [row["offerId"] for row in after.json()["offers"]] == ["offer-2"]


def test_a_forced_discard_of_a_damaged_record_waits_for_a_pull_that_owns_the_journal(
        config: pathlib.Path, journal_root: pathlib.Path) -> None:
    _accept(journal_root, "offer-1")
    (journal_root / "offers" / "offer-1.json").write_bytes(b"{}")
    with Journal.open(str(journal_root)):
        result = run_cli("--config", str(config), "inbox", "discard", "offer-1", "--yes", "--force", "--json")
    assert result.status == 75 and result.json()["code"] == "already_owned", result.stdout
    assert (journal_root / "offers" / "offer-1.json").exists()


@pytest.mark.parametrize("offer_id", ["a/b", "x" * 129, "a b"], ids=["slash", "too_long", "space"])
def test_rejects_malformed_offer_id(config: pathlib.Path, offer_id: str) -> None:
    for action in (["show", offer_id], ["discard", offer_id, "--yes"]):
        result = run_cli("--config", str(config), "inbox", *action)
        assert result.status == 64, result.stderr


def test_rejects_unsafe_journal_as_storage_error(config: pathlib.Path, journal_root: pathlib.Path) -> None:
    _accept(journal_root, "offer-1")
    journal_root.chmod(0o755)
    result = run_cli("--config", str(config), "inbox", "list", "--json")
    assert result.status == 73
    assert result.json()["code"] == "unsafe_storage"
    assert "Traceback" not in result.stderr


def test_rejects_a_configuration_without_worker(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"schema": "qinglong/edge-agent@v1", "stateDirectory": str(tmp_path)}))
    result = run_cli("--config", str(path), "inbox", "list", "--json")
    assert result.status == 78
    assert result.json()["code"] == "invalid_configuration"


def test_inbox_without_action_is_usage(config: pathlib.Path) -> None:
    assert run_cli("--config", str(config), "inbox").status == 64


def test_inbox_help_imports_no_heavy_module() -> None:
    import subprocess
    import sys

    from tests.support.cli import REPO

    probe = (
        "import sys\nfrom qinglong_edge.cli import main\n"
        "try:\n    main(['inbox', '--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'ssl', 'sqlite3', 'http', 'socket', 'subprocess', '_ssl', '_sqlite3'})\n"
        "sys.stderr.write('HEAVY=' + repr(heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, cwd=REPO, text=True, check=False)
    assert "HEAVY=[]" in proc.stderr, proc.stderr
