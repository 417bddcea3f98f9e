"""The cluster's clock seen from the device: offset samples, the local lease expiry, the
wire timestamps the cluster checks, and the stop a lease needs. Pure: numbers in, numbers
out; nothing here reads a clock or a file.

Spec README "Decisions for clocks" (they replace G9's "refuse work at > 60 s skew" and the
first sentence of G10's advice, remote-execution.md section 7):

* **Two clocks.** ``boot`` is ``CLOCK_BOOTTIME`` ms (:func:`qinglong_edge.clock.boot_ms`):
  every local timer. ``wall`` is the wall clock (wire and display only). ``cluster`` is the
  cluster's DB clock, the one of every ``*AtMs`` the cluster sends.
* **An offset sample** (:class:`ClockSample`) is one answer that carried a *fresh* cluster
  time ``c`` (heartbeat and new-register ``leaseExpiresAtMs - leaseDurationMs``,
  lease-control ``renewedAtMs``; never an offer's lease times, an ``already_*`` snapshot
  or a register replay: they carry stored times), sent at boot instant ``s`` and received
  at ``r``: ``offset = c - (s + r) / 2`` (cluster minus boot), ``error = (r - s) / 2`` (the
  cluster stamped ``c`` somewhere between ``s`` and ``r``). It is kept per boot (a boot
  offset means nothing after a reboot).
* **Which sample is kept** (:func:`better_sample`): the one with the lower *effective*
  error, ``error + age x DRIFT_PPM / 10^6`` (two free-running crystals drift apart; the
  boot clock is never stepped, so that drift is all that ages a sample), except that a new
  sample that disagrees with the kept one by more than both effective errors replaces it:
  the cluster's clock moved (a cluster whose time jumps must not be trusted at its old
  reading for ever).
* **Local lease expiry** (:func:`local_lease_expiry_ms`, boot ms) = the earlier of
  ``send instant + (expiresAtMs - renewedAtMs)`` and ``expiresAtMs`` translated by the
  offset minus its effective error. Renewal is due one third of the granted duration after
  the send (:func:`renewal_due_ms`), never sooner than a sixth of it after that send (so no
  estimate, however wrong, makes a renewal storm).
* **Wire timestamps** (:func:`result_times`): ``result.startedAtMs`` and ``finishedAtMs``
  in the cluster's clock, ``startedAtMs >= attemptCreatedAtMs``, ``finishedAtMs >=
  startedAtMs``, both ``<=`` the cluster's now + :data:`MAX_AHEAD_MS` (the cluster refuses
  times more than 5 minutes ahead of it).
* **The lease stop** (:func:`lease_stop_plan`): a job whose lease is not renewed is
  stopped (TERM, grace, KILL) early enough to be gone by the local expiry; the graces are
  cut so that the stop starts no earlier than half the grant after the send (the renewal
  at a third always comes first while the agent lives).

All times are integer ms. Errors: ``ContractError`` ``not_integer`` / ``out_of_range``.
"""

from __future__ import annotations

from qinglong_edge.contracts._shape import Frozen, int_value

__all__ = [
    "DRIFT_PPM",
    "LEASE_STOP_MARGIN_MS",
    "MAX_AHEAD_MS",
    "MIN_RENEWAL_FRACTION",
    "SKEW_NOTICE_MS",
    "ClockSample",
    "better_sample",
    "lease_stop_plan",
    "local_lease_expiry_ms",
    "renewal_due_ms",
    "result_times",
    "sample_from",
]

#: How far a kept sample is trusted to drift: 100 ppm (10 s a day), a cheap crystal.
DRIFT_PPM = 100
#: The cluster refuses worker timestamps more than this ahead of its clock (remote-execution.md 5).
MAX_AHEAD_MS = 300_000
#: A skew (cluster minus wall) beyond this is reported once per boot; work goes on.
SKEW_NOTICE_MS = 60_000
#: A renewal is never due sooner than this fraction of the grant after its send (1/6).
MIN_RENEWAL_FRACTION = 6
#: The lease stop ends this long before the local expiry (the last SIGKILL's own latency).
LEASE_STOP_MARGIN_MS = 500


