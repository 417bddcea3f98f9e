"""``qinglong-edge pull [--duration S] [--json] [--no-splay]``: the Remote Worker's cron job.

One cycle (or cycles at the profile cadence for ``--duration`` seconds): keep the
Worker Session alive, then one offer pull step (ADR-0110; see
:mod:`qinglong_edge.worker.cycle`). When a record is in flight afterwards (an offer
accepted, a job left running by an earlier pull), the same process stays resident and
executes it to its end (:mod:`qinglong_edge.worker.remote.resident`), then exits. Before its
splay it checks the owner lock: a live owner (a resident pull) makes it exit 0 at once
(``busy``). Exit statuses (spec README, sysexits):

=====  =====================================================================
0      accepted, replayed, idle, backoff not yet due, no slot free (``no_slot``:
       every one holds a record in flight), another pull holds the journal (cron
       overlap or a resident pull: "busy"), or SIGTERM/SIGINT/SIGHUP to a resident
       pull (persisted; its jobs go on and the next pull re-adopts them; its summary says
       how long their leases have left and what to run)
73/74  the journal's storage is unsafe / unavailable (the claim is intact)
75     temporary: cluster unavailable or invalid response (claim kept, retried
       with backoff), claim abandoned (reported, a new claim next cycle), inbox
       full (no claim made), clock not set, or aborted by SIGTERM/SIGINT/SIGHUP
77     the cluster rejected the worker credential (401/403 on a session call or
       on the offer pull; the claim is kept and backs off)
78     configuration, including unreadable credential/certificate/key files, a bad
       capabilities file (``invalid_capabilities``: one line naming the file, the key
       ``worker.capabilitiesFile`` and the key inside it; checked before any network
       call, and also when a resident pull holds the journal, which keeps the
       advertisement it started with), and
       ``unsupported_architecture``: QingLong cannot place work on this machine
       (mips...). Said in one line once per boot (remembered in the runtime
       directory), then quietly (``--json`` still prints its line); and
       ``identity_conflict``: another device uses this worker id (a cloned SD card):
       no session call and no claim for 10 minutes
       (:mod:`qinglong_edge.worker.delivery.identity_guard`)
=====  =====================================================================

Failures also go to stderr, once per distinct failure per hour with their remedy, where
cron's logger and the pull unit's journal listen (:mod:`qinglong_edge.worker.delivery.failure_log`).

Splay: before anything else (before the TLS client is even imported), the cycle waits
for this device's stable phase in the minute (``worker.splayMaxMs``,
:func:`qinglong_edge.worker.delivery.pacing.splay_delay_ms`); ``--no-splay`` skips it. On a
terminal it says how long it waits.

Device: every ``--json`` line carries ``device`` (``machine``, ``architecture``,
``supportTier``); the human line names them when a session is registered, and an idle
``no_match`` on a device whose tier is not ``tier1`` says that only tasks whose
placement lists that tier get offers (offer-delivery.md 5.1).

Warnings (the client certificate expires within 14 days: once a day) go to stderr as
``pull: warning: <code>: ...``, so cron's log gets them (the OpenWrt crontab logs
stderr).

With ``--duration`` the status is the last cycle's (a ``credential_rejected`` cycle
ends the loop at once).

SIGTERM/SIGINT/SIGHUP: a request in flight is aborted at once; a journal write in progress
finishes first; no new request starts. The pending claim stays, with the attempt's
marker in the runtime directory, so the next cycle counts that attempt (its outcome
is unknown) and replays the same offerId and token; the cluster answers
``lease_recovery`` if it had committed (field lessons 1). Exit 75.

``--json`` prints one compact JSON object per cycle, one line each::

    {"device":{"machine":"aarch64","architecture":"arm64","supportTier":"tier1"},
     "session":{"action":"registered|heartbeat|current|stale","sessionId":..,
                "generation":..,"version":..,"detail"?:"capabilities_changed|session_fenced|.."},
     "status":"accepted|replayed|idle|backoff|inbox_full|abandoned|unavailable|
               invalid_response|credential_rejected",
     "offerId":..,"runId":..,"reason":..,"nextAttemptAtMs":..,"httpStatus":..,
     "retryAfterMs":..,"attemptCount":..,"clusterCode":..,"counted":..,"stats":{..},"remedy":..}
                                                     (absent keys: not applicable)
    {"status":"failed","code":"credential_rejected|session_unavailable|..","reason":..,
     "detail":..,"remedy":..}

A failure caused by the transport names its typed ``reason`` (``certificate_expired``,
``dns_failure``...: :data:`qinglong_edge.errors.TRANSPORT_REASONS`) and its one-line
``remedy``; the human line ends with ``-> remedy``. ``counted`` says whether a failed
attempt counted toward the budget of 16 (False: it never reached the cluster);
``clusterCode`` is the cluster's ``{"code":...}`` of a non-200 answer.
    {"status":"busy","code":"already_owned"}
    {"status":"released","pid":N|null}           (``--release``: the holder exited, or none)
    {"status":"aborted","signal":"SIGTERM"}

A resident pull adds one line per record event
(:class:`~qinglong_edge.worker.remote.runner_state.RecordEvent`: ``{"event":..,"offerId":..,
"runId":..,"attemptId":..,"state":..,...}``) and, at its end, one summary line
(:class:`~qinglong_edge.worker.remote.resident.ResidentSummary`: ``{"event":"summary",
"residentMs":..,"events":..,"records":{state: count},"inFlight":..,"aborted"?:..,
"exitStatus":..}``); the human output prints each event but the routine renewals.
SIGUSR1 only wakes a resident pull (a forced ``inbox discard``).
"""

