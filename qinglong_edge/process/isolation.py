"""Which job isolation works here, found by doing it (spec README, "Isolation").

A job asks for isolation with :class:`~qinglong_edge.process.spawn.Isolation` in its
:class:`~qinglong_edge.process.spawn.JobSpec`; the job wrapper then makes, in the forked
child only, a private user namespace (our uid and gid mapped to themselves) and mount
namespace in which each hidden directory is an empty read-only tmpfs and each hidden
file a read-only ``/dev/null`` (:func:`qinglong_edge.process.wrapper._isolate`). It
works without root wherever the kernel allows unprivileged user namespaces.

Mechanism, in order of preference (no choice is left to configuration):

* ``unshare(CLONE_NEWUSER | CLONE_NEWNS)``: ``os.unshare`` on Python >= 3.12, else libc's
  ``unshare`` through ``ctypes``;
* ``mount(2)`` (tmpfs, bind, remount read-only): libc through ``ctypes``; the standard
  library has no wrapper for it. ``ctypes`` is imported in the forked child only, so
  neither the agent nor the wrapper pays its memory.

Without ``ctypes`` (OpenWrt's ``python3-ctypes`` is a separate package: the ipk depends on
it, a tarball install may lack it) there is no isolation: we do not fall back to the
``unshare``/``mount`` programs, because a job left as root of its namespace could unmount
the covers, and dropping that again needs a second nested namespace and options
(``--map-user``) that busybox's ``unshare`` lacks; OpenWrt's default image has neither
program. ``opkg install python3-ctypes`` is the
remedy :func:`probe_isolation` gives.

What isolation does not do: the job shares the network, and without a PID namespace
(level ``none``) it sees every process and may signal those of the agent's user. What
it does beyond the covers: processes outside its user namespace (the agent, other jobs)
are out of reach of ``/proc/<pid>/root``, ``/environ``, ``/fd``, ``/mem`` and ``ptrace``
(the kernel demands the same user namespace or ``CAP_SYS_PTRACE`` over theirs); in its
PID namespace (the probe's levels: :data:`PID_LEVELS`) it can signal none of them, and
with a private ``/proc`` it sees none.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.errors import EdgeError
from qinglong_edge.process.spawn import (
    PID_NAMESPACE,
    PID_NONE,
    PID_PRIVATE_PROC,
    Isolation,
    JobSpec,
    start_job,
)

__all__ = ["PID_LEVELS", "IsolationProbe", "probe_isolation"]

#: What the probe job runs: ``python -I -S -c CHECK SECRET`` in the kept directory.
_CHECK = """
import os, sys
try:
    open(sys.argv[1], "rb").read()
    print("visible")
except FileNotFoundError:
    print("hidden")
except OSError as exc:
    print("error", exc.errno)
with open("written", "w") as handle:
    handle.write("ok")
