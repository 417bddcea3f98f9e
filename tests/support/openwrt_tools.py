"""OpenWrt's real ``opkg-cl`` (opkg-lede) and ``uci``, built for this host, for tests.

``../shared/tools/build-openwrt-tools.sh PREFIX`` builds both from pinned upstream sources
(openwrt/opkg-lede 38eccbb, libubox 1aa36ee, uci 66127cd) in a few seconds; ``make
openwrt-tools`` runs it into ``.tools/openwrt`` (ignored by git), and ``.ci/run`` does
that before ``make test``. Where the tools are:

* ``$QINGLONG_EDGE_OPENWRT_TOOLS`` (a PREFIX holding ``bin/opkg-cl`` and ``bin/uci``), else
  ``<clone>/.tools/openwrt``;
* absent: the tests that need them skip, saying how to build them; with
  ``QINGLONG_EDGE_REQUIRE_OPENWRT_TOOLS=1`` (``.ci/run`` sets it) they fail instead, so CI
  can never pass with them skipped.

:class:`OfflineRoot` is an opkg offline root (``opkg-cl -o ROOT``) for one OpenWrt package
architecture: ``etc/opkg.conf`` (``dest root /``), ``etc/opkg/arch.conf`` (``all``,
``noarch`` and the target, as ``opkg print-architecture`` shows on a router) and a
``usr/lib/opkg/status`` listing the python3 packages our ``Depends`` names, as if the feed
had installed them (the real packages hold a CPython for the target, which cannot run
here; only their status entries are needed for opkg's dependency check). Under an
offline root opkg runs no maintainer script (the SDK's ``postinst`` needs
``/lib/functions.sh``, which only an OpenWrt root has: tests/packaging/
test_maintainer_scripts.py covers those with its stand-ins).

:class:`RealUci` runs ``uci -c CONFDIR -t SAVEDIR`` so neither ``/etc/config`` nor
``/tmp/.uci`` is touched.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "DEPENDS_VERSIONS",
    "REQUIRE_ENV",
    "TARGET_ARCHITECTURES",
    "TOOLS_ENV",
    "OfflineRoot",
    "OpenwrtTools",
    "RealUci",
    "find_tools",
]

REPO = pathlib.Path(__file__).resolve().parents[2]
TOOLS_ENV = "QINGLONG_EDGE_OPENWRT_TOOLS"
REQUIRE_ENV = "QINGLONG_EDGE_REQUIRE_OPENWRT_TOOLS"
DEFAULT_PREFIX = REPO / ".tools" / "openwrt"

#: OpenWrt package architectures of the targets we ship to: arm64 routers and Pi-class
#: boards, 32-bit ARM (Cortex-A7), mipsel routers (MT7621...), x86-64 (VMs, mini PCs).
TARGET_ARCHITECTURES = ("aarch64_generic", "arm_cortex-a7", "mipsel_24kc", "x86_64")

#: The feed's python3 packages our Depends names, at OpenWrt 23.05's version (3.11.7).
DEPENDS_VERSIONS: Mapping[str, str] = {
    "python3-light": "3.11.7-1",
    "python3-openssl": "3.11.7-1",
    "python3-sqlite3": "3.11.7-1",
    "python3-urllib": "3.11.7-1",
    "python3-logging": "3.11.7-1",
    "python3-ctypes": "3.11.7-1",
}


@dataclass(frozen=True)
class OpenwrtTools:
    """Paths of the built ``opkg-cl`` and ``uci``."""

    prefix: pathlib.Path

    @property
    def opkg(self) -> pathlib.Path:
        return self.prefix / "bin" / "opkg-cl"

    @property
    def uci(self) -> pathlib.Path:
        return self.prefix / "bin" / "uci"


def find_tools() -> OpenwrtTools | str:
    """The tools, or why they are missing (one line, with the command that builds them)."""
    env = os.environ.get(TOOLS_ENV)
    prefix = pathlib.Path(env) if env else DEFAULT_PREFIX
    tools = OpenwrtTools(prefix)
    missing = [path.name for path in (tools.opkg, tools.uci) if not os.access(path, os.X_OK)]
    if not missing:
        return tools
    where = f"${TOOLS_ENV}={env}" if env else str(DEFAULT_PREFIX)
    return (f"OpenWrt's real {' and '.join(missing)} not built in {where}: run `make openwrt-tools` "
            "(needs ../shared/tools and cmake gcc make pkg-config libjson-c-dev; .ci/run does it)")


@dataclass
class Run:
    """A finished tool invocation."""

    argv: list[str]
    status: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"$ {shlex.join(self.argv)}\nexit {self.status}\n{self.stdout}{self.stderr}"


def _run(argv: list[str], *, input_text: str | None = None, timeout: float = 60) -> Run:
    proc = subprocess.run(argv, capture_output=True, text=True, input=input_text, timeout=timeout, check=False,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C"})
    return Run(argv, proc.returncode, proc.stdout, proc.stderr)


class OfflineRoot:
    """An opkg offline root for one package architecture (see the module docstring).

    Args:
        tools: the built tools.
        root: an empty or missing directory.
        arch: the target's package architecture (``mipsel_24kc``...).
        installed: package -> version entered in the status file as installed by the feed
            (``Architecture: <arch>``, like the feed's python3 packages, which are not ``all``).
    """

    def __init__(self, tools: OpenwrtTools, root: pathlib.Path, arch: str,
                 installed: Mapping[str, str] = DEPENDS_VERSIONS) -> None:
        self.tools = tools
        self.root = root
        self.arch = arch
        info = root / "usr/lib/opkg/info"
        info.mkdir(parents=True)
        (root / "etc/opkg").mkdir(parents=True)
        (root / "var/lock").mkdir(parents=True)
        self.conf = root / "etc/opkg.conf"
        self.conf.write_text("dest root /\nlists_dir ext /var/opkg-lists\n")
        (root / "etc/opkg/arch.conf").write_text(f"arch all 1\narch noarch 1\narch {arch} 10\n")
        entries = []
        for name, version in installed.items():
            entries.append(f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\n"
                           "Status: install user installed\nInstalled-Time: 1700000000\n")
            (info / f"{name}.list").write_text("")
            (info / f"{name}.control").write_text(f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\n")
        (root / "usr/lib/opkg/status").write_text("\n".join(entries))

    def opkg(self, *args: str) -> Run:
        """``opkg-cl -f ROOT/etc/opkg.conf -o ROOT ARGS``."""
        return _run([str(self.tools.opkg), "-f", str(self.conf), "-o", str(self.root), *args])

    def status_file(self) -> str:
        return (self.root / "usr/lib/opkg/status").read_text()

    def files(self, package: str) -> list[str]:
        """``opkg files PACKAGE`` as absolute paths on the device (the root prefix removed)."""
        result = self.opkg("files", package)
        assert result.status == 0, result
        prefix = str(self.root).rstrip("/") + "/"
        paths = []
        for line in result.stdout.splitlines()[1:]:  # the first line is the "Package ... has the following files:"
            assert line.startswith(prefix), (line, prefix)
            paths.append("/" + line[len(prefix):].lstrip("/"))
        return sorted(paths)


class RealUci:
    """The real ``uci`` on a private config directory (``-c``) and delta directory (``-t``)."""

    def __init__(self, tools: OpenwrtTools, directory: pathlib.Path) -> None:
        self.tools = tools
        self.confdir = directory / "config"
        self.savedir = directory / "uci-delta"
        self.confdir.mkdir(parents=True)
        self.savedir.mkdir(parents=True)

    def argv(self, *args: str) -> list[str]:
        return [str(self.tools.uci), "-c", str(self.confdir), "-t", str(self.savedir), *args]

    def __call__(self, *args: str) -> Run:
        return _run(self.argv(*args))

    def batch(self, commands: Sequence[Sequence[str]]) -> list[Run]:
        """Run each ``uci ...`` command line (argv after ``uci``); every one must succeed."""
        runs = []
        for command in commands:
            run = self(*command)
            assert run.status == 0, run
            runs.append(run)
        return runs

    def wrapper(self, bin_dir: pathlib.Path) -> pathlib.Path:
        """``bin_dir/uci``: execs the real uci with this config and delta directory, so code
        that runs plain ``uci -q show PACKAGE`` from ``PATH`` reads this configuration."""
        bin_dir.mkdir(parents=True, exist_ok=True)
        script = bin_dir / "uci"
        script.write_text(f"#!/bin/sh\nexec {shlex.join(self.argv())} \"$@\"\n")
        script.chmod(0o755)
        return script
