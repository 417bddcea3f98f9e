"""A Local API site driven only through the real CLI and HTTP: ``admin`` provisioning,
``serve`` in a child process, task.start, cancellation (local-api.md sections 4-7).

No database access: what a test learns, it learns from the CLI's output, the HTTP
answers and ``/proc``. The CLI is started through an :class:`~tests.support.cli.Entry`
(default: this checkout), so the same chain runs from the zipapp or an installed
launcher. Short graces keep it fast: ``terminateGraceMs`` 1000, ``killGraceMs`` 500,
``controlIntervalMs`` 250.

Usage::

    site = LocalSite(tmp_path, entry)
    site.provision()                        # admin init, alice (operator), victor (viewer), task "looper"
    serve = site.serve()                    # waits for "serving the Local API"
    run = start_and_cancel(site)            # task.start -> running -> cancel 202 -> cancelled, job gone
    serve.stop()                            # SIGTERM -> drain -> exit 0

The task's job (:data:`JOB`) writes its pid to ``site.pidfile``, starts a ``setsid``
escapee (pid in ``<pidfile>.escapee``) and, on SIGTERM, writes ``term`` to
``<pidfile>.term``.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
from dataclasses import dataclass
from typing import Any

from tests.support.cli import Entry, repo_entry
from tests.support.http_client import exchange, request_bytes
from tests.support.wait import wait_until

__all__ = [
    "API",
    "JOB",
    "LocalSite",
    "Serve",
    "StartedRun",
    "alive",
    "cancel_and_verify",
    "cgroup_v2_available",
    "free_port",
    "start_and_cancel",
    "start_running",
]

JOB = (
    'echo $$ > "$PIDFILE"; '
    "setsid sh -c 'echo $$ > \"$PIDFILE.escapee\"; exec sleep 1000' & "
    "trap 'echo term > \"$PIDFILE.term\"; exit 143' TERM; "
    "while :; do sleep 0.05; done"
)
API = "/api/v3/projects/default"
FAST_EXECUTION: dict[str, Any] = {"terminateGraceMs": 1000, "killGraceMs": 500, "controlIntervalMs": 250}

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (``/proc/<pid>/stat``)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone before the open / reaped before the read (ESRCH)
        return False
    return state not in ("Z", "X", "x")


def cgroup_v2_available() -> bool:
    """A cgroup v2 hierarchy exists, so the per-Run cgroup also catches setsid escapees."""
    return os.path.isdir("/sys/fs/cgroup/unified") or os.path.exists("/sys/fs/cgroup/cgroup.controllers")


class Serve:
    """One ``serve`` child; stderr goes to a file (a verbose child can fill a pipe)."""

    def __init__(self, proc: subprocess.Popen[bytes], stderr_path: pathlib.Path) -> None:
        self.proc = proc
        self.stderr_path = stderr_path

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_serving(self, timeout: float = 20) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}: {self.stderr()[-4000:]}")
            return "serving the Local API" in self.stderr()

        wait_until(ready, timeout, interval=0.05, what="serve to listen")

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM (the drain), wait, return the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class LocalSite:
    """A state directory, a config (localApi + execution) and the CLI to drive them.

    Args:
        root: a private directory for the state, the config and the job's pid files.
        entry: how to start the CLI (default: this checkout).
        local_api: keys added to the ``localApi`` section (``console``, ``metrics``...).
        extra: more top-level sections (a ``worker``).
        execution: overrides of :data:`FAST_EXECUTION`.
    """

    def __init__(self, root: pathlib.Path, entry: Entry | None = None, *,
                 local_api: dict[str, Any] | None = None, extra: dict[str, Any] | None = None,
                 **execution: Any) -> None:
        self.root = root
        self.entry = entry or repo_entry()
        self.state = root / "state"
        self.state.mkdir(mode=0o700)
        self.state.chmod(0o700)
        self.port = free_port()
        self.pidfile = root / "job.pid"
        self.config = root / "config.json"
        self.config.write_text(json.dumps({
            "schema": "qinglong/edge-agent@v1",
            "stateDirectory": str(self.state),
            "localApi": {"listener": {"host": "127.0.0.1", "port": self.port}, **(local_api or {})},
            "execution": {**FAST_EXECUTION, **execution},
            **(extra or {}),
        }))
        self.token = ""
        self.viewer_token = ""
        self.task: dict[str, Any] = {}
        self._serves: list[Serve] = []

    # -- the CLI -----------------------------------------------------------------------------

    def cli(self, *args: str) -> str:
        result = self.entry.run("--config", str(self.config), *args)
        assert result.status == 0, (args, result.stdout, result.stderr)
        return result.stdout

    def provision(self) -> None:
        """``admin init``; alice (operator) and victor (viewer) with a credential each; the
        task ``looper`` running :data:`JOB`."""
        self.cli("admin", "init")
        for subject, role in (("alice", "operator"), ("victor", "viewer")):
            self.cli("admin", "subject", "create", "--type", "user", "--id", subject)
            self.cli("admin", "role", "grant", "--project", "default", "--subject-type", "user",
                     "--subject-id", subject, "--role", role)
        self.token = self.cli("admin", "credential", "issue", "--id", "alice-cli", "--subject-type", "user",
                              "--subject-id", "alice").strip()
        self.viewer_token = self.cli("admin", "credential", "issue", "--id", "victor-cli", "--subject-type",
                                     "user", "--subject-id", "victor").strip()
        created = json.loads(self.cli("admin", "task", "create", "--project", "default", "--id", "looper",
                                      "--name", "Looper", "--env", f"PIDFILE={self.pidfile}", "--shell", JOB,
                                      "--json"))
        self.task = created["task"]

    def serve(self) -> Serve:
        """Start ``serve`` and wait until it listens; :meth:`close` kills what is left."""
        stderr_path = self.root / f"serve-{len(self._serves)}.stderr"
        with open(stderr_path, "wb") as stderr:
            proc = self.entry.popen("--config", str(self.config), "serve", stdout=subprocess.DEVNULL,
                                    stderr=stderr)
        serve = Serve(proc, stderr_path)
        self._serves.append(serve)
        serve.wait_serving()
        return serve

    def close(self) -> None:
        """Kill the serve children still running and a setsid escapee left behind (no cgroup)."""
        for serve in self._serves:
            serve.kill()
        escapee_file = pathlib.Path(f"{self.pidfile}.escapee")
        if escapee_file.exists():
            pid = int(escapee_file.read_text().strip() or 0)
            try:
                cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes() if pid else b""
            except FileNotFoundError:
                cmdline = b""
            if cmdline == b"sleep\x001000\x00":
                os.kill(pid, signal.SIGKILL)

    # -- HTTP --------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                token: str | None = None) -> tuple[int, dict[str, Any]]:
        headers = [("Authorization", f"Bearer {token or self.token}")]
        raw = b""
        if body is not None:
            raw = json.dumps(body, separators=(",", ":")).encode()
            headers.append(("Content-Type", "application/json"))
        response = exchange(("127.0.0.1", self.port), request_bytes(method, path, headers=headers, body=raw))
        assert response is not None
        return response.status, response.json()

    def start_run(self, mutation_id: str = "0b1e2a4c-5d6e-4f70-8a9b-0c1d2e3f4a5b") -> str:
        """POST task.start for ``looper`` (202); returns the runId."""
        status, started = self.request("POST", f"{API}/tasks/looper/runs", {
            "schema": "qinglong/task-start@v1",
            "mutationId": mutation_id,
            "expectedRevision": self.task["revision"],
            "expectedContentDigest": self.task["contentDigest"],
        })
        assert status == 202, started
        return str(started["runId"])

    def run_status(self, run_id: str) -> str:
        status, body = self.request("GET", f"{API}/runs/{run_id}")
        assert status == 200, body
        return str(body["run"]["status"])

    def wait_run_status(self, run_id: str, wanted: str, timeout: float = 15) -> None:
        wait_until(lambda: self.run_status(run_id) == wanted, timeout, interval=0.05, what=f"the Run to be {wanted}")

    def cancel(self, run_id: str, mutation_id: str = "cancel-1",
               token: str | None = None) -> tuple[int, dict[str, Any]]:
        return self.request("POST", f"{API}/runs/{run_id}/cancellation",
                            {"schema": "qinglong/run-cancellation@v1", "mutationId": mutation_id}, token=token)

    def job_pids(self, timeout: float = 10) -> tuple[int, int]:
        """(job pid, setsid escapee pid), once the job has written both."""
        escapee_file = pathlib.Path(f"{self.pidfile}.escapee")

        def read(path: pathlib.Path) -> str:
            return path.read_text().strip() if path.exists() else ""

        pid = int(wait_until(lambda: read(self.pidfile), timeout, interval=0.05, what="the job pid"))
        escapee = int(wait_until(lambda: read(escapee_file), timeout, interval=0.05, what="the escapee pid"))
        return pid, escapee

    def job_saw_sigterm(self) -> bool:
        term = pathlib.Path(f"{self.pidfile}.term")
        return term.exists() and term.read_text().strip() == "term"


@dataclass(frozen=True)
class StartedRun:
    """A Run of ``looper`` that is running: its id, the job's pid, the setsid escapee's pid."""

    run_id: str
    pid: int
    escapee: int


def start_running(site: LocalSite) -> StartedRun:
    """task.start (202) -> ``running``, the job and its escapee alive."""
    run_id = site.start_run()
    site.wait_run_status(run_id, "running")
    pid, escapee = site.job_pids()
    assert alive(pid) and alive(escapee)
    return StartedRun(run_id, pid, escapee)


def cancel_and_verify(site: LocalSite, run: StartedRun, *, escapee_dies: bool | None = None) -> None:
    """POST cancellation (202, reason ``user``) -> ``cancelled`` -> the job is gone, SIGTERM
    came first, and the setsid escapee is gone too where the agent has a per-Run cgroup
    (``escapee_dies``; default: a cgroup v2 hierarchy exists, which an agent running as
    root can use)."""
    status, accepted = site.cancel(run.run_id)
    assert status == 202 and accepted["status"] == "accepted" and accepted["cancelReason"] == "user", accepted
    site.wait_run_status(run.run_id, "cancelled")
    assert not alive(run.pid)
    # The escapee left the process group; only the per-Run cgroup catches it.
    if cgroup_v2_available() if escapee_dies is None else escapee_dies:
        wait_until(lambda: not alive(run.escapee), 5, interval=0.05, what="the setsid escapee to die")
    assert site.job_saw_sigterm()  # SIGTERM came first


def start_and_cancel(site: LocalSite, *, escapee_dies: bool | None = None) -> StartedRun:
    """:func:`start_running` then :func:`cancel_and_verify`; returns the (now cancelled) Run."""
    run = start_running(site)
    cancel_and_verify(site, run, escapee_dies=escapee_dies)
    return run
