"""systemd units for Debian / Raspberry Pi OS: the 128 MiB / 64-task budget, sandboxing,
a dedicated user, and `systemd-analyze verify` when it is installed."""

from __future__ import annotations

import configparser
import pathlib
import shutil
import subprocess

import pytest

from tests.packaging.conftest import PACKAGING, Dist

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
