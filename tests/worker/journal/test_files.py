"""Crash-safe file primitives (offer-delivery.md 3.1 read rules, 3.5 algorithms)."""

from __future__ import annotations

import os
import pathlib
import stat
from collections.abc import Iterator

import pytest

from qinglong_edge.errors import JournalError
from qinglong_edge.worker.journal import files
from tests.support.ownership import foreign_directory


def _nothing() -> None:
    return None


@pytest.fixture
def root_fd(private_dir: pathlib.Path) -> Iterator[int]:
    fd = os.open(private_dir, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def _entries(path: pathlib.Path) -> list[str]:
    return sorted(os.listdir(path))


def test_publish_first_writes_exact_bytes_0600_and_leaves_no_temp(private_dir: pathlib.Path, root_fd: int) -> None:
    files.publish_first(root_fd, root_fd, "rec.json", b'{"a":1}\n', op="claim_create", what="rec", guard=_nothing)
    path = private_dir / "rec.json"
    assert path.read_bytes() == b'{"a":1}\n'
    st = os.lstat(path)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_nlink == 1
    assert _entries(private_dir) == ["rec.json"]


def test_publish_first_never_replaces(private_dir: pathlib.Path, root_fd: int) -> None:
    (private_dir / "rec.json").write_bytes(b"old\n")
    with pytest.raises(JournalError) as info:
        files.publish_first(root_fd, root_fd, "rec.json", b"new\n", op="claim_create", what="rec", guard=_nothing)
    assert info.value.code == "offer_conflict"
    assert (private_dir / "rec.json").read_bytes() == b"old\n"
    assert _entries(private_dir) == ["rec.json"]


def test_publish_first_into_a_subdirectory_keeps_the_temp_in_the_root(private_dir: pathlib.Path, root_fd: int) -> None:
    (private_dir / "offers").mkdir(mode=0o700)
    offers_fd = os.open(private_dir / "offers", os.O_RDONLY | os.O_DIRECTORY)
    seen: list[list[str]] = []
    try:
        files.publish_first(
            root_fd, offers_fd, "o.json", b"{}\n", op="offer_accept", what="o",
            guard=lambda: seen.append(_entries(private_dir)),
        )
    finally:
        os.close(offers_fd)
    # At link time the temp file was in the root, named .<target>.<32 hex>.tmp.
    [before_link] = seen
    temps = [name for name in before_link if name != "offers"]
    assert len(temps) == 1 and files.TEMP_NAME.fullmatch(temps[0]) and temps[0].startswith(".o.json.")
    assert _entries(private_dir) == ["offers"]
    assert (private_dir / "offers" / "o.json").read_bytes() == b"{}\n"


def test_publish_replace_replaces_atomically(private_dir: pathlib.Path, root_fd: int) -> None:
    (private_dir / "rec.json").write_bytes(b"old\n")
    files.publish_replace(root_fd, root_fd, "rec.json", b"new\n", op="claim_replace", what="rec", guard=_nothing)
    assert (private_dir / "rec.json").read_bytes() == b"new\n"
    assert _entries(private_dir) == ["rec.json"]


@pytest.mark.parametrize("replace", [False, True], ids=["first", "replace"])
def test_guard_failure_aborts_before_the_commit(private_dir: pathlib.Path, root_fd: int, replace: bool) -> None:
    (private_dir / "keep.json").write_bytes(b"old\n")

    def guard() -> None:
        raise JournalError("lost", code="ownership_compromised")

    with pytest.raises(JournalError) as info:
        if replace:
            files.publish_replace(root_fd, root_fd, "keep.json", b"x\n", op="claim_replace", what="r", guard=guard)
        else:
            files.publish_first(root_fd, root_fd, "new.json", b"x\n", op="claim_create", what="r", guard=guard)
    assert info.value.code == "ownership_compromised"
    assert _entries(private_dir) == ["keep.json"]
    assert (private_dir / "keep.json").read_bytes() == b"old\n"


@pytest.mark.parametrize("size", [0, 1, files.MAX_RECORD_BYTES + 1], ids=["empty", "one_byte", "over_160k"])
def test_rejects_record_size_out_of_bounds_on_write(private_dir: pathlib.Path, root_fd: int, size: int) -> None:
    with pytest.raises(JournalError) as info:
        files.publish_first(root_fd, root_fd, "r.json", b"x" * size, op="claim_create", what="r", guard=_nothing)
    assert info.value.code == "unsafe_storage"
    assert _entries(private_dir) == []


def test_remove_durably(private_dir: pathlib.Path, root_fd: int) -> None:
    (private_dir / "r.json").write_bytes(b"{}\n")
    assert files.remove_durably(root_fd, "r.json", op="claim_clear", what="r", guard=_nothing) is True
    assert files.remove_durably(root_fd, "r.json", op="claim_clear", what="r", guard=_nothing) is False
    assert _entries(private_dir) == []


def test_temp_file_mode_is_0600_even_under_a_hostile_umask(private_dir: pathlib.Path, root_fd: int) -> None:
    old = os.umask(0o277)
    try:
        files.publish_first(root_fd, root_fd, "r.json", b"{}\n", op="claim_create", what="r", guard=_nothing)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(private_dir / "r.json").st_mode) == 0o600


# -- read rules (3.1) -----------------------------------------------------------------------

def test_read_record_absent_is_none(root_fd: int) -> None:
    assert files.read_record(root_fd, "missing.json", "m") is None


def test_read_record_returns_the_bytes(private_dir: pathlib.Path, root_fd: int) -> None:
    path = private_dir / "r.json"
    path.write_bytes(b'{"x":2}\n')
    path.chmod(0o600)
    assert files.read_record(root_fd, "r.json", "r") == b'{"x":2}\n'


