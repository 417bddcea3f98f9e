"""Parent side of :mod:`tests.support.journal_child`: spawn, talk to, signal, reap."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
from typing import Any

from tests.support.wait import wait_until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("QINGLONG_EDGE_CRASHPOINT", None)
    if extra:
        env.update(extra)
    return env


class Child:
    """A running ``journal_child`` with line-based JSON I/O."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, executable: str | None = None) -> None:
        argv = [executable or sys.executable, "-m", "tests.support.journal_child", *args]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env(env),
            cwd=REPO,
        )
        self.pid = self.proc.pid

    def read_event(self, timeout: float = 20.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                raise AssertionError(f"child {self.pid} said nothing in {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"child {self.pid} exited: {self.stderr_text()}")
        result: dict[str, Any] = json.loads(line)
        return result

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def kill(self) -> int:
        """SIGKILL and reap; returns the wait status code."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        return self.proc.wait(timeout=20)

    def wait(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stderr_text(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read().decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def run_child(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "tests.support.journal_child", *args],
        capture_output=True, env=child_env(env), cwd=REPO, timeout=timeout, check=False,
    )


def last_event(output: bytes) -> dict[str, Any]:
    lines = [line for line in output.decode().splitlines() if line.strip()]
    assert lines, "no output"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def process_state(pid: int) -> str:
    """The one-letter state of ``/proc/<pid>/stat`` (``T`` when stopped)."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        data = handle.read()
    return data[data.rfind(b")") + 2 :].split()[0].decode()


def wait_stopped(pid: int, timeout: float = 20.0) -> bool:
    """Wait until ``pid`` is stopped (True) or has exited (False)."""

    def settled() -> str | None:
        try:
            state = process_state(pid)
        except FileNotFoundError:
            return "gone"
        return state if state in ("T", "t", "Z", "X") else None

    return wait_until(settled, timeout, interval=0.005, what=f"pid {pid} to stop or exit") in ("T", "t")
