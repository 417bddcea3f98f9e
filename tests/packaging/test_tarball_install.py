"""The package-manager-independent tarball: install.sh / uninstall.sh under busybox sh,
staged into a temporary root with --destdir (OpenWrt 25.x, systemd, plain), and a real
pull cycle from the staged install."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.packaging.conftest import Dist, busybox_unpack
from tests.packaging.installed import installed_entry, render_from_uci, worker_options
from tests.support.cli import assert_agent_loaded_from
from tests.support.cluster_double import ClusterDouble
from tests.support.openwrt_stubs import make_root
from tests.support.pull_env import PullEnv


@pytest.fixture(scope="module")
def unpacked_tarball(dist: Dist, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    where = tmp_path_factory.mktemp("tarball")
    busybox_unpack(busybox, dist.tarball, where)
    top = where / f"qinglong-edge-{dist.version}"
    assert top.is_dir()
    return top


Shell = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def sh(busybox: str, busybox_path: str) -> Shell:
    """``busybox sh SCRIPT ARGS`` seeing busybox applets only on PATH, as on OpenWrt."""

    def run(script: pathlib.Path, *args: str, cwd: pathlib.Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([busybox, "sh", str(script), *args], capture_output=True, text=True,
                              cwd=cwd, env={"PATH": busybox_path, **(env or {})}, check=False, timeout=120)

    return run


def _mode(path: pathlib.Path) -> int:
    return path.stat().st_mode & 0o7777


def _openwrt_root(tmp_path: pathlib.Path) -> pathlib.Path:
    root = make_root(tmp_path / "root")
    (root / "etc/openwrt_release").write_text("DISTRIB_RELEASE='25.12.0'\n")
    return root


def test_tarball_layout(unpacked_tarball: pathlib.Path, dist: Dist) -> None:
    top = unpacked_tarball
    for name in ("install.sh", "uninstall.sh", "scripts/postinst-pkg", "scripts/prerm-pkg"):
        assert _mode(top / name) == 0o755, name
    assert (top / "VERSION").read_text() == f"{dist.version}\n"
    assert (top / "payload/usr/lib/qinglong-edge/qinglong_edge/cli.py").is_file()
    assert not list(top.rglob("__pycache__"))
    assert sorted(p.name for p in (top / "systemd").iterdir()) == [
        "config.json", "qinglong-edge-pull.service", "qinglong-edge-pull.timer", "qinglong-edge.service"]


def test_install_for_openwrt_25_into_a_staging_root(sh: Shell, unpacked_tarball: pathlib.Path,
                                                    tmp_path: pathlib.Path) -> None:
    root = _openwrt_root(tmp_path)
    result = sh(unpacked_tarball / "install.sh", "--destdir", str(root), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "staged qinglong-edge" in result.stdout
    assert _mode(root / "etc/init.d/qinglong-edge") == 0o755
    assert _mode(root / "etc/config/qinglong-edge") == 0o644
    assert _mode(root / "etc/crontabs/qinglong") == 0o600
    assert (root / "lib/upgrade/keep.d/qinglong-edge").read_text() == "/etc/qinglong-edge/\n"
    assert _mode(root / "usr/bin/qinglong-edge") == 0o755
    conf = (root / "usr/lib/qinglong-edge/install.conf").read_text()
    assert "QLE_TARGET=openwrt\n" in conf and "QLE_PREFIX=/usr\n" in conf
    users = [line for line in (root / "etc/passwd").read_text().splitlines() if line.startswith("qinglong:")]
    assert users == ["qinglong:x:5700:5700:qinglong:/var/run/qinglong:/bin/false"]
    assert "qinglong:x:5700:\n" in (root / "etc/group").read_text()
    assert [line[:9] for line in (root / "etc/shadow").read_text().splitlines()].count("qinglong:") == 1
    # Staging never compiles with the build host's Python.
    assert not list((root / "usr/lib/qinglong-edge").rglob("__pycache__"))
    launched = subprocess.run([sys.executable, "-I", str(root / "usr/bin/qinglong-edge"), "version", "--json"],
                              capture_output=True, text=True, cwd=tmp_path, check=False)
    assert launched.returncode == 0, launched.stderr
    assert json.loads(launched.stdout)["ok"] is True


def test_reinstall_keeps_changed_conffiles_and_the_user(sh: Shell, unpacked_tarball: pathlib.Path,
                                                        tmp_path: pathlib.Path) -> None:
    root = _openwrt_root(tmp_path)
    assert sh(unpacked_tarball / "install.sh", "--destdir", str(root)).returncode == 0
    config = root / "etc/config/qinglong-edge"
    shipped = config.read_text()
    config.write_text(shipped.replace("option enabled '0'", "option enabled '1'", 1))
    (root / "usr/lib/qinglong-edge/qinglong_edge/stale_module.py").write_text("# removed upstream\n")
    result = sh(unpacked_tarball / "install.sh", "--destdir", str(root))
    assert result.returncode == 0, result.stderr
    assert "kept your /etc/config/qinglong-edge" in result.stdout
    assert "option enabled '1'" in config.read_text()
    assert (root / "etc/config/qinglong-edge-opkg").read_text() == shipped
    assert not (root / "etc/crontabs/qinglong-opkg").exists()  # unchanged: no sibling
    assert not (root / "usr/lib/qinglong-edge/qinglong_edge/stale_module.py").exists()
    assert [line[:9] for line in (root / "etc/passwd").read_text().splitlines()].count("qinglong:") == 1


def test_install_picks_a_free_id_when_5700_is_taken(sh: Shell, unpacked_tarball: pathlib.Path,
                                                    tmp_path: pathlib.Path) -> None:
    root = _openwrt_root(tmp_path)
    with open(root / "etc/passwd", "a") as handle:
        handle.write("someone:x:5700:5700::/home/someone:/bin/ash\n")
    with open(root / "etc/group", "a") as handle:
        handle.write("someone:x:5700:\n")
    assert sh(unpacked_tarball / "install.sh", "--destdir", str(root)).returncode == 0
    users = [line for line in (root / "etc/passwd").read_text().splitlines() if line.startswith("qinglong:")]
    assert users == ["qinglong:x:32768:32768:qinglong:/var/run/qinglong:/bin/false"]


def test_install_with_another_prefix_rewrites_every_reference(sh: Shell, unpacked_tarball: pathlib.Path,
                                                              tmp_path: pathlib.Path) -> None:
    root = _openwrt_root(tmp_path)
    result = sh(unpacked_tarball / "install.sh", "--destdir", str(root), "--prefix", "/opt/qle",
                 "--python", "/opt/python/bin/python3")
    assert result.returncode == 0, result.stderr
    assert (root / "opt/qle/bin/qinglong-edge").read_text().startswith("#!/opt/python/bin/python3\n")
    init = (root / "etc/init.d/qinglong-edge").read_text()
    assert "QLE_PROG=/opt/qle/bin/qinglong-edge\n" in init and "QLE_PYTHON=/opt/python/bin/python3\n" in init
    assert "/opt/qle/bin/qinglong-edge --config" in (root / "etc/crontabs/qinglong").read_text()
    assert 'QLE_LIBDIR:-/opt/qle/lib/qinglong-edge' in (root / "opt/qle/lib/qinglong-edge/postinst-pkg").read_text()
    assert not (root / "usr/bin/qinglong-edge").exists()
    launched = subprocess.run([sys.executable, "-I", str(root / "opt/qle/bin/qinglong-edge"), "--help"],
                              capture_output=True, text=True, cwd=tmp_path, check=False)
    assert launched.returncode == 0, launched.stderr


def test_install_for_systemd(sh: Shell, unpacked_tarball: pathlib.Path, tmp_path: pathlib.Path) -> None:
    root = make_root(tmp_path / "root")
    result = sh(unpacked_tarball / "install.sh", "--destdir", str(root), "--target", "systemd")
    assert result.returncode == 0, result.stderr
    units = root / "etc/systemd/system"
    assert sorted(p.name for p in units.iterdir()) == [
        "qinglong-edge-pull.service", "qinglong-edge-pull.timer", "qinglong-edge.service"]
    assert "ExecStart=/usr/local/bin/qinglong-edge --config /etc/qinglong-edge/config.json serve" in \
        (units / "qinglong-edge.service").read_text()
    assert (root / "usr/local/bin/qinglong-edge").is_file()
    assert not (root / "etc/init.d/qinglong-edge").exists()
    config = root / "etc/qinglong-edge/config.json"
    assert _mode(config) == 0o640 and _mode(config.parent) == 0o750
    if os.geteuid() == 0:
        assert config.stat().st_gid == 5700 and config.stat().st_uid == 0
    assert json.loads(config.read_text())["stateDirectory"] == "/var/lib/qinglong-edge"
    config.write_text('{"schema": "qinglong/edge-agent@v1", "stateDirectory": "/srv/qe"}')
    assert sh(unpacked_tarball / "install.sh", "--destdir", str(root), "--target", "systemd").returncode == 0
    assert "/srv/qe" in config.read_text()  # an existing config is never replaced


def test_install_plain_has_code_and_launcher_only(sh: Shell, unpacked_tarball: pathlib.Path,
                                                  tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    result = sh(unpacked_tarball / "install.sh", env={"DESTDIR": str(root)})  # the make-style variable
    assert result.returncode == 0, result.stderr
    installed = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert "usr/local/bin/qinglong-edge" in installed
    assert all(p.startswith(("usr/local/bin/", "usr/local/lib/qinglong-edge/")) for p in installed), installed


def test_uninstall_removes_the_package_and_keeps_the_configuration(
        sh: Shell, unpacked_tarball: pathlib.Path, tmp_path: pathlib.Path) -> None:
    root = _openwrt_root(tmp_path)
    assert sh(unpacked_tarball / "install.sh", "--destdir", str(root)).returncode == 0
    (root / "etc/qinglong-edge/state").mkdir(parents=True)
    result = sh(root / "usr/lib/qinglong-edge/uninstall.sh", "--destdir", str(root))
    assert result.returncode == 0, result.stderr
    for gone in ("etc/init.d/qinglong-edge", "etc/crontabs/qinglong", "lib/upgrade/keep.d/qinglong-edge",
                 "usr/bin/qinglong-edge", "usr/lib/qinglong-edge"):
        assert not (root / gone).exists(), gone
    assert (root / "etc/config/qinglong-edge").exists()
    assert (root / "etc/qinglong-edge/state").is_dir()
    assert "qinglong:" in (root / "etc/passwd").read_text()  # the user stays, as on OpenWrt
    assert sh(unpacked_tarball / "install.sh", "--destdir", str(root)).returncode == 0
    result = sh(unpacked_tarball / "uninstall.sh", "--destdir", str(root), "--purge")
    assert result.returncode == 0, result.stderr
    assert not (root / "etc/config/qinglong-edge").exists()
    assert not (root / "etc/qinglong-edge").exists()


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--bogus"], id="unknown_option"),
        pytest.param(["--destdir", "relative/root"], id="relative_destdir"),
        pytest.param(["--target", "windows"], id="unknown_target"),
        pytest.param(["--prefix", "/opt/my qle"], id="prefix_with_space"),
        pytest.param(["--prefix"], id="missing_value"),
    ],
)
def test_rejects_bad_install_arguments(sh: Shell, unpacked_tarball: pathlib.Path, tmp_path: pathlib.Path,
                                       args: list[str]) -> None:
    result = sh(unpacked_tarball / "install.sh", *args, cwd=tmp_path)
    assert result.returncode == 64, result.stderr
    assert "usage: ./install.sh" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_rejects_uninstall_without_an_installation(sh: Shell, unpacked_tarball: pathlib.Path,
                                                   tmp_path: pathlib.Path) -> None:
    result = sh(unpacked_tarball / "uninstall.sh", "--destdir", str(tmp_path))
    assert result.returncode == 1
    assert "no qinglong-edge installed" in result.stderr


def test_help_describes_the_options(sh: Shell, unpacked_tarball: pathlib.Path) -> None:
    result = sh(unpacked_tarball / "install.sh", "--help")
    assert result.returncode == 0
    assert "--destdir" in result.stdout and "--prefix" in result.stdout and "set -eu" not in result.stdout


def test_staged_install_runs_a_real_pull_cycle(sh: Shell, unpacked_tarball: pathlib.Path, cluster: ClusterDouble,
                                               tmp_path: pathlib.Path) -> None:
    """OpenWrt 25.x: install.sh --destdir, then the staged /usr/bin/qinglong-edge renders the
    staged UCI file and pulls an offer, under the OpenWrt split simulation."""
    root = _openwrt_root(tmp_path)
    assert sh(unpacked_tarball / "install.sh", "--destdir", str(root), cwd=tmp_path).returncode == 0
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    device = PullEnv(tmp_path / "device", cluster, entry=installed_entry(root, cwd=workdir))
    render_from_uci(device.entry, root, worker_options(device), device.config_path)
    outcome = device.pull("--json")
    assert outcome.status == 0, outcome.stdout + outcome.stderr[-4000:]
    assert (outcome.last()["status"], outcome.last()["reason"]) == ("accepted", "new_claim")
    assert list(device.inbox()) == [outcome.last()["offerId"]] == list(cluster.state.leases_by_offer())
    assert_agent_loaded_from(outcome.stderr, root / "usr/lib/qinglong-edge", {"qinglong_edge.worker.delivery.pull"})
    assert list(workdir.iterdir()) == []
