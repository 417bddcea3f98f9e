"""The validity window of X.509 certificates: a small strict DER reader (RFC 5280 4.1).

Why our own: the standard library exposes certificate dates only for a *peer* of a
live connection (``SSLSocket.getpeercert``) or through a private test helper
(``ssl._ssl._test_decode_cert``, which needs a file path and may change without
notice). ``doctor`` and ``pull`` need the dates of the configured client chain and
trust anchors before any handshake, so this module reads just enough DER::

    Certificate  ::= SEQUENCE { tbsCertificate, signatureAlgorithm SEQUENCE, signature BIT STRING }
    TBSCertificate ::= SEQUENCE {
        [0] EXPLICIT version INTEGER (0..2) OPTIONAL,
        serialNumber INTEGER, signature SEQUENCE, issuer Name,
        validity SEQUENCE { notBefore Time, notAfter Time },
        subject Name, ... }                      -- the rest is only checked to be TLVs
    Time ::= UTCTime "YYMMDDHHMMSSZ" (YY < 50: 20YY, else 19YY) | GeneralizedTime "YYYYMMDDHHMMSSZ"

Strict where the window depends on it: definite, minimally encoded lengths of at most
4 bytes, no high tag numbers, every TLV inside its parent, nothing after the
certificate, times in exactly the RFC 5280 4.1.2.5 forms (UTC ``Z``, seconds present,
no fraction) with real calendar dates. Lenient where OpenSSL is (and the dates do not
depend on it): either time form in any year, an explicit version 0. Anything else is a
:class:`~qinglong_edge.contracts.errors.ContractError` (``invalid_certificate``,
``invalid_pem``); no other exception escapes.

Input: PEM text with one or more ``CERTIFICATE`` blocks (other blocks are skipped), or
one or more concatenated DER certificates (what ``load_verify_locations(cadata=)``
accepts). Times are Unix milliseconds, computed without :mod:`datetime` (the pull path
does not import it for this).
"""

from __future__ import annotations

import binascii

from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.errors import ContractError

__all__ = [
    "MAX_CERTIFICATES",
    "CertificateValidity",
    "certificate_validities",
    "iso_utc",
    "read_validity",
]

#: Most certificates read from one file (a chain or an anchor bundle of a 1 MiB file).
MAX_CERTIFICATES = 64
#: Subject common names longer than this are cut for display.
MAX_SUBJECT_CHARS = 128

_SEQUENCE, _SET, _INTEGER, _BIT_STRING, _OID = 0x30, 0x31, 0x02, 0x03, 0x06
_UTC_TIME, _GENERALIZED_TIME, _VERSION = 0x17, 0x18, 0xA0
_COMMON_NAME = b"\x55\x04\x03"  # 2.5.4.3
_STRINGS = {0x0C: "utf-8", 0x13: "ascii", 0x16: "ascii", 0x14: "latin-1", 0x1E: "utf-16-be", 0x1C: "utf-32-be"}
_PEM_BEGIN = b"-----BEGIN CERTIFICATE-----"
_PEM_END = b"-----END CERTIFICATE-----"
_DAY_MS = 86_400_000


class CertificateValidity(Frozen):
    """The validity window of one certificate.

    Attributes:
        not_before_ms: first valid instant, Unix ms (inclusive).
        not_after_ms: last valid instant, Unix ms (inclusive, RFC 5280 4.1.2.5).
        subject: the subject's first commonName for display (control characters
            replaced by ``?``, at most 128 characters), or None.
    """

    __slots__ = ("not_before_ms", "not_after_ms", "subject")  # noqa: RUF023 (field order)

    not_before_ms: int
    not_after_ms: int
    subject: str | None

    def __init__(self, not_before_ms: int, not_after_ms: int, subject: str | None) -> None:
        object.__setattr__(self, "not_before_ms", not_before_ms)
        object.__setattr__(self, "not_after_ms", not_after_ms)
        object.__setattr__(self, "subject", subject)

    def state(self, now_ms: int, warn_ms: int = 0) -> str:
        """``not_yet_valid``, ``expired``, ``expiring`` (valid, ends in less than
        ``warn_ms``) or ``valid`` at ``now_ms``."""
        if now_ms < self.not_before_ms:
            return "not_yet_valid"
        if now_ms > self.not_after_ms:
            return "expired"
        if self.not_after_ms - now_ms < warn_ms:
            return "expiring"
        return "valid"

    def describe(self, now_ms: int) -> str:
        """``CN=edge-1 2025-01-01T00:00:00Z .. 2099-12-31T23:59:59Z (27394 days left)``."""
        name = f"CN={self.subject}" if self.subject is not None else "(no CN)"
        window = f"{iso_utc(self.not_before_ms)} .. {iso_utc(self.not_after_ms)}"
        state = self.state(now_ms)
        if state == "not_yet_valid":
            note = f"not valid for {_days(self.not_before_ms - now_ms)} more days"
        elif state == "expired":
            note = f"expired {_days(now_ms - self.not_after_ms)} days ago"
        else:
            note = f"{(self.not_after_ms - now_ms) // _DAY_MS} days left"
        return f"{name} {window} ({note})"


