#!/usr/bin/env python3
"""Build every qinglong-edge artefact into one directory (``make dist``).

usage: python3 packaging/build.py [--output DIR] [--release N]

Writes, reproducibly from ``SOURCE_DATE_EPOCH`` (default: the commit time of HEAD):

* ``qinglong-edge_<version>-<release>_all.ipk``  OpenWrt 23.05 / 24.10 (opkg)
* ``qinglong-edge_<version>.tar.gz``             OpenWrt 25.x (apk) and other Linux
* ``qinglong-edge.pyz``                          Raspberry Pi / any Python >= 3.11
* ``qinglong-edge.service``, ``qinglong-edge-pull.service``, ``qinglong-edge-pull.timer``
* ``SHA256SUMS``

Each file is written to a temporary name and renamed. Exit 0, or 2 with a message.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from qle_dist.ipk import build_ipk
from qle_dist.payload import FILES, REPO, read_version
from qle_dist.reproducible import source_date_epoch
from qle_dist.tarball import build_tarball
from qle_dist.zipapp import build_zipapp

UNITS = ("qinglong-edge.service", "qinglong-edge-pull.service", "qinglong-edge-pull.timer")


def build_all(output: Path, release: int = 1) -> dict[str, bytes]:
    """Build everything into ``output``; return ``{file name: bytes}``.

    Raises:
        ValueError: bad ``SOURCE_DATE_EPOCH`` or version.
        OSError: the output cannot be written.
    """
    epoch = source_date_epoch(REPO)
    version = read_version()
    ipk = build_ipk(version, release, epoch)
    artefacts = {ipk.filename: ipk.data}
    name, data = build_tarball(version, epoch)
    artefacts[name] = data
    name, data = build_zipapp(epoch)
    artefacts[name] = data
    for unit in UNITS:
        artefacts[unit] = (FILES / "systemd" / unit).read_bytes()
    sums = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in sorted(artefacts.items()))
    artefacts["SHA256SUMS"] = sums.encode()
    output.mkdir(parents=True, exist_ok=True)
    for name, data in artefacts.items():
        mode = 0o755 if name.endswith(".pyz") else 0o644
        temp = output / f".{name}.tmp"
        with open(temp, "wb") as handle:
            handle.write(data)
        os.chmod(temp, mode)
        os.replace(temp, output / name)
    return artefacts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="build.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=REPO / "dist", help="output directory (default: dist/)")
    parser.add_argument("--release", type=int, default=1, help="OpenWrt package release N in X.Y.Z-N (default 1)")
    args = parser.parse_args(argv)
    if args.release < 1:
        parser.error("--release must be 1 or more")
    try:
        artefacts = build_all(args.output, args.release)
    except (ValueError, OSError) as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 2
    for name, data in sorted(artefacts.items()):
        print(f"{args.output / name}  {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
