"""The package-manager-independent tarball: ``qinglong-edge_<version>.tar.gz``.

For OpenWrt 25.x (apk replaced opkg; we cannot build or verify an ``.apk`` without
apk-tools 3, packaging.md 2) and any other Linux. Layout, below
``qinglong-edge-<version>/``::

    install.sh, uninstall.sh   POSIX sh (busybox ash, dash); --prefix / --destdir aware
    INSTALL, LICENSE, VERSION
    payload/                   the .ipk's data tree (payload.runtime_tree)
    scripts/postinst-pkg       the .ipk's own maintainer logic, reused by install.sh
    scripts/prerm-pkg          ... and by uninstall.sh
    systemd/                   units and a minimal config for systemd hosts

It carries the package source, not the zipapp: postinst-pkg byte-compiles it once
on the device (OpenWrt's Python never writes bytecode, and zipimport never reads
``__pycache__``), exactly as for the .ipk.
"""

from __future__ import annotations

from qle_dist.payload import FILES, REPO, runtime_tree
from qle_dist.reproducible import Entry, gzip_bytes, tar_bytes

__all__ = ["SYSTEMD_FILES", "build_tarball"]

SYSTEMD_FILES = (
    "qinglong-edge.service",
    "qinglong-edge-pull.service",
    "qinglong-edge-pull.timer",
    "config.json",
)


def build_tarball(version: str, source_date_epoch: int) -> tuple[str, bytes]:
    """Return ``(file name, bytes)`` of ``qinglong-edge_<version>.tar.gz``."""
    entries = [
        Entry("install.sh", (FILES / "tarball" / "install.sh").read_bytes(), 0o755),
        Entry("uninstall.sh", (FILES / "tarball" / "uninstall.sh").read_bytes(), 0o755),
        Entry("INSTALL", (FILES / "tarball" / "INSTALL").read_bytes(), 0o644),
        Entry("LICENSE", (REPO / "LICENSE").read_bytes(), 0o644),
        Entry("VERSION", f"{version}\n".encode(), 0o644),
        Entry("scripts/postinst-pkg", (FILES / "openwrt" / "postinst-pkg").read_bytes(), 0o755),
        Entry("scripts/prerm-pkg", (FILES / "openwrt" / "prerm-pkg").read_bytes(), 0o755),
    ]
    entries += [Entry(f"systemd/{name}", (FILES / "systemd" / name).read_bytes(), 0o644)
                for name in SYSTEMD_FILES]
    entries += [Entry(f"payload/{e.path}", e.data, e.mode) for e in runtime_tree()]
    top = f"qinglong-edge-{version}"
    rooted = [Entry(f"{top}/{e.path}", e.data, e.mode) for e in entries]
    data = gzip_bytes(tar_bytes(rooted, source_date_epoch, prefix="", root=False))
    return f"qinglong-edge_{version}.tar.gz", data
