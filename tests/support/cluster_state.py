"""The worker-ingress state machine of the cluster double (tests and the demo only).

Sans-IO: :meth:`ClusterState.handle` takes a parsed request (method, target, header
list, raw body bytes) and returns a :class:`Reply` (status, body, headers); the TLS
server around it lives in :mod:`tests.support.cluster_double`. It behaves as the
reference cluster does for the routes the pull cycle uses (offer-delivery.md sections
1.3-1.7, 2, 5.1; reference ``workerIngressPipeline.ts``, ``httpSurface.ts``,
``workerCredentialAuthenticator.ts``, ``remoteWorkerDispatcher.ts``):

Order of checks (first failure answers)::

    path outside /api/v3                     -> 404 not_found
    method outside DELETE/GET/PATCH/POST/PUT -> 405 method_not_allowed (+ Allow)
    non-POST, a query, or no route match     -> 404 worker_route_not_found
    Authorization
      regex-valid but non-canonical secret   -> 503 worker_authentication_unavailable
      missing / malformed / unknown digest /
      inactive / outside notBefore..expires /
      credential worker != path workerId     -> 401 worker_authentication_required
    framing: content-encoding not identity   -> 415 unsupported_content_encoding
             content-length not digits       -> 400 invalid_content_length
             body over max_body_bytes        -> 413 request_too_large (Connection: close)
             media type != application/json  -> 415 unsupported_content_type
             (the part before ';', trimmed, compared case-sensitively)
             not JSON                        -> 400 invalid_json
             empty body (null)               -> 400 invalid_worker_request
    route handler (register / heartbeat / offers; the execution routes starting,
    start-failure, running, secrets, lease-control, completion and the artifacts
    stream are :attr:`ClusterState.execution`, :mod:`tests.support.cluster_execution`,
    which does its own framing for the stream route)

Credentials: only the HMAC digest is stored (``worker_credential_digest`` with the
double's 32-byte pepper), with ``state`` and ``notBeforeAtMs <= now < expiresAtMs``.

Sessions (one current row per worker, 5.1): ``register`` with a new sessionId
replaces the row (generation = previous + 1, or 1; version 0; ``replacedSession``
tells whether a row existed); a register replay with the current sessionId returns
the row unchanged (the response to the first try was lost) when its capabilities,
maxConcurrentRuns and availableSlots are the row's and the session is live, else 409
``worker_session_fenced`` (the reference's ``register``, workerSessionRepository.ts). ``heartbeat`` requires
the current sessionId, the same generation, a status other than offline, an
unexpired lease and ``version == expectedVersion``, else 409 ``worker_session_fenced``;
then version + 1 and the lease is extended to now + leaseDurationMs; a draining
session's ``availableSlots`` is stored as 0 whatever the heartbeat says. ``transition``
(``draining`` | ``offline``; reference ``PostgresWorkerSessionRepository.transition``)
takes the same fence as a heartbeat (current sessionId and generation, ``version ==
expectedVersion``, not offline, lease unexpired; else 409), then version + 1, the
status, ``availableSlots`` 0, and for ``offline`` the lease ends now: so online ->
draining, online -> offline, draining -> offline and draining -> draining (a replay)
are all allowed, and nothing leaves offline but a new registration. Where the
reference is silent the double decides: the granted session lease is
``min(leaseDurationMs, session_lease_cap_ms)`` (the knob lets a test shorten it).

Offers (``claimNext``), keyed by (workerId, offerId):

* a lease already bound to this offerId -> ``lease_recovery`` (same lease,
  placementScore 0, zero stats, truncated false) only if the lease is ``leased``,
  unexpired, its session row is current (same id and generation, online or draining,
  unexpired) and worker/session/generation/token digest all equal the request;
  otherwise 409 ``worker_offer_fenced``;
* the session is missing, another id/generation, not online (draining: the
  reference's ``listAvailable`` has only online rows), expired or has
  ``availableSlots < 1`` -> idle ``worker_unavailable``;
* no candidates -> idle ``no_candidates``; every candidate's plan unavailable ->
  ``plans_unavailable``; none matches placement -> ``no_match``. Placement is the
  reference's ``evaluateRemoteWorkerPlacement`` on the registered capabilities
  (:func:`qinglong_edge.contracts.placement_decision.evaluate_placement`, itself checked
  against vectors derived from the reference: tests/contracts/test_placement_decision.py),
  and the offer's ``placementScore`` is its score;
* else the first matching candidate is claimed: a ``leased`` lease (version 1,
  leaseGeneration 1, expires now + ``lease_duration_ms``) bound to the token digest,
  answered ``new_claim``.

An idle answer stores nothing keyed by the offerId (as the reference: its idle paths
only read, and the offerId is written only by the lease claim's transaction; see
docs/worker/delivery.md "Idle answers and the kept claim"), so the same offerId and token
sent again later are a fresh claim attempt: the worker keeps its claim across idle
answers.

Not modelled: the authentication shield's counters (429/503 come from scripted faults
instead), active leases counted against ``availableSlots``, and ``attestations``
(503 ``worker_ingress_unavailable``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from qinglong_edge.contracts.credentials import WORKER_DIGEST_PREFIX, decode_secret
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.placement import canonical_capabilities
from qinglong_edge.contracts.placement_decision import evaluate_placement
from tests.support.cluster_execution import EXECUTION_OPS, Executions
from tests.support.cluster_wire import (
    MAX_SAFE,
    Failure,
    Reply,
    compact,
    dispatch_id,
    exact_keys,
    header,
    js_int,
    wall_ms,
)

# Older names, kept for the modules that import them from here.
_Failure = Failure
_js_int = js_int
_dispatch_id = dispatch_id
_exact = exact_keys
_header = header
__all__ = ["MAX_SAFE", "Candidate", "ClusterState", "Credential", "LeaseRow", "Reply", "SessionRow", "compact",
           "wall_ms"]
OFFER_SCHEMA = "qinglong/remote-execution-offer@v1"
REGISTER_SCHEMA = "qinglong/worker-session-register@v1"
HEARTBEAT_SCHEMA = "qinglong/worker-session-heartbeat@v1"
TRANSITION_SCHEMA = "qinglong/worker-session-transition@v1"
DEFAULT_MAX_BODY_BYTES = 64 * 1024
DEFAULT_LEASE_DURATION_MS = 30_000

_ROUTE = re.compile(
    r"/api/v3/worker-ingress/workers/([A-Za-z0-9][A-Za-z0-9._:-]{0,127})"
    r"/sessions/([0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12})"
    r"/(register|heartbeat|transition|attestations|offers|starting|running|start-failure|secrets"
    r"|artifacts|completion|lease-control)"
)
_AUTHORIZATION = re.compile(r"Worker ql3w_([A-Za-z0-9][A-Za-z0-9._:-]{0,63})_([A-Za-z0-9_-]{43})")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_LEASE_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
_METHODS = ("DELETE", "GET", "PATCH", "POST", "PUT")


@dataclass
class Credential:
    credential_id: str
    worker_id: str
    digest: str
    state: str = "active"
    not_before_at_ms: int = 0
    expires_at_ms: int = MAX_SAFE


@dataclass
class SessionRow:
    worker_id: str
    session_id: str
    generation: int
    version: int
    status: str
    capabilities: dict[str, Any]
    max_concurrent_runs: int
    available_slots: int
    registered_at_ms: int
    last_heartbeat_at_ms: int
    lease_expires_at_ms: int


@dataclass
class Candidate:
    """A queued attempt with its execution revision (normalized, real digest)."""

    candidate: dict[str, Any]
    revision: dict[str, Any]
    plan_available: bool = True
    placement_score: int = 0
    #: Secret values the task needs (secretRef -> value), registered with the double.
    secrets: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass
class LeaseRow:
    offer_id: str
    status: str
    version: int
    lease_generation: int
    worker_id: str
    worker_session_id: str
    worker_generation: int
    lease_token_digest: str = field(repr=False)
    acquired_at_ms: int
    renewed_at_ms: int
    expires_at_ms: int
    updated_at_ms: int
    source: Candidate = field(repr=False)

    @property
    def run_id(self) -> str:
        return str(self.source.candidate["runId"])

    def projection(self) -> dict[str, int]:
        return {
            "version": self.version,
            "leaseGeneration": self.lease_generation,
            "acquiredAtMs": self.acquired_at_ms,
            "renewedAtMs": self.renewed_at_ms,
            "expiresAtMs": self.expires_at_ms,
            "updatedAtMs": self.updated_at_ms,
        }


class ClusterState:
    """Credentials, sessions, candidates and leases of one double (thread-safe).

    Args:
        pepper: the 32-byte credential pepper.
        clock_ms: the cluster's wall clock (ms).
        lease_duration_ms: how long a claimed lease runs.
        max_body_bytes: the ingress body cap (1 KiB-64 KiB in the reference).
        renewal_duration_ms: what lease-control grants (5 000-600 000; the reference's
            lease-control ``leaseDurationMs`` option, default 30 000, independent of the
            claim's duration).
    """

    def __init__(
        self,
        pepper: bytes,
        *,
        clock_ms: Callable[[], int] = wall_ms,
        lease_duration_ms: int = DEFAULT_LEASE_DURATION_MS,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        renewal_duration_ms: int = DEFAULT_LEASE_DURATION_MS,
    ) -> None:
        if len(pepper) != 32:
            raise ValueError("the pepper is 32 bytes")
        self._pepper = pepper
        self.clock_ms = clock_ms
        self.lease_duration_ms = lease_duration_ms
        self.max_body_bytes = max_body_bytes
        self.session_lease_cap_ms: int | None = None
        self.lock = threading.RLock()
        self.credentials: dict[str, Credential] = {}
        self.sessions: dict[str, SessionRow] = {}
        self.replaced_sessions: list[SessionRow] = []
        self.candidates: list[Candidate] = []
        self.leases: dict[tuple[str, str], LeaseRow] = {}
        self.execution = Executions(self, lease_duration_ms=renewal_duration_ms)

    # -- set-up and knobs ------------------------------------------------------------------

    def add_credential(self, credential_id: str, worker_id: str, secret: str, **fields: Any) -> Credential:
        """Store a credential as the cluster does: its digest, never the secret."""
        message = WORKER_DIGEST_PREFIX + credential_id.encode("utf-8") + b"\x00" + decode_secret(secret)
        digest = hmac.new(self._pepper, message, hashlib.sha256).hexdigest()
        credential = Credential(credential_id, worker_id, digest, **fields)
        with self.lock:
            self.credentials[credential_id] = credential
        return credential

    def add_candidate(self, candidate: Candidate) -> None:
        with self.lock:
            self.candidates.append(candidate)
            self.execution.secret_values.update(candidate.secrets)

    def expire_session(self, worker_id: str) -> None:
        """The session's lease ran out on the cluster (its heartbeats stopped)."""
        with self.lock:
            self.sessions[worker_id].lease_expires_at_ms = self.clock_ms() - 1

    def expire_lease(self, offer_id: str, worker_id: str | None = None) -> None:
        with self.lock:
            self.lease(offer_id, worker_id).expires_at_ms = self.clock_ms() - 1

    def set_lease_status(self, offer_id: str, status: str, worker_id: str | None = None) -> None:
        with self.lock:
            self.lease(offer_id, worker_id).status = status

    def lease(self, offer_id: str, worker_id: str | None = None) -> LeaseRow:
        with self.lock:
            for (worker, offer), row in self.leases.items():
                if offer == offer_id and worker_id in (None, worker):
                    return row
        raise KeyError(offer_id)

    def leases_by_offer(self) -> dict[str, LeaseRow]:
        with self.lock:
            return {offer: row for (_, offer), row in self.leases.items()}

    def snapshot(self) -> dict[str, Any]:
        """A JSON-able view for the demo (digests only, never a secret or token)."""
        with self.lock:
            return {
                "sessions": {w: _session_json(s) for w, s in self.sessions.items()},
                "replacedSessions": len(self.replaced_sessions),
                "candidates": [c.candidate["runId"] for c in self.candidates],
                "leases": {
                    offer: {"runId": row.run_id, "status": row.status, "version": row.version,
                            "workerSessionId": row.worker_session_id, "workerGeneration": row.worker_generation,
                            "expiresAtMs": row.expires_at_ms}
                    for (_, offer), row in self.leases.items()
                },
                "executions": self.execution.snapshot(),
            }

    # -- the request pipeline ----------------------------------------------------------------

    def handle(self, method: str, target: str, headers: tuple[tuple[str, str], ...], body: bytes | None, *,
               complete: bool = True) -> Reply:
        """Answer one request (see the module docstring for the order of checks).

        ``body`` None: the server did not read it (``artifacts`` with a content-length over
        the stream cap); ``complete`` False: the client ended the request early.
        """
        request_id = _header(headers, "x-request-id")
        if request_id is None or _REQUEST_ID.fullmatch(request_id) is None:
            request_id = str(uuid.uuid4())
        op: str | None = None
        close = False
        try:
            path, _, query = target.partition("?")
            if not (path == "/api/v3" or path.startswith("/api/v3/")):
                raise _Failure(404, "not_found")
            if method not in _METHODS:
                raise _Failure(405, "method_not_allowed")
            match = _ROUTE.fullmatch(path)
            if method != "POST" or query or match is None:
                raise _Failure(404, "worker_route_not_found")
            worker_id, session_id, op = match.group(1), match.group(2), match.group(3)
            try:
                self._authenticate(_header(headers, "authorization"), worker_id)
            except _Failure as failure:
                failure.close = op == "artifacts"  # the stream's body is left unread
                raise
            if op == "artifacts":
                answer = self.execution.upload(worker_id, session_id, headers, body, complete=complete)
                return self._reply(200, compact(answer), request_id, op=op, committed=True)
            if body is None:  # not read: only the stream route has a head-time size check
                raise _Failure(413, "request_too_large")
            document = self._read_body(headers, body)
            with self.lock:
                if op == "register":
                    answer = self._register(worker_id, session_id, document)
                elif op == "heartbeat":
                    answer = self._heartbeat(worker_id, session_id, document)
                elif op == "transition":
                    answer = self._transition(worker_id, session_id, document)
                elif op == "offers":
                    answer = self._offers(worker_id, session_id, document)
                elif op in EXECUTION_OPS:
                    answer = self.execution.handle(op, worker_id, session_id, document)
                else:
                    raise _Failure(503, "worker_ingress_unavailable")
            return self._reply(200, compact(answer), request_id, op=op, committed=True)
        except _Failure as failure:
            close = failure.close or failure.code == "request_too_large"
            extra: tuple[tuple[str, str], ...] = ()
            if failure.status == 405:
                extra = (("allow", ", ".join(_METHODS)),)
            return self._reply(failure.status, compact({"code": failure.code}), request_id, extra=extra, close=close,
                               op=op)

    def _reply(
        self, status: int, body: bytes, request_id: str, *, extra: tuple[tuple[str, str], ...] = (),
        close: bool = False, op: str | None = None, committed: bool = False,
    ) -> Reply:
        headers = (
            ("cache-control", "no-store"),
            ("content-type", "application/json; charset=utf-8"),
            ("content-length", str(len(body))),
            ("x-content-type-options", "nosniff"),
            ("x-request-id", request_id),
            *extra,
            *((("connection", "close"),) if close else ()),
        )
        return Reply(status, body, headers, close, op, committed)

    def _authenticate(self, authorization: str | None, worker_id: str) -> Credential:
        match = _AUTHORIZATION.fullmatch(authorization or "")
        if match is None:
            raise _Failure(401, "worker_authentication_required")
        credential_id, secret = match.group(1), match.group(2)
        try:
            raw = decode_secret(secret)
        except ContractError:
            # The reference's digest helper throws inside the authenticator (1.4).
            raise _Failure(503, "worker_authentication_unavailable") from None
        message = WORKER_DIGEST_PREFIX + credential_id.encode("utf-8") + b"\x00" + raw
        digest = hmac.new(self._pepper, message, hashlib.sha256).hexdigest()
        with self.lock:
            credential = self.credentials.get(credential_id)
            now = self.clock_ms()
            if (
                credential is None
                or not hmac.compare_digest(credential.digest, digest)
                or credential.state != "active"
                or not credential.not_before_at_ms <= now < credential.expires_at_ms
                or credential.worker_id != worker_id
            ):
                raise _Failure(401, "worker_authentication_required")
            return credential

    def _read_body(self, headers: tuple[tuple[str, str], ...], body: bytes) -> object:
        encoding = _header(headers, "content-encoding")
        if encoding is not None and encoding.strip().lower() not in ("", "identity"):
            raise _Failure(415, "unsupported_content_encoding")
        length = _header(headers, "content-length")
        if length is not None and not re.fullmatch(r"\d+", length.strip()):
            raise _Failure(400, "invalid_content_length")
        if len(body) > self.max_body_bytes:
            raise _Failure(413, "request_too_large")
        media = (_header(headers, "content-type") or "").split(";", 1)[0].strip()
        if media != "application/json":
            raise _Failure(415, "unsupported_content_type")
        if not body:
            raise _Failure(400, "invalid_worker_request")
        try:
            text = body.decode("utf-8", errors="replace")  # Node replaces, never fails
            return json.loads(text.removeprefix("\ufeff"))
        except ValueError:
            raise _Failure(400, "invalid_json") from None

    # -- sessions (5.1) ------------------------------------------------------------------------

    def _register(self, worker_id: str, session_id: str, document: object) -> dict[str, Any]:
        body = _exact(document, ("schema", "capabilitiesJson", "capabilitiesHash", "maxConcurrentRuns",
                                 "availableSlots", "leaseDurationMs"))
        try:
            if body["schema"] != REGISTER_SCHEMA:
                raise TypeError("schema")
            text, digest = body["capabilitiesJson"], body["capabilitiesHash"]
            if not isinstance(text, str) or not isinstance(digest, str) or not 2 <= len(text.encode()) <= 16384:
                raise TypeError("capabilities")
            capabilities, canonical, canonical_digest = canonical_capabilities(json.loads(text))
            if canonical != text or canonical_digest != digest:
                raise TypeError("capabilities not canonical")
            max_runs = _js_int(body["maxConcurrentRuns"], 1, 1024)
            slots = _js_int(body["availableSlots"], 0, max_runs)
            lease_ms = _js_int(body["leaseDurationMs"], 5000, 600_000)
        except (TypeError, ValueError, ContractError):
            raise _Failure(400, "invalid_worker_request") from None
        now = self.clock_ms()
        current = self.sessions.get(worker_id)
        if current is not None and current.session_id == session_id:
            # A replay (the answer to the first try was lost, or the worker lost its session
            # record): the row unchanged, only for the same snapshot and a live session
            # (PostgresWorkerSessionRepository.register: else WorkerSessionConflictError or
            # WorkerSessionFenceRejectedError, both 409 worker_session_fenced).
            if (current.capabilities != capabilities or current.max_concurrent_runs != max_runs
                    or current.available_slots != slots or current.status == "offline"
                    or current.lease_expires_at_ms <= now):
                raise _Failure(409, "worker_session_fenced")
            return _session_json(current, REGISTER_SCHEMA, replaced=False)
        if current is not None:
            self.replaced_sessions.append(current)
        row = SessionRow(
            worker_id=worker_id, session_id=session_id, generation=(current.generation + 1) if current else 1,
            version=0, status="online", capabilities=capabilities, max_concurrent_runs=max_runs,
            available_slots=slots, registered_at_ms=now, last_heartbeat_at_ms=now,
            lease_expires_at_ms=now + self._granted(lease_ms),
        )
        self.sessions[worker_id] = row
        return _session_json(row, REGISTER_SCHEMA, replaced=current is not None)

    def _granted(self, lease_ms: int) -> int:
        return lease_ms if self.session_lease_cap_ms is None else min(lease_ms, self.session_lease_cap_ms)

    def _heartbeat(self, worker_id: str, session_id: str, document: object) -> dict[str, Any]:
        body = _exact(document, ("schema", "generation", "expectedVersion", "availableSlots", "leaseDurationMs"))
        try:
            if body["schema"] != HEARTBEAT_SCHEMA:
                raise TypeError("schema")
            generation = _js_int(body["generation"], 1)
            expected = _js_int(body["expectedVersion"])
            slots = _js_int(body["availableSlots"], 0, 1024)
            lease_ms = _js_int(body["leaseDurationMs"], 5000, 600_000)
        except TypeError:
            raise _Failure(400, "invalid_worker_request") from None
        now = self.clock_ms()
        row = self._unfenced(worker_id, session_id, generation, expected, now)
        if slots > row.max_concurrent_runs:
            raise _Failure(400, "invalid_worker_request")
        row.version += 1
        row.available_slots = slots if row.status == "online" else 0
        row.last_heartbeat_at_ms = now
        row.lease_expires_at_ms = now + self._granted(lease_ms)
        return _session_json(row, HEARTBEAT_SCHEMA)

    def _unfenced(self, worker_id: str, session_id: str, generation: int, expected: int, now: int) -> SessionRow:
        """The worker's session row if the call's session, generation and expected version
        are its own and it is live (not offline, lease unexpired); else 409
        ``worker_session_fenced`` (heartbeat and transition alike)."""
        row = self.sessions.get(worker_id)
        if (
            row is None
            or row.session_id != session_id
            or row.generation != generation
            or row.status == "offline"
            or row.lease_expires_at_ms <= now
            or row.version != expected
        ):
            raise _Failure(409, "worker_session_fenced")
        return row

    def _transition(self, worker_id: str, session_id: str, document: object) -> dict[str, Any]:
        body = _exact(document, ("schema", "generation", "expectedVersion", "status"))
        try:
            if body["schema"] != TRANSITION_SCHEMA or body["status"] not in ("draining", "offline"):
                raise TypeError("schema or status")
            generation = _js_int(body["generation"], 1)
            expected = _js_int(body["expectedVersion"])
        except TypeError:
            raise _Failure(400, "invalid_worker_request") from None
        now = self.clock_ms()
        row = self._unfenced(worker_id, session_id, generation, expected, now)
        row.version += 1
        row.status = str(body["status"])
        row.available_slots = 0
        if row.status == "offline":
            row.lease_expires_at_ms = now
        return _session_json(row, TRANSITION_SCHEMA)

    # -- offers (2, claimNext) -------------------------------------------------------------------

    def _session_current(self, worker_id: str, session_id: str, generation: int, now: int,
                         statuses: tuple[str, ...]) -> SessionRow | None:
        row = self.sessions.get(worker_id)
        if (
            row is None
            or row.session_id != session_id
            or row.generation != generation
            or row.status not in statuses
            or row.lease_expires_at_ms <= now
        ):
            return None
        return row

    def _offers(self, worker_id: str, session_id: str, document: object) -> dict[str, Any]:
        body = _exact(document, ("workerGeneration", "offerId", "leaseToken"))
        try:
            generation = _js_int(body["workerGeneration"], 1)
            offer_id = _dispatch_id(body["offerId"])
            token = body["leaseToken"]
            if not isinstance(token, str) or not 32 <= len(token) <= 128 or not _LEASE_TOKEN.fullmatch(token):
                raise TypeError("leaseToken")
        except TypeError:
            raise _Failure(400, "invalid_worker_request") from None
        now = self.clock_ms()
        token_digest = hashlib.sha256(token.encode("utf-8")).hexdigest()
        existing = self.leases.get((worker_id, offer_id))
        if existing is not None:
            return self._recover(existing, (worker_id, session_id, generation), token_digest, now)
        row = self._session_current(worker_id, session_id, generation, now, ("online",))
        if row is None or row.available_slots < 1:
            return _idle("worker_unavailable", _stats())
        if not self.candidates:
            return _idle("no_candidates", _stats(pages=1))
        page = self.candidates[:8]
        planned = [c for c in page if c.plan_available]
        if not planned:
            return _idle("plans_unavailable", _stats(pages=1, candidates=len(page), plans=len(page)))
        scores = {id(c): _placement_score(c.revision, row.capabilities) for c in planned}
        matching = [c for c in planned if scores[id(c)] is not None]
        mismatches = len(planned) - len(matching)
        if not matching:
            return _idle("no_match", _stats(pages=1, candidates=len(page), plans=len(page) - len(planned),
                                            mismatches=mismatches))
        chosen = matching[0]
        self.candidates.remove(chosen)
        lease = LeaseRow(
            offer_id=offer_id, status="leased", version=1, lease_generation=1, worker_id=worker_id,
            worker_session_id=session_id, worker_generation=generation, lease_token_digest=token_digest,
            acquired_at_ms=now, renewed_at_ms=now, expires_at_ms=now + self.lease_duration_ms,
            updated_at_ms=now, source=chosen,
        )
        self.leases[(worker_id, offer_id)] = lease
        stats = _stats(pages=1, candidates=len(page), plans=len(page) - len(planned), mismatches=mismatches,
                       attempts=1)
        return _offered(lease, "new_claim", scores[id(chosen)] or chosen.placement_score, stats)

    def _recover(self, lease: LeaseRow, request: tuple[str, str, int], token_digest: str,
                 now: int) -> dict[str, Any]:
        worker_id, session_id, generation = request
        current = self._session_current(worker_id, lease.worker_session_id, lease.worker_generation, now,
                                        ("online", "draining"))
        if (
            lease.status != "leased"
            or lease.expires_at_ms <= now
            or current is None
            or (lease.worker_id, lease.worker_session_id, lease.worker_generation)
            != (worker_id, session_id, generation)
            or not hmac.compare_digest(lease.lease_token_digest, token_digest)
        ):
            raise _Failure(409, "worker_offer_fenced")
        return _offered(lease, "lease_recovery", 0, _stats())


def _session_json(row: SessionRow, schema: str | None = None, *, replaced: bool | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {} if schema is None else {"schema": schema}
    out.update({
        "workerId": row.worker_id,
        "sessionId": row.session_id,
        "generation": row.generation,
        "version": row.version,
        "status": row.status,
        "leaseExpiresAtMs": row.lease_expires_at_ms,
    })
    if replaced is not None:
        out["replacedSession"] = replaced
    return out


def _stats(*, pages: int = 0, candidates: int = 0, plans: int = 0, mismatches: int = 0,
           attempts: int = 0) -> dict[str, int]:
    return {
        "pages": pages,
        "candidates": candidates,
        "plansUnavailable": plans,
        "placementMismatches": mismatches,
        "claimAttempts": attempts,
        "claimRaces": 0,
    }


def _idle(reason: str, stats: dict[str, int]) -> dict[str, Any]:
    return {"schema": OFFER_SCHEMA, "status": "idle", "reason": reason, "stats": stats, "truncated": False}


def _offered(lease: LeaseRow, kind: str, score: int, stats: dict[str, int]) -> dict[str, Any]:
    revision = lease.source.revision
    return {
        "schema": OFFER_SCHEMA,
        "status": "offered",
        "offer": {
            "offerId": lease.offer_id,
            "deliveryKind": kind,
            "executionDigest": revision["contentDigest"],
            "candidate": lease.source.candidate,
            "worker": {"workerId": lease.worker_id, "sessionId": lease.worker_session_id,
                       "generation": lease.worker_generation},
            "lease": lease.projection(),
            "executionRevision": revision,
            "placementScore": score,
        },
        "stats": stats,
        "truncated": False,
    }


def _placement_score(revision: dict[str, Any], capabilities: dict[str, Any]) -> int | None:
    """The reference's placement decision for this revision here: its score, or None when
    it does not match (the session's availability is checked by the caller)."""
    decision = evaluate_placement(capabilities, revision.get("placement"))
    return decision.score if decision.matches else None
