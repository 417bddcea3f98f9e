"""Stop a Run's processes from its durable handle: verified, bounded, complete.

local-api.md 7.3 gives the reference algorithm (SIGTERM to the group, grace, re-check,
SIGKILL, grace); the spec README and field-lessons.md 3-5 add what we do beyond it:

1. Decode the handle (``unknown(invalid_handle)``); non-Linux is
   ``unknown(unsupported_platform)``.
2. Look: the leader (boot id, pid, group, start time), the process group, the cgroup.
   Nothing alive: ``already_exited``.
3. SIGTERM, each process exactly once. The leader is the job wrapper
   (:mod:`qinglong_edge.process.wrapper`): while it runs, it alone gets the SIGTERM
   (through its pidfd, re-verified just before), and it passes it on to its process
   group with one ``killpg`` while ignoring it itself (one call, so a child being forked
   gets it too). Signalling the group as well would hand every member a second TERM,
   and tools that force-quit on a second TERM skip their graceful shutdown. When the
   leader has exited but still pins the group (an unreaped zombie, see below), nothing
   forwards any more: the group is signalled directly. (The wrapper, a child subreaper,
   also passes the TERM on to its descendants outside the group, ends its leftovers itself
   and reaps them before it exits: see its module.) Then every member of the Run's
   cgroup outside the group (``setsid`` escapees, which no ``killpg`` reaches), but not
   those in a PID namespace below the leader's (an isolated remote job: its init, in the
   wrapper's group, passes the TERM on to each of them once). Those are
   pinned with a pidfd first and re-verified afterwards (still in the cgroup, still
   outside the group) before the signal goes through the pidfd, so a pid that exits and
   is recycled between enumeration and signal is never hit (ESRCH is tolerated). Poll
   every ``poll_ms`` until ``terminate_grace_ms``; all gone: ``stopped(SIGTERM)``.
4. Re-verify the identity. All gone: ``stopped(SIGTERM)``. Else SIGKILL the descendants of
   the still running wrapper outside its group (it is a child subreaper: a ``setsid``
   escapee is below it, and would re-parent to init once the group SIGKILL ends it), the
   group (``killpg``, only while the leader still pins the group number) and the cgroup
   (``cgroup.kill``, or freeze + SIGKILL + thaw on v1). Poll until ``kill_grace_ms``:
   all gone is ``stopped(SIGKILL)``, else ``timed_out``.
5. Any other signal error is ``unknown(signal_failed)``; an unreadable ``/proc`` or
   boot id is ``unknown(provider_unavailable)``.

"All gone" means: the leader is not running, no live (non-zombie) process is in its
group, and the cgroup has no live member. Only ``stopped`` and ``already_exited`` let a
Run terminalise.

One race is left open on purpose: a wrapper that exits (its command done, its drain over)
between our check and our signal never passes the TERM on; leftovers of its group then
get the SIGKILL after the grace. Signalling the group as well would close it only by
doubling the TERM of every job that did not exit.

Group authority. ``kill(-pgid)`` is only safe while the group number still belongs to
the Run. It does while the leader with the recorded identity exists, running or as an
unreaped zombie: Linux does not recycle a number still used as a pid or group id. The
leader is held by a pidfd opened *before* its ``/proc`` identity is checked (so the fd
can only name our leader), and ``pidfd_send_signal(fd, 0)`` right before each group
signal proves it still exists; without pidfd support (Linux < 5.3) the ``/proc``
identity is re-read instead. The
controller never reaps a leader it launched before its stop is complete, so for our own
children the group signal cannot hit anyone else. For a leader adopted after a restart
(not our child) ``init`` reaps it; if it is already gone, its orphaned group members
cannot be told apart from a new group that recycled the number, so without a cgroup we
do not signal them (the reference behaves the same); with a cgroup they die by
``cgroup.kill``. A leader whose pid now has another start time or group (``REUSED``)
never gives authority: the unrelated process is not signalled.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.errors import ExecutionError
from qinglong_edge.process.cgroups import RunCgroup, signal_pids
from qinglong_edge.process.identity import (
    Liveness,
    ProcessIdentity,
    decode_handle,
    probe,
    read_proc_stat,
    scan_processes,
)

__all__ = ["MAX_GRACE_MS", "StopResult", "pid_namespace_depth", "stop"]

#: Upper bound of every grace and poll interval (local-api.md 7.3).
MAX_GRACE_MS = 30_000
#: SIGKILL passes over the running wrapper's descendants outside its group.
_KILL_PASSES = 8


class StopResult(Frozen):
    """Outcome of :func:`stop` (local-api.md 7.3).

    Attributes:
        status: ``stopped``, ``already_exited``, ``timed_out`` or ``unknown``.
        signal: for ``stopped``: ``SIGTERM`` or ``SIGKILL`` (the last one needed).
        reason: for ``unknown``: ``invalid_handle``, ``unsupported_platform``,
            ``provider_unavailable`` or ``signal_failed``.

    A :class:`~qinglong_edge.contracts._shape.Frozen` value, not a dataclass: a resident
    ``pull`` imports this module, and :mod:`dataclasses` would cost it ~1.4 MiB.
    """

    __slots__ = ("status", "signal", "reason")  # noqa: RUF023 (field order)

    status: str
    signal: str | None
    reason: str | None

    def __init__(self, status: str, signal: str | None = None, reason: str | None = None) -> None:
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "signal", signal)
        object.__setattr__(self, "reason", reason)

    @property
    def conclusive(self) -> bool:
        """True when the Run may terminalise (``stopped`` or ``already_exited``)."""
        return self.status in ("stopped", "already_exited")


class _Target:
    """Everything of one Run that a stop must reach, and how to see whether it is gone.

    ``leader_fd`` is a pidfd bound to the recorded leader: opened first, then the
    ``/proc`` identity is checked, so the descriptor can only name our leader. While
    ``pidfd_send_signal(leader_fd, 0)`` succeeds the leader exists (alive or an unreaped
    zombie) and its group number cannot have been recycled; that check runs right before
    every group signal.
    """

    def __init__(self, identity: ProcessIdentity, cgroup: RunCgroup | None) -> None:
        self.identity = identity
        self.cgroup = cgroup
        self.leader_fd: int | None = None
        self._bound = False

    def close(self) -> None:
        if self.leader_fd is not None and self.leader_fd >= 0:
            os.close(self.leader_fd)
        self.leader_fd = None

    def leader(self) -> Liveness:
        """Probe the recorded identity, binding the leader pidfd on first sight."""
        state = probe(self.identity)[0]
        if not self._bound and state in (Liveness.RUNNING, Liveness.EXITED):
            self._bound = True
            try:
                self.leader_fd = os.pidfd_open(self.identity.pid)
            except ProcessLookupError:
                return probe(self.identity)[0]
            except (AttributeError, OSError):
                self.leader_fd = -1  # Linux < 5.3: fall back to /proc checks
                return state
            state = probe(self.identity)[0]  # after opening: the fd names this process
            if state not in (Liveness.RUNNING, Liveness.EXITED):
                self.close()
        return state

    def pinned(self) -> bool:
        """True while the leader's identity still pins the group number (checked now)."""
        state = self.leader()
        if state not in (Liveness.RUNNING, Liveness.EXITED):
            return False
        if self.leader_fd is None or self.leader_fd < 0:
            return True
        try:
            signal.pidfd_send_signal(self.leader_fd, 0)
        except ProcessLookupError:
            return False
        return True

    def group_members(self) -> set[int]:
        pgid = self.identity.pgid
        return {s.pid for s in scan_processes() if s.pgrp == pgid and not s.exited}

    def alive(self) -> bool:
        """Is any process of the Run still alive (see the module docstring)?"""
        state = self.leader()
        if state is Liveness.RUNNING:
            return True
        if state is Liveness.EXITED and self.group_members():
            return True
        return bool(self.cgroup is not None and self.cgroup.live_members())

    def _signal_group(self, sig: int) -> None:
        if not self.pinned():
            return
        try:
            os.killpg(self.identity.pgid, sig)
        except ProcessLookupError:
            pass
        except OSError as exc:
            raise ExecutionError(f"signal to the process group failed: {exc.strerror}", code="signal_failed") from None

    def _signal_leader(self, sig: int) -> None:
        """``sig`` to the leader alone, while its identity is verified running (through
        the pidfd bound to it, so a recycled pid is never hit)."""
        if self.leader() is not Liveness.RUNNING:
            return
        try:
            if self.leader_fd is not None and self.leader_fd >= 0:
                signal.pidfd_send_signal(self.leader_fd, sig)
            else:
                os.kill(self.identity.pid, sig)
        except ProcessLookupError:
            pass
        except OSError as exc:
            raise ExecutionError(f"signal to the job wrapper failed: {exc.strerror}", code="signal_failed") from None

    def terminate(self) -> None:
        """One SIGTERM for each process of the Run (module docstring, step 3): the running
        wrapper alone (it passes it on to its group), else the group of the exited leader
        directly; then each cgroup member outside the group through a verified pidfd."""
        if self.leader() is Liveness.RUNNING:
            self._signal_leader(signal.SIGTERM)
        else:
            self._signal_group(signal.SIGTERM)
        if self.cgroup is None:
            return
        pgid = self.identity.pgid
        cgroup = self.cgroup
        depth = pid_namespace_depth(self.identity.pid)

        def outside_group(pids: set[int]) -> set[int]:
            found = set()
            for pid in pids:
                stat = read_proc_stat(pid)
                # A process in a PID namespace below the leader's is reached through that
                # namespace's init (the wrapper's: it passes the TERM on to each, once).
                if stat is not None and stat.pgrp != pgid and not pid_namespace_depth(pid) > depth:
                    found.add(pid)
            return found

        signal_pids(outside_group(cgroup.members()), signal.SIGTERM, lambda: outside_group(cgroup.members()))

    def descendants_outside_group(self) -> set[int]:
        """Live descendants of the running leader outside its group, by ppid (``/proc``).

        The job wrapper is a child subreaper, so while it runs every process the job left
        (a ``setsid`` escapee whose parent exited included) is below it. Those in a PID
        namespace below the leader's are left out: they die with their init, which is in
        the group (the kernel ends a PID namespace whose init dies), so the job and its
        wrapper end at once, as for a job in the wrapper's group."""
        if self.leader() is not Liveness.RUNNING:
            return set()
        pgid = self.identity.pgid
        depth = pid_namespace_depth(self.identity.pid)
        children: dict[int, list[tuple[int, bool]]] = {}
        for s in scan_processes():
            children.setdefault(s.ppid, []).append((s.pid, s.pgrp != pgid and not s.exited))
        found: set[int] = set()
        seen = {self.identity.pid}
        todo = [self.identity.pid]
        while todo:
            for pid, outside in children.get(todo.pop(), ()):
                if pid not in seen:
                    seen.add(pid)
                    todo.append(pid)
                    if outside and not pid_namespace_depth(pid) > depth:
                        found.add(pid)
        return found

    def kill(self) -> None:
        """SIGKILL the whole group and the whole cgroup (``cgroup.kill`` where present).

        First, while the wrapper still runs, its descendants outside the group: the SIGKILL
        of the group ends the wrapper too, and what it had adopted would re-parent to init,
        out of reach without a cgroup. A few passes: a SIGKILLed escapee's children
        re-parent to the wrapper and are found by the next one."""
        for _ in range(_KILL_PASSES):
            escaped = self.descendants_outside_group()
            if not escaped:
                break
            signal_pids(escaped, signal.SIGKILL, self.descendants_outside_group)
        self._signal_group(signal.SIGKILL)
        if self.cgroup is not None:
            self.cgroup.kill()


