"""``pull`` executes what it accepts (issue 15): the real CLI in child processes, real job
wrappers and signals, the real journal, the TLS cluster double with short leases.

Each test ends with the invariants of "Never twice": a job started at most once (its
trace file), at most one completion accepted by the cluster, the record terminal, and
the job's files gone once its completion is acknowledged.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.support.cluster_double import ClusterDouble, Fault
from tests.support.jobs import alive, descendants_by_marker, kill_pids
from tests.support.remote_env import RemoteEnv, dump, event_names
from tests.support.wait import wait_until

SECRET = "s3cr3t-value-never-on-disk"


def _completions(cluster: ClusterDouble, run_id: str) -> int:
    """How many times the cluster applied a terminal outcome to the run (replays do not)."""
    terminal = {"run.succeeded", "run.failed", "run.cancelled", "run.timed_out"}
    return sum(1 for event in cluster.events(run_id) if event.type in terminal)


# -- the happy path ----------------------------------------------------------------------------------------

def test_a_job_runs_once_its_output_and_exit_code_reach_the_cluster_and_its_files_go(env: RemoteEnv) -> None:
    task = env.quick_job("job", exit_code=3, output="hello $GREETING from $BUNDLED",
                         env={"GREETING": "hi"}, secrets={"API_KEY": SECRET}, bundle={"BUNDLED": "the-bundle"})
    run_id = task.candidate["runId"]
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    assert outcome.cycles()[0]["status"] == "accepted"
    assert event_names(outcome) == ["starting_acknowledged", "launching", "started", "running_acknowledged",
                                    "exited", "uploaded", "completion_acknowledged"]
    exited = outcome.events("exited")[0]
    assert (exited["exitCode"], exited["source"]) == (3, "receipt")
    summary = outcome.summary()
    assert summary is not None and summary["records"] == {"completion_acknowledged": 1}
    assert (summary["inFlight"], summary["exitStatus"]) == (0, 0)
    # the cluster: one execution, the log as the job wrote it, its outcome mapping
    completion = env.cluster.completion(run_id)
    assert completion is not None and (completion["status"], completion["result"]["exitCode"]) == ("failed", 3)
    artifact = env.cluster.artifact(run_id)
    assert artifact is not None and artifact.data == b"hello hi from the-bundle\n" and artifact.truncated is False
    assert env.starts("job") == 1 and _completions(env.cluster, run_id) == 1
    # the device: the record acknowledged, its log, receipt and truncation fact gone
    assert env.record()["state"] == "completion_acknowledged"
    assert env.remote_logs() == [] and env.receipts() == []
    listing = env.cli("inbox", "list", "--json").lines()[0]["offers"][0]
    assert (listing["exitCode"], listing["logBytes"], listing["attemptId"]) == (3, None, task.candidate["attemptId"])


def test_a_secret_is_never_on_disk_in_output_or_in_inbox_show(env: RemoteEnv) -> None:
    """Spec README "Secrets": in memory and the job's environment only (the job proves it
    had it by its digest, never printing it)."""
    env.quick_job("job", output="$(printf %s \"$API_KEY\" | sha256sum | cut -c1-16)", secrets={"API_KEY": SECRET})
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    (stored,) = [env.cluster.artifact(r) for r in env.cluster.executions()]
    import hashlib

    assert stored is not None and stored.data.decode().strip() == hashlib.sha256(SECRET.encode()).hexdigest()[:16]
    shown = env.cli("inbox", "show", next(iter(env.inbox())), "--json")
    for text in (outcome.stdout, outcome.stderr, shown.stdout, shown.stderr):
        assert SECRET not in text
    for path in env.files_under():
        assert SECRET.encode() not in path.read_bytes(), path


def test_the_argv_form_runs_in_its_working_directory(env: RemoteEnv, tmp_path: pathlib.Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    task = env.cluster.add_command_task(["/bin/sh", "-c", 'pwd; echo "$0 $1" > marker', "argv0", "one"],
                                        working_directory=str(work))
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    artifact = env.cluster.artifact(task.candidate["runId"])
    assert artifact is not None and artifact.data == f"{work}\n".encode()
    assert (work / "marker").read_text() == "argv0 one\n"
    assert env.cluster.completion(task.candidate["runId"])["status"] == "succeeded"


def test_output_beyond_the_cap_keeps_the_head_and_reports_truncation(env: RemoteEnv) -> None:
    env.write_config(maxLogBytes=1024)
    task = env.cluster.add_command_task("i=0; while [ $i -lt 400 ]; do printf 'line %04d\\n' $i; i=$((i+1)); done")
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    artifact = env.cluster.artifact(task.candidate["runId"])
    assert artifact is not None and len(artifact.data) == 1024 and artifact.truncated is True
    assert artifact.data.startswith(b"line 0000\nline 0001\n")  # the head, raw, no notice line
    assert outcome.events("uploaded")[0]["truncated"] is True


def test_a_job_past_its_memory_limit_is_reported_out_of_memory(env: RemoteEnv) -> None:
    """Issue 24 item 3: the job (not its wrapper) runs in a memory leaf of
    ``execution.maxRunMemoryBytes``; allocating past it gets it OOM-killed there, the
    wrapper lives on and publishes 137, and ``pull --json`` says why."""
    from qinglong_edge.process.cgroups import CgroupManager

    if not CgroupManager.detect("auto", memory_max=8 << 20).memory_available:
        pytest.skip("no memory cgroup for jobs here")
    document = json.loads(env.config_path.read_text())
    document["execution"] = {"maxRunMemoryBytes": 8 << 20}
    env.config_path.write_text(json.dumps(document))
    task = env.cluster.add_command_task([sys.executable, "-I", "-S", "-c", "b = bytearray(64 << 20)"])
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    exited = outcome.events("exited")[0]
    assert (exited["exitCode"], exited["source"], exited["reason"]) == (137, "receipt", "out_of_memory"), exited
    completion = env.cluster.completion(task.candidate["runId"])
    assert completion is not None and (completion["status"], completion["result"]["exitCode"]) == ("failed", 137)


def test_a_job_that_fills_its_disk_costs_the_agent_no_record(tmp_path: pathlib.Path) -> None:
    """Issue 24 item 4: the state (journal, receipts, remote logs and the job's scratch
    directory) on one small file system, which the job fills. The wrapper's receipt
    cannot be written (tried 5 times, then "No receipt": the pull, its parent, has the
    exit status), journal writes fail cleanly (``storage_failed``) and are retried, the
    scratch directory goes once the job has ended, and the record ends as any other.
    The cluster's own 30 s leases (renewed every 10 s): the disk is full for a few seconds."""
    from tests.support.mounts import tmpfs

    with ClusterDouble(lease_duration_ms=30_000, renewal_duration_ms=30_000) as cluster:
        env = RemoteEnv(tmp_path, cluster)
        with tmpfs(env.state_dir, "8m"):
            _fill_the_disk(env)


