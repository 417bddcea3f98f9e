"""What each cron ``pull`` cycle leaves in RAM for people and Prometheus (issue 26 item 5).

Two files, both in RAM, neither ever on flash:

* ``cycles.json`` in the runtime directory (:mod:`qinglong_edge.worker.journal.runtime`, 0600):
  the last cycle (time, status, exit status), counters since the last reboot and the last
  :data:`MAX_FAILURES` failures (time, reason, detail). ``serve``'s read-only
  ``edge.worker.get`` route shows it in the status console. Written after a *failed*
  cycle always, and after every cycle when the metrics textfile is configured; an idle
  cycle without metrics writes nothing (spec README: an idle cycle writes nothing, and
  zero extra cost when not configured: one ``is None`` test).
* ``worker.metricsTextfile`` (off by default): the node_exporter textfile collector's
  format (:mod:`qinglong_edge.contracts.exposition`), rewritten after every cycle
  (:func:`qinglong_edge.filecheck.replace_file`, no fsync): a temp file
  ``.<name>.<32 hex>.tmp`` in the same directory, mode 0644 (the exporter runs as
  another user), then ``rename`` over the name, so the exporter never reads half a file.
  Its directory must be on a RAM file system (``tmpfs``/``ramfs``, from
  ``/proc/self/mountinfo``): elsewhere nothing is written and a warning is said once per
  boot (``metrics_textfile_not_in_ram``), as for an unwritable directory
  (``metrics_textfile_unavailable``). The cycle itself never fails because of it.

Families of the textfile: ``qinglong_edge_pull_last_cycle_timestamp_seconds``,
``qinglong_edge_pull_last_cycle_exit_status``, ``qinglong_edge_pull_last_cycle_success``,
``qinglong_edge_pull_cycles_total{status}``, ``qinglong_edge_pull_claims_total`` (offers
claimed: ``accepted`` + ``replayed``), ``qinglong_edge_pull_inbox_records{state}``,
``qinglong_edge_pull_failures_total{reason}``. Counters live in ``cycles.json``: they
survive between cron runs and restart at 0 after a reboot (Prometheus handles a reset).

Only modules the idle cycle already loads are imported here (tests/cli/test_pull_imports.py).
"""

from __future__ import annotations

import contextlib
import os

from qinglong_edge import filecheck
from qinglong_edge.contracts.exposition import Family, render
from qinglong_edge.contracts.strictjson import StrictJsonError, dumps_bytes, loads
from qinglong_edge.errors import JournalError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from qinglong_edge.config import WorkerConfig

__all__ = ["CYCLES_NAME", "MAX_FAILURES", "RAM_FILESYSTEMS", "read_cycles", "record_cycle"]

CYCLES_NAME = "cycles.json"
#: Failures kept in ``cycles.json`` (newest last).
MAX_FAILURES = 8
#: Distinct counter labels kept (reasons and statuses are a fixed vocabulary).
_MAX_LABELS = 64
_DETAIL_CHARS = 200
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def read_cycles(runtime: Any) -> dict[str, Any]:
    """``cycles.json`` of an open runtime directory, or an empty state (absent or not ours)."""
    try:
        data = runtime.read(CYCLES_NAME)
        value = loads(data, max_bytes=16_384, min_bytes=2) if data is not None else None
    except (JournalError, StrictJsonError):
        value = None
    if not isinstance(value, dict) or value.get("schemaVersion") != 1:
        return {"schemaVersion": 1, "lastCycle": None, "cycles": {}, "claims": 0, "failuresByReason": {},
                "failures": []}
    return value


def _bump(counts: dict[str, int], key: str) -> None:
    if key in counts or len(counts) < _MAX_LABELS:
        counts[key] = int(counts.get(key, 0)) + 1


def _facts(report: Any) -> tuple[str, str | None, str]:
    """``(status, failure reason or None, detail)`` of a CycleReport."""
    result = report.result
    status = str(report.error) if report.error else (str(result.status) if result is not None else "failed")
    detail = str(report.detail or "")[:_DETAIL_CHARS]
    if report.error:
        return status, str(report.reason or report.error), detail
    if result is None:
        return status, "failed", detail
    if result.status in ("accepted", "replayed", "idle", "backoff", "no_slot"):
        return status, None, detail
    return status, str(result.reason or result.status), detail


