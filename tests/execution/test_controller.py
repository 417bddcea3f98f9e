"""The controller end to end on a real store and real processes (local-api.md 7, 8).

Grace periods are 300 ms (SIGTERM) and 300 ms (SIGKILL) to keep the suite fast.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import time

import pytest

from qinglong_edge.process.cgroups import CgroupManager
from qinglong_edge.process.identity import read_proc_stat
from tests.support.execution_env import Env
from tests.support.jobs import alive, command_of, descendants_by_marker, kill_pids, read_text
from tests.support.wait import wait_until


def _pid(env: Env, attempt_id: str) -> int:
    assert wait_until(lambda: env.attempt_row(attempt_id).get("pid") is not None, timeout=10)
    return int(env.attempt_row(attempt_id)["pid"])


def _control_events(env: Env, run_id: str) -> list[tuple[str, str, tuple[str, str], str]]:
    return [(e["type"], e["dedupe_key"], e["actor"], e["payload_text"]) for e in env.events(run_id)[2:]]


def test_natural_exit_is_recorded_with_exit_code_and_events(env: Env) -> None:
    env.task("t-exit", "echo hello; echo oops >&2; exit 3", timeout_ms=600_000)
    run_id, attempt_id = env.start("t-exit")
    with env.controller() as controller:
        controller.notify()
        assert env.wait_status(run_id, "failed") == "failed"
    run, attempt = env.run_row(run_id), env.attempt_row(attempt_id)
    assert (attempt["status"], attempt["exit_code"], attempt["callback_sequence"]) == ("failed", 3, 1)
    assert (run["version"], run["event_sequence"]) == (8, 8)
    assert run["error_code"] == "EXECUTION_FAILED" and run["finished_at_ms"] >= run["started_at_ms"]
    pid, deadline = attempt["pid"], attempt["deadline_at_ms"]
    assert deadline is not None and deadline - run["started_at_ms"] <= 600_000
    aid = attempt_id
    assert _control_events(env, run_id) == [
        ("run.dispatching", f"local-execution:run:{run_id}:2:dispatching", ("scheduler", "local-execution"),
         '{"from_status":"queued","to_status":"dispatching","version":3}'),
        ("attempt.starting", f"local-execution:attempt:{aid}:0:starting", ("worker", "local_process"),
         f'{{"attempt_id":"{aid}","from_status":"claimed","to_status":"starting","version":4,'
         f'"deadline_at_ms":{deadline}}}'),
        ("attempt.running", f"local-execution:attempt:{aid}:0:running", ("executor", "local_process"),
         f'{{"attempt_id":"{aid}","from_status":"starting","to_status":"running","pid":{pid},"version":5}}'),
        ("run.running", f"local-execution:run:{run_id}:4:running", ("executor", "local_process"),
         '{"from_status":"dispatching","to_status":"running","version":6}'),
        ("attempt.failed", f"local-completion:{aid}:1:attempt", ("executor", "local_process"),
         f'{{"attempt_id":"{aid}","from_status":"running","to_status":"failed","callback_sequence":1,'
         f'"exit_code":3,"version":7}}'),
        ("run.failed", f"local-completion:{aid}:1:run", ("executor", "local_process"),
         '{"from_status":"running","to_status":"failed","version":8}'),
    ]
    assert attempt["log_artifact_id"].startswith("local-")  # logAvailable; the file is named by the ids
    log = os.path.join(env.log_directory, f"{run_id}_{aid}.log")
    assert read_text(log) == "hello\noops\n"
    assert not os.path.exists(log[:-4] + ".fifo")


def test_a_run_past_its_memory_limit_says_out_of_memory_in_its_stored_event(env: Env) -> None:
    """Issue 24 item 3: the job's memory leaf (``execution.maxRunMemoryBytes``), an OOM kill
    there, the exit status 137 and ``"reason":"out_of_memory"`` in the stored
    ``attempt.failed`` payload (the Local API's RunEvent fields are unchanged: payloads are
    never served)."""
    if os.geteuid() != 0 or not CgroupManager.detect("auto", memory_max=8 << 20).memory_available:
        pytest.skip("no memory cgroup for jobs here (root, a memory hierarchy)")
    env.task("t-oom", f"exec {sys.executable} -I -S -c 'b = bytearray(64 << 20)'")
    run_id, attempt_id = env.start("t-oom")
    with env.controller(max_run_memory_bytes=8 << 20) as controller:
        controller.notify()
        assert env.wait_status(run_id, "failed", timeout=30) == "failed"
    assert env.attempt_row(attempt_id)["exit_code"] == 137
    (failed,) = [e for e in env.events(run_id) if e["type"] == "attempt.failed"]
    assert json.loads(failed["payload_text"])["reason"] == "out_of_memory"


def test_a_run_that_fills_the_disk_costs_no_record(tmp_path: pathlib.Path) -> None:
    """Issue 24 item 4: the store, the logs and the Run's working directory on one small
    file system, which the job fills before it exits 5. The completion cannot be written
    (the store's write fails cleanly) and is retried; once the space is back (here the
    operator removes the file) the Run is recorded failed with its exit code."""
    from tests.support.execution_env import make_env
    from tests.support.mounts import tmpfs

    with tmpfs(tmp_path / "state", "4m") as root:
        env = make_env(str(root))
        try:
            work = root / "work"
            work.mkdir()
            env.task("t-fill", "head -c 8388608 /dev/zero > fill; exit 5", cwd=str(work))
            run_id, attempt_id = env.start("t-fill")
            with env.controller() as controller:
                controller.notify()
                assert wait_until(lambda: env.status(run_id) == "running", timeout=10)
                pid = env.attempt_row(attempt_id)["pid"]
                assert wait_until(lambda: not alive(pid), timeout=30)  # the job (and its wrapper) ended
                assert os.statvfs(root).f_bavail == 0
                seen = controller.passes  # the controller tries to record the exit meanwhile: it cannot ...
                assert wait_until(lambda: controller.passes >= seen + 2, timeout=10)
                assert env.status(run_id) == "running"  # ... and nothing is lost or half-written
                (work / "fill").unlink()  # until the space is back
                assert env.wait_status(run_id, "failed", timeout=30) == "failed"
            assert env.attempt_row(attempt_id)["exit_code"] == 5
        finally:
            env.store.close()


def test_exit_zero_succeeds_with_task_environment_and_directory(env: Env, tmp_path: object) -> None:
    workdir = os.path.join(str(tmp_path), "work")
    os.mkdir(workdir)
    env.task("t-ok", 'echo "$GREETING from $(pwd)" > out.txt', environment={"GREETING": "hi"}, cwd=workdir)
    run_id, attempt_id = env.start("t-ok")
    with env.controller() as controller:
        controller.notify()
        assert env.wait_status(run_id, "succeeded") == "succeeded"
    assert read_text(os.path.join(workdir, "out.txt")) == f"hi from {workdir}\n"
    assert env.attempt_row(attempt_id)["exit_code"] == 0 and env.run_row(run_id)["error_code"] is None


def test_cancel_stops_the_job_and_marks_terminal_with_the_exact_events(env: Env, tmp_path: object) -> None:
    marker = os.path.join(str(tmp_path), "term")
    env.task("t-long", f"trap 'echo term > {marker}; exit 0' TERM; sleep 100037 & wait")
    run_id, attempt_id = env.start("t-long")
    with env.controller() as controller:
        controller.notify()
        pid = _pid(env, attempt_id)
        assert wait_until(lambda: bool(descendants_by_marker("100037")), timeout=10)  # the trap is installed
        assert env.wait_status(run_id, "running") == "running"
        assert env.cancel(run_id, "m-1") == "accepted"
        controller.notify()
        assert env.wait_status(run_id, "cancelled") == "cancelled"
        assert not alive(pid)
        assert env.cancel(run_id, "m-1") == "already_terminal"  # the replay
    assert read_text(marker) == "term\n"
    run, attempt = env.run_row(run_id), env.attempt_row(attempt_id)
    assert (run["version"], run["event_sequence"], run["cancel_reason"]) == (9, 9, "user")
    assert (run["error_code"], run["error_summary"]) == ("EXECUTION_CANCELLED", "Execution was cancelled")
    assert (attempt["status"], attempt["error_code"]) == ("cancelled", "EXECUTION_CANCELLED")
    assert run["finished_at_ms"] == attempt["finished_at_ms"] >= max(run["started_at_ms"], run["created_at_ms"])
    aid = attempt_id
    assert _control_events(env, run_id)[-2:] == [
        ("attempt.cancelled", f"local-control:{aid}:0:attempt", ("reconciler", "local-execution-control"),
         f'{{"attempt_id":"{aid}","from_status":"running","to_status":"cancelled","reason":"user","version":8}}'),
        ("run.cancelled", f"local-control:{aid}:0:run", ("reconciler", "local-execution-control"),
         '{"from_status":"running","to_status":"cancelled","reason":"user","version":9}'),
    ]


def test_a_cancelled_local_run_gets_exactly_one_term(env: Env, tmp_path: object) -> None:
    """The process core's one-TERM-per-stop, end to end through the controller (the remote
    runner uses the same stop): the job counts each TERM delivered to it."""
    import shlex
    import sys

    from tests.process.test_stop import _PY_COUNTER, _terms

    counted, ready = os.path.join(str(tmp_path), "terms"), os.path.join(str(tmp_path), "ready")
    env.task("t-count", "exec " + shlex.join([sys.executable, "-I", "-S", "-c", _PY_COUNTER, counted, ready]))
    run_id, attempt_id = env.start("t-count")
    with env.controller(terminate_grace_ms=10_000) as controller:
        controller.notify()
        _pid(env, attempt_id)
        assert wait_until(lambda: os.path.exists(ready), timeout=30)
        assert env.cancel(run_id) == "accepted"
        controller.notify()
        assert env.wait_status(run_id, "cancelled", timeout=20) == "cancelled"
    assert _terms(counted) == 1


@pytest.mark.parametrize("use_cgroups", [True, False], ids=["cgroup", "no-cgroup"])
def test_cancel_leaves_no_process_of_the_run(env: Env, use_cgroups: bool, request: pytest.FixtureRequest) -> None:
    marker, escaped = "100031.5", "100031.75"
    cgroups = request.getfixturevalue("cgroup_manager") if use_cgroups else CgroupManager.detect("off")
    env.task("t-escape", f"setsid sh -c 'sleep {escaped} & sleep {escaped} & wait' & "
                         f"( sleep {marker} & ) & wait")
    run_id, attempt_id = env.start("t-escape")
    try:
        with env.controller(cgroups=cgroups) as controller:
            controller.notify()
            _pid(env, attempt_id)
            assert wait_until(lambda: len(descendants_by_marker(escaped)) == 2 and descendants_by_marker(marker), timeout=10)
            env.cancel(run_id)
            controller.notify()
            assert env.wait_status(run_id, "cancelled") == "cancelled"
            assert not descendants_by_marker(marker)  # the double fork stayed in the group: gone
            # setsid escapees: with a cgroup gone with it; without one, the job wrapper (a
            # child subreaper) passed the TERM on to them and reaped them before it exited.
            assert not descendants_by_marker(escaped)
            if use_cgroups:
                assert not cgroups.owned_names() & {attempt_id}
    finally:
        kill_pids(descendants_by_marker(escaped))


def test_a_setsid_escapee_does_not_outlive_a_completed_run_without_a_cgroup(env: Env, tmp_path: object) -> None:
    """(a) Regression: with ``execution.cgroups: off`` a ``setsid`` child of the job was in
    no group of ours and outlived the Run's completion. The job wrapper (a child subreaper)
    ends it before it exits; the Run keeps the command's exit code."""
    pid_file = os.path.join(str(tmp_path), "escaped.pid")
    env.task("t-escape-done", f"setsid sleep 300 & echo $! > {pid_file}; echo done")
    run_id, _ = env.start("t-escape-done")
    escaped = 0
    try:
        with env.controller(cgroups=CgroupManager.detect("off")) as controller:
            controller.notify()
            assert env.wait_status(run_id, "succeeded") == "succeeded"
            escaped = int(read_text(pid_file))
            assert not os.path.exists(f"/proc/{escaped}"), "the escaped child outlived the Run"
    finally:
        if escaped and alive(escaped):
            os.kill(escaped, 9)


