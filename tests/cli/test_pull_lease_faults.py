"""Faults around the lease (issue 23 items 4, 7 and 8): a state file system that is full
while a job runs, a job wrapper killed with the agent (escapees ended through the cgroup at
re-adoption), a start-failure report answered ``already_starting``. The real CLI, real
job wrappers, real small file systems (tmpfs, root only) and the TLS cluster double with
short leases (6 s: a renewal every 2 s).
"""

from __future__ import annotations

import os
import pathlib
import signal
from typing import Any

import pytest

from tests.support.cluster_double import ClusterDouble, Fault
from tests.support.mounts import tmpfs
from tests.support.remote_env import RemoteEnv, dump
from tests.support.wait import wait_until


def _version(env: RemoteEnv, run_id: str) -> int:
    try:
        return env.cluster.lease_version(run_id)
    except KeyError:
        return 0


def _fill(directory: pathlib.Path) -> pathlib.Path:
    """Fill the file system of ``directory`` to the last block (ENOSPC from then on)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        chunk = b"\0" * 65536
        while True:
            try:
                os.write(fd, chunk)
            except OSError:
                break
        for size in (4096, 512, 1):
            while True:
                try:
                    os.write(fd, chunk[:size])
                except OSError:
                    break
    finally:
        os.close(fd)
    return filler


def test_a_full_state_file_system_loses_no_renewal_and_no_outcome(tmp_path: pathlib.Path,
                                                                  cluster: ClusterDouble) -> None:
    """Before: ENOSPC on the state file system for 5 s during a renewal: the granted renewal
    was not stored, the next one went out stale (409) and the job was killed although the
    cluster held a fresh lease. Now a renewal never needs the state file system (it is kept
    in memory and in the RAM lease file); the one write that does (the exit observed) waits
    for space, retried, with the current lease still renewed and never sent stale."""
    env = RemoteEnv(tmp_path, cluster)
    with tmpfs(env.state_dir, "16m"):
        task = env.gated_job("job")
        run_id = task.candidate["runId"]
        proc = env.spawn_json()
        try:
            env.wait_state("running_acknowledged")
            filler = _fill(env.state_dir)
            start = _version(env, run_id)
            assert wait_until(lambda: _version(env, run_id) >= start + 2, timeout=30)  # renewals need no state space
            env.release("job")  # its receipt cannot be published now: the outcome is what the parent reaped
            at_exit = _version(env, run_id)
            assert wait_until(lambda: _version(env, run_id) >= at_exit + 2, timeout=30)  # renewed while storage fails
            filler.unlink()
            outcome = env.finish(proc, timeout=60)
        finally:
            if proc.poll() is None:  # a failure above: nothing may keep the file system busy
                proc.kill()
                env.finish(proc)
    assert outcome.status == 0, dump(outcome)
    failures = outcome.events("storage_failed")
    assert failures and {e["code"] for e in failures} == {"storage_unavailable"}, dump(outcome)
    assert not outcome.events("call_failed") and not any(e.get("resynced") for e in outcome.events("renewed"))
    completion = env.cluster.completion(run_id)
    assert completion is not None and completion["status"] == "succeeded", dump(outcome)
    assert env.starts("job") == 1
    assert env.cluster.fence_reasons("lease-control") == []


def test_escapees_of_a_killed_wrapper_are_ended_through_the_cgroup_at_re_adoption(tmp_path: pathlib.Path,
                                                                                 cluster: ClusterDouble) -> None:
    """The agent and the job's wrapper are both SIGKILLed (an OOM kill of the group, say):
    nothing of ours is left to stop the job's children. The next pull re-adopts the record,
    finds the wrapper gone and ends what is left in the job's cgroup."""
    from qinglong_edge.process.cgroups import CgroupManager

    if not CgroupManager.detect("auto", pids_max=16).available:
        pytest.skip("no cgroup can be created here (CI runs as root with cgroups)")
    env = RemoteEnv(tmp_path, cluster)
    marker = "100123"  # the escapee's host pid is found by its argv (the job may run in a PID namespace)
    script = (f'echo started >> {env.trace("job")}; setsid sh -c \'trap "" TERM; exec sleep {marker}\' & '
              f'while [ ! -e {env.trace("job.go")} ]; do sleep 0.02; done')
    task = env.cluster.add_command_task(script)
    proc = env.spawn_json()
    record = env.wait_state("running_acknowledged")
    pid = wait_until(lambda: _by_argv(["sleep", marker]), timeout=20, what="the escaped sleep")
    from qinglong_edge.process.identity import decode_handle

    wrapper = decode_handle(record["executorHandle"]).identity.pid
    os.kill(proc.pid, signal.SIGKILL)
    env.finish(proc, timeout=10)
    os.kill(wrapper, signal.SIGKILL)
    assert wait_until(lambda: not os.path.exists(f"/proc/{wrapper}") or _zombie(wrapper), timeout=20)
    assert _alive(pid)  # outside the wrapper, in the cgroup only
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    assert not _alive(pid), "the escapee outlived the re-adoption"
    assert env.record()["state"] in ("completion_acknowledged", "recovery_required")
    assert env.starts("job") == 1
    assert env.cluster.completion(task.candidate["runId"]) is None or env.cluster.completion(
        task.candidate["runId"])["result"]["exitCode"] == 255  # no receipt: outcome lost


def _by_argv(argv: list[str]) -> int | None:
    wanted = "\0".join(argv).encode() + b"\0"
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if pathlib.Path(f"/proc/{entry}/cmdline").read_bytes() == wanted:
                    return int(entry)
            except OSError:
                continue
    return None


def _zombie(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}") and not _zombie(pid)


def test_a_start_failure_answered_already_starting_is_retried_not_acknowledged(tmp_path: pathlib.Path,
                                                                              cluster: ClusterDouble) -> None:
    """Issue 23 item 8: the cluster applied the start failure but its answer says
    ``already_starting`` (as if it had not): the agent takes that answer as invalid and
    asks again (the reference does), and records the acknowledgement only from a valid one."""
    env = RemoteEnv(tmp_path, cluster)
    task = env.quick_job("job", secrets={"API_KEY": "a-secret-value"})
    env.cluster.push_fault(Fault.error_500("secrets"))  # a start failure (T3)

    def already_starting(answer: Any) -> Any:
        snapshot = {key: answer["snapshot"][key] for key in ("runId", "attemptId", "leaseVersion", "leaseGeneration",
                                                              "callbackSequence")}
        return {**answer, "status": "already_starting",
                "snapshot": {**snapshot, "runStatus": "dispatching", "attemptStatus": "starting"}}

    env.cluster.push_fault(Fault.wrong_echo("start-failure", edit=already_starting))
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    failed = outcome.events("call_failed")
    assert [(e["operation"], e["code"]) for e in failed] == [("start-failure", "call_response_invalid")], dump(outcome)
    acknowledged = outcome.events("start_failure_acknowledged")
    assert len(acknowledged) == 1 and acknowledged[0]["status"] == "already_terminal"
    assert env.record()["state"] == "start_failure_acknowledged" and env.starts("job") == 0
    attempt = env.cluster.attempt(task.candidate["runId"])
    assert attempt.status == "failed"
