"""Placement specs, capabilities and the two orderings (offer-delivery.md 2.4, 5.1)."""

from __future__ import annotations

from typing import Any

import pytest

from qinglong_edge.contracts.collation import is_array_index, js_own_key_order
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.placement import (
    canonical_capabilities,
    effective_placement,
    normalize_capabilities,
    normalize_placement,
    support_tier_for,
)
from qinglong_edge.contracts.strictjson import dumps

INGRESS_CAPABILITIES = {"architecture": "arm64", "executors": ["remote-worker"], "protocolVersion": "1.0.0",
                        "supportTier": "tier1"}
INGRESS_HASH = "b3d79017d91c477ffdf4a4dcc4ce9135ca053c921922ce0221920f905d8a2aa4"


# --- effective placement ---------------------------------------------------------------------------------


def test_empty_placement_requires_the_remote_worker_executor() -> None:
    assert effective_placement({}) == {"required": {"executors": ["remote-worker"]}}
    assert normalize_placement({}) == {}


def test_executors_default_is_inserted_in_its_canonical_position() -> None:
    placement = effective_placement({
        "preferred": [{"weight": 5, "labels": {"b": "1", "a": "2"}}],
        "required": {"features": ["z", "a"], "architectures": ["arm64", "amd64"], "minDiskBytes": 10},
    })
    assert dumps(placement) == (
        '{"required":{"architectures":["amd64","arm64"],"executors":["remote-worker"],"minDiskBytes":10,'
        '"features":["a","z"]},"preferred":[{"labels":{"a":"2","b":"1"},"weight":5}]}'
    )


def test_required_keys_are_emitted_in_reference_order() -> None:
    required = {
        "features": ["f"], "gpuVendor": "nvidia", "minDiskBytes": 1, "minMemoryBytes": 2, "labels": {"k": "v"},
        "supportTiers": ["tier1", "candidate"], "runtimes": [{"versionRange": ">=18", "name": "node"}],
        "protocolVersionRange": ">=1.0.0 <2.0.0", "executors": ["remote-worker", "docker"],
        "operatingSystems": ["linux"], "architectures": ["386"],
    }
    out = effective_placement({"required": required})["required"]
    assert list(out) == ["architectures", "operatingSystems", "executors", "protocolVersionRange", "runtimes",
                         "supportTiers", "labels", "minMemoryBytes", "minDiskBytes", "gpuVendor", "features"]
    assert out["executors"] == ["docker", "remote-worker"]
    assert out["supportTiers"] == ["candidate", "tier1"]
    assert out["runtimes"] == [{"name": "node", "versionRange": ">=18"}]


def test_runtimes_and_label_keys_sort_with_icu() -> None:
    out = effective_placement({"required": {
        "runtimes": [{"name": "python"}, {"name": "node"}, {"name": "node.js"}, {"name": "node-x"}],
        "labels": {"Zone": "a", "zone": "b", "arch": "c", "a-b": "d", "a_b": "e"},
    }})["required"]
    assert [r["name"] for r in out["runtimes"]] == ["node", "node-x", "node.js", "python"]
    assert list(out["labels"]) == ["a_b", "a-b", "arch", "zone", "Zone"]


def test_numeric_label_keys_come_first_as_in_a_js_object() -> None:
    out = effective_placement({"required": {"labels": {"b": "1", "10": "2", "9": "3", "09": "4", "a": "5"}}})
    # ICU order would be 09, 10, 9, a, b; JS hoists array indices (9, 10) in numeric order.
    assert list(out["required"]["labels"]) == ["9", "10", "09", "a", "b"]


def test_js_own_key_order() -> None:
    assert js_own_key_order(["b", "2", "a", "1", "4294967295", "4294967294"]) == [
        "1", "2", "4294967294", "b", "a", "4294967295"]
    assert [is_array_index(k) for k in ("0", "00", "-1", "1.0", "4294967294", "4294967295", "١")] == [
        True, False, False, False, True, False, False]


