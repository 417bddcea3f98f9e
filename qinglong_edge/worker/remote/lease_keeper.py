"""The lease of each record in flight: its local clock, its lease file, and lease-control
with the G2 rule (spec README "Lease clocks", "Decisions for clocks", "Later calls' errors").

One :class:`LeaseKeeper` per :class:`~qinglong_edge.worker.remote.runner.Runner` (one of its
parts, beside :class:`~qinglong_edge.worker.remote.ending.Ending`); it keeps the lease facts
of a :class:`~qinglong_edge.worker.remote.runner_state.Track` (``sent_at_ms``, ``duration_ms``,
``expiry_ms``, ``renew_now``, ``renewing``, ``lease_dirty``) and moves its phase only when
lease-control says the lease is lost or the run terminal.

Clocks: every timer here is on the boot clock (``clock_ms``, ``CLOCK_BOOTTIME``); the
cluster's clock (:class:`~qinglong_edge.worker.delivery.cluster_clock.ClusterClock`)
translates its lease times. A renewal is kept in memory and in the record's lease file in
the runtime directory (RAM), never written to the journal by itself (issue 23 item 7): the
journal takes the current lease with the next state change, and once more when the job's
exit is observed (:meth:`~qinglong_edge.worker.remote.ending.Ending.freeze_result`).
"""

from __future__ import annotations

from collections.abc import Callable

from qinglong_edge.contracts.clocks import lease_stop_plan, local_lease_expiry_ms, renewal_due_ms
from qinglong_edge.contracts.inbox import renewed_lease, with_lease
from qinglong_edge.contracts.residency import LAUNCHED_STATES
from qinglong_edge.crashpoints import crashpoint
from qinglong_edge.errors import JournalError, RemoteCallError
from qinglong_edge.worker.delivery.cluster_clock import ClusterClock
from qinglong_edge.worker.remote.calls import ExecutionCalls
from qinglong_edge.worker.remote.job_files import RemoteLimits
from qinglong_edge.worker.remote.lease import (
    JobLease,
    lease_name,
    read_job_lease,
    stopped_by_wrapper,
    stopped_name,
    write_job_lease,
)
from qinglong_edge.worker.remote.runner_state import Track, Transitions

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from qinglong_edge.contracts.records import OfferLease
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

__all__ = ["LeaseKeeper"]


