"""The value classes of the pull path (``contracts._shape.Frozen``) behave as the
``@dataclass(frozen=True, slots=True)`` classes they replaced: same constructor
signature, ``repr`` (secrets hidden), ``==``, ``hash``, immutability, copy and pickle.

Each class is compared with a real dataclass built here from the same field list, the
same ``repr=False`` fields, defaults and ``kw_only``: the reference is the dataclass
machinery itself, not a copy of its output.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
from typing import Any

import pytest

from qinglong_edge.config import EdgeConfig, ExecutionConfig, ListenerConfig, LocalApiConfig, WorkerConfig
from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.credentials import ApiToken, WorkerToken
from qinglong_edge.contracts.journal_records import AbandonedClaim, PendingClaim
from qinglong_edge.contracts.offer import ClaimAuthority, IdleResponse, OfferedResponse
from qinglong_edge.contracts.origin import Origin, parse_origin
from qinglong_edge.contracts.session import SessionProjection
from qinglong_edge.worker.delivery.pull import CycleReport, PullResult, SessionAuthority
from qinglong_edge.worker.delivery.session import SessionOutcome, SessionRecord
from qinglong_edge.worker.ingress.http_exchange import ResponseHead
from qinglong_edge.worker.ingress.material import Material
from qinglong_edge.worker.ingress.transport import TransportResponse
from qinglong_edge.worker.journal.ownerlock import OwnerRecord
from qinglong_edge.worker.journal.store import JournalOptions

SESSION_ID = "018f0000-0000-7000-8000-000000000001"
TOKEN = "T" * 43
SECRET = "S" * 43
ORIGIN = parse_origin("https://cluster.example:7443")
WORKER = WorkerConfig(ORIGIN, "edge-1", "/c", "/p", "/k", ("/a",), "/j", "/r", 15000, 64, 1000, 32, 30000, 1000,
                      60000, 20000, 60000, 0, 1)
RECORD = SessionRecord("edge-1", SESSION_ID, 1, 0, "active", 2000, 60000, "0" * 64, 1000, 1000)
CLAIM_VALUES: dict[str, Any] = {
    "revision": 0, "worker_id": "edge-1", "worker_session_id": SESSION_ID, "worker_generation": 1,
    "offer_id": "offer-1", "lease_token": TOKEN, "attempt_count": 0, "created_at_ms": 1000,
    "updated_at_ms": 1000, "last_attempt_at_ms": None, "next_attempt_at_ms": 1000,
}
OFFER = {"offerId": "offer-1", "deliveryKind": "new_claim", "candidate": {"runId": "run-1"}, "leaseToken": TOKEN}

#: class -> (positional args, keyword args) of one valid instance; every class the pull
#: path used to declare with @dataclass.
SAMPLES: dict[type[Frozen], tuple[tuple[Any, ...], dict[str, Any]]] = {
    Origin: (("cluster.example", 7443, False, "https://cluster.example:7443"), {}),
    WorkerConfig: ((ORIGIN, "edge-1", "/c", "/p", "/k", ("/a",), "/j", "/r", 15000, 64, 1000, 32, 30000, 1000, 60000,
                    20000, 60000, 0, 1), {}),
    ListenerConfig: (("127.0.0.1", 5700), {}),
    LocalApiConfig: ((ListenerConfig("127.0.0.1", 5700), "/db", "/pepper", 5000), {}),
    ExecutionConfig: ((2, 5000, 1000, 500, "/logs", 1 << 20, "auto"), {"max_run_pids": 24}),
    EdgeConfig: (("edge", "/state", WORKER, None, None), {}),
    WorkerToken: (("edge-1.primary", SECRET), {}),
    ApiToken: (("api-1", SECRET), {}),
    PendingClaim: ((), CLAIM_VALUES),
    AbandonedClaim: (("stale_session", 5000, "offer-1", "edge-1", SESSION_ID, 1, "a" * 64, 3, 2, 1000, 2000, 1500,
                      3000), {}),
    ClaimAuthority: (("edge-1", SESSION_ID, 1, "offer-1", TOKEN), {}),
    IdleResponse: (("no_candidates", {"pages": 1}, False), {}),
    OfferedResponse: ((OFFER, {"pages": 1}, False), {}),
    SessionProjection: (("edge-1", SESSION_ID, 1, 0, "active", 2000), {"replaced_session": True}),
    CycleReport: ((SessionOutcome(RECORD, "current"), PullResult("idle", "offer-1")), {"detail": "d"}),
    ResponseHead: ((1, 200, (("content-type", "application/json"),)), {}),
    Material: (("Worker ql3w_edge-1.primary_" + SECRET, b"CERT", b"KEY", (b"ANCHOR",), b"D" * 32), {}),
    JournalOptions: ((), {"maximum_entries": 8}),
    OwnerRecord: ((123, 456, "boot", "python3", 1000, 2000), {}),
    SessionAuthority: (("edge-1", SESSION_ID, 1), {}),
    PullResult: (("backoff", "offer-1"), {"next_attempt_at_ms": 9, "stats": {"pages": 1}}),
    SessionRecord: (("edge-1", SESSION_ID, 1, 0, "active", 2000, 60000, "0" * 64, 1000, 1000), {}),
    SessionOutcome: ((RECORD, "heartbeat"), {"replaced": True}),
    TransportResponse: ((200, b'{"secret":"body"}', "application/json", "req-1"), {}),
}

#: What each class hid from repr (``field(repr=False)``) and its defaults, as declared
#: when it was a dataclass.
HIDDEN = {
    WorkerToken: {"secret"}, ApiToken: {"secret"}, PendingClaim: {"lease_token"},
    ClaimAuthority: {"lease_token"}, OfferedResponse: {"offer"}, PullResult: {"stats"},
    Material: {"authorization", "certificate", "private_key", "anchors", "digest"}, TransportResponse: {"body"},
}
DEFAULTS: dict[type[Frozen], dict[str, Any]] = {
    WorkerConfig: {"log_directory": "/var/lib/qinglong-edge/logs/remote", "max_log_bytes": 1 << 20,
                   "log_minimum_free_bytes": 4 << 20, "capabilities_file": None, "labels": (),
                   "drain_timeout_ms": 60_000, "metrics_textfile": None},
    ExecutionConfig: {"max_run_pids": 0, "max_total_log_bytes": 4 << 20, "work_directory": "",
                      "max_run_memory_bytes": None},
    EdgeConfig: {"source": ""},
    LocalApiConfig: {"audit_maximum_entries": 5000, "audit_retention_ms": 2_592_000_000, "run_maximum_entries": 500,
                     "run_retention_ms": 2_592_000_000, "database_maximum_bytes": 8 << 20, "console": False,
                     "metrics": False},
    PendingClaim: {"schema_version": 1},
    SessionProjection: {"replaced_session": None}, CycleReport: {"error": None, "detail": "", "reason": None,
                                                                  "remedy": "", "inbox": None},
    JournalOptions: {"maximum_entries": 64, "abandoned_maximum_entries": 32, "retention_ms": 604_800_000,
                     "ownership_stale_ms": JournalOptions().ownership_stale_ms},
    PullResult: dict.fromkeys(("offer_id", "run_id", "reason", "next_attempt_at_ms", "http_status",
                               "retry_after_ms", "attempt_count", "stats", "cluster_code", "counted",
                               "detail")),
    SessionOutcome: {"replaced": False, "detail": ""},
    TransportResponse: {"source_sha256": None, "resumed": False},
}
SECRETS = (SECRET, TOKEN, "CERT", "KEY", "ANCHOR", "secret")


def _reference(cls: type[Frozen]) -> type:
    """A real frozen, slotted dataclass with ``cls``'s fields, repr=False fields and defaults."""
    specs = []
    for name in cls.__slots__:
        options: dict[str, Any] = {"repr": name not in HIDDEN.get(cls, set())}
        if name in DEFAULTS.get(cls, {}):
            options["default"] = DEFAULTS[cls][name]
        specs.append((name, Any, dataclasses.field(**options)))
    return dataclasses.make_dataclass(cls.__name__, specs, frozen=True, slots=True,
                                      kw_only=cls is PendingClaim)


