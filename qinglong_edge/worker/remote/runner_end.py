"""The end of a launched job: its outcome, the upload, the completion (T10), and a stop
that must be verified (``lease_lost_local_execution_unverified``).

Part of the runner (:mod:`qinglong_edge.worker.remote.runner` for the decisions; the class
hierarchy ``RunnerBase`` <- ``RunnerEnd`` <- ``Runner``).
"""

from __future__ import annotations

import os

from qinglong_edge.contracts.clocks import result_times
from qinglong_edge.contracts.inbox import to_completion_acknowledged, with_result_times
from qinglong_edge.crashpoints import crashpoint
from qinglong_edge.errors import RemoteCallError
from qinglong_edge.worker.remote.job import RemoteJob, open_log, read_outcome, read_truncated, stop_job
from qinglong_edge.worker.remote.job_files import JobFiles, remove_job_files, remove_scratch
from qinglong_edge.worker.remote.runner_base import AGAIN_MS, RunnerBase
from qinglong_edge.worker.remote.runner_state import Track

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["RunnerEnd"]


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


class RunnerEnd(RunnerBase):
    """T10 and the verified stop (module docstring)."""

    def _gone(self, t: Track, job: RemoteJob | None) -> None:
        """The job is gone (or there never was one to see): settle the record."""
        if t.lease_lost:
            if job is not None:
                job.finish(self.limits)
            self._recover(t, "lease_lost_local_execution_stopped")
            return
        if t.cluster_terminal and (t.outcome is None or t.terminal_checked):
            if job is not None:
                job.finish(self.limits)
            self._recover(t, "control_plane_terminal")
            return
        files = self.files(t)
        if t.outcome is None:
            if job is None and t.state == "recovery_required":
                # launch_outcome_unknown without a handle: complete only from a receipt.
                from qinglong_edge.process.logs import read_receipt

                if read_receipt(files.receipt_path) is None:
                    t.due_ms = self.expiry_ms(t)
                    return
            t.outcome = read_outcome(t.record, files, job, self.wall_ms())
            leftovers = job.finish(self.limits) if job is not None else None
            remove_scratch(files)  # room for the writes of the outcome, should the job have filled its disk
            if leftovers is not None and leftovers.status == "stopped":
                self._event(t, "stopped", reason="leftovers", result=leftovers.status, signal=leftovers.signal)
            crashpoint("runner.exited")
            self._event(t, "exited", **t.outcome.to_json())
        if "resultStartedAtMs" not in t.record and t.state != "recovery_required":
            self._freeze_result(t)
        if t.ask_after_timeout:
            outcome = self._renew(t)  # the cluster records timed_out (its deadline passed too)
            t.ask_after_timeout = False
            if outcome in ("lost", "terminal"):
                self._gone(t, None)
                return
        self._complete(t, files)

    def _complete(self, t: Track, files: JobFiles) -> None:
        """T10: upload the log (once per process), then completion.

        A fenced upload asks lease-control first: a lease one renewal behind (G2) is
        resynced and the upload sent again; a lease already over with a terminal run may
        be ours -- a completion whose answer was lost -- so the completion is sent once
        with our own digest of the log (the cluster answers ``already_completed`` when it
        holds exactly this outcome) before the record is closed as ``control_plane_terminal``.
        """
        offer = t.record["offer"]
        if t.artifact is None:
            fd = open_log(files)
            try:
                size = os.fstat(fd).st_size
                truncated = read_truncated(files, t.record, self.limits.max_log_bytes)
                if size > self.limits.max_log_bytes:  # the job appended to its log itself (no isolation)
                    size, truncated = self.limits.max_log_bytes, True
                try:
                    stored = self.calls.upload(offer, log_artifact_id=files.log_id, source=fd, byte_length=size,
                                               truncated=truncated)
                except RemoteCallError as exc:
                    if exc.code != "call_fenced":
                        raise
                    answer = self._renew(t)
                    if answer in ("ok", "stop"):
                        t.due_ms = self.clock_ms()  # resynced: upload again at once
                        return
                    if answer == "lost":
                        self._recover(t, "lease_lost_local_execution_stopped")
                        return
                    t.terminal_checked = True
                    t.artifact = (size, _file_sha256(fd, size), truncated)
                else:
                    t.artifact = (size, stored.sha256, truncated)
                    crashpoint("runner.uploaded")
                    self._event(t, "uploaded", byteLength=size, sha256=stored.sha256, truncated=truncated,
                                status=stored.status)
            finally:
                os.close(fd)
        size, digest, truncated = t.artifact
        outcome = t.outcome
        assert outcome is not None
        if "resultStartedAtMs" not in t.record:
            self._freeze_result(t)  # launch_outcome_unknown: frozen before its first completion too
        record = t.record
        started, finished = record["resultStartedAtMs"], record["resultFinishedAtMs"]

        def send() -> Any:
            return self.calls.completion(
                offer, callback_sequence=record["completionReceiptCallbackSequence"],
                callback_token_digest=record["completionReceiptTokenDigest"], started_at_ms=started,
                finished_at_ms=finished, exit_code=outcome.exit_code,
                log_artifact_id=files.log_id, byte_length=size, sha256=digest, truncated=truncated)

        if t.terminal_checked:
            try:
                result = send()
            except RemoteCallError as exc:
                if exc.code != "call_fenced":
                    raise
                self._recover(t, "control_plane_terminal")
                return
        else:
            result = self._fenced_call(t, "completion", send)
            if result is None:
                return
        crashpoint("runner.completion_answered")
        if result.status == "already_terminal":
            self._recover(t, "control_plane_terminal")
            return
        self._write(t, to_completion_acknowledged(t.record, self.wall_ms()), "completion_acknowledged",
                    "completion_acknowledged", status=result.status, exitCode=outcome.exit_code)
        t.done = True
        remove_job_files(files)
        crashpoint("runner.files_removed")

    def _freeze_result(self, t: Track) -> None:
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
        self._write(t, with_result_times(t.record, self.wall_ms(), started_at_ms=started, finished_at_ms=finished),
                    "result_stored")

    def _unverified(self, t: Track) -> None:
        """``lease_lost_local_execution_unverified``: stop until the job is verified gone."""
        job = self._job(t)
        if job is None or not job.running():
            if job is not None:
                job.finish(self.limits)
            self._event(t, "process_gone")
            t.done = True
            return
        result = stop_job(job, self.limits)
        self._event(t, "stopped", reason="lease_lost", result=result.status, signal=result.signal)
        t.due_ms = self.clock_ms() + AGAIN_MS
