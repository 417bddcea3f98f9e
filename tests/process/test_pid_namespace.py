"""The job wrapper's PID namespace on real processes (issue 24 item 2): our init is PID 1,
the command PID 2 in a session of its own; signals reach each process of the job once,
through the init; orphans are reaped; the stop path (TERM, grace, KILL, escapees,
receipt) works; the extra process counts in ``pids.max``; jobs get ``oom_score_adj``
1000 and (v1 here) a memory leaf of their own.

Real jobs under the real wrapper, as the user running the tests (root here, as in CI:
the isolation itself is tested as uid 65534 in test_isolation.py and the attack matrix).
Skipped with the probe's reason where no PID namespace can be made.
"""

from __future__ import annotations

import os
import pathlib
import signal
import time
from collections.abc import Iterator

import pytest

from qinglong_edge.process.cgroups import CgroupManager
from qinglong_edge.process.isolation import probe_isolation
from qinglong_edge.process.logs import read_receipt
from qinglong_edge.process.spawn import (
    PID_NAMESPACE,
    PID_PRIVATE_PROC,
    HeldJob,
    Isolation,
    JobSpec,
    Publication,
    start_job,
)
from qinglong_edge.process.stop import stop
from tests.support.jobs import descendants_by_marker, kill_pids, reap
from tests.support.wait import wait_until

ENV = {"PATH": "/usr/bin:/bin"}


@pytest.fixture(scope="module")
def level() -> str:
    probe = probe_isolation()
    if not probe.available or probe.pid != PID_PRIVATE_PROC:
        pytest.skip(f"no PID namespace with a private /proc here: {probe.reason} {probe.pid_reason}")
    return probe.pid


def _spec(tmp: pathlib.Path, script: str, *, pid: str = PID_PRIVATE_PROC, **kwargs: object) -> JobSpec:
    (tmp / "hidden").mkdir(exist_ok=True)
    return JobSpec(["/bin/sh", "-c", script], ENV, str(tmp), str(tmp / "logs" / "job.log"), 1 << 20,
                   isolation=Isolation(hide=[str(tmp / "hidden")], pid=pid), **kwargs)  # type: ignore[arg-type]


def _receipt(tmp: pathlib.Path) -> Publication:
    return Publication(str(tmp / "receipts" / "r.json"), b'{"schemaVersion":1,"startedAtMs":1')


def _log(tmp: pathlib.Path) -> str:
    return (tmp / "logs" / "job.log").read_text()


@pytest.fixture
def jobs() -> Iterator[list[HeldJob]]:
    started: list[HeldJob] = []
    yield started
    for job in started:
        reap(job.process)


def _start(jobs: list[HeldJob], spec: JobSpec, **kwargs: object) -> HeldJob:
    job = start_job(spec, **kwargs)  # type: ignore[arg-type]
    jobs.append(job)
    job.release()
    return job


def _children(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = pathlib.Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(name))
    return found


def test_the_init_is_pid_1_and_the_command_pid_2_in_its_own_session(tmp_path: pathlib.Path, level: str,
                                                                    jobs: list[HeldJob]) -> None:
    script = ("echo pid $$; echo sid $(cut -d' ' -f6 /proc/self/stat); "
              "echo init $(cat /proc/1/comm); echo maxpid $(ls /proc | grep '^[0-9]' | sort -n | tail -1); "
              "echo adj $(cat /proc/self/oom_score_adj)")
    job = _start(jobs, _spec(tmp_path, script, receipt=_receipt(tmp_path), started_at_ms=1))
    assert job.process.wait(10) == 0
    seen = dict(line.split(" ", 1) for line in _log(tmp_path).splitlines())
    assert seen["pid"] == "2" and seen["init"] == "qinglong-job"
    assert seen["sid"] == "2"  # the command leads a session of its own: kill(0) never reaches the wrapper
    assert int(seen["maxpid"]) < 20  # a private /proc: the init, the shell and its pipeline alone
    assert seen["adj"] == "1000"  # the OOM killer takes the job first ...
    assert pathlib.Path("/proc/self/oom_score_adj").read_text().strip() != "1000"  # ... never the agent
    raw = read_receipt(str(tmp_path / "receipts" / "r.json"))
    assert raw is not None and raw.endswith(b',"exitCode":0}')  # published by the wrapper, outside


def test_without_a_private_proc_the_host_proc_stays(tmp_path: pathlib.Path, level: str, jobs: list[HeldJob]) -> None:
    job = _start(jobs, _spec(tmp_path, "echo pid $$; echo procs $(ls /proc | grep -c '^[0-9]')", pid=PID_NAMESPACE))
    assert job.process.wait(10) == 0
    seen = dict(line.split(" ", 1) for line in _log(tmp_path).splitlines())
    assert seen["pid"] == "2" and int(seen["procs"]) > 4


