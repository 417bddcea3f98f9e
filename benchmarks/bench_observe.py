"""Benchmark: what the status console, ``/metrics`` and run.log.read cost (issue 26).

Run: ``python benchmarks/bench_observe.py [--requests 400] [--repeat 3] [--cycles 12]``.
Prints ONE JSON object. Three parts, each with its baseline in the same run:

* ``rss``: a real ``serve`` (edge profile, 1,000 Runs) with ``localApi.console`` and
  ``localApi.metrics`` on, against the same ``serve`` with both off (the baseline). Idle
  RSS (``VmRSS`` 1 s after start) and the maximum under load: 4 keep-alive clients,
  ``--requests`` each, authenticated ``run.list`` in both; ours interleaves ``/metrics``,
  ``/`` and ``/console.js``. Target: ours <= baseline + 1 MiB, idle and under load.
* ``latency``: the standalone profile with 1,000 Runs stored: the p50/p99 of a ``/metrics``
  scrape and of a 32 KiB ``run.log.read`` (of a 40 KiB log; base64 in JSON), one client,
  ``--requests`` each; baseline ``run.get`` (the cheapest audited read) on the same
  server. Target: p99 <= 10 ms each.
* ``pull``: ``--cycles`` idle cron cycles (the real CLI against the TLS cluster double)
  with ``worker.metricsTextfile`` on ``/dev/shm`` (tmpfs), against the same cycles
  without it: bytes written and fsyncs under the state directory (``strace``, flash) and
  the children's CPU time (user + system, ``getrusage``). Targets: 0 bytes and 0 fsyncs
  on flash, CPU <= +3 %.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_local_api import Client, Sampler, free_port, percentile, provision  # noqa: E402

from qinglong_edge.local.store import Store, write_transaction  # noqa: E402
from tests.support.cluster_double import ClusterDouble  # noqa: E402
from tests.support.idle_writes import strace_path, trace_cycle  # noqa: E402
from tests.support.pull_env import PullEnv  # noqa: E402

RUNS = 1000
LOG_BYTES = 40 * 1024


def _serve(site: str, *, profile: str, on: bool) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    config = os.path.join(site, "config.json")
    local: dict[str, Any] = {"listener": {"host": "127.0.0.1", "port": port}}
    if on:
        local.update(console=True, metrics=True)
    document = {"schema": "qinglong/edge-agent@v1", "profile": profile, "stateDirectory": os.path.join(site, "state"),
                "localApi": local, "execution": {"logDirectory": os.path.join(site, "logs")}}
    with open(config, "w", encoding="utf-8") as handle:
        json.dump(document, handle)
    stderr = open(os.path.join(site, f"serve-{uuid.uuid4().hex[:6]}.log"), "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([sys.executable, "-m", "qinglong_edge", "--config", config, "serve"], stderr=stderr,
                            env=dict(os.environ, PYTHONPATH=REPO), cwd=REPO)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            Client(port, "x").close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("serve did not start")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(30)


def _site(root: str, name: str) -> tuple[str, str]:
    site = os.path.join(root, name)
    state = os.path.join(site, "state")
    os.makedirs(state, mode=0o700)
    os.makedirs(os.path.join(site, "logs"), mode=0o700)
    token = provision(state, RUNS)
    return site, token


def _with_log(site: str) -> tuple[str, str]:
    """One finished attempt of run-000000 with a 40 KiB log; returns (run id, attempt id)."""
    run_id, attempt_id = "run-000000", "attempt-bench"
    with Store.open(os.path.join(site, "state", "local.db"), profile="edge") as store:
        def insert(conn: Any) -> None:
            with write_transaction(conn):
                conn.execute(
                    'INSERT INTO "RunAttempts" (id, run_id, attempt, status, executor_type, log_artifact_id,'
                    " callback_sequence, created_at_ms, started_at_ms) VALUES (?, ?, 1, 'running', 'local_process',"
                    " ?, 0, 1, 2)", (attempt_id, run_id, "local-" + "c" * 30))
        store.run(insert)
    path = os.path.join(site, "logs", f"{run_id}_{attempt_id}.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, (b"0123456789abcdef" * (LOG_BYTES // 16)))
    os.close(fd)
    return run_id, attempt_id


def _load(port: int, token: str, per_client: int, extra: list[str]) -> None:
    targets = ["/api/v3/projects/default/runs?limit=32", *extra]

    def one() -> None:
        client = Client(port, token)
        try:
            for i in range(per_client):
                target = targets[i % len(targets)]
                status, _ = client.request("GET", target)
                # one scrape at a time: a concurrent /metrics is 503 by design
                if status != 200 and not (status == 503 and target == "/metrics"):
                    raise RuntimeError(f"unexpected {status} for {target}")
        finally:
            client.close()

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def bench_rss(root: str, requests: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, on in (("baseline", False), ("ours", True)):
        site, token = _site(root, f"rss-{name}")
        proc, port = _serve(site, profile="edge", on=on)
        try:
            time.sleep(1.0)
            idle = Sampler(proc.pid)
            idle.sample()
            with Sampler(proc.pid) as sampler:
                _load(port, token, requests, ["/metrics", "/", "/console.js"] if on else [])
            out[name] = {"idle_mib": round(idle.rss_kib / 1024, 2), "load_max_mib": round(sampler.rss_kib / 1024, 2)}
        finally:
            _stop(proc)
    out["idle_delta_mib"] = round(out["ours"]["idle_mib"] - out["baseline"]["idle_mib"], 2)
    out["load_delta_mib"] = round(out["ours"]["load_max_mib"] - out["baseline"]["load_max_mib"], 2)
    return out


def _timed(client: Client, target: str, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        status, body = client.request("GET", target)
        samples.append((time.perf_counter() - started) * 1000)
        if status != 200:
            raise RuntimeError(f"{target}: {status} {body[:200]!r}")
    return samples


def bench_latency(root: str, requests: int) -> dict[str, Any]:
    site, token = _site(root, "latency")
    run_id, attempt_id = _with_log(site)
    proc, port = _serve(site, profile="standalone", on=True)
    try:
        client = Client(port, token)
        log = f"/api/v3/projects/default/runs/{run_id}/attempts/{attempt_id}/log?offset=0&length=32768"
        _timed(client, "/metrics", 20)  # warm-up
        _timed(client, log, 20)
        results = {}
        for name, target in (("metrics", "/metrics"), ("log_read_32k", log),
                             ("run_get", f"/api/v3/projects/default/runs/{run_id}")):
            samples = _timed(client, target, requests)
            results[name] = {"p50_ms": round(statistics.median(samples), 2),
                             "p99_ms": round(percentile(samples, 0.99), 2)}
        client.close()
    finally:
        _stop(proc)
    return results


def bench_pull(root: str, cycles: int) -> dict[str, Any]:
    """Baseline and ours alternate, cycle by cycle, so the machine's drift hits both."""
    shm = pathlib.Path("/dev/shm") / f"qle-bench-{uuid.uuid4().hex}"  # noqa: S108 - a fresh tmpfs directory
    shm.mkdir(mode=0o755)
    env_vars = {k: v for k, v in os.environ.items() if not k.startswith(("QINGLONG_EDGE_", "PYTHON"))}
    env_vars["PYTHONPATH"] = REPO
    out: dict[str, Any] = {}
    try:
        with ClusterDouble() as cluster:
            sides = {}
            for name, textfile in (("baseline", None), ("ours", str(shm / "qinglong_edge.prom"))):
                work = pathlib.Path(root) / f"pull-{name}"
                work.mkdir(parents=True)
                env = PullEnv(work, cluster, **({} if textfile is None else {"metricsTextfile": textfile}))
                argv = [sys.executable, "-m", "qinglong_edge", "--config", str(env.config_path), "pull", "--no-splay"]
                subprocess.run(argv, env=env_vars, cwd=REPO, capture_output=True, timeout=60, check=True)
                sides[name] = (work, env, argv)
            cpu = {"baseline": 0.0, "ours": 0.0}
            for _ in range(cycles):
                for name, (_, _, argv) in sides.items():
                    before = resource.getrusage(resource.RUSAGE_CHILDREN)
                    subprocess.run(argv, env=env_vars, cwd=REPO, capture_output=True, timeout=60, check=True)
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu[name] += (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            for name, (work, env, argv) in sides.items():
                flash: dict[str, int] = {"bytes": -1, "fsyncs": -1}
                if strace_path() is not None:
                    _, writes = trace_cycle(argv, env.state_dir, work / "trace.txt", env=env_vars, cwd=REPO)
                    flash = {"bytes": writes.bytes_written, "fsyncs": writes.fsyncs}
                out[name] = {"cpu_ms_per_cycle": round(cpu[name] * 1000 / cycles, 1),
                             "flash_bytes_per_cycle": flash["bytes"], "flash_fsyncs_per_cycle": flash["fsyncs"]}
        out["textfile_bytes"] = (shm / "qinglong_edge.prom").stat().st_size
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    out["cpu_ratio"] = round(out["ours"]["cpu_ms_per_cycle"] / max(0.001, out["baseline"]["cpu_ms_per_cycle"]), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=12)
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="bench-observe-")
    try:
        rss = [bench_rss(os.path.join(root, f"r{i}"), args.requests) for i in range(args.repeat)]
        latency = [bench_latency(os.path.join(root, f"l{i}"), args.requests) for i in range(args.repeat)]
        pull = [bench_pull(os.path.join(root, f"p{i}"), args.cycles) for i in range(args.repeat)]
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def med(items: list[dict[str, Any]], *path: str) -> float:
        values = []
        for item in items:
            node: Any = item
            for key in path:
                node = node[key]
            values.append(node)
        return float(statistics.median(values))

    result = {
        "rss": {"idle_delta_mib": med(rss, "idle_delta_mib"), "load_delta_mib": med(rss, "load_delta_mib"),
                "ours_idle_mib": med(rss, "ours", "idle_mib"), "baseline_idle_mib": med(rss, "baseline", "idle_mib"),
                "ours_load_max_mib": med(rss, "ours", "load_max_mib"),
                "baseline_load_max_mib": med(rss, "baseline", "load_max_mib")},
        "latency": {name: {"p50_ms": med(latency, name, "p50_ms"), "p99_ms": med(latency, name, "p99_ms")}
                    for name in ("metrics", "log_read_32k", "run_get")},
        "pull": {"cpu_ms_per_cycle_ours": med(pull, "ours", "cpu_ms_per_cycle"),
                 "cpu_ms_per_cycle_baseline": med(pull, "baseline", "cpu_ms_per_cycle"),
                 "cpu_ratio": med(pull, "cpu_ratio"),
                 "flash_bytes_per_cycle_ours": med(pull, "ours", "flash_bytes_per_cycle"),
                 "flash_fsyncs_per_cycle_ours": med(pull, "ours", "flash_fsyncs_per_cycle"),
                 "textfile_bytes": med(pull, "textfile_bytes")},
        "runs_stored": RUNS,
        "targets": {"rss_delta_mib": 1.0, "p99_ms": 10.0, "flash_bytes": 0, "cpu_ratio": 1.03},
        "units": {"rss": "MiB", "latency": "ms", "cpu": "ms per cycle (user + system)"},
    }
    result["met"] = {
        "rss": result["rss"]["idle_delta_mib"] <= 1.0 and result["rss"]["load_delta_mib"] <= 1.0,
        "metrics_p99": result["latency"]["metrics"]["p99_ms"] <= 10.0,
        "log_read_p99": result["latency"]["log_read_32k"]["p99_ms"] <= 10.0,
        "flash": (result["pull"]["flash_bytes_per_cycle_ours"] == 0
                  and result["pull"]["flash_fsyncs_per_cycle_ours"] == 0),
        "cpu": result["pull"]["cpu_ratio"] <= 1.03,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
