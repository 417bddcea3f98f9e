"""A QingLong 3.0 cluster double: worker ingress over real TLS 1.3 mutual TLS (tests, demo).

Never shipped in the router package. The HTTP/TLS part is
:class:`tests.support.tls_server.TLSServer` (TLS 1.3 only, server certificate
``server.pem`` for ``localhost``/``127.0.0.1`` chained to ``root-ca``, a client
certificate from ``client-ca`` required); the cluster's behaviour is
:class:`tests.support.cluster_state.ClusterState` (see there for what is modelled).

In a test::

    with ClusterDouble(tasks=("shell", "python")) as cluster:
        files = cluster.provision(tmp_path)          # credential, client chain/key, anchor
        config = cluster.agent_config(tmp_path / "state", files, requestTimeoutMs=1000)
        cluster.push_fault(Fault.drop())             # the next offers request commits, then
        ...                                          # the connection drops unanswered
        cluster.exchanges_for("offers")              # every request, raw body bytes kept
        cluster.state.leases_by_offer()              # what the cluster committed

Faults are scripted per request: :meth:`ClusterDouble.push_fault` queues them; each
applies to the next request of its ``op`` (``offers`` by default; ``None``: any).
With ``commit=True`` the request is processed first (the cluster committed), then
the answer is lost: ``drop`` (close, no answer), ``error_500`` (answer 500
``internal_error`` instead), ``delay`` (answer after ``delay_s``, past the client's
timeout), ``hang`` (never answer; wait for the client to leave), ``mid_body`` (the
head and half the body, then close), ``garbage`` (200 with a body that is not the
contract). ``Fault.status_answer(429, code, retry_after="30")`` answers a status without
processing the request (``commit=False``), as the authentication shield or a fence
does.

As its own process (the demo)::

    python -m tests.support.cluster_double --state-dir D [--port P] [--tasks shell,python]

provisions the worker files under ``D`` (``worker-private/`` 0700 with the
credential, client chain and key 0600; ``anchors/root-ca.pem``), writes
``D/agent-config.json`` (a ``qinglong/edge-agent@v1`` config for this double), prints
one JSON line (port, origin, certificate fingerprints, file paths) and serves until
SIGTERM/SIGINT, rewriting ``D/cluster-state.json`` (sessions, leases, request count;
no secret) after every request.
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from qinglong_edge.contracts.credentials import encode_secret
from qinglong_edge.contracts.ids import new_uuid4
from tests.support.cluster_state import Candidate, ClusterState, compact, wall_ms
from tests.support.cluster_tasks import TASK_KINDS, build_task
from tests.support.tls_server import Action, Close, Hang, Request, Respond, TLSServer, cert_path

__all__ = ["TASK_KINDS", "ClusterDouble", "Exchange", "Fault", "build_task"]

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 413: "Payload Too Large", 415: "Unsupported Media Type",
            429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable",
            504: "Gateway Timeout"}


@dataclass(frozen=True)
class Fault:
    """One scripted failure (see the module docstring)."""

    kind: str
    op: str | None = "offers"
    commit: bool = True
    status: int = 500
    code: str = "internal_error"
    retry_after: str | None = None
    delay_s: float = 0.0

    @classmethod
    def drop(cls, op: str | None = "offers") -> Fault:
        return cls("drop", op)

    @classmethod
    def error_500(cls, op: str | None = "offers") -> Fault:
        return cls("error_500", op)

    @classmethod
    def delay(cls, delay_s: float, op: str | None = "offers") -> Fault:
        return cls("delay", op, delay_s=delay_s)

    @classmethod
    def hang(cls, op: str | None = "offers") -> Fault:
        return cls("hang", op)

    @classmethod
    def mid_body(cls, op: str | None = "offers") -> Fault:
        return cls("mid_body", op)

    @classmethod
    def garbage(cls, op: str | None = "offers", *, commit: bool = True) -> Fault:
        return cls("garbage", op, commit=commit)

    @classmethod
    def status_answer(cls, status: int, code: str, *, retry_after: str | None = None,
                      op: str | None = "offers") -> Fault:
        """Answer ``status {"code": code}`` without processing the request."""
        return cls("status", op, commit=False, status=status, code=code, retry_after=retry_after)


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


def response_bytes(status: int, headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class ClusterDouble:
    """The double: a TLS 1.3 mTLS server + :class:`ClusterState` + faults + a request log.

    Args:
        worker_id: the worker the provisioned credential belongs to.
        credential_id: its ql3w credential id.
        tasks: task kinds queued at start (``shell``, ``python``).
        port: 0 for any free port.
        clock_ms: the cluster's clock.
        lease_duration_ms: how long a claimed lease runs.
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
        on_exchange: Callable[[Exchange], None] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.credential_id = credential_id
        self._clock_ms = clock_ms
        self._lease_duration_ms = lease_duration_ms
        self._faults: deque[Fault] = deque()
        self._exchanges: list[Exchange] = []
        self._cond = threading.Condition()
        self._on_exchange = on_exchange
        self.reset(tasks)
        self.server = TLSServer(self._handle, identity="server", client_ca="client-ca")
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
        faults and the request log cleared (lets a test module share one TLS server)."""
        with self._cond:
            self.state = ClusterState(os.urandom(32), clock_ms=self._clock_ms,
                                      lease_duration_ms=self._lease_duration_ms)
            self.secret = encode_secret(os.urandom(32))
            self.state.add_credential(self.credential_id, self.worker_id, self.secret)
            self._faults.clear()
            self._exchanges.clear()
        for kind in tasks:
            self.add_task(kind)

    def add_task(self, kind: str, **options: Any) -> Candidate:
        candidate = build_task(kind, now_ms=self.state.clock_ms(), **options)
        self.state.add_candidate(candidate)
        return candidate

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

    def _handle(self, request: Request) -> bytes | Action:
        op = request.target.partition("?")[0].rsplit("/", 1)[-1]
        fault = self._take_fault(op)
        if fault is not None and not fault.commit and fault.kind == "status":
            body = compact({"code": fault.code})
            headers = [("cache-control", "no-store"), ("content-type", "application/json; charset=utf-8"),
                       ("content-length", str(len(body))), ("x-content-type-options", "nosniff"),
                       ("x-request-id", new_uuid4())]
            if fault.retry_after is not None:
                headers.append(("retry-after", fault.retry_after))
            self._record(request, op, fault.status, fault, False)
            return response_bytes(fault.status, headers, body)
        if fault is not None and fault.kind == "garbage" and not fault.commit:
            self._record(request, op, 200, fault, False)
            return _garbage()
        reply = self.state.handle(request.method, request.target, request.headers, request.body)
        data = response_bytes(reply.status, reply.headers, reply.body)
        committed = reply.committed
        if fault is None:
            self._record(request, reply.op or op, reply.status, None, committed)
            return Respond(data, close=reply.close)
        kind = fault.kind
        self._record(request, reply.op or op, 500 if kind == "error_500" else
                     (200 if kind == "garbage" else None), fault, committed)
        if kind == "drop":
            return Close()
        if kind == "hang":
            return Hang()
        if kind == "delay":
            return Respond(data, delay_s=fault.delay_s, close=True)
        if kind == "mid_body":
            return Respond(data[: len(data) - len(reply.body) // 2], close=True)
        if kind == "garbage":
            return _garbage()
        body = compact({"code": "internal_error"})
        return response_bytes(500, [("cache-control", "no-store"),
                                    ("content-type", "application/json; charset=utf-8"),
                                    ("content-length", str(len(body))), ("x-content-type-options", "nosniff"),
                                    ("x-request-id", new_uuid4())], body)


def _garbage() -> bytes:
    body = b'{"schema":"qinglong/remote-execution-offer@v1","status":"offered","offer":'
    return response_bytes(200, [("content-type", "application/json; charset=utf-8"),
                                ("content-length", str(len(body)))], body)


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
    parser = argparse.ArgumentParser(prog="python -m tests.support.cluster_double",
                                     description="QingLong cluster double (worker ingress, TLS 1.3 mTLS)")
    parser.add_argument("--state-dir", required=True, help="where the worker files and state are written")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default: any free one)")
    parser.add_argument("--tasks", default="shell,python", help="comma-separated task kinds to queue")
    parser.add_argument("--worker-id", default="edge-1")
    parser.add_argument("--credential-id", default="edge-1.primary")
    args = parser.parse_args(argv)
    state_dir = pathlib.Path(args.state_dir).resolve()
    kinds = [kind for kind in args.tasks.split(",") if kind]
    lock = threading.Lock()

    def dump(_exchange: Exchange) -> None:
        with lock:
            snapshot = cluster.state.snapshot()
            snapshot["requests"] = len(cluster.exchanges)
            _write_atomically(state_dir / "cluster-state.json", compact(snapshot) + b"\n", 0o600)

    cluster = ClusterDouble(worker_id=args.worker_id, credential_id=args.credential_id, tasks=kinds,
                            port=args.port, on_exchange=dump)
    files = cluster.provision(state_dir)
    (state_dir / "agent").mkdir(mode=0o700, exist_ok=True)
    config = cluster.agent_config(state_dir / "agent", files)
    _write_atomically(state_dir / "agent-config.json", compact(config) + b"\n", 0o600)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    with cluster:
        print(json.dumps({
            "port": cluster.port,
            "origin": cluster.origin,
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
