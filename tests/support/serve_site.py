"""A Local API site for ``serve`` tests: a state directory with the section 10 identities,
its config, a free port, and ``serve`` started as a child process."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

from qinglong_edge.local.identity import activate_pepper_key, create_subject, issue_credential, register_pepper_key
from qinglong_edge.local.pepper import ensure_keyring_directory, read_pepper
from qinglong_edge.local.policy import grant_role
from qinglong_edge.local.store import Store, now_ms
from tests.support.cli import REPO
from tests.support.store import (
    CREDENTIAL_ID,
    PEPPER_KEY_ID,
    PEPPER_TEXT,
    SECRET,
    SYSTEM,
    USER,
    insert_run,
    write_pepper_file,
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def provision(state: pathlib.Path) -> None:
    """The section 10 identities, issued at the real clock (the child uses it)."""
    keyring = state / "pepper"
    ensure_keyring_directory(str(keyring))
    write_pepper_file(keyring, PEPPER_KEY_ID, PEPPER_TEXT)
    now = now_ms()
    with Store.open(str(state / "local.db")) as store:
        material = read_pepper(str(keyring), PEPPER_KEY_ID)
        store.run(lambda c: register_pepper_key(c, material, now))
        store.run(lambda c: activate_pepper_key(c, PEPPER_KEY_ID, now))
        store.run(lambda c: create_subject(c, USER, now))
        store.run(lambda c: issue_credential(c, credential_id=CREDENTIAL_ID, subject=USER, secret=SECRET,
                                             pepper=material, now_ms=now - 1000, expires_at_ms=now + 3_600_000))
        store.run(lambda c: grant_role(c, "default", USER, "operator", mutation_id="g1", changed_by=SYSTEM, now_ms=now))
        store.run(lambda c: insert_run(c, "run-1", created_at_ms=now))


def write_config(site: pathlib.Path, port: int, *, local_api: bool = True) -> pathlib.Path:
    document: dict[str, object] = {"schema": "qinglong/edge-agent@v1", "stateDirectory": str(site / "state")}
    if local_api:
        document["localApi"] = {"listener": {"host": "127.0.0.1", "port": port}, "busyTimeoutMs": 1000}
    path = site / "config.json"
    path.write_text(json.dumps(document))
    return path


def start(config: pathlib.Path, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen([sys.executable, "-m", "qinglong_edge", "--config", str(config), *extra, "serve"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert "serving the Local API" in line, line + proc.stderr.read()
    return proc


def one_line(stderr: str) -> str:
    """The one non-blank line a refusal says (no traceback)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]
