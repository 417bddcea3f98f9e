"""The pull-side warning before a worker certificate expires (issue 18 item 7).

``pull`` logs one line a day while the client certificate (or a trust anchor) ends
within 14 days (:data:`~qinglong_edge.worker.ingress.certificates.PULL_WARN_MS`), has ended or
is not valid yet, so an operator sees it before the TLS handshake starts failing
(``doctor`` shows every validity window). "Once a day" is remembered in the runtime
directory (:meth:`RuntimeDirectory.once_per_day`): the files are read and their dates
decoded at most once per UTC day, the first cycle of the day; a reboot may show the
line once more that day. The dates come from the transport's DER reader
(:func:`qinglong_edge.worker.ingress.certificates.expiring_certificate`, which reads the files
with the transport's rules and never raises for an unreadable one).
"""

from __future__ import annotations

from collections.abc import Sequence

from qinglong_edge.worker.ingress.certificates import PULL_WARN_MS, CertificateWindow, expiring_certificate

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

__all__ = ["NOTICE_KEY", "daily_expiry_warning", "expiry_line"]

NOTICE_KEY = "certificate-expiry-check"
_CODES = {"expired": "certificate_expired", "not_yet_valid": "certificate_not_yet_valid",
          "expiring": "certificate_expiring"}


def expiry_line(window: CertificateWindow, now_ms: int) -> str:
    """``certificate_<state>: <role> <path> [<i>] CN=.. <window> (<N days left>): <remedy>``."""
    state = window.state(now_ms, PULL_WARN_MS)
    if state == "not_yet_valid":
        remedy = "check the device clock (NTP)"
    elif window.role == "client certificate":
        remedy = ("the cluster will refuse the TLS handshake; install a renewed certificate"
                  if state == "expired" else "install a renewed client certificate (and its key) before then")
    else:
        remedy = "replace the trust anchor with the cluster's current CA"
    return f"{_CODES.get(state, 'certificate_expiring')}: {window.describe(now_ms)}: {remedy}"


def daily_expiry_warning(certificate_file: str, trust_anchor_files: Sequence[str], runtime: RuntimeDirectory,
                         now_ms: int) -> str | None:
    """The first cycle of each UTC day: the line for the certificate that needs attention
    soonest (:func:`expiring_certificate`), else None."""
    if not runtime.once_per_day(NOTICE_KEY, now_ms):
        return None
    window = expiring_certificate(certificate_file, trust_anchor_files, now_ms)
    return None if window is None else expiry_line(window, now_ms)
