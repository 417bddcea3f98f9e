"""The .ipk as opkg-lede reads it: structure, control fields, payload, and a checker
that catches each way a package can go wrong (packaging.md 1 and 8)."""

from __future__ import annotations

import gzip
import io
import pathlib
import tarfile
from collections.abc import Callable

import pytest

from tests.packaging.conftest import EPOCH, REPO, Dist

import ipkcheck  # isort: skip  (packaging/ on sys.path, see conftest)
from qle_dist.reproducible import gzip_bytes  # isort: skip

DEPENDS = "python3-light (>= 3.11), python3-openssl, python3-sqlite3, python3-urllib, python3-logging, python3-ctypes"


def _tar_members(data: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    out = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        for info in archive.getmembers():
            handle = archive.extractfile(info)
            out.append((info, handle.read() if handle else None))
    return out


def _outer(ipk: bytes) -> dict[str, bytes]:
    return {info.name: body or b"" for info, body in _tar_members(gzip.decompress(ipk))}


def _control(dist: Dist) -> dict[str, str]:
    members = _tar_members(gzip.decompress(_outer(dist.ipk.read_bytes())["./control.tar.gz"]))
    text = next(body for info, body in members if info.name == "./control")
    assert text is not None
    fields, problems = ipkcheck.parse_control(text.decode())
    assert not problems
    return dict(fields)


def test_built_package_passes_the_checker(dist: Dist) -> None:
    assert ipkcheck.check_ipk(dist.ipk.read_bytes(), dist.ipk.name) == []
    assert ipkcheck.main([str(dist.ipk)]) == 0


def test_outer_is_a_gzipped_gnu_tar_of_three_members(dist: Dist) -> None:
    data = dist.ipk.read_bytes()
    assert data[:2] == b"\x1f\x8b"
    assert data[4:8] == b"\0\0\0\0"  # gzip MTIME 0
    outer = _outer(data)
    assert sorted(outer) == ["./control.tar.gz", "./data.tar.gz", "./debian-binary"]
    assert outer["./debian-binary"] == b"2.0\n"
    for inner in ("./control.tar.gz", "./data.tar.gz"):
        assert outer[inner][4:8] == b"\0\0\0\0"
        members, problems = ipkcheck.read_tar(gzip.decompress(outer[inner]), inner)
        assert problems == []
        assert {m.typeflag for m in members} <= {"0", "5"}
        assert {(m.uid, m.gid, m.mtime) for m in members} == {(0, 0, EPOCH)}
        names = [m.name for m in members]
        assert names == sorted(names, key=lambda n: n.rstrip("/").split("/"))


def test_control_fields(dist: Dist) -> None:
    fields = _control(dist)
    assert fields["Package"] == "qinglong-edge"
    assert fields["Version"] == f"{dist.version}-1"
    assert fields["Architecture"] == "all"
    assert fields["Depends"] == DEPENDS
    assert fields["Require-User"] == "qinglong=5700:qinglong=5700"
    assert fields["SourceDateEpoch"] == str(EPOCH)
    data_tar = gzip.decompress(_outer(dist.ipk.read_bytes())["./data.tar.gz"])
    assert fields["Installed-Size"] == str(len(data_tar))
    assert len(fields["Description"].splitlines()) >= 3
    assert all(value.strip() for value in fields.values())
    assert list(fields)[:3] == ["Package", "Version", "Depends"]
    assert list(fields)[-3:] == ["Architecture", "Installed-Size", "Description"]


EXPECTED_FILES = {
    "etc/config/qinglong-edge": 0o644,
    "etc/crontabs/qinglong": 0o600,
    "etc/init.d/qinglong-edge": 0o755,
    "lib/upgrade/keep.d/qinglong-edge": 0o644,
    "usr/bin/qinglong-edge": 0o755,
}


def _data_files(dist: Dist) -> dict[str, int]:
    data_tar = gzip.decompress(_outer(dist.ipk.read_bytes())["./data.tar.gz"])
    return {info.name.removeprefix("./"): info.mode for info, body in _tar_members(data_tar) if info.isfile()}


def test_payload_is_the_runtime_and_nothing_else(dist: Dist) -> None:
    files = _data_files(dist)
    package = {p.relative_to(REPO).as_posix() for p in (REPO / "qinglong_edge").rglob("*.py")}
    # the status console's three assets (issue 26), files of the package like its modules
    package |= {p.relative_to(REPO).as_posix() for p in (REPO / "qinglong_edge" / "local" / "console").iterdir()}
    assert package, "no sources found"
    expected = dict(EXPECTED_FILES)
    expected.update({f"usr/lib/qinglong-edge/{rel}": 0o644 for rel in package})
    assert files == expected
    assert not any(part in {"tests", "benchmarks", "__pycache__"} for path in files for part in path.split("/"))


def test_conffiles_and_maintainer_scripts(dist: Dist) -> None:
    members = {
        info.name.removeprefix("./"): (info, body)
        for info, body in _tar_members(gzip.decompress(_outer(dist.ipk.read_bytes())["./control.tar.gz"]))
    }
    assert sorted(n for n in members if n != ".") == [
        "conffiles", "control", "postinst", "postinst-pkg", "postrm", "prerm", "prerm-pkg"]
    assert members["conffiles"][1] == b"/etc/config/qinglong-edge\n/etc/crontabs/qinglong\n"
    for name in ("postinst", "postinst-pkg", "postrm", "prerm", "prerm-pkg"):
        info, body = members[name]
        assert info.mode == 0o755, name
        assert body is not None and body.startswith(b"#!/bin/sh\n"), name
    assert members["postinst"][1] == ipkcheck.SDK_POSTINST
    assert members["prerm"][1] == ipkcheck.SDK_PRERM


def test_crontab_runs_pull_every_minute_as_the_dedicated_user(dist: Dist) -> None:
    data_tar = gzip.decompress(_outer(dist.ipk.read_bytes())["./data.tar.gz"])
    crontab = next(body for info, body in _tar_members(data_tar) if info.name == "./etc/crontabs/qinglong")
    assert crontab is not None
    jobs = [line for line in crontab.decode().splitlines() if line and not line.startswith("#")]
    assert len(jobs) == 1
    schedule, command = jobs[0].split(maxsplit=5)[:5], jobs[0].split(maxsplit=5)[5]
    assert schedule == ["*"] * 5
    assert "/usr/bin/qinglong-edge --config /var/etc/qinglong-edge/config.json pull" in command
    assert command.startswith("[ -e /var/etc/qinglong-edge/pull.enabled ] && ")


# ---- the checker catches what opkg-lede would choke on ----------------------------------

class Parts:
    """A package taken apart, to be mutated and reassembled."""

    def __init__(self, ipk: bytes) -> None:
        outer = _outer(ipk)
        self.debian_binary = outer["./debian-binary"]
        self.control = _tar_members(gzip.decompress(outer["./control.tar.gz"]))
        self.data = _tar_members(gzip.decompress(outer["./data.tar.gz"]))
        self.data_format = tarfile.GNU_FORMAT
        self.outer_gzip = True
        self.extra: dict[str, bytes] = {}

    def member(self, which: str, name: str) -> tarfile.TarInfo:
        return next(info for info, _ in getattr(self, which) if info.name == f"./{name}")

    def replace(self, which: str, name: str, body: bytes) -> None:
        members = getattr(self, which)
        for index, (info, _) in enumerate(members):
            if info.name == f"./{name}":
                info.size = len(body)
                members[index] = (info, body)
                return
        raise KeyError(name)

    def edit_control(self, edit: Callable[[str], str]) -> None:
        body = next(b for i, b in self.control if i.name == "./control")
        assert body is not None
        self.replace("control", "control", edit(body.decode()).encode())

    @staticmethod
    def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]], fmt: int) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=fmt) as archive:
            for info, body in members:
                archive.addfile(info, io.BytesIO(body) if body is not None else None)
        return buffer.getvalue()

    def build(self) -> bytes:
        outer = [("./debian-binary", self.debian_binary),
                 ("./control.tar.gz", gzip_bytes(self._tar(self.control, tarfile.GNU_FORMAT))),
                 ("./data.tar.gz", gzip_bytes(self._tar(self.data, self.data_format))),
                 *self.extra.items()]
        infos = []
        for name, body in outer:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(body), EPOCH, 0o644
            infos.append((info, body))
        raw = self._tar(infos, tarfile.GNU_FORMAT)
        return gzip_bytes(raw) if self.outer_gzip else raw


