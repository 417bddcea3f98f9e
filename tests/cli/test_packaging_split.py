"""The modules the agent imports are a subset of what our Depends line brings on OpenWrt.

Every CLI command runs in a child `python3 -I -S` in which each module of an OpenWrt
python3 split package missing from `Depends:` fails to import
(tests/support/openwrt_split.py). Commands are taken from `qinglong-edge --help`, so a
new command is covered as soon as it exists: its `--help` here, and a real run once it
has an entry in SPLIT_CASES.

`pull` runs a real cycle against the TLS cluster double here; `serve` (long-running)
runs with a real cancel under the blocker in tests/cli/test_serve_execution.py
(COVERED_ELSEWHERE), and both run from the installed ipk and tarball trees under the
blocker in tests/packaging/ (test_ipk_unpack.py, test_tarball_install.py).
"""

from __future__ import annotations

import ast
import json
import pathlib
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.cli import REPO, doctor_config
from tests.support.openwrt_split import (
    BASE_PYTHON,
    DEPENDS,
    available_pythons,
    blocked_modules,
    interpreter_without,
    run_cli_under_split,
    run_code_under_split,
)


@dataclass(frozen=True)
class SplitCase:
    """A real run of one command: ``prepare(tmp_path)`` returns its argv."""

    prepare: Callable[[pathlib.Path], list[str]]
    expect_status: int = 0
    expect_stdout: str = ""


def _doctor(tmp_path: pathlib.Path) -> list[str]:
    return ["--config", str(doctor_config(tmp_path)), "doctor"]


def _render_uci(tmp_path: pathlib.Path) -> list[str]:
    dump = tmp_path / "uci.txt"
    dump.write_text("qinglong-edge.main=agent\nqinglong-edge.main.state_directory='/etc/qinglong-edge/state'\n"
                    "qinglong-edge.worker=worker\nqinglong-edge.worker.enabled='1'\n"
                    "qinglong-edge.worker.origin='https://cluster.example'\nqinglong-edge.worker.worker_id='e1'\n"
                    "qinglong-edge.worker.credential_file='/c'\nqinglong-edge.worker.certificate_file='/p'\n"
                    "qinglong-edge.worker.private_key_file='/k'\nqinglong-edge.worker.trust_anchor_file='/a'\n")
    return ["config", "render-uci", "--input", str(dump), "--output", str(tmp_path / "config.json")]


def _admin_init(tmp_path: pathlib.Path) -> list[str]:
    return [*_doctor(tmp_path)[:2], "admin", "init"]  # a real SQLite store and pepper keyring


def _inbox_list(tmp_path: pathlib.Path) -> list[str]:
    config = tmp_path / "worker.json"
    state = tmp_path / "worker-state"
    state.mkdir(mode=0o700)
    config.write_text(json.dumps({
        "schema": "qinglong/edge-agent@v1", "stateDirectory": str(state),
        "worker": {"origin": "https://cluster.example", "workerId": "edge-1", "credentialFile": "/c",
                   "certificateFile": "/p", "privateKeyFile": "/k", "trustAnchorFiles": ["/a"]},
    }))
    return ["--config", str(config), "inbox", "list", "--json"]


#: Cluster doubles started by a case's ``prepare``; stopped when the module is done.
_DOUBLES: list[Any] = []


@pytest.fixture(autouse=True, scope="module")
def _stop_doubles() -> Iterator[None]:
    yield
    for double in _DOUBLES:
        double.stop()


def _pull(tmp_path: pathlib.Path) -> list[str]:
    """One real cycle over TLS 1.3 mTLS: register, claim, inbox record written."""
    from tests.support.cluster_double import ClusterDouble
    from tests.support.pull_env import PullEnv

    double = ClusterDouble(tasks=("shell",)).start()
    _DOUBLES.append(double)
    env = PullEnv(tmp_path, double)
    return ["--config", str(env.config_path), "pull", "--no-splay", "--json"]


def _drain(tmp_path: pathlib.Path) -> list[str]:
    """A registered device taken offline over TLS 1.3 mTLS: draining, then offline."""
    from tests.support.cluster_double import ClusterDouble
    from tests.support.pull_env import PullEnv

    double = ClusterDouble().start()
    _DOUBLES.append(double)
    env = PullEnv(tmp_path, double)
    assert env.pull().status == 0  # registers (the repository's code, outside the split)
    return ["--config", str(env.config_path), "--json", "drain"]


def _offer_check(tmp_path: pathlib.Path) -> list[str]:
    vectors = pathlib.Path(REPO) / "tests" / "contracts" / "vectors"
    return ["offer", "check", "--claim", str(vectors / "a_pending_claim.json"), str(vectors / "a_offered.json")]


