"""What the resident ``pull`` knows about each record beyond the journal, its phase, and its events.

The journal record is the truth that survives a crash; a :class:`Track` adds what only
this process can know: the job as our child (its exit status), the boot-clock send
instant of the request that granted the lease and the local lease expiry it gives (spec
README "Decisions for clocks"), the receive time of the starting answer (the local
deadline, "Timeout"), why a stop was asked for and what the last signal was ("No
receipt"), the upload's result, the retry schedule of a failed call, and its *phase*
(below). The lease and its boot-clock times also live in the record's lease file in the
runtime directory (:mod:`qinglong_edge.worker.remote.lease`), so a successor in the same
boot starts from them; everything else is lost at a restart, by design. Every ``*_ms``
here is boot-clock ms.

A track's phase: what this process has established about the record's fate, beyond its
journal state (whose own table is :data:`~qinglong_edge.contracts.inbox.INBOX_TRANSITIONS`).
Plain strings (:data:`PHASES`); :data:`PHASE_NEXT` is the table, and setting
:attr:`Track.phase` to a phase it does not allow raises ``EdgeError(invalid_phase)``::

    phase             meaning                                            next
    live              the lease is ours: the record moves on through     cluster_terminal,
                      T1-T12 (every track starts here)                   lease_lost, done
    cluster_terminal  the cluster said the run is terminal (lease-       last_call,
                      control ``terminal``, running ``already_terminal``): lease_lost, done
                      stop what runs; settle ``control_plane_terminal``
                      unless an outcome of ours is still to be reported
    last_call         that report goes out once more, as the one call    lease_lost, done
                      after the run was found terminal (a completion
                      with our digest, a start-failure): a refusal is
                      ``control_plane_terminal``
    lease_lost        the lease is lost (lease-control fenced twice, the  done
                      local lease stop or expiry, the wrapper's mark): stop
                      what runs under the lease's graces; the record ends
                      ``recovery_required``, never a completion
    done              nothing local left to do (residency ends)          -

A lost lease outranks a terminal run (``lease_lost_local_execution_stopped`` is what the
record says then), so a ``terminal`` answer in ``lease_lost`` leaves the phase as it is
(:meth:`Track.run_terminal`); the phases of one real run are checked against this table
by ``tests/worker/remote/test_phases.py``.

Facts that stay flags, because they are orthogonal to the phase (each can hold in more
than one phase, and the phase does not decide them): ``lease_dirty``, ``renew_now`` and
``renewing`` belong to the lease's clock and file (:mod:`~qinglong_edge.worker.remote.lease_keeper`:
a lease left to run out, T12, may meet a terminal run); ``ask_after_timeout`` (a
lease-control owed after a timeout kill) and ``skip_running`` (T8 given up) are about
one call each; ``stop_reason``, ``outcome``, ``artifact`` and ``discard`` are values.

:class:`RecordEvent` is one line of ``pull --json`` per record event (spec README "Shape
of the product")::

    {"event":"started","offerId":..,"runId":..,"attemptId":..,"state":"started","pid":4242}

``event`` is one of :data:`EVENTS`; the other keys depend on it (``pid``, ``reason``,
``leaseVersion``, ``expiresAtMs``, ``exitCode``, ``source``, ``byteLength``, ``sha256``,
``truncated``, ``status``, ``operation``, ``code``, ``httpStatus``, ``clusterCode``,
``retryAtMs``, ``signal``, ``logPath``...). Never a token, a secret or a body.

:class:`Transitions` writes a track's record (one durable journal update per state
change) and emits its events; the runner and its parts share one.
"""

from __future__ import annotations

from collections.abc import Callable

from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.inbox import to_recovery_required
from qinglong_edge.crashpoints import crashpoint
from qinglong_edge.errors import EdgeError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.contracts.records import InboxRecord
    from qinglong_edge.worker.journal.store import Journal
    from qinglong_edge.worker.remote.job import Outcome, RemoteJob

__all__ = ["CLUSTER_TERMINAL", "DONE", "EVENTS", "LAST_CALL", "LEASE_LOST", "LIVE", "PHASES", "PHASE_NEXT",
           "RecordEvent", "Track", "Transitions"]

