"""Golden vector A and its invalid variants I1-I10 (offer-delivery.md sections 4.1-4.4).

The files under ``vectors/`` are the bytes printed in section 4.2, copied verbatim
(``a_pending_claim.json`` and ``a_inbox_offer-1.json`` end with the ``\\n`` the
spec says the files carry). The variants are built here by the mutation the table of
section 4.4 names, re-serialized compactly like the cluster does.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qinglong_edge.contracts.offer import ClaimAuthority

VECTORS = pathlib.Path(__file__).resolve().parent / "vectors"

OFFERED = (VECTORS / "a_offered.json").read_bytes()
IDLE = (VECTORS / "a_idle.json").read_bytes()
IMMUTABLE = (VECTORS / "a_immutable.json").read_bytes()
PENDING_CLAIM = (VECTORS / "a_pending_claim.json").read_bytes()
INBOX_RECORD = (VECTORS / "a_inbox_offer-1.json").read_bytes()

WORKER_ID = "edge-1"
SESSION_ID = "018f0000-0000-7000-8000-000000000001"
GENERATION = 2
OFFER_ID = "offer-1"
LEASE_TOKEN = "worker_generated_lease_capability_0000000000000001"
LEASE_TOKEN_DIGEST = "3ec0eba7327e31e6bf55b10a70a671f1d53caea3234ad3358be1f13217f17203"
CONTENT_DIGEST = "6245978746f5a4bd6af7dd083979fb31f69de70989802f9ad3007a15e4a7b39e"
REQUEST_BODY = (
    b'{"workerGeneration":2,"offerId":"offer-1",'
    b'"leaseToken":"worker_generated_lease_capability_0000000000000001"}'
)

AUTHORITY = ClaimAuthority(WORKER_ID, SESSION_ID, GENERATION, OFFER_ID, LEASE_TOKEN)


def compact(value: Any) -> bytes:
    """Serialize like ``JSON.stringify`` (compact, insertion order, non-ASCII kept)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def offered() -> dict[str, Any]:
    """A fresh decoded copy of vector A's offered body."""
    body: dict[str, Any] = json.loads(OFFERED)
    return body


def idle() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(IDLE)
    return body


def mutate(source: bytes, change: Callable[[dict[str, Any]], object]) -> bytes:
    """Decode ``source``, apply ``change`` in place, re-serialize compactly."""
    value = json.loads(source)
    change(value)
    return compact(value)


@dataclass(frozen=True)
class Variant:
    name: str
    body: bytes
    code: str
    path: str


def _set(path: tuple[str | int, ...], new: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        target: Any = doc
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = new

    return change


INVALID_VARIANTS: tuple[Variant, ...] = (
    Variant("I1", mutate(OFFERED, _set(("unexpected",), True)), "key_set", "$.unexpected"),
    Variant("I2", mutate(OFFERED, _set(("offer", "offerId"), "offer-2")), "offer_id_mismatch", "$.offer.offerId"),
    Variant("I3", mutate(OFFERED, _set(("offer", "worker", "generation"), 3)), "worker_mismatch",
            "$.offer.worker.generation"),
    Variant("I4", mutate(OFFERED, _set(("offer", "lease", "leaseTokenDigest"), LEASE_TOKEN_DIGEST)), "key_set",
            "$.offer.lease.leaseTokenDigest"),
    Variant("I5", mutate(OFFERED, _set(("offer", "executionDigest"), "0" * 64)), "execution_digest_mismatch",
            "$.offer.executionDigest"),
    Variant("I6", mutate(OFFERED, _set(("offer", "executionRevision", "command", "args", 0), "evil.js")),
            "digest_mismatch", "$.offer.executionRevision.contentDigest"),
    Variant("I7", mutate(OFFERED, _set(("offer", "lease", "expiresAtMs"), 21)), "lease_order",
            "$.offer.lease.expiresAtMs"),
    Variant("I8", mutate(OFFERED, _set(("offer", "lease", "leaseGeneration"), 0)), "out_of_range",
            "$.offer.lease.leaseGeneration"),
    Variant("I9", mutate(OFFERED, _set(("stats", "claimRaces"), 2)), "stats_range", "$.stats.claimRaces"),
    Variant("I10", mutate(IDLE, _set(("reason",), "busy")), "idle_reason", "$.reason"),
)
