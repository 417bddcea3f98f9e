"""SHA-256, HMAC-SHA256 and constant-time comparison without loading OpenSSL.

``hashlib``, ``hmac`` and ``secrets`` all import ``_hashlib``, which maps OpenSSL's
libcrypto (about 3.4 MiB of RSS here) into every process that touches a digest. The
Local API (``serve``) needs SHA-256 and HMAC-SHA256 only, and it must fit a router's
memory budget (issue 8: <= 28 MiB), so this module uses CPython's built-in SHA-2
implementation (``_sha2`` on 3.12+, ``_sha256`` on 3.11; both are standard-library
extension modules that every CPython build has unless built without them) and falls
back to :mod:`hashlib` when neither exists. ``pull`` loads OpenSSL anyway for TLS,
where this changes nothing.

HMAC is RFC 2104 with SHA-256 (64-byte block): the same bytes as ``hmac.new(key, msg,
hashlib.sha256)``; ``tests/contracts/test_digest.py`` checks it against :mod:`hmac` and
the RFC 4231 vectors.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any, Protocol

    class _Hash(Protocol):
        def update(self, data: bytes, /) -> None: ...

        def digest(self) -> bytes: ...

        def hexdigest(self) -> str: ...


__all__ = ["constant_time_equal", "hmac_sha256_hex", "random_hex", "sha256", "sha256_hex"]

_BLOCK = 64


def _constructor() -> Any:
    # Looked up by name: which private module exists depends on the CPython version.
    # __import__, not importlib.import_module: the same for top-level names, and a
    # ``pull`` need not import importlib's package for it.
    for module_name in ("_sha2", "_sha256"):
        try:
            return __import__(module_name).sha256
        except (ImportError, AttributeError):
            continue
    return __import__("hashlib").sha256


def _compare() -> Any:
    try:
        return __import__("_operator")._compare_digest
    except (ImportError, AttributeError):
        return __import__("hmac").compare_digest


_SHA256 = _constructor()
_COMPARE = _compare()


def sha256(data: bytes = b"") -> _Hash:
    """A SHA-256 hash object (``update``/``digest``/``hexdigest``), like ``hashlib.sha256``."""
    hasher: _Hash = _SHA256(data)
    return hasher


def sha256_hex(data: bytes) -> str:
    """Lowercase hex SHA-256 of ``data``."""
    return sha256(data).hexdigest()


def hmac_sha256_hex(key: bytes, message: bytes) -> str:
    """Lowercase hex HMAC-SHA256(key, message) (RFC 2104)."""
    if len(key) > _BLOCK:
        key = sha256(key).digest()
    key = key.ljust(_BLOCK, b"\x00")
    inner = sha256(bytes(b ^ 0x36 for b in key))
    inner.update(message)
    outer = sha256(bytes(b ^ 0x5C for b in key))
    outer.update(inner.digest())
    return outer.hexdigest()


def constant_time_equal(a: str | bytes, b: str | bytes) -> bool:
    """``hmac.compare_digest``: equal, in time independent of where they differ.

    ``str`` arguments must be ASCII (digests are hex), as for ``hmac.compare_digest``.
    """
    return bool(_COMPARE(a, b))


def random_hex(nbytes: int) -> str:
    """``secrets.token_hex`` without importing :mod:`secrets` (``os.urandom``, a CSPRNG)."""
    return os.urandom(nbytes).hex()
