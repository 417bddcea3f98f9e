"""Identity subjects, ``ql3c`` credentials, the pepper key catalog, authentication and confirm.

Sources: local-api.md sections 3.1-3.4 and 5.4 (tables ``QingLong3IdentitySubjects``,
``QingLong3ApiCredentials``, ``QingLong3ApiCredentialPepperBindings``,
``QingLong3LocalOwnerPepperKeys``, ``QingLong3LocalOwnerPepperActivations``).

Every function takes an open ``sqlite3.Connection`` and is meant to run as (part of) one
:meth:`qinglong_edge.local.store.Store.run` operation; writers open their own
``BEGIN IMMEDIATE`` transaction.

Authentication (the admission's phase 1 step 2, section 2.2)::

    principal = store.run(lambda c: authenticate(c, header_values, now_ms, keyring_directory=d))
    # None                      -> 401 authentication_required (audit authentication_rejected)
    # AuthenticationUnavailable -> 503 authentication_unavailable (audit authentication_unavailable)
    store.run(lambda c: confirm(c, principal.token, principal.credential_fence, now_ms, keyring_directory=d))
    # AuthenticationUnavailable -> 503 authentication_unavailable (not audited)

Any other :class:`~qinglong_edge.errors.StoreError` from ``store.run`` (``store_busy``,
``store_closed``) is the same 503 class. :func:`authenticate` returns ``None`` for: not
exactly one header, over 320 characters, not ``Bearer ql3c_<id>_<secret>``, unknown
credential id, a non-canonical secret, a digest mismatch, credential not ``active``,
subject not ``active``, ``not_before_at_ms > now``, ``expires_at_ms <= now``. It raises
:class:`AuthenticationUnavailable` for a storage error, an invalid stored record, a
missing pepper binding, a pepper key missing / not ``active|retired`` / without digest,
a missing or unsafe pepper file, or a file whose digest differs from the catalog. The
order follows the reference: resolve the credential, then its pepper, then the digest,
then the state and lifetime checks.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field

from qinglong_edge.contracts.credentials import ApiToken, api_credential_digest
from qinglong_edge.contracts.digest import constant_time_equal
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import MAX_INT32, MAX_SAFE_INTEGER, has_control
from qinglong_edge.contracts.ids import CREDENTIAL_ID, HEX64, UUID4, new_uuid4
from qinglong_edge.errors import StoreError
from qinglong_edge.local.pepper import PepperError, PepperMaterial, read_pepper
from qinglong_edge.local.store import read_transaction, write_transaction

__all__ = [
    "CREDENTIAL_SUBJECT_TYPES",
    "PRINCIPAL_TTL_MS",
    "SUBJECT_TYPES",
    "AuthenticationUnavailable",
    "CredentialFence",
    "CredentialRecord",
    "PepperKeyRecord",
    "Principal",
    "Subject",
    "activate_pepper_key",
    "active_pepper_key",
    "authenticate",
    "confirm",
    "create_subject",
    "get_pepper_key",
    "get_subject",
    "issue_credential",
    "list_pepper_keys",
    "presents_credential",
    "register_pepper_key",
    "retire_pepper_key",
    "revoke_credential",
    "set_subject_status",
]

SUBJECT_TYPES = ("user", "api_app", "mcp_client", "agent", "system", "worker")
#: Subject types a ``ql3c`` credential may belong to (section 3.4).
CREDENTIAL_SUBJECT_TYPES = ("user", "api_app", "mcp_client", "agent")
#: The Local API's principal lifetime cap (section 3.4).
PRINCIPAL_TTL_MS = 60_000
_AUTHORIZATION = re.compile(r"Bearer (ql3c_([A-Za-z0-9][A-Za-z0-9._:-]{0,63})_([A-Za-z0-9_-]{43}))")
_MAX_AUTHORIZATION_CHARS = 320
_MAX_TOKEN_CHARS = 256


class AuthenticationUnavailable(StoreError):
    """The 503 class of section 3.3: authentication could not be decided."""

    code = "authentication_unavailable"
    http_status = 503


@dataclass(frozen=True, slots=True)
class Subject:
    """A security subject: ``type`` in :data:`SUBJECT_TYPES`, ``id`` 1-255 characters."""

    type: str
    id: str

    def __post_init__(self) -> None:
        if self.type not in SUBJECT_TYPES:
            raise StoreError(f"subject type must be one of {', '.join(SUBJECT_TYPES)}", code="invalid_input")
        if not isinstance(self.id, str) or not 1 <= len(self.id) <= 255 or has_control(self.id):
            raise StoreError("subject id must be 1-255 characters without control characters", code="invalid_input")


@dataclass(frozen=True, slots=True)
class CredentialFence:
    """The credential fence of section 3.4, captured at authentication, re-checked by confirm."""

    credential_id: str
    credential_version: int
    pepper_key_id: str
    material_digest: str
    subject_type: str
    subject_id: str
    secret_digest: str = field(repr=False)
    not_before_at_ms: int
    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller (section 3.4).

    Attributes:
        subject: the credential's subject.
        authentication_id: ``local_credential:{credentialId}:{version}``.
        authenticated_at_ms / expires_at_ms: now, and ``min(credential expiry, now + 60 s)``.
        assurance: ``single_factor`` for ``user``, ``service`` otherwise.
        credential_fence: what :func:`confirm` re-checks.
        token: the parsed token, kept for :func:`confirm`; never in ``repr``.
    """

    subject: Subject
    authentication_id: str
    authenticated_at_ms: int
    expires_at_ms: int
    assurance: str
    credential_fence: CredentialFence
    token: ApiToken = field(repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class CredentialRecord:
    """One issued credential version (the token is returned separately, once)."""

    credential_id: str
    version: int
    state: str
    subject: Subject
    pepper_key_id: str
    created_at_ms: int
    not_before_at_ms: int
    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class PepperKeyRecord:
    """A row of ``QingLong3LocalOwnerPepperKeys``."""

    pepper_key_id: str
    state: str
    version: int
    material_digest: str | None
    registered_at_ms: int
    activated_at_ms: int | None
    retired_at_ms: int | None


def _now(now_ms: int) -> int:
    if not isinstance(now_ms, int) or isinstance(now_ms, bool) or not 0 <= now_ms <= MAX_SAFE_INTEGER:
        raise StoreError("clock value is not a safe non-negative integer", code="invalid_input")
    return now_ms


# -- subjects --------------------------------------------------------------------------


def get_subject(conn: sqlite3.Connection, subject: Subject) -> tuple[str, int] | None:
    """``(status, version)`` of a subject, or ``None``."""
    row = conn.execute(
        'SELECT status, version FROM "QingLong3IdentitySubjects" WHERE subject_type = ? AND subject_id = ?',
        (subject.type, subject.id),
    ).fetchone()
    return None if row is None else (str(row[0]), int(row[1]))


def create_subject(conn: sqlite3.Connection, subject: Subject, now_ms: int) -> str:
    """Create an ``active`` subject; returns ``created`` or ``existing`` (left as it is)."""
    now = _now(now_ms)
    with write_transaction(conn):
        if get_subject(conn, subject) is not None:
            return "existing"
        conn.execute(
            'INSERT INTO "QingLong3IdentitySubjects" (subject_type, subject_id, status, version, created_at_ms,'
            " updated_at_ms) VALUES (?, ?, 'active', 1, ?, ?)",
            (subject.type, subject.id, now, now),
        )
    return "created"


def set_subject_status(conn: sqlite3.Connection, subject: Subject, status: str, now_ms: int) -> str:
    """Set ``active``/``disabled`` (version + 1 on a change); ``changed`` or ``unchanged``.

    Raises:
        StoreError: ``not_found`` for an unknown subject, ``invalid_input`` for a bad status.
    """
    if status not in ("active", "disabled"):
        raise StoreError("subject status must be active or disabled", code="invalid_input")
    now = _now(now_ms)
    with write_transaction(conn):
        current = get_subject(conn, subject)
        if current is None:
            raise StoreError(f"subject {subject.type}:{subject.id} does not exist", code="not_found")
        if current[0] == status:
            return "unchanged"
        conn.execute(
            'UPDATE "QingLong3IdentitySubjects" SET status = ?, version = version + 1,'
            " updated_at_ms = max(updated_at_ms, ?) WHERE subject_type = ? AND subject_id = ?",
            (status, now, subject.type, subject.id),
        )
    return "changed"


# -- pepper key catalog ----------------------------------------------------------------



def _key_record(row: tuple[object, ...]) -> PepperKeyRecord:
    return PepperKeyRecord(
        pepper_key_id=str(row[0]),
        state=str(row[1]),
        version=int(row[2]),  # type: ignore[call-overload]
        material_digest=None if row[3] is None else str(row[3]),
        registered_at_ms=int(row[4]),  # type: ignore[call-overload]
        activated_at_ms=None if row[5] is None else int(row[5]),  # type: ignore[call-overload]
        retired_at_ms=None if row[6] is None else int(row[6]),  # type: ignore[call-overload]
    )


def get_pepper_key(conn: sqlite3.Connection, key_id: str) -> PepperKeyRecord | None:
    row = conn.execute(
        "SELECT pepper_key_id, state, version, material_digest, registered_at_ms, activated_at_ms, retired_at_ms"
        ' FROM "QingLong3LocalOwnerPepperKeys" WHERE pepper_key_id = ?',
        (key_id,),
    ).fetchone()
    return None if row is None else _key_record(row)


def active_pepper_key(conn: sqlite3.Connection) -> PepperKeyRecord | None:
    row = conn.execute(
        "SELECT pepper_key_id, state, version, material_digest, registered_at_ms, activated_at_ms, retired_at_ms"
        " FROM \"QingLong3LocalOwnerPepperKeys\" WHERE state = 'active'"
    ).fetchone()
    return None if row is None else _key_record(row)


def list_pepper_keys(conn: sqlite3.Connection) -> list[PepperKeyRecord]:
    rows = conn.execute(
        "SELECT pepper_key_id, state, version, material_digest, registered_at_ms, activated_at_ms, retired_at_ms"
        ' FROM "QingLong3LocalOwnerPepperKeys" ORDER BY registered_at_ms, pepper_key_id'
    ).fetchall()
    return [_key_record(row) for row in rows]


def _mutation(mutation_id: str | None) -> str:
    value = mutation_id or new_uuid4()
    if UUID4.fullmatch(value) is None and (len(value) != 36 or has_control(value)):
        raise StoreError("pepper mutation ids are 36-character UUIDs", code="invalid_input")
    return value


def register_pepper_key(
    conn: sqlite3.Connection, material: PepperMaterial, now_ms: int, *, mutation_id: str | None = None
) -> str:
    """Register a key file's digest as ``staged``; ``registered`` or ``existing``.

    Raises:
        StoreError: ``conflict`` when the id is registered with another digest.
    """
    now = _now(now_ms)
    mutation = _mutation(mutation_id)
    with write_transaction(conn):
        current = get_pepper_key(conn, material.key_id)
        if current is not None:
            if current.material_digest is None or not constant_time_equal(
                current.material_digest, material.material_digest
            ):
                raise StoreError(f"pepper key {material.key_id} is registered with other material", code="conflict")
            return "existing"
        conn.execute(
            'INSERT INTO "QingLong3LocalOwnerPepperKeys" (pepper_key_id, material_digest, backup_digest, state,'
            " version, register_mutation_id, registered_at_ms) VALUES (?, ?, ?, 'staged', 1, ?, ?)",
            # We keep no separate escrow copy: the operator's backup is a copy of the key
            # file itself, so its digest is the material digest.
            (material.key_id, material.material_digest, material.material_digest, mutation, now),
        )
    return "registered"


def activate_pepper_key(
    conn: sqlite3.Connection, key_id: str, now_ms: int, *, mutation_id: str | None = None
) -> str:
    """Make a ``staged`` key the only ``active`` one; the previous active key is ``retired``.

    Appends the next ``QingLong3LocalOwnerPepperActivations`` generation. Returns
    ``activated`` or ``existing`` (already active).

    Raises:
        StoreError: ``not_found``; ``conflict`` for a retired or recovery-required key.
    """
    now = _now(now_ms)
    mutation = _mutation(mutation_id)
    with write_transaction(conn):
        key = _registered_key(conn, key_id)
        if key.state == "active":
            return "existing"
        if key.state != "staged" or key.material_digest is None:
            raise StoreError(f"pepper key {key_id} is {key.state} and cannot be activated", code="conflict")
        previous = active_pepper_key(conn)
        if previous is not None:
            _retire(conn, previous.pepper_key_id, _mutation(None), now)
        conn.execute(
            "UPDATE \"QingLong3LocalOwnerPepperKeys\" SET state = 'active', version = version + 1,"
            " activate_mutation_id = ?, activated_at_ms = max(?, registered_at_ms) WHERE pepper_key_id = ?",
            (mutation, now, key_id),
        )
        generation = int(conn.execute(
            'SELECT coalesce(max(generation), 0) + 1 FROM "QingLong3LocalOwnerPepperActivations"'
        ).fetchone()[0])
        conn.execute(
            'INSERT INTO "QingLong3LocalOwnerPepperActivations" (generation, mutation_id, expected_generation,'
            " previous_pepper_key_id, active_pepper_key_id, material_digest, backup_digest, activated_at_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                generation, mutation, generation - 1,
                None if previous is None else previous.pepper_key_id,
                key_id, key.material_digest, key.material_digest, now,
            ),
        )
    return "activated"


