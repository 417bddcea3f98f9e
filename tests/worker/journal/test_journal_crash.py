"""Crash matrix: SIGKILL a real child at every step boundary of the journal writes a
pull makes -- claim create / accept / clear when it is offered work, the claim rewrite
that counts an attempt of unknown outcome, the abandonment -- a fresh process must find
the old or the new complete state, and finishing the cycle must yield exactly one inbox
file (offer-delivery.md 3.5, field lessons 8). (An idle pull writes nothing here: the
claim is kept and its attempt marker is in the runtime directory, RAM.)

The child stops itself at the named point (``QINGLONG_EDGE_CRASHPOINT=<point>:pause``),
the test sees it stopped and sends a real ``SIGKILL``. A killed process keeps the page
cache, so this proves atomicity and the order of directory operations; the fsync
order that protects against power loss is checked under strace in
test_journal_syscalls.py.
"""

from __future__ import annotations

import os
import pathlib
import signal
from dataclasses import dataclass

import pytest

from qinglong_edge import crashpoints
from qinglong_edge.contracts.journal_records import PendingClaim
from qinglong_edge.worker.journal.files import TEMP_NAME
from tests.support.journal_proc import Child, last_event, run_child, wait_stopped
from tests.worker import offer_vectors as vectors

CLAIM_REV0 = vectors.CLAIM_T1000
CLAIM_REV1 = PendingClaim.create(vectors.authority(), 1000).replace(
    revision=1, attempt_count=1, last_attempt_at_ms=1000
).to_bytes()


@dataclass(frozen=True)
class Expect:
    claim: bytes | None
    offer: bool


def _expectations() -> dict[str, Expect]:
    """What a fresh process must find after a kill at each point (old or new, never torn)."""
    table: dict[str, Expect] = {}
    phases = [
        ("claim_create", Expect(None, False), Expect(CLAIM_REV0, False), "linked"),
        ("offer_accept", Expect(CLAIM_REV0, False), Expect(CLAIM_REV0, True), "linked"),
        ("claim_clear", Expect(CLAIM_REV0, True), Expect(None, True), "unlinked"),
    ]
    for op, old, new, commit in phases:
        steps = crashpoints.OPERATIONS[op]
        for step in steps:
            table[f"{op}.{step}"] = new if steps.index(step) >= steps.index(commit) else old
    return table


EXPECT = _expectations()


def _count_expectations() -> dict[str, bytes]:
    """Point -> the claim a fresh process must find after a kill while counting."""
    steps = crashpoints.OPERATIONS["claim_replace"]
    return {f"claim_replace.{step}": CLAIM_REV1 if steps.index(step) >= steps.index("renamed") else CLAIM_REV0
            for step in steps}


COUNT_EXPECT = _count_expectations()


def test_matrix_covers_more_than_twenty_points() -> None:
    assert len(EXPECT) + len(COUNT_EXPECT) >= 20
    assert set(EXPECT) | set(COUNT_EXPECT) <= set(crashpoints.POINTS)


def _snapshot(root: pathlib.Path) -> tuple[bytes | None, dict[str, bytes], list[str]]:
    claim_path = root / "pending-claim.json"
    claim = claim_path.read_bytes() if claim_path.exists() else None
    offers_dir = root / "offers"
    offers = {name: (offers_dir / name).read_bytes() for name in os.listdir(offers_dir)} if offers_dir.exists() else {}
    temps = sorted(name for name in os.listdir(root) if TEMP_NAME.fullmatch(name))
    return claim, offers, temps


def _killed_at(operation: str, root: pathlib.Path, point: str) -> int:
    """Run the journal ``operation`` in a child that pauses at crash point ``point``, SIGKILL
    it there; its wait status."""
    child = Child(operation, str(root), env={crashpoints.ENV: f"{point}:pause"})
    try:
        assert wait_stopped(child.pid), f"{operation} never reached {point}: {child.stderr_text()}"
        child.signal(signal.SIGKILL)
        return child.wait()
    finally:
        child.close()


