"""Sans-IO HTTP/1.1 pieces of the worker ingress client: bytes in, values out.

Source: offer-delivery.md section 1.3 (request path grammar, body sizes), 1.6 (response
acceptance), 1.7 (``Retry-After`` on 429/503). :mod:`qinglong_edge.worker.ingress.transport`
does the I/O and feeds the bytes it reads into these functions.

Why not ``http.client.HTTPResponse``: it is knowingly lenient (its docstring says so).
It accepts duplicate or ``1_0`` ``Content-Length``, passes ``Content-Encoding: gzip``
through, drops bytes sent beyond ``Content-Length``, accepts obs-fold, and hands the
header block to ``email.parser``, which moves every header after a malformed line into
the "payload", where nobody checks it (a ``Content-Encoding: gzip`` after a junk line
would be invisible). Here every header line is checked against RFC 9112 and the
acceptance rules see all of them.

Response head grammar accepted (RFC 9112 sections 4, 5; CRLF line ends only)::

    status-line = "HTTP/1." ("0" / "1") SP 3DIGIT [ SP reason-phrase ] CRLF
    field-line  = token ":" OWS field-value OWS CRLF   ; no obs-fold, no CTL but HTAB

Acceptance (section 1.6), in this order; the first failure wins:

1. status exactly 200, else ``response_rejected`` with ``http_status`` (and
   ``retry_after_ms`` for 429/503);
2. exactly one ``Content-Type`` matching ``^application/json(?:\\s*;|$)`` (any case);
3. ``Content-Encoding`` absent or exactly one ``identity``;
4. framing: ``Transfer-Encoding`` must be exactly one ``chunked`` and then no
   ``Content-Length``; else ``Content-Length`` at most once, ``^[0-9]+$``, no larger
   than the caller's cap; else the body runs to the end of the connection;
5. the body (decoded from its framing) at most the cap, counted as it streams
   (``response_too_large``), at least 2 bytes (``response_rejected``).

Errors are :class:`~qinglong_edge.errors.TransportError` and never contain body bytes;
their ``reason`` is ``unexpected_status`` (rule 1), ``malformed_response`` (the head
grammar, rules 2-4, a short body), ``connection_closed`` (EOF inside the body) or
``response_too_large``. :func:`error_code` reads the one thing of a non-200 body the
client keeps: the cluster's ``{"code":"..."}`` word.
"""

from __future__ import annotations

import math
import re

from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.ids import SESSION_ID, WORKER_ID
from qinglong_edge.contracts.origin import HTTP_FIELD_VALUE, HTTP_FIELD_VALUE_RE, HTTP_OWS, HTTP_TOKEN
from qinglong_edge.contracts.strictjson import loads
from qinglong_edge.errors import TransportError

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "MAX_HEADER_FIELDS",
    "MAX_HEAD_BYTES",
    "MAX_REQUEST_BYTES_CEILING",
    "MAX_RESPONSE_BYTES_CEILING",
    "MAX_RETRY_AFTER_MS",
    "BodyDecoder",
    "ChunkedBody",
    "CloseDelimitedBody",
    "LengthBody",
    "ResponseHead",
    "accept_head",
    "error_code",
    "is_ingress_path",
    "is_stream_path",
    "parse_response_head",
    "retry_after_ms",
]

#: Largest response head (status line + fields + CRLFs); llhttp's default, which the
#: Node worker runs with.
MAX_HEAD_BYTES = 16 * 1024
#: Most header fields in one head (``http.client._MAXHEADERS``).
MAX_HEADER_FIELDS = 100
#: ``MAX_REQUEST_BYTES`` of the TS client: the default request body cap.
DEFAULT_MAX_REQUEST_BYTES = 4096
#: ``HARD_MAX_REQUEST_BYTES``: a route may raise the request cap up to this (secrets).
MAX_REQUEST_BYTES_CEILING = 64 * 1024
#: ``MAX_RESPONSE_BYTES`` of the newer TS client: the largest cap a caller may ask for.
MAX_RESPONSE_BYTES_CEILING = 256 * 1024
#: A ``Retry-After`` longer than a day is clamped to a day (decision: a wrong value
#: must not park a device for years; the cluster sends seconds).
MAX_RETRY_AFTER_MS = 86_400_000
#: Largest chunk-size line (size, extensions, CRLF) and trailer section we read.
MAX_CHUNK_LINE_BYTES = 4096
#: Chunk framing bytes (size lines, CRLFs, trailers) allowed on top of the data.
MAX_CHUNK_OVERHEAD_BYTES = 64 * 1024

