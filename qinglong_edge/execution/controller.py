"""The execution controller: ONE thread that turns durable intents into verified stops.

ADR-0372 decision 6: the HTTP route only writes the intent; this thread alone holds
process authority. Public API (``serve`` builds one and calls these)::

    controller = ExecutionController(store, config.execution)
    controller.start()          # recovery, then the loop, on its own thread
    api = LocalApi(store, ..., on_intent=controller.on_intent)   # the HTTP hook (issue 8)
    controller.notify()         # the same wake-up, for any other caller; any thread
    controller.stop()           # serve drain: stop the Runs (reason shutdown), join
    store.close()               # only after stop(): the drain writes terminal states

``stop()`` waits :attr:`ExecutionController.stop_timeout_s` by default (both graces plus
2 s: the drain stops every Run concurrently, so one grace period in all).

Phases: the controller (``new -> recovering -> controlling -> draining -> closed``) and
each Run it controls (``running``, ``stopping``, ``completing``, ``reconciling``,
``finished``) have an explicit phase, every move checked against the tables of
:mod:`qinglong_edge.execution.phases` (their docstring has both tables).

**A stop never blocks the thread.** Each stop is a
:class:`~qinglong_edge.process.stop.Stopping` (the one stop algorithm of
:mod:`qinglong_edge.process.stop`, as timed steps), kept per attempt while it is under
way (:class:`~qinglong_edge.execution.stops.StopBook`). Its first step (look, SIGTERM)
runs at once, where the stop is decided; the loop then steps each stop when it is due
(every ``poll_ms``, 25 ms, and at a grace's end: re-verify, SIGKILL), and what follows the
stop (the terminal write, the completion, ``lost``) runs when its last step has the
:class:`~qinglong_edge.process.stop.StopResult`. So while Run A sits out its terminate
grace, a cancel of Run B is handled at once: B gets its SIGTERM within one turn of the
loop (``benchmarks/bench_controller_stop.py`` measures it). A stop that finds nothing to
signal ends in its first step, and its follow-up runs right there, as before.

The thread wakes on :meth:`notify` (a self-pipe), on any Run's exit (its wrapper's pidfd
is in the same ``selectors`` set), at the next step of a stop under way, at the nearest
deadline, and at least every ``execution.controlIntervalMs``. Each turn steps the stops
that are due; a pass (below) runs when the thread was woken, or a deadline, a backoff or
the control interval is due (not on every 25 ms step of a stop: a pass reads the store).
Output needs no attention: each Run's job wrapper (:mod:`qinglong_edge.process.wrapper`)
writes its capped log itself. Each pass:

1. Candidates of local-api.md 7.1 (cancellation intents and due deadlines; see
   :func:`~qinglong_edge.execution.transitions.list_candidates`). Per candidate, 7.2: a
   deadline first writes its ``timeout`` intent; then **completion first** (our child
   already exited: the completion path records its exit code; with an intent the Run still
   reads ``cancelled``/``timed_out``, 7.2 step 1); then the stop begins (a
   :class:`~qinglong_edge.process.stop.Stopping`); then, once it is over,
   ``mark_terminal`` if the stop is conclusive. If the stop found the process already
   gone without signalling (``already_exited``) and it is our child, its natural exit wins
   and goes through the completion path. A ``claimed`` attempt (queued Run) needs no stop.
   A stop that is not conclusive is retried after one control interval. A candidate whose
   stop is under way is skipped.
2. Completions of the other Runs: our children by ``waitid(WNOWAIT)`` (the leader stays an
   unreaped zombie, pinning its group number, until leftovers of its group and cgroup are
   stopped, by a stop that begins here); adopted processes by identity (exit status
   unknown: ``lost``, after a stop of leftovers in the cgroup).
3. Launches whose handle storage failed to record are put back to ``queued`` (a new
   attempt; :func:`~qinglong_edge.execution.transitions.requeue_launch`), as soon as
   storage takes the write; then launches while fewer than ``execution.maxConcurrentRuns``
   Runs are active (a requeued Run after its backoff).

One controller per database: :meth:`ExecutionController.start` takes an exclusive ``flock``
on ``<database>.controller.lock`` (``already_owned`` otherwise) and the thread releases it
when it ends, so a second ``serve`` on the same database can never adopt, and then "shut
down", the Runs of the one that is running.

Restart recovery (first thing on the thread; repeated by each pass until complete):
:mod:`qinglong_edge.execution.recovery`.

Shutdown (:meth:`stop`): decision for the drain that 7.2 mentions: the Runs this agent is
running are stopped, not left behind. Each active Run gets a ``shutdown`` intent (an
existing intent is kept), all are stopped concurrently, and each is marked terminal
(``cancelled``, reason ``shutdown``). Decision: the drain uses the same steppers as the
loop, on the controller's own thread (it once started one short-lived thread per Run):
every Run's SIGTERM goes out in the drain's first turn, stops already under way go on,
and the drain steps them all until each is over, so it takes one grace period in all, not
one per Run, with no thread per Run (a 64-PID budget). Queued Runs stay queued for the
next start. A Run the drain cannot finish within ``timeout_s`` keeps its intent; the next
start converges it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import selectors
import threading
import time
from collections.abc import Callable

from qinglong_edge.clock import boot_id, boot_ms
from qinglong_edge.config import ExecutionConfig
from qinglong_edge.contracts.ids import new_uuid4
from qinglong_edge.errors import EdgeError, StoreError, storage_error
from qinglong_edge.execution.launcher import (
    LAUNCH_BACKOFF_S,
    MAX_LAUNCH_ATTEMPTS,
    ActiveRun,
    Launcher,
)
from qinglong_edge.execution.phases import CONTROLLER_TRANSITIONS
from qinglong_edge.execution.recovery import Recovery, discard_cgroup
from qinglong_edge.execution.stops import StopBook
from qinglong_edge.execution.transitions import (
    MAX_PAGE,
    Candidate,
    Snapshot,
    list_candidates,
    load_snapshot,
    mark_lost,
    mark_terminal,
    record_completion,
    request_control_cancellation,
)
from qinglong_edge.local.store import Store, now_ms
from qinglong_edge.process.cgroups import CgroupManager, RunCgroup, out_of_memory
from qinglong_edge.process.identity import inspect
from qinglong_edge.process.stop import StopResult, check_transition

__all__ = ["ExecutionController"]


def _one_line(exc: BaseException) -> str:
    """An unexpected exception in one log line (no traceback to a user): its type, the
    first line of its message, and where it was raised."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = f" at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}" if tb is not None else ""
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}{where}" + (f": {text}" if text else "")

