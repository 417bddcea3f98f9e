"""The seven worker-ingress calls after acceptance, on the one transport (remote-execution.md 3).

:class:`ExecutionCalls` is a thin client: each method builds the request with the
contract of its call (:mod:`qinglong_edge.contracts.activation`, ``secret_delivery``,
``lease_control``, ``completion``), sends it through the pull's
:class:`~qinglong_edge.worker.ingress.transport.IngressTransport` (the same mutual-TLS
connection and TLS session as the session and offer calls; a resident ``pull`` renewing a
lease every ~10 s resumes its TLS session when the cluster has closed the idle
connection), and parses the answer strictly against the stored offer it was built from.

=============== ======================================== ============ ==============
call            body / answer contract                   request cap  answer cap
=============== ======================================== ============ ==============
starting        fence7 / remote-run-activation@v1        4 096        16 384
start-failure   fence7 / remote-run-activation@v1        4 096        16 384
running         fence7 + handle, log id, sequence, digest 4 096       16 384
secrets         remote-secret-delivery@v2                65 536       262 144
lease-control   remote-worker-lease-control@v1           8 192        4 096
artifacts       4-byte H + header + the log, streamed    (4+H+N)      4 096
completion      remote-worker-completion@v1              16 384       4 096
=============== ======================================== ============ ==============

The artifact upload streams the log file from its descriptor with an exact
``content-length`` (:meth:`IngressTransport.post_stream`: 64 KiB at a time, never the
whole log in memory) and compares the ``sha256`` the cluster echoes with the digest of
the bytes actually sent (``source_sha256``; spec README "Artifact": stricter than the
reference).

Every failure is one :class:`~qinglong_edge.errors.RemoteCallError` naming the call
(``operation``): ``call_unavailable`` (no answer, a timeout, 429, 5xx: with
``retry_after_ms``), ``call_fenced`` (409, ``cluster_code`` the route's fence code),
``call_rejected`` (another non-200), ``call_response_invalid`` (a 200 that broke the
contract: wrong echo, a version jump, a bad snapshot shape, oversized, wrong content
type; ``reason`` the field code), ``call_request_invalid`` (our body broke the contract).
No message carries a lease token, a callback token, a secret value or a response body:
the transport and the contracts never put one in theirs, and only their codes are kept.
:class:`PullAborted` (a signal) passes through unchanged.
"""

from __future__ import annotations

from qinglong_edge.contracts.activation import (
    ACTIVATION_RESPONSE_MAX_BYTES,
    ActivationResult,
    parse_activation_response,
    running_request_body,
    start_failure_request_body,
    starting_request_body,
)
from qinglong_edge.contracts.completion import (
    ARTIFACT_RESPONSE_MAX_BYTES,
    COMPLETION_REQUEST_MAX_BYTES,
    COMPLETION_RESPONSE_MAX_BYTES,
    ArtifactReceipt,
    CompletionResult,
    artifact_upload_preamble,
    completion_request_body,
    parse_artifact_response,
    parse_completion_response,
)
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.ingress import worker_call_path
from qinglong_edge.contracts.lease_control import (
    LEASE_CONTROL_REQUEST_MAX_BYTES,
    LEASE_CONTROL_RESPONSE_MAX_BYTES,
    LeaseControlResult,
    lease_control_request_body,
    parse_lease_control_response,
)
from qinglong_edge.contracts.secret_delivery import (
    SECRETS_REQUEST_MAX_BYTES,
    SECRETS_RESPONSE_MAX_BYTES,
    SecretValues,
    parse_secrets_response,
    secrets_request,
)
from qinglong_edge.errors import RemoteCallError, TransportError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.contracts.ports import Transport
    from qinglong_edge.contracts.records import InternalOffer

__all__ = ["ExecutionCalls", "call_error"]

#: The default worker-ingress request cap (activation bodies).
_DEFAULT_REQUEST_MAX_BYTES = 4096
#: Statuses that mean "no usable answer now, ask again" (rate limit, server trouble).
_UNAVAILABLE_STATUSES = frozenset({408, 429})


