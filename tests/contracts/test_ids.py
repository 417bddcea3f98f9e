"""Id generators match the grammars the contracts validate (offer-delivery.md 2.7, 5.1)."""

from __future__ import annotations

import pytest

from qinglong_edge.contracts.ids import (
    JOURNAL_OFFER_ID,
    LEASE_TOKEN,
    SESSION_ID,
    UUID4,
    new_lease_token,
    new_uuid4,
    new_uuid7,
)
from qinglong_edge.contracts.offer import ClaimAuthority


def test_uuid7_layout() -> None:
    session = new_uuid7(0x018F00000000, lambda n: b"\xff" * n)
    assert session == "018f0000-0000-7fff-bfff-ffffffffffff"
    assert SESSION_ID.fullmatch(session)
    assert SESSION_ID.fullmatch(new_uuid7(1_800_000_000_000))


def test_uuid7_rejects_an_out_of_range_time() -> None:
    with pytest.raises(ValueError, match="now_ms"):
        new_uuid7(2**48)


def test_generated_claims_are_valid_authorities() -> None:
    offer_id, token = new_uuid4(), new_lease_token()
    assert UUID4.fullmatch(offer_id) and JOURNAL_OFFER_ID.fullmatch(offer_id)
    assert len(token) == 43 and LEASE_TOKEN.fullmatch(token)
    ClaimAuthority("edge-1", new_uuid7(1_000), 1, offer_id, token)
