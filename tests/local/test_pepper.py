"""Pepper keyring directory rules (local-api.md 3.3) on real files."""

from __future__ import annotations

import os
import pathlib
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qinglong_edge.local.pepper import (
    PepperError,
    check_keyring_directory,
    create_pepper,
    ensure_keyring_directory,
    key_file_name,
    read_pepper,
)
from tests.support.store import MATERIAL_DIGEST, PEPPER_KEY_ID, PEPPER_TEXT, write_pepper_file


@pytest.fixture
def keyring(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "pepper"
    ensure_keyring_directory(str(path))
    return path


def test_key_file_name_is_base64url_of_the_key_id() -> None:
    assert key_file_name("local-api-pepper-v1") == "bG9jYWwtYXBpLXBlcHBlci12MQ.pepper"


def test_reads_the_spec_vector_and_its_material_digest(keyring: pathlib.Path) -> None:
    write_pepper_file(keyring, PEPPER_KEY_ID, PEPPER_TEXT)
    material = read_pepper(str(keyring), PEPPER_KEY_ID)
    assert material.pepper == b"\x52" * 32
    assert material.material_digest == MATERIAL_DIGEST
    assert "UlJS" not in repr(material) and "RRRR" not in repr(material)


def test_creates_the_directory_0700(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "a" / "pepper"
    assert ensure_keyring_directory(str(path)) is True
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert ensure_keyring_directory(str(path)) is False


@pytest.mark.parametrize(
    ("content", "mode"),
    [
        pytest.param(PEPPER_TEXT, 0o644, id="mode_0644"),
        pytest.param(PEPPER_TEXT, 0o400, id="mode_0400"),
        pytest.param(PEPPER_TEXT, 0o660, id="mode_0660"),
        pytest.param(PEPPER_TEXT + b"\n", 0o600, id="trailing_newline"),
        pytest.param(PEPPER_TEXT[:-1], 0o600, id="42_characters"),
        pytest.param(PEPPER_TEXT + b"A", 0o600, id="44_characters"),
        pytest.param(PEPPER_TEXT[:-1] + b"J", 0o600, id="non_canonical_last_character"),
        pytest.param(b"UlJS" * 7, 0o600, id="28_bytes_too_short"),
        pytest.param(b"A" * 257, 0o600, id="257_bytes_too_long"),
        pytest.param(PEPPER_TEXT[:-2] + b"=", 0o600, id="padding"),
        pytest.param(b" " + PEPPER_TEXT[1:], 0o600, id="leading_space"),
    ],
)
def test_rejects_a_bad_pepper_file(keyring: pathlib.Path, content: bytes, mode: int) -> None:
    write_pepper_file(keyring, PEPPER_KEY_ID, content, mode)
    with pytest.raises(PepperError) as info:
        read_pepper(str(keyring), PEPPER_KEY_ID)
    assert info.value.code == "unsafe_pepper"
    assert PEPPER_TEXT.decode() not in str(info.value)


def test_rejects_a_symlinked_pepper_file(keyring: pathlib.Path, tmp_path: pathlib.Path) -> None:
    target = tmp_path / "elsewhere.pepper"
    target.write_bytes(PEPPER_TEXT)
    target.chmod(0o600)
    (keyring / key_file_name(PEPPER_KEY_ID)).symlink_to(target)
    with pytest.raises(PepperError) as info:
        read_pepper(str(keyring), PEPPER_KEY_ID)
    assert info.value.code == "unsafe_pepper"


def test_rejects_a_pepper_path_that_is_a_directory(keyring: pathlib.Path) -> None:
    (keyring / key_file_name(PEPPER_KEY_ID)).mkdir(mode=0o600)
    with pytest.raises(PepperError) as info:
        read_pepper(str(keyring), PEPPER_KEY_ID)
    assert info.value.code == "unsafe_pepper"


def test_a_missing_pepper_file_is_unavailable(keyring: pathlib.Path) -> None:
    with pytest.raises(PepperError) as info:
        read_pepper(str(keyring), PEPPER_KEY_ID)
    assert info.value.code == "pepper_unavailable"


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o711, 0o500])
def test_rejects_a_keyring_directory_with_a_wrong_mode(keyring: pathlib.Path, mode: int) -> None:
    write_pepper_file(keyring, PEPPER_KEY_ID, PEPPER_TEXT)
    keyring.chmod(mode)
    try:
        with pytest.raises(PepperError) as info:
            read_pepper(str(keyring), PEPPER_KEY_ID)
        assert info.value.code == "unsafe_pepper"
        with pytest.raises(PepperError):
            ensure_keyring_directory(str(keyring))  # refused, not repaired
        assert stat.S_IMODE(keyring.stat().st_mode) == mode
    finally:
        keyring.chmod(0o700)