print("cwd-writable")
print("pid", os.getpid())
print("proc", os.readlink("/proc/self"))
"""
#: What the PID levels mean, for people (doctor, the README).
PID_LEVELS = {
    PID_NONE: "no PID namespace",
    PID_NAMESPACE: "a PID namespace",
    PID_PRIVATE_PROC: "a PID namespace with a private /proc",
}


class IsolationProbe(Frozen):
    """What :func:`probe_isolation` found.

    Attributes:
        available: True when a job asking for :class:`Isolation` runs isolated here.
        mechanism: ``"user+mount namespace"`` or ``"none"``.
        via: how, when available: ``"os.unshare + ctypes mount(2)"`` or
            ``"ctypes unshare(2) + mount(2)"``; ``""`` otherwise.
        reason: one line: what was verified, or why it is not available.
        remedy: what to do about it (``""`` when available or unknown).
        pid: the PID level that works with it (``Isolation.pid``): ``none``, ``pidns``
            or ``pidns+proc`` (``none`` when not available).
        pid_reason: why the PID level is not the highest (``""`` when it is).
    """

    __slots__ = ("available", "mechanism", "via", "reason", "remedy", "pid", "pid_reason")  # noqa: RUF023

    available: bool
    mechanism: str
    via: str
    reason: str
    remedy: str
    pid: str
    pid_reason: str

    def __init__(self, available: bool, mechanism: str, via: str, reason: str,  # noqa: PLR0917
                 remedy: str = "", pid: str = PID_NONE, pid_reason: str = "") -> None:
        _set = object.__setattr__
        _set(self, "available", available)
        _set(self, "mechanism", mechanism)
        _set(self, "via", via)
        _set(self, "reason", reason)
        _set(self, "remedy", remedy)
        _set(self, "pid", pid)
        _set(self, "pid_reason", pid_reason)

    @property
    def level(self) -> str:
        """What doctor reports: ``none``, ``PID namespace`` or ``PID namespace with private /proc``."""
        if not self.available or self.pid == PID_NONE:
            return "none"
        return "PID namespace" if self.pid == PID_NAMESPACE else "PID namespace with private /proc"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except (OSError, ValueError):
        return None


_NAMESPACES_REMEDY = ("allow user and mount namespaces for the agent (systemd: RestrictNamespaces=user mnt, as "
                      "the shipped pull unit does; no AppArmor userns restriction) and a kernel with CONFIG_USER_NS")


def _why(line: str) -> tuple[str, str]:
    """``(reason, remedy)`` from the wrapper's failure line."""
    if "ctypes" in line:
        return ("the ctypes module is missing (mount(2) needs it): " + line,
                "install the ctypes module (OpenWrt: opkg install python3-ctypes)")
    if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return ("unprivileged user namespaces are disabled (sysctl kernel.unprivileged_userns_clone=0): " + line,
                "sysctl -w kernel.unprivileged_userns_clone=1 (and persist it)")
    if _read("/proc/sys/user/max_user_namespaces") == "0":
        return ("user namespaces are disabled (sysctl user.max_user_namespaces=0): " + line,
                "sysctl -w user.max_user_namespaces=1024 (and persist it)")
    if _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        return ("AppArmor restricts unprivileged user namespaces "
                "(kernel.apparmor_restrict_unprivileged_userns=1): " + line, _NAMESPACES_REMEDY)
    return ("user or mount namespaces are refused (a seccomp filter such as systemd RestrictNamespaces=, "
            "an LSM, or a kernel without CONFIG_USER_NS): " + line, _NAMESPACES_REMEDY)


def probe_isolation(work_directory: str | None = None, *, timeout_s: float = 30.0,
                    python: str | None = None) -> IsolationProbe:
    """Run a real isolated job and report what is in effect (for ``doctor`` and runners).

    The probe makes ``<work_directory>/.isolation-probe-<hex>/`` with a hidden directory
    holding a secret file and a kept working directory inside it, runs
    ``python -I -S -c CHECK`` there under the job wrapper with that directory hidden, and
    checks from the job's output that the secret was invisible, the working directory
    writable (and from outside that the write landed), and which PID level holds: it
    asks for a PID namespace with a private ``/proc`` first (the job must be PID 2 and
    ``/proc/self`` must say so), then, when the kernel refuses the ``/proc`` mount (a
    locked overmount such as systemd's ``ProtectKernelTunables=``), a PID namespace
    alone, then, when the PID namespace itself is refused (systemd
    ``RestrictNamespaces=`` without ``pid``), none. Everything is removed afterwards.
    Costs two Python start-ups per attempt (some 50 ms here, about a second on a slow
    router); one attempt where everything works.

    Args:
        work_directory: an existing directory the agent's user can write
            (default: ``$TMPDIR`` or ``/tmp``).
        timeout_s: how long each probe job may take.
        python: the wrapper's interpreter (default ``sys.executable``, as for jobs).

    Returns:
        an :class:`IsolationProbe`; never raises for a platform that cannot isolate.
    """
    if not sys.platform.startswith("linux"):
        return IsolationProbe(False, "none", "", f"not Linux ({sys.platform}): no user namespaces")
    found = _attempt(work_directory, PID_PRIVATE_PROC, timeout_s, python)
    if isinstance(found, IsolationProbe):
        return found
    first = found
    if "private /proc" in first:
        found = _attempt(work_directory, PID_NAMESPACE, timeout_s, python)
        if isinstance(found, IsolationProbe):
            return _lower(found, "the kernel refused a private /proc (a locked overmount of /proc, e.g. "
                                 f"systemd ProtectKernelTunables=): {first}")
    found = _attempt(work_directory, PID_NONE, timeout_s, python)
    if isinstance(found, IsolationProbe):
        return _lower(found, f"the kernel refused a PID namespace (systemd RestrictNamespaces= without pid?): {first}")
    return _failure(found)


