"""`pip install .` (and so `pipx install .`, which is pip in a venv of its own) gives a working
`qinglong-edge` command.

Offline, as CI is: the wheel is built by PEP 517 with the pinned setuptools of the test
environment (`pip wheel --no-build-isolation --no-index`: the step `pip install .` runs
first), from a copy of the sources (setuptools writes build/ and *.egg-info beside them),
then installed with `pip --python` into a fresh venv that has neither pip, setuptools nor
this checkout. The command runs from an empty directory with a minimal environment."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.packaging.conftest import REPO
from tests.support.cli import assert_agent_loaded_from

from qle_dist.payload import package_files, read_version  # isort: skip  (packaging/ on sys.path, see conftest)

SOURCES = ("pyproject.toml", "README.md", "LICENSE", "qinglong_edge")


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args],
                          capture_output=True, text=True, check=False, timeout=300,
                          env={**os.environ, "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull})


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    if importlib.util.find_spec("setuptools") is None or importlib.util.find_spec("pip") is None:
        pytest.skip("pip and setuptools are not in this environment (make test's .venv has them pinned)")
    base = tmp_path_factory.mktemp("pip")
    source = base / "src"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, source / name)
    built = _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "--wheel-dir", str(base / "wheels"),
                 str(source))
    assert built.returncode == 0, built.stdout + built.stderr
    (found,) = (base / "wheels").glob("*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    target = tmp_path_factory.mktemp("venv") / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], capture_output=True,
                          text=True, check=False, timeout=120)
    assert made.returncode == 0, made.stderr
    installed = _pip("--python", str(target / "bin" / "python"), "install", "--no-deps", "--no-index", str(wheel))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return target


def _command(venv: pathlib.Path, *args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "qinglong-edge"), *args], capture_output=True, text=True, cwd=cwd,
                          env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "LANG": "C.UTF-8"}, check=False, timeout=60)


def test_the_wheel_carries_the_package_and_the_command(wheel: pathlib.Path) -> None:
    assert wheel.name == f"qinglong_edge-{read_version()}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        dist_info = f"qinglong_edge-{read_version()}.dist-info"
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
        metadata = archive.read(f"{dist_info}/METADATA").decode()
    package = {name for name in names if not name.startswith(f"{dist_info}/")}
    assert package == {path for path, _ in package_files()} | {"qinglong_edge/py.typed"}  # every module, no tests
    assert "[console_scripts]\nqinglong-edge = qinglong_edge.cli:main" in entry_points
    assert "Requires-Python: >=3.11" in metadata
    assert "Requires-Dist" not in metadata  # the standard library only


def test_the_installed_command_runs_from_the_venv(venv: pathlib.Path, tmp_path: pathlib.Path) -> None:
    assert not (venv / "bin" / "pip").exists()  # a bare venv: only what the wheel installed
    help_text = _command(venv, "--help", cwd=tmp_path)
    assert help_text.returncode == 0, help_text.stderr
    for command in ("version", "doctor", "pull", "serve", "admin", "config"):
        assert f"    {command} " in help_text.stdout
    version = _command(venv, "version", "--json", cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    assert json.loads(version.stdout)["version"] == read_version()
    dump = tmp_path / "uci.txt"
    dump.write_text("qinglong-edge.main=agent\nqinglong-edge.main.state_directory='/var/lib/qinglong-edge'\n")
    rendered = _command(venv, "config", "render-uci", "--input", str(dump), cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    assert json.loads(rendered.stdout)["stateDirectory"] == "/var/lib/qinglong-edge"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["uci.txt"]  # nothing written in the working directory


def test_the_command_loads_the_package_from_the_venv_only(venv: pathlib.Path, tmp_path: pathlib.Path) -> None:
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    proc = subprocess.run([str(venv / "bin" / "python"), "-v", str(venv / "bin" / "qinglong-edge"), "version"],
                          capture_output=True, text=True, cwd=tmp_path, check=False, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert_agent_loaded_from(proc.stderr, site / "qinglong_edge", {"qinglong_edge.cli", "qinglong_edge.commands"})
