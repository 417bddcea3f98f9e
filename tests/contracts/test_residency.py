"""Residency/pruning classification, T12 and the local clocks (spec README decisions)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.inbox import INBOX_STATES, RECOVERY_REASONS
from qinglong_edge.contracts.residency import (
    LAUNCHED_STATES,
    PRE_LAUNCH_STATES,
    lease_expired_locally,
    lease_loss_reason,
    local_deadline_ms,
    needs_local_action,
)

FACTS = list(itertools.product([False, True], repeat=3))


def rec(state: str, reason: str | None = None) -> dict[str, Any]:
    value: dict[str, Any] = {"state": state}
    if reason is not None:
        value["recoveryReason"] = reason
    return value


@pytest.mark.parametrize("state", [s for s in INBOX_STATES if s != "recovery_required"])
@pytest.mark.parametrize(("gone", "completed", "expired"), FACTS)
def test_every_state_but_recovery_follows_its_table_row(state: str, gone: bool, completed: bool,
                                                        expired: bool) -> None:
    expected = state not in ("completion_acknowledged", "start_failure_acknowledged")
    assert needs_local_action(rec(state), process_gone=gone, completion_succeeded=completed,
                              lease_expired=expired) is expected


@pytest.mark.parametrize("reason", RECOVERY_REASONS)
@pytest.mark.parametrize(("gone", "completed", "expired"), FACTS)
def test_recovery_is_terminal_once_no_local_action_remains(reason: str, gone: bool, completed: bool,
                                                           expired: bool) -> None:
    expected = {
        "control_plane_terminal": False,
        "control_plane_already_running": False,
        "lease_lost_local_execution_stopped": False,
        "lease_lost_local_execution_unverified": not gone,
        "launch_outcome_unknown": not (completed or expired),
    }[reason]
    assert needs_local_action(rec("recovery_required", reason), process_gone=gone, completion_succeeded=completed,
                              lease_expired=expired) is expected


@pytest.mark.parametrize("record", [{}, {"state": "running"}, {"state": 1}, [], {"state": "recovery_required"},
                                    {"state": "recovery_required", "recoveryReason": "x"}])
def test_a_bad_record_is_a_contract_error(record: Any) -> None:
    with pytest.raises(ContractError):
        needs_local_action(record)


@pytest.mark.parametrize("state", INBOX_STATES)
@pytest.mark.parametrize(("expired", "replaced", "conclusive"), FACTS)
def test_t12_lease_loss(state: str, expired: bool, replaced: bool, conclusive: bool) -> None:
    reason = lease_loss_reason(rec(state, "launch_outcome_unknown" if state == "recovery_required" else None),
                               lease_expired=expired, session_replaced=replaced, stop_conclusive=conclusive)
    if state in PRE_LAUNCH_STATES:
        assert reason == ("lease_lost_local_execution_stopped" if expired or replaced else None)
    elif state in LAUNCHED_STATES:
        if not expired:
            assert reason is None
        else:
            assert reason == ("lease_lost_local_execution_stopped" if conclusive
                              else "lease_lost_local_execution_unverified")
    else:
        assert reason is None


def test_lease_expired_locally_compares_the_cluster_clock() -> None:
    lease = {"renewedAtMs": 21, "expiresAtMs": 30021}
    assert not lease_expired_locally(lease, 30020)
    assert lease_expired_locally(lease, 30021)


def test_local_deadline() -> None:
    assert local_deadline_ms(None, starting_received_at_ms=5) is None
    assert local_deadline_ms(1000, starting_received_at_ms=5, executor_started_at_ms=9) == 1005
    assert local_deadline_ms(1000, executor_started_at_ms=9) == 1009
    with pytest.raises(ContractError):
        local_deadline_ms(1000)
    with pytest.raises(ContractError):
        local_deadline_ms(0, starting_received_at_ms=5)


@pytest.mark.parametrize("bad", [-1, 2**53, 1.0, True, None, "5"])
def test_clock_arguments_are_checked(bad: Any) -> None:
    with pytest.raises(ContractError):
        lease_expired_locally({"renewedAtMs": 0, "expiresAtMs": bad}, 0)