def _fill_the_disk(env: RemoteEnv) -> None:
    task = env.cluster.add_command_task("head -c 16777216 /dev/zero > fill; echo filled; exit 5")
    outcome = env.run_to_end(timeout=90)
    assert outcome.status == 0, dump(outcome)
    exited = outcome.events("exited")[0]
    assert (exited["exitCode"], exited["source"]) == (5, "reaped"), exited
    assert env.record()["state"] == "completion_acknowledged"
    completion = env.cluster.completion(task.candidate["runId"])
    assert completion is not None and completion["result"]["exitCode"] == 5
    assert env.remote_logs() == [] and env.receipts() == []
    assert not list((env.state_dir / "logs" / "remote" / "work").iterdir())  # the scratch directory went


# -- stops -------------------------------------------------------------------------------------------------

def test_a_cluster_side_cancel_stops_the_job_and_completes_it_cancelled(env: RemoteEnv) -> None:
    task = env.gated_job("job")
    run_id = task.candidate["runId"]
    proc = env.spawn_json()
    env.wait_state("running_acknowledged")
    assert wait_until(lambda: env.starts("job") == 1, timeout=20)
    assert env.cluster.request_cancel(run_id) == "accepted"
    outcome = env.finish(proc, timeout=30)
    assert outcome.status == 0, dump(outcome)
    stop = outcome.events("stop_requested")[0]
    assert stop["reason"] == "user"
    stopped = outcome.events("stopped")[0]
    assert (stopped["result"], stopped["signal"]) == ("stopped", "SIGTERM")
    assert outcome.events("exited")[0]["exitCode"] == 143
    assert env.cluster.completion(run_id)["status"] == "cancelled"
    assert env.record()["state"] == "completion_acknowledged" and env.starts("job") == 1


def test_the_local_deadline_stops_the_job_and_the_cluster_records_timed_out(env: RemoteEnv) -> None:
    task = env.gated_job("job", timeout_ms=1000)
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    assert outcome.events("stopped")[0]["reason"] == "timeout"
    assert outcome.events("exited")[0]["exitCode"] == 143
    # one lease-control after the kill, so the cluster records the timeout
    assert env.cluster.completion(task.candidate["runId"])["status"] == "timed_out"


