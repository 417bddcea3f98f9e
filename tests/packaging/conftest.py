"""Packaging fixtures: the artefacts, built once per session by the real builder.

``packaging/`` is put on ``sys.path`` so tests can import ``qle_dist`` (the builder)
and ``ipkcheck`` (the independent checker). The build runs ``packaging/build.py``
in a child process, exactly as ``make dist`` does, with a fixed SOURCE_DATE_EPOCH.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.cluster_double import ClusterDouble

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGING = REPO / "packaging"
if str(PACKAGING) not in sys.path:
    sys.path.insert(0, str(PACKAGING))

#: 2023-11-14T22:13:20Z
EPOCH = 1_700_000_000


@dataclass(frozen=True)
class Dist:
    """The artefacts of one build."""

    directory: pathlib.Path
    version: str
    release: int = 1

    @property
    def ipk(self) -> pathlib.Path:
        return self.directory / f"qinglong-edge_{self.version}-{self.release}_all.ipk"

    @property
    def tarball(self) -> pathlib.Path:
        return self.directory / f"qinglong-edge_{self.version}.tar.gz"

    @property
    def pyz(self) -> pathlib.Path:
        return self.directory / "qinglong-edge.pyz"


def build_dist(output: pathlib.Path, epoch: int = EPOCH, release: int = 1) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch))
    return subprocess.run(
        [sys.executable, str(PACKAGING / "build.py"), "--output", str(output), "--release", str(release)],
        capture_output=True, text=True, env=env, check=False, timeout=120,
    )


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    from qle_dist.payload import read_version

    output = tmp_path_factory.mktemp("dist")
    proc = build_dist(output)
    assert proc.returncode == 0, proc.stderr
    return Dist(output, read_version())


@pytest.fixture(scope="session")
def busybox() -> str:
    """Debian's busybox (the tools OpenWrt itself uses), or skip."""
    path = shutil.which("busybox")
    if path is None:
        pytest.skip("busybox is not installed (.ci/run installs Debian's busybox package)")
    return path


@pytest.fixture(scope="session")
def busybox_path(busybox: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PATH of busybox applets only, so scripts see the tools a router has, not GNU's."""
    directory = tmp_path_factory.mktemp("busybox-bin")
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if "/" not in applet and applet not in ("[", "[["):
            (directory / applet).symlink_to(busybox)
    return str(directory)


def busybox_unpack(busybox: str, archive: pathlib.Path, dest: pathlib.Path) -> None:
    """``busybox gzip -dc ARCHIVE | busybox tar -xf - -C DEST``, as opkg-lede does."""
    dest.mkdir(parents=True, exist_ok=True)
    gunzip = subprocess.Popen([busybox, "gzip", "-dc", str(archive)], stdout=subprocess.PIPE)
    assert gunzip.stdout is not None
    tar = subprocess.run([busybox, "tar", "-xf", "-", "-C", str(dest)], stdin=gunzip.stdout,
                         capture_output=True, check=False, timeout=60)
    gunzip.stdout.close()
    assert gunzip.wait(timeout=60) == 0
    assert tar.returncode == 0, tar.stderr


@dataclass(frozen=True)
class Unpacked:
    """An ipk unpacked with busybox: ``outer`` (the three members), ``control``, ``root``."""

    outer: pathlib.Path
    control: pathlib.Path
    root: pathlib.Path


def unpack_ipk(busybox: str, ipk: pathlib.Path, where: pathlib.Path) -> Unpacked:
    outer, control, root = where / "outer", where / "control", where / "root"
    busybox_unpack(busybox, ipk, outer)
    busybox_unpack(busybox, outer / "control.tar.gz", control)
    busybox_unpack(busybox, outer / "data.tar.gz", root)
    return Unpacked(outer, control, root)


def snapshot(directory: pathlib.Path) -> dict[str, tuple[int, int, int]]:
    """name -> (size, mtime_ns, mode) of every entry: compare before/after to prove no write."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_mode) for p in directory.iterdir()}


@contextlib.contextmanager
def read_only_copy(pyz: pathlib.Path) -> Iterator[pathlib.Path]:
    """A 0444 copy of ``pyz`` in a fresh 0555 directory under /tmp (traversable by any user)."""
    directory = pathlib.Path(tempfile.mkdtemp(prefix="qle-ro-"))
    try:
        copy = directory / "qinglong-edge.pyz"
        shutil.copyfile(pyz, copy)
        copy.chmod(0o444)
        directory.chmod(0o555)
        yield copy
    finally:
        directory.chmod(0o755)
        shutil.rmtree(directory)


@pytest.fixture(scope="session")
def shared_cluster() -> Iterator[ClusterDouble]:
    """One cluster double (TLS 1.3 mTLS) for the packaging end-to-end tests."""
    with ClusterDouble() as double:
        yield double


@pytest.fixture
def cluster(shared_cluster: ClusterDouble) -> ClusterDouble:
    """The shared double, reset: fresh credential and state, one ``shell`` task queued."""
    shared_cluster.reset(tasks=("shell",))
    return shared_cluster