_OPERATIONS = (
    "register|heartbeat|transition|offers|starting|running|start-failure|secrets|completion|lease-control"
)
_INGRESS_PATH = re.compile(
    rf"/api/v3/worker-ingress/workers/{WORKER_ID.pattern}/sessions/{SESSION_ID.pattern}/(?:{_OPERATIONS})",
    re.ASCII,
)
#: The stream routes (remote-execution.md 3.6): a binary body, not JSON.
_STREAM_PATH = re.compile(
    rf"/api/v3/worker-ingress/workers/{WORKER_ID.pattern}/sessions/{SESSION_ID.pattern}/artifacts",
    re.ASCII,
)
#: A cluster error code worth keeping (``worker_offer_fenced``); anything else is dropped.
_ERROR_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}", re.ASCII)
#: Largest non-200 body read for its code (the cluster's are ``{"code":"..."}``).
MAX_ERROR_BODY_BYTES = 1024
# token, field-vchar, field-value and OWS: contracts/origin.py's HTTP_* (the Local API's too).
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: (" + HTTP_FIELD_VALUE + rb"))?")
_FIELD_LINE = re.compile(rb"(" + HTTP_TOKEN + rb"):(.*)", re.DOTALL)
_JSON_MEDIA_TYPE = re.compile(r"application/json(?:\s*;|$)", re.IGNORECASE | re.ASCII)
_DIGITS = re.compile(r"[0-9]+", re.ASCII)
#: Compiled on first use (``re`` caches it): the cluster answers with Content-Length.
_CHUNK_SIZE = rb"([0-9A-Fa-f]{1,16})(?:[\t ]*;" + HTTP_FIELD_VALUE + rb")?"


def is_ingress_path(path: object) -> bool:
    """True for ``/api/v3/worker-ingress/workers/{workerId}/sessions/{sessionId}/{op}``.

    ``op`` is one of the JSON routes of the TS client (offer-delivery.md sections 1.3, 5);
    no query string, no fragment, no percent-encoding.
    """
    return isinstance(path, str) and _INGRESS_PATH.fullmatch(path) is not None


def is_stream_path(path: object) -> bool:
    """True for ``/api/v3/worker-ingress/workers/{workerId}/sessions/{sessionId}/artifacts``
    (remote-execution.md 3.6, the one stream route)."""
    return isinstance(path, str) and _STREAM_PATH.fullmatch(path) is not None


def error_code(body: bytes) -> str | None:
    """The ``code`` of a non-200 body that is exactly ``{"code":"<snake_case word>"}``
    (offer-delivery.md 1.7), else None. Nothing else of the body is kept or shown."""
    try:
        document = loads(body, max_bytes=MAX_ERROR_BODY_BYTES, min_bytes=2)
    except ContractError:
        return None
    if not isinstance(document, dict) or set(document) != {"code"}:
        return None
    code = document["code"]
    return code if isinstance(code, str) and _ERROR_CODE.fullmatch(code) else None


