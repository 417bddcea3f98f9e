"""The cluster execution revision: normalization in canonical order and its digest.

Source: offer-delivery.md section 2.4; reference ``clusterExecutionRevision.ts``
(newer revision, with ``environmentBundleRef``), ``localDispatch.ts`` (command and
environment), ``secretReference.ts`` and ``remoteWorkerPlacement.ts``.

The worker never trusts the received ``contentDigest``: it rebuilds every object in
the reference's key order, drops what the reference drops (unknown command and binding
keys), sorts the environment with the ICU key of Appendix A (spec README: never hash
the received order), and recomputes::

    contentDigest = sha256_hex(b"qinglong.cluster-task-execution-revision.v1\\0"
                               + JSON.stringify(revision minus createdAtMs, contentDigest))

Canonical key order: ``projectId, taskId, taskRevision, sourceRevision,
sourceContentDigest, executorType, planSchema, command, environment,
[environmentBundleRef], [workingDirectory], [timeoutMs], [placement], createdAtMs,
contentDigest``.

Limits: command ``file`` <= 4096 bytes, <= 256 ``args`` of <= 16 KiB, file + args
<= 64 KiB; shell ``command`` 1 byte-64 KiB; <= 256 bindings, names + values/refs
<= 64 KiB; secret refs <= 512 bytes; ``workingDirectory`` <= 4096 bytes; ``timeoutMs``
1-31 536 000 000; whole revision (with ``createdAtMs``, without ``contentDigest``)
<= 98 304 bytes.

Error codes (``ContractError.code``), besides those of
:mod:`qinglong_edge.contracts.placement` for ``placement``: ``not_object``,
``not_array``, ``not_string``, ``not_integer``, ``key_set``, ``length``,
``control_character``, ``pattern``, ``out_of_range``, ``task_revision_mismatch``,
``executor_type``, ``plan_schema``, ``command_kind``, ``shell``, ``binding_kind``,
``env_name`` (grammar), ``env_reserved`` (``QL3_`` prefix), ``env_duplicate``,
``secret_ref`` (not a canonical ``qlsecret:v1:`` ref), ``secret_ref_project``
(a ref of another project), ``bundle_ref_version`` (bundle ref without a version),
``budget`` (a byte budget), ``digest_mismatch``.
"""

from __future__ import annotations

import base64
import binascii
import re

from qinglong_edge.contracts._shape import (
    child,
    exact_keys,
    int_value,
    nul_free_text,
    object_value,
    utf8_length,
)
from qinglong_edge.contracts.collation import icu_sort_key
from qinglong_edge.contracts.digest import sha256_hex
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import MAX_INT32, string
from qinglong_edge.contracts.placement import effective_placement
from qinglong_edge.contracts.strictjson import StrictJsonError, dumps, loads

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any, NoReturn

__all__ = [
    "DIGEST_PREFIX",
    "EXECUTOR_TYPE",
    "MAX_REVISION_BYTES",
    "PLAN_SCHEMA",
    "SECRET_REF_PREFIX",
    "create_secret_ref",
    "icu_sort_key",
    "normalize_execution_revision",
    "parse_secret_ref",
    "revision_content_digest",
]

EXECUTOR_TYPE = "remote_worker"
PLAN_SCHEMA = "qinglong/command-execution@v1"
DIGEST_PREFIX = b"qinglong.cluster-task-execution-revision.v1\x00"
SECRET_REF_PREFIX = "qlsecret:v1:"  # noqa: S105 - a reference format prefix, not a secret

MAX_REVISION_BYTES = 96 * 1024
MAX_IDENTIFIER_BYTES = 128
MAX_PATH_BYTES = 4096
MAX_ARGS = 256
MAX_ARG_BYTES = 16 * 1024
MAX_COMMAND_BYTES = 64 * 1024
MAX_BINDINGS = 256
MAX_ENVIRONMENT_BYTES = 64 * 1024
MAX_SECRET_REF_BYTES = 512
MAX_TIMEOUT_MS = 365 * 24 * 60 * 60_000
SHELLS = ("/bin/sh", "/bin/bash")

_REQUIRED = (
    "projectId",
    "taskId",
    "taskRevision",
    "sourceRevision",
    "sourceContentDigest",
    "executorType",
    "planSchema",
    "command",
    "environment",
    "createdAtMs",
)
_OPTIONAL = ("environmentBundleRef", "workingDirectory", "timeoutMs", "placement")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")
#: ``,"createdAtMs":`` -- the bytes the full serialization adds to the immutable one.
_CREATED_AT_KEY_BYTES = len(',"createdAtMs":')


