"""Starting a job under the wrapper: start barrier, identity, environment, executable
resolution, and every launch failure (nothing runs, the wrapper is reaped)."""

from __future__ import annotations

import os
import pathlib

import pytest

from qinglong_edge.errors import ExecutionError
from qinglong_edge.process.cgroups import RunCgroup
from qinglong_edge.process.identity import inspect, read_proc_stat
from qinglong_edge.process.spawn import (
    NOT_STARTED,
    Isolation,
    JobSpec,
    Publication,
    encode_spec,
    job_environment,
    resolve_executable,
    start_job,
)
from tests.support.jobs import alive, command_of, read_text, reap
from tests.support.jobs import start_job as start_script
from tests.support.wait import wait_until


def _spec(tmp: pathlib.Path, argv: list[str] | None = None, **kwargs: object) -> JobSpec:
    return JobSpec(argv or ["/bin/true"], kwargs.pop("env", {}), str(kwargs.pop("cwd", tmp)),  # type: ignore[arg-type]
                   str(kwargs.pop("log", tmp / "job.log")), kwargs.pop("cap", 4096), **kwargs)  # type: ignore[arg-type]


def test_job_code_runs_only_after_release(tmp_path: pathlib.Path) -> None:
    marker = os.path.join(str(tmp_path), "ran")
    job = start_script(f"echo yes > {marker}", str(tmp_path), release=False)
    try:
        # The positive event: after its READY the wrapper's only wait is the barrier's read;
        # asleep there, it got as far as it goes unreleased.
        assert wait_until(lambda: (stat := read_proc_stat(job.pid)) is not None and stat.state == "S")
        assert not os.path.exists(marker) and alive(job.pid)  # held at the barrier
        assert command_of(job.pid, timeout=0) is None  # nothing forked yet
        assert inspect(job.handle).status == "running"  # the identity is the wrapper's, and stays
        job.release()
        assert job.process.wait(timeout=5) == 0
        assert read_text(marker) == "yes\n"
    finally:
        reap(job.process)


def test_abort_never_starts_the_job(tmp_path: pathlib.Path) -> None:
    marker = os.path.join(str(tmp_path), "ran")
    job = start_script(f"echo yes > {marker}", str(tmp_path), release=False)
    assert job.abort() is not None
    assert not os.path.exists(marker)


def test_agent_death_before_release_means_the_job_never_runs(tmp_path: pathlib.Path) -> None:
    """Closing our barrier end without 'go' is what the kernel does when the agent dies."""
    marker = os.path.join(str(tmp_path), "ran")
    job = start_script(f"echo yes > {marker}", str(tmp_path), release=False)
    os.close(job.control_fd)
    job.control_fd = -1
    assert job.process.wait(timeout=5) == NOT_STARTED
    assert not os.path.exists(marker)


def test_identity_is_the_wrappers_and_stays_across_the_job(tmp_path: pathlib.Path) -> None:
    job = start_script("exec sleep 1000", str(tmp_path))
    try:
        command = command_of(job.pid)
        assert command is not None and wait_until(lambda: read_text(f"/proc/{command}/comm").strip() == "sleep")
        assert inspect(job.handle).status == "running"
        assert job.identity.pgid == job.pid == os.getsid(job.pid) == os.getpgid(command)
    finally:
        reap(job.process)


def test_wrapper_enters_the_cgroup_before_the_release(run_cgroup: RunCgroup, tmp_path: pathlib.Path) -> None:
    job = start_script("sleep 1000", str(tmp_path), cgroup=run_cgroup, release=False)
    try:
        # start_job returned: the wrapper said ready, so it is already inside every hierarchy.
        assert all(str(job.pid) in read_text(f).split() for f in run_cgroup.procs_files())
        job.release()
        command = command_of(job.pid)
        assert command is not None and command in run_cgroup.members()
    finally:
        reap(job.process)