def retire_pepper_key(conn: sqlite3.Connection, key_id: str, now_ms: int, *, mutation_id: str | None = None) -> str:
    """Retire the ``active`` key (it keeps verifying old credentials); ``retired``/``existing``.

    Raises:
        StoreError: ``not_found``; ``conflict`` for a key that was never active.
    """
    now = _now(now_ms)
    mutation = _mutation(mutation_id)
    with write_transaction(conn):
        key = _registered_key(conn, key_id)
        if key.state == "retired":
            return "existing"
        if key.state != "active":
            raise StoreError(f"pepper key {key_id} is {key.state} and cannot be retired", code="conflict")
        _retire(conn, key_id, mutation, now)
    return "retired"


def _registered_key(conn: sqlite3.Connection, key_id: str) -> PepperKeyRecord:
    key = get_pepper_key(conn, key_id)
    if key is None:
        raise StoreError(f"pepper key {key_id} is not registered", code="not_found")
    return key


def _retire(conn: sqlite3.Connection, key_id: str, mutation: str, now: int) -> None:
    conn.execute(
        "UPDATE \"QingLong3LocalOwnerPepperKeys\" SET state = 'retired', version = version + 1,"
        " retire_mutation_id = ?, retired_at_ms = max(?, activated_at_ms) WHERE pepper_key_id = ?",
        (mutation, now, key_id),
    )