def test_a_job_that_exits_leaving_a_child_in_its_group_has_it_stopped_without_a_cgroup(env: RemoteEnv) -> None:
    """Regression: with no cgroup (an unprivileged cron pull, the shipped OpenWrt state) a
    background child the command left in its process group outlived the completion: the
    leader was reaped without stopping its group. Its leftovers are stopped first, as
    for Local Runs, while the unreaped leader still pins the group number. (The child is
    found by its argv from outside: an isolated job's pids are its PID namespace's.)"""
    document = json.loads(env.config_path.read_text())
    document["execution"] = {"cgroups": "off", "terminateGraceMs": 1000, "killGraceMs": 1000}
    env.config_path.write_text(json.dumps(document))
    marker = _marker()
    task = env.cluster.add_command_task(f"sleep {marker} & trap '' TERM; echo done")
    try:
        outcome = env.run_to_end()
        assert outcome.status == 0, dump(outcome)
        assert env.record()["state"] == "completion_acknowledged"
        assert not descendants_by_marker(marker), "the job's background child outlived its completion"
    finally:
        kill_pids(descendants_by_marker(marker))
    # The job wrapper (a child subreaper) ended the leftover before its receipt, so the
    # runner's own stop of the leftovers found nothing left to stop.
    assert [e["reason"] for e in outcome.events("stopped")] == []
    assert outcome.events("exited")[0]["exitCode"] == 0  # the command's own status, not the stop's
    assert env.cluster.completion(task.candidate["runId"])["status"] == "succeeded"


def _marker() -> str:
    """A ``sleep`` argument no other process has: its processes are found by it from outside."""
    return str(300_000_000 + int.from_bytes(os.urandom(3), "big"))


def _cgroups_off(env: RemoteEnv) -> None:
    """The shipped OpenWrt state: a cron pull as ``qinglong`` that cannot create cgroups."""
    document = json.loads(env.config_path.read_text())
    document["execution"] = {"cgroups": "off", "terminateGraceMs": 1000, "killGraceMs": 1000}
    env.config_path.write_text(json.dumps(document))


@pytest.mark.parametrize("escape", ["setsid", "double-fork"])
def test_an_escaped_child_does_not_outlive_the_completion_without_a_cgroup(env: RemoteEnv, escape: str) -> None:
    """(a), (c) Regression: a ``setsid`` child (or a double fork, then setsid) is in no group
    of ours; without a cgroup it outlived the job's completion and its receipt."""
    _cgroups_off(env)
    marker, flag = _marker(), env.trace("escaped.started")
    script = {"setsid": f"setsid sleep {marker} & echo done",
              "double-fork": f"( setsid sh -c 'echo started > {flag}; exec sleep {marker}' & ); "
                             f"while [ ! -s {flag} ]; do sleep 0.01; done; echo done"}[escape]
    task = env.cluster.add_command_task(script)
    try:
        outcome = env.run_to_end()
        assert outcome.status == 0, dump(outcome)
        assert not descendants_by_marker(marker), "the escaped child outlived the job's completion"
    finally:
        kill_pids(descendants_by_marker(marker))
    assert outcome.events("exited")[0]["exitCode"] == 0
    assert env.cluster.completion(task.candidate["runId"])["status"] == "succeeded"


def test_a_cancelled_job_leaves_no_setsid_escapee_without_a_cgroup(env: RemoteEnv) -> None:
    """(b) Regression: a cancel stopped the job's process group; its ``setsid`` child, in no
    group of ours and without a cgroup, survived the stop."""
    _cgroups_off(env)
    marker = _marker()
    task = env.cluster.add_command_task(f"setsid sleep {marker} & while :; do sleep 0.02; done")
    run_id = task.candidate["runId"]
    proc = env.spawn_json()
    try:
        env.wait_state("running_acknowledged")
        assert wait_until(lambda: descendants_by_marker(marker), timeout=20)
        assert env.cluster.request_cancel(run_id) == "accepted"
        outcome = env.finish(proc, timeout=30)
        assert outcome.status == 0, dump(outcome)
        assert not descendants_by_marker(marker), "the escaped child outlived the cancel"
    finally:
        kill_pids(descendants_by_marker(marker))
    stopped = outcome.events("stopped")[0]
    assert (stopped["reason"], stopped["result"], stopped["signal"]) == ("user", "stopped", "SIGTERM")
    assert outcome.events("exited")[0]["exitCode"] == 143
    assert env.cluster.completion(run_id)["status"] == "cancelled"


