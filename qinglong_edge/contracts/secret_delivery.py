"""``qinglong/remote-secret-delivery@v2``: the secrets call (T3), request and answer.

Sources: remote-execution.md sections 3.4 and 6 (with its corrections: ``workerGeneration``
second, the digest of the revision *with* the binding); offer-delivery.md 5.3; reference
``remoteSecretDelivery.ts`` and ``remoteSecretHttpsProvider.ts`` at 4abf125.

Request (compact JSON, this key order, at most 65 536 bytes), built from the stored
internal offer -- never from anything else::

    {schema, workerGeneration, runId, attemptId, projectId, taskId, taskRevision,
     executionDigest, offerId, leaseGeneration, leaseToken, expectedLeaseVersion,
     secretRefs, environmentBundleRefs}

``secretRefs`` are the unique ``secretRef`` of the revision's secret bindings in binding
(revision) order, first occurrence kept, at most 64; ``environmentBundleRefs`` is ``[]`` or
``[revision.environmentBundleRef]``. At least one ref in all, none in both lists, each a
canonical ``qlsecret:v1:`` ref of the body's project. No ref at all: the call is skipped
(:func:`secrets_request` returns None). Limits: runId/attemptId/offerId dispatch ids (no
36 limit on this side); projectId, taskId, taskRevision 1-128 bytes without ctrl;
executionDigest 64 lowercase hex; generations int31 >= 1; expectedLeaseVersion int31 >= 0;
the lease-token grammar.

Answer (2-262 144 bytes) ``{schema, runId, attemptId, offerId, executionDigest, values,
environmentBundles}`` exactly; runId/attemptId 1-36 bytes, offerId 1-128 bytes, no ctrl;
executionDigest 64 lowercase hex; ``values[i] = {secretRef, value}`` with ``secretRef ==
secretRefs[i]`` (same length, same order), the value a string without NUL of at most
16 384 bytes (may be empty, may hold other ctrl), all values <= 65 536 bytes;
``environmentBundles[i]`` likewise against ``environmentBundleRefs``, each and all
<= 98 304 bytes; then runId, attemptId, offerId and executionDigest echo the request.

Secrets in memory: values are kept only as ``bytearray`` (UTF-8) in :class:`SecretValues`,
whose ``repr`` names no value and whose :meth:`SecretValues.wipe` zeroes them; a
``bytearray`` body is zeroed after parsing, as the reference zeroes its buffer. Python
cannot zero what it made immutable on the way: the decoded JSON text and one ``str`` per
value live until the garbage collector frees them. Nothing here writes them anywhere;
error messages carry no value and paths under the answer keep only known key names.

Errors: :class:`~qinglong_edge.contracts.ingress.CallError` ``secrets_request_invalid``
(builder, :func:`parse_secrets_request`) or ``secrets_response_invalid``; ``reason`` is the
field code or ``schema``, ``secret_ref``, ``secret_ref_project``, ``duplicate_ref``,
``no_refs``, ``overlapping_refs``, ``ref_mismatch``, ``budget``, ``echo_mismatch``.
"""

from __future__ import annotations

from qinglong_edge.contracts._shape import Frozen, child, exact_keys, int_value, object_value, utf8_length
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.execution_revision import parse_secret_ref
from qinglong_edge.contracts.fields import MAX_INT32, dispatch_id, string
from qinglong_edge.contracts.ids import HEX64, LEASE_TOKEN
from qinglong_edge.contracts.ingress import echo, fence_of, guard, member, request_bytes, schema_document

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.contracts.records import InternalOffer

__all__ = [
    "MAX_BUNDLE_VALUE_BYTES",
    "MAX_SECRET_REFS",
    "MAX_SECRET_TOTAL_BYTES",
    "MAX_SECRET_VALUE_BYTES",
    "SECRETS_REQUEST_MAX_BYTES",
    "SECRETS_RESPONSE_MAX_BYTES",
    "SECRETS_SCHEMA",
    "SecretValues",
    "SecretsRequest",
    "parse_secrets_request",
    "parse_secrets_response",
    "secret_refs_of",
    "secrets_request",
]

