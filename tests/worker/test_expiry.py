"""The pull-side client certificate expiry warning (worker/expiry.py): the validity read
from the committed test certificates (tests/support/make_certs.py pinned their dates),
the 14-day window, and once a day through a real runtime directory."""

from __future__ import annotations

import pathlib

import pytest

from qinglong_edge.worker.expiry import (
    WARNING_WINDOW_MS,
    certificate_not_after_ms,
    daily_expiry_warning,
    expiry_warning,
)
from qinglong_edge.worker.runtime import RuntimeDirectory
from tests.support.tls_server import cert_path

DAY = 86_400_000
CLIENT_NOT_AFTER = 4_102_444_799_000  # Dec 31 23:59:59 2099 GMT
EXPIRED_NOT_AFTER = 1_609_459_200_000  # Jan  1 00:00:00 2021 GMT


def test_reads_not_after_of_real_certificates() -> None:
    assert certificate_not_after_ms(cert_path("client.pem").read_bytes()) == CLIENT_NOT_AFTER
    assert certificate_not_after_ms(cert_path("server-expired.pem").read_bytes()) == EXPIRED_NOT_AFTER


@pytest.mark.parametrize("data", [b"", b"not a certificate", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"])
def test_unreadable_material_is_unknown_not_an_error(data: bytes) -> None:
    assert certificate_not_after_ms(data) is None


def test_the_warning_window() -> None:
    end = CLIENT_NOT_AFTER
    assert expiry_warning("/c.pem", end, end - WARNING_WINDOW_MS - 1) is None
    assert "expires in 14 day(s)" in str(expiry_warning("/c.pem", end, end - WARNING_WINDOW_MS))
    assert "expires in less than a day" in str(expiry_warning("/c.pem", end, end - 1))
    assert str(expiry_warning("/c.pem", end, end)).startswith("certificate_expired: ")
    assert "expired 3 day(s) ago" in str(expiry_warning("/c.pem", end, end + 3 * DAY + 5))
    assert str(expiry_warning("/c.pem", end, end - DAY)).startswith("certificate_expiring: the client certificate /c.pem")


def test_one_line_a_day(tmp_path: pathlib.Path) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    reads: list[str] = []

    def read(path: str) -> bytes:
        reads.append(path)
        return cert_path("client.pem").read_bytes()

    near = (CLIENT_NOT_AFTER - 9 * DAY) // DAY * DAY + 1000  # early in a UTC day
    with RuntimeDirectory.open(str(tmp_path / "run"), str(tmp_path / "journal")) as runtime:
        first = daily_expiry_warning("/etc/c.pem", read, runtime, near)
        assert first is not None and "expires in 9 day(s)" in first
        assert daily_expiry_warning("/etc/c.pem", read, runtime, near + 60_000) is None  # later that day
        assert len(reads) == 1  # read and decoded at most once a day
        assert daily_expiry_warning("/etc/c.pem", read, runtime, near + DAY) is not None
        far = CLIENT_NOT_AFTER - 100 * DAY
        assert daily_expiry_warning("/etc/c.pem", read, runtime, far + 5 * DAY) is None  # not within 14 days

        def broken(path: str) -> bytes:
            raise OSError("unreadable")

        assert daily_expiry_warning("/etc/c.pem", broken, runtime, far + 9 * DAY) is None