def _identifier(value: object, path: str) -> str:
    # Non-empty, no control characters (NUL included), <= 128 UTF-8 bytes.
    return string(value, path, max_length=MAX_IDENTIFIER_BYTES, utf8_bytes=True)


def create_secret_ref(project_id: str, name: str, version: int | None = None, path: str = "$") -> str:
    """Build the canonical ``qlsecret:v1:`` ref (``createSecretRef``).

    ``base64url_nopad(JSON.stringify({"projectId":P,"name":N[,"version":V]}))`` after the prefix.

    Raises:
        ContractError: ``secret_ref`` when a part breaks its rule or the ref exceeds 512 bytes.
    """
    try:
        string(project_id, path, max_length=128, utf8_bytes=True)
        string(name, path, max_length=128, utf8_bytes=True)
        if version is not None:
            int_value(version, path, 1, MAX_INT32)
    except ContractError:
        raise ContractError("secret_ref", path, "secret reference parts are invalid") from None
    payload: dict[str, Any] = {"projectId": project_id, "name": name}
    if version is not None:
        payload["version"] = version
    encoded = base64.urlsafe_b64encode(dumps(payload).encode("utf-8")).rstrip(b"=").decode("ascii")
    ref = SECRET_REF_PREFIX + encoded
    if len(ref) > MAX_SECRET_REF_BYTES:
        raise ContractError("secret_ref", path, "secret reference exceeds 512 bytes")
    return ref


def parse_secret_ref(value: object, path: str = "$") -> dict[str, Any]:
    """Parse a canonical secret ref (``parseSecretRef``).

    The base64url text must round-trip and re-creating the ref from its parts must give
    the same string (so the payload is exactly ``{"projectId","name"[,"version"]}`` in
    that order, compact).

    Returns:
        ``{"projectId": P, "name": N}`` plus ``"version": V`` when present.

    Raises:
        ContractError: ``secret_ref``.
    """
    if (
        not isinstance(value, str)
        or utf8_length(value) > MAX_SECRET_REF_BYTES
        or not value.startswith(SECRET_REF_PREFIX)
    ):
        raise ContractError("secret_ref", path, "not a qlsecret:v1 reference")
    encoded = value[len(SECRET_REF_PREFIX):]
    if not encoded or _BASE64URL.fullmatch(encoded) is None:
        raise ContractError("secret_ref", path, "encoding is invalid")
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (binascii.Error, ValueError):
        raise ContractError("secret_ref", path, "encoding is invalid") from None
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != encoded:
        raise ContractError("secret_ref", path, "encoding is not canonical")
    try:
        record = loads(raw, max_bytes=MAX_SECRET_REF_BYTES)
    except StrictJsonError:
        raise ContractError("secret_ref", path, "payload is not JSON") from None
    if not isinstance(record, dict):
        raise ContractError("secret_ref", path, "payload is not an object")
    project_id, name, version = record.get("projectId"), record.get("name"), record.get("version")
    if not isinstance(project_id, str) or not isinstance(name, str):
        raise ContractError("secret_ref", path, "payload is invalid")
    if "version" in record and type(version) is not int:
        raise ContractError("secret_ref", path, "version is invalid")
    if create_secret_ref(project_id, name, version, path) != value:
        raise ContractError("secret_ref", path, "encoding is not canonical")
    result: dict[str, Any] = {"projectId": project_id, "name": name}
    if version is not None:
        result["version"] = version
    return result


def _command(value: object, path: str) -> dict[str, Any]:
    """``normalizeLocalDispatchCommand``: argv or shell; unknown keys are dropped."""
    command = object_value(value, path)
    kind = command.get("kind")
    if kind == "argv":
        file = nul_free_text(command.get("file"), child(path, "file"), min_bytes=1, max_bytes=MAX_PATH_BYTES)
        if not file.startswith("/"):
            raise ContractError("pattern", child(path, "file"), "must be an absolute path")
        args_path = child(path, "args")
        args = command.get("args")
        if not isinstance(args, list):
            raise ContractError("not_array", args_path, "must be an array")
        if len(args) > MAX_ARGS:
            raise ContractError("length", args_path, f"at most {MAX_ARGS} entries")
        total = utf8_length(file)
        for index, arg in enumerate(args):
            nul_free_text(arg, child(args_path, index), min_bytes=0, max_bytes=MAX_ARG_BYTES)
            total += utf8_length(arg)
        if total > MAX_COMMAND_BYTES:
            raise ContractError("budget", path, f"file and args exceed {MAX_COMMAND_BYTES} bytes")
        return {"kind": "argv", "file": file, "args": list(args)}
    if kind == "shell":
        text = nul_free_text(command.get("command"), child(path, "command"), min_bytes=1,
                             max_bytes=MAX_COMMAND_BYTES)
        out: dict[str, Any] = {"kind": "shell", "command": text}
        if "shell" in command:
            shell = command["shell"]
            if not isinstance(shell, str) or shell not in SHELLS:
                raise ContractError("shell", child(path, "shell"), "shell is not allowlisted")
            out["shell"] = shell
        return out
    raise ContractError("command_kind", child(path, "kind"), "must be argv or shell")


