"""Bearer authentication and confirm through a real store (local-api.md 3.1-3.4)."""

from __future__ import annotations

import pathlib
import sqlite3
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong_edge.contracts.credentials import pepper_material_digest
from qinglong_edge.errors import StoreError
from qinglong_edge.local.identity import (
    AuthenticationUnavailable,
    Principal,
    Subject,
    activate_pepper_key,
    authenticate,
    confirm,
    create_subject,
    issue_credential,
    list_pepper_keys,
    register_pepper_key,
    retire_pepper_key,
    revoke_credential,
    set_subject_status,
)
from qinglong_edge.local.pepper import create_pepper, key_file_name, read_pepper
from tests.support.store import (
    AUTHORIZATION,
    CREDENTIAL_ID,
    MATERIAL_DIGEST,
    NOW,
    PEPPER_KEY_ID,
    SECRET,
    SECRET_DIGEST,
    USER,
    Provisioned,
    provision,
    write_pepper_file,
)


@pytest.fixture
def env(tmp_path: pathlib.Path) -> Iterator[Provisioned]:
    provisioned = provision(tmp_path / "db" / "local.db", tmp_path / "pepper")
    yield provisioned
    provisioned.store.close()


def _auth(env: Provisioned, values: list[str], now: int = NOW) -> Principal | None:
    return env.store.run(lambda c: authenticate(c, values, now, keyring_directory=env.keyring))


def test_the_spec_vector_authenticates_through_the_store(env: Provisioned) -> None:
    stored = env.store.run(lambda c: c.execute(
        'SELECT secret_digest FROM "QingLong3ApiCredentials" WHERE credential_id = ?', (CREDENTIAL_ID,)).fetchone())
    assert stored == (SECRET_DIGEST,)
    keys = env.store.run(list_pepper_keys)
    assert [(k.pepper_key_id, k.state, k.material_digest) for k in keys] == [(PEPPER_KEY_ID, "active", MATERIAL_DIGEST)]
    principal = _auth(env, [AUTHORIZATION])
    assert principal is not None
    assert principal.subject == USER
    assert principal.authentication_id == "local_credential:local-api-owner:1"
    assert principal.authenticated_at_ms == NOW
    assert principal.expires_at_ms == NOW + 60_000
    assert principal.assurance == "single_factor"
    fence = principal.credential_fence
    assert (fence.credential_id, fence.credential_version, fence.pepper_key_id) == (CREDENTIAL_ID, 1, PEPPER_KEY_ID)
    assert (fence.material_digest, fence.secret_digest) == (MATERIAL_DIGEST, SECRET_DIGEST)
    assert (fence.subject_type, fence.subject_id) == ("user", "local-api-user")
    assert SECRET not in repr(principal)


def test_principal_expiry_is_capped_by_the_credential(env: Provisioned) -> None:
    principal = _auth(env, [AUTHORIZATION], now=NOW + 86_400_000 - 1000)
    assert principal is not None and principal.expires_at_ms == NOW + 86_400_000


def test_service_subjects_get_service_assurance(tmp_path: pathlib.Path) -> None:
    env = provision(tmp_path / "local.db", tmp_path / "pepper", subject=Subject("api_app", "ci"))
    with env.store:
        principal = _auth(env, [AUTHORIZATION])
        assert principal is not None and principal.assurance == "service"


OTHER_SECRET = "QkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkI"  # canonical, but not the credential's


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([], id="no_header"),
        pytest.param([AUTHORIZATION, AUTHORIZATION], id="two_headers"),
        pytest.param(["bearer " + AUTHORIZATION[7:]], id="lowercase_scheme"),
        pytest.param(["Bearer  " + AUTHORIZATION[7:]], id="two_spaces"),
        pytest.param([AUTHORIZATION + " "], id="trailing_space"),
        pytest.param(["Basic dXNlcjpwYXNz"], id="basic"),
        pytest.param([f"Bearer ql3c_{CREDENTIAL_ID}_{OTHER_SECRET}"], id="wrong_secret"),
        pytest.param([f"Bearer ql3c_unknown-id_{SECRET}"], id="unknown_credential"),
        pytest.param([AUTHORIZATION[:-1] + "F"], id="non_canonical_last_character"),
        pytest.param([AUTHORIZATION[:-1]], id="42_character_secret"),
        pytest.param(["Bearer ql3c_" + "a" * 300 + "_" + SECRET], id="over_320_characters"),
        pytest.param([f"Bearer ql3w_{CREDENTIAL_ID}_{SECRET}"], id="worker_token"),
    ],
)
def test_rejects_bad_credentials_as_401(env: Provisioned, values: list[str]) -> None:
    assert _auth(env, values) is None


