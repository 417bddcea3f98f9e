"""The exception tree every layer uses. Read this file first.

::

    EdgeError(Exception)                      .code .exit_status .http_status
    ├── ContractError(EdgeError, ValueError)  .path        wire/on-disk contract (contracts/)
    ├── UsageError(EdgeError, ValueError)                  bad command line           -> 64
    ├── ConfigError(EdgeError, ValueError)    .path        bad configuration          -> 78
    ├── StorageError(EdgeError, OSError)                   unsafe or failing storage  -> 73/74
    │   └── JournalError(StorageError)                     worker journal, ADR-0110 3.8
    ├── TransportError(EdgeError, ConnectionError)         worker ingress client, ADR-0110 1.6
    │       .http_status .retry_after_ms .reason .remedy .reached_cluster .cluster_code
    ├── DeliveryError(EdgeError)                           pull coordinator, ADR-0110 3.8
    ├── SessionError(EdgeError)                            worker session, ADR-0110 5.1
    ├── RemoteCallError(EdgeError)            .operation   a later worker-ingress call (remote-execution.md 3)
    ├── HttpProtocolError(EdgeError, ValueError)           malformed HTTP/1.1 request head
    ├── ApiError(EdgeError)                   .body        Local API route/admission answer
    ├── StoreError(EdgeError)                              Local SQLite store
    └── ExecutionError(EdgeError)                          launching / stopping processes

Each subclass also inherits the builtin a caller would naturally catch (``OSError``
for storage, ``ConnectionError`` for the network, ``ValueError`` for bad input), so
generic handlers keep working. ``code`` strings are stable API; the CLI maps them to
sysexits statuses with :func:`exit_status_for`, the Local API to HTTP statuses with
``http_status``.
"""

from __future__ import annotations

import errno

from qinglong_edge.contracts.errors import ContractError, EdgeError

__all__ = [
    "EXIT_STATUS_BY_CODE",
    "STORAGE_UNAVAILABLE_ERRNOS",
    "TRANSPORT_REASONS",
    "ApiError",
    "ConfigError",
    "ContractError",
    "DeliveryError",
    "EdgeError",
    "ExecutionError",
    "HttpProtocolError",
    "JournalError",
    "LogStorageUnavailable",
    "RemoteCallError",
    "SessionError",
    "StorageError",
    "StoreError",
    "TransportError",
    "UsageError",
    "exit_status_for",
    "storage_error",
    "transport_remedy",
]

# sysexits.h
EX_OK = 0
EX_USAGE = 64
EX_DATAERR = 65
EX_UNAVAILABLE = 69
EX_SOFTWARE = 70
EX_CANTCREAT = 73
EX_IOERR = 74
EX_TEMPFAIL = 75
EX_NOPERM = 77
EX_CONFIG = 78


class UsageError(EdgeError, ValueError):
    """The command line is wrong (unknown option, missing argument).

    Codes: ``usage`` (64), ``input_unreadable`` (66: a file named on the command line
    cannot be read).
    """

    code = "usage"
    exit_status = EX_USAGE


class ConfigError(EdgeError, ValueError):
    """The configuration is missing, unreadable or invalid.

    Attributes:
        path: JSON path inside the configuration file (``$.worker.requestTimeoutMs``),
            or ``$`` when the file as a whole is the problem.
    """

    code = "invalid_configuration"
    exit_status = EX_CONFIG

    def __init__(self, message: str, *, path: str = "$", code: str | None = None) -> None:
        self.path = path
        super().__init__(message, code=code)


class StorageError(EdgeError, OSError):
    """Durable storage cannot be trusted or written.

    Codes: ``unsafe_storage`` (wrong mode/owner, symlink, corrupt or foreign file:
    fail closed), ``storage_unavailable`` (ENOSPC, EIO, read-only: retry later).
    """

    code = "unsafe_storage"
    exit_status = EX_CANTCREAT
    http_status = 503


#: ``errno`` values of storage that is full or failing, which may heal by itself (retry
#: later): ``storage_unavailable`` (74). Every other ``OSError`` on agent storage (EACCES,
#: EPERM, ENOTDIR, EEXIST, ELOOP...) needs the operator: ``unsafe_storage`` (73). The
#: journal classifies its errors the same way (:mod:`qinglong_edge.worker.journal.files`).
STORAGE_UNAVAILABLE_ERRNOS: frozenset[int] = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})


