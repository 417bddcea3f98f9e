"""A storage error while launching an accepted Run keeps the Run (issue 17 item 3).

The fault is real SQLite failing the real transaction: a trigger aborts the insert of
the ``attempt.running`` event, so recording the durable handle fails exactly as a full
disk or an I/O error makes it fail (``StoreError`` from the store). The job must never
run while its handle is unrecorded; the Run goes back to ``queued`` with a new attempt
and runs once storage works; a fault that does not go away ends ``failed`` with
``LAUNCH_STORAGE_UNAVAILABLE`` after the bound.
"""

from __future__ import annotations

import errno
import os
import pathlib

from tests.support.execution_env import Env
from tests.support.mounts import tmpfs
from tests.support.wait import wait_until

FAST_LAUNCH = {"launch_attempts": 8, "launch_backoff_s": 0.05}


def _inject(env: Env, types: tuple[str, ...]) -> None:
    listed = ", ".join(f"'{t}'" for t in types)
    env.store.run(lambda c: c.execute(
        f'CREATE TRIGGER injected BEFORE INSERT ON "RunEvents" WHEN NEW.type IN ({listed})'
        " BEGIN SELECT RAISE(ABORT, 'injected storage failure'); END"))


def _heal(env: Env) -> None:
    env.store.run(lambda c: c.execute("DROP TRIGGER IF EXISTS injected"))


def _attempts(env: Env, run_id: str) -> list[tuple[int, str, str | None]]:
    return env.store.run(lambda c: [tuple(r) for r in c.execute(
        'SELECT attempt, status, error_code FROM "RunAttempts" WHERE run_id = ? ORDER BY attempt', (run_id,))])


