"""When the device talks to the cluster: splay phase, retry backoff, Retry-After.

Pure functions (numbers in, numbers out; no clock, no I/O). The pull coordinator
(:mod:`qinglong_edge.worker.delivery.pull`), the session keeper
(:mod:`qinglong_edge.worker.delivery.session`), the ``pull`` command and the fleet simulation
(``benchmarks/bench_fleet.py``) all call these, so the simulation runs the agent's own
arithmetic rather than a copy of it. All times are wall-clock milliseconds.

Splay (issue 18 item 8: a fleet on one crontab must not call the cluster in the same
second). Cron (busybox crond, the systemd timer) starts ``pull`` at second 0 of every
minute. Each device has a *stable phase* inside the minute,
``sha256("qinglong-edge/splay\\0" + workerId) mod splayMaxMs``, and each cycle waits until
its phase plus a small random jitter (uniform over :data:`SPLAY_JITTER_MS`, 10 s,
centred on the phase; wrapping inside the window) of the current minute. So a device
calls about every 60 s (never two cycles a few seconds apart, except at the window's
edge) and a fleet of N devices spreads evenly over the first ``splayMaxMs`` of each
minute: peak / mean <= 60 s / splayMaxMs plus the binomial spread (see
docs/benchmarks.md, fleet). The jitter is what keeps a cluster near its capacity fair:
with a purely stable phase the devices of a crowded second would be refused (503)
every minute, forever (benchmarks/bench_fleet.py measured that). A cycle that starts
after its offset (a late cron, a manual run) does not wait for the next minute: it runs
at once.

Backoff (offer-delivery.md 3.7): full jitter,
``floor(r * min(60000, base * 2^max(0, attempt - 1)))``, never sooner than a
``Retry-After`` (spec README: "429/503 with Retry-After never retry sooner than it
says"), which is honoured up to :data:`MAX_RETRY_AFTER_MS`.
"""

from __future__ import annotations

from qinglong_edge.contracts.digest import sha256

__all__ = [
    "BACKOFF_CAP_MS",
    "LEASE_MARGIN_MS",
    "MAX_RETRY_AFTER_MS",
    "SPLAY_JITTER_MS",
    "SPLAY_PERIOD_MS",
    "backoff_delay_ms",
    "claim_due",
    "heartbeat_due_ms",
    "honoured_retry_after_ms",
    "retry_after_window",
    "retry_delay_ms",
    "session_step",
    "splay_delay_ms",
    "splay_offset_ms",
    "splay_phase_ms",
    "waiting",
]

#: Full-jitter ceiling (section 3.7): base x 2^(attempt-1), capped at 60 s.
BACKOFF_CAP_MS = 60_000
#: Longest Retry-After we honour (a broken header must not park the device for days).
MAX_RETRY_AFTER_MS = 3_600_000
#: The cron period the splay phase lives in.
SPLAY_PERIOD_MS = 60_000
#: Width of the random jitter around a device's phase (at most the splay window).
SPLAY_JITTER_MS = 10_000
#: A session lease that ends within this margin is treated as already over (our clock
#: and the cluster's differ a little; re-registering is cheaper than a refused heartbeat).
LEASE_MARGIN_MS = 2000
_SPLAY_SALT = b"qinglong-edge/splay\x00"


def splay_phase_ms(worker_id: str, splay_max_ms: int) -> int:
    """This device's stable offset in the minute: 0 <= phase < ``splay_max_ms`` (0 if that is 0)."""
    if splay_max_ms <= 0:
        return 0
    digest = sha256()
    digest.update(_SPLAY_SALT + worker_id.encode("utf-8"))
    return int.from_bytes(digest.digest()[:8], "big") % splay_max_ms


def splay_offset_ms(worker_id: str, splay_max_ms: int, r: float) -> int:
    """This cycle's offset after second 0: the phase plus ``(r - 0.5) x jitter``, wrapped
    into ``0..splay_max_ms`` (``r`` uniform in [0, 1); 0 when the splay is off)."""
    if splay_max_ms <= 0:
        return 0
    jitter = min(SPLAY_JITTER_MS, splay_max_ms)
    return (splay_phase_ms(worker_id, splay_max_ms) + int((r - 0.5) * jitter)) % splay_max_ms


def splay_delay_ms(worker_id: str, splay_max_ms: int, now_ms: int, r: float) -> int:
    """How long a cycle started at ``now_ms`` waits (see the module docstring).

    Returns ``offset - (now_ms mod 60000)`` when that is positive, else 0 (this minute's
    offset has passed: go now rather than in a minute).
    """
    return max(0, splay_offset_ms(worker_id, splay_max_ms, r) - now_ms % SPLAY_PERIOD_MS)


