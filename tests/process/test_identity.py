"""Process identity and the durable handle (local-api.md 7.3), against real processes."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qinglong_edge.errors import ExecutionError
from qinglong_edge.process.identity import (
    HANDLE_PREFIX,
    DurableHandle,
    Liveness,
    ProcessIdentity,
    capture,
    decode_handle,
    encode_handle,
    inspect,
    parse_boot_id,
    parse_proc_stat,
    probe,
    read_boot_id,
)
from tests.support.jobs import read_text
from tests.support.wait import wait_until

TAIL = b" 1 100 100 0 -1 4194560 97 0 0 0 0 0 0 0 20 0 1 0 123456 2240512 192 18446744073709551615"


def _line(pid: int, comm: bytes, state: bytes = b"S") -> bytes:
    return str(pid).encode() + b" (" + comm + b") " + state + TAIL + b"\n"


@pytest.mark.parametrize(
    "comm",
    [b"sleep", b") (", b"a) (b c", b"x)", b"((", b"", b"new\nline", b") S 9 9 9", b"\xff\xfe"],
    ids=["plain", "paren-pair", "paren-spaces", "trailing-paren", "open-parens", "empty", "newline",
         "fake-fields", "non-utf8"],
)
def test_parses_fields_after_the_last_paren(comm: bytes) -> None:
    stat = parse_proc_stat(4242, _line(4242, comm))
    assert (stat.state, stat.ppid, stat.pgrp, stat.session, stat.start_time) == ("S", 1, 100, 100, "123456")
    assert stat.comm.encode("utf-8", "surrogateescape") == comm


@given(st.binary(max_size=32).filter(lambda b: b"\0" not in b), st.sampled_from([b"R", b"S", b"Z", b"X", b"D"]))
def test_parse_recovers_fields_for_any_comm(comm: bytes, state: bytes) -> None:
    stat = parse_proc_stat(77, _line(77, comm, state))
    assert stat.pgrp == 100 and stat.start_time == "123456" and stat.state == state.decode()
    assert stat.exited == (state in (b"Z", b"X"))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"4242 sleep S 1 100",
        b"4243 (sleep) S" + TAIL,
        b"4242 (sleep) S 1 100",
        b"4242 (sleep) S 1 -5 100 0 -1 4194560 97 0 0 0 0 0 0 0 20 0 1 0 123456",
        b"4242 (sleep) S 1 100 100 0 -1 4194560 97 0 0 0 0 0 0 0 20 0 1 0 12x34",
        b"4242 (sleep) SS" + TAIL,
        b"(sleep) S" + TAIL,
    ],
    ids=["empty", "no-parens", "pid-mismatch", "too-few-fields", "negative-pgrp", "bad-starttime",
         "bad-state", "no-pid"],
)
def test_rejects_malformed_proc_stat(data: bytes) -> None:
    with pytest.raises(ExecutionError) as info:
        parse_proc_stat(4242, data)
    assert info.value.code == "invalid_proc_stat"


@pytest.mark.parametrize("data", [b"", b"x" * 65, b"abc def", b"abc_def", b"\xff"],
                         ids=["empty", "too-long", "space", "underscore", "binary"])
def test_rejects_bad_boot_id(data: bytes) -> None:
    with pytest.raises(ExecutionError):
        parse_boot_id(data)


def test_reads_the_real_boot_id() -> None:
    assert read_boot_id() == parse_boot_id(read_text("/proc/sys/kernel/random/boot_id").encode())


IDENTITY = ProcessIdentity(boot_id="1f5ef181-666a-453c-b5dd-5c53059f3180", pid=123, pgid=123, start_time="456")


def test_handle_is_prefix_and_base64url_of_compact_json_in_key_order() -> None:
    text = encode_handle("0b8e4c2a-1c2d-4e5f-8a9b-0c1d2e3f4a5b", IDENTITY)
    assert text.startswith(HANDLE_PREFIX) and "=" not in text
    body = text[len(HANDLE_PREFIX):]
    raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    assert raw == (b'{"v":1,"h":"0b8e4c2a-1c2d-4e5f-8a9b-0c1d2e3f4a5b",'
                   b'"b":"1f5ef181-666a-453c-b5dd-5c53059f3180","p":123,"g":123,"s":"456"}')
    assert decode_handle(text) == DurableHandle("0b8e4c2a-1c2d-4e5f-8a9b-0c1d2e3f4a5b", IDENTITY)


def _raw_handle(payload: object) -> str:
    data = json.dumps(payload, separators=(",", ":")).encode()
    return HANDLE_PREFIX + base64.urlsafe_b64encode(data).rstrip(b"=").decode()


GOOD = {"v": 1, "h": "h1", "b": "boot-1", "p": 5, "g": 5, "s": "9"}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "ql3lp2." + _raw_handle(GOOD)[len(HANDLE_PREFIX):],
        _raw_handle(GOOD) + "=",
        HANDLE_PREFIX + "!!!!",
        HANDLE_PREFIX,
        HANDLE_PREFIX + base64.urlsafe_b64encode(b"not json").decode().rstrip("="),
        _raw_handle([1, 2]),
        _raw_handle({**GOOD, "x": 1}),
        _raw_handle({k: v for k, v in GOOD.items() if k != "s"}),
        _raw_handle({**GOOD, "v": 2}),
        _raw_handle({**GOOD, "v": True}),
        _raw_handle({**GOOD, "h": ""}),
        _raw_handle({**GOOD, "b": "boot id"}),
        _raw_handle({**GOOD, "p": 0}),
        _raw_handle({**GOOD, "g": -1}),
        _raw_handle({**GOOD, "p": 1.5}),
        _raw_handle({**GOOD, "s": "0"}),
        _raw_handle({**GOOD, "s": 9}),
        _raw_handle({**GOOD, "s": "12a"}),
        _raw_handle({**GOOD, "h": "x" * 600}),
        HANDLE_PREFIX + base64.urlsafe_b64encode(b'{"v":1,"v":1,"h":"h1","b":"boot-1","p":5,"g":5,"s":"9"}').decode().rstrip("="),
    ],
    ids=["empty", "other-prefix", "padding", "not-base64", "no-body", "not-json", "array", "extra-key",
         "missing-key", "version-2", "version-bool", "empty-id", "bad-boot", "pid-zero", "pgid-negative",
         "pid-float", "starttime-zero", "starttime-number", "starttime-hex", "too-long", "duplicate-key"],
)
def test_rejects_invalid_handles(text: str) -> None:
    with pytest.raises(ExecutionError) as info:
        decode_handle(text)
    assert info.value.code == "invalid_handle"
    assert inspect(text).status == "unknown" and inspect(text).reason == "invalid_handle"


@given(st.integers(1, 2**31), st.integers(1, 2**31), st.integers(1, 10**20), st.uuids())
def test_handle_round_trips(pid: int, pgid: int, start: int, uuid: object) -> None:
    identity = ProcessIdentity("b00t-1d", pid, pgid, str(start))
    assert decode_handle(encode_handle(str(uuid), identity)).identity == identity


def _start(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL)


def test_captures_and_inspects_a_real_process() -> None:
    proc = _start(["sleep", "1000"])
    try:
        identity = capture(proc.pid)
        assert identity is not None
        assert identity.pgid == proc.pid and int(identity.start_time) > 0
        assert identity.boot_id == read_boot_id()
        assert inspect(identity).status == "running"
        os.kill(proc.pid, signal.SIGKILL)
        assert wait_until(lambda: probe(identity)[0] is Liveness.EXITED)
        zombie = inspect(identity)
        assert (zombie.status, zombie.liveness) == ("not_running", Liveness.EXITED)
        proc.wait()
        gone = inspect(encode_handle("h", identity))
        assert (gone.status, gone.liveness) == ("not_running", Liveness.GONE)
    finally:
        proc.kill()
        proc.wait()


def test_a_command_name_with_parens_and_spaces_is_parsed(tmp_path: object) -> None:
    exe = os.path.join(str(tmp_path), "x) (y z")
    shutil.copy(shutil.which("sleep") or "/bin/sleep", exe)
    proc = _start([exe, "1000"])
    try:
        assert wait_until(lambda: "x) (y z" in read_text(f"/proc/{proc.pid}/stat"))
        identity = capture(proc.pid)
        assert identity is not None and identity.pgid == proc.pid
        assert inspect(identity).status == "running"
        stat_text = read_text(f"/proc/{proc.pid}/stat")
        assert stat_text.split(" ")[1] == "(x)"  # a naive split would read garbage
        assert stat_text.split()[21] != identity.start_time  # and the field index would be off
    finally:
        proc.kill()
        proc.wait()


def test_recycled_pid_or_other_boot_is_not_running() -> None:
    proc = _start(["sleep", "1000"])
    try:
        identity = capture(proc.pid)
        assert identity is not None
        other_start = ProcessIdentity(identity.boot_id, identity.pid, identity.pgid, str(int(identity.start_time) + 1))
        other_group = ProcessIdentity(identity.boot_id, identity.pid, identity.pgid + 1, identity.start_time)
        other_boot = ProcessIdentity("another-boot", identity.pid, identity.pgid, identity.start_time)
        assert (inspect(other_start).status, inspect(other_start).liveness) == ("not_running", Liveness.REUSED)
        assert inspect(other_group).liveness is Liveness.REUSED
        assert (inspect(other_boot).status, inspect(other_boot).liveness) == ("not_running", Liveness.GONE)
    finally:
        proc.kill()
        proc.wait()


def test_unsupported_platform_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert inspect(IDENTITY).reason == "unsupported_platform"


def test_unreadable_boot_id_is_provider_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    import qinglong_edge.process.identity as identity_module

    monkeypatch.setattr(identity_module, "BOOT_ID_PATH", "/nonexistent/boot_id")
    monkeypatch.setattr(identity_module.read_boot_id, "__defaults__", ("/nonexistent/boot_id",))
    result = inspect(IDENTITY)
    assert (result.status, result.reason) == ("unknown", "provider_unavailable")
