"""Where a remote run's files live, the limits it runs under, and how they are removed.

No process control here (so the cron cycle can find and remove a finished run's files
without importing the process core). Paths (remote-execution.md 4.2, 4.3)::

    <worker.logDirectory>/                    0700 (remote logs: RAM on OpenWrt by default)
      <id[5:7]>/<wlog-id>.log                 the job's output, raw head up to the cap
      <id[5:7]>/.<wlog-id>.log.truncated.json the truncation fact (quotaReached)
      work/<attemptId>/                       the job's working directory when its
                                              revision names none (gap G6), 0700
    <worker.journalDirectory>/receipts/       0700, on the journal's (durable) file system
      <attemptId[0:2]>/<attemptId>.json       the job wrapper's receipt (exit status)

Receipts sit beside the journal, not in RAM: a job that ended before a power loss is
still completed with its real exit status after the reboot (its log, in RAM, is then
uploaded empty). The journal and the log directory are hidden from remote jobs
(:func:`remote_limits` ``hidden``).

Limits without a Local API (spec README): the grace periods, the per-run PID cap and
the cgroup mode come from the ``execution`` section when the configuration has one,
else the same edge defaults (:data:`EDGE_LIMITS`); log settings are ``worker.logDirectory``,
``worker.maxLogBytes`` and ``worker.logMinimumFreeBytes`` (whose defaults follow the
``execution`` section too).
"""

from __future__ import annotations

import contextlib
import os
import stat

from qinglong_edge.config import DEFAULT_RUN_MEMORY, DEFAULT_RUN_PIDS, EdgeConfig, WorkerConfig
from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.receipt import log_artifact_id, log_file_names, receipt_file_names
from qinglong_edge.contracts.residency import lease_expired_locally, needs_local_action

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from qinglong_edge.contracts.records import InboxRecord

__all__ = [
    "EDGE_LIMITS",
    "RECEIPTS_DIR",
    "JobFiles",
    "RemoteLimits",
    "in_flight",
    "job_files",
    "outcome_name",
    "process_gone",
    "record_files",
    "remote_limits",
    "remove_job_files",
    "remove_scratch",
    "remove_tree",
    "worker_record_files",
]

#: The receipts' directory under the journal root.
RECEIPTS_DIR = "receipts"
#: The scratch working directories' directory under the log root.
WORK_DIR = "work"
#: (terminateGraceMs, killGraceMs, cgroups) when there is no ``execution`` section.
EDGE_LIMITS = (5000, 1000, "auto")


class RemoteLimits(Frozen):
    """What a remote job runs under (times in ms, sizes in bytes).

    Attributes:
        log_directory, max_log_bytes, minimum_free_bytes: the log root, the per-attempt
            cap, the free space kept beside it (``statfs`` guard at allocation).
        receipt_directory: ``<journal>/receipts``.
        terminate_grace_ms, kill_grace_ms: the stop's graces (process/stop.py).
        cgroups: ``auto`` or ``off``; max_run_pids: the per-run ``pids.max`` (0: none).
        hidden: the paths an isolated job must not see.
        readonly: the paths an isolated job sees read-only (what the agent reads back
            and its user could change: :func:`~qinglong_edge.worker.remote.isolation.remote_readonly_paths`).
        max_run_memory_bytes: the memory limit of the job's cgroup leaf.
    """

    __slots__ = ("log_directory", "max_log_bytes", "minimum_free_bytes", "receipt_directory",  # noqa: RUF023
                 "terminate_grace_ms", "kill_grace_ms", "cgroups", "max_run_pids", "hidden", "readonly",
                 "max_run_memory_bytes")

    log_directory: str
    max_log_bytes: int
    minimum_free_bytes: int
    receipt_directory: str
    terminate_grace_ms: int
    kill_grace_ms: int
    cgroups: str
    max_run_pids: int
    hidden: tuple[str, ...]
    readonly: tuple[str, ...]
    max_run_memory_bytes: int | None

    def __init__(self, log_directory: str, max_log_bytes: int, minimum_free_bytes: int,  # noqa: PLR0917
                 receipt_directory: str, terminate_grace_ms: int, kill_grace_ms: int, cgroups: str,
                 max_run_pids: int, hidden: tuple[str, ...] = (), readonly: tuple[str, ...] = (),
                 max_run_memory_bytes: int | None = None) -> None:
        _set = object.__setattr__
        _set(self, "log_directory", log_directory)
        _set(self, "max_log_bytes", max_log_bytes)
        _set(self, "minimum_free_bytes", minimum_free_bytes)
        _set(self, "receipt_directory", receipt_directory)
        _set(self, "terminate_grace_ms", terminate_grace_ms)
        _set(self, "kill_grace_ms", kill_grace_ms)
        _set(self, "cgroups", cgroups)
        _set(self, "max_run_pids", max_run_pids)
        _set(self, "hidden", hidden)
        _set(self, "readonly", readonly)
        _set(self, "max_run_memory_bytes", max_run_memory_bytes)


