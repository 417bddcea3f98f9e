"""Take this Remote Worker offline: ``draining``, every record settled, then ``offline``.

What ``qinglong-edge drain`` runs when the device leaves the cluster (the package's
removal, the worker role switched off): the reference's ``drainAndStop``
(``productionHeadlessApplication.ts``, with ``workerSessionCoordinator.ts``
``beginDrain``/``disconnect``), on our residency rule::

    own the journal (the command first makes a pull that holds it exit: pull --release)
    the stored session, live by our clock?    no -> nothing to send: "no_session"
    transition draining                       (the cluster places nothing more here; a
                                               repeat is its replay: draining -> draining)
    a kept claim is replayed once             (a lease the cluster committed but whose
                                               answer was lost comes back as lease_recovery)
    drive every record in flight              (the resident loop: renewals, completions,
                                               heartbeats announcing 0 slots, no pull)
      until none is in flight (contracts/residency.py) or worker.drainTimeoutMs passed
    none left   -> transition offline         "offline"
    some left   -> the session stays draining "timed_out", with what is left

``offline`` is never sent while a record is in flight: it ends the session's lease at
the cluster, which fences the completion still to be reported. A drain that timed out
is finished by running it again (``draining`` again is a replay). The keeper never
registers here (``may_register=False``): a drain must not bring the device back online.
"""

from __future__ import annotations

import os
import random as _random
import time
from collections.abc import Callable, Iterator

from qinglong_edge.clock import boot_ms
from qinglong_edge.config import EdgeConfig, WorkerConfig
from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.worker.cycle import _InterruptibleTransport
from qinglong_edge.worker.delivery.abort import AbortSignal
from qinglong_edge.worker.delivery.cluster_clock import ClusterClock
from qinglong_edge.worker.delivery.pull import PullCoordinator, SessionAuthority
from qinglong_edge.worker.delivery.session import SessionKeeper
from qinglong_edge.worker.ingress.transport import IngressTransport
from qinglong_edge.worker.journal.runtime import RuntimeDirectory
from qinglong_edge.worker.journal.store import Journal, JournalOptions
from qinglong_edge.worker.remote.job_files import in_flight

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["DrainReport", "run_drain", "unsettled"]


class DrainReport(Frozen):
    """A step of the drain: ``status`` ``draining`` (sent), ``offline`` (done),
    ``timed_out`` (records left, the session stays draining) or ``no_session`` (nothing
    live to take offline); ``left``: the records still in flight
    (``{offerId, runId, state}``); ``session``: ``{sessionId, generation, status}``."""

    __slots__ = ("status", "left", "session", "detail")  # noqa: RUF023 (field order)

    status: str
    left: tuple[dict[str, str], ...]
    session: dict[str, Any] | None
    detail: str

    def __init__(self, status: str, left: tuple[dict[str, str], ...] = (), session: dict[str, Any] | None = None,
                 detail: str = "") -> None:
        _set = object.__setattr__
        _set(self, "status", status)
        _set(self, "left", left)
        _set(self, "session", session)
        _set(self, "detail", detail)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"event": "drain", "status": self.status, "left": [dict(x) for x in self.left]}
        if self.session is not None:
            out["session"] = dict(self.session)
        if self.detail:
            out["detail"] = self.detail
        return out

    def describe(self) -> str:
        session = "" if self.session is None else f"session {self.session['sessionId']} "
        if self.status == "draining":
            return (f"drain: {session}draining: the cluster places nothing more here; waiting for "
                    f"{len(self.left)} record(s) in flight to settle")
        if self.status == "offline":
            return f"drain: every record settled; {session}offline"
        left = "; ".join(f"offer {x['offerId']} run {x['runId']} ({x['state']})" for x in self.left) or "none"
        if self.status == "no_session":
            return f"drain: no live session to take offline ({self.detail}); records in flight: {left}"
        return f"drain: {self.detail}; {session}stays draining; still in flight: {left}"


def unsettled(journal: Journal, now_ms: int) -> tuple[dict[str, str], ...]:
    """The inbox records still in flight by our residency rule, in offerId order."""
    left = []
    for offer_id in journal.list_offers():
        record = journal.read_offer(offer_id)
        if record is not None and in_flight(record, now_ms):
            left.append({"offerId": offer_id, "runId": str(record["offer"]["candidate"]["runId"]),
                         "state": str(record["state"])})
    return tuple(left)


def _session_json(keeper: SessionKeeper) -> dict[str, Any] | None:
    record = keeper.current()
    if record is None:
        return None
    return {"sessionId": record.session_id, "generation": record.generation, "status": record.status}