class LeaseKeeper:
    """The leases of one runner's tracks (module docstring).

    Args:
        calls: the seven calls (lease-control here).
        limits: the remote jobs' limits (the lease stop's graces).
        transitions: the events (``renewed``, ``stop_requested``, ``storage_failed``).
        clock_ms: the boot clock (ms).
        cluster: the cluster's clock.
        runtime: the runtime directory for the lease files (None: none are kept, and jobs
            run without the wrapper's lease stop; tests of the runner alone).
    """

    def __init__(self, calls: ExecutionCalls, limits: RemoteLimits, transitions: Transitions, *,
                 clock_ms: Callable[[], int], cluster: ClusterClock, runtime: RuntimeDirectory | None) -> None:
        self.calls = calls
        self.limits = limits
        self.transitions = transitions
        self.clock_ms = clock_ms
        self.cluster = cluster
        self.runtime = runtime

    @staticmethod
    def lease(t: Track) -> OfferLease:
        """The record's current lease (the offer's ``lease`` object)."""
        lease: OfferLease = t.record["offer"]["lease"]
        return lease

    # -- the lease's local clock (spec README "Decisions for clocks") -------------------------

    def expiry_ms(self, t: Track) -> int:
        """The local lease expiry (boot ms). Unknown (a record found without its lease file
        or a send instant): ``expiresAtMs`` translated by the cluster's clock minus its
        error; without any clock sample, a third of the grant from now (the lease is then
        renewed at once, which gives it a send instant)."""
        if t.expiry_ms is None:
            lease, now = self.lease(t), self.clock_ms()
            local, error = self.cluster.cluster_to_boot(lease["expiresAtMs"]), self.cluster.error_ms(now)
            t.expiry_ms = local - error if local is not None and error is not None else now + t.duration_ms // 3
        return t.expiry_ms

    def _granted(self, t: Track, sent: int, renewed_at_ms: int, expires_at_ms: int) -> None:
        """A grant sent at boot instant ``sent``: its local expiry (the earlier of the send
        term and the translated term)."""
        t.sent_at_ms = sent
        t.duration_ms = max(0, expires_at_ms - renewed_at_ms)
        t.expiry_ms = local_lease_expiry_ms(sent, renewed_at_ms, expires_at_ms, self.cluster.sample,
                                            self.clock_ms())

    def stop_plan(self, t: Track) -> tuple[int, int, int]:
        """``(lead, terminate grace, kill grace)`` ms of the lease stop
        (:func:`~qinglong_edge.contracts.clocks.lease_stop_plan`)."""
        return lease_stop_plan(t.duration_ms, self.limits.terminate_grace_ms, self.limits.kill_grace_ms)

    def stop_at_ms(self, t: Track) -> int:
        """When a job whose lease was not renewed must start being stopped (boot ms), so that
        it is gone by the local expiry; before the launch, the expiry itself."""
        if t.state in LAUNCHED_STATES:
            return self.expiry_ms(t) - self.stop_plan(t)[0]
        return self.expiry_ms(t)

    def renewal_due(self, t: Track) -> int:
        """When lease-control is due (boot ms): at a third of the grant from its send
        instant; at once without one (``renew_now``: learned from an offer, or found), or
        at the retry time after a failure; the local expiry once it is left to run out."""
        if not t.renewing:
            return self.expiry_ms(t)
        if t.renew_now or t.sent_at_ms is None:
            return t.due_ms if t.failures else self.clock_ms()  # learned from an offer or found: renew at once
        return renewal_due_ms(t.sent_at_ms, t.duration_ms, self.expiry_ms(t))

    # -- the lease file (worker/remote/lease.py) --------------------------------------------------

    def restore(self, t: Track, sent_boot_ms: int | None = None) -> None:
        """Start tracking ``t``: its lease file of this boot (a newer lease than the
        journal's, its boot-clock times), else the offer POST's send instant when this
        process accepted it (``sent_boot_ms``); a lease learned from an offer answer or
        found without a file is renewed at once. Then the lease file is written."""
        if self.runtime is not None:
            found = read_job_lease(self.runtime, t.record, self.cluster.boot_id)
            lease = self.lease(t)
            if found is not None and found.lease_version >= lease["version"]:
                if found.lease_version > lease["version"]:
                    with_file = renewed_lease(lease, lease_version=found.lease_version,
                                              renewed_at_ms=found.renewed_at_ms, expires_at_ms=found.expires_at_ms)
                    t.record = with_lease(t.record, with_file)
                t.sent_at_ms, t.duration_ms, t.expiry_ms = found.sent_boot_ms, found.duration_ms, found.expires_boot_ms
                t.starting_at_ms, t.started_boot_ms = found.starting_boot_ms, found.started_boot_ms
                t.renew_now = found.sent_boot_ms is None
                return
        lease = self.lease(t)
        if sent_boot_ms is not None:
            self._granted(t, sent_boot_ms, lease["renewedAtMs"], lease["expiresAtMs"])
        t.renew_now = True
        self.store(t)

    def store(self, t: Track, *, required: bool = False) -> bool:
        """Write the record's lease file (RAM). A failure keeps the lease in memory, marks
        it to be written again at the next step and returns False; ``required`` (the
        launch: the wrapper needs it) raises the JournalError instead."""
        if self.runtime is None:
            return True
        plan, lease = self.stop_plan(t), self.lease(t)
        offer = t.record["offer"]
        expiry = self.expiry_ms(t)
        try:
            write_job_lease(self.runtime, JobLease(
                offer_id=offer["offerId"], attempt_id=offer["candidate"]["attemptId"],
                lease_generation=lease["leaseGeneration"], lease_version=lease["version"],
                renewed_at_ms=lease["renewedAtMs"], expires_at_ms=lease["expiresAtMs"],
                boot_id=self.cluster.boot_id, sent_boot_ms=t.sent_at_ms, duration_ms=t.duration_ms,
                expires_boot_ms=max(0, expiry), stop_at_boot_ms=max(0, expiry - plan[0]),
                terminate_grace_ms=plan[1], kill_grace_ms=plan[2], starting_boot_ms=t.starting_at_ms,
                started_boot_ms=t.started_boot_ms))
        except JournalError as exc:
            if required:
                raise
            if not t.lease_dirty:
                self.transitions.event(t, "storage_failed", code=exc.code, what="lease file")
            t.lease_dirty = True
            return False
        t.lease_dirty = False
        return True

    def paths(self, t: Track) -> tuple[str, str] | None:
        """``(lease file, wrapper's mark)`` paths the job's wrapper watches, or None
        without a runtime directory."""
        if self.runtime is None:
            return None
        offer_id = t.offer_id
        return f"{self.runtime.path}/{lease_name(offer_id)}", f"{self.runtime.path}/{stopped_name(offer_id)}"

    def stopped_by_wrapper(self, t: Track) -> bool:
        """Whether the job's wrapper stopped it for its lease (its mark exists)."""
        return self.runtime is not None and stopped_by_wrapper(self.runtime, t.offer_id)

    # -- lease-control (T11, G2) -------------------------------------------------------------

    def renew(self, t: Track) -> str:
        """One lease-control (with the G2 retry): ``ok``, ``stop``, ``terminal`` or ``lost``.

        A renewal is a clock sample (``renewedAtMs``), gives the lease a new local expiry
        from its send instant, and is kept in memory and in the lease file (RAM), not in
        the journal; a newer version is taken even with an older ``renewedAtMs``. ``lost``
        moves the track to phase ``lease_lost``, ``terminal`` to ``cluster_terminal``
        (:meth:`~qinglong_edge.worker.remote.runner_state.Track.run_terminal`), each with
        its stop reason unless one is set.

        Raises:
            RemoteCallError: no usable answer (the record is unchanged).
        """
        offer = t.record["offer"]
        sent = self.clock_ms()
        expected = None
        try:
            result = self.calls.lease_control(offer)
        except RemoteCallError as exc:
            if exc.code != "call_fenced":
                raise
            expected = offer["lease"]["version"] + 1  # a renewal whose answer was lost (G2)
            sent = self.clock_ms()
            try:
                result = self.calls.lease_control(offer, expected_lease_version=expected)
            except RemoteCallError as again:
                if again.code != "call_fenced":
                    raise
                t.lose_lease()
                t.stop_reason = t.stop_reason or "lease_lost"
                return "lost"
        received = self.clock_ms()
        crashpoint("runner.renewal_answered")
        if result.status == "terminal":
            t.run_terminal()
            return "terminal"
        version, renewed_at, expires = result.lease_version, result.renewed_at_ms, result.expires_at_ms
        assert version is not None and renewed_at is not None and expires is not None  # a renewing answer
        self.cluster.observe(renewed_at, sent, received, "lease_control")
        t.record = with_lease(t.record, renewed_lease(self.lease(t), lease_version=version,
                                                      renewed_at_ms=renewed_at, expires_at_ms=expires))
        self._granted(t, sent, renewed_at, expires)
        t.renew_now = False
        self.store(t)
        crashpoint("runner.renewed")
        self.transitions.event(t, "renewed", leaseVersion=version, expiresAtMs=expires,
                               **({"resynced": True} if expected is not None else {}))
        if result.status == "stop_requested":
            if t.stop_reason is None or t.stop_reason == "timeout":
                if t.stop_reason is None:
                    self.transitions.event(t, "stop_requested", reason=result.stop_reason)
                t.stop_reason = result.stop_reason
            return "stop"
        return "ok"
