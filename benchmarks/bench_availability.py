"""Benchmark: the Local API stays available to an operator under hostile local clients
(issue 17), the audit stays small under an unauthenticated flood (issue 16), and the
credential check takes as long for an unknown id as for a known one (issue 17 item 6).

Run: ``python benchmarks/bench_availability.py [--seconds 20] [--requests 100000]
[--timing-rounds 3000] [--dir DIR]``. Prints ONE JSON object.

A real ``qinglong-edge serve`` child (edge profile, execution controller on) on a
provisioned database. In each phase an operator sends ``GET run.list`` every 100 ms on a
**fresh connection** (connect included in the latency, as curl does; a request that
fails or takes more than 10 s is an error) while, for ``--seconds``:

* ``baseline``: nothing else (the operator's latency without an attack);
* ``slowloris``: 40 connections, each sending one byte of a request head every 2 s and
  reconnecting as soon as the server closes it;
* ``idle``: 400 connections that never send a byte, reconnected as soon as closed;
* ``unauthenticated``: 4 clients sending ``GET run.list`` without a credential as fast
  as they can, each request on a new connection (a kept connection answered 429 is paused
  for a second by the server, so this is their fastest way);
* ``wrong_credentials``: 16 clients doing the same with a well-formed ``ql3c_`` Bearer
  credential whose id exists nowhere (a new random id each request), so the server cannot
  tell it from a valid one until the store check.

``flood``: one client sends ``--requests`` requests without a credential, the same way,
as fast as it can while the operator keeps polling; the database file's growth is measured
from before ``serve`` starts to after it stopped (the shutdown writes the last refusal
summary). Its baseline is the same number of requests audited one row each, as the
reference does: the growth of 500 audited (authenticated) reads, scaled.

``timing``: :func:`qinglong_edge.local.identity.authenticate` in-process on the same
kind of store (real SQLite, real key file), interleaved: a known id with a wrong secret
vs an unknown id; medians in microseconds. Baseline: the unknown id without the dummy
check (what it cost before issue 17 item 6).

The serve child's RSS and thread count are sampled every 20 ms throughout the phases.
Targets (reported, not asserted): operator p99 <= 250 ms and 0 errors in each attack
phase, RSS <= 26 MiB, threads <= 8, flood growth <= 1 MiB with the operator answered 200
and p99 <= 250 ms meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_local_api import CREDENTIAL_ID, Sampler, free_port, percentile, provision  # noqa: E402

from qinglong_edge.local import identity  # noqa: E402
from qinglong_edge.local.store import Store, now_ms  # noqa: E402

LIST = "/api/v3/projects/default/runs?limit=32"
OPERATOR_INTERVAL_S = 0.1
#: The attack phases, in order (each after the baseline, on the same serve).
ATTACKS = ("slowloris", "idle", "unauthenticated", "wrong_credentials")
REQUEST_TIMEOUT_S = 10.0


# -- the server child ------------------------------------------------------------------------


def start_serve(site: str, port: int) -> subprocess.Popen[bytes]:
    config = os.path.join(site, "config.json")
    with open(config, "w", encoding="utf-8") as handle:
        json.dump({"schema": "qinglong/edge-agent@v1", "profile": "edge", "stateDirectory": os.path.join(site, "state"),
                   "localApi": {"listener": {"host": "127.0.0.1", "port": port}}, "execution": {}}, handle)
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen([sys.executable, "-m", "qinglong_edge", "--config", config, "serve"],
                            stderr=subprocess.PIPE, env=env)
    assert proc.stderr is not None
    line = proc.stderr.readline().decode()
    if "serving" not in line:
        raise RuntimeError(f"serve did not start: {line}")
    return proc


def stop_serve(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    return proc.returncode


# -- clients ---------------------------------------------------------------------------------


def one_request(port: int, head: bytes) -> tuple[int, bytes]:
    """A request on a fresh connection (``connection: close``); (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT_S) as sock:
        sock.sendall(head)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    raw_head, _, body = data.partition(b"\r\n\r\n")
    return int(raw_head.split(b" ", 2)[1]), body


