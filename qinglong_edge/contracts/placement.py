"""Remote Worker placement specs and worker capabilities, normalized like the cluster.

Sources: offer-delivery.md sections 2.4 ("Placement") and 5.1 ("Capabilities");
reference ``remoteWorkerPlacement.ts`` and ``remoteWorkerCompatibility.ts`` (newer
revision, which adds ``architectures``, ``supportTiers`` and ``protocolVersionRange``).

Both outputs feed a digest (the execution revision digest, the capabilities hash), so
objects are rebuilt in the reference's key order, arrays sorted as the reference sorts
them (JS default sort, or ICU ``localeCompare`` for runtime names and label keys; see
:mod:`qinglong_edge.contracts.collation`) and label maps emitted in JS own-key order.

Semver ranges (``protocolVersionRange``, ``runtimes[].versionRange``): validating
node-semver ranges exactly is impractical here; we accept any control-free string of
1-128 characters (offer-delivery.md 2.4, "Python note": the digest authenticates the
content). Versions (``protocolVersion``, ``runtimes[].version``) must be strict SemVer
2.0 (node-semver ``valid`` without ``loose``, no surrounding whitespace).

Error codes (``ContractError.code``): ``not_object``, ``not_array``, ``not_string``,
``not_integer``, ``key_set``, ``length`` (too many entries, string length),
``control_character``, ``pattern``, ``out_of_range``, ``duplicate``,
``architecture`` (not in the release support policy), ``support_tier`` (unknown, or
not the architecture's tier), ``semver``, ``placement_executor`` (``required.executors``
lacks ``remote-worker``).
"""

from __future__ import annotations

import re

from qinglong_edge.contracts._shape import child, exact_keys, int_value, object_value
from qinglong_edge.contracts.collation import icu_sort_key, js_own_key_order
from qinglong_edge.contracts.digest import sha256_hex
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import MAX_SAFE_INTEGER, string
from qinglong_edge.contracts.strictjson import dumps

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "ARCHITECTURES",
    "ARCHITECTURES_BY_SUPPORT_TIER",
    "PROTOCOL_VERSION",
    "REMOTE_WORKER_EXECUTOR",
    "SUPPORT_TIERS",
    "canonical_capabilities",
    "effective_placement",
    "normalize_capabilities",
    "normalize_placement",
    "support_tier_for",
    "worker_labels",
]

REMOTE_WORKER_EXECUTOR = "remote-worker"
PROTOCOL_VERSION = "1.0.0"
SUPPORT_TIERS: tuple[str, ...] = ("tier1", "candidate", "experimental", "legacy-only")
ARCHITECTURES_BY_SUPPORT_TIER: dict[str, tuple[str, ...]] = {
    "tier1": ("amd64", "arm64"),
    "candidate": ("ppc64le", "s390x"),
    "experimental": ("arm/v7",),
    "legacy-only": ("arm/v6", "386"),
}
ARCHITECTURES: tuple[str, ...] = tuple(a for tier in SUPPORT_TIERS for a in ARCHITECTURES_BY_SUPPORT_TIER[tier])
_TIER_BY_ARCHITECTURE = {a: tier for tier, archs in ARCHITECTURES_BY_SUPPORT_TIER.items() for a in archs}

MAX_PLACEMENT_VALUES = 16
MAX_PLACEMENT_PREFERENCES = 16
MAX_WORKER_RUNTIMES = 32
MAX_WORKER_LABELS = 32
MAX_WORKER_FEATURES = 32
MAX_WORKER_GPUS = 8
MAX_WORKER_CPU_CORES = 4096

_CAPABILITY_NAME = re.compile(r"[a-z0-9][a-z0-9._+-]*")
#: Compiled on first use (``re`` caches it): only an offer's placement has labels.
_LABEL_KEY = r"[A-Za-z0-9][A-Za-z0-9._/-]*"
_NUMERIC = r"(?:0|[1-9][0-9]*)"
_PRERELEASE_ID = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_SEMVER = re.compile(
    rf"v?{_NUMERIC}\.{_NUMERIC}\.{_NUMERIC}"
    rf"(?:-{_PRERELEASE_ID}(?:\.{_PRERELEASE_ID})*)?"
    r"(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?"
)

