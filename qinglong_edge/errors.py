"""The exception tree every layer uses. Read this file first.

::

    EdgeError(Exception)                      .code .exit_status .http_status
    ├── ContractError(EdgeError, ValueError)  .path        wire/on-disk contract (contracts/)
    ├── UsageError(EdgeError, ValueError)                  bad command line           -> 64
    ├── ConfigError(EdgeError, ValueError)    .path        bad configuration          -> 78
    ├── StorageError(EdgeError, OSError)                   unsafe or failing storage  -> 73/74
    │   └── JournalError(StorageError)                     worker journal, ADR-0110 3.8
    ├── TransportError(EdgeError, ConnectionError)         worker ingress client, ADR-0110 1.6
    │       .http_status .retry_after_ms
    ├── DeliveryError(EdgeError)                           pull coordinator, ADR-0110 3.8
    ├── SessionError(EdgeError)                            worker session, ADR-0110 5.1
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

from qinglong_edge.contracts.errors import ContractError, EdgeError

__all__ = [
    "EXIT_STATUS_BY_CODE",
    "ApiError",
    "ConfigError",
    "ContractError",
    "DeliveryError",
    "EdgeError",
    "ExecutionError",
    "HttpProtocolError",
    "JournalError",
    "SessionError",
    "StorageError",
    "StoreError",
    "TransportError",
    "UsageError",
    "exit_status_for",
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


class JournalError(StorageError):
    """Worker journal failure (ADR-0110 section 3.8, file journal codes).

    Codes: ``invalid_configuration``, ``not_owned``, ``already_owned``,
    ``ownership_compromised``, ``unsafe_storage``, ``storage_unavailable``,
    ``capacity_exhausted``, ``claim_revision_conflict``, ``offer_revision_conflict``,
    ``invalid_transition``, ``offer_conflict``, ``claim_conflict``.
    """


class TransportError(EdgeError, ConnectionError):
    """Worker ingress HTTPS call failed (ADR-0110 section 1.6).

    Codes: ``invalid_configuration``, ``credentials_unavailable``, ``request_rejected``,
    ``response_rejected``, ``response_too_large``, ``closed``.

    Attributes:
        http_status: the response status when one was received (never the body).
        retry_after_ms: parsed ``Retry-After`` of a 429/503, in milliseconds, else None.
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
    ) -> None:
        self.http_status = http_status
        self.retry_after_ms = retry_after_ms
        super().__init__(message, code=code)


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
    ``invalid_configuration`` (from the transport), ``unsupported_platform``.
    """

    code = "session_unavailable"
    exit_status = EX_TEMPFAIL


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
    "database_replaced": EX_IOERR,  # serve: the database was removed or replaced while serving (restart)
    "store_busy": EX_TEMPFAIL,
    "not_found": EX_DATAERR,
    "task_not_found": EX_DATAERR,  # an operator naming a task that does not exist, not an I/O error
    "run_not_found": EX_DATAERR,
    "listener_unavailable": EX_UNAVAILABLE,
    "input_unreadable": 66,  # EX_NOINPUT: an input file named on the command line cannot be read
    "unsupported_platform": EX_UNAVAILABLE,  # no cluster architecture for this machine (worker session)
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