def call_error(operation: str, exc: TransportError) -> RemoteCallError:
    """A transport failure of ``operation`` as a :class:`RemoteCallError` (no body, no token)."""
    status = exc.http_status
    if status == 409:
        code = "call_fenced"
    elif status == 200 or exc.code == "response_too_large" or exc.reason in ("malformed_response",
                                                                            "response_too_large"):
        code = "call_response_invalid"  # an answer was there but broke the rules (type, size, framing)
    elif status is None or status >= 500 or status in _UNAVAILABLE_STATUSES:
        code = "call_unavailable"
    else:
        code = "call_rejected"
    detail = f"HTTP {status}" + (f" {exc.cluster_code}" if exc.cluster_code else "") if status else exc.reason
    return RemoteCallError(operation, detail, code=code, http_status=status, retry_after_ms=exc.retry_after_ms,
                           cluster_code=exc.cluster_code, reason=exc.reason, remedy=exc.remedy,
                           reached_cluster=exc.reached_cluster)


def _contract_error(operation: str, exc: ContractError, code: str) -> RemoteCallError:
    reason = getattr(exc, "reason", exc.code)
    return RemoteCallError(operation, f"{exc.code} at {exc.path} ({reason})", code=code, reason=reason)


def _contract_checked(operation: str, step: Any, code: str) -> Any:
    """``step()``; its :class:`ContractError` becomes the call's ``code`` (request or response side)."""
    try:
        return step()
    except ContractError as exc:
        raise _contract_error(operation, exc, code) from None


def _worker(offer: InternalOffer) -> tuple[str, str]:
    worker = offer.get("worker")
    if not isinstance(worker, dict):
        raise RemoteCallError("offer", "the stored offer has no worker", code="call_request_invalid")
    return str(worker.get("workerId")), str(worker.get("sessionId"))


