"""Callback token, completion receipt, ``wlog-`` id and truncation fact (sections 4.2, 4.3).

Sources: remote-execution.md sections 4.2, 4.3 and 6; reference ``completionReceipt.ts``
(receipt schema v1 and its parse rules), ``workerFileLogArtifactAllocator.ts``
(``createWorkerRemoteLogArtifactId``, ``readTruncationFact``), ``executionInboxProcessor.ts``
(the token and its digest) at c699c32; spec README "The job wrapper" (our wrapper, not the
reference's shell launcher, writes the receipt and the fact).

**Callback token**: 32 CSPRNG bytes; its text is base64url without padding (43 chars);
``completionReceiptTokenDigest = sha256_hex(raw 32 bytes)`` (not of the text: the lease
token's digest is over its text). The token never crosses the network; only the digest.

**Receipt** ``<receiptRoot>/<attemptId[0:2]>/<attemptId>.json``, no newline::

    {"schemaVersion":1,"runId":R,"attemptId":A,"callbackSequence":N,"token":T,
     "startedAtMs":S,"finishedAtMs":F,"exitCode":E}

:func:`receipt_prefix` gives every byte up to and excluding ``,"finishedAtMs"`` so the
wrapper only appends :func:`receipt_suffix` (``,"finishedAtMs":F,"exitCode":E}``) when
the command ends. Parse rules (:func:`parse_receipt`): 1-4 096 bytes, strict UTF-8 JSON, a
flat object with exactly these 8 keys and no duplicate; runId/attemptId
``[A-Za-z0-9][A-Za-z0-9._:-]{0,35}``; callbackSequence a safe int >= 1; token
``[A-Za-z0-9_-]{32,128}``; times safe ints >= 0 with F >= S; E 0-255.
:func:`authenticate_receipt`: run, attempt and sequence equal the record's; S equals
``executorStartedAtMs``; F <= now; the token is canonical base64url of exactly 32 bytes and
its SHA-256 equals ``completionReceiptTokenDigest`` (constant-time compare).

**Log id**: ``wlog-`` + the first 30 hex of ``SHA-256("qinglong/worker-log-artifact@v1"
"\\0"projectId "\\0"runId "\\0"attemptId "\\0"offerId)``; each part a dispatch id. The
file is ``<logRoot>/<id[5:7]>/<id>.log`` (:func:`log_file_names`).

**Truncation fact** ``.<id>.log.truncated.json``::

    {"schemaVersion":1,"runId":R,"attemptId":A,"logArtifactId":L,"maximumBytes":M,
     "quotaReached":Q,"observedAtMs":O}

:func:`truncation_fact_prefix` stops before ``,"quotaReached"``; the writer appends
:func:`truncation_fact_suffix`. :func:`parse_truncation_fact`: 1-4 096 bytes, exactly these
keys, schemaVersion 1, R/A/L equal the attempt's, M equal to the policy, Q boolean, O a
safe int >= 0 (the 0600 mode check is the reader's I/O).

Secrets: the token is held as ``bytearray`` (:meth:`CallbackToken.wipe`); the receipt
prefix is returned as ``bytearray`` so it can be zeroed after the wrapper took it; no
``repr`` or error message contains a token. A ``str`` of the token (:meth:`CallbackToken.text`,
the parsed receipt) cannot be zeroed by Python.

Errors: :class:`~qinglong_edge.contracts.launch.LaunchError` with code
``callback_token_invalid``, ``log_artifact_id_invalid``, ``receipt_invalid``,
``receipt_unauthenticated`` (reasons ``run_mismatch``, ``attempt_mismatch``,
``sequence_mismatch``, ``started_mismatch``, ``finished_in_future``, ``token_encoding``,
``token_digest``), ``truncation_fact_invalid``.
"""

from __future__ import annotations

import base64
import binascii
import os
import re

from qinglong_edge.contracts._shape import Frozen, exact_keys, int_value, object_value
from qinglong_edge.contracts.digest import constant_time_equal, sha256, sha256_hex
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import MAX_SAFE_INTEGER, dispatch_id, string
from qinglong_edge.contracts.ids import HEX64
from qinglong_edge.contracts.ingress import guard
from qinglong_edge.contracts.launch import PORTABLE_EXECUTION_ID, LaunchError
from qinglong_edge.contracts.strictjson import dumps, loads

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from collections.abc import Callable

    from qinglong_edge.contracts.records import InboxRecord

