"""Restart recovery of the execution controller (the first thing on its thread).

Every active attempt is reloaded. One with a handle whose identity still runs is adopted
(the pass stops it if its Run has an intent); one whose process is gone is reconciled:
``cancelled``/``timed_out`` if it has an intent, else ``lost``
(``RECOVERY_PROCESS_NOT_RUNNING``: its exit status died with the previous agent), after a
stop of what is left in its cgroup (a stop like any other: booked in the controller's
:class:`~qinglong_edge.execution.stops.StopBook` while it waits); a pid now owned by
another process is never signalled (the identity differs). An attempt ``starting``
without a handle never ran its job (start barrier) and becomes ``lost``
(``RECOVERY_UNSTARTED_LAUNCH``) or ``cancelled``. A cgroup ``qinglong-edge/<id>`` whose
``<id>`` is an attempt of *this* database that is no longer active (leftovers of a crash)
is emptied and removed; cgroups named after anything else (another agent's database, an
operator's) are never touched. A log FIFO left by an older version of the agent (which
drained Run output itself) is removed.

Recovery is complete when no attempt was deferred (its identity could not be read, or a
write failed) and none of its stops is still under way; until then the controller stays
in phase ``recovering`` and repeats it at the start of each pass
(:mod:`qinglong_edge.execution.phases`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping

from qinglong_edge.errors import EdgeError
from qinglong_edge.execution.launcher import ActiveRun, open_pidfd
from qinglong_edge.execution.stops import StopBook
from qinglong_edge.execution.transitions import Snapshot, finished_attempts, list_active, mark_lost, mark_terminal
from qinglong_edge.local.run_logs import LEGACY_LOG_NAME, parse_log_name
from qinglong_edge.local.store import Store
from qinglong_edge.process.cgroups import CgroupManager
from qinglong_edge.process.identity import decode_handle, inspect
from qinglong_edge.process.stop import StopResult

__all__ = ["Recovery", "discard_cgroup"]

_log = logging.getLogger("qinglong_edge.execution")


def discard_cgroup(cgroups: CgroupManager, attempt_id: str, kill_grace_ms: int) -> None:
    """Kill what is left in the cgroup of ``attempt_id`` and remove it, waiting at most
    ``kill_grace_ms`` for it to empty (a SIGKILLed member exits within milliseconds; one
    stuck in the kernel keeps the cgroup, swept at the next start). No cgroup: nothing."""
    cgroup = cgroups.open(attempt_id)
    if cgroup is not None:
        with contextlib.suppress(EdgeError):
            cgroup.kill()
        deadline = time.monotonic() + kill_grace_ms / 1000
        while not cgroup.remove() and time.monotonic() < deadline:
            time.sleep(0.01)


class Recovery:
    """Restart recovery (module docstring) on the controller's state.

    Args:
        store: the Local store.
        cgroups: the controller's cgroup manager.
        log_directory: ``execution.logDirectory`` (legacy FIFOs are swept there).
        kill_grace_ms: how long a leftover cgroup may take to empty.
        clock: wall clock in ms for stored times; new_id: event ids.
        boot_id: this boot's id (an adopted Run's boot-clock deadline; None: unreadable).
        stops: the controller's stops under way (a gone Run's leftovers are stopped there).
        active: the controller's Runs by attempt id (read only); track: adopts one.
    """

    def __init__(self, store: Store, *, cgroups: CgroupManager, log_directory: str, kill_grace_ms: int,
                 clock: Callable[[], int], new_id: Callable[[], str], boot_id: str | None, stops: StopBook,
                 active: Mapping[str, ActiveRun], track: Callable[[ActiveRun], None]) -> None:
        self.store = store
        self.cgroups = cgroups
        self.log_directory = log_directory
        self.kill_grace_ms = kill_grace_ms
        self.clock = clock
        self.new_id = new_id
        self.boot_id = boot_id
        self._stops = stops
        self._active = active
        self._track = track

    def run(self) -> bool:
        """One recovery pass; True when it is complete (module docstring).

        Raises:
            StoreError: the active attempts (or the finished ones) cannot be read.
        """
        snaps = self.store.run(list_active)
        complete = True
        for snap in snaps:
            if snap.attempt.id in self._stops:
                complete = False  # its stop is under way: the next pass looks again
                continue
            if snap.attempt.id in self._active:
                continue
            try:
                self._recover_one(snap)
            except EdgeError as exc:
                complete = False
                _log.warning("run %s: recovery deferred: %s", snap.run.id, exc.code)
        active_ids = {s.attempt.id for s in snaps} | set(self._active)
        leftover = sorted(self.cgroups.owned_names() - active_ids)
        for name in self.store.run(lambda c: finished_attempts(c, leftover)):
            discard_cgroup(self.cgroups, name, self.kill_grace_ms)
        self._sweep_fifos()
        return complete

    def _recover_one(self, snap: Snapshot) -> None:
        attempt = snap.attempt
        handle = attempt.executor_handle
        reason = snap.run.cancel_reason
        if handle is None:
            discard_cgroup(self.cgroups, attempt.id, self.kill_grace_ms)
            if reason is not None:
                self.store.run(lambda c: mark_terminal(c, snap, reason=reason, now_ms=self.clock(),
                                                       new_id=self.new_id))
            else:
                self.store.run(lambda c: mark_lost(c, snap, why="unstarted_launch", actor_id="local-startup",
                                                   now_ms=self.clock(), new_id=self.new_id))
            return
        status = inspect(handle)
        if status.status == "unknown":
            raise EdgeError(f"identity unavailable ({status.reason})", code="provider_unavailable")
        cgroup = self.cgroups.open(attempt.id)
        if status.status == "running":
            identity = decode_handle(handle).identity
            adopted = ActiveRun(snap.run.id, attempt.id, handle, identity, None, cgroup, attempt.deadline_at_ms,
                                pidfd=open_pidfd(identity.pid),
                                deadline_boot_ms=attempt.deadline_in_boot(self.boot_id))
            self._track(adopted)
            _log.info("run %s: adopted pid %d after restart", snap.run.id, identity.pid)
            return
        # Gone (or the pid belongs to someone else now): never signal it; empty our cgroup.

        def then(_leftovers: StopResult) -> None:
            if reason is not None:
                self.store.run(lambda c: mark_terminal(c, snap, reason=reason, now_ms=self.clock(),
                                                       new_id=self.new_id))
            else:
                self.store.run(lambda c: mark_lost(c, snap, why="process_not_running", actor_id="local-startup",
                                                   now_ms=self.clock(), new_id=self.new_id))
            if cgroup is not None:
                cgroup.remove()

        self._stops.begin(attempt.id, handle, cgroup, then)

    def _sweep_fifos(self) -> None:
        """Remove the log FIFOs an older agent made (it drained Run output through them;
        the job wrapper needs none): only names this agent makes, never a foreign file."""
        try:
            names = os.listdir(self.log_directory)
        except OSError:
            return
        for name in names:
            parsed = parse_log_name(name)
            legacy = LEGACY_LOG_NAME.fullmatch(name)
            if (parsed is not None and parsed[2] == "fifo") or (legacy is not None and legacy.group(2) == "fifo"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.log_directory, name))
