"""Debian bookworm roots of foreign architectures, run through qemu-user (binfmt_misc).

* :data:`ARCHITECTURES`: Debian architecture -> what ``uname -m`` says inside and the
  binfmt_misc entry qemu-user-static registers for it (Debian's ``qemu-user-static`` +
  ``binfmt-support`` packages register every entry with the ``F`` flag: the kernel opens the
  interpreter when it is registered, so the roots need no copy of qemu).
* :func:`check_host`: root, ``debootstrap``, ``chroot``, and the binfmt_misc handlers
  (mounting ``/proc/sys/fs/binfmt_misc`` and running ``update-binfmts --enable`` when the
  packages are installed but the handlers are not registered, as in a container); raises
  :class:`HostUnfit` with what to install otherwise.
* :func:`ensure_root`: ``debootstrap --variant=minbase --include=python3 bookworm``, cached
  in ``$QINGLONG_EDGE_FOREIGN_ROOTS`` (default ``<clone>/var/foreign``, ignored by git) as
  ``<arch>/`` with a ``.complete`` stamp; built into ``<arch>.partial`` and renamed, so an
  interrupted build is never taken for a root. The log is ``<arch>.log`` beside it.
  About 1.5 minutes per root on 2 cores with a nearby mirror; cached runs reuse them.
* :class:`Chroot`: a root prepared for a run: ``/proc`` mounted, a host work directory
  bind-mounted at the *same path* inside (so a config written on the host names paths that
  exist inside), the zipapp at ``/opt/qinglong-edge/qinglong-edge.pyz``; on exit every
  process whose root is the chroot is killed and the mounts are undone.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from types import TracebackType

from tests.support.wait import wait_until

__all__ = ["ARCHITECTURES", "ROOTS_ENV", "ZIPAPP_IN_ROOT", "Chroot", "ForeignArch", "HostUnfit", "check_host",
           "ensure_root", "roots_dir", "unmount_below"]

REPO = pathlib.Path(__file__).resolve().parents[2]
ROOTS_ENV = "QINGLONG_EDGE_FOREIGN_ROOTS"
MIRROR_ENV = "QINGLONG_EDGE_DEBIAN_MIRROR"
SUITE = "bookworm"
BINFMT = pathlib.Path("/proc/sys/fs/binfmt_misc")
PACKAGES = "debootstrap qemu-user-static binfmt-support"
ZIPAPP_IN_ROOT = "/opt/qinglong-edge/qinglong-edge.pyz"


@dataclass(frozen=True)
class ForeignArch:
    """One Debian architecture run under qemu-user."""

    debian: str
    machine: str
    binfmt: str


ARCHITECTURES: dict[str, ForeignArch] = {
    "arm64": ForeignArch("arm64", "aarch64", "qemu-aarch64"),
    "armhf": ForeignArch("armhf", "armv7l", "qemu-arm"),
    "mipsel": ForeignArch("mipsel", "mips", "qemu-mipsel"),
}


class HostUnfit(Exception):
    """This machine cannot run the foreign roots; the message says what is missing."""


def roots_dir() -> pathlib.Path:
    env = os.environ.get(ROOTS_ENV)
    return pathlib.Path(env) if env else REPO / "var" / "foreign"


def _quiet(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)


def _binfmt_entry(name: str) -> dict[str, str]:
    entry = BINFMT / name
    if not entry.exists():
        return {}
    lines = entry.read_text().splitlines()
    fields = {"state": lines[0] if lines else ""}
    for line in lines[1:]:
        key, _, value = line.partition(" ")
        fields[key.rstrip(":")] = value
    return fields


def check_host(arches: list[ForeignArch]) -> list[str]:
    """Make sure the roots can be built and run; return one line per binfmt handler used.

    Raises:
        HostUnfit: not root, a tool missing, or a handler that cannot be registered.
    """
    if os.geteuid() != 0:
        raise HostUnfit("needs root (debootstrap, chroot, mounts): sudo make test-foreign")
    for tool in ("debootstrap", "chroot", "mount", "umount"):
        if shutil.which(tool) is None:
            raise HostUnfit(f"{tool} not found: apt-get install {PACKAGES}")
    if not (BINFMT / "status").exists():
        mounted = _quiet(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)])
        if mounted.returncode != 0:
            raise HostUnfit(f"cannot mount {BINFMT}: {mounted.stderr.strip()}")
    lines = []
    for arch in arches:
        entry = _binfmt_entry(arch.binfmt)
        if entry.get("state") != "enabled" and shutil.which("update-binfmts"):
            _quiet(["update-binfmts", "--enable", arch.binfmt])
            entry = _binfmt_entry(arch.binfmt)
        if entry.get("state") != "enabled":
            raise HostUnfit(f"no enabled binfmt_misc handler {arch.binfmt} in {BINFMT}: "
                            f"apt-get install {PACKAGES}")
        interpreter = entry.get("interpreter", "")
        if "F" not in entry.get("flags", "") or not os.path.exists(interpreter):
            raise HostUnfit(f"{arch.binfmt}: interpreter {interpreter!r} without the F (fix binary) flag: "
                            f"the chroot could not find it; use Debian's {PACKAGES}")
        lines.append(f"{arch.binfmt}: {interpreter} (flags {entry.get('flags', '')})")
    return lines


def unmount_below(path: pathlib.Path) -> list[str]:
    """Unmount (lazily if busy) whatever an interrupted run left mounted below ``path``."""
    base = os.path.realpath(path).rstrip("/") + "/"
    with open("/proc/mounts") as handle:
        targets = [line.split()[1].replace("\\040", " ") for line in handle]
    left = sorted((t for t in targets if t.startswith(base)), key=len, reverse=True)
    for target in left:
        if _quiet(["umount", target]).returncode != 0:
            _quiet(["umount", "-l", target])
    return left


def ensure_root(arch: ForeignArch, rebuild: bool = False) -> tuple[pathlib.Path, str]:
    """The cached root for ``arch`` (built when missing); returns ``(path, how)``.

    Raises:
        HostUnfit: debootstrap failed (the last lines of its log are in the message).
    """
    base = roots_dir()
    base.mkdir(parents=True, exist_ok=True)
    unmount_below(base)  # never delete through a mount an interrupted run left
    root = base / arch.debian
    if rebuild and root.exists():
        shutil.rmtree(root)
    if (root / ".complete").exists():
        return root, f"cached ({(root / '.complete').read_text().strip()})"
    partial = base / f"{arch.debian}.partial"
    if partial.exists():
        shutil.rmtree(partial)
    log = base / f"{arch.debian}.log"
    mirror = os.environ.get(MIRROR_ENV, "http://deb.debian.org/debian")
    started = time.monotonic()
    with open(log, "w") as handle:
        proc = subprocess.run(["debootstrap", f"--arch={arch.debian}", "--variant=minbase", "--include=python3",
                               SUITE, str(partial), mirror], stdout=handle, stderr=subprocess.STDOUT, check=False,
                              timeout=3600)
    if proc.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").splitlines()[-3:])
        raise HostUnfit(f"debootstrap {arch.debian} failed (exit {proc.returncode}, log {log}): {tail}")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (partial / ".complete").write_text(f"debootstrap {SUITE} {arch.debian} {mirror} {stamp}\n")
    partial.rename(root)
    return root, f"built in {time.monotonic() - started:.0f} s (log {log})"


def _processes_in(root: pathlib.Path) -> list[int]:
    found = []
    target = os.path.realpath(root)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/root") == target:
                found.append(int(name))
        except OSError:
            continue
    return found


class Chroot:
    """A cached root mounted for one run (see the module docstring).

    Args:
        root: the debootstrapped root.
        workdir: a host directory (absolute, below /tmp) to bind-mount at the same path.
        zipapp: the ``qinglong-edge.pyz`` to install at :data:`ZIPAPP_IN_ROOT`.
    """

    def __init__(self, root: pathlib.Path, workdir: pathlib.Path, zipapp: bytes) -> None:
        self.root = root
        self.workdir = workdir
        self.zipapp = zipapp
        self._mounted: list[pathlib.Path] = []

    def inside(self, path: str | os.PathLike[str]) -> pathlib.Path:
        """The host path of ``path`` as seen inside the root."""
        return self.root / os.fspath(path).lstrip("/")

    def _mount(self, *argv: str) -> None:
        target = pathlib.Path(argv[-1])
        proc = _quiet(["mount", *argv])
        if proc.returncode != 0:
            raise HostUnfit(f"mount {' '.join(argv)}: {proc.stderr.strip()}")
        self._mounted.append(target)

    def __enter__(self) -> Chroot:
        unmount_below(self.root)
        pyz = self.inside(ZIPAPP_IN_ROOT)
        pyz.parent.mkdir(parents=True, exist_ok=True)
        pyz.write_bytes(self.zipapp)
        pyz.chmod(0o755)
        try:
            self._mount("-t", "proc", "proc", str(self.inside("/proc")))
            target = self.inside(self.workdir)
            target.mkdir(parents=True, exist_ok=True)
            self._mount("--bind", str(self.workdir), str(target))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def kill_all(self) -> int:
        """SIGKILL every process whose root is this chroot (a Run's setsid escapee...)."""
        pids = _processes_in(self.root)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_until(lambda: not _processes_in(self.root), 10, interval=0.05)
        return len(pids)

    def close(self) -> None:
        self.kill_all()
        for target in reversed(self._mounted):
            if _quiet(["umount", str(target)]).returncode != 0:
                _quiet(["umount", "-l", str(target)])
        self._mounted.clear()
        work = self.inside(self.workdir)
        if work.is_dir() and not os.path.ismount(work):
            try:
                work.rmdir()
            except OSError:
                pass
