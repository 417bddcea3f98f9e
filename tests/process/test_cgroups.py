"""Per-Run cgroups on the real kernel (v2 cgroup.kill, v1 freezer and pids)."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

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
from qinglong_edge.process.identity import read_proc_stat
from tests.support.jobs import alive, descendants_by_marker, kill_pids, read_text, reap, start_job
from tests.support.wait import wait_until

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
        # The positive event: a later signal acts (it stops); a SIGTERM sent before would have
        # ended it first (fatal, and dequeued before SIGSTOP).
        os.kill(bystander.pid, signal.SIGSTOP)
        assert wait_until(lambda: bystander.poll() is not None
                          or ((stat := read_proc_stat(bystander.pid)) is not None and stat.state in ("T", "t")))
        assert bystander.poll() is None  # it was enumerated but is no longer a member: untouched
        os.kill(bystander.pid, signal.SIGCONT)
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
        assert hierarchy.kind in ("v2", "freezer", "pids", "memory")


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


# -- the job's memory leaf (issue 24 item 3) --------------------------------------------------------


def test_a_v1_memory_leaf_holds_the_job_alone_with_its_limit_and_counts_its_oom_kills(tmp_path: pathlib.Path) -> None:
    """The real v1 memory hierarchy (hybrid machines, CI): ``memory.limit_in_bytes`` and
    (swap accounting) ``memory.memsw.limit_in_bytes``; the wrapper stays in the agent's
    memory cgroup; a job allocating past the limit is OOM-killed and counted."""
    if os.geteuid() != 0:
        pytest.skip("cgroups need root (CI runs as root)")
    manager = CgroupManager.detect("auto", memory_max=16 << 20)
    if not any(h.kind == "memory" for h in manager.hierarchies):
        pytest.skip(f"no v1 memory hierarchy here: {manager.memory_reason}")
    assert manager.memory_available and manager.memory_reason == ""
    group = manager.create(f"test-{new_uuid4()}")
    assert group is not None and group.memory_leaf() == group.paths["memory"]
    try:
        leaf = group.paths["memory"]
        assert int(read_text(os.path.join(leaf, "memory.limit_in_bytes"))) == 16 << 20
        if os.path.exists(os.path.join(leaf, "memory.memsw.limit_in_bytes")):
            assert int(read_text(os.path.join(leaf, "memory.memsw.limit_in_bytes"))) == 16 << 20
        assert os.path.join(leaf, "cgroup.procs") not in group.procs_files()  # not the wrapper's
        assert group.job_procs_files() == [os.path.join(leaf, "cgroup.procs")]
        assert group.oom_kills() == 0
        from qinglong_edge.process.spawn import JobSpec
        from qinglong_edge.process.spawn import start_job as start

        script = f"{sys.executable} -I -S -c 'bytearray(64 << 20)'; echo after $?"
        job = start(JobSpec(["/bin/sh", "-c", script], {}, str(tmp_path), str(tmp_path / "log"), 4096), cgroup=group)
        job.release()
        assert job.process.wait(30) == 0
        assert (tmp_path / "log").read_text().strip().endswith("after 137")  # SIGKILLed by the OOM killer
        assert group.oom_kills() == 1
        from qinglong_edge.process.cgroups import out_of_memory

        assert out_of_memory(group) == "out_of_memory" and out_of_memory(None) is None
    finally:
        group.kill()
        assert wait_until(group.remove)
    assert not os.path.exists(group.paths["memory"])


def _fake_v2(root: pathlib.Path, own: str, *, controllers: str = "cpu memory pids", procs: str = "") -> pathlib.Path:
    """A directory tree shaped like a cgroup v2 mount (a fake: the v2 memory controller
    cannot be had on this machine, bound to v1; the kernel's rules -- no process where
    controllers are enabled -- are not enforced by it, only our writes are checked)."""
    for directory in (root, root / own.strip("/"), (root / own.strip("/")).parent):
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in (("cgroup.controllers", controllers), ("cgroup.subtree_control", ""),
                           ("cgroup.procs", ""), ("memory.max", "max"), ("memory.swap.max", "max"),
                           ("pids.max", "max")):
            (directory / name).write_text(text)
    (root / own.strip("/") / "cgroup.procs").write_text("4242\n")  # the agent, in its leaf
    (root / own.strip("/")).parent.joinpath("cgroup.procs").write_text(procs)
    return root


def test_v2_memory_base_is_the_parent_of_the_agents_leaf(tmp_path: pathlib.Path) -> None:
    from qinglong_edge.process.cgroup_memory import create_v2_leaves, v2_memory_base

    mount = _fake_v2(tmp_path / "cg", "/system.slice/qinglong-edge-pull.service/agent")
    unit = mount / "system.slice" / "qinglong-edge-pull.service"
    (unit / "qinglong-edge").mkdir()  # what the kernel makes at mkdir, the fake makes before
    for name, text in (("cgroup.controllers", "memory pids"), ("cgroup.subtree_control", "")):
        (unit / "qinglong-edge" / name).write_text(text)
    base, reason = v2_memory_base(str(mount), "/system.slice/qinglong-edge-pull.service/agent")
    assert (base, reason) == (str(unit), "")
    assert (unit / "cgroup.subtree_control").read_text() == "+memory +pids"  # for its children only
    assert (unit / "qinglong-edge" / "cgroup.subtree_control").read_text() == "+memory +pids"
    run = unit / "qinglong-edge" / "remote-a-1"
    run.mkdir()
    for name in ("cgroup.controllers", "cgroup.subtree_control", "pids.max"):
        (run / name).write_text("memory pids" if name == "cgroup.controllers" else "")
    job = run / "job"
    job.mkdir()  # with the files the kernel would make in it
    for name in ("memory.max", "memory.swap.max"):
        job.joinpath(name).write_text("")  # cgroupfs files are not truncated by a write: empty here
    create_v2_leaves(str(run), 16 << 20, 16)
    assert (run / "pids.max").read_text() == "16" and (run / "cgroup.subtree_control").read_text() == "+memory"
    assert (job / "memory.max").read_text() == str(16 << 20) and (job / "memory.swap.max").read_text() == "0"
    assert (run / "wrapper").is_dir()


@pytest.mark.parametrize(("own", "controllers", "procs", "why"), [
    ("/", "cpu pids", "", "not available in cgroup v2"),
    ("/system.slice/qinglong-edge.service/agent", "cpu memory pids", "77\n", "holds processes itself"),
    ("/a/../b", "cpu memory pids", "", "not a plain path"),
])
def test_v2_memory_base_says_why_not(tmp_path: pathlib.Path, own: str, controllers: str, procs: str,
                                     why: str) -> None:
    from qinglong_edge.process.cgroup_memory import v2_memory_base

    mount = _fake_v2(tmp_path / "cg", own if ".." not in own else "/a/b", controllers=controllers, procs=procs)
    base, reason = v2_memory_base(str(mount), own)
    assert base is None and why in reason, reason


def test_a_run_cgroup_with_v2_leaves(tmp_path: pathlib.Path) -> None:
    """The wrapper enters ``<run>/wrapper``, the job ``<run>/job``; members are both
    leaves'; removal goes leaves first (a fake tree, as above)."""
    run = tmp_path / "run"
    for leaf in ("wrapper", "job"):
        (run / leaf).mkdir(parents=True)
    (run / "wrapper" / "cgroup.procs").write_text("10\n")
    (run / "job" / "cgroup.procs").write_text("11\n12\n")
    (run / "job" / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    group = RunCgroup("remote-a-1", {"v2": str(run), "pids": str(tmp_path / "pids")}, leaves=True)
    assert group.procs_files() == [str(run / "wrapper" / "cgroup.procs"), str(tmp_path / "pids" / "cgroup.procs")]
    assert group.job_procs_files() == [str(run / "job" / "cgroup.procs")]
    assert group.members() == {10, 11, 12} and group.oom_kills() == 1
    for leaf in ("wrapper", "job"):
        for name in os.listdir(run / leaf):
            os.unlink(run / leaf / name)
    assert group.remove() and not run.exists()