#: The phases of a track (module docstring), in the order a run may pass through them.
LIVE = "live"
CLUSTER_TERMINAL = "cluster_terminal"
LAST_CALL = "last_call"
LEASE_LOST = "lease_lost"
DONE = "done"
PHASES: tuple[str, ...] = (LIVE, CLUSTER_TERMINAL, LAST_CALL, LEASE_LOST, DONE)
#: phase -> the phases it may become (module docstring); ``done`` becomes nothing.
PHASE_NEXT: dict[str, frozenset[str]] = {
    LIVE: frozenset({CLUSTER_TERMINAL, LEASE_LOST, DONE}),
    CLUSTER_TERMINAL: frozenset({LAST_CALL, LEASE_LOST, DONE}),
    LAST_CALL: frozenset({LEASE_LOST, DONE}),
    LEASE_LOST: frozenset({DONE}),
    DONE: frozenset(),
}

#: Every ``event`` a record can report, roughly in the order of a run's life.
EVENTS: tuple[str, ...] = (
    "adopted", "starting_acknowledged", "launching", "started", "running_acknowledged", "renewed",
    "stop_requested", "stopped", "exited", "uploaded", "completion_acknowledged", "start_failed",
    "start_failure_acknowledged", "recovery_required", "process_gone", "call_failed", "storage_failed",
    "discarded",
)


class RecordEvent(Frozen):
    """One event of one record (see the module docstring)."""

    __slots__ = ("event", "offer_id", "run_id", "attempt_id", "state", "details")  # noqa: RUF023

    event: str
    offer_id: str
    run_id: str
    attempt_id: str
    state: str
    details: dict[str, Any]

    def __init__(self, event: str, record: InboxRecord, details: dict[str, Any] | None = None) -> None:
        candidate = record["offer"]["candidate"]
        _set = object.__setattr__
        _set(self, "event", event)
        _set(self, "offer_id", record["offer"]["offerId"])
        _set(self, "run_id", candidate["runId"])
        _set(self, "attempt_id", candidate["attemptId"])
        _set(self, "state", record["state"])
        _set(self, "details", dict(details or {}))

    def to_json(self) -> dict[str, Any]:
        return {"event": self.event, "offerId": self.offer_id, "runId": self.run_id, "attemptId": self.attempt_id,
                "state": self.state, **self.details}

    def describe(self) -> str:
        """The human line (``pull`` without ``--json``)."""
        extra = ", ".join(f"{key} {value}" for key, value in self.details.items() if value is not None)
        return f"pull: run {self.run_id}: {self.event.replace('_', ' ')}" + (f" ({extra})" if extra else "")




