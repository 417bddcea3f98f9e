"""``qinglong-edge pull [--duration S] [--json] [--no-splay]``: the Remote Worker's cron job.

One cycle (or cycles at the profile cadence for ``--duration`` seconds): keep the
Worker Session alive, then one offer pull step (ADR-0110; see
:mod:`qinglong_edge.worker.cycle`). Exit statuses (spec README, sysexits):

=====  =====================================================================
0      accepted, replayed, idle, backoff not yet due, or another pull holds
       the journal (cron overlap: "busy")
69     this machine maps to no cluster architecture
73/74  the journal's storage is unsafe / unavailable (the claim is intact)
75     temporary: cluster unavailable or invalid response (claim kept, retried
       with backoff), claim abandoned (reported, a new claim next cycle), inbox
       full (no claim made), clock not set, or aborted by SIGTERM/SIGINT
77     the cluster rejected the worker credential (401/403 on a session call or
       on the offer pull; the claim is kept and backs off)
78     configuration, including unreadable credential/certificate/key files
=====  =====================================================================

With ``--duration`` the status is the last cycle's (a ``credential_rejected`` cycle
ends the loop at once).

SIGTERM/SIGINT: a request in flight is aborted at once; a journal write in progress
finishes first; no new request starts. The pending claim stays at its persisted
attempt (same offerId and token), so the next cycle replays it and the cluster
answers ``lease_recovery`` if it had committed (field lessons 1). Exit 75.

``--json`` prints one compact JSON object per cycle, one line each::

    {"session":{"action":"registered|heartbeat|current|stale","sessionId":..,
                "generation":..,"version":..},
     "status":"accepted|replayed|idle|backoff|inbox_full|abandoned|unavailable|
               invalid_response|credential_rejected",
     "offerId":..,"runId":..,"reason":..,"nextAttemptAtMs":..,"httpStatus":..,
     "retryAfterMs":..,"attemptCount":..,"stats":{..},"remedy":..}  (absent keys: not applicable)
    {"status":"failed","code":"credential_rejected|session_unavailable|..","reason":..,
     "detail":..,"remedy":..}

A failure caused by the transport names its typed ``reason`` (``certificate_expired``,
``dns_failure``...: :data:`qinglong_edge.errors.TRANSPORT_REASONS`) and its one-line
``remedy``; the human line ends with ``-> remedy``.
    {"status":"busy","code":"already_owned"}
    {"status":"aborted","signal":"SIGTERM"}
"""

from __future__ import annotations

import signal
import sys
from types import SimpleNamespace

from qinglong_edge.commands._output import print_json

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from types import FrameType

_EXIT_BY_STATUS = {
    "accepted": 0,
    "replayed": 0,
    "idle": 0,
    "backoff": 0,
    "inbox_full": 75,
    "abandoned": 75,
    "unavailable": 75,
    "invalid_response": 75,
    "credential_rejected": 77,
}
_EXIT_BY_ERROR = {
    "credential_rejected": 77,
    "unsupported_platform": 69,
    "credentials_unavailable": 78,
    "invalid_configuration": 78,
}


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
    parser.add_argument("--no-splay", action="store_true", help="skip the configured random initial delay")
    parser.set_defaults(handler=_run)


#: The options :func:`plain_args` reads: cli.build_parser's global ones (on either side of
#: ``pull``) and :func:`register`'s (after it). Any change to either must change this too
#: (tests/cli/test_pull_plain_args.py compares the two parsers).
_GLOBAL_OPTIONS = {"--config": "config", "--json": "json"}
_PULL_OPTIONS = {"--duration": "duration", "--no-splay": "no_splay"}
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
                                handler=_run)
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


def _describe(report: object) -> str:
    from qinglong_edge.worker.cycle import CycleReport

    assert isinstance(report, CycleReport)
    if report.error is not None:
        remedy = report.remedy
        reason = f" ({report.reason})" if report.reason and report.reason != report.error else ""
        return f"pull: {report.error}{reason}: {report.detail}" + (f" -> {remedy}" if remedy else "")
    result = report.result
    session = report.session
    prefix = ""
    if session is not None and session.action == "registered":
        prefix = f"session {session.session.session_id} registered (generation {session.session.generation}); "
    if result is None:
        return "pull: " + prefix.rstrip("; ")
    status = result.status
    if status in ("accepted", "replayed"):
        text = f"{status} offer {result.offer_id} run {result.run_id} ({result.reason})"
    elif status == "idle":
        text = f"idle ({result.reason}); claim {result.offer_id} cleared"
    elif status == "backoff":
        text = f"backoff: claim {result.offer_id} is due at {_iso(result.next_attempt_at_ms)}"
    elif status == "inbox_full":
        text = "inbox full: no new claim made (see `qinglong-edge inbox list`)"
    elif status == "abandoned":
        text = f"claim {result.offer_id} abandoned ({result.reason}); the next cycle makes a new claim"
    else:
        http = f" HTTP {result.http_status}" if result.http_status else ""
        remedy = _remedy(result.reason, result.http_status)
        text = (
            f"{status} ({result.reason}{http}); claim {result.offer_id} kept, "
            f"attempt {result.attempt_count}, retry at {_iso(result.next_attempt_at_ms)}"
        ) + (f" -> {remedy}" if remedy else "")
    return "pull: " + prefix + text


def _exit_status(report: object) -> int:
    from qinglong_edge.worker.cycle import CycleReport

    assert isinstance(report, CycleReport)
    if report.error is not None:
        return _EXIT_BY_ERROR.get(report.error, 75)
    if report.result is None:
        return 75
    if report.result.reason in _EXIT_BY_ERROR:  # e.g. the credential file became unreadable
        return _EXIT_BY_ERROR[report.result.reason]
    return _EXIT_BY_STATUS.get(report.result.status, 75)


def _run(args: argparse.Namespace) -> int:
    from qinglong_edge.config import load_config
    from qinglong_edge.errors import ConfigError, JournalError, UsageError
    from qinglong_edge.worker.cycle import run_pull
    from qinglong_edge.worker.pull import AbortSignal, PullAborted

    if args.duration is not None and not 0 < args.duration <= 86_400:
        raise UsageError("--duration must be more than 0 and at most 86400 seconds")
    config = load_config(args.config)
    if config.worker is None:
        raise ConfigError("$.worker: the Remote Worker role is not configured", path="$.worker")

    abort = AbortSignal()

    def _abort(signum: int, _frame: FrameType | None) -> None:
        # Raises PullAborted only inside a network call or a sleep (AbortSignal).
        abort.trip(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, _abort) for sig in (signal.SIGTERM, signal.SIGINT)}
    status = 0
    try:
        for report in run_pull(config.worker, duration_s=args.duration, splay=not args.no_splay, abort=abort):
            status = _exit_status(report)
            if args.json:
                print_json(_with_remedy(report.to_json()))
            else:
                print(_describe(report), flush=True)
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
            raise
        if args.json:
            print_json({"status": "busy", "code": exc.code})
        else:
            print("pull: another pull holds the journal; nothing to do", flush=True)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status
