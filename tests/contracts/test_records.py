"""contracts/records.py: the TypedDicts say what the validators build (issue 27 item 5).

The module is annotations only (never imported at run time: tests/cli/test_pull_imports.py);
these tests keep each shape equal to its validator: the same keys in file order, the keys
the validator allows missing (and only those) ``NotRequired``, and the value types of a
real record."""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import pytest

from qinglong_edge.contracts import records
from qinglong_edge.contracts.inbox import (
    INBOX_OPTIONAL_KEYS,
    to_launching,
    to_recovery_required,
    to_started,
    to_starting_acknowledged,
)
from qinglong_edge.contracts.journal_records import (
    _ABANDONED_KEYS,
    _CLAIM_KEYS,
    abandoned_record_bytes,
    inbox_record,
    parse_inbox_record,
    parse_pending_claim,
)
from qinglong_edge.contracts.offer import CANDIDATE_KEYS, LEASE_KEYS, OFFER_KEYS, OfferedResponse, parse_offer_response
from tests.contracts import vector_a as va

_BASE = ("schemaVersion", "revision", "state", "offer", "acceptedAtMs", "updatedAtMs")


def _keys(shape: type) -> tuple[str, ...]:
    return tuple(typing.get_type_hints(shape))


def _optional(shape: type) -> frozenset[str]:
    """The ``NotRequired`` keys (``__optional_keys__`` misses them on 3.11 when the
    annotations are strings, as ``from __future__ import annotations`` makes them)."""
    hints = typing.get_type_hints(shape, include_extras=True)
    return frozenset(key for key, hint in hints.items() if typing.get_origin(hint) is typing.NotRequired)


@pytest.mark.parametrize(("shape", "keys"), [
    (records.InboxRecord, (*_BASE, *INBOX_OPTIONAL_KEYS)),
    (records.InternalOffer, OFFER_KEYS),
    (records.OfferLease, LEASE_KEYS),
    (records.OfferCandidate, CANDIDATE_KEYS),
    (records.OfferWorker, ("workerId", "sessionId", "generation")),
    (records.ClaimRecord, _CLAIM_KEYS),
    (records.AbandonedRecord, _ABANDONED_KEYS),
])
def test_each_shape_has_its_validators_keys_in_file_order(shape: type, keys: tuple[str, ...]) -> None:
    assert _keys(shape) == keys


def test_only_the_optional_inbox_keys_may_be_missing() -> None:
    assert _optional(records.InboxRecord) == frozenset(INBOX_OPTIONAL_KEYS)
    assert typing.get_args(records.InboxOptionalKey) == INBOX_OPTIONAL_KEYS
    for shape in (records.InternalOffer, records.OfferLease, records.OfferCandidate, records.OfferWorker,
                  records.ClaimRecord, records.AbandonedRecord):
        assert _optional(shape) == frozenset(), shape


def _conforms(value: object, hint: Any, where: str) -> None:
    """A shallow runtime check of ``value`` against a TypedDict hint (enough for records)."""
    if typing.is_typeddict(hint):
        assert isinstance(value, dict), where
        hints = typing.get_type_hints(hint)
        assert set(value) <= set(hints), (where, set(value) - set(hints))
        required = set(hints) - _optional(hint)
        assert required <= set(value), (where, required - set(value))
        for key, item in value.items():
            _conforms(item, hints[key], f"{where}.{key}")
        return
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        assert any(_matches(value, arg) for arg in typing.get_args(hint)), where
    elif origin is dict:
        assert isinstance(value, dict), where
    else:
        assert _matches(value, hint), (where, value, hint)


def _matches(value: object, hint: Any) -> bool:
    if hint is type(None):
        return value is None
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def test_real_records_conform_to_their_shapes() -> None:
    response = parse_offer_response(va.OFFERED, va.AUTHORITY)
    assert isinstance(response, OfferedResponse)
    offer = response.offer
    _conforms(offer, records.InternalOffer, "$.offer")
    record = inbox_record(offer, 1_800_000_000_000)
    _conforms(record, records.InboxRecord, "$")
    launched = to_launching(to_starting_acknowledged(record, 1_800_000_000_050), 1_800_000_000_100,
                            executor_started_at_ms=1_800_000_000_100, log_artifact_id="wlog-1",
                            callback_sequence=3, callback_token_digest="a" * 64)
    started = to_started(launched, 1_800_000_000_200, executor_handle="pid:1")
    recovered = to_recovery_required(started, 1_800_000_000_300, "launch_outcome_unknown")
    for step in (launched, started, recovered):
        _conforms(step, records.InboxRecord, "$")
    _conforms(parse_inbox_record(va.INBOX_RECORD), records.InboxRecord, "$")
    claim = parse_pending_claim(va.PENDING_CLAIM)
    _conforms(claim.to_dict(), records.ClaimRecord, "$")
    abandoned = json.loads(abandoned_record_bytes(claim, "stale_session", 1_800_000_000_000))
    _conforms(abandoned, records.AbandonedRecord, "$")