def test_a_fault_that_lasts_a_moment_requeues_the_run_and_it_runs(env: Env, tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "ran"
    env.task("t-once", f"echo run >> {marker}; exec sleep 100041")
    run_id, first = env.start("t-once")
    _inject(env, ("attempt.running",))
    with env.controller(launch=FAST_LAUNCH) as controller:
        controller.notify()
        assert wait_until(lambda: any(a[1] == "failed" for a in _attempts(env, run_id)), timeout=10)
        _heal(env)  # storage works again
        assert env.wait_status(run_id, "running") == "running"
        attempts = _attempts(env, run_id)
        assert attempts[0] == (1, "failed", "LAUNCH_STORAGE_UNAVAILABLE")
        assert all(a[1:] == ("failed", "LAUNCH_STORAGE_UNAVAILABLE") for a in attempts[:-1])
        assert attempts[-1][1] == "running" and len(attempts) < 8
        assert wait_until(marker.exists, timeout=10)
        assert marker.read_text() == "run\n"  # the job ran once: no unrecorded launch ever released it
        types = [e["type"] for e in env.events(run_id)]
        # What run.events.list shows (types in order): the failed launch, the requeue, the new launch.
        assert types[:8] == ["run.created", "run.queued", "run.dispatching", "attempt.starting", "attempt.failed",
                             "run.queued", "run.dispatching", "attempt.starting"]
        assert types[-2:] == ["attempt.running", "run.running"]
        requeued = env.events(run_id)[5]
        assert requeued["actor"] == ("scheduler", "local-execution")
        assert requeued["payload"]["from_status"] == "dispatching" and requeued["payload"]["attempt"] == 2
        assert env.run_row(run_id)["error_code"] is None
        assert first == env.store.run(lambda c: c.execute(
            'SELECT id FROM "RunAttempts" WHERE run_id = ? AND attempt = 1', (run_id,)).fetchone()[0])
        env.cancel(run_id)
        controller.notify()
        assert env.wait_status(run_id, "cancelled") == "cancelled"


def test_storage_that_cannot_even_record_the_requeue_keeps_the_run_until_it_can(env: Env) -> None:
    env.task("t-wait", "exec sleep 100042")
    run_id, attempt_id = env.start("t-wait")
    _inject(env, ("attempt.running", "attempt.failed"))
    with env.controller(launch=FAST_LAUNCH) as controller:
        controller.notify()
        assert wait_until(lambda: env.attempt_row(attempt_id)["status"] == "starting", timeout=10)
        passes = controller.passes
        assert wait_until(lambda: controller.passes >= passes + 3, timeout=10)  # several retries, all refused
        assert env.status(run_id) == "dispatching"  # not failed, nothing lost
        assert _attempts(env, run_id) == [(1, "starting", None)]
        assert env.attempt_row(attempt_id)["pid"] is None  # never recorded, never released
        _heal(env)
        assert env.wait_status(run_id, "running") == "running"
        assert [a[1] for a in _attempts(env, run_id)] == ["failed", "running"]
        env.cancel(run_id)
        controller.notify()
        assert env.wait_status(run_id, "cancelled") == "cancelled"


def test_a_fault_that_does_not_go_away_fails_the_run_after_the_bound(env: Env, tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "ran"
    env.task("t-never", f"touch {marker}")
    run_id, _ = env.start("t-never")
    _inject(env, ("attempt.running",))
    with env.controller(launch={"launch_attempts": 3, "launch_backoff_s": 0.02}) as controller:
        controller.notify()
        assert env.wait_status(run_id, "failed", timeout=20) == "failed"
    row = env.run_row(run_id)
    assert row["error_code"] == "LAUNCH_STORAGE_UNAVAILABLE"
    assert "each of 3 launches" in row["error_summary"]
    assert _attempts(env, run_id) == [(n, "failed", "LAUNCH_STORAGE_UNAVAILABLE") for n in (1, 2, 3)]
    assert [e["type"] for e in env.events(run_id)][-2:] == ["attempt.failed", "run.failed"]
    assert not marker.exists()  # no attempt's job ever ran
    assert not any(name.endswith(".fifo") for name in os.listdir(env.log_directory))


def test_a_cancel_while_a_launch_is_deferred_cancels_without_running(env: Env, tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "ran"
    env.task("t-cancel", f"touch {marker}")
    run_id, _ = env.start("t-cancel")
    _inject(env, ("attempt.running",))
    with env.controller(launch={"launch_attempts": 8, "launch_backoff_s": 30.0}) as controller:
        controller.notify()
        assert wait_until(lambda: env.status(run_id) == "queued" and len(_attempts(env, run_id)) == 2, timeout=10)
        assert env.cancel(run_id) == "accepted"  # during the backoff
        controller.notify()
        assert env.wait_status(run_id, "cancelled") == "cancelled"
    assert not marker.exists()
    assert [a[1] for a in _attempts(env, run_id)] == ["failed", "cancelled"]


def test_a_log_file_system_full_at_launch_requeues_the_run(env: Env, tmp_path: pathlib.Path) -> None:
    """Review (issue 17 item 3): the job wrapper cannot create the Run's log because the
    log directory's file system is full (ENOSPC, on a real tmpfs whose inodes are used
    up). That is storage failing while the launch is prepared, not the Run's fault: the
    Run must be requeued (attempt ``LAUNCH_STORAGE_UNAVAILABLE``) and run once there is
    room, not end ``failed`` at once."""
    with tmpfs(tmp_path / "logfs", "256k", inodes=8) as mount:
        logs = mount / "logs"
        logs.mkdir(mode=0o700)
        fillers: list[pathlib.Path] = []
        while True:
            filler = mount / f"filler-{len(fillers)}"
            try:
                filler.touch()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
            fillers.append(filler)
        env.log_directory = str(logs)
        marker = tmp_path / "ran"
        env.task("t-full", f"echo run >> {marker}")
        run_id, _ = env.start("t-full")
        with env.controller(launch=FAST_LAUNCH) as controller:
            controller.notify()
            assert wait_until(lambda: any(a[1:] == ("failed", "LAUNCH_STORAGE_UNAVAILABLE")
                                        for a in _attempts(env, run_id)), timeout=10)
            assert env.status(run_id) != "failed"
            assert not marker.exists()
            fillers.pop().unlink()  # room again
            assert env.wait_status(run_id, "succeeded", timeout=20) == "succeeded"
        assert marker.read_text() == "run\n"
        attempts = _attempts(env, run_id)
        assert attempts[-1][1] == "succeeded" and len(attempts) < 8
        assert env.run_row(run_id)["error_code"] is None
