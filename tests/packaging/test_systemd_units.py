"""systemd units for Debian / Raspberry Pi OS: the 128 MiB / 64-task budget, sandboxing,
a dedicated user, what `serve` and `pull` need (stop handling, writable paths, the
shipped config), and `systemd-analyze verify` when it is installed."""

from __future__ import annotations

import configparser
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from qinglong_edge.config import load_config
from tests.packaging.conftest import PACKAGING, Dist
from tests.packaging.installed import STOP_MARGIN_S, serve_stop_seconds

UNITS = PACKAGING / "files" / "systemd"


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string((UNITS / name).read_text())
    return parser


@pytest.mark.parametrize("name", ["qinglong-edge.service", "qinglong-edge-pull.service"])
def test_service_budget_and_sandbox(name: str) -> None:
    service = _unit(name)["Service"]
    assert service["MemoryMax"] == "128M"
    assert service["TasksMax"] == "64"
    assert service["ProtectSystem"] == "strict"
    assert service["NoNewPrivileges"] == "yes"
    assert service["User"] == service["Group"] == "qinglong"
    assert service["StateDirectory"] == "qinglong-edge"
    assert service["ReadWritePaths"] == "/var/lib/qinglong-edge"
    assert service["ProtectHome"] == "yes" and service["PrivateTmp"] == "yes"
    assert "AF_INET" in service["RestrictAddressFamilies"]
    assert service["ExecStart"].startswith("/usr/local/bin/qinglong-edge --config /etc/qinglong-edge/config.json ")


def test_serve_and_pull_commands() -> None:
    serve = _unit("qinglong-edge.service")
    assert serve["Service"]["ExecStart"].endswith(" serve")
    assert serve["Service"]["Type"] == "simple" and serve["Install"]["WantedBy"] == "multi-user.target"
    assert serve["Service"]["Delegate"] == "yes"  # per-Run cgroups below the service
    assert "78" in serve["Service"]["RestartPreventExitStatus"].split()
    pull = _unit("qinglong-edge-pull.service")
    assert pull["Service"]["ExecStart"].endswith(" pull") and pull["Service"]["Type"] == "oneshot"
    timer = _unit("qinglong-edge-pull.timer")
    assert timer["Timer"]["OnCalendar"] == "*-*-* *:*:00"
    assert timer["Install"]["WantedBy"] == "timers.target"


def test_only_the_unit_that_runs_remote_jobs_allows_their_namespaces() -> None:
    """Remote jobs get a private user + mount namespace (spec README, "Isolation"): the pull
    unit allows exactly those two types; serve (Local Runs: no isolation) allows none."""
    pull = _unit("qinglong-edge-pull.service")["Service"]
    assert sorted(pull["RestrictNamespaces"].split()) == ["mnt", "user"]
    assert _unit("qinglong-edge.service")["Service"]["RestrictNamespaces"] == "yes"


def test_serve_stop_leaves_the_runs_to_the_controller() -> None:
    """KillMode=mixed: SIGTERM reaches serve only, whose controller stops the Runs and records
    them cancelled (reason shutdown); control-group mode would SIGTERM them behind its back."""
    service = _unit("qinglong-edge.service")["Service"]
    assert service["KillMode"] == "mixed"
    assert "SendSIGKILL" not in service  # what is left after the timeout still gets SIGKILL


def _seconds(value: str) -> float:
    """A systemd time span (``15s``, ``1min 30s``, ``20``) in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "ms": 0.001}
    parts = re.findall(r"(\d+)\s*([a-z]*)", value)
    assert parts and "".join(n + u for n, u in parts) == value.replace(" ", ""), value
    return sum(int(number) * units[unit] for number, unit in parts)


def test_stop_timeout_covers_the_drain_and_the_controller_stop() -> None:
    service = _unit("qinglong-edge.service")["Service"]
    config = load_config(str(UNITS / "config.json"))
    assert config.execution is not None  # the controller's stop counts
    assert _seconds(service["TimeoutStopSec"]) >= serve_stop_seconds(config) + STOP_MARGIN_S


def test_seconds_parser() -> None:
    assert [_seconds(v) for v in ("15s", "1min 30s", "20", "500ms")] == [15, 90, 20, 0.5]


def _writable(service: configparser.SectionProxy) -> list[str]:
    paths = service["ReadWritePaths"].split()
    paths += [f"/var/lib/{name}" for name in service.get("StateDirectory", "").split()]
    return paths


def _below(path: str, roots: list[str]) -> bool:
    return any(os.path.normpath(path) == root or os.path.normpath(path).startswith(root + "/") for root in roots)


def test_shipped_config_lets_serve_start_and_write_only_where_the_unit_allows() -> None:
    """serve needs localApi (else exit 78) and writes the database (and its journal files
    beside it), the pepper keyring (admin init), the Run logs and the Runs' work directory
    beside them; ProtectSystem=strict makes everything else read-only."""
    config = load_config(str(UNITS / "config.json"))
    assert config.local_api is not None and config.execution is not None
    serve = _unit("qinglong-edge.service")["Service"]
    for path in (config.state_directory, os.path.dirname(config.local_api.database_file),
                 config.local_api.pepper_keyring_directory, config.execution.log_directory,
                 os.path.dirname(os.path.normpath(config.execution.log_directory))):
        assert _below(path, _writable(serve)), path
    pull = _unit("qinglong-edge-pull.service")["Service"]
    assert _below(config.state_directory, _writable(pull))  # the journal defaults to <state>/worker
    assert not _below("/etc/qinglong-edge", _writable(serve) + _writable(pull))  # credentials stay read-only


def test_dist_ships_the_units_unchanged(dist: Dist) -> None:
    for name in ("qinglong-edge.service", "qinglong-edge-pull.service", "qinglong-edge-pull.timer"):
        assert (dist.directory / name).read_bytes() == (UNITS / name).read_bytes()


def test_systemd_analyze_verify_is_clean(tmp_path: pathlib.Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    launcher = tmp_path / "bin" / "qinglong-edge"
    launcher.parent.mkdir()
    launcher.write_text("#!/bin/sh\nexit 0\n")
    launcher.chmod(0o755)
    names = ["qinglong-edge.service", "qinglong-edge-pull.service", "qinglong-edge-pull.timer"]
    for name in names:
        text = (UNITS / name).read_text().replace("/usr/local/bin/qinglong-edge", str(launcher))
        (tmp_path / name).write_text(text)
    proc = subprocess.run([analyze, "verify", *(f"./{n}" for n in names)], capture_output=True, text=True,
                          cwd=tmp_path, check=False, timeout=120)
    if "Failed to" in proc.stderr and "bus" in proc.stderr.lower():
        pytest.skip(f"systemd-analyze cannot run here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr  # warnings (unknown keys, bad values) are failures too


def test_verify_catches_a_bad_unit(tmp_path: pathlib.Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    bad = tmp_path / "bad.service"
    bad.write_text("[Service]\nExecStart=/bin/true\nMemoryMax=lots\n")
    proc = subprocess.run([analyze, "verify", "./bad.service"], capture_output=True, text=True, cwd=tmp_path,
                          check=False, timeout=120)
    assert "MemoryMax" in proc.stderr or "memory" in proc.stderr.lower()