def test_job_ignoring_term_int_hup_is_killed_after_the_grace(env: Env) -> None:
    env.task("t-stubborn", "trap '' TERM INT HUP; sleep 100032 & while :; do wait; done")
    run_id, attempt_id = env.start("t-stubborn")
    with env.controller() as controller:
        controller.notify()
        pid = _pid(env, attempt_id)
        assert wait_until(lambda: bool(descendants_by_marker("100032")), timeout=10)  # the traps are installed
        started = time.monotonic()
        env.cancel(run_id)
        controller.notify()
        assert env.wait_status(run_id, "cancelled") == "cancelled"
        elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 3.0  # SIGTERM grace waited, then SIGKILL; bounded
    assert not alive(pid) and not descendants_by_marker("100032")


def test_busy_forking_job_terminalises_only_when_everything_is_gone(env: Env) -> None:
    env.task("t-forky", "while :; do /bin/true; done")
    run_id, attempt_id = env.start("t-forky")
    with env.controller() as controller:
        controller.notify()
        pid = _pid(env, attempt_id)
        assert wait_until(lambda: len([s for s in _scan() if s.pgrp == pid and not s.exited]) > 2, timeout=10)  # it forks
        env.cancel(run_id)
        controller.notify()
        assert env.wait_status(run_id, "cancelled") == "cancelled"
        group = [s for s in _scan() if s.pgrp == pid and not s.exited]
        assert not group