def backoff_delay_ms(attempt_count: int, base_ms: int, r: float) -> int:
    """Full-jitter delay of section 3.7: ``floor(r * min(60000, base * 2^max(0, n-1)))``.

    Args:
        attempt_count: the claim's attempt count after the failed attempt (>= 0; an
            attempt that did not count toward the budget still backs off as attempt 1).
        base_ms: backoff base, 100..60 000 (default 1 000).
        r: a random number in [0, 1).
    """
    exponent = max(0, attempt_count - 1)
    ceiling = BACKOFF_CAP_MS if exponent >= 16 else min(BACKOFF_CAP_MS, base_ms * (1 << exponent))
    return int(r * ceiling)


def honoured_retry_after_ms(retry_after_ms: int | None) -> int | None:
    """A received ``Retry-After`` clamped to 0..:data:`MAX_RETRY_AFTER_MS`, or None."""
    if retry_after_ms is None:
        return None
    return min(max(0, retry_after_ms), MAX_RETRY_AFTER_MS)


def retry_delay_ms(attempt_count: int, base_ms: int, r: float, retry_after_ms: int | None) -> tuple[int, int | None]:
    """``(delay, honoured Retry-After)``: the backoff, never less than the Retry-After."""
    delay = backoff_delay_ms(attempt_count, base_ms, r)
    honoured = honoured_retry_after_ms(retry_after_ms)
    return (delay if honoured is None else max(delay, honoured)), honoured


def claim_due(next_attempt_at_ms: int, now_ms: int, raw_now_ms: int) -> bool:
    """Whether a kept claim may be sent now.

    ``now_ms`` is the coordinator's clock (never behind the claim's ``updatedAtMs``),
    ``raw_now_ms`` the raw wall clock. A due date further away by the raw clock than any
    backoff or Retry-After could have put it (the clock stepped back) counts as due, so
    a clock step never wedges the device.
    """
    return not (next_attempt_at_ms > now_ms and next_attempt_at_ms - raw_now_ms <= MAX_RETRY_AFTER_MS)


def retry_after_window(now_ms: int, retry_after_ms: int | None) -> tuple[int, int] | None:
    """``(set at, not before)`` for a session call answered with ``Retry-After``, or None."""
    honoured = honoured_retry_after_ms(retry_after_ms)
    if not honoured:
        return None
    return now_ms, now_ms + honoured


def waiting(window: tuple[int, int] | None, now_ms: int) -> bool:
    """Whether ``now_ms`` is inside a Retry-After window (a clock that stepped back
    before the window's start does not trust it)."""
    return window is not None and window[0] <= now_ms < window[1]


def heartbeat_due_ms(lease_expires_at_ms: int, heartbeat_at_ms: int, heartbeat_interval_ms: int) -> int:
    """When the next heartbeat is due: ``heartbeat_interval_ms`` after the last one, or
    halfway to the (margin-reduced) session lease when the cluster granted less than
    asked, so a resident ``pull`` never lets a session it relies on run out."""
    usable = max(0, lease_expires_at_ms - LEASE_MARGIN_MS - heartbeat_at_ms)
    return heartbeat_at_ms + min(heartbeat_interval_ms, usable // 2)


def session_step(
    lease_expires_at_ms: int | None,
    heartbeat_at_ms: int | None,
    now_ms: int,
    heartbeat_interval_ms: int,
    window: tuple[int, int] | None,
) -> str:
    """What the session keeper does this cycle (offer-delivery.md 5.1 and the spec README).

    Args:
        lease_expires_at_ms, heartbeat_at_ms: the stored session's, or None without one.
        window: the Retry-After window of the last session call, or None.

    Returns:
        ``current`` (the session is fresh: no call), ``heartbeat``, ``wait_stale`` (a
        heartbeat is due but Retry-After forbids it; the stored lease still runs),
        ``register``, or ``wait_unavailable`` (no usable session and Retry-After
        forbids registering).
    """
    running = lease_expires_at_ms is not None and lease_expires_at_ms - LEASE_MARGIN_MS > now_ms
    if running and heartbeat_at_ms is not None and lease_expires_at_ms is not None:
        if heartbeat_at_ms <= now_ms < heartbeat_due_ms(lease_expires_at_ms, heartbeat_at_ms, heartbeat_interval_ms):
            return "current"
        return "wait_stale" if waiting(window, now_ms) else "heartbeat"
    return "wait_unavailable" if waiting(window, now_ms) else "register"
