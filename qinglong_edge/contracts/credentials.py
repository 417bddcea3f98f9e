"""Credential token grammars and secret digests: ``ql3w`` (worker) and ``ql3c`` (Local API).

Sources: offer-delivery.md section 1.4 (``Worker ql3w_<credentialId>_<secret>``) and
local-api.md sections 3.1-3.3 (``Bearer ql3c_<credentialId>_<secret>``, pepper).

A secret is the *canonical* unpadded base64url text of exactly 32 bytes: 43
characters whose last one is in ``AEIMQUYcgkosw048`` so that decoding and re-encoding
round-trips. Secrets never appear in ``repr``/``str`` of the token objects or in
error messages.

ql3w credential ids: the reference's regex is ``[A-Za-z0-9][A-Za-z0-9._:-]{0,63}``,
but its own fixtures (and offer-delivery.md 1.4) use ``worker_primary``; the split is
unambiguous because the secret is always the last 43 characters after ``_``, so we
also accept ``_`` inside a ql3w credential id. ql3c ids never contain ``_``.
"""

from __future__ import annotations

import base64
import binascii
import re

from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.digest import hmac_sha256_hex, sha256_hex
from qinglong_edge.contracts.errors import ContractError

__all__ = [
    "ApiToken",
    "WorkerToken",
    "api_credential_digest",
    "decode_secret",
    "encode_secret",
    "parse_api_token",
    "parse_bearer",
    "parse_worker_authorization",
    "parse_worker_token",
    "pepper_material_digest",
    "worker_credential_digest",
]

_WORKER_TOKEN = re.compile(r"ql3w_([A-Za-z0-9][A-Za-z0-9_.:-]{0,63})_([A-Za-z0-9_-]{43})")
#: Compiled on first use (``re`` caches it): a ``pull`` never parses a ql3c token.
_API_TOKEN = r"ql3c_([A-Za-z0-9][A-Za-z0-9.:-]{0,63})_([A-Za-z0-9_-]{43})"  # noqa: S105 - a grammar, not a secret
WORKER_DIGEST_PREFIX = b"qinglong-worker-credential-v1\x00"
API_DIGEST_PREFIX = b"qinglong-api-credential-v1\x00"
PEPPER_SUMMARY_PREFIX = b"qinglong.local-owner-pepper.summary.v1\x00"
MAX_API_TOKEN_CHARS = 256
MAX_AUTHORIZATION_CHARS = 320


def decode_secret(text: str, path: str = "$") -> bytes:
    """Decode a canonical unpadded base64url text of exactly 32 bytes.

    Raises:
        ContractError: ``non_canonical_secret`` when it does not round-trip.
    """
    if not isinstance(text, str) or len(text) != 43 or not re.fullmatch(r"[A-Za-z0-9_-]{43}", text):
        raise ContractError("non_canonical_secret", path, "must be 43 base64url characters")
    try:
        raw = base64.urlsafe_b64decode(text + "=")
    except (binascii.Error, ValueError):
        raise ContractError("non_canonical_secret", path, "not base64url") from None
    if len(raw) != 32 or encode_secret(raw) != text:
        raise ContractError("non_canonical_secret", path, "not the canonical encoding of 32 bytes")
    return raw


