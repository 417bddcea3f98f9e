"""PullCoordinator at unit level: the real journal on disk, the double's sans-IO cluster
state behind a direct (no TLS) ingress adapter, a pinned clock and a seeded random source.

The end-to-end behaviour over TLS with the real CLI is in tests/cli/test_pull_cli.py; here
the subject is the arithmetic and the branch table of ADR-0110 section 3.7 plus the spec
README decisions (abandon, Retry-After, inbox full, clock guards, abort, the budget that
counts only attempts that may have reached the cluster, 409 by code, the claim kept
across idle answers with its attempt-in-flight marker in a real runtime directory).
"""

from __future__ import annotations

import json
import os
import pathlib
import random
from collections.abc import Iterator
from typing import Any

import pytest

from qinglong_edge.contracts.journal_records import PendingClaim, parse_abandoned_record
from qinglong_edge.contracts.offer import ClaimAuthority
from qinglong_edge.errors import DeliveryError, TransportError
from qinglong_edge.worker.delivery.pull import (
    BACKOFF_CAP_MS,
    AbortSignal,
    PullAborted,
    PullCoordinator,
    SessionAuthority,
    backoff_delay_ms,
)
from qinglong_edge.worker.journal.runtime import RuntimeDirectory
from qinglong_edge.worker.journal.store import Journal, JournalOptions
from tests.support.cluster_state import ClusterState
from tests.support.cluster_tasks import build_task
from tests.support.direct_ingress import DirectIngress, Response
from tests.support.manual_clock import T0_MS, ManualClock

WORKER = "edge-1"
T0 = T0_MS  # where the clock fixture starts


@pytest.fixture
def state(clock: ManualClock) -> ClusterState:
    return ClusterState(os.urandom(32), clock_ms=clock)


@pytest.fixture
def ingress(state: ClusterState) -> DirectIngress:
    return DirectIngress(state, WORKER)


@pytest.fixture
def root(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "worker"


@pytest.fixture
def runtime(tmp_path: pathlib.Path, root: pathlib.Path) -> Iterator[RuntimeDirectory]:
    (tmp_path / "run").mkdir(mode=0o700)
    opened = RuntimeDirectory.open(str(tmp_path / "run"), str(root))
    yield opened
    opened.close()


@pytest.fixture
def journal(root: pathlib.Path, runtime: RuntimeDirectory) -> Iterator[Journal]:
    opened = Journal.open(str(root), JournalOptions(maximum_entries=2), runtime=runtime)
    yield opened
    opened.close()


def _register(ingress: DirectIngress, session_id: str = "018f0000-0000-7000-8000-000000000001") -> SessionAuthority:
    from qinglong_edge.contracts.session import capabilities_snapshot, register_request_body
    from qinglong_edge.worker.delivery.session import local_capabilities

    text, digest = capabilities_snapshot(local_capabilities("x86_64"))
    body = register_request_body(capabilities_json=text, capabilities_hash=digest, max_concurrent_runs=4,
                                 available_slots=4, lease_duration_ms=180_000)
    answer = json.loads(ingress.post_json(f"/api/v3/worker-ingress/workers/{WORKER}/sessions/{session_id}/register",
                                          body, max_response_bytes=4096).body)
    return SessionAuthority(WORKER, session_id, answer["generation"])


def _coordinator(journal: Journal, ingress: DirectIngress, clock: ManualClock, *, seed: int = 7,
                 base: int = 1000) -> tuple[PullCoordinator, random.Random]:
    draws = random.Random(seed)
    twin = random.Random(seed)  # the same sequence, for the expected values
    assert journal.runtime is not None
    # one fake clock for the wall and the boot clock: the backoff's boot-clock note follows it
    return PullCoordinator(journal, ingress, runtime=journal.runtime, backoff_base_ms=base, clock_ms=clock,
                           random=draws.random, boot_ms=clock), twin


def _unreached(message: str = "connect: Connection refused") -> TransportError:
    """A failure before the request could reach the cluster's HTTP layer (DNS, connect,
    handshake): what the transport marks ``reached_cluster = False``."""
    return TransportError(message, code="request_rejected", reason="connection_refused", reached_cluster=False)


def _marker(journal: Journal) -> dict[str, Any] | None:
    assert journal.runtime is not None
    data = journal.runtime.read("attempt.json")
    return None if data is None else json.loads(data)


def _claim(root: pathlib.Path) -> dict[str, Any] | None:
    path = root / "pending-claim.json"
    return json.loads(path.read_bytes()) if path.exists() else None


# -- the formula ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("attempt", "ceiling"), [
    (1, 1000), (2, 2000), (3, 4000), (4, 8000), (5, 16000), (6, 32000), (7, 60000), (16, 60000),
])
def test_backoff_ceiling_table_of_section_3_7(attempt: int, ceiling: int) -> None:
    assert backoff_delay_ms(attempt, 1000, 0.999999999) == ceiling - 1
    assert backoff_delay_ms(attempt, 1000, 0.0) == 0
    assert backoff_delay_ms(attempt, 1000, 0.5) == ceiling // 2


