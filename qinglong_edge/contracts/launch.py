"""``qinglong/command-execution@v1`` -> what to exec, and the job's environment (section 4.1).

Sources: remote-execution.md section 4.1 and gaps G6/G7; reference ``launcher.ts``
(``assertRequest``, ``normalizedEnvironment``) and ``completionReceipt.ts``
(``assertCompletionReceiptId``) at c699c32; ``executionContextMaterializer.ts`` at 4abf125;
the environment bundle format from ``packages/ql3-runtime-core/src/secret/environmentBundle.ts``
at commit 4abf125ce97f7642915e4ac32c34a22392ee923f (``parseEnvironmentBundle`` /
``normalizeEnvironmentBundle``; the spec authors had not read it, we did: the facts below).

:func:`launch_plan` reads the stored internal offer's normalized revision:

* argv ``{file, args}``: ``file`` absolute, not ``/``, no NUL, <= 4 096 bytes; <= 256
  ``args``, each **non-empty** (the reference launcher refuses empty ones although the
  revision allows them: gap G7, we match it), no NUL, <= 16 KiB; file + args <= 64 KiB.
  Exec vector ``[file, *args]`` (no PATH lookup: the path is absolute).
* shell ``{command, shell?}``: ``command`` 1 byte-64 KiB without NUL; ``shell`` ``/bin/sh``
  (default) or ``/bin/bash``. Exec vector ``[shell, "-c", command]``.
* ``workingDirectory``: absolute, not ``/``, no NUL, <= 4 096 bytes; absent -> None (the
  runner chooses, gap G6).
* ``timeoutMs``: 1..31 536 000 000 or None.
* runId and attemptId must be portable execution ids ``[A-Za-z0-9][A-Za-z0-9._:-]{0,35}``
  (the receipt grammar: other attempts cannot be launched at all).

Environment bundle (``qinglong/environment-bundle@v1``, :func:`parse_environment_bundle`):
2-98 304 bytes of JSON ``{"schema": "qinglong/environment-bundle@v1", "entries": [{"name",
"value"}, ...]}`` with exactly these keys; 1-256 entries; a name matches
``[A-Za-z_][A-Za-z0-9_]{0,127}``, does not start ``QL3_`` and is unique; a value is a
string without NUL of at most 16 384 bytes (an empty one passes the bundle, then fails the
launcher rule below); names + values <= 65 536 bytes; entries are sorted by name; the
normalized JSON is <= 98 304 bytes.

:func:`materialize_environment` (T3/T4): the bindings in revision order with their public
value or the secret value of the secrets answer (a missing one is an error), names +
values <= 64 KiB; then each bundle's entries appended (a name already present is an
error; they count toward 256 entries and 64 KiB); then the launcher rules: <= 256
entries, the name grammar, each value non-empty, no NUL, <= 16 KiB, names + values <= 64
KiB; names starting ``QL3_RECEIPT_`` or ``QL3_LAUNCH_`` are dropped after being counted.
The job gets only these variables (no PATH, HOME...: gap G6).

Secrets: :class:`Environment` holds values as ``bytearray``; its ``repr`` shows names
only; :meth:`Environment.wipe` zeroes them. The ``bytes`` copies :meth:`Environment.environ`
makes for ``execve`` cannot be zeroed by Python; drop them right after the spawn.

Errors: :class:`LaunchError` (a :class:`~qinglong_edge.contracts.ingress.CallError`) with
code ``launch_invalid``, ``environment_invalid`` or ``environment_bundle_invalid``;
``reason`` is the field code, or ``command_kind``, ``shell``, ``plan_schema``,
``env_name``, ``env_duplicate``, ``env_value``, ``missing_secret``, ``budget``,
``schema``. All lead the runner to ``start_failed`` (T3/T4). No value is ever in a message.
"""

from __future__ import annotations

import re

from qinglong_edge.contracts._shape import Frozen, child, exact_keys, int_value, nul_free_text, object_value
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.ingress import CallError, guard
from qinglong_edge.contracts.strictjson import dumps, loads

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.contracts.records import InternalOffer
    from qinglong_edge.contracts.secret_delivery import SecretValues

__all__ = [
    "BUNDLE_SCHEMA",
    "COMMAND_SCHEMA",
    "MAX_ENVIRONMENT_BYTES",
    "MAX_ENVIRONMENT_ENTRIES",
    "MAX_ENVIRONMENT_VALUE_BYTES",
    "PORTABLE_EXECUTION_ID",
    "Environment",
    "LaunchError",
    "LaunchPlan",
    "launch_plan",
    "materialize_environment",
    "parse_environment_bundle",
]

