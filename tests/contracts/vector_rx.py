"""Golden vectors of remote-execution.md section 6, verbatim, and builders of variant offers.

The fixture is the accepted record of offer-delivery.md 4.3 (``vectors/a_inbox_offer-1.json``):
edge-1, session 018f...0001, generation 2, offer-1, run-1/attempt-1/project-1/task-1,
leaseGeneration 1, lease.version 3. The byte strings below are copied from section 6 (with
its corrections for the secrets body and digest).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from qinglong_edge.contracts.execution_revision import create_secret_ref, normalize_execution_revision
from qinglong_edge.contracts.journal_records import parse_inbox_record
from tests.contracts import vector_a as va

RECORD: dict[str, Any] = parse_inbox_record(va.INBOX_RECORD)
SESSION = va.SESSION_ID
PATH_PREFIX = f"/api/v3/worker-ingress/workers/edge-1/sessions/{SESSION}/"

TOKEN_RAW = b"\x11" * 32
TOKEN_TEXT = "ERERERERERERERERERERERERERERERERERERERERERE"
TOKEN_DIGEST = "02d449a31fbb267c8f352e9968a79e3e5fc95c1bbeaa502fd6454ebde5a4bedc"
LOG_ID = "wlog-68cd94391d043410683fabcde45b2a"
API_KEY_REF = "qlsecret:v1:eyJwcm9qZWN0SWQiOiJwcm9qZWN0LTEiLCJuYW1lIjoiQVBJX0tFWSJ9"
DIGEST_WITH_API_KEY = "db2396c6da02e298190ba842f382d7e77f6a12d8dd86b30203d95c6b5f419d92"
HANDLE = ("ql3lp1.eyJ2IjoxLCJoIjoiMDE5MGEwMDAtMDAwMC00MDAwLTgwMDAtMDAwMDAwMDAwMDAxIiwiYiI6IjZmMWMwZTJhLTFiMmMtNGQzZS04"
          "ZjQwLTEyMzQ1Njc4OWFiYyIsInAiOjQyNDIsImciOjQyNDIsInMiOiIxMjM0NTYifQ")
HANDLE_JSON = (b'{"v":1,"h":"0190a000-0000-4000-8000-000000000001","b":"6f1c0e2a-1b2c-4d3e-8f40-123456789abc",'
               b'"p":4242,"g":4242,"s":"123456"}')
LOG = b"hello\n"
LOG_SHA256 = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"

STARTING = (b'{"runId":"run-1","attemptId":"attempt-1","workerGeneration":2,"offerId":"offer-1","leaseGeneration":1,'
            b'"leaseToken":"worker_generated_lease_capability_0000000000000001","expectedLeaseVersion":3}')
STARTING_APPLIED = (b'{"schema":"qinglong/remote-run-activation@v1","status":"applied","snapshot":{"runId":"run-1",'
                    b'"attemptId":"attempt-1","runStatus":"dispatching","attemptStatus":"starting","leaseVersion":3,'
                    b'"leaseGeneration":1,"callbackSequence":0}}')
STARTING_REPLAY = STARTING_APPLIED.replace(b'"applied"', b'"already_starting"')
SECRETS = (b'{"schema":"qinglong/remote-secret-delivery@v2","workerGeneration":2,"runId":"run-1","attemptId":"attempt-1",'
           b'"projectId":"project-1","taskId":"task-1","taskRevision":"qltd:v1:1:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'
           b'aaaaaaaaaaaaaaaaaaaaaaaaaa","executionDigest":"db2396c6da02e298190ba842f382d7e77f6a12d8dd86b30203d95c6b5f'
           b'419d92","offerId":"offer-1","leaseGeneration":1,"leaseToken":"worker_generated_lease_capability_000000000'
           b'0000001","expectedLeaseVersion":3,"secretRefs":["qlsecret:v1:eyJwcm9qZWN0SWQiOiJwcm9qZWN0LTEiLCJuYW1lIjoi'
           b'QVBJX0tFWSJ9"],"environmentBundleRefs":[]}')
#: The section-6 answer as printed (it echoes the *old* digest); :data:`SECRETS_ANSWER`
#: echoes the corrected one, as the section says a real cluster does.
SECRETS_ANSWER_PRINTED = (
    b'{"schema":"qinglong/remote-secret-delivery@v2","runId":"run-1","attemptId":"attempt-1","offerId":"offer-1",'
    b'"executionDigest":"6245978746f5a4bd6af7dd083979fb31f69de70989802f9ad3007a15e4a7b39e","values":[{"secretRef":'
    b'"qlsecret:v1:eyJwcm9qZWN0SWQiOiJwcm9qZWN0LTEiLCJuYW1lIjoiQVBJX0tFWSJ9","value":"s3cr3t"}],'
    b'"environmentBundles":[]}')
SECRETS_ANSWER = SECRETS_ANSWER_PRINTED.replace(va.CONTENT_DIGEST.encode(), DIGEST_WITH_API_KEY.encode())
RUNNING = (b'{"runId":"run-1","attemptId":"attempt-1","workerGeneration":2,"offerId":"offer-1","leaseGeneration":1,'
           b'"leaseToken":"worker_generated_lease_capability_0000000000000001","expectedLeaseVersion":3,'
           b'"executorHandle":"' + HANDLE.encode() + b'","logArtifactId":"wlog-68cd94391d043410683fabcde45b2a",'
           b'"callbackSequence":1,"callbackTokenDigest":"02d449a31fbb267c8f352e9968a79e3e5fc95c1bbeaa502fd6454ebde5a4bedc"}')
RUNNING_APPLIED = (b'{"schema":"qinglong/remote-run-activation@v1","status":"applied","snapshot":{"runId":"run-1",'
                   b'"attemptId":"attempt-1","runStatus":"running","attemptStatus":"running","leaseVersion":3,'
                   b'"leaseGeneration":1,"callbackSequence":1,"startedAtMs":1700000001234,"executorHandle":"'
                   + HANDLE.encode() + b'","logArtifactId":"wlog-68cd94391d043410683fabcde45b2a"}}')
LEASE_CONTROL = (b'{"schema":"qinglong/remote-worker-lease-control@v1","workerGeneration":2,"projectId":"project-1",'
                 b'"runId":"run-1","attemptId":"attempt-1","offerId":"offer-1","leaseGeneration":1,'
                 b'"leaseToken":"worker_generated_lease_capability_0000000000000001","expectedLeaseVersion":3}')
_LC_HEAD = (b'{"schema":"qinglong/remote-worker-lease-control@v1","status":"%s","projectId":"project-1","runId":"run-1",'
            b'"attemptId":"attempt-1","offerId":"offer-1","leaseGeneration":1,')
RENEWED = _LC_HEAD % b"renewed" + (b'"leaseVersion":4,"renewedAtMs":1700000002000,"expiresAtMs":1700000032000,'
                                   b'"stop":null,"terminalStatus":null}')
STOP_REQUESTED = _LC_HEAD % b"stop_requested" + (
    b'"leaseVersion":4,"renewedAtMs":1700000002000,"expiresAtMs":1700000032000,"stop":{"reason":"user",'
    b'"requestedAtMs":1700000001500},"terminalStatus":null}')
TERMINAL = _LC_HEAD % b"terminal" + (b'"leaseVersion":null,"renewedAtMs":null,"expiresAtMs":null,"stop":null,'
                                     b'"terminalStatus":"cancelled"}')
ARTIFACT_HEADER = (b'{"schema":"qinglong/remote-worker-artifact-upload@v1","workerGeneration":2,"projectId":"project-1",'
                   b'"runId":"run-1","attemptId":"attempt-1","offerId":"offer-1","leaseGeneration":1,'
                   b'"leaseToken":"worker_generated_lease_capability_0000000000000001","expectedLeaseVersion":4,'
                   b'"logArtifactId":"wlog-68cd94391d043410683fabcde45b2a","byteLength":6,"truncated":false}')
ARTIFACT_BODY_SHA256 = "af6b2f64a67b7c9a8396bb03187ef8082cf9bf8472de5fda5c37908a0e2c513d"
ARTIFACT_ANSWER = (b'{"schema":"qinglong/remote-worker-artifact-upload@v1","status":"stored","projectId":"project-1",'
                   b'"runId":"run-1","attemptId":"attempt-1","logArtifactId":"wlog-68cd94391d043410683fabcde45b2a",'
                   b'"byteLength":6,"sha256":"5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03",'
                   b'"truncated":false}')
COMPLETION = (b'{"schema":"qinglong/remote-worker-completion@v1","workerGeneration":2,"projectId":"project-1",'
              b'"runId":"run-1","attemptId":"attempt-1","offerId":"offer-1","leaseGeneration":1,'
              b'"leaseToken":"worker_generated_lease_capability_0000000000000001","expectedLeaseVersion":4,'
              b'"callbackSequence":1,"callbackTokenDigest":"02d449a31fbb267c8f352e9968a79e3e5fc95c1bbeaa502fd6454ebde5'
              b'a4bedc","result":{"outcome":"succeeded","startedAtMs":1005,"finishedAtMs":3000,"exitCode":0},'
              b'"artifact":{"logArtifactId":"wlog-68cd94391d043410683fabcde45b2a","byteLength":6,"sha256":"5891b5b52'
              b'2d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03","truncated":false}}')
COMPLETION_APPLIED = (b'{"schema":"qinglong/remote-worker-completion@v1","status":"applied","runId":"run-1",'
                      b'"attemptId":"attempt-1","callbackSequence":1}')
RECEIPT = (b'{"schemaVersion":1,"runId":"run-1","attemptId":"attempt-1","callbackSequence":1,'
           b'"token":"ERERERERERERERERERERERERERERERERERERERERERE","startedAtMs":1005,"finishedAtMs":3000,"exitCode":0}')
TRUNCATION_FACT = (b'{"schemaVersion":1,"runId":"run-1","attemptId":"attempt-1",'
                   b'"logArtifactId":"wlog-68cd94391d043410683fabcde45b2a","maximumBytes":4194304,"quotaReached":false,'
                   b'"observedAtMs":3000}')


def record() -> dict[str, Any]:
    """A fresh copy of the accepted record (state ``accepted``, revision 0, lease v3)."""
    return copy.deepcopy(RECORD)


def offer() -> dict[str, Any]:
    return record()["offer"]


def offer_with_revision(**changes: Any) -> dict[str, Any]:
    """The fixture offer with its revision changed and every digest rebuilt (still valid)."""
    value = offer()
    revision = {k: v for k, v in value["executionRevision"].items() if k != "contentDigest"}
    revision.update(changes)
    revision = {k: v for k, v in revision.items() if v is not None}
    normalized = normalize_execution_revision(revision, verify_digest=False)
    value["executionRevision"] = normalized
    value["executionDigest"] = normalized["contentDigest"]
    return value


def api_key_offer() -> dict[str, Any]:
    """The section-6 offer with the one secret binding ``API_KEY`` (digest db2396c6...)."""
    return offer_with_revision(environment=[{"name": "API_KEY", "kind": "secret", "secretRef": API_KEY_REF}])


def renewed_offer(version: int = 4) -> dict[str, Any]:
    """The offer after the section-6 renewal (v3 -> v4)."""
    value = offer()
    value["lease"].update(version=version, renewedAtMs=1700000002000, expiresAtMs=1700000032000,
                          updatedAtMs=1700000002000)
    return value


def secret(name: str, project: str = "project-1", version: int | None = None) -> str:
    return create_secret_ref(project, name, version)


def body(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decoded(data: bytes) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(data)
    return value


def with_key(data: bytes, path: tuple[str | int, ...], value: Any) -> bytes:
    """``data`` decoded, ``value`` set at ``path`` (a missing marker deletes), re-encoded compactly."""
    doc = decoded(data)
    target: Any = doc
    for part in path[:-1]:
        target = target[part]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return body(doc)


DELETE = object()


def changed(data: bytes, **changes: Any) -> bytes:
    """``data`` decoded, each top-level key of ``changes`` set (``DELETE`` deletes it), re-encoded compactly."""
    doc = decoded(data)
    for key, value in changes.items():
        if value is DELETE:
            del doc[key]
        else:
            doc[key] = value
    return body(doc)


def duplicated(data: bytes, key: str) -> bytes:
    """``data`` with a second top-level ``key`` (same value) appended: a duplicate key."""
    doc = decoded(data)
    return data[:-1] + b',"' + key.encode() + b'":' + body(doc[key]) + b"}"


def padded(data: bytes, size: int) -> bytes:
    """``data`` grown to exactly ``size`` bytes with insignificant whitespace before the final ``}``."""
    return data[:-1] + b" " * (size - len(data)) + b"}"


#: Text that must never appear in an error message or a repr.
SECRET_TEXTS = (va.LEASE_TOKEN, TOKEN_TEXT, "s3cr3t")


def only_call_errors(call: Any, code: str) -> Any:
    """Run ``call``: it returns, or raises a CallError named ``code`` that leaks no secret.

    ``reason == "malformed"`` would mean a Python error escaped a check (a bug): refused.
    """
    from qinglong_edge.contracts.ingress import CallError

    try:
        return call()
    except CallError as exc:
        assert exc.code == code, (exc.code, exc.reason, exc.path)
        assert exc.reason != "malformed", exc.path
        assert exc.path.startswith("$")
        for text in SECRET_TEXTS:
            assert text not in str(exc) and text not in repr(exc)
        return None