def storage_error(exc: OSError, what: str) -> StorageError:
    """A :class:`StorageError` for ``exc`` raised while making or opening ``what`` (a
    phrase naming the path and its configuration key): ``storage_unavailable`` (exit 74)
    for :data:`STORAGE_UNAVAILABLE_ERRNOS`, else ``unsafe_storage`` (73). The message is
    one line: ``what``, the errno name and its text."""
    code = "storage_unavailable" if exc.errno in STORAGE_UNAVAILABLE_ERRNOS else "unsafe_storage"
    name = errno.errorcode.get(exc.errno or 0, "error")
    return StorageError(f"{what}: {name} ({exc.strerror})", code=code)


class JournalError(StorageError):
    """Worker journal failure (ADR-0110 section 3.8, file journal codes).

    Codes: ``invalid_configuration``, ``not_owned``, ``already_owned``,
    ``ownership_compromised``, ``unsafe_storage``, ``storage_unavailable``,
    ``capacity_exhausted``, ``claim_revision_conflict``, ``offer_revision_conflict``,
    ``invalid_transition``, ``offer_conflict``, ``claim_conflict``.
    """


#: Transport reasons (``TransportError.reason``): code -> (one-line remedy, whether a
#: request failing this way may have reached the cluster's HTTP layer by default).
#: Stable API: ``pull`` prints them, ``pull --json`` and ``doctor`` carry them, the
#: README's Troubleshooting table lists them (tests/test_docs.py checks it). The pull
#: coordinator's attempt budget counts only failures with ``reached_cluster`` (spec
#: README, offer delivery decisions). Sources: offer-delivery.md 1.2 (TLS), 1.5
#: (timeouts), 1.6 (acceptance), 1.7 (statuses).
TRANSPORT_REASONS: dict[str, tuple[str, bool]] = {
    # before TCP: nothing was sent
    "dns_failure": ("the origin's host name does not resolve: check worker.origin and the device's DNS "
                    "resolver (/etc/resolv.conf)", False),
    "connection_refused": ("nothing accepts connections on the origin's port: check the port in worker.origin "
                           "and that the cluster's worker ingress is running", False),
    "network_unreachable": ("no route to the cluster: check the device's network link, default route and "
                            "firewall", False),
    "connect_timeout": ("the cluster did not accept the TCP connection within worker.requestTimeoutMs: check "
                        "the network path (a firewall dropping packets?)", False),
    "connection_failed": ("the TCP connection failed (see the message): check the network path to the "
                          "origin", False),
    # the TLS handshake (TLS 1.3 only, only the configured anchors): nothing was sent
    "tls_handshake_timeout": ("the peer accepted TCP but did not complete a TLS handshake in time: is the "
                              "origin's port the cluster's TLS worker ingress?", False),
    "certificate_expired": ("the cluster's certificate (or one of its chain) has expired by this device's "
                            "clock: check the clock (NTP), else the cluster must renew it", False),
    "certificate_not_yet_valid": ("the cluster's certificate is not valid yet by this device's clock: set "
                                  "the clock (NTP; a router may boot in 1970)", False),
    "hostname_mismatch": ("the cluster's certificate does not name the origin's host: put the name (or IP) "
                          "it was issued for in worker.origin", False),
    "untrusted_issuer": ("the cluster's certificate does not chain to a configured trust anchor: add the CA "
                         "that issued it to worker.trustAnchorFiles (or something intercepts the "
                         "connection)", False),
    "weak_certificate": ("the cluster's certificate has a key or signature below security level 2 (RSA < "
                         "2048 bits, SHA-1): the cluster must use a stronger certificate", False),
    "certificate_rejected": ("the cluster's certificate failed verification (see the message): it must be a "
                             "valid serverAuth certificate from a configured anchor", False),
    "protocol_version": ("the peer does not speak TLS 1.3: point worker.origin at the cluster's worker "
                         "ingress, or upgrade the server", False),
    "plaintext_peer": ("the peer answered without TLS (plain HTTP?): worker.origin must name the cluster's "
                       "HTTPS worker ingress port", False),
    "tls_handshake_failed": ("the TLS handshake failed (see the message): check worker.origin and the "
                             "cluster's TLS settings", False),
    # after the handshake: a TLS 1.3 server judges the client certificate only now
    "client_certificate_rejected": ("the cluster refused this device's client certificate: install one "
                                    "issued by the cluster's worker client CA, not expired "
                                    "(worker.certificateFile / privateKeyFile)", False),
    "tls_alert": ("the cluster ended the TLS session with an alert (see the message): retried; if it "
                  "persists check the cluster's TLS logs", True),
    "send_timeout": ("the cluster stopped reading the request within worker.requestTimeoutMs: check the "
                     "network and the cluster's load; retried", True),
    "read_timeout": ("no complete answer within worker.requestTimeoutMs (or the hard deadline): check the "
                     "cluster's load and the network; retried", True),
    "connection_reset": ("the connection was reset during the exchange: retried; if it persists check "
                         "middleboxes (proxies, NAT timeouts) and the cluster", True),
    "connection_closed": ("the cluster closed the connection before its answer was complete: retried", True),
    "unexpected_status": ("the cluster answered with a status other than 200 (see httpStatus): retried", True),
    "malformed_response": ("the answer broke the worker ingress contract (offer-delivery.md 1.6): is "
                           "worker.origin the cluster's worker ingress, with no proxy in between?", True),
    "response_too_large": ("the answer was larger than the route allows: is worker.origin the cluster's "
                           "worker ingress, with no proxy in between?", True),
    "source_changed": ("the file being uploaded changed during the upload: retried with the file as it is "
                       "then", True),
    # local faults: nothing was sent
    "credentials_unavailable": ("fix the file the message names: owned by the agent's user, mode 0600 in a "
                                "0700 directory (anchors: not group/other writable), 1 byte - 1 MiB; the "
                                "credential: one ql3w_<credentialId>_<secret> line, at most 256 bytes", False),
    "invalid_configuration": ("fix the worker configuration the message names", False),
    "invalid_request": ("a request broke the transport's own limits: a bug, please report it", False),
    "closed": ("the transport was closed (the agent is stopping)", True),
}