class Operator:
    """GET run.list every 100 ms on a fresh connection; latencies (ms) and errors."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.head = (f"GET {LIST} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                     "Connection: close\r\n\r\n").encode()
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                status, body = one_request(self.port, self.head)
                if status != 200:
                    code = json.loads(body).get("code", "") if body else ""
                    self.errors[f"{status} {code}".strip()] += 1
            except (OSError, ValueError, IndexError) as exc:
                self.errors[type(exc).__name__] += 1
            elapsed = time.perf_counter() - started
            self.latencies.append(elapsed * 1000)
            stop.wait(max(0.0, OPERATOR_INTERVAL_S - elapsed))

    def summary(self) -> dict[str, Any]:
        values = self.latencies or [0.0]
        return {"requests": len(self.latencies), "errors": sum(self.errors.values()),
                "errors_by_kind": dict(self.errors), "p50_ms": round(percentile(values, 0.50), 2),
                "p99_ms": round(percentile(values, 0.99), 2), "max_ms": round(max(values), 2)}


def _connect(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        sock.connect(("127.0.0.1", port))
    return sock


def hold_connections(port: int, count: int, stop: threading.Event, *, drip_every_s: float | None) -> dict[str, int]:
    """``count`` connections kept open (reconnected as soon as the server closes one); with
    ``drip_every_s``, each sends the next byte of a request head that never ends."""
    drip = f"GET {LIST} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + b"X-Slow: " + b"a" * 4000
    sel = selectors.DefaultSelector()
    offsets: dict[socket.socket, int] = {}
    stats = {"connects": 0, "closed_by_server": 0}

    def add() -> None:
        sock = _connect(port)
        sel.register(sock, selectors.EVENT_READ)
        offsets[sock] = 0
        stats["connects"] += 1

    def drop(sock: socket.socket) -> None:
        sel.unregister(sock)
        offsets.pop(sock, None)
        sock.close()

    for _ in range(count):
        add()
    next_drip = time.monotonic() + (drip_every_s or 0)
    try:
        while not stop.is_set():
            for key, _ in sel.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:  # closed by the server (evicted, or a deadline): reconnect at once
                    stats["closed_by_server"] += 1
                    drop(sock)
                    add()
            if drip_every_s is not None and time.monotonic() >= next_drip:
                next_drip += drip_every_s
                for sock in list(offsets):
                    offset = offsets[sock]
                    try:
                        sock.send(drip[offset % len(drip): offset % len(drip) + 1])
                        offsets[sock] = offset + 1
                    except OSError:
                        pass  # not connected yet, or closed: the select above sees it
    finally:
        for sock in list(offsets):
            drop(sock)
        sel.close()
    return stats


class Flooder:
    """Requests without a credential as fast as possible, each on a new connection (as a
    shell loop of curl would do; a kept connection answered 429 is paused by the server
    for a second, so reconnecting is the fastest way to send)."""

    def __init__(self, port: int, limit: int | None = None, *, wrong_credential: bool = False) -> None:
        self.port = port
        self.limit = limit
        self.wrong_credential = wrong_credential
        self.statuses: Counter[int] = Counter()
        self.failures = 0
        self.sent = 0

    def _head(self) -> bytes:
        if not self.wrong_credential:
            return f"GET {LIST} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
        token = f"ql3c_nobody-{os.urandom(8).hex()}_{'A' * 43}"  # the token grammar, an id that exists nowhere
        return f"GET {LIST} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n".encode()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set() and (self.limit is None or self.sent < self.limit):
            head = self._head()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=REQUEST_TIMEOUT_S) as sock:
                    sock.sendall(head)
                    buffer = b""
                    while b"\r\n\r\n" not in buffer:
                        chunk = sock.recv(65536)
                        if not chunk:
                            raise ConnectionError("closed before an answer")
                        buffer += chunk
                self.statuses[int(buffer.split(b" ", 2)[1])] += 1
            except (OSError, ValueError, IndexError):
                self.failures += 1
            self.sent += 1


# -- phases ----------------------------------------------------------------------------------


def run_attack(mode: str, port: int, stop: threading.Event, requests: int | None = None) -> dict[str, Any]:
    """The attack itself (in the attacker child process): until ``stop``, or ``requests``."""
    if mode in ("slowloris", "idle"):
        count, drip = (40, 2.0) if mode == "slowloris" else (400, None)
        return hold_connections(port, count, stop, drip_every_s=drip)
    clients = {"unauthenticated": 4, "wrong_credentials": 16}.get(mode, 1)
    flooders = [Flooder(port, limit=requests, wrong_credential=mode == "wrong_credentials") for _ in range(clients)]
    threads = [threading.Thread(target=f.run, args=(stop,), daemon=True) for f in flooders]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses: Counter[int] = Counter()
    for flooder in flooders:
        statuses.update(flooder.statuses)
    return {"attacker_requests": sum(f.sent for f in flooders), "attacker_statuses": dict(statuses),
            "attacker_failures": sum(f.failures for f in flooders),
            "seconds": round(time.perf_counter() - started, 2)}


def attacker_main(mode: str, port: int, requests: int | None) -> int:
    """``--attacker MODE``: run one attack in this (separate) process until SIGTERM, or
    until ``requests`` were sent; print its figures as one JSON line."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    print(json.dumps(run_attack(mode, port, stop, requests)))
    return 0


