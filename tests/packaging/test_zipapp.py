"""qinglong-edge.pyz: a reproducible zipapp that runs isolated from a read-only copy
and never writes next to itself (packaging.md 7)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import zipfile

import pytest

from tests.packaging.conftest import EPOCH, REPO, Dist, read_only_copy, snapshot
from tests.support.cli import doctor_config, unprivileged_python


def test_archive_layout(dist: Dist) -> None:
    data = dist.pyz.read_bytes()
    assert data.startswith(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(dist.pyz) as archive:
        infos = archive.infolist()
        names = [i.filename for i in infos]
        main = archive.read("__main__.py").decode()
    assert names == sorted(names, key=lambda n: n.split("/"))
    assert names[0] == "__main__.py"
    package = sorted([p.relative_to(REPO).as_posix() for p in (REPO / "qinglong_edge").rglob("*.py")]
                     + [p.relative_to(REPO).as_posix() for p in (REPO / "qinglong_edge/local/console").iterdir()])
    assert sorted(names[1:]) == package
    assert {i.date_time for i in infos} == {(2023, 11, 14, 22, 13, 20)}  # SOURCE_DATE_EPOCH, UTC
    assert {stat.S_IMODE(i.external_attr >> 16) for i in infos} == {0o644}
    assert {i.compress_type for i in infos} == {zipfile.ZIP_DEFLATED}
    assert "from qinglong_edge.cli import main" in main and "sys.exit(main())" in main
    assert stat.S_IMODE(dist.pyz.stat().st_mode) == 0o755


def test_runs_isolated_from_a_read_only_copy_and_writes_nothing_next_to_it(
        dist: Dist, tmp_path: pathlib.Path) -> None:
    config = doctor_config(tmp_path)
    with read_only_copy(dist.pyz) as pyz:
        before = snapshot(pyz.parent)
        env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
        runs = {
            "help": ["--help"],
            "version": ["version", "--json"],
            "doctor": ["--config", str(config), "doctor"],
        }
        for name, args in runs.items():
            # cwd is the read-only directory itself: any relative write would land there.
            proc = subprocess.run([sys.executable, "-I", str(pyz), *args], capture_output=True, text=True,
                                  cwd=pyz.parent, env=env, check=False, timeout=60)
            assert proc.returncode == 0, f"{name}: {proc.stdout}{proc.stderr}"
        assert snapshot(pyz.parent) == before
        assert os.access(pyz, os.W_OK) is (os.geteuid() == 0)  # root could write: the snapshot is the proof


def test_runs_as_an_unprivileged_user_from_a_read_only_copy(dist: Dist) -> None:
    python = unprivileged_python()
    with read_only_copy(dist.pyz) as pyz:
        before = snapshot(pyz.parent)
        for args in (["--help"], ["version"]):
            proc = subprocess.run([python, "-I", str(pyz), *args], capture_output=True, text=True,
                                  cwd=pyz.parent, env={"PATH": "/usr/bin:/bin"}, check=False, timeout=60,
                                  user=65534, group=65534, extra_groups=[])
            assert proc.returncode == 0, proc.stderr
        assert snapshot(pyz.parent) == before


def test_runs_through_its_shebang(dist: Dist, tmp_path: pathlib.Path) -> None:
    env_python = shutil.which("python3")
    if env_python is None:
        pytest.skip("no python3 on PATH for #!/usr/bin/env python3")
    check = subprocess.run(["python3", "-c", "import sys; sys.exit(sys.version_info < (3, 11))"], check=False)
    if check.returncode != 0:
        pytest.skip("python3 on PATH is older than 3.11")
    proc = subprocess.run([str(dist.pyz), "version", "--json"], capture_output=True, text=True, cwd=tmp_path,
                          check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True
    assert list(tmp_path.iterdir()) == []


def test_bad_usage_from_the_zipapp_exits_64_without_a_traceback(dist: Dist, tmp_path: pathlib.Path) -> None:
    proc = subprocess.run([sys.executable, "-I", str(dist.pyz), "no-such-command"], capture_output=True,
                          text=True, cwd=tmp_path, check=False, timeout=60)
    assert proc.returncode == 64
    assert "Traceback" not in proc.stderr


def test_zip_date_is_clamped_to_1980() -> None:
    from qle_dist.reproducible import zip_date_time

    assert zip_date_time(0) == (1980, 1, 1, 0, 0, 0)
    assert zip_date_time(EPOCH) == (2023, 11, 14, 22, 13, 20)
