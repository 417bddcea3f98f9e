"""Storage caps of the Local store (issue 16): real SQLite files, real log files.

Each test builds a Run history with the real transactions (tests/support/run_history.py)
and prunes it with the real :class:`~qinglong_edge.local.retention.Pruner`.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator

import pytest

from qinglong_edge.contracts.ids import new_uuid4
from qinglong_edge.local.retention import AUDIT_BATCH, RUN_BATCH, Pruner, PruneReport, RetentionCaps, measure_store
from qinglong_edge.local.run_logs import log_name
from qinglong_edge.local.runs import get_run
from qinglong_edge.local.store import write_transaction
from tests.support.run_history import DAY, T0, History, insert_step_runs

YEAR = 365 * DAY


def caps(history: History, **overrides: int | None) -> RetentionCaps:
    values: dict[str, object] = {
        "audit_maximum_entries": 10_000, "audit_retention_ms": YEAR, "run_maximum_entries": 1000,
        "run_retention_ms": YEAR, "database_maximum_bytes": 64 * 1024 * 1024,
        "log_directory": history.log_directory, "max_total_log_bytes": 1024 * 1024 * 1024,
    }
    values.update(overrides)
    return RetentionCaps(**values)  # type: ignore[arg-type]


@pytest.fixture
def history(tmp_path: pathlib.Path) -> Iterator[History]:
    made = History.create(str(tmp_path))
    yield made
    made.store.close()


def prune(history: History, now_ms: int = T0, **overrides: int | None) -> PruneReport:
    return Pruner(history.store, caps(history, **overrides), clock=lambda: now_ms).run()


def assert_consistent(history: History) -> None:
    """No damage, no dangling key, and every log file belongs to an attempt that names it."""
    integrity, foreign = history.checks()
    assert integrity == [("ok",)] and foreign == []
    attempts = history.store.run(lambda c: c.execute(
        'SELECT run_id, id FROM "RunAttempts" WHERE log_artifact_id IS NOT NULL').fetchall())
    named = {log_name(run_id, attempt_id) for run_id, attempt_id in attempts}
    assert {n for n in history.log_names() if n.endswith(".log")} <= named


def test_the_count_cap_keeps_the_newest_terminal_runs_and_deletes_every_row_and_log_of_the_others(
    history: History,
) -> None:
    runs = [history.finished(T0 - DAY + i * 1000) for i in range(30)]
    insert = runs[3][0]
    history.store.run(lambda c: insert_step_runs(c, insert, now_ms=T0 - DAY))
    report = prune(history, run_maximum_entries=10)
    assert report.runs == {"count": 20}
    assert history.run_ids() == [run_id for run_id, _ in runs[20:]]
    for run_id, attempt_id in runs[:20]:
        assert history.rows_of(run_id) == {"Runs": 0, "RunAttempts": 0, "RunEvents": 0, "StepRuns": 0,
                                           "StepRunMutations": 0}
        assert not os.path.exists(history.log_path(run_id, attempt_id))
    for run_id, attempt_id in runs[20:]:
        assert history.rows_of(run_id)["RunEvents"] >= 6
        assert pathlib.Path(history.log_path(run_id, attempt_id)).read_bytes() == b"output\n"
    assert report.log_bytes > 0
    assert_consistent(history)


def test_runs_that_are_not_terminal_are_never_pruned_whatever_their_age(history: History) -> None:
    running = history.running(T0 - 300 * DAY, b"still going\n")
    old = [history.finished(T0 - 200 * DAY + i) for i in range(12)]
    queued = history.queued(T0 - 299 * DAY)  # last: the launch claim would take it first
    report = prune(history, run_maximum_entries=10, run_retention_ms=DAY, max_total_log_bytes=1024 * 1024)
    assert report.runs == {"count": 2, "age": 10}  # the count cap first (oldest), then the age
    assert set(history.run_ids()) == {running[0], queued[0]}
    assert pathlib.Path(history.log_path(*running)).read_bytes() == b"still going\n"
    assert all(not os.path.exists(history.log_path(*run)) for run in old)
    # Even a cap the non-terminal Runs alone exceed removes nothing of theirs.
    assert prune(history, run_maximum_entries=10, run_retention_ms=60_000, max_total_log_bytes=0).runs == {}
    assert set(history.run_ids()) == {running[0], queued[0]}
    assert_consistent(history)


def test_the_age_cap_removes_runs_that_ended_before_it_even_if_created_later(history: History) -> None:
    long_run = history.finished(T0 - 40 * DAY, ended_ms=T0 - DAY)   # created first, ended yesterday
    short = history.finished(T0 - 39 * DAY, ended_ms=T0 - 39 * DAY)  # created later, ended long ago
    recent = history.finished(T0 - 2 * DAY)
    lost_run = history.cancelled_before_launch(T0 - 35 * DAY)
    report = prune(history, run_retention_ms=30 * DAY)
    assert report.runs == {"age": 2}
    assert history.run_ids() == [long_run[0], recent[0]]
    assert history.rows_of(short[0])["RunEvents"] == 0 and history.rows_of(lost_run[0])["Runs"] == 0


def test_lost_runs_are_terminal_for_pruning(history: History) -> None:
    run_id, attempt_id = history.running(T0 - 10 * DAY, b"x\n")
    history.store.run(lambda c: c.execute(
        "UPDATE \"Runs\" SET status = 'lost' WHERE id = ?", (run_id,)) and None)
    history.store.run(lambda c: c.execute(
        "UPDATE \"RunAttempts\" SET status = 'lost', finished_at_ms = ? WHERE id = ?", (T0, attempt_id)) and None)
    assert prune(history, run_retention_ms=DAY).runs == {"age": 1}
    assert history.run_ids() == [] and history.log_names() == set()


def test_each_step_is_bounded_and_a_pass_prunes_down_to_the_cap(history: History) -> None:
    for i in range(80):
        history.finished(T0 - DAY + i)
    pruner = Pruner(history.store, caps(history, run_maximum_entries=10), clock=lambda: T0)
    report = PruneReport()
    done = []
    while (step := pruner.step(report)) is not None:
        done.append((step, sum(report.runs.values())))
    counts = [n for step, n in done if step == "runs"]
    deltas = [b - a for a, b in zip([0, *counts], counts, strict=False)]
    assert max(deltas) <= RUN_BATCH and sum(deltas) == 70
    assert len(counts) == -(-70 // RUN_BATCH)
    assert len(history.run_ids()) == 10
    assert report.max_step_ms > 0


def test_audit_rows_beyond_the_count_or_the_age_go_oldest_first(history: History) -> None:
    history.audit(T0 - 100 * DAY, 5)
    history.audit(T0 - 10 * DAY, AUDIT_BATCH + 20)
    history.audit(T0 - DAY, 30)
    report = prune(history, audit_maximum_entries=AUDIT_BATCH + 60, audit_retention_ms=30 * DAY)
    assert report.audit_rows == {"age": 5}
    usage = history.store.run(measure_store)
    assert usage.audit_rows == AUDIT_BATCH + 50 and usage.audit_oldest_ms == T0 - 10 * DAY
    report = prune(history, audit_maximum_entries=100, audit_retention_ms=30 * DAY)
    assert report.audit_rows == {"count": AUDIT_BATCH + 50 - 100}
    kept = history.store.run(lambda c: c.execute(
        'SELECT occurred_at_ms FROM "QingLong3SecurityAuditEvents" ORDER BY rowid').fetchall())
    assert [t for (t,) in kept] == [T0 - 10 * DAY] * 70 + [T0 - DAY] * 30


def test_the_log_cap_deletes_the_logs_of_the_oldest_terminal_runs_and_keeps_the_runs(history: History) -> None:
    chunk = b"y" * 64 * 1024
    running = history.running(T0 - 50 * DAY, chunk)   # the oldest log, but in flight
    finished = [history.finished(T0 - 40 * DAY + i * DAY, chunk) for i in range(10)]
    for index, (run_id, attempt_id) in enumerate([running, *finished]):
        os.utime(history.log_path(run_id, attempt_id), ns=(0, (index + 1) * 10**9))
    cap = 4 * 64 * 1024 + 4096
    report = prune(history, max_total_log_bytes=cap)
    assert report.logs == 7 and report.runs == {}
    assert len(history.run_ids()) == 11
    for run_id, attempt_id in finished[:7]:
        assert not os.path.exists(history.log_path(run_id, attempt_id))
        body = history.store.run(lambda c, r=run_id: get_run(c, "default", r))  # type: ignore[misc]
        assert body["run"]["latestAttempt"]["logAvailable"] is False
    for run_id, attempt_id in [running, *finished[7:]]:
        assert os.path.getsize(history.log_path(run_id, attempt_id)) == len(chunk)
    scan = Pruner(history.store, caps(history)).log_scan()
    assert scan is not None and scan.total_bytes <= cap
    assert_consistent(history)


def test_the_database_cap_removes_the_oldest_records_and_gives_the_pages_back(history: History) -> None:
    for i in range(100):
        history.finished(T0 - 30 * DAY + i * 1000, b"")
    history.audit(T0 - 20 * DAY, 1500)
    before = history.store.run(measure_store)
    assert before.auto_vacuum == 2  # a new database: incremental auto-vacuum
    cap = before.used_bytes // 2
    report = prune(history, database_maximum_bytes=cap)
    after = history.store.run(measure_store)
    assert after.used_bytes <= cap and after.file_bytes <= cap
    assert report.runs.get("database", 0) > 0 and report.vacuum_pages > 0
    # Oldest first across both: every Run (older than every audit row) went before any audit row.
    assert report.audit_rows.get("database", 0) == 0 or after.runs == 0
    assert_consistent(history)


def test_a_run_another_run_refers_to_is_kept_and_does_not_stall_the_pass(history: History) -> None:
    parent = history.finished(T0 - 20 * DAY)
    others = [history.finished(T0 - 19 * DAY + i) for i in range(5)]
    child = history.finished(T0 - DAY)
    history.store.run(lambda c: c.execute(
        'UPDATE "Runs" SET parent_run_id = ? WHERE id = ?', (parent[0], child[0])) and None)
    report = prune(history, run_maximum_entries=10, run_retention_ms=10 * DAY)
    assert report.runs == {"age": 5} and report.pinned_runs == 1
    assert history.run_ids() == [parent[0], child[0]]
    assert all(history.rows_of(run_id)["Runs"] == 0 for run_id, _ in others)
    assert_consistent(history)


def test_orphan_log_files_are_swept_and_foreign_files_are_left_alone(history: History) -> None:
    kept = history.finished(T0 - DAY, b"mine\n")
    gone_run, gone_attempt = new_uuid4(), new_uuid4()
    orphans = [log_name(gone_run, gone_attempt), log_name(gone_run, gone_attempt, ".fifo"),
               "local-" + "a" * 30 + ".log"]
    foreign = ["notes.txt", "x_y.log.bak", "my_notes.log", "gone-run_gone-attempt.log"]  # not names we make
    for name in [*orphans, *foreign]:
        pathlib.Path(history.log_directory, name).write_bytes(b"stray\n")
    # A file named after a live attempt whose log was already cleared is an orphan too.
    cleared = history.finished(T0 - DAY, b"cleared\n")
    history.store.run(lambda c: c.execute(
        'UPDATE "RunAttempts" SET log_artifact_id = NULL WHERE id = ?', (cleared[1],)) and None)
    report = prune(history)
    assert report.orphan_files == 4
    assert history.log_names() == {log_name(*kept), *foreign}


def test_logs_named_before_the_rename_are_found_and_deleted_with_their_run(history: History) -> None:
    run_id, attempt_id = history.finished(T0 - 40 * DAY, b"")
    os.unlink(history.log_path(run_id, attempt_id))
    artifact = history.store.run(lambda c: c.execute(
        'SELECT log_artifact_id FROM "RunAttempts" WHERE id = ?', (attempt_id,)).fetchone()[0])
    legacy = pathlib.Path(history.log_directory, artifact + ".log")
    legacy.write_bytes(b"old layout\n")
    assert prune(history).orphan_files == 0 and legacy.exists()  # it has its row: not an orphan
    assert prune(history, run_retention_ms=30 * DAY).runs == {"age": 1}
    assert not legacy.exists()


def test_nothing_to_prune_writes_nothing(history: History) -> None:
    for i in range(5):
        history.finished(T0 - DAY + i)
    history.audit(T0 - DAY, 10)
    path = history.store.path
    before = (os.stat(path).st_mtime_ns, os.stat(path).st_size, history.store.run(
        lambda c: c.execute("PRAGMA data_version").fetchone()))
    pruner = Pruner(history.store, caps(history), clock=lambda: T0)
    assert pruner.run().removed_anything is False
    assert pruner.run().steps == 0  # the sweep is done once; later passes only read
    assert not os.path.exists(path + "-journal")
    assert (os.stat(path).st_mtime_ns, os.stat(path).st_size) == before[:2]


def test_a_cap_lowered_below_what_is_stored_is_reached_in_one_pass(history: History) -> None:
    for i in range(60):
        history.finished(T0 - DAY + i)
    assert prune(history, run_maximum_entries=50).runs == {"count": 10}
    assert prune(history, run_maximum_entries=20).runs == {"count": 30}
    assert len(history.run_ids()) == 20


def test_a_run_deleted_twice_is_harmless(history: History) -> None:
    from qinglong_edge.local.retention import delete_runs

    run_id, _ = history.finished(T0 - DAY)
    assert history.store.run(lambda c: delete_runs(c, [run_id])).run_ids == (run_id,)
    assert history.store.run(lambda c: delete_runs(c, [run_id])).run_ids == ()
    queued, _ = history.queued(T0)
    assert history.store.run(lambda c: delete_runs(c, [queued])).run_ids == ()  # not terminal: refused
    assert history.run_ids() == [queued]


def test_foreign_keys_are_back_on_after_a_prune_even_when_it_fails(history: History) -> None:
    from qinglong_edge.local.store import foreign_keys_off

    def failing(c: object) -> None:
        with foreign_keys_off(c), write_transaction(c):  # type: ignore[arg-type]
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        history.store.run(failing)
    assert history.store.run(lambda c: c.execute("PRAGMA foreign_keys").fetchone()) == (1,)


def test_the_history_launches_its_own_run_whatever_else_is_queued(history: History) -> None:
    """The flaky full-disk test (1 in ~40 runs): when the disk fills *after* a task.start
    committed and before its launch claim, that Run stays ``queued``, as it must (a fault
    keeps work; the oldest queued Run is launched first). The helper's next
    ``finished()`` then claimed that older Run instead of its own (claim_next is FIFO) and
    failed its own assertion. Deterministic here: a Run left queued first."""
    left_queued, _ = history.queued(T0 - DAY)
    run_id, _ = history.finished(T0)
    statuses = dict(history.store.run(lambda c: c.execute('SELECT id, status FROM "Runs"').fetchall()))
    assert (statuses[left_queued], statuses[run_id]) == ("queued", "succeeded")
