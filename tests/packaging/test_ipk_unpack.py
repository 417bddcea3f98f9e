"""Unpack the .ipk with busybox gzip/tar (what OpenWrt runs) into an offline root and
run the installed launcher there, isolated (`python3 -I`), with only that tree on the path:
`--help`, `doctor`, `config render-uci`, and (issue 11) a real pull cycle and a real
serve + cancel configured through the root's UCI file, under the OpenWrt split
simulation (tests/packaging/installed.py)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.packaging.conftest import Dist, Unpacked, unpack_ipk
from tests.packaging.installed import installed_entry, local_options, render_from_uci, worker_options
from tests.support.cli import assert_agent_loaded_from
from tests.support.cluster_double import ClusterDouble
from tests.support.local_site import LocalSite, start_and_cancel
from tests.support.pull_env import PullEnv
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


# ---- a real pull cycle and a real cancel from the installed tree, under the OpenWrt split ------------

LIBRARY = "usr/lib/qinglong-edge"


def test_installed_ipk_pulls_an_offer_configured_through_uci(unpacked: Unpacked, cluster: ClusterDouble,
                                                             tmp_path: pathlib.Path) -> None:
    """UCI -> `config render-uci` -> `pull` -> `inbox list`, all by /usr/bin/qinglong-edge of the root,
    with only the modules of the Depends packages importable."""
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    device = PullEnv(tmp_path, cluster, entry=installed_entry(unpacked.root, cwd=workdir))
    render_from_uci(device.entry, unpacked.root, worker_options(device), device.config_path)
    outcome = device.pull("--json")
    assert outcome.status == 0, outcome.stdout + outcome.stderr[-4000:]
    line = outcome.last()
    assert (line["status"], line["reason"]) == ("accepted", "new_claim")
    assert list(device.inbox()) == [line["offerId"]] == list(cluster.state.leases_by_offer())
    assert "OpenWrt package" not in outcome.stderr
    assert_agent_loaded_from(outcome.stderr, unpacked.root / LIBRARY,
                             {"qinglong_edge.commands.pull", "qinglong_edge.worker.ingress.transport"})
    listed = device.cli("inbox", "list", "--json")
    assert listed.status == 0, listed.stderr[-4000:]
    assert [row["offerId"] for row in json.loads(listed.stdout)["offers"]] == [line["offerId"]]
    assert list(workdir.iterdir()) == []


@pytest.mark.slow
def test_installed_ipk_serves_and_cancels_configured_through_uci(unpacked: Unpacked, tmp_path: pathlib.Path) -> None:
    """UCI -> render -> admin provisioning -> serve -> task.start -> cancel, the job really gone."""
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    site = LocalSite(tmp_path, installed_entry(unpacked.root, cwd=workdir))
    render_from_uci(site.entry, unpacked.root, local_options(site), site.config)
    try:
        site.provision()
        serve = site.serve()
        start_and_cancel(site)
        assert serve.stop() == 0, serve.stderr()[-4000:]
        assert "OpenWrt package" not in serve.stderr()
        assert_agent_loaded_from(serve.stderr(), unpacked.root / LIBRARY,
                                 {"qinglong_edge.local.server", "qinglong_edge.execution.controller"})
    finally:
        site.close()
    assert list(workdir.iterdir()) == []


def test_installed_launcher_under_the_split_is_refused_what_depends_lacks(unpacked: Unpacked,
                                                                          tmp_path: pathlib.Path) -> None:
    """The blocker reaches the installed tree: without python3-sqlite3, `admin init` fails."""
    report = tmp_path / "refused.tsv"
    site = LocalSite(tmp_path, installed_entry(unpacked.root, cwd=tmp_path, report=str(report), installed=(
        "python3-light", "python3-openssl", "python3-urllib", "python3-logging", "python3-ctypes")))
    result = site.entry.run("--config", str(site.config), "admin", "init")
    assert result.status == 69
    assert "module_missing" in result.stderr and "'sqlite3'" in result.stderr
    assert "sqlite3\tpython3-sqlite3" in report.read_text().splitlines()
