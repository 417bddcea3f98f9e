"""A full disk never corrupts the Local store or its logs (issue 16, "Bad input").

On a real 1 MiB tmpfs (root only; skipped with the reason otherwise): the store and the
log directory fill it up with real Runs, a filler file takes the last bytes, then every
writer fails cleanly: ``task.start`` and the audit sink with ``storage_unavailable``,
nothing half-written. The pruner then brings the store within its caps on the full
disk itself (it empties the logs it is deleting anyway, so SQLite's rollback journal
fits) and the store works again.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
from collections.abc import Iterator

import pytest

from qinglong_edge.errors import StoreError
from qinglong_edge.local.audit import AuditUnavailable
from qinglong_edge.local.retention import Pruner, RetentionCaps, measure_store
from qinglong_edge.local.run_logs import log_name
from qinglong_edge.local.store import Store
from tests.support.cli import run_cli
from tests.support.mounts import tmpfs
from tests.support.run_history import DAY, T0, History


@pytest.fixture
def small(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    with tmpfs(tmp_path / "small", "1m") as mount:
        yield mount


def _fill(fd: int) -> None:
    """Grow the file open at ``fd`` until the file system says ENOSPC."""
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC


def _not_terminal(history: History) -> list[tuple[str, str]]:
    return [(str(r[0]), str(r[1])) for r in history.store.run(lambda c: c.execute(
        "SELECT id, status FROM \"Runs\" WHERE status IN ('queued', 'dispatching', 'running')").fetchall())]


def _checks(history: History) -> None:
    integrity, foreign = history.checks()
    assert integrity == [("ok",)] and foreign == []
    named = {log_name(r, a) for r, a in history.store.run(lambda c: c.execute(
        'SELECT run_id, id FROM "RunAttempts" WHERE log_artifact_id IS NOT NULL').fetchall())}
    assert {n for n in history.log_names() if n.endswith(".log")} <= named


@pytest.mark.root
def test_a_full_disk_fails_every_writer_cleanly_and_pruning_makes_room_by_itself(small: pathlib.Path) -> None:
    history = History.create(str(small))
    filler = small / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # opened while there is room
    try:
        history.audit(T0 - DAY, 200)
        made = 0
        with pytest.raises((StoreError, OSError)):
            for i in range(2000):
                history.finished(T0 - DAY + i * 1000, b"o" * 6000)
                made += 1
        assert made > 20
        # The disk filled at one of the Run's steps: mostly its task.start (nothing
        # committed), sometimes after it (about 1 in 6 here: the Run stays queued,
        # dispatching or running, not terminal). Whatever it is, it is kept as it is.
        interrupted = _not_terminal(history)
        assert len(interrupted) <= 1, interrupted
        _fill(fd)
        with pytest.raises(StoreError) as started:
            history.queued(T0)
        assert started.value.code == "storage_unavailable"
        with pytest.raises(AuditUnavailable):
            history.audit(T0)
        _checks(history)
        caps = RetentionCaps(100, 365 * DAY, 10, 365 * DAY, 64 * 1024 * 1024, history.log_directory, 1 << 30)
        # Pruning on the full disk: its first transactions find no room for SQLite's
        # rollback journal (the audit step waits), so it empties the logs of the Runs it
        # is deleting (the files stay), deletes their rows, then the files; then the
        # audit rows go too.
        report = Pruner(history.store, caps, clock=lambda: T0).run()
        assert report.truncated_bytes > 0 and sum(report.runs.values()) == made - 10
        assert report.audit_rows == {"count": 100}
        assert not os.path.exists(history.store.path + "-journal")
        usage = history.store.run(measure_store)
        assert usage.terminal_runs == 10
        assert _not_terminal(history) == interrupted  # pruning never touches a Run in flight
        _checks(history)
        history.finished(T0 + 1000, b"works again\n")
        history.audit(T0)
        os.close(fd)
        fd = -1
    finally:
        if fd >= 0:
            os.close(fd)
        history.store.close()
    with Store.open(str(small / "local.db")) as reopened:  # quick_check and the write probe pass
        assert reopened.run(measure_store).terminal_runs == 11
    assert (small / "filler").stat().st_size > 0  # the disk stayed full of it all along


@pytest.mark.root
def test_after_a_restart_on_the_full_disk_admin_prune_still_makes_room(small: pathlib.Path,
                                                                      tmp_path: pathlib.Path) -> None:
    """Review (issue 16, "Bad input"): the disk filled while the agent ran, then it
    stopped (a reboot, a crash, an upgrade). Every later open of the store failed at its
    write probe (``SQLITE_FULL``: storage_unavailable, exit 74), so neither ``serve`` nor
    ``admin prune`` (doctor's remedy) could ever start to make room: the pruner's
    full-disk path was reachable only from a store opened before the disk filled."""
    history = History.create(str(small))
    fd = os.open(small / "filler", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    made = 0
    try:
        with pytest.raises((StoreError, OSError)):
            for i in range(2000):
                history.finished(T0 - DAY + i * 1000, b"o" * 6000)
                made += 1
        assert made > 20
        _fill(fd)
    finally:
        os.close(fd)
        history.store.close()  # the service stops; the disk stays full
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "schema": "qinglong/edge-agent@v1",
        "stateDirectory": str(small),
        "localApi": {"listener": {"host": "127.0.0.1", "port": 5700}, "runMaximumEntries": 10,
                     "pepperKeyringDirectory": str(tmp_path / "pepper")},
        "execution": {"logDirectory": history.log_directory},
    }))
    result = run_cli("--config", str(config), "--json", "admin", "prune")
    assert result.status == 0, result.stdout + result.stderr
    pruned = result.json()["store"]
    assert pruned["runs"] == made - 10 and pruned["truncatedBytes"] > 0
    assert (small / "filler").stat().st_size > 0  # still full of it: the room came from pruning
    with Store.open(str(small / "local.db")) as reopened:
        assert reopened.run(measure_store).terminal_runs == 10
