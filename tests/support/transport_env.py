"""Worker-side files and a secret-leak guard for transport tests.

:class:`WorkerFiles` lays out what a configured worker has on disk -- a private (0700)
directory with the ``ql3w`` credential, the client chain and key (0600), and a trust
anchor directory -- and replaces files atomically (temp file + ``rename``) the way an
operator or a renewal job rotates them.

:class:`LeakGuard` proves the "no secret in any message" rule over a whole test: while
active it records every :class:`~qinglong_edge.errors.TransportError` *constructed*
(raised or not, chained or not) and every log record of any logger, and
:meth:`LeakGuard.check` fails if a credential secret or private key material written by
any :class:`WorkerFiles` appears in an error's ``str``/``repr``/``args``/formatted
traceback (causes included) or in a log line.
"""

from __future__ import annotations

import logging
import os
import pathlib
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from qinglong_edge.contracts.credentials import encode_secret
from qinglong_edge.errors import TransportError
from qinglong_edge.worker.ingress.transport import IngressTransport
from tests.support.tls_server import cert_path

SESSION_ID = "01890a5d-ac96-774b-bcce-b302099a8057"
OFFER_PATH = f"/api/v3/worker-ingress/workers/edge-1/sessions/{SESSION_ID}/offers"
OFFER_BODY = (
    b'{"workerGeneration":1,"offerId":"7d444840-9dc0-41dd-9df5-0e3b0a6d4f1b",'
    b'"leaseToken":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"}'
)
OFFER_CAP = 131_072

#: Every secret and key body any WorkerFiles wrote in this process.
WRITTEN_SECRETS: set[str] = set()


def new_secret() -> str:
    """A fresh canonical 43-character secret."""
    secret = encode_secret(os.urandom(32))
    WRITTEN_SECRETS.add(secret)
    return secret


def _key_body(pem: str) -> str:
    """The base64 lines of a PEM key, joined: what a leak of the key would show."""
    lines = [line for line in pem.splitlines() if line and not line.startswith("-----")]
    return lines[0] if lines else pem


class WorkerFiles:
    """Credential, client chain/key and anchors of one test worker, with safe modes."""

    def __init__(self, root: pathlib.Path, credential_id: str = "worker_primary") -> None:
        self.private = root / "worker-private"
        self.private.mkdir(mode=0o700)
        self.private.chmod(0o700)
        self.anchors_dir = root / "anchors"
        self.anchors_dir.mkdir(mode=0o755)
        self.anchors_dir.chmod(0o755)
        self.credential = self.private / "credential"
        self.certificate = self.private / "client.pem"
        self.key = self.private / "client.key"
        self.anchor = self.anchors_dir / "root-ca.pem"
        self.credential_id = credential_id
        self.secret = ""
        self.rotate_credential()
        self.install_client("client")
        self.set_anchor("root-ca")

    # -- atomic writers ------------------------------------------------------------------
    def replace(self, path: pathlib.Path, data: bytes, mode: int = 0o600) -> None:
        """Write ``data`` to a temp file beside ``path`` and rename it over ``path``."""
        temp = path.with_name(f".{path.name}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.chmod(temp, mode)
        os.replace(temp, path)

    def rotate_credential(self, credential_id: str | None = None) -> str:
        """A new secret (and optionally id) in the credential file; returns the token."""
        self.credential_id = credential_id or self.credential_id
        self.secret = new_secret()
        token = f"ql3w_{self.credential_id}_{self.secret}"
        self.replace(self.credential, token.encode() + b"\n")
        return token

    def install_client(self, identity: str) -> None:
        """Install ``<identity>.pem`` / ``.key`` from the committed certificates."""
        key = cert_path(f"{identity}.key").read_text()
        WRITTEN_SECRETS.add(_key_body(key))
        self.replace(self.certificate, cert_path(f"{identity}.pem").read_bytes())
        self.replace(self.key, key.encode())

    def set_anchor(self, *names: str) -> list[str]:
        """Anchor files for ``names`` (``root-ca``...); the first is ``self.anchor``."""
        paths = []
        for index, name in enumerate(names):
            path = self.anchor if index == 0 else self.anchors_dir / f"{name}.pem"
            self.replace(path, cert_path(f"{name}.pem").read_bytes(), 0o644)
            paths.append(str(path))
        self.anchor_paths = paths
        return paths

    @property
    def authorization(self) -> str:
        return f"Worker ql3w_{self.credential_id}_{self.secret}"

    def transport(self, origin: str, *, timeout_ms: int = 1000, **overrides: Any) -> IngressTransport:
        """An :class:`IngressTransport` over these files (``overrides`` replace arguments)."""
        arguments: dict[str, Any] = {
            "credential_file": str(self.credential),
            "certificate_file": str(self.certificate),
            "private_key_file": str(self.key),
            "trust_anchor_files": list(self.anchor_paths),
            "request_timeout_ms": timeout_ms,
        }
        arguments.update(overrides)
        return IngressTransport(origin, **arguments)


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class LeakGuard:
    """Records every TransportError made and every log line while active."""

    def __init__(self) -> None:
        self.errors: list[TransportError] = []
        self.collector = _Collector()
        self.collector.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def texts(self) -> Iterator[str]:
        for error in self.errors:
            yield str(error)
            yield repr(error)
            yield repr(error.args)
            yield repr(vars(error))
            yield "".join(traceback.format_exception(error))
        yield from self.collector.lines

    def check(self) -> None:
        """Fail if any written secret or key body appears in any recorded text."""
        for text in self.texts():
            for secret in WRITTEN_SECRETS:
                assert secret not in text, "a secret leaked into an error message or log line"


@contextmanager
def leak_guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[LeakGuard]:
    """Activate a :class:`LeakGuard` for the block, then :meth:`LeakGuard.check` it."""
    guard = LeakGuard()
    original = TransportError.__init__

    def recording_init(self: TransportError, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        guard.errors.append(self)

    monkeypatch.setattr(TransportError, "__init__", recording_init)
    root = logging.getLogger()
    previous_level = root.level
    root.addHandler(guard.collector)
    root.setLevel(logging.DEBUG)
    try:
        yield guard
    finally:
        root.removeHandler(guard.collector)
        root.setLevel(previous_level)
    guard.check()


def expect_error(code: str, call: Any, *args: Any, **kwargs: Any) -> TransportError:
    """Call ``call(*args, **kwargs)``; it must raise a TransportError with ``code``."""
    with pytest.raises(TransportError) as info:
        call(*args, **kwargs)
    assert info.value.code == code, f"expected {code}, got {info.value.code}: {info.value}"
    return info.value
