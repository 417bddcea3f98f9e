"""The cluster double's admin listener and state files, for the double as its own
process (``python -m tests.support.cluster_double``, ``demo/cluster.py``; tests and the
demo only).

:class:`AdminListener` is plain HTTP/1.1 on ``127.0.0.1`` (loopback only, no TLS and no
authentication: it stands for a cluster operator's console, never for the worker
ingress). Requests and answers are JSON:

====================  ==========================================  =====================================
request               body                                        answer
====================  ==========================================  =====================================
``GET /state``        --                                          the state file's document
``POST /cancel``      ``{"runId"?: str, "reason"?: "user"}``      ``{"runId", "status"}``: ``accepted``,
                                                                  ``already_requested``, ``already_terminal``
``POST /clock``       ``{"advanceMs": n}`` or ``{"setMs": n}``    ``{"nowMs"}``
====================  ==========================================  =====================================

``runId`` omitted: the one claimed run that is not finished (404 ``no_run`` when none,
409 ``ambiguous`` when several). Errors are ``{"code": ...}`` with 400/404/409.

From a shell (the demo)::

    python -m tests.support.cluster_admin --state-dir D cancel [--run-id R] [--reason user]
    python -m tests.support.cluster_admin --state-dir D clock --advance-ms 60000
    python -m tests.support.cluster_admin --state-dir D state

which finds the listener in ``D/cluster-admin.json`` (``{"origin": "http://127.0.0.1:P"}``).

:func:`write_state` rewrites ``D/cluster-state.json`` (0600, atomic): sessions, leases,
executions (statuses, lease versions, deadlines, cancel intents, callback sequence,
artifact metadata, completion, event types; never a lease token, a credential or a
secret value) and writes each stored log to ``D/artifacts/<logArtifactId>.log`` (0600).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import pathlib
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tests.support.cluster_attempts import TERMINAL
from tests.support.cluster_wire import compact

if TYPE_CHECKING:
    from tests.support.cluster_double import ClusterDouble

__all__ = ["ADMIN_FILE", "STATE_FILE", "AdminListener", "write_private", "write_state"]

STATE_FILE = "cluster-state.json"
ADMIN_FILE = "cluster-admin.json"
_MAX_BODY = 4096


def write_private(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file + rename), mode 0600."""
    temp = path.with_name(f".{path.name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    os.replace(temp, path)


def write_state(cluster: ClusterDouble, state_dir: pathlib.Path, extra: dict[str, Any] | None = None) -> None:
    """Rewrite the state file and write new logs (see the module docstring)."""
    with cluster.state.lock:
        snapshot = cluster.state.snapshot()
        artifacts = list(cluster.state.execution.artifacts.values())
    snapshot["requests"] = len(cluster.exchanges)
    snapshot.update(extra or {})
    write_private(state_dir / STATE_FILE, compact(snapshot) + b"\n")
    if artifacts:
        directory = state_dir / "artifacts"
        directory.mkdir(mode=0o700, exist_ok=True)
        for stored in artifacts:
            path = directory / f"{stored.log_artifact_id}.log"
            if not path.exists():
                write_private(path, stored.data)


class AdminListener:
    """The admin listener (see the module docstring).

    Args:
        cluster: the double it drives.
        port: TCP port on 127.0.0.1 (0: any free one).
        on_change: called after a cancel or a clock change (e.g. to rewrite the state file).
    """

    def __init__(self, cluster: ClusterDouble, port: int = 0,
                 on_change: Callable[[], None] | None = None) -> None:
        self.cluster = cluster
        self.on_change = on_change
        listener = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/state":
                    self._send(404, {"code": "not_found"})
                    return
                self._send(200, listener.cluster.state.snapshot())

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if length > _MAX_BODY:
                    self._send(413, {"code": "request_too_large"})
                    return
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                    if not isinstance(body, dict):
                        raise ValueError("not an object")
                except ValueError:
                    self._send(400, {"code": "invalid_json"})
                    return
                status, answer = listener.dispatch(self.path, body)
                self._send(status, answer)

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = compact(body)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="cluster-admin", daemon=True)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> AdminListener:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> AdminListener:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def dispatch(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Carry out one POST; (HTTP status, answer)."""
        if path == "/cancel":
            run_id = body.get("runId")
            if run_id is None:
                live = [run for run, view in self.cluster.executions().items() if view["runStatus"] not in TERMINAL]
                if not live:
                    return 404, {"code": "no_run"}
                if len(live) > 1:
                    return 409, {"code": "ambiguous", "runIds": live}
                run_id = live[0]
            try:
                status = self.cluster.request_cancel(str(run_id), str(body.get("reason", "user")))
            except KeyError:
                return 404, {"code": "no_run"}
            except ValueError:
                return 400, {"code": "invalid_reason"}
            self._changed()
            return 200, {"runId": run_id, "status": status}
        if path == "/clock":
            try:
                if "setMs" in body:
                    self.cluster.set_clock(int(body["setMs"]))
                else:
                    self.cluster.advance_clock(int(body.get("advanceMs", 0)))
            except (TypeError, ValueError):
                return 400, {"code": "invalid_clock"}
            self._changed()
            return 200, {"nowMs": self.cluster.now_ms()}
        return 404, {"code": "not_found"}

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


def _request(origin: str, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else compact(body)
    request = urllib.request.Request(origin + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.cluster_admin",
                                     description="drive a running cluster double (cancel, clock, state)")
    parser.add_argument("--state-dir", required=True, type=pathlib.Path)
    commands = parser.add_subparsers(dest="command", required=True)
    cancel = commands.add_parser("cancel", help="request a cluster-side cancel of a run")
    cancel.add_argument("--run-id")
    cancel.add_argument("--reason", default="user")
    clock = commands.add_parser("clock", help="move the cluster's clock")
    clock.add_argument("--advance-ms", type=int, default=0)
    commands.add_parser("state", help="print the state document")
    args = parser.parse_args(argv)
    origin = json.loads((args.state_dir / ADMIN_FILE).read_text())["origin"]
    if args.command == "cancel":
        body: dict[str, Any] = {"reason": args.reason}
        if args.run_id:
            body["runId"] = args.run_id
        status, answer = _request(origin, "POST", "/cancel", body)
    elif args.command == "clock":
        status, answer = _request(origin, "POST", "/clock", {"advanceMs": args.advance_ms})
    else:
        status, answer = _request(origin, "GET", "/state")
    print(json.dumps(answer), file=sys.stdout if status == 200 else sys.stderr)
    return 0 if status == 200 else 1


if __name__ == "__main__":
    raise SystemExit(main())
