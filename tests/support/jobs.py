"""Real test jobs: start shell scripts as Run processes and watch them from /proc."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable

from qinglong_edge.process.cgroups import RunCgroup
from qinglong_edge.process.identity import read_proc_stat, scan_processes
from qinglong_edge.process.spawn import Spawned, job_environment, spawn


def start_job(script: str, cwd: str, *, cgroup: RunCgroup | None = None, release: bool = True) -> Spawned:
    """Start ``/bin/sh -c script`` exactly as the launcher does (new session, cgroup, gate)."""
    env = job_environment({}, run_id="run-test", attempt_id="attempt-test", home=cwd)
    fd = os.open(os.devnull, os.O_WRONLY)
    try:
        job = spawn(["/bin/sh", "-c", script], cwd=cwd, env=env, stdout_fd=fd, cgroup=cgroup)
    finally:
        os.close(fd)
    if release:
        job.release()
    return job


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    stat = read_proc_stat(pid)
    return stat is not None and not stat.exited


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


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
