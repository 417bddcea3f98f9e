"""Two-phase admission of a Local API request (local-api.md 2.2 and 2.4; ADR-0372).

Phase 1 (:meth:`Admission.admit`) runs with no byte of the body read, in the
normative order of section 2.2 step 5:

1. authenticate the ``Authorization`` values (:func:`qinglong_edge.local.identity.authenticate`):
   raises -> audit ``authentication_unavailable`` -> 503 ``authentication_unavailable``;
   no principal -> audit ``authentication_rejected`` -> 401 ``authentication_required``;
2. project policy (:func:`qinglong_edge.local.policy.decide`) for the route's permission:
   raises -> audit ``authorization_unavailable`` (subject set, fence null) -> 503
   ``authorization_unavailable``;
3. the durable audit row of the decision (``allowed`` / ``denied`` /
   ``approval_required`` with its reasons and fence). **Any** audit failure, in steps
   1-3, answers 503 ``security_audit_unavailable`` instead of the intended status;
4. ``deny`` -> 403 ``forbidden``; ``require_approval`` -> 403 ``approval_required``;
   for ``run.log.read`` both are 404 ``artifact_not_found`` (the reference at 308aa75).
   An unknown project is ``deny ["project_not_found"]``: 403, audited with the
   requested id (spec README; the audit table has no foreign key);
5. credential/pepper confirm (:func:`qinglong_edge.local.identity.confirm`): any
   change or failure -> 503 ``authentication_unavailable``, not audited.

Requests without a valid credential (no principal at step 1) are charged to the
:class:`~qinglong_edge.local.budget.RequestBudget` before their ``authentication_rejected``
audit row: with no token left the answer is **429** ``rate_limited`` with
``retry-after`` (:class:`RateLimited`), nothing is written, and the refusal is counted
(reason ``credential_missing`` without a credential of the token grammar, else
``authentication_rejected``) for the interval's summary row (spec README, "Decisions for
storage on flash"; our deviation from the reference, which audits every one).

Steps 1-5 run as **one** store operation (one hop through the bounded queue; the
audit row still commits in its own transaction before the confirm); if the queue
refuses that operation (``store_busy``), authentication counts as unavailable and its
audit row is attempted separately, as the reference's separate operations would. The
operation's lock waits add up to at most ``busyTimeoutMs`` (:mod:`qinglong_edge.local.store`):
on a database another process holds locked, authentication fails after that wait, the
audit write then fails at once, and the answer is 503 ``security_audit_unavailable``.

The reference's "signal aborted -> 503 ``request_unavailable``" checks (steps 5.1,
5.6, 5.8) are not reproduced: the server cannot see a client abort without reading
from the socket, which phase 1 must not do; an aborted client simply never reads the
answer.

Phase 2 (:func:`read_json_body`) applies the body rules of section 2.4 in order, from
the head alone until the last possible moment: Transfer-Encoding, one Content-Length,
one Content-Type equal to ``application/json`` after trim and lower-casing, a
canonical length ``^[1-9][0-9]*$``, 413 above 512 bytes (body never read), then
exactly that many bytes, strict UTF-8, one BOM stripped, strict JSON
(:func:`qinglong_edge.contracts.cancellation.decode_local_api_body`).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from qinglong_edge.contracts.cancellation import LOCAL_API_MAX_BODY_BYTES, decode_local_api_body
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.ids import new_uuid4
from qinglong_edge.errors import ApiError, StoreError
from qinglong_edge.local.audit import AuditRecord, record_audit
from qinglong_edge.local.budget import LOOPBACK_PEER, RequestBudget
from qinglong_edge.local.exchange import Exchange
from qinglong_edge.local.http11 import RequestHead
from qinglong_edge.local.identity import Principal, Subject, authenticate, confirm, presents_credential
from qinglong_edge.local.policy import Decision, PolicyFence, decide
from qinglong_edge.local.routes import Route
from qinglong_edge.local.store import Store

__all__ = ["Admission", "Admitted", "RateLimited", "read_json_body"]

_CANONICAL_LENGTH: Final = re.compile(r"[1-9][0-9]*")


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request that passed phase 1.

    Attributes:
        principal: the authenticated caller.
        decision: the ``allow`` decision; its fence is the admission-time fence the
            repositories re-check at commit.
        now_ms: the admission clock (epoch ms).
    """

    principal: Principal
    decision: Decision
    now_ms: int

    @property
    def subject(self) -> Subject:
        return self.principal.subject

    @property
    def fence(self) -> PolicyFence | None:
        return self.decision.fence


