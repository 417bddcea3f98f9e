"""``qinglong-edge pull`` end to end: the real CLI in child processes, against the cluster
double over TLS 1.3 mutual TLS, with real signals, real crash points and the real journal.

Requirements of issue 6 checked here: response lost after commit (drop, 500, timeout,
mid-body, garbage) -> byte-identical retries, one inbox file, one lease; SIGTERM in
flight -> claim kept, exit 75, replayed once; two pulls at once -> one claim, loser exits
0; SIGKILL at every step boundary -> convergence; backoff without network I/O and
Retry-After; abandoned claims; 401 -> 77 with the claim kept; full inbox; session
register/heartbeat/fencing; --duration; --json.
"""

from __future__ import annotations

import json
import pathlib
import signal
import time
from typing import Any

import pytest

from qinglong_edge.contracts.journal_records import PendingClaim
from qinglong_edge.contracts.offer import ClaimAuthority
from qinglong_edge.errors import transport_remedy
from qinglong_edge.process.identity import read_proc_stat
from qinglong_edge.worker.journal.store import Journal
from tests.support.cluster_double import ClusterDouble, Fault
from tests.support.journal_proc import wait_stopped
from tests.support.pull_env import PullEnv, kill
from tests.support.wait import wait_until


@pytest.fixture
def cluster(shared_cluster: ClusterDouble) -> ClusterDouble:
    shared_cluster.reset(tasks=("shell",))
    return shared_cluster


@pytest.fixture
def env(tmp_path: pathlib.Path, cluster: ClusterDouble) -> PullEnv:
    return PullEnv(tmp_path, cluster)


def _asleep(pid: int) -> bool:
    """The process's main thread is asleep (``S``): blocked in a read, a wait or a sleep."""
    stat = read_proc_stat(pid)
    return stat is not None and stat.state == "S"


def _acknowledged(env: PullEnv) -> bool:
    """The one inbox record is ``completion_acknowledged`` on disk."""
    return [record["state"] for record in env.inbox().values()] == ["completion_acknowledged"]


def _accepted_once(env: PullEnv) -> tuple[str, dict[str, Any]]:
    """Exactly one inbox record, exactly one lease on the cluster, and no pending claim
    the cluster holds a lease for (a claim answered idle is kept for the next cycle). The
    pull executes what it accepts: the record is completed, and the cluster saw exactly
    one completion of that attempt (nothing lost, nothing run twice)."""
    inbox = env.inbox()
    assert len(inbox) == 1, inbox.keys()
    leases = env.cluster.state.leases_by_offer()
    claim = env.claim()
    assert claim is None or claim["offerId"] not in leases
    assert list(leases) == list(inbox)
    ((offer_id, record),) = inbox.items()
    assert record["state"] == "completion_acknowledged", record["state"]
    run_id = record["offer"]["candidate"]["runId"]
    assert run_id == leases[offer_id].run_id
    assert env.cluster.completion(run_id)["status"] == "succeeded"
    assert [e.type for e in env.cluster.events(run_id)].count("attempt.running") == 1
    return offer_id, record


# -- the happy path and the JSON shape -----------------------------------------------------------------

def test_first_cycle_registers_and_accepts_an_offer_with_a_real_digest(env: PullEnv) -> None:
    outcome = env.pull("--json")
    assert outcome.status == 0, outcome.stderr
    line = outcome.last()
    assert line["session"]["action"] == "registered"
    assert line["session"]["generation"] == 1
    # attemptCount: the attempts counted toward the budget of 16 (none failed).
    assert (line["status"], line["reason"], line["attemptCount"]) == ("accepted", "new_claim", 0)
    assert set(line) == {"device", "session", "status", "offerId", "runId", "reason", "attemptCount", "stats"}
    assert line["device"]["architecture"] in ("amd64", "arm64") and line["device"]["supportTier"] == "tier1"
    assert line["stats"]["claimAttempts"] == 1
    offer_id, record = _accepted_once(env)
    assert line["offerId"] == offer_id
    revision = record["offer"]["executionRevision"]
    assert record["offer"]["executionDigest"] == revision["contentDigest"]
    register, offers, *execution = env.cluster.exchanges
    assert (register.op, register.status, offers.op, offers.status) == ("register", 200, "offers", 200)
    assert register.json()["availableSlots"] == 1
    # then the execution of what was accepted (remote-execution.md 2.2), one call each, after
    # the renewal a lease learned from an offer answer gets at once (spec README "Decisions for clocks")
    assert [x.op for x in execution] == ["lease-control", "starting", "starting", "running", "artifacts",
                                         "completion"]


