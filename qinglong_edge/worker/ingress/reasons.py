"""Which typed reason a network failure of the ingress client is (issue 18 item 1).

:func:`classify` turns the ``OSError`` (``ssl.SSLError``, ``TimeoutError``...) raised at
one stage of an exchange into a :class:`~qinglong_edge.errors.TransportError` with a
reason of :data:`~qinglong_edge.errors.TRANSPORT_REASONS`::

    stage                 failure                                  reason
    resolve               socket.gaierror                          dns_failure
    connect               ECONNREFUSED                             connection_refused
                          ENETUNREACH, EHOSTUNREACH, EADDRNOTAVAIL network_unreachable
                          timeout (or the hard deadline)           connect_timeout
                          anything else                            connection_failed
    TLS handshake         verify code 10 / 9                       certificate_expired / _not_yet_valid
                          62, 63, 64 (host, e-mail, IP)            hostname_mismatch
                          2, 18-21, 24, 79 (issuer chain)          untrusted_issuer
                          66, 67, 68 (key size, digest)            weak_certificate
                          any other verify code                    certificate_rejected
                          alert protocol_version, UNSUPPORTED_..   protocol_version
                          WRONG_VERSION_NUMBER, HTTP_REQUEST ..    plaintext_peer
                          timeout                                  tls_handshake_timeout
                          anything else (EOF, reset, alerts)       tls_handshake_failed
    send request          timeout                                  send_timeout
    read response head/   a TLS alert before any response byte on  client_certificate_rejected (certificate
    body, or send           a new connection                         alerts) / tls_alert, reached_cluster False
                          timeout (or the hard deadline)           read_timeout
                          ECONNRESET, EPIPE, TLS EOF               connection_reset
                          EOF before the answer was complete       connection_closed
                          another TLS alert                        tls_alert

Verify codes are OpenSSL's ``X509_V_ERR_*`` (stable from 1.1.1 to 3.x, except that 3.0
renumbered ``INVALID_CA`` from 24 to 79: both are issuer problems). SSL reasons are
OpenSSL's reason strings as ``ssl.SSLError.reason`` gives them.

``reached_cluster`` is False for every failure up to and including the handshake and
for a TLS alert on the first read of a new connection: a TLS 1.3 server rejects a
client certificate only after the client's handshake has completed, so the alert
arrives where the response would; it proves the request never reached the HTTP layer.
A reset or EOF cannot prove that and counts as reached (spec README, offer delivery
decisions). Imports only what the transport already has loaded (``ssl``, ``socket``).
"""

from __future__ import annotations

import errno
import socket
import ssl

from qinglong_edge.errors import EdgeError, TransportError

__all__ = ["CLIENT_CERTIFICATE_ALERTS", "classify", "is_tls_alert"]

_EXPIRED = frozenset({10})
_NOT_YET_VALID = frozenset({9})
_HOSTNAME = frozenset({62, 63, 64})
_ISSUER = frozenset({2, 18, 19, 20, 21, 24, 79})
_WEAK = frozenset({66, 67, 68})
_PROTOCOL = frozenset({
    "TLSV1_ALERT_PROTOCOL_VERSION", "UNSUPPORTED_PROTOCOL", "NO_PROTOCOLS_AVAILABLE", "WRONG_SSL_VERSION",
    "VERSION_TOO_LOW", "TLSV1_ALERT_INAPPROPRIATE_FALLBACK",
})
_PLAINTEXT = frozenset({"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "PACKET_LENGTH_TOO_LONG",
                        "RECORD_LENGTH_MISMATCH", "UNKNOWN_PROTOCOL"})
#: Alerts a TLS 1.3 server sends when it refuses the client's certificate (RFC 8446 6.2).
CLIENT_CERTIFICATE_ALERTS = frozenset({
    "TLSV13_ALERT_CERTIFICATE_REQUIRED", "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED", "SSLV3_ALERT_CERTIFICATE_REVOKED", "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE", "TLSV1_ALERT_ACCESS_DENIED", "TLSV1_ALERT_DECRYPT_ERROR",
})
_UNREACHABLE = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL, errno.ENETDOWN})
_RESET = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, ssl.SSLEOFError)