__all__ = [
    "CALLBACK_TOKEN_BYTES",
    "LOG_ARTIFACT_DOMAIN",
    "RECEIPT_MAX_BYTES",
    "TRUNCATION_FACT_MAX_BYTES",
    "CallbackToken",
    "LogFileNames",
    "Receipt",
    "authenticate_receipt",
    "callback_token_digest",
    "log_artifact_id",
    "log_file_names",
    "new_callback_token",
    "parse_receipt",
    "parse_truncation_fact",
    "receipt_file_names",
    "receipt_prefix",
    "receipt_suffix",
    "truncation_fact_prefix",
    "truncation_fact_suffix",
]

CALLBACK_TOKEN_BYTES = 32
RECEIPT_MAX_BYTES = 4096
TRUNCATION_FACT_MAX_BYTES = 4096
LOG_ARTIFACT_DOMAIN = b"qinglong/worker-log-artifact@v1"
_RECEIPT_KEYS = ("schemaVersion", "runId", "attemptId", "callbackSequence", "token", "startedAtMs",
                 "finishedAtMs", "exitCode")
_FACT_KEYS = ("schemaVersion", "runId", "attemptId", "logArtifactId", "maximumBytes", "quotaReached",
              "observedAtMs")
_TOKEN = re.compile(r"[A-Za-z0-9_-]{32,128}")
_TOKEN_43 = re.compile(r"[A-Za-z0-9_-]{43}")
_WLOG = re.compile(r"wlog-[0-9a-f]{30}")


def _encode(raw: bytes | bytearray) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def callback_token_digest(raw: bytes | bytearray) -> str:
    """``sha256_hex`` of the 32 raw token bytes (the record's ``completionReceiptTokenDigest``).

    Raises:
        LaunchError: ``callback_token_invalid`` when ``raw`` is not 32 bytes.
    """
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != CALLBACK_TOKEN_BYTES:
        raise LaunchError("callback_token_invalid", "$.token", "must be 32 bytes", reason="length")
    return sha256_hex(bytes(raw))


class CallbackToken:
    """A completion-callback capability: 32 raw bytes, kept as ``bytearray``.

    Attributes:
        raw: the 32 bytes (zeroed by :meth:`wipe`).
        digest: sha256 hex of ``raw`` (not secret: it goes to the record and the cluster).
    """

    __slots__ = ("digest", "raw")

    def __init__(self, raw: bytearray) -> None:
        self.digest = callback_token_digest(raw)
        self.raw = raw

    def text(self) -> str:
        """The base64url text without padding (43 chars): the receipt's ``token``."""
        return _encode(self.raw)

    def wipe(self) -> None:
        """Zero the raw bytes in place."""
        self.raw[:] = bytes(len(self.raw))

    def __repr__(self) -> str:
        return f"CallbackToken(digest={self.digest!r})"

    __str__ = __repr__


def new_callback_token(random_bytes: Callable[[int], bytes] = os.urandom) -> CallbackToken:
    """A fresh token from ``random_bytes(32)`` (a CSPRNG: ``os.urandom``; tests pin it).

    Raises:
        LaunchError: ``callback_token_invalid`` when the source gives other than 32 bytes.
    """
    return CallbackToken(bytearray(random_bytes(CALLBACK_TOKEN_BYTES)))


def log_artifact_id(project_id: str, run_id: str, attempt_id: str, offer_id: str) -> str:
    """``createWorkerRemoteLogArtifactId`` (section 4.3): deterministic per offer.

    Raises:
        LaunchError: ``log_artifact_id_invalid`` when a part is not a dispatch id.
    """
    with guard("log_artifact_id_invalid", error=LaunchError):
        hasher = sha256(LOG_ARTIFACT_DOMAIN)
        for key, value in (("projectId", project_id), ("runId", run_id), ("attemptId", attempt_id),
                           ("offerId", offer_id)):
            hasher.update(b"\x00" + dispatch_id(value, f"$.{key}").encode("utf-8"))
        return "wlog-" + hasher.hexdigest()[:30]