def test_human_output_is_one_line_per_cycle_and_per_record_event(env: PullEnv) -> None:
    outcome = env.pull()
    assert outcome.status == 0
    lines = outcome.stdout.splitlines()
    assert "accepted offer" in lines[0]
    run_id = env.cluster.attempt().run_id
    assert all(line.startswith(f"pull: run {run_id}: ") for line in lines[1:-1]), lines
    assert "completion acknowledged" in lines[-2] and lines[-1].startswith("pull: resident ")
    idle = env.pull()
    assert idle.status == 0 and idle.stdout.count("\n") == 1 and "idle (no_candidates)" in idle.stdout


def test_idle_cycles_keep_their_claim_unchanged_and_send_it_again(env: PullEnv) -> None:
    """Spec README, storage on flash: a claim is kept across idle answers (the reference
    cluster stores nothing per offerId on an idle answer), never rewritten, and no
    marker is left behind; the next cycle sends the very same body."""
    env.cluster.state.candidates.clear()
    outcome = env.pull("--json")
    assert outcome.status == 0
    assert (outcome.last()["status"], outcome.last()["reason"]) == ("idle", "no_candidates")
    kept = (env.journal / "pending-claim.json").read_bytes()
    assert json.loads(kept)["offerId"] == outcome.last()["offerId"] and env.inbox() == {}
    assert env.marker() is None
    again = env.pull("--json")
    assert (again.last()["status"], again.last()["offerId"]) == ("idle", outcome.last()["offerId"])
    assert (env.journal / "pending-claim.json").read_bytes() == kept  # not even rewritten
    first, second = env.cluster.exchanges_for("offers")
    assert first.body == second.body
    env.cluster.add_task("shell")
    accepted = env.pull("--json")
    assert (accepted.last()["status"], accepted.last()["offerId"]) == ("accepted", outcome.last()["offerId"])
    assert env.claim() is None


# -- response lost after the cluster committed ------------------------------------------------------

@pytest.mark.parametrize("fault", [
    pytest.param(Fault.drop(), id="drop"),
    pytest.param(Fault.error_500(), id="500"),
    pytest.param(Fault.delay(1.6), id="timeout"),
    pytest.param(Fault.mid_body(), id="close_mid_body"),
    pytest.param(Fault.garbage(), id="garbage"),
])
def test_lost_response_is_replayed_with_a_byte_identical_body(env: PullEnv, fault: Fault) -> None:
    env.cluster.push_fault(fault)
    first = env.pull("--json")
    assert first.status == 75, first.stdout + first.stderr
    assert first.last()["status"] in ("unavailable", "invalid_response")
    assert len(env.cluster.state.leases) == 1  # the cluster committed
    claim = env.claim()
    assert claim is not None and claim["attemptCount"] == 1
    outcomes = env.pull_until_settled()
    final = outcomes[-1].last()
    assert outcomes[-1].status == 0
    assert (final["status"], final["reason"]) == ("accepted", "lease_recovery")
    bodies = [exchange.body for exchange in env.cluster.exchanges_for("offers")]
    assert len(bodies) >= 2 and len(set(bodies)) == 1
    offer_id, record = _accepted_once(env)
    assert json.loads(bodies[0])["offerId"] == offer_id
    assert record["offer"]["deliveryKind"] == "lease_recovery"


