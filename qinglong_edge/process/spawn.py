"""Start one Run's command as a real process and capture its identity (no database here).

The process:

* runs in a new session (``setsid``), so its process group id is its pid and the group
  can be signalled as a whole (local-api.md 7.3);
* starts as ``/bin/sh -c ENTER_SCRIPT qinglong-edge-enter N procs1..procsN argv...``,
  a few lines of shell that (1) write their own pid into each ``cgroup.procs`` of the
  Run's cgroups, so the job cannot fork before it is inside, then (2) wait for the line
  ``go`` on the *gate* pipe (its stdin) and only then (3) ``exec`` the command with stdin
  from ``/dev/null`` (same pid, same start time). ``preexec_fn`` is not used: it can
  deadlock a process that has threads.
  The gate is the start barrier: the launcher records the durable handle first and
  :meth:`Spawned.release`\\ s the job after the commit. If the agent dies before that, the
  gate's write end closes, ``read`` sees end of file and the wrapper exits 125: no job
  code ever runs without a recorded owner. Any failure in (1) or (2) also exits 125;
* gets stdin from ``/dev/null``, stdout and stderr on the Run's log FIFO
  (:mod:`qinglong_edge.process.logs`), and no other descriptor of ours except the
  FIFO's keep-alive read end;
* gets a minimal environment (:func:`job_environment`): a fixed ``PATH``, ``HOME``,
  ``LANG``, ``QINGLONG_RUN_ID``, ``QINGLONG_ATTEMPT_ID`` and the task's own variables.
  Nothing of the agent's environment (credentials, pepper paths, ``QINGLONG_EDGE_*``)
  is passed on;
* has its executable resolved here, in the agent, against that ``PATH`` and the working
  directory, so a missing command is a launch failure (``EXECUTOR_START_FAILED``)
  rather than a Run whose wrapper fails to ``exec`` (127).

Signal dispositions: handlers are reset by ``exec``; ``SIGPIPE``/``SIGXFSZ`` are
restored by :mod:`subprocess`. The agent must not *ignore* SIGTERM/SIGINT/SIGHUP
(ignored dispositions survive ``exec``); ``serve`` installs handlers instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from qinglong_edge.contracts.ids import new_uuid4
from qinglong_edge.errors import ExecutionError
from qinglong_edge.process.cgroups import RunCgroup
from qinglong_edge.process.identity import ProcessIdentity, capture, encode_handle

__all__ = [
    "BASE_PATH",
    "ENTER_SCRIPT",
    "NOT_STARTED",
    "Spawned",
    "job_environment",
    "resolve_executable",
    "spawn",
]

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHELL = "/bin/sh"

#: Runs as ``sh -c ENTER_SCRIPT qinglong-edge-enter N file1..fileN argv...`` with the gate
#: pipe as stdin (dash and busybox only redirect descriptors 0-9, so the gate cannot be
#: an arbitrary inherited descriptor); the job gets ``/dev/null`` as stdin.
ENTER_SCRIPT = """n=$1; shift
while [ "$n" -gt 0 ]; do
  echo $$ > "$1" || exit 125
  shift; n=$((n - 1))
