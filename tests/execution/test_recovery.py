"""Restart recovery: the controller's process dies (SIGKILL) and a new one converges.

The first controller runs in a child process (tests/support/controller_main.py) so that it
can really be SIGKILLed; its jobs survive it (they run in their own sessions).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from qinglong_edge.contracts.ids import new_uuid4
from qinglong_edge.execution.launcher import claim_next
from qinglong_edge.process.cgroups import CgroupManager
from qinglong_edge.process.identity import ProcessIdentity, capture, encode_handle
from tests.support.execution_env import Env
from tests.support.jobs import Bystander, alive, descendants_by_marker, kill_pids, read_text, reap, start_job
from tests.support.wait import wait_until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@contextmanager
def controller_process(env: Env) -> Iterator[subprocess.Popen[str]]:
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.controller_main", env.root],
        cwd=REPO, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        yield child
    finally:
        child.kill()
        child.wait()


def _running_pid(env: Env, run_id: str, attempt_id: str) -> int:
    assert env.wait_status(run_id, "running") == "running"
    return int(env.attempt_row(attempt_id)["pid"])


def test_sigkill_after_the_intent_then_restart_finishes_the_stop(env: Env) -> None:
    env.task("t-survivor", "sleep 100041 & wait")
    run_id, attempt_id = env.start("t-survivor")
    with controller_process(env) as child:
        pid = _running_pid(env, run_id, attempt_id)
        assert wait_until(lambda: bool(descendants_by_marker("100041")), timeout=10)
        assert env.cancel(run_id) == "accepted"  # the intent is durable ...
        os.kill(child.pid, signal.SIGKILL)  # ... and the controller dies before stopping anything
        child.wait()
    assert alive(pid) and descendants_by_marker("100041")  # nothing stopped the job
    assert env.status(run_id) == "running"
    with env.controller() as controller:
        controller.notify()
        assert env.wait_status(run_id, "cancelled") == "cancelled"
        assert wait_until(lambda: not alive(pid), timeout=10)
        assert not descendants_by_marker("100041")
    assert [e["type"] for e in env.events(run_id)][-3:] == ["run.cancel_requested", "attempt.cancelled",
                                                           "run.cancelled"]
    # A later restart still reads cancelled, and the replay answers already_terminal.
    with env.controller():
        pass
    assert env.status(run_id) == "cancelled" and env.cancel(run_id, "m-2") == "already_terminal"


def test_restart_adopts_a_running_job_and_keeps_draining_its_log(env: Env) -> None:
    env.task("t-adopt", "echo one; sleep 0.5; echo two; sleep 100042")
    run_id, attempt_id = env.start("t-adopt")
    with controller_process(env) as child:
        pid = _running_pid(env, run_id, attempt_id)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    log = os.path.join(env.log_directory, f"{run_id}_{attempt_id}.log")
    with env.controller() as controller:
        assert attempt_id in controller.active_attempts  # adopted, not lost
        assert wait_until(lambda: read_text(log) == "one\ntwo\n", timeout=10)  # "two" was written after the agent died
        assert env.status(run_id) == "running" and alive(pid)
        env.cancel(run_id)
        controller.notify()
        assert env.wait_status(run_id, "cancelled") == "cancelled"
        assert wait_until(lambda: not alive(pid), timeout=10)


def test_restart_reconciles_a_process_that_is_gone(env: Env) -> None:
    env.task("t-gone", "sleep 100043")
    lost_run, lost_attempt = env.start("t-gone")
    cancelled_run, cancelled_attempt = env.start("t-gone")
    with controller_process(env) as child:
        pids = [_running_pid(env, lost_run, lost_attempt), _running_pid(env, cancelled_run, cancelled_attempt)]
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    kill_pids(descendants_by_marker("100043") + pids)  # both jobs die while no agent runs
    assert wait_until(lambda: not any(alive(p) for p in pids), timeout=10)
    env.cancel(cancelled_run)
    with env.controller() as controller:
        controller.notify()
        assert env.wait_status(cancelled_run, "cancelled") == "cancelled"
    run, attempt = env.run_row(lost_run), env.attempt_row(lost_attempt)
    assert (run["status"], run["error_code"], attempt["status"]) == ("lost", "RECOVERY_PROCESS_NOT_RUNNING", "lost")
    events = env.events(lost_run)[-2:]
    assert [(e["type"], e["dedupe_key"], e["actor"]) for e in events] == [
        ("attempt.lost", f"local-recovery:attempt:{lost_attempt}:0:process_not_running", ("reconciler", "local-startup")),
        ("run.lost", f"local-recovery:run:{lost_run}:{lost_attempt}:6:process_not_running",
         ("reconciler", "local-startup")),
    ]
    assert events[-1]["payload_text"] == (
        '{"from_status":"running","to_status":"lost","error_code":"RECOVERY_PROCESS_NOT_RUNNING","version":8}')


def _pretend_running(env: Env, run_id: str, attempt_id: str, handle: str, pid: int) -> None:
    """Write what a previous agent would have recorded (status running with this handle)."""
    def write(c: object) -> None:
        c.execute('UPDATE "Runs" SET status = \'running\', version = 6, event_sequence = 2 WHERE id = ?',  # type: ignore[attr-defined]
                  (run_id,))
        c.execute('UPDATE "RunAttempts" SET status = \'running\', executor_handle = ?, pid = ? WHERE id = ?',  # type: ignore[attr-defined]
                  (handle, pid, attempt_id))
    env.store.run(write)


def test_recorded_pid_now_owned_by_an_unrelated_process_is_never_signalled(env: Env, tmp_path: object) -> None:
    unrelated = Bystander(str(tmp_path))
    try:
        real = capture(unrelated.pid)
        assert real is not None
        recorded = ProcessIdentity(real.boot_id, real.pid, real.pgid, str(int(real.start_time) - 7))
        env.task("t-reused", "true")
        run_id, attempt_id = env.start("t-reused")
        _pretend_running(env, run_id, attempt_id, encode_handle(new_uuid4(), recorded), real.pid)
        env.cancel(run_id)
        with env.controller() as controller:
            controller.notify()
            assert env.wait_status(run_id, "cancelled") == "cancelled"
        assert unrelated.untouched()
    finally:
        unrelated.close()


def test_interrupted_launch_is_lost_and_its_job_never_ran(env: Env) -> None:
    env.task("t-interrupted", "true")
    run_id, attempt_id = env.start("t-interrupted")
    # What a crash between the claim and the handle leaves: dispatching / starting, no handle.
    env.store.run(lambda c: c.execute(
        'UPDATE "Runs" SET status = \'dispatching\', version = 4, event_sequence = 2 WHERE id = ?', (run_id,)))
    env.store.run(lambda c: c.execute('UPDATE "RunAttempts" SET status = \'starting\' WHERE id = ?', (attempt_id,)))
    with env.controller():
        pass
    run = env.run_row(run_id)
    assert (run["status"], run["error_code"]) == ("lost", "RECOVERY_UNSTARTED_LAUNCH")


def test_claim_transaction_cancels_a_queued_run_with_an_intent(env: Env) -> None:
    env.task("t-claim", "echo never")
    run_id, attempt_id = env.start("t-claim")
    env.cancel(run_id)
    claim = env.store.run(lambda c: claim_next(c, now_ms=int(time.time() * 1000), log_artifact_id="local-" + "0" * 30))
    assert claim is not None and (claim.outcome, claim.run_id) == ("cancelled", run_id)
    assert env.status(run_id) == "cancelled"
    assert [(e["type"], e["dedupe_key"]) for e in env.events(run_id)][-2:] == [
        ("attempt.cancelled", f"local-control:{attempt_id}:0:attempt"),
        ("run.cancelled", f"local-control:{attempt_id}:0:run"),
    ]
    assert env.store.run(lambda c: claim_next(c, now_ms=0, log_artifact_id="local-" + "1" * 30)) is None


def test_cgroups_of_finished_attempts_are_swept_at_start_and_others_never(
    env: Env, cgroup_manager: CgroupManager, tmp_path: object
) -> None:
    env.task("t-done", "true")
    run_id, attempt_id = env.start("t-done")
    env.cancel(run_id)
    env.store.run(lambda c: claim_next(c, now_ms=int(time.time() * 1000), log_artifact_id="local-" + "2" * 30))
    assert env.status(run_id) == "cancelled"
    # A crash left a process in the cgroup of that finished attempt; another cgroup under
    # qinglong-edge/ belongs to no attempt of this database (another agent's).
    ours, foreign = cgroup_manager.create(attempt_id), cgroup_manager.create(f"foreign-{new_uuid4()}")
    assert ours is not None and foreign is not None
    leftover = start_job("sleep 100044", str(tmp_path), cgroup=ours)
    bystander = start_job("sleep 100045", str(tmp_path), cgroup=foreign)
    try:
        assert wait_until(lambda: leftover.pid in ours.members() and bystander.pid in foreign.members(), timeout=10)
        with env.controller(cgroups=cgroup_manager):
            pass
        assert wait_until(lambda: not alive(leftover.pid), timeout=10)
        assert attempt_id not in cgroup_manager.owned_names()
        assert alive(bystander.pid) and foreign.name in cgroup_manager.owned_names()
    finally:
        reap(leftover.process)
        foreign.kill()
        reap(bystander.process)
        wait_until(foreign.remove, timeout=10)


def test_fifos_of_earlier_releases_are_removed_and_foreign_ones_kept(env: Env) -> None:
    """Earlier agents drained Run output through a FIFO; the job wrapper writes the log
    itself, so a leftover FIFO of ours goes at start. Anything else stays."""
    ours = [os.path.join(env.log_directory, f"{new_uuid4()}_{new_uuid4()}.fifo"),
            os.path.join(env.log_directory, "local-" + "a" * 30 + ".fifo")]
    foreign = os.path.join(env.log_directory, "my.fifo")
    os.makedirs(env.log_directory, exist_ok=True)
    for path in [*ours, foreign]:
        os.mkfifo(path, 0o600)
    with env.controller():
        pass
    assert not any(os.path.exists(p) for p in ours)
    assert os.path.exists(foreign)
