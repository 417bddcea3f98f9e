"""A remote run's process: launch under the job wrapper, re-adopt, observe, stop, outcome.

The same process core as Local Runs (:mod:`qinglong_edge.process.spawn` ``start_job``, the
job wrapper, :mod:`qinglong_edge.process.stop`, per-run cgroups with the PID cap), with the
remote rules of remote-execution.md 4 and the spec README decisions:

* **Log** (4.3; "Logs"): raw head up to ``worker.maxLogBytes`` (bytes already in the file
  count), no notice line; the truncation fact records whether output was cut. Before
  ``launching`` the log root must have ``cap + worker.logMinimumFreeBytes`` free
  (``statvfs``), else the start fails (T3).
* **Receipt** (4.2; "The job wrapper"): the wrapper publishes
  ``<journal>/receipts/<attemptId[0:2]>/<attemptId>.json`` with the callback token when
  the command ends; :func:`read_outcome` authenticates it against the record.
* **No receipt**: a job verified gone without one completes with what was observed:
  the status reaped as its parent, else 143/137 when we signalled SIGTERM/SIGKILL last,
  else 255 ("outcome lost").
* **Isolation** ("Isolation"): where :func:`isolation_available` (a real isolated job;
  a positive answer remembered in the runtime directory for the boot) says it works, the
  command runs in a private user + mount + PID namespace hiding ``RemoteLimits.hidden``
  and binding ``RemoteLimits.readonly`` read-only, at the PID level the probe found.
* **Cgroup** per job, ``remote-<attemptId>`` under the agent's ``qinglong-edge/``
  (a Local Run's cgroup is named by its UUID attempt id, so the names never meet), with
  ``pids.max`` = the PID cap on the v1 pids hierarchy, exactly as Local Runs.
* **The wrapper's program** is compiled once per boot and interpreter: the ``.pyc`` image
  is kept in the runtime directory under a name keyed by the interpreter, its version
  and the source's digest (:func:`prime_wrapper`), so a cron ``pull`` that launches a job
  does not pay a compiler start-up; only while remote jobs are isolated (without, a job
  could replace it: nothing a job can write is trusted later, issue 24).
* **Memory**: the job runs in its memory leaf (``execution.maxRunMemoryBytes``); an OOM
  kill there is the outcome's ``reason`` ``out_of_memory`` (:func:`read_outcome`).

Errors: :class:`LaunchFailure` (a ``start_failed`` reason: the job never ran) and
:class:`~qinglong_edge.errors.ExecutionError` from the process core.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess
import sys

from qinglong_edge.contracts.digest import sha256_hex
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.launch import Environment, LaunchPlan
from qinglong_edge.contracts.receipt import (
    CallbackToken,
    authenticate_receipt,
    parse_receipt,
    parse_truncation_fact,
    receipt_prefix,
    truncation_fact_prefix,
)
from qinglong_edge.contracts.strictjson import dumps_bytes, loads
from qinglong_edge.errors import EdgeError, ExecutionError, JournalError
from qinglong_edge.filecheck import stat_problem
from qinglong_edge.process.cgroups import CgroupManager, RunCgroup, out_of_memory
from qinglong_edge.process.identity import Liveness, ProcessIdentity, decode_handle, probe
from qinglong_edge.process.logs import read_receipt, read_truncation_fact
from qinglong_edge.process.spawn import (
    PID_NAMESPACE,
    PID_NONE,
    PID_PRIVATE_PROC,
    HeldJob,
    Isolation,
    JobSpec,
    Publication,
    exit_status_unreaped,
    remember_wrapper_bytecode,
    start_job,
    wrapper_bytecode,
    wrapper_source,
)
from qinglong_edge.process.stop import StopResult, stop
from qinglong_edge.worker.remote.job_files import JobFiles, RemoteLimits, remove_tree

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from collections.abc import Callable

    from qinglong_edge.contracts.records import InboxRecord
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

__all__ = ["LaunchFailure", "Outcome", "RemoteJob", "adopt", "allocate_log", "cgroup_name", "forget_caches",
           "isolation_available", "launch", "open_log", "prime_wrapper", "read_outcome", "read_truncated", "stop_job"]

#: The latest time a receipt may carry (JSON safe integers): its wall time is not judged.
_ANY_TIME_MS = 2**53 - 1
#: Exit statuses of "No receipt" (spec README): killed by our SIGTERM / SIGKILL, or lost.
OBSERVED_TERM, OBSERVED_KILL, OUTCOME_LOST = 143, 137, 255
_ISOLATION_NAME = "isolation.json"
_DIR_MODE = 0o700


class LaunchFailure(EdgeError):
    """The job could not be prepared or started; it never ran (T3/T4/T6: ``start_failed``).

    Codes: ``log_unavailable`` (the log root, its space, its directory), ``work_unavailable``
    (the scratch working directory), and the process core's launch codes (``spawn_failed``,
    ``cgroup_unavailable``, ``log_unavailable``, ``already_published``,
    ``identity_unavailable``, ``invalid_input``).
    """

    code = "launch_failed"


class Outcome:
    """How a job ended: ``exit_code`` 0-255, ``finished_at_ms``, ``source`` (``receipt``,
    ``reaped``, ``signalled`` or ``lost``), why a receipt was not used (``note``) and why
    it ended, when the device knows (``reason``: ``out_of_memory``, the kernel's OOM
    killer ended a process of it in its memory leaf)."""

    __slots__ = ("exit_code", "finished_at_ms", "note", "reason", "source")

    def __init__(self, exit_code: int, finished_at_ms: int, source: str, note: str = "",
                 reason: str | None = None) -> None:
        self.exit_code = exit_code
        self.finished_at_ms = finished_at_ms
        self.source = source
        self.note = note
        self.reason = reason

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"exitCode": self.exit_code, "finishedAtMs": self.finished_at_ms,
                                  "source": self.source}
        if self.note:
            out["note"] = self.note
        if self.reason is not None:
            out["reason"] = self.reason
        return out


def cgroup_name(attempt_id: str) -> str:
    """The job's cgroup directory name (never a Local Run's: those are UUIDs)."""
    return f"remote-{attempt_id}"


# -- the log ---------------------------------------------------------------------------------

def _private_dir(path: str) -> None:
    """``path`` as a 0700 directory of ours (created with its parents), never a symlink."""
    try:
        os.makedirs(path, _DIR_MODE, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise LaunchFailure(f"{path}: {exc.strerror}", code="log_unavailable") from None
    if stat_problem(st, path, directory=True) is not None:
        raise LaunchFailure(f"{path}: not a private directory of the agent's user (0700)", code="log_unavailable")


def allocate_log(limits: RemoteLimits, files: JobFiles) -> int:
    """Prepare the attempt's log (T3): the root and shard exist (0700), and the file
    system has ``maxLogBytes + logMinimumFreeBytes`` available. Returns the bytes the log
    already holds (they count toward the cap).

    Raises:
        LaunchFailure: ``log_unavailable``.
    """
    _private_dir(limits.log_directory)
    _private_dir(os.path.dirname(files.log_path))
    try:
        vfs = os.statvfs(limits.log_directory)
    except OSError as exc:
        raise LaunchFailure(f"{limits.log_directory}: {exc.strerror}", code="log_unavailable") from None
    free = vfs.f_bavail * vfs.f_frsize
    needed = limits.max_log_bytes + limits.minimum_free_bytes
    if free < needed:
        raise LaunchFailure(f"{limits.log_directory}: {free} bytes free, {needed} needed (worker.maxLogBytes + "
                            "worker.logMinimumFreeBytes)", code="log_unavailable")
    try:
        return os.lstat(files.log_path).st_size
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise LaunchFailure(f"{files.log_path}: {exc.strerror}", code="log_unavailable") from None


def open_log(files: JobFiles) -> int:
    """A read descriptor of the attempt's log for the upload: a private regular file of
    the agent's user with one link. An empty log is created (0600) when there is none
    (lost at a reboot in RAM, or never written), and in place of anything else found at
    its path: a job that sees the log directory (no isolation) may have put a symlink
    (never followed), a FIFO (never waited on: opened non-blocking), a directory or a
    hard link there. Its upload is then empty; its outcome is still reported.

    Raises:
        JournalError: ``storage_unavailable``: no log can be opened or made there (the
            runner tries again; the lease's expiry ends it).
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    path = files.log_path
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        fd = -1
    except OSError:  # ELOOP (a symlink), ENXIO... : not our log
        fd = -2
    if fd >= 0:
        st = os.fstat(fd)
        if stat_problem(st, path, directory=False, forbidden=0, single_link=True) is None:  # any mode: the wrapper's
            return fd
        os.close(fd)
    try:
        if fd == -1:
            os.makedirs(os.path.dirname(path), _DIR_MODE, exist_ok=True)
        else:
            _remove_entry(path)
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise JournalError(f"{path}: cannot open the log for the upload: {exc.strerror}",
                           code="storage_unavailable") from None


def _remove_entry(path: str) -> None:
    """Remove what stands at ``path`` (a directory as a tree), never following a symlink."""
    if stat.S_ISDIR(os.lstat(path).st_mode):
        remove_tree(path)
    else:
        os.unlink(path)


def read_truncated(files: JobFiles, record: InboxRecord, maximum_bytes: int) -> bool | None:
    """The truncation fact's ``quotaReached``, or None without a valid fact (4.3)."""
    candidate = record["offer"]["candidate"]
    try:
        data = read_truncation_fact(files.fact_path)
        if data is None:
            return None
        return parse_truncation_fact(data, run_id=candidate["runId"], attempt_id=candidate["attemptId"],
                                     log_artifact_id=files.log_id, maximum_bytes=maximum_bytes)
    except (ExecutionError, ContractError):
        return None


# -- the job ---------------------------------------------------------------------------------

class RemoteJob:
    """A remote job we launched (``process`` set: our child) or re-adopted after a restart.

    Attributes:
        handle: the durable ``ql3lp1.`` handle; identity: the wrapper's.
        process: the wrapper's Popen, or None when adopted (not our child).
        cgroup: its cgroup, or None.
        pidfd: readable once the wrapper exits (-1 where unavailable).
        last_signal: ``SIGTERM``/``SIGKILL`` when our stop signalled it last.
    """

    __slots__ = ("cgroup", "handle", "identity", "last_signal", "pidfd", "process")

    def __init__(self, handle: str, identity: ProcessIdentity, process: subprocess.Popen[bytes] | None,
                 cgroup: RunCgroup | None) -> None:
        self.handle = handle
        self.identity = identity
        self.process = process
        self.cgroup = cgroup
        self.last_signal: str | None = None
        self.pidfd = -1
        try:
            fd = os.pidfd_open(identity.pid)
        except (AttributeError, OSError):
            return
        if process is None and probe(identity)[0] is not Liveness.RUNNING:
            os.close(fd)  # opened after it exited (or a recycled pid): nothing to wait for
            return
        self.pidfd = fd

    def reaped_status(self) -> int | None:
        """Our child's exit status without reaping it (``WNOWAIT``: its pid keeps the group
        pinned until leftovers are stopped), 128 + N for death by signal N; None while
        it runs or for an adopted job."""
        return exit_status_unreaped(self.process)

    def running(self) -> bool:
        """Whether the wrapper (the job's leader) still runs."""
        if self.process is not None:
            return self.reaped_status() is None
        return probe(self.identity)[0] is Liveness.RUNNING

    def finish(self, limits: RemoteLimits) -> StopResult | None:
        """After the outcome is known: stop leftovers (a background or daemonized child
        keeps the group or the cgroup), reap our child, remove the cgroup, close the pidfd.

        Our own child is reaped only after its group is stopped (the verified stop of
        :func:`stop_job`, the graces of ``limits``): until then the unreaped leader pins
        the group number, so the group signal reaches only the job's leftovers (as the
        Local controller does). The job wrapper, a child subreaper, has normally ended
        them already (a ``setsid`` escapee included, also without a cgroup) before it
        exited; this stop is for a wrapper killed alone or one that could not become a
        subreaper (no ``_ctypes``), where a ``setsid`` escapee stays out of reach without
        a cgroup (docs/packaging.md). An adopted leader that
        is gone gives no group authority (process/stop.py): only its cgroup is emptied.

        Returns:
            The leftovers' stop (``stopped`` when there were some), or None when the job
            is not our child.
        """
        result = None
        if self.process is not None:
            if self.process.returncode is None and self.reaped_status() is not None:
                result = _verified_stop(self, limits)
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                self.process.wait(timeout=5)
        if self.cgroup is not None:
            with contextlib.suppress(EdgeError):
                if self.cgroup.live_members():
                    self.cgroup.kill()
            self.cgroup.remove()
        self.close()
        return result

    def close(self) -> None:
        if self.pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = -1


def adopt(handle: str, cgroups: CgroupManager | None, attempt_id: str) -> RemoteJob | None:
    """Re-adopt a job by its durable handle after a restart (spec README "Never twice"):
    None when the handle does not decode; the job may be gone already (``running()``)."""
    try:
        identity = decode_handle(handle).identity
    except ExecutionError:
        return None
    cgroup = cgroups.open(cgroup_name(attempt_id)) if cgroups is not None else None
    return RemoteJob(handle, identity, None, cgroup)


def _verified_stop(job: RemoteJob, limits: RemoteLimits, graces: tuple[int, int] | None = None) -> StopResult:
    term, kill = graces if graces is not None else (limits.terminate_grace_ms, limits.kill_grace_ms)
    term, kill = max(1, term), max(1, kill)
    return stop(job.handle, job.cgroup, terminate_grace_ms=term, kill_grace_ms=kill, poll_ms=min(25, term, kill))


def stop_job(job: RemoteJob, limits: RemoteLimits, graces: tuple[int, int] | None = None) -> StopResult:
    """The verified stop of :mod:`qinglong_edge.process.stop` (TERM, grace, KILL, cgroup
    kill); remembers the last signal it needed for "No receipt". ``graces``: ``(terminate,
    kill)`` ms instead of the configured ones (a lease stop, which must be over by the
    lease's local expiry: :func:`qinglong_edge.contracts.clocks.lease_stop_plan`)."""
    result = _verified_stop(job, limits, graces)
    if result.status == "stopped":
        job.last_signal = result.signal
    elif result.status == "timed_out":
        job.last_signal = "SIGKILL"
    return result


def launch(
    record: InboxRecord,
    files: JobFiles,
    *,
    plan: LaunchPlan,
    environment: Environment,
    token: CallbackToken,
    limits: RemoteLimits,
    cgroups: CgroupManager | None,
    isolate: str | None,
    lease_files: tuple[str, str] | None = None,
) -> tuple[HeldJob, RunCgroup | None]:
    """T6: start the job held at the start barrier (``record`` is ``launching``);
    ``isolate`` is the PID level of its isolation (:func:`isolation_available`), or None.

    ``lease_files``: ``(lease file, stop mark)`` paths of :mod:`qinglong_edge.worker.remote.lease`:
    the wrapper stops the job itself when the lease file is not moved on in time.

    The caller records the handle (T7), then releases it. The receipt and truncation
    fact prefixes are built here and zeroed once the wrapper has them; the environment
    and the token are the caller's to wipe.

    Raises:
        LaunchFailure: the job never ran (the wrapper is reaped, the cgroup removed).
    """
    candidate = record["offer"]["candidate"]
    started_at = record["executorStartedAtMs"]
    cwd = plan.working_directory
    if cwd is None:
        cwd = files.work_path
        try:
            _private_dir(os.path.dirname(cwd))
            with contextlib.suppress(FileExistsError):
                os.mkdir(cwd, _DIR_MODE)
        except (OSError, LaunchFailure) as exc:
            raise LaunchFailure(f"{cwd}: cannot make the working directory ({exc})", code="work_unavailable") from None
    prefix = receipt_prefix(run_id=candidate["runId"], attempt_id=candidate["attemptId"],
                            callback_sequence=record["completionReceiptCallbackSequence"], token=token,
                            started_at_ms=started_at)
    fact = truncation_fact_prefix(run_id=candidate["runId"], attempt_id=candidate["attemptId"],
                                  log_artifact_id=files.log_id, maximum_bytes=limits.max_log_bytes)
    cgroup: RunCgroup | None = None
    try:
        if cgroups is not None:
            cgroup = cgroups.create(cgroup_name(candidate["attemptId"]))
        spec = JobSpec(plan.argv, dict(zip(environment.names, environment.values, strict=True)), cwd,
                       files.log_path, limits.max_log_bytes, truncation_fact=Publication(files.fact_path, fact),
                       terminate_grace_ms=limits.terminate_grace_ms, kill_grace_ms=limits.kill_grace_ms,
                       receipt=Publication(files.receipt_path, prefix), started_at_ms=started_at,
                       isolation=None if isolate is None else Isolation(
                           hide=limits.hidden, readonly=limits.readonly, pid=isolate),
                       label=candidate["attemptId"],
                       lease_file=lease_files[0] if lease_files else None,
                       lease_stop_file=lease_files[1] if lease_files else None)
        held = start_job(spec, cgroup=cgroup)
    except ExecutionError as exc:
        if cgroup is not None:
            cgroup.remove()
        raise LaunchFailure(exc.message, code=exc.code) from None
    finally:
        prefix[:] = bytes(len(prefix))
    return held, cgroup


# -- the outcome -------------------------------------------------------------------------------

def read_outcome(record: InboxRecord, files: JobFiles, job: RemoteJob | None, now_ms: int) -> Outcome:
    """How a job that is gone ended: its authenticated receipt, else what was observed
    ("No receipt": reaped as its parent, else 143/137 after our signal, else 255); with
    the reason ``out_of_memory`` when its memory leaf counted an OOM kill (read here,
    before the caller removes the cgroup).

    The receipt's ``finishedAtMs <= now`` check is not applied against the wall clock as
    it is now: a wall clock stepped back after the job ended would make an honest receipt
    look as if from the future (spec README "Decisions for clocks"); the callback token
    authenticates it, and the completion's times are translated and clamped anyway."""
    outcome = _read_outcome(record, files, job, now_ms)
    outcome.reason = out_of_memory(job.cgroup if job is not None else None)
    return outcome


def _read_outcome(record: InboxRecord, files: JobFiles, job: RemoteJob | None, now_ms: int) -> Outcome:
    started = int(record.get("executorStartedAtMs", now_ms))
    note = ""
    try:
        data = read_receipt(files.receipt_path)
        if data is not None:
            receipt = authenticate_receipt(parse_receipt(data), record, _ANY_TIME_MS)
            return Outcome(receipt.exit_code, receipt.finished_at_ms, "receipt")
        note = "no receipt"
    except (ExecutionError, ContractError) as exc:
        note = f"receipt not used: {exc.code}"  # no content: the receipt holds the callback token
    finished = max(started, now_ms)
    reaped = job.reaped_status() if job is not None else None
    if reaped is not None:
        return Outcome(min(255, reaped), finished, "reaped", note)
    signal_sent = job.last_signal if job is not None else None
    if signal_sent is not None:
        return Outcome(OBSERVED_KILL if signal_sent == "SIGKILL" else OBSERVED_TERM, finished, "signalled", note)
    return Outcome(OUTCOME_LOST, finished, "lost", note)


# -- caches in the runtime directory -------------------------------------------------------------
#
# Nothing a job can write is trusted later (issue 24 item 1): the compiled job wrapper and
# the isolation answer are kept in the runtime directory only while remote jobs run
# isolated, i.e. cannot see that directory (it is hidden from them). Without isolation a job
# could replace them (the wrapper runs outside any namespace with the next job's secrets),
# so nothing is read from or written to them, and what is there is removed.

WRAPPER_PREFIX = "wrapper-"


def _wrapper_name(python: str) -> str | None:
    """``wrapper-<16 hex>.pyc``, keyed by the interpreter, its version and the source."""
    try:
        st = os.stat(python)
        key = sha256_hex(f"{python}\0{sys.version}\0{st.st_size}\0{st.st_mtime_ns}\0".encode("utf-8", "replace")
                         + bytes.fromhex(sha256_hex(wrapper_source())))[:16]
    except (OSError, ExecutionError):
        return None
    return f"{WRAPPER_PREFIX}{key}.pyc"


def _read_cache(runtime: RuntimeDirectory, name: str, notice: Callable[[str], None] | None,
                max_bytes: int = 4096) -> bytes | None:
    """A cache file, or None when absent or refused: a symlink, FIFO, directory, a file
    not ours or too large is never followed nor read, and says so in one line."""
    try:
        return runtime.read(name, max_bytes=max_bytes)
    except JournalError as exc:
        if notice is not None and exc.code == "unsafe_storage":
            notice(f"runtime directory: {name} refused ({exc.message}); the launch goes on with a fresh copy")
        return None


def forget_caches(runtime: RuntimeDirectory | None) -> None:
    """Remove the cached wrapper program and isolation answer (what a job that was not
    isolated could have written); what is not a regular file is left (never read)."""
    if runtime is None:
        return
    with contextlib.suppress(JournalError):
        for name in runtime.names():
            if name == _ISOLATION_NAME or (name.startswith(WRAPPER_PREFIX) and name.endswith(".pyc")):
                runtime.remove(name)


def prime_wrapper(runtime: RuntimeDirectory | None, *, trusted: bool = False,
                  notice: Callable[[str], None] | None = None) -> None:
    """Have the compiled job wrapper ready for this process's launches.

    ``trusted`` (remote jobs run isolated: none can see the runtime directory): load it
    from the runtime directory, or compile it once and keep it there, keyed by the
    interpreter, its version and the source's digest. Otherwise compile it in memory
    only (one interpreter start for this process) and remove the cached copies.
    """
    python = sys.executable
    name = _wrapper_name(python)
    if not trusted or runtime is None or name is None:
        forget_caches(runtime)
        wrapper_bytecode(python)
        return
    data = _read_cache(runtime, name, notice, max_bytes=1 << 20)
    if data is not None and remember_wrapper_bytecode(python, data):
        return
    data = wrapper_bytecode(python)
    if data:
        with contextlib.suppress(JournalError):
            for old in runtime.names():
                if old.startswith(WRAPPER_PREFIX) and old != name:
                    runtime.remove(old)
            runtime.write(name, data, max_bytes=1 << 20)


def isolation_available(runtime: RuntimeDirectory | None, work_directory: str, boot_id: str,
                        notice: Callable[[str], None] | None = None) -> tuple[str | None, str]:
    """``(pid level or None, reason)``: whether a remote job runs isolated here, and at
    which PID level (``Isolation.pid``). A real isolated job decides it
    (:func:`qinglong_edge.process.isolation.probe_isolation`, two interpreter start-ups);
    only a positive answer is kept in the runtime directory (per boot): a negative one
    means jobs see that directory, so nothing there is trusted and the probe runs again
    in the next process that launches a job."""
    if runtime is not None:
        with contextlib.suppress(ContractError):
            data = _read_cache(runtime, _ISOLATION_NAME, notice)
            if data is not None:
                value = loads(data, max_bytes=4096, min_bytes=2)
                if (isinstance(value, dict) and value.get("bootId") == boot_id and value.get("available") is True
                        and value.get("pid") in (PID_NONE, PID_NAMESPACE, PID_PRIVATE_PROC)):
                    return str(value["pid"]), str(value.get("reason", ""))
    from qinglong_edge.process.isolation import probe_isolation

    found = probe_isolation(work_directory if os.path.isdir(work_directory) else None)
    if not found.available:
        forget_caches(runtime)
        return None, found.reason
    if runtime is not None:
        with contextlib.suppress(JournalError):
            runtime.write(_ISOLATION_NAME, dumps_bytes({"bootId": boot_id, "available": True, "pid": found.pid,
                                                        "reason": found.reason[:500]}) + b"\n")
    return found.pid, found.reason


def is_enospc(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)