class ResponseHead(Frozen):
    """A parsed response head.

    Attributes:
        minor_version: 1 for HTTP/1.1, 0 for HTTP/1.0.
        status: the 3-digit status code (100-999).
        fields: every header field in order, name lower-cased, value with OWS trimmed,
            decoded as Latin-1 (the wire's bytes, one to one).
    """

    __slots__ = ("minor_version", "status", "fields")  # noqa: RUF023 (field order)

    minor_version: int
    status: int
    fields: tuple[tuple[str, str], ...]

    def __init__(self, minor_version: int, status: int, fields: tuple[tuple[str, str], ...]) -> None:
        object.__setattr__(self, "minor_version", minor_version)
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "fields", fields)

    def values(self, name: str) -> list[str]:
        """All values of header ``name`` (lower-case), in order."""
        return [value for key, value in self.fields if key == name]

    @property
    def keep_alive(self) -> bool:
        """HTTP/1.1 without a ``close`` token in ``Connection`` (RFC 9112 section 9.3)."""
        if self.minor_version != 1:
            return False
        tokens = {t.strip().lower() for value in self.values("connection") for t in value.split(",")}
        return "close" not in tokens


def _rejected(
    message: str, status: int | None = None, retry_after: int | None = None, reason: str = "malformed_response"
) -> TransportError:
    return TransportError(message, code="response_rejected", http_status=status, retry_after_ms=retry_after,
                          reason=reason)


def _too_large(message: str, status: int | None = 200) -> TransportError:
    return TransportError(message, code="response_too_large", http_status=status)


def _field(line: bytes) -> tuple[str, str] | None:
    """``(lower-case name, value without OWS)`` of one field line, None if malformed."""
    match = _FIELD_LINE.fullmatch(line)
    if match is None:
        return None
    value = match.group(2).strip(HTTP_OWS)
    if HTTP_FIELD_VALUE_RE.fullmatch(value) is None:
        return None
    return match.group(1).decode("ascii").lower(), value.decode("latin-1")


def parse_response_head(data: bytes) -> ResponseHead:
    """Parse a response head: the bytes up to and including the first ``CRLF CRLF``.

    Raises:
        TransportError: ``response_rejected`` (``http_status`` set when the status
            line was readable) for anything outside the grammar above, more than
            :data:`MAX_HEAD_BYTES` or :data:`MAX_HEADER_FIELDS`.
    """
    if len(data) > MAX_HEAD_BYTES:
        raise _rejected(f"response head larger than {MAX_HEAD_BYTES} bytes")
    if not data.endswith(b"\r\n\r\n"):
        raise _rejected("response head is not terminated by CRLF CRLF")
    lines = data[:-4].split(b"\r\n")
    status_match = _STATUS_LINE.fullmatch(lines[0])
    if status_match is None:
        raise _rejected("malformed status line")
    status = int(status_match.group(2))
    if status < 100:
        raise _rejected("malformed status code")
    if len(lines) - 1 > MAX_HEADER_FIELDS:
        raise _rejected(f"more than {MAX_HEADER_FIELDS} header fields", status)
    fields: list[tuple[str, str]] = []
    for line in lines[1:]:
        field = _field(line)
        if field is None:
            # Covers obs-fold (leading SP/HTAB), a missing colon, space before the
            # colon, bare CR/LF and other control characters.
            raise _rejected("malformed header field", status)
        fields.append(field)
    return ResponseHead(minor_version=int(status_match.group(1)), status=status, fields=tuple(fields))


def retry_after_ms(head: ResponseHead, now_ms: int) -> int | None:
    """The ``Retry-After`` of a 429/503 in milliseconds, else None.

    Accepts delta-seconds (``^[0-9]+$``) and an HTTP-date (IMF-fixdate, RFC 850 or
    asctime, RFC 9110 section 10.2.3; a date in the past gives 0). Exactly one field is
    required; an unparsable value gives None. Clamped to :data:`MAX_RETRY_AFTER_MS`.

    Args:
        now_ms: wall-clock Unix time in ms (the date form is compared with it).
    """
    if head.status not in (429, 503):
        return None
    values = head.values("retry-after")
    if len(values) != 1:
        return None
    value = values[0]
    if _DIGITS.fullmatch(value):
        if len(value) > 12:
            return MAX_RETRY_AFTER_MS
        return min(int(value) * 1000, MAX_RETRY_AFTER_MS)
    # Imported here: only an HTTP-date needs them (http.client imports them anyway,
    # but this module is also the sans-IO core the tests load on its own).
    import datetime
    import email.utils

    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # asctime carries no zone; HTTP dates are always GMT
        when = when.replace(tzinfo=datetime.UTC)
    delta = math.ceil(when.timestamp() * 1000) - now_ms
    return max(0, min(delta, MAX_RETRY_AFTER_MS))