#: Runs a command where the kernel refuses every new user namespace (as on a device
#: without unprivileged user namespaces): the agent is root of a user namespace of its
#: own (its uid mapped to itself) whose ``user.max_user_namespaces`` is 0.
NO_USER_NAMESPACES = ["unshare", "-U", "-r", "sh", "-c", 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"',
                      "no-userns"]


def _without_isolation(env: RemoteEnv) -> None:
    """A device where job isolation cannot work: every pull of ``env`` runs where the kernel
    refuses new user namespaces, so its probe finds no isolation and remote jobs run as the
    agent's user, seeing its files (README "What a remote job can do"). (Writing a negative
    isolation answer into the runtime directory no longer does it: nothing a job could
    write there is trusted, :func:`test_a_planted_isolation_answer_does_not_turn_isolation_off`.)"""
    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    probe = subprocess.run([*NO_USER_NAMESPACES, "true"], capture_output=True, text=True, check=False, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"no user namespace for the test itself: {probe.stderr.strip()}")
    argv = env.argv
    env.argv = lambda *args: [*NO_USER_NAMESPACES, *argv(*args)]  # type: ignore[method-assign]


def test_a_planted_isolation_answer_does_not_turn_isolation_off(env: RemoteEnv) -> None:
    """Regression (issue 24): a job rewrote ``isolation.json`` in the runtime directory with
    ``"available":false`` and the next job ran unisolated. The runtime directory is hidden
    from isolated jobs now, and a negative answer is never read: the probe decides."""
    from qinglong_edge.process.isolation import probe_isolation
    from qinglong_edge.worker.journal.runtime import boot_id

    if not probe_isolation().available:
        pytest.skip("no job isolation here")
    env.runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
    answer = env.runtime / "isolation.json"
    answer.write_text(json.dumps({"bootId": boot_id(), "available": False, "reason": "planted"}) + "\n")
    answer.chmod(0o600)
    env.quick_job("job")
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    assert outcome.events("started")[0]["isolated"] is True
    assert json.loads(answer.read_text())["available"] is True  # the probe's own answer replaced it


