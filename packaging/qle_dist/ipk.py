"""The OpenWrt 23.05 / 24.10 package: ``qinglong-edge_<version>-<release>_all.ipk``.

Format accepted by opkg-lede (packaging.md sections 1 and 8): a gzip'd GNU tar
(never ``ar``: opkg-lede dropped the ar reader) holding ``./control.tar.gz``,
``./data.tar.gz`` and ``./debian-binary`` (``2.0\\n``), each tar GNU format with
integer mtimes from ``SOURCE_DATE_EPOCH``, root ownership and sorted names, each gzip
with MTIME 0. ``Installed-Size`` is the uncompressed data.tar size in bytes, as
OpenWrt's ``ipkg-build`` computes it. No field is ever emitted empty (an empty
``Depends:`` crashes opkg).

``postinst``/``prerm`` are the SDK's exact boilerplate (include/package-pack.mk);
our logic is in ``postinst-pkg``/``prerm-pkg``, which ``default_postinst`` /
``default_prerm`` source in a subshell; ``postrm`` runs as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from qle_dist.payload import CONFFILES, FILES, runtime_tree
from qle_dist.reproducible import Entry, gzip_bytes, tar_bytes

__all__ = [
    "DEPENDS",
    "POSTINST",
    "PRERM",
    "REQUIRE_USER",
    "IpkBuild",
    "assemble",
    "build_ipk",
    "control_text",
]

PACKAGE_NAME = "qinglong-edge"
ARCHITECTURE = "all"
#: packaging.md 3.5; python3-email comes with python3-urllib. python3-logging: the Local API
#: (concurrent.futures, the server and controller logs) imports logging. python3-ctypes:
#: the isolation of remote jobs (mount(2) has no stdlib wrapper; only the job wrapper's
#: forked child imports it, so the agent still works without it: remote jobs then run
#: unisolated and doctor says what they can read). No uuid.
DEPENDS = "python3-light (>= 3.11), python3-openssl, python3-sqlite3, python3-urllib, python3-logging, python3-ctypes"
#: default_postinst -> add_group_and_user creates it (home /var/run/qinglong, shell
#: /bin/false). 5700 (QingLong's port): outside the ids OpenWrt feed packages pick
#: (below 1000) and outside OpenWrt's automatic range (32768 and up).
REQUIRE_USER = "qinglong=5700:qinglong=5700"
SUMMARY = "QingLong 3.0 edge agent: Remote Worker and Local run API"
DESCRIPTION = (
    "A standard-library-only Python agent for routers and small Linux boxes.",
    "A cron job pulls QingLong 3.0 Remote Worker offers over TLS 1.3 mTLS",
    "(ADR-0110); the procd service runs the Local run API with authenticated",
    "cancellation (ADR-0372). Everything is off until enabled in",
    "/etc/config/qinglong-edge.",
)

POSTINST = (
    "#!/bin/sh\n"
    '[ "${IPKG_NO_SCRIPT}" = "1" ] && exit 0\n'
    "[ -s ${IPKG_INSTROOT}/lib/functions.sh ] || exit 0\n"
    ". ${IPKG_INSTROOT}/lib/functions.sh\n"
    "default_postinst $0 $@\n"
)
PRERM = (
    "#!/bin/sh\n"
    "[ -s ${IPKG_INSTROOT}/lib/functions.sh ] || exit 0\n"
    ". ${IPKG_INSTROOT}/lib/functions.sh\n"
    "default_prerm $0 $@\n"
)


@dataclass(frozen=True, slots=True)
class IpkBuild:
    """A built package: file name, bytes, and the parts a checker looks at."""

    filename: str
    data: bytes
    control: str
    data_tar: bytes


def control_text(version: str, installed_size: int, source_date_epoch: int) -> str:
    """The ``control`` file, fields in the SDK's order (package-pack.mk)."""
    fields = [
        ("Package", PACKAGE_NAME),
        ("Version", version),
        ("Depends", DEPENDS),
        ("SourceName", PACKAGE_NAME),
        ("License", "MIT"),
        ("Section", "utils"),
        ("Require-User", REQUIRE_USER),
        ("SourceDateEpoch", str(source_date_epoch)),
        ("Maintainer", "qinglong-edge maintainers"),
        ("Architecture", ARCHITECTURE),
        ("Installed-Size", str(installed_size)),
    ]
    for name, value in fields:
        if not value.strip():
            raise ValueError(f"control field {name} would be empty (opkg crashes on that)")
    lines = [f"{name}: {value}" for name, value in fields]
    lines.append(f"Description: {SUMMARY}")
    lines += [f" {line}" for line in DESCRIPTION]
    return "\n".join(lines) + "\n"


def assemble(members: dict[str, bytes], mtime: int) -> bytes:
    """The outer gzip'd GNU tar of ``{name: bytes}`` (names without ``./``)."""
    entries = [Entry(name, data, 0o644) for name, data in members.items()]
    return gzip_bytes(tar_bytes(entries, mtime, root=False))


def build_ipk(version: str, release: int, source_date_epoch: int) -> IpkBuild:
    """Build ``qinglong-edge_<version>-<release>_all.ipk`` in memory."""
    full_version = f"{version}-{release}"
    data_tar = tar_bytes(runtime_tree(), source_date_epoch)
    control = control_text(full_version, len(data_tar), source_date_epoch)
    scripts = FILES / "openwrt"
    control_entries = [
        Entry("control", control.encode("utf-8"), 0o644),
        Entry("conffiles", "".join(f"{path}\n" for path in CONFFILES).encode(), 0o644),
        Entry("postinst", POSTINST.encode(), 0o755),
        Entry("postinst-pkg", (scripts / "postinst-pkg").read_bytes(), 0o755),
        Entry("prerm", PRERM.encode(), 0o755),
        Entry("prerm-pkg", (scripts / "prerm-pkg").read_bytes(), 0o755),
        Entry("postrm", (scripts / "postrm").read_bytes(), 0o755),
    ]
    control_tgz = gzip_bytes(tar_bytes(control_entries, source_date_epoch))
    package = assemble(
        {
            "debian-binary": b"2.0\n",
            "control.tar.gz": control_tgz,
            "data.tar.gz": gzip_bytes(data_tar),
        },
        source_date_epoch,
    )
    filename = f"{PACKAGE_NAME}_{full_version}_{ARCHITECTURE}.ipk"
    return IpkBuild(filename, package, control, data_tar)
