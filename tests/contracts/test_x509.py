"""The strict DER reader of certificate validity windows (contracts/x509.py).

Checked three ways: against OpenSSL's own reading of every committed test certificate
(``openssl x509 -startdate -enddate``), against certificates hypothesis builds from
random dates and names (the encoder below is independent of the reader), and against
malformed input, where only ``ContractError`` may escape.
"""

from __future__ import annotations

import base64
import datetime
import pathlib
import ssl
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.x509 import (
    MAX_CERTIFICATES,
    CertificateValidity,
    certificate_validities,
    iso_utc,
    read_validity,
)
from tests.support.tls_server import CERTS

PEMS = sorted(path for path in CERTS.glob("*.pem"))
UTC = datetime.UTC


def _oracle(path: pathlib.Path) -> list[tuple[int, int]]:
    """(notBefore, notAfter) in Unix seconds of every certificate in a PEM file, by OpenSSL."""
    text = path.read_text(encoding="ascii")
    windows = []
    for block in text.split("-----END CERTIFICATE-----")[:-1]:
        pem = block[block.index("-----BEGIN CERTIFICATE-----"):] + "-----END CERTIFICATE-----\n"
        der = ssl.PEM_cert_to_DER_cert(pem)
        out = subprocess.run(["openssl", "x509", "-inform", "DER", "-noout", "-startdate", "-enddate"], input=der,
                             capture_output=True, check=True).stdout.decode()
        dates = dict(line.split("=", 1) for line in out.splitlines())
        windows.append((int(ssl.cert_time_to_seconds(dates["notBefore"])),
                        int(ssl.cert_time_to_seconds(dates["notAfter"]))))
    return windows


@pytest.mark.parametrize("path", PEMS, ids=lambda p: p.name)
def test_every_committed_certificate_matches_openssl(path: pathlib.Path) -> None:
    ours = certificate_validities(path.read_bytes())
    assert [(w.not_before_ms // 1000, w.not_after_ms // 1000) for w in ours] == _oracle(path)
    assert all(w.not_after_ms % 1000 == 999 for w in ours)  # through the last second


def test_subjects_and_dates_of_known_certificates() -> None:
    (leaf, intermediate) = certificate_validities((CERTS / "server-expired.pem").read_bytes())
    assert leaf.subject == "localhost" and intermediate.subject == "qinglong-edge test intermediate CA"
    assert (iso_utc(leaf.not_before_ms), iso_utc(leaf.not_after_ms)) == ("2020-01-01T00:00:00Z", "2021-01-01T00:00:00Z")
    (client,) = certificate_validities((CERTS / "client.pem").read_bytes())
    assert client.subject == "edge-1"
    # UTCTime before 2050, GeneralizedTime after (RFC 5280): the committed set has both.
    assert iso_utc(client.not_before_ms) == "2025-01-01T00:00:00Z"
    assert iso_utc(client.not_after_ms) == "2099-12-31T23:59:59Z"


def test_der_input_of_one_and_of_concatenated_certificates() -> None:
    pem = (CERTS / "server.pem").read_text()
    ders = [ssl.PEM_cert_to_DER_cert(block.strip() + "\n-----END CERTIFICATE-----\n")
            for block in pem.split("-----END CERTIFICATE-----")[:-1]]
    assert read_validity(ders[0]) == certificate_validities(pem.encode())[0]
    assert certificate_validities(b"".join(ders)) == certificate_validities(pem.encode())


def test_state_and_description() -> None:
    day = 86_400_000
    window = CertificateValidity(10 * day, 20 * day + 999, "edge-1")
    assert window.state(5 * day) == "not_yet_valid"
    assert window.state(10 * day) == "valid"
    assert window.state(15 * day, warn_ms=5 * day + 1000) == "expiring"
    assert window.state(15 * day, warn_ms=4 * day) == "valid"
    assert window.state(20 * day + 999) == "valid"
    assert window.state(20 * day + 1000) == "expired"
    assert window.describe(15 * day) == "CN=edge-1 1970-01-11T00:00:00Z .. 1970-01-21T00:00:00Z (5 days left)"
    assert "expired 2 days ago" in window.describe(22 * day + 1)
    assert "not valid for 5 more days" in window.describe(5 * day)
    assert "(no CN)" in CertificateValidity(0, 1, None).describe(0)


# -- an independent DER encoder for generated certificates ------------------------------


def _tlv(tag: int, value: bytes) -> bytes:
    length = len(value)
    if length < 0x80:
        return bytes([tag, length]) + value
    octets = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(octets)]) + octets + value


