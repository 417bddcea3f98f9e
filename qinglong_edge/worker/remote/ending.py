"""The end of a launched job: its outcome, the upload, the completion (T10), or the
record's recovery when the lease is lost or the run terminal.

One :class:`Ending` per :class:`~qinglong_edge.worker.remote.runner.Runner` (one of its
parts, beside :class:`~qinglong_edge.worker.remote.lease_keeper.LeaseKeeper`; the runner's
docstring gives the decisions). It reads a track's phase to choose the record's end
(``lease_lost``: ``recovery_required(lease_lost_local_execution_stopped)``;
``cluster_terminal``: ``control_plane_terminal`` unless our outcome is still to be
reported, once, in ``last_call``) and sets ``done`` once nothing is left.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from qinglong_edge.contracts.clocks import result_times
from qinglong_edge.contracts.inbox import to_completion_acknowledged, with_result_times
from qinglong_edge.crashpoints import crashpoint
from qinglong_edge.errors import RemoteCallError
from qinglong_edge.worker.delivery.cluster_clock import ClusterClock
from qinglong_edge.worker.remote.calls import ExecutionCalls
from qinglong_edge.worker.remote.job import RemoteJob, open_log, read_outcome, read_truncated
from qinglong_edge.worker.remote.job_files import JobFiles, RemoteLimits, job_files, remove_job_files, remove_scratch
from qinglong_edge.worker.remote.lease_keeper import LeaseKeeper
from qinglong_edge.worker.remote.runner_state import CLUSTER_TERMINAL, DONE, LAST_CALL, LEASE_LOST, Track, Transitions

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    #: A call under G15 (:meth:`~qinglong_edge.worker.remote.runner.Runner.fenced_call`).
    Fenced = Callable[[Track, str, Callable[[], Any]], Any]

__all__ = ["Ending"]


def _file_sha256(fd: int, size: int) -> str:
    """SHA-256 (hex) of the first ``size`` bytes of ``fd``, 64 KiB at a time."""
    from qinglong_edge.contracts.digest import sha256

    hasher, offset = sha256(), 0
    while offset < size:
        chunk = os.pread(fd, min(65536, size - offset), offset)
        if not chunk:
            break
        hasher.update(chunk)
        offset += len(chunk)
    return hasher.hexdigest()


class Ending:
    """T10 and the settling of a launched record whose job is gone (module docstring).

    Args:
        calls: the seven calls (artifacts, completion).
        limits: the remote jobs' limits (log cap, the leftovers' graces).
        transitions: the journal writes and events.
        lease: the lease keeper (the expiry, lease-control).
        fenced: the runner's call under G15 (a 409: lease-control, then ask again).
        clock_ms: the boot clock (ms); wall_ms: the wall clock (ms).
        cluster: the cluster's clock (the completion's result times).
    """

    def __init__(self, calls: ExecutionCalls, limits: RemoteLimits, transitions: Transitions, lease: LeaseKeeper,
                 fenced: Fenced, *, clock_ms: Callable[[], int], wall_ms: Callable[[], int],
                 cluster: ClusterClock) -> None:
        self.calls = calls
        self.limits = limits
        self.transitions = transitions
        self.lease = lease
        self.fenced = fenced
        self.clock_ms = clock_ms
        self.wall_ms = wall_ms
        self.cluster = cluster

    def files(self, t: Track) -> JobFiles:
        """The record's log, receipt and truncation fact paths."""
        return job_files(self.limits.log_directory, self.limits.receipt_directory, t.record)

    def gone(self, t: Track, job: RemoteJob | None) -> None:
        """The job is gone (or there never was one to see): settle the record."""
        if t.phase == LEASE_LOST:
            if job is not None:
                job.finish(self.limits)
            self.transitions.recover(t, "lease_lost_local_execution_stopped")
            return
        if t.phase == LAST_CALL or (t.phase == CLUSTER_TERMINAL and t.outcome is None):
            if job is not None:
                job.finish(self.limits)
            self.transitions.recover(t, "control_plane_terminal")
            return
        files = self.files(t)
        if t.outcome is None:
            if job is None and t.state == "recovery_required":
                # launch_outcome_unknown without a handle: complete only from a receipt.
                from qinglong_edge.process.logs import read_receipt

                if read_receipt(files.receipt_path) is None:
                    t.due_ms = self.lease.expiry_ms(t)
                    return
            t.outcome = read_outcome(t.record, files, job, self.wall_ms())
            leftovers = job.finish(self.limits) if job is not None else None
            remove_scratch(files)  # room for the writes of the outcome, should the job have filled its disk
            if leftovers is not None and leftovers.status == "stopped":
                self.transitions.event(t, "stopped", reason="leftovers", result=leftovers.status,
                                       signal=leftovers.signal)
            crashpoint("runner.exited")
            self.transitions.event(t, "exited", **t.outcome.to_json())
        if "resultStartedAtMs" not in t.record and t.state != "recovery_required":
            self.freeze_result(t)
        if t.ask_after_timeout:
            outcome = self.lease.renew(t)  # the cluster records timed_out (its deadline passed too)
            t.ask_after_timeout = False
            if outcome in ("lost", "terminal"):
                self.gone(t, None)
                return
        self._complete(t, files)

    def _upload(self, t: Track, files: JobFiles) -> bool:
        """The log, once per process (``t.artifact``); False when the record moved on or
        is to be looked at again at once (a fenced upload, below)."""
        fd = open_log(files)
        try:
            size = os.fstat(fd).st_size
            truncated = read_truncated(files, t.record, self.limits.max_log_bytes)
            if size > self.limits.max_log_bytes:  # the job appended to its log itself (no isolation)
                size, truncated = self.limits.max_log_bytes, True
            try:
                stored = self.calls.upload(t.record["offer"], log_artifact_id=files.log_id, source=fd,
                                           byte_length=size, truncated=truncated)
            except RemoteCallError as exc:
                if exc.code != "call_fenced":
                    raise
                answer = self.lease.renew(t)
                if answer in ("ok", "stop"):
                    t.due_ms = self.clock_ms()  # resynced: upload again at once
                    return False
                if answer == "lost":
                    self.transitions.recover(t, "lease_lost_local_execution_stopped")
                    return False
                if t.phase == CLUSTER_TERMINAL:
                    t.phase = LAST_CALL
                t.artifact = (size, _file_sha256(fd, size), truncated)
            else:
                t.artifact = (size, stored.sha256, truncated)
                crashpoint("runner.uploaded")
                self.transitions.event(t, "uploaded", byteLength=size, sha256=stored.sha256, truncated=truncated,
                                       status=stored.status)
        finally:
            os.close(fd)
        return True

    def _complete(self, t: Track, files: JobFiles) -> None:
        """T10: upload the log (once per process), then completion.

        A fenced upload asks lease-control first: a lease one renewal behind (G2) is
        resynced and the upload sent again; a lease already over with a terminal run may
        be ours -- a completion whose answer was lost -- so the completion is sent once
        (phase ``last_call``) with our own digest of the log (the cluster answers
        ``already_completed`` when it holds exactly this outcome) before the record is
        closed as ``control_plane_terminal``.
        """
        if t.artifact is None and not self._upload(t, files):
            return
        assert t.artifact is not None
        size, digest, truncated = t.artifact
        outcome = t.outcome
        assert outcome is not None
        if "resultStartedAtMs" not in t.record:
            self.freeze_result(t)  # launch_outcome_unknown: frozen before its first completion too
        record = t.record
        offer, started, finished = record["offer"], record["resultStartedAtMs"], record["resultFinishedAtMs"]

        def send() -> Any:
            return self.calls.completion(
                offer, callback_sequence=record["completionReceiptCallbackSequence"],
                callback_token_digest=record["completionReceiptTokenDigest"], started_at_ms=started,
                finished_at_ms=finished, exit_code=outcome.exit_code,
                log_artifact_id=files.log_id, byte_length=size, sha256=digest, truncated=truncated)

        if t.phase == LAST_CALL:
            try:
                result = send()
            except RemoteCallError as exc:
                if exc.code != "call_fenced":
                    raise
                self.transitions.recover(t, "control_plane_terminal")
                return
        else:
            result = self.fenced(t, "completion", send)
            if result is None:
                return
        crashpoint("runner.completion_answered")
        if result.status == "already_terminal":
            self.transitions.recover(t, "control_plane_terminal")
            return
        self.transitions.write(t, to_completion_acknowledged(t.record, self.wall_ms()), "completion_acknowledged",
                               "completion_acknowledged", status=result.status, exitCode=outcome.exit_code)
        t.phase = DONE
        remove_job_files(files)
        crashpoint("runner.files_removed")

    def freeze_result(self, t: Track) -> None:
        """The job's exit observed: the completion's result times in the cluster's clock,
        clamped (:func:`~qinglong_edge.contracts.clocks.result_times`), and the current
        lease, stored in one journal write before anything is sent, so every completion
        (and every replay after a restart) sends the same bytes (spec README "Wire
        timestamps"; issue 23 item 7: the journal's one write with the current lease).

        ``startedAtMs`` comes from the launch's boot instant when this boot knows it (no
        wall-clock step in between can move it), else ``executorStartedAtMs``;
        ``finishedAtMs`` from the receipt's (or the observed) wall time, both through the
        cluster clock as it is now."""
        outcome = t.outcome
        assert outcome is not None
        cluster = self.cluster
        if t.started_boot_ms is not None:
            started = cluster.boot_to_cluster(t.started_boot_ms)
        else:
            started = cluster.wall_to_cluster(t.record["executorStartedAtMs"])
        finished = cluster.wall_to_cluster(outcome.finished_at_ms)
        started, finished = result_times(
            started, finished, attempt_created_at_ms=t.record["offer"]["candidate"]["attemptCreatedAtMs"],
            cluster_now_ms=cluster.cluster_now())
        self.transitions.write(t, with_result_times(t.record, self.wall_ms(), started_at_ms=started,
                                                    finished_at_ms=finished), "result_stored")