class LogFileNames(Frozen):
    """Names relative to the log root: ``shard`` directory, then files inside it."""

    __slots__ = ("shard", "log", "fifo", "truncation_fact")  # noqa: RUF023

    shard: str
    log: str
    fifo: str
    truncation_fact: str

    def __init__(self, shard: str, log: str, fifo: str, truncation_fact: str) -> None:
        _set = object.__setattr__
        _set(self, "shard", shard)
        _set(self, "log", log)
        _set(self, "fifo", fifo)
        _set(self, "truncation_fact", truncation_fact)


def log_file_names(log_id: str) -> LogFileNames:
    """``<id[5:7]>/``, ``<id>.log``, ``.<id>.log.fifo``, ``.<id>.log.truncated.json`` (section 4.3).

    Raises:
        LaunchError: ``log_artifact_id_invalid`` unless ``log_id`` matches ``wlog-[0-9a-f]{30}``.
    """
    if not isinstance(log_id, str) or _WLOG.fullmatch(log_id) is None:
        raise LaunchError("log_artifact_id_invalid", "$.logArtifactId", "not a wlog id", reason="pattern")
    return LogFileNames(log_id[5:7], f"{log_id}.log", f".{log_id}.log.fifo", f".{log_id}.log.truncated.json")


def receipt_file_names(attempt_id: str) -> tuple[str, str]:
    """``(attemptId[0:2], attemptId + ".json")``: the receipt's directory and name under its root.

    Raises:
        LaunchError: ``receipt_invalid`` unless ``attempt_id`` is a portable execution id.
    """
    if not isinstance(attempt_id, str) or PORTABLE_EXECUTION_ID.fullmatch(attempt_id) is None:
        raise LaunchError("receipt_invalid", "$.attemptId", "not a portable execution id", reason="pattern")
    return attempt_id[:2], f"{attempt_id}.json"


def _portable(value: object, path: str) -> str:
    return string(value, path, max_length=36, pattern=PORTABLE_EXECUTION_ID)


def receipt_prefix(
    *,
    run_id: str,
    attempt_id: str,
    callback_sequence: int,
    token: CallbackToken,
    started_at_ms: int,
) -> bytearray:
    """The receipt's bytes up to and excluding ``,"finishedAtMs"`` (``...,"startedAtMs":S``).

    Args:
        started_at_ms: the record's ``executorStartedAtMs``.

    Returns:
        A ``bytearray`` (it holds the token: zero it once handed to the wrapper).

    Raises:
        LaunchError: ``receipt_invalid`` for a value the parser would refuse.
    """
    with guard("receipt_invalid", error=LaunchError):
        _portable(run_id, "$.runId")
        _portable(attempt_id, "$.attemptId")
        int_value(callback_sequence, "$.callbackSequence", 1, MAX_SAFE_INTEGER)
        int_value(started_at_ms, "$.startedAtMs")
        if not isinstance(token, CallbackToken):
            raise ContractError("not_string", "$.token", "must be a CallbackToken")
        head = dumps({"schemaVersion": 1, "runId": run_id, "attemptId": attempt_id,
                      "callbackSequence": callback_sequence, "token": ""})
        out = bytearray(head[:-3].encode("ascii"))  # ...,"token": (the empty '""' and '}' cut)
        out += b'"' + base64.urlsafe_b64encode(token.raw).rstrip(b"=") + b'","startedAtMs":'
        out += str(started_at_ms).encode("ascii")
        return out


def receipt_suffix(finished_at_ms: int, exit_code: int) -> bytes:
    """``,"finishedAtMs":F,"exitCode":E}``, completing :func:`receipt_prefix`.

    Raises:
        LaunchError: ``receipt_invalid`` (F safe int >= 0, E 0-255).
    """
    with guard("receipt_invalid", error=LaunchError):
        int_value(finished_at_ms, "$.finishedAtMs")
        int_value(exit_code, "$.exitCode", 0, 255)
        return f',"finishedAtMs":{finished_at_ms},"exitCode":{exit_code}}}'.encode("ascii")


