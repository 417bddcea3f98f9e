"""The Raspberry Pi artefact: ``qinglong-edge.pyz``, one executable file.

Built with :mod:`zipfile` rather than :mod:`zipapp` (which stamps entries with file
mtimes and the current time): ``#!/usr/bin/env python3``, a ``__main__.py`` calling
:func:`qinglong_edge.cli.main`, the package sources, sorted, fixed ``date_time``,
mode 0644, no ``__pycache__`` (packaging.md 7). zipimport never writes bytecode, so
running it (also from a read-only directory, also under ``python3 -I``) writes
nothing next to it; the agent's config and state live outside the archive.
"""

from __future__ import annotations

from qle_dist.payload import package_files
from qle_dist.reproducible import Entry, zip_bytes

__all__ = ["MAIN", "SHEBANG", "build_zipapp"]

SHEBANG = b"#!/usr/bin/env python3\n"
MAIN = b'''"""qinglong-edge zipapp entry point: python3 qinglong-edge.pyz COMMAND ..."""
import sys

if sys.version_info < (3, 11):
    sys.exit("qinglong-edge: Python 3.11 or newer is required")

from qinglong_edge.cli import main

sys.exit(main())
'''


def build_zipapp(source_date_epoch: int) -> tuple[str, bytes]:
    """Return ``("qinglong-edge.pyz", bytes)``; install it as an executable (0755)."""
    entries = [Entry("__main__.py", MAIN, 0o644)]
    entries += [Entry(path, data, 0o644) for path, data in package_files()]
    return "qinglong-edge.pyz", zip_bytes(entries, source_date_epoch, SHEBANG)