def _scan() -> list:  # type: ignore[type-arg]
    from qinglong_edge.process.identity import scan_processes

    return scan_processes()


def test_command_name_with_parens_and_spaces(env: Env, tmp_path: object) -> None:
    exe = os.path.join(str(tmp_path), "x) (y z")
    shutil.copy(shutil.which("sleep") or "/bin/sleep", exe)
    env.store.run(lambda c: None)
    from qinglong_edge.contracts.ids import new_uuid4
    from qinglong_edge.local.tasks import create_task
    from tests.support.execution_env import OPERATOR

    env.store.run(lambda c: create_task(
        c, project_id="default", task_id="t-parens", name="t-parens",
        definition={"command": {"kind": "argv", "file": exe, "args": ["1000"]}},
        mutation_id=new_uuid4(), created_by=OPERATOR, now_ms=int(time.time() * 1000)))
    run_id, attempt_id = env.start("t-parens")
    with env.controller() as controller:
        controller.notify()
        pid = _pid(env, attempt_id)  # the job wrapper's: the Run's identity
        assert read_text(f"/proc/{pid}/comm") == "qinglong-job\n"
        command = command_of(pid)  # the wrapper's child runs the oddly named program
        assert command is not None
        assert wait_until(lambda: "x) (y z" in read_text(f"/proc/{command}/stat"), timeout=10)
        stat = read_proc_stat(command)
        assert stat is not None and stat.comm == "x) (y z" and stat.pgrp == pid and stat.ppid == pid
        env.cancel(run_id)
        controller.notify()
        assert env.wait_status(run_id, "cancelled") == "cancelled"
        assert not alive(pid) and not alive(command)


