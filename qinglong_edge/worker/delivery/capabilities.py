"""This device's capabilities advertisement: the operator's file, or the probes.

:func:`advertisement` is what ``pull`` registers with (read once per process, at its
start: a resident pull keeps what it started with) and what ``doctor`` prints.

**With ``worker.capabilitiesFile``** the file is the whole advertisement (the reference
worker's ``QL3_WORKER_CAPABILITIES_FILE``; the rules on its content are
:func:`qinglong_edge.contracts.capabilities.parse_capabilities_file`). It is opened
``O_NOFOLLOW`` (a symlink is refused), must be a regular file of 2 B to 20 KiB that is
not writable by group or others (it may belong to root: it is the operator's), and is
read whole once. Any problem is one :class:`~qinglong_edge.errors.ConfigError`
``invalid_capabilities`` (exit 78) naming the file, the configuration key and the key
inside the file: nothing is registered or claimed with a wrong advertisement.

**Without it** the device probes (:func:`probe`):

* ``operatingSystem`` ``linux``; ``runtimes``: ``python`` at the version of the
  interpreter that runs the jobs (this one: the job wrapper is ``sys.executable``);
* ``capacity.cpuCores``: the CPUs this process may run on (``sched_getaffinity``);
* ``capacity.memoryBytes``: ``MemTotal``, or the job cgroup's limit when lower: the
  lowest ``memory.max`` (v2) / ``memory.limit_in_bytes`` (v1) from the cgroup the jobs'
  own cgroups are made under (``<agent's cgroup>/qinglong-edge``) up to the root;
* ``capacity.diskBytes``: the size of the file system of the jobs' scratch working
  directory (``<worker.logDirectory>/work``, or its nearest existing parent);
* ``labels``: ``worker.labels``.

What cannot change within a boot is cached in the runtime directory (RAM), keyed by the
kernel's boot id and the process's ``/proc/self/cgroup``: ``MemTotal`` and the paths of
the cgroup limit files (found in ``/proc/self/mountinfo``). Each start still reads the
limit files (a limit may be changed at run time), ``statvfs`` and the CPU affinity, so
the advertisement and its hash change exactly when one of these does.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys

from qinglong_edge.clock import boot_id
from qinglong_edge.contracts.capabilities import (
    MAX_FILE_BYTES,
    MIN_FILE_BYTES,
    parse_capabilities_file,
    probed_capabilities,
    python_semver,
)
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.session import capabilities_snapshot
from qinglong_edge.contracts.strictjson import dumps_bytes, loads
from qinglong_edge.errors import ConfigError, JournalError
from qinglong_edge.filecheck import stat_problem

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.config import WorkerConfig
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

__all__ = ["CACHE_NAME", "Advertisement", "Probe", "advertisement", "describe", "probe", "read_capabilities_file"]

#: The probe cache in the runtime directory.
CACHE_NAME = "capabilities.probe"
#: The job cgroups' directory under the agent's cgroup (qinglong_edge.process.cgroups.PARENT).
_JOB_PARENT = "qinglong-edge"
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_KEY = "worker.capabilitiesFile"


class Advertisement:
    """What the device advertises: ``capabilities`` (normalized), their canonical
    ``json`` and ``hash``, ``source`` (``file`` or ``probed``) and ``file``."""

    __slots__ = ("capabilities", "json", "hash", "source", "file")  # noqa: RUF023 (field order)

    def __init__(self, capabilities: dict[str, Any], source: str, file: str | None) -> None:
        self.capabilities = capabilities
        self.json, self.hash = capabilities_snapshot(capabilities)
        self.source = source
        self.file = file

    def to_json(self) -> dict[str, object]:
        return {"source": self.source, "file": self.file, "capabilities": self.capabilities,
                "capabilitiesHash": self.hash, "bytes": len(self.json.encode("utf-8"))}


def _invalid(path: str, detail: str, key: str | None = None) -> ConfigError:
    where = f"{path} ({_KEY})" + (f": {key}" if key else "")
    return ConfigError(f"{where}: {detail}", path=f"$.{_KEY}", code="invalid_capabilities")


def read_capabilities_file(path: str, architecture: str) -> dict[str, Any]:
    """The normalized capabilities in the operator's file (module docstring).

    Raises:
        ConfigError: ``invalid_capabilities``, one line naming the file and the key.
    """
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _invalid(path, "is a symlink (the file is opened without following links)") from None
        raise _invalid(path, f"cannot be opened: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        problem = stat_problem(st, path, directory=False, forbidden=0o022, owner=False)  # root may own it
        if problem is not None and problem.kind == "not_file":
            raise _invalid(path, "is not a regular file")
        if problem is not None:
            raise _invalid(path, f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}; "
                                 f"chmod go-w {path})")
        if not MIN_FILE_BYTES <= st.st_size <= MAX_FILE_BYTES:
            raise _invalid(path, f"is {st.st_size} bytes, outside {MIN_FILE_BYTES}..{MAX_FILE_BYTES}")
        chunks, size = [], 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise _invalid(path, f"cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)
    try:
        return parse_capabilities_file(data, architecture=architecture)
    except ContractError as exc:
        if exc.code in ("too_large", "too_small"):
            raise _invalid(path, f"is {len(data)} bytes, outside {MIN_FILE_BYTES}..{MAX_FILE_BYTES}") from None
        if exc.code == "invalid_utf8":
            raise _invalid(path, f"is not UTF-8 ({exc.detail})") from None
        if exc.code in ("invalid_json", "trailing_data", "duplicate_key", "depth_exceeded", "non_finite_number",
                        "integer_out_of_range", "lone_surrogate"):
            raise _invalid(path, f"is not strict JSON: {exc.code} ({exc.detail})", exc.path) from None
        raise _invalid(path, f"{exc.detail} ({exc.code})", exc.path) from None


class Probe:
    """What the probes found (None: unknown); ``memory_source`` names the figure used."""

    __slots__ = ("python_version", "cpu_cores", "memory_bytes", "memory_source", "disk_bytes",  # noqa: RUF023
                 "disk_path")

    def __init__(self, python_version: str, *, cpu_cores: int | None, memory_bytes: int | None,
                 memory_source: str, disk_bytes: int | None, disk_path: str) -> None:
        self.python_version = python_version
        self.cpu_cores = cpu_cores
        self.memory_bytes = memory_bytes
        self.memory_source = memory_source
        self.disk_bytes = disk_bytes
        self.disk_path = disk_path


def _read_text(path: str, limit: int = 65536) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def _mem_total() -> int | None:
    text = _read_text("/proc/meminfo", 8192) or ""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    return None


def _limit_files(cgroup_text: str, mountinfo: str) -> list[str]:
    """The memory limit files from the jobs' parent cgroup up to (not including) each root."""
    own: dict[str, str] = {}
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/"):
            if parts[0] == "0" and not parts[1]:
                own.setdefault("v2", parts[2])
            elif "memory" in parts[1].split(","):
                own.setdefault("v1", parts[2])
    mounts: dict[str, str] = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or fields[3] != "/":
            continue
        mount = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
        if tail[0] == "cgroup2":
            mounts.setdefault("v2", mount)
        elif tail[0] == "cgroup" and "memory" in tail[2].split(","):
            mounts.setdefault("v1", mount)
    found = []
    for kind, name in (("v2", "memory.max"), ("v1", "memory.limit_in_bytes")):
        if kind not in mounts or kind not in own or ".." in own[kind].split("/"):
            continue
        relative = [p for p in own[kind].split("/") if p] + [_JOB_PARENT]
        while relative:
            found.append(os.path.join(mounts[kind], *relative, name))
            relative.pop()
    return found