# -- credentials -----------------------------------------------------------------------


def issue_credential(
    conn: sqlite3.Connection,
    *,
    credential_id: str,
    subject: Subject,
    secret: str,
    pepper: PepperMaterial,
    now_ms: int,
    expires_at_ms: int,
    not_before_at_ms: int | None = None,
) -> CredentialRecord:
    """Store the next version of ``credential_id``, bound to the active pepper key.

    A first issue creates version 1; issuing an existing id creates version n + 1, which
    supersedes the older ones (resolution always takes the highest version), i.e. a
    rotation. The caller builds the token ``ql3c_<credential_id>_<secret>`` and shows it
    once; only the HMAC digest is stored.

    Raises:
        StoreError: ``invalid_input`` (grammar, subject type, lifetime, non-canonical
            secret), ``not_found`` (subject missing), ``conflict`` (the pepper is not the
            catalog's active key, or its digest differs).
    """
    now = _now(now_ms)
    if CREDENTIAL_ID.fullmatch(credential_id or "") is None:
        raise StoreError("credential id must match [A-Za-z0-9][A-Za-z0-9._:-]{0,63}", code="invalid_input")
    if subject.type not in CREDENTIAL_SUBJECT_TYPES:
        raise StoreError(f"credentials belong to {', '.join(CREDENTIAL_SUBJECT_TYPES)} subjects", code="invalid_input")
    not_before = now if not_before_at_ms is None else _now(not_before_at_ms)
    expires = _now(expires_at_ms)
    if not not_before >= now or not expires > not_before:
        raise StoreError("credential lifetime must satisfy now <= notBefore < expires", code="invalid_input")
    try:
        digest = api_credential_digest(pepper.pepper, credential_id, secret)
    except ContractError:
        raise StoreError("credential secret is not canonical base64url of 32 bytes", code="invalid_input") from None
    with write_transaction(conn):
        status = get_subject(conn, subject)
        if status is None:
            raise StoreError(f"subject {subject.type}:{subject.id} does not exist", code="not_found")
        key = active_pepper_key(conn)
        if key is None or key.pepper_key_id != pepper.key_id or key.material_digest is None:
            raise StoreError(f"pepper key {pepper.key_id} is not the active key", code="conflict")
        if not constant_time_equal(key.material_digest, pepper.material_digest):
            raise StoreError(f"pepper key {pepper.key_id} file does not match the catalog", code="conflict")
        version = int(conn.execute(
            'SELECT coalesce(max(version), 0) + 1 FROM "QingLong3ApiCredentials" WHERE credential_id = ?',
            (credential_id,),
        ).fetchone()[0])
        if version > MAX_INT32:
            raise StoreError("credential version space exhausted", code="conflict")
        conn.execute(
            'INSERT INTO "QingLong3ApiCredentials" (credential_id, version, state, subject_type, subject_id,'
            " secret_digest, created_at_ms, not_before_at_ms, expires_at_ms) VALUES (?, ?, 'active', ?, ?, ?, ?, ?, ?)",
            (credential_id, version, subject.type, subject.id, digest, now, not_before, expires),
        )
        conn.execute(
            'INSERT INTO "QingLong3ApiCredentialPepperBindings" (credential_id, credential_version, pepper_key_id)'
            " VALUES (?, ?, ?)",
            (credential_id, version, pepper.key_id),
        )
    return CredentialRecord(credential_id, version, "active", subject, pepper.key_id, now, not_before, expires)