from __future__ import annotations

import os
import signal
import sys
from types import SimpleNamespace

from qinglong_edge.commands._output import print_json

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from types import FrameType

    from qinglong_edge.config import WorkerConfig
    from qinglong_edge.errors import EdgeError
    from qinglong_edge.worker.delivery.failure_log import FailureLog

_EXIT_BY_STATUS = {
    "accepted": 0,
    "replayed": 0,
    "idle": 0,
    "backoff": 0,
    "no_slot": 0,
    "inbox_full": 75,
    "abandoned": 75,
    "unavailable": 75,
    "invalid_response": 75,
    "credential_rejected": 77,
}
_EXIT_BY_ERROR = {
    "credential_rejected": 77,
    "identity_conflict": 78,
    "unsupported_architecture": 78,
    "credentials_unavailable": 78,
    "invalid_configuration": 78,
}
#: Remembered once per boot in the runtime directory.
_ARCH_NOTICE = "unsupported-architecture"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "pull",
        parents=[common],
        help="keep the Worker Session alive and pull one offer (cron job)",
        description="Keep the Worker Session alive (register/heartbeat), then pull work from the "
        "cluster without ever losing or duplicating an offer (ADR-0110).",
    )
    parser.add_argument(
        "--duration",
        metavar="S",
        type=float,
        default=None,
        help="repeat cycles in the foreground at the profile cadence for S seconds (0 < S <= 86400)",
    )
    parser.add_argument("--no-splay", action="store_true",
                        help="start at once instead of at this device's phase in the minute (worker.splayMaxMs)")
    parser.add_argument("--release", action="store_true",
                        help="no cycle: ask the pull that holds the journal to exit now (SIGTERM; a resident "
                        "pull's jobs go on and the next pull re-adopts them) and wait for it; the package's "
                        "prerm runs this before an upgrade or removal")
    parser.set_defaults(handler=_run)


#: The options :func:`plain_args` reads: cli.build_parser's global ones (on either side of
#: ``pull``) and :func:`register`'s (after it). Any change to either must change this too
#: (tests/cli/test_pull_plain_args.py compares the two parsers).
_GLOBAL_OPTIONS = {"--config": "config", "--json": "json"}
_PULL_OPTIONS = {"--duration": "duration", "--no-splay": "no_splay", "--release": "release"}
_VALUE_OPTIONS = frozenset({"--config", "--duration"})


