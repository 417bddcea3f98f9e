"""``edge.worker.get``: the Remote Worker's state as this device sees it (issue 26 item 4).

Our route (the reference has none): ``GET /api/v3/projects/{projectId}/edge-worker``,
permission ``project.read`` (every role has it: the state is the device's, not a
project's, and holds no secret), audited as every read, no query. It reads without any
lock, as ``inbox list`` does: the session record and ``cycles.json`` from the RAM
runtime directory, the inbox records from the journal. Body (keys in this order)::

    {"schema":"qinglong-edge/worker-status@v1","configured":true,
     "workerId":"edge-1",
     "session":null | {"sessionId","generation","version","status","registeredAtMs",
                       "heartbeatAtMs","leaseExpiresAtMs"},
     "records":[{"offerId","state","runId","attemptId","acceptedAtMs","inFlight"}...],
     "inFlight":N,
     "lastCycle":null | {"atMs","status","exitStatus"},
     "failures":[{"atMs","reason","detail"}...]}

At most :data:`MAX_RECORDS` records (the newest accepted); lease tokens, credentials and
callback digests never appear. ``lastCycle`` is the last *failed* cycle unless the
metrics textfile is on (only then does every cycle write it: docs/local.md, "Metrics").
"""

from __future__ import annotations

import os
from typing import Any, Final

from qinglong_edge.clock import wall_ms
from qinglong_edge.config import WorkerConfig
from qinglong_edge.errors import JournalError

__all__ = ["MAX_RECORDS", "WORKER_STATUS_SCHEMA", "worker_status"]

WORKER_STATUS_SCHEMA: Final = "qinglong-edge/worker-status@v1"
MAX_RECORDS: Final = 64


def _session(runtime: Any) -> dict[str, Any] | None:
    from qinglong_edge.contracts.errors import ContractError
    from qinglong_edge.worker.delivery.session import parse_session_state
    from qinglong_edge.worker.journal.store import SESSION_NAME

    try:
        data = runtime.read(SESSION_NAME)
        state = parse_session_state(data) if data is not None else None
    except (JournalError, ContractError):
        return None
    record = None if state is None else state.record
    if record is None:
        return None
    return {"sessionId": record.session_id, "generation": record.generation, "version": record.version,
            "status": record.status, "registeredAtMs": record.registered_at_ms,
            "heartbeatAtMs": record.heartbeat_at_ms, "leaseExpiresAtMs": record.lease_expires_at_ms}


def worker_status(worker: WorkerConfig) -> dict[str, Any]:
    """The body of ``edge.worker.get`` (module docstring).

    Raises:
        JournalError: the journal cannot be read safely (the route answers 503).
    """
    from qinglong_edge.worker.delivery.cycle_status import read_cycles
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory
    from qinglong_edge.worker.journal.view import JournalReader
    from qinglong_edge.worker.remote.job_files import in_flight

    now = wall_ms()
    session: dict[str, Any] | None = None
    cycles: dict[str, Any] = {"lastCycle": None, "failures": []}
    try:
        runtime = RuntimeDirectory.open(worker.runtime_directory, worker.journal_directory)
    except JournalError:
        runtime = None
    if runtime is not None:
        with runtime:
            session = _session(runtime)
            cycles = read_cycles(runtime)
    records: list[dict[str, Any]] = []
    if os.path.lexists(worker.journal_directory):
        with JournalReader.open(worker.journal_directory) as reader:
            for offer_id in reader.list_offers():
                record = reader.read_offer(offer_id)
                if record is None:
                    continue
                candidate = record["offer"]["candidate"]
                records.append({"offerId": offer_id, "state": record["state"], "runId": candidate["runId"],
                                "attemptId": candidate["attemptId"], "acceptedAtMs": record["acceptedAtMs"],
                                "inFlight": bool(in_flight(record, now))})
    records.sort(key=lambda r: (-int(r["acceptedAtMs"]), r["offerId"]))
    failures = [f for f in cycles.get("failures", []) if isinstance(f, dict)]
    return {
        "schema": WORKER_STATUS_SCHEMA,
        "configured": True,
        "workerId": worker.worker_id,
        "session": session,
        "records": records[:MAX_RECORDS],
        "inFlight": sum(1 for r in records if r["inFlight"]),
        "lastCycle": cycles.get("lastCycle"),
        "failures": failures,
    }