def revoke_credential(conn: sqlite3.Connection, credential_id: str) -> str:
    """Mark every version of ``credential_id`` ``revoked``; ``revoked`` or ``unchanged``.

    Raises:
        StoreError: ``not_found`` for an unknown id.
    """
    with write_transaction(conn):
        exists = conn.execute(
            'SELECT count(*), sum(state = \'active\') FROM "QingLong3ApiCredentials" WHERE credential_id = ?',
            (credential_id,),
        ).fetchone()
        if not exists[0]:
            raise StoreError(f"credential {credential_id} does not exist", code="not_found")
        if not exists[1]:
            return "unchanged"
        conn.execute(
            "UPDATE \"QingLong3ApiCredentials\" SET state = 'revoked' WHERE credential_id = ? AND state = 'active'",
            (credential_id,),
        )
    return "revoked"


# -- authentication --------------------------------------------------------------------


def _split_authorization(values: list[str]) -> ApiToken | None:
    if not isinstance(values, list) or len(values) != 1:
        return None
    value = values[0]
    if not isinstance(value, str) or len(value) > _MAX_AUTHORIZATION_CHARS:
        return None
    match = _AUTHORIZATION.fullmatch(value)
    if match is None or len(match.group(1)) > _MAX_TOKEN_CHARS:
        return None
    return ApiToken(match.group(2), match.group(3))


