"""Owner lock (spec README "Owner lock"): real flock, real processes, real signals."""

from __future__ import annotations

import os
import pathlib
import signal
import stat
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qinglong_edge.errors import JournalError
from qinglong_edge.worker.journal import ownerlock
from qinglong_edge.worker.journal.ownerlock import (
    LOCK_NAME,
    OwnerLock,
    boot_id,
    parse_owner_record,
    parse_proc_stat_start_ticks,
    process_start_ticks,
    read_owner_record,
)
from tests.support.journal_proc import Child, last_event, run_child, wait_stopped
from tests.support.wait import wait_until

STALE_MS = 400  # refresh every 200 ms; the tests watch several periods


def _code(exc_info: pytest.ExceptionInfo[JournalError]) -> str:
    return exc_info.value.code


@pytest.fixture
def lock(private_dir: pathlib.Path) -> Iterator[OwnerLock]:
    held = OwnerLock.acquire(str(private_dir), stale_ms=STALE_MS)
    yield held
    held.release()


def test_acquire_writes_a_private_owner_record(private_dir: pathlib.Path, lock: OwnerLock) -> None:
    path = private_dir / LOCK_NAME
    st_ = os.lstat(path)
    assert stat.S_ISREG(st_.st_mode) and stat.S_IMODE(st_.st_mode) == 0o600
    record = parse_owner_record(path.read_bytes())
    assert record.pid == os.getpid()
    assert record.process_start_ticks == process_start_ticks()
    assert record.boot_id == boot_id() and record.boot_id
    assert record.is_alive()
    assert read_owner_record(str(private_dir)) == record


def test_rejects_second_acquire_in_the_same_process(private_dir: pathlib.Path, lock: OwnerLock) -> None:
    with pytest.raises(JournalError) as info:
        OwnerLock.acquire(str(private_dir))
    assert _code(info) == "already_owned"
    lock.ensure_owned()  # the loser did not disturb the holder


def test_loser_does_not_truncate_or_rewrite_the_holders_record(private_dir: pathlib.Path, lock: OwnerLock) -> None:
    before = (private_dir / LOCK_NAME).read_bytes()
    result = run_child("try", str(private_dir))
    assert b'"already_owned"' in result.stdout, result.stderr
    assert (private_dir / LOCK_NAME).read_bytes() in (before, lock.record.to_bytes())
    assert str(os.getpid()).encode() in (private_dir / LOCK_NAME).read_bytes()


def test_second_process_gets_already_owned_immediately_while_owner_lives(private_dir: pathlib.Path) -> None:
    owner = Child("hold", str(private_dir), str(STALE_MS))
    try:
        owned = owner.read_event()
        assert owned["event"] == "owned"
        event = last_event(run_child("try", str(private_dir)).stdout)
        assert event["code"] == "already_owned"
        assert f"pid {owner.pid}" in event["message"]  # the diagnosis names the holder
        assert event["ms"] < 1000  # no waiting
    finally:
        owner.close()


def test_sigstopped_owner_keeps_the_lock_and_is_compromised_after_resume(private_dir: pathlib.Path) -> None:
    owner = Child("hold", str(private_dir), str(STALE_MS))
    try:
        owner.read_event()
        owner.signal(signal.SIGSTOP)
        assert wait_stopped(owner.pid)
        for _ in range(3):  # several refresh periods (and past stale) while stopped
            time.sleep(STALE_MS / 1000)  # the scenario: real time passes (the staleness clock) while stopped
            result = run_child("try", str(private_dir))
            assert b'"already_owned"' in result.stdout, result.stdout + result.stderr
        owner.signal(signal.SIGCONT)
        owner.send("check")
        # It missed its refreshes for longer than stale: it must not trust itself.
        assert owner.read_event() == {"event": "check", "code": "ownership_compromised"}
    finally:
        owner.close()


def test_next_process_owns_at_once_after_sigkill_of_the_owner(private_dir: pathlib.Path) -> None:
    owner = Child("hold", str(private_dir), "30000")
    try:
        owner.read_event()
        owner.kill()
        start = time.monotonic()
        lock = OwnerLock.acquire(str(private_dir))
        assert time.monotonic() - start < 1.0  # no staleness wait (stale is 30 s)
        assert lock.record.pid == os.getpid()
        lock.release()
    finally:
        owner.close()


