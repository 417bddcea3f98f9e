"""Start one job under the job wrapper, held at the start barrier (no database here).

Shared by Local Runs (:mod:`qinglong_edge.execution.launcher`) and remote runs (the
runner in :mod:`qinglong_edge.worker`): the caller builds a :class:`JobSpec`, calls
:func:`start_job`, records the durable identity of the returned :class:`HeldJob`
(``handle``), then :meth:`HeldJob.release`\\ s it. The wrapper
(:mod:`qinglong_edge.process.wrapper`, a small Python program of ours) is the job's
session and process-group leader and stays the command's parent: it enters the job's
cgroups first, holds the start barrier, passes TERM/INT/HUP on to the job's process
group once, writes the capped log and, at the end, the truncation fact and the durable
receipt. Its identity is the job's identity (boot id, pid = process group = session,
start time).

Guarantees:

* **Start barrier.** The command runs only after :meth:`HeldJob.release`. If the agent
  dies before (or :meth:`HeldJob.abort` is called), the wrapper reads end of file and
  exits :data:`NOT_STARTED` (125) without running anything. :func:`start_job` returns
  only once the wrapper answered ``ready`` (spec checked, cgroups entered, log and
  publication directories open), so a log or cgroup problem is a launch failure, not a
  job that fails later.
* **Identity before release.** The identity is captured right after the fork, while the
  wrapper is held; a failure to capture it kills and reaps the wrapper
  (``identity_unavailable``).
* **Secrets** (the job's environment) travel only through the control pipe: never in
  the wrapper's argv (``/proc/<pid>/cmdline`` shows ``python3 -I -S /proc/self/fd/N
  qinglong-edge-job LABEL``), its environment (empty) or a file. The spec buffer is
  overwritten after the write; Python cannot zero the ``str`` values the caller passed.
* **The command gets only fds 0, 1, 2** (``/dev/null``, the wrapper's output pipe twice),
  default signal dispositions and an empty signal mask.
* **Executable resolution** is the caller's: Local resolves ``argv[0]`` against the
  job's ``PATH`` with :func:`resolve_executable` first (a missing command is a launch
  failure); a remote ``file`` is absolute by contract. A command that still cannot be
  executed ends with 126/127 and one line in its log, as a shell would.

Signal dispositions: the agent must not *ignore* SIGTERM/SIGINT/SIGHUP (``serve`` and
``pull`` install handlers); the wrapper resets every disposition in the child anyway.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping

from qinglong_edge.contracts.ids import new_uuid4
from qinglong_edge.errors import ExecutionError, LogStorageUnavailable
from qinglong_edge.filecheck import write_all
from qinglong_edge.process.cgroups import RunCgroup
from qinglong_edge.process.identity import ProcessIdentity, capture, encode_handle
from qinglong_edge.process.jobspec import (
    CANNOT_EXECUTE,
    DEFAULT_DRAIN_MS,
    DEFAULT_FACT_KEYS,
    FACT_KEYS,
    MAGIC,
    MAX_DRAIN_MS,
    MAX_PREFIX_BYTES,
    MAX_SPEC_BYTES,
    NOT_FOUND,
    NOT_STARTED,
    PID_NAMESPACE,
    PID_NONE,
    PID_PRIVATE_PROC,
    READY,
    RELEASE,
    Isolation,
    JobSpec,
    Publication,
    encode_spec,
    wipe,
)

__all__ = [
    "BASE_PATH",
    "CANNOT_EXECUTE",
    "DEFAULT_DRAIN_MS",
    "DEFAULT_FACT_KEYS",
    "FACT_KEYS",
    "MAGIC",
    "MAX_DRAIN_MS",
    "MAX_PREFIX_BYTES",
    "MAX_SPEC_BYTES",
    "NOT_FOUND",
    "NOT_STARTED",
    "PID_NAMESPACE",
    "PID_NONE",
    "PID_PRIVATE_PROC",
    "READY",
    "RELEASE",
    "HeldJob",
    "Isolation",
    "JobSpec",
    "Publication",
    "encode_spec",
    "exit_status_unreaped",
    "job_environment",
    "remember_wrapper_bytecode",
    "resolve_executable",
    "start_job",
    "wrapper_argv",
    "wrapper_bytecode",
    "wrapper_source",
]

def exit_status_unreaped(process: subprocess.Popen[bytes] | None) -> int | None:
    """Our child's exit status without reaping it (``waitid`` with ``WNOWAIT``), or None
    while it runs, when it is not our child (``process`` None: an adopted job) or gone.

    A zombie leader keeps its pid and group number pinned, so the group can still be
    checked and signalled safely until the caller reaps it. Death by signal N is 128 + N.
    The one reading of an exit that Local Runs and remote runs share.
    """
    if process is None:
        return None
    if process.returncode is not None:
        code = process.returncode
        return code if code >= 0 else 128 - code
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None or info.si_pid == 0:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else 128 + info.si_status


BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: The wrapper's ``argv[1]`` (what ``ps`` shows after the interpreter and the fd path).
WRAPPER_NAME = "qinglong-edge-job"
#: How long :func:`start_job` waits for the wrapper's ``ready`` by default (s): Python's
#: start-up on a slow router takes a good part of a second.
READY_TIMEOUT_S = 30.0
#: Wrapper error codes -> ExecutionError codes of a launch failure.
_FAILURES = {
    "cgroup_unavailable": "cgroup_unavailable",
    "log_unavailable": "log_unavailable",
    "publication_unavailable": "log_unavailable",
    "already_published": "already_published",
    "lease_unavailable": "lease_unavailable",
}
#: Use a sealed memfd for the wrapper's program (else a pipe, with its source); tests
#: switch it off.
USE_MEMFD = True
_source: bytes | None = None
#: interpreter -> the wrapper compiled by it (``.pyc`` bytes), or b"" when that failed.
_bytecode: dict[str, bytes] = {}
#: Run once per interpreter by :func:`wrapper_bytecode`: source on stdin, ``.pyc`` out.
_COMPILE = (
    "import marshal, sys\n"
    "source = sys.stdin.buffer.read()\n"
    "code = compile(source, 'qinglong-edge-job', 'exec', dont_inherit=True, optimize=2)\n"
    "magic = sys.modules['_frozen_importlib_external'].MAGIC_NUMBER\n"
    "sys.stdout.buffer.write(magic + bytes(12) + marshal.dumps(code))\n"
)


def wrapper_source() -> bytes:
    """The wrapper program's source, read through our own loader (a file or the zipapp)."""
    global _source
    if _source is None:
        path = os.path.join(os.path.dirname(__file__), "wrapper.py")
        get_data = getattr(globals().get("__loader__"), "get_data", None)
        try:
            data = get_data(path) if get_data is not None else None
            if not isinstance(data, bytes):
                with open(path, "rb") as handle:
                    data = handle.read()
        except OSError as exc:
            raise ExecutionError(f"the job wrapper's source is unreadable: {exc.strerror}",
                                 code="spawn_failed") from None
        _source = data
    return _source