def _cgroup_limit(files: list[str]) -> int | None:
    lowest = None
    for path in files:
        text = (_read_text(path, 64) or "").strip()
        if text.isdigit():
            value = int(text)
            lowest = value if lowest is None else min(lowest, value)
    return lowest


def _boot_facts(runtime: RuntimeDirectory | None) -> tuple[int | None, list[str]]:
    """``(MemTotal, limit files)``: from the cache when it is this boot's and this
    cgroup's, else probed (and cached)."""
    cgroup_text = _read_text("/proc/self/cgroup", 8192) or ""
    key = {"bootId": boot_id(), "cgroup": cgroup_text}
    if runtime is not None and key["bootId"] is not None:
        with contextlib.suppress(JournalError, ContractError):
            data = runtime.read(CACHE_NAME)
            cached = loads(data, max_bytes=16_384) if data is not None else None
            if (isinstance(cached, dict) and cached.get("schemaVersion") == 1 and cached.get("bootId") == key["bootId"]
                    and cached.get("cgroup") == cgroup_text and isinstance(cached.get("limitFiles"), list)):
                total = cached.get("memTotalBytes")
                return (total if isinstance(total, int) else None), [str(f) for f in cached["limitFiles"]]
    total = _mem_total()
    files = _limit_files(cgroup_text, _read_text("/proc/self/mountinfo", 1 << 20) or "")
    if runtime is not None and key["bootId"] is not None:
        with contextlib.suppress(JournalError):
            runtime.write(CACHE_NAME, dumps_bytes({"schemaVersion": 1, **key, "memTotalBytes": total,
                                                   "limitFiles": files}) + b"\n")
    return total, files


