"""Real small file systems for storage tests (root only; skip with the reason otherwise)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess
from collections.abc import Iterator

import pytest


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a file system needs root")


def _umount(path: pathlib.Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True, check=False, timeout=30)


@contextlib.contextmanager
def tmpfs(path: pathlib.Path, size: str, *, inodes: int | None = None) -> Iterator[pathlib.Path]:
    """A tmpfs of ``size`` (e.g. ``"64k"``) mounted at ``path`` (mode 0700); ``inodes``
    caps its inodes (``nr_inodes``, the root directory included), so creating a file
    fails with ENOSPC once they are used up."""
    _need_root()
    path.mkdir(mode=0o700, exist_ok=True)
    options = f"size={size},mode=0700" + (f",nr_inodes={inodes}" if inodes is not None else "")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True, check=False, timeout=30)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount tmpfs: {proc.stderr.decode(errors='replace').strip()}")
    try:
        yield path
    finally:
        _umount(path)


@contextlib.contextmanager
def exfat(path: pathlib.Path, image: pathlib.Path) -> Iterator[pathlib.Path]:
    """An 8 MiB exFAT image on a loop device, mounted with exfat-fuse (umask 077)."""
    _need_root()
    for tool in ("mkfs.exfat", "mount.exfat-fuse", "losetup"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (CI installs exfat-fuse and exfatprogs)")
    with open(image, "wb") as handle:
        handle.truncate(8 * 1024 * 1024)
    subprocess.run(["mkfs.exfat", str(image)], capture_output=True, check=True, timeout=60)
    loop = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, check=False, timeout=30)
    if loop.returncode != 0:
        pytest.skip(f"no loop device: {loop.stderr.decode(errors='replace').strip()}")
    device = loop.stdout.decode().strip()
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        proc = subprocess.run(["mount.exfat-fuse", "-o", "umask=077", device, str(path)],
                              capture_output=True, check=False, timeout=30)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount exFAT: {proc.stderr.decode(errors='replace').strip()}")
        try:
            yield path
        finally:
            _umount(path)
    finally:
        subprocess.run(["losetup", "-d", device], capture_output=True, check=False, timeout=30)
