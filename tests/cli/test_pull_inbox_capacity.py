"""Issue 23 item 1, "Finished records never block work": the real CLI against the TLS
cluster double, real job wrappers, the real journal and job files.

The wedge this replaces: finished records (``completion_acknowledged``,
``start_failure_acknowledged``) stayed for ``inboxRetentionMs`` (7 days) and counted against
``inboxMaximumEntries``, so a device taking a job every 5 minutes stopped claiming after 64
jobs (5 hours): every pull exited 75 ``inbox_full``, ``admin prune`` removed nothing, and
with a pending claim the pull line said ``idle (worker_unavailable)`` instead. The same
wedge is shown here with a cap of 3 (and once with the edge default of 64, built from
finished records written by the journal's own state steps).
"""

from __future__ import annotations

import pathlib
import time
from typing import Any

import pytest

from tests.support.cluster_double import ClusterDouble
from tests.support.remote_env import RemoteEnv, dump
from tests.support.wait import wait_until


@pytest.fixture
def env(tmp_path: pathlib.Path, cluster: ClusterDouble) -> RemoteEnv:
    return RemoteEnv(tmp_path, cluster, inboxMaximumEntries=3)


def _job(env: RemoteEnv, name: str) -> dict[str, Any]:
    """Queue one quick job, run ``pull`` to its end; returns the accepted cycle's line."""
    task = env.quick_job(name)
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    first = outcome.cycles()[0]
    assert first["status"] == "accepted", dump(outcome)
    assert first["runId"] == task.candidate["runId"]
    assert env.cluster.completion(task.candidate["runId"]) is not None
    return first


def test_finished_records_never_stop_new_claims(env: RemoteEnv) -> None:
    """Five jobs through an inbox of 3: each is claimed, run once and completed; the inbox
    never holds more than 3 records; the oldest finished ones went first, with their files."""
    offers = [_job(env, f"job{n}")["offerId"] for n in range(5)]
    inbox = env.inbox()
    assert len(inbox) == 3
    assert sorted(inbox) == sorted(offers[2:])  # the two oldest finished records went first
    assert all(record["state"] == "completion_acknowledged" for record in inbox.values())
    assert [env.starts(f"job{n}") for n in range(5)] == [1, 1, 1, 1, 1]
    assert env.remote_logs() == [] and env.receipts() == []
    # The exit-code notes of the evicted records went with them (runtime directory).
    notes = sorted(p.name for p in env.runtime.iterdir() if p.name.startswith("outcome."))
    assert len(notes) == 3


def test_the_inbox_full_of_finished_records_pulls_and_says_what_fills_it(env: RemoteEnv) -> None:
    for n in range(3):
        _job(env, f"job{n}")
    listing = env.cli("inbox", "list")
    assert listing.status == 0, listing.stderr
    assert "3 records of 3: 0 need this device, 3 finished" in listing.stdout
    assert "the oldest finished record goes when room is needed" in listing.stdout
    data = env.cli("inbox", "list", "--json").lines()[0]
    assert data["capacity"] == {"maximumEntries": 3, "inFlight": 0, "finished": 3}
    assert [row["inFlight"] for row in data["offers"]] == [False, False, False]
    doctor = env.cli("doctor", "--json").lines()[0]
    (check,) = [c for c in doctor["checks"] if c["name"] == "store_inbox"]
    assert check["ok"] is True, check
    assert check["detail"].startswith("0 of 3 entries held by records that need this device; 3 finished"), check
    # An idle cycle on the full inbox asks for work (1 slot): it does not wedge.
    idle = env.pull("--json")
    assert idle.status == 0, dump(idle)
    assert idle.last()["status"] == "idle" and idle.last()["reason"] != "worker_unavailable", dump(idle)
    announced = [e.json() for e in env.cluster.exchanges if e.op in ("register", "heartbeat")]
    assert announced[-1]["availableSlots"] == 1


def test_admin_prune_makes_room_in_an_inbox_full_of_finished_records(env: RemoteEnv) -> None:
    for n in range(3):
        _job(env, f"job{n}")
    pruned = env.cli("admin", "prune", "--json")
    assert pruned.status == 0, pruned.stderr
    journal = pruned.lines()[0]["journal"]
    assert len(journal["inboxRecords"]) == 1 and journal["inboxLeft"] == 2, journal
    assert len(env.inbox()) == 2
    text = env.cli("admin", "prune")
    assert "journal: 0 terminal inbox records removed" in text.stdout, text.stdout  # room is there already


