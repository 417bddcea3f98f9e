"""``python -m qinglong_edge`` (and the zipapp entry point)."""

from __future__ import annotations

import sys

from qinglong_edge.cli import main

if __name__ == "__main__":
    sys.exit(main())
