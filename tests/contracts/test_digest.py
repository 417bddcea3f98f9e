"""The OpenSSL-free SHA-256 / HMAC-SHA256 equal hashlib / hmac byte for byte."""

from __future__ import annotations

import hashlib
import hmac
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from qinglong_edge.contracts import digest
from tests.support.cli import REPO

# RFC 4231 test cases 1, 2 and 6 (key longer than the block).
RFC4231 = [
    (b"\x0b" * 20, b"Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    (b"Jefe", b"what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
    (b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First",
     "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
]


def test_rfc4231_vectors() -> None:
    for key, message, expected in RFC4231:
        assert digest.hmac_sha256_hex(key, message) == expected


@given(st.binary(max_size=200), st.binary(max_size=300))
def test_hmac_equals_the_stdlib(key: bytes, message: bytes) -> None:
    assert digest.hmac_sha256_hex(key, message) == hmac.new(key, message, hashlib.sha256).hexdigest()


@given(st.binary(max_size=500))
def test_sha256_equals_hashlib(data: bytes) -> None:
    assert digest.sha256_hex(data) == hashlib.sha256(data).hexdigest()


def test_constant_time_equal() -> None:
    assert digest.constant_time_equal("ab" * 32, "ab" * 32)
    assert not digest.constant_time_equal("ab" * 32, "ab" * 31 + "ac")
    assert not digest.constant_time_equal(b"a", b"ab")


def test_serve_path_does_not_load_openssl() -> None:
    """The Local API's import set holds no _hashlib/_ssl (libcrypto is ~3.4 MiB of RSS)."""
    code = (
        "import sys\n"
        "from qinglong_edge.cli import build_parser; build_parser(['serve'])\n"
        "import qinglong_edge.commands.serve, qinglong_edge.local.api, qinglong_edge.local.server\n"
        "import qinglong_edge.local.identity, qinglong_edge.execution.controller\n"
        "print(sorted(m for m in ('_hashlib', '_ssl', 'hashlib', 'hmac', 'secrets') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-I", "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