_REQUIRED_KEYS = (
    "architectures",
    "operatingSystems",
    "executors",
    "protocolVersionRange",
    "runtimes",
    "supportTiers",
    "labels",
    "minMemoryBytes",
    "minDiskBytes",
    "gpuVendor",
    "features",
)


def worker_labels(value: object, path: str) -> dict[str, str]:
    """A worker's label map as the capabilities carry it (at most 32 entries; keys
    ``[A-Za-z0-9][A-Za-z0-9._/-]*`` of at most 128 characters, values of 1-256
    characters without control characters), in canonical order.

    Raises:
        ContractError: ``not_object``, ``length``, ``pattern``, ``not_string``,
            ``control_character``.
    """
    return _labels(value, path, MAX_WORKER_LABELS)


def support_tier_for(architecture: str) -> str | None:
    """The support tier of a cluster architecture name (``arm64`` -> ``tier1``), else None."""
    return _TIER_BY_ARCHITECTURE.get(architecture)


def _name(value: object, path: str, max_length: int = 64) -> str:
    return string(value, path, max_length=max_length, pattern=_CAPABILITY_NAME)


def _array(value: object, path: str, max_items: int) -> list[Any]:
    if not isinstance(value, list):
        raise ContractError("not_array", path, "must be an array")
    if len(value) > max_items:
        raise ContractError("length", path, f"at most {max_items} entries")
    return value


def _unique_sorted(items: list[str], path: str) -> list[str]:
    if len(set(items)) != len(items):
        raise ContractError("duplicate", path, "contains duplicates")
    return sorted(items)


def _sorted_names(value: object, path: str, max_items: int, *, allow_empty: bool = True) -> list[str]:
    items = _array(value, path, max_items)
    if not allow_empty and not items:
        raise ContractError("length", path, "must not be empty")
    return _unique_sorted([_name(item, child(path, i)) for i, item in enumerate(items)], path)


def _enum_list(value: object, path: str, allowed: tuple[str, ...], code: str, max_items: int) -> list[str]:
    items = _array(value, path, max_items)
    for index, item in enumerate(items):
        if not isinstance(item, str) or item not in allowed:
            raise ContractError(code, child(path, index), "unknown value")
    return _unique_sorted(items, path)


def _labels(value: object, path: str, max_entries: int) -> dict[str, str]:
    """Label map: keys ``[A-Za-z0-9][A-Za-z0-9._/-]*`` <= 128, values 1-256 chars, no ctrl."""
    source = object_value(value, path)
    if len(source) > max_entries:
        raise ContractError("length", path, f"at most {max_entries} entries")
    label_key = re.compile(_LABEL_KEY)
    for key, item in source.items():
        string(key, child(path, key), max_length=128, pattern=label_key)
        string(item, child(path, key), max_length=256)
    ordered = sorted(source, key=icu_sort_key)
    return {key: source[key] for key in js_own_key_order(ordered)}


def _range_text(value: object, path: str) -> str:
    # node-semver range: accepted as a bounded, control-free string (module docstring).
    return string(value, path, max_length=128)


def _semver(value: object, path: str) -> str:
    text = string(value, path, max_length=64)
    # node-semver's valid() also caps each number at 2^53-1 (contracts/semver.py).
    if _SEMVER.fullmatch(text) is None or any(
            int(n) > MAX_SAFE_INTEGER for n in text.removeprefix("v").split("-")[0].split("+")[0].split(".")):
        raise ContractError("semver", path, "not a semantic version")
    return text


def _positive(value: object, path: str, high: int | None = None) -> int:
    return int_value(value, path, 1) if high is None else int_value(value, path, 1, high)


def _runtimes(value: object, path: str, max_items: int, *, capability: bool) -> list[dict[str, str]]:
    items = _array(value, path, max_items)
    result: list[dict[str, str]] = []
    for index, item in enumerate(items):
        at = child(path, index)
        runtime = object_value(item, at)
        if capability:
            exact_keys(runtime, ("name", "version"), at)
            result.append({
                "name": _name(runtime["name"], child(at, "name")),
                "version": _semver(runtime["version"], child(at, "version")),
            })
        else:
            exact_keys(runtime, ("name",), at, ("versionRange",))
            entry = {"name": _name(runtime["name"], child(at, "name"))}
            if "versionRange" in runtime:
                entry["versionRange"] = _range_text(runtime["versionRange"], child(at, "versionRange"))
            result.append(entry)
    if len({entry["name"] for entry in result}) != len(result):
        raise ContractError("duplicate", path, "repeats a runtime name")
    result.sort(key=lambda entry: icu_sort_key(entry["name"]))
    return result