def pid_namespace_depth(pid: int) -> int:
    """How many PID namespaces ``pid`` is in, as seen from ours (``NSpid:`` in
    ``/proc/<pid>/status``: one pid per level); 1 when unreadable or gone, or before
    Linux 4.1 (no ``NSpid``)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("NSpid:"):
                    return max(1, len(line.split()) - 1)
    except OSError:
        pass
    return 1


def _check_duration(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GRACE_MS:
        raise ExecutionError(f"{name} must be 1..{MAX_GRACE_MS} ms", code="invalid_input")


def _boot_seconds() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _gone_within(
    target: _Target,
    grace_ms: int,
    poll_ms: int,
    wait: Callable[[float], None],
    clock: Callable[[], float],
) -> bool:
    deadline = clock() + grace_ms / 1000
    while True:
        if not target.alive():
            return True
        now = clock()
        if now >= deadline:
            return False
        wait(min(poll_ms / 1000, deadline - now))


def stop(
    handle: str,
    cgroup: RunCgroup | None = None,
    *,
    terminate_grace_ms: int,
    kill_grace_ms: int,
    poll_ms: int = 25,
    wait: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] | None = None,
) -> StopResult:
    """Stop every process of a Run (see the module docstring for the algorithm).

    Args:
        handle: the ``ql3lp1.`` durable handle from ``RunAttempts.executor_handle``.
        cgroup: the Run's cgroup, or ``None`` where there is none.
        terminate_grace_ms: wait after SIGTERM, 1..30000 (config default 5000).
        kill_grace_ms: wait after SIGKILL, 1..30000 (config default 1000).
        poll_ms: observation interval, 1..30000 and at most either grace.
        wait: sleeps for the given seconds between polls; the controller passes a
            function that drains Run output meanwhile.
        clock: seconds on a clock that is never stepped (default ``CLOCK_BOOTTIME``: the
            graces are local timers, spec README "Decisions for clocks").

    Returns:
        a :class:`StopResult`; never raises for process or ``/proc`` trouble.

    Raises:
        ExecutionError: ``invalid_input`` for durations out of range (a caller bug).
    """
    _check_duration("terminate_grace_ms", terminate_grace_ms)
    _check_duration("kill_grace_ms", kill_grace_ms)
    _check_duration("poll_ms", poll_ms)
    if clock is None:
        clock = _boot_seconds
    if poll_ms > terminate_grace_ms or poll_ms > kill_grace_ms:
        raise ExecutionError("poll_ms cannot exceed a grace period", code="invalid_input")
    try:
        identity = decode_handle(handle).identity
    except ExecutionError:
        return StopResult("unknown", reason="invalid_handle")
    if not sys.platform.startswith("linux"):
        return StopResult("unknown", reason="unsupported_platform")
    target = _Target(identity, cgroup)
    try:
        if not target.alive():
            return StopResult("already_exited")
        target.terminate()
        if _gone_within(target, terminate_grace_ms, poll_ms, wait, clock):
            return StopResult("stopped", "SIGTERM")
        # Re-verify the full identity before escalating (inside alive() and kill()).
        if not target.alive():
            return StopResult("stopped", "SIGTERM")
        target.kill()
        if _gone_within(target, kill_grace_ms, poll_ms, wait, clock):
            return StopResult("stopped", "SIGKILL")
        return StopResult("timed_out")
    except ExecutionError as exc:
        reason = "signal_failed" if exc.code == "signal_failed" else "provider_unavailable"
        return StopResult("unknown", reason=reason)
    except OSError:
        return StopResult("unknown", reason="provider_unavailable")
    finally:
        target.close()
