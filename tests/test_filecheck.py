"""The durable-write primitives of :mod:`qinglong_edge.filecheck` (issue 27 item 5): real
files, real ``fsync`` (counted by wrapping ``os.fsync``), the steps in order, nothing left
behind on a failure. The rules (``stat_problem``...) are tested through their callers
(tests/test_doctor.py, tests/worker/journal/test_files.py)."""

from __future__ import annotations

import errno
import os
import pathlib
import stat
from collections.abc import Iterator

import pytest

from qinglong_edge import filecheck

DATA = b'{"a":1}\n'


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The path of every fsync'd descriptor, in order (the real fsync runs)."""
    seen: list[str] = []
    real = os.fsync

    def counting(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return seen


@pytest.fixture
def dir_fd(tmp_path: pathlib.Path) -> Iterator[int]:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


@pytest.fixture
def umask_077() -> Iterator[None]:
    old = os.umask(0o077)
    yield
    os.umask(old)


def _temps(directory: pathlib.Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_temp_name_is_hidden_beside_the_target() -> None:
    name = filecheck.temp_name("offer-1.json")
    assert name.startswith(".offer-1.json.") and name.endswith(".tmp")
    assert len(name.split(".")[-2]) == 32 and name != filecheck.temp_name("offer-1.json")


def test_write_all_writes_every_byte_and_a_torn_write_stops_at_half(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "f"
    data = bytes(range(256)) * 1000
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    seen: list[int] = []
    try:
        filecheck.write_all(fd, data, torn=lambda: seen.append(path.stat().st_size))
    finally:
        os.close(fd)
    assert path.read_bytes() == data and seen == [len(data) // 2]


def test_replace_file_by_descriptor(tmp_path: pathlib.Path, dir_fd: int, fsyncs: list[str], umask_077: None) -> None:
    (tmp_path / "f").write_bytes(b"old")
    steps: list[str] = []
    filecheck.replace_file("f", DATA, dir_fd=dir_fd, mode=0o644, step=steps.append)
    assert (tmp_path / "f").read_bytes() == DATA
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o644  # fchmod: the umask does not narrow it
    assert steps == ["tmp_created", "tmp_written", "tmp_synced", "renamed", "dir_synced"]
    # The temp file (now the target) first, then the directory: two fsyncs, no more.
    assert len(fsyncs) == 2 and fsyncs[0].startswith(f"{tmp_path}/.f.") and fsyncs[1] == str(tmp_path)
    assert _temps(tmp_path) == []


def test_replace_file_by_path_in_ram_mode_syncs_nothing(tmp_path: pathlib.Path, fsyncs: list[str],
                                                         umask_077: None) -> None:
    target = tmp_path / "metrics.prom"
    filecheck.replace_file(str(target), DATA, mode=0o644, sync=False)
    assert target.read_bytes() == DATA and stat.S_IMODE(target.stat().st_mode) == 0o644
    assert fsyncs == [] and _temps(tmp_path) == []


def test_replace_file_relative_path(tmp_path: pathlib.Path, fsyncs: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    filecheck.replace_file("out.json", DATA)
    assert (tmp_path / "out.json").read_bytes() == DATA
    assert fsyncs[-1] == str(tmp_path) and len(fsyncs) == 2


def test_replace_file_without_chmod_keeps_the_umask(tmp_path: pathlib.Path, dir_fd: int, umask_077: None) -> None:
    filecheck.replace_file("f", DATA, dir_fd=dir_fd, mode=0o644, chmod=False, sync=False)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o600


def test_replace_file_torn_step_sees_half_the_bytes(tmp_path: pathlib.Path, dir_fd: int) -> None:
    sizes: dict[str, int] = {}

    def step(name: str) -> None:
        if name == "tmp_partial":
            (temp,) = _temps(tmp_path)
            sizes[name] = (tmp_path / temp).stat().st_size

    filecheck.replace_file("f", DATA, dir_fd=dir_fd, torn=True, step=step)
    assert sizes == {"tmp_partial": len(DATA) // 2} and (tmp_path / "f").read_bytes() == DATA


def test_replace_file_replaces_a_symlink_never_its_target(tmp_path: pathlib.Path, dir_fd: int) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    (tmp_path / "f").symlink_to(outside)
    filecheck.replace_file("f", DATA, dir_fd=dir_fd)
    assert not (tmp_path / "f").is_symlink() and (tmp_path / "f").read_bytes() == DATA
    assert outside.read_bytes() == b"keep"


def test_a_failed_before_leaves_the_old_file_and_no_temp(tmp_path: pathlib.Path, dir_fd: int) -> None:
    (tmp_path / "f").write_bytes(b"old")

    def guard() -> None:
        raise PermissionError(errno.EPERM, "lock lost")

    with pytest.raises(PermissionError) as caught:
        filecheck.replace_file("f", DATA, dir_fd=dir_fd, before=guard)
    assert filecheck.failed_step(caught.value) == ""  # not a step's system call
    assert (tmp_path / "f").read_bytes() == b"old" and _temps(tmp_path) == []


def test_a_failed_rename_is_tagged_and_removes_the_temp(tmp_path: pathlib.Path, dir_fd: int) -> None:
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "x").write_bytes(b"")  # rename() over a non-empty directory fails
    with pytest.raises(OSError) as caught:
        filecheck.replace_file("f", DATA, dir_fd=dir_fd)
    assert filecheck.failed_step(caught.value) == "rename" and _temps(tmp_path) == []


def test_a_failed_create_is_tagged(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError) as caught:
        filecheck.replace_file(str(tmp_path / "missing" / "f"), DATA)
    assert filecheck.failed_step(caught.value) == "create"


def test_a_failed_write_is_tagged_and_removes_the_temp(tmp_path: pathlib.Path, dir_fd: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError) as caught:
        filecheck.replace_file("f", DATA, dir_fd=dir_fd)
    assert caught.value.errno == errno.ENOSPC and filecheck.failed_step(caught.value) == "write"
    assert not (tmp_path / "f").exists() and _temps(tmp_path) == []


def test_a_failed_close_is_tagged_and_removes_the_temp(tmp_path: pathlib.Path, dir_fd: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.close

    def deferred_error(fd: int) -> None:
        real(fd)
        if fd != dir_fd:
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "close", deferred_error)
    with pytest.raises(OSError) as caught:
        filecheck.replace_file("f", DATA, dir_fd=dir_fd)
    monkeypatch.undo()
    assert filecheck.failed_step(caught.value) == "close"
    assert not (tmp_path / "f").exists() and _temps(tmp_path) == []


def test_publish_file_into_another_directory(tmp_path: pathlib.Path, dir_fd: int, fsyncs: list[str]) -> None:
    (tmp_path / "offers").mkdir()
    offers_fd = os.open(tmp_path / "offers", os.O_RDONLY | os.O_DIRECTORY)
    steps: list[str] = []
    try:
        filecheck.publish_file("offer-1.json", DATA, dir_fd=offers_fd, temp_dir_fd=dir_fd, step=steps.append)
    finally:
        os.close(offers_fd)
    assert (tmp_path / "offers" / "offer-1.json").read_bytes() == DATA
    assert stat.S_IMODE((tmp_path / "offers" / "offer-1.json").stat().st_mode) == 0o600
    assert steps == ["tmp_created", "tmp_written", "tmp_synced", "linked", "dir_synced", "tmp_removed"]
    assert len(fsyncs) == 2 and fsyncs[0].startswith(f"{tmp_path}/.offer-1.json.")
    assert fsyncs[1] == str(tmp_path / "offers")  # the target's directory, not the root
    assert _temps(tmp_path) == [] and os.listdir(tmp_path / "offers") == ["offer-1.json"]


def test_publish_file_never_replaces(tmp_path: pathlib.Path, dir_fd: int) -> None:
    (tmp_path / "f").write_bytes(b"old")
    with pytest.raises(FileExistsError) as caught:
        filecheck.publish_file("f", DATA, dir_fd=dir_fd)
    assert filecheck.failed_step(caught.value) == "link"
    assert (tmp_path / "f").read_bytes() == b"old" and _temps(tmp_path) == []


def test_publish_file_renames_where_there_are_no_hard_links(tmp_path: pathlib.Path, dir_fd: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def no_links(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    steps: list[str] = []
    filecheck.publish_file("f", DATA, dir_fd=dir_fd, rename_without_links=True, step=steps.append)
    assert (tmp_path / "f").read_bytes() == DATA and _temps(tmp_path) == []
    assert steps[-3:] == ["linked", "dir_synced", "tmp_removed"]
    with pytest.raises(FileExistsError):  # the existence check before the rename
        filecheck.publish_file("f", b"new\n", dir_fd=dir_fd, rename_without_links=True)
    assert (tmp_path / "f").read_bytes() == DATA and _temps(tmp_path) == []
    with pytest.raises(PermissionError) as caught:  # without the option the error stands
        filecheck.publish_file("g", DATA, dir_fd=dir_fd)
    assert filecheck.failed_step(caught.value) == "link" and not (tmp_path / "g").exists()


def test_create_file_is_exclusive_and_durable(tmp_path: pathlib.Path, fsyncs: list[str], umask_077: None) -> None:
    path = tmp_path / "db.sqlite3"
    filecheck.create_file(str(path), mode=0o640)
    assert path.read_bytes() == b"" and stat.S_IMODE(path.stat().st_mode) == 0o640
    assert fsyncs == [str(path), str(tmp_path)]
    with pytest.raises(FileExistsError) as caught:
        filecheck.create_file(str(path))
    assert filecheck.failed_step(caught.value) == "create"


def test_create_file_never_follows_a_symlink(tmp_path: pathlib.Path) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        filecheck.create_file(str(tmp_path / "link"))
    assert not (tmp_path / "elsewhere").exists()


def test_remove_file(tmp_path: pathlib.Path, dir_fd: int, fsyncs: list[str]) -> None:
    (tmp_path / "f").write_bytes(DATA)
    steps: list[str] = []
    assert filecheck.remove_file("f", dir_fd=dir_fd, step=steps.append) is True
    assert steps == ["unlinked", "dir_synced"] and fsyncs == [str(tmp_path)]
    assert filecheck.remove_file("f", dir_fd=dir_fd) is False
    (tmp_path / "g").write_bytes(DATA)
    assert filecheck.remove_file(str(tmp_path / "g"), sync=False) is True and len(fsyncs) == 1
    (tmp_path / "d").mkdir()
    with pytest.raises(OSError) as caught:
        filecheck.remove_file("d", dir_fd=dir_fd)
    assert filecheck.failed_step(caught.value) == "unlink"


def test_fsync_directory_of(tmp_path: pathlib.Path, fsyncs: list[str]) -> None:
    filecheck.fsync_directory_of(str(tmp_path / "anything"))
    assert fsyncs == [str(tmp_path)]
    with pytest.raises(FileNotFoundError) as caught:
        filecheck.fsync_directory_of(str(tmp_path / "missing" / "x"))
    assert filecheck.failed_step(caught.value) == "open_directory"


# -- the rules' options (every caller of file rules uses stat_problem) ---------------------------


def _file(tmp_path: pathlib.Path, mode: int, name: str = "f") -> pathlib.Path:
    path = tmp_path / name
    path.write_bytes(DATA)
    path.chmod(mode)
    return path


def _kind(path: pathlib.Path, **options: object) -> str | None:
    problem = filecheck.stat_problem(os.lstat(path), str(path), **options)  # type: ignore[arg-type]
    return None if problem is None else problem.kind


def test_the_default_rule_is_private(tmp_path: pathlib.Path) -> None:
    assert _kind(_file(tmp_path, 0o600), directory=False) is None
    assert _kind(_file(tmp_path, 0o640, "g"), directory=False) == "loose_mode"
    assert _kind(tmp_path / "g", directory=True) == "not_directory"
    (tmp_path / "link").symlink_to(tmp_path / "f")
    assert _kind(tmp_path / "link", directory=False) == "symlink"


def test_an_exact_mode_refuses_a_narrower_one_too(tmp_path: pathlib.Path) -> None:
    path = _file(tmp_path, 0o400)
    assert _kind(path, directory=False) is None  # no group/other bits: private
    assert _kind(path, directory=False, mode=0o600) == "loose_mode"  # but not 0600
    problem = filecheck.stat_problem(os.lstat(path), str(path), directory=False, mode=0o600)
    assert problem is not None and problem.message == f"{path}: mode 0400, not 0600"
    assert problem.remedy.endswith(f"chmod 0600 {path}")
    path.chmod(0o600)
    assert _kind(path, directory=False, mode=0o600) is None


def test_forbidden_zero_allows_any_mode(tmp_path: pathlib.Path) -> None:
    assert _kind(_file(tmp_path, 0o666), directory=False, forbidden=0) is None
    assert _kind(_file(tmp_path, 0o666, "g"), directory=False, forbidden=0o022) == "loose_mode"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_owner_false_accepts_another_owner(tmp_path: pathlib.Path) -> None:
    path = _file(tmp_path, 0o644)
    os.chown(path, 65534, 65534)
    assert _kind(path, directory=False, forbidden=0o022) == "foreign_owner"
    assert _kind(path, directory=False, forbidden=0o022, owner=False) is None
    path.chmod(0o664)
    problem = filecheck.stat_problem(os.lstat(path), str(path), directory=False, forbidden=0o022, owner=False)
    assert problem is not None and problem.kind == "loose_mode" and problem.remedy == f"chmod go-w {path}"


def test_single_link_refuses_a_second_name(tmp_path: pathlib.Path) -> None:
    path = _file(tmp_path, 0o600)
    assert _kind(path, directory=False, single_link=True) is None
    os.link(path, tmp_path / "other")
    assert _kind(path, directory=False) is None
    assert _kind(path, directory=False, single_link=True) == "hard_linked"
