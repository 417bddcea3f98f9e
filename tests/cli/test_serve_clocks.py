"""Local Run deadlines on the boot clock (issue 23; spec README "Decisions for clocks"):
``serve`` with a real job, its wall clock stepped through the test-only shim
(tests/support/wallclock). Before: a Run with a 10-minute timeout ended ``timed_out`` one
second after a +1 h step; a -1 h step would have kept a 2 s timeout from firing for an hour.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Iterator

import pytest

from tests.support.cli import repo_entry
from tests.support.local_site import API, LocalSite
from tests.support.wait import wait_until
from tests.support.wall_clock import WallClock


@pytest.fixture
def wall(tmp_path: pathlib.Path) -> WallClock:
    return WallClock(tmp_path)


@pytest.fixture
def site(tmp_path: pathlib.Path, wall: WallClock) -> Iterator[LocalSite]:
    base = repo_entry()
    (tmp_path / "site").mkdir()
    s = LocalSite(tmp_path / "site", dataclasses.replace(base, env={**base.env, **wall.env()}))
    s.provision()
    yield s
    s.close()


def _start(site: LocalSite, task_id: str, timeout_ms: int) -> str:
    created = json.loads(site.cli("admin", "task", "create", "--project", "default", "--id", task_id, "--name",
                                  task_id, "--timeout-ms", str(timeout_ms), "--shell", "sleep 1000", "--json"))
    task = created["task"]
    status, started = site.request("POST", f"{API}/tasks/{task_id}/runs", {
        "schema": "qinglong/task-start@v1", "mutationId": f"0b1e2a4c-5d6e-4f70-8a9b-0c1d2e3f4a{timeout_ms % 100:02d}",
        "expectedRevision": task["revision"], "expectedContentDigest": task["contentDigest"]})
    assert status == 202, started
    run_id = str(started["runId"])
    site.wait_run_status(run_id, "running")
    return run_id


def test_a_wall_clock_step_forward_does_not_time_a_run_out(site: LocalSite, wall: WallClock) -> None:
    site.serve()
    run_id = _start(site, "ten-minutes", 600_000)
    wall.step(3_600_000)
    # The positive event: a second Run, started after the step, times out on its own 1 s
    # deadline; the controller's passes look at every deadline, so passes after the step
    # looked at the first one too. Nothing may have fired for it.
    probe = _start(site, "one-second", 1_050)
    site.wait_run_status(probe, "timed_out", timeout=20)
    assert site.run_status(run_id) == "running"
    status, cancelled = site.cancel(run_id)
    assert status == 202, cancelled
    site.wait_run_status(run_id, "cancelled")


def test_a_wall_clock_step_back_does_not_delay_a_timeout(site: LocalSite, wall: WallClock) -> None:
    site.serve()
    run_id = _start(site, "two-seconds", 2_000)
    wall.step(-3_600_000)
    # (read with the admin CLI: a credential issued "an hour ahead" of the stepped clock is
    # not valid yet over HTTP, a matter of the Local API's own credential window)
    wait_until(lambda: _status(site, run_id) == "timed_out", 20, interval=0.05, what="the Run to time out")


def _status(site: LocalSite, run_id: str) -> str:
    listed = json.loads(site.cli("admin", "runs", "list", "--project", "default", "--json"))
    return str(next(run["status"] for run in listed["runs"] if run["id"] == run_id))