def remote_limits(config: EdgeConfig) -> RemoteLimits:
    """The limits of this configuration's remote jobs (module docstring).

    Raises:
        ValueError: the configuration has no ``worker`` section.
    """
    worker = config.worker
    if worker is None:
        raise ValueError("no worker section")
    execution = config.execution
    if execution is not None:
        term, kill, cgroups, pids = (execution.terminate_grace_ms, execution.kill_grace_ms, execution.cgroups,
                                     execution.max_run_pids)
        memory = execution.max_run_memory_bytes
    else:
        term, kill, cgroups = EDGE_LIMITS
        pids = DEFAULT_RUN_PIDS[config.profile]
        memory = DEFAULT_RUN_MEMORY[config.profile]
    from qinglong_edge.worker.remote.isolation import remote_hidden_paths, remote_readonly_paths

    hidden = tuple(sorted({*remote_hidden_paths(config), os.path.normpath(worker.log_directory)}))
    return RemoteLimits(worker.log_directory, worker.max_log_bytes, worker.log_minimum_free_bytes,
                        os.path.join(worker.journal_directory, RECEIPTS_DIR), term, kill, cgroups, pids, hidden,
                        remote_readonly_paths(config), memory)


class JobFiles(Frozen):
    """The files of one attempt (absolute paths; see the module docstring)."""

    __slots__ = ("log_id", "log_path", "fact_path", "receipt_path", "work_path")  # noqa: RUF023

    log_id: str
    log_path: str
    fact_path: str
    receipt_path: str
    work_path: str

    def __init__(self, log_id: str, log_path: str, fact_path: str, receipt_path: str,
                 work_path: str) -> None:
        _set = object.__setattr__
        _set(self, "log_id", log_id)
        _set(self, "log_path", log_path)
        _set(self, "fact_path", fact_path)
        _set(self, "receipt_path", receipt_path)
        _set(self, "work_path", work_path)


def job_files(log_directory: str, receipt_directory: str, record: InboxRecord) -> JobFiles:
    """The files of a record's attempt: its stored ``logArtifactId``, or the one T5 will
    store (deterministic per offer, section 4.3).

    Raises:
        ContractError: ids a launch could never carry (``log_artifact_id_invalid``,
            ``receipt_invalid``).
    """
    offer = record["offer"]
    candidate = offer["candidate"]
    log_id = record.get("logArtifactId") or log_artifact_id(
        candidate["projectId"], candidate["runId"], candidate["attemptId"], offer["offerId"])
    names = log_file_names(log_id)
    shard, receipt = receipt_file_names(candidate["attemptId"])
    shard_dir = os.path.join(log_directory, names.shard)
    return JobFiles(log_id, os.path.join(shard_dir, names.log), os.path.join(shard_dir, names.truncation_fact),
                    os.path.join(receipt_directory, shard, receipt),
                    os.path.join(log_directory, WORK_DIR, candidate["attemptId"]))


def remove_job_files(files: JobFiles) -> list[str]:
    """Remove the receipt, then the truncation fact and the log, then the scratch working
    directory (never following a symlink); returns what was removed. Missing files are
    fine; errors are ignored (the next pass or the inbox pruning tries again)."""
    removed = []
    for path in (files.receipt_path, files.fact_path, files.log_path):
        try:
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    if os.path.isdir(files.work_path) and not os.path.islink(files.work_path):
        with contextlib.suppress(OSError):
            remove_tree(files.work_path)
            removed.append(files.work_path)
    return removed