#: Remedies of ``unexpected_status`` by HTTP status (offer-delivery.md 1.7).
_STATUS_REMEDIES: dict[int, str] = {
    400: "the cluster refused the request as malformed: a bug, please report it with the cluster's code",
    401: "the cluster rejected the worker credential: install a valid ql3w credential of this worker "
         "(worker.credentialFile)",
    403: "the cluster rejected the worker credential: install a valid ql3w credential of this worker "
         "(worker.credentialFile)",
    404: "the cluster has no such worker route: check worker.origin and worker.workerId",
    409: "the cluster fenced the call (see the code): the agent resolves it",
    413: "the cluster refused the request as too large: a bug, please report it",
    415: "the cluster refused the request's media type: a bug, please report it",
    429: "the cluster is rate-limiting this device: retried after its Retry-After",
    503: "the cluster is busy, starting or reloading: retried after its Retry-After",
    504: "the cluster timed out handling the call: retried",
}


def transport_remedy(reason: str, http_status: int | None = None) -> str:
    """The one-line remedy of a transport reason (:data:`TRANSPORT_REASONS`); for
    ``unexpected_status`` the one of the HTTP status class. "" for an unknown reason."""
    if reason == "unexpected_status" and http_status is not None:
        if http_status in _STATUS_REMEDIES:
            return _STATUS_REMEDIES[http_status]
        if 500 <= http_status <= 599:
            return "the cluster failed handling the call (5xx): retried; see the cluster's logs"
    entry = TRANSPORT_REASONS.get(reason)
    return entry[0] if entry is not None else ""


class TransportError(EdgeError, ConnectionError):
    """Worker ingress HTTPS call failed (ADR-0110 section 1.6).

    Codes: ``invalid_configuration``, ``credentials_unavailable``, ``request_rejected``,
    ``response_rejected``, ``response_too_large``, ``closed``.

    Attributes:
        http_status: the response status when one was received (never the body).
        retry_after_ms: parsed ``Retry-After`` of a 429/503, in milliseconds, else None.
        reason: the typed reason, a key of :data:`TRANSPORT_REASONS`
            (``certificate_expired``, ``read_timeout``...); the code when none was given
            (an error made the old way, e.g. by a test double).
        remedy: its one-line remedy (:func:`transport_remedy`; "" for a bare code).
        reached_cluster: whether the request may have reached the cluster's HTTP
            layer: False for DNS, connect and handshake failures, a TLS alert on the
            first read of a new connection (how TLS 1.3 refuses a client certificate)
            and local faults; True otherwise (also when unknown).
        cluster_code: the ``code`` of a non-200 JSON answer ``{"code":"..."}`` when it
            is a plain snake_case word (e.g. ``worker_offer_fenced``), else None. The
            rest of the body is never kept.
    """

    code = "request_rejected"
    exit_status = EX_TEMPFAIL

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        http_status: int | None = None,
        retry_after_ms: int | None = None,
        reason: str | None = None,
        reached_cluster: bool | None = None,
        cluster_code: str | None = None,
    ) -> None:
        self.http_status = http_status
        self.retry_after_ms = retry_after_ms
        self.cluster_code = cluster_code
        super().__init__(message, code=code)
        self.reason: str = reason or self.code
        self.remedy: str = transport_remedy(self.reason, http_status)
        if reached_cluster is None:
            entry = TRANSPORT_REASONS.get(self.reason)
            reached_cluster = entry[1] if entry is not None else True
        self.reached_cluster: bool = reached_cluster

    def __str__(self) -> str:
        text = super().__str__()
        if self.reason == self.code:
            return text
        return f"{self.code} ({self.reason}): {self.message}"


