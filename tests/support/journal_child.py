"""A child process that drives the real owner lock / journal, for tests that need two
processes, signals or crashes.

Run as ``python -m tests.support.journal_child COMMAND ROOT [ARGS]`` with the repo on
``PYTHONPATH``. It speaks one JSON object per line on stdout.

Commands:
    hold ROOT STALE_MS    acquire the owner lock, print {"event":"owned",...}, then
                          answer stdin lines: "check" -> {"event":"check","code":...},
                          "release" -> release and exit 0. EOF exits.
    try ROOT              try once: {"event":"try","code":null|"already_owned",...,"ms":elapsed}
"""

from __future__ import annotations

import json
import sys
import time


def _emit(**payload: object) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def _hold(root: str, stale_ms: int) -> int:
    from qinglong_edge.worker.ownerlock import OwnerLock

    lock = OwnerLock.acquire(root, stale_ms=stale_ms)
    record = lock.record
    _emit(event="owned", pid=record.pid, startTicks=record.process_start_ticks, name=record.process_name)
    for line in sys.stdin:
        command = line.strip()
        if command == "check":
            try:
                lock.ensure_owned()
                _emit(event="check", code=None)
            except Exception as exc:
                _emit(event="check", code=getattr(exc, "code", type(exc).__name__))
        elif command == "release":
            lock.release()
            _emit(event="released")
            return 0
    return 0


def _try(root: str) -> int:
    from qinglong_edge.errors import JournalError
    from qinglong_edge.worker.ownerlock import OwnerLock

    start = time.monotonic()
    try:
        lock = OwnerLock.acquire(root)
    except JournalError as exc:
        _emit(event="try", code=exc.code, message=exc.message, ms=(time.monotonic() - start) * 1000)
        return 0
    _emit(event="try", code=None, ms=(time.monotonic() - start) * 1000)
    lock.release()
    return 0


def main(argv: list[str]) -> int:
    command, root, *rest = argv
    if command == "hold":
        return _hold(root, int(rest[0]))
    if command == "try":
        return _try(root)
    raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
