"""Credential material of the worker ingress client, re-read from files for every request.

Sources: offer-delivery.md section 1.2 (client chain and key 1 byte - 1 MiB, 1-8 trust
anchors, connections pooled per SHA-256 of the length-prefixed material) and 1.4 (the
``ql3w`` credential file; ``workerProductionCredentialProvider.ts``).

File rules (every violation is ``credentials_unavailable``; messages name the file and
the rule, never its content):

* credential, client certificate chain, private key -- *private files*: the parent
  directory is a real directory (not a symlink) with no group/other permission bits;
  the file is opened with ``O_NOFOLLOW`` (a symlink is refused), is a regular file with
  no group/other permission bits, and holds 1 byte - the limit (credential 256 bytes,
  certificate and key 1 MiB), checked on the open descriptor and again on the bytes read.
* trust anchors -- public but must not be replaceable by others (our decision; the
  reference takes them from a provider): the parent directory is not a symlink and not
  group/other writable; the file is opened ``O_NOFOLLOW``, is regular, not group/other
  writable, 1 byte - 1 MiB, and holds at least one PEM certificate (or one DER one).

Rotation: nothing is cached between requests except the TLS context of the last
material digest, so replacing a file atomically (write a temp file, ``rename``) takes
effect on the next request, and a new digest opens a new connection.

The credential is ``ql3w_<credentialId>_<secret>`` in ASCII with an optional single
trailing ``\\n``; it is parsed with :func:`qinglong_edge.contracts.credentials.parse_worker_token`,
which also requires the secret to be canonical base64url (the reference sends a
non-canonical one and gets a 503; we refuse it before sending).

Python cannot wipe ``bytes``; the material lives in ordinary objects until collected.
No ``repr`` shows it.
"""

from __future__ import annotations

import os
import ssl
import stat
from collections.abc import Sequence

from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.credentials import parse_worker_token
from qinglong_edge.contracts.digest import sha256
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.errors import TransportError
from qinglong_edge.filecheck import stat_problem, write_all

__all__ = [
    "MAX_CREDENTIAL_BYTES",
    "MAX_TLS_MATERIAL_BYTES",
    "Material",
    "build_context",
    "load_material",
]

MAX_CREDENTIAL_BYTES = 256
MAX_TLS_MATERIAL_BYTES = 1024 * 1024
#: TLS 1.2 cipher string whose only job is the security level: TLS 1.3 suites ignore
#: it, but level 2 rejects RSA/DH keys below 2048 bits and SHA-1 signatures in the
#: peer's chain, whatever default this Python was built with (Node's default, level
#: 1, would accept RSA-1024; we do not).
SECURITY_LEVEL_CIPHERS = "@SECLEVEL=2:ECDHE+AESGCM:ECDHE+CHACHA20"

_PRIVATE_BITS = 0o077
_WRITE_BITS = 0o022


def _unavailable(message: str) -> TransportError:
    return TransportError(message, code="credentials_unavailable")


class Material(Frozen):
    """What one request needs, read from the files just before it.

    Attributes:
        authorization: ``Worker ql3w_...`` header value.
        certificate: client certificate chain (PEM bytes).
        private_key: client private key (PEM bytes).
        anchors: trust anchors, one entry per configured file.
        digest: SHA-256 over the 4-byte big-endian length-prefixed certificate, key and
            anchors (the reference's pool key): equal digests may share a connection.
    """

    __slots__ = ("authorization", "certificate", "private_key", "anchors", "digest")  # noqa: RUF023 (field order)
    _repr_hidden = ("authorization", "certificate", "private_key", "anchors", "digest")

    authorization: str
    certificate: bytes
    private_key: bytes
    anchors: tuple[bytes, ...]
    digest: bytes

    def __init__(
        self,
        authorization: str,
        certificate: bytes,
        private_key: bytes,
        anchors: tuple[bytes, ...],
        digest: bytes,
    ) -> None:
        _set = object.__setattr__
        _set(self, "authorization", authorization)
        _set(self, "certificate", certificate)
        _set(self, "private_key", private_key)
        _set(self, "anchors", anchors)
        _set(self, "digest", digest)