COMMAND_SCHEMA = "qinglong/command-execution@v1"
BUNDLE_SCHEMA = "qinglong/environment-bundle@v1"
MAX_PATH_BYTES = 4096
MAX_ARGS = 256
MAX_ARG_BYTES = 16 * 1024
MAX_COMMAND_BYTES = 64 * 1024
MAX_TIMEOUT_MS = 365 * 24 * 60 * 60_000
MAX_ENVIRONMENT_ENTRIES = 256
MAX_ENVIRONMENT_VALUE_BYTES = 16 * 1024
MAX_ENVIRONMENT_BYTES = 64 * 1024
MAX_BUNDLE_ENCODED_BYTES = 96 * 1024
SHELLS = ("/bin/sh", "/bin/bash")
#: ``assertCompletionReceiptId``: the ids a launch (and its receipt) can carry.
PORTABLE_EXECUTION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,35}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_DROPPED_PREFIXES = ("QL3_RECEIPT_", "QL3_LAUNCH_")


class LaunchError(CallError):
    """A section-4 contract failed (launch plan, environment, bundle, receipt, truncation fact)."""


def _absolute(value: object, path: str) -> str:
    """``assertAbsoluteBoundedPath``: absolute, not the root itself, no NUL, <= 4 096 bytes."""
    text = nul_free_text(value, path, min_bytes=1, max_bytes=MAX_PATH_BYTES)
    if not text.startswith("/") or text == "/":
        raise ContractError("pattern", path, "must be an absolute path other than /")
    return text


class LaunchPlan(Frozen):
    """What to exec for one attempt.

    Attributes:
        kind: ``argv`` or ``shell``.
        argv: the exec vector (``[file, *args]`` or ``[shell, "-c", command]``).
        working_directory: absolute path, or None (the runner chooses; gap G6).
        timeout_ms: the revision's ``timeoutMs`` or None.
        run_id, attempt_id: portable execution ids (the receipt's).
    """

    __slots__ = ("kind", "argv", "working_directory", "timeout_ms", "run_id", "attempt_id")  # noqa: RUF023

    kind: str
    argv: tuple[str, ...]
    working_directory: str | None
    timeout_ms: int | None
    run_id: str
    attempt_id: str

    def __init__(self, kind: str, argv: tuple[str, ...], working_directory: str | None,  # noqa: PLR0917
                 timeout_ms: int | None, run_id: str, attempt_id: str) -> None:
        _set = object.__setattr__
        _set(self, "kind", kind)
        _set(self, "argv", argv)
        _set(self, "working_directory", working_directory)
        _set(self, "timeout_ms", timeout_ms)
        _set(self, "run_id", run_id)
        _set(self, "attempt_id", attempt_id)


def _argv(command: dict[str, Any], path: str) -> tuple[str, ...]:
    kind = command.get("kind")
    if kind == "argv":
        file = _absolute(command.get("file"), child(path, "file"))
        args = command.get("args")
        args_path = child(path, "args")
        if not isinstance(args, list):
            raise ContractError("not_array", args_path, "must be an array")
        if len(args) > MAX_ARGS:
            raise ContractError("length", args_path, f"at most {MAX_ARGS} arguments")
        total = len(file.encode("utf-8", "surrogatepass"))
        for index, arg in enumerate(args):
            text = nul_free_text(arg, child(args_path, index), min_bytes=1, max_bytes=MAX_ARG_BYTES)
            total += len(text.encode("utf-8", "surrogatepass"))
        if total > MAX_COMMAND_BYTES:
            raise ContractError("budget", path, f"file and args exceed {MAX_COMMAND_BYTES} bytes")
        return (file, *args)
    if kind == "shell":
        text = nul_free_text(command.get("command"), child(path, "command"), min_bytes=1, max_bytes=MAX_COMMAND_BYTES)
        shell = command.get("shell", "/bin/sh")
        if not isinstance(shell, str) or shell not in SHELLS:
            raise ContractError("shell", child(path, "shell"), "shell is not allowlisted")
        return (shell, "-c", text)
    raise ContractError("command_kind", child(path, "kind"), "must be argv or shell")


def launch_plan(offer: InternalOffer) -> LaunchPlan:
    """The launch plan of the stored internal offer (its normalized ``executionRevision``).

    Raises:
        LaunchError: ``launch_invalid`` (the runner records ``start_failed``).
    """
    with guard("launch_invalid", error=LaunchError):
        source = object_value(offer, "$.offer")
        candidate = object_value(source.get("candidate"), "$.offer.candidate")
        ids = []
        for key in ("runId", "attemptId"):
            value = candidate.get(key)
            if not isinstance(value, str) or PORTABLE_EXECUTION_ID.fullmatch(value) is None:
                raise ContractError("pattern", child("$.offer.candidate", key), "not a portable execution id")
            ids.append(value)
        path = "$.offer.executionRevision"
        revision = object_value(source.get("executionRevision"), path)
        if revision.get("planSchema") != COMMAND_SCHEMA:
            raise ContractError("plan_schema", child(path, "planSchema"), f"must be {COMMAND_SCHEMA}")
        command = object_value(revision.get("command"), child(path, "command"))
        argv = _argv(command, child(path, "command"))
        directory = None
        if "workingDirectory" in revision:
            directory = _absolute(revision["workingDirectory"], child(path, "workingDirectory"))
        timeout = None
        if "timeoutMs" in revision:
            timeout = int_value(revision["timeoutMs"], child(path, "timeoutMs"), 1, MAX_TIMEOUT_MS)
        return LaunchPlan(str(command["kind"]), argv, directory, timeout, ids[0], ids[1])