def is_tls_alert(exc: BaseException) -> bool:
    """An ``ssl.SSLError`` carrying an alert the peer sent (``..._ALERT_...``)."""
    return isinstance(exc, ssl.SSLError) and "_ALERT_" in str(exc.reason or "")


def _describe(exc: BaseException) -> str:
    """A secret-free description of a network failure."""
    if isinstance(exc, EdgeError):  # tls_wire's DeadlineExceeded, PeerClosed: their own message
        return exc.message
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed ({exc.verify_message})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error ({exc.reason or type(exc).__name__})"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host name ({exc.strerror or exc.errno})"
    if isinstance(exc, TimeoutError):
        return str(exc) if "deadline" in str(exc) else "timed out"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    return str(exc) or type(exc).__name__


def _handshake_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        code = exc.verify_code
        if code in _EXPIRED:
            return "certificate_expired"
        if code in _NOT_YET_VALID:
            return "certificate_not_yet_valid"
        if code in _HOSTNAME:
            return "hostname_mismatch"
        if code in _ISSUER:
            return "untrusted_issuer"
        if code in _WEAK:
            return "weak_certificate"
        return "certificate_rejected"
    if isinstance(exc, TimeoutError):
        return "tls_handshake_timeout"
    if isinstance(exc, ssl.SSLError):
        name = str(exc.reason or "")
        if name in _PROTOCOL:
            return "protocol_version"
        if name in _PLAINTEXT:
            return "plaintext_peer"
        if name in ("EE_KEY_TOO_SMALL", "CA_KEY_TOO_SMALL", "CA_MD_TOO_WEAK"):
            return "weak_certificate"
    return "tls_handshake_failed"


def _connect_reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection_refused"
    if isinstance(exc, TimeoutError):
        return "connect_timeout"
    if isinstance(exc, OSError) and exc.errno in _UNREACHABLE:
        return "network_unreachable"
    return "connection_failed"


def classify(
    exc: BaseException,
    stage: str,
    *,
    first_read: bool = False,
    http_status: int | None = None,
) -> TransportError:
    """The ``request_rejected`` error for ``exc`` raised at ``stage``.

    Args:
        stage: ``resolve``, ``connect``, ``TLS handshake``, ``send request``,
            ``read response head`` or ``read response body`` (it starts the message).
        first_read: no byte of a response has arrived yet on a connection this
            request opened (not a reused idle one): an alert now is the server's TLS
            layer refusing the session, not an answer.
        http_status: the status, once a response head was read.
    """
    if isinstance(exc, TransportError):  # a ConnectionError too: already classified
        return exc
    detail = _describe(exc)
    reached: bool | None = None
    if stage == "resolve":
        reason = "dns_failure"
    elif stage == "connect":
        reason = _connect_reason(exc)
    elif stage == "TLS handshake":
        reason = _handshake_reason(exc)
    elif is_tls_alert(exc):
        name = str(getattr(exc, "reason", "") or "")
        if first_read:
            reason = "client_certificate_rejected" if name in CLIENT_CERTIFICATE_ALERTS else "tls_alert"
            reached = False
        else:
            reason = "tls_alert"
    elif isinstance(exc, TimeoutError):
        reason = "send_timeout" if stage == "send request" else "read_timeout"
    elif isinstance(exc, _RESET):
        reason = "connection_reset"
    elif isinstance(exc, ConnectionError | EOFError):
        reason = "connection_closed"
    elif isinstance(exc, ssl.SSLError):
        reason = "tls_alert" if stage != "send request" else "connection_reset"
    else:
        reason = "connection_failed" if stage == "connect" else "connection_reset"
    return TransportError(
        f"{stage}: {detail}", code="request_rejected", http_status=http_status, reason=reason,
        reached_cluster=reached,
    )
