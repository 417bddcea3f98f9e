"""Benchmark: the Local store and the Run logs stay within the storage caps (issue 16).

    python benchmarks/bench_storage_caps.py [--runs N] [--baseline-runs B] [--disk-runs D] [--dir DIR]

N Runs with output go through the real transactions (task.start, the launch claim,
running, completion: tests/support/run_history.py) with their log files written where
the launcher names them, plus one security audit row per Run (what the task.start
request's admission writes). The caps are the edge profile's defaults
(``RetentionCaps.from_config`` of a minimal edge config). Every 100 Runs (``serve``'s
pruning pass every 10 s at 10 Runs/s) the real :class:`Pruner` runs. Output per Run:
100-4000 bytes of text (a seeded PRNG), every 100th Run 64 KiB.

Measured:

* ``final`` and ``peak``: the database file (``page_count x page_size``, what the
  file takes; its used pages too) and the Run logs (bytes allocated on disk, what
  ``maxTotalLogBytes`` caps), after the last pass and at their highest just before a
  pass (the most the device holds between passes);
* every pruning step's duration (each step is one store operation, so the longest step
  is the longest the store's queue waits for pruning);
* ``baseline``: today's behaviour without pruning, B Runs of the same kind: database and
  log bytes per Run, and the same figures projected linearly to N Runs;
* ``disk_steps``: the step durations pruning D Runs over the cap on a disk-backed
  directory (fsync costs), since the N-Run part runs on a tmpfs when it can (root): the
  sizes are the same, the time is not.

Targets: after N Runs, database file <= ``databaseMaximumBytes`` and logs <=
``maxTotalLogBytes``. Reported, never asserted. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from qinglong_edge.config import parse_config  # noqa: E402
from qinglong_edge.local.retention import Pruner, PruneReport, RetentionCaps, measure_store  # noqa: E402
from qinglong_edge.local.run_logs import scan_logs  # noqa: E402
from tests.support.run_history import T0, History  # noqa: E402

PASS_EVERY = 100
TEXT = b"step 42: the quick brown fox jumps over the lazy dog 0123456789\n"


def _edge_caps(log_directory: str) -> RetentionCaps:
    config = parse_config({
        "schema": "qinglong/edge-agent@v1", "stateDirectory": "/var/lib/qle",
        "localApi": {"listener": {"host": "127.0.0.1", "port": 5700}},
        "execution": {"logDirectory": log_directory},
    })
    return RetentionCaps.from_config(config)


def _output(rng: random.Random, index: int) -> bytes:
    size = 64 * 1024 if index % 100 == 99 else rng.randint(100, 4000)
    return (TEXT * (size // len(TEXT) + 1))[:size]


@contextlib.contextmanager
def _workspace(base: str | None, *, want_tmpfs: bool) -> Iterator[tuple[str, str]]:
    """A fresh directory: a 512 MiB tmpfs when asked and root, else a temp directory."""
    parent = tempfile.mkdtemp(prefix="qle-bench-storage-", dir=base)
    mounted = False
    try:
        if want_tmpfs and os.geteuid() == 0:
            proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m,mode=0700", "tmpfs", parent],
                                  capture_output=True, check=False)
            mounted = proc.returncode == 0
        yield parent, "tmpfs" if mounted else "disk"
    finally:
        if mounted:
            subprocess.run(["umount", parent], capture_output=True, check=False)
        shutil.rmtree(parent, ignore_errors=True)


def _sizes(history: History) -> dict[str, int]:
    usage = history.store.run(measure_store)
    scan = scan_logs(history.log_directory)
    return {"database_file_bytes": usage.file_bytes, "database_used_bytes": usage.used_bytes,
            "log_bytes": scan.total_bytes, "log_files": scan.logs,
            "terminal_runs": usage.terminal_runs, "audit_rows": usage.audit_rows}


def _populate(history: History, runs: int, pruner: Pruner | None, report: PruneReport,
              step_ms: list[float]) -> dict[str, int]:
    """Add ``runs`` Runs and as many audit rows; a pruning pass every PASS_EVERY Runs.
    Returns the highest sizes seen just before a pass."""
    rng = random.Random(16)
    peak = {"database_file_bytes": 0, "log_bytes": 0}
    pending = 0
    for i in range(runs):
        now = T0 + i * 1000
        history.finished(now, _output(rng, i))
        pending += 1
        if pending < PASS_EVERY and i < runs - 1:
            continue
        history.audit(now, pending)
        pending = 0
        if pruner is None:
            continue
        pruner.clock = lambda at=now: at  # type: ignore[misc]
        before = _sizes(history)
        peak = {key: max(value, before[key]) for key, value in peak.items()}
        while True:
            started = time.perf_counter()
            if pruner.step(report) is None:
                break
            step_ms.append((time.perf_counter() - started) * 1000)
    return peak


def _main_part(runs: int, base: str | None) -> dict[str, Any]:
    with _workspace(base, want_tmpfs=True) as (root, fs):
        history = History.create(root)
        caps = _edge_caps(history.log_directory)
        pruner = Pruner(history.store, caps)
        report, steps = PruneReport(), []
        started = time.perf_counter()
        peak = _populate(history, runs, pruner, report, steps)
        seconds = time.perf_counter() - started
        final = _sizes(history)
        integrity = history.store.run(lambda c: c.execute("PRAGMA integrity_check").fetchone()[0])
        history.store.close()
    return {
        "fs": fs, "seconds": round(seconds, 1), "final": final, "peak_before_a_pass": peak,
        "pruned": report.to_json(), "integrity": integrity,
        "caps": {"database_maximum_bytes": caps.database_maximum_bytes, "max_total_log_bytes": caps.max_total_log_bytes,
                 "run_maximum_entries": caps.run_maximum_entries, "audit_maximum_entries": caps.audit_maximum_entries},
        "steps": {"count": len(steps), "max_ms": round(max(steps, default=0.0), 2),
                  "median_ms": round(statistics.median(steps), 2) if steps else 0.0},
    }


def _baseline(runs: int, target_runs: int, base: str | None) -> dict[str, Any]:
    with _workspace(base, want_tmpfs=True) as (root, fs):
        history = History.create(root)
        empty = _sizes(history)
        _populate(history, runs, None, PruneReport(), [])
        after = _sizes(history)
        history.store.close()
    db_per_run = (after["database_file_bytes"] - empty["database_file_bytes"]) / runs
    log_per_run = after["log_bytes"] / runs
    return {
        "fs": fs, "runs": runs, "database_file_bytes": after["database_file_bytes"], "log_bytes": after["log_bytes"],
        "database_bytes_per_run": round(db_per_run, 1), "log_bytes_per_run": round(log_per_run, 1),
        "projected_database_bytes": int(empty["database_file_bytes"] + db_per_run * target_runs),
        "projected_log_bytes": int(log_per_run * target_runs), "projected_for_runs": target_runs,
    }


def _disk_steps(runs: int, base: str | None) -> dict[str, Any]:
    with _workspace(base, want_tmpfs=False) as (root, fs):
        history = History.create(root)
        caps = _edge_caps(history.log_directory)
        keep = 10
        rng = random.Random(7)
        for i in range(runs + keep):
            history.finished(T0 + i * 1000, _output(rng, i))
        history.audit(T0, runs)
        low = RetentionCaps(100, caps.audit_retention_ms, keep, caps.run_retention_ms, caps.database_maximum_bytes,
                            caps.log_directory, caps.max_total_log_bytes)
        pruner, report, steps = Pruner(history.store, low, clock=lambda: T0 + runs * 1000), PruneReport(), []
        while True:
            started = time.perf_counter()
            if pruner.step(report) is None:
                break
            steps.append((time.perf_counter() - started) * 1000)
        history.store.close()
    return {"fs": fs, "runs_pruned": report.to_json()["runs"], "audit_rows_pruned": report.to_json()["auditRows"],
            "steps": len(steps), "max_ms": round(max(steps, default=0.0), 2),
            "median_ms": round(statistics.median(steps), 2) if steps else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--baseline-runs", type=int, default=2000)
    parser.add_argument("--disk-runs", type=int, default=400)
    parser.add_argument("--dir", help="where the temporary stores go (default: the system temp directory)")
    args = parser.parse_args()
    main_part = _main_part(args.runs, args.dir)
    final, caps = main_part["final"], main_part["caps"]
    met = {
        "database_within_cap": final["database_file_bytes"] <= caps["database_maximum_bytes"],
        "logs_within_cap": final["log_bytes"] <= caps["max_total_log_bytes"],
    }
    result = {
        "runs": args.runs, "pass_every_runs": PASS_EVERY, **main_part,
        "baseline": _baseline(args.baseline_runs, args.runs, args.dir),
        "disk_steps": _disk_steps(args.disk_runs, args.dir),
        "targets": {"database_file_bytes_max": caps["database_maximum_bytes"],
                    "log_bytes_max": caps["max_total_log_bytes"]},
        "met": met,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