def plain_args(argv: Sequence[str]) -> argparse.Namespace | None:
    """The namespace :func:`qinglong_edge.cli.main` would get from argparse for a plain
    ``pull`` command line, or None to let argparse parse it.

    Cron and the systemd timer run ``qinglong-edge --config PATH pull`` every minute;
    importing argparse and building the parser (its help formatter imports ``shutil``,
    its messages ``gettext`` and ``locale``) cost a router ~8 ms CPU per cycle. Only
    this plain grammar is read here: ``[--config V] [--json] pull [--config V] [--json]
    [--duration F] [--no-splay]``, options in any order, each at most once, values as
    separate words that do not start with ``-``, ``--duration`` converted with
    :func:`float` as argparse does. Everything else (``--help``, abbreviations,
    ``--opt=value``, a repeat, ``--``, an unknown word, a value argparse would have to
    classify, a bad float) returns None, so argparse parses it and gives its usual
    answer or message. The result has the attributes argparse sets (``config``,
    ``json``, ``command``, ``duration``, ``no_splay``, ``handler``), with the defaults
    :func:`qinglong_edge.cli.main` applies; handlers only read attributes.
    """
    values: dict[str, object] = {}
    command = False
    index = 0
    while index < len(argv):
        arg = argv[index]
        index += 1
        if arg == "pull" and not command:
            command = True
            continue
        key = _GLOBAL_OPTIONS.get(arg) or (_PULL_OPTIONS.get(arg) if command else None)
        if key is None or key in values:
            return None
        if arg not in _VALUE_OPTIONS:
            values[key] = True
            continue
        if index == len(argv) or argv[index].startswith("-"):
            return None
        value: object = argv[index]
        index += 1
        if key == "duration":
            try:
                value = float(argv[index - 1])
            except ValueError:
                return None
        values[key] = value
    if not command:
        return None
    namespace = SimpleNamespace(config=None, json=False, command="pull", duration=None, no_splay=False,
                                release=False, handler=_run)
    namespace.__dict__.update(values)
    return namespace  # type: ignore[return-value]  # duck-typed: the handler reads attributes only


def _iso(ms: int | None) -> str:
    import datetime

    if ms is None:
        return "?"
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def _remedy(reason: object, http_status: object = None) -> str:
    """The remedy of a typed transport reason ("" for other reasons and the bare codes)."""
    from qinglong_edge.errors import TRANSPORT_REASONS, transport_remedy

    if not isinstance(reason, str) or reason not in TRANSPORT_REASONS:
        return ""
    return transport_remedy(reason, http_status if isinstance(http_status, int) else None)


def _with_remedy(payload: dict[str, object]) -> dict[str, object]:
    if payload.get("status") in ("unavailable", "credential_rejected") and "remedy" not in payload:
        remedy = _remedy(payload.get("reason"), payload.get("httpStatus"))
        if remedy:
            payload["remedy"] = remedy
    return payload


def _describe(report: object, device: dict[str, str | None]) -> str:
    from qinglong_edge.worker.delivery.pull import CycleReport

    assert isinstance(report, CycleReport)
    if report.error is not None:
        remedy = report.remedy
        reason = f" ({report.reason})" if report.reason and report.reason != report.error else ""
        return f"pull: {report.error}{reason}: {report.detail}" + (f" -> {remedy}" if remedy else "")
    result = report.result
    session = report.session
    prefix = ""
    if session is not None and session.action == "registered":
        prefix = (f"session {session.session.session_id} registered (generation {session.session.generation}; "
                  f"{device['architecture']}, support tier {device['supportTier']}); ")
    if result is None:
        return "pull: " + prefix.rstrip("; ")
    status = result.status
    if status in ("accepted", "replayed"):
        text = f"{status} offer {result.offer_id} run {result.run_id} ({result.reason})"
    elif status == "idle":
        text = f"idle ({result.reason}); claim {result.offer_id} kept for the next cycle"
        if result.reason == "no_match" and device["supportTier"] not in (None, "tier1"):
            text += (f" (this device is {device['architecture']}, support tier {device['supportTier']}: only tasks "
                     f"whose placement lists {device['supportTier']} in supportTiers get offers)")
    elif status == "no_slot":
        text = "every slot is busy (worker.maxConcurrentRuns): no offer pulled"
    elif status == "backoff":
        text = f"backoff: claim {result.offer_id} is due at {_iso(result.next_attempt_at_ms)}"
    elif status == "inbox_full":
        held = result.detail or "records that need this device fill it"
        kept = f"claim {result.offer_id} kept, not sent" if result.offer_id else "no new claim made"
        text = (f"inbox full: {held} (worker.inboxMaximumEntries; finished records make room); {kept} "
                "(see `qinglong-edge inbox list`)")
    elif status == "abandoned":
        text = f"claim {result.offer_id} abandoned ({result.reason}); the next cycle makes a new claim"
    else:
        http = f" HTTP {result.http_status}" if result.http_status else ""
        code = f" {result.cluster_code}" if result.cluster_code else ""
        counted = "" if result.counted is not False else " (did not reach the cluster: not counted)"
        remedy = _remedy(result.reason, result.http_status)
        # The failure's message: the file, host or answer the remedy ("see the message",
        # "the file the message names") refers to.
        detail = f": {result.detail}" if result.detail else ""
        text = (
            f"{status} ({result.reason}{http}{code}); claim {result.offer_id} kept, "
            f"attempt {result.attempt_count} of 16{counted}, retry at {_iso(result.next_attempt_at_ms)}{detail}"
        ) + (f" -> {remedy}" if remedy else "")
    return "pull: " + prefix + text


