"""The job wrapper program and the isolation answer in the runtime directory (issue 24
item 1 and "Bad input"): kept only while remote jobs are isolated, only a positive
answer read, and a cache file replaced by a symlink, FIFO, directory or a huge file
refused without following it, in one line, the launch going on with a fresh copy.

Real files in a real runtime directory; the wrapper compiled by the real interpreter.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
from collections.abc import Iterator

import pytest

from qinglong_edge.process import spawn
from qinglong_edge.process.isolation import probe_isolation
from qinglong_edge.worker.journal.runtime import RuntimeDirectory, boot_id
from qinglong_edge.worker.remote.job import _wrapper_name, forget_caches, isolation_available, prime_wrapper


@pytest.fixture
def runtime(tmp_path: pathlib.Path) -> Iterator[RuntimeDirectory]:
    base = tmp_path / "run"
    base.mkdir(mode=0o700)
    with RuntimeDirectory.open(str(base), str(tmp_path / "journal")) as opened:
        yield opened


@pytest.fixture(autouse=True)
def fresh_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new process would: no wrapper compiled in memory yet."""
    monkeypatch.setattr(spawn, "_bytecode", {})


def _name() -> str:
    name = _wrapper_name(sys.executable)
    assert name is not None
    return name


def test_with_isolation_the_program_is_kept_and_reused(runtime: RuntimeDirectory) -> None:
    prime_wrapper(runtime, trusted=True)
    stored = pathlib.Path(runtime.path, _name())
    assert stored.read_bytes() == spawn._bytecode[sys.executable]
    spawn._bytecode.clear()
    prime_wrapper(runtime, trusted=True)  # a later pull: taken from the runtime directory
    assert spawn._bytecode[sys.executable] == stored.read_bytes()


def test_without_isolation_nothing_is_kept_read_or_left(runtime: RuntimeDirectory) -> None:
    """A job that can write the runtime directory could replace the program (the next
    wrapper runs it outside any namespace, with the next job's secrets): without isolation
    it is compiled in memory only, and what is there is removed, unread."""
    planted = pathlib.Path(runtime.path, _name())
    planted.write_bytes(b"planted program")
    planted.chmod(0o600)
    answer = pathlib.Path(runtime.path, "isolation.json")
    answer.write_text("{}")
    answer.chmod(0o600)
    prime_wrapper(runtime, trusted=False)
    assert not planted.exists() and not answer.exists()
    assert spawn._bytecode[sys.executable] not in (b"", b"planted program")  # compiled here, not loaded
    assert sorted(os.listdir(runtime.path)) == []


#: What a job that could write the runtime directory puts at a cache file's name.
DAMAGE = {
    "symlink": lambda path, target: os.symlink(target, path),
    "fifo": lambda path, target: os.mkfifo(path, 0o600),
    "directory": lambda path, target: os.mkdir(path, 0o700),
    "huge": lambda path, target: (open(path, "wb").truncate(2 << 20), os.chmod(path, 0o600)),  # noqa: SIM115
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_program_cache_is_refused_in_one_line_and_replaced(runtime: RuntimeDirectory,
                                                                     tmp_path: pathlib.Path, damage: str) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"not ours to read")
    path = pathlib.Path(runtime.path, _name())
    DAMAGE[damage](str(path), str(target))
    lines: list[str] = []
    prime_wrapper(runtime, trusted=True, notice=lines.append)  # returns: a FIFO is never waited on
    assert len(lines) == 1 and "refused" in lines[0] and _name() in lines[0], lines
    assert target.read_bytes() == b"not ours to read"  # never followed
    assert spawn._bytecode[sys.executable].startswith(spawn.sys.modules["_frozen_importlib_external"].MAGIC_NUMBER)
    if damage == "directory":
        assert path.is_dir()  # cannot be renamed over: the fresh copy lives in memory
    else:
        assert path.is_file() and not path.is_symlink() and path.read_bytes() == spawn._bytecode[sys.executable]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_isolation_answer_is_refused_and_the_probe_decides(runtime: RuntimeDirectory,
                                                                     tmp_path: pathlib.Path, damage: str) -> None:
    target = tmp_path / "target"
    target.write_text(json.dumps({"bootId": boot_id(), "available": True, "pid": "pidns+proc"}))
    DAMAGE[damage](os.path.join(runtime.path, "isolation.json"), str(target))
    lines: list[str] = []
    level, _ = isolation_available(runtime, str(tmp_path), boot_id(), lines.append)
    assert len(lines) == 1 and "isolation.json" in lines[0], lines
    probe = probe_isolation(str(tmp_path))
    assert level == (probe.pid if probe.available else None)


def test_a_negative_answer_is_never_read(runtime: RuntimeDirectory, tmp_path: pathlib.Path) -> None:
    """The issue's attack: ``"available":false`` written by a job made the next job run
    unisolated. Only a positive answer is kept (jobs are isolated then: they cannot see
    the runtime directory); a negative one is not taken."""
    probe = probe_isolation(str(tmp_path))
    if not probe.available:
        pytest.skip(f"no isolation here: {probe.reason}")
    answer = pathlib.Path(runtime.path, "isolation.json")
    answer.write_text(json.dumps({"bootId": boot_id(), "available": False, "reason": "planted"}) + "\n")
    answer.chmod(0o600)
    level, _ = isolation_available(runtime, str(tmp_path), boot_id())
    assert level == probe.pid
    stored = json.loads(answer.read_text())
    assert (stored["available"], stored["pid"]) == (True, probe.pid)
    forget_caches(runtime)
    assert not answer.exists()