class RateLimited(ApiError):
    """429 ``{"code":"rate_limited"}``: no token left for a request without a valid
    credential. ``retry_after_s`` is the ``retry-after`` value (whole seconds, >= 1)."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(429, "rate_limited")
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class _Stage:
    """Where the combined phase-1 store operation stopped.

    ``stop`` is ``""`` (admitted, or a decision to refuse), ``authentication_rejected``,
    ``authentication_unavailable``, ``authorization_unavailable``, ``audit`` (the audit
    write failed), ``confirm`` or ``rate_limited`` (``retry_after_s`` set).
    """

    stop: str
    principal: Principal | None = None
    decision: Decision | None = None
    retry_after_s: int = 0


#: HTTP answers of the stops (section 2.2).
_STOPS: Final = {
    "authentication_rejected": (401, "authentication_required"),
    "authentication_unavailable": (503, "authentication_unavailable"),
    "authorization_unavailable": (503, "authorization_unavailable"),
    "audit": (503, "security_audit_unavailable"),
    "confirm": (503, "authentication_unavailable"),
}


class Admission:
    """Phase 1 of section 2.2 over the Local store.

    Args:
        store: the open store.
        keyring_directory: the pepper keyring directory.
        clock: wall-clock epoch ms (the admission clock; tests pin it).
        store_timeout_s: how long a request waits for a store operation, in seconds.
        budget: the budget of requests without a valid credential (``None``: every
            one is audited, as the reference does).
    """

    def __init__(
        self,
        store: Store,
        keyring_directory: str,
        *,
        clock: Callable[[], int],
        store_timeout_s: float | None = 30.0,
        budget: RequestBudget | None = None,
    ) -> None:
        self._store = store
        self._keyring = keyring_directory
        self._clock = clock
        self._timeout = store_timeout_s
        self._budget = budget

    def admit(self, route: Route, head: RequestHead, request_id: str, peer: str = LOOPBACK_PEER) -> Admitted:
        """Authenticate, authorize, audit and confirm one request.

        Args:
            route: the resolved route (its operation id and project id are audited).
            head: the request head (its raw ``Authorization`` values are used).
            request_id: the ``local:<uuid>`` id, also audited.
            peer: the client's budget key (:func:`qinglong_edge.local.budget.peer_key`).

        Raises:
            RateLimited: 429, no budget left for a request without a valid credential.
            ApiError: 401, 403 or 503 with the exact body of section 2.2.
        """
        now = self._clock()
        authorization = head.values("authorization")
        budget = self._budget

        def audit(
            conn: sqlite3.Connection,
            outcome: str,
            reasons: tuple[str, ...],
            principal: Principal | None,
            fence: PolicyFence | None,
        ) -> bool:
            """Write the audit row; False when it failed (503 wins)."""
            record = AuditRecord(
                event_id=new_uuid4(),
                request_id=request_id,
                operation_id=route.operation_id,
                project_id=route.project_id,
                subject=None if principal is None else principal.subject,
                authentication_id=None if principal is None else principal.authentication_id,
                outcome=outcome,
                reasons=reasons,
                fence=fence,
                occurred_at_ms=now,
            )
            try:
                record_audit(conn, record)
            except StoreError:
                return False
            return True

        def phase_one(conn: sqlite3.Connection) -> _Stage:
            try:
                principal = authenticate(conn, authorization, now, keyring_directory=self._keyring)
            except StoreError:
                ok = audit(conn, "authentication_unavailable", ("authentication_unavailable",), None, None)
                return _Stage("authentication_unavailable" if ok else "audit")
            if principal is None:
                if budget is not None:
                    wait = budget.take(peer)
                    if wait > 0:  # before any durable write: counted for the summary row
                        presented = presents_credential(authorization)
                        budget.refuse("authentication_rejected" if presented else "credential_missing")
                        return _Stage("rate_limited", retry_after_s=RequestBudget.retry_after_s(wait))
                ok = audit(conn, "authentication_rejected", ("authentication_rejected",), None, None)
                return _Stage("authentication_rejected" if ok else "audit")
            try:
                decision = decide(conn, principal.subject, route.project_id, route.permission)
            except StoreError:
                ok = audit(conn, "authorization_unavailable", ("authorization_unavailable",), principal, None)
                return _Stage("authorization_unavailable" if ok else "audit", principal)
            if not audit(conn, decision.audit_outcome, decision.reasons, principal, decision.fence):
                return _Stage("audit", principal, decision)
            if decision.outcome != "allow":
                return _Stage("", principal, decision)
            try:
                confirm(conn, principal.token, principal.credential_fence, self._clock(),
                        keyring_directory=self._keyring)
            except StoreError:
                return _Stage("confirm", principal, decision)
            return _Stage("", principal, decision)

        try:
            stage = self._store.run(phase_one, timeout_s=self._timeout)
        except StoreError as exc:
            # The queue refused the operation (store_busy: nothing ran, nothing waited):
            # authentication is unavailable, and its audit row is attempted on its own,
            # as the reference's separate operations would. After a timeout (the
            # operation waited its time) or a closed store no second operation is
            # tried: the audit row is not known to be written, so the answer is
            # security_audit_unavailable, within one operation's wait.
            written = False
            if exc.code == "store_busy":
                try:
                    written = self._store.run(
                        lambda conn: audit(conn, "authentication_unavailable", ("authentication_unavailable",),
                                           None, None),
                        timeout_s=self._timeout,
                    )
                except StoreError:
                    written = False
            stage = _Stage("authentication_unavailable" if written else "audit")
        if stage.stop == "rate_limited":
            raise RateLimited(stage.retry_after_s)
        if stage.stop:
            status, code = _STOPS[stage.stop]
            raise ApiError(status, code)
        assert stage.principal is not None and stage.decision is not None
        if stage.decision.outcome != "allow" and route.operation_id == "run.log.read":
            # The reference's answer for this route: a refusal looks like a missing log,
            # so the route is no existence oracle (ADR-0377 1); the audit row tells.
            raise ApiError(404, "artifact_not_found")
        if stage.decision.outcome == "deny":
            raise ApiError(403, "forbidden")
        if stage.decision.outcome == "require_approval":
            raise ApiError(403, "approval_required")
        return Admitted(stage.principal, stage.decision, now)


def read_json_body(exchange: Exchange) -> object:
    """Phase 2 for ``bodyMode: json`` (section 2.4, rules in order).

    Returns:
        The decoded JSON value (any type; the route checks its schema).

    Raises:
        ApiError: 400 ``invalid_request_body`` or 413 ``request_body_too_large``.
        BodyReadError: from :meth:`Exchange.read_body` (the server maps it).
    """
    head = exchange.head
    invalid = ApiError(400, "invalid_request_body")
    if head.has_transfer_encoding or head.count("content-length") != 1 or head.count("content-type") != 1:
        raise invalid
    if head.values("content-type")[0].strip(" \t").lower() != "application/json":
        raise invalid
    raw = head.content_length_raw or ""
    if _CANONICAL_LENGTH.fullmatch(raw) is None:
        raise invalid
    size = head.content_length or 0
    if size > LOCAL_API_MAX_BODY_BYTES:
        raise ApiError(413, "request_body_too_large")
    body = exchange.read_body(size)
    try:
        return decode_local_api_body(body)
    except ContractError:
        raise invalid from None