def _exit_status(report: object) -> int:
    from qinglong_edge.worker.delivery.pull import CycleReport

    assert isinstance(report, CycleReport)
    if report.error is not None:
        return _EXIT_BY_ERROR.get(report.error, 75)
    if report.result is None:  # a resident's session step: a registration that worked is no failure
        return 0 if report.session is not None else 75
    if report.result.reason in _EXIT_BY_ERROR:  # e.g. the credential file became unreadable
        return _EXIT_BY_ERROR[report.result.reason]
    return _EXIT_BY_STATUS.get(report.result.status, 75)


def _unsupported(args: argparse.Namespace, worker: object, machine: str) -> int:
    """Exit 78 ``unsupported_architecture``: one line once per boot, then quietly."""
    from qinglong_edge.config import WorkerConfig
    from qinglong_edge.errors import JournalError
    from qinglong_edge.worker.delivery.session import unsupported_architecture_message
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

    assert isinstance(worker, WorkerConfig)
    message = unsupported_architecture_message(machine)
    first = True
    try:
        with RuntimeDirectory.open(worker.runtime_directory, worker.journal_directory) as runtime:
            first = runtime.once_per_boot(_ARCH_NOTICE)
    except JournalError:
        pass  # nowhere to remember it: say it every time rather than never
    if args.json:
        print_json({"ok": False, "code": "unsupported_architecture", "message": message, "exitStatus": 78})
    elif first:
        print(f"qinglong-edge: unsupported_architecture: {message}", file=sys.stderr, flush=True)
    return 78