#: Real runs per command (key: the command name in `--help`). A case for a command
#: this tree does not have yet runs as soon as the command exists.
SPLIT_CASES: dict[str, SplitCase] = {
    "version": SplitCase(lambda tmp: ["version"], expect_stdout="qinglong-edge "),
    "doctor": SplitCase(_doctor, expect_stdout="doctor: all required checks passed"),
    "config": SplitCase(_render_uci),
    "admin": SplitCase(_admin_init, expect_stdout="database "),
    "inbox": SplitCase(_inbox_list, expect_stdout='"offers":[]'),
    "pull": SplitCase(_pull, expect_stdout='"status":"accepted"'),
    "drain": SplitCase(_drain, expect_stdout='"status":"offline"'),
    "offer": SplitCase(_offer_check, expect_stdout="valid offered offer-1 run-1"),
}

#: Commands whose real run needs a fixture another issue provides (name -> what to add).
PENDING_CASES: dict[str, str] = {}

#: Long-running commands whose real run under the blocker lives in another test file
#: (name -> (file, a marker that file must contain)).
COVERED_ELSEWHERE: dict[str, tuple[str, str]] = {
    "serve": ("tests/cli/test_serve_execution.py", "split_entry()"),
}


def _commands_in_help() -> list[str]:
    result = run_cli_under_split(["--help"])
    assert result.status == 0, result.stderr
    text = result.stdout.split("COMMAND\n", 2)[-1]
    return re.findall(r"^    ([a-z][a-z0-9-]*)\s", text, flags=re.MULTILINE)


COMMANDS = _commands_in_help()
PYTHONS = available_pythons()


def test_help_lists_the_commands() -> None:
    assert {"version", "doctor", "config"} <= set(COMMANDS)
    assert not set(SPLIT_CASES) & set(PENDING_CASES)
    assert not set(COVERED_ELSEWHERE) & (set(SPLIT_CASES) | set(PENDING_CASES))


@pytest.mark.parametrize("python", PYTHONS, ids=lambda p: pathlib.Path(p).parent.parent.name or p)
@pytest.mark.parametrize("command", COMMANDS)
def test_command_help_imports_only_depends(command: str, python: str) -> None:
    result = run_cli_under_split([command, "--help"], python=python)
    assert result.status == 0, result.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_command_runs_under_depends(command: str, tmp_path: pathlib.Path) -> None:
    case = SPLIT_CASES.get(command)
    if case is None and command in COVERED_ELSEWHERE:
        path, marker = COVERED_ELSEWHERE[command]
        assert marker in (pathlib.Path(REPO) / path).read_text(), f"{path} no longer runs {command} under the split"
        return
    if case is None:
        assert command in PENDING_CASES, (
            f"`{command}` has no real run under the OpenWrt split simulation: add a SplitCase for it "
            "to SPLIT_CASES in tests/cli/test_packaging_split.py")
        pytest.skip(f"needs {PENDING_CASES[command]} (see the module docstring)")
    result = run_cli_under_split(case.prepare(tmp_path))
    assert result.status == case.expect_status, (
        f"{result.stdout}{result.stderr}imports refused by the OpenWrt split: {result.refused}")
    assert case.expect_stdout in result.stdout
    assert "OpenWrt package" not in result.stderr


def test_doctor_under_light_only_reports_the_missing_packages(tmp_path: pathlib.Path) -> None:
    """The blocker reaches the CLI: without python3-openssl/sqlite3 doctor fails their checks."""
    result = run_cli_under_split(_doctor(tmp_path), installed=("python3-light",))
    assert result.status == 69, result.stdout + result.stderr
    lines = {line.split()[1]: line for line in result.stdout.splitlines() if line[:4] in ("ok  ", "FAIL", "warn")}
    assert not lines["tls13"].startswith("ok") and "python3-openssl" in lines["tls13"]
    assert lines["sqlite"].startswith("FAIL") and "python3-sqlite3" in lines["sqlite"]
    assert ("sqlite3", "python3-sqlite3") in result.refused