def _pair(cls: type[Frozen]) -> tuple[Any, Any]:
    args, kwargs = SAMPLES[cls]
    return cls(*args, **kwargs), _reference(cls)(*args, **kwargs)


CLASSES = sorted(SAMPLES, key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_signature_is_the_dataclass_signature(cls: type[Frozen]) -> None:
    ours = inspect.signature(cls).parameters
    reference = inspect.signature(_reference(cls)).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == \
        [(p.name, p.kind, p.default) for p in reference.values()]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_repr_is_the_dataclass_repr_and_hides_secrets(cls: type[Frozen]) -> None:
    ours, reference = _pair(cls)
    if cls is OfferedResponse:  # its own __repr__ (kept from the dataclass): ids, never the offer
        assert repr(ours).startswith("OfferedResponse(offerId='offer-1', runId='run-1'")
    else:
        assert repr(ours) == repr(reference)
    assert not any(secret in repr(ours) for secret in SECRETS), repr(ours)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_equality_and_hash_are_the_dataclass_ones(cls: type[Frozen]) -> None:
    ours, reference = _pair(cls)
    twin, _ = _pair(cls)
    assert ours == twin
    assert not ours != twin  # noqa: SIM202 - __ne__ comes from __eq__
    assert ours != reference  # another class: NotImplemented both ways, as between dataclasses
    assert ours.__eq__(reference) is NotImplemented
    try:
        expected = hash(reference)
    except TypeError:  # a dict field: unhashable then, unhashable now
        with pytest.raises(TypeError):
            hash(ours)
    else:
        assert hash(ours) == expected == hash(twin)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_rejects_assignment_and_deletion(cls: type[Frozen]) -> None:
    ours, _ = _pair(cls)
    name = cls.__slots__[0]
    with pytest.raises(dataclasses.FrozenInstanceError, match=f"cannot assign to field '{name}'"):
        setattr(ours, name, 1)
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'other'"):
        ours.other = 1  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError, match=f"cannot delete field '{name}'"):
        delattr(ours, name)
    assert not hasattr(ours, "__dict__")


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_copy_and_pickle_keep_the_value(cls: type[Frozen]) -> None:
    ours, _ = _pair(cls)
    for clone in (copy.copy(ours), copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):  # noqa: S301 - our own bytes
        assert type(clone) is cls
        assert clone == ours


def test_pending_claim_replace_validates_like_dataclasses_replace() -> None:
    claim = PendingClaim(**CLAIM_VALUES)
    later = claim.replace(revision=1, attempt_count=1, last_attempt_at_ms=1000)
    assert (later.revision, later.attempt_count, later.lease_token) == (1, 1, TOKEN)
    assert claim.revision == 0
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        claim.replace(nope=1)
    from qinglong_edge.contracts.errors import ContractError

    with pytest.raises(ContractError):
        claim.replace(attempt_count=99)  # re-validated, as __post_init__ did


def test_rejects_positional_arguments_to_pending_claim() -> None:
    with pytest.raises(TypeError):
        PendingClaim(1, 0)  # type: ignore[misc]


def test_origin_from_the_parser_is_a_plain_value() -> None:
    assert parse_origin("https://Cluster.Example:7443/") == Origin("cluster.example", 7443, False,
                                                                    "https://cluster.example:7443")
