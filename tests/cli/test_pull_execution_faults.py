"""Every state of a record x every fault of the call it makes there (issue 15, "Bad input").

A record is brought to a state by a real crash (a ``runner.*`` crash point kills the
pull right after that state's durable write), the fault is queued for the call the
state makes next, and a fresh ``pull`` runs to its end. Whatever the fault -- the answer
dropped after the cluster committed, a 500 after commit, a 503 with Retry-After, a
delay past the client's timeout, a truncated or garbage body, a wrong content type, an
oversized body, a wrong echo, a version jump -- the record converges: the failure is a
typed ``call_failed`` event naming the call (or, for secrets, the start failure T3
prescribes), the record is left unchanged and retried (never past the local lease
expiry), the job runs at most once, the cluster applies exactly one outcome, and no
traceback or secret ever shows.

The whole matrix is the slower tier (``@pytest.mark.matrix``, ``make test-matrix``); a
representative row per fault family runs in the default tier.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.cluster_double import Fault
from tests.support.remote_env import RemoteEnv, dump
from tests.support.wait import wait_until

SECRET = "matrix-secret-never-shown"

#: case -> (the crash point that leaves the record in its state, the call it makes next,
#: what the job is: gated (it waits for the test), quick, or unstartable)
CASES: dict[str, tuple[str, str, str]] = {
    "accepted:starting": ("pull.claim_cleared", "starting", "quick"),
    "starting_acknowledged:starting": ("runner.starting_acknowledged", "starting", "quick"),
    "starting_acknowledged:secrets": ("runner.starting_acknowledged", "secrets", "quick"),
    "started:running": ("runner.released", "running", "gated"),
    "running_acknowledged:lease-control": ("runner.running_acknowledged", "lease-control", "gated"),
    "running_acknowledged:artifacts": ("runner.running_acknowledged", "artifacts", "quick_gated"),
    "running_acknowledged:completion": ("runner.running_acknowledged", "completion", "quick_gated"),
    "start_failed:start-failure": ("runner.start_failed", "start-failure", "unstartable"),
}


def _version_jump(answer: Any) -> Any:
    if "snapshot" in answer:
        return {**answer, "snapshot": {**answer["snapshot"], "leaseVersion": answer["snapshot"]["leaseVersion"] + 2}}
    if isinstance(answer.get("leaseVersion"), int):
        return {**answer, "leaseVersion": answer["leaseVersion"] + 2}
    return {**answer, "unexpected": 1}


def _wrong_echo(op: str) -> Fault:
    if op in ("starting", "running", "start-failure"):
        return Fault.wrong_echo(op, snapshot={"runId": "another-run"})
    if op == "artifacts":
        return Fault.wrong_echo(op, sha256="0" * 64)
    if op == "completion":
        return Fault.wrong_echo(op, callbackSequence=99)
    return Fault.wrong_echo(op, runId="another-run")  # secrets, lease-control


FAULTS: dict[str, Callable[[str], Fault]] = {
    "drop": Fault.drop,
    "500_committed": Fault.error_500,
    "503_retry_after": lambda op: Fault.unavailable(op, retry_after="1"),
    "delay": lambda op: Fault.delay(1.6, op),  # past requestTimeoutMs 1000
    "mid_body": Fault.mid_body,
    "garbage": Fault.garbage,
    "wrong_type": Fault.wrong_type,
    "oversized": Fault.oversized,
    "wrong_echo": _wrong_echo,
    "version_jump": lambda op: Fault.wrong_echo(op, edit=_version_jump),
}
#: The default tier: one row per family of fault, each on another call.
REPRESENTATIVE = {
    ("running_acknowledged:completion", "drop"),
    ("running_acknowledged:lease-control", "version_jump"),
    ("accepted:starting", "503_retry_after"),
    ("running_acknowledged:artifacts", "wrong_echo"),
    ("starting_acknowledged:secrets", "garbage"),
    ("start_failed:start-failure", "mid_body"),
}


def _params() -> Iterator[Any]:
    for case in CASES:
        for fault in FAULTS:
            marks = () if (case, fault) in REPRESENTATIVE else (pytest.mark.matrix,)
            yield pytest.param(case, fault, id=f"{case}-{fault}", marks=marks)


@pytest.mark.parametrize(("case", "fault"), list(_params()))
def test_a_fault_in_any_state_converges(env: RemoteEnv, case: str, fault: str, tmp_path: pathlib.Path) -> None:
    point, op, job = CASES[case]
    options: dict[str, Any] = {"secrets": {"API_KEY": SECRET}} if op == "secrets" else {}
    if job == "unstartable":
        options["working_directory"] = str(tmp_path / "missing")
    task = env.gated_job("job", **options) if job in ("gated", "quick_gated") else env.quick_job("job", **options)
    run_id = task.candidate["runId"]
    crashed = env.pull("--json", env={"QINGLONG_EDGE_CRASHPOINT": point})
    assert crashed.status == 137, dump(crashed)
    env.cluster.push_fault(FAULTS[fault](op))
    if job == "quick_gated":
        env.release("job")  # it ends at once: its upload / completion meets the fault
    proc = env.spawn_json()
    if job == "gated":
        assert wait_until(lambda: env.cluster.pending_faults() == 0, timeout=30)
        assert wait_until(lambda: env.state() == "running_acknowledged", timeout=30)
        env.release("job")
    outcome = env.finish(proc, timeout=90)
    assert outcome.status == 0, dump(outcome)
    assert "Traceback" not in outcome.stderr and SECRET not in outcome.stdout + outcome.stderr
    assert env.cluster.pending_faults() == 0  # the fault was met
    record = env.record()
    attempt = env.cluster.attempt(run_id)
    terminal = [e.type for e in env.cluster.events(run_id) if e.type.startswith("run.")
                and e.type.split(".")[1] in ("succeeded", "failed", "cancelled", "timed_out")]
    assert len(terminal) == 1, terminal  # exactly one outcome applied
    if op == "secrets" or job == "unstartable":
        assert record["state"] == "start_failure_acknowledged", record["state"]
        assert (attempt.status, attempt.error_code) == ("failed", "EXECUTOR_START_FAILED")
        assert env.starts("job") == 0
        if op == "secrets":
            assert outcome.events("start_failed")[0]["operation"] == "secrets"
    else:
        assert record["state"] == "completion_acknowledged", record["state"]
        assert attempt.completion is not None and attempt.completion["status"] == "succeeded"
        assert env.starts("job") == 1
    spoiled = fault not in ("drop", "500_committed", "503_retry_after", "delay", "mid_body")
    failed = [e for e in outcome.events("call_failed") if e["operation"] == op]
    if op != "secrets" and (spoiled or fault in ("500_committed", "503_retry_after")):
        assert failed, [e["event"] for e in outcome.events()]  # a typed error naming the call
        assert all(set(e) >= {"operation", "code", "reason", "retryAtMs"} for e in failed)
    if spoiled and failed:
        assert {e["code"] for e in failed} <= {"call_response_invalid", "call_fenced"}
