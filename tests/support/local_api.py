"""A real Local API server on a real SQLite file, provisioned like local-api.md section 10.

Fixture of ``packages/ql3-local-api/test/sqliteHttp.integration.test.cjs``: profile
edge, project ``default`` (version 1), user ``local-api-user`` with an ``operator``
binding at version 1, credential ``local-api-owner`` v1 with pepper key
``local-api-pepper-v1`` (the section 3.2 vector), Run ``run_local_api_1`` (``running``,
version 1, event_sequence 1), server clock ``1800000000000``.
"""

from __future__ import annotations

import contextlib
import pathlib
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from qinglong_edge.local.api import LocalApi
from qinglong_edge.local.budget import RequestBudget
from qinglong_edge.local.identity import Subject
from qinglong_edge.local.routes import Route
from qinglong_edge.local.server import Server, ServerLimits
from qinglong_edge.local.store import Store
from tests.support.http_client import RawResponse, ResponseReader, exchange, request_bytes
from tests.support.store import AUTHORIZATION, NOW, USER, Provisioned, insert_run, provision

RUN_ID = "run_local_api_1"
CANCEL_PATH = f"/api/v3/projects/default/runs/{RUN_ID}/cancellation"
CANCEL_BODY = b'{"schema":"qinglong/run-cancellation@v1","mutationId":"cancel-local-api-1"}'


@dataclass
class LocalApiServer:
    """A running server and everything a test needs to look behind it."""

    server: Server
    api: LocalApi
    store: Store
    provisioned: Provisioned
    db_path: pathlib.Path
    intents: list[tuple[str, str]] = field(default_factory=list)
    hooks: list[Callable[[Route], None]] = field(default_factory=list)

    @property
    def address(self) -> tuple[str, int]:
        return self.server.address

    def send(self, data: bytes, *, half_close: bool = False, timeout: float = 10.0) -> RawResponse | None:
        """One request on a fresh connection."""
        return exchange(self.address, data, half_close=half_close, timeout=timeout)

    def cancel(self, body: bytes = CANCEL_BODY, *, run_id: str = RUN_ID, project: str = "default",
               authorization: str | None = AUTHORIZATION, headers: list[tuple[str, str]] | None = None) -> RawResponse:
        extra = [("Authorization", authorization)] if authorization else []
        extra += [("Content-Type", "application/json"), *(headers or [])]
        data = request_bytes("POST", f"/api/v3/projects/{project}/runs/{run_id}/cancellation", headers=extra, body=body)
        response = self.send(data)
        assert response is not None
        return response

    def get(self, target: str, *, authorization: str | None = AUTHORIZATION) -> RawResponse:
        headers = [("Authorization", authorization)] if authorization else []
        response = self.send(request_bytes("GET", target, headers=headers))
        assert response is not None
        return response

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self.store.run(lambda c: [tuple(r) for r in c.execute(sql, params).fetchall()])

    def write(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        return self.store.run(fn)

    def audit_rows(self) -> list[tuple[Any, ...]]:
        return self.query(
            'SELECT operation_id, project_id, subject_type, subject_id, outcome, reasons_json, fence_project_version,'
            ' fence_binding_version, request_id FROM "QingLong3SecurityAuditEvents" ORDER BY rowid'
        )

    def events(self, run_id: str = RUN_ID) -> list[tuple[Any, ...]]:
        return self.query(
            'SELECT sequence, type, dedupe_key, actor_type, actor_id, payload, created_at_ms FROM "RunEvents"'
            " WHERE run_id = ? ORDER BY sequence",
            (run_id,),
        )

    def run_row(self, run_id: str = RUN_ID) -> tuple[Any, ...]:
        rows = self.query(
            'SELECT status, version, event_sequence, cancel_requested_at_ms, cancel_reason FROM "Runs" WHERE id = ?',
            (run_id,),
        )
        assert len(rows) == 1
        return rows[0]

    def next_request_served(self) -> bool:
        """The server still answers a plain authenticated read on a new connection."""
        return self.get("/api/v3/projects/default/runs?limit=1").status == 200

    def keep_alive(self) -> tuple[Any, ResponseReader]:
        import socket

        sock = socket.create_connection(self.address)
        return sock, ResponseReader(sock)


@contextlib.contextmanager
def local_api(
    tmp_path: pathlib.Path,
    *,
    db_dir: pathlib.Path | None = None,
    subject: Subject = USER,
    role: str | None = "operator",
    profile: str = "edge",
    busy_timeout_ms: int = 5000,
    limits: ServerLimits | None = None,
    clock: Callable[[], int] | None = None,
    with_run: bool = True,
    budget: RequestBudget | None = None,
    store_timeout_s: float = 10.0,
    log_directory: pathlib.Path | None = None,
    **api_options: Any,
) -> Iterator[LocalApiServer]:
    """Provision the section 10 fixture, start a real server, yield, drain and close.

    The server classifies requests as ``serve`` does (those without a credential hold
    at most ``limits.unauthenticated_slots``); ``budget`` (default none) is shared by
    the server and admission, as ``serve`` shares it.
    """
    db_path = (db_dir or tmp_path) / "local.db"
    keyring = tmp_path / "pepper"
    provisioned = provision(db_path, keyring, subject=subject, role=role, profile=profile)
    provisioned.store.close()
    store = Store.open(str(db_path), profile=profile, busy_timeout_ms=busy_timeout_ms)
    provisioned.store = store
    if with_run:
        store.run(lambda c: insert_run(c, RUN_ID))
    holder: dict[str, LocalApiServer] = {}

    def before_mutation(route: Route) -> None:
        for hook in list(holder["server"].hooks):
            hook(route)

    api = LocalApi(
        store,
        str(keyring),
        clock=clock or (lambda: NOW),
        on_intent=lambda op, run: holder["server"].intents.append((op, run)),
        before_mutation=before_mutation,
        store_timeout_s=store_timeout_s,
        budget=budget,
        profile=profile,
        log_directory=None if log_directory is None else str(log_directory),
        **api_options,
    )
    server = Server(api, limits=limits or ServerLimits.for_profile(profile), classify=api.presents_credential,
                    budget=budget)
    fixture = LocalApiServer(server, api, store, provisioned, db_path)
    holder["server"] = fixture
    server.start()
    try:
        yield fixture
    finally:
        server.shutdown(timeout=2)
        store.close()
