"""The .ipk through OpenWrt's real package manager (opkg-lede's ``opkg-cl``, built from the
pinned upstream source: tests/support/openwrt_tools.py), in an offline root per target
architecture: install, ``opkg files``, ``opkg info``, an upgrade that keeps an edited
conffile and writes the new default as ``<file>-opkg``, ``opkg remove``; and the
dependency and architecture checks opkg makes before installing anything.

The python3 packages of ``Depends`` are entries of the root's status file (their files
are the target's CPython, which cannot run here). opkg runs no maintainer script in an
offline root; those run against stand-ins in test_maintainer_scripts.py."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pathlib
import shutil
import stat
import subprocess
import tarfile

import pytest

from tests.packaging.conftest import EPOCH, Dist, build_dist
from tests.support.openwrt_tools import DEPENDS_VERSIONS, TARGET_ARCHITECTURES, OfflineRoot, OpenwrtTools

from qle_dist.ipk import assemble  # isort: skip  (packaging/ on sys.path, see conftest)
from qle_dist.payload import CONFFILES, runtime_tree  # isort: skip
from qle_dist.reproducible import Entry, gzip_bytes, tar_bytes  # isort: skip

UCI = "/etc/config/qinglong-edge"
CRONTAB = "/etc/crontabs/qinglong"


@pytest.fixture(scope="module")
def dist_release2(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """The same sources rebuilt as release 2 (``0.1.0-2``), as an upgrade would ship."""
    output = tmp_path_factory.mktemp("dist-release2")
    proc = build_dist(output, epoch=EPOCH + 86400, release=2)
    assert proc.returncode == 0, proc.stderr
    return Dist(output, dist.version, release=2)


def _shipped() -> dict[str, Entry]:
    return {"/" + entry.path: entry for entry in runtime_tree()}


def _info(root: OfflineRoot) -> dict[str, str]:
    result = root.opkg("info", "qinglong-edge")
    assert result.status == 0, result
    fields: dict[str, str] = {}
    name = ""
    for line in result.stdout.splitlines():
        if line.startswith(" ") and name:
            fields[name] += "\n" + line.strip()
        elif ":" in line:
            name, _, value = line.partition(":")
            fields[name] = value.strip()  # "Conffiles:" has its value on the next lines
    return fields


@pytest.mark.parametrize("arch", TARGET_ARCHITECTURES)
def test_install_files_info_upgrade_remove(openwrt_tools: OpenwrtTools, dist: Dist, dist_release2: Dist,
                                           tmp_path: pathlib.Path, arch: str) -> None:
    root = OfflineRoot(openwrt_tools, tmp_path / "root", arch)
    assert root.opkg("print-architecture").stdout.split("\n")[:3] == ["arch all 1", "arch noarch 1", f"arch {arch} 10"]
    shipped = _shipped()

    # -- install ---------------------------------------------------------------------------------
    installed = root.opkg("install", str(dist.ipk))
    assert installed.status == 0, installed
    assert f"Installing qinglong-edge ({dist.version}-1) to root..." in installed.stdout
    assert "Collected errors" not in installed.stderr, installed
    assert root.files("qinglong-edge") == sorted(shipped)
    for path, entry in shipped.items():
        on_disk = root.root / path.lstrip("/")
        assert on_disk.read_bytes() == entry.data, path
        assert stat.S_IMODE(on_disk.stat().st_mode) == entry.mode, path
    info = _info(root)
    assert info["Version"] == f"{dist.version}-1"
    assert info["Architecture"] == "all"
    assert info["Status"] == "install user installed"
    assert info["Depends"] == ", ".join(["python3-light (>= 3.11)", *list(DEPENDS_VERSIONS)[1:]])
    assert info["Conffiles"].split("\n")[1:] == [
        f"{path} {hashlib.sha256(shipped[path].data or b'').hexdigest()}" for path in CONFFILES]
    assert f"qinglong-edge - {dist.version}-1" in root.opkg("list-installed").stdout.splitlines()
    assert root.opkg("list-changed-conffiles").stdout.strip() == ""

    # -- the operator edits the UCI file; the upgrade keeps it ---------------------------------------
    uci = root.root / UCI.lstrip("/")
    edited = uci.read_text().replace("option origin ''", "option origin 'https://cluster.example:7443'")
    assert edited != uci.read_text()
    uci.write_text(edited)
    assert root.opkg("list-changed-conffiles").stdout.split() == [UCI]
    upgraded = root.opkg("install", str(dist_release2.ipk))
    assert upgraded.status == 0, upgraded
    assert f"Upgrading qinglong-edge on root from {dist.version}-1 to {dist.version}-2..." in upgraded.stdout
    assert f"Existing conffile {root.root}/{UCI.lstrip('/')} is different from the conffile in the new package" \
        in upgraded.stderr.replace(f"{root.root}//", f"{root.root}/")
    assert uci.read_text() == edited
    assert (root.root / f"{UCI}-opkg".lstrip("/")).read_bytes() == shipped[UCI].data
    assert not (root.root / f"{CRONTAB}-opkg".lstrip("/")).exists()  # unchanged: replaced silently
    assert _info(root)["Version"] == f"{dist.version}-2"
    assert root.files("qinglong-edge") == sorted(shipped)

    # -- remove: the edited conffile stays, every other file of ours goes ---------------------------------
    postrm = tmp_path / "postrm"  # what opkg runs after removing the files, on the device
    shutil.copy(root.root / "usr/lib/opkg/info/qinglong-edge.postrm", postrm)
    removed = root.opkg("remove", "qinglong-edge")
    assert removed.status == 0, removed
    assert f"Not deleting modified conffile {root.root}" in removed.stdout.replace("//", "/")
    assert uci.read_text() == edited
    for path in shipped:
        if path != UCI:
            assert not (root.root / path.lstrip("/")).exists(), path
    assert "Package: qinglong-edge" not in root.status_file()
    assert not (root.root / "usr/lib/opkg/info/qinglong-edge.list").exists()
    # opkg-lede owns no directory (file_hash_set_file_owner skips names ending in '/'), so it
    # leaves the code's tree behind, empty; our postrm removes it.
    library = root.root / "usr/lib/qinglong-edge"
    left = sorted(p.relative_to(library).as_posix() for p in library.rglob("*"))
    assert "qinglong_edge/worker" in left and all((library / p).is_dir() for p in left), left
    cleaned = subprocess.run(["sh", str(postrm), "remove"], capture_output=True, text=True, check=False, timeout=60,
                             env={"PATH": os.environ["PATH"], "QLE_LIBDIR": str(library), "QLE_CRON_INIT": ""})
    assert cleaned.returncode == 0, cleaned.stderr
    assert not library.exists()
    assert [line.split(" - ")[0] for line in root.opkg("list-installed").stdout.splitlines()] == sorted(
        DEPENDS_VERSIONS)


@pytest.mark.parametrize(("installed", "message"), [
    pytest.param({k: v for k, v in DEPENDS_VERSIONS.items() if k != "python3-sqlite3"},
                 "cannot find dependency python3-sqlite3 for qinglong-edge", id="no-sqlite3"),
    pytest.param({k: v for k, v in DEPENDS_VERSIONS.items() if k != "python3-ctypes"},
                 "cannot find dependency python3-ctypes for qinglong-edge", id="no-ctypes"),
    pytest.param({**DEPENDS_VERSIONS, "python3-light": "3.10.13-1"},
                 "cannot find dependency python3-light (>= 3.11) for qinglong-edge", id="python-3.10"),
])
def test_opkg_reports_a_missing_dependency(openwrt_tools: OpenwrtTools, dist: Dist, tmp_path: pathlib.Path,
                                           installed: dict[str, str], message: str) -> None:
    root = OfflineRoot(openwrt_tools, tmp_path / "root", "mipsel_24kc", installed)
    result = root.opkg("install", str(dist.ipk))
    assert result.status != 0, result
    assert message in result.stderr, result
    assert "Cannot install package qinglong-edge" in result.stderr
    assert not (root.root / "usr/bin/qinglong-edge").exists()
    assert "Package: qinglong-edge" not in root.status_file()


def _with_architecture(ipk: bytes, arch: str) -> bytes:
    """The same package with ``Architecture: ARCH`` in its control file."""
    outer = {}
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(ipk))) as archive:
        for info in archive.getmembers():
            handle = archive.extractfile(info)
            if handle is not None:
                outer[info.name.removeprefix("./")] = handle.read()
    entries = []
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(outer["control.tar.gz"]))) as archive:
        for info in archive.getmembers():
            handle = archive.extractfile(info)
            if handle is not None:
                data = handle.read()
                if info.name == "./control":
                    assert b"\nArchitecture: all\n" in data
                    data = data.replace(b"\nArchitecture: all\n", f"\nArchitecture: {arch}\n".encode())
                entries.append(Entry(info.name.removeprefix("./"), data, info.mode))
    outer["control.tar.gz"] = gzip_bytes(tar_bytes(entries, EPOCH))
    return assemble(outer, EPOCH)


def test_the_root_enforces_its_architecture(openwrt_tools: OpenwrtTools, dist: Dist, tmp_path: pathlib.Path) -> None:
    """Control: the arch configuration is in force, so `all` installing everywhere means something."""
    foreign = tmp_path / f"qinglong-edge_{dist.version}-1_x86_64.ipk"
    foreign.write_bytes(_with_architecture(dist.ipk.read_bytes(), "x86_64"))
    mips = OfflineRoot(openwrt_tools, tmp_path / "mips", "mipsel_24kc")
    refused = mips.opkg("install", str(foreign))
    assert refused.status != 0, refused
    assert "incompatible with the architectures configured" in refused.stderr
    assert not (mips.root / "usr/bin/qinglong-edge").exists()
    x86 = OfflineRoot(openwrt_tools, tmp_path / "x86", "x86_64")
    accepted = x86.opkg("install", str(foreign))
    assert accepted.status == 0, accepted
    assert (x86.root / "usr/bin/qinglong-edge").exists()