def presents_credential(authorization_values: list[str]) -> bool:
    """The request carries a credential: exactly one ``Authorization`` value of the
    ``Bearer ql3c_<id>_<secret>`` grammar (section 3.1; no store, no pepper). What the
    server and the budget of requests without a valid credential classify by
    (:mod:`qinglong_edge.local.budget`); whether it authenticates is another matter."""
    return _split_authorization(authorization_values) is not None


#: Compared against when the credential id is unknown (never a real digest: no secret maps to it
#: but the comparison costs the same).
_DUMMY_DIGEST = "0" * 64
#: The HMAC key of the dummy check when no usable active pepper key can be read.
_DUMMY_PEPPER = bytes(32)


def _dummy_check(key: PepperKeyRecord | None, token: ApiToken, now_ms: int, keyring_directory: str) -> None:
    """An unknown credential id costs what a known id with a wrong secret costs (issue 17
    item 6): a stand-in record bound to the active key (its catalog row was read in the
    same transaction) goes through the very checks of a known one: the record's
    normalization, the key file read and verified, the presented secret's HMAC, the
    constant-time compare with a dummy digest. The outcome is always a 401: should the
    keyring be unusable (the known path's 503 class), a real HMAC under a zero pepper is
    computed instead, so the cost stays close."""
    stand_in = (token.credential_id, 1, "active", "user", "unknown", _DUMMY_DIGEST, 0, 0, MAX_SAFE_INTEGER,
                "active", key.pepper_key_id if key is not None else "unknown")
    try:
        _verify(stand_in, key, token, now_ms, keyring_directory)
    except AuthenticationUnavailable:
        try:
            constant_time_equal(api_credential_digest(_DUMMY_PEPPER, token.credential_id, token.secret),
                                _DUMMY_DIGEST)
        except ContractError:
            pass  # a non-canonical secret: a known id computes no HMAC either