class Attacker:
    """The attack in a child process, so that its threads never compete for the GIL with
    the operator's client (each side has its own interpreter, as separate clients would)."""

    def __init__(self, mode: str, port: int, requests: int | None = None) -> None:
        argv = [sys.executable, os.path.abspath(__file__), "--attacker", mode, "--port", str(port)]
        if requests is not None:
            argv += ["--requests", str(requests)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=REPO))
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"

    def finish(self, *, stop: bool) -> dict[str, Any]:
        if stop:
            self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=120)
        return dict(json.loads(out.strip().splitlines()[-1]))


def attack_phase(port: int, token: str, seconds: float, attack: str, sampler: Sampler) -> dict[str, Any]:
    stop = threading.Event()
    operator = Operator(port, token)
    attacker = Attacker(attack, port) if attack != "baseline" else None
    if attacker is not None:
        time.sleep(1.0)  # let the attack reach its steady state before the operator measures
    operator_thread = threading.Thread(target=operator.run, args=(stop,), daemon=True)
    operator_thread.start()
    stop.wait(seconds)
    stop.set()
    operator_thread.join(REQUEST_TIMEOUT_S + 5)
    result = operator.summary()
    result["attack"] = attacker.finish(stop=True) if attacker is not None else {}
    result["rss_max_mib_so_far"] = round(sampler.rss_kib / 1024, 1)
    return result


def db_size(state: str) -> int:
    return sum(os.path.getsize(os.path.join(state, name)) for name in os.listdir(state)
               if name.startswith("local.db") and not name.endswith(".lock"))


def flood_phase(site: str, state: str, token: str, requests: int) -> dict[str, Any]:
    """The database growth from ``requests`` unauthenticated requests (serve started and
    stopped around it), with the operator polling meanwhile."""
    before = db_size(state)
    port = free_port()
    proc = start_serve(site, port)
    try:
        with Sampler(proc.pid) as sampler:
            stop = threading.Event()
            operator = Operator(port, token)
            operator_thread = threading.Thread(target=operator.run, args=(stop,), daemon=True)
            operator_thread.start()
            flood = Attacker("flood", port, requests).finish(stop=False)
            stop.set()
            operator_thread.join(REQUEST_TIMEOUT_S + 5)
    finally:
        exit_status = stop_serve(proc)
    growth = db_size(state) - before
    sent, elapsed = flood["attacker_requests"], max(flood["seconds"], 1e-3)
    return {"requests": sent, "seconds": round(elapsed, 1),
            "requests_per_s": round(sent / elapsed, 1), "statuses": flood["attacker_statuses"],
            "database_growth_bytes": growth, "operator": operator.summary(),
            "serve_rss_max_mib": round(sampler.rss_kib / 1024, 1), "serve_threads_max": sampler.threads,
            "serve_exit": exit_status}


