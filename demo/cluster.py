"""The demo's QingLong 3.0 cluster: the test suite's cluster double as its own process.

Run by ``demo/run_demo.py`` (never shipped to a device)::

    PYTHONPATH=. python3 demo/cluster.py --pki var/demo/pki --state-dir var/demo/cluster

It is :class:`tests.support.cluster_double.ClusterDouble` (the worker-ingress routes
register / heartbeat / offers of ADR-0110 over TLS 1.3, modelled on the reference
cluster) with three things the in-process double leaves to its tests:

* the TLS identity comes from the demo's throwaway PKI (``--pki``): ``server.pem`` /
  ``server.key`` are presented, and a client certificate issued by ``client-ca.pem``
  is required (mutual TLS);
* two tasks are queued: ``task-shell`` (``/bin/sh`` runs an ``echo``) and
  ``task-python`` (Python prints its progress once a second for 30 s);
* it issues the worker's ``ql3w`` credential into ``<state-dir>/issued/<workerId>.credential``
  (0600 in a 0700 directory; the cluster keeps only its HMAC digest), as a cluster
  operator would hand one over, and never prints it.

Control: ``SIGUSR1`` arms one fault, *commit then drop*: the next ``offers`` request is
processed (the lease is committed) and the connection is then closed without an
answer, so the worker never learns the outcome. A cluster-side cancel (and the clock)
goes through the admin listener on 127.0.0.1 (:mod:`tests.support.cluster_admin`)::

    python3 -m tests.support.cluster_admin --state-dir var/demo/cluster cancel [--run-id R]

SIGTERM/SIGINT stop the server.

Output: one JSON line on stdout when it listens (pid, port, origin, adminOrigin,
credential file); one line per request on stderr; ``<state-dir>/cluster-state.json``
rewritten after every request and admin action (sessions, leases, executions, the
SHA-256 of every offer request body; no secret), ``<state-dir>/cluster-admin.json`` (the
admin origin) and each uploaded log in ``<state-dir>/artifacts/``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import signal
import ssl
import sys
import threading
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: the repo root holds qinglong_edge and tests
    sys.path.insert(0, str(REPO))

from qinglong_edge.contracts.execution_revision import (  # noqa: E402
    EXECUTOR_TYPE,
    PLAN_SCHEMA,
    normalize_execution_revision,
)
from qinglong_edge.contracts.ids import new_uuid4  # noqa: E402
from tests.support.cluster_admin import ADMIN_FILE, AdminListener, write_state  # noqa: E402
from tests.support.cluster_double import ClusterDouble, Exchange, Fault  # noqa: E402
from tests.support.cluster_state import Candidate, compact  # noqa: E402

#: Claim and renewal leases of the demo's cluster (ms).
DEMO_LEASE_MS = 6000
#: The queued Python task: prints its progress once a second for 30 seconds.
PYTHON_PROGRESS = (
    "import time\n"
    "for step in range(1, 31):\n"
    "    print(f'progress {step}/30', flush=True)\n"
    "    time.sleep(1)\n"
)


def progress_task(now_ms: int, project_id: str = "project-1") -> Candidate:
    """A queued attempt of ``task-python`` with a real execution revision and digest."""
    command: dict[str, Any] = {"kind": "argv", "file": "/usr/bin/python3", "args": ["-u", "-c", PYTHON_PROGRESS]}
    source_digest = hashlib.sha256(compact(command)).hexdigest()
    revision = normalize_execution_revision({
        "projectId": project_id,
        "taskId": "task-python",
        "taskRevision": f"qltd:v1:1:{source_digest}",
        "sourceRevision": 1,
        "sourceContentDigest": source_digest,
        "executorType": EXECUTOR_TYPE,
        "planSchema": PLAN_SCHEMA,
        "command": command,
        "environment": [{"name": "PYTHONUNBUFFERED", "kind": "public", "value": "1"}],
        "timeoutMs": 120_000,
        "placement": {"required": {"executors": ["remote-worker"]}},
        "createdAtMs": now_ms,
    }, verify_digest=False)
    candidate = {
        "runId": new_uuid4(), "attemptId": new_uuid4(), "projectId": project_id, "taskId": "task-python",
        "taskRevision": revision["taskRevision"], "priority": 0, "queuedAtMs": now_ms,
        "attemptCreatedAtMs": now_ms, "attemptNumber": 1, "executorType": EXECUTOR_TYPE,
    }
    return Candidate(candidate, revision)


def server_context(pki: pathlib.Path) -> ssl.SSLContext:
    """TLS 1.3 only; presents ``server.pem``; requires a client certificate from ``client-ca``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(pki / "server.pem", pki / "server.key")
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(pki / "client-ca.pem")
    return context


