"""Filesystem and network isolation for the envelope scenario.

Runs as root *inside* fresh mount and network namespaces (``unshare --mount --net``:
mount propagation private, only an ``lo`` that is down), so nothing here is visible to
the rest of the machine and everything disappears with the namespace:

* a tmpfs at ``root`` (the agent's state, its worker files, its configuration);
* the agent's package bind-mounted read-only at ``root/lib/qinglong_edge``;
* every other mount point remounted read-only (a per-mount flag, ``remount,bind,ro``),
  except ``/proc`` and the cgroup file systems (the agent creates its per-Run cgroups);
* ``lo`` brought up (``SIOCSIFFLAGS``), and no other interface exists.

:func:`verify` then records what a process in the namespace really sees.
Without namespaces (:func:`prepare_plain`), ``root`` is a plain directory and the
package is copied there; the report says so, with the reason.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import socket
import struct
import subprocess
from typing import Any

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
#: Mount points (and everything below) that stay writable.
_KEEP_WRITABLE = ("/proc", "/sys/fs/cgroup")


def _mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True, check=False, timeout=30)
    if proc.returncode != 0:
        raise OSError(f"mount {' '.join(args)}: {proc.stderr.strip()}")


def mount_points() -> dict[str, bool]:
    """Mount point -> already read-only (per-mount ``ro`` option), in mount order."""
    points: dict[str, bool] = {}
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            fields = line.split()
            if len(fields) > 5:
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                points[point] = "ro" in fields[5].split(",")
    return points


def _below(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP))


def _world_readable(tree: str) -> bool:
    """Every directory of ``tree`` searchable and every file readable by other users."""
    for directory, _, files in os.walk(tree):
        if os.stat(directory).st_mode & 0o005 != 0o005:
            return False
        if any(os.stat(os.path.join(directory, name)).st_mode & 0o004 == 0 for name in files):
            return False
    return True


def _copy_package(package: str, lib: str) -> None:
    """A copy the agent user can read (root-owned, so it cannot change it)."""
    shutil.copytree(package, lib, ignore=shutil.ignore_patterns("__pycache__"))
    for directory, _, files in os.walk(os.path.dirname(lib)):
        os.chmod(directory, 0o755)  # noqa: S103 -- read-only code for the agent user
        for name in files:
            os.chmod(os.path.join(directory, name), 0o644)


def prepare_isolated(root: str, package: str, *, tmpfs_size: str = "64m") -> dict[str, Any]:
    """Set up the namespaces' view (see the module docstring); returns what was done."""
    _mount("-t", "tmpfs", "-o", f"size={tmpfs_size},mode=0755,nosuid,nodev", "qinglong-envelope", root)
    lib = os.path.join(root, "lib", "qinglong_edge")
    if _world_readable(package):
        os.makedirs(lib, mode=0o755)
        os.chmod(os.path.join(root, "lib"), 0o755)  # noqa: S103 -- the agent user imports from here
        _mount("--bind", package, lib)
        _mount("-o", "remount,bind,ro", lib)
        how = "bind-mounted read-only"
    else:  # a checkout made with umask 077: the agent user could not read it
        _copy_package(package, lib)
        how = "copied (the checkout is not readable by other users)"
    readonly, already, failed = [], [], []
    for point, is_readonly in mount_points().items():
        if point in (root, lib) or _below(point, _KEEP_WRITABLE):
            continue
        if is_readonly:
            already.append(point)
            continue
        try:
            _mount("-o", "remount,bind,ro", point)
            readonly.append(point)
        except OSError as exc:
            failed.append(f"{point}: {exc}")
    loopback_up()
    return {"mode": "namespaces", "tmpfs": root, "package": f"{lib} ({how})", "readonly_mounts": readonly,
            "already_readonly": already, "readonly_failures": failed, "writable": [root, *_KEEP_WRITABLE]}


def prepare_plain(root: str, package: str, reason: str) -> dict[str, Any]:
    """No namespaces: a plain directory and a copy of the package."""
    lib = os.path.join(root, "lib", "qinglong_edge")
    _copy_package(package, lib)
    os.chmod(root, 0o755)  # noqa: S103 -- the agent user must reach its state
    return {"mode": "plain", "reason": reason, "tmpfs": None, "package": lib}


def namespaces() -> dict[str, str]:
    """This process's mount and network namespace ids (``mnt:[4026531841]``...)."""
    return {kind: os.readlink(f"/proc/self/ns/{kind}") for kind in ("mnt", "net")}


def verify(root: str, probe_dirs: list[str], outer: dict[str, str]) -> dict[str, Any]:
    """What a process here sees: writes outside ``root`` refused, interfaces, a route
    out; ``outer`` is :func:`namespaces` of the process that started us."""
    writes: dict[str, str] = {}
    for directory in [*probe_dirs, root]:
        path = os.path.join(directory, f".envelope-write-probe-{os.getpid()}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            writes[directory] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            continue
        os.close(fd)
        os.unlink(path)
        writes[directory] = "writable"
    interfaces = sorted(name for _, name in socket.if_nameindex())
    outside = "connected"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        try:
            sock.connect(("192.0.2.1", 9))  # TEST-NET-1: never a real host
        except OSError as exc:
            outside = errno.errorcode.get(exc.errno or 0, type(exc).__name__) if exc.errno else type(exc).__name__
    return {"writes": writes, "interfaces": interfaces, "connect_192.0.2.1": outside,
            "namespaces": namespaces(), "outer_namespaces": outer,
            "mount_ns_private": namespaces()["mnt"] != outer["mnt"] if outer else None,
            "net_ns_private": namespaces()["net"] != outer["net"] if outer else None}
