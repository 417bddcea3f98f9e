"""``edge.worker.get`` (issue 26 item 4): the Remote Worker's state for the status console,
read-only, audited, no secret."""

from __future__ import annotations

import json
import pathlib

from qinglong_edge.config import parse_config
from qinglong_edge.local.worker_status import worker_status
from qinglong_edge.worker.delivery.cycle_status import CYCLES_NAME
from qinglong_edge.worker.journal.runtime import RuntimeDirectory
from qinglong_edge.worker.journal.store import Journal
from tests.support.local_api import local_api
from tests.worker import offer_vectors as vectors


def _worker(tmp_path: pathlib.Path) -> object:
    (tmp_path / "run").mkdir(mode=0o700)
    config = parse_config({
        "schema": "qinglong/edge-agent@v1", "stateDirectory": str(tmp_path / "state"),
        "worker": {"origin": "https://cluster.example:7443", "workerId": "edge-1", "credentialFile": "/x/c",
                   "certificateFile": "/x/crt", "privateKeyFile": "/x/key", "trustAnchorFiles": ["/x/ca"],
                   "runtimeDirectory": str(tmp_path / "run")},
    })
    assert config.worker is not None
    return config.worker


def test_a_fresh_device_has_no_session_and_no_records(tmp_path: pathlib.Path) -> None:
    status = worker_status(_worker(tmp_path))  # type: ignore[arg-type]
    assert status == {"schema": "qinglong-edge/worker-status@v1", "configured": True, "workerId": "edge-1",
                      "session": None, "records": [], "inFlight": 0, "lastCycle": None, "failures": []}


def test_records_in_flight_and_the_failures_kept_in_ram(tmp_path: pathlib.Path) -> None:
    worker = _worker(tmp_path)
    with Journal.open(worker.journal_directory) as journal:  # type: ignore[attr-defined]
        journal.accept_offer({**vectors.offer(), "offerId": "offer-1"}, 1001)
    with RuntimeDirectory.open(worker.runtime_directory, worker.journal_directory) as runtime:  # type: ignore[attr-defined]
        runtime.write(CYCLES_NAME, json.dumps({
            "schemaVersion": 1, "lastCycle": {"atMs": 5, "status": "unavailable", "exitStatus": 75},
            "cycles": {"unavailable": 1}, "claims": 0, "failuresByReason": {"connection_refused": 1},
            "failures": [{"atMs": 5, "reason": "connection_refused", "detail": "no route"}]}).encode())
    status = worker_status(worker)  # type: ignore[arg-type]
    assert status["records"] == [{"offerId": "offer-1", "state": "accepted", "runId": "run-1",
                                  "attemptId": "attempt-1", "acceptedAtMs": 1001, "inFlight": True}]
    assert status["inFlight"] == 1
    assert status["lastCycle"] == {"atMs": 5, "status": "unavailable", "exitStatus": 75}
    assert status["failures"][0]["reason"] == "connection_refused"
    assert "leaseToken" not in json.dumps(status) and vectors.offer()["leaseToken"] not in json.dumps(status)


def test_the_route_is_audited_and_open_to_a_viewer(tmp_path: pathlib.Path) -> None:
    worker = _worker(tmp_path)
    with local_api(tmp_path, role="viewer", worker_status=lambda: worker_status(worker)) as api:  # type: ignore[arg-type]
        response = api.get("/api/v3/projects/default/edge-worker")
        assert response.status == 200 and response.json()["configured"] is True
        assert [(r[0], r[4]) for r in api.audit_rows()] == [("edge.worker.get", "allowed")]
        assert api.get("/api/v3/projects/default/edge-worker", authorization=None).status == 401


def test_without_a_worker_section(tmp_path: pathlib.Path) -> None:
    with local_api(tmp_path) as api:
        assert api.get("/api/v3/projects/default/edge-worker").json() == {
            "schema": "qinglong-edge/worker-status@v1", "configured": False}
