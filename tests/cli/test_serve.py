"""``qinglong-edge serve`` end to end: a child process, a real port, real signals."""

from __future__ import annotations

import json
import pathlib
import signal
import socket
import time

import pytest

from tests.support.cli import run_cli
from tests.support.http_client import exchange, request_bytes
from tests.support.serve_site import free_port, start, write_config
from tests.support.store import (
    TOKEN,
)


def test_serves_and_drains_on_sigterm(site: pathlib.Path) -> None:
    port = free_port()
    proc = start(write_config(site, port), "--json")
    try:
        auth = [("Authorization", f"Bearer {TOKEN}")]
        listed = exchange(("127.0.0.1", port), request_bytes("GET", "/api/v3/projects/default/runs", headers=auth))
        assert listed is not None and listed.status == 200
        assert [r["id"] for r in listed.json()["runs"]] == ["run-1"]
        body = b'{"schema":"qinglong/run-cancellation@v1","mutationId":"m-1"}'
        cancel = exchange(("127.0.0.1", port), request_bytes(
            "POST", "/api/v3/projects/default/runs/run-1/cancellation",
            headers=[*auth, ("Content-Type", "application/json")], body=body))
        assert cancel is not None and cancel.status == 202
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert time.monotonic() - started < 6
        summary = json.loads(out.strip().splitlines()[-1])
        pruned = summary.pop("pruned")  # what the storage caps removed meanwhile (issue 16): nothing here
        assert summary == {"ok": True, "drained": True, "exitStatus": 0}
        assert pruned["runs"] == 0 and pruned["auditRows"] == 0
        assert "Traceback" not in err and TOKEN not in err
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigint_also_drains(site: pathlib.Path) -> None:
    proc = start(write_config(site, free_port()))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err


def test_sighup_drains_like_sigterm_and_exits_0(site: pathlib.Path) -> None:
    """procd's ``service signal`` (``procd_send_signal``) sends SIGHUP by default; so does a
    terminal hang-up. serve has no live reload: SIGHUP drains as SIGTERM does and exits 0
    (procd's respawn starts it again). On main it killed serve undrained (-1 / 129)."""
    port = free_port()
    proc = start(write_config(site, port), "--json")
    listed = exchange(("127.0.0.1", port), request_bytes("GET", "/api/v3/projects/default/runs",
                                                         headers=[("Authorization", f"Bearer {TOKEN}")]))
    assert listed is not None and listed.status == 200
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "SIGHUP" in err and "draining" in err and "stopped" in err, err
    assert "Traceback" not in err
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["ok"], summary["drained"], summary["exitStatus"]) == (True, True, 0)


def test_rejects_a_configuration_without_local_api(site: pathlib.Path) -> None:
    result = run_cli("--config", str(write_config(site, 0, local_api=False)), "serve")
    assert result.status == 78
    assert "localApi" in result.stderr


def test_rejects_a_port_in_use_with_69(site: pathlib.Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = run_cli("--config", str(write_config(site, port)), "--json", "serve")
    assert result.status == 69, result.stderr
    assert result.json()["code"] == "listener_unavailable"


def test_rejects_a_missing_keyring(site: pathlib.Path) -> None:
    (site / "state" / "pepper").rename(site / "state" / "elsewhere")
    result = run_cli("--config", str(write_config(site, free_port())), "serve")
    # The database names a key the keyring lacks: 73 keyring_missing (README "Commands"), not
    # the 78 of a first serve before admin init (the test below).
    assert result.status == 73, result.stderr
    assert "keyring_missing" in result.stderr and "restore the keyring" in result.stderr
    assert "Traceback" not in result.stderr


def test_rejects_a_missing_keyring_and_names_the_command_that_makes_it(tmp_path: pathlib.Path) -> None:
    # A new user's first `serve` before `admin init` (found while following the README):
    # the message must say what to run, not only what is missing.
    (tmp_path / "state").mkdir(mode=0o700)
    result = run_cli("--config", str(write_config(tmp_path, free_port())), "serve")
    assert result.status == 78, result.stderr
    assert "pepper_unavailable" in result.stderr
    assert "qinglong-edge admin init" in result.stderr
