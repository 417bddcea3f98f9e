"""``make bench``'s runner end to end on two real (quick) benchmarks: it runs them, writes
the document with the machine, the commands and a table per benchmark, and reports a
failing benchmark as failed (exit 1) instead of dropping it. No figure is asserted."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

from tests.support.cli import REPO

RUNNER = pathlib.Path(REPO) / "benchmarks" / "run_all.py"


def _run(tmp_path: pathlib.Path, *names: str, bench_dir: pathlib.Path | None = None) -> tuple[int, str, str]:
    output = tmp_path / "benchmarks.md"
    runner = RUNNER if bench_dir is None else bench_dir / "run_all.py"
    proc = subprocess.run([sys.executable, str(runner), "--quick", "--output", str(output), "--only", *names],
                          capture_output=True, text=True, timeout=240, check=False)
    return proc.returncode, output.read_text() if output.exists() else "", proc.stderr


@pytest.mark.slow
def test_runner_writes_the_document(tmp_path: pathlib.Path) -> None:
    status, text, stderr = _run(tmp_path, "startup")
    assert status == 0, stderr
    assert text.startswith("# Benchmarks\n")
    for needle in ("## Machine", "| CPU |", "| Python |", "| System |", "## Summary", "## startup",
                   "Command: `python benchmarks/bench_startup.py --runs 5`", "quick smoke run",
                   "| `--help` heavy modules (ssl, sqlite3, socket, http, subprocess) | none |", "raw JSON",
                   "## Recorded by hand", "### Issue 27 (the refactor)"):
        assert needle in text, needle


def test_a_failing_benchmark_is_reported_and_fails_the_run(tmp_path: pathlib.Path) -> None:
    """A benchmark that crashes is listed as failed, with its error, and the exit is 1."""
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    for name in ("run_all.py", "tables.py"):
        shutil.copy(pathlib.Path(REPO) / "benchmarks" / name, bench / name)
    (bench / "bench_broken.py").write_text("raise SystemExit('broken on purpose')\n")
    status, text, _ = _run(tmp_path, "broken", bench_dir=bench)
    assert status == 1
    assert "| broken | **failed** |" in text and "broken on purpose" in text


def test_a_process_left_behind_is_named_and_stopped(tmp_path: pathlib.Path) -> None:
    """A benchmark whose job outlives it (holding its stdout) neither hangs the runner nor
    keeps running: the document names it."""
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    for name in ("run_all.py", "tables.py"):
        shutil.copy(pathlib.Path(REPO) / "benchmarks" / name, bench / name)
    marker = tmp_path / "leaked.pid"
    (bench / "bench_leaky.py").write_text(
        "import json, subprocess\n"
        "job = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        f"open({str(marker)!r}, 'w').write(str(job.pid))\n"
        "print(json.dumps({'benchmark': 'leaky'}))\n")
    status, text, stderr = _run(tmp_path, "leaky", bench_dir=bench)
    assert status == 0, stderr
    assert "**It left 1 process(es) behind** (killed by the runner): `sleep 300`" in text
    pid = int(marker.read_text())
    assert not pathlib.Path(f"/proc/{pid}").exists()