def test_environment_is_minimal_and_task_values_win(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QINGLONG_EDGE_SECRET_FOR_TEST", "do-not-leak")
    env = job_environment({"FOO": "bar", "PATH": "/bin:/usr/bin"}, run_id="r1", attempt_id="a1", home=str(tmp_path))
    job = start_job(_spec(tmp_path, [resolve_executable("env", env, str(tmp_path))], env=env))
    job.release()
    assert job.process.wait(timeout=5) == 0
    seen = dict(line.split("=", 1) for line in read_text(str(tmp_path / "job.log")).splitlines())
    assert seen == {"FOO": "bar", "PATH": "/bin:/usr/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
                    "QINGLONG_RUN_ID": "r1", "QINGLONG_ATTEMPT_ID": "a1"}


@pytest.mark.parametrize("name", ["no-such-program-xyz", "/nonexistent/bin/tool", "./missing"],
                         ids=["bare-name", "absolute", "relative"])
def test_rejects_missing_executables(tmp_path: pathlib.Path, name: str) -> None:
    with pytest.raises(ExecutionError) as info:
        resolve_executable(name, {"PATH": "/usr/bin:/bin"}, str(tmp_path))
    assert info.value.code == "command_not_found"


def test_resolves_like_execvp(tmp_path: pathlib.Path) -> None:
    assert resolve_executable("sh", {"PATH": "/nonexistent:/bin"}, str(tmp_path)) == "/bin/sh"
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o700)
    assert resolve_executable("./run.sh", {}, str(tmp_path)) == str(script)


def _refused(spec: JobSpec, code: str, **kwargs: object) -> None:
    before = _children()
    with pytest.raises(ExecutionError) as info:
        start_job(spec, **kwargs)  # type: ignore[arg-type]
    assert info.value.code == code, info.value
    assert _children() == before  # the wrapper was reaped: no zombie, nothing left


def _children() -> set[int]:
    me = os.getpid()
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = read_text(f"/proc/{name}/stat")
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                found.add(int(name))
    return found


def test_a_missing_working_directory_is_a_launch_failure(tmp_path: pathlib.Path) -> None:
    _refused(_spec(tmp_path, cwd=tmp_path / "gone"), "spawn_failed")


def test_a_symlinked_log_directory_is_refused(tmp_path: pathlib.Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "logs").symlink_to(tmp_path / "real")
    _refused(_spec(tmp_path, log=tmp_path / "logs" / "job.log"), "log_unavailable")
    assert os.listdir(tmp_path / "real") == []


def test_a_symlinked_log_file_is_refused(tmp_path: pathlib.Path) -> None:
    (tmp_path / "target").write_text("")
    (tmp_path / "job.log").symlink_to(tmp_path / "target")
    _refused(_spec(tmp_path), "log_unavailable")


def test_a_fifo_planted_as_the_log_does_not_hang_the_launch(tmp_path: pathlib.Path) -> None:
    os.mkfifo(tmp_path / "job.log", 0o600)
    _refused(_spec(tmp_path), "log_unavailable")


