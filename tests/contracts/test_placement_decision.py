"""The reference's placement decision (evaluateRemoteWorkerPlacement) against derived vectors.

tests/contracts/vectors/placement.jsonl: 500 generated (session row, capabilities,
placement) cases whose expected decisions come from generate.mjs's restatement of the
reference's rules with every semver question asked of the real node-semver 7.7.4.
"""

from __future__ import annotations

import collections
import json
import pathlib

import pytest

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.placement_decision import MISMATCHES, evaluate_placement

VECTORS = pathlib.Path(__file__).parent / "vectors" / "placement.jsonl"
CASES = [json.loads(line) for line in VECTORS.read_text(encoding="utf-8").splitlines()]
CAPS = {"architecture": "arm64", "executors": ["remote-worker"], "protocolVersion": "1.0.0", "supportTier": "tier1",
        "operatingSystem": "linux", "runtimes": [{"name": "python", "version": "3.11.2"}],
        "labels": {"site": "lab"}, "capacity": {"cpuCores": 4, "memoryBytes": 1 << 30, "diskBytes": 8 << 30}}


def _decide(case: dict[str, object]) -> dict[str, object]:
    try:
        return evaluate_placement(case["capabilities"], case["placement"], case["worker"]).to_json()  # type: ignore[arg-type]
    except ContractError:
        return {"error": "placement"}


def test_the_vectors_exercise_every_rule() -> None:
    counts: collections.Counter[str] = collections.Counter()
    for case in CASES:
        expected = case["expected"]
        counts["error" if "error" in expected else ("match" if expected["matches"] else "mismatch")] += 1
        counts.update(expected.get("mismatches", ()))
        counts["scored"] += bool(expected.get("score"))
    assert counts["match"] >= 100 and counts["mismatch"] >= 100 and counts["error"] >= 5 and counts["scored"] >= 50
    assert all(counts[code] >= 5 for code in MISMATCHES), counts


def test_agrees_with_the_reference_on_every_vector() -> None:
    wrong = [(case["placement"], case["expected"], _decide(case)) for case in CASES if _decide(case) != case["expected"]]
    assert wrong == []


def test_placement_defaults_require_tier1_and_the_remote_worker_executor() -> None:
    assert evaluate_placement(CAPS, None).to_json() == {"matches": True, "score": 0, "mismatches": []}
    tier = {**CAPS, "architecture": "arm/v7", "supportTier": "experimental"}
    assert evaluate_placement(tier, {}).mismatches == ("support_tier",)
    assert evaluate_placement(tier, {"required": {"supportTiers": ["experimental"]}}).matches


@pytest.mark.parametrize(("required", "mismatch"), [
    ({"minMemoryBytes": (1 << 30) + 1}, "memory"),
    ({"minDiskBytes": 9 << 30}, "disk"),
    ({"runtimes": [{"name": "python", "versionRange": ">=3.12"}]}, "runtime"),
    ({"labels": {"site": "home"}}, "label"),
    ({"operatingSystems": ["freebsd"]}, "operating_system"),
    ({"gpuVendor": "nvidia"}, "gpu"),
    ({"features": ["ipv6"]}, "feature"),
])
def test_each_requirement_this_device_lacks_is_named(required: dict[str, object], mismatch: str) -> None:
    assert evaluate_placement(CAPS, {"required": required}).mismatches == (mismatch,)


def test_preferred_labels_score_by_weight() -> None:
    placement = {"preferred": [{"labels": {"site": "lab"}, "weight": 7}, {"labels": {"site": "x"}, "weight": 50}]}
    assert evaluate_placement(CAPS, placement).score == 7


def test_an_invalid_range_is_an_invalid_placement() -> None:
    with pytest.raises(ContractError) as caught:
        evaluate_placement(CAPS, {"required": {"runtimes": [{"name": "python", "versionRange": "not-a-range"}]}})
    assert (caught.value.code, caught.value.path) == ("semver_range", "$.placement.required.runtimes[0].versionRange")
