"""The job wrapper's phases (:class:`qinglong_edge.process.wrapper.Supervisor`): the table
itself, and the phases real jobs pass through.

The real runs use the real wrapper program, started by :func:`~qinglong_edge.process.spawn.start_job`
as always, with four lines appended to its source before its ``__main__`` block: they wrap
``Supervisor._enter`` to append each phase it enters to a file (the wrapper's own files and
environment are never touched otherwise).
"""

from __future__ import annotations

import itertools
import os
import pathlib
import signal
import time
from collections.abc import Iterator

import pytest

from qinglong_edge.process import spawn, wrapper
from qinglong_edge.process.spawn import JobSpec, start_job
from tests.process.test_wrapper_lease import _lease
from tests.process.test_wrapper_lease import _spec as _lease_spec
from tests.support.jobs import descendants_by_marker, kill_pids, reap
from tests.support.wait import wait_until

_MAIN = b'\nif __name__ == "__main__":'
_HOOK = """
_TRACE = {path!r}
_entered = Supervisor._enter
def _traced(self: Supervisor, phase: str) -> None:
    before = self.phase
    _entered(self, phase)
    if self.phase != before:
        fd = os.open(_TRACE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.write(fd, self.phase.encode() + b"\\n")
        os.close(fd)
Supervisor._enter = _traced  # type: ignore[method-assign]
"""


# -- the table ------------------------------------------------------------------------------------

def test_every_allowed_move_is_taken_and_every_other_raises() -> None:
    table = wrapper.PHASE_NEXT
    assert set(table) == {wrapper.STARTING, wrapper.RUNNING, wrapper.STOPPING, wrapper.KILLING, wrapper.DRAINING,
                          wrapper.CLOSED}
    for phase, allowed in table.items():
        assert wrapper.advance(phase, phase) == phase  # staying is no move (a signal handler got there first)
        for to in allowed:
            assert wrapper.advance(phase, to) == to
        for to in set(table) - set(allowed) - {phase}:
            with pytest.raises(RuntimeError, match=f"phase {phase} cannot become {to}"):
                wrapper.advance(phase, to)
    # every phase is reachable from the start, and the walk ends in closed only
    seen, todo = {wrapper.STARTING}, [wrapper.STARTING]
    while todo:
        for to in table[todo.pop()]:
            if to not in seen:
                seen.add(to)
                todo.append(to)
    assert seen == set(table)
    assert [phase for phase, allowed in table.items() if not allowed] == [wrapper.CLOSED]


def test_the_supervisor_moves_only_along_the_table(tmp_path: pathlib.Path) -> None:
    """``_enter`` is the only way the phase changes; a move the table has not is refused."""
    supervisor = wrapper.Supervisor.__new__(wrapper.Supervisor)
    supervisor.phase = wrapper.STARTING
    supervisor._enter(wrapper.RUNNING)
    with pytest.raises(RuntimeError):
        supervisor._enter(wrapper.KILLING)  # running never kills before a TERM went out
    assert supervisor.phase == wrapper.RUNNING


# -- real runs ------------------------------------------------------------------------------------

@pytest.fixture
def trace(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    """The file each started wrapper appends its phases to (the program, traced)."""
    path = tmp_path / "phases"
    source = spawn.wrapper_source()
    assert source.count(_MAIN) == 1
    traced = source.replace(_MAIN, _HOOK.format(path=str(path)).encode() + _MAIN)
    monkeypatch.setattr(spawn, "_source", traced)
    monkeypatch.setattr(spawn, "_bytecode", {})  # compiled again, from the traced source
    yield path


def _phases(path: pathlib.Path) -> list[str]:
    return [wrapper.STARTING, *path.read_text().split()]


def _walks_the_table(phases: list[str]) -> None:
    for before, after in itertools.pairwise(phases):
        assert after in wrapper.PHASE_NEXT[before], phases


def _spec(tmp: pathlib.Path, script: str, **kwargs: object) -> JobSpec:
    return JobSpec(["/bin/sh", "-c", script], {"PATH": "/usr/bin:/bin"}, str(tmp), str(tmp / "logs" / "job.log"),
                   1 << 20, **kwargs)  # type: ignore[arg-type]


def _run(spec: JobSpec, *, stop_when: pathlib.Path | None = None) -> int:
    job = start_job(spec)
    try:
        job.release()
        if stop_when is not None:
            assert wait_until(stop_when.exists)
            os.kill(job.pid, signal.SIGTERM)  # as process.stop does: the wrapper alone
        return job.process.wait(20)
    finally:
        reap(job.process)


def test_a_command_that_exits_runs_then_drains(tmp_path: pathlib.Path, trace: pathlib.Path) -> None:
    assert _run(_spec(tmp_path, "echo hi; exit 3")) == 3
    phases = _phases(trace)
    _walks_the_table(phases)
    assert phases == ["starting", "running", "draining", "closed"]


def test_a_stopped_command_passes_through_stopping(tmp_path: pathlib.Path, trace: pathlib.Path) -> None:
    ready = tmp_path / "ready"
    assert _run(_spec(tmp_path, f"touch {ready}; exec sleep 100071"), stop_when=ready) == 143
    phases = _phases(trace)
    _walks_the_table(phases)
    assert phases == ["starting", "running", "stopping", "draining", "closed"]


def test_a_command_that_ignores_the_stop_is_killed(tmp_path: pathlib.Path, trace: pathlib.Path) -> None:
    ready = tmp_path / "ready"
    started = time.monotonic()
    code = _run(_spec(tmp_path, f"trap '' TERM; touch {ready}; while :; do sleep 0.02; done",
                      terminate_grace_ms=200, kill_grace_ms=1000), stop_when=ready)
    assert code == 137 and time.monotonic() - started >= 0.2
    phases = _phases(trace)
    _walks_the_table(phases)
    assert phases == ["starting", "running", "stopping", "killing", "draining", "closed"]


def test_leftovers_of_a_command_that_exited_get_term_then_sigkill(tmp_path: pathlib.Path,
                                                                  trace: pathlib.Path) -> None:
    ready = tmp_path / "ready"
    script = f"(trap '' TERM; touch {ready}; exec sleep 100072) & while [ ! -e {ready} ]; do sleep 0.01; done; exit 5"
    try:
        assert _run(_spec(tmp_path, script, terminate_grace_ms=200, kill_grace_ms=1000)) == 5
        assert not descendants_by_marker("100072")
    finally:
        kill_pids(descendants_by_marker("100072"))
    phases = _phases(trace)
    _walks_the_table(phases)
    assert phases == ["starting", "running", "stopping", "killing", "draining", "closed"]


def test_the_lease_stop_passes_through_stopping(tmp_path: pathlib.Path, trace: pathlib.Path) -> None:
    _lease(tmp_path, 300)
    assert _run(_lease_spec(tmp_path, "echo started; while :; do sleep 0.02; done")) == 143
    assert (tmp_path / "job.stopped").exists()
    phases = _phases(trace)
    _walks_the_table(phases)
    assert phases == ["starting", "running", "stopping", "draining", "closed"]