def accept_head(head: ResponseHead, max_response_bytes: int, now_ms: int) -> BodyDecoder:
    """Apply acceptance rules 1-4 and return the decoder for the body's framing.

    Args:
        max_response_bytes: the caller's cap, 2 - :data:`MAX_RESPONSE_BYTES_CEILING`.
        now_ms: wall-clock ms, for an HTTP-date ``Retry-After``.

    Raises:
        TransportError: ``response_rejected`` with ``http_status`` (and
            ``retry_after_ms`` for 429/503).
    """
    status = head.status
    if status != 200:
        raise _rejected(f"HTTP {status} is not 200", status, retry_after_ms(head, now_ms), "unexpected_status")
    content_types = head.values("content-type")
    if len(content_types) != 1 or _JSON_MEDIA_TYPE.match(content_types[0]) is None:
        raise _rejected("content-type is not exactly one application/json", status)
    encodings = head.values("content-encoding")
    if encodings and encodings != ["identity"]:
        raise _rejected("content-encoding other than identity", status)
    transfer_codings = head.values("transfer-encoding")
    lengths = head.values("content-length")
    if transfer_codings:
        if head.minor_version != 1 or len(transfer_codings) != 1 or transfer_codings[0].lower() != "chunked":
            raise _rejected("transfer-encoding other than a single chunked", status)
        if lengths:
            # RFC 9112 section 6.3 item 3: both together is a smuggling signature.
            raise _rejected("both transfer-encoding and content-length", status)
        return ChunkedBody(max_response_bytes)
    if lengths:
        if len(lengths) != 1 or _DIGITS.fullmatch(lengths[0]) is None:
            raise _rejected("content-length is not exactly one decimal number", status)
        # Compare the text length first: int() of a huge digit string is refused by
        # CPython (and needless); 7 digits already exceed every cap.
        if len(lengths[0].lstrip("0")) > 7 or int(lengths[0]) > max_response_bytes:
            raise _rejected(f"content-length over the {max_response_bytes}-byte cap", status)
        return LengthBody(int(lengths[0]), max_response_bytes)
    return CloseDelimitedBody(max_response_bytes)


class BodyDecoder:
    """Incremental body decoder: :meth:`feed` wire bytes, then :meth:`finish`.

    Attributes:
        done: the message ended by its framing (length reached, last chunk and
            trailers read). EOF-delimited bodies are done only at :meth:`eof`.
        reusable: the framing leaves the connection usable for another request.
    """

    reusable = True

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.done = False
        self._body = bytearray()

    def feed(self, data: bytes) -> None:
        """Consume ``data``.

        Raises:
            TransportError: ``response_too_large`` past the cap or past the end of the
                message, ``response_rejected`` for a framing error.
        """
        raise NotImplementedError

    def eof(self) -> None:
        """The peer closed the connection.

        Raises:
            TransportError: ``response_rejected`` when the message is incomplete.
        """
        if not self.done:
            raise _rejected("connection closed before the end of the body", 200, reason="connection_closed")

    def finish(self) -> bytes:
        """The decoded body of a done message (at least 2 bytes).

        Raises:
            TransportError: ``response_rejected`` for a body shorter than 2 bytes.
        """
        if len(self._body) < 2:
            raise _rejected("body shorter than 2 bytes", 200)
        return bytes(self._body)

    def _append(self, data: bytes) -> None:
        if len(self._body) + len(data) > self.cap:
            raise _too_large(f"body exceeds the {self.cap}-byte cap")
        self._body += data