_log = logging.getLogger("qinglong_edge.execution")
#: Candidate pages read per pass (7.1 pages of 64; lifecycle ``maxDrainPages`` <= 16).
_MAX_PAGES = 16


class ExecutionController:
    """Launches queued Runs and converges cancel intents and deadlines into verified stops.

    Args:
        store: the opened Local store (shared with the HTTP server).
        config: ``config.execution`` (grace periods, interval, log directory and cap,
            concurrency, ``cgroups`` auto|off).
        clock: wall clock in ms for stored times (default: the store's); deadlines run
            on the boot clock (``deadline_boot_ms`` of this boot), so a wall-clock step
            neither times a Run out nor keeps it running (spec README "Decisions for clocks").
        cgroups: a prepared :class:`CgroupManager` (default: detected at :meth:`start`).
        poll_ms: observation interval during a stop (local-api.md 7.3: 25 ms).
        work_directory: default working directory (and ``HOME``) of jobs whose task has
            none (default: ``config.work_directory``, ``execution.workDirectory``, whose
            default is ``<stateDirectory>/work``; created 0700 at :meth:`start`).
            Never derived from the log directory (whose parent may be ``/tmp``).
        pids_max: per-Run ``pids.max`` where the v1 pids controller is used (None: no cap).
        launch_attempts, launch_backoff_s: the bound and first backoff of launches that
            storage failed to record (:mod:`qinglong_edge.execution.launcher`; tests
            shorten them).

    Creating it opens a self-pipe and a selector, nothing else; :meth:`start` creates the
    directories and starts the thread.
    """

    def __init__(
        self,
        store: Store,
        config: ExecutionConfig,
        *,
        clock: Callable[[], int] = now_ms,
        cgroups: CgroupManager | None = None,
        poll_ms: int = 25,
        work_directory: str | None = None,
        pids_max: int | None = None,
        new_id: Callable[[], str] = new_uuid4,
        launch_attempts: int = MAX_LAUNCH_ATTEMPTS,
        launch_backoff_s: float = LAUNCH_BACKOFF_S,
    ) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        #: This boot's id: a boot-clock deadline of another boot is void (the wall one counts).
        self._boot_id = boot_id()
        #: Called (controller thread) after each Run it launches; serve counts them.
        self.on_launch: Callable[[], None] | None = None
        self.poll_ms = min(poll_ms, config.terminate_grace_ms, config.kill_grace_ms)
        self.work_directory = work_directory or config.work_directory
        if not self.work_directory:
            raise ValueError("the execution controller needs a work directory (execution.workDirectory)")
        self.new_id = new_id
        self._cgroups = cgroups
        self._pids_max = pids_max
        self._launch_attempts = launch_attempts
        self._launch_backoff_s = launch_backoff_s
        self._active: dict[str, ActiveRun] = {}
        self._retry_at: dict[str, float] = {}
        #: Stops under way, by attempt id (module docstring: a stop never blocks the thread).
        self._stops = StopBook(terminate_grace_ms=config.terminate_grace_ms, kill_grace_ms=config.kill_grace_ms,
                               poll_ms=self.poll_ms)
        self._recovery: Recovery | None = None
        #: When the next pass is due (``time.monotonic()``), unless the thread is woken first.
        self._pass_at = 0.0
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._woken = False
        self._launcher: Launcher | None = None
        self._authority_fd = -1
        #: ``new``, ``recovering``, ``controlling``, ``draining`` or ``closed``
        #: (:data:`~qinglong_edge.execution.phases.CONTROLLER_TRANSITIONS`).
        self.phase = "new"
        #: Completed passes (for tests and diagnostics).
        self.passes = 0

    # -- public API ---------------------------------------------------------------------

    @property
    def cgroups(self) -> CgroupManager:
        if self._cgroups is None:
            self._cgroups = CgroupManager.detect(self.config.cgroups, pids_max=self._pids_max,
                                                 memory_max=self.config.max_run_memory_bytes)
        return self._cgroups

    def start(self) -> None:
        """Detect cgroups, create the log and work directories, start the thread (recovery
        runs on it).

        Raises:
            StorageError: a directory (or the controller lock) cannot be created:
                ``storage_unavailable`` (exit 74) when its file system is full or failing,
                ``unsafe_storage`` (73) otherwise (:func:`qinglong_edge.errors.storage_error`).
            EdgeError: ``already_owned``.
        """
        if self._thread is not None:
            return
        self._take_authority()
        try:
            directories = ((self.config.log_directory, "the Run log directory {} (execution.logDirectory)"),
                           (self.work_directory, "the Runs' work directory {} (execution.workDirectory)"))
            for directory, what in directories:
                try:
                    os.makedirs(directory, mode=0o700, exist_ok=True)
                except OSError as exc:
                    raise storage_error(exc, "cannot create " + what.format(directory)) from None
        except EdgeError:
            self._release_authority()
            raise
        if not self.cgroups.available:
            _log.warning("per-Run cgroups are not used: %s", self.cgroups.reason)
        self._launcher = Launcher(
            self.store, cgroups=self.cgroups, log_directory=self.config.log_directory,
            max_log_bytes=self.config.max_log_bytes, work_directory=self.work_directory, clock=self.clock,
            new_id=self.new_id, launch_attempts=self._launch_attempts, launch_backoff_s=self._launch_backoff_s,
            terminate_grace_ms=self.config.terminate_grace_ms, kill_grace_ms=self.config.kill_grace_ms,
        )
        self._recovery = Recovery(
            self.store, cgroups=self.cgroups, log_directory=self.config.log_directory,
            kill_grace_ms=self.config.kill_grace_ms, clock=self.clock, new_id=self.new_id, boot_id=self._boot_id,
            stops=self._stops, active=self._active, track=self._track,
        )
        self._move("recovering")
        self._thread = threading.Thread(target=self._main, name="qinglong-edge-execution", daemon=True)
        self._thread.start()

    def _move(self, phase: str) -> None:
        check_transition(CONTROLLER_TRANSITIONS, "execution controller", self.phase, phase)
        self.phase = phase

    def _take_authority(self) -> None:
        """Hold ``<database>.controller.lock`` (``flock``, never unlinked) while the thread
        may signal: ADR-0372 decision 6 gives process authority to *one* controller. A
        second one on the same database (another ``serve``) would adopt the first one's
        processes in its restart recovery and stop them as a "shutdown" when it exits.

        Raises:
            EdgeError: ``already_owned`` (another process runs a controller on this
                database).
            StorageError: the lock file cannot be opened (:func:`qinglong_edge.errors.storage_error`).
        """
        path = getattr(self.store, "path", "")
        if not isinstance(path, str) or not path or path == ":memory:":
            return
        lock_path = path + ".controller.lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise storage_error(exc, f"cannot open the execution controller's lock {lock_path}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise EdgeError(
                f"{lock_path}: another process runs the execution controller on this database",
                code="already_owned",
            ) from None
        self._authority_fd = fd

    def _release_authority(self) -> None:
        fd, self._authority_fd = self._authority_fd, -1
        if fd >= 0:
            os.close(fd)

    def notify(self) -> None:
        """Wake the thread now (a cancel intent or a new Run committed). Never blocks."""
        with self._wake_lock:
            if self._wake_w < 0:
                return
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._wake_w, b"\0")

    def on_intent(self, operation: str, run_id: str) -> None:
        """The Local API's intent hook (``("run.cancel" | "task.start", runId)``): wake up.

        The Run id is not needed: the thread re-reads every durable intent (level
        triggered, field-lessons.md 2), so a lost wake-up only costs one control interval.
        """
        self.notify()

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Wait until restart recovery has finished; True if it has."""
        return self._ready.wait(timeout_s)

    @property
    def stop_timeout_s(self) -> float:
        """A ``stop`` timeout that lets the drain finish: both graces plus 2 s (seconds)."""
        return (self.config.terminate_grace_ms + self.config.kill_grace_ms) / 1000 + 2.0

    def stop(self, timeout_s: float | None = None) -> bool:
        """Drain (module docstring) and join the thread; True if it finished in time.

        Args:
            timeout_s: how long to wait (default :attr:`stop_timeout_s`).
        """
        if timeout_s is None:
            timeout_s = self.stop_timeout_s
        self._stopping.set()
        self.notify()
        thread = self._thread
        if thread is None:
            if self.phase == "new":
                self._move("closed")
            return True
        thread.join(timeout_s)
        return not thread.is_alive()

    @property
    def active_attempts(self) -> list[str]:
        """Attempt ids whose processes this controller currently owns (a snapshot)."""
        return list(self._active)

    def run_phase(self, attempt_id: str) -> str | None:
        """The phase of a Run this controller owns (``running``, ``stopping``,
        ``completing``, ``reconciling``; :mod:`qinglong_edge.execution.phases`), or None
        once it is finished (or was never ours). Any thread; for tests and diagnostics."""
        active = self._active.get(attempt_id)
        return active.phase if active is not None else None

    # -- the thread ---------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._recover()
        except Exception as exc:  # noqa: BLE001 - the loop must run even if recovery could not finish
            _log.warning("restart recovery failed (%s); the control loop retries it", _one_line(exc))
        self._ready.set()
        self._pass_at = time.monotonic() + self._pass_interval()  # the first pass: when woken or due
        while not self._stopping.is_set():
            if self._pump(self._next_wait()):
                self._woken = True
            if self._stopping.is_set():
                break
            self._guarded("stop step", self._advance_stops)
            if self._woken or time.monotonic() >= self._pass_at:
                self._woken = False
                self._guarded("execution control pass", self._pass)
                self.passes += 1
                self._pass_at = time.monotonic() + self._pass_interval()
        self._move("draining")
        try:
            self._drain()
        except StoreError as exc:  # the store is closed or failing (database gone): nothing can be recorded
            _log.warning("shutdown drain stopped (%s): the Runs still running are left to the next start, "
                         "which adopts or reconciles them", exc.code)
        except Exception as exc:  # noqa: BLE001 - still close what we hold
            _log.error("shutdown drain failed: %s", _one_line(exc))
        finally:
            self._stops.close()
            for active in list(self._active.values()):
                active.close()
            self._selector.close()
            with self._wake_lock:
                os.close(self._wake_w)
                os.close(self._wake_r)
                self._wake_w = self._wake_r = -1
            self._release_authority()
            self._move("closed")

    @staticmethod
    def _guarded(what: str, step: Callable[[], None]) -> None:
        """Run ``step``; log what it raises: this thread must never die (the next turn retries)."""
        try:
            step()
        except StoreError as exc:
            _log.warning("%s failed: %s", what, exc.code)
        except Exception as exc:  # noqa: BLE001 - this thread must never die; the next pass retries
            _log.error("%s failed: %s", what, _one_line(exc))

    def _pass_interval(self) -> float:
        """Seconds from now to the next pass (a pass just ended): the control interval, or
        sooner a Run's deadline or a requeued Run's backoff end."""
        timeout = self.config.control_interval_ms / 1000
        now, boot = self.clock(), boot_ms()
        for active in self._active.values():
            if active.deadline_boot_ms is not None:  # the timer (boot clock); wall only without one
                timeout = min(timeout, max(0.0, (active.deadline_boot_ms - boot) / 1000))
            elif active.deadline_at_ms is not None:
                timeout = min(timeout, max(0.0, (active.deadline_at_ms - now) / 1000))
        launcher = self._launcher
        if launcher is not None and launcher.not_before:  # a requeued Run's backoff ends
            timeout = min(timeout, max(0.0, min(launcher.not_before.values()) - time.monotonic()))
        return timeout

    def _next_wait(self) -> float:
        """Seconds the loop may wait: until the next pass or the next step of a stop."""
        if self._woken:
            return 0.0
        wait = max(0.0, self._pass_at - time.monotonic())
        step = self._stops.wait_s()
        return wait if step is None else min(wait, step)

    def _pump(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a notification or a process exit; True if one came
        (it ends the wait)."""
        deadline = time.monotonic() + seconds
        woken = False
        while True:
            remaining = deadline - time.monotonic()
            for key, _ in self._selector.select(max(remaining, 0.0)):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError, OSError):
                        while os.read(self._wake_r, 512):
                            pass
                else:  # a pidfd: that process exited
                    self._selector.unregister(key.fd)
                woken = True
            if woken or remaining <= 0:
                return woken

    def _track(self, active: ActiveRun) -> None:
        self._active[active.attempt_id] = active
        if active.pidfd >= 0:
            self._selector.register(active.pidfd, selectors.EVENT_READ, active.attempt_id)

    def _forget(self, active: ActiveRun) -> None:
        if active.pidfd >= 0:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(active.pidfd)
        self._active.pop(active.attempt_id, None)
        self._retry_at.pop(active.attempt_id, None)

    # -- one pass -----------------------------------------------------------------------

    def _pass(self) -> None:
        if self.phase == "recovering":
            self._recover()
        now, boot_now, boot = self.clock(), boot_ms(), self._boot_id
        after: tuple[int, str, str] | None = None
        for _ in range(_MAX_PAGES):
            candidates = self.store.run(lambda c, a=after: list_candidates(  # type: ignore[misc]
                c, now, after=a, boot_ms=boot_now, boot_id=boot))
            for candidate in candidates:
                if self._stopping.is_set():
                    return
                if self._retry_at.get(candidate.attempt_id, 0.0) > time.monotonic():
                    continue
                self._control(candidate)
            if len(candidates) < MAX_PAGE:
                break
            last = candidates[-1]
            after = (last.due_at_ms, last.kind, last.attempt_id)
        for active in list(self._active.values()):
            self._check_exit(active)
        launcher = self._launcher
        if launcher is not None and launcher.unrecorded:
            launcher.retry_unrecorded()
        if launcher is not None and launcher.deferred:
            launcher.retry_deferred()
        while launcher is not None and len(self._active) < self.config.max_concurrent_runs:
            if self._stopping.is_set():
                return
            result = launcher.launch_next()
            if result is None:
                break
            if result.active is not None:
                self._track(result.active)
                if self.on_launch is not None:
                    self.on_launch()  # serve's metrics: a counter, never blocks

    def _control(self, candidate: Candidate) -> None:
        """local-api.md 7.2 for one candidate.

        A deadline first checks for a completion (a job that exited just before its
        deadline was noticed ended by itself), then writes its ``timeout`` intent. A
        candidate whose stop is under way is left to that stop.
        """
        if candidate.attempt_id in self._stops:
            return
        active = self._active.get(candidate.attempt_id)
        if candidate.kind == "deadline":
            if active is not None and active.exit_code() is not None:
                self._complete(active)
                return
            requested = self.store.run(lambda c: request_control_cancellation(
                c, candidate.run_id, candidate.attempt_id, reason="timeout", requested_at_ms=candidate.due_at_ms,
                require_deadline=True, new_id=self.new_id,
            ))
            if not requested:
                return
        if active is not None and active.exit_code() is not None:
            self._complete(active)  # completion first
            return
        snap = self.store.run(lambda c: load_snapshot(c, candidate.run_id, candidate.attempt_id))
        if snap is None or not snap.controllable or snap.run.cancel_reason is None:
            return  # stale
        reason = snap.run.cancel_reason
        handle = snap.attempt.executor_handle
        if snap.attempt.status == "claimed" or (handle is None and active is None):
            # Never launched (queued), or a launch interrupted before its handle: the
            # start barrier guarantees its job never ran.
            self._discard_orphan_cgroup(snap.attempt.id)
            self.store.run(lambda c: mark_terminal(c, snap, reason=reason, now_ms=self.clock(), new_id=self.new_id))
            return
        if handle is None:
            return  # remaining
        cgroup = active.cgroup if active is not None else self.cgroups.open(snap.attempt.id)
        self._stop_for_intent(active, snap, reason, handle, cgroup)

    def _stop_for_intent(self, active: ActiveRun | None, snap: Snapshot, reason: str, handle: str,
                         cgroup: RunCgroup | None) -> None:
        """7.2 steps 6-7: begin the stop; once it is over, terminalise (or retry)."""
        if active is not None:
            active.move("stopping")

        def then(result: StopResult) -> None:
            try:
                self._after_intent_stop(active, snap, reason, result)
            except BaseException:
                if active is not None and active.phase == "stopping":
                    active.move("running")  # the next pass decides again
                raise

        self._begin_stop(snap.attempt.id, handle, cgroup, then)

    def _after_intent_stop(self, active: ActiveRun | None, snap: Snapshot, reason: str, result: StopResult) -> None:
        _log.info("run %s: stop (%s): %s %s", snap.run.id, reason, result.status, result.signal or result.reason or "")
        if active is not None and result.status == "already_exited" and active.exit_code() is not None:
            self._complete(active)  # nothing was signalled: the natural exit wins
            return
        if not result.conclusive:
            if self.phase == "draining":
                _log.warning("run %s: not stopped at shutdown (%s)", snap.run.id, result)
            else:
                self._retry_at[snap.attempt.id] = time.monotonic() + self.config.control_interval_ms / 1000
            if active is not None:
                active.move("running")
            return
        exit_code = active.exit_code() if active is not None else None
        done = self.store.run(lambda c: mark_terminal(
            c, snap, reason=reason, now_ms=self.clock(), exit_code=exit_code, new_id=self.new_id,
        ))
        if done:
            self._finish(active, snap.attempt.id)
        elif active is not None:
            active.move("running")

    def _check_exit(self, active: ActiveRun) -> None:
        if active.phase != "running":
            return  # its stop is under way: the stop's end decides
        if active.process is not None:
            if active.exit_code() is not None:
                self._complete(active)
            return
        if inspect(active.handle).status == "not_running":
            self._reconcile_gone(active)

    def _complete(self, active: ActiveRun) -> None:
        """Our child exited by itself: stop leftovers, then the completion path."""
        code = active.exit_code()
        if code is None:
            return
        if active.exited_at_ms is None:
            active.exited_at_ms = self.clock()
        active.move("completing")

        def then(leftovers: StopResult) -> None:
            try:
                if leftovers.status == "stopped":
                    _log.info("run %s: stopped leftover processes after the leader exited", active.run_id)
                reason = out_of_memory(active.cgroup)
                status = self.store.run(lambda c: record_completion(
                    c, active.run_id, active.attempt_id, exit_code=code, finished_at_ms=active.exited_at_ms or 0,
                    now_ms=self.clock(), new_id=self.new_id, reason=reason,
                ))
            except BaseException:
                active.move("running")  # the next pass records it again
                raise
            _log.info("run %s: exited with %d: %s", active.run_id, code, status or "already recorded")
            self._finish(active, active.attempt_id)

        self._begin_stop(active.attempt_id, active.handle, active.cgroup, then)

    def _reconcile_gone(self, active: ActiveRun) -> None:
        """An adopted process is gone: exit status unknown. Leftovers in its cgroup, if
        any, are stopped first."""
        active.move("reconciling")

        def then(_leftovers: StopResult) -> None:
            try:
                snap = self.store.run(lambda c: load_snapshot(c, active.run_id, active.attempt_id))
                if snap is not None and snap.controllable and snap.run.cancel_requested_at_ms is not None:
                    active.move("running")  # the candidate pass terminalises it (stop -> already_exited)
                    return
                if snap is not None and snap.controllable:
                    self.store.run(lambda c: mark_lost(c, snap, why="process_not_running",
                                                       actor_id="local-execution-control",
                                                       now_ms=self.clock(), new_id=self.new_id))
            except BaseException:
                if active.phase == "reconciling":
                    active.move("running")
                raise
            self._finish(active, active.attempt_id)

        self._begin_stop(active.attempt_id, active.handle, active.cgroup, then)

    def _finish(self, active: ActiveRun | None, attempt_id: str) -> None:
        """After the Run is terminal: reap, close, remove the cgroup."""
        if active is None:
            self._discard_orphan_cgroup(attempt_id)
            return
        active.move("finished")
        self._forget(active)
        active.reap()
        active.close()
        if active.cgroup is not None and not active.cgroup.remove():
            _log.warning("run %s: its cgroup is not empty yet; it is swept at the next start", active.run_id)

    def _discard_orphan_cgroup(self, attempt_id: str) -> None:
        discard_cgroup(self.cgroups, attempt_id, self.config.kill_grace_ms)

    def _recover(self) -> None:
        """Restart recovery (:mod:`qinglong_edge.execution.recovery`); once it is complete
        the controller moves on to ``controlling``."""
        recovery = self._recovery
        if recovery is not None and recovery.run() and self.phase == "recovering":
            self._move("controlling")

    def _begin_stop(self, attempt_id: str, handle: str, cgroup: RunCgroup | None,
                    then: Callable[[StopResult], None]) -> None:
        self._stops.begin(attempt_id, handle, cgroup, then)

    def _advance_stops(self) -> None:
        """Step the stops that are due; the follow-up of each one that is over runs
        guarded (what one raises is logged; the others go on)."""
        self._stops.advance(lambda attempt_id, follow_up: self._guarded(
            f"the end of the stop of attempt {attempt_id}", follow_up))

    # -- shutdown drain -----------------------------------------------------------------

    def _drain(self) -> None:
        """Module docstring, "Shutdown": every Run's stop begins in this first turn; then
        the stops (those already under way too) are stepped until each is over."""
        for active in list(self._active.values()):
            if active.phase == "running" and active.exit_code() is not None:
                self._complete(active)
        for active in list(self._active.values()):
            if active.phase != "running":
                continue  # its stop is under way (below, it goes on to its end)
            self.store.run(lambda c, a=active: request_control_cancellation(  # type: ignore[misc]
                c, a.run_id, a.attempt_id, reason="shutdown", requested_at_ms=self.clock(),
                require_deadline=False, new_id=self.new_id,
            ))
            snap = self.store.run(lambda c, a=active: load_snapshot(c, a.run_id, a.attempt_id))  # type: ignore[misc]
            if snap is not None and snap.controllable and snap.run.cancel_reason is not None:
                self._stop_for_intent(active, snap, snap.run.cancel_reason, active.handle, active.cgroup)
        while self._stops:
            self._pump(self._stops.wait_s() or 0.0)
            self._advance_stops()