def test_deadline_times_the_run_out(env: Env) -> None:
    env.task("t-slow", "sleep 100033", timeout_ms=1000)
    run_id, attempt_id = env.start("t-slow")
    with env.controller() as controller:
        controller.notify()
        pid = _pid(env, attempt_id)
        assert env.wait_status(run_id, "timed_out", timeout=10) == "timed_out"
        assert not alive(pid)
    run, attempt = env.run_row(run_id), env.attempt_row(attempt_id)
    assert (run["cancel_reason"], run["error_code"]) == ("timeout", "EXECUTION_TIMED_OUT")
    assert run["cancel_requested_at_ms"] == attempt["deadline_at_ms"]
    assert attempt["status"] == "timed_out"
    aid = attempt_id
    assert _control_events(env, run_id)[-3:] == [
        ("run.cancel_requested", f"local-control:{aid}:timeout:6", ("reconciler", "local-deadline"),
         '{"reason":"timeout","from_status":"running","version":7}'),
        ("attempt.timed_out", f"local-control:{aid}:0:attempt", ("reconciler", "local-execution-control"),
         f'{{"attempt_id":"{aid}","from_status":"running","to_status":"timed_out","reason":"timeout","version":8}}'),
        ("run.timed_out", f"local-control:{aid}:0:run", ("reconciler", "local-execution-control"),
         '{"from_status":"running","to_status":"timed_out","reason":"timeout","version":9}'),
    ]