def _splay(worker: object, abort: object, no_splay: bool) -> None:
    """Wait for this device's phase in the minute (before the heavy imports)."""
    import random
    import time

    from qinglong_edge.config import WorkerConfig
    from qinglong_edge.worker.delivery.abort import AbortSignal
    from qinglong_edge.worker.delivery.pacing import splay_delay_ms
    from qinglong_edge.worker.journal.runtime import handover_pending

    assert isinstance(worker, WorkerConfig) and isinstance(abort, AbortSignal)
    if no_splay or handover_pending(worker.runtime_directory, worker.journal_directory):
        return  # a stopped resident pull left jobs in flight: their leases cannot wait
    delay = splay_delay_ms(worker.worker_id, worker.splay_max_ms, time.time_ns() // 1_000_000, random.random())
    if delay <= 0:
        return
    if sys.stderr.isatty():
        print(f"pull: waiting {delay / 1000:.1f} s for this device's slot in the minute "
              "(worker.splayMaxMs; --no-splay skips it)", file=sys.stderr, flush=True)
    with abort.interruptible():
        time.sleep(delay / 1000)


#: Record events a human line leaves out (``--json`` has them all): the routine renewals.
_QUIET_EVENTS = frozenset({"renewed"})


def _check_capabilities_file(worker: object, architecture: str) -> None:
    """A cron pull that meets a resident one still checks the operator's capabilities
    file, so a bad edit is reported at once (exit 78); the resident pull keeps the
    advertisement it read at its start."""
    from qinglong_edge.config import WorkerConfig
    from qinglong_edge.errors import ConfigError

    assert isinstance(worker, WorkerConfig)
    if worker.capabilities_file is None:
        return
    from qinglong_edge.worker.delivery.capabilities import read_capabilities_file

    try:
        read_capabilities_file(worker.capabilities_file, architecture)
    except ConfigError as exc:
        raise ConfigError(f"{exc.message}; the resident pull keeps advertising the capabilities it started with",
                          path=exc.path, code=exc.code) from None


def _busy(args: argparse.Namespace) -> int:
    if args.json:
        print_json({"status": "busy", "code": "already_owned"})
    else:
        print("pull: another pull holds the journal; nothing to do", flush=True)
    return 0


def _resident_owner(worker: object) -> bool:
    """Whether a live process owns the journal (a resident pull): then this cron run
    exits at once, before its splay (spec README "One resident owner"). Read-only: a
    non-blocking flock probe of the owner lock (dropped at once), nothing written."""
    from qinglong_edge.config import WorkerConfig
    from qinglong_edge.worker.journal.ownerlock import lock_holder

    assert isinstance(worker, WorkerConfig)
    if not os.path.isdir(worker.journal_directory):
        return False
    held, _ = lock_holder(worker.journal_directory)
    return held


def _release(args: argparse.Namespace, worker: object) -> int:
    """``pull --release``: SIGTERM to the journal's holder, then wait for the lock to be free.

    A resident pull persists what it holds and exits 0, its jobs left running under
    their wrappers (the next pull re-adopts them by their identity); a pull cycle keeps
    its claim and exits 75. Run as root by the package's ``prerm`` before an upgrade
    replaces the code a resident pull would import lazily: nothing is created or
    written (the owner record is read as it is, whoever owns it), and a recycled pid is
    never signalled (pidfd checked against the record's start time). Exit 0 when no pull
    holds the journal or it exited within the wait (the request timeout + 10 s), 75
    ``already_owned`` otherwise.
    """
    from qinglong_edge.commands._output import emit

    outcome, pid = release_holder(worker)
    if outcome == "none":
        emit(args.json, "pull: no pull holds the journal; nothing to release", {"status": "released", "pid": None})
    elif outcome == "gone":
        emit(args.json, "pull: the pull that held the journal has exited", {"status": "released", "pid": None})
    else:
        emit(args.json, f"pull: released: the pull that held the journal (pid {pid}) exited; jobs it ran go on "
             "and the next pull re-adopts them", {"status": "released", "pid": pid})
    return 0


def release_holder(worker: object) -> tuple[str, int | None]:
    """Make the process that holds the journal exit (see :func:`_release`; ``drain`` uses
    it too): ``("none", None)`` nothing held it, ``("gone", None)`` it exited on its own,
    ``("released", pid)`` it exited after our SIGTERM.

    Raises:
        EdgeError: ``already_owned`` (it did not exit, or cannot be identified).
    """
    import time

    from qinglong_edge.config import WorkerConfig
    from qinglong_edge.errors import EdgeError
    from qinglong_edge.worker.journal.ownerlock import lock_holder
    from qinglong_edge.worker.remote.discard import peek_owner, signal_owner

    assert isinstance(worker, WorkerConfig)
    root = worker.journal_directory
    if not (os.path.isdir(root) and lock_holder(root)[0]):
        return "none", None
    owner = peek_owner(worker.runtime_directory, root)
    if owner is None or not signal_owner(owner, signal.SIGTERM):
        if not lock_holder(root)[0]:
            return "gone", None
        raise EdgeError(f"a process holds {root} but its owner record cannot be read or names another process: "
                        "nothing was signalled", code="already_owned")
    wait_s = worker.request_timeout_ms / 1000 + 10
    deadline = time.monotonic() + wait_s
    while lock_holder(root)[0]:
        if time.monotonic() >= deadline:
            raise EdgeError(f"the pull that holds the journal (pid {owner.pid}) did not exit within {wait_s:.0f} s "
                            "of SIGTERM", code="already_owned")
        time.sleep(0.05)
    return "released", owner.pid


def _run(args: argparse.Namespace) -> int:
    from qinglong_edge.config import load_config
    from qinglong_edge.errors import ConfigError, EdgeError, JournalError, UsageError
    from qinglong_edge.worker.delivery.abort import AbortSignal, PullAborted
    from qinglong_edge.worker.delivery.session import platform_architecture

    if args.duration is not None and not 0 < args.duration <= 86_400:
        raise UsageError("--duration must be more than 0 and at most 86400 seconds")
    config = load_config(args.config)
    worker = config.worker
    if worker is None:
        raise ConfigError("$.worker: the Remote Worker role is not configured", path="$.worker")
    if getattr(args, "release", False):
        return _release(args, worker)
    machine, architecture, tier = platform_architecture()
    if architecture is None:
        return _unsupported(args, worker, machine)
    device: dict[str, str | None] = {"machine": machine, "architecture": architecture, "supportTier": tier}

    abort = AbortSignal()

    def _abort(signum: int, _frame: FrameType | None) -> None:
        # Raises PullAborted only inside a network call or a sleep (AbortSignal).
        abort.trip(signal.Signals(signum).name)

    def _notice(line: str) -> None:
        print(f"pull: warning: {line}", file=sys.stderr, flush=True)

    # SIGHUP (the terminal of a hand-run pull closed) is a SIGTERM: summary and handover.
    previous = {sig: signal.signal(sig, _abort) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    # SIGUSR1 only wakes a resident pull (a forced `inbox discard`); its default would kill.
    previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, lambda _signum, _frame: None)
    status = 0
    failures = _FailureSink(worker)
    try:
        if _resident_owner(worker):
            _check_capabilities_file(worker, architecture)
            return _busy(args)
        _splay(worker, abort, args.no_splay)
        from qinglong_edge.worker.cycle import run_pull
        from qinglong_edge.worker.delivery.pull import CycleReport

        for item in run_pull(worker, duration_s=args.duration, abort=abort, notice=_notice, config=config):
            if isinstance(item, CycleReport):
                status = _exit_status(item)
                if worker.metrics_textfile is not None or status != 0:  # else: no cost at all
                    import time as _time

                    from qinglong_edge.worker.delivery.cycle_status import record_cycle

                    # wall clock (a person's and Prometheus' time); time is loaded already
                    record_cycle(worker, item, status, _time.time_ns() // 1_000_000, _notice)
                payload = _with_remedy(item.to_json())
                line = _describe(item, device)
                if args.json:
                    print_json({"device": device, **payload})
                else:
                    print(line, flush=True)
                if status != 0 or item.error is not None:
                    failures.say(line, payload)
                continue
            # A record event or the resident summary (worker/remote/runner_state.py, worker/remote/resident.py).
            summary = getattr(item, "resident_ms", None) is not None
            if summary and getattr(item, "aborted", None) is not None:
                status = 0  # SIGTERM to a resident pull: persisted, jobs left running, exit 0
            if args.json:
                print_json({**item.to_json(), "exitStatus": status} if summary else item.to_json())
            elif summary:
                print(item.describe(resume=_resume_command(args)), flush=True)
            elif getattr(item, "event", "") not in _QUIET_EVENTS:
                print(item.describe(), flush=True)
            if getattr(item, "event", "") in _FAILED_EVENTS:
                failures.say(item.describe(), item.to_json())
    except PullAborted as exc:
        name = str(exc.signal_name)
        if args.json:
            print_json({"status": "aborted", "signal": name})
        else:
            print(f"pull: aborted by {name}; any pending claim is kept and replayed by the next cycle",
                  file=sys.stderr, flush=True)
        return 75
    except JournalError as exc:
        if exc.code != "already_owned":
            return failures.failed(args, exc)
        return _busy(args)
    except EdgeError as exc:
        return failures.failed(args, exc)
    finally:
        failures.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status


def _resume_command(args: argparse.Namespace) -> str:
    """The command that takes a stopped pull's jobs over (said in its summary)."""
    import shlex

    config = getattr(args, "config", None)
    return "qinglong-edge " + (f"--config {shlex.quote(config)} " if config else "") + "pull"


#: Record events that are failures (said on stderr once an hour, as a failed cycle).
_FAILED_EVENTS = frozenset({"call_failed", "storage_failed", "recovery_required"})


class _FailureSink:
    """Each failure of a pull to stderr once per distinct failure per hour, with its remedy
    (issue 23 item 5: cron and the pull unit keep stderr, not stdout;
    :mod:`qinglong_edge.worker.delivery.failure_log`). Imported only when a failure happens."""

    def __init__(self, worker: WorkerConfig) -> None:
        self._worker = worker
        self._log: FailureLog | None = None

    def say(self, line: str, payload: dict[str, object]) -> bool:
        from qinglong_edge.worker.delivery.failure_log import FailureLog, failure_key

        if self._log is None:
            self._log = FailureLog(self._worker)
        return self._log.say(line, failure_key(payload))

    def failed(self, args: argparse.Namespace, exc: EdgeError) -> int:
        """A failure that ends the pull (storage, the capabilities file, configuration read
        at run time): the CLI's own line (``qinglong-edge: code: message``) on stderr once
        per hour, on stdout the other times (a terminal always shows it; cron's logger gets
        it once); ``--json`` prints the CLI's own JSON line (unchanged)."""
        from qinglong_edge.errors import exit_status_for

        status = exit_status_for(exc)
        line = f"qinglong-edge: {exc.code}: {exc.message}"
        said = self.say(line, {"status": "failed", "code": exc.code})
        if args.json:
            raise exc
        if not said:
            print(line, flush=True)
        return status

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
