"""The whole Local chain as an operator meets it: admin CLI -> serve -> task.start over HTTP ->
a real process -> POST cancellation (202) -> the process really stops -> replay (200) ->
restart serve -> still cancelled. No database access from the test: only the CLI and HTTP
(tests/support/local_site.py; the packaging tests run the same chain from the zipapp and
the installed package)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from tests.support.cli import repo_entry, split_entry
from tests.support.local_site import API, LocalSite, alive, cancel_and_verify, start_running


@pytest.fixture(params=[False, True], ids=["host-python", "openwrt_split"])
def site(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[LocalSite]:
    # openwrt_split: `python3 -I -S` with every module of an OpenWrt split package missing
    # from our Depends line refused (packaging.md 3.2/3.3): admin, serve, the controller
    # and the jobs' launch must work with what a router really has.
    s = LocalSite(tmp_path, split_entry() if request.param else repo_entry())
    s.provision()
    yield s
    s.close()


def test_cancel_over_http_stops_the_real_process_and_survives_restart(site: LocalSite) -> None:
    serve = site.serve()
    run = start_running(site)

    status, viewer = site.cancel(run.run_id, token=site.viewer_token)
    assert (status, viewer) == (403, {"code": "forbidden"})
    assert alive(run.pid)

    cancel_and_verify(site, run)

    status, replay = site.cancel(run.run_id)
    assert status == 200 and replay["status"] == "already_terminal" and replay["runStatus"] == "cancelled"

    assert serve.stop() == 0
    site.serve()
    assert site.run_status(run.run_id) == "cancelled"
    _, events = site.request("GET", f"{API}/runs/{run.run_id}/events")
    types = [event["type"] for event in events["events"]]
    assert types[:2] == ["run.created", "run.queued"]
    assert "run.cancel_requested" in types and types[-1] == "run.cancelled"


def test_a_second_serve_on_a_busy_port_leaves_the_running_runs_alone(tmp_path: pathlib.Path) -> None:
    # A confused operator starts `serve` again while the service runs: the second process
    # must fail on its listener (69) before it takes process authority, never adopt and
    # "shut down" the first one's Runs.
    site = LocalSite(tmp_path)
    site.provision()
    try:
        site.serve()
        run = start_running(site)
        second = site.entry.run("--config", str(site.config), "serve", timeout=60)
        assert second.status == 69, second.stderr
        assert "listener_unavailable" in second.stderr
        assert alive(run.pid)
        assert site.run_status(run.run_id) == "running"
        cancel_and_verify(site, run)
    finally:
        site.close()
