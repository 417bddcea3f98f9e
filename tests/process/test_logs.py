"""Reading back what the job wrapper published: raw bytes, or None, or a typed refusal."""

from __future__ import annotations

import os
import pathlib

import pytest

from qinglong_edge.errors import ExecutionError
from qinglong_edge.process.logs import MAX_PUBLICATION_BYTES, read_publication, read_receipt, read_truncation_fact


def _file(path: pathlib.Path, data: bytes, mode: int = 0o600) -> str:
    path.write_bytes(data)
    path.chmod(mode)
    return str(path)


def test_reads_the_raw_bytes(tmp_path: pathlib.Path) -> None:
    assert read_receipt(_file(tmp_path / "r.json", b'{"exitCode":0}')) == b'{"exitCode":0}'
    assert read_truncation_fact(_file(tmp_path / "f.json", b"x" * MAX_PUBLICATION_BYTES)) == b"x" * 4096


def test_absent_is_none(tmp_path: pathlib.Path) -> None:
    assert read_receipt(str(tmp_path / "missing.json")) is None


@pytest.mark.parametrize(
    "make",
    [
        lambda p: _file(p, b""),
        lambda p: _file(p, b"x" * (MAX_PUBLICATION_BYTES + 1)),
        lambda p: _file(p, b"{}", 0o644),
        lambda p: (os.symlink(_file(p.with_name("real"), b"{}"), p), str(p))[1],
        lambda p: (os.mkfifo(p, 0o600), str(p))[1],
        lambda p: (os.link(_file(p.with_name("other"), b"{}"), p), str(p))[1],
        lambda p: (os.mkdir(p, 0o700), str(p))[1],
    ],
    ids=["empty", "too-big", "group-readable", "symlink", "fifo", "two-links", "directory"],
)
def test_anything_the_wrapper_would_not_write_is_refused(tmp_path: pathlib.Path, make: object) -> None:
    path = make(tmp_path / "r.json")  # type: ignore[operator]
    with pytest.raises(ExecutionError) as info:
        read_publication(path, "receipt")
    assert info.value.code in ("publication_invalid", "publication_unavailable")
    assert "receipt" in str(info.value)