# -- signals ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_the_request_keeps_the_claim_and_the_next_cycle_replays(env: PullEnv,
                                                                             signum: int) -> None:
    env.cluster.push_fault(Fault.hang())  # commits, then never answers
    proc = env.spawn("--json")
    assert env.cluster.wait_for(lambda xs: any(x.op == "offers" for x in xs))
    assert wait_until(lambda: _asleep(proc.pid))  # waiting for the answer that never comes
    kill(proc, signum)
    outcome = env.finish(proc)
    assert outcome.status == 75, outcome.stderr
    assert outcome.last() == {"status": "aborted", "signal": signal.Signals(signum).name}
    assert "Traceback" not in outcome.stderr
    claim = env.claim()
    assert claim is not None and claim["attemptCount"] == 0
    # The attempt's marker stays in the runtime directory: its outcome is unknown.
    marker = env.marker()
    assert marker is not None and (marker["offerId"], marker["revision"]) == (claim["offerId"], claim["revision"])
    assert len(env.cluster.state.leases) == 1
    replay = env.pull("--json")
    assert replay.status == 0
    assert (replay.last()["status"], replay.last()["reason"]) == ("accepted", "lease_recovery")
    assert replay.last()["attemptCount"] == 1  # the aborted attempt was counted, once
    assert env.marker() is None
    bodies = {exchange.body for exchange in env.cluster.exchanges_for("offers")}
    assert len(bodies) == 1
    _accepted_once(env)


def test_two_pulls_started_together_make_one_claim(env: PullEnv) -> None:
    env.cluster.push_fault(Fault.delay(0.7))  # the winner holds the journal a while
    first, second = env.spawn("--json"), env.spawn("--json")
    outcomes = [env.finish(first), env.finish(second)]
    assert [o.status for o in outcomes] == [0, 0], [o.stderr for o in outcomes]
    statuses = sorted(o.last()["status"] for o in outcomes)
    assert statuses == ["accepted", "busy"]
    busy = next(o for o in outcomes if o.last()["status"] == "busy")
    assert busy.last() == {"status": "busy", "code": "already_owned"}
    assert len(env.cluster.exchanges_for("offers")) == 1
    assert len(env.cluster.exchanges_for("register")) == 1
    _accepted_once(env)


# -- SIGKILL at the step boundaries -------------------------------------------------------------------

CRASH_POINTS = [
    "pull.attempt_marked",
    "pull.response_received",
    "pull.inbox_published",
    "pull.claim_cleared",
    "claim_create.linked",
    "offer_accept.linked",
    "offer_accept.dir_synced",
    "claim_clear.unlinked",
    "runtime_write.tmp_written",
    "runtime_write.renamed",
]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_sigkill_at_a_step_boundary_converges_to_one_inbox_record(env: PullEnv, point: str) -> None:
    proc = env.spawn("--json", env={"QINGLONG_EDGE_CRASHPOINT": f"{point}:pause"})
    assert wait_stopped(proc.pid), f"the pull exited before {point}"
    kill(proc)
    outcome = env.finish(proc)
    assert outcome.status == -signal.SIGKILL
    outcomes = env.pull_until_settled()
    assert outcomes[-1].status == 0, outcomes[-1].stdout + outcomes[-1].stderr
    if point in ("pull.claim_cleared", "claim_clear.unlinked"):
        # the offer was already in the inbox: executed first (it holds the only slot)
        assert outcomes[0].last()["status"] == "no_slot"
    _accepted_once(env)
    assert not [name for name in (env.journal).iterdir() if name.name.endswith(".tmp")]


# -- backoff and Retry-After ------------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "code"), [(429, "authentication_rate_limited"),
                                              (503, "authentication_shield_unavailable")])
def test_retry_after_is_honoured_and_an_early_cycle_does_no_network_io(env: PullEnv, status: int,
                                                                       code: str) -> None:
    env.cluster.push_fault(Fault.status_answer(status, code, retry_after="30"))
    started_ms = time.time_ns() // 1_000_000
    first = env.pull("--json")
    assert first.status == 75
    line = first.last()
    assert (line["status"], line["httpStatus"], line["retryAfterMs"]) == ("unavailable", status, 30_000)
    assert line["nextAttemptAtMs"] >= started_ms + 30_000
    seen = len(env.cluster.exchanges)
    early = env.pull("--json")
    assert early.status == 0
    assert early.last()["status"] == "backoff"
    assert early.last()["nextAttemptAtMs"] == line["nextAttemptAtMs"]
    assert len(env.cluster.exchanges) == seen  # no request at all
    assert env.cluster.state.leases == {}