class ClockSample(Frozen):
    """One offset sample (module docstring).

    Attributes:
        offset_ms: cluster time minus boot time (ms).
        error_ms: half the round trip (ms, >= 0).
        at_boot_ms: the boot instant the sample was taken (its receive time).
    """

    __slots__ = ("offset_ms", "error_ms", "at_boot_ms")  # noqa: RUF023 (field order)

    offset_ms: int
    error_ms: int
    at_boot_ms: int

    def __init__(self, offset_ms: int, error_ms: int, at_boot_ms: int) -> None:
        _set = object.__setattr__
        _set(self, "offset_ms", int_value(offset_ms, "$.offsetMs", -(2**62), 2**62))
        _set(self, "error_ms", int_value(error_ms, "$.errorMs"))
        _set(self, "at_boot_ms", int_value(at_boot_ms, "$.atBootMs", -(2**62), 2**62))

    def effective_error_ms(self, now_boot_ms: int) -> int:
        """``error + age x DRIFT_PPM / 10^6`` (rounded up) at ``now_boot_ms``."""
        age = max(0, now_boot_ms - self.at_boot_ms)
        return self.error_ms + -(-age * DRIFT_PPM // 1_000_000)

    def to_cluster(self, boot_ms: int) -> int:
        """The cluster time of boot instant ``boot_ms``."""
        return boot_ms + self.offset_ms

    def to_boot(self, cluster_ms: int) -> int:
        """The boot instant of cluster time ``cluster_ms``."""
        return cluster_ms - self.offset_ms

    def skew_ms(self, boot_now_ms: int, wall_now_ms: int) -> int:
        """Cluster minus wall clock now (positive: the device's wall clock is behind)."""
        return self.to_cluster(boot_now_ms) - wall_now_ms


def sample_from(cluster_ms: int, sent_boot_ms: int, received_boot_ms: int) -> ClockSample:
    """The sample of an answer carrying the fresh cluster time ``cluster_ms``, sent and
    received at those boot instants (a receive before the send counts as a zero trip)."""
    cluster = int_value(cluster_ms, "$.clusterMs")
    sent = int_value(sent_boot_ms, "$.sentBootMs")
    received = max(sent, int_value(received_boot_ms, "$.receivedBootMs"))
    trip = received - sent
    return ClockSample(cluster - (sent + trip // 2), -(-trip // 2), received)


def better_sample(kept: ClockSample | None, new: ClockSample) -> ClockSample:
    """The sample to keep after ``new`` (module docstring): the lower effective error,
    unless the two disagree by more than both effective errors (then ``new``)."""
    if kept is None:
        return new
    now = max(kept.at_boot_ms, new.at_boot_ms)
    kept_error, new_error = kept.effective_error_ms(now), new.effective_error_ms(now)
    if abs(new.offset_ms - kept.offset_ms) > kept_error + new_error:
        return new
    return new if new_error <= kept_error else kept


def local_lease_expiry_ms(sent_boot_ms: int, renewed_at_ms: int, expires_at_ms: int,
                          sample: ClockSample | None, now_boot_ms: int | None = None) -> int:
    """The local lease expiry on the boot clock (module docstring).

    Args:
        sent_boot_ms: the boot instant the request that granted this lease was sent.
        renewed_at_ms / expires_at_ms: the grant's times (cluster clock).
        sample: the kept offset sample, or None (then only the send term counts).
        now_boot_ms: when the sample's effective error is judged (default: its own time).
    """
    sent = int_value(sent_boot_ms, "$.sentBootMs", -(2**62), 2**62)
    renewed = int_value(renewed_at_ms, "$.renewedAtMs")
    expires = int_value(expires_at_ms, "$.expiresAtMs")
    by_send = sent + max(0, expires - renewed)
    if sample is None:
        return by_send
    at = sample.at_boot_ms if now_boot_ms is None else now_boot_ms
    return min(by_send, sample.to_boot(expires) - sample.effective_error_ms(at))


def renewal_due_ms(sent_boot_ms: int, duration_ms: int, expiry_boot_ms: int) -> int:
    """When to renew (boot ms): a third of the grant after the send, earlier when the
    local expiry leaves less than two thirds after that, never sooner than a sixth of
    the grant after the send (bounded: at most six renewals per grant, never a storm)."""
    duration = max(0, int_value(duration_ms, "$.durationMs"))
    due = min(sent_boot_ms + duration // 3, expiry_boot_ms - (duration - duration // 3))
    return max(sent_boot_ms + duration // MIN_RENEWAL_FRACTION, due)


def result_times(started_ms: int, finished_ms: int, *, attempt_created_at_ms: int,
                 cluster_now_ms: int) -> tuple[int, int]:
    """``(startedAtMs, finishedAtMs)`` for the wire, already in the cluster's clock, with
    the clamps of the module docstring. When the cluster's own clock went back more than
    5 minutes before the attempt's creation no value can pass both of its checks; then
    ``startedAtMs >= attemptCreatedAtMs`` wins (the cluster refuses it, the lease runs
    out and the Run is retried, never a start time the cluster did not give)."""
    created = int_value(attempt_created_at_ms, "$.attemptCreatedAtMs")
    ceiling = int_value(cluster_now_ms, "$.clusterNowMs") + MAX_AHEAD_MS
    started = max(created, min(int_value(started_ms, "$.startedAtMs", -(2**62), 2**62), ceiling))
    finished = max(started, min(int_value(finished_ms, "$.finishedAtMs", -(2**62), 2**62), ceiling))
    return started, finished


def lease_stop_plan(duration_ms: int, terminate_grace_ms: int, kill_grace_ms: int) -> tuple[int, int, int]:
    """``(lead, terminate grace, kill grace)`` of the stop of a job whose lease runs out:
    the stop starts ``lead`` ms before the local expiry, TERM first, SIGKILL after the
    terminate grace, and is over after the kill grace plus :data:`LEASE_STOP_MARGIN_MS`.
    The configured graces are cut so that ``lead <= duration / 2``."""
    duration = max(0, int_value(duration_ms, "$.durationMs"))
    budget = max(0, duration // 2 - LEASE_STOP_MARGIN_MS)
    kill = min(max(0, kill_grace_ms), budget // 4)
    term = min(max(0, terminate_grace_ms), budget - kill)
    return term + kill + LEASE_STOP_MARGIN_MS, term, kill