def _raise_text(text: object, path: str, low: int, high: int) -> NoReturn:
    nul_free_text(text, path, min_bytes=low, max_bytes=high)
    raise ContractError("invalid_json", path, "unexpected text")  # not reached: the call above raises


def _raise_env_name(name: object, path: str) -> NoReturn:
    if not isinstance(name, str):
        raise ContractError("not_string", path, "must be a string")
    if _ENV_NAME.fullmatch(name) is None:
        raise ContractError("env_name", path, "not a valid environment name")
    if name.startswith("QL3_"):
        raise ContractError("env_reserved", path, "the QL3_ prefix is reserved")
    raise ContractError("env_duplicate", path, "duplicate environment name")


def _environment(value: object, path: str, project_id: str) -> list[dict[str, str]]:
    """``canonicalBindings`` + the cross-project check, sorted with the ICU key."""
    if not isinstance(value, list):
        raise ContractError("not_array", path, "must be an array")
    if len(value) > MAX_BINDINGS:
        raise ContractError("length", path, f"at most {MAX_BINDINGS} bindings")
    names: set[str] = set()
    total = 0
    bindings: list[dict[str, str]] = []
    # Paths are built only when raising: this loop runs for up to 256 bindings per pull.
    for index, binding in enumerate(value):
        if not isinstance(binding, dict):
            raise ContractError("not_object", f"{path}[{index}]", "must be an object")
        name = binding.get("name")
        if not isinstance(name, str) or _ENV_NAME.fullmatch(name) is None or name.startswith("QL3_") or name in names:
            _raise_env_name(name, f"{path}[{index}].name")
        names.add(name)
        kind = binding.get("kind")
        if kind == "public":
            key, low, high = "value", 0, MAX_ENVIRONMENT_BYTES
        elif kind == "secret":
            key, low, high = "secretRef", 1, MAX_SECRET_REF_BYTES
        else:
            raise ContractError("binding_kind", f"{path}[{index}].kind", "must be public or secret")
        text = binding.get(key)
        if not isinstance(text, str) or "\x00" in text:
            _raise_text(text, f"{path}[{index}].{key}", low, high)
        size = utf8_length(text)
        if not low <= size <= high:
            _raise_text(text, f"{path}[{index}].{key}", low, high)
        total += len(name) + size
        bindings.append({"name": name, "kind": kind, key: text})
    if total > MAX_ENVIRONMENT_BYTES:
        raise ContractError("budget", path, f"environment exceeds {MAX_ENVIRONMENT_BYTES} bytes")
    for index, binding in enumerate(bindings):
        if binding["kind"] == "secret":
            ref_path = child(child(path, index), "secretRef")
            if parse_secret_ref(binding["secretRef"], ref_path)["projectId"] != project_id:
                raise ContractError("secret_ref_project", ref_path, "secret of another project")
    bindings.sort(key=lambda binding: icu_sort_key(binding["name"]))
    return bindings


def revision_content_digest(normalized: dict[str, Any]) -> str:
    """The content digest of a *normalized* revision (offer-delivery.md 2.4).

    ``sha256_hex(DIGEST_PREFIX + UTF-8(JSON.stringify(immutable)))`` where
    ``immutable`` is ``normalized`` without ``createdAtMs`` and ``contentDigest``, in
    its key order. The caller must pass a normalized revision: the key order and the
    environment order are hashed as given.
    """
    immutable = {k: v for k, v in normalized.items() if k not in ("createdAtMs", "contentDigest")}
    return sha256_hex(DIGEST_PREFIX + dumps(immutable).encode("utf-8"))


