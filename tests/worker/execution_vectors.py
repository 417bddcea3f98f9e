"""The golden vectors of remote-execution.md section 6, verbatim (the fixture of
offer-delivery.md 4.3: edge-1, session ...0001 generation 2, offer-1, run-1/attempt-1 of
project-1/task-1, leaseGeneration 1, lease version 3 at starting, 4 after one renewal).

Request bodies are the bytes a reference worker sends; responses are the bytes the spec
prints (the ones with cluster-clock fields are templates: see the tests).
"""

from __future__ import annotations

import hashlib

SESSION_ID = "018f0000-0000-7000-8000-000000000001"
LEASE_TOKEN = "worker_generated_lease_capability_0000000000000001"
CALLBACK_TOKEN = b"\x11" * 32
CALLBACK_DIGEST = "02d449a31fbb267c8f352e9968a79e3e5fc95c1bbeaa502fd6454ebde5a4bedc"
LOG_ARTIFACT_ID = "wlog-68cd94391d043410683fabcde45b2a"
SECRET_REF = "qlsecret:v1:eyJwcm9qZWN0SWQiOiJwcm9qZWN0LTEiLCJuYW1lIjoiQVBJX0tFWSJ9"
#: The revision digest once the API_KEY binding is in it (the section 6 correction).
EXECUTION_DIGEST = "db2396c6da02e298190ba842f382d7e77f6a12d8dd86b30203d95c6b5f419d92"
HANDLE = (
    "ql3lp1.eyJ2IjoxLCJoIjoiMDE5MGEwMDAtMDAwMC00MDAwLTgwMDAtMDAwMDAwMDAwMDAxIiwiYiI6IjZmMWMwZTJhLTFiMmMtNGQzZS04Zj"
    "QwLTEyMzQ1Njc4OWFiYyIsInAiOjQyNDIsImciOjQyNDIsInMiOiIxMjM0NTYifQ"
)
LOG = b"hello\n"

assert hashlib.sha256(CALLBACK_TOKEN).hexdigest() == CALLBACK_DIGEST