def test_rejects_a_revoked_credential(env: Provisioned) -> None:
    assert env.store.run(lambda c: revoke_credential(c, CREDENTIAL_ID)) == "revoked"
    assert env.store.run(lambda c: revoke_credential(c, CREDENTIAL_ID)) == "unchanged"
    assert _auth(env, [AUTHORIZATION]) is None


def test_rejects_an_expired_credential(env: Provisioned) -> None:
    assert _auth(env, [AUTHORIZATION], now=NOW + 86_400_000 - 1) is not None
    assert _auth(env, [AUTHORIZATION], now=NOW + 86_400_000) is None


def test_rejects_a_credential_not_yet_valid(env: Provisioned) -> None:
    material = read_pepper(env.keyring, PEPPER_KEY_ID)
    env.store.run(lambda c: issue_credential(
        c, credential_id=CREDENTIAL_ID, subject=USER, secret=SECRET, pepper=material,
        now_ms=NOW - 1000, not_before_at_ms=NOW + 5000, expires_at_ms=NOW + 10_000))
    assert _auth(env, [AUTHORIZATION], now=NOW + 4999) is None
    principal = _auth(env, [AUTHORIZATION], now=NOW + 5000)
    assert principal is not None and principal.credential_fence.credential_version == 2


def test_rejects_a_disabled_subject(env: Provisioned) -> None:
    assert env.store.run(lambda c: set_subject_status(c, USER, "disabled", NOW)) == "changed"
    assert _auth(env, [AUTHORIZATION]) is None
    env.store.run(lambda c: set_subject_status(c, USER, "active", NOW))
    assert _auth(env, [AUTHORIZATION]) is not None


def test_wrong_pepper_is_a_digest_mismatch(env: Provisioned) -> None:
    """The catalog and the file agree on another pepper: the HMAC differs -> 401."""
    other = b"QkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkI"
    write_pepper_file(pathlib.Path(env.keyring), PEPPER_KEY_ID, other)
    env.store.run(lambda c: c.execute(
        'UPDATE "QingLong3LocalOwnerPepperKeys" SET material_digest = ?, backup_digest = ?',
        (pepper_material_digest(other), pepper_material_digest(other))))
    assert _auth(env, [AUTHORIZATION]) is None


def test_a_retired_key_still_verifies_and_rotation_supersedes(env: Provisioned) -> None:
    new = create_pepper(env.keyring, "local-api-pepper-v2")
    env.store.run(lambda c: register_pepper_key(c, new, NOW))
    assert env.store.run(lambda c: activate_pepper_key(c, "local-api-pepper-v2", NOW)) == "activated"
    states = {k.pepper_key_id: k.state for k in env.store.run(list_pepper_keys)}
    assert states == {PEPPER_KEY_ID: "retired", "local-api-pepper-v2": "active"}
    generations = env.store.run(lambda c: c.execute(
        'SELECT generation, previous_pepper_key_id, active_pepper_key_id FROM "QingLong3LocalOwnerPepperActivations"'
        " ORDER BY generation").fetchall())
    assert generations == [(1, None, PEPPER_KEY_ID), (2, PEPPER_KEY_ID, "local-api-pepper-v2")]
    assert _auth(env, [AUTHORIZATION]) is not None  # bound to the retired key: still verifies
    # Rotation: version 2 bound to the new key; the old token no longer matches the latest version.
    new_secret = "Nzc3Nzc3Nzc3Nzc3Nzc3Nzc3Nzc3Nzc3Nzc3Nzc3Nzc"
    record = env.store.run(lambda c: issue_credential(
        c, credential_id=CREDENTIAL_ID, subject=USER, secret=new_secret, pepper=new,
        now_ms=NOW, expires_at_ms=NOW + 60_000_000))
    assert (record.version, record.pepper_key_id) == (2, "local-api-pepper-v2")
    assert _auth(env, [AUTHORIZATION]) is None
    principal = _auth(env, [f"Bearer ql3c_{CREDENTIAL_ID}_{new_secret}"])
    assert principal is not None and principal.credential_fence.pepper_key_id == "local-api-pepper-v2"
    assert env.store.run(lambda c: retire_pepper_key(c, "local-api-pepper-v2", NOW)) == "retired"
    assert _auth(env, [f"Bearer ql3c_{CREDENTIAL_ID}_{new_secret}"]) is not None


def test_a_missing_pepper_file_is_503(env: Provisioned) -> None:
    (pathlib.Path(env.keyring) / key_file_name(PEPPER_KEY_ID)).unlink()
    with pytest.raises(AuthenticationUnavailable) as info:
        _auth(env, [AUTHORIZATION])
    assert info.value.code == "authentication_unavailable"
    assert info.value.http_status == 503


def test_an_unsafe_pepper_file_is_503(env: Provisioned) -> None:
    (pathlib.Path(env.keyring) / key_file_name(PEPPER_KEY_ID)).chmod(0o644)
    with pytest.raises(AuthenticationUnavailable):
        _auth(env, [AUTHORIZATION])


