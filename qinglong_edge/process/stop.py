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

Steps, not sleeps. The algorithm lives once, in :class:`Stopping`: an explicit phase
(``new`` -> ``terminating`` -> ``killing`` -> ``done``, table :data:`STOP_TRANSITIONS`)
advanced by :meth:`Stopping.step`, which does what is due *now* (look and SIGTERM; one
poll; the re-verification and SIGKILL) and says when it wants the next step (at most
``poll_ms`` later, never past a grace's end). It never sleeps, so one thread can advance
many stops and do other work between their polls: the execution controller does (a stop
never blocks its loop). :func:`stop` is the blocking form for callers with a thread to
spare (the remote worker's runner, tests): the same steps with a sleep in between, the
same signals, verification and :class:`StopResult`.
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

__all__ = [
    "MAX_GRACE_MS",
    "STOP_TRANSITIONS",
    "StopResult",
    "Stopping",
    "check_transition",
    "pid_namespace_depth",
    "stop",
]

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
        _send("the process group", lambda: os.killpg(self.identity.pgid, sig))

    def _signal_leader(self, sig: int) -> None:
        """``sig`` to the leader alone, while its identity is verified running (through
        the pidfd bound to it, so a recycled pid is never hit)."""
        if self.leader() is not Liveness.RUNNING:
            return
        fd = self.leader_fd
        if fd is not None and fd >= 0:
            _send("the job wrapper", lambda: signal.pidfd_send_signal(fd, sig))
        else:
            _send("the job wrapper", lambda: os.kill(self.identity.pid, sig))

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


def _send(target: str, send: Callable[[], None]) -> None:
    """``send()`` a signal; a target already gone is no error, another failure is
    ``signal_failed``."""
    try:
        send()
    except ProcessLookupError:
        pass
    except OSError as exc:
        raise ExecutionError(f"signal to {target} failed: {exc.strerror}", code="signal_failed") from None


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


#: The phases of one :class:`Stopping` and the phases each may move to (module docstring,
#: "Phases"); :meth:`Stopping.step` checks every move against it.
STOP_TRANSITIONS: dict[str, frozenset[str]] = {
    "new": frozenset({"terminating", "done"}),
    "terminating": frozenset({"killing", "done"}),
    "killing": frozenset({"done"}),
    "done": frozenset(),
}


def check_transition(table: dict[str, frozenset[str]], what: str, current: str, target: str) -> None:
    """Raise unless ``table`` lets ``current`` move to ``target``.

    Args:
        table: phase -> the phases it may move to (e.g. :data:`STOP_TRANSITIONS`).
        what: what moves, for the message (``"stop"``, ``"run 1b2c..."``).

    Raises:
        ExecutionError: ``invalid_phase`` (a caller bug: a move the table does not
            list, or an unknown phase).
    """
    if target not in table.get(current, ()):
        raise ExecutionError(f"{what}: no transition from {current!r} to {target!r}", code="invalid_phase")


class Stopping:
    """One stop of a Run's processes as timed steps (the module docstring's algorithm).

    Sans-IO in time: it never sleeps. :meth:`step` does the work that is due now (look and
    SIGTERM, one poll, the re-verification and SIGKILL) and returns how long until it
    wants the next step, or ``None`` once :attr:`result` is set. :func:`stop` is this loop
    with a sleep; the execution controller advances many stops on its one thread, each at
    its own :attr:`due_at`, and handles intents, deadlines and launches in between.

    Phases (:data:`STOP_TRANSITIONS`; :attr:`phase`)::

        new          -> done         invalid handle, not Linux, nothing alive (already_exited),
                                     or a signal / /proc failure (unknown)
        new          -> terminating  the SIGTERM went out; the terminate grace runs
        terminating  -> done         all gone (stopped SIGTERM, also at the re-verification),
                                     or unknown
        terminating  -> killing      grace over and still alive after re-verifying: SIGKILL
                                     went out; the kill grace runs
        killing      -> done         all gone (stopped SIGKILL), grace over (timed_out), unknown

    A step that moves on also polls at once (after the SIGTERM, after the SIGKILL), as the
    blocking loop always did: one step can go ``terminating -> killing -> done``.

    Args:
        handle, cgroup, terminate_grace_ms, kill_grace_ms, poll_ms, clock: as :func:`stop`.

    Attributes:
        phase: ``new``, ``terminating``, ``killing`` or ``done``.
        due_at: when the next step is due, in seconds on ``clock`` (0.0 until the first).
        result: the :class:`StopResult` once ``phase`` is ``done``, else ``None``.

    Raises:
        ExecutionError: ``invalid_input`` for durations out of range (a caller bug), at
            construction; :meth:`step` never raises for process or ``/proc`` trouble.
    """

    def __init__(
        self,
        handle: str,
        cgroup: RunCgroup | None = None,
        *,
        terminate_grace_ms: int,
        kill_grace_ms: int,
        poll_ms: int = 25,
        clock: Callable[[], float] | None = None,
    ) -> None:
        _check_duration("terminate_grace_ms", terminate_grace_ms)
        _check_duration("kill_grace_ms", kill_grace_ms)
        _check_duration("poll_ms", poll_ms)
        if poll_ms > terminate_grace_ms or poll_ms > kill_grace_ms:
            raise ExecutionError("poll_ms cannot exceed a grace period", code="invalid_input")
        self.handle = handle
        self.cgroup = cgroup
        self.terminate_grace_ms = terminate_grace_ms
        self.kill_grace_ms = kill_grace_ms
        self.poll_ms = poll_ms
        self.clock: Callable[[], float] = clock if clock is not None else _boot_seconds
        self.phase = "new"
        self.due_at = 0.0
        self.result: StopResult | None = None
        self._target: _Target | None = None
        #: End of the running grace (terminate, then kill), in seconds on ``clock``.
        self._grace_ends = 0.0
        #: When the last poll that kept waiting looked (seconds on ``clock``).
        self._polled_at = 0.0

    def wait_s(self) -> float | None:
        """Seconds until :meth:`step` is due (0.0 when due now), ``None`` once done."""
        if self.result is not None:
            return None
        return max(0.0, self.due_at - self.clock())

    def step(self) -> float | None:
        """Do what is due now; the seconds until the next step (at most ``poll_ms``), or
        ``None`` when the stop is over (:attr:`result` is set). Calling it early only
        polls early; calling it after ``done`` returns ``None`` again."""
        if self.result is not None:
            return None
        try:
            return self._step()
        except ExecutionError as exc:
            reason = "signal_failed" if exc.code == "signal_failed" else "provider_unavailable"
            self._finish(StopResult("unknown", reason=reason))
        except OSError:
            self._finish(StopResult("unknown", reason="provider_unavailable"))
        return None

    def close(self) -> None:
        """Release the leader's pidfd (a stop abandoned before ``done``; idempotent)."""
        if self._target is not None:
            self._target.close()

    def _move(self, phase: str) -> None:
        check_transition(STOP_TRANSITIONS, "stop", self.phase, phase)
        self.phase = phase

    def _finish(self, result: StopResult) -> None:
        self._move("done")
        self.result = result
        self.close()

    def _step(self) -> float | None:
        if self.phase == "new":
            try:
                identity = decode_handle(self.handle).identity
            except ExecutionError:
                self._finish(StopResult("unknown", reason="invalid_handle"))
                return None
            if not sys.platform.startswith("linux"):
                self._finish(StopResult("unknown", reason="unsupported_platform"))
                return None
            self._target = _Target(identity, self.cgroup)
            if not self._target.alive():
                self._finish(StopResult("already_exited"))
                return None
            self._target.terminate()
            self._begin_grace("terminating", self.terminate_grace_ms)
        target = self._target
        assert target is not None  # set in phase "new"
        seen = self._poll(target)
        if seen == "waiting":
            return self.due_at - self._polled_at
        if seen == "gone":
            self._finish(StopResult("stopped", "SIGKILL" if self.phase == "killing" else "SIGTERM"))
            return None
        if self.phase == "killing":
            self._finish(StopResult("timed_out"))
            return None
        # The terminate grace is over. Re-verify the full identity before escalating
        # (inside alive() and kill()).
        if not target.alive():
            self._finish(StopResult("stopped", "SIGTERM"))
            return None
        target.kill()
        self._begin_grace("killing", self.kill_grace_ms)
        return self._step()  # the kill grace's first poll, right away

    def _begin_grace(self, phase: str, grace_ms: int) -> None:
        self._move(phase)
        self._grace_ends = self.clock() + grace_ms / 1000

    def _poll(self, target: _Target) -> str:
        """One observation: ``gone`` (all gone), ``over`` (the running grace is over) or
        ``waiting`` (:attr:`due_at` moves at most ``poll_ms`` on, never past the grace end)."""
        if not target.alive():
            return "gone"
        now = self.clock()
        if now >= self._grace_ends:
            return "over"
        self._polled_at = now
        self.due_at = now + min(self.poll_ms / 1000, self._grace_ends - now)
        return "waiting"


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
    """Stop every process of a Run (see the module docstring for the algorithm), blocking:
    a :class:`Stopping` stepped until done, sleeping with ``wait`` in between.

    Args:
        handle: the ``ql3lp1.`` durable handle from ``RunAttempts.executor_handle``.
        cgroup: the Run's cgroup, or ``None`` where there is none.
        terminate_grace_ms: wait after SIGTERM, 1..30000 (config default 5000).
        kill_grace_ms: wait after SIGKILL, 1..30000 (config default 1000).
        poll_ms: observation interval, 1..30000 and at most either grace.
        wait: sleeps for the given seconds between polls.
        clock: seconds on a clock that is never stepped (default ``CLOCK_BOOTTIME``: the
            graces are local timers, spec README "Decisions for clocks").

    Returns:
        a :class:`StopResult`; never raises for process or ``/proc`` trouble.

    Raises:
        ExecutionError: ``invalid_input`` for durations out of range (a caller bug).
    """
    stopping = Stopping(handle, cgroup, terminate_grace_ms=terminate_grace_ms, kill_grace_ms=kill_grace_ms,
                        poll_ms=poll_ms, clock=clock)
    try:
        while (delay := stopping.step()) is not None:
            wait(delay)
    finally:
        stopping.close()
    assert stopping.result is not None  # step() returned None: done
    return stopping.result
