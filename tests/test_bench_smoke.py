"""Every benchmark of ``make bench`` runs to the end (``run_all.py --quick``, ~3 minutes).

Regression: ``bench_remote_execution.py`` found the pull from its job through
``/proc/$PPID/stat``; once jobs ran in their own PID namespace (issue 24) the job saw
no pull, its log held an error instead of ``ready``, and ``make bench`` failed after
the whole run (the launch figure had been silently negative before that). The slower
tier runs the whole plan so a benchmark broken by a change is seen before the record
run. No figure is asserted, only that each benchmark ran and measured something.

Regression: ``bench_inbox_week.py``'s virtual clock started on 2026-09-21, before
``clock.CLOCK_FLOOR_MS`` (issue 23): every simulated cycle failed ``clock_not_set``, no
offer was accepted, and the table still said "met" (0 refused, 0 entries).
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import pytest

from tests.support.cli import REPO

RUNNER = pathlib.Path(REPO) / "benchmarks" / "run_all.py"


def _raw(text: str, name: str) -> dict[str, object]:
    """The raw JSON block of benchmark ``name`` in the document."""
    section = text.split(f"\n## {name}\n", 1)[1]
    match = re.search(r"```json\n(.*?)\n```", section, re.S)
    assert match is not None, f"no raw JSON for {name}"
    value: dict[str, object] = json.loads(match.group(1))
    return value


@pytest.mark.matrix
def test_every_benchmark_runs_in_quick_mode(tmp_path: pathlib.Path) -> None:
    output = tmp_path / "benchmarks.md"
    proc = subprocess.run([sys.executable, str(RUNNER), "--quick", "--output", str(output)],
                          capture_output=True, text=True, timeout=900, check=False)
    text = output.read_text() if output.exists() else ""
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "**failed**" not in text
    remote = _raw(text, "remote_execution")
    launch = remote["launch"]
    assert isinstance(launch, dict)
    # CPU between the offered answer and the job's first instruction: a real, positive sample
    assert all(value > 0 for value in launch["cpu_ms_all"]), launch
    week = _raw(text, "inbox_week")
    for side in ("ours", "baseline"):
        run = week[side]
        assert isinstance(run, dict)
        assert not [status for status in run["statuses"] if status.startswith("failed")], run["statuses"]
        assert run["accepted"] > 0, run