def test_admin_prune_removes_the_outcome_notes_of_the_records_it_prunes(env: RemoteEnv) -> None:
    """Regression (issue 27): the pull's own pruning removed a record's exit-code note
    (``outcome.*`` in the runtime directory) with it; ``admin prune`` did not, so each record
    it pruned left its note in RAM for good (nothing else reads or prunes them)."""
    offers = [_job(env, f"job{n}")["offerId"] for n in range(3)]
    pruned = env.cli("admin", "prune", "--json")
    assert pruned.status == 0, pruned.stderr
    (gone,) = pruned.lines()[0]["journal"]["inboxRecords"]
    from qinglong_edge.worker.remote.job_files import outcome_name

    notes = sorted(p.name for p in env.runtime.iterdir() if p.name.startswith("outcome."))
    assert notes == sorted(outcome_name(o) for o in offers if o != gone)


def test_a_pending_claim_on_an_inbox_full_of_records_in_flight_says_inbox_full(env: RemoteEnv) -> None:
    """The true reason, not ``idle (worker_unavailable)`` nor "every slot is busy": records
    that need this device fill the inbox (a cap lowered below them), so a pending claim is
    kept and not even sent (the cluster would answer idle to 0 slots)."""
    env.write_config(inboxMaximumEntries=3, maxConcurrentRuns=4)
    env.gated_job("a")
    env.gated_job("b")
    resident = env.spawn_json()
    try:
        # a and b are accepted and run; the third pull finds no task: its claim is kept.
        assert wait_until(lambda: env.starts("a") == 1 and env.starts("b") == 1 and env.claim() is not None, timeout=30)
        stopped = RemoteEnv.stop(resident)
        assert stopped.status == 0, dump(stopped)
        claim = env.claim()
        assert claim is not None
        env.write_config(inboxMaximumEntries=2, maxConcurrentRuns=4)  # the operator lowers the cap
        before = len(env.cluster.exchanges)
    finally:
        env.release("a")  # both stay in flight until the next pull completes them
        env.release("b")
    outcome = env.run_to_end()
    assert outcome.status == 75, dump(outcome)  # the cycle's status (inbox full), documented
    first = outcome.cycles()[0]
    assert (first["status"], first["reason"], first["offerId"]) == ("inbox_full", "capacity_exhausted",
                                                                    claim["offerId"]), dump(outcome)
    assert first["detail"] == "2 of 2 entries held by records that need this device"
    assert [env.starts("a"), env.starts("b")] == [1, 1]
    # While the records in flight filled the inbox, the kept claim was not sent. (It may
    # count one attempt: the stopped resident pull may have been stopped with its request
    # in flight, which leaves the attempt marker.)
    assert "offers" not in [e.op for e in env.cluster.exchanges[before:]]
    kept = env.claim()
    assert kept is not None and kept["offerId"] == claim["offerId"]
    assert kept["attemptCount"] <= claim["attemptCount"] + 1
    # Once they finished, the next pull sends it (2 finished records make room).
    again = env.pull("--json")
    assert again.status == 0 and again.last()["status"] == "idle" and again.last()["offerId"] == claim["offerId"]


def test_the_human_line_of_a_full_inbox_names_what_fills_it(env: RemoteEnv) -> None:
    env.write_config(inboxMaximumEntries=1, maxConcurrentRuns=2)
    env.gated_job("a")
    resident = env.spawn_json()
    try:
        assert wait_until(lambda: env.starts("a") == 1, timeout=30)
        stopped = RemoteEnv.stop(resident)
        assert stopped.status == 0, dump(stopped)
    finally:
        env.release("a")  # the record stays in flight until this pull completes it
    line = env.pull()
    assert line.status == 75, line.stderr
    assert "inbox full: 1 of 1 entries held by records that need this device" in line.stdout, line.stdout
    assert "qinglong-edge inbox list" in line.stdout


def test_the_64_jobs_wedge_at_the_edge_default(tmp_path: pathlib.Path, cluster: ClusterDouble) -> None:
    """The issue's numbers: 64 finished records (the edge default cap), then a 65th job. The
    records are written by the journal's own state steps (a start failure acknowledged)."""
    from qinglong_edge.contracts.inbox import (
        to_start_failed,
        to_start_failure_acknowledged,
        to_starting_acknowledged,
    )
    from qinglong_edge.worker.journal.store import Journal
    from tests.worker import offer_vectors as vectors

    env = RemoteEnv(tmp_path, cluster)  # inboxMaximumEntries: the edge default, 64
    hour_ago = int(time.time() * 1000) - 3_600_000  # well within the 7 days of retention
    with Journal.open(str(env.journal)) as journal:
        for n in range(64):
            _, record = journal.accept_offer({**vectors.offer(), "offerId": f"done-{n:02d}"}, hour_ago + n)
            for step in (to_starting_acknowledged, to_start_failed, to_start_failure_acknowledged):
                record = journal.replace_offer(step(record, hour_ago + 100 + n), record["revision"])
    assert len(env.inbox()) == 64
    first = _job(env, "job65")
    inbox = env.inbox()
    assert len(inbox) == 64 and first["offerId"] in inbox and "done-00" not in inbox
    assert env.starts("job65") == 1