def test_backoff_never_exceeds_the_cap_for_huge_attempt_counts() -> None:
    assert backoff_delay_ms(10_000, 60_000, 0.999) == int(0.999 * BACKOFF_CAP_MS)


def test_golden_backoff_example_of_section_4_1(journal: Journal, ingress: DirectIngress, clock: ManualClock,
                                               root: pathlib.Path) -> None:
    """Claim at t, transport error with r = 0.5, base 1000 -> nextAttemptAtMs t + 500;
    at t + 400 backoff (no I/O); at t + 500 the same offerId and token are sent again."""
    session = _register(ingress)
    ingress.state.add_candidate(build_task("shell", now_ms=clock.now))
    assert journal.runtime is not None
    coordinator = PullCoordinator(journal, ingress, runtime=journal.runtime, clock_ms=clock, random=lambda: 0.5,
                                  boot_ms=clock)
    ingress.script.append(TransportError("boom", code="request_rejected"))
    result = coordinator.pull(session)
    assert (result.status, result.next_attempt_at_ms, result.attempt_count) == ("unavailable", T0 + 500, 1)
    claim = _claim(root)
    # created (revision 0), then the failed attempt and its backoff (revision 1): the
    # attempt itself was marked in RAM, not written to the claim before sending
    assert claim is not None and claim["revision"] == 1 and claim["lastAttemptAtMs"] == T0
    assert _marker(journal) is None
    clock.now = T0 + 400
    before = len(ingress.calls)
    assert coordinator.pull(session).status == "backoff"
    assert len(ingress.calls) == before  # no network I/O before it is due
    clock.now = T0 + 500
    assert coordinator.pull(session).status == "accepted"
    first, second = ingress.offer_calls()
    assert first == second  # byte-identical body: same offerId and token


def test_seeded_backoff_follows_the_formula_for_all_16_attempts_then_abandons(
    journal: Journal, ingress: DirectIngress, clock: ManualClock, root: pathlib.Path
) -> None:
    session = _register(ingress)
    coordinator, twin = _coordinator(journal, ingress, clock, base=100)
    bodies = set()
    for attempt in range(1, 17):
        ingress.script.append(TransportError("down", code="request_rejected"))
        result = coordinator.pull(session)
        expected = clock.now + int(twin.random() * min(60_000, 100 * 2 ** (attempt - 1)))
        assert (result.status, result.attempt_count, result.next_attempt_at_ms) == ("unavailable", attempt, expected)
        claim = _claim(root)
        assert claim is not None and claim["nextAttemptAtMs"] == expected and claim["attemptCount"] == attempt
        bodies.add(ingress.offer_calls()[-1])
        clock.now = expected
    assert len(bodies) == 1
    result = coordinator.pull(session)
    assert (result.status, result.reason) == ("abandoned", "attempt_budget_exhausted")
    assert _claim(root) is None
    record = parse_abandoned_record((root / "abandoned" / f"{result.offer_id}.json").read_bytes())
    assert (record.reason, record.attempt_count) == ("attempt_budget_exhausted", 16)
    ingress.state.add_candidate(build_task("python", now_ms=clock.now))
    again = coordinator.pull(session)  # nothing wedges: a new claim, new offerId
    assert again.status == "accepted" and again.offer_id != result.offer_id