@pytest.mark.parametrize(("script", "code"), [("exit 7", 7), ("kill -9 $$", 137), ("kill -TERM $$", 143)])
def test_the_init_exits_with_the_commands_status(tmp_path: pathlib.Path, level: str, jobs: list[HeldJob],
                                                 script: str, code: int) -> None:
    job = _start(jobs, _spec(tmp_path, script, receipt=_receipt(tmp_path), started_at_ms=1))
    assert job.process.wait(10) == code
    raw = read_receipt(str(tmp_path / "receipts" / "r.json"))
    assert raw is not None and raw.endswith(f',"exitCode":{code}}}'.encode())


def test_a_term_reaches_each_process_of_the_job_once(tmp_path: pathlib.Path, level: str, jobs: list[HeldJob]) -> None:
    """The wrapper passes the TERM to its init alone (never to a group the job shares), which
    sends it to every process of the namespace once: the command, a background child in
    its group and a setsid escapee; each traps it and counts."""
    terms, ready = tmp_path / "terms", tmp_path / "ready"
    def trap(who: str) -> str:
        return f"trap 'echo TERM {who} >> {terms}; exit 0' TERM"

    script = (f"{trap('sh')}; sh -c \"{trap('child')}; echo > {ready}.1; while :; do sleep 0.01; done\" & "
              f"setsid sh -c \"{trap('escapee')}; echo > {ready}.2; while :; do sleep 0.01; done\" & "
              f"while [ ! -e {ready}.1 ] || [ ! -e {ready}.2 ]; do sleep 0.01; done; echo ready; "
              "while :; do sleep 0.01; done")
    job = _start(jobs, _spec(tmp_path, script, receipt=_receipt(tmp_path), started_at_ms=1, terminate_grace_ms=5000))
    assert wait_until(lambda: "ready" in _log(tmp_path), timeout=10)
    os.kill(job.pid, signal.SIGTERM)
    assert job.process.wait(10) == 0  # the command's trap exited 0
    lines = sorted(terms.read_text().splitlines())
    assert lines == ["TERM child", "TERM escapee", "TERM sh"], lines


def test_a_job_cannot_make_the_init_pass_signals_on(tmp_path: pathlib.Path, level: str, jobs: list[HeldJob]) -> None:
    """A TERM the job sends to its PID 1 is dropped (only one from outside the namespace is
    passed on); kill(-1) from the job reaches the job's own processes alone."""
    script = "kill -TERM 1; sleep 0.2; echo alive; kill -0 -1 2>/dev/null && echo reached || echo nobody"
    job = _start(jobs, _spec(tmp_path, script))
    assert job.process.wait(10) == 0
    assert _log(tmp_path).splitlines() == ["alive", "nobody"]


