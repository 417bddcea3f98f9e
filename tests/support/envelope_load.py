"""Load and measurement for the envelope scenario: Local API clients and a sampler.

:class:`LoadClients` runs N keep-alive clients (``http.client``; the clients are the
test, not the agent) against ``serve``: in ``mixed`` mode a steady mix of ``run.list``,
``run.get``, ``run.events.list``, ``run.cancel`` of a Run that is queued or running,
and ``task.start`` of real jobs while fewer than ``max_active`` Runs are active; in
``reads`` mode reads only. Every answer is counted by operation and status; a status of
500 or more, or a transport error, is *unexpected*. Statistics are taken per phase
(:meth:`LoadClients.phase`).

:class:`Sampler` reads cgroup and ``/proc`` counters every ``interval_s`` (10 ms): the
tasks (``pids.current``) and memory in use of each watched cgroup, and ``VmRSS`` /
``Threads`` of each watched process, keeping the maximum per phase.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

ACTIVE = frozenset({"created", "queued", "dispatching", "running"})
BASE = "/api/v3/projects/default"


class Client:
    """One keep-alive connection with the operator's Bearer token."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.token = token
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token}"}
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        try:
            self.conn.request(method, path, body=data, headers=headers)
            response = self.conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            raise
        if (response.getheader("connection") or "").lower() == "close":
            self.conn.close()
        try:
            return response.status, json.loads(raw) if raw else None
        except ValueError:
            return response.status, None

    def close(self) -> None:
        self.conn.close()


class LoadClients:
    """N clients on threads (see the module docstring).

    Args:
        tasks: task id -> ``{"revision", "contentDigest"}`` for ``task.start`` (mixed mode).
    """

    def __init__(self, port: int, token: str, tasks: dict[str, dict[str, Any]], *, clients: int = 4,
                 max_active: int = 4, pause_s: float = 0.02, seed: int = 10) -> None:
        self.port = port
        self.token = token
        self.tasks = tasks
        self.clients = clients
        self.max_active = max_active
        self.pause_s = pause_s
        self.mode = "mixed"
        self.active_clients = clients
        self.runs: dict[str, str] = {}  # runId -> last status seen
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._rng = random.Random(seed)
        self._reset()

    def _reset(self) -> None:
        self.counts: Counter[str] = Counter()
        self.latencies: list[float] = []
        self.unexpected: list[str] = []

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        for index in range(self.clients):
            thread = threading.Thread(target=self._loop, args=(index,), name=f"envelope-client-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def phase(self, mode: str, clients: int | None = None) -> dict[str, Any]:
        """Switch mode (and the number of clients that send: the others wait, so that a
        caller's own requests keep the total within the server's in-flight limit);
        return (and restart) the statistics of the phase that ended."""
        with self._lock:
            summary = self._summary()
            self._reset()
            self.mode = mode
            self.active_clients = self.clients if clients is None else clients
        return summary

    def _summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        return {
            "clients": self.active_clients,
            "requests": len(lat),
            "by_operation_status": dict(sorted(self.counts.items())),
            "unexpected": len(self.unexpected),
            "unexpected_samples": self.unexpected[:10],
            "latency_ms_p50": round(statistics.median(lat), 2) if lat else None,
            "latency_ms_p99": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2) if lat else None,
            "latency_ms_max": round(lat[-1], 2) if lat else None,
        }

    # -- the clients --------------------------------------------------------------------------

    def active_runs(self) -> list[str]:
        with self._lock:
            return [run for run, status in self.runs.items() if status in ACTIVE]

    def _record(self, op: str, status: int | None, started: float, error: str = "", body: Any = None) -> None:
        elapsed = (time.perf_counter() - started) * 1000
        with self._lock:
            self.counts[f"{op} {status if status is not None else 'error'}"] += 1
            self.latencies.append(elapsed)
            if status is None or status >= 500:
                code = body.get("code") if isinstance(body, dict) else None
                self.unexpected.append(f"{op}: {status} {code or ''} {error}".strip()[:300])

    def _choose(self, rng: random.Random) -> str:
        if self.mode == "reads":
            return rng.choice(("list", "list", "get", "events"))
        return rng.choices(("list", "get", "events", "start", "cancel"), weights=(30, 30, 10, 15, 15))[0]

    def _loop(self, index: int) -> None:
        rng = random.Random(self._rng.random() + index)
        client = Client(self.port, self.token)
        try:
            while not self._stop.is_set():
                if index < self.active_clients:
                    self.one(client, self._choose(rng), rng)
                self._stop.wait(self.pause_s)
        finally:
            client.close()

    def one(self, client: Client, op: str, rng: random.Random) -> None:
        with self._lock:
            known = list(self.runs)
        if op in ("get", "events", "cancel") and not known:
            op = "list"
        if op == "cancel":
            # Half the Runs are cancel targets; the others run to completion.
            candidates = [run for run in self.active_runs() if int(run[-1], 16) % 2 == 0]
            if not candidates:
                op = "get"
        if op == "start" and (len(self.active_runs()) >= self.max_active or not self.tasks):
            op = "list"
        started = time.perf_counter()
        try:
            if op == "list":
                status, body = client.call("GET", f"{BASE}/runs?limit=32")
                if status == 200:
                    self._learn(body.get("runs", []))
            elif op == "get":
                status, body = client.call("GET", f"{BASE}/runs/{rng.choice(known)}")
                if status == 200:
                    self._learn([body.get("run", {})])
            elif op == "events":
                status, body = client.call("GET", f"{BASE}/runs/{rng.choice(known)}/events?limit=32")
            elif op == "cancel":
                status, body = client.call("POST", f"{BASE}/runs/{rng.choice(candidates)}/cancellation",
                                           {"schema": "qinglong/run-cancellation@v1",
                                            "mutationId": str(uuid.uuid4())})
            else:
                task_id = rng.choice(sorted(self.tasks))
                status, body = self.start_task(client, task_id)
        except (OSError, http.client.HTTPException) as exc:
            self._record(op, None, started, type(exc).__name__)
            return
        self._record(op, status, started, body=body)

    def start_task(self, client: Client, task_id: str, task: dict[str, Any] | None = None) -> tuple[int, Any]:
        """``task.start`` of ``task`` (default: ``self.tasks[task_id]``); a 202's Run is
        remembered as queued."""
        task = task or self.tasks[task_id]
        status, body = client.call("POST", f"{BASE}/tasks/{task_id}/runs", {
            "schema": "qinglong/task-start@v1", "mutationId": str(uuid.uuid4()),
            "expectedRevision": task["revision"], "expectedContentDigest": task["contentDigest"]})
        if status == 202 and isinstance(body, dict) and "runId" in body:
            with self._lock:
                self.runs[body["runId"]] = "queued"
        return status, body

    def _learn(self, runs: list[dict[str, Any]]) -> None:
        with self._lock:
            for run in runs:
                if isinstance(run, dict) and run.get("id") in self.runs:
                    self.runs[run["id"]] = run.get("status", "?")