@pytest.mark.parametrize("damage", ["symlink", "fifo", "file"])
def test_a_runtime_directory_replaced_by_something_else_is_refused_and_the_launch_goes_on(
        env: RemoteEnv, tmp_path: pathlib.Path, damage: str) -> None:
    """Issue 24 "Bad input": the journal's runtime directory replaced by a symlink (to a
    directory a job could control), a FIFO or a file. Never followed nor opened: one line
    (``pull: warning: runtime directory refused ...``, once per boot), the records go to
    the fallback ``<journal>/run``, and the job runs and completes."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    env.run_base.mkdir(exist_ok=True)
    {"symlink": lambda: env.runtime.symlink_to(elsewhere), "fifo": lambda: os.mkfifo(env.runtime, 0o600),
     "file": lambda: env.runtime.write_text("x" * 100_000)}[damage]()
    env.quick_job("job")
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    warnings = [line for line in outcome.stderr.splitlines() if "runtime directory refused" in line]
    assert len(warnings) == 1 and warnings[0].startswith("pull: warning: "), outcome.stderr
    assert env.record()["state"] == "completion_acknowledged" and env.starts("job") == 1
    assert list(elsewhere.iterdir()) == []  # nothing written through the symlink
    assert (env.journal / "run").is_dir()
    second = env.run_to_end()
    assert "runtime directory refused" not in second.stderr  # once per boot


#: What a job that can see the log directory (no isolation) puts where its log was.
PLANTED_LOGS = {
    "symlink": 'rm -f "$f"; ln -s /etc/hostname "$f"',
    "fifo": 'rm -f "$f"; mkfifo "$f"',
    "directory": 'rm -f "$f"; mkdir "$f"',
    # After the wrapper has copied "hi" (the job's own append would race that copy).
    "oversized": 'until grep -q hi "$f"; do sleep 0.02; done; head -c 10000 /dev/zero >> "$f"',
}


@pytest.mark.parametrize("planted", sorted(PLANTED_LOGS))
def test_a_job_that_replaces_its_own_log_still_completes(env: RemoteEnv, planted: str) -> None:
    """Regression: the upload opened whatever stood at the log's path. A symlink was an
    OSError out of the resident pull (``internal_error``, exit 70, at every later pull
    too: the record never ended), a FIFO hung it forever, a directory or a file past the
    cap (appended to by the job itself) was refused until the lease ran out, so the
    outcome was never reported. Now only a private regular file of ours is uploaded,
    at most ``maxLogBytes`` of it (``truncated``); anything else is replaced by an empty log."""
    _without_isolation(env)
    env.write_config(maxLogBytes=4096)
    task = env.cluster.add_command_task(
        f'echo hi; for f in ../../*/wlog-*.log; do {PLANTED_LOGS[planted]}; done; exit 3')
    outcome = env.run_to_end(timeout=45)
    assert outcome.status == 0, dump(outcome)
    assert outcome.events("started")[0]["isolated"] is False
    assert "Traceback" not in outcome.stderr
    assert env.record()["state"] == "completion_acknowledged"
    completion = env.cluster.completion(task.candidate["runId"])
    assert completion is not None and completion["result"]["exitCode"] == 3
    artifact = env.cluster.artifact(task.candidate["runId"])
    assert artifact is not None
    if planted == "oversized":
        assert len(artifact.data) == 4096 and artifact.data.startswith(b"hi\n") and artifact.truncated is True
    else:
        assert artifact.data == b""  # not the symlink's target, nothing from a FIFO or a directory
    assert env.remote_logs() == [] and env.receipts() == []


# -- start failures -----------------------------------------------------------------------------------------

def test_a_failed_secrets_call_is_a_start_failure_and_the_job_never_runs(env: RemoteEnv) -> None:
    task = env.quick_job("job", secrets={"API_KEY": SECRET})
    env.cluster.push_fault(Fault.error_500("secrets"))
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    failed = outcome.events("start_failed")[0]
    assert (failed["code"], failed["operation"]) == ("secrets_failed", "secrets")
    assert outcome.events("start_failure_acknowledged")
    attempt = env.cluster.attempt(task.candidate["runId"])
    assert (attempt.status, attempt.error_code) == ("failed", "EXECUTOR_START_FAILED")
    assert env.starts("job") == 0 and env.record()["state"] == "start_failure_acknowledged"


def test_a_missing_working_directory_is_a_start_failure(env: RemoteEnv, tmp_path: pathlib.Path) -> None:
    env.quick_job("job", working_directory=str(tmp_path / "missing"))
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    assert outcome.events("start_failed")[0]["code"] == "spawn_failed"
    record = env.record()
    assert record["state"] == "start_failure_acknowledged" and "logArtifactId" in record  # it got to launching
    assert env.starts("job") == 0


# -- the agent's lifetime -----------------------------------------------------------------------------------

def test_sigterm_leaves_the_job_running_and_the_next_pull_adopts_it(env: RemoteEnv) -> None:
    task = env.gated_job("job")
    proc = env.spawn_json()
    env.wait_state("running_acknowledged")
    outcome = env.stop(proc, signal.SIGTERM)
    assert outcome.status == 0, dump(outcome)
    summary = outcome.summary()
    assert summary is not None and (summary["aborted"], summary["inFlight"]) == ("SIGTERM", 1)
    assert env.record()["state"] == "running_acknowledged"
    handover = json.loads((env.runtime / "handover.json").read_text())  # the next pull skips its splay
    assert (handover["inFlight"], handover["signal"]) == (1, "SIGTERM")
    env.release("job")  # the job was left running: it ends now, with nobody watching
    again = env.run_to_end()
    assert again.status == 0, dump(again)
    assert not (env.runtime / "handover.json").exists()  # taken by the new owner
    adopted = again.events("adopted")[0]
    assert adopted["pid"] == outcome.events("started")[0]["pid"]
    assert again.events("exited")[0]["source"] == "receipt"
    assert env.cluster.completion(task.candidate["runId"])["status"] == "succeeded"
    assert env.starts("job") == 1


def test_sigkill_while_the_job_runs_converges_to_one_completion(env: RemoteEnv) -> None:
    task = env.gated_job("job", exit_code=4)
    proc = env.spawn_json()
    env.wait_state("running_acknowledged")
    outcome = env.stop(proc, signal.SIGKILL)
    assert outcome.status == -signal.SIGKILL
    again = env.spawn_json()
    assert wait_until(lambda: env.cluster.lease_version(task.candidate["runId"]) >= 2, timeout=20)  # re-adopted: renewed at once
    env.release("job")
    final = env.finish(again, timeout=30)
    assert final.status == 0, dump(final)
    assert env.cluster.completion(task.candidate["runId"])["result"]["exitCode"] == 4
    assert env.starts("job") == 1 and _completions(env.cluster, task.candidate["runId"]) == 1


def test_a_cron_pull_finding_a_resident_owner_exits_at_once(env: RemoteEnv) -> None:
    env.gated_job("job")
    resident = env.spawn_json()
    env.wait_state("running_acknowledged")
    env.write_config(splayMaxMs=60_000)
    started = time.monotonic()
    cron = env.pull("--json", timeout=20)  # with its splay: still at once (the owner is checked first)
    # (the resident pull keeps its config: it read it at start)
    assert (cron.status, cron.last()) == (0, {"status": "busy", "code": "already_owned"})
    assert time.monotonic() - started < 5
    env.release("job")
    assert env.finish(resident).status == 0


def test_a_lost_renewal_answer_does_not_fence_the_job(env: RemoteEnv) -> None:
    task = env.gated_job("job")
    env.cluster.push_fault(Fault.drop("lease-control"))
    proc = env.spawn_json()
    run_id = task.candidate["runId"]
    # the renewal committed (version 2), its answer lost; the next one is fenced and resynced

    def resynced() -> bool:
        try:
            return env.cluster.lease_version(run_id) >= 3
        except KeyError:  # not claimed yet
            return False

    assert wait_until(resynced, timeout=30)
    env.release("job")
    outcome = env.finish(proc, timeout=30)
    assert outcome.status == 0, dump(outcome)
    assert any(e.get("resynced") for e in outcome.events("renewed"))
    assert env.cluster.completion(run_id)["status"] == "succeeded"
    assert [e["operation"] for e in outcome.events("call_failed")][:1] == ["lease-control"]


def test_a_lost_lease_stops_the_job(env: RemoteEnv) -> None:
    task = env.gated_job("job")
    proc = env.spawn_json()
    record = env.wait_state("running_acknowledged")
    env.cluster.state.expire_lease(record["offer"]["offerId"])
    outcome = env.finish(proc, timeout=30)
    assert outcome.status == 0, dump(outcome)
    assert outcome.events("stopped")[0]["reason"] == "lease_lost"
    final = env.record()
    assert (final["state"], final["recoveryReason"]) == ("recovery_required", "lease_lost_local_execution_stopped")
    assert env.cluster.completion(task.candidate["runId"]) is None and env.starts("job") == 1


# -- operator commands while resident -------------------------------------------------------------------------

def test_inbox_commands_while_resident(env: RemoteEnv) -> None:
    task = env.gated_job("job")
    proc = env.spawn_json()
    record = env.wait_state("running_acknowledged")
    offer_id = record["offer"]["offerId"]
    listing = env.cli("inbox", "list", "--json")
    (row,) = listing.lines()[0]["offers"]
    assert (row["state"], row["exitCode"]) == ("running_acknowledged", None)
    assert row["logPath"].endswith(".log") and row["logBytes"] == len("hello\n")
    refused = env.cli("inbox", "discard", offer_id, "--yes", "--json")
    assert (refused.status, refused.lines()[0]["code"]) == (75, "in_flight")
    forced = env.cli("inbox", "discard", offer_id, "--yes", "--force", "--json")
    assert forced.status == 0, forced.stdout + forced.stderr
    answer = forced.lines()[0]
    assert (answer["by"], answer["state"], answer["exitCode"]) == ("resident", "completion_acknowledged", 143)
    outcome = env.finish(proc, timeout=30)
    assert outcome.status == 0, dump(outcome)
    assert outcome.events("discarded") and env.inbox() == {}
    assert env.cluster.completion(task.candidate["runId"])["result"]["exitCode"] == 143
    assert env.remote_logs() == [] and env.receipts() == []


def test_a_forced_discard_with_no_pull_running_leaves_nothing_of_the_record_in_the_runtime_directory(
        env: RemoteEnv) -> None:
    """Regression (issue 27): with no pull running (it was SIGKILLed), ``inbox discard
    --force`` stopped the job and removed the record, but its lease file (``job.*.json``)
    stayed in the runtime directory for good (nothing prunes a file of a record that is
    gone): one more file in RAM per forced discard, until a reboot."""
    env.gated_job("job")
    proc = env.spawn_json()
    offer_id = env.wait_state("running_acknowledged")["offer"]["offerId"]
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    from qinglong_edge.worker.remote.job_files import outcome_name
    from qinglong_edge.worker.remote.lease import lease_name, stopped_name

    assert (env.runtime / lease_name(offer_id)).exists()
    forced = env.cli("inbox", "discard", offer_id, "--yes", "--force", "--json")
    assert forced.status == 0, forced.stdout + forced.stderr
    assert forced.lines()[0]["stop"].startswith("stopped"), forced.stdout
    assert env.inbox() == {} and env.remote_logs() == [] and env.receipts() == []
    for name in (lease_name(offer_id), stopped_name(offer_id), outcome_name(offer_id)):
        assert not (env.runtime / name).exists(), name
    assert env.starts("job") == 1


def test_two_forced_discards_at_once_both_get_an_answer(env: RemoteEnv) -> None:
    """Regression: the second request replaced the first one's file (one name per offer),
    so the first command waited out its whole budget and said exit 75 ``already_owned``
    ("the request stays") although the record was discarded. The answer to either
    request now answers both."""
    env.gated_job("job")
    proc = env.spawn_json()
    offer_id = env.wait_state("running_acknowledged")["offer"]["offerId"]
    argv = env.entry.argv("--config", str(env.config_path), "inbox", "discard", offer_id, "--yes", "--force", "--json")
    started = time.monotonic()
    commands = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=env.entry.environment(None), cwd=env.entry.cwd) for _ in range(2)]
    answers = [(c.wait(timeout=60), c.communicate()[0].decode()) for c in commands]
    assert time.monotonic() - started < 10, answers  # not the 15 s budget of an unanswered request
    statuses = sorted(status for status, _ in answers)
    assert statuses in ([0, 0], [0, 65]), answers  # 65: not_found, served after the other one
    outcome = env.finish(proc, timeout=30)
    assert outcome.status == 0, dump(outcome)
    assert env.inbox() == {} and env.starts("job") == 1


# -- SIGKILL at the runner's crash points -----------------------------------------------------------------------

CRASH_POINTS = {
    # point: (what the next pull ends with, whether the command ran)
    "runner.launching": ("start_failure_acknowledged", False),
    "runner.started": ("completion_acknowledged", False),
    "runner.released": ("completion_acknowledged", True),
    "runner.running_acknowledged": ("completion_acknowledged", True),
    "runner.exited": ("completion_acknowledged", True),
    "runner.uploaded": ("completion_acknowledged", True),
    "runner.completion_answered": ("completion_acknowledged", True),
    "runner.completion_acknowledged": ("completion_acknowledged", True),
}


@pytest.mark.parametrize("point", sorted(CRASH_POINTS))
def test_sigkill_at_a_runner_crash_point_converges(env: RemoteEnv, point: str) -> None:
    final_state, ran = CRASH_POINTS[point]
    task = env.quick_job("job")
    run_id = task.candidate["runId"]
    crashed = env.pull("--json", env={"QINGLONG_EDGE_CRASHPOINT": point})
    assert crashed.status == 137, dump(crashed)
    if point == "runner.started":  # (at runner.launching no wrapper was started yet)
        from qinglong_edge.process.identity import decode_handle

        wrapper = decode_handle(env.record()["executorHandle"]).identity.pid
        assert wait_until(lambda: not alive(wrapper))  # it read end of file on its barrier and exited 125
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    assert env.record()["state"] == final_state
    assert wait_until(lambda: env.starts("job") == (1 if ran else 0), timeout=5)
    attempt = env.cluster.attempt(run_id)
    if final_state == "completion_acknowledged":
        expected = "succeeded" if ran else "failed"  # never released: the wrapper exited 125, no receipt
        assert attempt.completion is not None and attempt.completion["status"] == expected
        accepted = [x for x in env.cluster.exchanges_for("completion") if x.status == 200]
        assert {x.json()["callbackSequence"] for x in accepted} == {1}  # one completion, replayed at most
    else:
        assert (attempt.status, attempt.error_code) == ("failed", "EXECUTOR_START_FAILED")
    assert env.remote_logs() == [] and env.receipts() == []


def test_the_journal_holds_no_half_written_record_after_any_of_them(env: RemoteEnv) -> None:
    env.quick_job("job")
    env.pull("--json", env={"QINGLONG_EDGE_CRASHPOINT": "offer_update.tmp_partial"})
    assert env.run_to_end().status == 0
    assert not [p for p in env.journal.iterdir() if p.name.endswith(".tmp")]
    assert json.loads((env.journal / "offers" / f"{next(iter(env.inbox()))}.json").read_bytes())["state"] == \
        "completion_acknowledged"


# -- isolation -------------------------------------------------------------------------------------------------

def test_an_isolated_job_cannot_read_the_credential_or_the_journal(env: RemoteEnv) -> None:
    from qinglong_edge.process.isolation import probe_isolation

    probe = probe_isolation()
    if not probe.available:
        pytest.skip(f"no isolation here: {probe.reason}")
    credential = env.files["credentialFile"]
    task = env.cluster.add_command_task(
        f"cat {credential} 2>/dev/null && echo READ; ls {env.journal}/offers 2>/dev/null | wc -l; echo done")
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    assert outcome.events("started")[0]["isolated"] is True
    artifact = env.cluster.artifact(task.candidate["runId"])
    assert artifact is not None and artifact.data == b"0\ndone\n"
    assert env.cluster.token.encode() not in artifact.data
    assert os.path.exists(credential)


# -- every runner crash point (the slower tier) ---------------------------------------------------------------

def _sweep_params() -> list[object]:
    from qinglong_edge.crashpoints import RUNNER_STEPS

    points = [f"runner.{step}" for step in RUNNER_STEPS] + ["session.heartbeat_answered"]
    return [pytest.param(point, marks=() if point in CRASH_POINTS else (pytest.mark.matrix,)) for point in points]


@pytest.mark.parametrize("point", _sweep_params())
def test_sigkill_at_every_crash_point_converges(env: RemoteEnv, point: str, tmp_path: pathlib.Path) -> None:
    """Each named boundary (crashpoints.py RUNNER_STEPS): killed there, the next pull
    converges; the job ran at most once and the cluster applied at most one outcome."""
    step = point.split(".", 1)[1]
    if point == "session.heartbeat_answered":
        assert env.run_to_end().status == 0  # registers
        session = env.session()
        assert session is not None
        state = json.loads((env.runtime / "session.json").read_bytes())
        state["session"]["heartbeatAtMs"] -= 60_000  # a heartbeat due, as at every cron minute
        (env.runtime / "session.json").write_text(json.dumps(state))
        assert env.pull("--json", env={"QINGLONG_EDGE_CRASHPOINT": point}).status == 137
        state = json.loads((env.runtime / "session.json").read_bytes())
        state["session"]["heartbeatAtMs"] -= 60_000
        (env.runtime / "session.json").write_text(json.dumps(state))
        again = env.run_to_end()
        assert again.status == 0, dump(again)
        # the lost answer was resynced with expectedVersion + 1: the same session goes on
        assert again.last()["session"]["action"] == "heartbeat"
        assert env.session()["sessionId"] == session["sessionId"]
        return
    if step.startswith("start_failure") or step == "start_failed":
        task = env.quick_job("job", working_directory=str(tmp_path / "missing"))
        expected = "start_failure_acknowledged"
    elif step == "recovery_required":
        task = env.gated_job("job")
        proc = env.spawn_json(env={"QINGLONG_EDGE_CRASHPOINT": point})
        record = env.wait_state("running_acknowledged")
        env.cluster.state.expire_lease(record["offer"]["offerId"])
        assert env.finish(proc).status == 137
        assert env.run_to_end().status == 0
        final = env.record()
        assert (final["state"], final["recoveryReason"]) == ("recovery_required", "lease_lost_local_execution_stopped")
        assert env.starts("job") == 1 and env.cluster.completion(task.candidate["runId"]) is None
        return
    elif step == "stopped":
        task = env.gated_job("job", timeout_ms=1000)
        expected = "completion_acknowledged"
    else:
        task = env.quick_job("job", secrets={"API_KEY": SECRET})
        # killed at the barrier (written, or the wrapper held): the command never ran
        expected = "start_failure_acknowledged" if step in ("launching", "held") else "completion_acknowledged"
    crashed = env.pull("--json", env={"QINGLONG_EDGE_CRASHPOINT": point})
    assert crashed.status == 137, dump(crashed)
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    assert env.record()["state"] == expected
    run_id = task.candidate["runId"]
    assert _completions(env.cluster, run_id) == 1
    assert env.starts("job") <= 1
    assert env.remote_logs() == [] and env.receipts() == []


@pytest.mark.matrix
def test_a_failing_session_call_backs_off_while_resident(env: RemoteEnv) -> None:
    """No busy loop: heartbeats refused (503 without Retry-After) while a job runs are tried
    again with backoff, and the job is still supervised to its end."""
    env.write_config(heartbeatIntervalMs=5000, sessionLeaseDurationMs=60_000)
    task = env.gated_job("job")
    proc = env.spawn_json()
    env.wait_state("running_acknowledged")
    env.cluster.push_fault(*[Fault.status_answer(503, "not_ready", op="heartbeat") for _ in range(200)])
    # The scenario is a stretch of real time: 9 s, past the 5 s interval; how many heartbeats
    # were refused in it bounds their rate (a few, each followed by a backoff: no busy loop).
    time.sleep(9)
    refused = [x for x in env.cluster.exchanges_for("heartbeat") if x.fault == "status"]
    assert 1 <= len(refused) <= 10, len(refused)
    env.release("job")
    outcome = env.finish(proc, timeout=30)
    assert outcome.status == 0, dump(outcome)  # a refused heartbeat while the session lease runs: "stale"
    assert env.cluster.completion(task.candidate["runId"])["status"] == "succeeded"
