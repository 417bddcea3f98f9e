"""Validity windows of the worker's client certificate chain and trust anchors.

Issue 18 item 7 (ADR-0110 names certificate-expiry alerts as a remaining gate): nothing
looked at these dates until a handshake failed. ``doctor`` shows every window, warns
within :data:`DOCTOR_WARN_MS` of an end and fails once one is over or not yet begun;
the ``pull`` cycle calls :func:`expiring_certificate` (cheap: reads the same small
files the transport reads per request, parses a few hundred bytes of DER, no
OpenSSL) to log one warning a day within :data:`PULL_WARN_MS`.

Files are read with the transport's rules (:func:`~qinglong_edge.worker.ingress.material.read_guarded_file`:
private chain, anchors not group/other writable); the dates come from
:mod:`qinglong_edge.contracts.x509`.
"""

from __future__ import annotations

from collections.abc import Sequence

from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.x509 import CertificateValidity, certificate_validities
from qinglong_edge.errors import TransportError
from qinglong_edge.worker.ingress.material import MAX_TLS_MATERIAL_BYTES, read_guarded_file

__all__ = [
    "DOCTOR_WARN_MS",
    "PULL_WARN_MS",
    "CertificateWindow",
    "certificate_windows",
    "expiring_certificate",
    "file_windows",
]

_DAY_MS = 86_400_000
#: ``doctor`` warns when a certificate ends within 30 days.
DOCTOR_WARN_MS = 30 * _DAY_MS
#: ``pull`` logs its daily warning within 14 days.
PULL_WARN_MS = 14 * _DAY_MS


class CertificateWindow(Frozen):
    """One certificate of a configured file and its validity.

    Attributes:
        role: ``client certificate`` or ``trust anchor``.
        path: the file it was read from.
        index: its position in that file (0: the leaf of the client chain).
        validity: its window (:class:`~qinglong_edge.contracts.x509.CertificateValidity`).
    """

    __slots__ = ("role", "path", "index", "validity")  # noqa: RUF023 (field order)

    role: str
    path: str
    index: int
    validity: CertificateValidity

    def __init__(self, role: str, path: str, index: int, validity: CertificateValidity) -> None:
        _set = object.__setattr__
        _set(self, "role", role)
        _set(self, "path", path)
        _set(self, "index", index)
        _set(self, "validity", validity)

    def state(self, now_ms: int, warn_ms: int) -> str:
        """``valid``, ``expiring``, ``expired`` or ``not_yet_valid`` (see CertificateValidity)."""
        return self.validity.state(now_ms, warn_ms)

    def describe(self, now_ms: int) -> str:
        """``client certificate /p/client.pem [0] CN=edge-1 2025-.. .. 2099-.. (N days left)``."""
        return f"{self.role} {self.path} [{self.index}] {self.validity.describe(now_ms)}"


def file_windows(path: str, role: str, *, private: bool) -> list[CertificateWindow]:
    """The windows of every certificate in one file.

    Args:
        private: the client chain's rules (no group/other bits), else an anchor's
            (not group/other writable).

    Raises:
        TransportError: ``credentials_unavailable``: the file breaks its rules, or holds
            no certificate whose dates can be read (the message says which).
    """
    forbidden = 0o077 if private else 0o022
    what = "certificate file" if private else "trust anchor file"
    data = read_guarded_file(path, MAX_TLS_MATERIAL_BYTES, forbidden, what)
    try:
        validities = certificate_validities(data)
    except ContractError as exc:
        raise TransportError(f"{what} {path}: cannot read the validity dates ({exc.code}: {exc.detail})",
                             code="credentials_unavailable") from None
    return [CertificateWindow(role, path, index, validity) for index, validity in enumerate(validities)]


def certificate_windows(certificate_file: str, trust_anchor_files: Sequence[str]) -> list[CertificateWindow]:
    """The client chain's windows, then each anchor file's, in configuration order.

    Raises:
        TransportError: ``credentials_unavailable`` (see :func:`file_windows`).
    """
    windows = file_windows(certificate_file, "client certificate", private=True)
    for path in trust_anchor_files:
        windows.extend(file_windows(path, "trust anchor", private=False))
    return windows


def expiring_certificate(
    certificate_file: str, trust_anchor_files: Sequence[str], now_ms: int, within_ms: int = PULL_WARN_MS
) -> CertificateWindow | None:
    """The window that needs attention soonest, or None when all are fine.

    A certificate not yet valid or already expired comes first (the earliest end
    among them); else the one ending soonest if it ends within ``within_ms``. For the
    pull cycle: never raises for an unreadable file (the transport reports those
    with its own reason, ``credentials_unavailable``) -- the file is skipped.

    Args:
        now_ms: wall-clock Unix ms.
        within_ms: the warning horizon (default 14 days).
    """
    windows: list[CertificateWindow] = []
    files = [(certificate_file, "client certificate", True)] + [(p, "trust anchor", False) for p in trust_anchor_files]
    for path, role, private in files:
        try:
            windows.extend(file_windows(path, role, private=private))
        except TransportError:
            continue
    broken = [w for w in windows if w.state(now_ms, 0) in ("expired", "not_yet_valid")]
    if broken:
        return min(broken, key=lambda w: w.validity.not_after_ms)
    soon = [w for w in windows if w.state(now_ms, within_ms) == "expiring"]
    return min(soon, key=lambda w: w.validity.not_after_ms) if soon else None