def test_a_missing_pepper_binding_is_503(env: Provisioned) -> None:
    env.store.run(lambda c: c.execute('DELETE FROM "QingLong3ApiCredentialPepperBindings"'))
    with pytest.raises(AuthenticationUnavailable):
        _auth(env, [AUTHORIZATION])


def test_a_pepper_file_that_differs_from_the_catalog_is_503(env: Provisioned) -> None:
    write_pepper_file(pathlib.Path(env.keyring), PEPPER_KEY_ID, b"QkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkI")
    with pytest.raises(AuthenticationUnavailable):
        _auth(env, [AUTHORIZATION])


def test_a_pepper_key_that_is_not_active_or_retired_is_503(env: Provisioned) -> None:
    env.store.run(lambda c: c.execute(
        "UPDATE \"QingLong3LocalOwnerPepperKeys\" SET state = 'staged', activate_mutation_id = NULL,"
        " activated_at_ms = NULL"))
    with pytest.raises(AuthenticationUnavailable):
        _auth(env, [AUTHORIZATION])


def test_503_class_wins_over_a_non_canonical_secret(env: Provisioned) -> None:
    """The reference resolves the pepper before it computes the digest."""
    (pathlib.Path(env.keyring) / key_file_name(PEPPER_KEY_ID)).unlink()
    with pytest.raises(AuthenticationUnavailable):
        _auth(env, [AUTHORIZATION[:-1] + "F"])
    assert _auth(env, [f"Bearer ql3c_unknown-id_{SECRET}"]) is None  # unknown id: 401 before pepper


def test_a_storage_failure_is_503(env: Provisioned) -> None:
    conn = sqlite3.connect(":memory:")
    with pytest.raises(AuthenticationUnavailable):
        authenticate(conn, [AUTHORIZATION], NOW, keyring_directory=env.keyring)
    conn.close()


# -- confirm ---------------------------------------------------------------------------


def _principal(env: Provisioned) -> Principal:
    principal = _auth(env, [AUTHORIZATION])
    assert principal is not None
    return principal


def _confirm(env: Provisioned, principal: Principal, now: int = NOW + 10) -> None:
    env.store.run(lambda c: confirm(c, principal.token, principal.credential_fence, now, keyring_directory=env.keyring))


def test_confirm_accepts_an_unchanged_fence(env: Provisioned) -> None:
    _confirm(env, _principal(env))


def test_confirm_rejects_a_rotated_credential(env: Provisioned) -> None:
    principal = _principal(env)
    material = read_pepper(env.keyring, PEPPER_KEY_ID)
    # Same secret, new version: authenticates again, but the fence's version differs.
    env.store.run(lambda c: issue_credential(c, credential_id=CREDENTIAL_ID, subject=USER, secret=SECRET,
                                             pepper=material, now_ms=NOW, expires_at_ms=NOW + 86_400_000))
    with pytest.raises(AuthenticationUnavailable):
        _confirm(env, principal)


@pytest.mark.parametrize("change", ["revoke", "disable_subject", "remove_pepper", "expire"])
def test_confirm_rejects_any_change(env: Provisioned, change: str) -> None:
    principal = _principal(env)
    now = NOW + 10
    if change == "revoke":
        env.store.run(lambda c: revoke_credential(c, CREDENTIAL_ID))
    elif change == "disable_subject":
        env.store.run(lambda c: set_subject_status(c, USER, "disabled", NOW))
    elif change == "remove_pepper":
        (pathlib.Path(env.keyring) / key_file_name(PEPPER_KEY_ID)).unlink()
    else:
        now = NOW + 86_400_000
    with pytest.raises(AuthenticationUnavailable):
        _confirm(env, principal, now)


def test_confirm_rejects_a_changed_expiry(env: Provisioned) -> None:
    principal = _principal(env)
    env.store.run(lambda c: c.execute('UPDATE "QingLong3ApiCredentials" SET expires_at_ms = expires_at_ms + 1'))
    with pytest.raises(AuthenticationUnavailable):
        _confirm(env, principal)


# -- issuing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        pytest.param({"credential_id": "bad id"}, "invalid_input", id="credential_id_grammar"),
        pytest.param({"secret": SECRET[:-1] + "F"}, "invalid_input", id="non_canonical_secret"),
        pytest.param({"expires_at_ms": NOW - 60_000}, "invalid_input", id="expires_not_after_not_before"),
        pytest.param({"subject": Subject("user", "nobody")}, "not_found", id="unknown_subject"),
        pytest.param({"subject": Subject("system", "x")}, "invalid_input", id="system_subject"),
    ],
)
def test_rejects_a_bad_issue(env: Provisioned, kwargs: dict[str, object], code: str) -> None:
    material = read_pepper(env.keyring, PEPPER_KEY_ID)
    args: dict[str, object] = {
        "credential_id": "new-cred", "subject": USER, "secret": SECRET, "pepper": material,
        "now_ms": NOW - 60_000, "expires_at_ms": NOW,
    }
    args.update(kwargs)
    with pytest.raises(StoreError) as info:
        env.store.run(lambda c: issue_credential(c, **args))  # type: ignore[arg-type]
    assert info.value.code == code


