"""Identifier grammars and generators (offer-delivery.md section 2.7, local-api.md).

Generators take their randomness and time as arguments where tests need to pin
them, and never import :mod:`uuid` (a separate OpenWrt package, ``python3-uuid``;
see packaging.md section 3.5).
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable

__all__ = [
    "API_ID",
    "CREDENTIAL_ID",
    "HEX64",
    "JOURNAL_OFFER_ID",
    "LEASE_TOKEN",
    "SESSION_ID",
    "UUID4",
    "UUID_ANY",
    "WORKER_ID",
    "new_lease_token",
    "new_uuid4",
    "new_uuid7",
]

#: workerId: ``[A-Za-z0-9][A-Za-z0-9._:-]*``, length 1-128.
WORKER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
#: Worker Session id: lowercase UUIDv7.
SESSION_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
#: Grammars only the Local API uses, compiled on first access of the module attribute
#: (PEP 562 ``__getattr__`` below): a ``pull`` imports this module but none of them,
#: and compiling them at import cost it ~0.3 ms. Each is an ``re.Pattern[str]``:
#:
#: * ``UUID4``: a lowercase UUIDv4 (audit event ids, generated offer ids);
#: * ``UUID_ANY``: any lowercase canonical UUID (task.start mutationId);
#: * ``CREDENTIAL_ID``: ql3w/ql3c credential id.
_LAZY_PATTERNS = {
    "UUID4": r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
    "UUID_ANY": r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "CREDENTIAL_ID": r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}",
}
#: Lease token: base64url alphabet, 32-128 characters.
LEASE_TOKEN = re.compile(r"[A-Za-z0-9_-]{32,128}")
#: An offerId that can also be a journal file name (section 3.1).
JOURNAL_OFFER_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
#: Local API id segment / mutationId: ``[A-Za-z0-9][A-Za-z0-9._:-]{0,127}``.
API_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
#: 64 lowercase hex characters (digests).
HEX64 = re.compile(r"[0-9a-f]{64}")


TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    UUID4: re.Pattern[str]
    UUID_ANY: re.Pattern[str]
    CREDENTIAL_ID: re.Pattern[str]
else:

    def __getattr__(name: str) -> re.Pattern[str]:
        pattern = _LAZY_PATTERNS.get(name)
        if pattern is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        compiled = globals()[name] = re.compile(pattern)
        return compiled


def _format_uuid(raw: bytes) -> str:
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def new_uuid4(random_bytes: Callable[[int], bytes] = os.urandom) -> str:
    """A lowercase random UUIDv4 (``crypto.randomUUID()``)."""
    raw = bytearray(random_bytes(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    return _format_uuid(bytes(raw))


def new_uuid7(now_ms: int, random_bytes: Callable[[int], bytes] = os.urandom) -> str:
    """A lowercase UUIDv7: 48-bit big-endian unix ms, version 7, variant ``10``.

    Args:
        now_ms: wall-clock milliseconds since the epoch, 0 <= now_ms < 2^48.
    """
    if not 0 <= now_ms < 2**48:
        raise ValueError("now_ms out of range for UUIDv7")
    raw = bytearray(now_ms.to_bytes(6, "big") + random_bytes(10))
    raw[6] = (raw[6] & 0x0F) | 0x70
    raw[8] = (raw[8] & 0x3F) | 0x80
    return _format_uuid(bytes(raw))


def new_lease_token(random_bytes: Callable[[int], bytes] = os.urandom) -> str:
    """base64url (no padding) of 32 CSPRNG bytes: exactly 43 characters."""
    return base64.urlsafe_b64encode(random_bytes(32)).rstrip(b"=").decode("ascii")
