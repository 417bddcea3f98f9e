"""A child process that drives the real owner lock / journal, for tests that need two
processes, signals or crashes.

Run as ``python -m tests.support.journal_child COMMAND ROOT [ARGS]`` with the repo on
``PYTHONPATH``. It speaks one JSON object per line on stdout.

Commands:
    hold ROOT STALE_MS    acquire the owner lock, print {"event":"owned",...}, then
                          answer stdin lines: "check" -> {"event":"check","code":...},
                          "release" -> release and exit 0. EOF exits.
    try ROOT              try once: {"event":"try","code":null|"already_owned",...,"ms":elapsed}
    cycle ROOT            golden vector A from nothing, the journal writes of a pull that
                          is offered work: claim create (t=1000), accept (t=1001), clear
                          (the attempt's marker is in the runtime directory, not here);
                          {"event":"done","result":...}
    resume ROOT           a fresh process after a crash: open the journal and finish
                          the cycle from whatever state is on disk (the "server"
                          always answers vector A, as a replay would);
                          {"event":"done","result":"accepted"|"replayed"|"already"}
    count ROOT            a claim (rev 0) is on disk and a marker of it was found at
                          start: rewrite it with the attempt counted (rev 1, the update
                          algorithm); after a crash, only finish that rewrite
    abandon ROOT          create vector A's claim and abandon it (offer_fenced, t=5000);
                          with an existing claim (after a crash) only abandon it again
"""

from __future__ import annotations

import json
import sys
import time


def _emit(**payload: object) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def _hold(root: str, stale_ms: int) -> int:
    from qinglong_edge.worker.journal.ownerlock import OwnerLock

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
    from qinglong_edge.worker.journal.ownerlock import OwnerLock

    start = time.monotonic()
    try:
        lock = OwnerLock.acquire(root)
    except JournalError as exc:
        _emit(event="try", code=exc.code, message=exc.message, ms=(time.monotonic() - start) * 1000)
        return 0
    _emit(event="try", code=None, ms=(time.monotonic() - start) * 1000)
    lock.release()
    return 0


def _cycle(root: str, resume: bool) -> int:
    from qinglong_edge.contracts.journal_records import PendingClaim
    from qinglong_edge.worker.journal.store import Journal
    from tests.worker import offer_vectors as vectors

    with Journal.open(root) as journal:
        claim = journal.read_claim()
        if not resume and (claim is not None or journal.list_offers()):
            raise SystemExit("cycle needs an empty journal")
        if claim is None:
            if journal.list_offers():
                _emit(event="done", result="already")
                return 0
            claim = journal.create_claim(PendingClaim.create(vectors.authority(), 1000))
        result, _record = journal.accept_offer(vectors.offer(), 1001)
        journal.clear_claim(claim.offer_id, claim.revision)
    _emit(event="done", result=result)
    return 0


def _count(root: str) -> int:
    from qinglong_edge.contracts.journal_records import PendingClaim
    from qinglong_edge.worker.journal.store import Journal
    from tests.worker import offer_vectors as vectors

    with Journal.open(root) as journal:
        claim = journal.read_claim()
        if claim is None:
            claim = journal.create_claim(PendingClaim.create(vectors.authority(), 1000))
            _emit(event="created")
            return 0
        if claim.revision == 0:
            journal.replace_claim(claim.replace(revision=1, attempt_count=1, last_attempt_at_ms=1000), 0)
    _emit(event="done", result="counted")
    return 0


def _abandon(root: str) -> int:
    from qinglong_edge.contracts.journal_records import PendingClaim
    from qinglong_edge.worker.journal.store import Journal
    from tests.worker import offer_vectors as vectors

    with Journal.open(root) as journal:
        if journal.read_claim() is None:
            if journal.list_abandoned():
                _emit(event="done", result="already")
                return 0
            journal.create_claim(PendingClaim.create(vectors.authority(), 1000))
        record = journal.abandon_claim("offer_fenced", 5000)
    _emit(event="done", result="abandoned", abandonedAtMs=record.abandoned_at_ms)
    return 0


def main(argv: list[str]) -> int:
    command, root, *rest = argv
    if command == "hold":
        return _hold(root, int(rest[0]))
    if command == "try":
        return _try(root)
    if command == "abandon":
        return _abandon(root)
    if command == "count":
        return _count(root)
    if command in ("cycle", "resume"):
        return _cycle(root, resume=command == "resume")
    raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