def test_issue_requires_the_active_pepper_key(env: Provisioned) -> None:
    staged = create_pepper(env.keyring, "staged-key")
    env.store.run(lambda c: register_pepper_key(c, staged, NOW))
    with pytest.raises(StoreError) as info:
        env.store.run(lambda c: issue_credential(c, credential_id="x", subject=USER, secret=SECRET, pepper=staged,
                                                 now_ms=NOW, expires_at_ms=NOW + 1))
    assert info.value.code == "conflict"


def test_subject_creation_is_idempotent(env: Provisioned) -> None:
    assert env.store.run(lambda c: create_subject(c, Subject("agent", "bot"), NOW)) == "created"
    assert env.store.run(lambda c: create_subject(c, Subject("agent", "bot"), NOW)) == "existing"


@pytest.mark.parametrize(("kind", "ident"), [("robot", "x"), ("user", ""), ("user", "a\x00b"), ("user", "x" * 256)])
def test_rejects_a_bad_subject(kind: str, ident: str) -> None:
    with pytest.raises(StoreError) as info:
        Subject(kind, ident)
    assert info.value.code == "invalid_input"


@pytest.fixture(scope="module")
def shared_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provisioned]:
    base = tmp_path_factory.mktemp("auth")
    provisioned = provision(base / "local.db", base / "pepper")
    yield provisioned
    provisioned.store.close()


_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
header_values = st.lists(
    st.one_of(
        st.text(max_size=400),
        st.builds(
            lambda ident, secret: f"Bearer ql3c_{ident}_{secret}",
            st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}", fullmatch=True),
            st.text(alphabet=_B64, min_size=43, max_size=43),
        ),
    ),
    max_size=3,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=header_values)
def test_authentication_is_total_over_header_values(shared_env: Provisioned, values: list[str]) -> None:
    """Any header list is a principal (only the real token), None, or the 503 class: nothing else."""
    principal = _auth(shared_env, values)
    assert (principal is not None) == (values == [AUTHORIZATION])


# -- an unknown credential id costs what a known one costs (issue 17 item 6) ----------


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, ...]]:
    """Record the pepper reads and HMACs authenticate makes (the real functions run)."""
    from qinglong_edge.local import identity

    calls: list[tuple[object, ...]] = []
    real_read, real_digest = identity.read_pepper, identity.api_credential_digest

    def read(directory: str, key_id: str):  # type: ignore[no-untyped-def]
        calls.append(("read_pepper", key_id))
        return real_read(directory, key_id)

    def digest(pepper: bytes, credential_id: str, secret: str) -> str:
        value = real_digest(pepper, credential_id, secret)
        calls.append(("hmac", pepper, credential_id, value))
        return value

    monkeypatch.setattr(identity, "read_pepper", read)
    monkeypatch.setattr(identity, "api_credential_digest", digest)
    return calls


def test_an_unknown_credential_id_reads_the_pepper_and_computes_a_real_hmac(
    env: Provisioned, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qinglong_edge.contracts.credentials import api_credential_digest

    calls = _spy(monkeypatch)
    assert _auth(env, [f"Bearer ql3c_unknown-id_{OTHER_SECRET}"]) is None
    unknown = list(calls)
    calls.clear()
    assert _auth(env, [f"Bearer ql3c_{CREDENTIAL_ID}_{OTHER_SECRET}"]) is None
    known = list(calls)
    pepper = read_pepper(env.keyring, PEPPER_KEY_ID).pepper
    # The same work in the same order: the active key's file, then an HMAC keyed by it.
    assert unknown == [("read_pepper", PEPPER_KEY_ID),
                       ("hmac", pepper, "unknown-id", api_credential_digest(pepper, "unknown-id", OTHER_SECRET))]
    assert [call[0] for call in known] == [call[0] for call in unknown]
    assert known[1][1] == pepper


def test_an_unknown_id_is_401_with_a_dummy_hmac_when_the_keyring_is_broken(
    env: Provisioned, monkeypatch: pytest.MonkeyPatch
) -> None:
    (pathlib.Path(env.keyring) / key_file_name(PEPPER_KEY_ID)).unlink()
    calls = _spy(monkeypatch)
    assert _auth(env, [f"Bearer ql3c_unknown-id_{OTHER_SECRET}"]) is None  # never the 503 class
    assert [call[0] for call in calls] == ["read_pepper", "hmac"]
    assert calls[1][1] == bytes(32)
