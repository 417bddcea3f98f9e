"""Fixtures shared by every test folder. A fixture one folder shares lives in that folder's
conftest.py; the servers and helpers fixtures use live in tests/support/."""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Iterator

import pytest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from qinglong_edge.process.cgroups import CgroupManager, RunCgroup
    from tests.support.cluster_double import ClusterDouble
    from tests.support.openwrt_tools import OpenwrtTools

REPO = pathlib.Path(__file__).resolve().parent.parent
CORPORA_ENV = "QINGLONG_EDGE_CORPORA"


def corpora_dir() -> pathlib.Path:
    """The external corpora: $QINGLONG_EDGE_CORPORA, else ../shared/corpora next to the clone."""
    env = os.environ.get(CORPORA_ENV)
    candidates = [pathlib.Path(env)] if env else []
    candidates += [REPO.parent / "shared" / "corpora", REPO.parent.parent / "shared" / "corpora"]
    for candidate in candidates:
        if (candidate / "README.md").is_file():
            return candidate
    pytest.fail(
        f"external corpora not found (set {CORPORA_ENV} or place ../shared/corpora beside the clone)"
    )


@pytest.fixture(scope="session")
def corpora() -> pathlib.Path:
    return corpora_dir()


#: The shipped defaults' shared RAM directory (UCI log/work directories): one per machine, so a
#: test that lets an agent make it, as root, breaks a later one whose agent runs as nobody.
SHIPPED_RAM_ROOT = pathlib.Path("/tmp/qinglong-edge")


@pytest.fixture(autouse=True)
def _no_shipped_ram_directory() -> Iterator[None]:
    """Every test keeps its agents' directories in its own temp root (a regression: a root
    pull made /tmp/qinglong-edge/remote-logs/work, and the service test's pull, as nobody,
    then failed every launch with ``work_unavailable``)."""
    existed = SHIPPED_RAM_ROOT.exists()
    yield
    if not existed and SHIPPED_RAM_ROOT.exists():
        made = sorted(str(path) for path in SHIPPED_RAM_ROOT.rglob("*"))[:8]
        pytest.fail(f"the test made {SHIPPED_RAM_ROOT} (shared by the machine's tests): {made}; "
                    "give its agents directories below tmp_path")


@pytest.fixture
def private_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """A 0700 directory for state that must not be group/other accessible."""
    path = tmp_path / "private"
    path.mkdir(mode=0o700)
    path.chmod(0o700)
    return path


def python_cli() -> list[str]:
    """argv prefix that runs the real CLI in a child interpreter."""
    return [sys.executable, "-m", "qinglong_edge"]


@pytest.fixture(scope="session")
def openwrt_tools() -> OpenwrtTools:
    """OpenWrt's real opkg-cl and uci (tests/support/openwrt_tools.py): skip with the reason when
    they are not built, fail instead under $QINGLONG_EDGE_REQUIRE_OPENWRT_TOOLS=1 (.ci/run)."""
    from tests.support.openwrt_tools import REQUIRE_ENV, find_tools

    found = find_tools()
    if isinstance(found, str):
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{found} (required: ${REQUIRE_ENV}=1)")
        pytest.skip(found)
    return found


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[ClusterDouble]:
    """One started cluster double (TLS 1.3 mTLS, tests/support/cluster_double.py) per test
    module, with the reference's 30 s run lease; stopped after the module. A test resets it
    (``shared_cluster.reset()``) so that each starts from a fresh cluster."""
    from tests.support.cluster_double import ClusterDouble

    with ClusterDouble() as double:
        yield double


@pytest.fixture(scope="module")
def shared_remote_cluster() -> Iterator[ClusterDouble]:
    """Like ``shared_cluster``, with the short run leases of tests/support/remote_env.py
    (``remote_cluster()``): a lease ends within seconds, so renewals and expiries are seen."""
    from tests.support.remote_env import remote_cluster

    with remote_cluster() as double:
        yield double


@pytest.fixture(scope="session")
def cgroup_manager() -> CgroupManager:
    """The machine's per-Run cgroups; tests needing them skip (with the reason) elsewhere."""
    from qinglong_edge.process.cgroups import CgroupManager

    if os.geteuid() != 0:
        pytest.skip("cgroups need root (CI runs as root)")
    manager = CgroupManager.detect("auto")
    if not manager.available:
        pytest.skip(f"no usable cgroup hierarchy: {manager.reason}")
    return manager


@pytest.fixture
def run_cgroup(cgroup_manager: CgroupManager) -> Iterator[RunCgroup]:
    """A fresh cgroup for one test; killed and removed afterwards."""
    from qinglong_edge.contracts.ids import new_uuid4

    group = cgroup_manager.create(f"test-{new_uuid4()}")
    assert group is not None
    yield group
    group.kill()
    from tests.support.wait import wait_until

    wait_until(group.remove, 2.0)
