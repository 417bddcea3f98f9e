"""Scripted faults on every execution route of the cluster double, seen through the agent's
own transport (what a runner will meet): a lost answer after the commit, 503 with
Retry-After before it, a delay or hang past the timeout, a truncated, garbage, mistyped,
oversized or tampered answer. And the double as its own process (the demo): the admin
listener's cancel, the state file with executions and no secret.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from qinglong_edge.errors import TransportError
from tests.support.cluster_admin import AdminListener
from tests.support.cluster_calls import TOKEN, WorkerCalls, registered_worker
from tests.support.cluster_double import ClusterDouble, Fault
from tests.support.cluster_faults import DELETE
from tests.support.cluster_tasks import PYTHON_SECRET_VALUE
from tests.support.cluster_wire import wall_ms
from tests.support.pull_env import REPO, child_env, cluster_process


@pytest.fixture
def worker(cluster: ClusterDouble, tmp_path: pathlib.Path) -> Iterator[WorkerCalls]:
    """Registered with a 1 s request timeout, one command task with a secret claimed."""
    with registered_worker(cluster, tmp_path / "files", request_timeout_ms=1000) as calls:
        cluster.add_command_task("true", secrets={"K": "v"})
        calls.claim()
        yield calls


def _ready(worker: WorkerCalls, op: str) -> Callable[[], Any]:
    """Bring the attempt to where ``op`` applies; the call that makes ``op``."""
    if op in ("start-failure", "running", "secrets", "artifacts", "completion"):
        worker.start()
    if op in ("artifacts", "completion"):
        worker.call("running", worker.running_body())
    if op == "completion":
        worker.upload(b"log")
    if op == "artifacts":
        return lambda: worker.upload(b"log")
    body = worker.completion_body(b"log") if op == "completion" else worker.body(op)
    return lambda: worker.call(op, body)


#: How each route's commit shows on the cluster.
COMMITTED: dict[str, Callable[[ClusterDouble, str], bool]] = {
    "starting": lambda c, run: c.attempt(run).status == "starting",
    "start-failure": lambda c, run: c.attempt(run).lease.status == "completed",
    "running": lambda c, run: c.attempt(run).status == "running",
    "lease-control": lambda c, run: c.lease_version(run) == 2,
    "artifacts": lambda c, run: c.artifact(run) is not None,
    "completion": lambda c, run: c.attempt(run).status == "succeeded",
    "secrets": lambda c, run: True,  # read-only: nothing to commit
}
ROUTES = sorted(COMMITTED)


@pytest.mark.parametrize("op", ROUTES)
def test_drop_after_commit(cluster: ClusterDouble, worker: WorkerCalls, op: str) -> None:
    make = _ready(worker, op)
    cluster.push_fault(Fault.drop(op))
    if op == "artifacts":
        assert make().status is None
    else:
        with pytest.raises(TransportError) as raised:
            make()
        assert raised.value.code == "request_rejected"
    assert COMMITTED[op](cluster, worker.run_id)
    exchange = cluster.exchanges_for(op)[-1]
    assert (exchange.fault, exchange.committed, exchange.status) == ("drop", True, None)


@pytest.mark.parametrize("op", ROUTES)
def test_unavailable_with_retry_after_is_not_committed(cluster: ClusterDouble, worker: WorkerCalls, op: str) -> None:
    make = _ready(worker, op)
    before = cluster.executions()[worker.run_id]
    cluster.push_fault(Fault.unavailable(op, retry_after="7"))
    if op == "artifacts":
        answer = make()
        assert (answer.status, answer.code, answer.headers["retry-after"]) == (503, "worker_ingress_unavailable", "7")
    else:
        with pytest.raises(TransportError) as raised:
            make()
        assert (raised.value.code, raised.value.http_status, raised.value.retry_after_ms) == (
            "response_rejected", 503, 7000)
    assert cluster.executions()[worker.run_id] == before
    assert cluster.exchanges_for(op)[-1].committed is False
    make()  # the retry is answered as if nothing happened
    assert COMMITTED[op](cluster, worker.run_id)


@pytest.mark.parametrize("op", ["starting", "lease-control", "completion", "secrets", "running"])
@pytest.mark.parametrize(("fault", "code"), [
    (Fault.error_500, "response_rejected"),   # status not 200
    (Fault.mid_body, "response_rejected"),    # the connection closed inside the body
    (Fault.wrong_type, "response_rejected"),  # not application/json
    (Fault.oversized, "response_rejected"),   # a Content-Length over the route's cap
    (lambda op: Fault.oversized(op, declared=False), "response_too_large"),  # counted as it streams
])
def test_spoiled_answers_after_commit(cluster: ClusterDouble, worker: WorkerCalls, op: str,
                                      fault: Callable[[str], Fault], code: str) -> None:
    make = _ready(worker, op)
    cluster.push_fault(fault(op))
    with pytest.raises(TransportError) as raised:
        make()
    assert raised.value.code == code
    assert COMMITTED[op](cluster, worker.run_id)
    assert cluster.exchanges_for(op)[-1].committed is True


@pytest.mark.parametrize("kind", ["delay", "hang"])
def test_an_answer_past_the_timeout(cluster: ClusterDouble, worker: WorkerCalls, kind: str) -> None:
    cluster.push_fault(Fault.delay(1.5, "lease-control") if kind == "delay" else Fault.hang("lease-control"))
    with pytest.raises(TransportError) as raised:
        worker.renew()
    assert raised.value.code == "request_rejected"
    assert cluster.lease_version(worker.run_id) == 2  # committed; the worker does not know it


def test_garbage_answers(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    cluster.push_fault(Fault.garbage("starting"))
    body = worker.transport.post_json(worker.path("starting"), json.dumps(worker.fence7()).encode(),
                                      max_response_bytes=16_384).body
    assert body.startswith(b'{"schema":"qinglong/remote-run-activation@v1","status":')
    with pytest.raises(ValueError):
        json.loads(body)
    assert cluster.attempt(worker.run_id).status == "starting"
    cluster.push_fault(Fault.garbage("lease-control", commit=False))
    with pytest.raises(ValueError):
        json.loads(worker.transport.post_json(worker.path("lease-control"), json.dumps(worker.lease_body()).encode(),
                                              max_response_bytes=4096).body)
    assert cluster.lease_version(worker.run_id) == 1


def test_wrong_echoes(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    cluster.push_fault(Fault.wrong_echo("lease-control", leaseVersion=9),
                       Fault.wrong_echo("starting", snapshot={"runId": "run-other", "callbackSequence": DELETE}),
                       Fault.wrong_echo("completion", edit=lambda answer: {**answer, "callbackSequence": 2}))
    assert worker.renew()["leaseVersion"] == 9
    assert cluster.lease_version(worker.run_id) == 2  # what the cluster really holds
    worker.version = 2
    snapshot = worker.call("starting")["snapshot"]
    assert snapshot["runId"] == "run-other" and "callbackSequence" not in snapshot
    worker.call("running", worker.running_body())
    worker.upload(b"log")
    assert worker.call("completion", worker.completion_body(b"log"))["callbackSequence"] == 2
    assert cluster.attempt(worker.run_id).status == "succeeded"


def test_artifact_faults(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    worker.run()
    cluster.push_fault(Fault.mid_body("artifacts"))
    answer = worker.upload(b"log")
    assert answer.error == "incomplete" and cluster.artifact(worker.run_id) is not None
    cluster.push_fault(Fault.wrong_echo("artifacts", sha256="0" * 64))
    assert worker.upload(b"log").json()["sha256"] == "0" * 64
    assert cluster.artifact(worker.run_id).sha256 != "0" * 64  # type: ignore[union-attr]


def test_a_fault_waits_for_its_route(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    cluster.push_fault(Fault.error_500("completion"))
    worker.run()
    worker.renew()
    assert cluster.pending_faults() == 1


# -- the admin listener and process mode ----------------------------------------------------------

def _post(origin: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(origin + path, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_admin_listener(cluster: ClusterDouble, worker: WorkerCalls) -> None:
    changes: list[int] = []
    with AdminListener(cluster, on_change=lambda: changes.append(1)) as admin:
        assert _post(admin.origin, "/cancel", {"runId": "nope"}) == (404, {"code": "no_run"})
        assert _post(admin.origin, "/cancel", {"reason": "bogus"}) == (400, {"code": "invalid_reason"})
        assert _post(admin.origin, "/clock", {"advanceMs": 5}) == (200, {"nowMs": 1_700_000_000_005})
        assert _post(admin.origin, "/cancel", {}) == (200, {"runId": worker.run_id, "status": "accepted"})
        assert worker.renew()["stop"] == {"reason": "user", "requestedAtMs": 1_700_000_000_005}
        cluster.add_command_task("true")
        worker.claim("offer-2", "Y" * 43)
        status, answer = _post(admin.origin, "/cancel", {})
        assert (status, answer["code"]) == (409, "ambiguous")
    assert len(changes) == 2


def test_process_mode_cancel_and_state_file(tmp_path: pathlib.Path) -> None:
    state = tmp_path / "cluster"
    with cluster_process(state, "python") as (proc, info):
        assert info["adminOrigin"].startswith("http://127.0.0.1:")
        token = pathlib.Path(info["credentialFile"]).read_text().strip()
        remote = SimpleNamespace(origin=info["origin"], port=info["port"], worker_id="edge-1", token=token,
                                 now_ms=wall_ms)
        calls = WorkerCalls(remote, info)  # type: ignore[arg-type]
        calls.register()
        calls.claim("offer-1", TOKEN)
        calls.start()
        cancel = subprocess.run([sys.executable, "-m", "tests.support.cluster_admin", "--state-dir", str(state),
                                 "cancel"], capture_output=True, cwd=REPO, env=child_env(), timeout=30, check=False)
        assert cancel.returncode == 0, cancel.stderr
        assert json.loads(cancel.stdout) == {"runId": calls.run_id, "status": "accepted"}
        assert calls.renew()["stop"]["reason"] == "user"
        calls.close()
        text = (state / "cluster-state.json").read_text()
        execution = json.loads(text)["executions"][calls.run_id]
        assert (execution["attemptStatus"], execution["cancel"]["reason"], execution["lease"]["version"]) == (
            "starting", "user", 2)
        assert "run.cancel_requested" in execution["events"]
        for secret in (PYTHON_SECRET_VALUE, TOKEN, token):
            assert secret not in text
        assert os.stat(state / "cluster-state.json").st_mode & 0o077 == 0
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
