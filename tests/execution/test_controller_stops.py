"""A stop never blocks the controller (issue 27 item 4), and the explicit phases of the
controller and of its Runs (item 3): real processes, the real store and the real
cancellation transaction (tests/support/execution_env.py).
"""

from __future__ import annotations

import os
import shlex
import sys
import time

import pytest

from qinglong_edge.errors import ExecutionError
from qinglong_edge.execution.controller import ExecutionController
from qinglong_edge.execution.launcher import ActiveRun
from qinglong_edge.execution.phases import CONTROLLER_TRANSITIONS, RUN_TRANSITIONS
from qinglong_edge.process.identity import ProcessIdentity
from qinglong_edge.process.stop import STOP_TRANSITIONS, check_transition
from tests.support.execution_env import Env
from tests.support.jobs import alive, descendants_by_marker
from tests.support.wait import wait_until

#: Block SIGTERM, say ready, wait for it with sigwait, stamp CLOCK_MONOTONIC (one clock
#: for every process of the machine) and exit. argv[1]: the file stem.
_STAMP_TERM = (
    "import os, signal, sys, time\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
    "open(sys.argv[1] + '.ready', 'w').close()\n"
    "signal.sigwait({signal.SIGTERM})\n"
    "now = time.monotonic_ns()\n"
    "with open(sys.argv[1] + '.tmp', 'w') as f:\n"
    "    f.write(str(now))\n"
    "os.rename(sys.argv[1] + '.tmp', sys.argv[1] + '.stamp')\n"
)

_DEAF_GRACE_MS = 4000


def _pid(env: Env, attempt_id: str) -> int:
    assert wait_until(lambda: env.attempt_row(attempt_id).get("pid") is not None, timeout=10)
    return int(env.attempt_row(attempt_id)["pid"])


def test_a_cancel_is_handled_while_another_run_sits_out_its_grace(env: Env, tmp_path: object) -> None:
    """Run A ignores SIGTERM (``trap '' TERM``, inherited by the ``exec``); while its stop
    waits out the terminate grace, Run B is cancelled through the real cancellation
    transaction: B gets its SIGTERM at once, and a new Run C is launched, both long before
    A's grace ends; A is then SIGKILLed at the grace's end, as before."""
    stem = os.path.join(str(tmp_path), "b")
    env.task("t-deaf", "trap '' TERM; exec sleep 100043")
    env.task("t-quick", "exec " + shlex.join([sys.executable, "-I", "-S", "-c", _STAMP_TERM, stem]))
    env.task("t-later", "exec sleep 100044")
    a_run, a_attempt = env.start("t-deaf")
    b_run, b_attempt = env.start("t-quick")
    with env.controller(terminate_grace_ms=_DEAF_GRACE_MS, kill_grace_ms=300, max_concurrent_runs=3) as controller:
        controller.notify()
        a_pid = _pid(env, a_attempt)
        _pid(env, b_attempt)
        assert wait_until(lambda: bool(descendants_by_marker("100043")), timeout=10)  # the trap is set, the exec done
        assert wait_until(lambda: os.path.exists(stem + ".ready"), timeout=30)
        assert controller.run_phase(a_attempt) == controller.run_phase(b_attempt) == "running"

        assert env.cancel(a_run, "cancel-a") == "accepted"
        controller.notify()
        assert wait_until(lambda: controller.run_phase(a_attempt) == "stopping", timeout=10)
        a_stopping_since = time.monotonic()

        assert env.cancel(b_run, "cancel-b") == "accepted"
        committed_ns = time.monotonic_ns()
        controller.notify()
        assert wait_until(lambda: os.path.exists(stem + ".stamp"), timeout=_DEAF_GRACE_MS / 1000)
        with open(stem + ".stamp", encoding="ascii") as handle:
            b_term_ms = (int(handle.read()) - committed_ns) / 1e6
        assert b_term_ms < 1000, f"B's SIGTERM came {b_term_ms:.0f} ms after its cancel"
        assert env.wait_status(b_run, "cancelled") == "cancelled"
        c_run, _ = env.start("t-later")
        controller.notify()
        assert env.wait_status(c_run, "running") == "running"
        # All of that happened while A was still in its terminate grace:
        assert controller.run_phase(a_attempt) == "stopping" and alive(a_pid)
        assert env.status(a_run) == "running"
        assert time.monotonic() - a_stopping_since < _DEAF_GRACE_MS / 1000

        assert env.wait_status(a_run, "cancelled", timeout=15) == "cancelled"
        assert time.monotonic() - a_stopping_since >= _DEAF_GRACE_MS / 1000 - 0.05  # the grace was waited
        assert not alive(a_pid) and not descendants_by_marker("100043")
        assert controller.run_phase(a_attempt) is None  # finished and forgotten
        env.cancel(c_run, "cancel-c")
        controller.notify()
        assert env.wait_status(c_run, "cancelled") == "cancelled"


