"""benchmarks/bench_local_api.py still runs end to end (tiny sizes; nothing is timed here)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.cli import REPO


def test_benchmark_prints_one_json_object() -> None:
    proc = subprocess.run(
        [sys.executable, "benchmarks/bench_local_api.py", "--runs", "40", "--cancels", "5", "--reads", "3",
         "--repeat", "1"],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["unexpected_responses"] == 0, result["unexpected_by_status"]
    for key in ("cancellations_per_s", "raw_sqlite_cancellations_per_s", "ratio_vs_raw", "run_list_p50_ms",
                "run_list_p99_ms", "server_rss_max_mib", "server_threads_max"):
        assert isinstance(result[key], (int, float)) and result[key] > 0, key