_RESOLVE = """
SELECT c.credential_id, c.version, c.state, c.subject_type, c.subject_id, c.secret_digest,
       c.created_at_ms, c.not_before_at_ms, c.expires_at_ms, s.status, b.pepper_key_id
FROM "QingLong3ApiCredentials" AS c
JOIN "QingLong3IdentitySubjects" AS s ON s.subject_type = c.subject_type AND s.subject_id = c.subject_id
LEFT JOIN "QingLong3ApiCredentialPepperBindings" AS b
  ON b.credential_id = c.credential_id AND b.credential_version = c.version
WHERE c.credential_id = ?
ORDER BY c.version DESC
LIMIT 1
"""


def _int(value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise AuthenticationUnavailable("a stored credential field is out of range")
    return value


def _text(value: object, pattern: re.Pattern[str] | None = None, max_length: int = 255) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= max_length or has_control(value):
        raise AuthenticationUnavailable("a stored credential field is invalid")
    if pattern is not None and pattern.fullmatch(value) is None:
        raise AuthenticationUnavailable("a stored credential field is invalid")
    return value


def _authenticate_token(
    conn: sqlite3.Connection, token: ApiToken, now_ms: int, keyring_directory: str
) -> Principal | None:
    try:
        with read_transaction(conn):
            row = conn.execute(_RESOLVE, (token.credential_id,)).fetchone()
            if row is None:
                # The same two reads as a known id: its key's catalog row (here the active key's).
                dummy_key = active_pepper_key(conn)
            else:
                pepper_key_id = row[10]
                if pepper_key_id is None:
                    raise AuthenticationUnavailable(f"credential {token.credential_id} has no pepper binding")
                key = get_pepper_key(conn, _text(pepper_key_id, CREDENTIAL_ID, 64))
    except sqlite3.Error:
        raise AuthenticationUnavailable("the credential store is unavailable") from None
    if row is None:
        _dummy_check(dummy_key, token, now_ms, keyring_directory)
        return None
    return _verify(row, key, token, now_ms, keyring_directory)


def _verify(
    row: tuple[object, ...], key: PepperKeyRecord | None, token: ApiToken, now_ms: int, keyring_directory: str
) -> Principal | None:
    """The checks of a resolved credential row (the order of the module docstring)."""
    (cred_id, version, state, subject_type, subject_id, stored_digest, created, not_before, expires,
     subject_status, pepper_key_id) = row
    fence_key_id = _text(pepper_key_id, CREDENTIAL_ID, 64)
    # Normalize the stored record: anything malformed is the 503 class, never a 401.
    _text(cred_id, CREDENTIAL_ID, 64)
    version = _int(version, 1, MAX_INT32)
    state = _text(state)
    if state not in ("active", "revoked") or subject_type not in CREDENTIAL_SUBJECT_TYPES:
        raise AuthenticationUnavailable("a stored credential field is invalid")
    subject = Subject(str(subject_type), _text(subject_id))
    stored_digest = _text(stored_digest, HEX64, 64)
    created = _int(created, 0, MAX_SAFE_INTEGER)
    not_before = _int(not_before, created, MAX_SAFE_INTEGER)
    expires = _int(expires, not_before + 1, MAX_SAFE_INTEGER)
    if subject_status not in ("active", "disabled"):
        raise AuthenticationUnavailable("a stored subject status is invalid")
    # Pepper: catalog key active or retired with a digest, file present, safe and matching.
    if key is None or key.state not in ("active", "retired") or key.material_digest is None:
        raise AuthenticationUnavailable(f"pepper key {fence_key_id} is not usable")
    try:
        material = read_pepper(keyring_directory, fence_key_id)
    except PepperError as exc:
        raise AuthenticationUnavailable(f"pepper key {fence_key_id}: {exc.code}") from None
    if not constant_time_equal(material.material_digest, key.material_digest):
        raise AuthenticationUnavailable(f"pepper key {fence_key_id} file does not match the catalog")
    try:
        presented = api_credential_digest(material.pepper, token.credential_id, token.secret)
    except ContractError:
        return None  # non-canonical secret: the digest cannot be computed, a mismatch
    if not constant_time_equal(presented, stored_digest):
        return None
    now = _now(now_ms)
    if state != "active" or subject_status != "active" or not_before > now or expires <= now:
        return None
    fence = CredentialFence(
        credential_id=token.credential_id,
        credential_version=version,
        pepper_key_id=fence_key_id,
        material_digest=key.material_digest,
        subject_type=subject.type,
        subject_id=subject.id,
        secret_digest=stored_digest,
        not_before_at_ms=not_before,
        expires_at_ms=expires,
    )
    return Principal(
        subject=subject,
        authentication_id=f"local_credential:{token.credential_id}:{version}",
        authenticated_at_ms=now,
        expires_at_ms=min(expires, now + PRINCIPAL_TTL_MS),
        assurance="single_factor" if subject.type == "user" else "service",
        credential_fence=fence,
        token=token,
    )


def authenticate(
    conn: sqlite3.Connection, authorization_values: list[str], now_ms: int, *, keyring_directory: str
) -> Principal | None:
    """Authenticate the raw ``Authorization`` header values of one request.

    Args:
        authorization_values: every ``Authorization`` header value, in order (two or
            more headers count as absent).
        now_ms: the admission clock (epoch ms).
        keyring_directory: the pepper keyring directory.

    Returns:
        The :class:`Principal`, or ``None`` for every 401 case (module docstring).

    Raises:
        AuthenticationUnavailable: every 503 case (module docstring).
    """
    token = _split_authorization(authorization_values)
    if token is None:
        return None
    return _authenticate_token(conn, token, now_ms, keyring_directory)


def confirm(
    conn: sqlite3.Connection, token: ApiToken, fence: CredentialFence, now_ms: int, *, keyring_directory: str
) -> None:
    """Re-authenticate ``token`` and require the identical credential fence (section 3.4).

    Raises:
        AuthenticationUnavailable: on any failure or difference (credential, version,
            pepper key, material digest, subject, secret digest, lifetime), including a
            token that no longer authenticates.
    """
    try:
        current = _authenticate_token(conn, token, now_ms, keyring_directory)
    except AuthenticationUnavailable:
        raise
    except StoreError as exc:
        raise AuthenticationUnavailable(f"confirm failed: {exc.code}") from None
    if current is None:
        raise AuthenticationUnavailable("the credential no longer authenticates")
    if current.credential_fence != fence:
        raise AuthenticationUnavailable("the credential fence changed since authentication")