# -- abandoned claims ---------------------------------------------------------------------------------------

def _seed_claim(env: PullEnv, *, session_id: str, generation: int, attempts: int) -> str:
    """Leave a claim in the journal as an earlier process would have (the owner lock is
    taken); the claim the last idle cycle kept is removed first."""
    authority = ClaimAuthority(env.cluster.worker_id, session_id, generation, "left-behind-offer", "L" * 43)
    now = time.time_ns() // 1_000_000
    claim = PendingClaim.create(authority, now).replace(attempt_count=attempts, revision=attempts,
                                                         last_attempt_at_ms=now if attempts else None)
    with Journal.open(str(env.journal)) as journal:
        kept = journal.read_claim()
        if kept is not None:
            journal.clear_claim(kept.offer_id, kept.revision)
        journal.create_claim(claim)
    return authority.offer_id


@pytest.mark.parametrize(("case", "reason"), [("old_session", "stale_session"),
                                              ("sixteen_attempts", "attempt_budget_exhausted")])
def test_left_behind_claims_are_abandoned_and_a_new_claim_follows(env: PullEnv, case: str, reason: str) -> None:
    env.cluster.state.candidates.clear()
    assert env.pull("--json").status == 0  # registers; idle
    session = env.session()
    assert session is not None
    if case == "old_session":
        offer_id = _seed_claim(env, session_id="018f0000-0000-7000-8000-0000000000aa", generation=9, attempts=3)
    else:
        offer_id = _seed_claim(env, session_id=session["sessionId"], generation=session["generation"],
                               attempts=16)
    env.cluster.add_task("python")
    abandoned = env.pull("--json")
    assert abandoned.status == 75
    assert (abandoned.last()["status"], abandoned.last()["reason"], abandoned.last()["offerId"]) == (
        "abandoned", reason, offer_id)
    record = env.abandoned()[offer_id]
    assert record["reason"] == reason and "leaseToken" not in record
    assert env.claim() is None
    assert env.pull("--json").last()["status"] == "accepted"
    _accepted_once(env)


@pytest.mark.parametrize("how", ["scripted", "lease_released"])
def test_claim_answered_409_is_abandoned_as_offer_fenced(env: PullEnv, how: str) -> None:
    if how == "scripted":
        env.cluster.push_fault(Fault.status_answer(409, "worker_offer_fenced"))
    else:
        env.cluster.push_fault(Fault.drop())
    first = env.pull("--json")
    if how == "lease_released":
        assert first.status == 75
        (offer_id,) = env.cluster.state.leases_by_offer()
        env.cluster.state.set_lease_status(offer_id, "released")  # the cluster moved on meanwhile
        claim = env.claim()
        assert claim is not None
        env.wait_until_due(claim)
        first = env.pull("--json")
    line = first.last()
    assert first.status == 75
    assert (line["status"], line["reason"], line["httpStatus"]) == ("abandoned", "offer_fenced", 409)
    assert env.abandoned()[line["offerId"]]["reason"] == "offer_fenced"
    assert env.claim() is None
    env.cluster.add_task("shell")
    assert env.pull("--json").last()["status"] == "accepted"


@pytest.mark.parametrize("code", ["claim_in_progress", "worker_session_fenced", "conflict"])
def test_a_409_other_than_the_fence_keeps_the_claim_backs_off_and_reports_the_code(env: PullEnv, code: str) -> None:
    """Spec README: only 409 worker_offer_fenced abandons; the cluster double answers
    409 with other codes (Fault.status_answer) and the real transport reads the code."""
    env.cluster.push_fault(Fault.status_answer(409, code))
    first = env.pull("--json")
    line = first.last()
    assert first.status == 75
    assert (line["status"], line["httpStatus"], line["clusterCode"], line["attemptCount"]) == (
        "unavailable", 409, code, 1)
    claim = env.claim()
    assert claim is not None and claim["offerId"] == line["offerId"] and env.abandoned() == {}
    env.wait_until_due(claim)
    final = env.pull_until_settled()[-1].last()
    assert (final["status"], final["offerId"]) == ("accepted", claim["offerId"])  # the same claim, replayed
    assert env.abandoned() == {}