@pytest.mark.parametrize("seed", range(8))
def test_retry_after_is_never_undercut(journal: Journal, ingress: DirectIngress, clock: ManualClock, seed: int) -> None:
    session = _register(ingress)
    coordinator, _ = _coordinator(journal, ingress, clock, seed=seed)
    ingress.script.append(TransportError("limited", code="response_rejected", http_status=429,
                                         retry_after_ms=30_000))
    result = coordinator.pull(session)
    assert result.status == "unavailable" and result.http_status == 429
    assert result.retry_after_ms == 30_000
    assert result.next_attempt_at_ms is not None and result.next_attempt_at_ms >= clock.now + 30_000
    clock.now += 29_999
    assert coordinator.pull(session).status == "backoff"


def test_absurd_retry_after_is_capped_at_one_hour(journal: Journal, ingress: DirectIngress, clock: ManualClock) -> None:
    session = _register(ingress)
    coordinator, _ = _coordinator(journal, ingress, clock)
    ingress.script.append(TransportError("x", code="response_rejected", http_status=503,
                                         retry_after_ms=10**12))
    assert coordinator.pull(session).next_attempt_at_ms == clock.now + 3_600_000


# -- the branch table ------------------------------------------------------------------------------------

def test_response_lost_after_commit_is_recovered_with_the_same_body(
    journal: Journal, ingress: DirectIngress, clock: ManualClock, root: pathlib.Path
) -> None:
    session = _register(ingress)
    ingress.state.add_candidate(build_task("shell", now_ms=clock.now))
    coordinator, _ = _coordinator(journal, ingress, clock)
    ingress.script.append("commit_then_lose")
    lost = coordinator.pull(session)
    assert lost.status == "unavailable"
    assert len(ingress.state.leases) == 1  # the cluster committed
    clock.now = lost.next_attempt_at_ms or clock.now
    result = coordinator.pull(session)
    assert (result.status, result.reason) == ("accepted", "lease_recovery")
    assert len(set(ingress.offer_calls())) == 1
    assert os.listdir(root / "offers") == [f"{result.offer_id}.json"]
    assert _claim(root) is None


def test_idle_keeps_the_claim_unwritten_uncounted_and_sends_it_again(
    journal: Journal, ingress: DirectIngress, clock: ManualClock, root: pathlib.Path
) -> None:
    session = _register(ingress)
    coordinator, _ = _coordinator(journal, ingress, clock)
    first = coordinator.pull(session)
    assert (first.status, first.reason, first.attempt_count) == ("idle", "no_candidates", 0)
    kept = (root / "pending-claim.json").read_bytes()
    assert json.loads(kept)["offerId"] == first.offer_id and _marker(journal) is None
    for _ in range(20):  # an idle answer proves no work: it never counts toward the 16
        clock.now += 5_000
        again = coordinator.pull(session)
        assert (again.status, again.offer_id, again.attempt_count) == ("idle", first.offer_id, 0)
    assert (root / "pending-claim.json").read_bytes() == kept
    assert len(set(ingress.offer_calls())) == 1  # the very same body every time
    assert ingress.state.leases == {}  # nothing stored on the cluster for it
    ingress.state.add_candidate(build_task("shell", now_ms=clock.now))
    accepted = coordinator.pull(session)
    assert (accepted.status, accepted.offer_id) == ("accepted", first.offer_id)
    assert _claim(root) is None


