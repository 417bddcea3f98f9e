#!/usr/bin/env python3
"""Check an .ipk the way OpenWrt's opkg-lede reads it, plus our packaging policy.

usage: python3 packaging/ipkcheck.py FILE.ipk ...   (exit 0 clean, 1 problems, 2 usage)

Independent of the builder on purpose (it shares no code with ``qle_dist``): it
parses raw 512-byte tar headers itself instead of trusting :mod:`tarfile`, which
would silently apply a PAX header that opkg-lede cannot read.

opkg-lede rules (packaging.md 1, ``libbb/unarchive.c`` ``get_header_tar`` and
``deb_extract``; ``libopkg/pkg_parse.c``):

* the outer file is gzip (``1f 8b``; ``gzip -d -c`` is the only reader: an ``ar``
  outer, the Debian/Yocto layout, is "Malformed package file");
* every tar (outer, control, data) has only ``ustar``/GNU (or all-zero, old GNU)
  magic, a valid header checksum, octal numbers, and typeflags ``0``/NUL, ``1``-``6``,
  ``L``, ``K``: anything else, in particular PAX ``x``/``g``, is "Unknown typeflag"
  (opkg then installs nothing and still exits 0);
* the outer holds ``debian-binary`` = ``2.0\\n``, ``control.tar.gz``, ``data.tar.gz``
  (a leading ``./`` is optional);
* ``control``: ``Field: value`` lines, continuation lines start with a space, no
  blank line (it would end the record), no empty field (an empty ``Depends:``
  crashes opkg), ``Package``/``Version``/``Architecture`` present, package name
  ``[a-z0-9.+-]`` (the stricter Yocto rule; ipkg-build allows ``[A-Za-z0-9_.+-]``);
* every ``conffiles`` line is an absolute path of a regular file in the data.

Our policy (packaging.md 8): root ownership everywhere; ``Depends`` exactly
:data:`EXPECTED_DEPENDS`; ``Architecture: all``; ``Version`` ``X.Y.Z-N``;
``Installed-Size`` = uncompressed data.tar bytes; a multi-line ``Description``;
``Require-User`` well-formed; maintainer scripts 0755 starting ``#!/bin/sh``;
``postinst``/``prerm`` are the SDK's exact boilerplate; the file is named
``<Package>_<Version>_<Architecture>.ipk``; the data holds no tests, benchmarks or
bytecode, and no absolute or ``..`` path.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import sys
import zlib
from dataclasses import dataclass

__all__ = ["EXPECTED_DEPENDS", "Member", "Problem", "check_ipk", "main", "read_tar"]

EXPECTED_DEPENDS = (
    "python3-light (>= 3.11), python3-openssl, python3-sqlite3, python3-urllib, python3-logging, python3-ctypes"
)
SCRIPTS = ("preinst", "postinst", "prerm", "postrm", "postinst-pkg", "prerm-pkg")
# include/package-pack.mk (OpenWrt SDK), verbatim.
SDK_POSTINST = (
    b'#!/bin/sh\n[ "${IPKG_NO_SCRIPT}" = "1" ] && exit 0\n'
    b"[ -s ${IPKG_INSTROOT}/lib/functions.sh ] || exit 0\n"
    b". ${IPKG_INSTROOT}/lib/functions.sh\ndefault_postinst $0 $@\n"
)
SDK_PRERM = (
    b"#!/bin/sh\n[ -s ${IPKG_INSTROOT}/lib/functions.sh ] || exit 0\n"
    b". ${IPKG_INSTROOT}/lib/functions.sh\ndefault_prerm $0 $@\n"
)
ACCEPTED_TYPEFLAGS = frozenset(b"0\x00123456LK")
RUNTIME_FORBIDDEN = frozenset({"tests", "test", "benchmarks", "__pycache__", "conftest.py"})
MAX_UNCOMPRESSED = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding: ``rule`` is a stable id (``pax-header``, ``field-empty``...)."""

    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail}"