def test_the_human_line_names_the_409_code(env: PullEnv) -> None:
    env.cluster.push_fault(Fault.status_answer(409, "claim_in_progress"))
    outcome = env.pull()
    assert outcome.status == 75
    assert "HTTP 409 claim_in_progress" in outcome.stdout and "kept" in outcome.stdout


def test_a_claim_survives_any_number_of_refused_connections_and_is_replayed(env: PullEnv,
                                                                           tmp_path: pathlib.Path) -> None:
    """Spec README: connect failures never consume the budget of 16; once the path works
    the same claim is replayed byte for byte (and recovers the lease the cluster holds)."""
    import socket

    env.cluster.push_fault(Fault.drop())  # the cluster commits, the answer is lost: a lease exists
    assert env.pull("--json").status == 75
    claim = env.claim()
    assert claim is not None and claim["attemptCount"] == 1
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]  # nothing listens once this socket is closed
    env.write_config(origin=f"https://127.0.0.1:{dead_port}")
    for _ in range(20):  # more than the 16 attempts a reachable cluster would have got
        refused = env.pull("--json")
        line = refused.last()
        assert (refused.status, line["status"], line.get("counted")) in ((75, "unavailable", False),
                                                                          (0, "backoff", None))
        current = env.claim()
        assert current is not None and current["attemptCount"] == 1
        env.wait_until_due(current)
    env.write_config()
    final = env.pull_until_settled()[-1].last()
    assert (final["status"], final["reason"], final["offerId"]) == ("accepted", "lease_recovery", claim["offerId"])
    assert len({x.body for x in env.cluster.exchanges_for("offers")}) == 1


# -- credentials --------------------------------------------------------------------------------------------

def test_401_on_offers_exits_77_and_keeps_the_claim(env: PullEnv) -> None:
    assert env.pull("--json").last()["status"] == "accepted"  # register, first claim
    env.cluster.add_task("python")
    env.cluster.state.credentials[env.cluster.credential_id].state = "revoked"
    rejected = env.pull("--json")
    assert rejected.status == 77
    line = rejected.last()
    assert (line["status"], line["httpStatus"]) == ("credential_rejected", 401)
    claim = env.claim()
    assert claim is not None and claim["offerId"] == line["offerId"] and claim["attemptCount"] == 1
    assert env.cluster.exchanges_for("offers")[-1].status == 401
    env.cluster.state.credentials[env.cluster.credential_id].state = "active"
    env.wait_until_due(claim)
    again = env.pull("--json")
    assert (again.status, again.last()["status"], again.last()["offerId"]) == (0, "accepted", claim["offerId"])


def test_scripted_401_on_offers_exits_77(env: PullEnv) -> None:
    env.cluster.push_fault(Fault.status_answer(401, "worker_authentication_required"))
    outcome = env.pull("--json")
    assert outcome.status == 77
    assert env.claim() is not None


def test_401_on_register_exits_77_with_the_code(env: PullEnv) -> None:
    env.cluster.state.credentials[env.cluster.credential_id].state = "revoked"
    outcome = env.pull("--json")
    assert outcome.status == 77
    assert {k: v for k, v in outcome.last().items() if k != "device"} == {"status": "failed", "code": "credential_rejected", "reason": "unexpected_status",
                              "detail": "register: the cluster rejected the worker credential (HTTP 401)",
                              "remedy": transport_remedy("unexpected_status", 401)}
    assert env.session() is None and env.claim() is None
    assert env.cluster.secret not in outcome.stdout + outcome.stderr


def test_unreadable_credential_file_is_a_configuration_error(env: PullEnv) -> None:
    pathlib.Path(env.files["credentialFile"]).chmod(0o644)  # group/other bits: refused
    outcome = env.pull("--json")
    assert outcome.status == 78, outcome.stdout + outcome.stderr
    assert outcome.last()["code"] == "credentials_unavailable"