def test_deleted_lock_file_fails_closed_before_the_next_operation(private_dir: pathlib.Path, lock: OwnerLock) -> None:
    lock.ensure_owned()
    os.unlink(private_dir / LOCK_NAME)
    with pytest.raises(JournalError) as info:
        lock.ensure_owned()
    assert _code(info) == "ownership_compromised"
    # ...and it stays compromised even once someone else owns a new lock file.
    other = OwnerLock.acquire(str(private_dir))
    try:
        with pytest.raises(JournalError) as again:
            lock.ensure_owned()
        assert _code(again) == "ownership_compromised"
        other.ensure_owned()
    finally:
        other.release()


def test_replaced_lock_file_fails_closed(private_dir: pathlib.Path, lock: OwnerLock) -> None:
    replacement = private_dir / "replacement"
    replacement.write_bytes(b"x")
    replacement.chmod(0o600)
    os.rename(replacement, private_dir / LOCK_NAME)
    with pytest.raises(JournalError) as info:
        lock.ensure_owned()
    assert _code(info) == "ownership_compromised"
    assert "replaced" in info.value.message


def test_refresh_thread_notices_deletion_without_any_call(private_dir: pathlib.Path, lock: OwnerLock) -> None:
    os.unlink(private_dir / LOCK_NAME)
    assert wait_until(lambda: lock.compromised, 5, interval=0.02)


def test_refresh_rewrites_the_record(private_dir: pathlib.Path, lock: OwnerLock) -> None:
    first = lock.record.refreshed_at_ms
    assert wait_until(lambda: lock.record.refreshed_at_ms > first, 10)
    on_disk = parse_owner_record((private_dir / LOCK_NAME).read_bytes())
    assert on_disk == lock.record
    lock.ensure_owned()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.guard = threading.Lock()

    def __call__(self) -> float:
        with self.guard:
            return self.now


def test_missed_refresh_past_stale_compromises_by_the_monotonic_clock(private_dir: pathlib.Path) -> None:
    clock = _Clock()
    lock = OwnerLock.acquire(str(private_dir), stale_ms=60_000, clock=clock)
    try:
        lock.ensure_owned()
        clock.now += 59.0
        lock.ensure_owned()  # within stale
        clock.now += 2.0  # 61 s since the last refresh, as after a long SIGSTOP
        with pytest.raises(JournalError) as info:
            lock.ensure_owned()
        assert _code(info) == "ownership_compromised"
    finally:
        lock.release()


