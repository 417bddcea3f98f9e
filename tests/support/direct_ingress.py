"""The cluster double's state machine called in-process, for unit tests of the session
keeper and the pull coordinator (no TLS, no sockets).

Every non-200 answer becomes a :class:`~qinglong_edge.errors.TransportError` carrying
only the HTTP status, the parsed ``Retry-After`` and the answer's ``code``
(``cluster_code``), as the real transport reports it (offer-delivery.md 1.6: never the
body). The end-to-end tests use the real transport over TLS instead
(tests/cli/test_pull_cli.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from qinglong_edge.contracts.credentials import encode_secret
from qinglong_edge.errors import TransportError
from tests.support.cluster_state import ClusterState

__all__ = ["DirectIngress", "Response"]


@dataclass
class Response:
    body: bytes


class DirectIngress:
    """The cluster state called in-process, with TransportError for every non-200
    (as the real transport reports it: status and Retry-After, never the body).

    ``script`` holds per-call overrides: an exception to raise instead of calling the
    cluster, or ``"commit_then_lose"`` to let the cluster commit and raise afterwards.
    """

    def __init__(self, state: ClusterState, worker_id: str = "edge-1", credential_id: str = "edge-1.primary") -> None:
        self.state = state
        self.secret = encode_secret(os.urandom(32))
        state.add_credential(credential_id, worker_id, self.secret)
        self.authorization = f"Worker ql3w_{credential_id}_{self.secret}"
        self.calls: list[tuple[str, bytes]] = []
        self.script: list[BaseException | str] = []

    def post_json(self, path: str, body: bytes, *, max_response_bytes: int, max_request_bytes: int = 4096) -> Response:
        assert len(body) <= max_request_bytes
        self.calls.append((path, body))
        step = self.script.pop(0) if self.script else None
        if isinstance(step, BaseException):
            raise step
        headers = (("authorization", self.authorization), ("content-type", "application/json"),
                   ("content-length", str(len(body))))
        reply = self.state.handle("POST", path, headers, body)
        if step == "commit_then_lose":
            raise TransportError("response lost", code="request_rejected")
        if reply.status != 200:
            retry = dict(reply.headers).get("retry-after")
            code = json.loads(reply.body).get("code") if reply.body else None
            raise TransportError(f"HTTP {reply.status}", code="response_rejected", http_status=reply.status,
                                 retry_after_ms=int(retry) * 1000 if retry else None, cluster_code=code)
        assert len(reply.body) <= max_response_bytes
        return Response(reply.body)

    def offer_calls(self) -> list[bytes]:
        return [body for path, body in self.calls if path.endswith("/offers")]