STARTING = (
    b'{"runId":"run-1","attemptId":"attempt-1","workerGeneration":2,"offerId":"offer-1","leaseGeneration":1,'
    b'"leaseToken":"worker_generated_lease_capability_0000000000000001","expectedLeaseVersion":3}'
)
STARTING_APPLIED = (
    b'{"schema":"qinglong/remote-run-activation@v1","status":"applied","snapshot":{"runId":"run-1",'
    b'"attemptId":"attempt-1","runStatus":"dispatching","attemptStatus":"starting","leaseVersion":3,'
    b'"leaseGeneration":1,"callbackSequence":0}}'
)
SECRETS = (
    b'{"schema":"qinglong/remote-secret-delivery@v2","workerGeneration":2,"runId":"run-1","attemptId":"attempt-1",'
    b'"projectId":"project-1","taskId":"task-1","taskRevision":"qltd:v1:1:'
    b'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","executionDigest":'
    b'"db2396c6da02e298190ba842f382d7e77f6a12d8dd86b30203d95c6b5f419d92","offerId":"offer-1","leaseGeneration":1,'
    b'"leaseToken":"worker_generated_lease_capability_0000000000000001","expectedLeaseVersion":3,"secretRefs":'
    b'["qlsecret:v1:eyJwcm9qZWN0SWQiOiJwcm9qZWN0LTEiLCJuYW1lIjoiQVBJX0tFWSJ9"],"environmentBundleRefs":[]}'
)
#: The printed response with the corrected digest echoed (section 6).
SECRETS_ANSWER = (
    b'{"schema":"qinglong/remote-secret-delivery@v2","runId":"run-1","attemptId":"attempt-1","offerId":"offer-1",'
    b'"executionDigest":"db2396c6da02e298190ba842f382d7e77f6a12d8dd86b30203d95c6b5f419d92","values":'
    b'[{"secretRef":"qlsecret:v1:eyJwcm9qZWN0SWQiOiJwcm9qZWN0LTEiLCJuYW1lIjoiQVBJX0tFWSJ9","value":"s3cr3t"}],'
    b'"environmentBundles":[]}'
)
RUNNING = (
    b'{"runId":"run-1","attemptId":"attempt-1","workerGeneration":2,"offerId":"offer-1","leaseGeneration":1,'
    b'"leaseToken":"worker_generated_lease_capability_0000000000000001","expectedLeaseVersion":3,'
    b'"executorHandle":"' + HANDLE.encode() + b'","logArtifactId":"wlog-68cd94391d043410683fabcde45b2a",'
    b'"callbackSequence":1,"callbackTokenDigest":"02d449a31fbb267c8f352e9968a79e3e5fc95c1bbeaa502fd6454ebde5a4bedc"}'
)
#: ``{started}`` is the cluster clock at the call.
RUNNING_APPLIED = (
    '{{"schema":"qinglong/remote-run-activation@v1","status":"applied","snapshot":{{"runId":"run-1",'
    '"attemptId":"attempt-1","runStatus":"running","attemptStatus":"running","leaseVersion":3,"leaseGeneration":1,'
    '"callbackSequence":1,"startedAtMs":{started},"executorHandle":"' + HANDLE + '",'
    '"logArtifactId":"wlog-68cd94391d043410683fabcde45b2a"}}}}'
)
LEASE_CONTROL = (
    b'{"schema":"qinglong/remote-worker-lease-control@v1","workerGeneration":2,"projectId":"project-1",'
    b'"runId":"run-1","attemptId":"attempt-1","offerId":"offer-1","leaseGeneration":1,'
    b'"leaseToken":"worker_generated_lease_capability_0000000000000001","expectedLeaseVersion":3}'
)
#: ``{renewed}`` / ``{expires}``: the cluster clock at the call and 30 s later.
LEASE_RENEWED = (
    '{{"schema":"qinglong/remote-worker-lease-control@v1","status":"renewed","projectId":"project-1",'
    '"runId":"run-1","attemptId":"attempt-1","offerId":"offer-1","leaseGeneration":1,"leaseVersion":4,'
    '"renewedAtMs":{renewed},"expiresAtMs":{expires},"stop":null,"terminalStatus":null}}'
)
ARTIFACT_HEADER = (
    b'{"schema":"qinglong/remote-worker-artifact-upload@v1","workerGeneration":2,"projectId":"project-1",'
    b'"runId":"run-1","attemptId":"attempt-1","offerId":"offer-1","leaseGeneration":1,'
    b'"leaseToken":"worker_generated_lease_capability_0000000000000001","expectedLeaseVersion":4,'
    b'"logArtifactId":"wlog-68cd94391d043410683fabcde45b2a","byteLength":6,"truncated":false}'
)
ARTIFACT_BODY_SHA256 = "af6b2f64a67b7c9a8396bb03187ef8082cf9bf8472de5fda5c37908a0e2c513d"
LOG_SHA256 = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
ARTIFACT_STORED = (
    b'{"schema":"qinglong/remote-worker-artifact-upload@v1","status":"stored","projectId":"project-1",'
    b'"runId":"run-1","attemptId":"attempt-1","logArtifactId":"wlog-68cd94391d043410683fabcde45b2a",'
    b'"byteLength":6,"sha256":"5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03",'
    b'"truncated":false}'
)
COMPLETION = (
    b'{"schema":"qinglong/remote-worker-completion@v1","workerGeneration":2,"projectId":"project-1",'
    b'"runId":"run-1","attemptId":"attempt-1","offerId":"offer-1","leaseGeneration":1,'
    b'"leaseToken":"worker_generated_lease_capability_0000000000000001","expectedLeaseVersion":4,'
    b'"callbackSequence":1,"callbackTokenDigest":"02d449a31fbb267c8f352e9968a79e3e5fc95c1bbeaa502fd6454ebde5a4bedc",'
    b'"result":{"outcome":"succeeded","startedAtMs":1005,"finishedAtMs":3000,"exitCode":0},'
    b'"artifact":{"logArtifactId":"wlog-68cd94391d043410683fabcde45b2a","byteLength":6,'
    b'"sha256":"5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03","truncated":false}}'
)
COMPLETION_APPLIED = (
    b'{"schema":"qinglong/remote-worker-completion@v1","status":"applied","runId":"run-1","attemptId":"attempt-1",'
    b'"callbackSequence":1}'
)

assert len(STARTING) == 193 and len(SECRETS) == 571 and len(RUNNING) == 550
assert len(LEASE_CONTROL) == 268 and len(ARTIFACT_HEADER) == 357 and len(COMPLETION) == 636
