"""Scripted faults of the cluster double, for every route (tests and the demo only).

A :class:`Fault` applies to the next request of its ``op`` (any route name: ``offers``,
``register``, ``starting``, ``start-failure``, ``running``, ``secrets``,
``lease-control``, ``artifacts``, ``completion``...; None: the next request of any
route), queued with :meth:`ClusterDouble.push_fault`.

Not committed (the request is not processed; the cluster state is unchanged):

* ``Fault.status_answer(status, code, retry_after=...)``: ``status {"code": code}``, as
  the authentication shield, admission control or an unavailable store answers;
  ``Fault.unavailable(op, retry_after="1")`` is the 503 ``worker_ingress_unavailable``
  with ``Retry-After`` of section 3;
* ``Fault.garbage(op, commit=False)``.

Committed (the request is processed first, so the cluster changed; then the answer is
lost or spoiled):

==================  ====================================================================
``drop``            the connection closes, no answer
``error_500``       500 ``internal_error`` instead of the answer
``delay``           the answer after ``delay_s`` (past the client's timeout), then close
``hang``            no answer; the connection stays open until the client leaves
``mid_body``        the head and half the body, then close (a truncated answer)
``garbage``         200 with a body that is not JSON (cut after the schema)
``wrong_type``      200, the real body, ``Content-Type: text/plain; charset=utf-8``
``oversized``       200, the real JSON padded with spaces to one byte over the route's
                    response cap (:data:`RESPONSE_CAPS`), an honest Content-Length
                    (``declared=False``: none, the body ends with the connection)
``wrong_echo``      200 with the real answer edited: ``Fault.wrong_echo(op,
                    leaseVersion=9)``, ``Fault.wrong_echo("starting",
                    snapshot={"runId": "other"})`` (dicts merge; :data:`DELETE` removes
                    a key), or ``edit=callable(answer) -> answer``
==================  ====================================================================

A spoiled answer to a request the cluster refused (a 409, say) spoils that refusal.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.support.cluster_wire import Reply, compact
from tests.support.tls_server import Action, Close, Hang, Respond

__all__ = ["DELETE", "RESPONSE_CAPS", "Fault", "response_bytes"]

#: The worker's response cap per route (bytes): offer-delivery.md 1.6, 5; remote-execution.md 3.
RESPONSE_CAPS = {
    "offers": 131_072, "register": 4096, "heartbeat": 4096, "transition": 4096, "starting": 16_384,
    "start-failure": 16_384, "running": 16_384, "secrets": 262_144, "lease-control": 4096,
    "artifacts": 4096, "completion": 4096,
}
_SCHEMAS = {
    "offers": "qinglong/remote-execution-offer@v1", "register": "qinglong/worker-session-register@v1",
    "heartbeat": "qinglong/worker-session-heartbeat@v1", "starting": "qinglong/remote-run-activation@v1",
    "start-failure": "qinglong/remote-run-activation@v1", "running": "qinglong/remote-run-activation@v1",
    "secrets": "qinglong/remote-secret-delivery@v2", "lease-control": "qinglong/remote-worker-lease-control@v1",
    "artifacts": "qinglong/remote-worker-artifact-upload@v1", "completion": "qinglong/remote-worker-completion@v1",
}
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 413: "Payload Too Large", 415: "Unsupported Media Type",
            429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable",
            504: "Gateway Timeout"}


class _Delete:
    def __repr__(self) -> str:
        return "DELETE"


#: In ``Fault.wrong_echo`` changes: remove this key from the answer.
DELETE: Any = _Delete()


def response_bytes(status: int, headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _json_headers(body: bytes, request_id: str, *, content_type: str = "application/json; charset=utf-8",
                  extra: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    return [("cache-control", "no-store"), ("content-type", content_type), ("content-length", str(len(body))),
            ("x-content-type-options", "nosniff"), ("x-request-id", request_id), *extra]


def _merge(answer: Any, changes: dict[str, Any]) -> Any:
    out = dict(answer)
    for key, value in changes.items():
        if value is DELETE:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


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
    changes: dict[str, Any] = field(default_factory=dict)
    edit: Callable[[Any], Any] | None = None
    declared: bool = True

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
    def wrong_type(cls, op: str | None = "offers") -> Fault:
        return cls("wrong_type", op)

    @classmethod
    def oversized(cls, op: str | None = "offers", *, declared: bool = True) -> Fault:
        """One byte over the route's cap; ``declared=False``: no Content-Length, the body
        runs to the end of the connection (the client must count it as it streams)."""
        return cls("oversized", op, declared=declared)

    @classmethod
    def wrong_echo(cls, op: str | None = "offers", *, edit: Callable[[Any], Any] | None = None,
                   **changes: Any) -> Fault:
        """The real answer with ``changes`` merged in (or passed through ``edit``)."""
        return cls("wrong_echo", op, changes=changes, edit=edit)

    @classmethod
    def status_answer(cls, status: int, code: str, *, retry_after: str | None = None,
                      op: str | None = "offers") -> Fault:
        """Answer ``status {"code": code}`` without processing the request."""
        return cls("status", op, commit=False, status=status, code=code, retry_after=retry_after)

    @classmethod
    def unavailable(cls, op: str | None = "offers", *, retry_after: str | None = "1",
                    code: str = "worker_ingress_unavailable") -> Fault:
        """503 with ``Retry-After`` (seconds), not processed."""
        return cls.status_answer(503, code, retry_after=retry_after, op=op)

    # -- applying it ---------------------------------------------------------------------

    def uncommitted(self, op: str | None, request_id: str) -> tuple[int, bytes]:
        """The answer of a fault that does not process the request: (status, bytes)."""
        if self.kind == "garbage":
            return 200, _garbage(op, request_id)
        body = compact({"code": self.code})
        extra = [("retry-after", self.retry_after)] if self.retry_after is not None else []
        return self.status, response_bytes(self.status, _json_headers(body, request_id, extra=extra), body)

    def committed(self, op: str | None, reply: Reply) -> tuple[int | None, bytes | Action]:
        """What replaces ``reply`` (already committed): (status sent or None, answer)."""
        request_id = dict(reply.headers).get("x-request-id", "req")
        data = response_bytes(reply.status, reply.headers, reply.body)
        kind = self.kind
        if kind == "drop":
            return None, Close()
        if kind == "hang":
            return None, Hang()
        if kind == "delay":
            return reply.status, Respond(data, delay_s=self.delay_s, close=True)
        if kind == "mid_body":
            return None, Respond(data[: len(data) - max(1, len(reply.body) // 2)], close=True)
        if kind == "garbage":
            return 200, _garbage(op, request_id)
        if kind == "wrong_type":
            return 200, Respond(response_bytes(200, _json_headers(reply.body, request_id,
                                                                  content_type="text/plain; charset=utf-8"),
                                               reply.body), close=reply.close)
        if kind == "oversized":
            cap = RESPONSE_CAPS.get(op or "", 256 * 1024)
            body = reply.body + b" " * max(0, cap + 1 - len(reply.body))
            headers = _json_headers(body, request_id)
            if not self.declared:
                headers = [(k, v) for k, v in headers if k != "content-length"] + [("connection", "close")]
                return 200, Respond(response_bytes(200, headers, body), close=True)
            return 200, Respond(response_bytes(200, headers, body), close=reply.close)
        if kind == "wrong_echo":
            answer = json.loads(reply.body)
            answer = self.edit(answer) if self.edit is not None else _merge(answer, self.changes)
            body = compact(answer)
            return 200, Respond(response_bytes(200, _json_headers(body, request_id), body), close=reply.close)
        body = compact({"code": "internal_error"})
        return 500, response_bytes(500, _json_headers(body, request_id), body)


def _garbage(op: str | None, request_id: str) -> bytes:
    schema = _SCHEMAS.get(op or "", "qinglong/unknown@v1")
    body = b'{"schema":"' + schema.encode() + b'","status":'
    return response_bytes(200, _json_headers(body, request_id), body)
