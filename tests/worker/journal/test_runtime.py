"""The runtime directory (worker/journal/runtime.py): one private directory per journal under the
configured base, atomic small files without fsync, the fallback, notices once per boot
and once per day. Real directories and files."""

from __future__ import annotations

import os
import pathlib
import stat

import pytest

from qinglong_edge.errors import JournalError
from qinglong_edge.worker.journal import runtime as runtime_module
from qinglong_edge.worker.journal.runtime import RuntimeDirectory, journal_key


@pytest.fixture
def base(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    return path


def test_each_journal_gets_its_own_private_directory(tmp_path: pathlib.Path, base: pathlib.Path) -> None:
    with RuntimeDirectory.open(str(base), str(tmp_path / "a")) as first, \
            RuntimeDirectory.open(str(base), str(tmp_path / "b")) as second:
        assert first.path != second.path and not first.on_fallback
        first.write("session.json", b'{"a":1}\n')
        assert second.read("session.json") is None  # two configurations never share a session
    made = base / journal_key(str(tmp_path / "a"))
    assert stat.S_IMODE(made.stat().st_mode) == 0o700 and made.stat().st_uid == os.geteuid()
    assert (made / "session.json").read_bytes() == b'{"a":1}\n'
    assert stat.S_IMODE((made / "session.json").stat().st_mode) == 0o600
    assert journal_key(str(tmp_path / "a") + "/") == journal_key(str(tmp_path / "a"))  # normalized


def test_write_replaces_atomically_and_remove_is_idempotent(tmp_path: pathlib.Path, base: pathlib.Path) -> None:
    with RuntimeDirectory.open(str(base), str(tmp_path / "j")) as runtime:
        runtime.write("owner.json", b"{}\n")
        runtime.write("owner.json", b'{"b":2}\n')
        assert runtime.read("owner.json") == b'{"b":2}\n'
        assert sorted(os.listdir(runtime.path)) == ["owner.json"]  # no temp file left
        assert runtime.remove("owner.json") and not runtime.remove("owner.json")
        assert runtime.read("owner.json") is None


@pytest.mark.parametrize("name", ["../x", "A.json", "", ".hidden", "x" * 65, "a/b"])
def test_names_are_plain(tmp_path: pathlib.Path, base: pathlib.Path, name: str) -> None:
    with RuntimeDirectory.open(str(base), str(tmp_path / "j")) as runtime:
        with pytest.raises(JournalError) as info:
            runtime.write(name, b"{}\n")
        assert info.value.code == "invalid_configuration"


def test_sizes_are_bounded(tmp_path: pathlib.Path, base: pathlib.Path) -> None:
    with RuntimeDirectory.open(str(base), str(tmp_path / "j")) as runtime:
        for data in (b"", b"x" * (runtime_module.MAX_RUNTIME_FILE_BYTES + 1)):
            with pytest.raises(JournalError):
                runtime.write("big", data)
        (pathlib.Path(runtime.path) / "big").write_bytes(b"x" * (runtime_module.MAX_RUNTIME_FILE_BYTES + 1))
        (pathlib.Path(runtime.path) / "big").chmod(0o600)
        with pytest.raises(JournalError):
            runtime.read("big")


def test_a_planted_symlink_or_loose_file_is_refused(tmp_path: pathlib.Path, base: pathlib.Path) -> None:
    with RuntimeDirectory.open(str(base), str(tmp_path / "j")) as runtime:
        target = tmp_path / "elsewhere"
        target.write_bytes(b"{}\n")
        (pathlib.Path(runtime.path) / "session.json").symlink_to(target)
        with pytest.raises(JournalError) as info:
            runtime.read("session.json")
        assert info.value.code == "unsafe_storage"
        (pathlib.Path(runtime.path) / "session.json").unlink()
        runtime.write("session.json", b"{}\n")
        (pathlib.Path(runtime.path) / "session.json").chmod(0o644)
        with pytest.raises(JournalError):
            runtime.read("session.json")


@pytest.mark.parametrize("case", ["missing_base", "loose_subdirectory", "subdirectory_is_a_symlink"])
def test_an_unusable_base_falls_back_to_the_journal(tmp_path: pathlib.Path, base: pathlib.Path, case: str) -> None:
    journal = tmp_path / "journal"
    configured = base
    if case == "missing_base":
        configured = tmp_path / "no" / "such"
    elif case == "loose_subdirectory":
        (base / journal_key(str(journal))).mkdir(mode=0o755)
        (base / journal_key(str(journal))).chmod(0o755)
    else:
        (tmp_path / "other").mkdir(mode=0o700)
        (base / journal_key(str(journal))).symlink_to(tmp_path / "other")
    with RuntimeDirectory.open(str(configured), str(journal)) as runtime:
        assert runtime.on_fallback and runtime.path == str(journal / "run")
        assert runtime.fallback_reason
        runtime.write("session.json", b"{}\n")
    assert stat.S_IMODE(journal.stat().st_mode) == 0o700  # the journal root made as the journal would
    assert os.listdir(tmp_path / "other" if case == "subdirectory_is_a_symlink" else journal / "run") == (
        [] if case == "subdirectory_is_a_symlink" else ["session.json"])


def test_once_per_boot_is_keyed_by_the_boot_id(tmp_path: pathlib.Path, base: pathlib.Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    with RuntimeDirectory.open(str(base), str(tmp_path / "j")) as runtime:
        assert runtime.once_per_boot("arch") is True
        assert runtime.once_per_boot("arch") is False
        assert runtime.once_per_boot("other") is True
    monkeypatch.setattr(runtime_module, "boot_id", lambda: "a-later-boot")
    with RuntimeDirectory.open(str(base), str(tmp_path / "j")) as runtime:  # e.g. on the flash fallback
        assert runtime.once_per_boot("arch") is True
        assert runtime.once_per_boot("arch") is False


def test_once_per_day_follows_the_utc_day(tmp_path: pathlib.Path, base: pathlib.Path) -> None:
    day = 86_400_000
    t = 20_000 * day + 5
    with RuntimeDirectory.open(str(base), str(tmp_path / "j")) as runtime:
        assert runtime.once_per_day("cert", t) is True
        assert runtime.once_per_day("cert", t + day - 10) is False
        assert runtime.once_per_day("cert", t + day) is True
        assert runtime.once_per_day("cert", t + day + 1) is False


def test_a_notice_that_cannot_be_remembered_is_shown(tmp_path: pathlib.Path, base: pathlib.Path) -> None:
    with RuntimeDirectory.open(str(base), str(tmp_path / "j")) as runtime:
        (pathlib.Path(runtime.path) / "notice.arch").mkdir()  # a directory where the file should be
        assert runtime.once_per_boot("arch") is True
        assert runtime.once_per_boot("arch") is True  # shown again rather than hidden