class DeliveryError(EdgeError):
    """Pull coordinator failure (ADR-0110 section 3.8).

    Codes: ``invalid_configuration``, ``claim_conflict``, ``claim_revision_conflict``,
    ``offer_conflict``, ``attempt_budget_exhausted``.
    """

    code = "claim_conflict"
    exit_status = EX_TEMPFAIL


class SessionError(EdgeError):
    """Worker Session failure (ADR-0110 section 5.1).

    Codes: ``credential_rejected`` (401/403), ``session_fenced`` (409),
    ``invalid_response``, ``session_unavailable``, ``credentials_unavailable`` and
    ``invalid_configuration`` (from the transport), ``unsupported_architecture``.

    Attributes:
        reason: the :attr:`TransportError.reason` when a transport failure caused it
            (``certificate_expired``...), else None.
        remedy: that failure's :attr:`TransportError.remedy` ("" without one).
    """

    code = "session_unavailable"
    exit_status = EX_TEMPFAIL

    def __init__(self, message: str = "", *, code: str | None = None, cause: TransportError | None = None) -> None:
        self.reason = cause.reason if cause is not None else None
        self.remedy = cause.remedy if cause is not None else ""
        super().__init__(message, code=code)


class RemoteCallError(EdgeError):
    """One of the seven calls after acceptance failed (remote-execution.md 3; spec README
    "Later calls' errors"): the record is left as it is and the call retried, except
    where the runner maps it to ``start_failed`` (secrets, T3).

    Codes: ``call_unavailable`` (no answer: network, timeout, 5xx, 429), ``call_fenced``
    (409), ``call_rejected`` (another non-200: 400, 401, 403, 404, 413, 415),
    ``call_response_invalid`` (a 200 whose body broke the call's contract),
    ``call_request_invalid`` (our own body broke it: a record the contracts refuse).

    Attributes:
        operation: the call (``starting``, ``start-failure``, ``running``, ``secrets``,
            ``lease-control``, ``artifacts``, ``completion``).
        http_status, retry_after_ms, cluster_code, reason, remedy, reached_cluster: as
            :class:`TransportError` (``reason`` is the contract's field code for an
            invalid answer); never a body, token or secret.
    """

    code = "call_unavailable"
    exit_status = EX_TEMPFAIL

    def __init__(
        self,
        operation: str,
        message: str,
        *,
        code: str | None = None,
        http_status: int | None = None,
        retry_after_ms: int | None = None,
        cluster_code: str | None = None,
        reason: str | None = None,
        remedy: str = "",
        reached_cluster: bool = True,
    ) -> None:
        self.operation = operation
        self.http_status = http_status
        self.retry_after_ms = retry_after_ms
        self.cluster_code = cluster_code
        self.remedy = remedy
        self.reached_cluster = reached_cluster
        super().__init__(f"{operation}: {message}", code=code)
        self.reason: str = reason or self.code

    def to_json(self) -> dict[str, object]:
        """The failure for ``pull --json`` (absent keys: not applicable)."""
        out: dict[str, object] = {"operation": self.operation, "code": self.code, "reason": self.reason}
        for key, value in (("httpStatus", self.http_status), ("clusterCode", self.cluster_code),
                           ("retryAfterMs", self.retry_after_ms)):
            if value is not None:
                out[key] = value
        if self.remedy:
            out["remedy"] = self.remedy
        return out


class HttpProtocolError(EdgeError, ValueError):
    """A request head broke RFC 9112 or a Local API framing limit.

    Attributes:
        http_status: the status to answer with (400, 413, 414, 431, 501, 505).
    """

    code = "bad_request"
    exit_status = EX_DATAERR
    http_status = 400

    def __init__(self, message: str, *, code: str | None = None, status: int = 400) -> None:
        self.http_status = status
        super().__init__(message, code=code)


class ApiError(EdgeError):
    """An answer of the Local API other than success, with its exact JSON body.

    Attributes:
        http_status: the status (local-api.md sections 1.3, 2).
        body: the compact JSON body's fields, in wire order; ``{"code": code}`` unless
            the route adds fields (``schema`` on 400, ``reason`` on 409).
    """

    code = "request_unavailable"
    exit_status = EX_UNAVAILABLE

    def __init__(
        self,
        http_status: int,
        code: str,
        *,
        extra: dict[str, object] | None = None,
        message: str = "",
    ) -> None:
        self.http_status = http_status
        self.body: dict[str, object] = {"code": code, **(extra or {})}
        super().__init__(message or code, code=code)


