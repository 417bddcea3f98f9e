"""A real ``pull`` cycle loads no module it does not need (spec README: the pull path of a
router pays for every import each minute; benchmarks/bench_pull.py measures the cost)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.cluster_double import ClusterDouble
from tests.support.pull_env import REPO, PullEnv, child_env

#: Modules a pull cycle must not import: the Local API's store, process control, and
#: conveniences with a cheaper stdlib equivalent on this path. (``random`` is not here:
#: ``http.client`` imports it through ``email.utils``.)
FORBIDDEN = ("sqlite3", "_sqlite3", "uuid", "logging", "platform", "secrets", "subprocess",
             "asyncio", "multiprocessing", "http.server", "socketserver", "urllib.request", "decimal")

#: Modules whose import (or, for dataclasses, class creation) a cycle paid for nothing:
#: ``dataclasses`` (and ``inspect``, ``ast``, ``dis``, ``tokenize`` under it), ``typing``
#: (annotations only: ``TYPE_CHECKING = False`` blocks), ``argparse`` (the plain ``pull``
#: command line is parsed by ``commands.pull.plain_args``; argparse's help formatter
#: imports ``shutil``, its messages ``gettext``), ``hashlib`` (contracts.digest has SHA-256),
#: ``importlib`` (``__import__`` does). ``email.utils``, ``datetime`` and ``random`` are not
#: here: ``http.client`` imports them (benchmarks/bench_pull.py's baseline pays them too).
IMPORT_COST = ("dataclasses", "inspect", "ast", "dis", "tokenize", "typing", "argparse", "shutil", "gettext",
               "hashlib", "importlib")

PROBE = """
import json, sys
import qinglong_edge.crashpoints as crashpoints
published = []
_crashpoint = crashpoints.crashpoint
def _hook(name):
    if name == "pull.claim_cleared" and not published:
        published.append(sorted(sys.modules))
    _crashpoint(name)