def _disk(path: str) -> tuple[int | None, str]:
    path = os.path.normpath(path)
    while True:
        try:
            st = os.statvfs(path)
        except OSError:
            parent = os.path.dirname(path)
            if parent == path:
                return None, path
            path = parent
            continue
        return (st.f_blocks * st.f_frsize) or None, path


def probe(worker: WorkerConfig, runtime: RuntimeDirectory | None = None) -> Probe:
    """Probe this device (module docstring); ``runtime`` holds the per-boot cache."""
    try:
        cores: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count()
    total, files = _boot_facts(runtime)
    limit = _cgroup_limit(files)
    memory, source = total, "MemTotal"
    if limit is not None and (total is None or limit < total):
        memory, source = limit, "cgroup limit"
    disk, disk_path = _disk(os.path.join(worker.log_directory, "work"))
    return Probe(python_semver(sys.version_info), cpu_cores=cores, memory_bytes=memory, memory_source=source,
                 disk_bytes=disk, disk_path=disk_path)


def advertisement(worker: WorkerConfig, base: dict[str, Any], runtime: RuntimeDirectory | None = None,
                  found: Probe | None = None) -> Advertisement:
    """The advertisement of this device (module docstring).

    Args:
        base: :func:`qinglong_edge.worker.delivery.session.local_capabilities` (the platform's
            architecture and tier; its ``unsupported_architecture`` comes first).
        runtime: the runtime directory for the probe cache (None: no cache).
        found: a probe already made (doctor prints it too).

    Raises:
        ConfigError: ``invalid_capabilities`` (the file, or labels that do not fit).
    """
    path = worker.capabilities_file
    if path is not None:
        return Advertisement(read_capabilities_file(path, base["architecture"]), "file", path)
    found = found or probe(worker, runtime)
    try:
        capabilities = probed_capabilities(base, python_version=found.python_version, labels=dict(worker.labels),
                                           cpu_cores=found.cpu_cores, memory_bytes=found.memory_bytes,
                                           disk_bytes=found.disk_bytes)
    except ContractError as exc:
        raise ConfigError(f"$.worker.labels: the advertisement does not fit: {exc.detail}", path="$.worker.labels",
                          code="invalid_capabilities") from None
    return Advertisement(capabilities, "probed", None)


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def describe(advert: Advertisement, found: Probe | None = None) -> str:
    """One line for ``doctor``: where the advertisement comes from and what it says."""
    caps = advert.capabilities
    parts = [f"{caps['architecture']} ({caps['supportTier']})"]
    if "operatingSystem" in caps:
        parts.append(caps["operatingSystem"])
    parts += [f"{r['name']} {r['version']}" for r in caps.get("runtimes", ())]
    capacity = caps.get("capacity", {})
    if "cpuCores" in capacity:
        parts.append(f"{capacity['cpuCores']} CPU{'s' if capacity['cpuCores'] != 1 else ''}")
    if "memoryBytes" in capacity:
        why = f" ({found.memory_source})" if found is not None and advert.source == "probed" else ""
        parts.append(f"memory {_size(capacity['memoryBytes'])}{why}")
    if "diskBytes" in capacity:
        where = f" ({found.disk_path})" if found is not None and advert.source == "probed" else ""
        parts.append(f"disk {_size(capacity['diskBytes'])}{where}")
    if caps.get("labels"):
        parts.append("labels " + ",".join(f"{k}={v}" for k, v in caps["labels"].items()))
    if caps.get("features"):
        parts.append("features " + ",".join(caps["features"]))
    source = f"file {advert.file}" if advert.source == "file" else "probed"
    return f"{source}: {'; '.join(parts)}; {len(advert.json.encode('utf-8'))} bytes, hash {advert.hash[:12]}"