class StoreError(EdgeError):
    """The Local SQLite store failed.

    Codes: ``storage_unavailable`` (busy past the timeout, I/O error, read-only, full
    disk), ``store_busy`` (operation queue full), ``store_closed``,
    ``database_newer`` (schema newer than this code), ``database_corrupt``,
    ``schema_mismatch`` (an applied migration differs from this code's),
    ``database_foreign`` (another application's SQLite file), ``unsafe_storage``,
    ``not_found``, ``conflict``, ``invalid_input``; the Local repositories add
    ``run_not_found``, ``task_not_found``, ``fence_rejected``, ``task_start_rejected``,
    ``authentication_unavailable``, ``pepper_unavailable``, ``unsafe_pepper``,
    ``audit_unavailable``, ``database_missing``, ``database_replaced`` (see
    :mod:`qinglong_edge.local`).
    """

    code = "storage_unavailable"
    exit_status = EX_IOERR
    http_status = 503


class ExecutionError(EdgeError):
    """Launching, inspecting or stopping a Run's process failed."""

    code = "execution_failed"
    exit_status = EX_SOFTWARE


class LogStorageUnavailable(ExecutionError):
    """A job's log (or a publication) could not be created because its file system is
    full or failing (ENOSPC, EDQUOT, EIO): code ``log_unavailable`` like any log failure,
    but transient, so a launch may be retried once there is room (issue 17 item 3)."""

    code = "log_unavailable"


#: Per-code refinements of the class default exit status (spec README, "Exit statuses").
EXIT_STATUS_BY_CODE: dict[str, int] = {
    "invalid_configuration": EX_CONFIG,
    "credentials_unavailable": EX_CONFIG,
    "credential_rejected": EX_NOPERM,
    "storage_unavailable": EX_IOERR,
    "unsafe_storage": EX_CANTCREAT,
    "capacity_exhausted": EX_TEMPFAIL,
    "ownership_compromised": EX_TEMPFAIL,
    "already_owned": EX_TEMPFAIL,
    "not_owned": EX_SOFTWARE,
    "database_newer": EX_CONFIG,
    "database_corrupt": EX_IOERR,
    "schema_mismatch": EX_CONFIG,
    "database_foreign": EX_CONFIG,
    "store_closed": EX_TEMPFAIL,
    "invalid_input": EX_DATAERR,
    "conflict": EX_DATAERR,
    "pepper_unavailable": EX_CONFIG,
    "unsafe_pepper": EX_CANTCREAT,
    "database_missing": EX_CANTCREAT,  # serve/admin refuse to create an empty database where one existed
    "keyring_missing": EX_CANTCREAT,  # serve/admin init refuse to go on without the pepper keys the database names
    "database_replaced": EX_IOERR,  # serve: the database was removed or replaced while serving (restart)
    "store_busy": EX_TEMPFAIL,
    "in_flight": EX_TEMPFAIL,  # inbox discard of a record a pull is (or would be) running
    "not_found": EX_DATAERR,
    "task_not_found": EX_DATAERR,  # an operator naming a task that does not exist, not an I/O error
    "run_not_found": EX_DATAERR,
    "listener_unavailable": EX_UNAVAILABLE,
    # A job's log (or publication) could not be made: storage, not an internal error
    # (the launch paths handle it; should one reach the command line, it is 74).
    "log_unavailable": EX_IOERR,
    "input_unreadable": 66,  # EX_NOINPUT: an input file named on the command line cannot be read
    # QingLong has no worker architecture for this machine (mips...): a configuration
    # problem of the device (the worker role cannot work here), not a passing outage.
    "unsupported_architecture": EX_CONFIG,
}


def exit_status_for(error: BaseException) -> int:
    """Return the sysexits status for ``error``.

    A :class:`TransportError` carrying HTTP 401/403 is a credential problem (77) so the
    operator sees it (spec README, offer delivery gaps). Codes in
    :data:`EXIT_STATUS_BY_CODE` refine the class default; anything that is not an
    :class:`EdgeError` is an internal error (70).
    """
    if isinstance(error, TransportError) and error.http_status in (401, 403):
        return EX_NOPERM
    if isinstance(error, EdgeError):
        if isinstance(error, ContractError):
            return error.exit_status
        return EXIT_STATUS_BY_CODE.get(error.code, error.exit_status)
    return EX_SOFTWARE