def remove_scratch(files: JobFiles) -> bool:
    """Remove the attempt's scratch working directory now that its job is gone (its
    contents are never uploaded): a job that filled its file system frees it before
    the agent's own writes of the outcome need room. True when it is gone."""
    if not os.path.isdir(files.work_path) or os.path.islink(files.work_path):
        return not os.path.lexists(files.work_path)
    try:
        remove_tree(files.work_path)
    except OSError:
        return False
    return True


def remove_tree(path: str) -> None:
    """Remove a directory tree the job left, never following a symlink (each level is
    opened ``O_NOFOLLOW`` and emptied through its descriptor). Not :func:`shutil.rmtree`:
    importing :mod:`shutil` pulls the compression modules into a resident ``pull``.

    A directory of ours without the owner's ``rwx`` (a job's ``chmod 555`` module cache,
    a ``chmod 0`` directory) is made so first, through an ``O_PATH`` descriptor of the
    very directory (``/proc/self/fd``): an agent that is not root could neither scan nor
    empty it, and the tree stayed behind for good.

    Raises:
        OSError: what could not be removed (the caller ignores it; the next pass tries again).
    """

    def empty(fd: int) -> None:
        with os.scandir(fd) as entries:
            names = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
        for name, is_dir in names:
            if is_dir:
                child = _open_directory(name, fd)
                try:
                    empty(child)
                finally:
                    os.close(child)
                os.rmdir(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)

    top = _open_directory(path, None)
    try:
        empty(top)
    finally:
        os.close(top)
    os.rmdir(path)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_directory(name: str, dir_fd: int | None) -> int:
    """A read descriptor of the directory ``name`` (never a symlink's target), with the
    owner's ``rwx`` added when it is ours and lacks them (see :func:`remove_tree`)."""
    handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(handle)
        if st.st_uid != os.geteuid() or st.st_mode & 0o700 == 0o700:
            return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        fixed = f"/proc/self/fd/{handle}"  # this inode, whatever its name points to now
        os.chmod(fixed, stat.S_IMODE(st.st_mode) | 0o700)
        return os.open(fixed, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    finally:
        os.close(handle)


def record_files(limits: RemoteLimits, record: InboxRecord) -> JobFiles | None:
    """:func:`job_files` for a record, or None for ids a launch could never carry."""
    try:
        return job_files(limits.log_directory, limits.receipt_directory, record)
    except (ContractError, KeyError, TypeError):
        return None


def worker_record_files(worker: WorkerConfig, record: InboxRecord) -> JobFiles | None:
    """:func:`record_files` from the worker section alone (the cron cycle's pruning)."""
    try:
        return job_files(worker.log_directory, os.path.join(worker.journal_directory, RECEIPTS_DIR), record)
    except (ContractError, KeyError, TypeError):
        return None


def outcome_name(offer_id: str) -> str:
    """The runtime-directory file that remembers how a record's job ended (``inbox``
    shows it after the receipt is deleted; lost at a reboot)."""
    from qinglong_edge.contracts.digest import sha256_hex

    return "outcome." + sha256_hex(offer_id.encode("utf-8"))[:16]


def process_gone(record: InboxRecord) -> bool:
    """Whether a stopped record's process is verified gone (its handle probed in /proc)."""
    handle = record.get("executorHandle")
    if not isinstance(handle, str):
        return True
    from qinglong_edge.process.identity import inspect  # only for such a record

    return inspect(handle).status == "not_running"


def in_flight(record: InboxRecord, now_ms: int) -> bool:
    """Whether ``record`` keeps the pull resident and holds a slot (spec README "Terminal for
    residency and pruning"; an unverified stop is probed by its handle)."""
    gone = record.get("recoveryReason") == "lease_lost_local_execution_unverified" and process_gone(record)
    return needs_local_action(record, process_gone=gone,
                              lease_expired=lease_expired_locally(record["offer"]["lease"], now_ms))
