"""Test-only crash injection at the named step boundaries of the worker journal.

Set ``QINGLONG_EDGE_CRASHPOINT=<name>[:exit|:pause]`` in the environment of a
process that uses the journal:

* ``exit`` (the default): ``os._exit(137)`` at that boundary: no ``finally`` block,
  no ``atexit`` handler and no buffered write runs, the kernel closes the files and
  drops the ``flock``, exactly as after ``SIGKILL``.
* ``pause``: the process sends itself ``SIGSTOP`` there, so a test can watch it
  stop (``/proc/<pid>/stat`` state ``T``) and then deliver a real ``SIGKILL`` (or
  ``SIGCONT`` to let it go on).

The variable is read once, at import. When it is unset :func:`crashpoint` costs one
comparison against ``None``, so the hooks stay in production code.

What a process crash does **not** model is power loss: the page cache survives a
killed process. Durability against power loss comes from the fsync order, which
``tests/worker/journal/test_journal_syscalls.py`` checks under ``strace``.

Point names are ``<operation>.<step>``. Operations (see :mod:`qinglong_edge.worker.journal.store`):

==================  ==========================================================
``claim_create``    first publication of ``pending-claim.json``
``claim_replace``   a claim revision (the attempt, the backoff)
``claim_clear``     removal of ``pending-claim.json``
``claim_abandon``   first publication of ``abandoned/<offerId>.json``; then the
                    claim's removal uses the ``claim_clear`` steps
``offer_accept``    first publication of ``offers/<offerId>.json``
``offer_update``    an inbox record revision (higher lease version, ``replace_offer``)
``offer_discard``   removal of ``offers/<offerId>.json`` (``inbox discard``, retention)
``abandoned_prune`` removal of the oldest ``abandoned/<offerId>.json`` beyond the bound
``session_clear``   removal of a legacy ``session.json`` from the journal root (the
                    session record now lives in the runtime directory)
``runtime_write``   a file of the runtime directory (RUNTIME_STEPS below)
``pull``            the step boundaries of one offer pull (PULL_STEPS below)
``runner``          the state boundaries of executing one inbox record (RUNNER_STEPS below)
``session``         ``heartbeat_answered`` (the cluster committed a heartbeat, the answer
                    arrived, the session record not yet saved: a lost answer)
``store_prune``     Run pruning (:mod:`qinglong_edge.local.retention`):
                    ``rows_deleted`` (inside the transaction, not committed),
                    ``rows_committed`` (rows gone, log files not yet removed),
                    ``files_removed``
``log_prune``       log pruning: ``rows_updated`` (``log_artifact_id`` cleared, not
                    committed), ``rows_committed`` (the file not yet removed)
==================  ==========================================================

Steps of a first publication (:data:`FIRST_PUBLICATION_STEPS`), in order:
``begin`` (before any file is touched), ``tmp_created`` (temp file open, empty),
``tmp_partial`` (half the bytes written), ``tmp_written``, ``tmp_synced`` (file
fsynced and closed), ``linked`` (``link()`` done, directory not yet fsynced),
``dir_synced``, ``tmp_removed`` (temp name unlinked: the operation is complete).

Steps of an update (:data:`UPDATE_STEPS`): ``begin``, ``tmp_created``,
``tmp_partial``, ``tmp_written``, ``tmp_synced``, ``renamed``, ``dir_synced``.

Steps of a removal (:data:`REMOVAL_STEPS`): ``begin``, ``unlinked``, ``dir_synced``.

Steps of a runtime-directory write (:data:`RUNTIME_STEPS`,
:mod:`qinglong_edge.worker.journal.runtime`): ``begin``, ``tmp_written`` (temp file complete and
closed), ``renamed``.

Steps of a pull (:data:`PULL_STEPS`, :mod:`qinglong_edge.worker.delivery.pull`):
``attempt_counted`` (an attempt-in-flight marker found at start was counted into the
claim on disk, the marker not yet removed), ``attempt_marked`` (the marker for this
attempt is in the runtime directory, nothing sent),
``response_received`` (a 200 body arrived, nothing parsed or written),
``inbox_published`` (the inbox record is durable, the claim not yet cleared),
``claim_cleared`` (the claim is removed, the result not yet reported).

Steps of executing a record (:data:`RUNNER_STEPS`, :mod:`qinglong_edge.worker.remote.runner`),
each just after what it names and before the next durable write: ``starting_answered``
(T1's 200 arrived, nothing written), ``starting_acknowledged`` (T1 written),
``replay_answered`` (T2's answer, no token yet), ``secrets_received`` (T3: the secrets
in memory, nothing written), ``launching`` (T5, the pre-spawn barrier, written),
``held`` (the wrapper started and waits at the start barrier, T7 not written),
``started`` (T7 written, the job not released), ``released`` (the command runs),
``running_answered`` / ``running_acknowledged`` (T8), ``renewal_answered`` (a
lease-control answer arrived, not kept: the lost renewal of G2) / ``renewed`` (kept in
memory and the lease file, RAM),
``stopped`` (a stop returned), ``exited`` (the job is gone and its outcome known,
nothing uploaded), ``result_stored`` (the completion's frozen result times and the
current lease written), ``uploaded`` (the log is stored, completion not sent),
``completion_answered`` / ``completion_acknowledged`` (T10 written, files not yet
removed), ``files_removed``, ``start_failed``, ``start_failure_answered`` /
``start_failure_acknowledged`` (T9), ``recovery_required``.
"""

