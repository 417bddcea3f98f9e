"""The Local API application: route, admit, body, handler (local-api.md 2.2, 6, 9, 9.5).

:class:`LocalApi` is the callable :class:`qinglong_edge.local.server.Server` runs on a
worker thread for every request:

1. :func:`qinglong_edge.local.routes.resolve`: 404 ``route_not_found`` / 400 query
   codes, before authentication and never audited;
2. :meth:`qinglong_edge.local.admission.Admission.admit`: 401 / 403 / 503, audited;
3. the body: GET routes answer a body with 400 ``invalid_request_body`` (after the
   ``allowed`` audit row, never parsed); POST routes run
   :func:`qinglong_edge.local.admission.read_json_body`;
4. the handler: the run readers, the cancellation transaction or task.start, through
   the store queue; bodies built by :mod:`qinglong_edge.contracts.cancellation`.

Error bodies per route (section 1.3, 9, 9.5):

==============  =====================  ============================================
route           404                    409 / 503
==============  =====================  ============================================
run.get/events  ``run_not_found``      503 ``run_query_unavailable`` / ``run_event_list_unavailable``
run.steps.list  ``run_not_found``      503 ``run_step_list_unavailable``
run.list        -                      503 ``run_list_unavailable``
run.cancel      ``run_not_found``      409 ``run_cancellation_fence_rejected`` + reason;
                                       503 ``run_cancellation_unavailable``
task.start      ``task_not_found``     409 ``task_start_fence_rejected`` + reason;
                                       503 ``task_start_unavailable``
run.log.read    ``artifact_not_found`` 202 pending, 410 retired; 503 ``artifact_unavailable``
                                       (:mod:`qinglong_edge.local.log_read`)
task.list/get   ``task_not_found``     503 ``task_list_unavailable`` / ``task_query_unavailable``
edge.worker.get -                      503 ``worker_status_unavailable`` (ours)
==============  =====================  ============================================

Before routing, ``public`` (:mod:`qinglong_edge.local.public`) answers the status
console's assets and ``/metrics`` when ``serve`` turned them on.

A ``run.get`` body includes ``latestAttempt`` (the later reference, 57953ec8; the store's
default).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol, TypeVar

from qinglong_edge.contracts.cancellation import (
    RUN_CANCELLATION_SCHEMA,
    TASK_START_SCHEMA,
    parse_run_cancellation_request,
    parse_task_start_request,
    run_cancellation_result,
    task_start_result,
)
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.ids import new_uuid4
from qinglong_edge.contracts.log_read import DEFAULT_READ_BYTES
from qinglong_edge.errors import ApiError, StoreError
from qinglong_edge.local import runs
from qinglong_edge.local.admission import Admission, Admitted, RateLimited, read_json_body
from qinglong_edge.local.audit import record_refusal_summaries
from qinglong_edge.local.budget import RequestBudget
from qinglong_edge.local.exchange import Exchange, Response
from qinglong_edge.local.http11 import RequestHead
from qinglong_edge.local.identity import presents_credential
from qinglong_edge.local.log_read import LogReader
from qinglong_edge.local.metrics import ApiMetrics
from qinglong_edge.local.policy import PolicyFence
from qinglong_edge.local.routes import Route, resolve
from qinglong_edge.local.store import Store, now_ms
from qinglong_edge.local.task_reader import get_task_body, list_tasks_body
from qinglong_edge.local.tasks import TaskNotFound
from qinglong_edge.local.worker_status import WORKER_STATUS_SCHEMA


class PublicRoutes(Protocol):
    """Requests answered before routing, without a credential or an audit row: the
    status console's assets and ``/metrics`` (:mod:`qinglong_edge.local.public`)."""

    def answer(self, head: RequestHead) -> Response | None:
        """The response, or None when the request is not one of them."""


