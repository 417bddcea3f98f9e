"""Maintainer scripts and the procd init script, run by busybox sh against stubs of
OpenWrt's /lib/functions.sh and procd (tests/support/openwrt_stubs.py)."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from qinglong_edge.config import load_config
from tests.packaging.conftest import PACKAGING, Dist, Unpacked, unpack_ipk
from tests.packaging.installed import STOP_MARGIN_S, Router, serve_stop_seconds
from tests.support.openwrt_stubs import make_root, read_log, write_logging_stub

INFO = "usr/lib/opkg/info"
LIB = "usr/lib/qinglong-edge"


def _shells(busybox: str) -> list[list[str]]:
    shells = [[busybox, "sh"]]
    dash = shutil.which("dash")
    if dash:
        shells.append([dash])
    return shells


def _shell_scripts(unpacked: Unpacked) -> dict[str, pathlib.Path]:
    scripts = {name: unpacked.control / name for name in ("postinst", "postinst-pkg", "prerm", "prerm-pkg", "postrm")}
    scripts["init.d/qinglong-edge"] = unpacked.root / "etc/init.d/qinglong-edge"
    scripts["install.sh"] = PACKAGING / "files/tarball/install.sh"
    scripts["uninstall.sh"] = PACKAGING / "files/tarball/uninstall.sh"
    return scripts


@pytest.fixture(scope="module")
def unpacked(dist: Dist, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> Unpacked:
    return unpack_ipk(busybox, dist.ipk, tmp_path_factory.mktemp("ipk"))


def test_every_shell_script_parses(busybox: str, unpacked: Unpacked) -> None:
    for shell in _shells(busybox):
        for name, path in _shell_scripts(unpacked).items():
            proc = subprocess.run([*shell, "-n", str(path)], capture_output=True, text=True, check=False)
            assert proc.returncode == 0, f"{shell[-1]} -n {name}: {proc.stderr}"
        crontab = (unpacked.root / "etc/crontabs/qinglong").read_text()
        for line in crontab.splitlines():
            if line and not line.startswith("#"):
                command = line.split(maxsplit=5)[5]
                proc = subprocess.run([*shell, "-n", "-c", command], capture_output=True, text=True, check=False)
                assert proc.returncode == 0, f"crontab command: {proc.stderr}"


def test_syntax_check_can_fail(busybox: str, tmp_path: pathlib.Path) -> None:
    broken = tmp_path / "broken.sh"
    broken.write_text("if true; then\n  echo\n")
    assert subprocess.run([busybox, "sh", "-n", str(broken)], capture_output=True, check=False).returncode != 0


# ---- postinst / prerm / postrm ----------------------------------------------------------------

class Device:
    """An offline root holding the installed package, as opkg leaves it before postinst."""

    def __init__(self, unpacked: Unpacked, root: pathlib.Path, path: str) -> None:
        self.path = path
        self.root = make_root(root)
        shutil.copytree(unpacked.root, root, dirs_exist_ok=True, symlinks=True)
        info = root / INFO
        info.mkdir(parents=True)
        for member in unpacked.control.iterdir():
            if member.is_file():
                shutil.copy2(member, info / f"qinglong-edge.{member.name}")
        files = sorted("/" + p.relative_to(unpacked.root).as_posix()
                       for p in unpacked.root.rglob("*") if p.is_file())
        (info / "qinglong-edge.list").write_text("".join(f"{f}\n" for f in files))
        self.log = root / "stub.log"
        self.python = write_logging_stub(root / "stub/python3", self.log, "python3", f'exec {sys.executable} "$@"')
        self.cron = write_logging_stub(root / "etc/init.d/cron", self.log, "cron")
        # The agent's own `pull --release` is tested for real (tests/cli/test_pull_release.py);
        # here only that prerm-pkg calls it, after switching the cron pull off.
        rundir = root / "var/etc/qinglong-edge"
        self.agent = write_logging_stub(
            root / "stub/qinglong-edge", self.log, "qinglong-edge",
            f'[ -e "{rundir}/pull.enabled" ] && echo "pull.enabled still there" >> "{self.log}"; exit 0')

    def env(self, *, instroot: bool, upgrade: bool = False) -> dict[str, str]:
        env = {
            "PATH": self.path,
            "QLE_STUB_ROOT": str(self.root),
            "QLE_STUB_LOG": str(self.log),
            "PKG_UPGRADE": "1" if upgrade else "0",
        }
        if instroot:
            env["IPKG_INSTROOT"] = str(self.root)
        else:
            # The live-device case: the scripts' OpenWrt paths, redirected into the root.
            env.update(QLE_LIBDIR=str(self.root / LIB), QLE_PYTHON=str(self.python),
                       QLE_CRON_INIT=str(self.cron), QLE_RUNDIR=str(self.root / "var/etc/qinglong-edge"),
                       QLE_BIN=str(self.agent))
        return env

    def run_script(self, busybox: str, script: str, *args: str, instroot: bool,
                   upgrade: bool = False) -> subprocess.CompletedProcess[str]:
        """The exact control-file script (its boilerplate sources ${IPKG_INSTROOT}/lib/functions.sh)."""
        return subprocess.run([busybox, "sh", str(self.root / INFO / f"qinglong-edge.{script}"), *args],
                              env=self.env(instroot=instroot, upgrade=upgrade), capture_output=True,
                              text=True, check=False, timeout=120)

    def run_default(self, busybox: str, function: str, *args: str, upgrade: bool = False) -> subprocess.CompletedProcess[str]:
        """default_postinst/default_prerm as on a live device (IPKG_INSTROOT empty)."""
        script = f'. "$QLE_STUB_ROOT/lib/functions.sh"; {function} "$QLE_STUB_ROOT/{INFO}/qinglong-edge.x" "$@"'
        return subprocess.run([busybox, "sh", "-c", script, "sh", *args],
                              env=self.env(instroot=False, upgrade=upgrade), capture_output=True,
                              text=True, check=False, timeout=120)

    def caches(self) -> list[pathlib.Path]:
        return sorted((self.root / LIB).rglob("__pycache__"))

    def users(self) -> list[str]:
        return [line for line in (self.root / "etc/passwd").read_text().splitlines() if line.startswith("qinglong:")]


@pytest.fixture
def device(unpacked: Unpacked, tmp_path: pathlib.Path, busybox_path: str) -> Device:
    return Device(unpacked, tmp_path / "root", busybox_path)


def test_postinst_building_an_image_only_adds_the_user(busybox: str, device: Device) -> None:
    result = device.run_script(busybox, "postinst", "configure", instroot=True)
    assert result.returncode == 0, result.stderr
    assert device.users() == ["qinglong:x:5700:5700:qinglong:/var/run/qinglong:/bin/false"]
    assert "qinglong:x:5700:" in (device.root / "etc/group").read_text()
    log = read_log(device.log)
    assert log == ["add_group_and_user qinglong=5700 qinglong=5700",
                   f"rc.common {device.root}/etc/init.d/qinglong-edge enable"]
    assert device.caches() == []  # no compileall, no cron when not on the device


def test_postinst_on_the_device_compiles_and_restarts_cron(busybox: str, device: Device) -> None:
    result = device.run_default(busybox, "default_postinst", "configure")
    assert result.returncode == 0, result.stderr
    assert read_log(device.log) == [
        "add_group_and_user qinglong=5700 qinglong=5700",
        f"python3 -m compileall -q {device.root / LIB}",
        "cron enable",
        "cron restart",
        "/etc/init.d/qinglong-edge enable",
        "/etc/init.d/qinglong-edge start",
    ]
    caches = device.caches()
    assert caches, "compileall wrote no bytecode"
    tag = sys.implementation.cache_tag
    assert (device.root / LIB / "qinglong_edge/__pycache__" / f"cli.{tag}.pyc").is_file()


def test_postinst_is_idempotent_and_upgrade_tolerant(busybox: str, device: Device) -> None:
    assert device.run_default(busybox, "default_postinst", "configure").returncode == 0
    stale = device.root / LIB / "qinglong_edge/__pycache__/removed_module.cpython-311.pyc"
    stale.write_bytes(b"stale")
    device.log.unlink()
    result = device.run_default(busybox, "default_postinst", "configure", upgrade=True)
    assert result.returncode == 0, result.stderr
    assert device.users() == ["qinglong:x:5700:5700:qinglong:/var/run/qinglong:/bin/false"]  # not twice
    log = read_log(device.log)
    assert "/etc/init.d/qinglong-edge enable" not in log  # an upgrade keeps the operator's choice
    assert log[-1] == "/etc/init.d/qinglong-edge start"
    assert "cron restart" in log
    assert not stale.exists()  # stale bytecode of the old version is gone
    assert device.caches()


def _enabled_rundir(device: Device) -> pathlib.Path:
    """The service's run directory as ``start`` leaves it: the rendered config, pull enabled."""
    rundir = device.root / "var/etc/qinglong-edge"
    rundir.mkdir(parents=True)
    (rundir / "config.json").write_text("{}")
    (rundir / "pull.enabled").touch()
    return rundir