def test_a_claim_failure_names_the_file_its_remedy_points_at(env: PullEnv) -> None:
    # Regression: with a fresh session (no heartbeat due) the credential is first read by
    # the offer claim; its line said "-> fix the file the message names" without the
    # message, so the user could not tell which file (the heartbeat path names it).
    env.write_config(heartbeatIntervalMs=300000, sessionLeaseDurationMs=600000)
    assert env.pull("--json").last()["status"] == "accepted"  # register, claim, execute
    credential = pathlib.Path(env.files["credentialFile"])
    credential.chmod(0o644)
    human = env.pull()
    assert human.status == 78, human.stdout + human.stderr
    assert "unavailable (credentials_unavailable)" in human.stdout, human.stdout
    assert f"{credential}: mode 0644 has forbidden group/other bits" in human.stdout, human.stdout
    claim = env.claim()
    assert claim is not None
    env.wait_until_due(claim)
    line = env.pull("--json").last()
    assert line["reason"] == "credentials_unavailable" and str(credential) in line["detail"], line
    assert env.cluster.secret not in human.stdout + human.stderr + json.dumps(line)


# -- inbox capacity -----------------------------------------------------------------------------------------

def test_an_inbox_full_of_finished_records_still_claims(env: PullEnv) -> None:
    """Issue 23: a finished record holds no inbox entry; the oldest makes room for the next
    offer (a full inbox of records in flight makes no claim: tests/cli/test_pull_inbox_capacity.py)."""
    env.write_config(inboxMaximumEntries=1)
    env.cluster.add_task("python")
    first = env.pull("--json")
    assert first.last()["status"] == "accepted"
    (done,) = env.inbox()
    assert env.inbox()[done]["state"] == "completion_acknowledged"
    env.cluster.add_task("python")
    outcome = env.pull("--json")
    assert outcome.status == 0, outcome.stdout
    assert outcome.last()["status"] == "accepted"
    assert done not in env.inbox() and len(env.inbox()) == 1
    assert env.cluster.exchanges_for("register")[0].json()["availableSlots"] == 1


# -- the Worker Session ------------------------------------------------------------------------------------

def _session_ran_out(env: PullEnv) -> None:
    """The session lease ran out, on the device's boot clock (its last heartbeat went out a
    lease ago: the device was away) and on the cluster (its heartbeats stopped)."""
    path = env.runtime / "session.json"
    state = json.loads(path.read_bytes())
    state["session"]["heartbeatAtMs"] -= state["session"]["leaseDurationMs"]
    path.write_text(json.dumps(state, separators=(",", ":")) + "\n")
    env.cluster.state.expire_session("edge-1")


def test_expired_session_re_registers_with_the_next_generation(env: PullEnv) -> None:
    env.cluster.state.candidates.clear()
    first = env.pull("--json")
    assert first.last()["session"]["action"] == "registered"
    _session_ran_out(env)
    second = env.pull("--json")
    session = second.last()["session"]
    assert (session["action"], session["generation"]) == ("registered", 2)
    assert session["sessionId"] != first.last()["session"]["sessionId"]
    assert [x.op for x in env.cluster.exchanges].count("heartbeat") == 0
    assert env.cluster.exchanges_for("register")[1].status == 200


def test_claim_of_an_expired_session_is_abandoned_as_stale(env: PullEnv) -> None:
    env.cluster.push_fault(Fault.status_answer(503, "worker_ingress_unavailable"))
    kept = env.pull("--json")
    assert kept.status == 75
    _session_ran_out(env)
    stale = env.pull("--json")
    line = stale.last()
    assert (line["session"]["action"], line["status"], line["reason"]) == ("registered", "abandoned",
                                                                           "stale_session")
    assert line["offerId"] == kept.last()["offerId"]
    assert env.pull("--json").last()["status"] == "accepted"