def test_queued_run_with_intent_is_cancelled_without_launching(env: Env) -> None:
    env.task("t-hog", "sleep 100034")
    env.task("t-queued", "echo should-not-run")
    hog_run, hog_attempt = env.start("t-hog")
    with env.controller(max_concurrent_runs=1) as controller:
        controller.notify()
        _pid(env, hog_attempt)
        run_id, attempt_id = env.start("t-queued")
        seen = controller.passes
        controller.notify()
        assert wait_until(lambda: controller.passes >= seen + 2, timeout=10)  # passes that could have launched it
        assert env.status(run_id) == "queued"  # the only slot is taken
        env.cancel(run_id)
        controller.notify()
        assert env.wait_status(run_id, "cancelled", timeout=3) == "cancelled"
        assert env.status(hog_run) == "running"
        env.cancel(hog_run)
        controller.notify()
        assert env.wait_status(hog_run, "cancelled") == "cancelled"
    attempt = env.attempt_row(attempt_id)
    assert (attempt["status"], attempt["pid"], attempt["executor_handle"], attempt["log_artifact_id"]) == (
        "cancelled", None, None, None)
    assert [e["type"] for e in env.events(run_id)] == [
        "run.created", "run.queued", "run.cancel_requested", "attempt.cancelled", "run.cancelled"]
    assert env.events(run_id)[-1]["payload_text"] == (
        '{"from_status":"queued","to_status":"cancelled","reason":"user","version":5}')


def test_natural_exit_racing_a_stop_records_the_exit(env: Env, tmp_path: object) -> None:
    go, term = os.path.join(str(tmp_path), "go"), os.path.join(str(tmp_path), "term")
    env.task("t-race", f"trap 'echo term > {term}' TERM; while [ ! -e {go} ]; do sleep 0.01; done; exit 7")
    run_id, attempt_id = env.start("t-race")
    # A long interval and no notify: the only wake-up is the job's own exit.
    with env.controller(control_interval_ms=3_600_000) as controller:
        controller.notify()
        _pid(env, attempt_id)
        assert wait_until(lambda: bool(descendants_by_marker("0.01")), timeout=10)  # the trap is installed
        env.cancel(run_id)  # intent committed; the controller is not told
        open(go, "w").close()  # the job exits by itself right away
        assert env.wait_status(run_id, "cancelled") == "cancelled"
    attempt = env.attempt_row(attempt_id)
    assert not os.path.exists(term)  # no signal was sent
    assert (attempt["exit_code"], attempt["callback_sequence"]) == (7, 1)  # the natural exit, recorded
    aid = attempt_id
    assert _control_events(env, run_id)[-2][:2] == ("attempt.cancelled", f"local-completion:{aid}:1:attempt")
    assert '"exit_code":7' in _control_events(env, run_id)[-2][3]


def test_missing_command_fails_the_launch(env: Env) -> None:
    from qinglong_edge.contracts.ids import new_uuid4
    from qinglong_edge.local.tasks import create_task
    from tests.support.execution_env import OPERATOR

    env.store.run(lambda c: create_task(
        c, project_id="default", task_id="t-missing", name="t-missing",
        definition={"command": {"kind": "argv", "file": "/nonexistent/tool"}},
        mutation_id=new_uuid4(), created_by=OPERATOR, now_ms=int(time.time() * 1000)))
    run_id, attempt_id = env.start("t-missing")
    with env.controller() as controller:
        controller.notify()
        assert env.wait_status(run_id, "failed") == "failed"
    assert env.run_row(run_id)["error_code"] == "EXECUTOR_START_FAILED"
    assert [e["type"] for e in env.events(run_id)][-2:] == ["attempt.failed", "run.failed"]
    assert env.attempt_row(attempt_id)["pid"] is None