from __future__ import annotations

import os
import signal

__all__ = [
    "ENV",
    "FIRST_PUBLICATION_STEPS",
    "OPERATIONS",
    "POINTS",
    "PULL_STEPS",
    "REMOVAL_STEPS",
    "RUNNER_STEPS",
    "RUNTIME_STEPS",
    "UPDATE_STEPS",
    "armed",
    "crashpoint",
]

ENV = "QINGLONG_EDGE_CRASHPOINT"

FIRST_PUBLICATION_STEPS = (
    "begin", "tmp_created", "tmp_partial", "tmp_written", "tmp_synced", "linked", "dir_synced", "tmp_removed",
)
UPDATE_STEPS = ("begin", "tmp_created", "tmp_partial", "tmp_written", "tmp_synced", "renamed", "dir_synced")
REMOVAL_STEPS = ("begin", "unlinked", "dir_synced")
RUNTIME_STEPS = ("begin", "tmp_written", "renamed")
PULL_STEPS = ("attempt_counted", "attempt_marked", "response_received", "inbox_published", "claim_cleared")
RUNNER_STEPS = (
    "starting_answered", "starting_acknowledged", "replay_answered", "secrets_received", "launching", "held",
    "started", "released", "running_answered", "running_acknowledged", "renewal_answered", "renewed", "stopped",
    "exited", "result_stored", "uploaded", "completion_answered", "completion_acknowledged", "files_removed",
    "start_failed",
    "start_failure_answered", "start_failure_acknowledged", "recovery_required",
)

#: operation -> its steps, in order.
OPERATIONS: dict[str, tuple[str, ...]] = {
    "claim_create": FIRST_PUBLICATION_STEPS,
    "claim_replace": UPDATE_STEPS,
    "claim_clear": REMOVAL_STEPS,
    "claim_abandon": FIRST_PUBLICATION_STEPS,
    "offer_accept": FIRST_PUBLICATION_STEPS,
    "offer_update": UPDATE_STEPS,
    "offer_discard": REMOVAL_STEPS,
    "abandoned_prune": REMOVAL_STEPS,
    "session_clear": REMOVAL_STEPS,
    "runtime_write": RUNTIME_STEPS,
    "pull": PULL_STEPS,
    "runner": RUNNER_STEPS,
    "session": ("heartbeat_answered",),
    "store_prune": ("rows_deleted", "rows_committed", "files_removed"),
    "log_prune": ("rows_updated", "rows_committed"),
}

#: Every documented point name, in execution order within each operation.
POINTS: tuple[str, ...] = tuple(f"{op}.{step}" for op, steps in OPERATIONS.items() for step in steps)


def _parse(value: str | None) -> tuple[str, str] | None:
    if not value:
        return None
    name, _, mode = value.partition(":")
    return name, (mode or "exit")


_TARGET = _parse(os.environ.get(ENV))


def armed(name: str) -> bool:
    """Whether ``name`` is the configured point (lets callers skip work only a test needs)."""
    return _TARGET is not None and _TARGET[0] == name


def crashpoint(name: str) -> None:
    """Die (or stop) here if ``$QINGLONG_EDGE_CRASHPOINT`` names this point.

    Args:
        name: ``<operation>.<step>``, one of :data:`POINTS`.
    """
    if _TARGET is None or _TARGET[0] != name:
        return
    if _TARGET[1] == "pause":
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    os._exit(137)