class _MutationOutcome(Protocol):
    """What :meth:`LocalApi._commit` reads of a mutation's outcome (``runs.*Outcome``)."""

    @property
    def status(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def http_status(self) -> int: ...


_Outcome = TypeVar("_Outcome", bound=_MutationOutcome)


__all__ = ["UNAVAILABLE_CODES", "WORKER_STATUS_SCHEMA", "IntentHook", "LocalApi", "PublicRoutes"]

_log = logging.getLogger("qinglong_edge.local.api")


#: 503 code of each route when its storage or projection fails (sections 1.3, 9, 9.5).
UNAVAILABLE_CODES: Final[Mapping[str, str]] = {
    "run.list": "run_list_unavailable",
    "run.get": "run_query_unavailable",
    "run.events.list": "run_event_list_unavailable",
    "run.steps.list": "run_step_list_unavailable",
    "run.cancel": "run_cancellation_unavailable",
    "task.start": "task_start_unavailable",
    "run.log.read": "artifact_unavailable",
    "task.list": "task_list_unavailable",
    "task.get": "task_query_unavailable",
    "edge.worker.get": "worker_status_unavailable",
}

#: Called after a durable intent commits: ``(operation_id, run_id)`` with
#: ``("run.cancel", runId)`` for a new cancel intent (202) and ``("task.start", runId)``
#: for a newly created Run (202). The execution controller uses it as a wake-up;
#: it must not block (it runs on a server worker thread).
IntentHook = Callable[[str, str], None]


class LocalApi:
    """The Local API application handed to :class:`qinglong_edge.local.server.Server`.

    For each request: :func:`resolve` (404/400 before authentication), then
    :meth:`Admission.admit` (401/403/503, audited), then the body phase (GET: a body
    is 400 ``invalid_request_body``; POST: :func:`read_json_body`), then the handler.

    Args:
        store: the open Local store.
        keyring_directory: the pepper keyring directory.
        clock: wall-clock epoch ms for admission, audit and the repositories
            (default :func:`qinglong_edge.local.store.now_ms`; tests pin it).
        on_intent: see :data:`IntentHook`; exceptions it raises are logged by type and
            ignored (the intent is already durable).
        before_mutation: test hook called with the route after the body was validated
            and before the repository transaction (the fence race tests revoke a role
            here). ``None`` in production.
        store_timeout_s: how long one request waits for one store operation (queue
            wait included), in seconds; ``serve`` passes ``busyTimeoutMs``.
        budget: the budget of requests without a valid credential, shared with the
            server (:mod:`qinglong_edge.local.budget`); ``None``: none (every such
            request is audited, as the reference does).
    """

    def __init__(
        self,
        store: Store,
        keyring_directory: str,
        *,
        clock: Callable[[], int] | None = None,
        on_intent: IntentHook | None = None,
        before_mutation: Callable[[Route], None] | None = None,
        store_timeout_s: float | None = 30.0,
        budget: RequestBudget | None = None,
        profile: str = "edge",
        log_directory: str | None = None,
        worker_status: Callable[[], dict[str, Any]] | None = None,
        public: PublicRoutes | None = None,
        metrics: ApiMetrics | None = None,
    ) -> None:
        self.metrics = metrics
        self._store = store
        self._log_window = DEFAULT_READ_BYTES.get(profile, DEFAULT_READ_BYTES["edge"])
        self.logs = LogReader(store, log_directory, timeout_s=store_timeout_s)
        self._worker_status = worker_status
        self.public = public
        self._clock = clock or now_ms
        self._timeout = store_timeout_s
        self.budget = budget
        self.admission = Admission(store, keyring_directory, clock=self._clock, store_timeout_s=store_timeout_s,
                                   budget=budget)
        self.on_intent = on_intent
        self.before_mutation = before_mutation

    def __call__(self, exchange: Exchange) -> Response:
        head = exchange.head
        if self.public is not None:
            answer = self.public.answer(head)
            if answer is not None:
                return answer
        try:
            route = resolve(head.method, head.target)
            admitted = self.admission.admit(route, head, exchange.request_id, exchange.peer)
            if route.json_body:
                document = read_json_body(exchange)
                status, body = self._mutate(route, admitted, document)
            else:
                if head.has_body:  # section 2.5: after the allowed audit, never parsed
                    raise ApiError(400, "invalid_request_body")
                if route.operation_id == "run.log.read":
                    status, body = self._read_log(route)
                else:
                    status, body = 200, self._read(route)
        except RateLimited as exc:
            return Response(429, exc.body, retry_after_s=exc.retry_after_s)
        except ApiError as exc:
            return Response(exc.http_status or 503, exc.body)
        return Response(status, body)

    @staticmethod
    def presents_credential(head: RequestHead) -> bool:
        """The server's ``classify``: the head carries a credential of the token grammar."""
        return presents_credential(head.values("authorization"))

    def flush_refusals(self, *, force: bool = False) -> int:
        """Write the summary rows of the refusal interval that ended (``force``: now,
        at shutdown) in one store operation; returns the rows written (0: nothing due,
        no budget, or the write failed: the counts are kept for the next try)."""
        if self.budget is None:
            return 0
        summaries = self.budget.take_summaries(force=force)
        if not summaries:
            return 0
        try:
            return self._store.run(lambda c: record_refusal_summaries(c, summaries), timeout_s=self._timeout)
        except StoreError as exc:
            self.budget.restore(summaries)
            _log.warning("refusal summary not written yet: %s", exc.code)
            return 0

    # -- reads (section 9) --------------------------------------------------

    def _read_log(self, route: Route) -> tuple[int, dict[str, Any]]:
        length = route.query.get("length")
        try:
            return self.logs.read(route.project_id, route.run_id or "", route.attempt_id or "",
                                  offset=_int(route.query["offset"]),
                                  length=length if isinstance(length, int) else self._log_window)
        except StoreError:
            raise ApiError(503, "artifact_unavailable") from None

    def _read(self, route: Route) -> dict[str, Any]:
        query = route.query
        project_id = route.project_id
        run_id = route.run_id or ""
        operation = route.operation_id
        if operation == "edge.worker.get":
            return self._worker(project_id)

        def read(conn: sqlite3.Connection) -> dict[str, Any]:
            if operation == "task.list":
                return list_tasks_body(conn, project_id, limit=_int(query["limit"]),
                                       after_task_id=_opt_str(query["after_task_id"]))
            if operation == "task.get":
                return get_task_body(conn, project_id, route.task_id or "")
            if operation == "run.list":
                return runs.list_runs(
                    conn, project_id, limit=_int(query["limit"]),
                    after_created_at_ms=_opt_int(query["after_created_at_ms"]),
                    after_run_id=_opt_str(query["after_run_id"]),
                )
            if operation == "run.get":
                return runs.get_run(conn, project_id, run_id)
            if operation == "run.events.list":
                return runs.list_run_events(
                    conn, project_id, run_id, after_sequence=_int(query["after_sequence"]), limit=_int(query["limit"])
                )
            return runs.list_run_steps(
                conn, project_id, run_id, limit=_int(query["limit"]),
                after_step_key=_opt_str(query["after_step_key"]),
                after_step_run_id=_opt_str(query["after_step_run_id"]),
            )

        try:
            return self._store.run(read, timeout_s=self._timeout)
        except runs.RunNotFound:
            raise ApiError(404, "run_not_found") from None
        except TaskNotFound:
            raise ApiError(404, "task_not_found") from None
        except StoreError:
            raise ApiError(503, UNAVAILABLE_CODES[operation]) from None

    def _worker(self, project_id: str) -> dict[str, Any]:
        """``edge.worker.get``: the Remote Worker's state (``serve`` passes the reader;
        without one: ``{"configured": false}``)."""
        if self._worker_status is None:
            return {"schema": WORKER_STATUS_SCHEMA, "configured": False}
        try:
            return self._worker_status()
        except Exception as exc:  # noqa: BLE001 - a journal problem is a 503 of this route only
            _log.warning("worker status unavailable: %s", type(exc).__name__)
            raise ApiError(503, "worker_status_unavailable") from None

    # -- mutations (sections 6 and 9.5) ---------------------------------------

    def _mutate(self, route: Route, admitted: Admitted, document: object) -> tuple[int, dict[str, Any]]:
        if route.operation_id == "run.cancel":
            return self._cancel(route, admitted, document)
        return self._start(route, admitted, document)

    def _fence(self, admitted: Admitted, operation: str) -> PolicyFence:
        fence = admitted.fence
        if fence is None or fence.binding_version is None:  # cannot happen on allow (1.3)
            raise ApiError(503, UNAVAILABLE_CODES[operation])
        return fence

    def _cancel(self, route: Route, admitted: Admitted, document: object) -> tuple[int, dict[str, Any]]:
        try:
            request = parse_run_cancellation_request(document)
        except ContractError:
            raise ApiError(400, "invalid_run_cancellation_request", extra={"schema": RUN_CANCELLATION_SCHEMA}) from None
        command = runs.CancellationCommand(
            project_id=route.project_id,
            run_id=route.run_id or "",
            mutation_id=request.mutation_id,
            event_id=new_uuid4(),
            subject=admitted.subject,
            policy_fence=self._fence(admitted, "run.cancel"),
        )
        return self._commit(
            route, "run.cancel",
            transaction=lambda c, now: runs.request_cancellation(c, command, now_ms=now),
            not_found=(runs.RunNotFound, "run_not_found"),
            rejected=(runs.FenceRejected, "run_cancellation_fence_rejected"),
            result=lambda outcome: run_cancellation_result(
                status=outcome.status,
                project_id=outcome.project_id,
                run_id=outcome.run_id,
                run_status=outcome.run_status,
                run_version=outcome.run_version,
                event_sequence=outcome.event_sequence,
                cancel_requested_at_ms=outcome.cancel_requested_at_ms,
                cancel_reason=outcome.cancel_reason,
            ),
        )

    def _start(self, route: Route, admitted: Admitted, document: object) -> tuple[int, dict[str, Any]]:
        try:
            request = parse_task_start_request(document)
        except ContractError:
            raise ApiError(400, "invalid_task_start_request", extra={"schema": TASK_START_SCHEMA}) from None
        command = runs.new_task_start_command(
            project_id=route.project_id,
            task_id=route.task_id or "",
            mutation_id=request.mutation_id,
            expected_revision=request.expected_revision,
            expected_content_digest=request.expected_content_digest,
            subject=admitted.subject,
            policy_fence=self._fence(admitted, "task.start"),
        )
        return self._commit(
            route, "task.start",
            transaction=lambda c, now: runs.start_task(c, command, now_ms=now),
            not_found=(runs.TaskNotFound, "task_not_found"),
            rejected=(runs.TaskStartRejected, "task_start_fence_rejected"),
            result=lambda outcome: task_start_result(
                status=outcome.status,
                project_id=outcome.project_id,
                task_id=outcome.task_id,
                task_revision=outcome.task_revision,
                task_content_digest=outcome.task_content_digest,
                run_id=outcome.run_id,
                attempt_id=outcome.attempt_id,
                executor_type=outcome.executor_type,
                execution_revision_digest=outcome.execution_revision_digest,
                created_at_ms=outcome.created_at_ms,
            ),
        )

    def _commit(
        self,
        route: Route,
        operation: str,
        *,
        transaction: Callable[[sqlite3.Connection, int], _Outcome],
        not_found: tuple[type[Exception], str],
        rejected: tuple[type[runs.FenceRejected], str],
        result: Callable[[_Outcome], dict[str, Any]],
    ) -> tuple[int, dict[str, Any]]:
        """The steps ``run.cancel`` and ``task.start`` share: the test hook, the write
        transaction at one clock reading, its refusals (404 ``not_found``, 409 ``rejected``
        with the reason, 503 on storage), the validated result body (503 when it does not
        validate) and, on ``accepted``, the intent hook."""
        if self.before_mutation is not None:
            self.before_mutation(route)
        now = self._clock()
        unavailable = UNAVAILABLE_CODES[operation]
        try:
            outcome = self._store.run(lambda c: transaction(c, now), timeout_s=self._timeout)
        except not_found[0]:
            raise ApiError(404, not_found[1]) from None
        except rejected[0] as exc:
            raise ApiError(409, rejected[1], extra={"reason": exc.reason}) from None
        except StoreError:
            raise ApiError(503, unavailable) from None
        try:
            body = result(outcome)
        except ContractError:
            raise ApiError(503, unavailable) from None
        if outcome.status == "accepted":
            self._notify(operation, outcome.run_id)
        return outcome.http_status, body

    def _notify(self, operation: str, run_id: str) -> None:
        if self.metrics is not None:
            self.metrics.count("task_starts" if operation == "task.start" else "cancellations")
        if self.on_intent is None:
            return
        try:
            self.on_intent(operation, run_id)
        except Exception as exc:  # noqa: BLE001 - the intent is durable; a hook failure must not turn it into 503
            _log.error("intent hook failed: %s", type(exc).__name__)


def _int(value: int | str | None) -> int:
    assert isinstance(value, int)
    return value


def _opt_int(value: int | str | None) -> int | None:
    return value if isinstance(value, int) else None


def _opt_str(value: int | str | None) -> str | None:
    return value if isinstance(value, str) else None
