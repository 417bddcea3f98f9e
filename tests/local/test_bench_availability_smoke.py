"""benchmarks/bench_availability.py still runs end to end (tiny sizes; nothing is timed or
compared with a target here: the figures are the benchmark's business)."""

from __future__ import annotations

import pytest

from tests.support.cli import benchmark_result


@pytest.mark.slow
def test_benchmark_prints_one_json_object() -> None:
    result = benchmark_result("bench_availability.py", "--seconds", "1", "--requests", "300", "--timing-rounds", "20",
                              timeout=180)
    for phase in ("baseline", "slowloris", "idle", "unauthenticated", "wrong_credentials"):
        assert result["phases"][phase]["requests"] > 0, phase
    assert result["flood"]["requests"] == 300
    assert set(result["flood"]["statuses"]) <= {"401", "429"}
    assert result["serve_exit"] == 0 and result["flood"]["serve_exit"] == 0
    assert set(result["met"]) >= {"slowloris_p99", "idle_errors", "wrong_credentials_p99", "wrong_credentials_errors",
                                  "flood_growth", "rss", "threads"}
    assert set(result["phases"]["wrong_credentials"]["attack"]["attacker_statuses"]) <= {"401", "429", "503"}
