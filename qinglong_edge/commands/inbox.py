"""``qinglong-edge inbox list|show|discard``: look at and discard inbox records.

They read ``worker.journalDirectory`` of the configuration; ``list`` and ``show`` never
take the owner lock (records change only by atomic link/rename), so they work while a
``pull`` is resident (spec README "Operator commands while resident").

* ``list``: per record its offerId, state, runId, attemptId, acceptedAtMs, the job's
  exit code (from its receipt, or what the resident pull noted in the runtime
  directory once the receipt is deleted; none before the job ended or after a reboot),
  the log path and its size (none once deleted), whether it is in flight; then what
  fills the inbox (``capacity``: ``maximumEntries``, ``inFlight``, ``finished``): only
  records in flight count against ``worker.inboxMaximumEntries``, finished ones make room.
* ``show OFFER_ID``: the record with the lease token replaced by ``"[redacted]"`` (the
  record holds no secret otherwise: the callback token is only its digest), then one
  ``# exit code: ..; log: ..; in flight: ..`` line (with ``--json`` a ``local`` object:
  ``exitCode``, ``outcomeSource``, ``logPath``, ``logBytes``, ``inFlight``).
* ``log OFFER_ID [--max-bytes N] [--tail] [--follow]``: the remote job's log, raw bytes on
  stdout (``--json``: base64 in ``logBase64``); ``--follow`` reads it by offset as it
  grows until the job ended (its receipt exists, the record left flight or is gone).
* ``discard OFFER_ID --yes [--force]``: removes the record (and its log, receipt and
  truncation fact). A record in flight (a job may run, or its lease is live: the
  resident pull would still run it) is refused (``in_flight``, exit 75) unless
  ``--force``. While a pull owns the journal the command asks it (a request in the
  runtime directory plus SIGUSR1, :mod:`qinglong_edge.worker.remote.discard`): the owner stops
  the job (verified), reports the outcome to the cluster as any other (a completion,
  or a start failure before the launch), removes the record and answers; the command
  waits for that answer. With no pull running, ``--force`` stops the job itself (by its
  identity) and removes the record without telling the cluster (its lease runs out and
  the cluster retries the Run). Without ``--yes`` it refuses (exit 64).

Exit statuses: 0 done; 64 usage (bad offerId, missing ``--yes``); 65 ``not_found``;
73/74 storage; 75 ``in_flight``, ``already_owned`` (a pull holds the journal and did not
answer in time); 78 no worker configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from typing import TYPE_CHECKING, Any

from qinglong_edge.commands._output import emit, print_json

if TYPE_CHECKING:
    from qinglong_edge.config import WorkerConfig
    from qinglong_edge.contracts.records import InboxRecord

REDACTED = "[redacted]"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "inbox",
        parents=[common],
        help="list, show or discard accepted offers in the worker journal",
        description="Inspect the worker journal's inbox (offers/<offerId>.json).",
    )
    actions = parser.add_subparsers(dest="inbox_action", metavar="ACTION", parser_class=type(parser))
    listing = actions.add_parser("list", parents=[common], help="one line per inbox record")
    listing.set_defaults(handler=_list)
    show = actions.add_parser("show", parents=[common], help="print one record (lease token redacted)")
    show.add_argument("offer_id", metavar="OFFER_ID")
    show.set_defaults(handler=_show)
    log = actions.add_parser("log", parents=[common], help="print a remote job's log (raw bytes on stdout)")
    log.add_argument("offer_id", metavar="OFFER_ID")
    log.add_argument("--max-bytes", type=int, help="bytes shown, 1-67108864 (default: worker.maxLogBytes)")
    log.add_argument("--tail", action="store_true", help="the last --max-bytes bytes instead of the first")
    log.add_argument("--follow", action="store_true",
                     help="keep printing what the job writes until it ends (from the start, or the --tail window)")
    log.set_defaults(handler=_log)
    discard = actions.add_parser("discard", parents=[common], help="delete one record (needs --yes)")
    discard.add_argument("offer_id", metavar="OFFER_ID")
    discard.add_argument("--yes", action="store_true", help="really delete it")
    discard.add_argument("--force", action="store_true",
                         help="also a record in flight: its job is stopped first (by the resident pull if one runs)")
    discard.set_defaults(handler=_discard)
    parser.set_defaults(handler=_usage)


def _usage(args: argparse.Namespace) -> int:
    from qinglong_edge.errors import UsageError

    raise UsageError("inbox needs an action: list, show OFFER_ID, log OFFER_ID or discard OFFER_ID --yes")


def _worker_config(args: argparse.Namespace) -> WorkerConfig:
    from qinglong_edge.config import load_config
    from qinglong_edge.errors import ConfigError

    config = load_config(args.config)
    if config.worker is None:
        raise ConfigError("the configuration has no worker section (no journal)", path="$.worker")
    return config.worker


def _check_offer_id(offer_id: str) -> str:
    from qinglong_edge.contracts.ids import JOURNAL_OFFER_ID
    from qinglong_edge.errors import UsageError

    if JOURNAL_OFFER_ID.fullmatch(offer_id) is None:
        raise UsageError("OFFER_ID must match [A-Za-z0-9._:-]{1,128}")
    return offer_id


def _read_record(root: str, offer_id: str) -> InboxRecord | None:
    """The inbox record of ``offer_id`` (a dict), or None: no such record, or no journal."""
    from qinglong_edge.worker.journal.store import JournalReader

    if not os.path.lexists(root):
        return None
    with JournalReader.open(root) as reader:
        return reader.read_offer(offer_id)


def _existing_record(root: str, offer_id: str) -> InboxRecord:
    """:func:`_read_record`, or ``not_found``."""
    record = _read_record(root, offer_id)
    if record is None:
        raise _not_found(offer_id)
    return record


def _not_found(offer_id: str) -> Exception:
    from qinglong_edge.errors import EdgeError

    return EdgeError(f"no inbox record {offer_id}", code="not_found")


def _record_document(record: InboxRecord) -> dict[str, Any]:
    """The record as JSON, lease token redacted (never print a capability)."""
    from qinglong_edge.contracts.journal_records import inbox_record_bytes

    document: dict[str, Any] = json.loads(inbox_record_bytes(record))
    offer = document.get("offer")
    if isinstance(offer, dict) and "leaseToken" in offer:
        offer["leaseToken"] = REDACTED
    return document


def _local(worker: WorkerConfig, record: InboxRecord, runtime: Any) -> dict[str, Any]:
    """What this device knows about a record beyond it: exit code, log, in flight."""
    from qinglong_edge.contracts.receipt import parse_receipt
    from qinglong_edge.contracts.strictjson import loads
    from qinglong_edge.worker.delivery.cluster_clock import estimated_cluster_now
    from qinglong_edge.worker.remote.job_files import in_flight, outcome_name, worker_record_files

    files = worker_record_files(worker, record)
    out: dict[str, Any] = {"exitCode": None, "outcomeSource": None, "logPath": None, "logBytes": None,
                           "inFlight": in_flight(record, estimated_cluster_now(worker.runtime_directory,
                                                                               worker.journal_directory))}
    if files is None:
        return out
    out["logPath"] = files.log_path
    try:
        out["logBytes"] = os.lstat(files.log_path).st_size
    except OSError:
        out["logBytes"] = None
    from qinglong_edge.errors import EdgeError
    from qinglong_edge.process.logs import read_receipt

    with contextlib.suppress(EdgeError, OSError):  # an unreadable receipt shows no exit code
        data = read_receipt(files.receipt_path)
        if data is not None:
            out["exitCode"], out["outcomeSource"] = parse_receipt(data).exit_code, "receipt"
            return out
    if runtime is not None:
        with contextlib.suppress(EdgeError, OSError):
            note = runtime.read(outcome_name(record["offer"]["offerId"]))
            value = loads(note, max_bytes=4096, min_bytes=2) if note is not None else None
            if isinstance(value, dict) and isinstance(value.get("exitCode"), int):
                out["exitCode"], out["outcomeSource"] = value["exitCode"], value.get("source")
    return out


def _runtime(worker: WorkerConfig) -> Any:
    from qinglong_edge.errors import JournalError
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

    try:
        return RuntimeDirectory.open(worker.runtime_directory, worker.journal_directory)
    except JournalError:
        return None


def _list(args: argparse.Namespace) -> int:
    from qinglong_edge.worker.journal.store import JournalReader

    worker = _worker_config(args)
    root = worker.journal_directory
    rows: list[dict[str, Any]] = []
    if os.path.lexists(root):
        runtime = _runtime(worker)
        try:
            with JournalReader.open(root) as reader:
                for offer_id in reader.list_offers():
                    record = reader.read_offer(offer_id)
                    if record is None:  # discarded between the listing and the read
                        continue
                    local = _local(worker, record, runtime)
                    rows.append({
                        "offerId": offer_id,
                        "state": record["state"],
                        "runId": record["offer"]["candidate"]["runId"],
                        "attemptId": record["offer"]["candidate"]["attemptId"],
                        "acceptedAtMs": record["acceptedAtMs"],
                        **({"recoveryReason": record["recoveryReason"]} if "recoveryReason" in record else {}),
                        "exitCode": local["exitCode"],
                        "logPath": local["logPath"] if local["logBytes"] is not None else None,
                        "logBytes": local["logBytes"],
                        "inFlight": local["inFlight"],
                    })
        finally:
            if runtime is not None:
                runtime.close()
    busy = sum(1 for row in rows if row["inFlight"])
    capacity = {"maximumEntries": worker.inbox_maximum_entries, "inFlight": busy, "finished": len(rows) - busy}
    if args.json:
        print_json({"ok": True, "offers": rows, "capacity": capacity})
        return 0
    if not rows:
        print("inbox: empty")
        return 0
    header = ("OFFER_ID", "STATE", "RUN_ID", "ATTEMPT_ID", "EXIT", "LOG_BYTES", "LOG")
    table = [header] + [(r["offerId"], r["state"] + (f"({r['recoveryReason']})" if "recoveryReason" in r else ""),
                         r["runId"], r["attemptId"], "-" if r["exitCode"] is None else str(r["exitCode"]),
                         "-" if r["logBytes"] is None else str(r["logBytes"]), r["logPath"] or "-") for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    print(capacity_line(len(rows), capacity))
    return 0


def capacity_line(records: int, capacity: dict[str, int]) -> str:
    """What fills the inbox (issue 23): only records that need this device count against
    ``worker.inboxMaximumEntries``; finished ones make room, the oldest first."""
    cap, busy, done = capacity["maximumEntries"], capacity["inFlight"], capacity["finished"]
    line = f"inbox: {records} records of {cap}: {busy} need this device, {done} finished"
    if busy >= cap:
        return line + ("; full: no claim is made until one of them ends (each is driven by the resident pull; "
                       "`inbox discard OFFER_ID --yes --force` gives one up)")
    if done:
        line += "; the oldest finished record goes when room is needed (else after worker.inboxRetentionMs)"
    return line


def _show(args: argparse.Namespace) -> int:
    offer_id = _check_offer_id(args.offer_id)
    worker = _worker_config(args)
    record = _existing_record(worker.journal_directory, offer_id)
    document = _record_document(record)
    runtime = _runtime(worker)
    try:
        local = _local(worker, record, runtime)
    finally:
        if runtime is not None:
            runtime.close()
    if args.json:
        print_json({"ok": True, "record": document, "local": local})
    else:
        print(json.dumps(document, indent=2, ensure_ascii=False))
        exit_code = "none yet" if local["exitCode"] is None else f"{local['exitCode']} ({local['outcomeSource']})"
        log = "none" if local["logBytes"] is None else f"{local['logPath']} ({local['logBytes']} bytes)"
        print(f"# exit code: {exit_code}; log: {log}; in flight: {'yes' if local['inFlight'] else 'no'}")
    return 0


def _log(args: argparse.Namespace) -> int:
    """``inbox log OFFER_ID [--max-bytes N] [--tail] [--follow]``: the remote job's log as
    stored (the head the cap kept), or as it grows until the job ends (``--follow``:
    until its receipt exists, the record is no longer in flight, or the record is gone)."""
    import sys
    import time

    from qinglong_edge.commands._follow import follow_log
    from qinglong_edge.errors import EdgeError, UsageError
    from qinglong_edge.worker.remote.job_files import in_flight, worker_record_files

    offer_id = _check_offer_id(args.offer_id)
    worker = _worker_config(args)
    limit = args.max_bytes if args.max_bytes is not None else worker.max_log_bytes
    if not 1 <= limit <= 64 * 1024 * 1024:
        raise UsageError("--max-bytes must be 1-67108864")
    if args.follow and args.json:
        raise UsageError("--follow prints raw bytes as they come; it takes no --json")
    root = worker.journal_directory

    first = _existing_record(root, offer_id)
    files = worker_record_files(worker, first)
    if files is None:
        raise EdgeError(f"inbox record {offer_id} names no log", code="not_found")
    if not args.follow:
        from qinglong_edge.local.run_logs import read_log

        if not os.path.lexists(files.log_path):
            raise EdgeError(f"inbox record {offer_id} has no log (the job has not started, or its log "
                            "was removed with the record's files)", code="not_found")
        data, size = read_log(files.log_path, limit, tail=args.tail)
        if args.json:
            import base64

            print_json({"ok": True, "offerId": offer_id, "path": files.log_path, "bytes": size, "shown": len(data),
                        "truncated": size > len(data), "tail": bool(args.tail),
                        "logBase64": base64.b64encode(data).decode("ascii")})
            return 0
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0

    def ended() -> bool:
        current = _read_record(root, offer_id)
        if current is None or os.path.lexists(files.receipt_path):
            return True
        return not in_flight(current, time.time_ns() // 1_000_000)

    start = 0
    if args.tail:
        with contextlib.suppress(OSError):
            start = max(0, os.stat(files.log_path).st_size - limit)
    follow_log(lambda: files.log_path, ended, sys.stdout.buffer, start=start)
    return 0


def _discard(args: argparse.Namespace) -> int:
    from qinglong_edge.config import load_config
    from qinglong_edge.contracts.residency import PRE_LAUNCH_STATES, lease_expired_locally
    from qinglong_edge.errors import EdgeError, JournalError, UsageError
    from qinglong_edge.worker.delivery.cluster_clock import estimated_cluster_now
    from qinglong_edge.worker.remote.job_files import in_flight

    offer_id = _check_offer_id(args.offer_id)
    if not args.yes:
        raise UsageError(f"discard deletes {offer_id} for good; add --yes to confirm")
    config = load_config(args.config)
    worker = _worker_config(args)
    root = worker.journal_directory
    try:
        record = _existing_record(root, offer_id)
    except JournalError as exc:
        if exc.code != "unsafe_storage" or not args.force:
            raise
        return _discard_damaged(args, worker, offer_id)
    now = estimated_cluster_now(worker.runtime_directory, root)  # the lease's own clock (clock.json), else wall
    busy = in_flight(record, now) and not (
        record["state"] in PRE_LAUNCH_STATES and lease_expired_locally(record["offer"]["lease"], now))
    if busy and not args.force:
        raise EdgeError(f"{offer_id} is in flight (state {record['state']}: its job may run, or its lease is live "
                        "and the pull would run it); the pull finishes it on its own; --force stops it and "
                        "discards it", code="in_flight")
    owner_result = _ask_owner(worker, offer_id, config)
    if owner_result is not None:
        text = f"inbox: discarded {offer_id} (was {owner_result.get('state')}" + (
            f", exit code {owner_result['exitCode']})" if owner_result.get("exitCode") is not None else ")")
        emit(args.json, text, {"ok": True, "discarded": offer_id, "by": "resident", **{
            k: owner_result.get(k) for k in ("state", "exitCode")}})
        return 0
    stopped = _discard_here(config, offer_id, busy)
    emit(args.json, f"inbox: discarded {offer_id}" + (f" (its job: {stopped})" if stopped else ""),
         {"ok": True, "discarded": offer_id, **({"stop": stopped} if stopped else {})})
    return 0


def _discard_damaged(args: argparse.Namespace, worker: WorkerConfig, offer_id: str) -> int:
    """``--force`` on a record that cannot be read (truncated, garbage, a wrong mode): take
    the lock (a pull that holds it: ``already_owned``), remove the file and what the runtime
    directory keeps by its offerId. Its log and receipt cannot be located without it; a job
    it started is no longer renewed and its wrapper stops it when its lease ends."""
    from qinglong_edge.worker.journal.store import Journal, JournalOptions

    with Journal.open(worker.journal_directory, JournalOptions.from_config(worker)) as journal:
        journal.discard_offer(offer_id)
        _forget_runtime(worker, offer_id)
    emit(args.json, f"inbox: discarded {offer_id} (a damaged record: a job it started stops when its lease ends)",
         {"ok": True, "discarded": offer_id, "damaged": True})
    return 0


def _forget_runtime(worker: WorkerConfig, offer_id: str) -> None:
    """Remove a discarded record's lease file, stop mark and outcome note (RAM)."""
    from qinglong_edge.errors import JournalError
    from qinglong_edge.worker.remote.job_files import outcome_name
    from qinglong_edge.worker.remote.lease import remove_job_lease

    runtime = _runtime(worker)
    if runtime is None:
        return
    try:
        remove_job_lease(runtime, offer_id)
        runtime.remove(outcome_name(offer_id))
    except JournalError:
        pass  # RAM only: a reboot forgets them
    finally:
        runtime.close()


