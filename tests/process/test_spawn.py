"""Starting a Run's process: start barrier, environment, executable resolution, identity."""

from __future__ import annotations

import os
import time

import pytest

from qinglong_edge.errors import ExecutionError
from qinglong_edge.process.identity import inspect
from qinglong_edge.process.spawn import NOT_STARTED, job_environment, resolve_executable, spawn
from tests.support.jobs import alive, read_text, reap, start_job, wait_until


def test_job_code_runs_only_after_release(tmp_path: object) -> None:
    marker = os.path.join(str(tmp_path), "ran")
    job = start_job(f"echo yes > {marker}", str(tmp_path), release=False)
    try:
        time.sleep(0.2)
        assert not os.path.exists(marker) and alive(job.pid)  # held at the barrier
        assert inspect(job.handle).status == "running"  # the identity is the wrapper's, and stays
        job.release()
        assert job.process.wait(timeout=5) == 0
        assert read_text(marker) == "yes\n"
    finally:
        reap(job.process)


def test_abort_never_starts_the_job(tmp_path: object) -> None:
    marker = os.path.join(str(tmp_path), "ran")
    job = start_job(f"echo yes > {marker}", str(tmp_path), release=False)
    assert job.abort() is not None
    assert not os.path.exists(marker)


def test_agent_death_before_release_means_the_job_never_runs(tmp_path: object) -> None:
    """Closing our gate end without 'go' is what the kernel does when the agent dies."""
    marker = os.path.join(str(tmp_path), "ran")
    job = start_job(f"echo yes > {marker}", str(tmp_path), release=False)
    os.close(job.gate_fd)
    job.gate_fd = -1
    assert job.process.wait(timeout=5) == NOT_STARTED
    assert not os.path.exists(marker)


def test_identity_survives_exec(tmp_path: object) -> None:
    job = start_job("exec sleep 1000", str(tmp_path))
    try:
        assert wait_until(lambda: read_text(f"/proc/{job.pid}/comm").strip() == "sleep")
        assert inspect(job.handle).status == "running"
        assert job.identity.pgid == job.pid == os.getsid(job.pid)
    finally:
        reap(job.process)


def test_environment_is_minimal_and_task_values_win(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QINGLONG_EDGE_SECRET_FOR_TEST", "do-not-leak")
    env = job_environment({"FOO": "bar", "PATH": "/bin:/usr/bin"}, run_id="r1", attempt_id="a1", home=str(tmp_path))
    out = os.path.join(str(tmp_path), "env")
    fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        job = spawn(["env"], cwd=str(tmp_path), env=env, stdout_fd=fd)
    finally:
        os.close(fd)
    job.release()
    assert job.process.wait(timeout=5) == 0
    seen = dict(line.split("=", 1) for line in read_text(out).splitlines())
    assert seen == {"FOO": "bar", "PATH": "/bin:/usr/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
                    "QINGLONG_RUN_ID": "r1", "QINGLONG_ATTEMPT_ID": "a1", "PWD": str(tmp_path)} or \
        set(seen) - {"PWD", "SHLVL", "_"} == {"FOO", "PATH", "HOME", "LANG", "QINGLONG_RUN_ID", "QINGLONG_ATTEMPT_ID"}
    assert "QINGLONG_EDGE_SECRET_FOR_TEST" not in seen


def test_only_stdio_and_the_kept_fds_are_inherited(tmp_path: object) -> None:
    out = os.path.join(str(tmp_path), "fds")
    keep_r, keep_w = os.pipe()
    fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        env = job_environment({}, run_id="r", attempt_id="a", home=str(tmp_path))
        job = spawn(["/bin/sh", "-c", "ls /proc/$$/fd"], cwd=str(tmp_path), env=env, stdout_fd=fd, keep_fds=[keep_r])
    finally:
        os.close(fd)
        os.close(keep_w)
    job.release()
    assert job.process.wait(timeout=5) == 0
    os.close(keep_r)
    fds = sorted(int(x) for x in read_text(out).split())
    assert fds[:3] == [0, 1, 2] and keep_r in fds and len(fds) <= 5  # + the fd ls itself opens


@pytest.mark.parametrize("name", ["no-such-program-xyz", "/nonexistent/bin/tool", "./missing"],
                         ids=["bare-name", "absolute", "relative"])
def test_rejects_missing_executables(tmp_path: object, name: str) -> None:
    with pytest.raises(ExecutionError) as info:
        resolve_executable(name, {"PATH": "/usr/bin:/bin"}, str(tmp_path))
    assert info.value.code == "command_not_found"


def test_resolves_like_execvp(tmp_path: object) -> None:
    assert resolve_executable("sh", {"PATH": "/nonexistent:/bin"}, str(tmp_path)) == "/bin/sh"
    script = os.path.join(str(tmp_path), "run.sh")
    with open(script, "w") as handle:
        handle.write("#!/bin/sh\n")
    os.chmod(script, 0o700)
    assert resolve_executable("./run.sh", {}, str(tmp_path)) == script


def test_rejects_a_missing_working_directory(tmp_path: object) -> None:
    env = job_environment({}, run_id="r", attempt_id="a", home="/")
    with pytest.raises(ExecutionError) as info:
        spawn(["/bin/true"], cwd=os.path.join(str(tmp_path), "gone"), env=env, stdout_fd=1)
    assert info.value.code == "spawn_failed"


def test_identity_capture_failure_discards_the_unstarted_process(tmp_path: object,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake on purpose: /proc cannot be made to fail for one real pid. The process is real."""
    import qinglong_edge.process.spawn as spawn_module

    started: list[int] = []

    def failing_capture(pid: int, **_: object) -> None:
        started.append(pid)
        raise ExecutionError("boom", code="provider_unavailable")

    monkeypatch.setattr(spawn_module, "capture", failing_capture)
    marker = os.path.join(str(tmp_path), "ran")
    env = job_environment({}, run_id="r", attempt_id="a", home=str(tmp_path))
    with pytest.raises(ExecutionError) as info:
        spawn(["/bin/sh", "-c", f"echo yes > {marker}"], cwd=str(tmp_path), env=env, stdout_fd=1)
    assert info.value.code == "identity_unavailable"
    assert started and not alive(started[0])  # killed and reaped
    with pytest.raises(ChildProcessError):
        os.waitpid(started[0], os.WNOHANG)
    assert not os.path.exists(marker)  # the job never ran
