"""qinglong-edge.pyz end to end (issue 11): a real pull cycle and a real cancel from a
read-only copy of the zipapp (0444 file in a 0555 directory) under ``python3 -I``.

The working directory is an empty directory elsewhere, the environment is only PATH and
LANG, and the child runs with ``-v``: every ``qinglong_edge`` module it loads must come
from the copy's zipimporter and nothing from this checkout (``-I`` still reads the
virtualenv's site-packages, whose editable install points here, so "it ran" alone would
prove nothing). Nothing may be written next to the archive nor in the working directory.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator

import pytest

from tests.packaging.conftest import REPO, Dist, read_only_copy, snapshot
from tests.support.cli import Entry, agent_imports, assert_agent_loaded_from, isolated_entry
from tests.support.cluster_double import ClusterDouble
from tests.support.local_site import LocalSite, start_and_cancel
from tests.support.pull_env import PullEnv


@pytest.fixture
def workdir(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "cwd"
    path.mkdir()
    return path


@pytest.fixture
def pyz(dist: Dist, workdir: pathlib.Path) -> Iterator[pathlib.Path]:
    with read_only_copy(dist.pyz) as copy:
        before = snapshot(copy.parent)
        yield copy
        assert snapshot(copy.parent) == before, "something was written next to the zipapp"
    assert list(workdir.iterdir()) == [], "something was written in the working directory"


def _zipapp(pyz: pathlib.Path, workdir: pathlib.Path) -> Entry:
    return isolated_entry(pyz, cwd=workdir, flags=("-v",), name="zipapp")


def test_pull_cycle_and_inbox_from_a_read_only_zipapp(pyz: pathlib.Path, workdir: pathlib.Path,
                                                      cluster: ClusterDouble, tmp_path: pathlib.Path) -> None:
    device = PullEnv(tmp_path, cluster, entry=_zipapp(pyz, workdir))
    outcome = device.pull("--json")
    assert outcome.status == 0, outcome.stdout + outcome.stderr[-4000:]
    line = outcome.last()
    assert (line["session"]["action"], line["status"], line["reason"]) == ("registered", "accepted", "new_claim")
    inbox = device.inbox()
    assert list(inbox) == [line["offerId"]] == list(cluster.state.leases_by_offer())
    # executed from the read-only zipapp too (the job wrapper's program is read through its loader)
    assert inbox[line["offerId"]]["state"] == "completion_acknowledged"
    assert cluster.completion(line["runId"])["status"] == "succeeded"
    assert device.claim() is None
    assert_agent_loaded_from(outcome.stderr, pyz, {"qinglong_edge.cli", "qinglong_edge.commands.pull",
                                                   "qinglong_edge.worker.ingress.transport", "qinglong_edge.worker.journal.store"})

    listed = device.cli("inbox", "list", "--json")
    assert listed.status == 0, listed.stderr[-4000:]
    offers = json.loads(listed.stdout)["offers"]
    assert [(row["offerId"], row["state"], row["runId"]) for row in offers] == [
        (line["offerId"], "completion_acknowledged", line["runId"])]


@pytest.mark.slow
def test_admin_serve_and_cancel_from_a_read_only_zipapp(pyz: pathlib.Path, workdir: pathlib.Path,
                                                        tmp_path: pathlib.Path) -> None:
    site = LocalSite(tmp_path, _zipapp(pyz, workdir))
    try:
        site.provision()
        serve = site.serve()
        start_and_cancel(site)
        assert serve.stop() == 0, serve.stderr()[-4000:]
        assert_agent_loaded_from(serve.stderr(), pyz, {"qinglong_edge.commands.serve", "qinglong_edge.local.server",
                                                       "qinglong_edge.execution.controller",
                                                       "qinglong_edge.process.spawn"})
    finally:
        site.close()


def test_the_origin_check_sees_modules_loaded_from_the_checkout(pyz: pathlib.Path, workdir: pathlib.Path) -> None:
    """The -v check above can fail: a child that takes the package from this checkout is caught."""
    probe = isolated_entry("-c", cwd=workdir, flags=("-v",))
    result = probe.run(f"import sys; sys.path.insert(0, {str(REPO)!r}); import qinglong_edge.cli")
    assert result.status == 0, result.stderr[-2000:]
    imports = agent_imports(result.stderr)
    assert "qinglong_edge.cli" in imports.modules
    assert any(source.startswith(f"{REPO}/qinglong_edge/") for source in imports.outside(str(pyz)))
