"""The splay of a cron ``pull`` (issue 18 item 8): the cycle waits for the device's
phase in the minute *before* it imports the TLS client or opens the journal (a sleeping
pull holds no lock and as little memory as possible), says so on a terminal, and a
SIGTERM during the wait ends it at once with nothing sent.

The wall clock is pinned in the child (``time.time_ns`` replaced before the real CLI
runs) to second 0 of a minute, so the wait is the device's offset (``edge-3``: phase
47.7 s, +-5 s of jitter), whatever the real time is.
"""

from __future__ import annotations

import os
import pathlib
import pty
import select
import signal
import subprocess
import sys
import time

from tests.support.cluster_double import ClusterDouble
from tests.support.pull_env import REPO, PullEnv, child_env

PINNED_CLOCK = """
import sys, time
minute = (time.time_ns() // 60_000_000_000) * 60_000_000_000
time.time_ns = lambda: minute
from qinglong_edge.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _read_until(fd: int, needle: bytes, timeout: float = 20.0) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while needle not in data:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {needle!r} in {data!r}"
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 4096)
            assert chunk, f"closed before {needle!r}: {data!r}"
            data += chunk
    return data


def _pull_on_a_terminal(env: PullEnv) -> tuple[subprocess.Popen[bytes], int]:
    """``pull`` at the pinned clock, its stderr a terminal (a person runs it): the process
    and the terminal's controller side (the caller closes it)."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", PINNED_CLOCK, "--config", str(env.config_path), "pull"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=terminal, cwd=REPO,
                            env=child_env())
    os.close(terminal)
    return proc, controller


def test_the_wait_comes_before_the_tls_client_and_sigterm_ends_it(tmp_path: pathlib.Path) -> None:
    with ClusterDouble() as cluster:
        env = PullEnv(tmp_path, cluster, splayMaxMs=60_000, workerId="edge-3")
        proc, controller = _pull_on_a_terminal(env)
        try:
            said = _read_until(controller, b"--no-splay skips it")
            assert b"pull: waiting " in said and b"slot in the minute" in said
            maps = pathlib.Path(f"/proc/{proc.pid}/maps").read_text()
            assert "libssl" not in maps  # the TLS client is not even imported while it waits
            assert not env.journal.exists()  # nor is the journal opened: no lock held
            proc.send_signal(signal.SIGTERM)
            stdout, _ = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            os.close(controller)
        assert proc.returncode == 75
        assert stdout == b""
        assert cluster.exchanges == []  # nothing was sent


def test_a_handover_from_a_stopped_resident_pull_skips_the_wait(tmp_path: pathlib.Path) -> None:
    """A resident pull stopped by a signal (an upgrade's ``pull --release``, a Ctrl-C) leaves
    jobs whose 30 s leases run on: the next cron pull must not wait ~48 s for this device's
    phase (the test above waits it, same device, same pinned second 0) before it renews
    them. It takes the journal at once and removes the note."""
    with ClusterDouble(tasks=(), worker_id="edge-3") as cluster:
        env = PullEnv(tmp_path, cluster, splayMaxMs=60_000)
        env.runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        note = env.runtime / "handover.json"
        note.write_text('{"schemaVersion":1,"inFlight":1,"atMs":0,"signal":"SIGTERM"}\n')
        note.chmod(0o600)
        proc, controller = _pull_on_a_terminal(env)
        try:
            stdout, _ = proc.communicate(timeout=30)  # well before the 42.7 s the splay would take
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            said = b""
            while select.select([controller], [], [], 0)[0]:
                try:
                    chunk = os.read(controller, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                said += chunk
            os.close(controller)
        assert proc.returncode == 0, (said, stdout)
        assert b"pull: waiting" not in said
        assert b"idle" in stdout
        assert not note.exists()  # the new owner took the handover