def test_without_python3_ctypes_the_agent_works_and_doctor_says_what_remote_jobs_can_read(
        tmp_path: pathlib.Path) -> None:
    """python3-ctypes is in Depends (the isolation of remote jobs), but a device may lack it
    (a tarball install that skipped it, a package removed): the agent must still work and
    say plainly what that costs. The blocker removes ``ctypes`` from the agent; the
    interpreter itself lacks it too (:func:`interpreter_without`), so the job wrapper that
    the isolation probe starts (``sys.executable -I -S``) has no ``ctypes`` either, as on
    the router."""
    without = [package for package in DEPENDS if package != "python3-ctypes"]
    python = interpreter_without(["python3-ctypes"], str(tmp_path / "python"))
    if python is None:
        pytest.skip(f"{BASE_PYTHON} cannot be laid out without ctypes (missing, or a shared libpython)")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    device = tmp_path / "device"
    device.mkdir(mode=0o700)
    config = tmp_path / "worker.json"
    config.write_text(json.dumps({
        "schema": "qinglong/edge-agent@v1", "stateDirectory": str(state),
        "worker": {"origin": "https://cluster.example", "workerId": "edge-1",
                   "credentialFile": str(device / "worker.credential"), "certificateFile": str(device / "client.crt"),
                   "privateKeyFile": str(device / "client.key"), "trustAnchorFiles": [str(device / "ca.pem")]},
    }))
    result = run_cli_under_split(["--config", str(config), "doctor", "--json"], installed=without, python=python)
    assert result.status in (0, 69), result.stderr  # the worker's files are missing here: their checks fail
    assert "Traceback" not in result.stderr and "OpenWrt package" not in result.stderr
    checks = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    isolation = checks["isolation"]
    assert (isolation["ok"], isolation["required"]) == (False, False)  # a warning, not a failure
    assert "ctypes module is missing" in isolation["detail"]
    assert "can read everything it can" in isolation["detail"]
    assert str(device) in isolation["detail"] and str(state) in isolation["detail"]
    assert "opkg install python3-ctypes" in isolation["remedy"]
    assert not [name for name, _ in result.refused if name.startswith("ctypes")]  # the agent never imports it
    version = run_cli_under_split(["version"], installed=without, python=python)
    assert version.status == 0 and version.stdout.startswith("qinglong-edge "), version.stderr


# ---- the blocker itself -------------------------------------------------------------

def test_blocker_refuses_a_package_that_is_not_installed() -> None:
    result = run_code_under_split("import sqlite3", installed=("python3-light", "python3-openssl"))
    assert result.status == 1
    assert "No module named 'sqlite3' (OpenWrt package python3-sqlite3 is not installed)" in result.stderr


def test_blocker_follows_transitive_imports() -> None:
    """http.client imports email: it needs python3-email, which python3-urllib pulls in."""
    result = run_code_under_split("import http.client", installed=("python3-light", "python3-openssl"))
    assert result.status == 1
    assert ("email", "python3-email") in result.refused
    assert run_code_under_split("import http.client").status == 0


def test_blocker_sees_optional_imports_the_code_survives() -> None:
    result = run_code_under_split("import hashlib; hashlib.sha256(b'x').hexdigest()", installed=("python3-light",))
    assert result.status == 0, result.stderr
    assert ("_hashlib", "python3-openssl") in result.refused