def encode_secret(raw: bytes) -> str:
    """Unpadded base64url text of ``raw`` (43 characters for 32 bytes)."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


class WorkerToken(Frozen):
    """A parsed ``ql3w_<credentialId>_<secret>`` token. ``repr`` hides the secret."""

    __slots__ = ("credential_id", "secret")
    _repr_hidden = ("secret",)

    credential_id: str
    secret: str

    def __init__(self, credential_id: str, secret: str) -> None:
        object.__setattr__(self, "credential_id", credential_id)
        object.__setattr__(self, "secret", secret)

    @property
    def text(self) -> str:
        return f"ql3w_{self.credential_id}_{self.secret}"

    def authorization(self) -> str:
        """The ``Authorization`` header value: ``Worker ql3w_...``."""
        return "Worker " + self.text

    def __str__(self) -> str:
        return f"ql3w_{self.credential_id}_<redacted>"


class ApiToken(Frozen):
    """A parsed ``ql3c_<credentialId>_<secret>`` Bearer token. ``repr`` hides the secret."""

    __slots__ = ("credential_id", "secret")
    _repr_hidden = ("secret",)

    credential_id: str
    secret: str

    def __init__(self, credential_id: str, secret: str) -> None:
        object.__setattr__(self, "credential_id", credential_id)
        object.__setattr__(self, "secret", secret)

    @property
    def text(self) -> str:
        return f"ql3c_{self.credential_id}_{self.secret}"

    def __str__(self) -> str:
        return f"ql3c_{self.credential_id}_<redacted>"


def parse_worker_token(text: object) -> WorkerToken:
    """Parse a ql3w token (the credential file content without its newline).

    Raises:
        ContractError: ``invalid_token`` (grammar) or ``non_canonical_secret``. The
            message never contains the token.
    """
    if not isinstance(text, str) or not text.isascii():
        raise ContractError("invalid_token", "$", "not an ASCII ql3w token")
    match = _WORKER_TOKEN.fullmatch(text)
    if match is None:
        raise ContractError("invalid_token", "$", "does not match ql3w_<credentialId>_<secret>")
    decode_secret(match.group(2))
    return WorkerToken(match.group(1), match.group(2))


def parse_worker_authorization(value: object) -> WorkerToken:
    """Parse an ``Authorization: Worker ql3w_...`` header value (case-sensitive scheme)."""
    if not isinstance(value, str) or not value.startswith("Worker "):
        raise ContractError("invalid_token", "$", "scheme must be 'Worker '")
    return parse_worker_token(value[len("Worker ") :])


def parse_api_token(text: object) -> ApiToken:
    """Parse a ql3c token (at most 256 characters).

    Raises:
        ContractError: ``invalid_token`` or ``non_canonical_secret``.
    """
    if not isinstance(text, str) or not text.isascii() or len(text) > MAX_API_TOKEN_CHARS:
        raise ContractError("invalid_token", "$", "not a ql3c token")
    match = re.fullmatch(_API_TOKEN, text)
    if match is None:
        raise ContractError("invalid_token", "$", "does not match ql3c_<credentialId>_<secret>")
    decode_secret(match.group(2))
    return ApiToken(match.group(1), match.group(2))


def parse_bearer(values: list[str]) -> ApiToken:
    """Parse the raw ``Authorization`` header values of a Local API request.

    Exactly one header, at most 320 characters, ``Bearer `` (case-sensitive, one space)
    and a ql3c token (local-api.md section 3.1).

    Raises:
        ContractError: ``invalid_token`` for every violation (the API answers 401).
    """
    if len(values) != 1:
        raise ContractError("invalid_token", "$", "exactly one Authorization header is required")
    value = values[0]
    if len(value) > MAX_AUTHORIZATION_CHARS or not value.startswith("Bearer "):
        raise ContractError("invalid_token", "$", "Authorization must be 'Bearer ql3c_...'")
    return parse_api_token(value[len("Bearer ") :])


def worker_credential_digest(pepper: bytes, credential_id: str, secret: str) -> str:
    """HMAC-SHA256(pepper, prefix || credentialId || NUL || 32 secret bytes), lowercase hex.

    Args:
        pepper: the 32 decoded pepper bytes.
        secret: the canonical 43-character secret text.
    """
    message = WORKER_DIGEST_PREFIX + credential_id.encode("utf-8") + b"\x00" + decode_secret(secret)
    return hmac_sha256_hex(pepper, message)


def api_credential_digest(pepper: bytes, credential_id: str, secret: str) -> str:
    """local-api.md 3.2: HMAC-SHA256(pepper, ``qinglong-api-credential-v1`` NUL id NUL secret)."""
    message = API_DIGEST_PREFIX + credential_id.encode("utf-8") + b"\x00" + decode_secret(secret)
    return hmac_sha256_hex(pepper, message)


def pepper_material_digest(file_bytes: bytes) -> str:
    """local-api.md 3.3: SHA-256(``qinglong.local-owner-pepper.summary.v1`` NUL file bytes)."""
    return sha256_hex(PEPPER_SUMMARY_PREFIX + file_bytes)
