"""Credential vectors: ql3c digest and pepper (local-api.md 3.2-3.3), ql3w (offer-delivery.md 1.4)."""

from __future__ import annotations

import pytest

from qinglong_edge.contracts.credentials import (
    api_credential_digest,
    decode_secret,
    encode_secret,
    parse_api_token,
    parse_bearer,
    parse_worker_authorization,
    pepper_material_digest,
    worker_credential_digest,
)
from qinglong_edge.contracts.errors import ContractError

SECRET = "UVFRUVFRUVFRUVFRUVFRUVFRUVFRUVFRUVFRUVFRUVE"
PEPPER = "UlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlI"
TOKEN = "ql3c_local-api-owner_" + SECRET
WORKER_AUTH = "Worker ql3w_worker_primary_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc"


def test_ql3c_secret_digest_vector() -> None:
    assert decode_secret(SECRET) == b"\x51" * 32
    assert decode_secret(PEPPER) == b"\x52" * 32
    token = parse_api_token(TOKEN)
    assert token.credential_id == "local-api-owner"
    digest = api_credential_digest(decode_secret(PEPPER), token.credential_id, token.secret)
    assert digest == "0d95c7c52761338308bc7c748d545bfaa3d1de1dcd51b10cfc7df1ed6ddf05dd"


def test_pepper_material_digest_vector() -> None:
    assert pepper_material_digest(PEPPER.encode("ascii")) == (
        "4410b694b98570577279001456c8ea6c5a49c514ced7f821c570b445491ef237")


def test_bearer_header_parses_the_vector_token() -> None:
    assert parse_bearer(["Bearer " + TOKEN]).secret == SECRET
    assert SECRET not in repr(parse_bearer(["Bearer " + TOKEN]))


BASE64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
CANONICAL_LAST = "AEIMQUYcgkosw048"


@pytest.mark.parametrize("last", [c for c in BASE64URL if c not in CANONICAL_LAST])
def test_rejects_a_non_canonical_last_character(last: str) -> None:
    with pytest.raises(ContractError) as info:
        parse_api_token("ql3c_local-api-owner_" + SECRET[:-1] + last)
    assert info.value.code == "non_canonical_secret"
    assert SECRET[:-1] not in str(info.value)


@pytest.mark.parametrize("last", list(CANONICAL_LAST))
def test_accepts_every_canonical_last_character(last: str) -> None:
    assert parse_api_token("ql3c_id_" + SECRET[:-1] + last).credential_id == "id"


@pytest.mark.parametrize(
    "values",
    [[], ["Bearer " + TOKEN] * 2, ["bearer " + TOKEN], ["Bearer  " + TOKEN], ["Bearer ql3w_" + TOKEN[5:]],
     ["Bearer ql3c_bad_id_" + SECRET]],
)
def test_rejects_a_bad_bearer_header(values: list[str]) -> None:
    with pytest.raises(ContractError) as info:
        parse_bearer(values)
    assert info.value.code in ("invalid_token", "non_canonical_secret")


def test_worker_primary_parses() -> None:
    token = parse_worker_authorization(WORKER_AUTH)
    assert token.credential_id == "worker_primary"
    assert decode_secret(token.secret) == b"\x07" * 32
    assert token.authorization() == WORKER_AUTH
    assert token.secret not in repr(token)
    assert len(worker_credential_digest(b"\x01" * 32, token.credential_id, token.secret)) == 64


def test_encode_secret_round_trips() -> None:
    assert encode_secret(b"\x07" * 32) == "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc"
