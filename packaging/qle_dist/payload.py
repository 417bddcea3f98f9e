"""What the artefacts carry: the runtime package and the installed file layout.

The router package carries only the runtime: the ``qinglong_edge`` package (no
tests, no cluster double, no benchmarks, no bytecode, no ``py.typed``), the
launcher, the procd init script, the UCI defaults, the crontab and the sysupgrade
keep list. The same tree is the tarball's ``payload/``.

Installed layout (OpenWrt ipk; the tarball's install.sh may move ``/usr`` to another
prefix)::

    /etc/config/qinglong-edge          0644  UCI defaults (conffile, service off)
    /etc/crontabs/qinglong             0600  pull every minute as user qinglong (conffile)
    /etc/init.d/qinglong-edge          0755  procd init script
    /lib/upgrade/keep.d/qinglong-edge  0644  sysupgrade keeps /etc/qinglong-edge/
    /usr/bin/qinglong-edge             0755  launcher (#!/usr/bin/python3)
    /usr/lib/qinglong-edge/qinglong_edge/...  0644  the package (version-independent:
                                                not under python3.X/site-packages)
"""

from __future__ import annotations

import re
from pathlib import Path

from qle_dist.reproducible import Entry

__all__ = [
    "CONFFILES",
    "FILES",
    "PACKAGE",
    "REPO",
    "package_files",
    "read_version",
    "runtime_tree",
]

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "packaging" / "files"
PACKAGE = REPO / "qinglong_edge"

#: User-editable files: opkg keeps a changed one on upgrade (new one as FILE-opkg).
CONFFILES = ("/etc/config/qinglong-edge", "/etc/crontabs/qinglong")

_SKIP_SUFFIXES = (".pyc", ".pyo", "~", ".swp", ".orig", ".rej")
_SKIP_NAMES = frozenset({"__pycache__", "py.typed"})


def read_version(package: Path = PACKAGE) -> str:
    """``__version__`` from ``qinglong_edge/__init__.py`` (read, not imported).

    Raises:
        ValueError: no ``__version__ = "X.Y.Z"`` line.
    """
    text = (package / "__init__.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__ = "([0-9]+\.[0-9]+\.[0-9]+)"$', text, re.MULTILINE)
    if match is None:
        raise ValueError("qinglong_edge/__init__.py has no __version__ = \"X.Y.Z\"")
    return match.group(1)


def package_files(package: Path = PACKAGE) -> list[tuple[str, bytes]]:
    """``(path below the package's parent, bytes)`` of every runtime file, sorted.

    Skips bytecode, ``__pycache__``, ``py.typed`` (a typing marker for developers),
    hidden files and editor leftovers.
    """
    found: list[tuple[str, bytes]] = []
    for path in sorted(package.rglob("*")):
        rel = path.relative_to(package.parent)
        if any(part in _SKIP_NAMES or part.startswith(".") for part in rel.parts):
            continue
        if not path.is_file() or path.is_symlink() or path.name.endswith(_SKIP_SUFFIXES):
            continue
        found.append((rel.as_posix(), path.read_bytes()))
    return found


def _file(name: str) -> bytes:
    return (FILES / name).read_bytes()


def runtime_tree() -> list[Entry]:
    """The installed files (paths relative to ``/``), without directory entries."""
    entries = [
        Entry("etc/config/qinglong-edge", _file("openwrt/qinglong-edge.uci"), 0o644),
        Entry("etc/crontabs/qinglong", _file("openwrt/qinglong.crontab"), 0o600),
        Entry("etc/init.d/qinglong-edge", _file("openwrt/qinglong-edge.init"), 0o755),
        Entry("lib/upgrade/keep.d/qinglong-edge", _file("openwrt/keep.d"), 0o644),
        Entry("usr/bin/qinglong-edge", _file("launcher"), 0o755),
    ]
    entries += [
        Entry(f"usr/lib/qinglong-edge/{rel}", data, 0o644) for rel, data in package_files()
    ]
    return entries
