"""The budget of requests without a valid credential on the real Local API: real sockets,
a real SQLite file (issue 16 item 2, issue 17 item 1; spec README "Decisions for
storage on flash").

* beyond the budget: 429 ``rate_limited`` with ``retry-after``, and not one byte of the
  database changes (the file's hash is compared);
* requests with a credential keep ADR-0372's rule: each one is audited before its body
  is read, budget or not, and is served from its own slots;
* what was refused becomes one summary audit row per reason per interval.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from qinglong_edge.local.budget import RequestBudget
from qinglong_edge.local.server import ServerLimits
from tests.support.http_client import ResponseReader, exchange, request_bytes
from tests.support.local_api import CANCEL_PATH, LocalApiServer, local_api
from tests.support.store import AUTHORIZATION, CREDENTIAL_ID

LIST = "/api/v3/projects/default/runs?limit=1"
WRONG_SECRET = f"Bearer ql3c_{CREDENTIAL_ID}_{'A' * 43}"
UNKNOWN_ID = f"Bearer ql3c_nobody_{'A' * 43}"


class Clock:
    """A monotonic clock the test moves (the budget's refill and interval)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def api(tmp_path: pathlib.Path, clock: Clock) -> Iterator[LocalApiServer]:
    budget = RequestBudget(burst=3, per_minute=6.0, interval_s=60.0, clock=clock)
    with local_api(tmp_path, budget=budget) as server:
        yield server


def _sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _get(api: LocalApiServer, authorization: str | None, target: str = LIST):
    headers = [("Authorization", authorization)] if authorization else []
    response = exchange(api.address, request_bytes("GET", target, headers=headers))
    assert response is not None
    return response


def _rejected_rows(api: LocalApiServer) -> int:
    return int(api.query('SELECT count(*) FROM "QingLong3SecurityAuditEvents" WHERE outcome = ?'
                         " AND refused_count IS NULL", ("authentication_rejected",))[0][0])


def test_requests_without_a_credential_beyond_the_budget_are_429_before_any_write(api: LocalApiServer) -> None:
    for _ in range(3):  # the burst: each one audited, as ADR-0372 has it
        response = _get(api, None)
        assert (response.status, response.json()) == (401, {"code": "authentication_required"})
    assert _rejected_rows(api) == 3
    before = _sha256(api.db_path)
    for _ in range(20):
        response = _get(api, None)
        assert (response.status, response.json()) == (429, {"code": "rate_limited"})
        assert response.header("retry-after") == "10"  # 6 a minute: the next token in 10 s
        assert not response.closes  # keep-alive: a refusal costs the client a round trip only
    assert _sha256(api.db_path) == before  # nothing durable changed
    assert api.api.budget is not None and api.api.budget.pending() == {"credential_missing": 20}
    assert api.server.rate_limited == 20  # answered by the poll thread, no worker, no route


def test_failed_authentication_shares_the_budget_and_is_refused_before_its_audit_row(
    api: LocalApiServer, clock: Clock
) -> None:
    assert [_get(api, auth).status for auth in (WRONG_SECRET, UNKNOWN_ID, None)] == [401, 401, 401]
    before = _sha256(api.db_path)
    for authorization in (WRONG_SECRET, UNKNOWN_ID):
        response = _get(api, authorization)  # a credential: admission decides, then refuses
        assert (response.status, response.json(), response.header("retry-after")) == (
            429, {"code": "rate_limited"}, "10")
    assert _sha256(api.db_path) == before
    assert api.api.budget is not None and api.api.budget.pending() == {"authentication_rejected": 2}
    clock.now += 10.0  # one token back
    assert _get(api, WRONG_SECRET).status == 401
    assert _rejected_rows(api) == 4


def test_a_valid_credential_is_served_and_audited_however_empty_the_budget(api: LocalApiServer) -> None:
    for _ in range(5):
        _get(api, None)
    for _ in range(3):
        assert _get(api, AUTHORIZATION).status == 200
    allowed = api.query('SELECT count(*) FROM "QingLong3SecurityAuditEvents" WHERE outcome = ?', ("allowed",))
    assert allowed == [(3,)]


def test_unknown_routes_cost_no_token(api: LocalApiServer) -> None:
    """404 comes before authentication and writes nothing (local-api.md 2.2 step 3), so it
    does not use the budget up: the token is still there for the next real refusal."""
    for _ in range(10):
        assert _get(api, None, "/api/v3/projects/default/nothing").status == 404
    assert [_get(api, None).status for _ in range(4)] == [401, 401, 401, 429]


def test_an_unauthenticated_post_beyond_the_budget_is_429_without_reading_the_body(api: LocalApiServer) -> None:
    for _ in range(3):
        _get(api, None)
    received = api.server.bytes_received
    head = request_bytes("POST", CANCEL_PATH, headers=[("Content-Type", "application/json"),
                                                      ("Content-Length", str(1 << 20))])
    with socket.create_connection(api.address) as sock:
        sock.sendall(head + b"{" * 4096)
        response = ResponseReader(sock).read()
    assert response is not None and response.status == 429 and response.closes
    assert api.server.bytes_received - received == len(head)


def test_refusals_are_written_as_one_summary_row_per_reason_per_interval(api: LocalApiServer, clock: Clock) -> None:
    for _ in range(3):
        _get(api, None)
    for _ in range(7):
        assert _get(api, None).status == 429
    assert _get(api, WRONG_SECRET).status == 429
    assert api.api.flush_refusals() == 0  # the interval has not ended: nothing written
    clock.now += 60.0
    assert api.api.flush_refusals() == 2
    rows = api.query(
        'SELECT operation_id, project_id, subject_type, outcome, reasons_json, refused_count, refused_since_ms,'
        ' occurred_at_ms FROM "QingLong3SecurityAuditEvents" WHERE refused_count IS NOT NULL ORDER BY reasons_json')
    assert [(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5]) for r in rows] == [
        ("request.refused", None, None, "authentication_rejected", ["rate_limited", "authentication_rejected"], 1),
        ("request.refused", None, None, "authentication_rejected", ["rate_limited", "credential_missing"], 7),
    ]
    assert all(since <= until for *_, since, until in rows)
    clock.now += 60.0
    assert api.api.flush_refusals() == 0  # a quiet interval writes nothing