class Environment:
    """The job's environment: ``names[i]`` = ``values[i]`` (UTF-8 ``bytearray``), in order.

    ``repr``/``str`` show the names only. ``len()`` is the number of variables.
    """

    __slots__ = ("names", "values")

    def __init__(self, names: list[str], values: list[bytearray]) -> None:
        self.names = names
        self.values = values

    def environ(self) -> dict[bytes, bytes]:
        """``{name: value}`` as ``bytes`` for ``os.execve``/``subprocess`` (immutable copies)."""
        return {name.encode("ascii"): bytes(value) for name, value in zip(self.names, self.values, strict=True)}

    def wipe(self) -> None:
        """Zero every value in place and drop them."""
        for value in self.values:
            value[:] = bytes(len(value))
        self.names, self.values = [], []

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        return f"Environment(names={self.names!r}, values=redacted)"

    __str__ = __repr__


def _bundle_entries(value: object) -> list[tuple[str, str]]:
    bundle = object_value(value, "$")
    exact_keys(bundle, ("entries", "schema"), "$")
    if bundle["schema"] != BUNDLE_SCHEMA:
        raise ContractError("schema", "$.schema", f"must be {BUNDLE_SCHEMA}")
    entries = bundle["entries"]
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_ENVIRONMENT_ENTRIES:
        raise ContractError("length", "$.entries", f"must hold 1..{MAX_ENVIRONMENT_ENTRIES} entries")
    names: set[str] = set()
    total = 0
    out: list[tuple[str, str]] = []
    for index, entry in enumerate(entries):
        path = child("$.entries", index)
        item = object_value(entry, path)
        exact_keys(item, ("name", "value"), path)
        name, text = item["name"], item["value"]
        if not isinstance(name, str) or _ENV_NAME.fullmatch(name) is None or name.startswith("QL3_"):
            raise ContractError("env_name", child(path, "name"), "not a valid environment name")
        if name in names:
            raise ContractError("env_duplicate", child(path, "name"), "duplicate environment name")
        if not isinstance(text, str) or "\x00" in text or len(text.encode("utf-8")) > MAX_ENVIRONMENT_VALUE_BYTES:
            raise ContractError("env_value", child(path, "value"),
                                f"a string without NUL of at most {MAX_ENVIRONMENT_VALUE_BYTES} bytes")
        names.add(name)
        total += len(name) + len(text.encode("utf-8"))
        if total > MAX_ENVIRONMENT_BYTES:
            raise ContractError("budget", "$.entries", f"names and values exceed {MAX_ENVIRONMENT_BYTES} bytes")
        out.append((name, text))
    out.sort(key=lambda pair: pair[0])  # ASCII names: JS code-unit order
    normalized = {"schema": BUNDLE_SCHEMA, "entries": [{"name": name, "value": text} for name, text in out]}
    if len(dumps(normalized).encode("utf-8")) > MAX_BUNDLE_ENCODED_BYTES:
        raise ContractError("budget", "$", f"the normalized bundle exceeds {MAX_BUNDLE_ENCODED_BYTES} bytes")
    return out


def parse_environment_bundle(data: bytes | bytearray) -> list[tuple[str, bytearray]]:
    """Parse one ``qinglong/environment-bundle@v1`` value (module docstring).

    Returns:
        ``[(name, value), ...]`` sorted by name; values as UTF-8 ``bytearray``.

    Raises:
        LaunchError: ``environment_bundle_invalid`` (no value in it).
    """
    with guard("environment_bundle_invalid", error=LaunchError, known_keys=frozenset({"entries", "schema", "name",
                                                                                      "value"})):
        if not isinstance(data, (bytes, bytearray)):
            raise ContractError("not_bytes", "$", "a bundle is bytes")
        entries = _bundle_entries(loads(data, max_bytes=MAX_BUNDLE_ENCODED_BYTES, min_bytes=2))
        return [(name, bytearray(text, "utf-8")) for name, text in entries]