def run_drain(
    worker: WorkerConfig,
    *,
    config: EdgeConfig,
    abort: AbortSignal | None = None,
    clock_ms: Callable[[], int] | None = None,
    random: Callable[[], float] = _random.random,
    transport: IngressTransport | None = None,
) -> Iterator[Any]:
    """Drain and take the session offline (module docstring).

    Yields the :class:`DrainReport` steps, the record events and notable session or pull
    reports of the resident loop, and its summary; the last item is the final
    :class:`DrainReport` (``offline``, ``timed_out`` or ``no_session``).

    Raises:
        JournalError: ``already_owned`` (a process holds the journal) and storage failures.
        SessionError: the ``draining`` or ``offline`` call failed (``credential_rejected``,
            ``session_unavailable``, ``invalid_response``, ``session_fenced``...).
        TransportError: ``invalid_configuration`` / ``credentials_unavailable``.
    """
    from qinglong_edge.worker.cycle import wall_ms

    abort = abort or AbortSignal()
    clock = clock_ms or wall_ms  # the wall clock (the record's times); every timer runs on boot_ms
    with RuntimeDirectory.open(worker.runtime_directory, worker.journal_directory) as runtime:
        cluster = ClusterClock(runtime, wall_ms=clock)
        journal = Journal.open(worker.journal_directory, JournalOptions.from_config(worker), runtime=runtime)
        try:
            own_transport = transport is None
            transport = transport or IngressTransport.from_config(worker)
            try:
                wire = _InterruptibleTransport(transport, abort)
                keeper = SessionKeeper(runtime, wire, worker_id=worker.worker_id,
                                       max_concurrent_runs=worker.max_concurrent_runs,
                                       lease_duration_ms=worker.session_lease_duration_ms,
                                       heartbeat_interval_ms=worker.heartbeat_interval_ms, clock_ms=boot_ms,
                                       may_register=False, cluster=cluster, wall_ms=clock)
                yield from _drain(worker, config, journal=journal, runtime=runtime, wire=wire, keeper=keeper,
                                  abort=abort, clock=clock, random=random, cluster=cluster)
            finally:
                if own_transport:
                    transport.close()
        finally:
            journal.close()


def _drain(worker: WorkerConfig, config: EdgeConfig, *, journal: Journal, runtime: RuntimeDirectory, wire: Any,
           keeper: SessionKeeper, abort: AbortSignal, clock: Callable[[], int],
           random: Callable[[], float], cluster: ClusterClock) -> Iterator[Any]:
    from qinglong_edge.worker.remote.resident import Resident

    now = cluster.cluster_now  # in flight is judged by the lease's own (the cluster's) clock
    stored = keeper.current()
    if stored is None or keeper.lease_end_ms(stored) <= boot_ms():
        why = "none is stored" if stored is None else "its lease ran out"
        yield DrainReport("no_session", unsettled(journal, now()), None, why)
        return
    deadline = boot_ms() + worker.drain_timeout_ms
    keeper.transition("draining")
    yield DrainReport("draining", unsettled(journal, now()), _session_json(keeper))
    coordinator = PullCoordinator(journal, wire, runtime=runtime, backoff_base_ms=worker.backoff_base_ms,
                                  clock_ms=clock, random=random, boot_ms=boot_ms)
    if journal.read_claim() is not None:
        record = keeper.current()
        if record is not None:
            coordinator.pull(SessionAuthority(record.worker_id, record.session_id, record.generation))
    abort.check()
    resident = Resident(config=config, worker=worker, journal=journal, runtime=runtime, wire=wire, keeper=keeper,
                        coordinator=coordinator, abort=abort, clock_ms=boot_ms, random=random, draining=True,
                        deadline_boot_ms=deadline, wall_ms=clock, cluster=cluster)
    yield from resident.run()
    left = unsettled(journal, now())
    while left and boot_ms() < deadline:
        # Nothing was resident to wait on (a record the loop does not track): look again.
        with abort.interruptible():
            time.sleep(min(0.5, max(0.0, (deadline - boot_ms()) / 1000)))
        yield from Resident(config=config, worker=worker, journal=journal, runtime=runtime, wire=wire,
                            keeper=keeper, coordinator=coordinator, abort=abort, clock_ms=boot_ms, random=random,
                            draining=True, deadline_boot_ms=deadline, wall_ms=clock, cluster=cluster).run()
        left = unsettled(journal, now())
    if left:
        seconds = worker.drain_timeout_ms / 1000
        yield DrainReport("timed_out", left, _session_json(keeper),
                          f"{seconds:g} s (worker.drainTimeoutMs) passed with {len(left)} record(s) in flight")
        return
    record = keeper.transition("offline")
    yield DrainReport("offline", (), {"sessionId": record.session_id, "generation": record.generation,
                                      "status": record.status})


def become_journal_owner(worker: WorkerConfig) -> None:
    """Run as the owner of the journal when started as root (the package's prerm and
    init script run as root; the journal and its runtime directory are the agent
    user's and refuse other owners). No-op otherwise, or when it belongs to root."""
    if os.geteuid() != 0:
        return
    for path in (worker.journal_directory, worker.runtime_directory):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_uid != 0:
            os.setgroups([])
            os.setgid(st.st_gid)
            os.setuid(st.st_uid)
        return