@pytest.mark.slow
@pytest.mark.parametrize("point", list(EXPECT))
def test_sigkill_at_every_step_leaves_old_or_new_state(tmp_path: pathlib.Path, point: str) -> None:
    root = tmp_path / "journal"
    assert _killed_at("cycle", root, point) == -signal.SIGKILL

    claim, offers, temps = _snapshot(root)
    expect = EXPECT[point]
    assert claim == expect.claim  # complete old or new bytes, never partial or empty
    assert offers == ({"offer-1.json": vectors.OFFER_RECORD_T1001} if expect.offer else {})
    for name in temps:  # leftovers only in the root, named as temp files
        assert name.startswith((".pending-claim.json.", ".offer-1.json."))

    finished = run_child("resume", str(root))
    assert finished.returncode == 0, finished.stderr.decode()
    event = last_event(finished.stdout)
    assert event["result"] == ("already" if expect.claim is None and expect.offer else
                               "replayed" if expect.offer else "accepted")
    claim, offers, temps = _snapshot(root)
    assert claim is None
    assert offers == {"offer-1.json": vectors.OFFER_RECORD_T1001}  # exactly one inbox file
    assert temps == []  # the fresh owner removed stray temp files


def test_uninterrupted_cycle_leaves_exactly_the_golden_inbox_file(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "journal"
    result = run_child("cycle", str(root))
    assert result.returncode == 0, result.stderr.decode()
    assert last_event(result.stdout) == {"event": "done", "result": "accepted"}
    assert _snapshot(root) == (None, {"offer-1.json": vectors.OFFER_RECORD_T1001}, [])
    assert sorted(os.listdir(root)) == [".owner.lock", "abandoned", "offers"]


@pytest.mark.slow
@pytest.mark.parametrize("point", list(COUNT_EXPECT))
def test_sigkill_while_counting_an_attempt_leaves_the_old_or_new_claim(tmp_path: pathlib.Path, point: str) -> None:
    root = tmp_path / "journal"
    created = run_child("count", str(root))
    assert created.returncode == 0 and last_event(created.stdout)["event"] == "created"
    _killed_at("count", root, point)
    claim, _offers, temps = _snapshot(root)
    assert claim == COUNT_EXPECT[point]
    assert all(name.startswith(".pending-claim.json.") for name in temps)
    finished = run_child("count", str(root))
    assert finished.returncode == 0, finished.stderr.decode()
    assert _snapshot(root) == (CLAIM_REV1, {}, [])  # counted exactly once


def test_crash_with_exit_mode_kills_without_cleanup(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "journal"
    result = run_child("cycle", str(root), env={crashpoints.ENV: "offer_accept.tmp_partial"})
    assert result.returncode == 137
    claim, offers, temps = _snapshot(root)
    assert claim == CLAIM_REV0 and offers == {} and len(temps) == 1
    # The torn temp file holds half the record: it is never what a reader sees.
    assert 0 < len((root / temps[0]).read_bytes()) < len(vectors.OFFER_RECORD_T1001)


def _abandon_expectations() -> dict[str, tuple[bool, bool]]:
    """Point -> (claim present, abandoned record present) after a kill there."""
    table = {}
    steps = crashpoints.OPERATIONS["claim_abandon"]
    for step in steps:
        table[f"claim_abandon.{step}"] = (True, steps.index(step) >= steps.index("linked"))
    for step in crashpoints.OPERATIONS["claim_clear"]:
        table[f"claim_clear.{step}"] = (step == "begin", True)
    return table


ABANDON_EXPECT = _abandon_expectations()


@pytest.mark.slow
@pytest.mark.parametrize("point", list(ABANDON_EXPECT))
def test_sigkill_while_abandoning_leaves_the_claim_or_its_record(tmp_path: pathlib.Path, point: str) -> None:
    root = tmp_path / "journal"
    _killed_at("abandon", root, point)
    claim_present, record_present = ABANDON_EXPECT[point]
    assert ((root / "pending-claim.json").read_bytes() == CLAIM_REV0) if claim_present else \
        not (root / "pending-claim.json").exists()
    abandoned = sorted(os.listdir(root / "abandoned"))
    assert abandoned == (["offer-1.json"] if record_present else [])

    finished = run_child("abandon", str(root))
    assert finished.returncode == 0, finished.stderr.decode()
    assert not (root / "pending-claim.json").exists()
    assert sorted(os.listdir(root / "abandoned")) == ["offer-1.json"]
    data = (root / "abandoned" / "offer-1.json").read_bytes()
    assert b'"reason":"offer_fenced"' in data and b'"abandonedAtMs":5000' in data
    assert vectors.LEASE_TOKEN.encode() not in data
