"""``execution.maxRunPids`` reaches the kernel: a Run started through ``serve`` finds its
own cgroup's ``pids.max`` set to the configured cap (cgroup v1 ``pids``; skipped with
the reason elsewhere). The fork bomb under that cap is in ``tests/envelope``."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys

import pytest

from qinglong_edge.process.cgroups import CgroupManager
from tests.support.cli import REPO, run_cli
from tests.support.http_client import exchange, request_bytes
from tests.support.wait import wait_until

#: The job prints the pids.max of its own v1 pids cgroup (``$MOUNT`` is the hierarchy).
JOB = 'p=$(sed -n "s/^[0-9]*:pids:\\(.*\\)$/\\1/p" /proc/self/cgroup); cat "$MOUNT$p/pids.max" > "$OUT"'


def _pids_mount() -> str:
    if os.geteuid() != 0:
        pytest.skip("per-Run cgroups need root here (CI runs as root)")
    manager = CgroupManager.detect("auto")
    mounts = [h.mount for h in manager.hierarchies if h.kind == "pids"]
    if not mounts:
        pytest.skip(f"no writable cgroup v1 pids hierarchy ({manager.reason or 'only ' + str(manager.hierarchies)})")
    return mounts[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(("cap", "expected"), [(7, "7"), (0, "max")], ids=["cap_7", "zero_means_no_cap"])
def test_serve_applies_max_run_pids_to_each_run(tmp_path: pathlib.Path, cap: int, expected: str) -> None:
    mount = _pids_mount()
    port = _free_port()
    out = tmp_path / "pids.max"
    config = tmp_path / "config.json"
    (tmp_path / "state").mkdir(mode=0o700)
    config.write_text(json.dumps({
        "schema": "qinglong/edge-agent@v1", "stateDirectory": str(tmp_path / "state"),
        "localApi": {"listener": {"host": "127.0.0.1", "port": port}},
        "execution": {"maxRunPids": cap, "controlIntervalMs": 250},
    }))

    def cli(*args: str) -> str:
        result = run_cli("--config", str(config), *args)
        assert result.status == 0, (args, result.stderr)
        return result.stdout

    cli("admin", "init")
    cli("admin", "subject", "create", "--type", "user", "--id", "alice")
    cli("admin", "role", "grant", "--project", "default", "--subject-type", "user", "--subject-id", "alice",
        "--role", "operator")
    token = cli("admin", "credential", "issue", "--id", "alice-cli", "--subject-type", "user",
                "--subject-id", "alice").strip()
    task = json.loads(cli("admin", "task", "create", "--project", "default", "--id", "pidsmax", "--name", "pids",
                          "--env", f"OUT={out}", "--env", f"MOUNT={mount}", "--shell", JOB, "--json"))["task"]
    proc = subprocess.Popen([sys.executable, "-m", "qinglong_edge", "--config", str(config), "serve"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=dict(os.environ, PYTHONPATH=REPO))
    try:
        assert proc.stderr is not None
        lines = [proc.stderr.readline()]
        while "serving the Local API" not in lines[-1] and lines[-1] and len(lines) < 5:
            lines.append(proc.stderr.readline())
        assert "serving the Local API" in lines[-1], lines
        body = json.dumps({"schema": "qinglong/task-start@v1", "mutationId": "0b1e2a4c-5d6e-4f70-8a9b-0c1d2e3f4a5b",
                           "expectedRevision": task["revision"],
                           "expectedContentDigest": task["contentDigest"]}).encode()
        response = exchange(("127.0.0.1", port), request_bytes(
            "POST", "/api/v3/projects/default/tasks/pidsmax/runs", body=body,
            headers=[("Authorization", f"Bearer {token}"), ("Content-Type", "application/json")]))
        assert response is not None and response.status == 202, response
        assert wait_until(lambda: out.exists() and out.read_text().strip(), 15, interval=0.05)
        assert out.read_text().strip() == expected
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