@pytest.mark.slow
def test_heartbeat_then_fenced_heartbeat_re_registers_and_abandons_the_claim(env: PullEnv) -> None:
    env.write_config(heartbeatIntervalMs=5000, sessionLeaseDurationMs=60_000)
    env.cluster.state.candidates.clear()
    first = env.pull("--json")
    assert (first.last()["session"]["action"], first.last()["session"]["version"]) == ("registered", 0)
    current = env.pull("--json")  # within the interval: no session call at all
    assert current.last()["session"]["action"] == "current"
    assert [x.op for x in env.cluster.exchanges] == ["register", "offers", "offers"]
    time.sleep(5.1)  # the scenario: the 5 s heartbeat interval passes on the clocks a fresh pull reads
    beat = env.pull("--json")
    assert (beat.last()["session"]["action"], beat.last()["session"]["version"]) == ("heartbeat", 1)
    assert env.cluster.state.sessions["edge-1"].version == 1
    heartbeat = env.cluster.exchanges_for("heartbeat")[0].json()
    assert (heartbeat["expectedVersion"], heartbeat["generation"]) == (0, 1)
    env.cluster.push_fault(Fault.status_answer(503, "worker_ingress_unavailable"))
    env.cluster.add_task("shell")
    kept = env.pull("--json")  # a claim is now pending
    assert kept.status == 75 and env.claim() is not None
    env.cluster.state.expire_session("edge-1")  # the cluster fences the session
    time.sleep(5.1)  # the scenario: the next heartbeat is due
    fenced = env.pull("--json")
    line = fenced.last()
    assert env.cluster.exchanges_for("heartbeat")[-1].status == 409
    assert (line["session"]["action"], line["session"]["generation"]) == ("registered", 2)
    assert (line["status"], line["reason"]) == ("abandoned", "stale_session")
    assert env.pull("--json").last()["status"] == "accepted"


# -- --duration -------------------------------------------------------------------------------------------

def test_duration_loops_at_the_cadence_and_exits_at_the_end(env: PullEnv) -> None:
    env.cluster.add_task("python")
    env.cluster.add_task("shell")
    started = time.monotonic()
    outcome = env.pull("--duration", "2.5", "--json")
    elapsed = time.monotonic() - started
    assert outcome.status == 0, outcome.stderr
    lines = outcome.cycles()
    assert [line["status"] for line in lines[:4]] == ["accepted", "accepted", "accepted", "idle"]
    assert 4 <= len(lines) <= 15  # 200 ms cadence over 2.5 s (each accepted offer executed at once)
    assert len(outcome.events("completion_acknowledged")) == 3
    assert lines[0]["session"]["action"] == "registered"
    assert all(line["session"]["action"] in ("current", "heartbeat") for line in lines[1:])
    assert elapsed < 8
    assert len(env.inbox()) == 3


def test_sigterm_during_duration_sleep_stops_the_loop(env: PullEnv) -> None:
    env.write_config(pullIntervalMs=5000)
    proc = env.spawn("--duration", "30", "--json")
    # the accepted offer runs to its completion first, then the loop sleeps its 5 s
    assert env.cluster.wait_for(lambda xs: any(x.op == "completion" for x in xs))
    assert wait_until(lambda: _asleep(proc.pid) and _acknowledged(env))  # the cycle ended: the loop sleeps
    kill(proc, signal.SIGTERM)
    outcome = env.finish(proc, timeout=10)
    assert outcome.status == 75
    assert [line["status"] for line in outcome.cycles()] == ["accepted", "aborted"]
    _accepted_once(env)


# -- usage and configuration ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["0", "-1", "86401", "nan"])
def test_rejects_a_bad_duration(env: PullEnv, value: str) -> None:
    outcome = env.pull("--duration", value, "--json")
    assert outcome.status == 64
    assert env.cluster.exchanges == []


def test_rejects_a_config_without_the_worker_role(env: PullEnv) -> None:
    env.config_path.write_text(json.dumps({"schema": "qinglong/edge-agent@v1", "stateDirectory": str(env.state_dir)}))
    outcome = env.pull("--json")
    assert outcome.status == 78
    assert outcome.last()["code"] == "invalid_configuration"
