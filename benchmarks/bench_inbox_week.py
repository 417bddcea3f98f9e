"""A week of a device taking a job every 5 minutes, in virtual time (issue 23 item 1).

    python benchmarks/bench_inbox_week.py [--days 7] [--baseline-days 1] [--every-min 5]

One cron cycle per virtual minute (at the device's splay phase, ``pacing.splay_delay_ms``)
runs the real cycle (``worker/cycle.py`` ``_cycle``: retention pruning, ``make_room``,
the session keeper's heartbeat pacing, the pull coordinator's claim pacing) on a real
journal and runtime directory (tmpfs when /dev/shm exists, so the week takes seconds,
not the device's fsyncs), against the cluster double's state machine in process
(tests/support/direct_ingress.py) with the same virtual clock. Every 5 virtual minutes a
task is queued; an accepted offer is executed through the journal's own state steps
(starting, launching, started, running, completion acknowledged: 30 virtual seconds),
as the resident pull writes them.

Baseline, same run: the rule before issue 23 (finished records hold inbox entries:
``Journal.make_room`` does nothing), which stops claiming after 64 jobs (5 h 20 min);
simulated for ``--baseline-days`` (1: every later day is the same wedge).

Cost: every cycle's retention pass parses every inbox record (about 0.6 ms each here), so
a full inbox costs an idle cycle about 40 ms CPU on this machine; the week takes minutes.

Figures: claims refused (``inbox_full`` cycles while a task waited), jobs offered /
accepted / completed, the largest number of inbox files seen after a cycle, tasks left
unclaimed at the end. Targets: claims refused 0; inbox entries at most the cap.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from qinglong_edge.clock import CLOCK_FLOOR_MS  # noqa: E402
from qinglong_edge.config import parse_config  # noqa: E402
from qinglong_edge.contracts.inbox import (  # noqa: E402
    to_completion_acknowledged,
    to_launching,
    to_running_acknowledged,
    to_started,
    to_starting_acknowledged,
)
from qinglong_edge.worker import cycle  # noqa: E402
from qinglong_edge.worker.delivery.pacing import splay_delay_ms  # noqa: E402
from qinglong_edge.worker.delivery.pull import PullCoordinator  # noqa: E402
from qinglong_edge.worker.delivery.session import SessionKeeper, local_capabilities  # noqa: E402
from qinglong_edge.worker.journal.runtime import RuntimeDirectory  # noqa: E402
from qinglong_edge.worker.journal.store import Journal, JournalOptions  # noqa: E402
from tests.support.cluster_state import ClusterState  # noqa: E402
from tests.support.cluster_tasks import build_task  # noqa: E402
from tests.support.direct_ingress import DirectIngress  # noqa: E402

#: A day past the floor under which a wall clock is "not set" (clock_not_set, issue 23):
#: a virtual week before it would fail every cycle and accept nothing.
START_MS = CLOCK_FLOOR_MS + 86_400_000
#: tmpfs for the journal (mkdtemp makes a private directory in it): the week takes minutes.
SHM = "/dev/shm"  # noqa: S108
MINUTE_MS = 60_000


class VirtualClock:
    def __init__(self) -> None:
        self.now = START_MS

    def __call__(self) -> int:
        return self.now


def _execute(journal: Journal, offer_id: str, at_ms: int) -> None:
    """The resident pull's writes for a job of 30 virtual seconds (the journal's own steps)."""
    record = journal.read_offer(offer_id)
    assert record is not None
    for step, delay in ((to_starting_acknowledged, 100), (None, 200), (None, 300), (to_running_acknowledged, 400),
                        (to_completion_acknowledged, 30_000)):
        if step is None and record["state"] == "starting_acknowledged":
            record = journal.replace_offer(to_launching(record, at_ms + delay, executor_started_at_ms=at_ms + delay,
                                                        log_artifact_id=f"wlog-{offer_id[:20]}", callback_sequence=2,
                                                        callback_token_digest="0" * 64), record["revision"])
        elif step is None:
            record = journal.replace_offer(to_started(record, at_ms + delay, executor_handle="ql3lp1.bench"),
                                           record["revision"])
        else:
            record = journal.replace_offer(step(record, at_ms + delay), record["revision"])


def simulate(root: pathlib.Path, *, days: int, every_min: int, make_room: bool) -> dict[str, Any]:
    (root / "state").mkdir(mode=0o700)
    (root / "run").mkdir(mode=0o700)
    document = {"schema": "qinglong/edge-agent@v1", "profile": "edge", "stateDirectory": str(root / "state"),
                "worker": {"origin": "https://cluster.example:7443", "workerId": "edge-1", "credentialFile": "/c",
                           "certificateFile": "/p", "privateKeyFile": "/k", "trustAnchorFiles": ["/a"],
                           "runtimeDirectory": str(root / "run")}}
    worker = parse_config(document).worker
    assert worker is not None
    clock = VirtualClock()
    state = ClusterState(os.urandom(32), clock_ms=clock)
    ingress = DirectIngress(state)
    runtime = RuntimeDirectory.open(worker.runtime_directory, worker.journal_directory)
    journal = Journal.open(worker.journal_directory, JournalOptions.from_config(worker), runtime=runtime)
    if not make_room:  # the rule before issue 23: finished records hold their entries
        journal.make_room = lambda *args, **kwargs: []  # type: ignore[method-assign]
    keeper = SessionKeeper(runtime, ingress, worker_id=worker.worker_id, max_concurrent_runs=worker.max_concurrent_runs,
                           lease_duration_ms=worker.session_lease_duration_ms,
                           heartbeat_interval_ms=worker.heartbeat_interval_ms, clock_ms=clock,
                           capabilities=local_capabilities("aarch64"))
    coordinator = PullCoordinator(journal, ingress, runtime=runtime, backoff_base_ms=worker.backoff_base_ms,
                                  clock_ms=clock)
    offered = accepted = refused = 0
    statuses: dict[str, int] = {}
    most_files = 0
    started = time.monotonic()
    try:
        for minute in range(days * 24 * 60):
            base = START_MS + minute * MINUTE_MS
            if minute % every_min == 0:
                state.add_candidate(build_task("shell", now_ms=base))
                offered += 1
            clock.now = base + splay_delay_ms(worker.worker_id, worker.splay_max_ms, base, 0.5)
            report, _ = cycle._cycle(journal, keeper, coordinator, worker, clock, runtime=runtime)
            status = report.result.status if report.result is not None else f"failed:{report.error}"
            statuses[status] = statuses.get(status, 0) + 1
            if status == "inbox_full" and state.candidates:
                refused += 1
            if status == "accepted" and report.result is not None and report.result.offer_id is not None:
                accepted += 1
                _execute(journal, report.result.offer_id, clock.now)
            most_files = max(most_files, len(journal.list_offers()))
    finally:
        journal.close()
        runtime.close()
    return {"offered": offered, "accepted": accepted, "claimsRefused": refused, "mostInboxFiles": most_files,
            "unclaimedAtEnd": len(state.candidates), "cycles": days * 24 * 60, "statuses": statuses,
            "wallSeconds": round(time.monotonic() - started, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--baseline-days", type=int, default=1)
    parser.add_argument("--every-min", type=int, default=5)
    args = parser.parse_args()
    parent = SHM if os.path.isdir(SHM) and os.access(SHM, os.W_OK) else None
    results = {}
    for name, make_room, days in (("ours", True, args.days), ("baseline", False, args.baseline_days)):
        root = pathlib.Path(tempfile.mkdtemp(prefix="qle-inbox-week-", dir=parent))
        try:
            results[name] = simulate(root, days=days, every_min=args.every_min, make_room=make_room)
        finally:
            with contextlib.suppress(OSError):
                shutil.rmtree(root)
    cap = 64
    ours = results["ours"]
    out = {
        "days": args.days, "baselineDays": args.baseline_days, "everyMinutes": args.every_min,
        "inboxMaximumEntries": cap,
        "ours": ours, "baseline": results["baseline"],
        "targets": {"claims_refused": 0, "most_inbox_files": f"<= {cap}", "failed_cycles": 0},
        "met": {"claims_refused": ours["claimsRefused"] == 0, "most_inbox_files": ours["mostInboxFiles"] <= cap,
                "failed_cycles": not any(status.startswith("failed") for status in ours["statuses"])},
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
