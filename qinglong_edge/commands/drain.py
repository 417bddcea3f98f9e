"""``qinglong-edge drain``: take the Remote Worker offline (removal, role switched off).

Sends ``draining`` for the stored Worker Session (the cluster places nothing more
here), drives every record in flight to its end (renewals, completions; heartbeats
announce no free slot; nothing is pulled), and sends ``offline`` once none is left
(:mod:`qinglong_edge.worker.drain`). A pull that holds the journal is made to exit
first, as ``pull --release`` does (its jobs go on and this command takes them over).
Run as root (the package's prerm, the init script), it runs as the journal's owner.
It does not stop cron: switch the worker role off first (OpenWrt:
``uci set qinglong-edge.worker.enabled=0; uci commit; reload_config`` does both), or
the next pull registers the device again.

Exit statuses:

=====  ======================================================================
0      offline: every record settled and the session is offline; or nothing to
       take offline (no live session and nothing in flight)
75     ``worker.drainTimeoutMs`` (edge 60 s) passed with records in flight: the
       session stays ``draining`` (run ``drain`` again to finish); records in flight
       but no live session to report them; the cluster was unreachable or answered
       badly; SIGTERM/SIGINT
77     the cluster rejected the worker credential
78     configuration (no worker section, unreadable credential files)
73/74  the journal's storage is unsafe / unavailable
=====  ======================================================================

``--json``: one line per step ``{"event":"drain","status":"draining|offline|timed_out|
no_session","left":[{"offerId","runId","state"}],"session":{..},"detail"?}``, the
record events and the resident summary between them, and the last line carries
``exitStatus``.
"""

from __future__ import annotations

import signal
import sys

from qinglong_edge.commands._output import print_json

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    import argparse
    from types import FrameType

_EXIT = {"offline": 0, "timed_out": 75}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "drain",
        parents=[common],
        help="take the Remote Worker offline: draining, every record settled, then offline",
        description="Send draining for the Worker Session, wait (worker.drainTimeoutMs) until every record "
        "in flight has settled, then send offline. Exit 0 offline, 75 when records are left (the session "
        "stays draining).",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from qinglong_edge.commands.pull import release_holder
    from qinglong_edge.config import load_config
    from qinglong_edge.errors import ConfigError, EdgeError, exit_status_for
    from qinglong_edge.worker.delivery.abort import AbortSignal, PullAborted
    from qinglong_edge.worker.drain import DrainReport, become_journal_owner, run_drain

    config = load_config(args.config)
    worker = config.worker
    if worker is None:
        raise ConfigError("$.worker: the Remote Worker role is not configured", path="$.worker")
    become_journal_owner(worker)
    abort = AbortSignal()

    def _abort(signum: int, _frame: FrameType | None) -> None:
        abort.trip(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, _abort) for sig in (signal.SIGTERM, signal.SIGINT)}
    status = 75
    last: dict[str, object] | None = None
    try:
        released = release_holder(worker)
        if released[0] == "released" and not args.json:
            print(f"drain: the pull that held the journal (pid {released[1]}) exited; its jobs are taken over",
                  flush=True)
        for item in run_drain(worker, config=config, abort=abort):
            payload = item.to_json() if hasattr(item, "to_json") else {}
            if isinstance(item, DrainReport):
                if item.status == "no_session":
                    status = 75 if item.left else 0
                else:
                    status = _EXIT.get(item.status, status)
            if last is not None and args.json:
                print_json(last)
            last = payload
            if not args.json and (isinstance(item, DrainReport) or getattr(item, "event", "") != "renewed"):
                text = item.describe() if hasattr(item, "describe") else ""
                if not text and getattr(item, "error", None):
                    text = f"drain: {item.error}: {item.detail}"
                if text:
                    print(text, flush=True)
    except PullAborted as exc:
        last = {"event": "drain", "status": "aborted", "signal": str(exc.signal_name)}
        if not args.json:
            print(f"drain: aborted by {exc.signal_name}; the session stays as it is", file=sys.stderr, flush=True)
        status = 75
    except EdgeError as exc:
        if not args.json:
            raise
        last = {"event": "drain", "status": "failed", "code": exc.code, "detail": exc.message}
        status = exit_status_for(exc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if args.json and last is not None:
        print_json({**last, "exitStatus": status})
    return status