PR = "$.placement.required"


@pytest.mark.parametrize(
    ("placement", "code", "path"),
    [
        ([], "not_object", "$.placement"),
        ({"other": {}}, "key_set", "$.placement.other"),
        ({"required": None}, "not_object", PR),
        ({"required": {"cpu": 1}}, "key_set", f"{PR}.cpu"),
        ({"required": {"executors": ["docker"]}}, "placement_executor", f"{PR}.executors"),
        ({"required": {"executors": []}}, "placement_executor", f"{PR}.executors"),
        ({"required": {"executors": ["Remote-Worker"]}}, "pattern", f"{PR}.executors[0]"),
        ({"required": {"executors": ["remote-worker", "remote-worker"]}}, "duplicate", f"{PR}.executors"),
        ({"required": {"features": ["f"] * 17}}, "length", f"{PR}.features"),
        ({"required": {"features": ["x" * 65]}}, "length", f"{PR}.features[0]"),
        ({"required": {"architectures": ["riscv64"]}}, "architecture", f"{PR}.architectures[0]"),
        ({"required": {"architectures": ["arm64", "arm64"]}}, "duplicate", f"{PR}.architectures"),
        ({"required": {"supportTiers": ["tier2"]}}, "support_tier", f"{PR}.supportTiers[0]"),
        ({"required": {"supportTiers": ["tier1"] * 5}}, "length", f"{PR}.supportTiers"),
        ({"required": {"protocolVersionRange": ""}}, "length", f"{PR}.protocolVersionRange"),
        ({"required": {"protocolVersionRange": "x" * 129}}, "length", f"{PR}.protocolVersionRange"),
        ({"required": {"runtimes": [{"name": "node", "version": "1"}]}}, "key_set", f"{PR}.runtimes[0].version"),
        ({"required": {"runtimes": [{"name": "n"}, {"name": "n"}]}}, "duplicate", f"{PR}.runtimes"),
        ({"required": {"labels": {"-a": "v"}}}, "pattern", f'{PR}.labels["-a"]'),
        ({"required": {"labels": {"a": ""}}}, "length", f"{PR}.labels.a"),
        ({"required": {"labels": {"a": "x" * 257}}}, "length", f"{PR}.labels.a"),
        ({"required": {"labels": {f"k{i}": "v" for i in range(17)}}}, "length", f"{PR}.labels"),
        ({"required": {"minMemoryBytes": 0}}, "out_of_range", f"{PR}.minMemoryBytes"),
        ({"required": {"gpuVendor": "NVIDIA"}}, "pattern", f"{PR}.gpuVendor"),
        ({"preferred": {}}, "not_array", "$.placement.preferred"),
        ({"preferred": [{"labels": {}, "weight": 1}]}, "length", "$.placement.preferred[0].labels"),
        ({"preferred": [{"labels": {"a": "b"}, "weight": 101}]}, "out_of_range", "$.placement.preferred[0].weight"),
        ({"preferred": [{"labels": {"a": "b"}}]}, "key_set", "$.placement.preferred[0].weight"),
        ({"preferred": [{"labels": {"a": "b"}, "weight": 1}] * 17}, "length", "$.placement.preferred"),
    ],
)
def test_rejects_an_invalid_placement(placement: object, code: str, path: str) -> None:
    with pytest.raises(ContractError) as info:
        effective_placement(placement)
    assert (info.value.code, info.value.path) == (code, path)


# --- capabilities (5.1) ---------------------------------------------------------------------------------


def test_ingress_capabilities_hash_vector() -> None:
    capabilities, text, digest = canonical_capabilities(INGRESS_CAPABILITIES)
    assert text == ('{"architecture":"arm64","executors":["remote-worker"],"protocolVersion":"1.0.0",'
                    '"supportTier":"tier1"}')
    assert digest == INGRESS_HASH
    assert capabilities == INGRESS_CAPABILITIES