def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS``/``VmHWM`` (KiB) and ``Threads`` of a live process ({} if it is gone)."""
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "Threads"):
                    found[key] = int(value.split()[0])
    except (OSError, ValueError):
        return {}
    return found


class Sampler:
    """Maxima of watched counters, per phase (see the module docstring).

    ``watch_value(name, read)`` adds a counter read by ``read()`` (None: skip this time);
    ``watch_process(name, pid)`` adds ``VmRSS``/``Threads`` of a process.
    """

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.phase_name = "setup"
        self.maxima: dict[str, dict[str, int]] = {}
        self.samples = 0
        self._values: dict[str, Callable[[], int | None]] = {}
        self._processes: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="envelope-sampler", daemon=True)

    def watch_value(self, name: str, read: Callable[[], int | None]) -> None:
        with self._lock:
            self._values[name] = read

    def watch_process(self, name: str, pid: int) -> None:
        with self._lock:
            self._processes[name] = pid

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def phase(self, name: str) -> None:
        with self._lock:
            self.phase_name = name

    def sample(self) -> None:
        with self._lock:
            values = dict(self._values)
            processes = dict(self._processes)
            phase = self.maxima.setdefault(self.phase_name, {})
        seen: dict[str, int] = {}
        for name, read in values.items():
            value = None
            with contextlib.suppress(OSError, ValueError):
                value = read()
            if value is not None:
                seen[name] = value
        for name, pid in processes.items():
            status = proc_status(pid)
            if "VmRSS" in status:
                seen[f"{name}_rss_kib"] = status["VmRSS"]
                seen[f"{name}_threads"] = status["Threads"]
        with self._lock:
            self.samples += 1
            for key, value in seen.items():
                phase[key] = max(phase.get(key, value), value)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def overall(self) -> dict[str, int]:
        """The maximum of each counter over every phase."""
        total: dict[str, int] = {}
        with self._lock:
            for phase in self.maxima.values():
                for key, value in phase.items():
                    total[key] = max(total.get(key, value), value)
        return total
