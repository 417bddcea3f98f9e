"""Issue 23 item 4, damaged runtime files, and "Bad input": a runtime directory that is
missing, read-only, full or full of garbage. The real CLI against the TLS cluster double,
real job wrappers, real files and real (tmpfs) mounts.

Before: a zero-length ``attempt.json`` (a power loss with the runtime directory on disk)
made every pull exit 73 for good, and doctor did not see it. Now no damaged runtime file
is a permanent error: docs/worker/journal.md "Runtime files" says what each damaged file
means; doctor names them (``runtime_files``).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
from typing import Any

import pytest

from tests.support.cluster_double import ClusterDouble
from tests.support.mounts import tmpfs
from tests.support.remote_env import RemoteEnv, dump
from tests.support.wait import wait_until


def _damage(path: pathlib.Path, how: str) -> None:
    whole = path.read_bytes() if path.exists() else b'{"schemaVersion":1,"x":"' + b"y" * 40 + b'"}\n'
    data = {"empty": b"", "truncated": whole[: max(1, len(whole) // 2)], "garbage": b"\x00\xfe not json \xff\n"}[how]
    path.write_bytes(data)
    path.chmod(0o600)


def _check(env: RemoteEnv, name: str) -> dict[str, Any]:
    doctor = env.cli("doctor", "--json")
    assert "Traceback" not in doctor.stderr, doctor.stderr
    (check,) = [c for c in doctor.lines()[0]["checks"] if c["name"] == name]
    return dict(check)


def _no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text, text


@pytest.mark.parametrize("how", ["empty", "truncated", "garbage"])
def test_a_damaged_attempt_marker_counts_once_and_never_wedges_the_pull(env: RemoteEnv, how: str) -> None:
    first = env.pull("--json")
    assert first.last()["status"] == "idle", dump(first)  # no task: the claim is kept
    claim = env.claim()
    assert claim is not None and claim["attemptCount"] == 0
    marker = env.runtime / "attempt.json"
    marker.write_text(json.dumps({"schemaVersion": 1, "offerId": claim["offerId"], "revision": claim["revision"],
                                  "startedAtMs": claim["updatedAtMs"]}))
    _damage(marker, how)
    seen = _check(env, "runtime_files")
    assert seen["ok"] is False and "attempt.json" in seen["detail"], seen
    assert "an attempt of unknown outcome" in seen["detail"]
    for _ in range(2):
        outcome = env.pull("--json")
        assert outcome.status == 0, dump(outcome)
        _no_traceback(outcome.stderr)
        assert outcome.last()["status"] == "idle"
    after = env.claim()
    assert after is not None and after["offerId"] == claim["offerId"] and after["attemptCount"] == 1  # once
    assert not marker.exists()
    assert _check(env, "runtime_files")["ok"] is True


@pytest.mark.parametrize("how", ["empty", "garbage", "missing"])
def test_a_lost_session_record_with_a_job_in_flight_re_registers_its_session_not_a_new_one(
        env: RemoteEnv, how: str) -> None:
    """A new session would fence the running job's lease (the cluster replaces its session
    row); the session of the record in flight is registered again instead (a register
    replay: the row comes back unchanged), and the job runs once to its completion."""
    task = env.gated_job("job")
    resident = env.spawn_json()
    try:
        env.wait_state("running_acknowledged", timeout=30)
        stopped = RemoteEnv.stop(resident)
        assert stopped.status == 0, dump(stopped)
        row = env.cluster.state.sessions[env.cluster.worker_id]
        before = (row.session_id, row.generation, len(env.cluster.state.replaced_sessions))
        session = env.runtime / "session.json"
        if how == "missing":
            session.unlink()
        else:
            _damage(session, how)
            assert "session.json" in _check(env, "runtime_files")["detail"]
    finally:
        env.release("job")
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    _no_traceback(outcome.stderr)
    row = env.cluster.state.sessions[env.cluster.worker_id]
    assert (row.session_id, row.generation, len(env.cluster.state.replaced_sessions)) == before
    assert outcome.cycles()[0]["session"]["action"] == "registered"  # the replay, same session id
    assert outcome.cycles()[0]["session"]["sessionId"] == before[0]
    assert env.record()["state"] == "completion_acknowledged"
    assert env.starts("job") == 1
    assert env.cluster.completion(task.candidate["runId"]) is not None


def test_a_damaged_session_record_with_nothing_in_flight_registers_a_new_session(env: RemoteEnv) -> None:
    assert env.pull("--json").status == 0
    generation = env.cluster.state.sessions[env.cluster.worker_id].generation
    _damage(env.runtime / "session.json", "garbage")
    outcome = env.pull("--json")
    assert outcome.status == 0, dump(outcome)
    assert outcome.last()["session"]["action"] == "registered"
    assert env.cluster.state.sessions[env.cluster.worker_id].generation == generation + 1


def test_a_runtime_directory_full_of_garbage_is_named_by_doctor_and_work_goes_on(env: RemoteEnv) -> None:
    env.quick_job("first")
    assert env.run_to_end().status == 0
    present = sorted(p.name for p in env.runtime.iterdir() if not p.name.startswith("."))
    assert {"owner.json", "session.json", "identity.json", "isolation.json"} <= set(present), present
    assert any(name.startswith("wrapper-") for name in present) and any(n.startswith("outcome.") for n in present)
    for name in present:
        _damage(env.runtime / name, "garbage")
    for extra in ("handover.json", "notice.daily-expiry-check", "discard.0123456789abcdef.request"):
        _damage(env.runtime / extra, "garbage")
    seen = _check(env, "runtime_files")
    assert seen["ok"] is False
    for name in [*present, "notice.daily-expiry-check", "discard.0123456789abcdef.request"]:
        assert f"{name}: garbage" in seen["detail"], (name, seen["detail"])
    task = env.quick_job("second")
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    _no_traceback(outcome.stderr)
    assert outcome.cycles()[0]["status"] == "accepted" and env.starts("second") == 1
    assert env.cluster.completion(task.candidate["runId"]) is not None
    listing = env.cli("inbox", "list")
    assert listing.status == 0, listing.stderr  # the first record's exit-code note is garbage: no exit code
    left = _check(env, "runtime_files")
    # What a pull rewrote is repaired; the first record's note stays until the record goes.
    assert "session.json" not in left["detail"] and "attempt.json" not in left["detail"]
    assert "discard.0123456789abcdef.request" not in left["detail"]  # dropped by the resident pull


def _remount(path: pathlib.Path, mode: str) -> None:
    proc = subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], capture_output=True, text=True,
                          check=False, timeout=30)
    if proc.returncode != 0:
        pytest.skip(f"cannot remount {mode}: {proc.stderr.strip()}")


@pytest.mark.parametrize("fault", ["read_only", "full"])
def test_a_read_only_or_full_runtime_directory_is_one_line_and_nothing_is_sent(tmp_path: pathlib.Path,
                                                                               cluster: ClusterDouble,
                                                                               fault: str) -> None:
    env = RemoteEnv(tmp_path, cluster)
    with tmpfs(env.run_base, "64k"):
        env.run_base.chmod(0o700)
        first = env.pull("--json")  # a session is registered; its records are in the tmpfs
        assert first.status == 0, dump(first)
        claim = env.claim()
        assert claim is not None
        if fault == "read_only":
            _remount(env.run_base, "ro")
        else:
            with contextlib.suppress(OSError), open(env.run_base / "filler", "wb") as handle:
                while True:
                    handle.write(b"\0" * 4096)
        try:
            sent = len(env.cluster.exchanges_for("offers"))
            env.cluster.add_command_task("echo never")
            outcome = env.pull()
            _no_traceback(outcome.stdout, outcome.stderr)
            assert outcome.status in (73, 74), (outcome.status, outcome.stdout, outcome.stderr)
            # One line, to the log every time (the directory cannot remember that it said it).
            (line,) = outcome.stderr.splitlines()
            assert outcome.stdout == ""
            assert str(env.run_base) in line and "worker.runtimeDirectory" in line, line
            # The attempt marker could not be written first: the claim was not sent.
            assert len(env.cluster.exchanges_for("offers")) == sent
            assert env.claim() == claim
        finally:
            if fault == "read_only":
                _remount(env.run_base, "rw")
            else:
                os.unlink(env.run_base / "filler")
        again = env.pull("--json")
        assert again.status == 0 and again.last()["status"] == "accepted", dump(again)
        assert wait_until(lambda: env.state() == "completion_acknowledged", timeout=30)


def test_a_runtime_directory_removed_under_a_running_job_is_made_again_and_the_job_lives(env: RemoteEnv) -> None:
    """Regression (issue 27): ``rm -rf`` of the runtime directory (an operator clearing
    caches, a tmpfiles clean-up) while a resident pull ran a job: every later write went to
    the removed directory (ENOENT), so the job's lease file was never renewed, its wrapper
    stopped it at the old lease's end although the cluster's lease was live, and the stop
    was reported as a completion, exit 143 ``failed`` (the wrapper's mark could not be
    made either); the pull then exited 75. The directory is now made again at its path."""
    task = env.gated_job("job")
    proc = env.spawn_json()
    env.wait_state("running_acknowledged")
    import shutil

    shutil.rmtree(env.runtime)
    run_id = task.candidate["runId"]
    version = env.cluster.lease_version(run_id)
    # two renewals later (every 2 s here), past the old lease file's stop time
    assert wait_until(lambda: env.cluster.lease_version(run_id) >= version + 4, timeout=30)
    assert env.starts("job") == 1 and env.state() == "running_acknowledged"
    env.release("job")
    outcome = env.finish(proc, timeout=60)
    assert outcome.status == 0, dump(outcome)
    assert not outcome.events("storage_failed"), dump(outcome)
    assert env.cluster.completion(run_id)["result"]["exitCode"] == 0
    assert env.runtime.is_dir() and (env.runtime.stat().st_mode & 0o777) == 0o700