def test_prerm_on_removal_drops_bytecode_and_the_rendered_config(busybox: str, device: Device) -> None:
    assert device.run_default(busybox, "default_postinst", "configure").returncode == 0
    rundir = _enabled_rundir(device)
    device.log.unlink()
    result = device.run_default(busybox, "default_prerm", "remove")
    assert result.returncode == 0, result.stderr
    assert device.caches() == []
    assert not rundir.exists()  # a kept, modified crontab now does nothing
    # A removal takes the worker offline (drain: tests/cli/test_drain.py), not pull --release.
    assert read_log(device.log) == [f"qinglong-edge --config {rundir}/config.json drain",
                                    "/etc/init.d/qinglong-edge disable", "/etc/init.d/qinglong-edge stop"]


def test_prerm_on_upgrade_keeps_the_rendered_config(busybox: str, device: Device) -> None:
    rundir = device.root / "var/etc/qinglong-edge"
    rundir.mkdir(parents=True)
    (rundir / "pull.enabled").touch()
    result = device.run_default(busybox, "default_prerm", "upgrade", "0.2.0-1", upgrade=True)
    assert result.returncode == 0, result.stderr
    assert (rundir / "pull.enabled").exists()
    assert read_log(device.log) == ["/etc/init.d/qinglong-edge stop"]


