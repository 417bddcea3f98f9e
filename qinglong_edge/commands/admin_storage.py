"""``admin prune`` and ``admin runs log``: the storage caps and the Local Run logs (issue 16).

::

    admin prune                                    prune every store to its cap now, say what went
    admin runs log RUN_ID [--attempt N] [--max-bytes N] [--tail] [--follow]
                                                   print a Run's log (raw bytes on stdout)

``admin prune`` runs the same bounded steps as ``serve``
(:class:`qinglong_edge.local.retention.Pruner`) until every cap holds, safe while
``serve`` runs (each step is one SQLite transaction; rows go before files). With a
``worker`` section it also prunes the journal: terminal inbox records past
``inboxRetentionMs``, the oldest terminal one when the inbox files fill
``inboxMaximumEntries`` (so the next claim has room, as a pull would make it), and
abandoned claims beyond ``abandonedMaximumEntries`` (skipped, and said so, while a
``pull`` owns the journal). Exit 0; 74 when the store fails.

``admin runs log`` prints the log of the Run's latest attempt (or ``--attempt N``):
the first ``--max-bytes`` bytes (default: ``execution.maxLogBytes``, else 1 MiB; at most
64 MiB), or the last ones with ``--tail``, exactly as stored. Exit 65 ``run_not_found``
for an unknown Run, 65 ``not_found`` when the attempt has no log (it never started, or
its log was pruned by ``maxTotalLogBytes``). ``--json`` prints one line with the bytes
in base64 (``logBase64``). ``--follow`` keeps printing what the attempt writes, read by
offset (:mod:`qinglong_edge.commands._follow`), until the Run and its attempt are
terminal; with ``--tail`` it starts at the last ``--max-bytes`` bytes; it takes no
``--json``. Ctrl-C stops it (130).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from qinglong_edge.commands._output import print_json

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from qinglong_edge.contracts.records import InboxRecord

MAX_SHOWN_BYTES = 64 * 1024 * 1024
DEFAULT_SHOWN_BYTES = 1024 * 1024


def register(groups: Any, runs: Any, common: argparse.ArgumentParser) -> None:
    """Add ``admin prune`` to ``groups`` and ``admin runs log`` to ``runs``."""
    prune = groups.add_parser(
        "prune", parents=[common], help="prune the audit, Runs, logs and journal to their caps now",
        description="Delete what the storage caps no longer keep (oldest first) and say what was removed.",
    )
    prune.set_defaults(handler=_prune)
    log = runs.add_parser("log", parents=[common], help="print a Run's log (raw bytes on stdout)")
    log.add_argument("run_id", metavar="RUN_ID")
    log.add_argument("--attempt", type=int, help="attempt number (default: the latest)")
    log.add_argument("--max-bytes", type=int, help="bytes shown, 1-67108864 (default: execution.maxLogBytes)")
    log.add_argument("--tail", action="store_true", help="the last --max-bytes bytes instead of the first")
    log.add_argument("--follow", action="store_true",
                     help="keep printing what the Run writes until it ends (from the start, or the --tail window)")
    log.set_defaults(handler=_runs_log)


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def _prune_journal(config: Any) -> dict[str, Any]:
    from qinglong_edge.errors import JournalError
    from qinglong_edge.local.store import now_ms
    from qinglong_edge.worker.journal.store import Journal, JournalOptions

    worker = config.worker
    try:
        journal = Journal.open(worker.journal_directory, JournalOptions.from_config(worker))
    except JournalError as exc:
        if exc.code == "already_owned":
            return {"skipped": "a pull owns the journal (it prunes it every cycle)"}
        raise
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory
    from qinglong_edge.worker.remote.job_files import (
        in_flight,
        outcome_name,
        process_gone,
        remove_job_files,
        worker_record_files,
    )

    try:
        runtime: RuntimeDirectory | None = RuntimeDirectory.open(worker.runtime_directory, worker.journal_directory)
    except JournalError:
        runtime = None

    def remove_files(record: InboxRecord) -> None:  # the remote run's log, receipt, fact, outcome note
        files = worker_record_files(worker, record)
        if files is not None:
            remove_job_files(files)
        if runtime is not None:
            try:
                runtime.remove(outcome_name(record["offer"]["offerId"]))
            except JournalError:
                pass  # RAM: a reboot forgets it

    try:
        with journal:
            now = now_ms()
            kept: list[InboxRecord] = []
            inbox = journal.prune_inbox(now, process_gone=process_gone, remove_files=remove_files, kept=kept)
            # Issue 23: an inbox that finished records fill gets one entry free now, as the next
            # pull would make it (the oldest finished first); records in flight are never touched.
            inbox += journal.make_room(lambda r: not in_flight(r, now), remove_files=remove_files, records=kept)
            abandoned = journal.prune_abandoned()
            left = len(journal.list_offers())
    finally:
        if runtime is not None:
            runtime.close()
    return {"inboxRecords": inbox, "abandonedClaims": abandoned, "inboxLeft": left}


def _prune(args: argparse.Namespace) -> int:
    from qinglong_edge.config import load_config
    from qinglong_edge.errors import ConfigError

    config = load_config(args.config)
    if config.local_api is None and config.worker is None:
        raise ConfigError("the configuration has neither a localApi nor a worker section", path="$")
    out: dict[str, Any] = {"ok": True}
    lines = []
    if config.local_api is not None:
        from qinglong_edge.local.retention import Pruner, RetentionCaps, measure_store
        from qinglong_edge.local.store import Store

        local = config.local_api
        caps = RetentionCaps.from_config(config)
        with Store.open(local.database_file, profile=config.profile, busy_timeout_ms=local.busy_timeout_ms) as store:
            pruner = Pruner(store, caps)
            report = pruner.run()
            usage = store.run(measure_store)
            scan = pruner.log_scan()
        removed = report.to_json()
        out["store"] = removed
        out["usage"] = {**usage.to_json(), "logBytes": None if scan is None else scan.total_bytes,
                        "logFiles": None if scan is None else scan.logs}
        by = ", ".join(f"{k} {v}" for k, v in removed["runsBy"].items())
        audit_by = ", ".join(f"{k} {v}" for k, v in removed["auditRowsBy"].items())
        lines.append(
            f"pruned: {removed['auditRows']} audit rows" + (f" ({audit_by})" if audit_by else "")
            + f", {removed['runs']} Runs with their attempts, events and step runs" + (f" ({by})" if by else "")
            + f", {removed['logs']} logs of kept Runs, {removed['orphanFiles']} orphan log files,"
            f" {_mib(removed['logBytes'])} of log files, {removed['vacuumPages']} free pages returned"
            f" ({removed['steps']} steps, longest {removed['maxStepMs']:.1f} ms)"
        )
        lines.append(
            f"now: database {_mib(usage.used_bytes)} used of {_mib(caps.database_maximum_bytes)}"
            f" (file {_mib(usage.file_bytes)}); audit {usage.audit_rows} of {caps.audit_maximum_entries} rows;"
            f" terminal Runs {usage.terminal_runs} of {caps.run_maximum_entries} ({usage.runs} in all)"
            + ("" if scan is None or caps.max_total_log_bytes is None
               else f"; logs {_mib(scan.total_bytes)} of {_mib(caps.max_total_log_bytes)} in {scan.logs} files")
        )
        if removed["unremovedFiles"]:
            lines.append(f"warning: {removed['unremovedFiles']} log files could not be removed (see above)")
        if removed["pinnedRuns"]:
            lines.append(f"kept: {removed['pinnedRuns']} terminal Runs another Run refers to")
    if config.worker is not None:
        journal = _prune_journal(config)
        out["journal"] = journal
        if "skipped" in journal:
            lines.append(f"journal: skipped: {journal['skipped']}")
        else:
            lines.append(f"journal: {len(journal['inboxRecords'])} terminal inbox records removed (past retention,"
                         " or the oldest to free an entry of a full inbox),"
                         f" {len(journal['abandonedClaims'])} abandoned claims beyond the bound removed;"
                         f" {journal['inboxLeft']} inbox records left")
    if args.json:
        print_json(out)
    else:
        print("\n".join(lines))
    return 0


def _runs_log(args: argparse.Namespace) -> int:
    from qinglong_edge.config import load_config
    from qinglong_edge.contracts.ids import API_ID
    from qinglong_edge.errors import ConfigError, EdgeError, UsageError
    from qinglong_edge.local.run_logs import attempt_log_path, read_log
    from qinglong_edge.local.runs import RunNotFound
    from qinglong_edge.local.store import Store

    config = load_config(args.config)
    local = config.local_api
    if local is None:
        raise ConfigError("the configuration has no localApi section", path="$.localApi")
    if API_ID.fullmatch(args.run_id) is None:
        raise UsageError("RUN_ID must match [A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
    execution = config.execution
    limit = args.max_bytes if args.max_bytes is not None else (
        execution.max_log_bytes if execution is not None else DEFAULT_SHOWN_BYTES)
    if not 1 <= limit <= MAX_SHOWN_BYTES:
        raise UsageError(f"--max-bytes must be 1-{MAX_SHOWN_BYTES}")
    if args.attempt is not None and not 1 <= args.attempt <= 2**31 - 1:
        raise UsageError("--attempt must be 1-2147483647")
    directory = execution.log_directory if execution is not None else os.path.join(config.state_directory, "logs")
    if args.follow:
        if args.json:
            raise UsageError("--follow prints raw bytes as they come; it takes no --json")
        return _follow_run(args, local, config.profile, directory, limit)
    with Store.open(local.database_file, profile=config.profile, busy_timeout_ms=local.busy_timeout_ms) as store:
        rows = store.run(lambda c: c.execute(
            'SELECT a.id, a.attempt, a.log_artifact_id, a.started_at_ms FROM "Runs" AS r'
            ' LEFT JOIN "RunAttempts" AS a ON a.run_id = r.id WHERE r.id = ? ORDER BY a.attempt DESC',
            (args.run_id,),
        ).fetchall())
    if not rows:
        raise RunNotFound(f"run {args.run_id} not found")
    attempts = [row for row in rows if row[0] is not None]
    chosen = next((row for row in attempts if args.attempt in (None, row[1])), None)
    if chosen is None:
        which = "no attempt" if args.attempt is None else f"no attempt {args.attempt}"
        raise EdgeError(f"run {args.run_id} has {which}", code="not_found")
    attempt_id, number, artifact, started = chosen
    path = None if artifact is None else attempt_log_path(directory, args.run_id, attempt_id, artifact)
    if path is None:
        if artifact is None:
            why = "it never started" if started is None else "its log was pruned (execution.maxTotalLogBytes)"
        else:
            why = f"no log file in {directory} (another logDirectory, or the launch failed before creating it)"
        raise EdgeError(f"run {args.run_id} attempt {number} has no log: {why}", code="not_found")
    try:
        data, size = read_log(path, limit, tail=args.tail)
    except EdgeError as exc:
        raise EdgeError(f"run {args.run_id} attempt {number}: {exc.message}", code="not_found") from None
    cut = size > len(data)
    if args.json:
        import base64

        print_json({"ok": True, "runId": args.run_id, "attemptId": attempt_id, "attempt": number, "path": path,
                    "bytes": size, "shown": len(data), "truncated": cut, "tail": bool(args.tail),
                    "logBase64": base64.b64encode(data).decode("ascii")})
        return 0
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    if cut:
        where = "last" if args.tail else "first"
        sys.stderr.write(f"qinglong-edge: showed the {where} {len(data)} of {size} bytes (--max-bytes, --tail)\n")
    return 0


def _follow_run(args: argparse.Namespace, local: Any, profile: str, directory: str, limit: int) -> int:
    """``admin runs log --follow``: the attempt's log as it grows, until the Run and the
    attempt are terminal (:func:`qinglong_edge.commands._follow.follow_log`)."""
    from qinglong_edge.commands._follow import follow_log
    from qinglong_edge.errors import EdgeError
    from qinglong_edge.local.log_read import ACTIVE_ATTEMPT_STATUSES
    from qinglong_edge.local.run_logs import attempt_log_path
    from qinglong_edge.local.runs import RunNotFound
    from qinglong_edge.local.store import Store

    with Store.open(local.database_file, profile=profile, busy_timeout_ms=local.busy_timeout_ms) as store:
        def attempt() -> tuple[str, str, str | None, str] | None:
            """(run status, attempt id, log_artifact_id, attempt status) of the chosen attempt."""
            rows = store.run(lambda c: c.execute(
                'SELECT r.status, a.id, a.attempt, a.log_artifact_id, a.status FROM "Runs" AS r'
                ' LEFT JOIN "RunAttempts" AS a ON a.run_id = r.id WHERE r.id = ? ORDER BY a.attempt DESC',
                (args.run_id,)).fetchall())
            if not rows:
                raise RunNotFound(f"run {args.run_id} not found")
            for status, attempt_id, number, artifact, attempt_status in rows:
                if attempt_id is not None and args.attempt in (None, number):
                    return str(status), str(attempt_id), artifact, str(attempt_status)
            if args.attempt is not None:
                raise EdgeError(f"run {args.run_id} has no attempt {args.attempt}", code="not_found")
            return None

        first = attempt()

        def path() -> str | None:
            now = attempt()
            return None if now is None else attempt_log_path(directory, args.run_id, now[1], now[2])

        def ended() -> bool:
            now = attempt()
            return now is not None and now[0] in TERMINAL and now[3] not in ACTIVE_ATTEMPT_STATUSES

        start = 0
        if args.tail and first is not None:
            found = attempt_log_path(directory, args.run_id, first[1], first[2])
            size = os.stat(found).st_size if found is not None else 0
            start = max(0, size - limit)
        follow_log(path, ended, sys.stdout.buffer, start=start)
        final = attempt()
    if final is not None:
        sys.stderr.write(f"qinglong-edge: run {args.run_id} {final[0]} (attempt {final[3]})\n")
    return 0


#: Run statuses after which nothing more is written (execution control's set, with lost).
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost"})