def _lower(probe: IsolationProbe, why: str) -> IsolationProbe:
    return IsolationProbe(probe.available, probe.mechanism, probe.via, probe.reason, probe.remedy, probe.pid,
                          why[:300])


def _failure(text: str) -> IsolationProbe:
    """The probe's result when no level worked, from its last failure text."""
    if text.startswith("qinglong-edge: "):
        reason, remedy = _why(text[len("qinglong-edge: "):])
        return IsolationProbe(False, "none", "", reason, remedy)
    return IsolationProbe(False, "none", "", text)


def _attempt(work_directory: str | None, pid: str, timeout_s: float, python: str | None) -> IsolationProbe | str:
    """One probe job at ``pid``: the :class:`IsolationProbe` when it held, else the text of
    what went wrong (a wrapper line ``qinglong-edge: ...`` when the job did not start)."""
    via = "os.unshare + ctypes mount(2)" if hasattr(os, "unshare") else "ctypes unshare(2) + mount(2)"
    base = work_directory or os.environ.get("TMPDIR") or "/tmp"  # noqa: S108 - a private 0700 subdirectory
    root = os.path.join(base, f".isolation-probe-{os.urandom(8).hex()}")
    try:
        os.mkdir(root, 0o700)
    except OSError as exc:
        return f"cannot probe in {base}: {exc.strerror}"
    try:
        hidden = os.path.join(root, "hidden")
        cwd = os.path.join(hidden, "work")
        secret = os.path.join(hidden, "secret")
        try:
            os.makedirs(cwd, 0o700)
            with open(secret, "w", encoding="ascii") as handle:
                handle.write("secret")
        except OSError as exc:  # a full file system (ENOSPC at the close), quota, EIO: doctor says so
            return f"cannot probe in {base}: {exc.strerror}"
        log = os.path.join(root, "probe.log")
        spec = JobSpec([sys.executable, "-I", "-S", "-c", _CHECK, secret], {}, cwd, log, 4096,
                       drain_ms=0, isolation=Isolation(hide=[hidden], pid=pid), label="isolation-probe")
        try:
            job = start_job(spec, ready_timeout_s=timeout_s, python=python)
        except EdgeError as exc:
            return f"the probe job could not start: {exc}"
        job.release()
        deadline = time.monotonic() + timeout_s
        code = None
        while code is None and time.monotonic() < deadline:
            code = job.process.poll()
            if code is None:
                time.sleep(0.01)
        if code is None:
            job.abort()
            return f"the probe job did not finish within {timeout_s:g} s"
        output = _read(log) or ""
        lines = output.splitlines()
        written = _read(os.path.join(cwd, "written")) == "ok"
        if code == 0 and lines[:2] == ["hidden", "cwd-writable"] and written and _pid_held(pid, lines[2:]):
            return IsolationProbe(True, "user+mount namespace", via,
                                  "verified: a hidden file was invisible to a job and its working directory writable",
                                  pid=pid)
        if lines and lines[0].startswith("qinglong-edge: "):
            return lines[0]
        if lines[:1] == ["visible"]:
            return "the probe job could read a hidden file"
        return f"the probe job ended with {code}: {output[:200]!r}"
    finally:
        with contextlib.suppress(OSError):
            import shutil  # not at the top: a resident pull probes once per boot and needs no more

            shutil.rmtree(root)


def _pid_held(pid: str, lines: list[str]) -> bool:
    """The job's ``pid N`` and ``proc N`` lines match the PID level asked for."""
    if pid == PID_NONE:
        return True
    seen = dict(line.split(" ", 1) for line in lines if " " in line)
    return seen.get("pid") == "2" and (pid != PID_PRIVATE_PROC or seen.get("proc") == "2")
