"""A QingLong 3.0 cluster double: worker ingress over real TLS 1.3 mutual TLS (tests, demo).

Never shipped in the router package. The HTTP/TLS part is
:class:`tests.support.tls_server.TLSServer` (TLS 1.3 only, server certificate
``server.pem`` for ``localhost``/``127.0.0.1`` chained to ``root-ca``, a client
certificate from ``client-ca`` required); the cluster's behaviour is
:class:`tests.support.cluster_state.ClusterState` (sessions, offers) and its
``execution`` (:mod:`tests.support.cluster_execution`: starting, start-failure, running,
secrets, lease-control, the artifacts stream, completion; fences, replays, deadlines,
cancels and the outcome mapping as the reference cluster does them).

In a test::

    with ClusterDouble(tasks=("shell", "python")) as cluster:
        files = cluster.provision(tmp_path)          # credential, client chain/key, anchor
        config = cluster.agent_config(tmp_path / "state", files, requestTimeoutMs=1000)
        task = cluster.add_command_task("echo $A $KEY", env={"A": "1"}, secrets={"KEY": "s3cr3t"},
                                        timeout_ms=5_000)
        run_id = task.candidate["runId"]
        cluster.push_fault(Fault.drop("lease-control"))   # commits, then drops the answer
        ...
        cluster.request_cancel(run_id)               # the next lease-control: stop_requested{user}
        cluster.advance_clock(6_000)                 # past the deadline: stop_requested{timeout}
        cluster.attempt(run_id).status               # claimed/starting/running/succeeded/...
        cluster.lease_version(run_id), cluster.events(run_id), cluster.artifact(run_id).data
        cluster.completion(run_id)["status"]         # the cluster's outcome mapping
        cluster.fence_reasons("running")             # why each 409 was answered
        cluster.exchanges_for("offers")              # every request, raw body bytes kept

Faults are scripted per request (:mod:`tests.support.cluster_faults`): :meth:`push_fault`
queues them; each applies to the next request of its ``op`` (any route; ``None``: any).

As its own process (the demo)::

    python -m tests.support.cluster_double --state-dir D [--port P] [--admin-port A] [--tasks shell,python]

provisions the worker files under ``D`` (``worker-private/`` 0700 with the
credential, client chain and key 0600; ``anchors/root-ca.pem``), writes
``D/agent-config.json`` (a ``qinglong/edge-agent@v1`` config for this double), starts
the plain-HTTP admin listener on 127.0.0.1 (:mod:`tests.support.cluster_admin`: cancel a
run, move the clock, read the state; its origin in ``D/cluster-admin.json``), prints one
JSON line (port, origin, adminOrigin, certificate fingerprints, file paths) and serves
until SIGTERM/SIGINT, rewriting ``D/cluster-state.json`` (sessions, leases, executions,
request count; no secret, no token) after every request and admin action, and writing
each stored log to ``D/artifacts/<logArtifactId>.log``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import signal
import socket
import ssl
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from qinglong_edge.contracts.credentials import encode_secret
from qinglong_edge.contracts.ids import new_uuid4
from tests.support.cluster_attempts import Attempt, Event, FenceRecord, StoredArtifact
from tests.support.cluster_completion import MAX_ARTIFACT_BODY_BYTES
from tests.support.cluster_faults import Fault, response_bytes
from tests.support.cluster_state import Candidate, ClusterState, compact
from tests.support.cluster_tasks import TASK_KINDS, build_task, command_task
from tests.support.cluster_wire import Clock, wall_ms
from tests.support.tls_server import Action, Close, Request, Respond, TLSServer, cert_path

__all__ = ["TASK_KINDS", "ClusterDouble", "Exchange", "Fault", "build_task", "command_task", "response_bytes"]


@dataclass(frozen=True)
class Exchange:
    """One request as the double saw it and what became of it.

    Attributes:
        op: the route's operation (``register``, ``heartbeat``, ``offers``...) or None.
        body: the raw request body bytes.
        status: the status answered, or None when no complete answer was sent.
        fault: the fault applied (its ``kind``), or None.
        committed: whether the cluster's state changed.
    """

    op: str | None
    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    status: int | None
    fault: str | None
    committed: bool
    connection: int

    def json(self) -> Any:
        return json.loads(self.body)


class ClusterDouble:
    """The double: a TLS 1.3 mTLS server + :class:`ClusterState` + faults + a request log.

    Args:
        worker_id: the worker the provisioned credential belongs to.
        credential_id: its ql3w credential id.
        tasks: task kinds queued at start (``shell``, ``python``).
        port: 0 for any free port.
        clock_ms: the cluster's clock source (ms); the double wraps it in a
            :class:`~tests.support.cluster_wire.Clock` (``advance_clock``/``set_clock``)
            unless it already is one.
        lease_duration_ms: how long a claimed lease runs.
        renewal_duration_ms: what lease-control grants (5 000-600 000, default 30 000 as
            the reference's lease-control service).
        on_exchange: called (outside the lock) after every recorded exchange.
    """

    def __init__(
        self,
        *,
        worker_id: str = "edge-1",
        credential_id: str = "edge-1.primary",
        tasks: Iterable[str] = (),
        port: int = 0,
        clock_ms: Callable[[], int] = wall_ms,
        lease_duration_ms: int = 30_000,
        renewal_duration_ms: int = 30_000,
        on_exchange: Callable[[Exchange], None] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.credential_id = credential_id
        self._clock_source = clock_ms
        self.clock = clock_ms if isinstance(clock_ms, Clock) else Clock(clock_ms)
        self._lease_duration_ms = lease_duration_ms
        self._renewal_duration_ms = renewal_duration_ms
        self._faults: deque[Fault] = deque()
        self._exchanges: list[Exchange] = []
        self._cond = threading.Condition()
        self._on_exchange = on_exchange
        self.reset(tasks)
        self.server = TLSServer(self._handle, identity="server", client_ca="client-ca", head_handler=self._head,
                                short_bodies=True)
        if port:
            _rebind(self.server, port)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> ClusterDouble:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> ClusterDouble:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return int(self.server.port)

    @property
    def origin(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        """The worker's ``ql3w_<credentialId>_<secret>`` (write it only to 0600 files)."""
        return f"ql3w_{self.credential_id}_{self.secret}"

    # -- scripting ---------------------------------------------------------------------------

    def reset(self, tasks: Iterable[str] = ()) -> None:
        """A fresh cluster behind the same server: new pepper, credential secret and state;
        faults and the request log cleared, the clock back to its source (lets a test
        module share one TLS server)."""
        with self._cond:
            if not isinstance(self._clock_source, Clock):
                self.clock = Clock(self._clock_source)
            self.state = ClusterState(os.urandom(32), clock_ms=self.clock, lease_duration_ms=self._lease_duration_ms,
                                      renewal_duration_ms=self._renewal_duration_ms)
            self.secret = encode_secret(os.urandom(32))
            self.state.add_credential(self.credential_id, self.worker_id, self.secret)
            self._faults.clear()
            self._exchanges.clear()
        for kind in tasks:
            self.add_task(kind)

    # -- tasks, secrets ------------------------------------------------------------------------

    def add_task(self, kind: str = "shell", **options: Any) -> Candidate:
        """Queue a task (:func:`tests.support.cluster_tasks.build_task`: ``shell``, ``python``
        or ``custom`` with ``command=``, ``environment=``, ``environment_bundle_ref=``,
        ``timeout_ms=``, ``working_directory=``, ``task_id=``, ``secrets=``)."""
        candidate = build_task(kind, now_ms=self.clock(), **options)
        self.state.add_candidate(candidate)
        return candidate

    def add_command_task(self, command: str | Iterable[str] | dict[str, Any], **options: Any) -> Candidate:
        """Queue a custom task (:func:`tests.support.cluster_tasks.command_task`: a shell
        string, an argv list or a command dict; ``env=``, ``secrets=`` name -> value,
        ``bundle=`` name -> value, ``timeout_ms=``, ``working_directory=``, ``task_id=``)."""
        spec = command if isinstance(command, str | dict) else list(command)
        candidate = command_task(spec, now_ms=self.clock(), **options)
        self.state.add_candidate(candidate)
        return candidate

    def define_secret(self, name: str, value: str, *, project_id: str = "project-1",
                      version: int | None = None) -> str:
        """A project secret the secrets route delivers; returns its ``qlsecret:v1:`` ref."""
        return self.state.execution.define_secret(name, value, project_id=project_id, version=version)

    def define_environment_bundle(self, name: str, entries: Mapping[str, str], *, project_id: str = "project-1",
                                  version: int = 1) -> str:
        """An environment bundle secret; returns its ref (for ``environment_bundle_ref=``)."""
        return self.state.execution.define_environment_bundle(name, entries, project_id=project_id,
                                                              version=version)

    # -- the cluster's side of an execution -----------------------------------------------------

    def advance_clock(self, ms: int) -> int:
        """Move the cluster's clock forward (lease expiry, deadlines); returns the new time."""
        return self.clock.advance(ms)

    def set_clock(self, ms: int) -> None:
        """Freeze the cluster's clock at ``ms`` (``self.clock.release()`` unfreezes)."""
        self.clock.set(ms)

    def now_ms(self) -> int:
        return self.clock()

    def request_cancel(self, run_id: str, reason: str = "user") -> str:
        """An operator (``user``) or the system (``policy``, ``shutdown``, ``reconcile``,
        ``timeout``) cancels a claimed run: ``accepted`` / ``already_requested`` /
        ``already_terminal``. KeyError for a run nobody claimed."""
        return self.state.execution.request_cancel(run_id, reason)

    def attempt(self, run_id: str | None = None, *, attempt_id: str | None = None,
                offer_id: str | None = None) -> Attempt:
        """The cluster's row of a claimed attempt (live: read it, do not change it)."""
        return self.state.execution.attempt(run_id, attempt_id=attempt_id, offer_id=offer_id)

    def lease_version(self, run_id: str) -> int:
        return self.attempt(run_id).lease.version

    def events(self, run_id: str) -> list[Event]:
        return self.state.execution.events(run_id)

    def artifact(self, run_id: str) -> StoredArtifact | None:
        """The stored log (``.data`` bytes, ``.sha256``, ``.truncated``) or None."""
        return self.state.execution.artifact(run_id)

    def completion(self, run_id: str) -> dict[str, Any] | None:
        """The accepted completion: ``status`` (the cluster's mapping), ``errorCode``,
        ``result``, ``artifact``, ``terminalAtMs``; None before one."""
        return self.attempt(run_id).completion

    def fence_reasons(self, op: str | None = None) -> list[FenceRecord]:
        """Every 409 answered (``op``, ``reason``, ``run_id``, ``attempt_id``, ``at_ms``)."""
        return self.state.execution.fence_reasons(op)

    def executions(self) -> dict[str, Any]:
        """A JSON-able view of every claimed attempt by runId (no token, no secret)."""
        return self.state.execution.snapshot()

    # -- scripting ---------------------------------------------------------------------------

    def push_fault(self, *faults: Fault) -> None:
        with self._cond:
            self._faults.extend(faults)

    def pending_faults(self) -> int:
        with self._cond:
            return len(self._faults)

    @property
    def exchanges(self) -> list[Exchange]:
        with self._cond:
            return list(self._exchanges)

    def exchanges_for(self, op: str) -> list[Exchange]:
        return [exchange for exchange in self.exchanges if exchange.op == op]

    def wait_for(self, predicate: Callable[[list[Exchange]], bool], timeout: float = 10.0) -> bool:
        """Wait until ``predicate(exchanges)`` holds (True) or ``timeout`` passes (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self._exchanges), timeout=timeout)

    # -- the worker's side -----------------------------------------------------------------------

    def provision(self, directory: os.PathLike[str] | str) -> dict[str, str]:
        """Write the worker's files under ``directory`` with the modes the agent requires.

        Returns:
            ``credentialFile``, ``certificateFile``, ``privateKeyFile``, ``trustAnchorFile``.
        """
        root = pathlib.Path(directory)
        private = root / "worker-private"
        anchors = root / "anchors"
        for path, mode in ((root, 0o700), (private, 0o700), (anchors, 0o755)):
            path.mkdir(mode=mode, parents=True, exist_ok=True)
            path.chmod(mode)
        files = {
            "credentialFile": (private / "credential", (self.token + "\n").encode(), 0o600),
            "certificateFile": (private / "client.pem", cert_path("client.pem").read_bytes(), 0o600),
            "privateKeyFile": (private / "client.key", cert_path("client.key").read_bytes(), 0o600),
            "trustAnchorFile": (anchors / "root-ca.pem", cert_path("root-ca.pem").read_bytes(), 0o644),
        }
        for path, data, mode in files.values():
            _write_atomically(path, data, mode)
        return {name: str(path) for name, (path, _, _) in files.items()}

    def agent_config(self, state_directory: os.PathLike[str] | str, files: dict[str, str],
                     **worker: Any) -> dict[str, Any]:
        """A ``qinglong/edge-agent@v1`` document for this double; ``worker`` overrides keys."""
        section: dict[str, Any] = {
            "origin": self.origin,
            "workerId": self.worker_id,
            "credentialFile": files["credentialFile"],
            "certificateFile": files["certificateFile"],
            "privateKeyFile": files["privateKeyFile"],
            "trustAnchorFiles": [files["trustAnchorFile"]],
        }
        section.update(worker)
        return {"schema": "qinglong/edge-agent@v1", "profile": "edge",
                "stateDirectory": str(state_directory), "worker": section}

    # -- per request -------------------------------------------------------------------------------

    def _take_fault(self, op: str | None) -> Fault | None:
        with self._cond:
            for fault in self._faults:
                if fault.op is None or fault.op == op:
                    self._faults.remove(fault)
                    return fault
        return None

    def _record(self, request: Request, op: str | None, status: int | None, fault: Fault | None,
                committed: bool) -> None:
        exchange = Exchange(op, request.method, request.target, request.headers, request.body, status,
                            fault.kind if fault else None, committed, request.connection)
        with self._cond:
            self._exchanges.append(exchange)
            self._cond.notify_all()
        if self._on_exchange is not None:
            self._on_exchange(exchange)

    def _head(self, request: Request) -> bytes | Action | None:
        """Refuse an upload whose content-length is over the stream cap before reading it
        (the reference checks it before the body, after route and authentication)."""
        op = _op(request.target)
        length = request.header("content-length") or ""
        if op != "artifacts" or not length.isdigit() or int(length) <= MAX_ARTIFACT_BODY_BYTES:
            return None
        reply = self.state.handle(request.method, request.target, request.headers, None)
        self._record(request, reply.op or op, reply.status, None, False)
        return Respond(response_bytes(reply.status, reply.headers, reply.body), close=True)

    def _handle(self, request: Request) -> bytes | Action:
        op = _op(request.target)
        if not request.complete and op != "artifacts":
            return Close()  # the client left mid-body: nothing to answer (as before)
        fault = self._take_fault(op)
        if fault is not None and not fault.commit:
            status, data = fault.uncommitted(op, new_uuid4())
            self._record(request, op, status, fault, False)
            return Respond(data, close=not request.complete)
        reply = self.state.handle(request.method, request.target, request.headers, request.body,
                                  complete=request.complete)
        if fault is None:
            self._record(request, reply.op or op, reply.status, None, reply.committed)
            return Respond(response_bytes(reply.status, reply.headers, reply.body), close=reply.close)
        sent, answer = fault.committed(op, reply)
        self._record(request, reply.op or op, sent, fault, reply.committed)
        return answer


def _op(target: str) -> str:
    return target.partition("?")[0].rsplit("/", 1)[-1]


def _rebind(server: TLSServer, port: int) -> None:
    """Listen on a fixed port instead of the kernel's choice (process mode, ``--port``)."""
    server._listener.close()  # TLSServer binds port 0; the demo wants a fixed one
    listener = socket.create_server(("127.0.0.1", port))
    listener.settimeout(0.2)
    server._listener = listener
    server.port = port


def _write_atomically(path: pathlib.Path, data: bytes, mode: int) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    os.replace(temp, path)


def _fingerprint(name: str) -> str:
    pem = cert_path(name).read_text()
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()


def main(argv: list[str] | None = None) -> int:
    from tests.support.cluster_admin import ADMIN_FILE, AdminListener, write_private, write_state

    parser = argparse.ArgumentParser(prog="python -m tests.support.cluster_double",
                                     description="QingLong cluster double (worker ingress, TLS 1.3 mTLS)")
    parser.add_argument("--state-dir", required=True, help="where the worker files and state are written")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default: any free one)")
    parser.add_argument("--admin-port", type=int, default=0, help="admin listener port on 127.0.0.1 (default: any)")
    parser.add_argument("--tasks", default="shell,python", help="comma-separated task kinds to queue")
    parser.add_argument("--worker-id", default="edge-1")
    parser.add_argument("--credential-id", default="edge-1.primary")
    args = parser.parse_args(argv)
    state_dir = pathlib.Path(args.state_dir).resolve()
    kinds = [kind for kind in args.tasks.split(",") if kind]
    lock = threading.Lock()

    def dump(_exchange: Exchange | None = None) -> None:
        with lock:
            write_state(cluster, state_dir)

    cluster = ClusterDouble(worker_id=args.worker_id, credential_id=args.credential_id, tasks=kinds,
                            port=args.port, on_exchange=dump)
    files = cluster.provision(state_dir)
    (state_dir / "agent").mkdir(mode=0o700, exist_ok=True)
    config = cluster.agent_config(state_dir / "agent", files)
    _write_atomically(state_dir / "agent-config.json", compact(config) + b"\n", 0o600)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    with cluster, AdminListener(cluster, args.admin_port, on_change=dump) as admin:
        write_private(state_dir / ADMIN_FILE, compact({"origin": admin.origin}) + b"\n")
        dump()
        print(json.dumps({
            "port": cluster.port,
            "origin": cluster.origin,
            "adminOrigin": admin.origin,
            "serverCertificateSha256": _fingerprint("server.pem"),
            "trustAnchorSha256": _fingerprint("root-ca.pem"),
            "clientCaSha256": _fingerprint("client-ca.pem"),
            "workerId": cluster.worker_id,
            "credentialId": cluster.credential_id,
            "tasks": kinds,
            "configFile": str(state_dir / "agent-config.json"),
            **files,
        }), flush=True)
        while not stop.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
