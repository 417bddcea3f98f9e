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


class Bystander:
    """An unrelated process (its own session) that a stop must never signal.

    It records a SIGTERM in ``<directory>/signalled`` (and exits 1); otherwise it goes round
    a 50 ms loop, appending a line to ``<directory>/beats`` each time. A signal sent before
    a moment is handled before the loop's next turn ends, so :meth:`untouched` waits for two
    more beats (the positive event) instead of sleeping, then looks.
    """

    def __init__(self, directory: str) -> None:
        self.marker = os.path.join(directory, "signalled")
        self.beats = os.path.join(directory, "beats")
        script = f"trap 'echo TERM > {self.marker}; exit 1' TERM; while :; do sleep 0.05; echo >> {self.beats}; done"
        self.process = subprocess.Popen(["sh", "-c", script], start_new_session=True)

    @property
    def pid(self) -> int:
        return self.process.pid

    def _count(self) -> int:
        try:
            with open(self.beats, "rb") as handle:
                return handle.read().count(b"\n")
        except FileNotFoundError:
            return 0

    def untouched(self, timeout: float = 5.0) -> bool:
        """True once it beat twice more than now, still running and never sent a SIGTERM."""
        now = self._count()
        wait_until(lambda: self._count() >= now + 2 or self.process.poll() is not None, timeout)
        return self._count() >= now + 2 and self.process.poll() is None and not os.path.exists(self.marker)

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
