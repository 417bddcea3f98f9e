"""Which inbox records still need local action, and the timeout deadline.

Pure rules from the spec README, "Decisions for remote execution": "Terminal for residency
and pruning", "Slots" and "Timeout"; remote-execution.md section 2.2 (T12). The runner
supplies the facts it observed (is the process verified gone, did completion succeed, did
the lease expire locally, was the session replaced); nothing here reads a clock or a file.

* :func:`needs_local_action` -- False for a record that is terminal for residency and
  pruning: ``completion_acknowledged``, ``start_failure_acknowledged``, and
  ``recovery_required`` once no local action remains (``control_plane_terminal``,
  ``control_plane_already_running``, ``lease_lost_local_execution_stopped`` at once;
  ``lease_lost_local_execution_unverified`` once the process is verified gone;
  ``launch_outcome_unknown`` once completion succeeded or the lease expired locally).
  Every other record is *in flight*: it keeps the ``pull`` process resident and holds a
  slot (``availableSlots = maxConcurrentRuns - in flight``).
* :func:`lease_loss_reason` -- T12, the local lease check on a non-terminal record: the
  ``recovery_required`` reason to record, or None.
* :func:`lease_expired_locally` -- a stored lease over by the cluster's clock as estimated
  (records no runner tracks); the local lease expiry of a tracked record and its renewal
  are :mod:`qinglong_edge.contracts.clocks` (spec README "Decisions for clocks").
* :func:`local_deadline_ms` -- receive time of the starting answer + ``timeoutMs`` (boot
  clock); after a restart the launch instant, or ``executorStartedAtMs`` mapped onto it.

All times are ms. Errors: ``ContractError`` with ``inbox_state`` / ``recovery_reason`` /
``not_integer`` / ``out_of_range`` (never anything else).
"""

from __future__ import annotations

from qinglong_edge.contracts._shape import int_value, object_value
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.inbox import INBOX_STATES, RECOVERY_REASONS

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from qinglong_edge.contracts.records import InboxRecord, OfferLease

__all__ = [
    "LAUNCHED_STATES",
    "PRE_LAUNCH_STATES",
    "lease_expired_locally",
    "lease_loss_reason",
    "local_deadline_ms",
    "needs_local_action",
]

#: T12 group 1: no process was ever started (or it was proved not spawned).
PRE_LAUNCH_STATES = frozenset({"accepted", "starting_acknowledged", "start_failed"})
#: T12 group 2: a process may exist; the stop's result picks the reason.
LAUNCHED_STATES = frozenset({"launching", "started", "running_acknowledged"})
_DONE_AT_ONCE = frozenset({"control_plane_terminal", "control_plane_already_running",
                           "lease_lost_local_execution_stopped"})


def _state(record: object) -> tuple[str, str | None]:
    source = object_value(record, "$")
    state = source.get("state")
    if not isinstance(state, str) or state not in INBOX_STATES:
        raise ContractError("inbox_state", "$.state", "not a known inbox state")
    reason = source.get("recoveryReason")
    if state == "recovery_required" and (not isinstance(reason, str) or reason not in RECOVERY_REASONS):
        raise ContractError("recovery_reason", "$.recoveryReason", "not a known recovery reason")
    return state, reason if state == "recovery_required" else None


def needs_local_action(
    record: InboxRecord,
    *,
    process_gone: bool = False,
    completion_succeeded: bool = False,
    lease_expired: bool = False,
) -> bool:
    """Whether ``record`` is still in flight (spec README "Terminal for residency and pruning").

    Args:
        record: an inbox record (only ``state`` and ``recoveryReason`` are read).
        process_gone: the job's process is verified gone (identity checked).
        completion_succeeded: completion answered ``applied``/``already_completed``.
        lease_expired: the lease expired locally (:func:`lease_expired_locally`).

    Returns:
        True while the record holds the ``pull`` resident and a slot; False when it is
        terminal (nothing local remains; pruned after retention with its files).
    """
    state, reason = _state(record)
    if state in ("completion_acknowledged", "start_failure_acknowledged"):
        return False
    if state != "recovery_required":
        return True
    if reason in _DONE_AT_ONCE:
        return False
    if reason == "lease_lost_local_execution_unverified":
        return not process_gone
    return not (completion_succeeded or lease_expired)  # launch_outcome_unknown


def lease_loss_reason(
    record: InboxRecord,
    *,
    lease_expired: bool,
    session_replaced: bool = False,
    stop_conclusive: bool = True,
) -> str | None:
    """T12: the ``recovery_required`` reason a lost lease gives ``record``, or None.

    * ``accepted``, ``starting_acknowledged``, ``start_failed`` (no live process): lease
      expired locally *or* session replaced -> ``lease_lost_local_execution_stopped``.
    * ``launching``, ``started``, ``running_acknowledged``: lease expired locally -> stop
      the process first, then ``lease_lost_local_execution_stopped`` when the stop was
      conclusive (``stopped`` or already gone) else ``lease_lost_local_execution_unverified``.
      (A replaced session alone fences lease-control; the lease then expires locally.)
    * any other state: None (terminal, or already in recovery).

    Args:
        stop_conclusive: for the launched states, whether the stop ended the process.
    """
    state, _ = _state(record)
    if state in PRE_LAUNCH_STATES:
        return "lease_lost_local_execution_stopped" if lease_expired or session_replaced else None
    if state in LAUNCHED_STATES and lease_expired:
        return "lease_lost_local_execution_stopped" if stop_conclusive else "lease_lost_local_execution_unverified"
    return None


def lease_expired_locally(lease: OfferLease, cluster_now_ms: int) -> bool:
    """Whether a stored lease (``offer.lease``) is over by the cluster's clock as this
    device estimates it (``expiresAtMs <= cluster_now_ms``; the estimate is
    :meth:`qinglong_edge.worker.delivery.cluster_clock.ClusterClock.cluster_now`). For the records
    no runner tracks (pruning, ``inbox``); a tracked record's expiry is its local one
    (:func:`qinglong_edge.contracts.clocks.local_lease_expiry_ms`, boot clock)."""
    source = object_value(lease, "$.offer.lease")
    expires = int_value(source.get("expiresAtMs"), "$.offer.lease.expiresAtMs")
    return expires <= int_value(cluster_now_ms, "$.clusterNowMs")


def local_deadline_ms(
    timeout_ms: int | None,
    *,
    starting_received_at_ms: int | None = None,
    executor_started_at_ms: int | None = None,
) -> int | None:
    """The local timeout deadline (spec README "Timeout"), or None without ``timeoutMs``.

    Args:
        timeout_ms: the revision's ``timeoutMs`` (1..31 536 000 000) or None.
        starting_received_at_ms: local receive time of the starting answer (kept in memory).
        executor_started_at_ms: the record's ``executorStartedAtMs`` (after a restart).

    Raises:
        ContractError: ``not_integer``/``out_of_range``; ``key_set`` at ``$`` when
            ``timeout_ms`` is set but neither base time is given.
    """
    if timeout_ms is None:
        return None
    timeout = int_value(timeout_ms, "$.timeoutMs", 1)
    if starting_received_at_ms is not None:
        return int_value(starting_received_at_ms, "$.startingReceivedAtMs") + timeout
    if executor_started_at_ms is not None:
        return int_value(executor_started_at_ms, "$.executorStartedAtMs") + timeout
    raise ContractError("key_set", "$", "a deadline needs the starting receive time or executorStartedAtMs")