def _check_parent(path: str, forbidden: int, what: str) -> None:
    parent = os.path.dirname(path) or "/"
    try:
        info = os.lstat(parent)
    except OSError as exc:
        raise _unavailable(f"{what} {path}: parent directory unavailable ({exc.strerror})") from None
    problem = stat_problem(info, parent, directory=True, forbidden=forbidden, owner=False)  # root may own it
    if problem is None:
        return
    if problem.kind == "symlink":
        raise _unavailable(f"{what} {path}: parent directory is a symlink")
    if problem.kind == "not_directory":
        raise _unavailable(f"{what} {path}: parent is not a directory")
    raise _unavailable(  # loose_mode
        f"{what} {path}: parent directory mode {stat.S_IMODE(info.st_mode):04o} has forbidden group/other bits"
    )


def read_guarded_file(path: str, max_bytes: int, forbidden: int, what: str) -> bytes:
    """Read ``path`` under the rules of the module docstring.

    Args:
        forbidden: permission bits that must be clear on the file and its parent
            (``0o077`` for private files, ``0o022`` for trust anchors).
        what: the file's role for messages (``credential file``).

    Raises:
        TransportError: ``credentials_unavailable``.
    """
    _check_parent(path, forbidden, what)
    try:
        # O_NONBLOCK: opening a FIFO planted at the path must not block; it is then
        # refused as not regular.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        if os.path.islink(path):
            raise _unavailable(f"{what} {path}: is a symlink") from None
        raise _unavailable(f"{what} {path}: cannot open ({exc.strerror})") from None
    try:
        data = _read_checked(fd, path, max_bytes, forbidden, what)
    finally:
        os.close(fd)
    return data


def _read_checked(fd: int, path: str, max_bytes: int, forbidden: int, what: str) -> bytes:
    try:
        info = os.fstat(fd)
    except OSError as exc:
        raise _unavailable(f"{what} {path}: cannot stat ({exc.strerror})") from None
    problem = stat_problem(info, path, directory=False, forbidden=forbidden, owner=False)
    if problem is not None and problem.kind == "not_file":
        raise _unavailable(f"{what} {path}: not a regular file")
    if problem is not None:
        raise _unavailable(f"{what} {path}: mode {stat.S_IMODE(info.st_mode):04o} has forbidden group/other bits")
    if not 1 <= info.st_size <= max_bytes:
        raise _unavailable(f"{what} {path}: size {info.st_size} outside 1-{max_bytes} bytes")
    chunks: list[bytes] = []
    total = 0
    while total <= max_bytes:
        # Ask for what fstat promised (+1 to see growth or EOF), not for the cap: os.read
        # allocates the whole request up front (1 MiB per file per request otherwise).
        # A file that grew past it is read in cap-sized requests, as before.
        want = info.st_size + 1 - total if total <= info.st_size else max_bytes + 1 - total
        want = min(want, max_bytes + 1 - total)
        try:
            chunk = os.read(fd, want)
        except OSError as exc:
            raise _unavailable(f"{what} {path}: cannot read ({exc.strerror})") from None
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    data = b"".join(chunks)
    if not 1 <= len(data) <= max_bytes:
        raise _unavailable(f"{what} {path}: changed while read (size outside 1-{max_bytes} bytes)")
    return data


def read_authorization(path: str) -> str:
    """The ``Authorization`` value from the private credential file at ``path``.

    Raises:
        TransportError: ``credentials_unavailable`` (file rules, grammar, non-canonical
            secret). The message never contains the token.
    """
    data = read_guarded_file(path, MAX_CREDENTIAL_BYTES, _PRIVATE_BITS, "credential file")
    if data.endswith(b"\n"):
        data = data[:-1]
    if not data.isascii() or b"\n" in data:
        raise _unavailable(f"credential file {path}: not a single ASCII ql3w token line")
    try:
        token = parse_worker_token(data.decode("ascii"))
    except ContractError as exc:
        reason = "non-canonical secret" if exc.code == "non_canonical_secret" else "not a ql3w token"
        raise _unavailable(f"credential file {path}: {reason}") from None
    return token.authorization()