def test_stale_session_claim_is_abandoned_then_a_new_claim_is_made(
    journal: Journal, ingress: DirectIngress, clock: ManualClock, root: pathlib.Path
) -> None:
    old = _register(ingress)
    coordinator, _ = _coordinator(journal, ingress, clock)
    ingress.script.append(TransportError("down", code="request_rejected"))
    kept = coordinator.pull(old)
    new = _register(ingress, "018f0000-0000-7000-8000-000000000002")
    assert new.generation == old.generation + 1
    result = coordinator.pull(new)
    assert (result.status, result.reason, result.offer_id) == ("abandoned", "stale_session", kept.offer_id)
    assert parse_abandoned_record((root / "abandoned" / f"{kept.offer_id}.json").read_bytes()).reason == \
        "stale_session"
    ingress.state.add_candidate(build_task("shell", now_ms=clock.now))
    assert coordinator.pull(new).status == "accepted"


def test_stale_claim_never_counted_is_replaced_in_the_same_cycle(
    journal: Journal, ingress: DirectIngress, clock: ManualClock, root: pathlib.Path
) -> None:
    """A claim whose attempts were all answered idle (or never reached the cluster) has
    no lease anywhere: after a re-registration (every reboot) it is simply replaced,
    with no abandoned record and no failed cycle."""
    old = _register(ingress)
    coordinator, _ = _coordinator(journal, ingress, clock)
    kept = coordinator.pull(old)
    assert kept.status == "idle"
    new = _register(ingress, "018f0000-0000-7000-8000-000000000002")
    ingress.state.add_candidate(build_task("shell", now_ms=clock.now))
    result = coordinator.pull(new)
    assert result.status == "accepted" and result.offer_id != kept.offer_id
    assert os.listdir(root / "abandoned") == []


def test_409_other_than_the_fence_keeps_the_claim_and_reports_the_code(
    journal: Journal, ingress: DirectIngress, clock: ManualClock, root: pathlib.Path
) -> None:
    """Spec README: only 409 worker_offer_fenced abandons; any other 409 keeps the claim,
    backs off (counted: it reached the cluster) and is reported."""
    session = _register(ingress)
    ingress.state.add_candidate(build_task("shell", now_ms=clock.now))
    coordinator, _ = _coordinator(journal, ingress, clock)
    ingress.script.append(TransportError("HTTP 409", code="response_rejected", http_status=409,
                                         cluster_code="claim_in_progress"))
    result = coordinator.pull(session)
    assert (result.status, result.http_status, result.cluster_code, result.attempt_count) == (
        "unavailable", 409, "claim_in_progress", 1)
    assert result.to_json()["clusterCode"] == "claim_in_progress"
    claim = _claim(root)
    assert claim is not None and claim["offerId"] == result.offer_id
    ingress.script.append(TransportError("HTTP 409", code="response_rejected", http_status=409))  # no code
    clock.now = result.next_attempt_at_ms or clock.now
    assert coordinator.pull(session).status == "unavailable"
    clock.now += 60_000
    assert coordinator.pull(session).status == "accepted"
    assert os.listdir(root / "abandoned") == []


def test_409_abandons_the_claim_as_offer_fenced(journal: Journal, ingress: DirectIngress, clock: ManualClock,
                                                root: pathlib.Path) -> None:
    session = _register(ingress)
    ingress.state.add_candidate(build_task("shell", now_ms=clock.now))
    coordinator, _ = _coordinator(journal, ingress, clock)
    ingress.script.append("commit_then_lose")
    lost = coordinator.pull(session)
    assert lost.offer_id is not None
    ingress.state.set_lease_status(lost.offer_id, "released")  # the cluster moved on
    clock.now = lost.next_attempt_at_ms or clock.now
    result = coordinator.pull(session)
    assert (result.status, result.reason, result.http_status) == ("abandoned", "offer_fenced", 409)
    assert _claim(root) is None
    assert (root / "abandoned" / f"{lost.offer_id}.json").exists()