SECRETS_SCHEMA = "qinglong/remote-secret-delivery@v2"
SECRETS_REQUEST_MAX_BYTES = 64 * 1024
SECRETS_RESPONSE_MAX_BYTES = 256 * 1024
MAX_SECRET_REFS = 64
MAX_BUNDLE_REFS = 1
MAX_SECRET_VALUE_BYTES = 16 * 1024
MAX_SECRET_TOTAL_BYTES = 64 * 1024
MAX_BUNDLE_VALUE_BYTES = 96 * 1024
_REQUEST_KEYS = (
    "schema", "workerGeneration", "runId", "attemptId", "projectId", "taskId", "taskRevision", "executionDigest",
    "offerId", "leaseGeneration", "leaseToken", "expectedLeaseVersion", "secretRefs", "environmentBundleRefs",
)
_RESPONSE_KEYS = ("schema", "runId", "attemptId", "offerId", "executionDigest", "values", "environmentBundles")
_ENTRY_KEYS = ("secretRef", "value")
#: Key names a path in a secrets error may show (anything else is cut: it came from the peer).
_KNOWN_KEYS = frozenset((*_REQUEST_KEYS, *_RESPONSE_KEYS, *_ENTRY_KEYS, "offer", "executionRevision",
                         "environment", "environmentBundleRef"))


def _identifier(value: object, path: str, max_bytes: int = 128) -> str:
    return string(value, path, max_length=max_bytes, utf8_bytes=True)


