"""A scripted worker for the cluster double's execution routes (tests only).

:class:`WorkerCalls` registers a session, claims an offer and then makes the seven calls
of remote-execution.md 3 with bodies in the reference worker's key order, built from the
claimed offer (so for the golden fixture they are byte for byte the section 6 vectors).
JSON routes go through the agent's own transport
(:meth:`IngressTransport.post_json <qinglong_edge.worker.ingress.transport.IngressTransport.post_json>`,
real TLS 1.3 mutual TLS, the route's request and response caps); :meth:`WorkerCalls.raw`
and :meth:`WorkerCalls.upload` use :mod:`tests.support.ingress_client`, which shows error
bodies and can send what the agent never would. It tracks the lease version the way a
worker must: every ``renewed``/``stop_requested`` answer moves it to ``leaseVersion``.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from qinglong_edge.contracts.offer import ClaimAuthority, OfferedResponse, claim_request_body, parse_offer_response
from qinglong_edge.contracts.session import capabilities_snapshot, register_request_body
from qinglong_edge.worker.delivery.session import local_capabilities
from qinglong_edge.worker.ingress.transport import IngressTransport
from tests.support.cluster_double import ClusterDouble
from tests.support.cluster_faults import RESPONSE_CAPS
from tests.support.cluster_wire import compact
from tests.support.ingress_client import Answer, artifact_body, artifact_header, ingress_path, post

__all__ = ["SESSION_0", "SESSION_1", "TOKEN", "WorkerCalls", "log_artifact_id", "registered_worker"]

SESSION_0 = "018f0000-0000-7000-8000-000000000000"
SESSION_1 = "018f0000-0000-7000-8000-000000000001"
TOKEN = "worker_generated_lease_capability_0000000000000001"
REQUEST_CAPS = {"starting": 4096, "start-failure": 4096, "running": 4096, "secrets": 65_536, "lease-control": 8192,
                "completion": 16_384, "register": 20_480, "offers": 4096}
DIGEST = "02d449a31fbb267c8f352e9968a79e3e5fc95c1bbeaa502fd6454ebde5a4bedc"


def log_artifact_id(project_id: str, run_id: str, attempt_id: str, offer_id: str) -> str:
    """``wlog-`` + 30 hex of SHA-256 over the ids (remote-execution.md 4.3)."""
    text = "qinglong/worker-log-artifact@v1" + "".join("\0" + part for part in (project_id, run_id, attempt_id,
                                                                                   offer_id))
    return "wlog-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:30]


class WorkerCalls:
    """One worker against a :class:`ClusterDouble` (see the module docstring).

    Args:
        cluster: the running double.
        files: what :meth:`ClusterDouble.provision` wrote.
        request_timeout_ms: the transport's timeout (1 000 - 60 000).
    """

    def __init__(self, cluster: ClusterDouble, files: dict[str, str], *, request_timeout_ms: int = 5000) -> None:
        self.cluster = cluster
        self.transport = IngressTransport(cluster.origin, credential_file=files["credentialFile"],
                                          certificate_file=files["certificateFile"],
                                          private_key_file=files["privateKeyFile"],
                                          trust_anchor_files=[files["trustAnchorFile"]],
                                          request_timeout_ms=request_timeout_ms)
        self.session_id = SESSION_1
        self.generation = 0
        self.offer: dict[str, Any] = {}
        self.version = 0

    def close(self) -> None:
        self.transport.close()

    # -- session and claim ---------------------------------------------------------------------

    def register(self, sessions: tuple[str, ...] = (SESSION_0, SESSION_1)) -> int:
        """Register each session in turn (the last one stays current); its generation."""
        text, digest = capabilities_snapshot(local_capabilities("x86_64"))
        body = register_request_body(capabilities_json=text, capabilities_hash=digest, max_concurrent_runs=4,
                                     available_slots=4, lease_duration_ms=600_000)
        for session_id in sessions:
            answer = json.loads(self.transport.post_json(ingress_path("register", session_id), body,
                                                         max_response_bytes=4096, max_request_bytes=20_480).body)
        self.session_id = sessions[-1]
        self.generation = int(answer["generation"])
        return self.generation

    def claim(self, offer_id: str = "offer-1", token: str = TOKEN) -> dict[str, Any]:
        """Claim the next candidate; the offer (parsed and digest-checked by the agent's parser)."""
        authority = ClaimAuthority(self.cluster.worker_id, self.session_id, self.generation, offer_id, token)
        response = self.transport.post_json(self.path("offers"), claim_request_body(authority),
                                            max_response_bytes=131_072)
        parsed = parse_offer_response(response.body, authority)
        if not isinstance(parsed, OfferedResponse):
            raise AssertionError(f"no offer: idle {parsed.reason}")
        offer = dict(parsed.offer)
        self.offer = {**offer, "leaseToken": token}
        self.version = int(parsed.offer["lease"]["version"])
        return self.offer

    # -- ids -------------------------------------------------------------------------------

    @property
    def run_id(self) -> str:
        return str(self.offer["candidate"]["runId"])

    @property
    def attempt_id(self) -> str:
        return str(self.offer["candidate"]["attemptId"])

    @property
    def project_id(self) -> str:
        return str(self.offer["candidate"]["projectId"])

    @property
    def log_id(self) -> str:
        return log_artifact_id(self.project_id, self.run_id, self.attempt_id, str(self.offer["offerId"]))

    def path(self, op: str) -> str:
        return ingress_path(op, self.session_id, self.cluster.worker_id)

    # -- bodies (the reference worker's key order) -----------------------------------------

    def fence7(self, **changes: Any) -> dict[str, Any]:
        body = {"runId": self.run_id, "attemptId": self.attempt_id, "workerGeneration": self.generation,
                "offerId": self.offer["offerId"], "leaseGeneration": self.offer["lease"]["leaseGeneration"],
                "leaseToken": self.offer["leaseToken"], "expectedLeaseVersion": self.version}
        body.update(changes)
        return body

    def _scoped(self, schema: str, **changes: Any) -> dict[str, Any]:
        fence = self.fence7()
        body = {"schema": schema, "workerGeneration": self.generation, "projectId": self.project_id,
                "runId": fence["runId"], "attemptId": fence["attemptId"], "offerId": fence["offerId"],
                "leaseGeneration": fence["leaseGeneration"], "leaseToken": fence["leaseToken"],
                "expectedLeaseVersion": self.version}
        body.update(changes)
        return body

    def running_body(self, *, handle: str = "ql3lp1.handle", sequence: int = 1, digest: str = DIGEST,
                     log_id: str | None = "default", **changes: Any) -> dict[str, Any]:
        return self.fence7(executorHandle=handle, logArtifactId=self.log_id if log_id == "default" else log_id,
                           callbackSequence=sequence, callbackTokenDigest=digest, **changes)

    def secrets_body(self, **changes: Any) -> dict[str, Any]:
        revision = self.offer["executionRevision"]
        refs: list[str] = []
        for binding in revision["environment"]:
            if binding["kind"] == "secret" and binding["secretRef"] not in refs:
                refs.append(binding["secretRef"])
        fence = self.fence7()
        body = {"schema": "qinglong/remote-secret-delivery@v2", "workerGeneration": self.generation,
                "runId": fence["runId"], "attemptId": fence["attemptId"], "projectId": self.project_id,
                "taskId": revision["taskId"], "taskRevision": revision["taskRevision"],
                "executionDigest": self.offer["executionDigest"], "offerId": fence["offerId"],
                "leaseGeneration": fence["leaseGeneration"], "leaseToken": fence["leaseToken"],
                "expectedLeaseVersion": self.version, "secretRefs": refs,
                "environmentBundleRefs": [revision["environmentBundleRef"]] if "environmentBundleRef" in revision
                else []}
        body.update(changes)
        return body

    def lease_body(self, **changes: Any) -> dict[str, Any]:
        return self._scoped("qinglong/remote-worker-lease-control@v1", **changes)

    def completion_body(self, content: bytes = b"", *, exit_code: int = 0, started: int | None = None,
                        finished: int | None = None, sequence: int = 1, digest: str = DIGEST,
                        truncated: bool | None = False, log_id: str | None = None, **changes: Any) -> dict[str, Any]:
        now = self.cluster.now_ms()
        started = now if started is None else started
        body = self._scoped("qinglong/remote-worker-completion@v1")
        body.update({
            "callbackSequence": sequence, "callbackTokenDigest": digest,
            "result": {"outcome": "succeeded" if exit_code == 0 else "failed", "startedAtMs": started,
                       "finishedAtMs": max(started, now) if finished is None else finished, "exitCode": exit_code},
            "artifact": {"logArtifactId": log_id or self.log_id, "byteLength": len(content),
                         "sha256": hashlib.sha256(content).hexdigest(), "truncated": truncated},
        })
        body.update(changes)
        return body

    def body(self, op: str, **changes: Any) -> dict[str, Any]:
        """The default body of a JSON route: fence7 for starting/start-failure, else the builders."""
        if op in ("starting", "start-failure"):
            return self.fence7(**changes)
        if op == "running":
            return self.running_body(**changes)
        if op == "secrets":
            return self.secrets_body(**changes)
        if op == "lease-control":
            return self.lease_body(**changes)
        if op == "completion":
            return self.completion_body(**changes)
        raise ValueError(op)

    # -- calls ----------------------------------------------------------------------------

    def call(self, op: str, body: dict[str, Any] | bytes | None = None) -> dict[str, Any]:
        """POST through the agent's transport (TransportError on anything but an accepted 200)."""
        data = body if isinstance(body, bytes) else compact(self.body(op) if body is None else body)
        response = self.transport.post_json(self.path(op), data, max_response_bytes=RESPONSE_CAPS[op],
                                            max_request_bytes=REQUEST_CAPS[op])
        answer: dict[str, Any] = json.loads(response.body)
        if op == "lease-control" and answer.get("status") in ("renewed", "stop_requested"):
            self.version = int(answer["leaseVersion"])
        return answer

    def raw(self, op: str, body: dict[str, Any] | bytes | None = None, **options: Any) -> Answer:
        """POST with the raw client (any status, error bodies shown)."""
        data = body if isinstance(body, bytes) else compact(self.body(op) if body is None else body)
        options.setdefault("authorization", f"Worker {self.cluster.token}")
        return post(self.cluster.port, self.path(op), data, **options)

    def renew(self) -> dict[str, Any]:
        return self.call("lease-control")

    def artifact(self, content: bytes, *, truncated: bool | None = False, **header: Any) -> bytes:
        """The artifact body for ``content`` (header fields overridable)."""
        fields = {"workerGeneration": self.generation, "projectId": self.project_id, "runId": self.run_id,
                  "attemptId": self.attempt_id, "offerId": self.offer["offerId"],
                  "leaseGeneration": self.offer["lease"]["leaseGeneration"], "leaseToken": self.offer["leaseToken"],
                  "leaseVersion": self.version}
        values = artifact_header(fields, self.log_id, len(content), truncated)
        values.update(header)
        return artifact_body(values, content)

    def upload(self, content: bytes | None = None, *, body: bytes | None = None, **options: Any) -> Answer:
        """POST artifacts (``body`` raw, else :meth:`artifact` of ``content``)."""
        data = body if body is not None else self.artifact(content or b"")
        options.setdefault("authorization", f"Worker {self.cluster.token}")
        options.setdefault("content_type", "application/vnd.qinglong.worker-artifact")
        return post(self.cluster.port, self.path("artifacts"), data, **options)

    def start(self) -> None:
        """starting (applied) with the current lease version."""
        assert self.call("starting")["status"] == "applied"

    def run(self, **changes: Any) -> dict[str, Any]:
        """starting then running; the running answer."""
        self.start()
        return self.call("running", self.running_body(**changes))


@contextmanager
def registered_worker(cluster: ClusterDouble, directory: pathlib.Path, *,
                      request_timeout_ms: int = 5000) -> Iterator[WorkerCalls]:
    """A :class:`WorkerCalls` with files provisioned under ``directory``, registered
    (:meth:`WorkerCalls.register`); its transport closed after the block."""
    calls = WorkerCalls(cluster, cluster.provision(directory), request_timeout_ms=request_timeout_ms)
    try:
        calls.register()
        yield calls
    finally:
        calls.close()
