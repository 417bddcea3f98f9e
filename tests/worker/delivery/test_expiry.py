"""The pull-side certificate expiry warning (worker/delivery/expiry.py): one line a day through a
real runtime directory, with the dates read by the transport's DER reader from the
committed test certificates (tests/support/make_certs.py pinned their dates)."""

from __future__ import annotations

import pathlib

from qinglong_edge.worker.delivery.expiry import daily_expiry_warning
from qinglong_edge.worker.journal.runtime import RuntimeDirectory
from tests.support.tls_server import cert_path

DAY = 86_400_000
CLIENT_NOT_AFTER = 4_102_444_799_000  # Dec 31 23:59:59 2099 GMT


def _private(tmp_path: pathlib.Path, name: str, source: str) -> str:
    directory = tmp_path / "private"
    directory.mkdir(mode=0o700, exist_ok=True)
    path = directory / name
    path.write_bytes(cert_path(source).read_bytes())
    path.chmod(0o600)
    return str(path)


def test_one_line_a_day_within_fourteen_days(tmp_path: pathlib.Path) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    certificate = _private(tmp_path, "client.pem", "client.pem")
    near = (CLIENT_NOT_AFTER - 9 * DAY) // DAY * DAY + 1000  # early in a UTC day
    with RuntimeDirectory.open(str(tmp_path / "run"), str(tmp_path / "journal")) as runtime:
        first = daily_expiry_warning(certificate, [], runtime, near)
        assert first is not None and first.startswith("certificate_expiring: client certificate ")
        assert certificate in first and "(9 days left)" in first and "renewed client certificate" in first
        assert daily_expiry_warning(certificate, [], runtime, near + 60_000) is None  # later that day
        assert daily_expiry_warning(certificate, [], runtime, near + DAY) is not None  # the next day
        far = CLIENT_NOT_AFTER - 100 * DAY
        assert daily_expiry_warning(certificate, [], runtime, far + 5 * DAY) is None  # not within 14 days


def test_an_expired_certificate_says_so(tmp_path: pathlib.Path) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    certificate = _private(tmp_path, "expired.pem", "server-expired.pem")
    with RuntimeDirectory.open(str(tmp_path / "run"), str(tmp_path / "journal")) as runtime:
        line = daily_expiry_warning(certificate, [], runtime, CLIENT_NOT_AFTER - 1000 * DAY)
    assert line is not None and line.startswith("certificate_expired: ") and "refuse the TLS handshake" in line


def test_an_unreadable_certificate_is_left_to_the_transport(tmp_path: pathlib.Path) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    with RuntimeDirectory.open(str(tmp_path / "run"), str(tmp_path / "journal")) as runtime:
        assert daily_expiry_warning(str(tmp_path / "missing.pem"), [], runtime, CLIENT_NOT_AFTER) is None