def _pax(parts: Parts) -> None:
    # What tarfile's default does with os.stat(): PAX format and a float mtime.
    parts.data_format = tarfile.PAX_FORMAT
    parts.member("data", "etc/init.d/qinglong-edge").mtime = EPOCH + 0.5


def _empty_depends(parts: Parts) -> None:
    parts.edit_control(lambda text: text.replace(f"Depends: {DEPENDS}", "Depends: "))


def _no_depends(parts: Parts) -> None:
    parts.edit_control(lambda text: text.replace(f"Depends: {DEPENDS}\n", ""))


def _plain_tar_outer(parts: Parts) -> None:
    parts.outer_gzip = False


def _big_uid(parts: Parts) -> None:
    parts.member("data", "usr/bin/qinglong-edge").uid = 2**22  # GNU base-256 number


def _wrong_owner(parts: Parts) -> None:
    parts.member("data", "etc/init.d/qinglong-edge").uid = 1000


def _script_mode(parts: Parts) -> None:
    parts.member("control", "postinst-pkg").mode = 0o644


def _no_shebang(parts: Parts) -> None:
    body = next(b for i, b in parts.control if i.name == "./prerm-pkg")
    assert body is not None
    parts.replace("control", "prerm-pkg", body.replace(b"#!/bin/sh\n", b"", 1))


def _custom_postinst(parts: Parts) -> None:
    parts.replace("control", "postinst", b"#!/bin/sh\necho installing\n")


def _missing_conffile(parts: Parts) -> None:
    parts.replace("control", "conffiles", b"/etc/config/qinglong-edge\n/etc/config/missing\n")


