"""Start one Run's command as a real process and capture its identity (no database here).

The process:

* runs in a new session (``setsid``), so its process group id is its pid and the group
  can be signalled as a whole (local-api.md 7.3);
* enters the Run's cgroups *before* it runs any job code: when there is a cgroup it is
  started as ``/bin/sh -c ENTER_SCRIPT qinglong-edge-enter N procs1..procsN argv...``, a
  six-line shell that writes its own pid into each ``cgroup.procs`` and then ``exec``\\ s
  the command (same pid, same start time). If the write fails it exits 125 before the
  job starts. ``preexec_fn`` is not used: it can deadlock a process that has threads;
* gets stdin from ``/dev/null``, stdout and stderr on the Run's log FIFO
  (:mod:`qinglong_edge.execution.logs`), and no other descriptor of ours except the
  FIFO's keep-alive read end;
* gets a minimal environment (:func:`job_environment`): a fixed ``PATH``, ``HOME``,
  ``LANG``, ``QINGLONG_RUN_ID``, ``QINGLONG_ATTEMPT_ID`` and the task's own variables.
  Nothing of the agent's environment (credentials, pepper paths, ``QINGLONG_EDGE_*``)
  is passed on;
* has its executable resolved here, in the agent, against that ``PATH`` and the working
  directory, so a missing command is a launch failure (``EXECUTOR_START_FAILED``) with
  or without a cgroup, rather than a Run that fails with 127 in one case only.

Signal dispositions: handlers are reset by ``exec``; ``SIGPIPE``/``SIGXFSZ`` are
restored by :mod:`subprocess`. The agent must not *ignore* SIGTERM/SIGINT/SIGHUP
(ignored dispositions survive ``exec``); ``serve`` installs handlers instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from qinglong_edge.contracts.ids import new_uuid4
from qinglong_edge.errors import ExecutionError
from qinglong_edge.execution.cgroups import RunCgroup
from qinglong_edge.execution.identity import ProcessIdentity, capture, encode_handle

__all__ = [
    "BASE_PATH",
    "ENTER_SCRIPT",
    "Spawned",
    "job_environment",
    "resolve_executable",
    "spawn",
]

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHELL = "/bin/sh"

#: Runs as ``sh -c ENTER_SCRIPT qinglong-edge-enter N file1..fileN argv...``.
ENTER_SCRIPT = """n=$1; shift
while [ "$n" -gt 0 ]; do
  echo $$ > "$1" || exit 125
  shift; n=$((n - 1))
done
exec "$@"
"""


@dataclass(frozen=True, slots=True)
class Spawned:
    """A started process we own.

    Attributes:
        process: the :class:`subprocess.Popen` (never ``poll()``-ed: the controller
            reaps the leader itself, only after the Run's stop or completion).
        identity: boot id, pid, process group, start time.
        handle: the durable ``ql3lp1.`` handle.
        started_at_ms: wall clock when the process was started (ms since the epoch).
    """

    process: subprocess.Popen[bytes]
    identity: ProcessIdentity
    handle: str
    started_at_ms: int

    @property
    def pid(self) -> int:
        return self.identity.pid


def job_environment(
    task_environment: Mapping[str, str], *, run_id: str, attempt_id: str, home: str
) -> dict[str, str]:
    """The whole environment of a job: base variables, then the task's own (which win)."""
    env = {
        "PATH": BASE_PATH,
        "HOME": home,
        "LANG": "C.UTF-8",
        "QINGLONG_RUN_ID": run_id,
        "QINGLONG_ATTEMPT_ID": attempt_id,
    }
    env.update(task_environment)
    return env


def resolve_executable(name: str, env: Mapping[str, str], cwd: str) -> str:
    """Absolute path of the program ``name`` as ``execvp`` would find it.

    Raises:
        ExecutionError: ``command_not_found``.
    """
    if "/" in name:
        path = name if os.path.isabs(name) else os.path.join(cwd, name)
        candidates = [path]
    else:
        candidates = [os.path.join(d or ".", name) for d in env.get("PATH", BASE_PATH).split(":")]
        candidates = [c if os.path.isabs(c) else os.path.join(cwd, c) for c in candidates]
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise ExecutionError("the command is not an executable file", code="command_not_found")


def spawn(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    stdout_fd: int,
    keep_fds: Sequence[int] = (),
    cgroup: RunCgroup | None = None,
) -> Spawned:
    """Start ``argv`` (``argv[0]`` resolved with :func:`resolve_executable`).

    Args:
        argv: the command; for a shell command pass ``["/bin/sh", "-c", text]``.
        cwd: an existing absolute directory.
        env: the complete environment (see :func:`job_environment`).
        stdout_fd: where stdout and stderr go (the log FIFO's write end); the caller
            closes its copy afterwards.
        keep_fds: descriptors the job inherits at the same numbers.
        cgroup: the Run's cgroup, entered before the command runs.

    Returns:
        the :class:`Spawned` process with its captured identity.

    Raises:
        ExecutionError: ``command_not_found``, ``spawn_failed`` (fork/exec/cwd error), or
            ``identity_unavailable`` (the identity could not be captured: the process,
            which we then own without a handle, has been killed and reaped).
    """
    if not argv:
        raise ExecutionError("empty command", code="invalid_input")
    program = resolve_executable(argv[0], env, cwd)
    command = [program, *argv[1:]]
    if cgroup is not None:
        files = cgroup.procs_files()
        command = [SHELL, "-c", ENTER_SCRIPT, "qinglong-edge-enter", str(len(files)), *files, *command]
    started_at_ms = time.time_ns() // 1_000_000
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=stdout_fd,
            stderr=stdout_fd,
            cwd=cwd,
            env=dict(env),
            close_fds=True,
            pass_fds=tuple(keep_fds),
            start_new_session=True,
            restore_signals=True,
        )
    except OSError as exc:
        raise ExecutionError(f"the command could not start: {exc.strerror}", code="spawn_failed") from None
    try:
        identity = capture(process.pid)
        if identity is None or identity.pgid != process.pid:
            raise ExecutionError("process identity is unavailable", code="identity_unavailable")
        handle = encode_handle(new_uuid4(), identity)
    except ExecutionError:
        _discard(process, cgroup)
        raise ExecutionError("process identity is unavailable", code="identity_unavailable") from None
    return Spawned(process=process, identity=identity, handle=handle, started_at_ms=started_at_ms)


def _discard(process: subprocess.Popen[bytes], cgroup: RunCgroup | None) -> None:
    """Kill a process we started but cannot own durably, and reap it.

    It is our unreaped child, so its pid and group number cannot have been recycled.
    """
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)
    if cgroup is not None:
        with contextlib.suppress(ExecutionError):
            cgroup.kill()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        process.wait(timeout=5)
