"""A raw TLS 1.3 client for the worker ingress and the artifact stream (tests only).

The agent's transport (:class:`qinglong_edge.worker.ingress.transport.IngressTransport`) only
posts JSON and never shows an error body; this client sends any bytes with any headers
over a fresh mutual-TLS connection (the committed client certificate) and returns what
came back, the ``{"code":...}`` of an error included. It is how the tests send what the
agent never would: malformed framing, a body shorter than its ``Content-Length`` (the
client half-closes after ``send_bytes`` bytes), or an artifact upload, whose streaming
sender does not exist in the agent yet.

Artifact body (remote-execution.md 3.6): a 4-byte big-endian header length ``H``, ``H``
bytes of header JSON, then the raw log bytes; ``Content-Length`` ``4 + H + N`` exactly,
``Content-Type: application/vnd.qinglong.worker-artifact``.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from dataclasses import dataclass
from typing import Any

from tests.support.cluster_wire import compact
from tests.support.tls_server import cert_path

__all__ = ["ARTIFACT_CONTENT_TYPE", "Answer", "artifact_body", "artifact_header", "client_context", "ingress_path",
           "post"]

ARTIFACT_CONTENT_TYPE = "application/vnd.qinglong.worker-artifact"
ARTIFACT_SCHEMA = "qinglong/remote-worker-artifact-upload@v1"


@dataclass
class Answer:
    """What came back: the status (None when no complete head came), the headers (lower
    case), the body, and the name of the error that ended the exchange, if any."""

    status: int | None
    headers: dict[str, str]
    body: bytes
    error: str | None = None

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def code(self) -> str:
        return str(self.json()["code"])


def ingress_path(op: str, session_id: str, worker_id: str = "edge-1") -> str:
    return f"/api/v3/worker-ingress/workers/{worker_id}/sessions/{session_id}/{op}"


def client_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_verify_locations(cert_path("root-ca.pem"))
    context.load_cert_chain(cert_path("client.pem"), cert_path("client.key"))
    return context


def post(
    port: int,
    target: str,
    body: bytes,
    *,
    authorization: str | None,
    content_type: str | None = "application/json",
    content_length: str | None = "auto",
    headers: dict[str, str] | None = None,
    send_bytes: int | None = None,
    timeout: float = 5.0,
) -> Answer:
    """POST ``body`` on a fresh TLS connection to ``127.0.0.1:port``.

    Args:
        authorization: the whole header value (``Worker ql3w_...``) or None for none.
        content_length: ``auto`` (the body's length), a literal value, or None (no header).
        send_bytes: send only this many body bytes, then half-close (a short body).
    """
    fields: dict[str, str] = {"accept": "application/json"}
    if authorization is not None:
        fields["authorization"] = authorization
    if content_type is not None:
        fields["content-type"] = content_type
    if content_length == "auto":
        fields["content-length"] = str(len(body))
    elif content_length is not None:
        fields["content-length"] = content_length
    fields.update(headers or {})
    head = f"POST {target} HTTP/1.1\r\nHost: localhost:{port}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in fields.items()) + "\r\n"
    payload = body if send_bytes is None else body[:send_bytes]
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
        try:
            with client_context().wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(head.encode("latin-1") + payload)
                if send_bytes is not None:
                    socket.socket.shutdown(tls, socket.SHUT_WR)
                response = http.client.HTTPResponse(tls)  # type: ignore[arg-type,unused-ignore]
                response.begin()
                found = {k.lower(): v for k, v in response.getheaders()}
                try:
                    data = response.read()
                except http.client.IncompleteRead as exc:
                    return Answer(response.status, found, exc.partial, "incomplete")
                return Answer(response.status, found, data)
        except (OSError, http.client.HTTPException) as exc:
            return Answer(None, {}, b"", f"{type(exc).__name__}: {exc}")


def artifact_header(offer: dict[str, Any], log_artifact_id: str, byte_length: int, truncated: bool | None, *,
                    expected_lease_version: int | None = None) -> dict[str, Any]:
    """The upload header of remote-execution.md 3.6 for an offer (keys in the TS order).

    ``offer`` holds ``workerGeneration``, ``projectId``, ``runId``, ``attemptId``,
    ``offerId``, ``leaseGeneration``, ``leaseToken`` and ``leaseVersion``.
    """
    return {
        "schema": ARTIFACT_SCHEMA,
        "workerGeneration": offer["workerGeneration"],
        "projectId": offer["projectId"],
        "runId": offer["runId"],
        "attemptId": offer["attemptId"],
        "offerId": offer["offerId"],
        "leaseGeneration": offer["leaseGeneration"],
        "leaseToken": offer["leaseToken"],
        "expectedLeaseVersion": offer["leaseVersion"] if expected_lease_version is None else expected_lease_version,
        "logArtifactId": log_artifact_id,
        "byteLength": byte_length,
        "truncated": truncated,
    }


def artifact_body(header: dict[str, Any] | bytes, content: bytes) -> bytes:
    """``4-byte BE len(header) || header JSON || content``."""
    encoded = header if isinstance(header, bytes) else compact(header)
    return len(encoded).to_bytes(4, "big") + encoded + content
