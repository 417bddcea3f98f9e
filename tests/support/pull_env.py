"""A worker device for end-to-end pull tests: a cluster double, the worker's files, a
config file, and the real CLI (``qinglong-edge pull``) run as child processes.

:class:`PullEnv` owns one :class:`~tests.support.cluster_double.ClusterDouble` and one
state directory. ``env.pull("--json")`` runs a cycle to completion; ``env.spawn(...)``
starts one to signal it. Journal helpers read the files as a fresh process would
(``claim()``, ``inbox()``, ``abandoned()``) without taking the owner lock.

The CLI is started through an :class:`~tests.support.cli.Entry` (default: ``python -m
qinglong_edge`` from this checkout); the packaging tests pass the zipapp or an
installed launcher instead, so the same cycle runs through each artefact.

Defaults keep the suite fast: ``requestTimeoutMs`` 1000 (the minimum), ``backoffBaseMs``
100, ``pullIntervalMs`` 200, no splay; the runtime directory ("RAM") is ``<root>/run``
(standing in for ``/run/qinglong-edge``). ``worker_overrides`` replace any key.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tests.support.cli import Entry, repo_entry
from tests.support.cluster_double import ClusterDouble

REPO = pathlib.Path(__file__).resolve().parent.parent.parent

FAST_WORKER: dict[str, Any] = {
    "requestTimeoutMs": 1000,
    "backoffBaseMs": 100,
    "pullIntervalMs": 200,
    "splayMaxMs": 0,
}


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("QINGLONG_EDGE_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if extra:
        env.update(extra)
    return env


@dataclass
class Outcome:
    """A finished ``pull`` process."""

    status: int
    stdout: str
    stderr: str

    def lines(self) -> list[dict[str, Any]]:
        """The ``--json`` lines, decoded (each must be one JSON object)."""
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]

    def last(self) -> dict[str, Any]:
        """The last cycle's line (a resident pull also prints record events and a summary)."""
        lines = self.cycles()
        assert lines, f"no JSON output; stderr: {self.stderr}"
        return lines[-1]

    def cycles(self) -> list[dict[str, Any]]:
        """The lines of the cycles (``status``), without record events and the summary."""
        return [line for line in self.lines() if "event" not in line]

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The record event lines (``event``), optionally only those named ``name``."""
        return [line for line in self.lines()
                if "event" in line and line["event"] != "summary" and (name is None or line["event"] == name)]

    def summary(self) -> dict[str, Any] | None:
        """The resident pull's summary line, or None (nothing was in flight)."""
        found = [line for line in self.lines() if line.get("event") == "summary"]
        return found[-1] if found else None


