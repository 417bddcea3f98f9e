"""benchmarks/bench_local_api.py still runs end to end (tiny sizes; nothing is timed here)."""

from __future__ import annotations

from tests.support.cli import benchmark_result


def test_benchmark_prints_one_json_object() -> None:
    result = benchmark_result("bench_local_api.py", "--runs", "40", "--cancels", "5", "--reads", "3", "--repeat", "1",
                              timeout=120)
    assert result["unexpected_responses"] == 0, result["unexpected_by_status"]
    for key in ("cancellations_per_s", "raw_sqlite_cancellations_per_s", "ratio_vs_raw", "run_list_p50_ms",
                "run_list_p99_ms", "server_rss_max_mib", "server_threads_max"):
        assert isinstance(result[key], (int, float)) and result[key] > 0, key