def in_ram(path: str, mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether the directory of ``path`` is on tmpfs/ramfs (the longest mount point that
    contains it, from ``mountinfo``; unreadable: False)."""
    directory = os.path.realpath(os.path.dirname(path))
    best, fstype = -1, ""
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                fields = line.split()
                if "-" not in fields:
                    continue
                point = fields[4].replace("\\040", " ")
                kind = fields[fields.index("-") + 1]
                inside = directory == point or directory.startswith(point.rstrip("/") + "/")
                if inside and len(point) > best:
                    best, fstype = len(point), kind
    except OSError:
        return False
    return fstype in RAM_FILESYSTEMS


def _records_by_state(journal_directory: str) -> dict[str, int]:
    from qinglong_edge.worker.journal.view import JournalReader

    counts: dict[str, int] = {}
    if not os.path.lexists(journal_directory):
        return counts
    with JournalReader.open(journal_directory) as reader:
        for offer_id in reader.list_offers():
            record = reader.read_offer(offer_id)
            if record is not None:
                _bump(counts, str(record["state"]))
    return counts


def textfile(state: dict[str, Any], records: dict[str, int]) -> bytes:
    """The node_exporter textfile of ``state`` and the inbox ``records`` by state."""
    last = state.get("lastCycle") or {}
    families = [
        Family("qinglong_edge_pull_last_cycle_timestamp_seconds", "gauge", "When the last pull cycle ended.")
        .add(round(int(last.get("atMs", 0)) / 1000, 3)),
        Family("qinglong_edge_pull_last_cycle_exit_status", "gauge", "The last pull cycle's exit status (sysexits).")
        .add(int(last.get("exitStatus", 0))),
        Family("qinglong_edge_pull_last_cycle_success", "gauge", "1 when the last pull cycle exited 0.")
        .add(1 if int(last.get("exitStatus", 1)) == 0 and last else 0),
    ]
    cycles = Family("qinglong_edge_pull_cycles_total", "counter", "Pull cycles by status since the last reboot.")
    for status, n in sorted(state["cycles"].items()):
        cycles.add(int(n), (("status", status),))
    families.append(cycles)
    families.append(Family("qinglong_edge_pull_claims_total", "counter",
                           "Offers claimed (accepted or replayed) since the last reboot.").add(int(state["claims"])))
    inbox = Family("qinglong_edge_pull_inbox_records", "gauge", "Inbox records by state.")
    for record_state, n in sorted(records.items()):
        inbox.add(n, (("state", record_state),))
    families.append(inbox)
    failures = Family("qinglong_edge_pull_failures_total", "counter",
                      "Failed pull cycles by reason since the last reboot.")
    for reason, n in sorted(state["failuresByReason"].items()):
        failures.add(int(n), (("reason", reason),))
    families.append(failures)
    return render(families)


def _write_textfile(path: str, data: bytes) -> None:
    """Temp file beside ``path``, 0644 whatever the umask (the exporter is another user),
    then ``rename``; no fsync (RAM). Raises OSError (the temp file removed)."""
    filecheck.replace_file(path, data, mode=0o644, sync=False)


def record_cycle(worker: WorkerConfig, report: Any, exit_status: int, now_ms: int,
                 notice: Callable[[str], None] | None = None) -> None:
    """After one cycle: update ``cycles.json`` and the textfile (module docstring).

    Never raises for a storage problem (the cycle's outcome stands): a runtime directory
    or textfile that cannot be written is said through ``notice`` once per boot.
    """
    path = worker.metrics_textfile
    status, reason, detail = _facts(report)
    if path is None and reason is None:
        return  # an idle or successful cycle without metrics: nothing at all
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

    try:
        runtime = RuntimeDirectory.open(worker.runtime_directory, worker.journal_directory)
    except JournalError:
        return
    with runtime:
        state = read_cycles(runtime)
        state["lastCycle"] = {"atMs": now_ms, "status": status, "exitStatus": exit_status}
        _bump(state["cycles"], status)
        if status in ("accepted", "replayed"):
            state["claims"] = int(state["claims"]) + 1
        if reason is not None:
            _bump(state["failuresByReason"], reason)
            entry = {"atMs": now_ms, "reason": reason, "detail": detail}
            state["failures"] = [*state["failures"], entry][-MAX_FAILURES:]
        with contextlib.suppress(JournalError, StrictJsonError):
            runtime.write(CYCLES_NAME, dumps_bytes(state))
        if path is None:
            return
        problem = None
        if not in_ram(path):
            problem = "metrics_textfile_not_in_ram"
        else:
            try:
                records = report.inbox if report.inbox is not None else _records_by_state(worker.journal_directory)
                _write_textfile(path, textfile(state, records))
            except (OSError, JournalError):
                problem = "metrics_textfile_unavailable"
        if problem is not None and notice is not None:
            with contextlib.suppress(JournalError):
                if runtime.once_per_boot(problem):
                    where = "is not on a RAM file system (tmpfs): never written to flash" \
                        if problem == "metrics_textfile_not_in_ram" else "cannot be written"
                    notice(f"{problem}: worker.metricsTextfile {path} {where}")
