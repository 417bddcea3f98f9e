"""Real test jobs: start shell scripts as Run processes and watch them from /proc."""

from __future__ import annotations

import os
import subprocess

from qinglong_edge.process.cgroups import RunCgroup
from qinglong_edge.process.identity import read_proc_stat, scan_processes
from qinglong_edge.process.spawn import HeldJob, JobSpec, job_environment
from qinglong_edge.process.spawn import start_job as start_held_job
from tests.support.wait import wait_until


def start_job(script: str, cwd: str, *, cgroup: RunCgroup | None = None, release: bool = True,
              log_path: str | None = None, drain_ms: int = 100, terminate_grace_ms: int = 5000,
              kill_grace_ms: int = 1000) -> HeldJob:
    """Start ``/bin/sh -c script`` exactly as the launcher does (job wrapper, new session,
    cgroup, start barrier); output goes to ``log_path`` (default ``<cwd>/job-<pid>.log``).
    The graces are the wrapper's for the descendants it ends (``JobSpec``)."""
    env = job_environment({}, run_id="run-test", attempt_id="attempt-test", home=cwd)
    log = log_path or os.path.join(cwd, f"job-{os.urandom(6).hex()}.log")
    job = start_held_job(JobSpec(["/bin/sh", "-c", script], env, cwd, log, 1 << 20, drain_ms=drain_ms,
                                         terminate_grace_ms=terminate_grace_ms, kill_grace_ms=kill_grace_ms),
                             cgroup=cgroup)
    if release:
        job.release()
    return job


def command_of(wrapper_pid: int, timeout: float = 5.0) -> int | None:
    """The pid of the command a job wrapper started (its only child), once it exists."""
    found: list[int] = []

    def look() -> bool:
        found[:] = [s.pid for s in scan_processes() if s.ppid == wrapper_pid]
        return bool(found)

    return found[0] if wait_until(look, timeout) else None


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    stat = read_proc_stat(pid)
    return stat is not None and not stat.exited


def descendants_by_marker(marker: str) -> list[int]:
    """Live pids running exactly ``sleep <marker>`` (finds setsid escapees anywhere)."""
    found = []
    for stat in scan_processes():
        if stat.exited:
            continue
        try:
            with open(f"/proc/{stat.pid}/cmdline", "rb") as handle:
                cmdline = handle.read()
        except OSError:
            continue
        if cmdline.split(b"\0")[:2] == [b"sleep", marker.encode()]:
            found.append(stat.pid)
    return found


def reap(process: subprocess.Popen[bytes]) -> None:
    """Kill (if needed) and reap a job's leader so tests leave no zombies."""
    try:
        os.killpg(process.pid, 9)
    except OSError:
        pass
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="surrogateescape") as handle:
        return handle.read()