@pytest.mark.parametrize("status", [401, 403])
def test_credential_rejection_keeps_the_claim_and_backs_off(journal: Journal, ingress: DirectIngress,
                                                            clock: ManualClock, root: pathlib.Path, status: int) -> None:
    session = _register(ingress)
    coordinator, _ = _coordinator(journal, ingress, clock)
    ingress.script.append(TransportError("no", code="response_rejected", http_status=status))
    result = coordinator.pull(session)
    assert (result.status, result.http_status) == ("credential_rejected", status)
    claim = _claim(root)
    assert claim is not None and claim["attemptCount"] == 1 and claim["nextAttemptAtMs"] > clock.now - 1


def test_contract_violation_is_invalid_response_with_the_claim_kept(
    journal: Journal, ingress: DirectIngress, clock: ManualClock, root: pathlib.Path
) -> None:
    session = _register(ingress)
    coordinator, _ = _coordinator(journal, ingress, clock)

    class Garbage:
        def post_json(self, path: str, body: bytes, *, max_response_bytes: int) -> Response:
            return Response(b'{"schema":"qinglong/remote-execution-offer@v1","status":"busy"}')

    coordinator._transport = Garbage()  # type: ignore[assignment]
    result = coordinator.pull(session)
    assert (result.status, result.reason) == ("invalid_response", "key_set")
    assert _claim(root) is not None


def test_full_inbox_makes_no_new_claim(journal: Journal, ingress: DirectIngress, clock: ManualClock,
                                       root: pathlib.Path) -> None:
    session = _register(ingress)
    for kind in ("shell", "python", "shell"):
        ingress.state.add_candidate(build_task(kind, now_ms=clock.now))
    coordinator, _ = _coordinator(journal, ingress, clock)
    assert coordinator.pull(session).status == "accepted"
    assert coordinator.pull(session).status == "accepted"  # maximum_entries = 2
    calls = len(ingress.calls)
    result = coordinator.pull(session)
    assert (result.status, result.offer_id) == ("inbox_full", None)
    assert _claim(root) is None and len(ingress.calls) == calls
    assert len(ingress.state.candidates) == 1  # nothing was claimed on the cluster


def test_a_clock_that_steps_back_never_moves_claim_times_backwards(
    journal: Journal, ingress: DirectIngress, clock: ManualClock, root: pathlib.Path
) -> None:
    session = _register(ingress)
    boot = ManualClock()  # the boot clock: never stepped
    coordinator = PullCoordinator(journal, ingress, runtime=journal.runtime, clock_ms=clock, boot_ms=boot,
                                  random=random.Random(7).random)
    ingress.script.append(TransportError("down", code="request_rejected"))
    first = coordinator.pull(session)
    claim = _claim(root)
    assert claim is not None and first.next_attempt_at_ms is not None
    clock.now = first.next_attempt_at_ms - 10_000_000  # NTP stepped the clock back ~3 h
    boot.now += 60_000  # the backoff (at most 60 s) is over by the boot clock
    ingress.script.append(TransportError("down", code="request_rejected"))
    second = coordinator.pull(session)
    after = _claim(root)
    assert second.status == "unavailable"  # a due date > 1 h away counts as due: no wedge
    assert after is not None and after["updatedAtMs"] >= claim["updatedAtMs"]
    assert after["lastAttemptAtMs"] >= claim["lastAttemptAtMs"]


@pytest.mark.parametrize("step_ms", [-1_800_000, 1_800_000])
def test_a_backoff_runs_on_the_boot_clock_whatever_the_wall_clock_does(
    journal: Journal, ingress: DirectIngress, clock: ManualClock, step_ms: int
) -> None:
    """Issue 23 ("backoff" among the timers): half an hour back no longer makes a claim
    wait half an hour more; half an hour ahead does not send it early."""
    session = _register(ingress)
    boot = ManualClock()
    coordinator = PullCoordinator(journal, ingress, runtime=journal.runtime, clock_ms=clock, boot_ms=boot,
                                  random=lambda: 0.5)
    ingress.script.append(TransportError("down", code="request_rejected", http_status=503, retry_after_ms=30_000))
    first = coordinator.pull(session)
    assert first.status == "unavailable" and coordinator.backoff_due_boot_ms == boot.now + 30_000
    clock.now += step_ms
    boot.now += 29_000
    assert coordinator.pull(session).status == "backoff"  # not yet, by the boot clock
    boot.now += 1_000
    assert coordinator.pull(session).status in ("accepted", "idle")  # due: sent again


