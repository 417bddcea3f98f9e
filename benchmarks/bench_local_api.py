"""Benchmark: the Local API's cancellation throughput and read latency (edge profile).

Run: ``python benchmarks/bench_local_api.py [--runs 10000] [--cancels 300] [--reads 200]
[--repeat 3] [--dir DIR]``. Prints ONE JSON object.

What is measured, each ``--repeat`` times (medians reported):

* ``cancel``: a real ``qinglong-edge serve`` child process (edge profile:
  ``journal_mode=DELETE``, ``synchronous=FULL``) on a database of ``--runs`` Runs; one
  keep-alive client POSTs ``--cancels`` cancellations, each for a different Run
  (every one is a new durable intent: admission with its audit row, then the section
  6 transaction). Result: cancellations per second.
* ``raw``: the baseline, plain ``sqlite3`` on a copy of the same database with the
  same pragmas, in one loop: the section 6 transaction alone (``BEGIN IMMEDIATE``,
  project/binding fence reads, Run read, guarded update, event insert, ``COMMIT``).
  ``raw_with_audit`` adds the audit row's own committed transaction first: the same
  durable work the API does per request (two fsync'ed commits), so its ratio shows
  the cost of HTTP, admission checks and the queue alone.
* ``list``: 4 concurrent keep-alive clients (the edge in-flight limit) GET
  ``run.list`` (``limit=32``) ``--reads`` times each; latency p50/p99 in ms.
  Every read is audited (one committed row), as the spec requires.
* the server child's RSS (``VmRSS``, MiB) right after start (idle) and, with its
  thread count (``Threads``), sampled from ``/proc/<pid>/status`` every 20 ms during
  both loads (maximum reported).

Targets (reported, not asserted): cancellations >= 0.5x raw, RSS <= 28 MiB, threads
<= 8 on the edge profile.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from qinglong_edge.contracts.credentials import encode_secret  # noqa: E402
from qinglong_edge.contracts.ids import new_uuid4  # noqa: E402
from qinglong_edge.local.identity import (  # noqa: E402
    Subject,
    activate_pepper_key,
    create_subject,
    issue_credential,
    register_pepper_key,
)
from qinglong_edge.local.pepper import create_pepper, ensure_keyring_directory  # noqa: E402
from qinglong_edge.local.policy import grant_role  # noqa: E402
from qinglong_edge.local.store import Store, now_ms, write_transaction  # noqa: E402

USER = Subject("user", "bench-user")
ADMIN = Subject("system", "bench-admin")
CREDENTIAL_ID = "bench-credential"


# -- provisioning ------------------------------------------------------------------------


def provision(state: str, runs: int) -> str:
    """Create the database, keyring, identities and ``runs`` running Runs; returns the token."""
    keyring = os.path.join(state, "pepper")
    ensure_keyring_directory(keyring)
    material = create_pepper(keyring, "bench-pepper-v1")
    secret = encode_secret(os.urandom(32))
    now = now_ms()
    with Store.open(os.path.join(state, "local.db"), profile="edge") as store:
        store.run(lambda c: register_pepper_key(c, material, now))
        store.run(lambda c: activate_pepper_key(c, material.key_id, now))
        store.run(lambda c: create_subject(c, USER, now))
        store.run(lambda c: issue_credential(c, credential_id=CREDENTIAL_ID, subject=USER, secret=secret,
                                             pepper=material, now_ms=now - 1000, expires_at_ms=now + 86_400_000))
        store.run(lambda c: grant_role(c, "default", USER, "operator", mutation_id="bench", changed_by=ADMIN,
                                       now_ms=now))

        def insert(conn: sqlite3.Connection) -> None:
            with write_transaction(conn):
                conn.executemany(
                    'INSERT INTO "Runs" (id, project_id, task_id, task_revision, trigger_type, execution_origin,'
                    " execution_owner, status, version, event_sequence, priority, created_at_ms, queued_at_ms,"
                    " started_at_ms) VALUES (?, 'default', 'bench-task', ?, 'task_start', 'manual', 'runtime',"
                    " 'running', 1, 1, 0, ?, ?, ?)",
                    [(f"run-{i:06d}", "qltd:v1:1:" + "a" * 64, now - i, now - i, now - i + 1) for i in range(runs)],
                )

        store.run(insert)
    return f"ql3c_{CREDENTIAL_ID}_{secret}"


# -- the raw baseline ----------------------------------------------------------------------


def raw_loop(db_path: str, count: int, *, with_audit: bool) -> float:
    """The section 6 transaction in plain sqlite3 (same pragmas as the edge store)."""
    conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    for pragma in ("journal_mode=DELETE", "synchronous=FULL", "foreign_keys=ON", "busy_timeout=5000",
                   "journal_size_limit=8388608", "cache_size=-4096", "mmap_size=0"):
        conn.execute(f"PRAGMA {pragma}")
    started = time.perf_counter()
    for index in range(count):
        run_id = f"run-{index:06d}"
        now = now_ms()
        if with_audit:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                'INSERT INTO "QingLong3SecurityAuditEvents" (event_id, request_id, operation_id, project_id,'
                " subject_type, subject_id, authentication_id, outcome, reasons_json, fence_project_version,"
                " fence_binding_version, occurred_at_ms) VALUES (?, ?, 'run.cancel', 'default', 'user', ?, ?,"
                " 'allowed', '[\"role_grant\"]', 1, 1, ?)",
                (new_uuid4(), "local:" + new_uuid4(), USER.id, f"local_credential:{CREDENTIAL_ID}:1", now),
            )
            conn.execute("COMMIT")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute('SELECT status, version FROM "QingLong3Projects" WHERE id = ?', ("default",)).fetchone()
        conn.execute(
            'SELECT version, state, role FROM "QingLong3ProjectRoleBindings" WHERE project_id = ? AND subject_type = ?'
            " AND subject_id = ? ORDER BY version DESC LIMIT 1",
            ("default", USER.type, USER.id),
        ).fetchone()
        row = conn.execute(
            'SELECT project_id, status, version, event_sequence, cancel_requested_at_ms, cancel_reason FROM "Runs"'
            " WHERE id = ?",
            (run_id,),
        ).fetchone()
        conn.execute(
            "UPDATE \"Runs\" SET cancel_requested_at_ms = ?, cancel_reason = 'user', version = version + 1,"
            " event_sequence = event_sequence + 1 WHERE id = ? AND project_id = ? AND version = ?"
            " AND cancel_requested_at_ms IS NULL RETURNING status, version, event_sequence",
            (now, run_id, "default", row[2]),
        ).fetchall()
        payload = json.dumps({"reason": "user", "mutation_id": f"m-{index}",
                              "policy_fence": {"project_version": 1, "binding_version": 1}}, separators=(",", ":"))
        conn.execute(
            'INSERT INTO "RunEvents" (id, run_id, sequence, type, dedupe_key, actor_type, actor_id, attempt_id,'
            " step_run_id, payload, created_at_ms) VALUES (?, ?, ?, 'run.cancel_requested', ?, ?, ?, NULL, NULL, ?, ?)",
            (new_uuid4(), run_id, row[3] + 1, f"user-cancel:m-{index}", USER.type, USER.id, payload, now),
        )
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - started
    conn.close()
    return count / elapsed


# -- the server child and clients ------------------------------------------------------------


class Sampler:
    """Samples VmRSS (KiB) and Threads of a process from /proc every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss_kib = 0
        self.threads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> None:
        with open(f"/proc/{self.pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    self.rss_kib = max(self.rss_kib, int(line.split()[1]))
                elif line.startswith("Threads:"):
                    self.threads = max(self.threads, int(line.split()[1]))

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.sample()
            except OSError:
                return

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Client:
    """A keep-alive HTTP/1.1 client over one socket (the benchmark measures the server)."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.auth = f"Authorization: Bearer {token}\r\n"
        self.buffer = b""
        self.reconnects = 0

    def request(self, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
        head = f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n{self.auth}"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.sock.sendall(head.encode() + b"\r\n" + body)
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self._recv()
        raw_head, _, rest = self.buffer.partition(b"\r\n\r\n")
        length, closes = 0, False
        for line in raw_head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
            elif name.lower() == b"connection":
                closes = value.strip().lower() == b"close"
        while len(rest) < length:
            rest += self._recv()
        self.buffer = rest[length:]
        if closes:  # e.g. the 100-requests-per-connection limit: open a new one
            self.sock.close()
            self.sock = socket.create_connection(("127.0.0.1", self.port))
            self.buffer = b""
            self.reconnects += 1
        return int(raw_head.split(b" ", 2)[1]), rest[:length]

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        return chunk

    def close(self) -> None:
        self.sock.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(site: str, port: int) -> subprocess.Popen[bytes]:
    config = os.path.join(site, "config.json")
    with open(config, "w", encoding="utf-8") as handle:
        json.dump({"schema": "qinglong/edge-agent@v1", "profile": "edge", "stateDirectory": os.path.join(site, "state"),
                   "localApi": {"listener": {"host": "127.0.0.1", "port": port}}}, handle)
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen([sys.executable, "-m", "qinglong_edge", "--config", config, "serve"],
                            stderr=subprocess.PIPE, env=env)
    assert proc.stderr is not None
    line = proc.stderr.readline().decode()
    if "serving" not in line:
        raise RuntimeError(f"server did not start: {line}")
    return proc


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(30)


#: Unexpected answers, by "status code" (e.g. "503 server_overloaded").
UNEXPECTED: collections.Counter[str] = collections.Counter()
_UNEXPECTED_LOCK = threading.Lock()


def _unexpected(status: int, body: bytes) -> None:
    try:
        code = json.loads(body).get("code", "")
    except ValueError:
        code = ""
    with _UNEXPECTED_LOCK:
        UNEXPECTED[f"{status} {code}".strip()] += 1


def bench_cancel(port: int, token: str, count: int, offset: int) -> tuple[float, int]:
    client = Client(port, token)
    errors = 0
    started = time.perf_counter()
    for index in range(offset, offset + count):
        body = json.dumps({"schema": "qinglong/run-cancellation@v1", "mutationId": f"bench-{index}"},
                          separators=(",", ":")).encode()
        status, answer = client.request("POST", f"/api/v3/projects/default/runs/run-{index:06d}/cancellation", body)
        if status != 202:
            errors += 1
            _unexpected(status, answer)
    elapsed = time.perf_counter() - started
    client.close()
    return count / elapsed, errors


def bench_list(port: int, token: str, clients: int, per_client: int) -> tuple[list[float], int, float]:
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def work() -> None:
        client = Client(port, token)
        mine: list[float] = []
        barrier.wait()
        for _ in range(per_client):
            started = time.perf_counter()
            status, answer = client.request("GET", "/api/v3/projects/default/runs?limit=32")
            mine.append((time.perf_counter() - started) * 1000)
            if status != 200:
                _unexpected(status, answer)
                with lock:
                    errors[0] += 1
        client.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    return latencies, errors[0], clients * per_client / elapsed


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--cancels", type=int, default=300)
    parser.add_argument("--reads", type=int, default=200, help="GET run.list per client")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the databases live (default: a temp dir)")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="bench-local-api-", dir=args.dir)
    try:
        site = os.path.join(root, "site")
        state = os.path.join(site, "state")
        os.makedirs(state, mode=0o700)
        token = provision(state, args.runs)
        pristine = os.path.join(root, "pristine.db")
        shutil.copyfile(os.path.join(state, "local.db"), pristine)
        cancel_rates, raw_rates, raw_audit_rates, p50s, p99s, list_rates = [], [], [], [], [], []
        rss, threads, errors, idle_rss = 0, 0, 0, []
        for rep in range(args.repeat):
            for mode, sink in ((False, raw_rates), (True, raw_audit_rates)):
                copy = os.path.join(root, f"raw-{rep}-{int(mode)}.db")
                shutil.copyfile(pristine, copy)
                sink.append(raw_loop(copy, args.cancels, with_audit=mode))
                os.unlink(copy)
            shutil.copyfile(pristine, os.path.join(state, "local.db"))
            port = free_port()
            proc = start_server(site, port)
            try:
                idle = Sampler(proc.pid)
                idle.sample()
                idle_rss.append(idle.rss_kib)
                with Sampler(proc.pid) as sampler:
                    rate, failed = bench_cancel(port, token, args.cancels, 0)
                    cancel_rates.append(rate)
                    latencies, list_failed, list_rate = bench_list(port, token, args.clients, args.reads)
                    sampler.sample()
                p50s.append(percentile(latencies, 0.50))
                p99s.append(percentile(latencies, 0.99))
                list_rates.append(list_rate)
                errors += failed + list_failed
                rss, threads = max(rss, sampler.rss_kib), max(threads, sampler.threads)
            finally:
                stop_server(proc)
        cancel = statistics.median(cancel_rates)
        raw = statistics.median(raw_rates)
        raw_audit = statistics.median(raw_audit_rates)
        result: dict[str, Any] = {
            "benchmark": "local_api",
            "command": " ".join([os.path.basename(sys.executable), *(os.path.relpath(a) if a.endswith(".py") else a
                                                                  for a in sys.argv)]),
            "profile": "edge",
            "journal_mode": "delete",
            "synchronous": "full",
            "runs_in_database": args.runs,
            "repetitions": args.repeat,
            "cancellations_per_s": round(cancel, 1),
            "raw_sqlite_cancellations_per_s": round(raw, 1),
            "raw_sqlite_audit_plus_cancellation_per_s": round(raw_audit, 1),
            "ratio_vs_raw": round(cancel / raw, 3),
            "ratio_vs_raw_with_audit": round(cancel / raw_audit, 3),
            "run_list_clients": args.clients,
            "run_list_p50_ms": round(statistics.median(p50s), 2),
            "run_list_p99_ms": round(statistics.median(p99s), 2),
            "run_list_requests_per_s": round(statistics.median(list_rates), 1),
            "server_rss_idle_mib": round(statistics.median(idle_rss) / 1024, 1),
            "server_rss_max_mib": round(rss / 1024, 1),
            "server_threads_max": threads,
            "unexpected_responses": errors,
            "unexpected_by_status": dict(UNEXPECTED),
            "samples": {
                "cancellations_per_s": [round(v, 1) for v in cancel_rates],
                "raw_sqlite_cancellations_per_s": [round(v, 1) for v in raw_rates],
                "raw_sqlite_audit_plus_cancellation_per_s": [round(v, 1) for v in raw_audit_rates],
                "run_list_p50_ms": [round(v, 2) for v in p50s],
                "run_list_p99_ms": [round(v, 2) for v in p99s],
            },
            "targets": {
                "ratio_vs_raw_min": 0.5,
                "server_rss_max_mib": 28,
                "server_threads_max": 8,
                "met": {
                    "ratio_vs_raw": cancel / raw >= 0.5,
                    "rss": rss / 1024 <= 28,
                    "threads": threads <= 8,
                },
            },
            "units": {"rates": "requests or transactions per second", "latency": "ms", "rss": "MiB"},
        }
        print(json.dumps(result))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