class ExecutionCalls:
    """The seven calls for stored internal offers (``record["offer"]``), on one transport.

    Args:
        transport: the pull's transport (``post_json``, ``post_stream``), usually wrapped
            so that a signal interrupts a call in flight (:mod:`qinglong_edge.worker.cycle`).
    """

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    # -- plumbing ----------------------------------------------------------------------------

    def _path(self, offer: InternalOffer, operation: str) -> str:
        worker_id, session_id = _worker(offer)
        path: str = self._build(operation, lambda: worker_call_path(worker_id, session_id, operation))
        return path

    def _post(self, offer: InternalOffer, operation: str, body: bytes, *, max_response_bytes: int,
              max_request_bytes: int = _DEFAULT_REQUEST_MAX_BYTES) -> bytes:
        path = self._path(offer, operation)
        try:
            response = self._transport.post_json(path, body, max_response_bytes=max_response_bytes,
                                                 max_request_bytes=max_request_bytes)
        except TransportError as exc:
            raise call_error(operation, exc) from None
        data: bytes = response.body
        return data

    @staticmethod
    def _build(operation: str, build: Any) -> Any:
        return _contract_checked(operation, build, "call_request_invalid")

    @staticmethod
    def _parse(operation: str, parse: Any) -> Any:
        return _contract_checked(operation, parse, "call_response_invalid")

    # -- activation (3.1-3.3) ----------------------------------------------------------------

    def _activation(self, offer: InternalOffer, operation: str, body: bytes) -> ActivationResult:
        data = self._post(offer, operation, body, max_response_bytes=ACTIVATION_RESPONSE_MAX_BYTES)
        result: ActivationResult = self._parse(
            operation, lambda: parse_activation_response(data, offer, operation=operation))
        return result

    def starting(self, offer: InternalOffer) -> ActivationResult:
        """T1 / T2: POST starting (fence7). Raises :class:`RemoteCallError`."""
        body = self._build("starting", lambda: starting_request_body(offer))
        return self._activation(offer, "starting", body)

    def start_failure(self, offer: InternalOffer) -> ActivationResult:
        """T9: POST start-failure (fence7). Raises :class:`RemoteCallError`."""
        body = self._build("start-failure", lambda: start_failure_request_body(offer))
        return self._activation(offer, "start-failure", body)

    def running(self, offer: InternalOffer, *, executor_handle: str, log_artifact_id: str,
                callback_sequence: int, callback_token_digest: str) -> ActivationResult:
        """T8: POST running with the launch barrier's stored values. Raises :class:`RemoteCallError`."""
        body = self._build("running", lambda: running_request_body(
            offer, executor_handle=executor_handle, log_artifact_id=log_artifact_id,
            callback_sequence=callback_sequence, callback_token_digest=callback_token_digest))
        return self._activation(offer, "running", body)

    # -- secrets (3.4) -------------------------------------------------------------------------

    def secrets(self, offer: InternalOffer) -> SecretValues | None:
        """T3: POST secrets, or None when the revision binds no secret and no bundle.

        The answer's values come back as ``bytearray`` (:class:`SecretValues`: wipe them
        once the environment is built); the body copy is zeroed by the parser.

        Raises:
            RemoteCallError: any failure (the runner records ``start_failed``).
        """
        request = self._build("secrets", lambda: secrets_request(offer))
        if request is None:
            return None
        data = bytearray(self._post(offer, "secrets", request.body, max_response_bytes=SECRETS_RESPONSE_MAX_BYTES,
                                    max_request_bytes=SECRETS_REQUEST_MAX_BYTES))
        values: SecretValues = self._parse("secrets", lambda: parse_secrets_response(data, request))
        return values

    # -- lease-control (3.5) ------------------------------------------------------------------

    def lease_control(self, offer: InternalOffer, *, expected_lease_version: int | None = None) -> LeaseControlResult:
        """T11: POST lease-control; ``expected_lease_version`` for the G2 retry (stored + 1).

        Raises:
            RemoteCallError: ``call_fenced`` for 409 (the runner's G2 rule), and the rest.
        """
        body = self._build("lease-control", lambda: lease_control_request_body(
            offer, expected_lease_version=expected_lease_version))
        data = self._post(offer, "lease-control", body, max_response_bytes=LEASE_CONTROL_RESPONSE_MAX_BYTES,
                          max_request_bytes=LEASE_CONTROL_REQUEST_MAX_BYTES)
        result: LeaseControlResult = self._parse("lease-control", lambda: parse_lease_control_response(
            data, offer, expected_lease_version=expected_lease_version))
        return result

    # -- artifacts and completion (3.6, 3.7) ---------------------------------------------------

    def upload(self, offer: InternalOffer, *, log_artifact_id: str, source: int, byte_length: int,
               truncated: bool | None) -> ArtifactReceipt:
        """POST artifacts: the preamble, then ``byte_length`` bytes of the file ``source``
        (a descriptor) from offset 0, streamed; the echoed sha256 must be ours.

        Raises:
            RemoteCallError: ``call_response_invalid`` (reason ``sha256_mismatch``...) and
                the rest; a file that changed meanwhile is ``call_unavailable``
                (``source_changed``: retried with the file as it is then).
        """
        prefix = self._build("artifacts", lambda: artifact_upload_preamble(
            offer, log_artifact_id=log_artifact_id, byte_length=byte_length, truncated=truncated))
        path = self._path(offer, "artifacts")
        try:
            response = self._transport.post_stream(path, prefix, source, byte_length,
                                                   max_response_bytes=ARTIFACT_RESPONSE_MAX_BYTES)
        except TransportError as exc:
            raise call_error("artifacts", exc) from None
        digest = str(response.source_sha256)
        receipt: ArtifactReceipt = self._parse("artifacts", lambda: parse_artifact_response(
            response.body, offer, log_artifact_id=log_artifact_id, byte_length=byte_length, truncated=truncated,
            sha256=digest))
        return receipt

    def completion(self, offer: InternalOffer, *, callback_sequence: int, callback_token_digest: str,
                   started_at_ms: int, finished_at_ms: int, exit_code: int, log_artifact_id: str,
                   byte_length: int, sha256: str, truncated: bool | None) -> CompletionResult:
        """T10: POST completion (the outcome is ``succeeded`` iff ``exit_code`` is 0).

        Raises:
            RemoteCallError.
        """
        body = self._build("completion", lambda: completion_request_body(
            offer, callback_sequence=callback_sequence, callback_token_digest=callback_token_digest,
            started_at_ms=started_at_ms, finished_at_ms=finished_at_ms, exit_code=exit_code,
            log_artifact_id=log_artifact_id, byte_length=byte_length, sha256=sha256, truncated=truncated))
        data = self._post(offer, "completion", body, max_response_bytes=COMPLETION_RESPONSE_MAX_BYTES,
                          max_request_bytes=COMPLETION_REQUEST_MAX_BYTES)
        result: CompletionResult = self._parse("completion", lambda: parse_completion_response(
            data, offer, callback_sequence=callback_sequence))
        return result