def test_concurrency_is_capped(env: Env) -> None:
    env.task("t-cap", "sleep 100035")
    runs = [env.start("t-cap") for _ in range(3)]
    with env.controller(max_concurrent_runs=2) as controller:
        controller.notify()
        assert wait_until(lambda: sum(env.status(r) == "running" for r, _ in runs) == 2, timeout=10)
        seen = controller.passes
        assert wait_until(lambda: controller.passes >= seen + 2, timeout=10)  # passes that could have launched a third
        assert sorted(env.status(r) for r, _ in runs) == ["queued", "running", "running"]
        for run_id, _ in runs:
            env.cancel(run_id)
        controller.notify()
        assert all(env.wait_status(r, "cancelled") == "cancelled" for r, _ in runs)


def test_output_beyond_the_cap_is_discarded_and_the_job_is_not_blocked(env: Env) -> None:
    env.task("t-chatty", "i=0; while [ $i -lt 4000 ]; do echo 0123456789012345678901234567890123456789; "
                         "i=$((i+1)); done; echo done")
    run_id, attempt_id = env.start("t-chatty")
    with env.controller(max_log_bytes=1024) as controller:
        controller.notify()
        assert env.wait_status(run_id, "succeeded") == "succeeded"
    log = os.path.join(env.log_directory, f"{run_id}_{attempt_id}.log")
    data = read_text(log).encode("utf-8", "surrogateescape")
    assert len(data) <= 1024 and data.endswith(b"[qinglong-edge: output truncated]\n")


def test_shutdown_stops_running_jobs_with_reason_shutdown(env: Env) -> None:
    env.task("t-drain", "sleep 100036")
    run_id, attempt_id = env.start("t-drain")
    with env.controller() as controller:
        controller.notify()
        pid = _pid(env, attempt_id)
        assert env.wait_status(run_id, "running") == "running"
    assert not alive(pid)
    run = env.run_row(run_id)
    assert (run["status"], run["cancel_reason"]) == ("cancelled", "shutdown")
    assert [(e["type"], e["actor"]) for e in env.events(run_id)][-3:] == [
        ("run.cancel_requested", ("reconciler", "local-shutdown")),
        ("attempt.cancelled", ("reconciler", "local-execution-control")),
        ("run.cancelled", ("reconciler", "local-execution-control")),
    ]


def test_shutdown_drain_stops_every_run_at_once(env: Env) -> None:
    env.task("t-stubborn-2", "trap '' TERM INT HUP; sleep 100038 & while :; do wait; done")
    runs = [env.start("t-stubborn-2") for _ in range(2)]
    with env.controller(terminate_grace_ms=1000, kill_grace_ms=300) as controller:
        controller.on_intent("task.start", runs[0][0])  # the Local API's hook
        pids = [_pid(env, attempt_id) for _, attempt_id in runs]
        assert wait_until(lambda: len(descendants_by_marker("100038")) == 2, timeout=10)
        assert controller.stop_timeout_s == 3.3
        started = time.monotonic()
        assert controller.stop() is True
        elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 2.4  # one grace period for both, not one per Run
    assert not any(alive(p) for p in pids) and not descendants_by_marker("100038")
    assert [env.run_row(r)["cancel_reason"] for r, _ in runs] == ["shutdown", "shutdown"]
    assert [env.status(r) for r, _ in runs] == ["cancelled", "cancelled"]


def test_a_second_controller_on_the_same_database_is_refused(env: Env) -> None:
    # ADR-0372 decision 6: one controller holds process authority. A second one (another
    # `serve` on the same database) would adopt the first one's processes in its restart
    # recovery and stop them as a "shutdown" when it exits.
    from qinglong_edge.errors import EdgeError
    from qinglong_edge.execution.controller import ExecutionController

    env.task("t-hold", "sleep 30", timeout_ms=600_000)
    run_id, attempt_id = env.start("t-hold")
    with env.controller() as first:
        first.notify()
        assert env.wait_status(run_id, "running") == "running"
        second = ExecutionController(env.store, env.config(), work_directory=env.root)
        with pytest.raises(EdgeError) as refused:
            second.start()
        assert refused.value.code == "already_owned"
        second.stop(5)
        assert env.status(run_id) == "running" and alive(_pid(env, attempt_id))
        env.cancel(run_id)
        first.notify()
        assert env.wait_status(run_id, "cancelled") == "cancelled"
    third = ExecutionController(env.store, env.config(), work_directory=env.root)
    third.start()  # the lock went with the first controller's stop
    third.stop(5)