def _days(ms: int) -> int:
    return max(1, -(-ms // _DAY_MS))


def _invalid(detail: str) -> ContractError:
    return ContractError("invalid_certificate", "$", detail)


def _tlv(data: bytes, offset: int, end: int) -> tuple[int, int, int]:
    """``(tag, value start, value end)`` of the DER TLV at ``offset`` inside ``[.., end)``."""
    if offset + 2 > end:
        raise _invalid("truncated TLV")
    tag = data[offset]
    if tag & 0x1F == 0x1F:
        raise _invalid("high tag number")
    first = data[offset + 1]
    start = offset + 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if count == 0:
            raise _invalid("indefinite length")
        if count > 4 or start + count > end:
            raise _invalid("length too long")
        length = int.from_bytes(data[start : start + count], "big")
        if data[start] == 0 or length < 0x80:
            raise _invalid("length not minimally encoded")
        start += count
    if start + length > end:
        raise _invalid("TLV overruns its parent")
    return tag, start, start + length


def _expect(data: bytes, offset: int, end: int, tag: int, what: str) -> tuple[int, int]:
    found, start, stop = _tlv(data, offset, end)
    if found != tag:
        raise _invalid(f"{what}: expected tag 0x{tag:02x}, found 0x{found:02x}")
    return start, stop


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def _month_days(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _time(data: bytes, offset: int, end: int, what: str) -> tuple[int, int]:
    """``(Unix ms, offset after)`` of the Time at ``offset``."""
    tag, start, stop = _tlv(data, offset, end)
    text = data[start:stop]
    if tag == _UTC_TIME and len(text) == 13:
        digits = text[:12]
    elif tag == _GENERALIZED_TIME and len(text) == 15:
        digits = text[:14]
    else:
        raise _invalid(f"{what}: not a UTCTime or GeneralizedTime of the RFC 5280 form")
    if text[-1:] != b"Z" or not digits.isdigit() or not digits.isascii():
        raise _invalid(f"{what}: not YY(YY)MMDDHHMMSSZ")
    if tag == _UTC_TIME:
        year = int(digits[:2])
        year += 2000 if year < 50 else 1900
        rest = digits[2:]
    else:
        year = int(digits[:4])
        rest = digits[4:]
    month, day, hour, minute, second = (int(rest[i : i + 2]) for i in range(0, 10, 2))
    if not (1 <= month <= 12 and 1 <= day <= _month_days(year, month) and hour < 24 and minute < 60
            and second < 60):
        raise _invalid(f"{what}: not a calendar date and time")
    seconds = ((_days_from_civil(year, month, day) * 24 + hour) * 60 + minute) * 60 + second
    return seconds * 1000, stop


def _common_name(data: bytes, start: int, end: int) -> str | None:
    """The first commonName of a Name, for display; None when absent or odd."""
    try:
        offset = start
        while offset < end:
            rdn_start, rdn_end = _expect(data, offset, end, _SET, "RDN")
            inner = rdn_start
            while inner < rdn_end:
                ava_start, ava_end = _expect(data, inner, rdn_end, _SEQUENCE, "attribute")
                oid_start, oid_end = _expect(data, ava_start, ava_end, _OID, "attribute type")
                tag, value_start, value_end = _tlv(data, oid_end, ava_end)
                if data[oid_start:oid_end] == _COMMON_NAME and tag in _STRINGS:
                    text = data[value_start:value_end].decode(_STRINGS[tag])
                    return "".join(c if c.isprintable() else "?" for c in text[:MAX_SUBJECT_CHARS])
                inner = ava_end
            offset = rdn_end
    except (ContractError, UnicodeDecodeError):
        return None
    return None


def _certificate(data: bytes, offset: int) -> tuple[CertificateValidity, int]:
    """Read the certificate at ``offset``; returns it and the offset after it."""
    end = len(data)
    cert_start, cert_end = _expect(data, offset, end, _SEQUENCE, "Certificate")
    tbs_start, tbs_end = _expect(data, cert_start, cert_end, _SEQUENCE, "tbsCertificate")
    after_tbs = tbs_end
    _, after_alg = _expect(data, after_tbs, cert_end, _SEQUENCE, "signatureAlgorithm")
    _, after_sig = _expect(data, after_alg, cert_end, _BIT_STRING, "signatureValue")
    if after_sig != cert_end:
        raise _invalid("bytes after the signature")
    cursor = tbs_start
    tag, version_start, version_end = _tlv(data, cursor, tbs_end)
    if tag == _VERSION:
        int_start, int_end = _expect(data, version_start, version_end, _INTEGER, "version")
        if int_end != version_end or data[int_start:int_end] not in (b"\x00", b"\x01", b"\x02"):
            raise _invalid("version is not v1, v2 or v3")
        cursor = version_end
    serial_start, cursor = _expect(data, cursor, tbs_end, _INTEGER, "serialNumber")
    if cursor == serial_start:
        raise _invalid("empty serialNumber")
    _, cursor = _expect(data, cursor, tbs_end, _SEQUENCE, "signature")
    _, cursor = _expect(data, cursor, tbs_end, _SEQUENCE, "issuer")
    validity_start, validity_end = _expect(data, cursor, tbs_end, _SEQUENCE, "validity")
    not_before, inner = _time(data, validity_start, validity_end, "notBefore")
    not_after, inner = _time(data, inner, validity_end, "notAfter")
    if inner != validity_end:
        raise _invalid("validity holds more than two times")
    subject_start, subject_end = _expect(data, validity_end, tbs_end, _SEQUENCE, "subject")
    cursor = subject_end
    while cursor < tbs_end:  # subjectPublicKeyInfo, unique ids, extensions: well-formed TLVs
        _, _, cursor = _tlv(data, cursor, tbs_end)
    if cursor == subject_end:
        raise _invalid("no subjectPublicKeyInfo")
    subject = _common_name(data, subject_start, subject_end)
    return CertificateValidity(not_before + 0, not_after + 999, subject), cert_end


def read_validity(der: bytes) -> CertificateValidity:
    """The window of exactly one DER certificate.

    ``not_after_ms`` ends at the last millisecond of the ``notAfter`` second.

    Raises:
        ContractError: ``invalid_certificate`` (with what is wrong in the detail).
    """
    if not isinstance(der, bytes):
        raise _invalid("not bytes")
    validity, end = _certificate(der, 0)
    if end != len(der):
        raise _invalid("bytes after the certificate")
    return validity


def _pem_blocks(data: bytes) -> list[bytes]:
    blocks: list[bytes] = []
    position = 0
    while True:
        begin = data.find(_PEM_BEGIN, position)
        if begin < 0:
            return blocks
        stop = data.find(_PEM_END, begin)
        if stop < 0:
            raise ContractError("invalid_pem", "$", "CERTIFICATE block without an END line")
        body = b"".join(data[begin + len(_PEM_BEGIN) : stop].split())
        try:
            blocks.append(binascii.a2b_base64(body, strict_mode=True))
        except (binascii.Error, ValueError):
            raise ContractError("invalid_pem", "$", "CERTIFICATE block is not base64") from None
        if len(blocks) > MAX_CERTIFICATES:
            raise ContractError("invalid_pem", "$", f"more than {MAX_CERTIFICATES} certificates")
        position = stop + len(_PEM_END)


def certificate_validities(data: bytes) -> list[CertificateValidity]:
    """Every certificate's window in a PEM file (``CERTIFICATE`` blocks, in order) or
    in concatenated DER certificates.

    Raises:
        ContractError: ``invalid_pem`` (no certificate, a broken block, too many) or
            ``invalid_certificate``.
    """
    if not isinstance(data, bytes):
        raise ContractError("invalid_pem", "$", "not bytes")
    if data.lstrip().startswith(b"-----BEGIN"):
        blocks = _pem_blocks(data)
        if not blocks:
            raise ContractError("invalid_pem", "$", "no CERTIFICATE block")
        return [read_validity(block) for block in blocks]
    windows: list[CertificateValidity] = []
    offset = 0
    while offset < len(data):
        if len(windows) == MAX_CERTIFICATES:
            raise ContractError("invalid_pem", "$", f"more than {MAX_CERTIFICATES} certificates")
        window, offset = _certificate(data, offset)
        windows.append(window)
    if not windows:
        raise ContractError("invalid_pem", "$", "no certificate")
    return windows


def iso_utc(ms: int) -> str:
    """``2099-12-31T23:59:59Z`` for Unix ``ms`` (seconds precision, proleptic Gregorian)."""
    seconds, _ = divmod(ms, 1000)
    days, rest = divmod(seconds, 86_400)
    # civil_from_days (H. Hinnant): the inverse of _days_from_civil.
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    hour, rest = divmod(rest, 3600)
    minute, second = divmod(rest, 60)
    return f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}Z"