def test_backoff_base_is_range_checked(journal: Journal, ingress: DirectIngress, clock: ManualClock) -> None:
    for base in (99, 60_001):
        with pytest.raises(DeliveryError) as info:
            PullCoordinator(journal, ingress, runtime=journal.runtime, backoff_base_ms=base,  # type: ignore[arg-type]
                            clock_ms=clock)
        assert info.value.code == "invalid_configuration"


# -- abort ---------------------------------------------------------------------------------------------

def test_an_abort_during_the_request_keeps_the_claim_and_its_marker(
    journal: Journal, ingress: DirectIngress, clock: ManualClock, root: pathlib.Path
) -> None:
    session = _register(ingress)
    ingress.state.add_candidate(build_task("shell", now_ms=clock.now))
    coordinator, _ = _coordinator(journal, ingress, clock)
    ingress.script.append(PullAborted("SIGTERM"))
    with pytest.raises(PullAborted):
        coordinator.pull(session)
    claim = _claim(root)
    assert claim is not None
    assert (claim["revision"], claim["attemptCount"], claim["nextAttemptAtMs"]) == (0, 0, clock.now)
    assert _marker(journal) == {"schemaVersion": 1, "offerId": claim["offerId"], "revision": 0,
                                "startedAtMs": clock.now}
    result = coordinator.pull(session)  # the next cycle counts the unknown outcome, then replays
    assert (result.status, result.attempt_count) == ("accepted", 1)
    assert len(set(ingress.offer_calls())) == 1
    assert _marker(journal) is None


# -- the budget: only attempts that may have reached the cluster -----------------------------------

def test_failures_that_never_reached_the_cluster_never_use_the_budget(
    journal: Journal, ingress: DirectIngress, clock: ManualClock, root: pathlib.Path
) -> None:
    """Spec README: DNS, connect and handshake failures (and a TLS alert on the first
    read) back off with full jitter but never count: 40 of them, then the path works and
    the very same claim is replayed byte for byte."""
    session = _register(ingress)
    ingress.state.add_candidate(build_task("shell", now_ms=clock.now))
    coordinator, twin = _coordinator(journal, ingress, clock, base=100)
    for failure in range(1, 41):
        ingress.script.append(_unreached())
        result = coordinator.pull(session)
        # the jitter ceiling still grows with the failures in a row (base x 2^(n-1), <= 60 s)
        expected = clock.now + int(twin.random() * min(60_000, 100 * 2 ** (failure - 1)))
        assert (result.status, result.attempt_count, result.counted) == ("unavailable", 0, False)
        assert result.next_attempt_at_ms == expected
        clock.now = expected
    claim = _claim(root)
    assert claim is not None and claim["attemptCount"] == 0
    ingress.state.sessions[WORKER].lease_expires_at_ms = clock.now + 60_000  # heartbeats kept it alive
    final = coordinator.pull(session)
    assert (final.status, final.offer_id) == ("accepted", claim["offerId"])
    assert len(set(ingress.offer_calls())) == 1


def test_a_marker_found_at_start_counts_once_and_a_killing_answer_is_not_replayed_forever(
    journal: Journal, ingress: DirectIngress, clock: ManualClock, root: pathlib.Path
) -> None:
    """An answer that kills the agent every time leaves the marker each time: each one
    is counted at the next start, so after 16 the claim is abandoned."""
    session = _register(ingress)
    ingress.state.add_candidate(build_task("shell", now_ms=clock.now))
    coordinator, _ = _coordinator(journal, ingress, clock)
    for attempt in range(16):
        ingress.script.append(PullAborted("SIGKILL"))  # stands in for a crash with the request in flight
        with pytest.raises(PullAborted):
            coordinator.pull(session)
        claim = _claim(root)
        assert claim is not None and claim["attemptCount"] == attempt
        clock.now += 1000
    result = coordinator.pull(session)
    assert (result.status, result.reason, result.attempt_count) == ("abandoned", "attempt_budget_exhausted", 16)
    assert _marker(journal) is None


