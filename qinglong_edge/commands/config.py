"""``qinglong-edge config render-uci``: the OpenWrt UCI front-end of the JSON config.

On OpenWrt the operator edits ``/etc/config/qinglong-edge`` (UCI, LuCI-friendly); the
init script runs ``qinglong-edge config render-uci --output
/var/etc/qinglong-edge/config.json`` on every start and reload, and the agent reads
only the rendered ``qinglong/edge-agent@v1`` JSON (spec README, "Configuration";
packaging.md section 4.2). Input is the text of ``uci -q show qinglong-edge`` (run
here unless ``--input FILE`` or ``--input -`` gives it); the output is validated with
:func:`qinglong_edge.config.parse_config` before it is written atomically (temp file,
fsync, rename, fsync of the directory), so a bad UCI edit never leaves a half-written
or invalid config behind.

UCI option <-> JSON key (:data:`UCI_SCHEMA`; an empty value means "unset": the
agent's default applies, or the key is reported as required)::

    config agent 'main'                          (document root)
        enabled          0|1     not rendered: the init script starts `serve` only when 1
        profile                  profile
        state_directory          stateDirectory
    config worker 'worker'                       worker      (rendered only when enabled=1)
        enabled          0|1
        origin                   worker.origin
        worker_id                worker.workerId
        credential_file          worker.credentialFile
        certificate_file         worker.certificateFile
        private_key_file         worker.privateKeyFile
        list trust_anchor_file   worker.trustAnchorFiles
        journal_directory        worker.journalDirectory
        runtime_directory        worker.runtimeDirectory
        request_timeout_ms  inbox_maximum_entries  inbox_retention_ms
        abandoned_maximum_entries  ownership_stale_ms  backoff_base_ms
        session_lease_duration_ms  heartbeat_interval_ms  pull_interval_ms
        splay_max_ms  max_concurrent_runs  max_log_bytes  log_minimum_free_bytes
                                 worker.<camelCase of the same name>, integers
        log_directory            worker.logDirectory (remote run logs)
        capabilities_file        worker.capabilitiesFile
        list label 'key=value'   worker.labels {"key": "value", ...} (split at the first '=')
        drain_timeout_ms         worker.drainTimeoutMs
        metrics_textfile         worker.metricsTextfile (a RAM path; empty: off)
    config local_api 'local_api'                 localApi    (rendered only when enabled=1)
        enabled          0|1
        host                     localApi.listener.host
        port                     localApi.listener.port
        database_file            localApi.databaseFile
        pepper_keyring_directory localApi.pepperKeyringDirectory
        busy_timeout_ms          localApi.busyTimeoutMs
        audit_maximum_entries  audit_retention_ms  run_maximum_entries  run_retention_ms
        database_maximum_bytes   localApi.<camelCase of the same name>, integers
        console          0|1     localApi.console (the status console on /)
        metrics          0|1     localApi.metrics (GET /metrics)
    config execution 'execution'                 execution   (rendered only when enabled=1)
        enabled          0|1
        max_concurrent_runs  terminate_grace_ms  kill_grace_ms  control_interval_ms
        max_log_bytes  max_run_pids  max_total_log_bytes  max_run_memory_bytes
                                 execution.<camelCase>, integers
        log_directory            execution.logDirectory
        work_directory           execution.workDirectory
        cgroups                  execution.cgroups

Flags accept OpenWrt's ``get_bool`` words (1/on/true/yes/enabled, 0/off/false/no/
disabled) and default to 0. Sections may be named or unnamed; each type may appear
once. Unknown section types and options are rejected (strict, like the JSON schema).

Exit statuses: 0 rendered; 78 (``invalid_configuration``) for any problem in the UCI
input, naming the UCI option (``qinglong-edge.worker.request_timeout_ms: must be an
integer from 1000 to 60000``); 74 when the output cannot be written.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qinglong_edge.commands._output import print_json

if TYPE_CHECKING:
    from qinglong_edge.contracts.uci import UciSection

__all__ = [
    "UCI_PACKAGE",
    "UCI_SCHEMA",
    "UciOption",
    "UciSectionType",
    "register",
    "render_document",
    "render_uci_text",
    "write_atomically",
]

#: The UCI package (config file name) and init script name on OpenWrt.
UCI_PACKAGE = "qinglong-edge"
#: Largest ``uci show`` dump read, in bytes.
MAX_INPUT_BYTES = 256 * 1024
#: Timeout for running ``uci -q show``, in seconds.
UCI_TIMEOUT_S = 10

_TRUE = frozenset({"1", "on", "true", "yes", "enabled"})
_FALSE = frozenset({"0", "off", "false", "no", "disabled"})
_INTEGER = re.compile(r"[0-9]{1,16}")


@dataclass(frozen=True, slots=True)
class UciOption:
    """One UCI option and where it goes in the JSON document.

    Attributes:
        name: the UCI option name.
        json_path: keys below the section's JSON object (``("listener", "port")``);
            empty for a flag.
        kind: ``text`` (string), ``integer`` (decimal digits -> int), ``list``
            (list of strings), ``map`` (a list of ``key=value`` items -> an object),
            ``boolean`` (a flag word -> true/false) or ``flag`` (the section's ``enabled``
            switch).
    """

    name: str
    json_path: tuple[str, ...]
    kind: str


@dataclass(frozen=True, slots=True)
class UciSectionType:
    """One UCI section type: ``json_key`` None means the document root."""

    type: str
    json_key: str | None
    options: tuple[UciOption, ...]


def _text(name: str, *path: str) -> UciOption:
    return UciOption(name, path, "text")


def _int(name: str, *path: str) -> UciOption:
    return UciOption(name, path, "integer")


_FLAG = UciOption("enabled", (), "flag")

UCI_SCHEMA: tuple[UciSectionType, ...] = (
    UciSectionType("agent", None, (
        _FLAG,
        _text("profile", "profile"),
        _text("state_directory", "stateDirectory"),
    )),
    UciSectionType("worker", "worker", (
        _FLAG,
        _text("origin", "origin"),
        _text("worker_id", "workerId"),
        _text("credential_file", "credentialFile"),
        _text("certificate_file", "certificateFile"),
        _text("private_key_file", "privateKeyFile"),
        UciOption("trust_anchor_file", ("trustAnchorFiles",), "list"),
        _text("journal_directory", "journalDirectory"),
        _text("runtime_directory", "runtimeDirectory"),
        _int("request_timeout_ms", "requestTimeoutMs"),
        _int("inbox_maximum_entries", "inboxMaximumEntries"),
        _int("inbox_retention_ms", "inboxRetentionMs"),
        _int("abandoned_maximum_entries", "abandonedMaximumEntries"),
        _int("ownership_stale_ms", "ownershipStaleMs"),
        _int("backoff_base_ms", "backoffBaseMs"),
        _int("session_lease_duration_ms", "sessionLeaseDurationMs"),
        _int("heartbeat_interval_ms", "heartbeatIntervalMs"),
        _int("pull_interval_ms", "pullIntervalMs"),
        _int("splay_max_ms", "splayMaxMs"),
        _int("max_concurrent_runs", "maxConcurrentRuns"),
        _text("log_directory", "logDirectory"),
        _int("max_log_bytes", "maxLogBytes"),
        _int("log_minimum_free_bytes", "logMinimumFreeBytes"),
        _text("capabilities_file", "capabilitiesFile"),
        UciOption("label", ("labels",), "map"),
        _int("drain_timeout_ms", "drainTimeoutMs"),
        _text("metrics_textfile", "metricsTextfile"),
    )),
    UciSectionType("local_api", "localApi", (
        _FLAG,
        _text("host", "listener", "host"),
        _int("port", "listener", "port"),
        _text("database_file", "databaseFile"),
        _text("pepper_keyring_directory", "pepperKeyringDirectory"),
        _int("busy_timeout_ms", "busyTimeoutMs"),
        _int("audit_maximum_entries", "auditMaximumEntries"),
        _int("audit_retention_ms", "auditRetentionMs"),
        _int("run_maximum_entries", "runMaximumEntries"),
        _int("run_retention_ms", "runRetentionMs"),
        _int("database_maximum_bytes", "databaseMaximumBytes"),
        UciOption("console", ("console",), "boolean"),
        UciOption("metrics", ("metrics",), "boolean"),
    )),
    UciSectionType("execution", "execution", (
        _FLAG,
        _int("max_concurrent_runs", "maxConcurrentRuns"),
        _int("terminate_grace_ms", "terminateGraceMs"),
        _int("kill_grace_ms", "killGraceMs"),
        _int("control_interval_ms", "controlIntervalMs"),
        _text("log_directory", "logDirectory"),
        _text("work_directory", "workDirectory"),
        _int("max_log_bytes", "maxLogBytes"),
        _text("cgroups", "cgroups"),
        _int("max_run_pids", "maxRunPids"),
        _int("max_total_log_bytes", "maxTotalLogBytes"),
        _int("max_run_memory_bytes", "maxRunMemoryBytes"),
    )),
)
_BY_TYPE = {section.type: section for section in UCI_SCHEMA}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "config",
        parents=[common],
        help="configuration tools (render the OpenWrt UCI config to JSON)",
        description="Configuration tools.",
    )
    actions = parser.add_subparsers(dest="config_action", metavar="ACTION", required=True,
                                    parser_class=type(parser))
    render = actions.add_parser(
        "render-uci",
        parents=[common],
        help=f"render `uci -q show {UCI_PACKAGE}` as qinglong/edge-agent@v1 JSON",
        description=f"Read `uci -q show {UCI_PACKAGE}` (run here, or from --input), "
        "validate it and write the JSON configuration atomically (stdout without "
        "--output). Exit 78 naming the UCI option on any problem.",
    )
    render.add_argument("--input", metavar="FILE",
                        help=f"a saved `uci -q show {UCI_PACKAGE}` dump ('-' for stdin)")
    render.add_argument("--output", metavar="FILE",
                        help="write the JSON here atomically (mode 0644)")
    render.set_defaults(handler=_run_render)


def _flag(value: str, where: str) -> bool:
    from qinglong_edge.errors import ConfigError

    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{where}: must be 0 or 1", path=where)


def _map(items: list[str], where: str) -> dict[str, str]:
    """``list label 'site=lab'`` items -> ``{"site": "lab"}`` (split at the first ``=``)."""
    from qinglong_edge.errors import ConfigError

    mapping: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{where}: {item!r} is not key=value", path=where)
        if key in mapping:
            raise ConfigError(f"{where}: the key {key!r} is given twice", path=where)
        mapping[key] = value
    return mapping


def _set(target: dict[str, Any], path: tuple[str, ...], value: object) -> None:
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value


def render_document(
    sections: Sequence[UciSection], package: str = UCI_PACKAGE
) -> tuple[dict[str, Any], dict[str, str]]:
    """Map parsed UCI sections to a (not yet validated) JSON document.

    Args:
        sections: :class:`qinglong_edge.contracts.uci.UciSection` values in dump order.
        package: the UCI package name used in error messages.

    Returns:
        ``(document, names)``: the document, and JSON path -> UCI name
        (``$.worker.requestTimeoutMs`` -> ``qinglong-edge.worker.request_timeout_ms``)
        for every known option and section, used to name UCI options in errors.

    Raises:
        ConfigError: an unknown or repeated section type, an unknown option, a list
            given to a single-valued option, a flag or integer that does not parse,
            or roles switched on without the Local API they need.
    """
    from qinglong_edge.config import SCHEMA
    from qinglong_edge.errors import ConfigError

    found: dict[str, UciSection] = {}
    for section in sections:
        where = f"{package}.{section.name}"
        if section.type not in _BY_TYPE:
            types = ", ".join(_BY_TYPE)
            raise ConfigError(f"{where}: unknown section type {section.type!r} (known: {types})", path=where)
        if section.type in found:
            raise ConfigError(f"{where}: a second {section.type!r} section", path=where)
        found[section.type] = section

    names: dict[str, str] = {"$": package, "$.schema": package}
    document: dict[str, Any] = {"schema": SCHEMA}
    enabled: dict[str, bool] = {}
    for kind in UCI_SCHEMA:
        present = found.get(kind.type)
        section_name = present.name if present is not None else f"@{kind.type}[0]"
        base = "$" if kind.json_key is None else f"$.{kind.json_key}"
        names[base] = f"{package}.{section_name}" if kind.json_key else package
        known = {option.name: option for option in kind.options}
        for option in kind.options:
            uci_name = f"{package}.{section_name}.{option.name}"
            for depth in range(1, len(option.json_path) + 1):
                names.setdefault(base + "".join(f".{k}" for k in option.json_path[:depth]), uci_name)
        values: Mapping[str, tuple[str, ...]] = present.options if present is not None else {}
        for name in values:
            if name not in known:
                where = f"{package}.{section_name}.{name}"
                raise ConfigError(f"{where}: unknown option", path=where)
        flag_values = [v for v in values.get("enabled", ()) if v != ""]
        if len(flag_values) > 1:
            where = f"{package}.{section_name}.enabled"
            raise ConfigError(f"{where}: must be a single value", path=where)
        on = _flag(flag_values[0], f"{package}.{section_name}.enabled") if flag_values else False
        enabled[kind.type] = on
        if kind.json_key is not None and not on:
            continue
        target = document if kind.json_key is None else document.setdefault(kind.json_key, {})
        for option in kind.options:
            if option.kind == "flag" or option.name not in values:
                continue
            where = f"{package}.{section_name}.{option.name}"
            items = [v for v in values[option.name] if v != ""]
            if not items:
                continue  # an empty option is unset: the agent's default applies
            if option.kind == "list":
                _set(target, option.json_path, items)
                continue
            if option.kind == "map":
                _set(target, option.json_path, _map(items, where))
                continue
            if len(items) > 1:
                raise ConfigError(f"{where}: must be a single value, not a list", path=where)
            if option.kind == "boolean":
                _set(target, option.json_path, _flag(items[0], where))
            elif option.kind == "integer":
                if not _INTEGER.fullmatch(items[0]):
                    raise ConfigError(f"{where}: must be a decimal integer", path=where)
                _set(target, option.json_path, int(items[0]))
            else:
                _set(target, option.json_path, items[0])

    local_flag = f"{package}.{found['local_api'].name if 'local_api' in found else '@local_api[0]'}.enabled"
    if enabled["agent"] and not enabled["local_api"]:
        raise ConfigError(
            f"{local_flag}: must be 1 when the service is enabled (serve runs the Local API)",
            path=local_flag,
        )
    if enabled["execution"] and not enabled["local_api"]:
        raise ConfigError(
            f"{local_flag}: must be 1 when execution is enabled (Runs live in the Local store)",
            path=local_flag,
        )
    return document, names


def _uci_name(json_path: str, names: Mapping[str, str]) -> str:
    path = re.sub(r"\[(?:\d+|\"[^\"]*\")\]$", "", json_path)  # an index, or a quoted key (labels)
    while path:
        if path in names:
            return names[path]
        path = path.rpartition(".")[0]
    return names["$"]


def render_uci_text(text: str, package: str = UCI_PACKAGE) -> bytes:
    """Render a ``uci -q show`` dump to validated ``qinglong/edge-agent@v1`` JSON bytes.

    Returns:
        UTF-8 JSON, two-space indented, keys in schema order, ending in a newline;
        exactly the bytes :func:`qinglong_edge.config.load_config` accepts.

    Raises:
        ConfigError: anything wrong in the input, the message and ``path`` naming the
            UCI option (or section, or the package).
    """
    import json

    from qinglong_edge.config import parse_config
    from qinglong_edge.contracts.errors import ContractError
    from qinglong_edge.contracts.strictjson import loads
    from qinglong_edge.contracts.uci import parse_show
    from qinglong_edge.errors import ConfigError

    try:
        sections = parse_show(text, package)
    except ContractError as exc:
        raise ConfigError(f"{exc.path}: {exc.detail}", path=exc.path) from None
    document, names = render_document(sections, package)
    data = (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    try:
        parse_config(loads(data, max_bytes=64 * 1024, min_bytes=2), source=package)
    except ContractError as exc:
        # Only reachable through a value JSON cannot hold (a lone surrogate).
        where = _uci_name(exc.path, names)
        raise ConfigError(f"{where}: {exc.detail or exc.code}", path=where) from None
    except ConfigError as exc:
        where = _uci_name(exc.path, names)
        message = exc.message
        prefix = f"{exc.path}: "
        detail = message[len(prefix):] if message.startswith(prefix) else message
        raise ConfigError(f"{where}: {detail}", path=where) from None
    return data


def _read_input(source: str | None) -> str:
    from qinglong_edge.errors import ConfigError

    if source is None:
        import subprocess

        argv = ["uci", "-q", "show", UCI_PACKAGE]
        try:
            proc = subprocess.run(argv, capture_output=True, timeout=UCI_TIMEOUT_S, check=False)
        except FileNotFoundError:
            raise ConfigError("uci: command not found (not OpenWrt? pass --input FILE)") from None
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"`uci -q show {UCI_PACKAGE}` failed ({type(exc).__name__})") from None
        if proc.returncode != 0:
            raise ConfigError(
                f"`uci -q show {UCI_PACKAGE}` exited {proc.returncode} "
                f"(is /etc/config/{UCI_PACKAGE} missing or unreadable?)"
            )
        data = proc.stdout
    else:
        try:
            if source == "-":
                data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
            else:
                with open(source, "rb") as handle:
                    data = handle.read(MAX_INPUT_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"{source}: cannot read ({exc.strerror})") from None
    if len(data) > MAX_INPUT_BYTES:
        raise ConfigError(f"{UCI_PACKAGE}: the uci dump is larger than {MAX_INPUT_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{UCI_PACKAGE}: the uci dump is not UTF-8 (byte {exc.start})") from None


def write_atomically(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync the directory.

    Raises:
        StorageError: ``storage_unavailable`` when any step fails; the temp file is
            removed and ``path`` is left as it was.
    """
    from qinglong_edge import filecheck
    from qinglong_edge.errors import StorageError

    try:
        # The temp file beside it, fchmod(mode): the umask must not narrow it.
        filecheck.replace_file(path, data, mode=mode)
    except OSError as exc:
        raise StorageError(f"{path}: cannot write ({exc.strerror})", code="storage_unavailable") from None


def _run_render(args: argparse.Namespace) -> int:
    data = render_uci_text(_read_input(args.input))
    if args.output is None:
        if args.json:  # one machine-readable line, like every other --json output
            import json

            print_json({"ok": True, "config": json.loads(data)})
            return 0
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    write_atomically(args.output, data)
    if args.json:
        print_json({"ok": True, "output": args.output, "bytes": len(data)})
    return 0