def test_capabilities_are_canonicalized() -> None:
    value: dict[str, Any] = {
        "features": ["z", "a"], "capacity": {"gpu": [{"memoryBytes": 1, "vendor": "amd", "model": "x"}],
                                             "diskBytes": 3, "cpuCores": 4, "memoryBytes": 2},
        "labels": {"b": "1", "A": "2"}, "runtimes": [{"version": "20.1.0", "name": "node"},
                                                     {"name": "bash", "version": "5.2.0"}],
        "operatingSystem": "linux", "supportTier": "experimental", "protocolVersion": "1.0.0",
        "executors": ["shell", "remote-worker"], "architecture": "arm/v7",
    }
    out = normalize_capabilities(value)
    assert list(out) == ["architecture", "executors", "protocolVersion", "supportTier", "operatingSystem",
                         "runtimes", "labels", "capacity", "features"]
    assert out["executors"] == ["remote-worker", "shell"]
    assert [r["name"] for r in out["runtimes"]] == ["bash", "node"]
    assert list(out["labels"]) == ["A", "b"]
    assert list(out["capacity"]) == ["cpuCores", "memoryBytes", "diskBytes", "gpu"]
    assert list(out["capacity"]["gpu"][0]) == ["vendor", "model", "memoryBytes"]


C = "$.capabilities"


@pytest.mark.parametrize(
    ("changes", "code", "path"),
    [
        ({"architecture": "mips"}, "architecture", f"{C}.architecture"),
        ({"supportTier": "candidate"}, "support_tier", f"{C}.supportTier"),
        ({"supportTier": "gold"}, "support_tier", f"{C}.supportTier"),
        ({"executors": []}, "length", f"{C}.executors"),
        ({"protocolVersion": "1.0"}, "semver", f"{C}.protocolVersion"),
        ({"protocolVersion": "01.0.0"}, "semver", f"{C}.protocolVersion"),
        ({"protocolVersion": " 1.0.0"}, "semver", f"{C}.protocolVersion"),
        ({"operatingSystem": "x" * 33}, "length", f"{C}.operatingSystem"),
        ({"runtimes": [{"name": "node", "version": "20"}]}, "semver", f"{C}.runtimes[0].version"),
        ({"runtimes": [{"name": "node"}]}, "key_set", f"{C}.runtimes[0].version"),
        ({"capacity": {"cpuCores": 4097}}, "out_of_range", f"{C}.capacity.cpuCores"),
        ({"capacity": {"gpu": [{"model": "x"}]}}, "key_set", f"{C}.capacity.gpu[0].vendor"),
        ({"capacity": {"ram": 1}}, "key_set", f"{C}.capacity.ram"),
        ({"labels": {f"k{i}": "v" for i in range(33)}}, "length", f"{C}.labels"),
        ({"extra": 1}, "key_set", f"{C}.extra"),
    ],
)
def test_rejects_invalid_capabilities(changes: dict[str, Any], code: str, path: str) -> None:
    with pytest.raises(ContractError) as info:
        normalize_capabilities({**INGRESS_CAPABILITIES, **changes})
    assert (info.value.code, info.value.path) == (code, path)


@pytest.mark.parametrize("version", ["1.0.0", "v1.2.3", "1.0.0-rc.1", "1.0.0-alpha-1+build.7", "10.20.30"])
def test_accepts_semver_versions(version: str) -> None:
    assert normalize_capabilities({**INGRESS_CAPABILITIES, "protocolVersion": version})["protocolVersion"] == version


@pytest.mark.parametrize(
    ("architecture", "tier"),
    [("amd64", "tier1"), ("arm64", "tier1"), ("ppc64le", "candidate"), ("s390x", "candidate"),
     ("arm/v7", "experimental"), ("arm/v6", "legacy-only"), ("386", "legacy-only"), ("mips", None)],
)
def test_support_tier_for(architecture: str, tier: str | None) -> None:
    assert support_tier_for(architecture) == tier