def test_a_stale_marker_of_another_revision_is_dropped_uncounted(
    journal: Journal, ingress: DirectIngress, clock: ManualClock, root: pathlib.Path
) -> None:
    session = _register(ingress)
    coordinator, _ = _coordinator(journal, ingress, clock)
    assert coordinator.pull(session).status == "idle"
    claim = _claim(root)
    assert claim is not None and journal.runtime is not None
    for stale in (b'{"schemaVersion":1,"offerId":"other","revision":0,"startedAtMs":1}\n',
                  json.dumps({"schemaVersion": 1, "offerId": claim["offerId"], "revision": 7,
                              "startedAtMs": 1}).encode()):
        journal.runtime.write("attempt.json", stale)
        result = coordinator.pull(session)
        assert (result.status, result.attempt_count) == ("idle", 0)
        assert _marker(journal) is None


@pytest.mark.parametrize("damage", ["empty", "one_byte", "truncated", "garbage", "loose_mode"])
def test_a_damaged_marker_counts_as_an_attempt_of_unknown_outcome_once(
    journal: Journal, ingress: DirectIngress, clock: ManualClock, root: pathlib.Path, damage: str
) -> None:
    """Issue 23: a damaged attempt marker (a power loss with the runtime directory on disk,
    garbage) is never a permanent error: it counts as present (its outcome unknown), the
    claim is rewritten with the attempt, the marker removed, and the claim sent."""
    session = _register(ingress)
    coordinator, _ = _coordinator(journal, ingress, clock)
    assert coordinator.pull(session).status == "idle"
    claim = _claim(root)
    assert claim is not None and journal.runtime is not None
    path = pathlib.Path(journal.runtime.path) / "attempt.json"
    whole = json.dumps({"schemaVersion": 1, "offerId": claim["offerId"], "revision": claim["revision"],
                        "startedAtMs": clock.now}).encode()
    path.write_bytes({"empty": b"", "one_byte": b"{", "truncated": whole[:len(whole) // 2],
                      "garbage": b"\x00\xff garbage", "loose_mode": whole}[damage])
    path.chmod(0o644 if damage == "loose_mode" else 0o600)
    clock.now += 1000
    result = coordinator.pull(session)
    assert (result.status, result.attempt_count) == ("idle", 1), result
    assert _marker(journal) is None
    again = coordinator.pull(session)
    assert (again.status, again.attempt_count) == ("idle", 1)  # counted once


def test_abort_signal_raises_only_inside_interruptible_sections() -> None:
    abort = AbortSignal()
    abort.trip("SIGTERM")  # outside: recorded, not raised
    assert abort.tripped
    with pytest.raises(PullAborted):
        abort.check()
    with pytest.raises(PullAborted), abort.interruptible():
        pass  # entry refuses once tripped: no new request starts
    fresh = AbortSignal()
    with pytest.raises(PullAborted) as info, fresh.interruptible():
        fresh.trip("SIGINT")  # inside: raised at once
    assert info.value.signal_name == "SIGINT"
    fresh.trip("SIGTERM")
    assert fresh.reason == "SIGINT"  # the first signal names the abort


def test_claim_conflict_is_reported_for_a_claim_made_by_another_worker(
    journal: Journal, ingress: DirectIngress, clock: ManualClock
) -> None:
    """A claim of another workerId is as stale as one of another session: abandoned
    (once an attempt of it counted; see the test above for one that never did)."""
    session = _register(ingress)
    other = ClaimAuthority("edge-2", session.session_id, session.generation, "offer-x", "A" * 43)
    journal.create_claim(PendingClaim.create(other, clock.now).replace(revision=1, attempt_count=1,
                                                                       last_attempt_at_ms=clock.now))
    coordinator, _ = _coordinator(journal, ingress, clock)
    assert coordinator.pull(session).reason == "stale_session"