class LengthBody(BodyDecoder):
    """A ``Content-Length`` body: exactly ``length`` bytes; a byte more is a violation."""

    def __init__(self, length: int, cap: int) -> None:
        super().__init__(cap)
        self.remaining = length
        self.done = length == 0

    def feed(self, data: bytes) -> None:
        if not data:
            return
        if len(data) > self.remaining:
            # The server sent more than it declared: http.client would silently drop
            # it; we cut the connection off (the "sends more than it declared").
            raise _too_large("server sent more bytes than its content-length")
        self._append(data)
        self.remaining -= len(data)
        self.done = self.remaining == 0


class CloseDelimitedBody(BodyDecoder):
    """No framing header: the body runs to EOF (RFC 9112 section 6.3 item 8)."""

    reusable = False

    def feed(self, data: bytes) -> None:
        self._append(data)

    def eof(self) -> None:
        self.done = True


class ChunkedBody(BodyDecoder):
    """A strict ``chunked`` decoder (RFC 9112 section 7.1).

    Chunk sizes are 1-16 hex digits (no ``0x``, sign, underscore or space); extensions
    are skipped; trailer fields are parsed and discarded. A chunk whose declared size
    would pass the cap is refused before its data is read.
    """

    _SIZE, _DATA, _DATA_END, _TRAILER = range(4)

    def __init__(self, cap: int) -> None:
        super().__init__(cap)
        self._state = self._SIZE
        self._pending = bytearray()
        self._left = 0
        self._overhead = 0
        self._trailer_bytes = 0

    def feed(self, data: bytes) -> None:
        if self.done:
            if data:
                raise _too_large("server sent bytes after the last chunk")
            return
        self._pending += data
        while self._pending:
            if self._state == self._DATA:
                take = min(self._left, len(self._pending))
                self._append(bytes(self._pending[:take]))
                del self._pending[:take]
                self._left -= take
                if self._left == 0:
                    self._state = self._DATA_END
                continue
            if self._state == self._DATA_END:
                if len(self._pending) < 2:
                    return
                if self._pending[:2] != b"\r\n":
                    raise _rejected("chunk data not followed by CRLF", 200)
                del self._pending[:2]
                self._count_overhead(2)
                self._state = self._SIZE
                continue
            line = self._take_line()
            if line is None:
                return
            if self._state == self._SIZE:
                self._size_line(line)
            else:
                self._trailer_line(line)
                if self.done:
                    if self._pending:
                        raise _too_large("server sent bytes after the last chunk")
                    return

    def _take_line(self) -> bytes | None:
        end = self._pending.find(b"\r\n")
        if end < 0:
            if len(self._pending) > MAX_CHUNK_LINE_BYTES:
                raise _rejected("chunk line too long", 200)
            return None
        if end > MAX_CHUNK_LINE_BYTES:
            raise _rejected("chunk line too long", 200)
        line = bytes(self._pending[:end])
        del self._pending[: end + 2]
        self._count_overhead(end + 2)
        return line

    def _size_line(self, line: bytes) -> None:
        match = re.fullmatch(_CHUNK_SIZE, line)
        if match is None:
            raise _rejected("malformed chunk size", 200)
        size = int(match.group(1), 16)
        if size == 0:
            self._state = self._TRAILER
            return
        if len(self._body) + size > self.cap:
            raise _too_large(f"chunked body exceeds the {self.cap}-byte cap")
        self._left = size
        self._state = self._DATA

    def _trailer_line(self, line: bytes) -> None:
        if line == b"":
            self.done = True
            return
        self._trailer_bytes += len(line) + 2
        if self._trailer_bytes > MAX_HEAD_BYTES or _field(line) is None:
            raise _rejected("malformed or oversized chunked trailer", 200)

    def _count_overhead(self, count: int) -> None:
        self._overhead += count
        if self._overhead > MAX_CHUNK_OVERHEAD_BYTES:
            raise _too_large("chunk framing overhead exceeds its bound")
