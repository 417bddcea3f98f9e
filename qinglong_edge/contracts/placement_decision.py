"""Would the cluster place a task here? The reference's placement decision, for diagnostics.

Source: reference ``evaluateRemoteWorkerPlacement`` (``remoteWorkerPlacement.ts`` at
6265e31, with ``remoteWorkerCompatibility.ts``). The cluster decides; the device never
refuses work by this (``doctor --placement`` reports it, the double of the tests places
by it). Checked against vectors derived from the reference's rules with the real
node-semver package (tests/contracts/vectors/generate.mjs).

The rules, in the reference's order (each adds its mismatch code)::

    worker_unavailable  the session is not online, has no free slot or its lease ran out
                        (only when a session row is given)
    support_tier        the tier is not in required.supportTiers (default ["tier1"])
    protocol_version    protocolVersion outside ">=1.0.0 <2.0.0" or required.protocolVersionRange
    architecture        required.architectures (non-empty) lacks it
    operating_system    required.operatingSystems (non-empty) lacks operatingSystem (or none)
    executor            a required executor (default ["remote-worker"]) is missing
    runtime             a required runtime has no entry of that name whose version
                        satisfies its versionRange (node-semver, includePrerelease)
    label               a required label is absent or has another value
    memory / disk       capacity.memoryBytes / diskBytes (0 when absent) < the minimum
    gpu                 no capacity.gpu entry of required.gpuVendor
    feature             a required feature is missing

``score``: the sum of the weights of the preferences whose labels all match.

Errors: :class:`~qinglong_edge.contracts.errors.ContractError` for capabilities or a
placement the reference's normalizers reject (their codes, and ``semver_range`` for a
range node-semver's ``validRange`` rejects).
"""

from __future__ import annotations

from qinglong_edge.contracts._shape import Frozen, child
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.placement import REMOTE_WORKER_EXECUTOR, effective_placement, normalize_capabilities
from qinglong_edge.contracts.semver import satisfies, valid_range

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["MISMATCHES", "PROTOCOL_RANGE", "PlacementDecision", "evaluate_placement"]

#: ``REMOTE_WORKER_PROTOCOL_RANGE``: the protocol versions this cluster release speaks.
PROTOCOL_RANGE = ">=1.0.0 <2.0.0"
MISMATCHES: tuple[str, ...] = ("worker_unavailable", "support_tier", "protocol_version", "architecture",
                               "operating_system", "executor", "runtime", "label", "memory", "disk", "gpu",
                               "feature")


class PlacementDecision(Frozen):
    """``matches`` (no mismatch), ``score`` (>= 0) and ``mismatches`` (codes, rule order)."""

    __slots__ = ("matches", "score", "mismatches")  # noqa: RUF023 (field order)

    matches: bool
    score: int
    mismatches: tuple[str, ...]

    def __init__(self, matches: bool, score: int, mismatches: tuple[str, ...]) -> None:
        object.__setattr__(self, "matches", matches)
        object.__setattr__(self, "score", score)
        object.__setattr__(self, "mismatches", mismatches)

    def to_json(self) -> dict[str, object]:
        return {"matches": self.matches, "score": self.score, "mismatches": list(self.mismatches)}


def _compatible(version: str, range_text: str) -> bool:
    return satisfies(version, range_text, include_prerelease=True)


def _contains(actual: dict[str, str] | None, expected: dict[str, str]) -> bool:
    return all(actual is not None and actual.get(key) == value for key, value in expected.items())


def _check_ranges(required: dict[str, Any], path: str) -> None:
    at = child(path, "required")
    if "protocolVersionRange" in required and valid_range(required["protocolVersionRange"]) is None:
        raise ContractError("semver_range", child(at, "protocolVersionRange"), "not a node-semver range")
    for index, runtime in enumerate(required.get("runtimes", ())):
        if "versionRange" in runtime and valid_range(runtime["versionRange"]) is None:
            raise ContractError("semver_range", child(child(child(at, "runtimes"), index), "versionRange"),
                                "not a node-semver range")


def _unavailable(worker: dict[str, Any]) -> bool:
    return bool(worker["status"] != "online" or worker["availableSlots"] < 1
                or worker["leaseExpiresAtMs"] <= worker["observedAtMs"])


def evaluate_placement(capabilities: object, placement: object | None,
                       worker: dict[str, Any] | None = None) -> PlacementDecision:
    """The reference's decision for ``placement`` (None: the default) on ``capabilities``.

    Args:
        capabilities: the advertised capabilities (normalized here first).
        placement: a task's placement spec, as its execution revision carries it.
        worker: the cluster's session row facts ``{status, availableSlots,
            leaseExpiresAtMs, observedAtMs}`` (ms), or None to leave ``worker_unavailable``
            out (a diagnosis on the device: "if the session is online with a free slot").

    Raises:
        ContractError: see the module docstring.
    """
    caps = normalize_capabilities(capabilities)
    spec = effective_placement({} if placement is None else placement)
    required: dict[str, Any] = spec["required"]
    _check_ranges(required, "$.placement")
    found: list[str] = []
    if worker is not None and _unavailable(worker):
        found.append("worker_unavailable")
    if caps["supportTier"] not in required.get("supportTiers", ["tier1"]):
        found.append("support_tier")
    protocol = caps["protocolVersion"]
    if not _compatible(protocol, PROTOCOL_RANGE) or (
            "protocolVersionRange" in required and not _compatible(protocol, required["protocolVersionRange"])):
        found.append("protocol_version")
    if required.get("architectures") and caps["architecture"] not in required["architectures"]:
        found.append("architecture")
    if required.get("operatingSystems") and caps.get("operatingSystem") not in required["operatingSystems"]:
        found.append("operating_system")
    if any(executor not in caps["executors"] for executor in required.get("executors", [REMOTE_WORKER_EXECUTOR])):
        found.append("executor")
    runtimes = caps.get("runtimes", [])
    if any(not any(have["name"] == need["name"] and ("versionRange" not in need
                                                     or _compatible(have["version"], need["versionRange"]))
                   for have in runtimes)
           for need in required.get("runtimes", ())):
        found.append("runtime")
    labels = caps.get("labels")
    if "labels" in required and not _contains(labels, required["labels"]):
        found.append("label")
    capacity = caps.get("capacity", {})
    if "minMemoryBytes" in required and capacity.get("memoryBytes", 0) < required["minMemoryBytes"]:
        found.append("memory")
    if "minDiskBytes" in required and capacity.get("diskBytes", 0) < required["minDiskBytes"]:
        found.append("disk")
    if "gpuVendor" in required and not any(gpu["vendor"] == required["gpuVendor"]
                                           for gpu in capacity.get("gpu", ())):
        found.append("gpu")
    if any(feature not in caps.get("features", ()) for feature in required.get("features", ())):
        found.append("feature")
    score = sum(p["weight"] for p in spec.get("preferred", ()) if _contains(labels, p["labels"]))
    return PlacementDecision(not found, score, tuple(found))