def _write_private(path: pathlib.Path, data: bytes) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    os.replace(temp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="demo/cluster.py", description=__doc__.splitlines()[0])
    parser.add_argument("--pki", required=True, type=pathlib.Path, help="the demo PKI directory")
    parser.add_argument("--state-dir", required=True, type=pathlib.Path, help="where the cluster writes its files")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default: any free one)")
    parser.add_argument("--admin-port", type=int, default=0, help="admin listener port on 127.0.0.1 (default: any)")
    parser.add_argument("--worker-id", default="edge-1")
    args = parser.parse_args(argv)
    state_dir = args.state_dir.resolve()
    issued = state_dir / "issued"
    for directory in (state_dir, issued):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.chmod(0o700)

    lock = threading.Lock()
    offer_requests: list[dict[str, Any]] = []

    def record(exchange: Exchange) -> None:
        status = "no answer (connection dropped)" if exchange.status is None else str(exchange.status)
        print(f"cluster: {exchange.method} {exchange.target} -> {status}"
              + (f" [fault: {exchange.fault}, committed: {exchange.committed}]" if exchange.fault else ""),
              file=sys.stderr, flush=True)
        with lock:
            if exchange.op == "offers":
                offer_requests.append({
                    "bodySha256": hashlib.sha256(exchange.body).hexdigest(),
                    "offerId": json.loads(exchange.body).get("offerId"),
                    "status": exchange.status,
                    "fault": exchange.fault,
                    "committed": exchange.committed,
                })
        dump()

    def dump() -> None:
        with lock:
            write_state(cluster, state_dir, {"offerRequests": offer_requests})

    # Short leases (the reference's are 30 s): the device renews every third of a lease,
    # so a cancel reaches a running job within about 2 s instead of 10.
    cluster = ClusterDouble(worker_id=args.worker_id, credential_id=f"{args.worker_id}.primary", port=args.port,
                            on_exchange=record, lease_duration_ms=DEMO_LEASE_MS, renewal_duration_ms=DEMO_LEASE_MS)
    cluster.server.context = server_context(args.pki)
    cluster.add_task("shell")
    cluster.state.add_candidate(progress_task(cluster.state.clock_ms()))
    credential_file = issued / f"{args.worker_id}.credential"
    _write_private(credential_file, (cluster.token + "\n").encode("ascii"))

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: stop.set())

    def arm_drop(*_: object) -> None:
        cluster.push_fault(Fault.drop("offers"))
        print("cluster: fault armed: the next offers request commits, then the connection drops",
              file=sys.stderr, flush=True)

    signal.signal(signal.SIGUSR1, arm_drop)
    with cluster, AdminListener(cluster, args.admin_port, on_change=dump) as admin:
        _write_private(state_dir / ADMIN_FILE, compact({"origin": admin.origin}) + b"\n")
        print(json.dumps({
            "pid": os.getpid(),
            "port": cluster.port,
            "origin": cluster.origin,
            "adminOrigin": admin.origin,
            "workerId": cluster.worker_id,
            "credentialId": cluster.credential_id,
            "credentialFile": str(credential_file),
            "tasks": [c.candidate["taskId"] for c in cluster.state.candidates],
        }), flush=True)
        while not stop.wait(0.2):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