def test_rejects_a_symlinked_keyring_directory(keyring: pathlib.Path, tmp_path: pathlib.Path) -> None:
    write_pepper_file(keyring, PEPPER_KEY_ID, PEPPER_TEXT)
    link = tmp_path / "link"
    link.symlink_to(keyring)
    with pytest.raises(PepperError) as info:
        check_keyring_directory(str(link))
    assert info.value.code == "unsafe_pepper"


def test_a_missing_keyring_directory_is_unavailable(tmp_path: pathlib.Path) -> None:
    with pytest.raises(PepperError) as info:
        read_pepper(str(tmp_path / "nope"), PEPPER_KEY_ID)
    assert info.value.code == "pepper_unavailable"


@pytest.mark.root
@pytest.mark.parametrize("what", ["file", "directory"])
def test_rejects_a_pepper_owned_by_another_user(keyring: pathlib.Path, what: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    path = write_pepper_file(keyring, PEPPER_KEY_ID, PEPPER_TEXT)
    os.chown(path if what == "file" else keyring, 65534, 65534)
    with pytest.raises(PepperError) as info:
        read_pepper(str(keyring), PEPPER_KEY_ID)
    assert info.value.code == "unsafe_pepper"
    assert "another user" in info.value.message


def test_create_pepper_writes_a_canonical_0600_file_atomically(keyring: pathlib.Path) -> None:
    material = create_pepper(str(keyring), "edge-pepper-v1", random_bytes=lambda n: b"\x07" * n)
    path = keyring / key_file_name("edge-pepper-v1")
    data = path.read_bytes()
    assert len(data) == 43 and not data.endswith(b"\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert material.pepper == b"\x07" * 32
    assert read_pepper(str(keyring), "edge-pepper-v1") == material
    assert sorted(os.listdir(keyring)) == [path.name]  # no temporary file left behind


def test_create_pepper_never_replaces_an_existing_key(keyring: pathlib.Path) -> None:
    first = create_pepper(str(keyring), "edge-pepper-v1")
    with pytest.raises(PepperError) as info:
        create_pepper(str(keyring), "edge-pepper-v1")
    assert info.value.code == "conflict"
    assert read_pepper(str(keyring), "edge-pepper-v1") == first
    assert len(os.listdir(keyring)) == 1


def test_key_ids_may_contain_underscores_like_the_reference_grammar() -> None:
    # [A-Za-z0-9._:-] includes "_" (local-api.md 3.3; the DB CHECK agrees).
    assert key_file_name("key_v1") == "a2V5X3Yx.pepper"


@pytest.mark.parametrize("key_id", ["", "-leading-dash", "has space", "a" * 65, "slash/id"])
def test_rejects_a_bad_key_id(key_id: str) -> None:
    with pytest.raises(PepperError) as info:
        key_file_name(key_id)
    assert info.value.code == "invalid_input"


@settings(max_examples=200, deadline=None)
@given(content=st.binary(min_size=0, max_size=300))
def test_pepper_content_rule_is_total(tmp_path_factory: pytest.TempPathFactory, content: bytes) -> None:
    """Any file content gives a verified pepper or a PepperError, never another exception."""
    keyring = tmp_path_factory.mktemp("pepper")
    keyring.chmod(0o700)
    write_pepper_file(keyring, PEPPER_KEY_ID, content)
    try:
        material = read_pepper(str(keyring), PEPPER_KEY_ID)
    except PepperError:
        return
    assert len(content) == 43 and len(material.pepper) == 32


@pytest.mark.root
def test_rejects_a_process_whose_real_uid_differs_from_its_effective_uid(keyring: pathlib.Path) -> None:
    """A setuid-style process (ruid != euid) must not use the keyring (local-api.md 3.3)."""
    if os.geteuid() != 0:
        pytest.skip("changing the real uid needs root")
    import subprocess
    import sys

    from tests.support.cli import REPO

    write_pepper_file(keyring, PEPPER_KEY_ID, PEPPER_TEXT)
    probe = (
        "import os, sys\n"
        "from qinglong_edge.local.pepper import PepperError, read_pepper\n"
        "os.setreuid(65534, 0)\n"
        "try:\n    read_pepper(sys.argv[1], sys.argv[2])\nexcept PepperError as exc:\n    print(exc.code)\n"
        "else:\n    print('read')\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe, str(keyring), PEPPER_KEY_ID], capture_output=True,
                          text=True, cwd=REPO, check=False, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.stdout.strip() == "unsafe_pepper", proc.stderr