@pytest.mark.parametrize("jump_s", [-1.6e9, -3600.0, 3600.0, 10 * 365 * 86400.0], ids=["to_1970", "back_1h", "ntp_step_1h", "ahead_10y"])
def test_wall_clock_jumps_change_nothing(private_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch, jump_s: float) -> None:
    lock = OwnerLock.acquire(str(private_dir), stale_ms=200)
    try:
        real_time, real_time_ns = time.time, time.time_ns
        monkeypatch.setattr(time, "time", lambda: real_time() + jump_s)
        monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + int(jump_s * 1e9))
        for _ in range(4):  # across several refreshes (each a new record)
            assert wait_until(lambda before=lock.record: lock.record is not before, 10)
            lock.ensure_owned()
        assert not lock.compromised
        # The refresh thread ran under the jumped wall clock (its stamp moved with it)...
        assert abs(lock.record.refreshed_at_ms - (real_time_ns() // 1_000_000 + int(jump_s * 1000))) < 5_000
    finally:
        lock.release()


def test_release_unlocks_keeps_the_file_and_stops_the_thread(private_dir: pathlib.Path) -> None:
    lock = OwnerLock.acquire(str(private_dir), stale_ms=STALE_MS)
    thread = lock._thread
    lock.release()
    lock.release()  # idempotent
    assert not thread.is_alive()
    assert (private_dir / LOCK_NAME).exists()
    with pytest.raises(JournalError) as info:
        lock.ensure_owned()
    assert _code(info) == "not_owned"
    again = OwnerLock.acquire(str(private_dir))
    again.release()


def test_rejects_symlinked_lock_file(private_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    os.symlink(target, private_dir / LOCK_NAME)
    with pytest.raises(JournalError) as info:
        OwnerLock.acquire(str(private_dir))
    assert _code(info) == "unsafe_storage"
    assert target.read_bytes() == b""


def test_rejects_lock_path_that_is_a_directory(private_dir: pathlib.Path) -> None:
    (private_dir / LOCK_NAME).mkdir()  # proper-lockfile's layout: not ours
    with pytest.raises(JournalError) as info:
        OwnerLock.acquire(str(private_dir))
    assert _code(info) in ("unsafe_storage",)


@pytest.mark.root
def test_rejects_foreign_owned_lock_file(private_dir: pathlib.Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    path = private_dir / LOCK_NAME
    path.write_bytes(b"")
    path.chmod(0o600)
    os.chown(path, 65534, 65534)
    with pytest.raises(JournalError) as info:
        OwnerLock.acquire(str(private_dir))
    assert _code(info) == "unsafe_storage"


def test_group_readable_lock_file_is_tightened_once_held(private_dir: pathlib.Path) -> None:
    path = private_dir / LOCK_NAME
    path.write_bytes(b"")
    path.chmod(0o644)
    with OwnerLock.acquire(str(private_dir)):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600


def test_locked_dead_inode_is_retried(private_dir: pathlib.Path) -> None:
    path = str(private_dir / LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.unlink(path)
        assert ownerlock._lock(fd, path) is False  # st_nlink == 0 after locking
    finally:
        os.close(fd)


@pytest.mark.parametrize("stale_ms", [0, 99, 300_001])
def test_rejects_stale_out_of_range(private_dir: pathlib.Path, stale_ms: int) -> None:
    with pytest.raises(JournalError) as info:
        OwnerLock.acquire(str(private_dir), stale_ms=stale_ms)
    assert _code(info) == "invalid_configuration"


# -- /proc/<pid>/stat parsing ---------------------------------------------------------------

def test_process_name_with_paren_space_paren_does_not_confuse_the_parser(private_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # comm is the basename the kernel exec'ed: a symlink named like this gives a
    # process whose /proc/<pid>/stat second field is "(py) (1 2 3)".
    tricky = tmp_path / "py) (1 2 3"
    os.symlink(os.path.realpath("/proc/self/exe"), tricky)
    owner = Child("hold", str(private_dir), "30000", executable=str(tricky))
    try:
        owned = owner.read_event()
        with open(f"/proc/{owner.pid}/comm", "rb") as handle:
            comm = handle.read().rstrip(b"\n")
        assert comm == b"py) (1 2 3"
        with open(f"/proc/{owner.pid}/stat", "rb") as handle:
            line = handle.read()
        # Independent slicing with the known comm: "<pid> (<comm>) <fields from 3>".
        prefix = f"{owner.pid} (".encode() + comm + b") "
        assert line.startswith(prefix)
        expected = int(line[len(prefix):].split()[19])
        naive = line.split(b")", 1)[1].split()  # what a first-')' parser would read
        assert naive[19] != str(expected).encode()  # the case really is tricky
        assert owned["startTicks"] == expected
        assert owned["name"] == "py) (1 2 3"
        record = read_owner_record(str(private_dir))
        assert record is not None and record.process_start_ticks == expected and record.is_alive()
    finally:
        owner.close()


@given(
    comm=st.binary(min_size=0, max_size=15).filter(lambda b: b"\n" not in b and b"\0" not in b),
    pid=st.integers(1, 4_194_304),
    start=st.integers(0, 2**63 - 1),
)
def test_start_ticks_parser_handles_any_command_name(comm: bytes, pid: int, start: int) -> None:
    fields = [b"S"] + [str(i).encode() for i in range(4, 22)] + [str(start).encode()] + [b"0"] * 30
    line = f"{pid} (".encode() + comm + b") " + b" ".join(fields) + b"\n"
    assert parse_proc_stat_start_ticks(line) == start


@pytest.mark.parametrize("line", [b"", b"1 (x S 2 3", b"1 (x) S 2 3"], ids=["empty", "no_paren", "short"])
def test_rejects_malformed_proc_stat(line: bytes) -> None:
    with pytest.raises(ValueError):
        parse_proc_stat_start_ticks(line)


@pytest.mark.parametrize(
    "data",
    [b"", b"{}", b'{"schema":"other","pid":1,"acquiredAtMs":0,"refreshedAtMs":0}', b'{"schema":"qinglong-edge/owner-lock@v1","pid":-1,"acquiredAtMs":0,"refreshedAtMs":0}', b"\xff"],
    ids=["empty", "no_schema", "other_schema", "negative_pid", "not_ascii"],
)
def test_rejects_malformed_owner_record(data: bytes) -> None:
    with pytest.raises((ValueError, UnicodeDecodeError)):
        parse_owner_record(data)


def test_default_clock_is_monotonic_not_wall(private_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _Clock()
    monkeypatch.setattr(ownerlock.time, "monotonic", fake)
    lock = OwnerLock.acquire(str(private_dir), stale_ms=60_000)  # no clock given
    try:
        monkeypatch.setattr(ownerlock.time, "time", lambda: 0.0)
        monkeypatch.setattr(ownerlock.time, "time_ns", lambda: 0)
        lock.ensure_owned()  # the wall clock at 1970 does not matter
        fake.now += 61.0  # the monotonic clock does
        with pytest.raises(JournalError) as info:
            lock.ensure_owned()
        assert _code(info) == "ownership_compromised"
    finally:
        lock.release()


def test_failed_record_rewrite_does_not_compromise(private_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fake failure: ENOSPC on rewriting an already-allocated record happens on
    # log-structured flash file systems (JFFS2/UBIFS), not on the ext4/tmpfs here.
    lock = OwnerLock.acquire(str(private_dir), stale_ms=STALE_MS)
    try:
        def full(fd: int, record: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(ownerlock, "_write_record", full)
        # Three failed refreshes (one per stale/2): the last record written is past stale.
        assert wait_until(lambda: lock.record_write_failures >= 3, 10)
        lock.ensure_owned()
    finally:
        lock.release()


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_owner_process_fails_closed_after_its_lock_file_is_changed(private_dir: pathlib.Path, how: str) -> None:
    owner = Child("hold", str(private_dir), "30000")
    try:
        owner.read_event()
        owner.send("check")
        assert owner.read_event() == {"event": "check", "code": None}
        os.unlink(private_dir / LOCK_NAME)
        if how == "replaced":
            (private_dir / LOCK_NAME).write_bytes(b"")
        owner.send("check")  # long before its next refresh (stale is 30 s)
        assert owner.read_event() == {"event": "check", "code": "ownership_compromised"}
        # A newcomer can own the new file: exactly why the old owner must stop.
        newcomer = last_event(run_child("try", str(private_dir)).stdout)
        assert newcomer["code"] is None
    finally:
        owner.close()


def test_with_a_runtime_directory_the_record_lives_there_and_the_lock_file_is_not_written(
    private_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """Spec README, storage on flash: taking and holding the lock writes nothing to the
    journal's file system (no record, no fchmod of a lock file already 0600)."""
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

    (tmp_path / "run").mkdir(mode=0o700)
    OwnerLock.acquire(str(private_dir), stale_ms=STALE_MS).release()  # the lock file exists (0600)
    path = private_dir / LOCK_NAME
    path.write_bytes(b"")
    before = path.stat()
    with RuntimeDirectory.open(str(tmp_path / "run"), str(private_dir)) as runtime:
        lock = OwnerLock.acquire(str(private_dir), stale_ms=STALE_MS, runtime=runtime)
        try:
            first = lock.record.refreshed_at_ms
            assert wait_until(lambda: lock.record.refreshed_at_ms > first, 10)  # the refresh thread ran
            assert read_owner_record(str(private_dir), runtime) == lock.record
            assert parse_owner_record((pathlib.Path(runtime.path) / "owner.json").read_bytes()) == lock.record
            with pytest.raises(JournalError) as info:  # a second owner names the first
                OwnerLock.acquire(str(private_dir), stale_ms=STALE_MS, runtime=runtime)
            assert f"pid {os.getpid()}" in info.value.message
        finally:
            lock.release()
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ctime_ns) == (before.st_size, before.st_mtime_ns,
                                                                     before.st_ctime_ns)
