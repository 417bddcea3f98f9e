"""The demo's shared state and helpers: paths, the shell, the Local API call with curl."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import socket
import time
from collections.abc import Callable
from typing import Any

from console import Console
from shell import DemoError, Shell

__all__ = ["MARKER", "PROJECT", "REPO", "TASK", "WORKER_ID", "DemoBase"]

REPO = pathlib.Path(__file__).resolve().parent.parent
MARKER = ".qinglong-edge-demo"
WORKER_ID = "edge-1"
PROJECT = "demo"
TASK = "progress"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_private(path: pathlib.Path, data: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(data)
    os.chmod(path, 0o600)


def iso_time(ms: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


class DemoBase:
    """The demo's state: paths, the shell, the processes, what the steps learned."""
    """The demo's state: paths, the shell, the processes, what the steps learned."""

    def __init__(self, root: pathlib.Path, console: Console) -> None:
        self.console = console
        self.root = root
        try:
            self.show_root = str(root.relative_to(REPO))
        except ValueError:
            self.show_root = str(root)
        self.pki = root / "pki"
        self.cluster_dir = root / "cluster"
        self.logs = root / "logs"
        self.agent = root / "agent"
        self.private = self.agent / "private"
        self.anchors = self.agent / "anchors"
        self.state = self.agent / "state"
        self.config_path = self.agent / "config.json"
        self.pidfile = root / "progress.pid"
        env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_EDGE_")}
        env["PYTHONPATH"] = str(REPO)
        self.shell = Shell(console, str(REPO), env)
        self.curl = "curl"
        self.config: dict[str, Any] = {}
        self.cluster_pid = 0
        self.cluster_proc: Any = None
        self.serve_proc: Any = None
        self.api_port = 0
        self.run_id = ""
        self.task: dict[str, Any] = {}

    # -- helpers ---------------------------------------------------------------------------

    def rel(self, path: pathlib.Path) -> str:
        """``path`` as the commands show it: relative to the repository root when inside."""
        try:
            return str(path.relative_to(REPO))
        except ValueError:
            return str(path)

    def qle(self, args: str, **kwargs: Any) -> Any:
        """``python3 -m qinglong_edge ARGS`` (the config comes from $QINGLONG_EDGE_CONFIG)."""
        return self.shell.run(f"python3 -m qinglong_edge {args}", **kwargs)

    def cluster_state(self) -> dict[str, Any]:
        path = self.cluster_dir / "cluster-state.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def claim(self) -> dict[str, Any] | None:
        path = self.state / "worker" / "pending-claim.json"
        return json.loads(path.read_text()) if path.exists() else None

    def api(self, method: str, path: str, token: str, body: dict[str, Any] | None = None, *,
            expect: int, show_headers: tuple[str, ...] = (), brief: Callable[[Any], str] | None = None,
            show: bool = True) -> tuple[int, dict[str, str], Any]:
        """One Local API call with curl, as a person would type it; checks the status."""
        parts = [self.curl, "-sS", "-i"]
        if method != "GET":
            parts += ["-X", method]
        parts.append(f'-H "Authorization: Bearer ${token}"')
        if body is not None:
            data = json.dumps(body, separators=(",", ":"))
            parts += ["-H", "'Content-Type: application/json'", "--data", shlex.quote(data)]
        parts.append(f"http://127.0.0.1:{self.api_port}/api/v3/projects/{PROJECT}{path}")
        line = " ".join(parts)
        result = self.shell.run(line, quiet=True, show=show)
        head, _, raw = result.stdout.replace("\r\n", "\n").partition("\n\n")
        lines = head.splitlines()
        if not lines or not lines[0].startswith("HTTP/"):
            raise DemoError(f"no HTTP response from {line}: {result.stdout[:200]!r} {result.stderr[:200]!r}")
        status = int(lines[0].split()[1])
        headers = {}
        for header in lines[1:]:
            name, _, value = header.partition(":")
            headers[name.strip().lower()] = value.strip()
        document = json.loads(raw) if raw.strip() else None
        if show:
            self.console.output(lines[0])
            for name in show_headers:
                if name in headers:
                    self.console.output(f"{name}: {headers[name]}")
            text = brief(document) if brief is not None else json.dumps(document, separators=(",", ":"))
            self.console.output(text, limit=12)
        if status != expect:
            raise DemoError(f"{method} {path} answered {status}, expected {expect}: {raw[:300]}")
        return status, headers, document

    def run_status(self) -> str:
        _, _, document = self.api("GET", f"/runs/{self.run_id}", "OPERATOR_TOKEN", expect=200, show=False)
        return str(document["run"]["status"])

    def write_config(self, what: str) -> None:
        text = json.dumps(self.config, indent=2) + "\n"
        write_private(self.config_path, text)
        self.console.info(f"wrote {self.rel(self.config_path)} (mode 0600): {what}")
        self.console.output(text, limit=40)
