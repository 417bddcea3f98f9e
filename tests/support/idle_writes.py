"""What an idle ``pull`` cycle writes under the state directory: strace and stat.

Used by tests/cli/test_pull_idle_writes.py and benchmarks/bench_idle_writes.py (issue 16
item 4: "no fsync, no file created, no byte written under the state or journal directory"
in steady state, cycle 2 onward, a heartbeat due each cycle).

Two independent measurements of one cycle:

* :func:`trace_cycle` runs the cycle under ``strace -f -y`` and counts, for file
  descriptors and paths under the watched directory: ``fsync``/``fdatasync``/
  ``sync_file_range`` calls, bytes written (``write``/``pwrite64``/``writev``/...),
  ``open*`` with ``O_CREAT``, and every call that changes a name or an inode
  (``rename*``, ``link*``, ``unlink*``, ``mkdir*``, ``rmdir``, ``symlink*``,
  ``fchmod*``/``chmod``, ``fchown*``, ``*truncate``, ``utimensat``). An ``O_CREAT``
  open of a file that already exists creates nothing, so it is reported apart
  (``opens_with_create``; an idle cycle of the agent makes none) and the snapshot
  below decides.
* :func:`snapshot` records ``(inode, size, mtime_ns, ctime_ns)`` of every entry under
  the directory: any write, rename, link count or mode change moves a ``ctime``, and
  a created or removed name changes the listing.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

SYNCS = ("fsync", "fdatasync", "sync_file_range", "syncfs")
WRITES = ("write", "pwrite64", "writev", "pwritev", "pwritev2")
OPENS = ("open", "openat", "openat2", "creat")
MUTATIONS = ("rename", "renameat", "renameat2", "link", "linkat", "unlink", "unlinkat", "mkdir", "mkdirat",
             "rmdir", "symlink", "symlinkat", "fchmod", "fchmodat", "chmod", "fchown", "fchownat", "chown",
             "lchown", "ftruncate", "truncate", "utimensat", "mknod", "mknodat")
TRACED = ",".join((*SYNCS, *WRITES, *OPENS, *MUTATIONS))
_LINE = re.compile(r"^(?:\[pid +\d+\] |\d+ +)?(\w+)\((.*)\) += (-?\d+)")
_FD_PATH = re.compile(r"\d+<([^>]*)>")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


@dataclass
class Writes:
    """What one traced cycle did under the watched directory."""

    fsyncs: int = 0
    bytes_written: int = 0
    opens_with_create: int = 0
    mutations: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    @property
    def nothing(self) -> bool:
        return self.fsyncs == 0 and self.bytes_written == 0 and not self.mutations


def strace_path() -> str | None:
    return shutil.which("strace")


def _under(args: str, root: str) -> bool:
    paths = _FD_PATH.findall(args) + [p for p in _QUOTED.findall(args) if p.startswith("/")]
    return any(p == root or p.startswith(root + "/") for p in paths)


def parse_trace(text: str, root: str) -> Writes:
    """Count the calls of an ``strace -f -y -o`` file that touch ``root`` (see module)."""
    root = os.path.normpath(root)
    found = Writes()
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        name, args, result = match.group(1), match.group(2), int(match.group(3))
        if not _under(args, root):
            continue
        found.lines.append(line)
        if name in SYNCS:
            found.fsyncs += 1
        elif name in WRITES:
            found.bytes_written += max(0, result)
        elif name in OPENS:
            if "O_CREAT" in args or name == "creat":
                found.opens_with_create += 1
        elif name in MUTATIONS and result >= 0:
            found.mutations.append(line)
    return found


def trace_cycle(argv: Sequence[str], root: pathlib.Path, out: pathlib.Path, *, env: dict[str, str],
                cwd: str | None = None, timeout: float = 60) -> tuple[subprocess.CompletedProcess[bytes], Writes]:
    """Run ``argv`` under strace; return the process and what it did under ``root``."""
    strace = strace_path()
    if strace is None:
        raise FileNotFoundError("strace")
    proc = subprocess.run([strace, "-f", "-qq", "-y", "-s", "256", "-e", f"trace={TRACED}", "-o", str(out),
                           *argv], capture_output=True, env=env, cwd=cwd, timeout=timeout, check=False)
    return proc, parse_trace(out.read_text(errors="replace"), str(root))


def snapshot(root: pathlib.Path) -> dict[str, tuple[int, int, int, int]]:
    """``relative path -> (inode, size, mtime_ns, ctime_ns)`` of ``root`` and everything in it."""
    entries = {}
    for directory, dirs, names in os.walk(root):
        for name in [".", *dirs, *names]:
            path = pathlib.Path(directory, name) if name != "." else pathlib.Path(directory)
            st = path.lstat()
            entries[str(path.relative_to(root))] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return entries