@dataclass(frozen=True, slots=True)
class Member:
    """A tar member as opkg-lede sees it (long names already applied)."""

    name: str
    typeflag: str
    mode: int
    uid: int
    gid: int
    size: int
    mtime: int
    data: bytes


def _octal(field: bytes) -> int | None:
    text = field.rstrip(b"\x00 ").lstrip(b" ")
    if not text:
        return 0
    if not re.fullmatch(rb"[0-7]+", text):
        return None  # base-256 or garbage: opkg-lede parses octal only
    return int(text, 8)


def read_tar(data: bytes, where: str) -> tuple[list[Member], list[Problem]]:
    """Walk raw tar headers as opkg-lede's ``get_header_tar`` does.

    Returns the members it would see and the problems found; stops at the first
    problem that makes the rest unreadable.
    """
    members: list[Member] = []
    problems: list[Problem] = []
    pos = 0
    long_name: str | None = None
    while pos + 512 <= len(data):
        header = data[pos : pos + 512]
        if header == b"\x00" * 512:
            break
        at = f"{where}@{pos}"
        magic = header[257:262]
        if magic not in (b"ustar", b"\x00" * 5):
            problems.append(Problem("magic", f"{at}: tar magic {magic!r} is neither ustar nor zero"))
            return members, problems
        checksum = _octal(header[148:156])
        computed = sum(header[:148]) + 8 * 32 + sum(header[156:])
        if checksum != computed:
            problems.append(Problem("checksum", f"{at}: header checksum mismatch"))
            return members, problems
        numbers = {name: _octal(header[a:b]) for name, a, b in
                   (("mode", 100, 108), ("uid", 108, 116), ("gid", 116, 124),
                    ("size", 124, 136), ("mtime", 136, 148))}
        bad = [name for name, value in numbers.items() if value is None]
        if bad:
            problems.append(Problem("numeric-field", f"{at}: {', '.join(bad)} not octal"))
            return members, problems
        size = numbers["size"] or 0
        body = data[pos + 512 : pos + 512 + size]
        if len(body) != size:
            problems.append(Problem("truncated", f"{at}: member data is truncated"))
            return members, problems
        pos += 512 + (size + 511) // 512 * 512
        flag = header[156]
        name = header[:100].split(b"\x00", 1)[0].decode("utf-8", "replace")
        if flag not in ACCEPTED_TYPEFLAGS:
            kind = " (PAX header)" if flag in b"xg" else ""
            problems.append(Problem(
                "pax-header" if flag in b"xg" else "typeflag",
                f"{where}: {name!r}: Unknown typeflag: 0x{flag:02x}{kind}; opkg-lede skips the "
                "files and still exits 0",
            ))
            continue
        if flag in b"LK":
            if flag == ord("L"):
                long_name = body.split(b"\x00", 1)[0].decode("utf-8", "replace")
            continue
        if long_name is not None:
            name, long_name = long_name, None
        elif magic == b"ustar" and header[257:263] == b"ustar\x00" and header[345:500].strip(b"\x00"):
            prefix = header[345:500].split(b"\x00", 1)[0].decode("utf-8", "replace")
            name = f"{prefix}/{name}"
        members.append(Member(
            name=name, typeflag=chr(flag) if flag else "0", mode=numbers["mode"] or 0,
            uid=numbers["uid"] or 0, gid=numbers["gid"] or 0, size=size,
            mtime=numbers["mtime"] or 0, data=body,
        ))
    return members, problems


def _gunzip(data: bytes, where: str) -> tuple[bytes | None, list[Problem]]:
    if data[:2] != b"\x1f\x8b":
        return None, [Problem("not-gzip", f"{where}: no gzip magic 1f 8b")]
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
            out = stream.read(MAX_UNCOMPRESSED + 1)
    except (OSError, EOFError, zlib.error) as exc:
        return None, [Problem("not-gzip", f"{where}: corrupt gzip ({exc})")]
    if len(out) > MAX_UNCOMPRESSED:
        return None, [Problem("too-large", f"{where}: more than {MAX_UNCOMPRESSED} bytes")]
    return out, []


def _strip(name: str) -> str:
    return name[2:] if name.startswith("./") else name


