"""Each cron ``pull`` cycle's RAM facts (issue 26 item 5): ``cycles.json`` in the runtime
directory and, when ``worker.metricsTextfile`` is set, the node_exporter textfile (0644,
atomic rename, RAM only, checked by ``promtool check metrics``)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from qinglong_edge.worker.delivery.cycle_status import in_ram
from tests.cli.test_pull_imports import FORBIDDEN, IMPORT_COST, PROBE
from tests.support.cluster_double import ClusterDouble
from tests.support.observe_tools import require_tool
from tests.support.pull_env import REPO, PullEnv, child_env

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ram_dir() -> Iterator[pathlib.Path]:
    """A fresh directory on tmpfs (/dev/shm), as node_exporter's textfile directory would be."""
    base = pathlib.Path("/dev/shm")
    if not base.is_dir() or not in_ram(str(base / "probe")):
        pytest.skip("/dev/shm is not a tmpfs here")
    path = base / f"qle-metrics-{uuid.uuid4().hex}"
    path.mkdir(mode=0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _value(text: str, sample: str) -> float:
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{sample} not in\n{text}")


def test_idle_cycles_rewrite_the_textfile_in_ram(tmp_path: pathlib.Path, ram_dir: pathlib.Path) -> None:
    textfile = ram_dir / "qinglong_edge.prom"
    with ClusterDouble(tasks=()) as cluster:
        env = PullEnv(tmp_path, cluster, metricsTextfile=str(textfile))
        assert env.pull().status == 0
        first = textfile.read_text()
        assert env.pull().status == 0
    text = textfile.read_text()
    assert stat.S_IMODE(textfile.stat().st_mode) == 0o644
    assert [p.name for p in ram_dir.iterdir()] == ["qinglong_edge.prom"]  # no temp file left
    assert _value(first, 'qinglong_edge_pull_cycles_total{status="idle"}') == 1
    assert _value(text, 'qinglong_edge_pull_cycles_total{status="idle"}') == 2
    assert _value(text, "qinglong_edge_pull_last_cycle_success") == 1
    assert _value(text, "qinglong_edge_pull_last_cycle_exit_status") == 0
    assert _value(text, "qinglong_edge_pull_claims_total") == 0
    assert _value(text, "qinglong_edge_pull_last_cycle_timestamp_seconds") > 1.7e9
    state = json.loads((env.runtime / "cycles.json").read_text())
    assert state["lastCycle"]["status"] == "idle" and state["failures"] == []
    promtool = require_tool("promtool")
    checked = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30,
                             check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_an_accepting_cycle_counts_a_claim_and_the_inbox(tmp_path: pathlib.Path, ram_dir: pathlib.Path) -> None:
    textfile = ram_dir / "qinglong_edge.prom"
    with ClusterDouble(tasks=("shell",)) as cluster:
        env = PullEnv(tmp_path, cluster, metricsTextfile=str(textfile))
        assert env.pull().status == 0
    text = textfile.read_text()
    assert _value(text, "qinglong_edge_pull_claims_total") == 1
    assert 'qinglong_edge_pull_inbox_records{state="' in text


def test_without_the_textfile_an_idle_cycle_writes_nothing_more(tmp_path: pathlib.Path) -> None:
    with ClusterDouble(tasks=()) as cluster:
        env = PullEnv(tmp_path, cluster)
        assert env.pull().status == 0
        assert env.pull().status == 0
    assert not (env.runtime / "cycles.json").exists()


def test_a_failed_cycle_is_kept_in_ram_and_counted(tmp_path: pathlib.Path, ram_dir: pathlib.Path) -> None:
    textfile = ram_dir / "qinglong_edge.prom"
    with ClusterDouble(tasks=()) as cluster:
        env = PullEnv(tmp_path, cluster)
        assert env.pull().status == 0
    # the cluster is gone: the next cycles fail (unavailable), with or without the textfile
    outcome = env.pull()
    assert outcome.status == 75
    state = json.loads((env.runtime / "cycles.json").read_text())
    assert state["lastCycle"]["exitStatus"] == 75 and len(state["failures"]) == 1
    assert state["failures"][0]["reason"]
    env.write_config(metricsTextfile=str(textfile))
    # the failed attempt backed off with full jitter: a cycle before it is due exits 0
    # ("backoff") without an attempt, so wait for the claim to be due (flaky otherwise)
    claim = env.claim()
    assert claim is not None
    env.wait_until_due(claim)
    assert env.pull().status == 75
    text = textfile.read_text()
    assert _value(text, "qinglong_edge_pull_last_cycle_success") == 0
    assert _value(text, "qinglong_edge_pull_last_cycle_exit_status") == 75
    reason = state["failures"][0]["reason"]
    assert _value(text, f'qinglong_edge_pull_failures_total{{reason="{reason}"}}') == 2


def test_a_textfile_not_in_ram_is_never_written(tmp_path: pathlib.Path) -> None:
    disk = tmp_path / "on-disk"
    disk.mkdir()
    if in_ram(str(disk / "x")):
        pytest.skip("the test directory itself is on tmpfs here")
    with ClusterDouble(tasks=()) as cluster:
        env = PullEnv(tmp_path, cluster, metricsTextfile=str(disk / "qinglong_edge.prom"))
        first = env.pull()
        second = env.pull()
    assert first.status == 0 and second.status == 0  # the cycle itself never fails for it
    assert list(disk.iterdir()) == []
    assert "metrics_textfile_not_in_ram" in first.stderr
    assert "metrics_textfile_not_in_ram" not in second.stderr  # once per boot


def test_in_ram_reads_mountinfo(tmp_path: pathlib.Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text("22 1 0:21 / / rw - ext4 /dev/root rw\n"
                    "25 22 0:23 / /run rw,nosuid - tmpfs tmpfs rw\n"
                    "26 25 0:24 / /run/media\\040x rw - vfat /dev/sda1 rw\n")
    assert in_ram("/run/node-exporter/q.prom", str(info))
    assert not in_ram("/etc/q.prom", str(info))
    assert not in_ram("/run/media x/q.prom", str(info))
    assert not in_ram("/run/q.prom", str(tmp_path / "absent"))


def test_an_idle_cycle_with_the_textfile_imports_nothing_heavy(tmp_path: pathlib.Path,
                                                              ram_dir: pathlib.Path) -> None:
    with ClusterDouble(tasks=()) as cluster:
        env = PullEnv(tmp_path, cluster, metricsTextfile=str(ram_dir / "q.prom"))
        proc = subprocess.run([sys.executable, "-S", "-c", PROBE, "--config", str(env.config_path), "pull",
                               "--no-splay"], capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=30,
                              check=False)
    assert proc.returncode == 0, proc.stderr
    line = [text for text in proc.stderr.splitlines() if text.startswith("MODULES=")][-1]
    modules = set(json.loads(line[len("MODULES="):]))
    assert "qinglong_edge.worker.delivery.cycle_status" in modules  # the probe sees it ran
    assert sorted((set(FORBIDDEN) | set(IMPORT_COST)) & modules) == []
    assert os.path.exists(ram_dir / "q.prom")