done
IFS= read -r go || exit 125
[ "$go" = go ] || exit 125
exec "$@" </dev/null
"""
#: Exit status of the wrapper when the job was never started.
NOT_STARTED = 125


@dataclass(slots=True)
class Spawned:
    """A started process we own, held at the start barrier until :meth:`release`.

    Attributes:
        process: the :class:`subprocess.Popen` (never ``poll()``-ed: the controller
            reaps the leader itself, only after the Run's stop or completion).
        identity: boot id, pid, process group, start time.
        handle: the durable ``ql3lp1.`` handle.
        started_at_ms: wall clock when the process was started (ms since the epoch).
        gate_fd: our end of the start barrier, -1 once released or aborted.
    """

    process: subprocess.Popen[bytes]
    identity: ProcessIdentity
    handle: str
    started_at_ms: int
    gate_fd: int
    cgroup: RunCgroup | None = None

    @property
    def pid(self) -> int:
        return self.identity.pid

    def release(self) -> None:
        """Let the job run (after its handle is durable).

        Raises:
            ExecutionError: ``spawn_failed`` if the wrapper is already gone.
        """
        fd, self.gate_fd = self.gate_fd, -1
        try:
            os.write(fd, b"go\n")
        except OSError:
            raise ExecutionError("the job exited before it was released", code="spawn_failed") from None
        finally:
            os.close(fd)

    def abort(self) -> int | None:
        """Never start the job: close the gate, kill the wrapper (and its cgroup), reap it.

        It is our unreaped child, so its pid and group number cannot have been recycled.

        Returns:
            its exit status (see :meth:`subprocess.Popen.wait`), or ``None`` if it did not
            exit within 5 s.
        """
        if self.gate_fd >= 0:
            os.close(self.gate_fd)
            self.gate_fd = -1
        return _discard(self.process, self.cgroup)


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
        path = name if os.path.isabs(name) else os.path.normpath(os.path.join(cwd, name))
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
    """Start ``argv`` (``argv[0]`` resolved with :func:`resolve_executable`) held at the
    start barrier; call :meth:`Spawned.release` once its handle is recorded.

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
            ``identity_unavailable`` (the identity could not be captured: the wrapper,
            which never started the job, has been killed and reaped).
    """
    if not argv:
        raise ExecutionError("empty command", code="invalid_input")
    program = resolve_executable(argv[0], env, cwd)
    files = cgroup.procs_files() if cgroup is not None else []
    raw = os.pipe2(os.O_CLOEXEC)
    gate_read, gate_write = _above_stdio(*raw)
    for fd, original in zip((gate_read, gate_write), raw, strict=True):
        if fd != original:
            os.close(original)
    inherited = _above_stdio(*keep_fds)
    command = [SHELL, "-c", ENTER_SCRIPT, "qinglong-edge-enter", str(len(files)), *files, program, *argv[1:]]
    started_at_ms = time.time_ns() // 1_000_000
    try:
        process = subprocess.Popen(
            command,
            stdin=gate_read,
            stdout=stdout_fd,
            stderr=stdout_fd,
            cwd=cwd,
            env=dict(env),
            close_fds=True,
            pass_fds=inherited,
            start_new_session=True,
            restore_signals=True,
        )
    except OSError as exc:
        os.close(gate_write)
        raise ExecutionError(f"the command could not start: {exc.strerror}", code="spawn_failed") from None
    finally:
        os.close(gate_read)
        for fd, original in zip(inherited, keep_fds, strict=True):
            if fd != original:
                os.close(fd)
    spawned = Spawned(process, _NO_IDENTITY, "", started_at_ms, gate_write, cgroup)
    try:
        identity = capture(process.pid)
        if identity is None or identity.pgid != process.pid:
            raise ExecutionError("process identity is unavailable", code="identity_unavailable")
        spawned.identity = identity
        spawned.handle = encode_handle(new_uuid4(), identity)
    except ExecutionError:
        spawned.abort()
        raise ExecutionError("process identity is unavailable", code="identity_unavailable") from None
    return spawned


_NO_IDENTITY = ProcessIdentity("none", 1, 1, "1")


def _above_stdio(*fds: int) -> tuple[int, ...]:
    """The same descriptors, duplicated above 2 where needed.

    An agent started with fd 0, 1 or 2 closed (a daemon, a test runner) gets those
    numbers back from ``pipe``/``open``; a kept descriptor must not collide with the
    job's stdio, which the child sets up with ``dup2`` before ``exec``.
    """
    moved = []
    for fd in fds:
        if fd > 2:
            moved.append(fd)
            continue
        moved.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3))
    return tuple(moved)


def _discard(process: subprocess.Popen[bytes], cgroup: RunCgroup | None) -> int | None:
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)
    if cgroup is not None:
        with contextlib.suppress(ExecutionError):
            cgroup.kill()
    try:
        return process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None
