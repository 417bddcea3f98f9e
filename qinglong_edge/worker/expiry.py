"""The pull-side warning before the client certificate expires (issue 18 item 7).

``pull`` logs one line a day while the client certificate's ``notAfter`` is within
:data:`WARNING_WINDOW_MS` (14 days) or has passed, so an operator sees it before the
TLS handshake starts failing (``doctor`` shows the whole validity window). "Once a
day" is remembered in the runtime directory (:meth:`RuntimeDirectory.once_per_day`):
the certificate is read and decoded at most once per UTC day, the first cycle of the
day; a reboot may show the line once more.

The validity is read by :func:`certificate_not_after_ms`. Until the transport's pure
certificate reader exists (worker-transport), it asks CPython's own decoder
(``ssl._ssl._test_decode_cert``, the function behind ``SSLSocket.getpeercert``) through
an anonymous memory file; anything it cannot decode is None (no warning, never an
error: the handshake reports a broken certificate on its own terms). The function is
the only thing to swap.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from qinglong_edge.worker.runtime import RuntimeDirectory

__all__ = ["NOTICE_KEY", "WARNING_WINDOW_MS", "certificate_not_after_ms", "daily_expiry_warning", "expiry_warning"]

WARNING_WINDOW_MS = 14 * 86_400_000
NOTICE_KEY = "certificate-expiry-check"
_DAY_MS = 86_400_000


def certificate_not_after_ms(pem: bytes) -> int | None:
    """``notAfter`` of the first certificate in ``pem`` (wall ms), or None when unknown."""
    try:
        import ssl

        decode = ssl._ssl._test_decode_cert  # type: ignore[attr-defined]  # CPython's decoder; see module docstring
        fd = os.memfd_create("qinglong-edge-cert", os.MFD_CLOEXEC)
    except (ImportError, AttributeError, OSError):
        return None
    try:
        view = memoryview(pem)
        while view:
            view = view[os.write(fd, view):]
        info = decode(f"/proc/self/fd/{fd}")
        return int(ssl.cert_time_to_seconds(info["notAfter"])) * 1000
    except (OSError, ValueError, KeyError, TypeError, ssl.SSLError):
        return None
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def expiry_warning(path: str, not_after_ms: int, now_ms: int) -> str | None:
    """The warning line for a certificate ending at ``not_after_ms``, or None outside the window."""
    left = not_after_ms - now_ms
    if left > WARNING_WINDOW_MS:
        return None
    if left <= 0:
        days = -left // _DAY_MS
        return (f"certificate_expired: the client certificate {path} expired "
                f"{'today' if days == 0 else f'{days} day(s) ago'}: the cluster will refuse the TLS handshake; "
                "install a renewed certificate")
    days = left // _DAY_MS
    return (f"certificate_expiring: the client certificate {path} expires in "
            f"{'less than a day' if days == 0 else f'{days} day(s)'}: install a renewed certificate before then")


def daily_expiry_warning(path: str, read: Callable[[str], bytes], runtime: RuntimeDirectory,
                         now_ms: int) -> str | None:
    """The first cycle of each UTC day: read the certificate with ``read(path)`` (the
    transport's private-file rules) and return :func:`expiry_warning`'s line, else None."""
    if not runtime.once_per_day(NOTICE_KEY, now_ms):
        return None
    try:
        pem = read(path)
    except OSError:
        return None  # the request itself reports an unreadable certificate
    not_after = certificate_not_after_ms(pem)
    return None if not_after is None else expiry_warning(path, not_after, now_ms)