def _relative_conffile(parts: Parts) -> None:
    parts.replace("control", "conffiles", b"etc/config/qinglong-edge\n")


def _bytecode(parts: Parts) -> None:
    info = tarfile.TarInfo("./usr/lib/qinglong-edge/qinglong_edge/__pycache__/cli.cpython-311.pyc")
    info.size, info.mtime = 4, EPOCH
    parts.data.append((info, b"\x00\x00\x00\x00"))


CASES: list[tuple[str, Callable[[Parts], None], str]] = [
    ("pax_header", _pax, "pax-header"),
    ("empty_depends", _empty_depends, "field-empty"),
    ("missing_depends", _no_depends, "field-missing"),
    ("other_depends", lambda p: p.edit_control(lambda t: t.replace(DEPENDS, "python3-light")), "depends"),
    ("debian_binary", lambda p: setattr(p, "debian_binary", b"2.1\n"), "debian-binary"),
    ("plain_tar_outer", _plain_tar_outer, "not-gzip"),
    ("extra_member", lambda p: p.extra.update({"./notes.txt": b"x"}), "extra-member"),
    ("base256_number", _big_uid, "numeric-field"),
    ("non_root_owner", _wrong_owner, "owner"),
    ("script_mode", _script_mode, "script-mode"),
    ("no_shebang", _no_shebang, "script-shebang"),
    ("not_sdk_postinst", _custom_postinst, "boilerplate"),
    ("conffile_not_in_data", _missing_conffile, "conffile-missing"),
    ("relative_conffile", _relative_conffile, "conffile-path"),
    ("bytecode_in_data", _bytecode, "runtime-only"),
    ("installed_size", lambda p: p.edit_control(lambda t: t.replace("Installed-Size: ", "Installed-Size: 1")),
     "installed-size"),
    ("uppercase_name", lambda p: p.edit_control(lambda t: t.replace("Package: qinglong-edge", "Package: QL")),
     "package-name"),
    ("blank_line", lambda p: p.edit_control(lambda t: t.replace("\nLicense", "\n\nLicense")), "blank-line"),
    ("one_line_description", lambda p: p.edit_control(lambda t: t.split("\n ")[0] + "\n"), "description"),
    ("architecture", lambda p: p.edit_control(lambda t: t.replace("Architecture: all", "Architecture: x86_64")),
     "architecture"),
    ("version_format", lambda p: p.edit_control(lambda t: t.replace("Version: ", "Version: v")), "version"),
    ("require_user", lambda p: p.edit_control(lambda t: t.replace("qinglong=5700:", "qinglong=57x:")),
     "require-user"),
]


def test_the_unmodified_parts_reassemble_clean(dist: Dist) -> None:
    """The mutation harness itself must not introduce problems."""
    assert ipkcheck.check_ipk(Parts(dist.ipk.read_bytes()).build(), dist.ipk.name) == []


@pytest.mark.parametrize(("mutate", "rule"), [pytest.param(m, r, id=i) for i, m, r in CASES])
def test_rejects_broken_package(dist: Dist, mutate: Callable[[Parts], None], rule: str) -> None:
    parts = Parts(dist.ipk.read_bytes())
    mutate(parts)
    problems = ipkcheck.check_ipk(parts.build(), dist.ipk.name)
    assert rule in {p.rule for p in problems}, problems


def test_rejects_ar_outer(dist: Dist) -> None:
    """The Debian/Yocto layout: opkg-lede says "Malformed package file"."""
    outer = _outer(dist.ipk.read_bytes())
    body = b"!<arch>\n"
    for name in ("debian-binary", "control.tar.gz", "data.tar.gz"):
        data = outer[f"./{name}"]
        body += f"{name + '/':<16}{EPOCH:<12}0     0     100644  {len(data):<10}`\n".encode() + data
        body += b"\n" if len(data) % 2 else b""
    problems = ipkcheck.check_ipk(body, dist.ipk.name)
    assert [p.rule for p in problems] == ["ar-outer"]


def test_rejects_corrupt_tar_checksum(dist: Dist) -> None:
    raw = bytearray(gzip.decompress(dist.ipk.read_bytes()))
    raw[0] ^= 0x01  # first header's name byte: checksum no longer matches
    problems = ipkcheck.check_ipk(gzip_bytes(bytes(raw)), dist.ipk.name)
    assert "checksum" in {p.rule for p in problems}


def test_rejects_wrong_file_name(dist: Dist) -> None:
    problems = ipkcheck.check_ipk(dist.ipk.read_bytes(), "qinglong-edge_0.0.1-1_all.ipk")
    assert [p.rule for p in problems] == ["filename"]


def test_checker_cli_reports_problems(dist: Dist, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / dist.ipk.name
    parts = Parts(dist.ipk.read_bytes())
    _empty_depends(parts)
    bad.write_bytes(parts.build())
    assert ipkcheck.main([str(bad)]) == 1
    assert "field-empty: Depends" in capsys.readouterr().out
    assert ipkcheck.main([]) == 2
