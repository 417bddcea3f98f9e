"""The per-job lease file (worker/remote/lease.py; issue 23 items 4 and 7) in a real runtime
directory: its bytes, what a damaged copy means to the agent, the in-place update that a
full RAM file system does not stop (a real tmpfs, root only)."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import pytest

from qinglong_edge.errors import JournalError
from qinglong_edge.worker.journal.runtime import RuntimeDirectory
from qinglong_edge.worker.remote.lease import (
    FILE_BYTES,
    JobLease,
    lease_name,
    parse_job_lease,
    read_job_lease,
    remove_job_lease,
    stopped_by_wrapper,
    stopped_name,
    write_job_lease,
)
from tests.support.mounts import tmpfs

BOOT = "6f1c0e2a-1b2c-4d3e-8f40-123456789abc"
RECORD: dict[str, Any] = {"offer": {"offerId": "offer-1", "candidate": {"attemptId": "attempt-1"},
                                    "lease": {"leaseGeneration": 1, "version": 3}}}


def _lease(**changes: Any) -> JobLease:
    values: dict[str, Any] = {
        "offer_id": "offer-1", "attempt_id": "attempt-1", "lease_generation": 1, "lease_version": 4,
        "renewed_at_ms": 1_800_000_000_000, "expires_at_ms": 1_800_000_030_000, "boot_id": BOOT,
        "sent_boot_ms": 5000, "duration_ms": 30_000, "expires_boot_ms": 35_000, "stop_at_boot_ms": 28_500,
        "terminate_grace_ms": 5000, "kill_grace_ms": 1000, "starting_boot_ms": 4000, "started_boot_ms": 4100}
    values.update(changes)
    return JobLease(**values)


def test_bytes_are_fixed_size_flat_json_and_round_trip() -> None:
    data = _lease().to_bytes()
    assert len(data) == FILE_BYTES and data.endswith(b" \n") and b"\\" not in data
    assert parse_job_lease(data) == _lease()
    assert parse_job_lease(_lease(sent_boot_ms=None, started_boot_ms=None).to_bytes()).sent_boot_ms is None


def test_a_lease_file_holds_plain_ids_only() -> None:
    from qinglong_edge.contracts.errors import ContractError

    with pytest.raises(ContractError):
        _lease(offer_id='o"1').to_bytes()


def test_written_read_and_removed_in_the_runtime_directory(runtime: RuntimeDirectory) -> None:
    write_job_lease(runtime, _lease())
    assert read_job_lease(runtime, RECORD, BOOT) == _lease()
    write_job_lease(runtime, _lease(lease_version=5))  # in place
    found = read_job_lease(runtime, RECORD, BOOT)
    assert found is not None and found.lease_version == 5
    assert not stopped_by_wrapper(runtime, "offer-1")
    fd = os.open(os.path.join(runtime.path, stopped_name("offer-1")), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"lease\n")
    os.close(fd)
    assert stopped_by_wrapper(runtime, "offer-1")
    remove_job_lease(runtime, "offer-1")
    assert runtime.names() == []


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "another_boot", "another_attempt",
                                    "another_generation"])
def test_a_damaged_copy_is_absent_to_the_agent(runtime: RuntimeDirectory, damage: str) -> None:
    path = pathlib.Path(runtime.path) / lease_name("offer-1")
    if damage in ("another_boot", "another_attempt", "another_generation"):
        change = {"another_boot": {"boot_id": "00000000-0000-4000-8000-000000000000"},
                  "another_attempt": {"attempt_id": "attempt-2"},
                  "another_generation": {"lease_generation": 2}}[damage]
        write_job_lease(runtime, _lease(**change))
    else:
        data = {"empty": b"", "truncated": _lease().to_bytes()[:40], "garbage": os.urandom(300)}[damage]
        path.write_bytes(data)
        path.chmod(0o600)
    assert read_job_lease(runtime, RECORD, BOOT) is None


def test_an_update_needs_no_space_on_a_full_ram_file_system(tmp_path: pathlib.Path) -> None:
    """The renewal reaches the wrapper's file even when the tmpfs is full (in place, the
    same size); only a new file needs a block."""
    with tmpfs(tmp_path / "run", "256k"):
        runtime = RuntimeDirectory.open(str(tmp_path / "run"), str(tmp_path / "worker"))
        try:
            write_job_lease(runtime, _lease())
            filler = pathlib.Path(runtime.path) / "filler"
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                while True:
                    try:
                        os.write(fd, b"\0" * 4096)
                    except OSError:
                        break
            finally:
                os.close(fd)
            write_job_lease(runtime, _lease(lease_version=9, stop_at_boot_ms=60_000))
            found = read_job_lease(runtime, RECORD, BOOT)
            assert found is not None and (found.lease_version, found.stop_at_boot_ms) == (9, 60_000)
            with pytest.raises(JournalError) as info:
                write_job_lease(runtime, _lease(offer_id="offer-2"))  # a new file: ENOSPC
            assert info.value.code == "storage_unavailable"
            filler.unlink()
        finally:
            runtime.close()