def _required(value: object, path: str) -> dict[str, Any]:
    source = object_value(value, path)
    exact_keys(source, (), path, _REQUIRED_KEYS)
    out: dict[str, Any] = {}
    if "architectures" in source:
        out["architectures"] = _enum_list(
            source["architectures"], child(path, "architectures"), ARCHITECTURES, "architecture",
            MAX_PLACEMENT_VALUES,
        )
    for key in ("operatingSystems", "executors"):
        if key in source:
            out[key] = _sorted_names(source[key], child(path, key), MAX_PLACEMENT_VALUES)
    if "protocolVersionRange" in source:
        out["protocolVersionRange"] = _range_text(source["protocolVersionRange"], child(path, "protocolVersionRange"))
    if "runtimes" in source:
        out["runtimes"] = _runtimes(source["runtimes"], child(path, "runtimes"), MAX_PLACEMENT_VALUES,
                                    capability=False)
    if "supportTiers" in source:
        out["supportTiers"] = _enum_list(
            source["supportTiers"], child(path, "supportTiers"), SUPPORT_TIERS, "support_tier", len(SUPPORT_TIERS)
        )
    if "labels" in source:
        out["labels"] = _labels(source["labels"], child(path, "labels"), MAX_PLACEMENT_VALUES)
    for key in ("minMemoryBytes", "minDiskBytes"):
        if key in source:
            out[key] = _positive(source[key], child(path, key))
    if "gpuVendor" in source:
        out["gpuVendor"] = _name(source["gpuVendor"], child(path, "gpuVendor"))
    if "features" in source:
        out["features"] = _sorted_names(source["features"], child(path, "features"), MAX_PLACEMENT_VALUES)
    return out


def _preferred(value: object, path: str) -> list[dict[str, Any]]:
    items = _array(value, path, MAX_PLACEMENT_PREFERENCES)
    result: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        at = child(path, index)
        preference = object_value(item, at)
        exact_keys(preference, ("labels", "weight"), at)
        labels = _labels(preference["labels"], child(at, "labels"), MAX_PLACEMENT_VALUES)
        if not labels:
            raise ContractError("length", child(at, "labels"), "must not be empty")
        result.append({"labels": labels, "weight": _positive(preference["weight"], child(at, "weight"), 100)})
    return result


def normalize_placement(value: object, path: str = "$.placement") -> dict[str, Any]:
    """Normalize a placement spec (``normalizeRemoteWorkerPlacement``), no defaults added.

    Returns:
        ``{"required"?: {...}, "preferred"?: [...]}`` in canonical key order.

    Raises:
        ContractError: see the module docstring for the codes.
    """
    source = object_value(value, path)
    exact_keys(source, (), path, ("preferred", "required"))
    out: dict[str, Any] = {}
    if "required" in source:
        out["required"] = _required(source["required"], child(path, "required"))
    if "preferred" in source:
        out["preferred"] = _preferred(source["preferred"], child(path, "preferred"))
    return out


def effective_placement(value: object, path: str = "$.placement") -> dict[str, Any]:
    """The placement the cluster hashes (``effectiveRemoteWorkerPlacement``).

    ``required.executors`` must contain ``remote-worker`` when present; when absent it
    is inserted (in its canonical position), so ``{}`` becomes
    ``{"required":{"executors":["remote-worker"]}}``.

    Raises:
        ContractError: as :func:`normalize_placement`, or ``placement_executor``.
    """
    placement = normalize_placement(value, path)
    required = placement.get("required", {})
    executors = required.get("executors")
    if executors is None:
        rebuilt = {}
        for key in _REQUIRED_KEYS:
            if key == "executors":
                rebuilt[key] = [REMOTE_WORKER_EXECUTOR]
            elif key in required:
                rebuilt[key] = required[key]
        required = rebuilt
    elif REMOTE_WORKER_EXECUTOR not in executors:
        raise ContractError(
            "placement_executor", child(child(path, "required"), "executors"), "must require remote-worker"
        )
    out: dict[str, Any] = {"required": required}
    if "preferred" in placement:
        out["preferred"] = placement["preferred"]
    return out


