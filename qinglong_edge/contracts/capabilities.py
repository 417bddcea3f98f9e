"""What this device advertises: an operator's capabilities file, or what we probed.

Sources: reference ``workerProcessConfig.ts`` (6265e31, ``QL3_WORKER_CAPABILITIES_FILE``)
and ``remoteWorkerPlacement.ts`` (``normalizeRemoteWorkerCapabilities``); the file
handling around these pure rules (no symlink, a regular file, mode, read once) is
:mod:`qinglong_edge.worker.delivery.capabilities`.

**The file** (``worker.capabilitiesFile``) is the whole capabilities object, as the
reference worker reads it: strict UTF-8 and strict JSON (:mod:`.strictjson`: no
duplicate key, no NaN...), 2 B to 20 KiB, every key known and every required key
present (``architecture``, ``executors``, ``protocolVersion``, ``supportTier``; the
optional ``operatingSystem``, ``runtimes``, ``labels``, ``capacity``, ``features``),
``executors`` holding ``remote-worker`` and ``architecture`` equal to this device's.
The canonical JSON the cluster stores must fit 16 KiB.

**The probe** (no file): ``architecture``/``supportTier`` of the platform,
``executors: ["remote-worker"]``, ``protocolVersion`` 1.0.0, ``operatingSystem``
``linux``, ``runtimes: [{"name": "python", "version": <the interpreter that runs the
jobs, as semver>}]``, ``labels`` from the configuration, ``capacity`` with
``cpuCores``, ``memoryBytes`` and ``diskBytes`` when known.

Errors: :class:`~qinglong_edge.contracts.errors.ContractError` with the strict-JSON
codes, the capability codes of :mod:`.placement`, ``executor`` (no ``remote-worker``),
``architecture_mismatch`` and ``length`` (the canonical JSON over 16 KiB); ``path`` is
the JSON path inside the file (``$.labels.site``).
"""

from __future__ import annotations

from qinglong_edge.contracts._shape import utf8_length
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.placement import (
    MAX_WORKER_CPU_CORES,
    PROTOCOL_VERSION,
    REMOTE_WORKER_EXECUTOR,
    normalize_capabilities,
)
from qinglong_edge.contracts.strictjson import dumps, loads

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "MAX_CANONICAL_BYTES",
    "MAX_FILE_BYTES",
    "MIN_FILE_BYTES",
    "OPERATING_SYSTEM",
    "PYTHON_RUNTIME",
    "parse_capabilities_file",
    "probed_capabilities",
    "python_semver",
]

#: The reference's ``MAX_CAPABILITIES_FILE_BYTES`` and its 2-byte floor.
MAX_FILE_BYTES = 20 * 1024
MIN_FILE_BYTES = 2
#: ``MAX_WORKER_CAPABILITIES_BYTES``: the canonical JSON the cluster accepts.
MAX_CANONICAL_BYTES = 16 * 1024
OPERATING_SYSTEM = "linux"
PYTHON_RUNTIME = "python"
_PRERELEASE = {"alpha": "alpha", "beta": "beta", "candidate": "rc"}


def _fits(capabilities: dict[str, Any]) -> dict[str, Any]:
    size = utf8_length(dumps(capabilities))
    if size > MAX_CANONICAL_BYTES:
        raise ContractError("length", "$", f"the canonical advertisement is {size} bytes, over {MAX_CANONICAL_BYTES}")
    return capabilities


def parse_capabilities_file(data: bytes, *, architecture: str) -> dict[str, Any]:
    """The normalized capabilities of a capabilities file's bytes.

    Args:
        data: the file's content (its size is checked again here).
        architecture: this device's cluster architecture (``arm64``...).

    Raises:
        ContractError: see the module docstring.
    """
    value = loads(data, max_bytes=MAX_FILE_BYTES, min_bytes=MIN_FILE_BYTES)
    capabilities = normalize_capabilities(value, "$")
    if REMOTE_WORKER_EXECUTOR not in capabilities["executors"]:
        raise ContractError("executor", "$.executors", f"must contain {REMOTE_WORKER_EXECUTOR!r}")
    if capabilities["architecture"] != architecture:
        raise ContractError("architecture_mismatch", "$.architecture",
                            f"{capabilities['architecture']!r} is not this device's architecture ({architecture})")
    return _fits(capabilities)


def python_semver(version_info: tuple[Any, ...]) -> str:
    """``sys.version_info`` as a semantic version: ``(3, 11, 2, "final", 0)`` ->
    ``3.11.2``; ``(3, 13, 0, "candidate", 1)`` -> ``3.13.0-rc.1`` (``alpha.N``,
    ``beta.N``, ``rc.N``: semver orders them as Python does)."""
    major, minor, micro, level, serial = version_info[:5]
    text = f"{int(major)}.{int(minor)}.{int(micro)}"
    if level in _PRERELEASE:
        text += f"-{_PRERELEASE[level]}.{int(serial)}"
    return text


def probed_capabilities(
    base: dict[str, Any],
    *,
    python_version: str,
    labels: dict[str, str] | None = None,
    cpu_cores: int | None = None,
    memory_bytes: int | None = None,
    disk_bytes: int | None = None,
) -> dict[str, Any]:
    """The advertisement of a device without a capabilities file, normalized.

    Args:
        base: ``{architecture, executors, protocolVersion, supportTier}`` of the platform
            (:func:`qinglong_edge.worker.delivery.session.local_capabilities`).
        python_version: :func:`python_semver` of the jobs' interpreter.
        labels: ``worker.labels`` (validated by the configuration), or None.
        cpu_cores / memory_bytes / disk_bytes: what the probes found (None or < 1:
            unknown, left out; cores are capped at the cluster's 4096).

    Raises:
        ContractError: a capability rule is broken (a bug in the probes), or ``length``.
    """
    source: dict[str, Any] = {
        "architecture": base["architecture"],
        "executors": list(base.get("executors", [REMOTE_WORKER_EXECUTOR])),
        "protocolVersion": base.get("protocolVersion", PROTOCOL_VERSION),
        "supportTier": base["supportTier"],
        "operatingSystem": OPERATING_SYSTEM,
        "runtimes": [{"name": PYTHON_RUNTIME, "version": python_version}],
    }
    if labels:
        source["labels"] = dict(labels)
    capacity: dict[str, int] = {}
    if cpu_cores is not None and cpu_cores >= 1:
        capacity["cpuCores"] = min(cpu_cores, MAX_WORKER_CPU_CORES)
    if memory_bytes is not None and memory_bytes >= 1:
        capacity["memoryBytes"] = memory_bytes
    if disk_bytes is not None and disk_bytes >= 1:
        capacity["diskBytes"] = disk_bytes
    if capacity:
        source["capacity"] = capacity
    return _fits(normalize_capabilities(source, "$"))
