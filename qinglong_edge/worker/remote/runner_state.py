"""What the resident ``pull`` knows about each record beyond the journal, and its events.

The journal record is the truth that survives a crash; a :class:`Track` adds what only
this process can know: the job as our child (its exit status), the boot-clock send
instant of the request that granted the lease and the local lease expiry it gives (spec
README "Decisions for clocks"), the receive time of the starting answer (the local
deadline, "Timeout"), why a stop was asked for and what the last signal was ("No
receipt"), the upload's result, the retry schedule of a failed call. The lease and its
boot-clock times also live in the record's lease file in the runtime directory
(:mod:`qinglong_edge.worker.remote.lease`), so a successor in the same boot starts from them;
everything else is lost at a restart, by design. Every ``*_ms`` here is boot-clock ms.

:class:`RecordEvent` is one line of ``pull --json`` per record event (spec README "Shape
of the product")::

    {"event":"started","offerId":..,"runId":..,"attemptId":..,"state":"started","pid":4242}

``event`` is one of :data:`EVENTS`; the other keys depend on it (``pid``, ``reason``,
``leaseVersion``, ``expiresAtMs``, ``exitCode``, ``source``, ``byteLength``, ``sha256``,
``truncated``, ``status``, ``operation``, ``code``, ``httpStatus``, ``clusterCode``,
``retryAtMs``, ``signal``, ``logPath``...). Never a token, a secret or a body.
"""

from __future__ import annotations

from qinglong_edge.contracts._shape import Frozen

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.worker.remote.job import Outcome, RemoteJob

__all__ = ["EVENTS", "RecordEvent", "Track"]

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

    def __init__(self, event: str, record: dict[str, Any], details: dict[str, Any] | None = None) -> None:
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
        lease_lost / cluster_terminal: what a call established; terminal_checked: the
            completion was tried once after lease-control said the run is terminal.
        fenced: the calls answered 409 since their last success (G15);
        renew_now: renew at the next step (a re-adopted job: no send time is known);
        renewing: False once a call was fenced after a good lease-control: the lease
            then runs out (T12); skip_running: T8 given up the same way.
        outcome: how the job ended, once known; artifact: ``(byteLength, sha256,
            truncated)`` of the stored log, once uploaded.
        due_ms: when the runner wants to look at the record again (boot ms).
        failures: calls failed in a row (the backoff's exponent).
        discard: a forced discard's request id, while one is pending.
        done: terminal for residency (nothing local left to do).
    """

    __slots__ = ("artifact", "ask_after_timeout", "cluster_terminal", "discard", "done", "due_ms", "duration_ms",
                 "expiry_ms", "failures", "fenced", "job", "lease_dirty", "lease_lost", "outcome", "record",
                 "renew_now", "renewing", "sent_at_ms", "skip_running", "started_boot_ms", "starting_at_ms",
                 "stop_reason", "terminal_checked")

    def __init__(self, record: dict[str, Any], now_ms: int) -> None:
        self.record = record
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
        self.lease_lost = False
        self.cluster_terminal = False
        self.fenced: set[str] = set()
        self.renewing = True
        self.renew_now = False
        self.skip_running = False
        self.terminal_checked = False
        self.outcome: Outcome | None = None
        self.artifact: tuple[int, str, bool | None] | None = None
        self.due_ms = now_ms
        self.failures = 0
        self.discard: str | None = None
        self.done = False

    @property
    def offer_id(self) -> str:
        return str(self.record["offer"]["offerId"])

    @property
    def state(self) -> str:
        return str(self.record["state"])

    def __repr__(self) -> str:  # the record holds the lease token: never shown
        return f"<Track {self.offer_id} {self.state}>"
