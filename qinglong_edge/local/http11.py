"""Sans-IO strict HTTP/1.1: request-head parser and response writer.

Bytes in, a :class:`RequestHead` or an :class:`~qinglong_edge.errors.HttpProtocolError`
out; no sockets here (:mod:`qinglong_edge.local.server` drives it). Modelled on h11's
``_abnf`` idea (spec/style-anchors.md section 1): the RFC grammar as named regex
fragments, one :func:`_validate` helper, errors that carry the status to answer with.
Unlike h11 it is strict (spec README, "Local API"):

* request line exactly ``method SP request-target SP HTTP/1.1 CRLF``; origin-form only
  (absolute-form and asterisk-form are 400: a loopback API has no proxy role;
  corpora ``http-malformed/policy_absolute_form`` allows 200|400); another
  well-formed version is 505;
* every line ends with CRLF: a bare LF or a bare CR anywhere in the head is 400
  (RFC 9112 section 2.2 "MAY" accept bare LF: we do not);
* no empty line before the request line, no whitespace before the first field,
  no obs-fold (RFC 9112 section 5.2: reject), no whitespace before the colon
  (section 5.1: MUST reject), field names are tokens, field values are
  ``field-vchar`` / SP / HTAB only (so NUL and other controls are 400), OWS trimmed;
* exactly one valid ``Host`` (RFC 9112 section 3.2: MUST 400);
* framing errors RFC 9112 section 6.3 calls unrecoverable are rejected here, before
  authentication, as Node's llhttp does (local-api.md section 2.4, compat notes):
  ``Transfer-Encoding`` together with ``Content-Length``, more than one
  ``Content-Length`` line, a ``Content-Length`` that is not ``1*DIGIT``. The
  application rules of section 2.4 (``^[1-9]\\d*$``, 512-byte cap, TE alone) run
  later, after admission;
* ``Expect`` other than one ``100-continue`` is 417 (RFC 9110 section 10.1.1);
* limits: the whole head (request line, fields, final CRLF) at most 8 KiB
  (Node ``maxHeaderSize``): over it 414 while the request line is still open, else
  431; at most 64 field lines (431). The 512-byte URL rule of local-api.md 2.3 is a
  *route* rule (404), applied by :mod:`qinglong_edge.local.routes`.

The raw field list is kept in order with duplicates, so callers can count
``Authorization`` / ``Content-Type`` / ``Content-Length`` lines (local-api.md 11.1).

The parser is incremental and chunking-invariant: feeding a head one byte at a time
gives the same head or the same error as feeding it whole, because every decision
depends only on the bytes before it (complete lines are checked in order; the open
line is checked only for bare CR and the size cap).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from qinglong_edge.contracts.ids import new_uuid4
from qinglong_edge.contracts.origin import HTTP_FIELD_VALUE_RE, HTTP_FIELD_VCHAR, HTTP_OWS, HTTP_TOKEN
from qinglong_edge.contracts.strictjson import StrictJsonError, dumps_bytes
from qinglong_edge.errors import HttpProtocolError

__all__ = [
    "MAX_FIELD_LINES",
    "MAX_HEAD_BYTES",
    "MAX_RESPONSE_BODY_BYTES",
    "HeadParser",
    "RequestHead",
    "new_request_id",
    "parse_head",
    "render_bare_response",
    "render_continue",
    "render_json_response",
    "render_raw_response",
]

#: Whole request head in bytes, request line to the final CRLF (Node ``maxHeaderSize``
#: 8 KiB, local-api.md 2.1; Apache and Tomcat use 8 KiB per line too).
MAX_HEAD_BYTES: Final = 8 * 1024
#: Field lines per head (Node's default is 2000; a Local API request has about 6).
MAX_FIELD_LINES: Final = 64
#: Response body cap in bytes (local-api.md 2.1, baseline 64 KiB).
MAX_RESPONSE_BODY_BYTES: Final = 64 * 1024
#: Digits of a Content-Length we bother converting; longer is "not a safe integer".
CONTENT_LENGTH_MAX_DIGITS: Final = 16

# ---------------------------------------------------------------------------
# RFC 9110 / 9112 grammar as regex fragments (h11 _abnf style).
# ---------------------------------------------------------------------------

# token, field-vchar, field-value and OWS are the worker ingress client's too: they are
# contracts/origin.py's HTTP_* fragments (RFC 9110 5.5, 5.6.2, 5.6.3).
# pchar = unreserved / pct-encoded / sub-delims / ":" / "@"        (RFC 3986 3.3)
_PCHAR = rb"(?:[-A-Za-z0-9._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})"
# origin-form = absolute-path [ "?" query ]; absolute-path = 1*( "/" segment )
# query = *( pchar / "/" / "?" )                                  (RFC 9112 3.2.1)
_ORIGIN_FORM = rb"(?:/" + _PCHAR + rb"*)+(?:\?(?:" + _PCHAR + rb"|[/?])*)?"
# absolute-form = absolute-URI (scheme ":" ...)                   (RFC 9112 3.2.2)
_ABSOLUTE_FORM_START = rb"[A-Za-z][A-Za-z0-9+.-]*:"
# request-line = method SP request-target SP HTTP-version         (RFC 9112 3)
# HTTP-version = "HTTP/" DIGIT "." DIGIT                           (RFC 9112 2.3)
_REQUEST_LINE = (
    rb"(?P<method>" + HTTP_TOKEN + rb") (?P<target>[" + HTTP_FIELD_VCHAR + rb"]+) HTTP/(?P<version>[0-9]\.[0-9])"
)
# field-line = field-name ":" OWS field-value OWS; field-name = token  (RFC 9112 5)
_FIELD_NAME = rb"(?P<name>" + HTTP_TOKEN + rb"):"
# field-value: after trimming OWS, a run of SP / HTAB / field-vchar (HTTP_FIELD_VALUE_RE).
# Host = uri-host [ ":" port ]; uri-host = IP-literal / IPv4address / reg-name
# reg-name = *( unreserved / pct-encoded / sub-delims )             (RFC 3986 3.2.2)
_HOST = (
    rb"(?:\[[0-9A-Fa-f:.]+\]|(?:[-A-Za-z0-9._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})*)(?::[0-9]*)?"
)
# Content-Length = 1*DIGIT                                          (RFC 9110 8.6)
_CONTENT_LENGTH = rb"[0-9]+"

_REQUEST_LINE_RE = re.compile(_REQUEST_LINE)
_TOKEN_RE = re.compile(HTTP_TOKEN)
_ORIGIN_FORM_RE = re.compile(_ORIGIN_FORM)
_ABSOLUTE_FORM_RE = re.compile(_ABSOLUTE_FORM_START)
_FIELD_NAME_RE = re.compile(_FIELD_NAME)
_FIELD_VALUE_RE = HTTP_FIELD_VALUE_RE
_HOST_RE = re.compile(_HOST)
_CONTENT_LENGTH_RE = re.compile(_CONTENT_LENGTH)


def _validate(regex: re.Pattern[bytes], data: bytes, code: str, message: str, status: int = 400) -> re.Match[bytes]:
    """``regex.fullmatch(data)`` or raise HttpProtocolError(code, status)."""
    match = regex.fullmatch(data)
    if match is None:
        raise HttpProtocolError(message, code=code, status=status)
    return match


# ---------------------------------------------------------------------------
# The parsed head.
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestHead:
    """A validated HTTP/1.1 request head.

    Attributes:
        method: the method token, case kept (``GET``; ``get`` is another method).
        target: the raw origin-form request-target, never decoded (ASCII).
        fields: every field line in order, duplicates kept, as (lower-cased name,
            value with OWS trimmed). Values are decoded as ISO-8859-1 (as Node does)
            so ``obs-text`` survives byte for byte.
        head_bytes: size of the head in bytes, request line to the final CRLF.
    """

    method: str
    target: str
    fields: tuple[tuple[str, str], ...]
    head_bytes: int

    def values(self, name: str) -> list[str]:
        """All values of field ``name`` (case-insensitive), in order."""
        key = name.lower()
        return [value for field, value in self.fields if field == key]

    def count(self, name: str) -> int:
        """Number of field lines named ``name`` (case-insensitive)."""
        key = name.lower()
        return sum(1 for field, _ in self.fields if field == key)

    @property
    def has_transfer_encoding(self) -> bool:
        """A ``Transfer-Encoding`` line is present (any value)."""
        return self.count("transfer-encoding") > 0

    @property
    def content_length_raw(self) -> str | None:
        """The raw value of the single ``Content-Length`` line, or None if absent.

        The parser has already rejected duplicates and non-``1*DIGIT`` values.
        """
        found = self.values("content-length")
        return found[0] if found else None

    @property
    def content_length(self) -> int | None:
        """The declared body size in bytes, None if absent.

        Values of more than 16 digits (beyond 2^53-1) come back as
        ``2**53``, which every cap treats as too large (local-api.md 2.4: "not a
        safe integer" is 413); ``int()`` is never asked to convert thousands of digits.
        """
        raw = self.content_length_raw
        if raw is None:
            return None
        digits = raw.lstrip("0") or "0"
        if len(digits) > CONTENT_LENGTH_MAX_DIGITS:
            return 2**53
        return int(digits)

    @property
    def has_body(self) -> bool:
        """local-api.md 2.2 "has body": a Transfer-Encoding line, more than one
        Content-Length line, or one whose raw value is not exactly ``0`` (``00`` is a body).
        """
        lengths = self.values("content-length")
        return self.has_transfer_encoding or len(lengths) > 1 or (len(lengths) == 1 and lengths[0] != "0")

    @property
    def expects_continue(self) -> bool:
        """The client sent ``Expect: 100-continue`` (the only expectation we accept)."""
        return self.count("expect") == 1

    @property
    def wants_close(self) -> bool:
        """A ``Connection`` field lists the ``close`` option (RFC 9112 9.6)."""
        for value in self.values("connection"):
            for option in value.split(","):
                if option.strip(" \t").lower() == "close":
                    return True
        return False


# ---------------------------------------------------------------------------
# The incremental parser.
# ---------------------------------------------------------------------------


class HeadParser:
    """Incremental parser of one request head.

    Usage: call :meth:`feed` with bytes as they arrive until it returns a
    :class:`RequestHead`; the bytes after the head are then in :attr:`trailing`
    (the start of the body or of the next request). One head per instance.

    Args:
        max_head_bytes: cap on the head, request line to the final CRLF (bytes).
        max_field_lines: cap on the number of field lines.
    """

    def __init__(self, *, max_head_bytes: int = MAX_HEAD_BYTES, max_field_lines: int = MAX_FIELD_LINES) -> None:
        self._max_head = max_head_bytes
        self._max_fields = max_field_lines
        self._buf = bytearray()
        self._line_start = 0
        self._request_line: tuple[str, str] | None = None
        self._fields: list[tuple[str, str]] = []
        self._error: HttpProtocolError | None = None
        self._head: RequestHead | None = None
        self.trailing = b""

    @property
    def buffered(self) -> int:
        """Bytes fed so far (head and anything after it)."""
        return len(self._buf)

    @property
    def started(self) -> bool:
        """At least one byte of this head has arrived."""
        return len(self._buf) > 0

    def feed(self, data: bytes) -> RequestHead | None:
        """Add ``data`` and try to complete the head.

        Args:
            data: the next bytes from the connection (may be empty).

        Returns:
            The head once the final CRLF arrived, else None (need more bytes).

        Raises:
            HttpProtocolError: the bytes so far can never be a valid head; its
                ``http_status`` is the status to answer (400, 414, 417, 431, 505).
                Later calls raise the same error again.
            RuntimeError: called again after a head was returned.
        """
        if self._head is not None:
            raise RuntimeError("HeadParser.feed called after the head was complete")
        if self._error is not None:
            raise self._error
        self._buf += data
        try:
            return self._advance()
        except HttpProtocolError as exc:
            self._error = exc
            raise

    def _advance(self) -> RequestHead | None:
        buf = self._buf
        while True:
            window_end = min(len(buf), self._max_head)
            lf = buf.find(b"\n", self._line_start, window_end)
            if lf == -1:
                tail = buf[self._line_start : window_end]
                cr = tail.find(b"\r")
                if cr != -1 and cr + 1 < len(tail):
                    raise HttpProtocolError("bare CR in the request head", code="bare_cr")
                if len(buf) > self._max_head:
                    if self._request_line is None:
                        raise HttpProtocolError("request line too long", code="uri_too_long", status=414)
                    raise HttpProtocolError("request head too large", code="head_too_large", status=431)
                return None
            # Report the earliest fault: a CR followed by anything but LF comes
            # before the LF that ends this line.
            if lf - 1 > self._line_start and buf.find(b"\r", self._line_start, lf - 1) != -1:
                raise HttpProtocolError("bare CR in the request head", code="bare_cr")
            if lf == self._line_start or buf[lf - 1] != 0x0D:
                raise HttpProtocolError("bare LF in the request head", code="bare_lf")
            line = bytes(buf[self._line_start : lf - 1])
            self._line_start = lf + 1
            if self._request_line is None:
                self._request_line = _parse_request_line(line)
            elif line:
                self._fields.append(self._parse_field_line(line))
            else:
                head = _finish(self._request_line, self._fields, self._line_start)
                self.trailing = bytes(buf[self._line_start :])
                self._head = head
                return head

    def _parse_field_line(self, line: bytes) -> tuple[str, str]:
        if line[:1] in (b" ", b"\t"):
            if self._fields:
                raise HttpProtocolError("obs-fold is not allowed", code="obs_fold")
            raise HttpProtocolError("whitespace before the first field line", code="leading_whitespace")
        if len(self._fields) >= self._max_fields:
            raise HttpProtocolError("too many field lines", code="too_many_fields", status=431)
        colon = line.find(b":")
        if colon == -1:
            raise HttpProtocolError("field line without a colon", code="invalid_field_line")
        name = _validate(
            _FIELD_NAME_RE, line[: colon + 1], "invalid_field_name", "field name is not a token"
        ).group("name")
        value = line[colon + 1 :].strip(HTTP_OWS)
        _validate(_FIELD_VALUE_RE, value, "invalid_field_value", "field value has a forbidden byte")
        return name.decode("ascii").lower(), value.decode("latin-1")


def _parse_request_line(line: bytes) -> tuple[str, str]:
    if not line:
        raise HttpProtocolError("empty line before the request line", code="invalid_request_line")
    match = _validate(_REQUEST_LINE_RE, line, "invalid_request_line", "malformed request line")
    if match.group("version") != b"1.1":
        raise HttpProtocolError("only HTTP/1.1 is served", code="http_version_not_supported", status=505)
    target = match.group("target")
    if _ORIGIN_FORM_RE.fullmatch(target) is None:
        if target == b"*" or _ABSOLUTE_FORM_RE.match(target):
            raise HttpProtocolError("only origin-form request targets are served", code="unsupported_target_form")
        raise HttpProtocolError("malformed request target", code="invalid_request_target")
    return match.group("method").decode("ascii"), target.decode("ascii")


def _finish(request_line: tuple[str, str], fields: list[tuple[str, str]], head_bytes: int) -> RequestHead:
    head = RequestHead(request_line[0], request_line[1], tuple(fields), head_bytes)
    hosts = head.values("host")
    if len(hosts) != 1:
        raise HttpProtocolError("exactly one Host field is required", code="invalid_host")
    _validate(_HOST_RE, hosts[0].encode("latin-1"), "invalid_host", "malformed Host field")
    lengths = head.values("content-length")
    if len(lengths) > 1:
        raise HttpProtocolError("more than one Content-Length", code="duplicate_content_length")
    if lengths:
        _validate(
            _CONTENT_LENGTH_RE, lengths[0].encode("latin-1"), "invalid_content_length", "Content-Length is not 1*DIGIT"
        )
        if head.has_transfer_encoding:
            raise HttpProtocolError("Transfer-Encoding with Content-Length", code="ambiguous_framing")
    expects = head.values("expect")
    if expects and (len(expects) != 1 or expects[0].lower() != "100-continue"):
        raise HttpProtocolError("unsupported expectation", code="expectation_failed", status=417)
    return head


def parse_head(data: bytes, **limits: int) -> RequestHead:
    """Parse a complete head (``data`` must contain the final CRLF CRLF).

    Bytes after the head are ignored. Keyword limits as :class:`HeadParser`.

    Raises:
        HttpProtocolError: as :meth:`HeadParser.feed`, or ``incomplete_head`` (400)
            when ``data`` ends before the head does.
    """
    parser = HeadParser(**limits)
    head = parser.feed(data)
    if head is None:
        raise HttpProtocolError("the request head is incomplete", code="incomplete_head")
    return head


# ---------------------------------------------------------------------------
# The response writer (local-api.md 2.1).
# ---------------------------------------------------------------------------

#: Reason phrases as Node's ``http.STATUS_CODES`` spells them.
REASONS: Final[Mapping[int, str]] = {
    100: "Continue",
    200: "OK",
    202: "Accepted",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    409: "Conflict",
    410: "Gone",
    411: "Length Required",
    413: "Payload Too Large",
    414: "URI Too Long",
    417: "Expectation Failed",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}

_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_UNAVAILABLE_BODY: Final = b'{"code":"response_unavailable"}'


def new_request_id() -> str:
    """``local:<uuidv4>``, the ``x-request-id`` and audit request id (local-api.md 2.2)."""
    return "local:" + new_uuid4()


def http_date(epoch_seconds: float | None = None) -> str:
    """IMF-fixdate (RFC 9110 5.6.7), e.g. ``Sun, 06 Nov 1994 08:49:37 GMT``."""
    t = time.gmtime(time.time() if epoch_seconds is None else epoch_seconds)
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year:04d} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
    )


def _status_line(status: int) -> bytes:
    return f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\n".encode("ascii")


def render_json_response(
    status: int,
    body: Mapping[str, object],
    *,
    request_id: str,
    close: bool,
    keep_alive_timeout_s: int = 5,
    date: str | None = None,
    max_body_bytes: int = MAX_RESPONSE_BODY_BYTES,
    head_only: bool = False,
    retry_after_s: int | None = None,
) -> tuple[int, bytes]:
    """Serialise a Local API JSON response, head and body.

    Headers in Node's order: the five of local-api.md 2.1 (``content-type``,
    ``cache-control``, ``x-content-type-options``, ``x-request-id``,
    ``content-length``), ``connection: close`` when the transport closes, then what
    Node adds: ``Date``, and ``Connection: keep-alive`` + ``Keep-Alive: timeout=5``
    on a persistent connection.

    Args:
        status: HTTP status.
        body: the JSON object, keys in wire order; serialised compactly with
            non-ASCII kept (JS ``JSON.stringify``).
        request_id: ``local:<uuidv4>``.
        close: the connection closes after this response.
        keep_alive_timeout_s: advertised idle timeout in seconds.
        date: the ``Date`` value (tests pin it), default now.
        max_body_bytes: body cap; a larger or unserialisable body becomes
            503 ``{"code":"response_unavailable"}``.
        head_only: the request was ``HEAD``: the headers (``content-length`` included)
            are sent without the body, as Node does (RFC 9110 9.3.2).
        retry_after_s: adds ``retry-after: N`` (whole seconds, RFC 9110 10.2.3) after
            ``content-length`` (429 ``rate_limited``).

    Returns:
        (status actually sent, the response bytes).
    """
    try:
        payload = dumps_bytes(dict(body))
    except StrictJsonError:
        payload = b""
    if not payload or len(payload) > max_body_bytes:
        status, payload = 503, _UNAVAILABLE_BODY
    lines = [
        _status_line(status),
        b"content-type: application/json; charset=utf-8\r\n",
        b"cache-control: no-store\r\n",
        b"x-content-type-options: nosniff\r\n",
        b"x-request-id: " + request_id.encode("ascii") + b"\r\n",
        b"content-length: " + str(len(payload)).encode("ascii") + b"\r\n",
    ]
    if retry_after_s is not None:
        lines.append(b"retry-after: " + str(max(0, int(retry_after_s))).encode("ascii") + b"\r\n")
    lines += _connection_headers(close, keep_alive_timeout_s, date)
    if not head_only:
        lines.append(payload)
    return status, b"".join(lines)


def _connection_headers(close: bool, keep_alive_timeout_s: int, date: str | None) -> list[bytes]:
    """The end of a head, in Node's order: ``connection: close`` when the transport
    closes, ``Date``, ``Connection: keep-alive`` + ``Keep-Alive`` on a persistent
    connection, the blank line."""
    lines = [b"connection: close\r\n"] if close else []
    lines.append(b"Date: " + (date or http_date()).encode("ascii") + b"\r\n")
    if not close:
        lines.append(b"Connection: keep-alive\r\n")
        lines.append(b"Keep-Alive: timeout=" + str(keep_alive_timeout_s).encode("ascii") + b"\r\n")
    lines.append(b"\r\n")
    return lines


def render_raw_response(
    status: int,
    content: bytes,
    headers: tuple[tuple[str, str], ...],
    *,
    request_id: str,
    close: bool,
    keep_alive_timeout_s: int = 5,
    date: str | None = None,
    head_only: bool = False,
) -> bytes:
    """A response whose body is not JSON (the status console's assets, ``/metrics``).

    ``headers`` (each name a token, each value visible ASCII and spaces) come first, then
    ``x-request-id``, ``content-length`` and the connection headers as
    :func:`render_json_response` writes them. A ``204`` carries no body and no
    ``content-length`` (RFC 9110 8.6).

    Raises:
        ValueError: a header name that is not a token, or a value with a control byte.
    """
    lines = [_status_line(status)]
    for name, value in headers:
        if _TOKEN_RE.fullmatch(name.encode("ascii")) is None or any(not 0x20 <= ord(c) < 0x7F for c in value):
            raise ValueError("a response header that is not a token/visible ASCII")
        lines.append(f"{name}: {value}\r\n".encode("ascii"))
    lines.append(b"x-request-id: " + request_id.encode("ascii") + b"\r\n")
    if status != 204:
        lines.append(b"content-length: " + str(len(content)).encode("ascii") + b"\r\n")
    lines += _connection_headers(close, keep_alive_timeout_s, date)
    if not head_only and status != 204:
        lines.append(content)
    return b"".join(lines)


def render_bare_response(status: int) -> bytes:
    """A body-less response that closes the connection, as Node's HTTP parser sends
    for protocol errors (400/408/414/417/431/505): ``HTTP/1.1 400 Bad Request``,
    ``Connection: close``, no JSON (local-api.md 2.4: clients cannot depend on a body).
    """
    return _status_line(status) + b"Connection: close\r\n\r\n"


def render_continue() -> bytes:
    """The interim ``100 Continue`` response (RFC 9110 15.2.1)."""
    return b"HTTP/1.1 100 Continue\r\n\r\n"
