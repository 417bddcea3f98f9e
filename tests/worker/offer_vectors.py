"""Golden vector A of offer-delivery.md section 4.2 for the journal tests.

The bytes are the verbatim copies in ``tests/contracts/vectors/`` (shared with the
contract tests); this module adds the journal's names and builders.
"""

from __future__ import annotations

from typing import Any, cast

from qinglong_edge.contracts.offer import ClaimAuthority, OfferedResponse, parse_offer_response
from tests.contracts import vector_a

TYPE_CHECKING = False
if TYPE_CHECKING:
    from qinglong_edge.contracts.records import InternalOffer

WORKER_ID = vector_a.WORKER_ID
SESSION_ID = vector_a.SESSION_ID
GENERATION = vector_a.GENERATION
OFFER_ID = vector_a.OFFER_ID
LEASE_TOKEN = vector_a.LEASE_TOKEN

#: The offered response body (1 382 bytes).
OFFERED_BODY = vector_a.OFFERED
#: ``pending-claim.json`` as created at t=1000, including the trailing newline.
CLAIM_T1000 = vector_a.PENDING_CLAIM
#: ``offers/offer-1.json`` after acceptance at t=1001 (1 584 bytes including ``\n``).
OFFER_RECORD_T1001 = vector_a.INBOX_RECORD

assert len(OFFERED_BODY) == 1382 and len(OFFER_RECORD_T1001) == 1584


def authority(offer_id: str = OFFER_ID, token: str = LEASE_TOKEN) -> ClaimAuthority:
    return ClaimAuthority(WORKER_ID, SESSION_ID, GENERATION, offer_id, token)


def offer(**lease_changes: Any) -> InternalOffer:
    """The internal offer of vector A, parsed by the real response parser.

    Args:
        lease_changes: lease fields to override (``version=4`` ...), for replays.
    """
    response = parse_offer_response(OFFERED_BODY, authority())
    assert isinstance(response, OfferedResponse)
    result = response.offer
    if lease_changes:
        result = cast("InternalOffer", {**result, "lease": {**result["lease"], **lease_changes}})
    return result
