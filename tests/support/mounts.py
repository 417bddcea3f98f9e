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


def _umount(path: pathlib.Path, *, lazy: bool = False) -> None:
    subprocess.run(["umount", *(["-l"] if lazy else []), str(path)], capture_output=True, check=False, timeout=30)


def _mount(argv: list[str], what: str) -> None:
    """Run the mount command ``argv``; skip the test with its error when it fails."""
    proc = subprocess.run(argv, capture_output=True, check=False, timeout=30)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount {what}: {proc.stderr.decode(errors='replace').strip()}")


@contextlib.contextmanager
def tmpfs(path: pathlib.Path, size: str, *, inodes: int | None = None, lazy: bool = False) -> Iterator[pathlib.Path]:
    """A tmpfs of ``size`` (e.g. ``"64k"``) mounted at ``path`` (mode 0700); ``inodes``
    caps its inodes (``nr_inodes``, the root directory included), so creating a file
    fails with ENOSPC once they are used up. ``lazy`` unmounts it with ``umount -l`` (for
    a test that may leave a file open in it)."""
    _need_root()
    path.mkdir(mode=0o700, exist_ok=True)
    options = f"size={size},mode=0700" + (f",nr_inodes={inodes}" if inodes is not None else "")
    _mount(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], "tmpfs")
    try:
        yield path
    finally:
        _umount(path, lazy=lazy)


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
        _mount(["mount.exfat-fuse", "-o", "umask=077", device, str(path)], "exFAT")
        try:
            yield path
        finally:
            _umount(path)
    finally:
        subprocess.run(["losetup", "-d", device], capture_output=True, check=False, timeout=30)