def _time(moment: datetime.datetime, generalized: bool) -> bytes:
    if generalized:
        return _tlv(0x18, moment.strftime("%Y%m%d%H%M%SZ").encode())
    return _tlv(0x17, moment.strftime("%y%m%d%H%M%SZ").encode())


def _name(common_name: str | None) -> bytes:
    rdns = [_tlv(0x31, _tlv(0x30, _tlv(0x06, b"\x55\x04\x0a") + _tlv(0x0C, b"org")))]
    if common_name is not None:
        rdns.append(_tlv(0x31, _tlv(0x30, _tlv(0x06, b"\x55\x04\x03") + _tlv(0x0C, common_name.encode()))))
    return _tlv(0x30, b"".join(rdns))


def _certificate(not_before: datetime.datetime, not_after: datetime.datetime, *, common_name: str | None = "x",
                 generalized: tuple[bool, bool] = (False, False), version: bytes | None = b"\x02",
                 serial: bytes = b"\x01\x02", extra_validity: bytes = b"", times: bytes | None = None) -> bytes:
    algorithm = _tlv(0x30, _tlv(0x06, b"\x2a\x86\x48\xce\x3d\x04\x03\x02"))
    tbs = b""
    if version is not None:
        tbs += _tlv(0xA0, _tlv(0x02, version))
    tbs += _tlv(0x02, serial) + algorithm + _name("issuer")
    if times is None:
        times = _time(not_before, generalized[0]) + _time(not_after, generalized[1])
    tbs += _tlv(0x30, times + extra_validity)
    tbs += _name(common_name) + _tlv(0x30, algorithm + _tlv(0x03, b"\x00" + b"\x04" * 65))
    tbs += _tlv(0xA3, _tlv(0x30, b""))
    return _tlv(0x30, _tlv(0x30, tbs) + algorithm + _tlv(0x03, b"\x00" + b"\x30" * 70))


def _ms(moment: datetime.datetime) -> int:
    return int(moment.replace(tzinfo=UTC).timestamp()) * 1000


MOMENTS = st.datetimes(min_value=datetime.datetime(1950, 1, 1), max_value=datetime.datetime(2049, 12, 31, 23, 59, 59))
LATE = st.datetimes(min_value=datetime.datetime(1000, 1, 1), max_value=datetime.datetime(9999, 12, 31, 23, 59, 59))


@given(MOMENTS.map(lambda m: m.replace(microsecond=0)), MOMENTS.map(lambda m: m.replace(microsecond=0)),
       st.one_of(st.none(), st.text(min_size=1, max_size=40)))
@settings(max_examples=200, deadline=None)
def test_utctime_windows_round_trip(not_before: datetime.datetime, not_after: datetime.datetime,
                                    common_name: str | None) -> None:
    window = read_validity(_certificate(not_before, not_after, common_name=common_name))
    assert window.not_before_ms == _ms(not_before)
    assert window.not_after_ms == _ms(not_after) + 999
    shown = None if common_name is None else "".join(c if c.isprintable() else "?" for c in common_name)
    assert window.subject == shown


@given(LATE.map(lambda m: m.replace(microsecond=0)), LATE.map(lambda m: m.replace(microsecond=0)))
@settings(max_examples=200, deadline=None)
def test_generalized_time_windows_round_trip(not_before: datetime.datetime, not_after: datetime.datetime) -> None:
    window = read_validity(_certificate(not_before, not_after, generalized=(True, True), version=None))
    assert (window.not_before_ms, window.not_after_ms) == (_ms(not_before), _ms(not_after) + 999)
    assert iso_utc(window.not_before_ms) == not_before.strftime("%Y-%m-%dT%H:%M:%SZ").rjust(20, "0")


@given(st.integers(min_value=-62_135_596_800_000, max_value=253_402_300_799_999))
def test_iso_utc_is_datetime(ms: int) -> None:
    moment = datetime.datetime(1970, 1, 1, tzinfo=UTC) + datetime.timedelta(milliseconds=ms)
    assert iso_utc(ms) == f"{moment.year:04d}" + moment.strftime("-%m-%dT%H:%M:%SZ")


@given(st.binary(max_size=400))
@settings(max_examples=500)
def test_random_bytes_raise_only_contract_errors(data: bytes) -> None:
    for parse in (read_validity, certificate_validities):
        try:
            parse(data)
        except ContractError:
            pass