class Receipt(Frozen):
    """A parsed receipt. ``repr`` never shows the token."""

    __slots__ = ("run_id", "attempt_id", "callback_sequence", "token", "started_at_ms",  # noqa: RUF023
                 "finished_at_ms", "exit_code")
    _repr_hidden = ("token",)

    run_id: str
    attempt_id: str
    callback_sequence: int
    token: str
    started_at_ms: int
    finished_at_ms: int
    exit_code: int

    def __init__(self, run_id: str, attempt_id: str, callback_sequence: int, token: str,  # noqa: PLR0917
                 started_at_ms: int, finished_at_ms: int, exit_code: int) -> None:
        _set = object.__setattr__
        _set(self, "run_id", run_id)
        _set(self, "attempt_id", attempt_id)
        _set(self, "callback_sequence", callback_sequence)
        _set(self, "token", token)
        _set(self, "started_at_ms", started_at_ms)
        _set(self, "finished_at_ms", finished_at_ms)
        _set(self, "exit_code", exit_code)


def parse_receipt(data: bytes | bytearray) -> Receipt:
    """Parse a receipt file's bytes (``parseCompletionReceipt``; module docstring).

    Raises:
        LaunchError: ``receipt_invalid`` (never with the token in it).
    """
    with guard("receipt_invalid", error=LaunchError, known_keys=frozenset(_RECEIPT_KEYS)):
        value = object_value(loads(data, max_bytes=RECEIPT_MAX_BYTES, min_bytes=1), "$")
        exact_keys(value, _RECEIPT_KEYS, "$")
        if value["schemaVersion"] != 1 or type(value["schemaVersion"]) is not int:
            raise ContractError("schema_version", "$.schemaVersion", "must be 1")
        run_id = _portable(value["runId"], "$.runId")
        attempt_id = _portable(value["attemptId"], "$.attemptId")
        sequence = int_value(value["callbackSequence"], "$.callbackSequence", 1, MAX_SAFE_INTEGER)
        token = value["token"]
        if not isinstance(token, str) or _TOKEN.fullmatch(token) is None:
            raise ContractError("pattern", "$.token", "not a bounded base64url value")
        started = int_value(value["startedAtMs"], "$.startedAtMs")
        finished = int_value(value["finishedAtMs"], "$.finishedAtMs")
        if finished < started:
            raise ContractError("time_order", "$.finishedAtMs", "must be >= startedAtMs")
        exit_code = int_value(value["exitCode"], "$.exitCode", 0, 255)
        return Receipt(run_id, attempt_id, sequence, token, started, finished, exit_code)


def _unauthenticated(reason: str, path: str, detail: str) -> LaunchError:
    return LaunchError("receipt_unauthenticated", path, detail, reason=reason)


def authenticate_receipt(receipt: Receipt, record: InboxRecord, now_ms: int) -> Receipt:
    """The completion coordinator's receipt checks (section 4.2) against the inbox record.

    Args:
        record: the inbox record (``offer.candidate.runId/attemptId``,
            ``completionReceiptCallbackSequence``, ``completionReceiptTokenDigest``,
            ``executorStartedAtMs``).
        now_ms: local wall clock (ms).

    Returns:
        ``receipt``, authenticated.

    Raises:
        LaunchError: ``receipt_unauthenticated`` (reason in the module docstring), or
            ``receipt_invalid`` when the record lacks the launch fields.
    """
    with guard("receipt_invalid", error=LaunchError):
        candidate = object_value(object_value(record, "$").get("offer"), "$.offer").get("candidate")
        candidate = object_value(candidate, "$.offer.candidate")
        sequence = int_value(record.get("completionReceiptCallbackSequence"), "$.completionReceiptCallbackSequence", 1)
        digest = string(record.get("completionReceiptTokenDigest"), "$.completionReceiptTokenDigest",
                        min_length=64, max_length=64, pattern=HEX64)
        started = int_value(record.get("executorStartedAtMs"), "$.executorStartedAtMs")
        now = int_value(now_ms, "$.nowMs")
        if not isinstance(receipt, Receipt):
            raise ContractError("not_object", "$", "must be a Receipt")
    if receipt.run_id != candidate.get("runId"):
        raise _unauthenticated("run_mismatch", "$.runId", "not the record's run")
    if receipt.attempt_id != candidate.get("attemptId"):
        raise _unauthenticated("attempt_mismatch", "$.attemptId", "not the record's attempt")
    if receipt.callback_sequence != sequence:
        raise _unauthenticated("sequence_mismatch", "$.callbackSequence", "not the record's sequence")
    if receipt.started_at_ms != started:
        raise _unauthenticated("started_mismatch", "$.startedAtMs", "not the record's executorStartedAtMs")
    if receipt.finished_at_ms > now:
        raise _unauthenticated("finished_in_future", "$.finishedAtMs", "after the local clock")
    token = receipt.token
    raw = b""
    if _TOKEN_43.fullmatch(token) is not None:
        try:
            raw = base64.urlsafe_b64decode(token + "=")
        except (binascii.Error, ValueError):
            raw = b""
    if len(raw) != CALLBACK_TOKEN_BYTES or _encode(raw) != token:
        raise _unauthenticated("token_encoding", "$.token", "not canonical base64url of 32 bytes")
    if not constant_time_equal(sha256_hex(raw), digest):
        raise _unauthenticated("token_digest", "$.token", "does not match the stored digest")
    return receipt