def _digest(parts: Sequence[bytes]) -> bytes:
    hasher = sha256()  # built-in SHA-2 (contracts.digest): no hashlib import for a pull
    for part in parts:
        hasher.update(len(part).to_bytes(4, "big"))
        hasher.update(part)
    return hasher.digest()


def load_material(
    credential_file: str, certificate_file: str, private_key_file: str, trust_anchor_files: Sequence[str]
) -> Material:
    """Read every file for one request.

    Raises:
        TransportError: ``credentials_unavailable``.
    """
    certificate = read_guarded_file(certificate_file, MAX_TLS_MATERIAL_BYTES, _PRIVATE_BITS, "certificate file")
    private_key = read_guarded_file(private_key_file, MAX_TLS_MATERIAL_BYTES, _PRIVATE_BITS, "private key file")
    anchors = tuple(
        read_guarded_file(path, MAX_TLS_MATERIAL_BYTES, _WRITE_BITS, "trust anchor file")
        for path in trust_anchor_files
    )
    authorization = read_authorization(credential_file)
    return Material(
        authorization=authorization,
        certificate=certificate,
        private_key=private_key,
        anchors=anchors,
        digest=_digest((certificate, private_key, *anchors)),
    )


def _no_password() -> bytes:
    # An encrypted key must fail, never prompt on the terminal.
    return b""


def _load_chain_from_memory(context: ssl.SSLContext, certificate: bytes, private_key: bytes) -> None:
    """``load_cert_chain`` needs paths: hand OpenSSL the exact bytes we checked.

    Each blob goes into an anonymous memory file (``memfd_create``) read through
    ``/proc/self/fd``; nothing touches the disk and the configured path cannot be
    swapped between our checks and OpenSSL's read.
    """
    fds: list[int] = []
    try:
        for blob in (certificate, private_key):
            fd = os.memfd_create("qinglong-edge-tls", os.MFD_CLOEXEC)
            fds.append(fd)
            write_all(fd, blob)
        context.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}", password=_no_password)
    finally:
        for fd in fds:
            os.close(fd)


def _memfd_usable() -> bool:
    return hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


def build_context(material: Material, certificate_file: str, private_key_file: str) -> ssl.SSLContext:
    """A client context for ``material``: TLS 1.3 only, hostname checked, only the anchors.

    Without ``memfd_create`` or ``/proc`` the chain is loaded from the configured paths
    and the files are re-read afterwards; a digest change (a rotation in between) is
    refused so the context never mixes generations.

    Raises:
        TransportError: ``credentials_unavailable`` when OpenSSL rejects an anchor, the
            chain or the key (including a key that does not match the certificate).
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.maximum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        context.set_ciphers(SECURITY_LEVEL_CIPHERS)
    except ssl.SSLError:
        raise TransportError("this OpenSSL refuses security level 2", code="invalid_configuration") from None
    for index, anchor in enumerate(material.anchors):
        try:
            if anchor.lstrip().startswith(b"-----BEGIN"):
                context.load_verify_locations(cadata=anchor.decode("ascii"))
            else:
                context.load_verify_locations(cadata=anchor)
        except (ssl.SSLError, ValueError, UnicodeDecodeError):
            raise _unavailable(f"trust anchor {index + 1}: no usable certificate") from None
    try:
        if _memfd_usable():
            _load_chain_from_memory(context, material.certificate, material.private_key)
        else:
            context.load_cert_chain(certificate_file, private_key_file, password=_no_password)
            again = (
                read_guarded_file(certificate_file, MAX_TLS_MATERIAL_BYTES, _PRIVATE_BITS, "certificate file"),
                read_guarded_file(private_key_file, MAX_TLS_MATERIAL_BYTES, _PRIVATE_BITS, "private key file"),
            )
            if again != (material.certificate, material.private_key):
                raise _unavailable("client certificate or key changed while loading; retry")
    except TransportError:
        raise
    except ssl.SSLError as exc:
        reason = exc.reason or type(exc).__name__
        raise _unavailable(f"client certificate chain or key rejected by OpenSSL ({reason})") from None
    except OSError as exc:
        raise _unavailable(f"client certificate chain or key unavailable ({exc.strerror})") from None
    return context