def _capacity(value: object, path: str) -> dict[str, Any]:
    source = object_value(value, path)
    exact_keys(source, (), path, ("cpuCores", "diskBytes", "gpu", "memoryBytes"))
    out: dict[str, Any] = {}
    if "cpuCores" in source:
        out["cpuCores"] = _positive(source["cpuCores"], child(path, "cpuCores"), MAX_WORKER_CPU_CORES)
    for key in ("memoryBytes", "diskBytes"):
        if key in source:
            out[key] = _positive(source[key], child(path, key))
    if "gpu" in source:
        gpus = []
        for index, item in enumerate(_array(source["gpu"], child(path, "gpu"), MAX_WORKER_GPUS)):
            at = child(child(path, "gpu"), index)
            device = object_value(item, at)
            exact_keys(device, ("vendor",), at, ("memoryBytes", "model"))
            gpu: dict[str, Any] = {"vendor": _name(device["vendor"], child(at, "vendor"))}
            if "model" in device:
                gpu["model"] = string(device["model"], child(at, "model"), max_length=128)
            if "memoryBytes" in device:
                gpu["memoryBytes"] = _positive(device["memoryBytes"], child(at, "memoryBytes"))
            gpus.append(gpu)
        out["gpu"] = gpus
    return out


def normalize_capabilities(value: object, path: str = "$.capabilities") -> dict[str, Any]:
    """Normalize worker capabilities (``normalizeRemoteWorkerCapabilities``, offer-delivery.md 5.1).

    Returns:
        ``{architecture, executors, protocolVersion, supportTier[, operatingSystem,
        runtimes, labels, capacity, features]}`` in that order.

    Raises:
        ContractError: see the module docstring for the codes.
    """
    source = object_value(value, path)
    exact_keys(
        source,
        ("architecture", "executors", "protocolVersion", "supportTier"),
        path,
        ("capacity", "features", "labels", "operatingSystem", "runtimes"),
    )
    architecture = source["architecture"]
    if not isinstance(architecture, str) or architecture not in _TIER_BY_ARCHITECTURE:
        raise ContractError("architecture", child(path, "architecture"), "outside the release support policy")
    executors = _sorted_names(source["executors"], child(path, "executors"), 16, allow_empty=False)
    protocol_version = _semver(source["protocolVersion"], child(path, "protocolVersion"))
    tier = source["supportTier"]
    if not isinstance(tier, str) or tier not in SUPPORT_TIERS:
        raise ContractError("support_tier", child(path, "supportTier"), "unknown support tier")
    if _TIER_BY_ARCHITECTURE[architecture] != tier:
        raise ContractError("support_tier", child(path, "supportTier"), "not the architecture's support tier")
    out: dict[str, Any] = {
        "architecture": architecture,
        "executors": executors,
        "protocolVersion": protocol_version,
        "supportTier": tier,
    }
    if "operatingSystem" in source:
        out["operatingSystem"] = _name(source["operatingSystem"], child(path, "operatingSystem"), 32)
    if "runtimes" in source:
        out["runtimes"] = _runtimes(source["runtimes"], child(path, "runtimes"), MAX_WORKER_RUNTIMES, capability=True)
    if "labels" in source:
        out["labels"] = _labels(source["labels"], child(path, "labels"), MAX_WORKER_LABELS)
    if "capacity" in source:
        out["capacity"] = _capacity(source["capacity"], child(path, "capacity"))
    if "features" in source:
        out["features"] = _sorted_names(source["features"], child(path, "features"), MAX_WORKER_FEATURES)
    return out


def canonical_capabilities(value: object, path: str = "$.capabilities") -> tuple[dict[str, Any], str, str]:
    """Normalized capabilities, their canonical JSON and its SHA-256 hex.

    Returns:
        ``(capabilities, capabilitiesJson, capabilitiesHash)``; the JSON is
        ``JSON.stringify`` of the normalized object (compact, reference key order).
    """
    capabilities = normalize_capabilities(value, path)
    text = dumps(capabilities)
    return capabilities, text, sha256_hex(text.encode("utf-8"))
