"""Another process holding an exclusive lock on a SQLite database (a real process, a real
lock: ``BEGIN EXCLUSIVE`` in DELETE journal mode blocks readers and writers alike).

Usage::

    with exclusive_lock(db_path):
        ...   # every other connection's statement now waits for its busy timeout
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN EXCLUSIVE")
sys.stdout.write("locked\\n")
sys.stdout.flush()
sys.stdin.read()
conn.execute("ROLLBACK")
"""


@contextlib.contextmanager
def exclusive_lock(db_path: str | os.PathLike[str]) -> Iterator[subprocess.Popen[str]]:
    """Start the holder, wait until it holds the lock, yield it; release on exit."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, os.fspath(db_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "locked\n", "the lock holder failed"
        yield proc
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=30)