crashpoints.crashpoint = _hook  # bound by name by every module imported from here on
from qinglong_edge.cli import main
status = main(sys.argv[1:])
sys.stderr.write("\\nPUBLISHED=" + json.dumps(published[0] if published else None) + "\\n")
sys.stderr.write("\\nMODULES=" + json.dumps(sorted(sys.modules)) + "\\n")
sys.exit(status)
"""
#: What the execution after the inbox publication imports (lazily, only then): the
#: resident loop, the runner, the seven calls, the process core and what it needs.
#: Every module of ours an idle cron cycle loads, exactly: a new one on this path is a
#: decision (each costs the router's minute), made here and in benchmarks/bench_pull.py.
IDLE_OURS = frozenset({
    "qinglong_edge",
    "qinglong_edge.cli",
    "qinglong_edge.clock",
    "qinglong_edge.commands",
    "qinglong_edge.commands._output",
    "qinglong_edge.commands.pull",
    "qinglong_edge.config",
    "qinglong_edge.contracts",
    "qinglong_edge.contracts._shape",
    "qinglong_edge.contracts.capabilities",
    "qinglong_edge.contracts.clocks",
    "qinglong_edge.contracts.collation",
    "qinglong_edge.contracts.credentials",
    "qinglong_edge.contracts.digest",
    "qinglong_edge.contracts.errors",
    "qinglong_edge.contracts.fields",
    "qinglong_edge.contracts.ids",
    "qinglong_edge.contracts.inbox",
    "qinglong_edge.contracts.journal_records",
    "qinglong_edge.contracts.offer",
    "qinglong_edge.contracts.origin",
    "qinglong_edge.contracts.placement",
    "qinglong_edge.contracts.residency",
    "qinglong_edge.contracts.session",
    "qinglong_edge.contracts.strictjson",
    "qinglong_edge.contracts.x509",
    "qinglong_edge.crashpoints",
    "qinglong_edge.errors",
    "qinglong_edge.filecheck",
    "qinglong_edge.worker",
    "qinglong_edge.worker.cycle",
    "qinglong_edge.worker.delivery",
    "qinglong_edge.worker.delivery.abort",
    "qinglong_edge.worker.delivery.capabilities",
    "qinglong_edge.worker.delivery.cluster_clock",
    "qinglong_edge.worker.delivery.expiry",
    "qinglong_edge.worker.delivery.identity_guard",
    "qinglong_edge.worker.delivery.pacing",
    "qinglong_edge.worker.delivery.pull",
    "qinglong_edge.worker.delivery.session",
    "qinglong_edge.worker.ingress",
    "qinglong_edge.worker.ingress.certificates",
    "qinglong_edge.worker.ingress.http_exchange",
    "qinglong_edge.worker.ingress.material",
    "qinglong_edge.worker.ingress.tls_wire",
    "qinglong_edge.worker.ingress.transport",
    "qinglong_edge.worker.journal",
    "qinglong_edge.worker.journal.files",
    "qinglong_edge.worker.journal.ownerlock",
    "qinglong_edge.worker.journal.runtime",
    "qinglong_edge.worker.journal.store",
    "qinglong_edge.worker.journal.view",
})

#: Modules of ours for the type checker only (imported under ``TYPE_CHECKING``): no cycle,
#: idle or executing, imports them (contracts/records.py and ports.py import ``typing``).
TYPE_ONLY = ("qinglong_edge.contracts.ports", "qinglong_edge.contracts.records")

EXECUTION = ("qinglong_edge.worker.remote.resident", "qinglong_edge.worker.remote.runner", "qinglong_edge.worker.remote.calls",
             "qinglong_edge.process.spawn", "qinglong_edge.process.stop", "subprocess")


@pytest.fixture
def env(tmp_path: pathlib.Path) -> Iterator[PullEnv]:
    with ClusterDouble(tasks=("shell",)) as cluster:
        yield PullEnv(tmp_path, cluster)


def _probe(env: PullEnv, *extra: str) -> tuple[int, set[str], set[str] | None]:
    proc = subprocess.run([sys.executable, "-S", "-c", PROBE, "pull", "--config", str(env.config_path),
                           "--no-splay", "--json", *extra],
                          capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=30, check=False)
    lines = {text.partition("=")[0]: json.loads(text.partition("=")[2]) for text in proc.stderr.splitlines()
             if text.startswith(("MODULES=", "PUBLISHED="))}
    published = lines["PUBLISHED"]
    return proc.returncode, set(lines["MODULES"]), None if published is None else set(published)


def _modules(env: PullEnv, *extra: str) -> tuple[int, set[str]]:
    status, modules, _ = _probe(env, *extra)
    return status, modules


def test_an_accepting_cycle_imports_nothing_it_does_not_need_up_to_the_inbox(env: PullEnv) -> None:
    """Spec README "Layers": up to the inbox publication (the claim cleared) an accepting
    cycle loads today's pinned set; the execution that follows imports the rest lazily."""
    status, modules, published = _probe(env)
    assert status == 0
    assert published is not None, "the probe did not see the claim cleared"
    assert {"ssl", "http.client", "fcntl", "threading"} <= published  # the probe sees real imports
    assert sorted(set(FORBIDDEN) & published) == []
    assert sorted(set(IMPORT_COST) & published) == []
    assert sorted(set(EXECUTION) & published) == []  # nothing of the execution before it is needed
    assert set(EXECUTION) <= modules  # then the offer was executed: those came after
    assert sorted({"sqlite3", "_sqlite3", "http.server", "asyncio", "multiprocessing"} & modules) == []
    assert sorted(set(TYPE_ONLY) & modules) == []  # annotations only, under TYPE_CHECKING, the execution too
    ((_, record),) = env.inbox().items()
    assert record["state"] == "completion_acknowledged"


def test_an_idle_cron_cycle_imports_nothing_it_does_not_need(tmp_path: pathlib.Path) -> None:
    """The cron line itself (``--config PATH pull``, global option first), idle cluster."""
    with ClusterDouble(tasks=()) as cluster:
        env = PullEnv(tmp_path, cluster)
        proc = subprocess.run([sys.executable, "-S", "-c", PROBE, "--config", str(env.config_path), "pull"],
                              capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "idle (no_candidates)" in proc.stdout
    line = [text for text in proc.stderr.splitlines() if text.startswith("MODULES=")][-1]
    modules = set(json.loads(line[len("MODULES="):]))
    assert {"ssl", "http.client", "email.utils", "datetime"} <= modules  # what the baseline pays too
    assert sorted((set(FORBIDDEN) | set(IMPORT_COST)) & modules) == []
    # An empty inbox has no job files to name: those modules wait for a record (0.2 MiB).
    assert sorted({"qinglong_edge.worker.remote.job_files", "qinglong_edge.contracts.receipt",
                   "qinglong_edge.contracts.launch"} & modules) == []
    # The probes are light (issue 25): placement decisions and semver ranges are doctor's.
    assert "qinglong_edge.worker.delivery.capabilities" in modules
    assert sorted({"qinglong_edge.contracts.semver", "qinglong_edge.contracts.placement_decision"} & modules) == []
    assert sorted(set(EXECUTION) & modules) == []
    assert sorted(m for m in modules if m.startswith("qinglong_edge")) == sorted(IDLE_OURS)


def test_the_probe_sees_the_argparse_path(env: PullEnv) -> None:
    """The probe can fail: an abbreviated option goes through argparse (and its imports)."""
    status, modules = _modules(env, "--no-spl")
    assert status == 0
    assert {"argparse", "shutil"} <= modules