def test_a_group_writable_log_directory_is_refused(tmp_path: pathlib.Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs").chmod(0o770)
    _refused(_spec(tmp_path, log=tmp_path / "logs" / "job.log"), "log_unavailable")


def test_an_existing_receipt_means_the_attempt_already_ran(tmp_path: pathlib.Path) -> None:
    """Never twice: a receipt (or truncation fact) already published refuses the launch."""
    marker = tmp_path / "ran"
    (tmp_path / "receipts").mkdir(mode=0o700)
    (tmp_path / "receipts" / "r.json").write_text("{}")
    spec = _spec(tmp_path, ["/bin/sh", "-c", f"touch {marker}"],
                 receipt=Publication(str(tmp_path / "receipts" / "r.json"), b"{"), started_at_ms=1)
    _refused(spec, "already_published")
    assert not marker.exists()


def test_an_unwritable_cgroup_is_refused(tmp_path: pathlib.Path) -> None:
    fake = RunCgroup("x", {"v2": str(tmp_path / "no-such-cgroup")})
    _refused(_spec(tmp_path), "cgroup_unavailable", cgroup=fake)


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"argv": ["relative/tool"]}, "argv[0]"),
        ({"argv": ["/bin/echo", "a\0b"]}, "NUL"),
        ({"env": {"A=B": "x"}}, "environment"),
        ({"env": {"A": "x\0y"}}, "environment"),
        ({"cwd": "relative"}, "cwd"),
        ({"log": "/"}, "log_path"),
        ({"cap": 0}, "log_cap"),
        ({"cap": 4, "log_notice": b"12345"}, "log_cap"),
        ({"drain_ms": -1}, "drain_ms"),
        ({"terminate_grace_ms": 0}, "terminate_grace_ms"),
        ({"kill_grace_ms": 30_001}, "kill_grace_ms"),
        ({"receipt": Publication("/tmp/r.json", b"{")}, "started_at_ms"),
        ({"receipt": Publication("/tmp/r.json", b""), "started_at_ms": 1}, "prefix"),
        ({"truncation_fact": Publication("/tmp/f.json", b"{"), "fact_keys": ("bogus",)}, "fact_keys"),
        ({"isolation": Isolation(hide=["/"])}, "hidden"),
        ({"label": "has space"}, "label"),
    ],
    ids=["relative-argv0", "nul-arg", "env-name", "env-nul", "cwd", "log-root", "cap-zero", "notice-over-cap",
         "drain", "term-grace", "kill-grace", "receipt-no-start", "empty-prefix", "fact-keys", "hide-root", "label"],
)
def test_invalid_specs_are_refused_before_anything_starts(tmp_path: pathlib.Path, kwargs: dict[str, object],
                                                          what: str) -> None:
    spec = _spec(tmp_path, **kwargs)  # type: ignore[arg-type]
    before = _children()
    with pytest.raises(ExecutionError) as info:
        start_job(spec)
    assert info.value.code == "invalid_input" and what in str(info.value)
    assert _children() == before


def test_the_spec_repr_and_encoding_hide_nothing_they_should_not_show(tmp_path: pathlib.Path) -> None:
    secret = "hunter2-9f8e"
    spec = _spec(tmp_path, env={"TOKEN": secret}, receipt=Publication("/tmp/r.json", b'{"token":"tok-77"'),
                 started_at_ms=1)
    assert secret not in repr(spec) and "tok-77" not in repr(spec.receipt)
    encoded = encode_spec(spec)
    assert b"env 18\nTOKEN=" + secret.encode() + b"\n" in encoded  # it travels only here