def parse_control(text: str) -> tuple[list[tuple[str, str]], list[Problem]]:
    """``[(field, value)]`` in order (continuations joined with newlines) and problems."""
    fields: list[tuple[str, str]] = []
    problems: list[Problem] = []
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, 1):
        if line.strip() == "":
            problems.append(Problem("blank-line", f"control line {number} is blank (ends the record)"))
        elif line[0] in " \t":
            if not fields:
                problems.append(Problem("syntax", f"control line {number}: continuation before any field"))
            else:
                name, value = fields[-1]
                fields[-1] = (name, f"{value}\n{line.strip()}")
        elif ":" not in line:
            problems.append(Problem("syntax", f"control line {number}: no 'Field:'"))
        else:
            name, _, value = line.partition(":")
            fields.append((name.strip(), value.strip()))
    return fields, problems


def _check_control(control: str, data_size: int, filename: str | None) -> list[Problem]:
    fields, problems = parse_control(control)
    values: dict[str, str] = {}
    for name, value in fields:
        if name in values:
            problems.append(Problem("field-duplicate", f"{name} appears twice"))
        values[name] = value
        if value.split("\n", 1)[0].strip() == "":
            problems.append(Problem("field-empty", f"{name}: empty value (an empty Depends: crashes opkg)"))
    for name in ("Package", "Version", "Architecture", "Depends", "Installed-Size", "Description",
                 "Maintainer", "License", "Section", "Require-User", "SourceDateEpoch"):
        if name not in values:
            problems.append(Problem("field-missing", f"no {name} field"))
    package = values.get("Package", "")
    version = values.get("Version", "")
    arch = values.get("Architecture", "")
    if package and not re.fullmatch(r"[a-z0-9.+-]+", package):
        problems.append(Problem("package-name", f"{package!r} is not [a-z0-9.+-]+"))
    if version and not re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+-[0-9]+", version):
        problems.append(Problem("version", f"{version!r} is not X.Y.Z-N"))
    if arch and arch != "all":
        problems.append(Problem("architecture", f"{arch!r}: a pure-Python package is 'all'"))
    if "Depends" in values and values["Depends"] != EXPECTED_DEPENDS:
        problems.append(Problem("depends", f"Depends is {values['Depends']!r}, expected {EXPECTED_DEPENDS!r}"))
    if "Installed-Size" in values and values["Installed-Size"] != str(data_size):
        problems.append(Problem("installed-size",
                                f"Installed-Size {values['Installed-Size']} != data.tar size {data_size}"))
    if "Description" in values and "\n" not in values["Description"]:
        problems.append(Problem("description", "Description has no continuation lines"))
    user = values.get("Require-User")
    if user and not re.fullmatch(r"[a-z_][a-z0-9_-]*(=[0-9]+)?:[a-z_][a-z0-9_-]*(=[0-9]+)?", user):
        problems.append(Problem("require-user", f"{user!r} is not user[=uid]:group[=gid]"))
    epoch = values.get("SourceDateEpoch")
    if epoch and not epoch.isdigit():
        problems.append(Problem("source-date-epoch", f"{epoch!r} is not an integer"))
    if filename is not None and package and version and arch:
        expected = f"{package}_{version}_{arch}.ipk"
        if filename != expected:
            problems.append(Problem("filename", f"{filename!r} should be {expected!r}"))
    return problems