class Track:
    """One in-flight record and what this process knows about it (module docstring).

    Attributes:
        record: the record as last written (or read), holding the *current* lease: a
            renewal replaces the lease in memory (same revision) and in the lease file,
            the next state change writes it to the journal.
        phase: one of :data:`PHASES` (module docstring); set only along :data:`PHASE_NEXT`.
        job: its job, once launched or re-adopted; None before, or when gone for good.
        sent_at_ms: boot-clock send instant of the request that granted the lease, or None.
        duration_ms: that grant's ``expiresAtMs - renewedAtMs``.
        expiry_ms: the local lease expiry (boot clock), or None until known.
        starting_at_ms: receive time of the starting answer (T1 or T2).
        started_boot_ms: the boot instant of the launch (T5), when known in this boot.
        lease_dirty: the lease file could not be written (RAM full): written again at the
            next step; the lease itself is kept here and used by every call.
        stop_reason: why the job is to be stopped (a cluster stop reason, ``timeout``
            for the local deadline, ``terminal``, ``lease_lost``, ``discard``) or None.
        ask_after_timeout: a lease-control is still owed after a local timeout kill.
        fenced: the calls answered 409 since their last success (G15);
        renew_now: renew at the next step (a re-adopted job: no send time is known);
        renewing: False once a call was fenced after a good lease-control: the lease
            then runs out (T12); skip_running: T8 given up the same way.
        outcome: how the job ended, once known; artifact: ``(byteLength, sha256,
            truncated)`` of the stored log, once uploaded.
        due_ms: when the runner wants to look at the record again (boot ms).
        failures: calls failed in a row (the backoff's exponent).
        discard: a forced discard's request id, while one is pending.
    """

    __slots__ = ("_phase", "artifact", "ask_after_timeout", "discard", "due_ms", "duration_ms", "expiry_ms",
                 "failures", "fenced", "job", "lease_dirty", "outcome", "record", "renew_now", "renewing",
                 "sent_at_ms", "skip_running", "started_boot_ms", "starting_at_ms", "stop_reason")

    def __init__(self, record: InboxRecord, now_ms: int) -> None:
        self.record = record
        self._phase = LIVE
        self.job: RemoteJob | None = None
        self.sent_at_ms: int | None = None
        lease = record["offer"]["lease"]
        self.duration_ms: int = max(0, lease["expiresAtMs"] - lease["renewedAtMs"])
        self.expiry_ms: int | None = None
        self.starting_at_ms: int | None = None
        self.started_boot_ms: int | None = None
        self.lease_dirty = False
        self.stop_reason: str | None = None
        self.ask_after_timeout = False
        self.fenced: set[str] = set()
        self.renewing = True
        self.renew_now = False
        self.skip_running = False
        self.outcome: Outcome | None = None
        self.artifact: tuple[int, str, bool | None] | None = None
        self.due_ms = now_ms
        self.failures = 0
        self.discard: str | None = None

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, phase: str) -> None:
        """Move to ``phase``. Raises EdgeError (``invalid_phase``) when :data:`PHASE_NEXT`
        does not allow it (a bug of the runner: never caught)."""
        if phase not in PHASE_NEXT[self._phase]:
            raise EdgeError(f"a record in phase {self._phase} cannot move to {phase}", code="invalid_phase")
        self._phase = phase

    @property
    def done(self) -> bool:
        """Terminal for residency (nothing local left to do): phase ``done``."""
        return self._phase == DONE

    def lose_lease(self) -> None:
        """The lease is lost (phase ``lease_lost``; already there: nothing changes)."""
        if self._phase != LEASE_LOST:
            self.phase = LEASE_LOST

    def run_terminal(self) -> None:
        """The cluster said the run is terminal: ``live`` becomes ``cluster_terminal``
        (``last_call`` and ``lease_lost`` stay: module docstring); the job is to stop."""
        if self._phase == LIVE:
            self.phase = CLUSTER_TERMINAL
        self.stop_reason = self.stop_reason or "terminal"

    @property
    def offer_id(self) -> str:
        return str(self.record["offer"]["offerId"])

    @property
    def state(self) -> str:
        return str(self.record["state"])

    def __repr__(self) -> str:  # the record holds the lease token: never shown
        return f"<Track {self.offer_id} {self.state} {self._phase}>"


class Transitions:
    """The durable transitions and the events of one journal's tracks.

    Args:
        journal: the owned journal.
        emit: called with each :class:`RecordEvent`.
        wall_ms: the wall clock, for the record's times people read.
    """

    def __init__(self, journal: Journal, emit: Callable[[RecordEvent], None], wall_ms: Callable[[], int]) -> None:
        self.journal = journal
        self.emit = emit
        self.wall_ms = wall_ms

    def event(self, t: Track, name: str, **details: Any) -> None:
        self.emit(RecordEvent(name, t.record, details))

    def write(self, t: Track, record: InboxRecord, point: str, event: str | None = None, **details: Any) -> None:
        """One durable transition (the journal re-checks it against the stored record);
        ``record`` holds the current lease, so the journal catches up on renewals here.
        Then the crash point ``runner.<point>`` and the event, if any.

        Raises:
            JournalError: the write failed (the track keeps the record as last written).
        """
        t.record = self.journal.replace_offer(record, t.record["revision"])
        crashpoint(f"runner.{point}")
        if event is not None:
            self.event(t, event, **details)

    def recover(self, t: Track, reason: str) -> None:
        """``recovery_required(reason)``; phase ``done`` unless the reason still needs this
        process (a stop to verify, a ``launch_outcome_unknown`` to complete from a receipt)."""
        self.write(t, to_recovery_required(t.record, self.wall_ms(), reason), "recovery_required",
                   "recovery_required", reason=reason)
        if reason not in ("lease_lost_local_execution_unverified", "launch_outcome_unknown"):
            t.phase = DONE