def _fact_head(run_id: object, attempt_id: object, log_id: object, maximum_bytes: object) -> str:
    _portable(run_id, "$.runId")
    _portable(attempt_id, "$.attemptId")
    string(log_id, "$.logArtifactId", max_length=36, pattern=_WLOG)
    int_value(maximum_bytes, "$.maximumBytes", 1)
    text = dumps({"schemaVersion": 1, "runId": run_id, "attemptId": attempt_id, "logArtifactId": log_id,
                  "maximumBytes": maximum_bytes})
    return text[:-1]


def truncation_fact_prefix(*, run_id: str, attempt_id: str, log_artifact_id: str, maximum_bytes: int) -> bytes:
    """The fact's bytes up to and excluding ``,"quotaReached"`` (``...,"maximumBytes":M``).

    Raises:
        LaunchError: ``truncation_fact_invalid``.
    """
    with guard("truncation_fact_invalid", error=LaunchError):
        return _fact_head(run_id, attempt_id, log_artifact_id, maximum_bytes).encode("ascii")


def truncation_fact_suffix(quota_reached: bool, observed_at_ms: int) -> bytes:
    """``,"quotaReached":Q,"observedAtMs":O}``, completing :func:`truncation_fact_prefix`.

    Raises:
        LaunchError: ``truncation_fact_invalid``.
    """
    with guard("truncation_fact_invalid", error=LaunchError):
        if not isinstance(quota_reached, bool):
            raise ContractError("not_boolean", "$.quotaReached", "must be a boolean")
        int_value(observed_at_ms, "$.observedAtMs")
        return f',"quotaReached":{"true" if quota_reached else "false"},"observedAtMs":{observed_at_ms}}}'.encode()


def parse_truncation_fact(
    data: bytes,
    *,
    run_id: str,
    attempt_id: str,
    log_artifact_id: str,
    maximum_bytes: int,
) -> bool:
    """Read a truncation fact (``readTruncationFact``): returns ``quotaReached``.

    Args:
        maximum_bytes: the log policy's per-attempt cap; the fact must carry the same.

    Raises:
        LaunchError: ``truncation_fact_invalid`` (reasons: field codes, ``schema_version``,
            ``echo_mismatch``).
    """
    with guard("truncation_fact_invalid", error=LaunchError, known_keys=frozenset(_FACT_KEYS)):
        value = object_value(loads(data, max_bytes=TRUNCATION_FACT_MAX_BYTES, min_bytes=1), "$")
        exact_keys(value, _FACT_KEYS, "$")
        if value["schemaVersion"] != 1 or type(value["schemaVersion"]) is not int:
            raise ContractError("schema_version", "$.schemaVersion", "must be 1")
        for key, expected in (("runId", run_id), ("attemptId", attempt_id), ("logArtifactId", log_artifact_id),
                              ("maximumBytes", maximum_bytes)):
            if type(value[key]) is not type(expected) or value[key] != expected:
                raise ContractError("echo_mismatch", f"$.{key}", "not this attempt's value")
        if not isinstance(value["quotaReached"], bool):
            raise ContractError("not_boolean", "$.quotaReached", "must be a boolean")
        int_value(value["observedAtMs"], "$.observedAtMs")
        return bool(value["quotaReached"])