def test_blocker_refuses_to_start_after_a_blocked_import() -> None:
    import subprocess

    from tests.support.openwrt_split import bootstrap_code

    proc = subprocess.run([sys.executable, "-I", "-S", "-c", "import sqlite3\n" + bootstrap_code(("python3-light",))],
                          capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode != 0
    assert "openwrt_split: imported before the blocker: _sqlite3, sqlite3" in proc.stderr


def test_depends_line_matches_the_package() -> None:
    sys.path.insert(0, str(pathlib.Path(REPO) / "packaging"))
    try:
        import ipkcheck
        from qle_dist.ipk import DEPENDS as BUILT
    finally:
        sys.path.pop(0)
    names = [part.split()[0] for part in BUILT.split(", ")]
    assert tuple(names) == DEPENDS
    assert ipkcheck.EXPECTED_DEPENDS == BUILT


# ---- every stdlib module the package names, under Depends ------------------------------

#: Modules the package imports only where it survives their absence, with the proof.
#: ``ctypes`` (OpenWrt: python3-ctypes, in Depends for the isolation of remote jobs, but
#: the agent must work without it): only the job wrapper's forked child imports it, to
#: make an isolated job's namespace (mount(2) has no stdlib wrapper); without it that job
#: is not started and probe_isolation/doctor say why
#: (tests/process/test_isolation.py::test_the_probe_explains_a_missing_ctypes, and
#: test_without_python3_ctypes_the_agent_works_and_doctor_says_what_remote_jobs_can_read).
OPTIONAL = {"ctypes": {"wrapper.py"}}


def test_optional_imports_stay_where_their_absence_is_handled() -> None:
    modules = _stdlib_imports(optional=True)
    for name, files in OPTIONAL.items():
        assert set(modules.get(name, [])) == files, (name, modules.get(name))
    source = (pathlib.Path(REPO) / "qinglong_edge" / "process" / "wrapper.py").read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            imports = [n for n in ast.walk(node) if isinstance(n, ast.Import)]
            if any(alias.name == "ctypes" for n in imports for alias in n.names):
                # the isolated child only (and its init: _libc_mount mounts its /proc)
                assert node.name in ("_isolate", "_libc_call", "_libc_mount", "_drop_capabilities"), node.name
    tree = ast.parse(source)
    assert not [n for n in tree.body if isinstance(n, ast.Import) and any(a.name == "ctypes" for a in n.names)]


def _stdlib_imports(optional: bool = False) -> dict[str, list[str]]:
    """stdlib module -> files importing it, for every import in qinglong_edge (lazy ones too;
    the :data:`OPTIONAL` ones only with ``optional``)."""
    found: dict[str, list[str]] = {}
    for path in sorted((pathlib.Path(REPO) / "qinglong_edge").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                stdlib = name.split(".")[0] in sys.stdlib_module_names and name != "__future__"
                if stdlib and (optional or name not in OPTIONAL):
                    found.setdefault(name, []).append(path.name)
    return found


def test_every_stdlib_module_the_package_imports_loads_under_depends() -> None:
    modules = _stdlib_imports()
    assert "ssl" in modules and "json" in modules  # the scan finds lazy and top-level imports
    code = (
        "import importlib, json\nfailed = {}\n"
        f"for name in {sorted(modules)!r}:\n"
        "    try:\n        importlib.import_module(name)\n"
        "    except ImportError as exc:\n        failed[name] = str(exc)\n"
        "print(json.dumps(failed))\n"
    )
    for python in PYTHONS:
        result = run_code_under_split(code, python=python)
        assert result.status == 0, result.stderr
        failed = json.loads(result.stdout)
        assert failed == {}, {name: (error, modules[name]) for name, error in failed.items()}


def test_no_module_of_an_undeclared_package_is_named() -> None:
    blocked = blocked_modules()
    named = {name.split(".")[0] for name in _stdlib_imports()}
    assert not named & set(blocked), {name: blocked[name] for name in named & set(blocked)}


def test_compileall_as_postinst_runs_it_works_under_depends(tmp_path: pathlib.Path) -> None:
    """postinst-pkg runs `python3 -m compileall` on the router with only Depends installed."""
    import shutil

    target = tmp_path / "lib"
    shutil.copytree(pathlib.Path(REPO) / "qinglong_edge", target / "qinglong_edge",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = f"import runpy\nsys.argv = ['compileall', '-q', {str(target)!r}]\nrunpy.run_module('compileall', run_name='__main__')\n"
    result = run_code_under_split(code)
    assert result.status == 0, result.stderr
    assert list(target.rglob("*.pyc"))


def test_tls_client_with_a_text_server_hostname_needs_python3_codecs() -> None:
    """A trap for the transport: ssl encodes a str server_hostname with the `idna` codec,
    which imports `unicodedata` from python3-codecs (not in Depends). An ASCII bytes
    server_hostname skips the codec and works with Depends only."""
    code = (
        "import socket, ssl\n"
        "context = ssl.create_default_context()\n"
        "for host in (b'cluster.example', 'cluster.example'):\n"
        "    try:\n"
        "        context.wrap_socket(socket.socket(), server_hostname=host).close()\n"
        "        print(type(host).__name__, 'ok')\n"
        "    except LookupError as exc:\n"
        "        print(type(host).__name__, 'LookupError', exc)\n"
    )
    result = run_code_under_split(code)
    assert result.status == 0, result.stderr
    assert result.stdout.splitlines() == ["bytes ok", "str LookupError unknown encoding: idna"]
    assert ("unicodedata", "python3-codecs") in result.refused
    with_codecs = run_code_under_split(code, installed=(*DEPENDS, "python3-codecs"))
    assert with_codecs.stdout.splitlines() == ["bytes ok", "str ok"]


def test_a_missing_split_package_is_named_not_a_traceback(tmp_path: pathlib.Path) -> None:
    """Without python3-sqlite3 `admin init` says which module is missing (exit 69)."""
    without_sqlite = tuple(p for p in DEPENDS if p != "python3-sqlite3")
    result = run_cli_under_split(_admin_init(tmp_path), installed=without_sqlite)
    assert result.status == 69, result.stderr
    assert "module_missing" in result.stderr and "'sqlite3'" in result.stderr
    assert "Traceback" not in result.stderr