def wrapper_bytecode(python: str) -> bytes:
    """The wrapper compiled by ``python`` (a ``.pyc`` image: magic, 12 bytes, marshal),
    made once per interpreter by a short-lived ``python -I -S -c`` and kept (about 54 KB).

    Why: Python parsing the wrapper's 36 KB of source costs each wrapper some 2.4 MiB for
    its whole life (measured: USS 5.2 vs 2.9 MiB); compiling in the agent would cost the
    agent as much, once and for good. The helper costs one interpreter start, once.
    Docstrings are stripped (``optimize=2``). Returns ``b""`` when it fails (the source
    is used then).
    """
    cached = _bytecode.get(python)
    if cached is not None:
        return cached
    try:
        proc = subprocess.run([python, "-I", "-S", "-c", _COMPILE], input=wrapper_source(), capture_output=True,
                              env={}, cwd="/", timeout=60, check=False)
        data = proc.stdout if proc.returncode == 0 and len(proc.stdout) > 16 else b""
    except (OSError, subprocess.SubprocessError):
        data = b""
    _bytecode[python] = data
    return data


def remember_wrapper_bytecode(python: str, data: bytes) -> bool:
    """Use ``data`` as the wrapper compiled by ``python`` (a ``.pyc`` image a caller kept,
    e.g. in its runtime directory, from an earlier :func:`wrapper_bytecode`), so this
    process need not run the compiler. Only an image that starts with this interpreter's
    magic number is taken (True), and only for ``sys.executable``; the caller keys its
    cache by the interpreter and the source's digest. An image that does not load as one
    code object (truncated or garbage after the header: a damaged cache) is refused
    (False), so the caller compiles again: a damaged cache never fails every launch."""
    magic = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", None)
    if python != sys.executable or not isinstance(magic, bytes) or len(data) <= 16 or not data.startswith(magic):
        return False
    import marshal  # built in; only here (a cached image is checked once per process)

    try:
        # Our own cache (a private file of this user, which runs it anyway): checked, not trusted more.
        code = marshal.loads(memoryview(data)[16:])  # noqa: S302
    except (EOFError, ValueError, TypeError):
        return False
    if type(code).__name__ != "code":
        return False
    _bytecode[python] = data
    return True