def test_the_drain_stops_a_run_whose_stop_is_under_way_and_the_others_at_once(env: Env) -> None:
    """The shutdown drain on the controller's own thread: a stop under way (a user cancel
    of a TERM-deaf Run) goes on to its end, the other Run gets its shutdown stop at once;
    one grace period in all."""
    env.task("t-deaf-2", "trap '' TERM; exec sleep 100045")
    env.task("t-plain", "exec sleep 100046")
    deaf_run, deaf_attempt = env.start("t-deaf-2")
    plain_run, plain_attempt = env.start("t-plain")
    with env.controller(terminate_grace_ms=1000, kill_grace_ms=300) as controller:
        controller.notify()
        pids = [_pid(env, deaf_attempt), _pid(env, plain_attempt)]
        assert wait_until(lambda: bool(descendants_by_marker("100045")) and bool(descendants_by_marker("100046")), timeout=10)
        env.cancel(deaf_run)
        controller.notify()
        assert wait_until(lambda: controller.run_phase(deaf_attempt) == "stopping", timeout=10)
        started = time.monotonic()
        assert controller.stop() is True
        elapsed = time.monotonic() - started
        assert controller.phase == "closed"
    assert elapsed < 1.0 + 0.3 + 1.0  # at most the deaf Run's grace, not one per Run
    assert not any(alive(p) for p in pids)
    assert [env.run_row(r)["cancel_reason"] for r in (deaf_run, plain_run)] == ["user", "shutdown"]
    assert [env.status(r) for r in (deaf_run, plain_run)] == ["cancelled", "cancelled"]


def test_the_controller_walks_its_phases(env: Env) -> None:
    controller = ExecutionController(env.store, env.config(), work_directory=env.root)
    assert controller.phase == "new"
    controller.start()
    assert controller.wait_ready(10)
    assert wait_until(lambda: controller.phase == "controlling", timeout=10)  # recovery is complete
    assert controller.stop(10) is True
    assert controller.phase == "closed"
    never_started = ExecutionController(env.store, env.config(), work_directory=env.root)
    assert never_started.stop(1) is True and never_started.phase == "closed"


def test_the_controller_refuses_a_phase_move_its_table_does_not_list(env: Env) -> None:
    controller = ExecutionController(env.store, env.config(), work_directory=env.root)
    with pytest.raises(ExecutionError) as refused:
        controller._move("draining")  # new -> draining: not in the table
    assert refused.value.code == "invalid_phase" and controller.phase == "new"
    controller.stop(1)


def _every_phase(table: dict[str, frozenset[str]]) -> set[str]:
    return set(table) | {phase for targets in table.values() for phase in targets}


@pytest.mark.parametrize("table", [CONTROLLER_TRANSITIONS, RUN_TRANSITIONS, STOP_TRANSITIONS],
                         ids=["controller", "run", "stop"])
def test_each_listed_move_is_allowed_and_every_other_one_raises(table: dict[str, frozenset[str]]) -> None:
    phases = _every_phase(table)
    assert phases == set(table)  # every target is itself a phase of the table
    for current in phases:
        for target in phases:
            if target in table[current]:
                check_transition(table, "t", current, target)
            else:
                with pytest.raises(ExecutionError) as refused:
                    check_transition(table, "t", current, target)
                assert refused.value.code == "invalid_phase"
    with pytest.raises(ExecutionError):
        check_transition(table, "t", "no-such-phase", next(iter(phases)))


def _active_run(phase: str) -> ActiveRun:
    identity = ProcessIdentity("boot", 1, 1, "1")
    return ActiveRun("run-1", "attempt-1", "ql3lp1.x", identity, None, None, None, phase=phase)


def test_a_run_walks_each_allowed_move_and_refuses_a_disallowed_one() -> None:
    for current, targets in RUN_TRANSITIONS.items():
        for target in targets:
            active = _active_run(current)
            active.move(target)
            assert active.phase == target
    finished = _active_run("running")
    for phase in ("stopping", "finished"):
        finished.move(phase)
    for illegal in ("running", "stopping", "finished"):
        with pytest.raises(ExecutionError) as refused:
            finished.move(illegal)
        assert refused.value.code == "invalid_phase" and finished.phase == "finished"
    with pytest.raises(ExecutionError):
        _active_run("running").move("finished")  # a Run is never finished without its stop
