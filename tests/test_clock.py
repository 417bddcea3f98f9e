"""The two clocks (spec README, "Decisions for clocks")."""

from __future__ import annotations

import pathlib
import time

import pytest

from qinglong_edge import clock


def test_boot_clock_counts_since_boot_and_never_goes_back() -> None:
    first = clock.boot_ms()
    with open("/proc/uptime", encoding="ascii") as handle:
        uptime_ms = float(handle.read().split()[0]) * 1000
    second = clock.boot_ms()
    assert 0 < first <= second
    # CLOCK_BOOTTIME includes suspend, /proc/uptime too: the two agree within a second.
    assert abs(second - uptime_ms) < 1000


def test_wall_clock_is_epoch_milliseconds() -> None:
    assert abs(clock.wall_ms() - time.time() * 1000) < 1000


def test_boot_id_is_the_kernel_value(tmp_path: pathlib.Path) -> None:
    assert clock.boot_id() is not None
    path = tmp_path / "boot_id"
    path.write_bytes(b"  abc-123\n")
    assert clock.boot_id(str(path)) == "abc-123"
    path.write_bytes(b"\n")
    assert clock.boot_id(str(path)) is None
    assert clock.boot_id(str(tmp_path / "missing")) is None


def test_boot_id_has_one_shape() -> None:
    assert clock.parse_boot_id(b" 1f5ef181-666a-453c-b5dd-5c53059f3180\n") == "1f5ef181-666a-453c-b5dd-5c53059f3180"
    for bad in (b"", b"\n", b"x" * 65, b"abc def", b"abc_def", b"\xff"):
        assert clock.parse_boot_id(bad) is None
    assert clock.is_boot_id("a" * 64) and not clock.is_boot_id(" a")


_TAIL = b" 1 100 100 0 -1 4194560 97 0 0 0 0 0 0 0 20 0 1 0 123456 1 2 3\n"


def test_proc_stat_fields_come_after_the_last_paren() -> None:
    assert clock.parse_proc_stat(b"42 (a) (b) S" + _TAIL, 42) == (42, "a) (b", "S", 1, 100, 100, "123456")
    assert clock.parse_proc_stat(b"42 (x) Z" + _TAIL)[0] == 42  # no pid given: the line's own


@pytest.mark.parametrize(("data", "message"), [
    (b"", "no command field"),
    (b"42 sleep S 1 100", "no command field"),
    (b"43 (sleep) S" + _TAIL, "pid does not match"),
    (b"x (sleep) S" + _TAIL, "pid does not match"),
    (b"42 (sleep) S 1 100", "missing fields"),
    (b"42 (sleep) SS" + _TAIL, "invalid identity fields"),
    (b"42 (sleep) S 1 -5" + _TAIL[7:], "invalid identity fields"),
])
def test_proc_stat_rejects_a_malformed_line(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        clock.parse_proc_stat(data, 42 if not data.startswith(b"x") else None)


def test_the_agent_reads_the_boot_id_and_parses_proc_stat_only_here() -> None:
    """One reader of the boot id and one parser of ``/proc/<pid>/stat`` (issue 27 item 5):
    the process core and the journal's owner lock call this module's (the job wrapper, a
    program of its own that imports nothing of ours, is the one exception)."""
    package = pathlib.Path(clock.__file__).parent
    for path in sorted(package.rglob("*.py")):
        if path.name in ("clock.py", "wrapper.py"):
            continue
        text = path.read_text(encoding="utf-8")
        assert "random/boot_id" not in text, path
        assert 'rfind(b")")' not in text, path
