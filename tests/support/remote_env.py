"""Helpers for the remote-execution tests: a device (:class:`~tests.support.pull_env.PullEnv`)
against a cluster double with short leases, jobs that leave traces outside the agent's
state, and the invariants every scenario ends with.

Leases are short (claim 6 s, renewals 6 s: a renewal every 2 s) so a cancel reaches a job
within about two seconds; the jobs are ``/bin/sh`` scripts that append one line to a
*trace* file per start (so "never twice" is a line count) and may wait for a *gate* file
(so a test decides when a job ends, without sleeping).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
from typing import Any

from tests.support.cluster_double import ClusterDouble
from tests.support.pull_env import Outcome, PullEnv
from tests.support.wait import wait_until

__all__ = ["CLAIM_LEASE_MS", "RENEWAL_MS", "RemoteEnv", "remote_cluster"]

CLAIM_LEASE_MS = 6_000
RENEWAL_MS = 6_000


def remote_cluster() -> ClusterDouble:
    """A cluster double with the short leases of this module (not started)."""
    return ClusterDouble(lease_duration_ms=CLAIM_LEASE_MS, renewal_duration_ms=RENEWAL_MS)


class RemoteEnv(PullEnv):
    """A device whose pulls execute what they accept (see the module docstring)."""

    def __init__(self, root: pathlib.Path, cluster: ClusterDouble, **worker: Any) -> None:
        super().__init__(root, cluster, **worker)
        self.traces = root / "traces"
        self.traces.mkdir(mode=0o755)

    # -- jobs ----------------------------------------------------------------------------------

    def trace(self, name: str) -> pathlib.Path:
        return self.traces / name

    def gated_job(self, name: str, *, exit_code: int = 0, output: str = "hello", **options: Any) -> Any:
        """A shell task that records its start in ``trace(name)``, prints ``output``, waits
        for ``trace(name + ".go")`` (polling, 20 ms) and exits ``exit_code``."""
        trace, gate = self.trace(name), self.trace(name + ".go")
        script = (f'echo started >> {trace}; printf "%s\\n" "{output}"; '
                  f'while [ ! -e {gate} ]; do sleep 0.02; done; exit {exit_code}')
        return self.cluster.add_command_task(script, **options)

    def quick_job(self, name: str, *, exit_code: int = 0, output: str = "hello", **options: Any) -> Any:
        trace = self.trace(name)
        return self.cluster.add_command_task(f'echo started >> {trace}; printf "%s\\n" "{output}"; exit {exit_code}',
                                             **options)

    def release(self, name: str) -> None:
        self.trace(name + ".go").write_text("go")

    def starts(self, name: str) -> int:
        path = self.trace(name)
        return path.read_text().count("started") if path.exists() else 0

    # -- the device --------------------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        ((_, record),) = self.inbox().items()
        return record

    def state(self) -> str | None:
        inbox = self.inbox()
        return next(iter(inbox.values()))["state"] if len(inbox) == 1 else None

    def wait_state(self, *states: str, timeout: float = 20.0) -> dict[str, Any]:
        def record() -> dict[str, Any] | None:
            return self.record() if self.state() in states else None

        found = wait_until(record, timeout, interval=0.02, what=f"the offer to be {' or '.join(states)}")
        assert found is not None  # what= raised otherwise
        return found

    def files_under(self, root: pathlib.Path | None = None) -> list[pathlib.Path]:
        base = root or self.root
        return [pathlib.Path(d) / f for d, _, names in os.walk(base) for f in names]

    def remote_logs(self) -> list[pathlib.Path]:
        logs = self.state_dir / "logs" / "remote"
        return [p for p in self.files_under(logs) if p.name.endswith(".log")] if logs.exists() else []

    def receipts(self) -> list[pathlib.Path]:
        base = self.journal / "receipts"
        return self.files_under(base) if base.exists() else []

    def run_to_end(self, *args: str, timeout: float = 60) -> Outcome:
        """``pull --json`` until it exits (a resident pull stays until its records end)."""
        return self.pull("--json", *args, timeout=timeout)

    def spawn_json(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return self.spawn("--json", *args, env=env)

    def spawn_json_cli(self, *args: str) -> subprocess.Popen[bytes]:
        """Another command (``drain``...) with ``--json`` and this device's config, in the background."""
        return subprocess.Popen(self.entry.argv("--config", str(self.config_path), "--json", *args),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.entry.environment(None),
                                cwd=self.entry.cwd)

    @staticmethod
    def stop(proc: subprocess.Popen[bytes], signum: int = signal.SIGTERM, timeout: float = 30) -> Outcome:
        os.kill(proc.pid, signum)
        return PullEnv.finish(proc, timeout=timeout)


def event_names(outcome: Outcome) -> list[str]:
    """The record events in order, without the routine renewals (their number depends on time)."""
    return [line["event"] for line in outcome.events() if line["event"] != "renewed"]


def dump(outcome: Outcome) -> str:
    return json.dumps({"status": outcome.status, "stdout": outcome.stdout[-4000:], "stderr": outcome.stderr[-4000:]})
