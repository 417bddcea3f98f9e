"""Failures of a cron pull where the device logs (issue 23 item 5).

``pull`` prints every result line on stdout, which cron and the pull unit throw away
(the OpenWrt crontab: ``2>&1 >/dev/null | logger``; systemd: ``StandardOutput=null``), so
an idle minute writes nothing to any log. A *failure* (an exit status other than 0, a
failed session call, a record call that failed or lost its lease) is also said on stderr,
which reaches ``logread`` (the crontab's ``logger``; procd's ``stderr 1``) and the journal
(the unit's ``StandardError=journal``): once per distinct failure per hour, with its
remedy. A failure is *distinct* by its code, reason, HTTP status and cluster code (not by
its message, whose times change every minute).

The memory is one small file per failure in the runtime directory (RAM), written only
when the failure is said::

    failure.<16 hex of sha256(key)>   {"bootId":..,"atMs":<boot ms>,"key":..}

A copy of another boot, or one that does not parse (a damaged file), says it again; when
the runtime directory cannot be used at all, every failure is said (never hidden).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

from qinglong_edge.clock import boot_id, boot_ms
from qinglong_edge.config import WorkerConfig
from qinglong_edge.contracts.digest import sha256_hex
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.strictjson import dumps_bytes, loads
from qinglong_edge.errors import JournalError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any, TextIO

    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

__all__ = ["HOUR_MS", "FailureLog", "failure_key"]

#: A distinct failure is said at most once in this much boot-clock time.
HOUR_MS = 3_600_000
_KEY_FIELDS = ("status", "code", "event", "operation", "reason", "httpStatus", "clusterCode")


def failure_key(payload: dict[str, Any]) -> str:
    """What makes a failure distinct: its code, reason, HTTP status and cluster code."""
    return "|".join(f"{name}={payload[name]}" for name in _KEY_FIELDS if payload.get(name) is not None)


class FailureLog:
    """Says failures on ``stream`` (stderr) once per distinct failure per hour.

    Args:
        worker: the worker section (its runtime directory keeps the memory).
        stream: where the lines go (default ``sys.stderr``).
        duplicate: False when ``stream`` is the same terminal as stdout (a person already
            read the line there): then nothing is said twice.
        boot_clock: boot-clock ms (a test passes its own).
    """

    def __init__(self, worker: WorkerConfig, stream: TextIO | None = None, *, duplicate: bool | None = None,
                 boot_clock: Callable[[], int] = boot_ms) -> None:
        self._worker = worker
        self._boot_clock = boot_clock
        self._stream = stream if stream is not None else sys.stderr
        if duplicate is None:
            duplicate = not (os.isatty(1) and os.isatty(2))
        self._duplicate = duplicate
        self._runtime: RuntimeDirectory | None = None
        self._opened = False
        self._boot = boot_id() or "unknown"

    def say(self, line: str, key: str) -> bool:
        """Write ``line`` (its remedy included) unless this failure was said within the hour.
        Returns whether it was written."""
        if not self._duplicate or not self._due(key):
            return False
        with contextlib.suppress(OSError, ValueError):
            print(line, file=self._stream, flush=True)
        return True

    def close(self) -> None:
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None

    def _store(self) -> RuntimeDirectory | None:
        if not self._opened:
            self._opened = True
            from qinglong_edge.worker.journal.runtime import RuntimeDirectory

            try:
                self._runtime = RuntimeDirectory.open(self._worker.runtime_directory, self._worker.journal_directory)
            except JournalError:
                self._runtime = None
        return self._runtime

    def _due(self, key: str) -> bool:
        runtime = self._store()
        if runtime is None:
            return True  # nowhere to remember it: said every time rather than never
        name = "failure." + sha256_hex(key.encode("utf-8", "replace"))[:16]
        now = self._boot_clock()
        try:
            data = runtime.read(name)
            value = None if data is None else loads(data, max_bytes=4096, min_bytes=2)
        except (JournalError, ContractError):
            value = None  # damaged: said again, rewritten
        if (isinstance(value, dict) and value.get("bootId") == self._boot and value.get("key") == key
                and isinstance(value.get("atMs"), int) and 0 <= now - value["atMs"] < HOUR_MS):
            return False
        with contextlib.suppress(JournalError):
            runtime.write(name, dumps_bytes({"bootId": self._boot, "atMs": now, "key": key}) + b"\n")
        return True
