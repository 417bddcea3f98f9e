"""The job wrapper's lease stop (step 5a; issue 23 item 4): a remote job's wrapper reads
the agent's per-job lease file (worker/remote/lease.py) and stops the job itself -- TERM, the
lease's terminate grace, SIGKILL -- at its ``stopAtBootMs``, unless the agent moved that
later meanwhile. Real wrappers, real commands, real files and the real boot clock.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import pytest

from qinglong_edge.clock import boot_id, boot_ms
from qinglong_edge.errors import ExecutionError
from qinglong_edge.process import wrapper
from qinglong_edge.process.logs import read_receipt
from qinglong_edge.process.spawn import JobSpec, Publication, start_job
from qinglong_edge.worker.remote.lease import JobLease
from tests.support.jobs import reap


def _lease(tmp: pathlib.Path, stop_in_ms: int, *, term: int = 300, kill: int = 200, boot: str | None = None) -> None:
    """Write the lease file (as the agent does) with its stop ``stop_in_ms`` from now."""
    now = boot_ms()
    data = JobLease(offer_id="offer-1", attempt_id="attempt-1", lease_generation=1, lease_version=2,
                    renewed_at_ms=1, expires_at_ms=6001, boot_id=boot or boot_id() or "unknown", sent_boot_ms=now,
                    duration_ms=6000, expires_boot_ms=now + stop_in_ms + term + kill + 500,
                    stop_at_boot_ms=max(0, now + stop_in_ms), terminate_grace_ms=term, kill_grace_ms=kill,
                    starting_boot_ms=None, started_boot_ms=now).to_bytes()
    temp = tmp / "job.lease.tmp"
    temp.write_bytes(data)
    temp.chmod(0o600)
    os.replace(temp, tmp / "job.lease")


def _spec(tmp: pathlib.Path, script: str) -> JobSpec:
    receipt = Publication(str(tmp / "receipts" / "r.json"), b'{"schemaVersion":1,"attemptId":"attempt-1","startedAtMs":1')
    return JobSpec(["/bin/sh", "-c", script], {"PATH": "/usr/bin:/bin"}, str(tmp), str(tmp / "logs" / "job.log"),
                   1 << 20, receipt=receipt, started_at_ms=1, terminate_grace_ms=5000, kill_grace_ms=1000,
                   lease_file=str(tmp / "job.lease"), lease_stop_file=str(tmp / "job.stopped"))


def _exit_code(tmp: pathlib.Path) -> int:
    raw = read_receipt(str(tmp / "receipts" / "r.json"))
    assert raw is not None
    code: int = json.loads(raw)["exitCode"]
    return code


def test_a_lease_that_is_not_moved_on_stops_the_job_by_its_expiry(tmp_path: pathlib.Path) -> None:
    _lease(tmp_path, 400)
    lease = json.loads((tmp_path / "job.lease").read_bytes())
    job = start_job(_spec(tmp_path, "echo started; while :; do sleep 0.02; done"))
    try:
        job.release()
        assert job.process.wait(10) == 143  # TERM (forwarded to the group, once)
    finally:
        reap(job.process)
    assert boot_ms() <= lease["expiresBootMs"] + 1000  # gone by the expiry (the wait adds a little)
    assert (tmp_path / "job.stopped").read_bytes() == b"lease\n"
    assert _exit_code(tmp_path) == 143


def test_a_command_that_ignores_term_is_killed_after_the_leases_grace(tmp_path: pathlib.Path) -> None:
    _lease(tmp_path, 300, term=300, kill=200)
    lease = json.loads((tmp_path / "job.lease").read_bytes())
    job = start_job(_spec(tmp_path, "trap '' TERM; echo started; while :; do sleep 0.02; done"))
    try:
        job.release()
        assert job.process.wait(10) == 137
        ended = boot_ms()
    finally:
        reap(job.process)
    assert ended <= lease["expiresBootMs"] + 1000
    assert (tmp_path / "job.stopped").exists() and _exit_code(tmp_path) == 137


def test_a_lease_moved_on_by_the_agent_keeps_the_job_running(tmp_path: pathlib.Path) -> None:
    _lease(tmp_path, 300)
    gate = tmp_path / "go"
    job = start_job(_spec(tmp_path, f"echo started; while [ ! -e {gate} ]; do sleep 0.02; done; exit 7"))
    try:
        job.release()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # the agent renews: the stop keeps moving later
            _lease(tmp_path, 300)
            time.sleep(0.1)  # the scenario: a renewal every 100 ms for 2 s, well past the 300 ms lease
            assert job.process.poll() is None
        gate.write_text("go")
        assert job.process.wait(10) == 7
    finally:
        reap(job.process)
    assert not (tmp_path / "job.stopped").exists() and _exit_code(tmp_path) == 7


def test_a_damaged_copy_keeps_the_last_good_one_in_force(tmp_path: pathlib.Path) -> None:
    _lease(tmp_path, 600)
    job = start_job(_spec(tmp_path, "while :; do sleep 0.02; done"))
    try:
        job.release()
        (tmp_path / "job.lease").write_bytes(b'{"bootId":')  # torn or garbage: not a lease
        assert job.process.wait(10) == 143  # stopped at the last good copy's time
    finally:
        reap(job.process)


@pytest.mark.parametrize("case", ["missing", "garbage", "another_boot"])
def test_without_a_good_lease_file_the_command_never_starts(tmp_path: pathlib.Path, case: str) -> None:
    if case == "garbage":
        (tmp_path / "job.lease").write_bytes(b"\0" * 64)
    elif case == "another_boot":
        _lease(tmp_path, 10_000, boot="00000000-0000-4000-8000-000000000000")
    marker = tmp_path / "ran"
    with pytest.raises(ExecutionError) as info:
        start_job(_spec(tmp_path, f"touch {marker}"))
    assert info.value.code == "lease_unavailable"
    assert not marker.exists()


@pytest.mark.parametrize(("data", "expected"), [
    (b'{"a":"x","b":12,"c":null}   \n', {b"a": b"x", b"b": b"12", b"c": b"null"}),
    (b'{"a":-3}', {b"a": b"-3"}),
    (b'{}', {}),
    (b'{"a":"x\\"y"}', None),
    (b'{"a":1,"a":2}', None),
    (b'{"a":1.5}', None),
    (b'{"a":true}', None),
    (b'["a"]', None),
    (b'{"a":1', None),
    (b'', None),
])
def test_the_wrappers_flat_json_reader(data: bytes, expected: dict[bytes, bytes] | None) -> None:
    assert wrapper.flat_json(data) == expected
