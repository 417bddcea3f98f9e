"""doctor runs real probes and names what fails, with a remedy."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.cli import run_cli


def _config(tmp_path: pathlib.Path, state: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "schema": "qinglong/edge-agent@v1",
        "stateDirectory": str(state),
        "localApi": {"listener": {"host": "127.0.0.1", "port": 5700}},
    }))
    return path


def _checks(result_json: dict[str, object]) -> dict[str, dict[str, object]]:
    checks = result_json["checks"]
    assert isinstance(checks, list)
    return {c["name"]: c for c in checks}


def test_healthy_directory_passes(tmp_path: pathlib.Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "pepper").mkdir(mode=0o700)
    result = run_cli("--config", str(_config(tmp_path, state)), "doctor")
    assert result.status == 0, result.stdout + result.stderr
    assert "doctor: all required checks passed" in result.stdout
    for name in ("hard_links", "o_excl", "fsync", "flock", "sqlite_write", "state_dir", "clock"):
        assert any(line.startswith("ok") and f" {name} " in line for line in result.stdout.splitlines()), name


def test_world_writable_state_directory_fails(tmp_path: pathlib.Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    (state / "pepper").mkdir(mode=0o700)
    result = run_cli("--config", str(_config(tmp_path, state)), "doctor")
    assert result.status == 69
    line = next(ln for ln in result.stdout.splitlines() if " state_dir " in ln)
    assert line.startswith("FAIL")
    assert "mode 0777 allows group/other" in line
    assert "chmod 0700" in line
    data = run_cli("--config", str(_config(tmp_path, state)), "doctor", "--json").json()
    assert data["ok"] is False
    assert _checks(data)["state_dir"]["ok"] is False


def test_remedies_quote_paths_with_spaces(tmp_path: pathlib.Path) -> None:
    # The remedy is a command to copy and paste: a path with a space must stay one argument.
    state = tmp_path / "my state"
    missing = _checks(run_cli("--config", str(_config(tmp_path, state)), "doctor", "--json").json())
    assert str(missing["state_dir"]["remedy"]).startswith(f"mkdir -p -m 0700 '{state}'")
    state.mkdir()
    state.chmod(0o755)
    loose = _checks(run_cli("--config", str(_config(tmp_path, state)), "doctor", "--json").json())
    assert loose["state_dir"]["remedy"] == f"chown {os.geteuid()} '{state}' && chmod 0700 '{state}'"


@contextlib.contextmanager
def _exfat_mount(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a file system needs root")
    if not (shutil.which("mkfs.exfat") and shutil.which("mount.exfat-fuse") and shutil.which("losetup")):
        pytest.skip("exfatprogs/exfat-fuse not installed (.ci/run installs them)")
    image = tmp_path / "exfat.img"
    with image.open("wb") as handle:
        handle.truncate(8 * 1024 * 1024)
    subprocess.run(["mkfs.exfat", str(image)], check=True, capture_output=True)
    loop = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True, check=False)
    if loop.returncode != 0:
        pytest.skip(f"no loop device: {loop.stderr.strip()}")
    device = loop.stdout.strip()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        mounted = subprocess.run(["mount.exfat-fuse", device, str(mnt)], capture_output=True, text=True, check=False)
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount exFAT via FUSE: {mounted.stderr.strip()}")
        try:
            yield mnt
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
    finally:
        subprocess.run(["losetup", "-d", device], check=False)


def test_filesystem_without_hard_links_fails(tmp_path: pathlib.Path) -> None:
    with _exfat_mount(tmp_path) as mnt:
        state = mnt / "state"
        state.mkdir()
        result = run_cli("--config", str(_config(tmp_path, state)), "doctor")
        assert result.status == 69, result.stdout
        lines = {ln.split()[1]: ln for ln in result.stdout.splitlines() if ln[:4] in ("ok  ", "FAIL", "warn")}
        assert lines["hard_links"].startswith("FAIL")
        assert "link() failed" in lines["hard_links"]
        assert "not FAT/exFAT" in lines["hard_links"]
        # exFAT has no Unix permissions either: every file shows 0777.
        assert lines["state_dir"].startswith("FAIL")
        assert "0777" in lines["state_dir"]


def test_missing_directories_name_the_command_that_makes_them(tmp_path: pathlib.Path) -> None:
    # Before `admin init` nothing exists: every remedy must be something to run.
    data = run_cli("--config", str(_config(tmp_path, tmp_path / "state")), "doctor", "--json").json()
    checks = _checks(data)
    assert "qinglong-edge admin init" in str(checks["pepper_dir"]["remedy"])
    for name in ("state_dir", "sqlite_write"):
        remedy = str(checks[name]["remedy"])
        assert f"mkdir -p -m 0700 {tmp_path / 'state'}" in remedy
        assert "qinglong-edge admin init" in remedy
    assert not any("the command that creates it" in str(c["remedy"]) for c in checks.values())
