"""The owner pepper keyring directory (local-api.md section 3.3).

Pepper material lives in files, never in the database; the database keeps only each
key's ``material_digest`` (:mod:`qinglong_edge.local.identity`). Rules, all enforced on
every read (a failure is the 503 ``authentication_unavailable`` class, never a 401):

* the directory is a real directory (not a symlink), mode exactly ``0700``, owned by the
  effective uid, and the process's real uid equals its effective uid;
* one file per key, named ``base64url(UTF-8 key id)`` without padding + ``.pepper``
  (``local-api-pepper-v1`` -> ``bG9jYWwtYXBpLXBlcHBlci12MQ.pepper``), opened
  ``O_NOFOLLOW`` relative to the directory descriptor;
* the file is regular, mode exactly ``0600``, owned by the effective uid, 32-256 bytes;
* its content is exactly the 43-character canonical unpadded base64url text of 32 bytes
  (``^[A-Za-z0-9_-]+$``, so a trailing newline is refused);
* ``material_digest`` = SHA-256(``qinglong.local-owner-pepper.summary.v1`` NUL file bytes)
  (:func:`qinglong_edge.contracts.credentials.pepper_material_digest`).

New key files are written atomically: a ``0600`` temporary file in the same directory,
written and fsynced, then published under its final name without ever replacing an
existing key (hard link, or rename where the file system has no hard links), then the
directory is fsynced.

Errors: :class:`PepperError` (a :class:`~qinglong_edge.errors.StoreError`) with code
``pepper_unavailable`` (missing or unreadable file or directory), ``unsafe_pepper``
(wrong type, mode, owner, size or content) or ``conflict`` (creating a key that exists).
Messages name paths and key ids, never material.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from qinglong_edge import filecheck
from qinglong_edge.contracts.credentials import decode_secret, encode_secret, pepper_material_digest
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.ids import CREDENTIAL_ID
from qinglong_edge.errors import StoreError

__all__ = [
    "PEPPER_SUFFIX",
    "PepperError",
    "PepperMaterial",
    "check_keyring_directory",
    "create_pepper",
    "ensure_keyring_directory",
    "key_file_name",
    "read_pepper",
]

PEPPER_SUFFIX = ".pepper"
MIN_FILE_BYTES = 32
MAX_FILE_BYTES = 256
_CONTENT = re.compile(rb"[A-Za-z0-9_-]+")


class PepperError(StoreError):
    """The pepper keyring cannot be used (see the module docstring for codes)."""

    code = "pepper_unavailable"
    http_status = 503


@dataclass(frozen=True, slots=True)
class PepperMaterial:
    """One verified pepper key.

    Attributes:
        key_id: the pepper key id (``[A-Za-z0-9][A-Za-z0-9._:-]{0,63}``).
        pepper: the 32 decoded bytes (the HMAC key); hidden from ``repr``.
        material_digest: 64 lowercase hex characters (section 3.3).
    """

    key_id: str
    pepper: bytes = field(repr=False)
    material_digest: str


def _check_key_id(key_id: str) -> None:
    if not isinstance(key_id, str) or CREDENTIAL_ID.fullmatch(key_id) is None:
        raise PepperError("pepper key id must match [A-Za-z0-9][A-Za-z0-9._:-]{0,63}", code="invalid_input")


def key_file_name(key_id: str) -> str:
    """``base64url(UTF-8 key id)`` without padding, plus ``.pepper``."""
    _check_key_id(key_id)
    return base64.urlsafe_b64encode(key_id.encode("utf-8")).rstrip(b"=").decode("ascii") + PEPPER_SUFFIX


def _check_process_uid() -> int:
    euid = os.geteuid()
    if os.getuid() != euid:
        raise PepperError("the pepper keyring needs real uid == effective uid", code="unsafe_pepper")
    return euid


def _check_directory_stat(directory: str, info: os.stat_result) -> None:
    problem = filecheck.stat_problem(info, directory, directory=True, mode=0o700)
    if problem is None:
        return
    if problem.kind in ("symlink", "not_directory"):
        raise PepperError(f"{directory}: the pepper keyring is not a real directory", code="unsafe_pepper")
    if problem.kind == "foreign_owner":
        raise PepperError(f"{directory}: the pepper keyring is owned by another user", code="unsafe_pepper")
    raise PepperError(
        f"{directory}: the pepper keyring must have mode 0700 (has {stat.S_IMODE(info.st_mode):04o})",
        code="unsafe_pepper",
    )


@contextlib.contextmanager
def _open_directory(directory: str) -> Iterator[int]:
    """Open and check the keyring directory; yields its descriptor."""
    _check_process_uid()
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        raise PepperError(
            f"{directory}: the pepper keyring directory is missing (run 'qinglong-edge admin init' first)"
        ) from None
    except OSError as exc:
        raise PepperError(f"{directory}: cannot inspect the pepper keyring ({exc.strerror})") from None
    _check_directory_stat(directory, info)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise PepperError(f"{directory}: cannot open the pepper keyring ({exc.strerror})") from None
    try:
        _check_directory_stat(directory, os.fstat(fd))  # the one we opened, not a swapped one
        yield fd
    finally:
        os.close(fd)


def check_keyring_directory(directory: str) -> None:
    """Verify the directory rules only.

    Raises:
        PepperError: ``pepper_unavailable`` (missing) or ``unsafe_pepper``.
    """
    with _open_directory(directory):
        pass


def ensure_keyring_directory(directory: str) -> bool:
    """Create the directory ``0700`` when missing (parents too), then verify it.

    Returns:
        ``True`` when it was created.

    Raises:
        PepperError: as :func:`check_keyring_directory`; an existing directory with a
            wrong mode is refused, not repaired.
    """
    created = False
    if not os.path.lexists(directory):
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            os.chmod(directory, 0o700)
        except OSError as exc:
            raise PepperError(f"{directory}: cannot create the pepper keyring ({exc.strerror})") from None
        created = True
    check_keyring_directory(directory)
    return created


def _parse_material(data: bytes, where: str) -> bytes:
    if _CONTENT.fullmatch(data) is None:
        raise PepperError(
            f"{where}: pepper file content must be base64url text only (no newline)", code="unsafe_pepper"
        )
    try:
        return decode_secret(data.decode("ascii"))
    except ContractError:
        raise PepperError(
            f"{where}: pepper file must hold the 43-character canonical base64url of 32 bytes",
            code="unsafe_pepper",
        ) from None


def read_pepper(directory: str, key_id: str) -> PepperMaterial:
    """Read and verify one key file; returns its material and digest.

    Raises:
        PepperError: ``pepper_unavailable`` (missing/unreadable), ``unsafe_pepper``.
    """
    name = key_file_name(key_id)
    where = os.path.join(directory, name)
    _check_process_uid()
    with _open_directory(directory) as dir_fd:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
        except FileNotFoundError:
            raise PepperError(f"{where}: pepper key file is missing") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise PepperError(f"{where}: pepper key file is a symlink", code="unsafe_pepper") from None
            raise PepperError(f"{where}: cannot open the pepper key file ({exc.strerror})") from None
        try:
            info = os.fstat(fd)
            problem = filecheck.stat_problem(info, where, directory=False, mode=0o600)
            if problem is not None and problem.kind == "not_file":
                raise PepperError(f"{where}: pepper key file is not a regular file", code="unsafe_pepper")
            if problem is not None and problem.kind == "foreign_owner":
                raise PepperError(f"{where}: pepper key file is owned by another user", code="unsafe_pepper")
            if problem is not None:
                raise PepperError(
                    f"{where}: pepper key file must have mode 0600 (has {stat.S_IMODE(info.st_mode):04o})",
                    code="unsafe_pepper",
                )
            if not MIN_FILE_BYTES <= info.st_size <= MAX_FILE_BYTES:
                raise PepperError(
                    f"{where}: pepper key file must be {MIN_FILE_BYTES}-{MAX_FILE_BYTES} bytes", code="unsafe_pepper"
                )
            data = os.read(fd, MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise PepperError(f"{where}: cannot read the pepper key file ({exc.strerror})") from None
        finally:
            os.close(fd)
    if not MIN_FILE_BYTES <= len(data) <= MAX_FILE_BYTES:
        raise PepperError(f"{where}: pepper key file changed size while read", code="unsafe_pepper")
    pepper = _parse_material(data, where)
    return PepperMaterial(key_id=key_id, pepper=pepper, material_digest=pepper_material_digest(data))


def create_pepper(
    directory: str,
    key_id: str,
    *,
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> PepperMaterial:
    """Generate a new 32-byte pepper and publish its key file atomically.

    Args:
        directory: the keyring directory (must already pass the directory rules).
        key_id: the new key's id.
        random_bytes: CSPRNG (tests may pin it).

    Raises:
        PepperError: ``conflict`` when the key file exists (it is never replaced),
            ``pepper_unavailable`` on I/O errors, ``unsafe_pepper`` for a bad directory.
    """
    name = key_file_name(key_id)
    text = encode_secret(random_bytes(32)).encode("ascii")
    where = os.path.join(directory, name)
    with _open_directory(directory) as dir_fd:
        if filecheck.exists_at(name, dir_fd):
            raise PepperError(f"{where}: pepper key file already exists", code="conflict")
        try:
            # Never replaces a key: link(), or rename() where there are no hard links.
            filecheck.publish_file(name, text, dir_fd=dir_fd, rename_without_links=True)
        except OSError as exc:
            step = filecheck.failed_step(exc)
            if isinstance(exc, FileExistsError) and step == "link":
                raise PepperError(f"{where}: pepper key file already exists", code="conflict") from None
            if step == "create":
                raise PepperError(f"{directory}: cannot create a pepper key file ({exc.strerror})") from None
            raise PepperError(f"{where}: cannot write the pepper key file ({exc.strerror})") from None
    return read_pepper(directory, key_id)

