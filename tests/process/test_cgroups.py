"""Per-Run cgroups on the real kernel (v2 cgroup.kill, v1 freezer and pids)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qinglong_edge.contracts.ids import new_uuid4
from qinglong_edge.errors import ExecutionError
from qinglong_edge.process.cgroups import (
    PARENT,
    CgroupManager,
    Hierarchy,
    RunCgroup,
    find_hierarchies,
    own_cgroups,
    signal_pids,
)
from tests.support.jobs import alive, descendants_by_marker, kill_pids, read_text, reap, start_job, wait_until

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


@pytest.mark.parametrize(
    ("mountinfo", "expected"),
    [
        (HYBRID, [("v2", "/sys/fs/cgroup/unified"), ("freezer", "/sys/fs/cgroup/freezer"),
                  ("pids", "/sys/fs/cgroup/pids")]),
        ("30 1 0:26 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw,nsdelegate\n", [("v2", "/sys/fs/cgroup")]),
        ("30 1 0:26 /lxc/box /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", []),
        ("30 1 0:26 / /mnt/cg\\040x rw - cgroup cgroup rw,freezer,pids\n",
         [("freezer", "/mnt/cg x"), ("pids", "/mnt/cg x")]),
        ("30 1 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\nnot a mountinfo line\n", []),
    ],
    ids=["hybrid", "pure-v2", "bind-subtree-ignored", "escaped-path-both-controllers", "none"],
)
def test_finds_hierarchies_in_mountinfo(mountinfo: str, expected: list[tuple[str, str]]) -> None:
    assert [(h.kind, h.mount) for h in find_hierarchies(mountinfo)] == expected


def test_off_disables_cgroups() -> None:
    manager = CgroupManager.detect("off")
    assert not manager.available and "off" in manager.reason
    assert manager.create("abc") is None


def test_unreadable_mountinfo_disables_cgroups(tmp_path: object) -> None:
    manager = CgroupManager.detect("auto", mountinfo_path="/nonexistent/mountinfo")
    assert not manager.available


@pytest.mark.parametrize("name", ["", "../x", ".hidden", "a/b", "x" * 129], ids=["empty", "dotdot", "dot", "slash", "long"])
def test_rejects_names_outside_the_id_grammar(cgroup_manager: CgroupManager, name: str) -> None:
    with pytest.raises(ExecutionError):
        cgroup_manager.create(name)
    assert cgroup_manager.open(name) is None


def test_job_enters_its_cgroup_before_running(run_cgroup: RunCgroup, tmp_path: object) -> None:
    job = start_job("sleep 1000", str(tmp_path), cgroup=run_cgroup)
    try:
        assert wait_until(lambda: job.pid in run_cgroup.members())
        for kind, path in run_cgroup.paths.items():
            rel = path.split("/qinglong-edge/", 1)[1]
            lines = read_text(f"/proc/{job.pid}/cgroup").splitlines()
            assert any(line.endswith(f"/qinglong-edge/{rel}") for line in lines), (kind, lines)
    finally:
        reap(job.process)


def test_cgroup_kill_reaches_setsid_escapees(run_cgroup: RunCgroup, tmp_path: object) -> None:
    marker = "100017.25"
    job = start_job(f"setsid sh -c 'sleep {marker} & sleep {marker} & wait' & wait", str(tmp_path), cgroup=run_cgroup)
    try:
        assert wait_until(lambda: len(descendants_by_marker(marker)) == 2)
        escapees = descendants_by_marker(marker)
        assert all(os.getpgid(p) != job.pid for p in escapees)  # out of the process group
        assert set(escapees) <= run_cgroup.members()
        run_cgroup.kill()
        assert wait_until(lambda: not any(alive(p) for p in escapees))
        assert wait_until(lambda: not run_cgroup.live_members())
    finally:
        reap(job.process)
        kill_pids(descendants_by_marker(marker))


@pytest.mark.parametrize("kinds", [("freezer",), ("pids",), ("v2",)], ids=["v1-freezer", "v1-pids-only", "v2-only"])
def test_each_hierarchy_kills_its_members(cgroup_manager: CgroupManager, kinds: tuple[str, ...], tmp_path: object) -> None:
    chosen = [h for h in cgroup_manager.hierarchies if h.kind in kinds]
    if len(chosen) != len(kinds):
        pytest.skip(f"this machine has no {kinds} hierarchy")
    manager = CgroupManager(chosen)
    group = manager.create(f"test-{new_uuid4()}")
    assert group is not None and set(group.paths) == set(kinds)
    marker = "100018.5"
    job = start_job(f"setsid sleep {marker} & sleep {marker} & wait", str(tmp_path), cgroup=group)
    try:
        assert wait_until(lambda: len(descendants_by_marker(marker)) == 2)
        group.kill()
        assert wait_until(lambda: not group.live_members())
        assert not descendants_by_marker(marker)
    finally:
        reap(job.process)
        kill_pids(descendants_by_marker(marker))
        assert wait_until(group.remove)


def test_pids_cap_limits_a_runs_process_count(cgroup_manager: CgroupManager, tmp_path: object) -> None:
    pids = [h for h in cgroup_manager.hierarchies if h.kind == "pids"]
    if not pids:
        pytest.skip("no v1 pids hierarchy on this machine")
    manager = CgroupManager(pids, pids_max=4)
    group = manager.create(f"test-{new_uuid4()}")
    assert group is not None
    assert read_text(os.path.join(group.paths["pids"], "pids.max")).strip() == "4"
    events = os.path.join(group.paths["pids"], "pids.events")
    job = start_job("for i in 1 2 3 4 5 6 7 8; do sleep 100019 & done; wait", str(tmp_path), cgroup=group)
    try:
        # The shell forks until the cap refuses a fork (dash then exits with status 2).
        assert wait_until(lambda: read_text(events).split() != ["max", "0"])
        assert job.process.wait(timeout=5) == 2
        # The sleeps that outlived their shell were ended by the wrapper (a child subreaper)
        # before it exited: none is left in the cgroup.
        assert not group.members()
    finally:
        group.kill()
        reap(job.process)
        assert wait_until(group.remove)


def test_existing_cgroup_with_processes_is_refused(cgroup_manager: CgroupManager, run_cgroup: RunCgroup, tmp_path: object) -> None:
    job = start_job("sleep 1000", str(tmp_path), cgroup=run_cgroup)
    try:
        assert wait_until(lambda: job.pid in run_cgroup.members())
        with pytest.raises(ExecutionError) as info:
            cgroup_manager.create(run_cgroup.name)
        assert info.value.code == "cgroup_unavailable"
        reopened = cgroup_manager.open(run_cgroup.name)
        assert reopened is not None and reopened.paths == run_cgroup.paths
        assert run_cgroup.name in cgroup_manager.owned_names()
    finally:
        reap(job.process)


def test_remove_keeps_a_busy_cgroup(run_cgroup: RunCgroup, tmp_path: object) -> None:
    job = start_job("sleep 1000", str(tmp_path), cgroup=run_cgroup)
    try:
        assert wait_until(lambda: all(str(job.pid) in read_text(f).split() for f in run_cgroup.procs_files()))
        assert run_cgroup.remove() is False
        assert all(os.path.isdir(p) for p in run_cgroup.paths.values())
    finally:
        reap(job.process)


def test_signal_pids_tolerates_exited_pids_and_skips_non_members() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # exited and reaped: ESRCH on open
    bystander = subprocess.Popen(["sleep", "1000"])
    try:
        sent = signal_pids([gone.pid, bystander.pid], signal.SIGTERM, set)
        assert sent == 0
        time.sleep(0.05)
        assert bystander.poll() is None  # it was enumerated but is no longer a member: untouched
        assert signal_pids([bystander.pid], signal.SIGTERM, lambda: {bystander.pid}) == 1
        assert bystander.wait(timeout=5) == -signal.SIGTERM
    finally:
        bystander.kill()
        bystander.wait()


def test_hierarchy_parent_is_under_qinglong_edge() -> None:
    assert Hierarchy("v2", "/sys/fs/cgroup").parent == "/sys/fs/cgroup/qinglong-edge"


@given(st.text(max_size=400))
def test_mountinfo_parser_never_raises(text: str) -> None:
    for hierarchy in find_hierarchies(text):
        assert hierarchy.kind in ("v2", "freezer", "pids")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("9:name=systemd:/\n8:pids:/a\n6:freezer:/b\n0::/c\n", {"pids": "/a", "freezer": "/b", "v2": "/c"}),
        ("0::/system.slice/qinglong-edge.service\n", {"v2": "/system.slice/qinglong-edge.service"}),
        ("3:cpu,pids:/x\ngarbage\n4:freezer:relative\n", {"pids": "/x"}),
        ("", {}),
    ],
    ids=["hybrid", "pure-v2-service", "joined-controllers-and-garbage", "empty"],
)
def test_reads_own_cgroups(text: str, expected: dict[str, str]) -> None:
    assert own_cgroups(text) == expected


def test_nests_under_the_agents_own_cgroup_when_delegated(cgroup_manager: CgroupManager, tmp_path: object) -> None:
    """/proc/self/cgroup is faked (moving the test runner itself would disturb the suite);
    the delegated directory, the cgroups and the job are real."""
    v2 = [h for h in cgroup_manager.hierarchies if h.kind == "v2"]
    if not v2:
        pytest.skip("no cgroup v2 hierarchy on this machine")
    own = f"qle-test-own-{new_uuid4()}"
    delegated = os.path.join(v2[0].mount, own)
    os.mkdir(delegated)
    fake = os.path.join(str(tmp_path), "cgroup")
    with open(fake, "w") as handle:
        handle.write(f"0::/{own}\n")
    try:
        manager = CgroupManager.detect("auto", self_cgroup_path=fake)
        nested = [h for h in manager.hierarchies if h.kind == "v2"]
        assert nested and nested[0].parent == os.path.join(delegated, PARENT)
        group = manager.create(f"test-{new_uuid4()}")
        assert group is not None and group.paths["v2"].startswith(delegated + "/")
        job = start_job("sleep 100046", str(tmp_path), cgroup=group)
        try:
            assert wait_until(lambda: job.pid in group.members())
            assert f"0::/{own}/{PARENT}/{group.name}" in read_text(f"/proc/{job.pid}/cgroup").splitlines()
            group.kill()
            assert wait_until(lambda: not group.live_members())
        finally:
            reap(job.process)
            assert wait_until(group.remove)
    finally:
        os.rmdir(os.path.join(delegated, PARENT))
        os.rmdir(delegated)