def _ask_owner(worker: WorkerConfig, offer_id: str, config: Any) -> dict[str, Any] | None:
    """While a pull owns the journal: ask it (request + SIGUSR1) and wait for its answer."""
    import time

    from qinglong_edge.errors import EdgeError, JournalError
    from qinglong_edge.worker.journal.ownerlock import lock_holder
    from qinglong_edge.worker.remote.discard import read_result, resident_owner, signal_owner, write_request
    from qinglong_edge.worker.remote.job_files import remote_limits

    runtime = _runtime(worker)
    if runtime is None:
        return None
    try:
        held, holder = lock_holder(worker.journal_directory, runtime)
        if not held:
            return None  # nobody owns it: this command takes the lock itself
        owner = resident_owner(runtime, holder)
        if owner is None:
            raise EdgeError("another process holds the journal (a pull cycle, admin prune) and serves no "
                            "discard requests: try again in a moment", code="already_owned")
        request_id = write_request(runtime, offer_id, time.time_ns() // 1_000_000)
        if not signal_owner(owner):
            return None
        limits = remote_limits(config)
        budget = (limits.terminate_grace_ms + limits.kill_grace_ms + 4 * worker.request_timeout_ms + 5000) / 1000
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline:
            result = read_result(runtime, offer_id, request_id)
            if result is not None:
                if not result.get("discarded"):
                    raise _not_found(offer_id)
                return result
            time.sleep(0.05)
        raise EdgeError(f"the pull that owns the journal (pid {owner.pid}) did not answer within {budget:.0f} s; "
                        "the request stays in its runtime directory and is served when it can", code="already_owned")
    except JournalError:
        return None
    finally:
        runtime.close()


def _discard_here(config: Any, offer_id: str, busy: bool) -> str | None:
    """No owner: take the lock, stop the record's job by its identity if it may run,
    remove its files and the record. Returns the stop's status, if one was needed."""
    from qinglong_edge.worker.journal.store import Journal, JournalOptions
    from qinglong_edge.worker.remote.job_files import record_files, remote_limits, remove_job_files

    worker = config.worker
    limits = remote_limits(config)
    stopped = None
    with Journal.open(worker.journal_directory, JournalOptions.from_config(worker)) as journal:
        record = journal.read_offer(offer_id)
        if record is None:
            raise _not_found(offer_id)
        handle = record.get("executorHandle")
        if busy and isinstance(handle, str):
            from qinglong_edge.process.cgroups import CgroupManager
            from qinglong_edge.worker.remote.job import adopt, stop_job

            cgroups = CgroupManager.detect(limits.cgroups, memory_max=limits.max_run_memory_bytes)  # its leaf too
            job = adopt(handle, cgroups if cgroups.available else None, record["offer"]["candidate"]["attemptId"])
            if job is not None:
                result = stop_job(job, limits)
                stopped = result.status + (f" ({result.signal})" if result.signal else "")
                job.finish(limits)
        files = record_files(limits, record)
        if files is not None:
            remove_job_files(files)
        journal.discard_offer(offer_id)
        _forget_runtime(worker, offer_id)
    return stopped