def normalize_execution_revision(
    value: object,
    path: str = "$.executionRevision",
    *,
    verify_digest: bool = True,
) -> dict[str, Any]:
    """Normalize a cluster execution revision and recompute its digest.

    Args:
        value: the decoded ``executionRevision`` object.
        path: JSON path of ``value``, used in errors.
        verify_digest: when True (the worker's case), ``contentDigest`` is required and
            must equal the recomputed digest. When False, ``contentDigest`` is optional
            and ignored (building a revision, e.g. a fixture).

    Returns:
        A new dict in canonical key order ending with ``createdAtMs`` and the
        recomputed ``contentDigest``.

    Raises:
        ContractError: see the module docstring; ``digest_mismatch`` at
            ``<path>.contentDigest`` when the recomputed digest differs.
    """
    source = object_value(value, path)
    exact_keys(
        source,
        (*_REQUIRED, "contentDigest") if verify_digest else _REQUIRED,
        path,
        _OPTIONAL if verify_digest else (*_OPTIONAL, "contentDigest"),
    )
    project_id = _identifier(source["projectId"], child(path, "projectId"))
    task_id = _identifier(source["taskId"], child(path, "taskId"))
    source_revision = int_value(source["sourceRevision"], child(path, "sourceRevision"), 1, MAX_INT32)
    source_digest = source["sourceContentDigest"]
    digest_path = child(path, "sourceContentDigest")
    if not isinstance(source_digest, str):
        raise ContractError("not_string", digest_path, "must be a string")
    if _HEX64.fullmatch(source_digest) is None:
        raise ContractError("pattern", digest_path, "must be 64 lowercase hex characters")
    task_revision = f"qltd:v1:{source_revision}:{source_digest}"
    if source["taskRevision"] != task_revision:
        raise ContractError("task_revision_mismatch", child(path, "taskRevision"),
                            "must be qltd:v1:<sourceRevision>:<sourceContentDigest>")
    if source["executorType"] != EXECUTOR_TYPE:
        raise ContractError("executor_type", child(path, "executorType"), f"must be {EXECUTOR_TYPE}")
    if source["planSchema"] != PLAN_SCHEMA:
        raise ContractError("plan_schema", child(path, "planSchema"), f"must be {PLAN_SCHEMA}")
    command = _command(source["command"], child(path, "command"))
    environment = _environment(source["environment"], child(path, "environment"), project_id)
    out: dict[str, Any] = {
        "projectId": project_id,
        "taskId": task_id,
        "taskRevision": task_revision,
        "sourceRevision": source_revision,
        "sourceContentDigest": source_digest,
        "executorType": EXECUTOR_TYPE,
        "planSchema": PLAN_SCHEMA,
        "command": command,
        "environment": environment,
    }
    if "environmentBundleRef" in source:
        bundle_path = child(path, "environmentBundleRef")
        bundle = parse_secret_ref(source["environmentBundleRef"], bundle_path)
        if bundle["projectId"] != project_id:
            raise ContractError("secret_ref_project", bundle_path, "secret of another project")
        if "version" not in bundle:
            raise ContractError("bundle_ref_version", bundle_path, "an environment bundle ref needs a version")
        out["environmentBundleRef"] = source["environmentBundleRef"]
    if "workingDirectory" in source:
        directory_path = child(path, "workingDirectory")
        directory = nul_free_text(source["workingDirectory"], directory_path, min_bytes=1, max_bytes=MAX_PATH_BYTES)
        if not directory.startswith("/"):
            raise ContractError("pattern", directory_path, "must be an absolute path")
        out["workingDirectory"] = directory
    if "timeoutMs" in source:
        out["timeoutMs"] = int_value(source["timeoutMs"], child(path, "timeoutMs"), 1, MAX_TIMEOUT_MS)
    created_at_ms = int_value(source["createdAtMs"], child(path, "createdAtMs"))
    if "placement" in source:
        out["placement"] = effective_placement(source["placement"], child(path, "placement"))
    immutable = dumps(out).encode("utf-8")
    # Budget = the serialization *with* createdAtMs: the immutable bytes plus
    # ',"createdAtMs":<n>' (createdAtMs is the last key), without serializing twice.
    if len(immutable) + _CREATED_AT_KEY_BYTES + len(str(created_at_ms)) > MAX_REVISION_BYTES:
        raise ContractError("budget", path, f"revision exceeds {MAX_REVISION_BYTES} bytes")
    digest = sha256_hex(DIGEST_PREFIX + immutable)
    if verify_digest:
        received = source["contentDigest"]
        received_path = child(path, "contentDigest")
        if not isinstance(received, str):
            raise ContractError("not_string", received_path, "must be a string")
        if received != digest:
            raise ContractError("digest_mismatch", received_path, "does not match the recomputed digest")
    out["createdAtMs"] = created_at_ms
    out["contentDigest"] = digest
    return out
