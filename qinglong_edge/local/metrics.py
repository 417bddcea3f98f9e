"""``GET /metrics`` of ``serve`` (issue 26 item 5): counters in memory, gauges at scrape.

Off by default (``localApi.metrics``); no credential, no audit row, at most one scrape at
a time (a second concurrent one is 503 ``server_overloaded``), ``text/plain;
version=0.0.4`` (:mod:`qinglong_edge.contracts.exposition`). Families:

==============================================================  =========  ===================================
name                                                            type       what
==============================================================  =========  ===================================
``qinglong_edge_build_info{version}``                           gauge      1
``qinglong_edge_local_runs{status}``                            gauge      stored Runs by status (every status)
``qinglong_edge_local_task_starts_total``                       counter    task.start that created a Run (202)
``qinglong_edge_local_launches_total``                          counter    Runs the controller started
``qinglong_edge_local_cancellations_total``                     counter    new cancel intents (202)
``qinglong_edge_local_api_refusals_total{reason}``              counter    answers >= 400 by their ``code``
                                                                           (``http_<status>`` for a bare one)
``qinglong_edge_local_api_request_duration_seconds``            histogram  head complete -> answer written
``qinglong_edge_local_store_usage{store}``                      gauge      audit rows, terminal Runs, database
                                                                           bytes, log bytes
``qinglong_edge_local_store_cap{store}``                        gauge      their caps
==============================================================  =========  ===================================

Counters start at 0 with each ``serve`` (Prometheus handles the reset). The gauges cost one
store operation per scrape (a ``GROUP BY status`` and the caps' usage counts) and the
pruner's cached log scan: a few milliseconds with 1,000 Runs (benchmarks/bench_observe.py).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import Any, Final

from qinglong_edge.contracts.exposition import Family, histogram_family, render
from qinglong_edge.local.run_reader import RUN_STATUSES

__all__ = ["BUCKETS", "ApiMetrics", "StoreGauges", "run_counts"]

#: Latency buckets, seconds (an edge request takes about a millisecond).
BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Distinct refusal reasons kept (codes are a fixed vocabulary; a bound all the same).
_MAX_REASONS: Final = 64


def run_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Stored Runs by status (every known status, 0 when none)."""
    counts = dict.fromkeys(sorted(RUN_STATUSES), 0)
    for status, n in conn.execute('SELECT status, count(*) FROM "Runs" GROUP BY status'):
        if status in counts:
            counts[status] = int(n)
    return counts


#: ``gauges()`` -> ``(runs by status, {store: (usage, cap or None)})`` at scrape time.
StoreGauges = Callable[[], tuple[dict[str, int], dict[str, tuple[int, int | None]]]]


class ApiMetrics:
    """The counters and the latency histogram; thread-safe (workers and the poll thread).

    ``version``: the agent's, for ``qinglong_edge_build_info`` (``serve`` passes it: this
    layer does not import the package root).

    :meth:`observe` is the server's ``observer``; :meth:`count` is called by the API
    (``task_starts``, ``cancellations``) and by the controller (``launches``).
    """

    def __init__(self, version: str = "unknown") -> None:
        self._version = version
        self._lock = threading.Lock()
        self._counters = {"task_starts": 0, "launches": 0, "cancellations": 0}
        self._refusals: dict[str, int] = {}
        self._buckets = [0] * (len(BUCKETS) + 1)
        self._sum = 0.0
        self._count = 0
        self.scrape = threading.Lock()

    def observe(self, status: int, code: str | None, seconds: float) -> None:
        """One response: its latency, and its reason when it refused (status >= 400)."""
        index = next((i for i, bound in enumerate(BUCKETS) if seconds <= bound), len(BUCKETS))
        with self._lock:
            self._buckets[index] += 1
            self._sum += max(0.0, seconds)
            self._count += 1
            if status >= 400:
                reason = code if code is not None else f"http_{status}"
                if reason in self._refusals or len(self._refusals) < _MAX_REASONS:
                    self._refusals[reason] = self._refusals.get(reason, 0) + 1

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] += n

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"counters": dict(self._counters), "refusals": dict(self._refusals),
                    "buckets": list(self._buckets), "sum": self._sum, "count": self._count}

    def render(self, gauges: StoreGauges | None) -> bytes:
        """The exposition text (``gauges`` None: no store families, e.g. in tests)."""
        snap = self.snapshot()
        families = [Family("qinglong_edge_build_info", "gauge", "The agent's version.")
                    .add(1, (("version", self._version),))]
        if gauges is not None:
            runs, stores = gauges()
            family = Family("qinglong_edge_local_runs", "gauge", "Stored Local Runs by status.")
            for status, n in runs.items():
                family.add(n, (("status", status),))
            families.append(family)
        counters = snap["counters"]
        families += [
            Family("qinglong_edge_local_task_starts_total", "counter", "task.start requests that created a Run.")
            .add(counters["task_starts"]),
            Family("qinglong_edge_local_launches_total", "counter", "Local Runs the execution controller started.")
            .add(counters["launches"]),
            Family("qinglong_edge_local_cancellations_total", "counter", "New durable cancel intents.")
            .add(counters["cancellations"]),
        ]
        refusals = Family("qinglong_edge_local_api_refusals_total", "counter",
                          "Local API answers with status >= 400, by their code.")
        for reason in sorted(snap["refusals"]):
            refusals.add(snap["refusals"][reason], (("reason", reason),))
        families.append(refusals)
        families.append(histogram_family(
            "qinglong_edge_local_api_request_duration_seconds",
            "Local API requests from the complete head to the written answer.",
            BUCKETS, snap["buckets"], total=snap["sum"], count=snap["count"]))
        if gauges is not None:
            usage = Family("qinglong_edge_local_store_usage", "gauge", "What each bounded store holds.")
            caps = Family("qinglong_edge_local_store_cap", "gauge", "The configured cap of each bounded store.")
            for store, (used, cap) in sorted(stores.items()):
                usage.add(used, (("store", store),))
                if cap is not None:
                    caps.add(cap, (("store", store),))
            families += [usage, caps]
        return render(families)