def test_prerm_on_upgrade_releases_a_resident_pull_after_switching_cron_off(busybox: str, device: Device) -> None:
    rundir = _enabled_rundir(device)
    result = device.run_default(busybox, "default_prerm", "upgrade", "0.2.0-1", upgrade=True)
    assert result.returncode == 0, result.stderr
    assert (rundir / "config.json").exists() and not (rundir / "pull.enabled").exists()  # start makes it again
    assert read_log(device.log) == [f"qinglong-edge --config {rundir}/config.json pull --release",
                                    "/etc/init.d/qinglong-edge stop"]


def test_prerm_goes_on_when_the_release_fails(busybox: str, device: Device) -> None:
    rundir = _enabled_rundir(device)
    write_logging_stub(device.agent, device.log, "qinglong-edge", "exit 75")
    result = device.run_default(busybox, "default_prerm", "remove")
    assert result.returncode == 0, result.stderr
    assert "the worker was not taken offline" in result.stderr
    assert not rundir.exists() and device.caches() == []


def test_prerm_on_upgrade_goes_on_when_the_release_fails(busybox: str, device: Device) -> None:
    _enabled_rundir(device)
    write_logging_stub(device.agent, device.log, "qinglong-edge", "exit 75")
    result = device.run_default(busybox, "default_prerm", "upgrade", "0.2.0-1", upgrade=True)
    assert result.returncode == 0, result.stderr
    assert "the resident pull was not released" in result.stderr


def test_prerm_building_an_image_touches_nothing(busybox: str, device: Device) -> None:
    rundir = device.root / "var/etc/qinglong-edge"
    rundir.mkdir(parents=True)
    result = device.run_script(busybox, "prerm", "remove", instroot=True)
    assert result.returncode == 0, result.stderr
    assert rundir.exists()
    assert read_log(device.log) == [f"rc.common {device.root}/etc/init.d/qinglong-edge disable"]