class PullEnv:
    """One worker device against one cluster double (see the module docstring)."""

    def __init__(self, root: pathlib.Path, cluster: ClusterDouble, *, entry: Entry | None = None,
                 **worker_overrides: Any) -> None:
        self.root = root
        self.cluster = cluster
        self.entry = entry or repo_entry()
        self.files = cluster.provision(root / "device")
        self.state_dir = root / "state"
        self.state_dir.mkdir(mode=0o700)
        self.journal = self.state_dir / "worker"
        self.run_base = root / "run"
        self.run_base.mkdir(mode=0o700)
        self.config_path = root / "config.json"
        #: Merged into the environment of every child (the wall-clock shim of a test).
        self.extra_env: dict[str, str] = {}
        self.write_config(**worker_overrides)

    def write_config(self, **worker_overrides: Any) -> None:
        worker = {**FAST_WORKER, "runtimeDirectory": str(self.run_base), **worker_overrides}
        document = self.cluster.agent_config(self.state_dir, self.files, **worker)
        self.config_path.write_text(json.dumps(document))

    # -- running the CLI -----------------------------------------------------------------------

    def argv(self, *args: str) -> list[str]:
        return self.entry.argv("pull", "--config", str(self.config_path), "--no-splay", *args)

    def pull(self, *args: str, env: dict[str, str] | None = None, timeout: float = 30) -> Outcome:
        proc = subprocess.run(self.argv(*args), capture_output=True, env=self.entry.environment({**self.extra_env,
                                                                                               **(env or {})}),
                              cwd=self.entry.cwd, timeout=timeout, check=False)
        return Outcome(proc.returncode, proc.stdout.decode(), proc.stderr.decode())

    def spawn(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=self.entry.environment({**self.extra_env, **(env or {})}), cwd=self.entry.cwd)

    def cli(self, *args: str) -> Outcome:
        """Another command (``inbox list``...) with this device's config, through the same entry."""
        result = self.entry.run("--config", str(self.config_path), *args, env=self.extra_env or None)
        return Outcome(result.status, result.stdout, result.stderr)

    @staticmethod
    def finish(proc: subprocess.Popen[bytes], timeout: float = 30) -> Outcome:
        stdout, stderr = proc.communicate(timeout=timeout)
        return Outcome(proc.returncode, stdout.decode(), stderr.decode())

    def pull_until_settled(self, *args: str, limit: int = 20) -> list[Outcome]:
        """Run cycles until one is answered (accepted, replayed or idle: an idle answer
        keeps its claim), waiting for the claim's backoff in between."""
        outcomes = []
        for _ in range(limit):
            outcomes.append(self.pull("--json", *args))
            claim = self.claim()
            if claim is None or outcomes[-1].last().get("status") in ("accepted", "replayed", "idle"):
                return outcomes
            self.wait_until_due(claim)
        raise AssertionError(f"no convergence after {limit} cycles: {[o.stdout for o in outcomes]}")

    @staticmethod
    def wait_until_due(claim: dict[str, Any]) -> None:
        # Part of the scenario: the claim's backoff is on the wall clock the next cycle reads
        # (a cycle before nextAttemptAtMs only waits), so real time must pass.
        delay = claim["nextAttemptAtMs"] / 1000 - time.time()
        if delay > 0:
            time.sleep(delay + 0.01)

    # -- what a fresh process would find ---------------------------------------------------------

    def claim(self) -> dict[str, Any] | None:
        path = self.journal / "pending-claim.json"
        return json.loads(path.read_bytes()) if path.exists() else None

    def inbox(self) -> dict[str, dict[str, Any]]:
        offers = self.journal / "offers"
        if not offers.exists():
            return {}
        return {name.removesuffix(".json"): json.loads((offers / name).read_bytes())
                for name in sorted(os.listdir(offers)) if name.endswith(".json")}

    def abandoned(self) -> dict[str, dict[str, Any]]:
        directory = self.journal / "abandoned"
        if not directory.exists():
            return {}
        return {name.removesuffix(".json"): json.loads((directory / name).read_bytes())
                for name in sorted(os.listdir(directory)) if name.endswith(".json")}

    @property
    def runtime(self) -> pathlib.Path:
        """This journal's runtime directory (``<run>/journal-<key>``)."""
        from qinglong_edge.worker.journal.runtime import journal_key

        return self.run_base / journal_key(str(self.journal))

    def session(self) -> dict[str, Any] | None:
        """The Worker Session record (in the runtime directory), or None."""
        path = self.runtime / "session.json"
        if not path.exists():
            return None
        session: dict[str, Any] | None = json.loads(path.read_bytes())["session"]
        return session

    def marker(self) -> dict[str, Any] | None:
        path = self.runtime / "attempt.json"
        return json.loads(path.read_bytes()) if path.exists() else None


def kill(proc: subprocess.Popen[bytes], signum: int = signal.SIGKILL) -> None:
    os.kill(proc.pid, signum)


@contextmanager
def cluster_process(state_dir: pathlib.Path, tasks: str) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any]]]:
    """The cluster double as its own process (``python -m tests.support.cluster_double``,
    the demo's), its state under ``state_dir``, ``tasks`` (comma-separated kinds) queued: the process and the line it
    printed (origin, port, the worker's files). Killed after the block if still running."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.cluster_double", "--state-dir", str(state_dir),
                             "--tasks", tasks], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
                            env=child_env())
    try:
        assert proc.stdout is not None
        info: dict[str, Any] = json.loads(proc.stdout.readline())
        yield proc, info
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