def wrapper_argv(source_fd: int, label: str = "", python: str | None = None) -> list[str]:
    """How the wrapper is started (what ``ps`` shows)."""
    argv = [python or sys.executable, "-I", "-S", f"/proc/self/fd/{source_fd}", WRAPPER_NAME]
    return [*argv, label] if label else argv


def _above_stdio(fd: int) -> int:
    """``fd`` itself, or a close-on-exec duplicate above 2 (then ``fd`` is closed).

    An agent started with fd 0, 1 or 2 closed (a daemon, a test runner) gets those
    numbers back from ``pipe``/``open``; the source descriptor must not collide with the
    wrapper's stdio, which the child sets up with ``dup2`` before ``exec``.
    """
    if fd > 2:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved


def _source_descriptor(python: str) -> tuple[int, int]:
    """``(fd the wrapper reads its program from, pipe write end or -1)``.

    A sealed memfd holds the compiled wrapper (Python runs a ``.pyc`` image from a
    seekable file: it checks the magic number first); a pipe, where memfd is missing,
    gets the source (a pipe cannot be sniffed for the magic).
    """
    if USE_MEMFD and hasattr(os, "memfd_create"):
        source = wrapper_bytecode(python) or wrapper_source()
        try:
            fd = os.memfd_create("qinglong-edge-job", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                write_all(fd, source)
                seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
            except OSError:
                os.close(fd)  # no memory for it, or no sealing: the pipe below will do
            else:
                return _above_stdio(fd), -1
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    return _above_stdio(read_end), write_end


class HeldJob:
    """A started job held at the start barrier until :meth:`release`.

    Attributes:
        process: the wrapper's :class:`subprocess.Popen` (the caller reaps it, only
            after the job's stop or completion: while unreaped, its pid and group
            number stay pinned).
        identity: the wrapper's boot id, pid, process group (= pid) and start time: the
            job's identity.
        handle: the durable ``ql3lp1.`` handle of ``identity``.
        started_at_ms: wall clock just before the fork (ms since the epoch).
        control_fd: our end of the start barrier, -1 once released or aborted.
        cgroup: the job's cgroup (the wrapper is already inside).
    """

    __slots__ = ("cgroup", "control_fd", "handle", "identity", "process", "started_at_ms")

    def __init__(self, process: subprocess.Popen[bytes], identity: ProcessIdentity, handle: str,  # noqa: PLR0917
                 started_at_ms: int, control_fd: int, cgroup: RunCgroup | None) -> None:
        self.process = process
        self.identity = identity
        self.handle = handle
        self.started_at_ms = started_at_ms
        self.control_fd = control_fd
        self.cgroup = cgroup

    @property
    def pid(self) -> int:
        return self.process.pid

    def release(self) -> None:
        """Let the command run (after the handle is durable).

        Raises:
            ExecutionError: ``spawn_failed`` if the wrapper is already gone.
        """
        fd, self.control_fd = self.control_fd, -1
        if fd < 0:
            raise ExecutionError("the job was already released or aborted", code="spawn_failed")
        try:
            os.write(fd, RELEASE)
        except OSError:
            raise ExecutionError("the job exited before it was released", code="spawn_failed") from None
        finally:
            os.close(fd)

    def abort(self) -> int | None:
        """Never start the command: close the barrier, kill the wrapper (and its cgroup),
        reap it. It is our unreaped child, so its pid and group cannot have been recycled.

        Returns:
            its exit status (:meth:`subprocess.Popen.wait`), or ``None`` if it did not
            exit within 5 s.
        """
        if self.control_fd >= 0:
            os.close(self.control_fd)
            self.control_fd = -1
        return _discard(self.process, self.cgroup)


def _write_spec(fd: int, data: bytearray, deadline: float) -> None:
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ExecutionError("the job wrapper did not read its spec in time", code="spawn_failed") from None
                select.select([], [fd], [], remaining)
            except OSError:
                raise ExecutionError("the job wrapper exited before reading its spec", code="spawn_failed") from None
    finally:
        view.release()
        os.set_blocking(fd, True)


def _read_answer(fd: int, deadline: float) -> bytes:
    answer = b""
    while not answer.endswith(b"\n") and len(answer) < 2048:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return b""
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(fd, 2048)
        if not chunk:
            break
        answer += chunk
    return answer


def start_job(
    spec: JobSpec,
    *,
    cgroup: RunCgroup | None = None,
    python: str | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> HeldJob:
    """Start ``spec`` under the job wrapper, held at the start barrier.

    Call :meth:`HeldJob.release` once ``handle`` is recorded, or :meth:`HeldJob.abort`.

    Args:
        spec: the job (:class:`JobSpec`).
        cgroup: the job's cgroup, entered by the wrapper before anything else.
        python: the interpreter (default ``sys.executable``).
        ready_timeout_s: how long to wait for the wrapper's ``ready``.

    Returns:
        the :class:`HeldJob` with its captured identity.

    Raises:
        ExecutionError: ``invalid_input`` (the spec), ``spawn_failed`` (the wrapper could
            not start, or the cwd is missing), ``cgroup_unavailable``, ``log_unavailable``
            (log, fact or receipt directory; as :class:`LogStorageUnavailable` when it
            could not be created because its file system is full: ENOSPC, EDQUOT, EIO),
            ``already_published`` (the receipt or fact
            exists: this attempt already ran), ``identity_unavailable``. In every case
            nothing ran and the wrapper is reaped.
    """
    data = encode_spec(spec, cgroup)
    try:
        return _start(spec, data, cgroup, python, ready_timeout_s)
    finally:
        wipe(data)


def _start(spec: JobSpec, data: bytearray, cgroup: RunCgroup | None, python: str | None,
           ready_timeout_s: float) -> HeldJob:
    label = spec.label
    interpreter = python or sys.executable
    if not interpreter:
        raise ExecutionError("no Python interpreter to run the job wrapper (sys.executable is empty)",
                             code="spawn_failed")
    source_fd, source_writer = _source_descriptor(interpreter)
    control_r = control_w = status_r = status_w = devnull = -1
    try:
        control_r, control_w = os.pipe2(os.O_CLOEXEC)
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        started_at_ms = time.time_ns() // 1_000_000
        try:
            process = subprocess.Popen(
                wrapper_argv(source_fd, label, interpreter), stdin=control_r, stdout=status_w, stderr=devnull,
                pass_fds=(source_fd,), cwd="/", env={}, close_fds=True, start_new_session=True,
                restore_signals=True,
            )
        except OSError as exc:
            raise ExecutionError(f"the job wrapper could not start: {exc.strerror}", code="spawn_failed") from None
    except BaseException:
        for fd in (control_r, control_w, status_r, status_w, devnull, source_fd, source_writer):
            if fd >= 0:
                os.close(fd)
        raise
    for fd in (control_r, status_w, devnull, source_fd):
        os.close(fd)
    held = HeldJob(process, _NO_IDENTITY, "", started_at_ms, control_w, cgroup)
    try:
        try:
            identity = capture(process.pid)
            if identity is None or identity.pgid != process.pid:
                raise ExecutionError("process identity is unavailable", code="identity_unavailable")
            held.identity = identity
            held.handle = encode_handle(new_uuid4(), identity)
        except ExecutionError:
            raise ExecutionError("process identity is unavailable", code="identity_unavailable") from None
        deadline = time.monotonic() + ready_timeout_s
        if source_writer >= 0:
            _write_spec(source_writer, bytearray(wrapper_source()), deadline)
            os.close(source_writer)
            source_writer = -1
        _write_spec(control_w, data, deadline)
        answer = _read_answer(status_r, deadline)
        if answer != READY:
            raise _refusal(answer)
    except BaseException:
        if source_writer >= 0:
            os.close(source_writer)
        held.abort()
        raise
    finally:
        os.close(status_r)
    return held


#: Errors of the log's (or a publication's) file system that go away by themselves
#: (space freed, a transient I/O error): a launch failing on them is storage failing, not
#: the Run's fault (issue 17 item 3).
_STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO)


def _storage_failure(detail: str) -> bool:
    """The wrapper's detail (``PATH: strerror``, the same C library's text) names one of
    :data:`_STORAGE_ERRNOS`."""
    return any(detail.endswith(": " + os.strerror(number)) for number in _STORAGE_ERRNOS)


def _refusal(answer: bytes) -> ExecutionError:
    """The wrapper's ``error CODE TEXT`` (or silence) as a launch failure.

    A log or publication that could not be created because its file system is full
    (or failing: :data:`_STORAGE_ERRNOS`) is :class:`LogStorageUnavailable` (still code
    ``log_unavailable``), so the caller can retry the launch later instead of failing it.
    """
    text = answer.decode("utf-8", "replace").strip()
    if not text.startswith("error "):
        return ExecutionError("the job wrapper did not become ready", code="spawn_failed")
    code, _, detail = text[len("error "):].partition(" ")
    mapped = _FAILURES.get(code, "spawn_failed")
    message = f"the job could not be prepared: {detail}"[:300]
    if mapped == "log_unavailable" and _storage_failure(detail):
        return LogStorageUnavailable(message)
    return ExecutionError(message, code=mapped)


_NO_IDENTITY = ProcessIdentity("none", 1, 1, "1")


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


def job_environment(
    task_environment: Mapping[str, str], *, run_id: str, attempt_id: str, home: str
) -> dict[str, str]:
    """The whole environment of a Local job: base variables, then the task's own (which win)."""
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
