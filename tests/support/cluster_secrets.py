"""The secrets route of the cluster double, ``qinglong/remote-secret-delivery@v2``, and the
project secrets and environment bundles a test defines (tests and the demo only).

Server behaviour (remote-execution.md 3.4), checked against the reference (whyour/qinglong
at 4abf125):

* the pipeline (``workerIngressPipeline.ts``): the 14 body keys as a set and the schema,
  else 400 ``invalid_worker_request``;
* ``normalizeRemoteWorkerSecretDeliveryCommand``
  (``packages/ql3-runtime-core/src/remote-execution/remoteSecretDelivery.ts``): ids by
  the dispatch-id grammar, projectId/taskId/taskRevision 1-128 bytes, executionDigest 64
  lowercase hex, generations int31 >= 1, expectedLeaseVersion int31 >= 0, the lease-token
  grammar, ``secretRefs`` <= 64 and ``environmentBundleRefs`` <= 1 unique canonical
  ``qlsecret:v1:`` refs of the body's project, at least one ref, no ref in both lists. A
  violation is ``InvalidRemoteWorkerSecretDeliveryError``, which the pipeline maps to
  **503** ``worker_ingress_unavailable`` (not 400);
* the authority (``PostgresRemoteWorkerSecretDeliveryAuthorityRepository.authorize``,
  ``packages/ql3-cluster-postgres/src/remote-execution/`` at 4abf125): the attempt must
  be ``starting`` with the run ``dispatching`` and **no cancel intent**, the session
  current, the lease ``leased`` at the expected version and unexpired, every fence field
  equal; any difference (an unknown attempt included) -> 409
  ``worker_secret_delivery_fenced`` reason ``authority_mismatch``. Then the revision's
  project, task, taskRevision and contentDigest must equal the body, and the refs must be
  exactly the revision's unique secret refs in its (normalized) environment order and
  ``[environmentBundleRef]`` or ``[]``, else ``secret_scope_mismatch``;
* the values (``remoteWorkerSecretDeliveryService.ts``): a ref the double has no value
  for, a value with NUL or over 16 384 bytes, values over 65 536 bytes in total, or a
  bundle over 98 304 bytes -> 503 ``worker_ingress_unavailable``.

Read-only: no lease version change, no event. Environment bundles are the runtime-core
``qinglong/environment-bundle@v1`` document ``{"schema","entries":[{"name","value"}]}``
(entries sorted by name, 1-256, values <= 16 KiB without NUL; read in the reference's
environment-bundle contract, index id 57801481140, whose path the index does not show).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.execution_revision import create_secret_ref, parse_secret_ref
from tests.support.cluster_attempts import Fence, Ledger
from tests.support.cluster_wire import INT31, Failure, compact, dispatch_id, exact_keys, identifier, js_int, lease_token

__all__ = ["BUNDLE_SCHEMA", "SECRETS_SCHEMA", "bundle_value", "define_bundle", "define_secret", "secrets"]

SECRETS_SCHEMA = "qinglong/remote-secret-delivery@v2"
BUNDLE_SCHEMA = "qinglong/environment-bundle@v1"
SECRETS_KEYS = ("schema", "runId", "attemptId", "projectId", "taskId", "taskRevision", "executionDigest",
                "workerGeneration", "offerId", "leaseGeneration", "leaseToken", "expectedLeaseVersion", "secretRefs",
                "environmentBundleRefs")
MAX_VALUE_BYTES = 16 * 1024
MAX_TOTAL_VALUE_BYTES = 64 * 1024
MAX_BUNDLE_BYTES = 96 * 1024
_HEX64 = frozenset("0123456789abcdef")
_UNAVAILABLE = (503, "worker_ingress_unavailable")


def define_secret(ledger: Ledger, name: str, value: str, *, project_id: str = "project-1",
                  version: int | None = None) -> str:
    """Store a project secret; returns its canonical ``qlsecret:v1:`` ref."""
    ref = create_secret_ref(project_id, name, version)
    ledger.secret_values[ref] = value
    return ref


def bundle_value(entries: Mapping[str, str]) -> str:
    """The serialized ``qinglong/environment-bundle@v1`` of ``entries`` (sorted by name)."""
    items = [{"name": name, "value": entries[name]} for name in sorted(entries)]
    return compact({"schema": BUNDLE_SCHEMA, "entries": items}).decode("utf-8")


def define_bundle(ledger: Ledger, name: str, entries: Mapping[str, str], *, project_id: str = "project-1",
                  version: int = 1) -> str:
    """Store an environment bundle (a versioned project secret); returns its ref."""
    return define_secret(ledger, name, bundle_value(entries), project_id=project_id, version=version)


def _refs(value: object, project_id: str, maximum: int) -> list[str]:
    if not isinstance(value, list) or len(value) > maximum:
        raise TypeError("refs")
    seen: list[str] = []
    for entry in value:
        if not isinstance(entry, str) or entry in seen:
            raise TypeError("refs")
        try:
            if parse_secret_ref(entry)["projectId"] != project_id:
                raise TypeError("ref project")
        except ContractError:
            raise TypeError("ref") from None
        seen.append(entry)
    return seen


def _command(worker_id: str, session_id: str, body: dict[str, Any]) -> tuple[Fence, dict[str, Any]]:
    project_id = identifier(body["projectId"])
    fence = Fence(
        worker_id=worker_id, session_id=session_id,
        worker_generation=js_int(body["workerGeneration"], 1, INT31),
        run_id=dispatch_id(body["runId"]), attempt_id=dispatch_id(body["attemptId"]),
        offer_id=dispatch_id(body["offerId"]), lease_generation=js_int(body["leaseGeneration"], 1, INT31),
        lease_token=lease_token(identifier(body["leaseToken"])),
        expected_lease_version=js_int(body["expectedLeaseVersion"], 0, INT31), project_id=project_id,
    )
    digest = identifier(body["executionDigest"], 64)
    if len(digest) != 64 or not set(digest) <= _HEX64:
        raise TypeError("executionDigest")
    secret_refs = _refs(body["secretRefs"], project_id, 64)
    bundle_refs = _refs(body["environmentBundleRefs"], project_id, 1)
    if not secret_refs and not bundle_refs:
        raise TypeError("no refs")
    if any(ref in bundle_refs for ref in secret_refs):
        raise TypeError("refs overlap")
    rest = {"taskId": identifier(body["taskId"]), "taskRevision": identifier(body["taskRevision"]),
            "executionDigest": digest, "secretRefs": secret_refs, "environmentBundleRefs": bundle_refs}
    return fence, rest


def _values(ledger: Ledger, refs: list[str], each_max: int, total_max: int) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    total = 0
    for ref in refs:
        value = ledger.secret_values.get(ref)
        if value is None or "\x00" in value or len(value.encode("utf-8")) > each_max:
            raise Failure(*_UNAVAILABLE)
        total += len(value.encode("utf-8"))
        if total > total_max:
            raise Failure(*_UNAVAILABLE)
        out.append({"secretRef": ref, "value": value})
    return out


def secrets(ledger: Ledger, worker_id: str, session_id: str, document: object) -> dict[str, Any]:
    """POST secrets (see the module docstring)."""
    body = exact_keys(document, SECRETS_KEYS)
    if body["schema"] != SECRETS_SCHEMA:
        raise Failure(400, "invalid_worker_request")
    try:
        fence, command = _command(worker_id, session_id, body)
    except TypeError:
        raise Failure(*_UNAVAILABLE) from None
    now = ledger.clock_ms()
    attempt = ledger.attempts.get(fence.attempt_id)
    if (
        attempt is None
        or attempt.run_id != fence.run_id
        or attempt.project_id != fence.project_id
        or attempt.task_id != command["taskId"]
        or attempt.task_revision != command["taskRevision"]
        or attempt.run_status != "dispatching"
        or attempt.cancel_requested_at_ms is not None
        or attempt.status != "starting"
        or ledger.session_reason(fence, now) is not None
        or ledger.identity_reason(attempt, fence) is not None
        or ledger.live_lease_reason(attempt, fence, now) is not None
    ):
        raise ledger.fence("secrets", "authority_mismatch", fence)
    revision = attempt.revision
    expected_refs: list[str] = []
    for binding in revision["environment"]:
        if binding["kind"] == "secret" and binding["secretRef"] not in expected_refs:
            expected_refs.append(binding["secretRef"])
    bundle = revision.get("environmentBundleRef")
    if (
        revision["projectId"] != fence.project_id
        or revision["taskId"] != command["taskId"]
        or revision["taskRevision"] != command["taskRevision"]
        or revision["contentDigest"] != command["executionDigest"]
        or command["secretRefs"] != expected_refs
        or command["environmentBundleRefs"] != ([] if bundle is None else [bundle])
    ):
        raise ledger.fence("secrets", "secret_scope_mismatch", fence)
    return {
        "schema": SECRETS_SCHEMA,
        "runId": fence.run_id,
        "attemptId": fence.attempt_id,
        "offerId": fence.offer_id,
        "executionDigest": command["executionDigest"],
        "values": _values(ledger, command["secretRefs"], MAX_VALUE_BYTES, MAX_TOTAL_VALUE_BYTES),
        "environmentBundles": _values(ledger, command["environmentBundleRefs"], MAX_BUNDLE_BYTES, MAX_BUNDLE_BYTES),
    }
