"""The agent configuration: one JSON file, schema ``qinglong/edge-agent@v1``.

Lookup order: ``--config PATH``, else ``$QINGLONG_EDGE_CONFIG``, else
``/etc/qinglong-edge/config.json``. The file is strict JSON (see
:mod:`qinglong_edge.contracts.strictjson`) of at most 64 KiB, validated strictly:
unknown keys are rejected, every limit is range-checked, paths must be absolute,
and every error names the JSON path (``$.worker.requestTimeoutMs``).

Shape (camelCase, like the QingLong configs; defaults in brackets)::

    {
      "schema": "qinglong/edge-agent@v1",
      "profile": "edge" | "standalone",                       ["edge"]
      "stateDirectory": "/abs/dir",                            required
      "worker": {                                              absent: no Remote Worker role
        "origin": "https://cluster.example:7443",              required
        "workerId": "edge-1",                                  required
        "credentialFile": "/abs", "certificateFile": "/abs",   required
        "privateKeyFile": "/abs", "trustAnchorFiles": ["/abs", ...1-8], required
        "journalDirectory": "/abs",                 [<stateDirectory>/worker]
        "runtimeDirectory": "/abs",                 ["/run/qinglong-edge"; RAM: what is not precious]
        "requestTimeoutMs": 1000-60000,             [15000]
        "inboxMaximumEntries": 1-1024,              [64 edge, 256 standalone]
        "inboxRetentionMs": 60000-31536000000,      [604800000 = 7 days]
        "abandonedMaximumEntries": 1-1024,          [32]
        "ownershipStaleMs": 5000-300000,            [30000]
        "backoffBaseMs": 100-60000,                 [1000]
        "sessionLeaseDurationMs": 5000-600000,      [180000: survives a missed cron minute]
        "heartbeatIntervalMs": 5000-300000,         [10000; 2 x interval <= the session lease]
        "pullIntervalMs": 100-60000,                [2000 edge, 500 standalone]
        "splayMaxMs": 0-60000,                      [60000: this device's stable phase in the minute]
        "maxConcurrentRuns": 1-1024,                [1]
        "logDirectory": "/abs",                     [<execution.logDirectory>/remote, else <stateDirectory>/logs/remote]
        "maxLogBytes": 1024-67108864,               [execution.maxLogBytes, else 1048576: per remote attempt]
        "logMinimumFreeBytes": 0-1099511627776,     [4194304: free space kept beside a remote log's cap]
        "capabilitiesFile": "/abs",                 [none: advertise what the device probes]
        "labels": {"key": "value", ...0-32},        [none; not with capabilitiesFile]
        "drainTimeoutMs": 1000-600000,              [60000 edge, 300000 standalone: `drain`'s bound]
        "metricsTextfile": "/abs" | null            [null: off; a RAM path: node_exporter textfile per cycle]
      },
      "localApi": {                                            absent: no Local API role
        "listener": {"host": "127.0.0.1" | "::1", "port": 1024-65535},  required
        "databaseFile": "/abs",                     [<stateDirectory>/local.db]
        "pepperKeyringDirectory": "/abs",           [<stateDirectory>/pepper]
        "busyTimeoutMs": 100-30000,                 [5000]
        "auditMaximumEntries": 100-10000000,        [5000 edge, 200000 standalone]
        "auditRetentionMs": 60000-31536000000,      [2592000000 = 30 days edge, 90 days standalone]
        "runMaximumEntries": 10-1000000,            [500 edge, 20000 standalone: terminal Runs]
        "runRetentionMs": 60000-31536000000,        [2592000000 = 30 days edge, 90 days standalone]
        "databaseMaximumBytes": 1048576-68719476736, [8 MiB edge, 256 MiB standalone]
        "console": true | false,                    [false: the status console on /]
        "metrics": true | false                     [false: GET /metrics, Prometheus text, no credential]
      },
      "execution": {                                           absent: Runs are never launched
        "maxConcurrentRuns": 1-64,                  [2 edge, 8 standalone]
        "terminateGraceMs": 1-30000,                [5000]
        "killGraceMs": 1-30000,                     [1000]
        "controlIntervalMs": 250-3600000,           [1000]
        "logDirectory": "/abs",                     [<stateDirectory>/logs]
        "workDirectory": "/abs",                    [<stateDirectory>/work: cwd and HOME of a task that names none]
        "maxLogBytes": 1024-67108864,               [1048576]
        "maxTotalLogBytes": 1048576-1099511627776,  [4 MiB edge, 256 MiB standalone; >= maxLogBytes x maxConcurrentRuns]
        "cgroups": "auto" | "off",                  ["auto"]
        "maxRunPids": 0-4194304,                    [16 edge, 28 standalone; 0: no cap]
        "maxRunMemoryBytes": 4194304-1099511627776  [16 MiB edge, 512 MiB standalone: the job's memory leaf]
      }
    }

``execution`` needs ``localApi`` or ``worker``: with the Local API it configures Local Runs;
on a worker-only device (spec README "Limits without a Local API") it gives remote jobs
their grace periods, PID cap and cgroup mode, which otherwise take the same edge defaults
(:func:`qinglong_edge.worker.remote.job.remote_limits`).

Storage caps (issue 16; spec README "Decisions for storage on flash"): the security audit
(``auditMaximumEntries`` rows, ``auditRetentionMs``), terminal Runs with their attempts,
events and step runs (``runMaximumEntries``, ``runRetentionMs``), the database's used
bytes (``databaseMaximumBytes``: beyond it the oldest audit rows and terminal Runs go
first) and the Run logs (``execution.maxTotalLogBytes``: beyond it the logs of the oldest
terminal Runs are deleted, the Runs stay). ``serve`` prunes to them in bounded steps
(:mod:`qinglong_edge.local.retention`); ``admin prune`` does it at once. The edge
defaults keep the Local store within 12 MiB of flash (8 MiB database, 4 MiB logs): a
Run that ran takes ~7.1 KiB of database when written (8 events and their indexes), an
audit row ~0.36 KiB; after 20000 Runs pruned to 500 Runs and 5000 audit rows the file
holds at ~7 MiB (B-tree pages are not full once rows come and go), so the count caps,
not the byte cap, decide what goes (benchmarks/bench_storage_caps.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.origin import Origin, parse_origin
from qinglong_edge.contracts.strictjson import StrictJsonError, loads
from qinglong_edge.errors import ConfigError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_RUNTIME_DIRECTORY",
    "DEFAULT_RUN_MEMORY",
    "DEFAULT_SPLAY_MAX_MS",
    "SCHEMA",
    "EdgeConfig",
    "ExecutionConfig",
    "LocalApiConfig",
    "WorkerConfig",
    "load_config",
    "parse_config",
    "resolve_config_path",
]

SCHEMA = "qinglong/edge-agent@v1"
DEFAULT_CONFIG_PATH = "/etc/qinglong-edge/config.json"
#: ``worker.runtimeDirectory``: a RAM directory for what is not precious (spec README
#: "Decisions for storage on flash"; systemd ``RuntimeDirectory=qinglong-edge``; the
#: OpenWrt UCI defaults say ``/var/run/qinglong-edge``). See qinglong_edge.worker.journal.runtime.
DEFAULT_RUNTIME_DIRECTORY = "/run/qinglong-edge"
#: ``worker.splayMaxMs``: a fleet's devices spread over the whole cron minute by a stable
#: per-device phase plus a little jitter (qinglong_edge.worker.delivery.pacing; benchmarks/bench_fleet.py:
#: 50 s left the per-second load above a cluster sized at 1.1 x the mean).
DEFAULT_SPLAY_MAX_MS = 60_000
ENV_CONFIG = "QINGLONG_EDGE_CONFIG"
#: ``execution.maxRunPids`` by profile. Edge: Local 2 Runs x 16 + remote 1 x 16 + the
#: agent's own threads fit the 64-task envelope (docs/worker/remote.md, "PIDs").
DEFAULT_RUN_PIDS = {"edge": 16, "standalone": 28}
#: ``execution.maxRunMemoryBytes`` by profile: the memory limit of one job's cgroup leaf
#: (its wrapper is outside it). Edge: on a 128 MiB router, OpenWrt itself (~24 MiB), serve
#: and a resident pull (~22 MiB each), 3 job wrappers with the init (~4 MiB each) and
#: 2 Local + 1 remote jobs at 16 MiB fit (README, "What a remote job can do").
DEFAULT_RUN_MEMORY = {"edge": 16 * 1024 * 1024, "standalone": 512 * 1024 * 1024}
MIN_RUN_MEMORY = 4 * 1024 * 1024
MAX_RUN_MEMORY = 1 << 40
MAX_CONFIG_BYTES = 64 * 1024
_WORKER_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")


class WorkerConfig(Frozen):
    """Remote Worker role (ADR-0110). Times in ms, sizes in entries."""

    __slots__ = (  # noqa: RUF023 (field order)
        "origin",
        "worker_id",
        "credential_file",
        "certificate_file",
        "private_key_file",
        "trust_anchor_files",
        "journal_directory",
        "runtime_directory",
        "request_timeout_ms",
        "inbox_maximum_entries",
        "inbox_retention_ms",
        "abandoned_maximum_entries",
        "ownership_stale_ms",
        "backoff_base_ms",
        "session_lease_duration_ms",
        "heartbeat_interval_ms",
        "pull_interval_ms",
        "splay_max_ms",
        "max_concurrent_runs",
        "log_directory",
        "max_log_bytes",
        "log_minimum_free_bytes",
        "capabilities_file",
        "labels",
        "drain_timeout_ms",
        "metrics_textfile",
    )

    origin: Origin
    worker_id: str
    credential_file: str
    certificate_file: str
    private_key_file: str
    trust_anchor_files: tuple[str, ...]
    journal_directory: str
    runtime_directory: str
    request_timeout_ms: int
    inbox_maximum_entries: int
    inbox_retention_ms: int
    abandoned_maximum_entries: int
    ownership_stale_ms: int
    backoff_base_ms: int
    session_lease_duration_ms: int
    heartbeat_interval_ms: int
    pull_interval_ms: int
    splay_max_ms: int
    max_concurrent_runs: int
    #: Remote run logs and truncation facts (remote-execution.md 4.3: ``<id[5:7]>/<id>.log``).
    log_directory: str
    #: Bytes of output kept per remote attempt (the head; the rest only counted).
    max_log_bytes: int
    #: Free space a remote log must leave beside its cap (``statfs`` guard of 4.3).
    log_minimum_free_bytes: int
    #: The operator's capabilities file (the whole advertisement), or None: probed.
    capabilities_file: str | None
    #: ``worker.labels`` as (key, value) pairs in file order (validated like the
    #: capabilities' labels: contracts.placement.worker_labels).
    labels: tuple[tuple[str, str], ...]
    #: How long ``drain`` waits for every record to settle before it gives up (ms).
    drain_timeout_ms: int
    #: node_exporter textfile each pull cycle writes (a RAM path), None: off.
    metrics_textfile: str | None

    def __init__(  # noqa: PLR0917 (the dataclass signature)
        self,
        origin: Origin,
        worker_id: str,
        credential_file: str,
        certificate_file: str,
        private_key_file: str,
        trust_anchor_files: tuple[str, ...],
        journal_directory: str,
        runtime_directory: str,
        request_timeout_ms: int,
        inbox_maximum_entries: int,
        inbox_retention_ms: int,
        abandoned_maximum_entries: int,
        ownership_stale_ms: int,
        backoff_base_ms: int,
        session_lease_duration_ms: int,
        heartbeat_interval_ms: int,
        pull_interval_ms: int,
        splay_max_ms: int,
        max_concurrent_runs: int,
        log_directory: str = "/var/lib/qinglong-edge/logs/remote",
        max_log_bytes: int = 1024 * 1024,
        log_minimum_free_bytes: int = 4 * 1024 * 1024,
        capabilities_file: str | None = None,
        labels: tuple[tuple[str, str], ...] = (),
        drain_timeout_ms: int = 60_000,
        metrics_textfile: str | None = None,
    ) -> None:
        _set = object.__setattr__
        _set(self, "metrics_textfile", metrics_textfile)
        _set(self, "origin", origin)
        _set(self, "worker_id", worker_id)
        _set(self, "credential_file", credential_file)
        _set(self, "certificate_file", certificate_file)
        _set(self, "private_key_file", private_key_file)
        _set(self, "trust_anchor_files", trust_anchor_files)
        _set(self, "journal_directory", journal_directory)
        _set(self, "runtime_directory", runtime_directory)
        _set(self, "request_timeout_ms", request_timeout_ms)
        _set(self, "inbox_maximum_entries", inbox_maximum_entries)
        _set(self, "inbox_retention_ms", inbox_retention_ms)
        _set(self, "abandoned_maximum_entries", abandoned_maximum_entries)
        _set(self, "ownership_stale_ms", ownership_stale_ms)
        _set(self, "backoff_base_ms", backoff_base_ms)
        _set(self, "session_lease_duration_ms", session_lease_duration_ms)
        _set(self, "heartbeat_interval_ms", heartbeat_interval_ms)
        _set(self, "pull_interval_ms", pull_interval_ms)
        _set(self, "splay_max_ms", splay_max_ms)
        _set(self, "max_concurrent_runs", max_concurrent_runs)
        _set(self, "log_directory", log_directory)
        _set(self, "max_log_bytes", max_log_bytes)
        _set(self, "log_minimum_free_bytes", log_minimum_free_bytes)
        _set(self, "capabilities_file", capabilities_file)
        _set(self, "labels", labels)
        _set(self, "drain_timeout_ms", drain_timeout_ms)


class ListenerConfig(Frozen):
    """Loopback listener of the Local API (local-api.md section 2.1)."""

    __slots__ = ("host", "port")

    host: str
    port: int

    def __init__(self, host: str, port: int) -> None:
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "port", port)


class LocalApiConfig(Frozen):
    """Local API role (ADR-0372)."""

    __slots__ = (  # noqa: RUF023 (field order)
        "listener",
        "database_file",
        "pepper_keyring_directory",
        "busy_timeout_ms",
        "audit_maximum_entries",
        "audit_retention_ms",
        "run_maximum_entries",
        "run_retention_ms",
        "database_maximum_bytes",
        "console",
        "metrics",
    )

    listener: ListenerConfig
    database_file: str
    pepper_keyring_directory: str
    busy_timeout_ms: int
    #: Security audit rows kept (oldest pruned first).
    audit_maximum_entries: int
    #: Audit rows older than this (ms) are pruned.
    audit_retention_ms: int
    #: Terminal Runs kept, with their attempts, events and step runs (oldest pruned first).
    run_maximum_entries: int
    #: Terminal Runs that finished longer ago than this (ms) are pruned.
    run_retention_ms: int
    #: Cap of the database's used bytes (pages in use x page size).
    database_maximum_bytes: int
    #: Serve the status console (``/``, ``/console.css``, ``/console.js``).
    console: bool
    #: Serve ``GET /metrics`` (Prometheus text format, no credential).
    metrics: bool

    def __init__(  # noqa: PLR0917 (the dataclass signature)
        self,
        listener: ListenerConfig,
        database_file: str,
        pepper_keyring_directory: str,
        busy_timeout_ms: int,
        audit_maximum_entries: int = 5000,
        audit_retention_ms: int = 2_592_000_000,
        run_maximum_entries: int = 500,
        run_retention_ms: int = 2_592_000_000,
        database_maximum_bytes: int = 8 * 1024 * 1024,
        console: bool = False,
        metrics: bool = False,
    ) -> None:
        _set = object.__setattr__
        _set(self, "console", console)
        _set(self, "metrics", metrics)
        _set(self, "listener", listener)
        _set(self, "database_file", database_file)
        _set(self, "pepper_keyring_directory", pepper_keyring_directory)
        _set(self, "busy_timeout_ms", busy_timeout_ms)
        _set(self, "audit_maximum_entries", audit_maximum_entries)
        _set(self, "audit_retention_ms", audit_retention_ms)
        _set(self, "run_maximum_entries", run_maximum_entries)
        _set(self, "run_retention_ms", run_retention_ms)
        _set(self, "database_maximum_bytes", database_maximum_bytes)


class ExecutionConfig(Frozen):
    """Execution controller (local-api.md section 7). Times in ms, sizes in bytes."""

    __slots__ = (  # noqa: RUF023 (field order)
        "max_concurrent_runs",
        "terminate_grace_ms",
        "kill_grace_ms",
        "control_interval_ms",
        "log_directory",
        "max_log_bytes",
        "cgroups",
        "max_run_pids",
        "max_total_log_bytes",
        "work_directory",
        "max_run_memory_bytes",
    )

    max_concurrent_runs: int
    terminate_grace_ms: int
    kill_grace_ms: int
    control_interval_ms: int
    log_directory: str
    max_log_bytes: int
    cgroups: str
    #: Per-Run ``pids.max`` (tasks: processes and threads); 0: no cap.
    max_run_pids: int
    #: Cap of all Run logs in ``log_directory`` (bytes allocated on disk).
    max_total_log_bytes: int
    #: Working directory and ``HOME`` of a Run whose task names none (``""``: the caller
    #: must give one, e.g. tests; the parser's default is ``<stateDirectory>/work``).
    work_directory: str
    #: The memory limit of each job's cgroup leaf (bytes; ``None``: no leaf, e.g. tests).
    max_run_memory_bytes: int | None

    def __init__(self, max_concurrent_runs: int, terminate_grace_ms: int, kill_grace_ms: int,  # noqa: PLR0917 (the dataclass signature)
                 control_interval_ms: int, log_directory: str, max_log_bytes: int, cgroups: str,
                 max_run_pids: int = 0, max_total_log_bytes: int = 4 * 1024 * 1024, work_directory: str = "",
                 max_run_memory_bytes: int | None = None) -> None:
        _set = object.__setattr__
        _set(self, "max_concurrent_runs", max_concurrent_runs)
        _set(self, "terminate_grace_ms", terminate_grace_ms)
        _set(self, "kill_grace_ms", kill_grace_ms)
        _set(self, "control_interval_ms", control_interval_ms)
        _set(self, "log_directory", log_directory)
        _set(self, "max_log_bytes", max_log_bytes)
        _set(self, "cgroups", cgroups)
        _set(self, "max_run_pids", max_run_pids)
        _set(self, "max_total_log_bytes", max_total_log_bytes)
        _set(self, "work_directory", work_directory)
        _set(self, "max_run_memory_bytes", max_run_memory_bytes)


class EdgeConfig(Frozen):
    """A validated ``qinglong/edge-agent@v1`` configuration.

    A role whose section is absent is ``None`` and disabled.
    """

    __slots__ = ("profile", "state_directory", "worker", "local_api", "execution", "source")  # noqa: RUF023 (field order)

    profile: str
    state_directory: str
    worker: WorkerConfig | None
    local_api: LocalApiConfig | None
    execution: ExecutionConfig | None
    source: str

    def __init__(self, profile: str, state_directory: str, worker: WorkerConfig | None,  # noqa: PLR0917 (the dataclass signature)
                 local_api: LocalApiConfig | None, execution: ExecutionConfig | None, source: str = "") -> None:
        _set = object.__setattr__
        _set(self, "profile", profile)
        _set(self, "state_directory", state_directory)
        _set(self, "worker", worker)
        _set(self, "local_api", local_api)
        _set(self, "execution", execution)
        _set(self, "source", source)


class _Section:
    """Reads fields of one JSON object, tracking which keys were consumed."""

    def __init__(self, value: object, path: str) -> None:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: must be an object", path=path)
        self.data: Mapping[str, Any] = value
        self.path = path
        self.seen: set[str] = set()

    def _at(self, key: str) -> str:
        return f"{self.path}.{key}"

    def _get(self, key: str, required: bool) -> Any:
        self.seen.add(key)
        if key not in self.data:
            if required:
                raise ConfigError(f"{self._at(key)}: is required", path=self._at(key))
            return None
        return self.data[key]

    def integer(self, key: str, low: int, high: int, default: int) -> int:
        value = self._get(key, required=False)
        if value is None and key not in self.data:
            return default
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ConfigError(
                f"{self._at(key)}: must be an integer from {low} to {high}", path=self._at(key)
            )
        return value

    def choice(self, key: str, allowed: tuple[str, ...], default: str) -> str:
        value = self._get(key, required=False)
        if value is None and key not in self.data:
            return default
        if value not in allowed:
            raise ConfigError(
                f"{self._at(key)}: must be one of {', '.join(allowed)}", path=self._at(key)
            )
        return str(value)

    def string(self, key: str, check: Callable[[str], bool], what: str) -> str:
        value = self._get(key, required=True)
        if not isinstance(value, str) or not check(value):
            raise ConfigError(f"{self._at(key)}: must be {what}", path=self._at(key))
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key, required=False)
        if value is None and key not in self.data:
            return default
        if not isinstance(value, bool):
            raise ConfigError(f"{self._at(key)}: must be true or false", path=self._at(key))
        return value

    def optional_path(self, key: str) -> str | None:
        """An absolute path, or None when absent or ``null``."""
        value = self._get(key, required=False)
        return None if value is None else _absolute(value, self._at(key))

    def path_value(self, key: str, default: str | None = None) -> str:
        value = self._get(key, required=default is None)
        if value is None and key not in self.data and default is not None:
            return default
        return _absolute(value, self._at(key))

    def section(self, key: str) -> _Section | None:
        value = self._get(key, required=False)
        if value is None and key not in self.data:
            return None
        return _Section(value, self._at(key))

    def done(self) -> None:
        unknown = [key for key in self.data if key not in self.seen]
        if unknown:
            at = self._at(unknown[0])
            raise ConfigError(f"{at}: unknown key", path=at)


def _absolute(value: object, path: str) -> str:
    if (
        not isinstance(value, str)
        or not value.startswith("/")
        or len(value) > 4096
        or any(c in value for c in "\0\r\n")
    ):
        raise ConfigError(f"{path}: must be an absolute path", path=path)
    return os.path.normpath(value)


_DAY_MS = 86_400_000
_MIB = 1024 * 1024


def _worker_id(value: str) -> bool:
    return (
        1 <= len(value) <= 128
        and value[0].isascii()
        and value[0].isalnum()
        and all(c in _WORKER_ID_CHARS for c in value)
    )


def _parse_worker(sec: _Section, state_dir: str, profile: str, execution: ExecutionConfig | None) -> WorkerConfig:
    origin_text = sec.string("origin", lambda v: True, "a string")
    try:
        origin = parse_origin(origin_text)
    except ContractError as exc:
        raise ConfigError(f"{sec._at('origin')}: {exc.detail}", path=sec._at("origin")) from None
    worker_id = sec.string("workerId", _worker_id, "a worker id ([A-Za-z0-9][A-Za-z0-9._:-]*, 1-128)")
    credential = sec.path_value("credentialFile")
    certificate = sec.path_value("certificateFile")
    key = sec.path_value("privateKeyFile")
    anchors_raw = sec._get("trustAnchorFiles", required=True)
    at = sec._at("trustAnchorFiles")
    if not isinstance(anchors_raw, list) or not 1 <= len(anchors_raw) <= 8:
        raise ConfigError(f"{at}: must be a list of 1 to 8 absolute paths", path=at)
    anchors = tuple(_absolute(item, f"{at}[{i}]") for i, item in enumerate(anchors_raw))
    config = WorkerConfig(
        origin=origin,
        worker_id=worker_id,
        credential_file=credential,
        certificate_file=certificate,
        private_key_file=key,
        trust_anchor_files=anchors,
        journal_directory=sec.path_value("journalDirectory", os.path.join(state_dir, "worker")),
        runtime_directory=sec.path_value("runtimeDirectory", DEFAULT_RUNTIME_DIRECTORY),
        request_timeout_ms=sec.integer("requestTimeoutMs", 1000, 60000, 15000),
        inbox_maximum_entries=sec.integer(
            "inboxMaximumEntries", 1, 1024, 64 if profile == "edge" else 256
        ),
        inbox_retention_ms=sec.integer("inboxRetentionMs", 60_000, 31_536_000_000, 604_800_000),
        abandoned_maximum_entries=sec.integer("abandonedMaximumEntries", 1, 1024, 32),
        ownership_stale_ms=sec.integer("ownershipStaleMs", 5000, 300_000, 30_000),
        backoff_base_ms=sec.integer("backoffBaseMs", 100, 60_000, 1000),
        session_lease_duration_ms=sec.integer("sessionLeaseDurationMs", 5000, 600_000, 180_000),
        heartbeat_interval_ms=sec.integer("heartbeatIntervalMs", 5000, 300_000, 10_000),
        pull_interval_ms=sec.integer("pullIntervalMs", 100, 60_000, 2000 if profile == "edge" else 500),
        splay_max_ms=sec.integer("splayMaxMs", 0, 60_000, DEFAULT_SPLAY_MAX_MS),
        max_concurrent_runs=sec.integer("maxConcurrentRuns", 1, 1024, 1),
        # Spec README "Limits without a Local API": log settings follow the execution
        # section when there is one, else the same edge defaults.
        log_directory=sec.path_value("logDirectory", os.path.join(
            execution.log_directory if execution is not None else os.path.join(state_dir, "logs"), "remote")),
        max_log_bytes=sec.integer("maxLogBytes", 1024, 64 * _MIB,
                                  execution.max_log_bytes if execution is not None else _MIB),
        log_minimum_free_bytes=sec.integer("logMinimumFreeBytes", 0, 1024 * 1024 * _MIB, 4 * _MIB),
        capabilities_file=sec.path_value("capabilitiesFile", "") or None,
        labels=_labels(sec),
        drain_timeout_ms=sec.integer("drainTimeoutMs", 1000, 600_000, 60_000 if profile == "edge" else 300_000),
        metrics_textfile=sec.optional_path("metricsTextfile"),
    )
    sec.done()
    if config.capabilities_file is not None and config.labels:
        at = sec._at("labels")
        raise ConfigError(f"{at}: not with capabilitiesFile (the file is the whole advertisement: put the labels "
                          "in it)", path=at)
    if 2 * config.heartbeat_interval_ms > config.session_lease_duration_ms:
        at = sec._at("heartbeatIntervalMs")
        raise ConfigError(f"{at}: twice the interval must not exceed sessionLeaseDurationMs (offer-delivery.md 5.1)",
                          path=at)
    return config


def _labels(sec: _Section) -> tuple[tuple[str, str], ...]:
    """``worker.labels``: the capabilities' label rules (at most 32; keys
    ``[A-Za-z0-9][A-Za-z0-9._/-]*`` of 1-128, values of 1-256 characters, no control)."""
    value = sec._get("labels", required=False)
    if value is None and "labels" not in sec.data:
        return ()
    from qinglong_edge.contracts.placement import worker_labels  # only a config with labels pays for it

    at = sec._at("labels")
    try:
        worker_labels(value, at)
    except ContractError as exc:
        raise ConfigError(f"{exc.path}: {exc.detail}", path=exc.path) from None
    return tuple(value.items())


def _parse_local_api(sec: _Section, state_dir: str, profile: str) -> LocalApiConfig:
    listener_sec = sec.section("listener")
    if listener_sec is None:
        at = sec._at("listener")
        raise ConfigError(f"{at}: is required", path=at)
    host = listener_sec.string("host", lambda v: v in ("127.0.0.1", "::1"), "127.0.0.1 or ::1")
    port_at = listener_sec._at("port")
    if "port" not in listener_sec.data:
        raise ConfigError(f"{port_at}: is required", path=port_at)
    port = listener_sec.integer("port", 1024, 65535, 0)
    listener_sec.done()
    edge = profile == "edge"
    config = LocalApiConfig(
        listener=ListenerConfig(host=host, port=port),
        database_file=sec.path_value("databaseFile", os.path.join(state_dir, "local.db")),
        pepper_keyring_directory=sec.path_value(
            "pepperKeyringDirectory", os.path.join(state_dir, "pepper")
        ),
        busy_timeout_ms=sec.integer("busyTimeoutMs", 100, 30_000, 5000),
        audit_maximum_entries=sec.integer(
            "auditMaximumEntries", 100, 10_000_000, 5000 if edge else 200_000
        ),
        audit_retention_ms=sec.integer("auditRetentionMs", 60_000, 31_536_000_000, (30 if edge else 90) * _DAY_MS),
        run_maximum_entries=sec.integer("runMaximumEntries", 10, 1_000_000, 500 if edge else 20_000),
        run_retention_ms=sec.integer("runRetentionMs", 60_000, 31_536_000_000, (30 if edge else 90) * _DAY_MS),
        database_maximum_bytes=sec.integer(
            "databaseMaximumBytes", _MIB, 64 * 1024 * _MIB, (8 if edge else 256) * _MIB
        ),
        console=sec.boolean("console", False),
        metrics=sec.boolean("metrics", False),
    )
    sec.done()
    return config


def _parse_execution(sec: _Section, state_dir: str, profile: str) -> ExecutionConfig:
    config = ExecutionConfig(
        max_concurrent_runs=sec.integer("maxConcurrentRuns", 1, 64, 2 if profile == "edge" else 8),
        terminate_grace_ms=sec.integer("terminateGraceMs", 1, 30_000, 5000),
        kill_grace_ms=sec.integer("killGraceMs", 1, 30_000, 1000),
        control_interval_ms=sec.integer("controlIntervalMs", 250, 3_600_000, 1000),
        log_directory=sec.path_value("logDirectory", os.path.join(state_dir, "logs")),
        work_directory=sec.path_value("workDirectory", os.path.join(state_dir, "work")),
        max_log_bytes=sec.integer("maxLogBytes", 1024, 64 * 1024 * 1024, 1024 * 1024),
        cgroups=sec.choice("cgroups", ("auto", "off"), "auto"),
        max_run_pids=sec.integer("maxRunPids", 0, 4_194_304, DEFAULT_RUN_PIDS[profile]),
        max_run_memory_bytes=sec.integer("maxRunMemoryBytes", MIN_RUN_MEMORY, MAX_RUN_MEMORY,
                                         DEFAULT_RUN_MEMORY[profile]),
        max_total_log_bytes=sec.integer(
            "maxTotalLogBytes", _MIB, 1024 * 1024 * _MIB, (4 if profile == "edge" else 256) * _MIB
        ),
    )
    # The logs of Runs in flight are never pruned, so a total cap below what they may hold
    # together could not be met: refuse it rather than run over it silently.
    in_flight = config.max_log_bytes * config.max_concurrent_runs
    if config.max_total_log_bytes < in_flight:
        at = sec._at("maxTotalLogBytes")
        raise ConfigError(
            f"{at}: must be at least {in_flight} (maxLogBytes {config.max_log_bytes} x maxConcurrentRuns "
            f"{config.max_concurrent_runs}: the logs of Runs in flight are never pruned)",
            path=at,
        )
    sec.done()
    return config


def parse_config(document: object, source: str = "") -> EdgeConfig:
    """Validate a decoded configuration document.

    Raises:
        ConfigError: naming the JSON path of the first problem.
    """
    root = _Section(document, "$")
    root.string("schema", lambda v: v == SCHEMA, f'"{SCHEMA}"')
    profile = root.choice("profile", ("edge", "standalone"), "edge")
    state_dir = root.path_value("stateDirectory")
    worker_sec = root.section("worker")
    local_sec = root.section("localApi")
    exec_sec = root.section("execution")
    local_api = _parse_local_api(local_sec, state_dir, profile) if local_sec else None
    execution = _parse_execution(exec_sec, state_dir, profile) if exec_sec else None
    worker = _parse_worker(worker_sec, state_dir, profile, execution) if worker_sec else None
    root.done()
    if execution is not None and local_api is None and worker is None:
        raise ConfigError("$.execution: needs the localApi or the worker section", path="$.execution")
    return EdgeConfig(
        profile=profile,
        state_directory=state_dir,
        worker=worker,
        local_api=local_api,
        execution=execution,
        source=source,
    )


def resolve_config_path(explicit: str | None) -> str:
    """``--config``, else ``$QINGLONG_EDGE_CONFIG``, else the default path. An empty
    variable counts as unset (the shell's convention).

    Raises:
        ConfigError: ``--config ""`` (``--config "$CFG"`` with ``CFG`` unset): falling back
            would read another file, the device's own configuration among them.
    """
    if explicit is not None:
        if not explicit:
            raise ConfigError("--config is empty: it names no file (give the path, or leave the option out)")
        return explicit
    return os.environ.get(ENV_CONFIG) or DEFAULT_CONFIG_PATH


def load_config(explicit: str | None = None) -> EdgeConfig:
    """Read, decode and validate the configuration file.

    Raises:
        ConfigError: the file is missing, unreadable, too large, not strict JSON, or
            invalid; the message names the file and the JSON path.
    """
    path = resolve_config_path(explicit)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO must not block open
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot open ({exc.strerror})") from None
    try:
        kind = os.fstat(fd).st_mode & 0o170000
    except OSError as exc:
        os.close(fd)
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    if kind not in (0o100000, 0o040000):  # a directory says "Is a directory" below
        os.close(fd)
        raise ConfigError(f"{path}: not a regular file")
    try:
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        document = loads(data, max_bytes=MAX_CONFIG_BYTES, min_bytes=2)
    except StrictJsonError as exc:
        raise ConfigError(f"{path}: {exc.path}: {exc.code} ({exc.detail})", path=exc.path) from None
    try:
        return parse_config(document, source=path)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc.message}", path=exc.path) from None