def test_the_init_reaps_orphans(tmp_path: pathlib.Path, level: str, jobs: list[HeldJob]) -> None:
    """Orphans re-parent to the init (PID 1 of their namespace) and are reaped as they exit:
    their zombies would hold tasks of the job's PID cap."""
    script = (f"i=0; while [ $i -lt 20 ]; do (sh -c 'exit 0' &) ; i=$((i+1)); done; "
              f"echo > {tmp_path}/forked; while :; do sleep 0.01; done")
    job = _start(jobs, _spec(tmp_path, script))
    assert wait_until((tmp_path / "forked").exists, timeout=10)
    init = next(pid for pid in _children(job.pid) if pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
                == "qinglong-job")

    def zombies() -> int:
        return sum(1 for pid in _children(init)
                   if pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z")

    assert wait_until(lambda: zombies() == 0, timeout=10)
    os.kill(job.pid, signal.SIGTERM)
    assert job.process.wait(10) == 143


def test_leftovers_get_one_term_then_sigkill_and_the_commands_code_is_kept(tmp_path: pathlib.Path, level: str,
                                                                        jobs: list[HeldJob]) -> None:
    terms, ready = tmp_path / "terms", tmp_path / "ready"
    marker = str(310_000_000 + int.from_bytes(os.urandom(3), "big"))
    script = (f"(trap 'echo TERM >> {terms}' TERM; echo > {ready}; while :; do sleep {marker}; done) & "
              f"while [ ! -e {ready} ]; do sleep 0.01; done; exit 3")
    started = time.monotonic()
    job = _start(jobs, _spec(tmp_path, script, terminate_grace_ms=300, kill_grace_ms=1000))
    try:
        assert job.process.wait(10) == 3
        assert time.monotonic() - started >= 0.3  # its SIGKILL came after the grace
        assert terms.read_text() == "TERM\n"
        assert not descendants_by_marker(marker)
    finally:
        kill_pids(descendants_by_marker(marker))


@pytest.mark.parametrize("trap", ["'exit 0'", "''"], ids=["term", "kill"])
def test_the_stop_path_ends_the_namespace_and_the_receipt_follows(tmp_path: pathlib.Path, level: str,
                                                                  jobs: list[HeldJob], trap: str) -> None:
    """process/stop.py against an isolated job: TERM through the wrapper and its init (a
    job that ignores it is SIGKILLed after the grace), a setsid escapee included; then the
    wrapper publishes the receipt (143 or 137)."""
    marker = str(320_000_000 + int.from_bytes(os.urandom(3), "big"))
    script = f"trap {trap} TERM; setsid sleep {marker} & echo started; while :; do sleep 0.01; done"
    job = _start(jobs, _spec(tmp_path, script, receipt=_receipt(tmp_path), started_at_ms=1))
    try:
        assert wait_until(lambda: "started" in _log(tmp_path) and descendants_by_marker(marker), timeout=10)
        result = stop(job.handle, terminate_grace_ms=500, kill_grace_ms=2000)
        assert (result.status, result.signal) == ("stopped", "SIGTERM" if trap == "'exit 0'" else "SIGKILL"), result
        assert not descendants_by_marker(marker)
    finally:
        kill_pids(descendants_by_marker(marker))
    code = job.process.wait(10)
    raw = read_receipt(str(tmp_path / "receipts" / "r.json"))
    if trap == "'exit 0'":
        assert code == 0 and raw is not None and raw.endswith(b',"exitCode":0}')
    else:  # the wrapper itself was SIGKILLed with its group: "No receipt"
        assert code == -signal.SIGKILL and raw is None


def test_the_init_counts_in_pids_max(tmp_path: pathlib.Path, level: str, jobs: list[HeldJob],
                                     cgroup_manager: CgroupManager) -> None:
    """pids.max 4: the wrapper, the init, the shell and one child fit; a second child does
    not. (The process that made the namespace is gone once the init runs alone below the
    wrapper: the test waits for that before the job forks.)"""
    if "pids" not in {h.kind for h in cgroup_manager.hierarchies}:
        pytest.skip("no pids hierarchy")
    manager = CgroupManager(cgroup_manager.hierarchies, pids_max=4)
    group = manager.create(f"pidns-{os.urandom(4).hex()}")
    assert group is not None
    try:
        script = (f"echo started; while [ ! -e {tmp_path}/go ]; do read -t 0.01 x < /dev/null; done; "
                  "sleep 5 & sleep 5 & wait")
        job = _start(jobs, _spec(tmp_path, script), cgroup=group)
        assert wait_until(lambda: "started" in _log(tmp_path) and len(_children(job.pid)) == 1, timeout=10)
        (tmp_path / "go").write_text("")
        assert job.process.wait(15) != 0  # the shell gives up at the refused fork
        assert "fork" in _log(tmp_path).lower(), _log(tmp_path)  # the second child, not the first
    finally:
        group.kill()
        wait_until(group.remove)


def test_the_job_not_its_wrapper_is_in_the_memory_leaf(tmp_path: pathlib.Path, level: str, jobs: list[HeldJob],
                                                      cgroup_manager: CgroupManager) -> None:
    manager = CgroupManager.detect("auto", memory_max=32 << 20)
    if not manager.memory_available:
        pytest.skip(f"no memory cgroup: {manager.memory_reason}")
    group = manager.create(f"pidns-{os.urandom(4).hex()}")
    assert group is not None
    leaf = group.memory_leaf()
    assert leaf is not None
    try:
        job = _start(jobs, _spec(tmp_path, f"echo started; while [ ! -e {tmp_path}/go ]; do sleep 0.01; done"),
                     cgroup=group)
        assert wait_until(lambda: "started" in _log(tmp_path), timeout=10)
        members = {int(p) for p in pathlib.Path(leaf, "cgroup.procs").read_text().split()}
        assert job.pid not in members and members  # the init and the job: not the wrapper
        (tmp_path / "go").write_text("")
        assert job.process.wait(10) == 0
        assert group.oom_kills() == 0
    finally:
        group.kill()
        wait_until(group.remove)


def test_an_isolated_job_of_a_root_agent_has_no_capability_left(tmp_path: pathlib.Path, level: str,
                                                               jobs: list[HeldJob]) -> None:
    """An agent running as root (the packages use `qinglong`; tests and some routers do
    not): its isolated job is root of its user namespace, where it made the covers itself
    (not locked), so the wrapper empties the bounding set: no capability after exec, the
    covers stay."""
    if os.geteuid() != 0:
        pytest.skip("the agent is not root here")
    (tmp_path / "hidden" ).mkdir(exist_ok=True)
    (tmp_path / "hidden" / "secret").write_text("secret")
    script = (f"grep CapEff /proc/self/status; umount {tmp_path}/hidden 2>/dev/null && echo unmounted; "
              f"cat {tmp_path}/hidden/secret 2>/dev/null || echo hidden")
    job = _start(jobs, _spec(tmp_path, script))
    assert job.process.wait(10) == 0
    lines = _log(tmp_path).split()
    assert lines[:2] == ["CapEff:", "0000000000000000"] and "unmounted" not in lines and lines[-1] == "hidden", lines