def secret_refs_of(
    revision: object, path: str = "$.offer.executionRevision"
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(secretRefs, environmentBundleRefs)`` of a normalized revision (section 3.4).

    Secret refs: unique, in binding order (first occurrence). Bundle refs: ``()`` or the
    revision's ``environmentBundleRef``. Not validated here (the request builder does).

    Raises:
        ContractError: ``not_object`` / ``not_array`` for a revision that is not one.
    """
    source = object_value(revision, path)
    environment = source.get("environment")
    if not isinstance(environment, list):
        raise ContractError("not_array", child(path, "environment"), "must be an array")
    refs: dict[str, None] = {}  # insertion-ordered set: first occurrence wins
    for index, binding in enumerate(environment):
        entry_path = child(child(path, "environment"), index)
        entry = object_value(binding, entry_path)
        if entry.get("kind") == "secret":
            ref = entry.get("secretRef")
            if not isinstance(ref, str):
                raise ContractError("secret_ref", child(entry_path, "secretRef"), "not a qlsecret:v1 reference")
            refs.setdefault(ref, None)
    if "environmentBundleRef" not in source:
        return tuple(refs), ()
    bundle = source["environmentBundleRef"]
    if not isinstance(bundle, str):
        raise ContractError("secret_ref", child(path, "environmentBundleRef"), "not a qlsecret:v1 reference")
    return tuple(refs), (bundle,)


def _check_refs(value: object, path: str, project_id: str, maximum: int) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise ContractError("not_array", path, "must be an array")
    if len(value) > maximum:
        raise ContractError("length", path, f"at most {maximum} refs")
    seen: set[str] = set()
    for index, ref in enumerate(value):
        ref_path = child(path, index)
        if not isinstance(ref, str):
            raise ContractError("secret_ref", ref_path, "not a qlsecret:v1 reference")
        if ref in seen:
            raise ContractError("duplicate_ref", ref_path, "a ref appears twice")
        if parse_secret_ref(ref, ref_path)["projectId"] != project_id:
            raise ContractError("secret_ref_project", ref_path, "a secret of another project")
        seen.add(ref)
    return tuple(value)


def _check_request(body: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``normalizeRemoteWorkerSecretDeliveryCommand`` over a body, in its order."""
    for key in ("runId", "attemptId", "offerId"):
        dispatch_id(body[key], child("$", key))
    project_id = _identifier(body["projectId"], "$.projectId")
    int_value(body["workerGeneration"], "$.workerGeneration", 1, MAX_INT32)
    _identifier(body["taskId"], "$.taskId")
    _identifier(body["taskRevision"], "$.taskRevision")
    _identifier(body["executionDigest"], "$.executionDigest", 64)
    int_value(body["leaseGeneration"], "$.leaseGeneration", 1, MAX_INT32)
    _identifier(body["leaseToken"], "$.leaseToken")
    int_value(body["expectedLeaseVersion"], "$.expectedLeaseVersion", 0, MAX_INT32)
    secret_refs = _check_refs(body["secretRefs"], "$.secretRefs", project_id, MAX_SECRET_REFS)
    bundle_refs = _check_refs(body["environmentBundleRefs"], "$.environmentBundleRefs", project_id, MAX_BUNDLE_REFS)
    if not secret_refs and not bundle_refs:
        raise ContractError("no_refs", "$.secretRefs", "at least one secret or bundle ref")
    if set(secret_refs) & set(bundle_refs):
        raise ContractError("overlapping_refs", "$.environmentBundleRefs", "a ref is in both lists")
    string(body["executionDigest"], "$.executionDigest", min_length=64, max_length=64, pattern=HEX64)
    string(body["leaseToken"], "$.leaseToken", min_length=32, max_length=128, pattern=LEASE_TOKEN)
    return secret_refs, bundle_refs


class SecretsRequest(Frozen):
    """A secrets request ready to send, and what its answer must echo.

    Attributes:
        body: the request bytes (holds the lease token: never log it; not in ``repr``).
        secret_refs / bundle_refs: the refs in request order.
        run_id, attempt_id, offer_id, execution_digest: the values the answer echoes.
    """

    __slots__ = ("body", "secret_refs", "bundle_refs", "run_id", "attempt_id", "offer_id",  # noqa: RUF023
                 "execution_digest")
    _repr_hidden = ("body",)

    body: bytes
    secret_refs: tuple[str, ...]
    bundle_refs: tuple[str, ...]
    run_id: str
    attempt_id: str
    offer_id: str
    execution_digest: str

    def __init__(self, body: bytes, secret_refs: tuple[str, ...], bundle_refs: tuple[str, ...], run_id: str,  # noqa: PLR0917
                 attempt_id: str, offer_id: str, execution_digest: str) -> None:
        _set = object.__setattr__
        _set(self, "body", body)
        _set(self, "secret_refs", secret_refs)
        _set(self, "bundle_refs", bundle_refs)
        _set(self, "run_id", run_id)
        _set(self, "attempt_id", attempt_id)
        _set(self, "offer_id", offer_id)
        _set(self, "execution_digest", execution_digest)


def secrets_request(offer: InternalOffer) -> SecretsRequest | None:
    """Build the secrets request for the stored internal offer (T3), or None to skip the call.

    Raises:
        CallError: ``secrets_request_invalid`` (e.g. reason ``length`` beyond 64 refs).
    """
    with guard("secrets_request_invalid", known_keys=_KNOWN_KEYS):
        fence = fence_of(offer)
        source = object_value(offer, "$.offer")
        candidate = object_value(source["candidate"], "$.offer.candidate")
        secret_refs, bundle_refs = secret_refs_of(member(source, "executionRevision", "$.offer"))
        if not secret_refs and not bundle_refs:
            return None
        fence.check(project=False)  # the workerId / sessionId the provider's path needs
        body: dict[str, Any] = {
            "schema": SECRETS_SCHEMA,
            "workerGeneration": fence.worker_generation,
            "runId": fence.run_id,
            "attemptId": fence.attempt_id,
            "projectId": fence.project_id,
            "taskId": member(candidate, "taskId", "$.offer.candidate"),
            "taskRevision": member(candidate, "taskRevision", "$.offer.candidate"),
            "executionDigest": member(source, "executionDigest", "$.offer"),
            "offerId": fence.offer_id,
            "leaseGeneration": fence.lease_generation,
            "leaseToken": fence.lease_token,
            "expectedLeaseVersion": fence.expected_lease_version,
            "secretRefs": list(secret_refs),
            "environmentBundleRefs": list(bundle_refs),
        }
        _check_request(body)
        return SecretsRequest(request_bytes(body, SECRETS_REQUEST_MAX_BYTES), secret_refs, bundle_refs,
                              fence.run_id, fence.attempt_id, fence.offer_id, body["executionDigest"])


def parse_secrets_request(body: bytes) -> dict[str, Any]:
    """The server-side view of a secrets request body: exact keys, ``schema``, every rule.

    Raises:
        CallError: ``secrets_request_invalid``.
    """
    with guard("secrets_request_invalid", known_keys=_KNOWN_KEYS):
        value = schema_document(body, max_bytes=SECRETS_REQUEST_MAX_BYTES, keys=_REQUEST_KEYS, schema=SECRETS_SCHEMA)
        _check_request(value)
        return value


class SecretValues:
    """The values of a secrets answer, as ``bytearray`` (UTF-8), in request order.

    ``repr``/``str`` name the refs and sizes only. Call :meth:`wipe` once the environment
    is built (it zeroes and drops every value).
    """

    __slots__ = ("bundle_refs", "bundles", "refs", "values")

    def __init__(self, refs: tuple[str, ...], values: list[bytearray], bundle_refs: tuple[str, ...],
                 bundles: list[bytearray]) -> None:
        self.refs = refs
        self.values = values
        self.bundle_refs = bundle_refs
        self.bundles = bundles

    def value_for(self, secret_ref: str) -> bytearray:
        """The value of ``secret_ref``.

        Raises:
            KeyError: the ref was not requested (or the values were wiped).
        """
        if secret_ref not in self.refs or len(self.values) != len(self.refs):
            raise KeyError("a secret ref that was not requested")
        return self.values[self.refs.index(secret_ref)]

    def wipe(self) -> None:
        """Zero every value in place and drop the references."""
        for item in (*self.values, *self.bundles):
            item[:] = bytes(len(item))
        self.values = []
        self.bundles = []

    def __repr__(self) -> str:
        return f"SecretValues({len(self.values)} values, {len(self.bundles)} bundles, redacted)"

    __str__ = __repr__


def _entries(value: object, path: str, refs: tuple[str, ...], *, each: int, total: int,
             pending: list[bytearray]) -> list[bytearray]:
    if not isinstance(value, list) or len(value) != len(refs):
        raise ContractError("ref_mismatch", path, "must answer every requested ref, in order")
    out: list[bytearray] = []
    used = 0
    for index, entry in enumerate(value):
        entry_path = child(path, index)
        item = object_value(entry, entry_path)
        exact_keys(item, _ENTRY_KEYS, entry_path)
        text = item["value"]
        if item["secretRef"] != refs[index]:
            raise ContractError("ref_mismatch", child(entry_path, "secretRef"), "not the requested ref")
        if not isinstance(text, str) or "\x00" in text or utf8_length(text) > each:
            raise ContractError("secret_value", child(entry_path, "value"),
                                f"a string without NUL of at most {each} bytes")
        used += utf8_length(text)
        if used > total:
            raise ContractError("budget", path, f"values exceed {total} bytes")
        out.append(bytearray(text, "utf-8"))
        pending.append(out[-1])
    return out


def parse_secrets_response(body: bytes | bytearray, request: SecretsRequest) -> SecretValues:
    """Validate a 200 secrets answer against its request (module docstring order).

    A ``bytearray`` body is zeroed before this returns or raises.

    Raises:
        CallError: ``secrets_response_invalid`` (no value, no peer key name in it).
    """
    pending: list[bytearray] = []  # zeroed unless handed over in the result
    try:
        with guard("secrets_response_invalid", known_keys=_KNOWN_KEYS):
            value = schema_document(body, max_bytes=SECRETS_RESPONSE_MAX_BYTES, schema=SECRETS_SCHEMA,
                                    keys=_RESPONSE_KEYS)
            run_id = _identifier(value["runId"], "$.runId", 36)
            attempt_id = _identifier(value["attemptId"], "$.attemptId", 36)
            offer_id = _identifier(value["offerId"], "$.offerId", 128)
            digest = _identifier(value["executionDigest"], "$.executionDigest", 64)
            string(digest, "$.executionDigest", min_length=64, max_length=64, pattern=HEX64)
            values = _entries(value["values"], "$.values", request.secret_refs, each=MAX_SECRET_VALUE_BYTES,
                              total=MAX_SECRET_TOTAL_BYTES, pending=pending)
            bundles = _entries(value["environmentBundles"], "$.environmentBundles", request.bundle_refs,
                               each=MAX_BUNDLE_VALUE_BYTES, total=MAX_BUNDLE_VALUE_BYTES, pending=pending)
            echo(run_id, request.run_id, "$.runId")
            echo(attempt_id, request.attempt_id, "$.attemptId")
            echo(offer_id, request.offer_id, "$.offerId")
            echo(digest, request.execution_digest, "$.executionDigest")
            pending = []
            return SecretValues(request.secret_refs, values, request.bundle_refs, bundles)
    finally:
        for item in pending:
            item[:] = bytes(len(item))
        if isinstance(body, bytearray):
            body[:] = bytes(len(body))
