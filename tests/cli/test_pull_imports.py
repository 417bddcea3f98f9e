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
from qinglong_edge.cli import main
status = main(sys.argv[1:])
sys.stderr.write("\\nMODULES=" + json.dumps(sorted(sys.modules)) + "\\n")
sys.exit(status)
"""


@pytest.fixture
def env(tmp_path: pathlib.Path) -> Iterator[PullEnv]:
    with ClusterDouble(tasks=("shell",)) as cluster:
        yield PullEnv(tmp_path, cluster)


def _modules(env: PullEnv, *extra: str) -> tuple[int, set[str]]:
    proc = subprocess.run([sys.executable, "-S", "-c", PROBE, "pull", "--config", str(env.config_path),
                           "--no-splay", "--json", *extra],
                          capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=30, check=False)
    line = [text for text in proc.stderr.splitlines() if text.startswith("MODULES=")][-1]
    return proc.returncode, set(json.loads(line[len("MODULES="):]))


def test_an_accepting_cycle_imports_nothing_it_does_not_need(env: PullEnv) -> None:
    status, modules = _modules(env)
    assert status == 0
    assert {"ssl", "http.client", "fcntl", "threading"} <= modules  # the probe sees real imports
    assert sorted(set(FORBIDDEN) & modules) == []
    assert sorted(set(IMPORT_COST) & modules) == []
    assert len(env.inbox()) == 1


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


def test_the_probe_sees_the_argparse_path(env: PullEnv) -> None:
    """The probe can fail: an abbreviated option goes through argparse (and its imports)."""
    status, modules = _modules(env, "--no-spl")
    assert status == 0
    assert {"argparse", "shutil"} <= modules