def _launcher_rules(names: list[str], values: list[bytearray]) -> Environment:
    """``normalizedEnvironment`` of ``launcher.ts`` (count, grammar, values, budget, drops)."""
    if len(names) > MAX_ENVIRONMENT_ENTRIES:
        raise ContractError("budget", "$.environment", f"more than {MAX_ENVIRONMENT_ENTRIES} variables")
    total = 0
    kept_names: list[str] = []
    kept_values: list[bytearray] = []
    for index, (name, value) in enumerate(zip(names, values, strict=True)):
        path = child("$.environment", index)
        if _ENV_NAME.fullmatch(name) is None:
            raise ContractError("env_name", child(path, "name"), "not a valid environment name")
        if not value or 0 in value or len(value) > MAX_ENVIRONMENT_VALUE_BYTES:
            raise ContractError("env_value", child(path, "value"),
                                f"must be 1..{MAX_ENVIRONMENT_VALUE_BYTES} bytes without NUL")
        total += len(name) + len(value)
        if total > MAX_ENVIRONMENT_BYTES:
            raise ContractError("budget", "$.environment", f"names and values exceed {MAX_ENVIRONMENT_BYTES} bytes")
        if not name.startswith(_DROPPED_PREFIXES):
            kept_names.append(name)
            kept_values.append(value)
    return Environment(kept_names, kept_values)


def _binding_value(binding: dict[str, Any], secrets: SecretValues | None, path: str) -> bytearray:
    if binding.get("kind") == "public":
        text = binding.get("value")
        if not isinstance(text, str):
            raise ContractError("not_string", child(path, "value"), "must be a string")
        return bytearray(text, "utf-8")
    ref = binding.get("secretRef")
    if secrets is None or not isinstance(ref, str) or ref not in secrets.refs:
        raise ContractError("missing_secret", child(path, "secretRef"), "the secrets answer has no such value")
    return bytearray(secrets.value_for(ref))  # a copy: the answer is wiped on its own


def materialize_environment(offer: InternalOffer, secrets: SecretValues | None) -> Environment:
    """The job's environment for the stored internal offer and its secrets answer (T3/T4).

    Args:
        offer: the stored internal offer (its normalized revision's ``environment``).
        secrets: the parsed secrets answer, or None when the call was skipped (no refs).

    Returns:
        :class:`Environment`; the caller wipes it (and ``secrets``) after the spawn.

    Raises:
        LaunchError: ``environment_invalid`` (a budget, a missing secret, an empty value,
            a duplicate name) or ``environment_bundle_invalid``; the runner records
            ``start_failed``.
    """
    names: list[str] = []
    values: list[bytearray] = []
    kept: set[int] = set()  # ids of the values handed over; every other copy is wiped
    try:
        with guard("environment_invalid", error=LaunchError):
            path = "$.offer.executionRevision.environment"
            revision = object_value(object_value(offer, "$.offer").get("executionRevision"),
                                    "$.offer.executionRevision")
            bindings = revision.get("environment")
            if not isinstance(bindings, list):
                raise ContractError("not_array", path, "must be an array")
            total = 0
            for index, binding in enumerate(bindings):
                entry_path = child(path, index)
                item = object_value(binding, entry_path)
                name = item.get("name")
                if not isinstance(name, str):
                    raise ContractError("env_name", child(entry_path, "name"), "not a valid environment name")
                values.append(_binding_value(item, secrets, entry_path))
                names.append(name)
                total += len(name.encode("utf-8")) + len(values[-1])
                if total > MAX_ENVIRONMENT_BYTES:
                    raise ContractError("budget", path, f"names and values exceed {MAX_ENVIRONMENT_BYTES} bytes")
            count = len(names)
            present = set(names)
            for bundle_index, bundle in enumerate(secrets.bundles if secrets is not None else ()):
                bundle_path = child("$.environmentBundles", bundle_index)
                parsed = parse_environment_bundle(bundle)
                values.extend(value for _, value in parsed)  # owned from here on (wiped on failure)
                for name, value in parsed:
                    if name in present:
                        raise ContractError("env_duplicate", bundle_path, "a bundle variable is already bound")
                    if count >= MAX_ENVIRONMENT_ENTRIES:
                        raise ContractError("budget", bundle_path, f"more than {MAX_ENVIRONMENT_ENTRIES} variables")
                    present.add(name)
                    names.append(name)
                    count += 1
                    total += len(name) + len(value)
                    if total > MAX_ENVIRONMENT_BYTES:
                        raise ContractError("budget", bundle_path,
                                            f"names and values exceed {MAX_ENVIRONMENT_BYTES} bytes")
            environment = _launcher_rules(names, values)
            kept = {id(value) for value in environment.values}
            return environment
    finally:
        for value in values:
            if id(value) not in kept:
                value[:] = bytes(len(value))