def _operator_under_flood(api: LocalApiServer, flood: Callable[[threading.Event, dict[int, int], int], None], *,
                          clients: int, join_s: float) -> tuple[list[int], dict[int, int]]:
    """``clients`` threads run ``flood(stop, seen, index)`` (it counts the statuses it gets in
    ``seen`` until ``stop`` is set) while the operator sends 40 GETs with its credential:
    the operator's statuses, and the flood's statuses summed over the clients."""
    stop = threading.Event()
    counts: list[dict[int, int]] = [{} for _ in range(clients)]
    threads = [threading.Thread(target=flood, args=(stop, counts[index], index), daemon=True)
               for index in range(clients)]
    for thread in threads:
        thread.start()
    try:
        statuses = [_get(api, AUTHORIZATION).status for _ in range(40)]
    finally:
        stop.set()
        for thread in threads:
            thread.join(join_s)
    flooded: dict[int, int] = {}
    for seen in counts:
        for status, count in seen.items():
            flooded[status] = flooded.get(status, 0) + count
    return statuses, flooded


def test_an_operator_is_served_while_four_clients_without_credentials_flood(tmp_path: pathlib.Path) -> None:
    """Issue 17: 4 clients as fast as they can, keep-alive; the operator's 40 requests on
    fresh connections are all 200 (their slots are not the flood's), and the flood's
    durable cost is the budget's burst."""
    budget = RequestBudget(burst=3, per_minute=1.0)
    with local_api(tmp_path, budget=budget) as api:
        def flood(stop: threading.Event, seen: dict[int, int], _index: int) -> None:
            payload = request_bytes("GET", LIST)
            sock = socket.create_connection(api.address)
            reader = ResponseReader(sock)
            try:
                while not stop.is_set():
                    try:
                        sock.sendall(payload)
                        response = reader.read(timeout=10)
                    except OSError:
                        response = None
                    if response is None:  # closed after 100 requests: reconnect
                        sock.close()
                        sock = socket.create_connection(api.address)
                        reader = ResponseReader(sock)
                        continue
                    seen[response.status] = seen.get(response.status, 0) + 1
            finally:
                sock.close()

        statuses, flooded = _operator_under_flood(api, flood, clients=4, join_s=15)
        assert statuses == [200] * 40
        assert set(flooded) <= {401, 429} and flooded.get(429, 0) > 0, flooded
        assert _rejected_rows(api) <= 3 + 1  # the burst, and at most one refill meanwhile


def test_an_operator_is_served_while_sixteen_clients_with_wrong_credentials_flood(tmp_path: pathlib.Path) -> None:
    """Review of issue 17 item 1: 16 clients sending well-formed ``ql3c_`` credentials with
    ids that exist nowhere, each request on a new connection, as fast as they can (the
    edge profile's 4 slots are always busy with them: the server cannot tell their
    credentials from a valid one before the store check). The operator's 40 requests are
    all 200, never 503 ``server_overloaded``; the flood gets 401 within the budget, then
    429, and costs no more audit rows than the budget's burst. The wait for a slot is
    made generous here (a loaded CI machine); benchmarks/bench_availability.py measures
    the edge profile's (phase ``wrong_credentials``)."""
    budget = RequestBudget(burst=3, per_minute=1.0)
    limits = dataclasses.replace(ServerLimits.for_profile("edge"), credential_slot_wait_s=30.0)
    with local_api(tmp_path, budget=budget, limits=limits) as api:
        def flood(stop: threading.Event, seen: dict[int, int], index: int) -> None:
            sent = 0
            while not stop.is_set():
                sent += 1
                wrong = f"Bearer ql3c_nobody-{index}-{sent}_{'A' * 43}"
                payload = request_bytes("GET", LIST, headers=[("Authorization", wrong), ("Connection", "close")])
                try:
                    response = exchange(api.address, payload, timeout=30)
                except OSError:
                    response = None
                status = 0 if response is None else response.status
                seen[status] = seen.get(status, 0) + 1

        statuses, flooded = _operator_under_flood(api, flood, clients=16, join_s=60)
        assert statuses == [200] * 40, (statuses, flooded)
        assert set(flooded) <= {401, 429} and flooded.get(429, 0) > 0, flooded
        assert _rejected_rows(api) <= 3 + 1  # the burst, and at most one refill meanwhile
