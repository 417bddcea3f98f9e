"""Two builds from the same commit are byte-identical; the builders' primitives are
deterministic and never emit what opkg-lede cannot read."""

from __future__ import annotations

import gzip
import io
import pathlib
import tarfile

from tests.packaging.conftest import EPOCH, Dist, build_dist

from qle_dist.reproducible import Entry, gzip_bytes, tar_bytes  # isort: skip


def _files(directory: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_two_builds_are_byte_identical(dist: Dist, tmp_path: pathlib.Path) -> None:
    again = tmp_path / "again"
    proc = build_dist(again)
    assert proc.returncode == 0, proc.stderr
    first, second = _files(dist.directory), _files(again)
    assert sorted(first) == sorted(second)
    assert {dist.ipk.name, dist.tarball.name, dist.pyz.name, "SHA256SUMS"} <= set(first)
    for name in first:
        assert first[name] == second[name], f"{name} differs between two builds"


def test_the_standard_library_alone_builds_the_same_bytes_on_every_python(dist: Dist, tmp_path: pathlib.Path) -> None:
    """`make dist` runs with plain python3: `python -I -S` (no site-packages, no .venv) on every
    interpreter >= 3.11 here builds exactly the session's artefacts."""
    import os
    import subprocess

    from tests.packaging.conftest import PACKAGING
    from tests.support.openwrt_split import available_pythons

    expected = _files(dist.directory)
    for index, python in enumerate(available_pythons()):
        output = tmp_path / f"python-{index}"
        proc = subprocess.run([python, "-I", "-S", str(PACKAGING / "build.py"), "--output", str(output)],
                              capture_output=True, text=True, check=False, timeout=120,
                              env={"PATH": os.environ["PATH"], "SOURCE_DATE_EPOCH": str(EPOCH)})
        assert proc.returncode == 0, (python, proc.stderr)
        assert _files(output) == expected, f"{python} built different bytes"


def test_source_date_epoch_is_what_varies_the_artefacts(dist: Dist, tmp_path: pathlib.Path) -> None:
    later = tmp_path / "later"
    assert build_dist(later, EPOCH + 86400).returncode == 0
    first, second = _files(dist.directory), _files(later)
    for name in (dist.ipk.name, dist.tarball.name, dist.pyz.name):
        assert first[name] != second[name], name
    assert first["qinglong-edge.service"] == second["qinglong-edge.service"]


def test_checksums_list_every_artefact(dist: Dist) -> None:
    import hashlib

    lines = (dist.directory / "SHA256SUMS").read_text().splitlines()
    listed = {line.split("  ")[1]: line.split("  ")[0] for line in lines}
    for name, digest in listed.items():
        assert hashlib.sha256((dist.directory / name).read_bytes()).hexdigest() == digest
    assert set(listed) == {p.name for p in dist.directory.iterdir()} - {"SHA256SUMS"}


def test_rejects_a_bad_source_date_epoch(tmp_path: pathlib.Path) -> None:
    import os
    import subprocess
    import sys

    from tests.packaging.conftest import PACKAGING

    for bad in ("yesterday", "-1", "1.5"):
        proc = subprocess.run([sys.executable, str(PACKAGING / "build.py"), "--output", str(tmp_path / "out")],
                              capture_output=True, text=True, env=dict(os.environ, SOURCE_DATE_EPOCH=bad),
                              check=False)
        assert proc.returncode == 2, bad
        assert "SOURCE_DATE_EPOCH must be a non-negative integer" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_gzip_header_is_fixed_and_round_trips() -> None:
    data = b"qinglong" * 1000
    packed = gzip_bytes(data)
    assert packed[:10] == b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03"  # no name, MTIME 0, OS Unix
    assert gzip.decompress(packed) == data
    assert gzip_bytes(data) == packed


def test_tar_is_gnu_sorted_root_owned_with_integer_mtimes() -> None:
    entries = [Entry("b/z.txt", b"z", 0o600), Entry("a.txt", b"a", 0o644), Entry("b/c/d", b"d", 0o755)]
    raw = tar_bytes(entries, EPOCH)
    assert raw == tar_bytes(list(reversed(entries)), EPOCH)
    with tarfile.open(fileobj=io.BytesIO(raw)) as archive:
        members = archive.getmembers()
    assert [m.name for m in members] == [".", "./a.txt", "./b", "./b/c", "./b/c/d", "./b/z.txt"]
    assert {(m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == {(0, 0, "", "", EPOCH)}
    assert b"ustar  \x00" in raw[:512]  # GNU magic, never PAX
    assert not any(raw[offset + 156:offset + 157] in (b"x", b"g") for offset in range(0, len(raw), 512))