def audited_row_bytes(site: str, state: str, token: str, reads: int = 500) -> float:
    """Database growth per audited request (authenticated reads: one row each)."""
    before = db_size(state)
    port = free_port()
    proc = start_serve(site, port)
    head = (f"GET {LIST} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT_S)
    try:
        buffer = b""
        for index in range(reads):
            if index and index % 99 == 0:  # the server closes after 100 requests per connection
                sock.close()
                sock = socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT_S)
                buffer = b""
            sock.sendall(head)
            while b"\r\n\r\n" not in buffer:
                buffer += sock.recv(65536)
            raw_head, _, rest = buffer.partition(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in raw_head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            while len(rest) < length:
                rest += sock.recv(65536)
            buffer = rest[length:]
    finally:
        sock.close()
        stop_serve(proc)
    return (db_size(state) - before) / reads


def timing_phase(root: str, rounds: int) -> dict[str, Any]:
    """authenticate() for a known id with a wrong secret vs an unknown id (in-process)."""
    state = os.path.join(root, "timing")
    os.makedirs(state, mode=0o700)
    provision(state, 1)
    keyring = os.path.join(state, "pepper")
    wrong = "A" * 43
    known = [f"Bearer ql3c_{CREDENTIAL_ID}_{wrong}"]
    unknown = [f"Bearer ql3c_nobody-{CREDENTIAL_ID[:8]}_{wrong}"]
    samples: dict[str, list[float]] = {"known_wrong_secret": [], "unknown_id": [], "unknown_id_without_dummy": []}
    real_dummy = identity._dummy_check  # the baseline switches it off

    def measure(conn: Any) -> None:
        now = now_ms()
        for index in range(rounds):
            order = [("known_wrong_secret", known, True), ("unknown_id", unknown, True),
                     ("unknown_id_without_dummy", unknown, False)]
            if index % 2:
                order.reverse()
            for name, values, dummy in order:
                identity._dummy_check = real_dummy if dummy else (lambda *_: None)
                started = time.perf_counter_ns()
                principal = identity.authenticate(conn, values, now, keyring_directory=keyring)
                samples[name].append((time.perf_counter_ns() - started) / 1000)
                assert principal is None
        identity._dummy_check = real_dummy

    with Store.open(os.path.join(state, "local.db"), profile="edge") as store:
        store.run(measure)
    medians = {name: round(statistics.median(values), 1) for name, values in samples.items()}
    return {
        "rounds": rounds,
        "median_us": medians,
        "difference_us": round(medians["known_wrong_secret"] - medians["unknown_id"], 1),
        "difference_without_dummy_us": round(medians["known_wrong_secret"] - medians["unknown_id_without_dummy"], 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each attack phase")
    parser.add_argument("--requests", type=int, default=100_000, help="unauthenticated requests of the flood")
    parser.add_argument("--timing-rounds", type=int, default=3000)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--attacker", choices=("slowloris", "idle", "unauthenticated", "wrong_credentials", "flood"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.attacker is not None:
        return attacker_main(args.attacker, args.port, args.requests if args.attacker == "flood" else None)
    root = tempfile.mkdtemp(prefix="bench-availability-", dir=args.dir)
    try:
        site = os.path.join(root, "site")
        state = os.path.join(site, "state")
        os.makedirs(state, mode=0o700)
        token = provision(state, 200)
        phases: dict[str, Any] = {}
        port = free_port()
        proc = start_serve(site, port)
        try:
            with Sampler(proc.pid) as sampler:
                for attack in ("baseline", *ATTACKS):
                    phases[attack] = attack_phase(port, token, args.seconds, attack, sampler)
                sampler.sample()
        finally:
            exit_status = stop_serve(proc)
        row_bytes = audited_row_bytes(site, state, token)
        flood = flood_phase(site, state, token, args.requests)
        timing = timing_phase(root, args.timing_rounds)
        rss = max(sampler.rss_kib / 1024, flood["serve_rss_max_mib"])
        threads = max(sampler.threads, flood["serve_threads_max"])
        baseline_growth = row_bytes * flood["requests"]
        met = {f"{a}_p99": phases[a]["p99_ms"] <= 250 for a in ATTACKS}
        met |= {f"{a}_errors": phases[a]["errors"] == 0 for a in ATTACKS}
        met |= {
            "rss": rss <= 26,
            "threads": threads <= 8,
            "flood_growth": flood["database_growth_bytes"] <= 1024 * 1024,
            "flood_operator": flood["operator"]["errors"] == 0 and flood["operator"]["p99_ms"] <= 250,
        }
        result: dict[str, Any] = {
            "benchmark": "availability",
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "profile": "edge",
            "seconds_per_phase": args.seconds,
            "operator_interval_ms": int(OPERATOR_INTERVAL_S * 1000),
            "phases": phases,
            "serve_exit": exit_status,
            "serve_rss_max_mib": round(rss, 1),
            "serve_threads_max": threads,
            "flood": flood,
            "audited_row_bytes": round(row_bytes, 1),
            "flood_baseline_growth_bytes": round(baseline_growth),
            "timing": timing,
            "targets": {"operator_p99_ms_max": 250, "operator_errors": 0, "serve_rss_max_mib": 26,
                        "serve_threads_max": 8, "flood_growth_bytes_max": 1024 * 1024},
            "met": met,
        }
        print(json.dumps(result))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
