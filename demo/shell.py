"""Runs the demo's commands exactly as it prints them, and owns every process it starts.

Each command is one line of POSIX shell, printed, then run as ``/bin/sh -c LINE`` in the
repository root with the demo's environment (``PYTHONPATH``, ``QINGLONG_EDGE_CONFIG``, the
token variables once issued; nothing of the caller's ``QINGLONG_EDGE_*``), so what is on
the screen is what ran. Long-lived processes (the cluster, ``serve``) start in their own
session with ``exec`` (the pid is the program's own) and are stopped by
:meth:`Shell.stop_all` on every exit path: success, failure, Ctrl-C, SIGTERM, SIGHUP.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from console import Console

__all__ = ["DemoError", "Result", "Shell", "alive"]

T = TypeVar("T")


class DemoError(Exception):
    """A step did not give what the demo expects; the message says what and where to look."""


@dataclass
class Result:
    status: int
    stdout: str
    stderr: str


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (``/proc/<pid>/stat`` state)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X", "x")


class Shell:
    """The demo's command runner (see the module docstring)."""

    def __init__(self, console: Console, cwd: str, env: dict[str, str]) -> None:
        self.console = console
        self.cwd = cwd
        self.env = env
        self.background: list[tuple[str, subprocess.Popen[bytes]]] = []
        #: Process groups started by our children (the Run's job) to make sure of at exit.
        self.watched_groups: list[tuple[str, int]] = []

    def run(self, line: str, *, expect: Iterable[int] = (0,), show: bool = True, limit: int = 14,
            quiet: bool = False, timeout: float = 60) -> Result:
        """Print ``line``, run it, print what it printed (unless ``quiet``), check its status.

        Raises:
            DemoError: the exit status is not in ``expect`` (its output is shown first).
        """
        if show:
            self.console.command(line)
        proc = subprocess.run(["/bin/sh", "-c", line], cwd=self.cwd, env=self.env, capture_output=True,
                              timeout=timeout, check=False)
        result = Result(proc.returncode, proc.stdout.decode("utf-8", "replace"),
                        proc.stderr.decode("utf-8", "replace"))
        expected = tuple(expect)
        if show and not quiet:
            text = result.stdout + result.stderr
            if text.strip():
                self.console.output(text, limit)
            if result.status != 0:
                self.console.info(f"(exit status {result.status})")
        if result.status not in expected:
            if not show or quiet:
                self.console.output(result.stdout + result.stderr, 40)
            raise DemoError(f"`{line}` exited {result.status}, expected {' or '.join(map(str, expected))}")
        return result

    def start(self, name: str, line: str) -> subprocess.Popen[bytes]:
        """Print ``line &`` and start it in its own session (``exec``: the pid is the program's)."""
        self.console.command(f"{line} &")
        proc = subprocess.Popen(["/bin/sh", "-c", f"exec {line}"], cwd=self.cwd, env=self.env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.background.append((name, proc))
        return proc

    def forget(self, proc: subprocess.Popen[bytes]) -> None:
        self.background = [(name, p) for name, p in self.background if p is not proc]

    def stop(self, name: str, proc: subprocess.Popen[bytes], timeout: float = 20, *, signalled: bool = False) -> int:
        """SIGTERM (unless ``signalled``: the demo already sent it), wait up to ``timeout``,
        then SIGKILL; returns the exit status."""
        if proc.poll() is None:
            if not signalled:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.console.failure(f"{name} (pid {proc.pid}) ignored SIGTERM for {timeout:.0f} s: SIGKILL")
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        self.forget(proc)
        return proc.returncode

    def stop_all(self) -> list[str]:
        """Stop every process still running (newest first), then any watched job group.

        Returns:
            ``name (pid N)`` of each process that had to be stopped here.
        """
        stopped = []
        for name, proc in reversed(list(self.background)):
            if proc.poll() is None:
                stopped.append(f"{name} (pid {proc.pid})")
            self.stop(name, proc)
        for name, pgid in self.watched_groups:
            if alive(pgid):
                stopped.append(f"{name} (process group {pgid})")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
        return stopped

    @staticmethod
    def wait_for(predicate: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
        """Poll ``predicate()`` until it is truthy; its value, or DemoError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise DemoError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(interval)