REAL = ssl.PEM_cert_to_DER_cert((CERTS / "client.pem").read_text())


@given(st.integers(min_value=0, max_value=len(REAL) - 1), st.integers(min_value=0, max_value=255))
@settings(max_examples=500)
def test_mutated_real_certificates_raise_only_contract_errors(position: int, value: int) -> None:
    mutated = REAL[:position] + bytes([value]) + REAL[position + 1:]
    try:
        read_validity(mutated)
    except ContractError:
        pass


@given(st.integers(min_value=1, max_value=len(REAL) - 1))
def test_every_truncation_is_refused(cut: int) -> None:
    with pytest.raises(ContractError):
        read_validity(REAL[:cut])


A = datetime.datetime(2030, 1, 1)
B = datetime.datetime(2031, 1, 1)


def _replace_time(cert: bytes, old: bytes, new: bytes) -> bytes:
    assert cert.count(old) == 1
    return cert.replace(old, new)


@pytest.mark.parametrize(
    ("der", "detail"),
    [
        (_certificate(A, B) + b"\x00", "bytes after the certificate"),
        (b"\x30\x80" + _certificate(A, B)[2:], "indefinite length"),
        (b"\x30\x81\x05" + b"\x00" * 5, "not minimally encoded"),
        (b"\x30\x85\x00\x00\x00\x00\x01\x00", "length too long"),
        (b"\x1f\x01\x00", "high tag number"),
        (_replace_time(_certificate(A, B), b"300101000000Z", b"300101000000+"), "not YY(YY)MMDDHHMMSSZ"),
        (_certificate(A, B, times=_tlv(0x17, b"3001010000Z") + _tlv(0x17, b"310101000000Z")), "RFC 5280 form"),
        (_replace_time(_certificate(A, B), b"\x17\x0d300101000000Z", b"\x17\x0d300230000000Z"), "calendar"),
        (_replace_time(_certificate(A, B), b"\x17\x0d300101000000Z", b"\x17\x0d301301000000Z"), "calendar"),
        (_replace_time(_certificate(A, B), b"\x17\x0d300101000000Z", b"\x17\x0d300101240000Z"), "calendar"),
        (_replace_time(_certificate(A, B), b"\x17\x0d300101000000Z", b"\x17\x0d300101000060Z"), "calendar"),
        (_replace_time(_certificate(A, B), b"\x17\x0d300101000000Z", b"\x17\x0d3001010000 0Z"), "YY(YY)"),
        (_certificate(A, B, times=_tlv(0x18, b"20300101000000.5Z") + _tlv(0x17, b"310101000000Z")),
         "RFC 5280 form"),
        (_certificate(A, B, version=b"\x03"), "version"),
        (_certificate(A, B, serial=b""), "empty serialNumber"),
        (_certificate(A, B, extra_validity=_tlv(0x17, b"300101000000Z")), "more than two times"),
    ],
    ids=["trailing", "indefinite", "non-minimal", "long-length", "high-tag", "offset-zone", "no-seconds",
         "feb-30", "month-13", "hour-24", "second-60", "space", "fraction", "v4", "empty-serial", "three-times"],
)
def test_strictness(der: bytes, detail: str) -> None:
    with pytest.raises(ContractError) as info:
        read_validity(der)
    assert info.value.code == "invalid_certificate"
    assert detail in info.value.detail


def test_a_leap_day_and_explicit_v1_are_read() -> None:
    window = read_validity(_certificate(datetime.datetime(2028, 2, 29, 12), B, version=b"\x00"))
    assert iso_utc(window.not_before_ms) == "2028-02-29T12:00:00Z"


def test_pem_errors() -> None:
    block = base64.encodebytes(_certificate(A, B)).decode()
    good = f"-----BEGIN CERTIFICATE-----\n{block}-----END CERTIFICATE-----\n".encode()
    assert len(certificate_validities(good)) == 1
    cases = {
        b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n": "no CERTIFICATE block",
        good.replace(b"-----END CERTIFICATE-----", b""): "without an END line",
        good.replace(block[:4].encode(), b"!!!!", 1): "not base64",
        good * (MAX_CERTIFICATES + 1): f"more than {MAX_CERTIFICATES}",
        b"": "no certificate",
    }
    for data, detail in cases.items():
        with pytest.raises(ContractError) as info:
            certificate_validities(data)
        assert info.value.code == "invalid_pem" and detail in info.value.detail, data[:40]
