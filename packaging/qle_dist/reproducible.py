"""Byte-reproducible tar, gzip and zip writers (stdlib only).

Every artefact is a pure function of the input files and ``SOURCE_DATE_EPOCH``
(https://reproducible-builds.org/specs/source-date-epoch/):

* tar: ``tarfile.GNU_FORMAT`` (never PAX: opkg-lede skips the files after an ``x``
  header and still exits 0, packaging.md 1.2), integer mtimes, uid/gid 0, empty
  uname/gname, explicit modes, parents before children, names sorted by path
  components (what ``tar --sort=name`` gives);
* gzip: written by hand (RFC 1952 header with MTIME 0, no file name, XFL 2, OS 3,
  like ``gzip -9n``; raw deflate level 9), so the bytes depend only on zlib, not on
  which Python wrote them;
* zip: sorted names, fixed ``date_time``, Unix permissions, deflate level 9, no
  directory entries and no bytecode.
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import tarfile
import time
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Entry",
    "gzip_bytes",
    "source_date_epoch",
    "tar_bytes",
    "zip_bytes",
    "zip_date_time",
]

#: 1980-01-01T00:00:00Z, the earliest time a zip entry can carry.
ZIP_EPOCH = 315532800


@dataclass(frozen=True, slots=True)
class Entry:
    """One archive member.

    Attributes:
        path: relative POSIX path without a leading ``./`` or a trailing ``/``.
        data: file contents, or ``None`` for a directory.
        mode: permission bits (``0o644``, ``0o755``...).
    """

    path: str
    data: bytes | None
    mode: int

    @property
    def is_dir(self) -> bool:
        return self.data is None


def source_date_epoch(repo: Path) -> int:
    """``$SOURCE_DATE_EPOCH``, else the commit time of ``HEAD`` in ``repo``.

    Raises:
        ValueError: the variable is not a non-negative integer, or it is unset and
            git cannot tell the commit time.
    """
    text = os.environ.get("SOURCE_DATE_EPOCH")
    if text is None:
        try:
            proc = subprocess.run(
                ["git", "-C", str(repo), "log", "-1", "--format=%ct"],
                capture_output=True, text=True, check=False, timeout=30,
            )
        except OSError as exc:
            raise ValueError(f"SOURCE_DATE_EPOCH is unset and git failed ({exc.strerror})") from None
        if proc.returncode != 0 or not proc.stdout.strip():
            raise ValueError("SOURCE_DATE_EPOCH is unset and this is not a git checkout")
        text = proc.stdout.strip()
    if not text.isdigit() or len(text) > 12:
        raise ValueError("SOURCE_DATE_EPOCH must be a non-negative integer (seconds)")
    return int(text)


def _sort_key(path: str) -> tuple[str, ...]:
    return tuple(path.split("/"))


def with_parents(entries: Iterable[Entry], root: bool = False) -> list[Entry]:
    """Add a 0755 directory entry for every missing parent; sort by path components.

    With ``root`` a ``.`` entry comes first (ipkg-build archives ``.``).
    """
    by_path = {entry.path: entry for entry in entries}
    for path in list(by_path):
        parts = path.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            by_path.setdefault(parent, Entry(parent, None, 0o755))
    ordered = sorted(by_path.values(), key=lambda e: _sort_key(e.path))
    if root:
        ordered.insert(0, Entry(".", None, 0o755))
    return ordered


def tar_bytes(entries: Iterable[Entry], mtime: int, prefix: str = "./", root: bool | None = None) -> bytes:
    """An uncompressed GNU tar of ``entries`` (parents added), names ``prefix + path``.

    ``root`` (default: ``prefix == "./"``) adds the ``./`` entry first, as
    ``tar -C dir .`` does; the ipk's outer tar lists its three members only.
    """
    buffer = io.BytesIO()
    members = with_parents(entries, root=prefix == "./" if root is None else root)
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for entry in members:
            name = "." if entry.path == "." else prefix + entry.path
            info = tarfile.TarInfo(name)
            info.mtime = int(mtime)
            info.mode = entry.mode
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if entry.data is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(entry.data)
                archive.addfile(info, io.BytesIO(entry.data))
    return buffer.getvalue()


def gzip_bytes(data: bytes) -> bytes:
    """RFC 1952 gzip of ``data``: MTIME 0, no name, XFL 2 (best), OS 3 (Unix)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS, 9)
    body = compressor.compress(data) + compressor.flush()
    header = b"\x1f\x8b\x08\x00" + struct.pack("<I", 0) + b"\x02\x03"
    trailer = struct.pack("<II", zlib.crc32(data) & 0xFFFFFFFF, len(data) & 0xFFFFFFFF)
    return header + body + trailer


def zip_date_time(epoch: int) -> tuple[int, int, int, int, int, int]:
    """UTC ``date_time`` for a zip entry, clamped to 1980-01-01 (the format's start)."""
    year, month, day, hour, minute, second = time.gmtime(max(epoch, ZIP_EPOCH))[:6]
    return (year, month, day, hour, minute, second)


def zip_bytes(entries: Iterable[Entry], epoch: int, shebang: bytes = b"") -> bytes:
    """A deflated zip of the file entries, sorted, prefixed with ``shebang``.

    Readers (zipfile, zipimport) locate members from the end of the file, so a
    prefix such as ``#!/usr/bin/env python3\\n`` is allowed (this is how zipapp
    writes executable archives).
    """
    buffer = io.BytesIO()
    buffer.write(shebang)
    date_time = zip_date_time(epoch)
    files = sorted((e for e in entries if e.data is not None), key=lambda e: _sort_key(e.path))
    with zipfile.ZipFile(buffer, "w") as archive:
        for entry in files:
            assert entry.data is not None
            info = zipfile.ZipInfo(entry.path, date_time)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # Unix, so external_attr carries the mode
            info.external_attr = (0o100000 | entry.mode) << 16
            archive.writestr(info, entry.data, compresslevel=9)
    return buffer.getvalue()