def _make_symlink(path: pathlib.Path) -> None:
    target = path.parent / "target.json"
    target.write_bytes(b"{}\n")
    target.chmod(0o600)
    os.symlink(target.name, path)


def _make_fifo(path: pathlib.Path) -> None:
    os.mkfifo(path, 0o600)


def _make_dir(path: pathlib.Path) -> None:
    path.mkdir(mode=0o700)


def _make_mode(mode: int, content: bytes = b"{}\n"):  # type: ignore[no-untyped-def]
    def make(path: pathlib.Path) -> None:
        path.write_bytes(content)
        path.chmod(mode)
    return make


@pytest.mark.parametrize(
    "make",
    [
        _make_symlink,
        _make_fifo,
        _make_dir,
        _make_mode(0o644),
        _make_mode(0o640),
        _make_mode(0o602),
        _make_mode(0o600, b"{"),
        _make_mode(0o600, b"x" * (files.MAX_RECORD_BYTES + 1)),
    ],
    ids=["symlink", "fifo", "directory", "mode_0644", "mode_0640", "mode_0602", "one_byte", "over_160k"],
)
def test_rejects_unsafe_record(private_dir: pathlib.Path, root_fd: int, make) -> None:  # type: ignore[no-untyped-def]
    make(private_dir / "r.json")
    with pytest.raises(JournalError) as info:
        files.read_record(root_fd, "r.json", "r")
    assert info.value.code == "unsafe_storage"


@pytest.mark.root
def test_rejects_foreign_owned_record(private_dir: pathlib.Path, root_fd: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    path = private_dir / "r.json"
    path.write_bytes(b"{}\n")
    path.chmod(0o600)
    os.chown(path, 65534, 65534)
    with pytest.raises(JournalError) as info:
        files.read_record(root_fd, "r.json", "r")
    assert info.value.code == "unsafe_storage"


# -- directories ------------------------------------------------------------------------------

def test_open_private_directory_creates_0700_under_any_umask(tmp_path: pathlib.Path) -> None:
    old = os.umask(0o000)
    try:
        fd, created = files.open_private_directory(str(tmp_path / "j"), dir_fd=None, what="j", create=True)
    finally:
        os.umask(old)
    os.close(fd)
    assert created
    assert stat.S_IMODE(os.lstat(tmp_path / "j").st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o701, 0o710], ids=oct)
def test_rejects_existing_directory_with_group_or_other_bits(tmp_path: pathlib.Path, mode: int) -> None:
    path = tmp_path / "j"
    path.mkdir()
    path.chmod(mode)
    with pytest.raises(JournalError) as info:
        files.open_private_directory(str(path), dir_fd=None, what="j", create=True)
    assert info.value.code == "unsafe_storage"
    assert stat.S_IMODE(os.lstat(path).st_mode) == mode  # not "fixed" behind the operator's back


def test_rejects_symlinked_directory(tmp_path: pathlib.Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.symlink(real, tmp_path / "j")
    with pytest.raises(JournalError) as info:
        files.open_private_directory(str(tmp_path / "j"), dir_fd=None, what="j", create=True)
    assert info.value.code == "unsafe_storage"


def test_rejects_a_file_where_the_directory_should_be(tmp_path: pathlib.Path) -> None:
    (tmp_path / "j").write_bytes(b"")
    with pytest.raises(JournalError) as info:
        files.open_private_directory(str(tmp_path / "j"), dir_fd=None, what="j", create=True)
    assert info.value.code == "unsafe_storage"


def test_missing_directory_without_create(tmp_path: pathlib.Path) -> None:
    with pytest.raises(JournalError) as info:
        files.open_private_directory(str(tmp_path / "j"), dir_fd=None, what="j", create=False)
    assert info.value.code == "unsafe_storage"


@pytest.mark.root
def test_rejects_foreign_owned_directory(tmp_path: pathlib.Path) -> None:
    path = foreign_directory(tmp_path / "j")
    with pytest.raises(JournalError) as info:
        files.open_private_directory(str(path), dir_fd=None, what="j", create=True)
    assert info.value.code == "unsafe_storage"
    assert "65534" in info.value.message


@pytest.mark.parametrize(
    ("errno_value", "code"),
    [(28, "storage_unavailable"), (5, "storage_unavailable"), (30, "storage_unavailable"), (122, "storage_unavailable"),
     (13, "unsafe_storage"), (40, "unsafe_storage")],
    ids=["ENOSPC", "EIO", "EROFS", "EDQUOT", "EACCES", "ELOOP"],
)
def test_errno_mapping(errno_value: int, code: str) -> None:
    error = files.journal_error(OSError(errno_value, os.strerror(errno_value)), "x")
    assert error.code == code
    assert isinstance(error, OSError)


def test_directory_created_by_a_concurrent_opener_is_accepted(tmp_path: pathlib.Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: two pulls started together both found the journal root missing; the
    loser's mkdir got EEXIST, which surfaced as unsafe_storage (exit 73)."""
    target = tmp_path / "worker"
    real_mkdir = os.mkdir

    def racing_mkdir(path: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(path, 0o700, dir_fd=dir_fd)  # the other process wins the race here
        real_mkdir(path, mode, dir_fd=dir_fd)   # ours then fails with EEXIST

    monkeypatch.setattr(os, "mkdir", racing_mkdir)
    fd, created = files.open_private_directory(str(target), dir_fd=None, what=str(target), create=True)
    try:
        assert created is False
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o700
    finally:
        os.close(fd)