def test_identity_capture_failure_discards_the_unstarted_process(tmp_path: pathlib.Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake on purpose: /proc cannot be made to fail for one real pid. The process is real."""
    import qinglong_edge.process.spawn as spawn_module

    started: list[int] = []

    def failing_capture(pid: int, **_: object) -> None:
        started.append(pid)
        raise ExecutionError("boom", code="provider_unavailable")

    monkeypatch.setattr(spawn_module, "capture", failing_capture)
    marker = tmp_path / "ran"
    with pytest.raises(ExecutionError) as info:
        start_job(_spec(tmp_path, ["/bin/sh", "-c", f"echo yes > {marker}"]))
    assert info.value.code == "identity_unavailable"
    assert started and not alive(started[0])  # killed and reaped
    with pytest.raises(ChildProcessError):
        os.waitpid(started[0], os.WNOHANG)
    assert not marker.exists()  # the job never ran


def test_protocol_constants_agree_with_the_wrapper_program() -> None:
    """The agent does not import the wrapper (its parse would cost the agent ~2.4 MiB)."""
    from qinglong_edge.process import spawn, wrapper

    for name in ("MAGIC", "RELEASE", "READY", "NOT_STARTED", "CANNOT_EXECUTE", "NOT_FOUND", "MAX_SPEC_BYTES",
                 "MAX_PREFIX_BYTES", "DEFAULT_DRAIN_MS", "MAX_DRAIN_MS", "FACT_KEYS", "DEFAULT_FACT_KEYS"):
        assert getattr(spawn, name) == getattr(wrapper, name), name
    from qinglong_edge.process import jobspec

    for name in ("DEFAULT_TERMINATE_GRACE_MS", "DEFAULT_KILL_GRACE_MS", "MAX_GRACE_MS"):
        assert getattr(jobspec, name) == getattr(wrapper, name), name


def test_the_wrapper_runs_compiled_from_a_memfd(tmp_path: pathlib.Path) -> None:
    import importlib.util
    import sys

    import qinglong_edge.process.spawn as spawn_module

    bytecode = spawn_module.wrapper_bytecode(sys.executable)
    assert bytecode.startswith(importlib.util.MAGIC_NUMBER) and b"qinglong-edge-job" in bytecode
    assert spawn_module.wrapper_bytecode(sys.executable) is bytecode  # made once per interpreter
    job = start_job(_spec(tmp_path, ["/bin/echo", "compiled"]))
    job.release()
    assert job.process.wait(10) == 0 and read_text(str(tmp_path / "job.log")) == "compiled\n"


@pytest.mark.parametrize("damage", ["truncated", "garbage_body", "not_code"])
def test_a_damaged_cached_wrapper_image_is_refused_and_jobs_still_run(tmp_path: pathlib.Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      damage: str) -> None:
    """Issue 23: the wrapper image cached in the runtime directory may be damaged (a power
    loss on a disk-backed fallback, garbage): it is refused, so the caller compiles again;
    before, a truncated image with a good header failed every launch."""
    import marshal
    import sys

    import qinglong_edge.process.spawn as spawn_module

    good = spawn_module.wrapper_bytecode(sys.executable)
    bad = {"truncated": good[:len(good) // 2], "garbage_body": good[:16] + b"\xff" * 64,
           "not_code": good[:16] + marshal.dumps(42)}[damage]
    monkeypatch.setattr(spawn_module, "_bytecode", {})
    assert spawn_module.remember_wrapper_bytecode(sys.executable, bad) is False
    assert spawn_module.remember_wrapper_bytecode(sys.executable, good) is True
    job = start_job(_spec(tmp_path, ["/bin/echo", "after a damaged cache"]))
    job.release()
    assert job.process.wait(10) == 0 and read_text(str(tmp_path / "job.log")) == "after a damaged cache\n"


def test_an_interpreter_that_cannot_compile_falls_back_to_the_source(tmp_path: pathlib.Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import qinglong_edge.process.spawn as spawn_module

    monkeypatch.setattr(spawn_module, "_bytecode", {sys.executable: b""})  # as after a failed compile helper
    job = start_job(_spec(tmp_path, ["/bin/echo", "from source"]))
    job.release()
    assert job.process.wait(10) == 0 and read_text(str(tmp_path / "job.log")) == "from source\n"


def test_missing_log_directories_are_created_0700_below_a_shared_one(tmp_path: pathlib.Path) -> None:
    """The log's own directory must be private; its ancestors may be anyone's (/tmp)."""
    import tempfile

    shared = pathlib.Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        shared.chmod(0o1777)  # like /tmp
        log = shared / "a" / "b" / "job.log"
        job = start_job(_spec(tmp_path, ["/bin/echo", "ok"], log=log))
        job.release()
        assert job.process.wait(10) == 0 and log.read_text() == "ok\n"
        for directory in (shared / "a", shared / "a" / "b"):
            assert directory.stat().st_mode & 0o777 == 0o700
        assert log.stat().st_mode & 0o777 == 0o600
    finally:
        import shutil

        shutil.rmtree(shared)