def test_postrm_restarts_cron_after_removal_only(busybox: str, device: Device) -> None:
    script = str(device.root / INFO / "qinglong-edge.postrm")
    for instroot, upgrade, expected in ((True, False, []), (False, True, []), (False, False, ["cron restart"])):
        if device.log.exists():
            device.log.unlink()
        result = subprocess.run([busybox, "sh", script, "remove"], env=device.env(instroot=instroot, upgrade=upgrade),
                                capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
        assert read_log(device.log) == expected, (instroot, upgrade)


def test_postrm_removes_the_empty_code_directories_only(busybox: str, device: Device) -> None:
    """opkg leaves the package's directories (it records files only); postrm removes the empty ones."""
    library = device.root / LIB
    for path in sorted(library.rglob("*"), reverse=True):
        if path.is_file():
            path.unlink()
    (library / "qinglong_edge" / "notes.txt").write_text("the operator's\n")
    script = str(device.root / INFO / "qinglong-edge.postrm")
    for instroot, upgrade in ((True, False), (False, True)):
        result = subprocess.run([busybox, "sh", script, "remove"], env=device.env(instroot=instroot, upgrade=upgrade),
                                capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
        assert (library / "qinglong_edge" / "worker").is_dir(), (instroot, upgrade)
    result = subprocess.run([busybox, "sh", script, "remove"], env=device.env(instroot=False),
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert sorted(p.relative_to(library).as_posix() for p in library.rglob("*")) == [
        "qinglong_edge", "qinglong_edge/notes.txt"]


def test_boilerplate_does_nothing_without_functions_sh(busybox: str, device: Device) -> None:
    (device.root / "lib/functions.sh").unlink()
    result = device.run_script(busybox, "postinst", "configure", instroot=True)
    assert result.returncode == 0
    assert device.users() == []


# ---- the procd init script ---------------------------------------------------------------------

@pytest.fixture
def router(unpacked: Unpacked, tmp_path: pathlib.Path, busybox_path: str) -> Router:
    return Router(unpacked, tmp_path / "root", busybox_path)


def test_start_with_defaults_renders_config_but_starts_nothing(busybox: str, router: Router) -> None:
    result = router.call(busybox, "start_service")
    assert result.returncode == 0, result.stderr
    config = json.loads((router.rundir / "config.json").read_text())
    assert config == {"schema": "qinglong/edge-agent@v1", "profile": "edge", "stateDirectory": str(router.state)}
    assert router.procd() == []  # serve is off until main.enabled=1
    assert not (router.rundir / "pull.enabled").exists()
    assert router.state.is_dir() and router.state.stat().st_mode & 0o777 == 0o700
    assert f"chown qinglong:qinglong {router.state}" in read_log(router.log)


def test_start_when_enabled_runs_serve_under_procd(busybox: str, router: Router) -> None:
    router.set_uci(main__enabled="1", local_api__enabled="1", execution__enabled="1", worker__enabled="1",
                   worker__origin="https://cluster.example", worker__worker_id="edge-1")
    result = router.call(busybox, "start_service")
    assert result.returncode == 0, result.stderr
    config = router.rundir / "config.json"
    assert router.procd() == [
        *_pull_at_once(router, config),
        "procd_open_instance serve",
        f"procd_set_param command {sys.executable} -u {router.root}/usr/bin/qinglong-edge --config {config} serve",
        "procd_set_param user qinglong",
        "procd_set_param group qinglong",
        "procd_set_param respawn 3600 5 5",
        "procd_set_param limits nofile=1024 1024 nproc=64 64",
        "procd_set_param stdout 1",
        "procd_set_param stderr 1",
        f"procd_set_param file {config}",
        f"procd_set_param term_timeout {serve_stop_seconds(load_config(str(config))) + STOP_MARGIN_S}",
        "procd_close_instance",
    ]
    assert (router.rundir / "pull.enabled").exists()  # the cron pull is switched on
    assert json.loads(config.read_text())["worker"]["workerId"] == "edge-1"
    assert router.logs.is_dir() and router.logs.stat().st_mode & 0o777 == 0o700


def _pull_at_once(router: Router, config: pathlib.Path) -> list[str]:
    """The procd instance every start declares while worker.enabled is 1: one pull at once."""
    return [
        "procd_open_instance pull",
        f"procd_set_param command {sys.executable} -u {router.root}/usr/bin/qinglong-edge --config {config} pull"
        " --no-splay",
        "procd_set_param user qinglong",
        "procd_set_param group qinglong",
        "procd_set_param limits nofile=1024 1024 nproc=64 64",
        "procd_set_param stderr 1",
        "procd_set_param term_timeout 15",
        "procd_close_instance",
    ]


def test_every_start_with_the_worker_enabled_runs_one_pull_at_once_as_the_service_user(
        busybox: str, router: Router) -> None:
    """Issue 23 item 3: after a restart or an upgrade (default_postinst starts the script
    once the files are replaced) the successor pull starts at once, as user qinglong, not
    at the next cron minute; it has no respawn (cron runs the next ones). Serve stays off."""
    router.set_uci(worker__enabled="1", worker__origin="https://cluster.example", worker__worker_id="edge-1")
    result = router.call(busybox, "start_service")
    assert result.returncode == 0, result.stderr
    assert router.procd() == _pull_at_once(router, router.rundir / "config.json")
    router.set_uci(worker__enabled="0")
    assert router.call(busybox, "start_service").returncode == 0
    assert router.procd() == []  # no worker: no pull


def test_invalid_uci_stops_everything_and_logs_the_option(busybox: str, router: Router) -> None:
    router.set_uci(main__enabled="1", local_api__enabled="1", worker__enabled="1",
                   worker__origin="https://cluster.example", worker__worker_id="edge-1")
    assert router.call(busybox, "start_service").returncode == 0
    assert (router.rundir / "pull.enabled").exists()
    router.set_uci(local_api__port="80")
    result = router.call(busybox, "start_service")
    assert result.returncode != 0
    assert router.procd() == []
    assert not (router.rundir / "config.json").exists()
    assert not (router.rundir / "pull.enabled").exists()
    logged = [line for line in read_log(router.log) if line.startswith("logger ")]
    assert logged and "qinglong-edge.local_api.port: must be an integer from 1024 to 65535" in logged[0]


def test_refuses_a_symlinked_state_directory(busybox: str, router: Router, tmp_path: pathlib.Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    router.state.parent.mkdir(parents=True, exist_ok=True)
    router.state.symlink_to(elsewhere)
    result = router.call(busybox, "start_service")
    assert result.returncode != 0
    assert not any(line.startswith("chown") for line in read_log(router.log))


def test_stop_switches_the_cron_pull_off_and_reload_is_triggered_by_uci(busybox: str, router: Router) -> None:
    router.rundir.mkdir(parents=True)
    (router.rundir / "pull.enabled").touch()
    assert router.call(busybox, "stop_service").returncode == 0
    assert not (router.rundir / "pull.enabled").exists()
    assert router.call(busybox, "service_triggers").returncode == 0
    assert read_log(router.log) == ["procd_add_reload_trigger qinglong-edge"]


def test_switching_the_worker_role_off_drains_with_the_config_that_has_it(busybox: str, router: Router) -> None:
    """worker.enabled 1 -> 0: the reload runs `drain` with the rendered config that still
    has the worker section (the real agent: no session yet, so nothing to send), then
    renders the new one and keeps the cron pull off."""
    router.set_uci(worker__enabled="1", worker__origin="https://cluster.example", worker__worker_id="edge-1")
    assert router.call(busybox, "start_service").returncode == 0
    assert (router.rundir / "pull.enabled").exists()
    router.set_uci(worker__enabled="0")
    result = router.call(busybox, "start_service")
    assert result.returncode == 0, result.stderr
    assert not (router.rundir / "pull.enabled").exists()
    assert "worker" not in json.loads((router.rundir / "config.json").read_text())
    logged = [line for line in read_log(router.log) if line.startswith("logger ")]
    assert any("drain: no live session to take offline" in line for line in logged), logged
    again = router.call(busybox, "start_service")  # off and staying off: no drain
    assert again.returncode == 0
    assert not any("drain" in line for line in read_log(router.log))  # each call starts a fresh log
