"""Unpack the .ipk with busybox gzip/tar (what OpenWrt runs) into an offline root and
run the installed launcher there, isolated (`python3 -I`), with only that tree on the path."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.packaging.conftest import Dist, Unpacked, unpack_ipk
from tests.support.uci import install_fake_uci, uci_file_to_show


@pytest.fixture(scope="module")
def unpacked(dist: Dist, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> Unpacked:
    return unpack_ipk(busybox, dist.ipk, tmp_path_factory.mktemp("ipk"))


def test_busybox_lists_root_owned_entries(dist: Dist, busybox: str, unpacked: Unpacked) -> None:
    listing = subprocess.run([busybox, "tar", "-tvzf", str(unpacked.outer / "data.tar.gz")],
                             capture_output=True, text=True, check=True).stdout.splitlines()
    assert listing, "empty data.tar.gz"
    assert all(line.split()[1] == "0/0" for line in listing), listing
    assert sorted(p.name for p in unpacked.outer.iterdir()) == ["control.tar.gz", "data.tar.gz", "debian-binary"]
    assert (unpacked.outer / "debian-binary").read_bytes() == b"2.0\n"


def test_unpacked_files_keep_their_modes(unpacked: Unpacked) -> None:
    root = unpacked.root
    assert (root / "etc/crontabs/qinglong").stat().st_mode & 0o7777 == 0o600
    assert (root / "etc/init.d/qinglong-edge").stat().st_mode & 0o7777 == 0o755
    assert (root / "usr/bin/qinglong-edge").stat().st_mode & 0o7777 == 0o755
    assert (root / "usr/lib/qinglong-edge/qinglong_edge/cli.py").stat().st_mode & 0o7777 == 0o644
    if os.geteuid() == 0:
        assert (root / "etc/crontabs/qinglong").stat().st_uid == 0  # busybox crond needs uid 0
    for name in ("postinst", "postinst-pkg", "prerm", "prerm-pkg", "postrm"):
        assert (unpacked.control / name).stat().st_mode & 0o777 == 0o755


def _launch(unpacked: Unpacked, *args: str, cwd: pathlib.Path, env: dict[str, str] | None = None,
            python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    """``python3 -I <root>/usr/bin/qinglong-edge ARGS`` from ``cwd``."""
    child_env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", **(env or {})}
    return subprocess.run([python, "-I", str(unpacked.root / "usr/bin/qinglong-edge"), *args],
                          capture_output=True, text=True, cwd=cwd, env=child_env, check=False, timeout=60)


def test_installed_launcher_runs_help_isolated(unpacked: Unpacked, tmp_path: pathlib.Path) -> None:
    result = _launch(unpacked, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for command in ("version", "doctor", "config"):
        assert f"    {command} " in result.stdout


def test_installed_launcher_imports_only_the_unpacked_tree(unpacked: Unpacked, tmp_path: pathlib.Path) -> None:
    probe = (
        "import runpy, sys\n"
        f"sys.argv = [{str(unpacked.root / 'usr/bin/qinglong-edge')!r}, 'version']\n"
        "try:\n"
        "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "print(sys.modules['qinglong_edge'].__file__)\n"
    )
    proc = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True,
                          cwd=tmp_path, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = proc.stdout.strip().splitlines()[-1]
    assert loaded == str(unpacked.root / "usr/lib/qinglong-edge/qinglong_edge/__init__.py")


def test_installed_launcher_runs_doctor_with_a_config_in_the_root(unpacked: Unpacked, tmp_path: pathlib.Path) -> None:
    etc = unpacked.root / "etc" / "qinglong-edge"
    state = etc / "state"
    state.mkdir(parents=True, mode=0o700, exist_ok=True)
    state.chmod(0o700)
    (state / "pepper").mkdir(mode=0o700, exist_ok=True)
    config = etc / "config.json"
    config.write_text(json.dumps({
        "schema": "qinglong/edge-agent@v1",
        "stateDirectory": str(state),
        "localApi": {"listener": {"host": "127.0.0.1", "port": 5700}},
    }))
    result = _launch(unpacked, "--config", str(config), "doctor", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "doctor: all required checks passed" in result.stdout
    as_json = _launch(unpacked, "--config", str(config), "doctor", "--json", cwd=tmp_path)
    assert json.loads(as_json.stdout)["ok"] is True
    assert not list(tmp_path.iterdir())  # nothing written in the working directory


def test_launcher_shebang_runs_with_the_system_python(unpacked: Unpacked, tmp_path: pathlib.Path) -> None:
    """The launcher's `#!/usr/bin/python3`, executed directly (Debian's 3.11 here)."""
    system = pathlib.Path("/usr/bin/python3")
    if not system.exists():
        pytest.skip("no /usr/bin/python3")
    check = subprocess.run([str(system), "-c", "import sys; sys.exit(sys.version_info < (3, 11))"], check=False)
    if check.returncode != 0:
        pytest.skip("/usr/bin/python3 is older than 3.11")
    launcher = unpacked.root / "usr/bin/qinglong-edge"
    assert launcher.read_text().startswith("#!/usr/bin/python3\n")
    proc = subprocess.run([str(launcher), "version", "--json"], capture_output=True, text=True,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True


def test_unpacked_launcher_renders_the_shipped_uci_defaults(unpacked: Unpacked, tmp_path: pathlib.Path) -> None:
    dump = tmp_path / "uci-show.txt"
    dump.write_text(uci_file_to_show((unpacked.root / "etc/config/qinglong-edge").read_text(), "qinglong-edge"))
    bin_dir = install_fake_uci(tmp_path / "bin", "qinglong-edge", dump).parent
    out_dir = unpacked.root / "var/etc/qinglong-edge"
    out_dir.mkdir(parents=True, exist_ok=True)
    result = _launch(unpacked, "config", "render-uci", "--output", str(out_dir / "config.json"), cwd=tmp_path,
                     env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    assert json.loads((out_dir / "config.json").read_text())["stateDirectory"] == "/etc/qinglong-edge/state"