def check_ipk(data: bytes, filename: str | None = None) -> list[Problem]:
    """Every problem opkg-lede or our policy has with the package ``data``.

    Args:
        data: the .ipk file's bytes.
        filename: its base name, to check ``<Package>_<Version>_<Architecture>.ipk``.

    Returns:
        The problems; empty when the package is clean.
    """
    if data[:8] == b"!<arch>\n":
        return [Problem("ar-outer", "ar archive: opkg-lede reads only a gzip'd tar (Malformed package file)")]
    outer_tar, problems = _gunzip(data, "package")
    if outer_tar is None:
        return problems
    outer, found = read_tar(outer_tar, "outer")
    problems += found
    by_name = {_strip(m.name): m for m in outer}
    for name in ("debian-binary", "control.tar.gz", "data.tar.gz"):
        if name not in by_name:
            problems.append(Problem("missing-member", f"outer tar has no {name}"))
    for name in sorted(set(by_name) - {"debian-binary", "control.tar.gz", "data.tar.gz"}):
        problems.append(Problem("extra-member", f"outer tar has an unexpected {name!r}"))
    if "debian-binary" in by_name and by_name["debian-binary"].data != b"2.0\n":
        problems.append(Problem("debian-binary", f"debian-binary is {by_name['debian-binary'].data!r}, not '2.0\\n'"))
    inner: dict[str, tuple[bytes, list[Member]]] = {}
    for name in ("control.tar.gz", "data.tar.gz"):
        if name not in by_name:
            continue
        raw, found = _gunzip(by_name[name].data, name)
        problems += found
        if raw is None:
            continue
        members, found = read_tar(raw, name)
        problems += found
        inner[name] = (raw, members)
    for where, members in [("outer", outer)] + [(n, m) for n, (_, m) in inner.items()]:
        for member in members:
            if member.uid != 0 or member.gid != 0:
                problems.append(Problem("owner", f"{where}: {member.name} is {member.uid}:{member.gid}, not 0:0"))
    if "control.tar.gz" not in inner or "data.tar.gz" not in inner:
        return problems
    data_raw, data_members = inner["data.tar.gz"]
    data_files = {_strip(m.name): m for m in data_members}
    for path in data_files:
        parts = path.split("/")
        if path.startswith("/") or ".." in parts:
            problems.append(Problem("unsafe-path", f"data: {path!r}"))
        if RUNTIME_FORBIDDEN.intersection(parts) or path.endswith((".pyc", ".pyo")):
            problems.append(Problem("runtime-only", f"data: {path!r} is not runtime"))
    control_files = {_strip(m.name): m for m in inner["control.tar.gz"][1]}
    if "control" not in control_files:
        problems.append(Problem("control-missing", "control.tar.gz has no control file"))
    else:
        try:
            text = control_files["control"].data.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(Problem("control-encoding", "control is not UTF-8"))
        else:
            problems += _check_control(text, len(data_raw), filename)
    for name in SCRIPTS:
        script = control_files.get(name)
        if script is None:
            if name in ("postinst", "prerm"):
                problems.append(Problem("script-missing", f"no {name}"))
            continue
        if script.mode & 0o777 != 0o755:
            problems.append(Problem("script-mode", f"{name} has mode {script.mode & 0o777:04o}, not 0755"))
        if not script.data.startswith(b"#!/bin/sh\n"):
            problems.append(Problem("script-shebang", f"{name} does not start with #!/bin/sh"))
    for name, expected in (("postinst", SDK_POSTINST), ("prerm", SDK_PRERM)):
        script = control_files.get(name)
        if script is not None and script.data != expected:
            problems.append(Problem("boilerplate", f"{name} is not the SDK boilerplate"))
    conffiles = control_files.get("conffiles")
    if conffiles is not None:
        for line in conffiles.data.decode("utf-8", "replace").splitlines():
            if not line.startswith("/"):
                problems.append(Problem("conffile-path", f"conffile {line!r} is not absolute"))
                continue
            target = data_files.get(line[1:])
            if target is None or target.typeflag not in ("0", "\x00"):
                problems.append(Problem("conffile-missing", f"conffile {line} is not a regular file in data"))
    return problems


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths or any(p.startswith("-") for p in paths):
        print("usage: ipkcheck.py FILE.ipk ...", file=sys.stderr)
        return 2
    status = 0
    for path in paths:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            print(f"{path}: cannot read ({exc.strerror})", file=sys.stderr)
            status = 1
            continue
        problems = check_ipk(data, os.path.basename(path))
        for problem in problems:
            print(f"{path}: {problem}")
        if problems:
            status = 1
        else:
            print(f"{path}: ok")
    return status


if __name__ == "__main__":
    sys.exit(main())
