"""The budget of requests without a valid credential (spec README, "Decisions for storage
on flash"; issues 16 and 17).

Every request that reaches admission costs one durable, fsync'd audit row (ADR-0372).
A local client sending requests without a credential, or with a wrong one, would turn
that rule into unbounded writes on flash and, with the request slots shared, into a
denial of service for the operator. So requests that carry no usable credential, and
those whose credential fails authentication, share:

* a **token bucket** (``burst`` tokens, refilled at ``per_minute``): one token pays for
  one ``authentication_rejected`` audit row. Global, and per source address where there
  is more than one; every loopback address is the *same* peer (:func:`peer_key`), so on
  the Local API's loopback-only listener (local-api.md 2.1) the global bucket alone
  applies;
* a **share of the request slots** (``ServerLimits.unauthenticated_slots``, enforced by
  :class:`qinglong_edge.local.server.Server`); requests with a credential are served
  from the others.

Beyond the bucket (or the share) the answer is **429** ``{"code":"rate_limited"}`` with
``Retry-After`` (whole seconds until the next token), decided before any durable write.
What was refused is counted here, in memory, per reason, and written as **one** summary
audit row per reason per interval (:func:`qinglong_edge.local.audit.record_refusal_summary`,
by ``serve``'s main loop through :meth:`qinglong_edge.local.api.LocalApi.flush_refusals`).
An interval with no refusal writes nothing.

Refusal reasons (:data:`REFUSAL_REASONS`):

``credential_missing``       no ``Authorization: Bearer ql3c_...`` credential (absent, two
                             headers, or not the token grammar): refused by the server
                             before routing, or by admission
``authentication_rejected``  a well-formed credential that failed authentication, refused
                             by admission before its audit row

Thread safety: every method takes the object's lock; none blocks or does I/O (the
server's poll thread and the store thread both call it).
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qinglong_edge.local.exchange import ServerLimits

__all__ = [
    "LOOPBACK_PEER",
    "REFUSAL_REASONS",
    "RefusalSummary",
    "RequestBudget",
    "peer_key",
]

#: The one peer every loopback client is (spec README: "on a loopback-only listener
#: every client is one peer").
LOOPBACK_PEER = "loopback"
REFUSAL_REASONS = ("credential_missing", "authentication_rejected")
#: Peers remembered for their own buckets (least recently seen forgotten first).
MAX_PEERS = 256


def peer_key(address: object) -> str:
    """The budget key of a client address (``socket.accept()``'s second value).

    Loopback addresses (``127.0.0.0/8``, ``::1``, IPv4-mapped loopback) are all
    :data:`LOOPBACK_PEER`; any other address is its own text; anything unparsable is
    ``unknown`` (one shared peer).
    """
    host = address[0] if isinstance(address, tuple) and address else address
    if not isinstance(host, str):
        return "unknown"
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return "unknown"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return LOOPBACK_PEER if ip.is_loopback else str(ip)


@dataclass(frozen=True, slots=True)
class RefusalSummary:
    """Refused requests of one reason over one interval (wall-clock epoch ms).

    Attributes:
        reason: one of :data:`REFUSAL_REASONS`.
        count: refused requests, >= 1.
        since_ms: start of the interval (the first refusal counted may be later).
        until_ms: end of the interval (when the summary was taken).
    """

    reason: str
    count: int
    since_ms: int
    until_ms: int


class _Bucket:
    __slots__ = ("capacity", "rate_per_s", "tokens", "updated")

    def __init__(self, capacity: float, rate_per_s: float, now: float) -> None:
        self.capacity = capacity
        self.rate_per_s = rate_per_s
        self.tokens = capacity
        self.updated = now

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate_per_s)
        self.updated = now

    def wait_s(self) -> float:
        """Seconds until one whole token is there (0 when it is)."""
        if self.tokens >= 1.0:
            return 0.0
        return (1.0 - self.tokens) / self.rate_per_s


class RequestBudget:
    """Token buckets and refusal counters (module docstring).

    Args:
        burst: tokens a full bucket holds (>= 1): the audit rows a quiet device pays at once.
        per_minute: refill rate in tokens per minute (> 0).
        interval_s: length of a summary interval in seconds (> 0).
        peer_burst, peer_per_minute: the per-address bucket (default half the global
            one, at least 1 token); never used for :data:`LOOPBACK_PEER`.
        clock: monotonic seconds (tests pin it).
        wall_clock: epoch ms for the summaries' interval bounds.
    """

    def __init__(
        self,
        *,
        burst: int,
        per_minute: float,
        interval_s: float = 60.0,
        peer_burst: int | None = None,
        peer_per_minute: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        if burst < 1 or per_minute <= 0 or interval_s <= 0:
            raise ValueError("burst must be >= 1, per_minute and interval_s > 0")
        self.burst = burst
        self.per_minute = per_minute
        self.interval_s = interval_s
        self._peer_burst = max(1, burst // 2) if peer_burst is None else peer_burst
        self._peer_rate = (per_minute / 2 if peer_per_minute is None else peer_per_minute) / 60.0
        self._clock = clock
        self._wall = wall_clock
        self._lock = threading.Lock()
        now = clock()
        self._global = _Bucket(float(burst), per_minute / 60.0, now)
        self._peers: OrderedDict[str, _Bucket] = OrderedDict()
        self._counts: dict[str, int] = {}
        self._since_ms = wall_clock()
        self._since = now
        self.refused_total = 0
        self.taken_total = 0

    @classmethod
    def from_limits(cls, limits: ServerLimits) -> RequestBudget:
        """The profile's budget (``unauthenticated_burst``, ``unauthenticated_per_minute``,
        ``refusal_interval_s`` of :class:`~qinglong_edge.local.exchange.ServerLimits`)."""
        return cls(burst=limits.unauthenticated_burst, per_minute=limits.unauthenticated_per_minute,
                   interval_s=limits.refusal_interval_s)

    # -- tokens ---------------------------------------------------------------------------

    def _buckets(self, peer: str, now: float, *, create: bool) -> list[_Bucket]:
        buckets = [self._global]
        if peer != LOOPBACK_PEER:
            bucket = self._peers.get(peer)
            if bucket is None and create:
                bucket = _Bucket(float(self._peer_burst), self._peer_rate, now)
                self._peers[peer] = bucket
                while len(self._peers) > MAX_PEERS:
                    self._peers.popitem(last=False)
            if bucket is not None:
                self._peers.move_to_end(peer)
                buckets.append(bucket)
        for bucket in buckets:
            bucket.refill(now)
        return buckets

    def wait_s(self, peer: str = LOOPBACK_PEER) -> float:
        """Seconds until a request of ``peer`` could take a token (0: it could now).
        Takes nothing: the server's early check before it spends a worker."""
        with self._lock:
            return max(bucket.wait_s() for bucket in self._buckets(peer, self._clock(), create=False))

    def take(self, peer: str = LOOPBACK_PEER) -> float:
        """Take one token for ``peer`` (from the global bucket and the peer's own).

        Returns:
            0.0 when taken; else the seconds until a token will be there (nothing taken).
        """
        with self._lock:
            buckets = self._buckets(peer, self._clock(), create=True)
            wait = max(bucket.wait_s() for bucket in buckets)
            if wait > 0:
                return wait
            for bucket in buckets:
                bucket.tokens -= 1.0
            self.taken_total += 1
            return 0.0

    @staticmethod
    def retry_after_s(wait_s: float) -> int:
        """The ``Retry-After`` value for a wait: whole seconds, at least 1."""
        return max(1, math.ceil(wait_s))

    # -- refusals -------------------------------------------------------------------------

    def refuse(self, reason: str) -> None:
        """Count one refused request (a reason of :data:`REFUSAL_REASONS`)."""
        if reason not in REFUSAL_REASONS:
            raise ValueError(f"unknown refusal reason {reason!r}")
        with self._lock:
            self._counts[reason] = self._counts.get(reason, 0) + 1
            self.refused_total += 1

    def pending(self) -> dict[str, int]:
        """Refusals counted and not yet taken as summaries (a copy)."""
        with self._lock:
            return dict(self._counts)

    def take_summaries(self, *, force: bool = False) -> list[RefusalSummary]:
        """The counts of the interval that ended, one summary per reason with a count;
        the counters restart. Before the interval's end (unless ``force``: shutdown)
        nothing is taken and ``[]`` is returned."""
        with self._lock:
            now = self._clock()
            if not self._counts or (not force and now - self._since < self.interval_s):
                if not self._counts and now - self._since >= self.interval_s:
                    self._since, self._since_ms = now, self._wall()
                return []
            until = max(self._wall(), self._since_ms)
            summaries = [RefusalSummary(reason, count, self._since_ms, until)
                         for reason, count in sorted(self._counts.items())]
            self._counts = {}
            self._since, self._since_ms = now, until
            return summaries

    def restore(self, summaries: list[RefusalSummary]) -> None:
        """Put back summaries that could not be written: they are merged into the
        current interval (which then starts at the oldest one's start)."""
        if not summaries:
            return
        with self._lock:
            for summary in summaries:
                self._counts[summary.reason] = self._counts.get(summary.reason, 0) + summary.count
            self._since_ms = min(self._since_ms, *(summary.since_ms for summary in summaries))
