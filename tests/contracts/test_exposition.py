"""The Prometheus text format writer (contracts/exposition.py)."""

from __future__ import annotations

import pytest

from qinglong_edge.contracts.exposition import Family, histogram_family, render


def test_families_samples_and_escapes() -> None:
    text = render([
        Family("a_total", "counter", 'help with \\ and\nnewline').add(3, (("reason", 'q"uote\\\n'),)),
        Family("b", "gauge", "g").add(0.5).add(float("inf"), (("x", "1"),)).add(float("nan"), (("x", "2"),)),
    ]).decode()
    assert text == ('# HELP a_total help with \\\\ and\\nnewline\n# TYPE a_total counter\n'
                    'a_total{reason="q\\"uote\\\\\\n"} 3\n'
                    '# HELP b g\n# TYPE b gauge\nb 0.5\nb{x="1"} +Inf\nb{x="2"} NaN\n')


def test_a_histogram_is_cumulative_and_ends_with_inf() -> None:
    text = render([histogram_family("h_seconds", "h", (0.1, 1.0), (2, 1, 4), total=9.5, count=7)]).decode()
    assert text.splitlines()[2:] == ['h_seconds_bucket{le="0.1"} 2', 'h_seconds_bucket{le="1.0"} 3',
                                     'h_seconds_bucket{le="+Inf"} 7', "h_seconds_sum 9.5", "h_seconds_count 7"]


@pytest.mark.parametrize("name", ["", "9x", "a-b", "a b", "é"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="bad metric family"):
        Family(name, "gauge", "x")
    with pytest.raises(ValueError, match="bad label name"):
        Family("ok", "gauge", "x").add(1, ((name or "__x", "v"),))
