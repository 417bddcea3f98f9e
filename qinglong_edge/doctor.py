"""Device checks behind ``qinglong-edge doctor``: real probes, one result each.

Every probe does the real thing in the configured directories (creates, links,
fsyncs, locks and removes its own temporary files) rather than guessing from the
file-system type, because routers mount surprising things (JFFS2 overlays, FAT
USB sticks, FUSE).

A check is *required* when the configured roles cannot work without it; the
command exits 0 only when every required check passes.

One source of truth (issue 18 item 5): directories are judged by
:func:`qinglong_edge.filecheck.directory_problem` (the journal and the Local store use
the same rules), the worker's credential, certificate, key and trust anchors by the very
functions ``pull`` reads them with (:mod:`qinglong_edge.worker.ingress.material`), so a
file that fails ``pull`` fails ``doctor`` with the same words. One root cause is one
failure: a directory that is not ours (another owner, loose mode, a symlink) is reported
once, with the chown/chmod remedy, and the probes inside it are not run (each would fail
with EACCES and suggest another file system).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shlex
import stat
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from qinglong_edge.config import EdgeConfig, WorkerConfig
from qinglong_edge.filecheck import Problem, directory_problem

__all__ = ["Check", "check_certificate_validity", "check_pepper_keyring", "check_worker_tls", "run_checks"]

MIN_FREE_BYTES = 8 * 1024 * 1024
MIN_SQLITE = (3, 35, 0)


@dataclass(frozen=True, slots=True)
class Check:
    """One doctor result.

    Attributes:
        name: stable identifier (``hard_links``, ``tls13``...).
        ok: whether the probe passed.
        required: whether a failure makes ``doctor`` exit non-zero.
        detail: what was found, one line.
        remedy: what to do about a failure ("" when ok).
    """

    name: str
    ok: bool
    required: bool
    detail: str
    remedy: str = ""

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _probe_name(directory: str, tag: str) -> str:
    return os.path.join(directory, f".doctor-{tag}.{secrets.token_hex(8)}.tmp")


@contextlib.contextmanager
def _temp_file(directory: str, tag: str) -> Iterator[tuple[str, int]]:
    path = _probe_name(directory, tag)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        yield path, fd
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)


def check_python() -> Check:
    ok = sys.version_info >= (3, 11)
    version = ".".join(map(str, sys.version_info[:3]))
    return Check(
        "python", ok, True, f"Python {version}", "" if ok else "install Python 3.11 or newer"
    )


def check_tls13(required: bool) -> Check:
    try:
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.maximum_version = ssl.TLSVersion.TLSv1_3
        ok = bool(ssl.HAS_TLSv1_3)
        detail = f"{ssl.OPENSSL_VERSION}, TLS 1.3 {'available' if ok else 'missing'}"
    except (ImportError, ValueError, OSError) as exc:
        ok, detail = False, f"ssl unusable ({type(exc).__name__})"
    remedy = "" if ok else "install python3-openssl with OpenSSL >= 1.1.1 (TLS 1.3)"
    return Check("tls13", ok, required, detail, remedy)


def check_sqlite(required: bool) -> Check:
    try:
        import sqlite3

        version = sqlite3.sqlite_version_info
        ok = version >= MIN_SQLITE
        detail = f"SQLite {sqlite3.sqlite_version}"
    except ImportError:
        ok, detail = False, "sqlite3 module missing"
    need = ".".join(map(str, MIN_SQLITE))
    remedy = "" if ok else f"install python3-sqlite3 with SQLite >= {need}"
    return Check("sqlite", ok, required, detail, remedy)


def check_sqlite_journal(directory: str, profile: str, required: bool) -> list[Check]:
    """Real writes in ``directory``: the profile's journal mode, and whether WAL works."""
    results = []
    try:
        import sqlite3
    except ImportError:
        return [
            Check("sqlite_write", False, required, "sqlite3 module missing", "install python3-sqlite3")
        ]
    wanted = "wal" if profile == "standalone" else "delete"
    for mode in dict.fromkeys((wanted, "wal")):
        path = _probe_name(directory, f"sqlite-{mode}")
        ok, detail = False, ""
        try:
            conn = sqlite3.connect(path, isolation_level=None)
            try:
                got = conn.execute(f"PRAGMA journal_mode={mode}").fetchone()[0]
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute("CREATE TABLE t(x INTEGER)")
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO t VALUES (1)")
                conn.execute("COMMIT")
                rows = conn.execute("SELECT count(*) FROM t").fetchone()[0]
                ok = got == mode and rows == 1
                detail = f"journal_mode={got} write+read {'ok' if rows == 1 else 'failed'}"
            finally:
                conn.close()
        except sqlite3.Error as exc:
            detail = f"{mode} failed: {exc}"
        finally:
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(OSError):
                    os.unlink(path + suffix)
        name = "sqlite_write" if mode == wanted else "sqlite_wal"
        remedy = ""
        if not ok:
            remedy = (
                "use the edge profile (journal_mode=DELETE) on this file system"
                if mode == "wal"
                else f"put the database on a writable local file system ({directory})"
            )
        results.append(Check(name, ok, required and mode == wanted, f"{directory}: {detail}", remedy))
    return results


#: What makes a missing directory, for the remedy (``admin init`` makes the Local API's).
_ADMIN_INIT = "qinglong-edge admin init"


def check_directory(directory: str, name: str, required: bool, *, creator: str = "") -> Check:
    """Exists, is a real directory owned by us, with no group/other permission bits
    (:func:`qinglong_edge.filecheck.directory_problem`).

    ``creator``: the remedy when it is missing (default ``mkdir -p -m 0700 DIR``).
    """
    return _directory_check(directory, name, required, creator=creator)[0]


def _directory_check(directory: str, name: str, required: bool, *, creator: str = "") -> tuple[Check, Problem | None]:
    problem = directory_problem(directory, creator=creator)
    if problem is None:
        st = os.lstat(directory)
        return Check(name, True, required, f"{directory}: mode {stat.S_IMODE(st.st_mode):04o}, owner ok"), None
    detail = problem.message
    if problem.root_cause:
        detail += " (the probes inside it are skipped until this is fixed)"
    return Check(name, False, required, detail, problem.remedy), problem


def _inside(path: str, roots: list[str]) -> bool:
    path = os.path.normpath(path)
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _exists(directory: str) -> bool:
    return os.path.isdir(directory) and not os.path.islink(directory)


def check_hard_links(directory: str, required: bool) -> Check:
    remedy = "put the state directory on ext4/f2fs/ubifs/jffs2/tmpfs, not FAT/exFAT or a FUSE mount without links"
    try:
        with _temp_file(directory, "link") as (path, _fd):
            target = path + ".link"
            try:
                os.link(path, target)
                nlink = os.stat(path).st_nlink
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(target)
    except OSError as exc:
        return Check("hard_links", False, required, f"{directory}: link() failed: {exc.strerror}", remedy)
    ok = nlink == 2
    return Check("hard_links", ok, required, f"{directory}: link() ok, st_nlink={nlink}", "" if ok else remedy)


def check_exclusive_create(directory: str, required: bool) -> Check:
    try:
        with _temp_file(directory, "excl") as (path, _fd):
            try:
                fd2 = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            except FileExistsError:
                return Check("o_excl", True, required, f"{directory}: O_EXCL refuses an existing file")
            os.close(fd2)
    except OSError as exc:
        return Check("o_excl", False, required, f"{directory}: {exc.strerror}", "use a local POSIX file system")
    return Check(
        "o_excl", False, required, f"{directory}: O_EXCL opened an existing file", "use a local POSIX file system"
    )


def check_fsync(directory: str, required: bool) -> Check:
    try:
        with _temp_file(directory, "fsync") as (_path, fd):
            os.write(fd, b"qinglong-edge doctor\n")
            os.fsync(fd)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        return Check(
            "fsync", False, required, f"{directory}: fsync failed: {exc.strerror}",
            "use a file system that supports fsync on files and directories",
        )
    return Check("fsync", True, required, f"{directory}: fsync of file and directory ok")


def check_flock(directory: str, required: bool) -> Check:
    remedy = "use a local file system with flock (not NFS/SMB)"
    try:
        with _temp_file(directory, "flock") as (path, fd):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            other = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                try:
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno in (errno.EAGAIN, errno.EACCES):
                        return Check("flock", True, required, f"{directory}: flock is exclusive")
                    raise
                return Check("flock", False, required, f"{directory}: a second flock succeeded", remedy)
            finally:
                os.close(other)
    except OSError as exc:
        return Check("flock", False, required, f"{directory}: flock failed: {exc.strerror}", remedy)


def check_free_space(directory: str, required: bool) -> Check:
    try:
        st = os.statvfs(directory)
    except OSError as exc:
        return Check("free_space", False, required, f"{directory}: {exc.strerror}", "check the path")
    free = st.f_bavail * st.f_frsize
    ok = free >= MIN_FREE_BYTES
    detail = f"{directory}: {free // (1024 * 1024)} MiB free"
    remedy = "" if ok else f"free at least {MIN_FREE_BYTES // (1024 * 1024)} MiB"
    return Check("free_space", ok, required, detail, remedy)


def _cgroup_probe(base: str) -> str | None:
    name = os.path.join(base, f"qinglong-edge-doctor-{secrets.token_hex(4)}")
    try:
        os.mkdir(name)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        os.rmdir(name)
    return base


def check_cgroups() -> Check:
    """Can the agent create a cgroup per Run (v2 with cgroup.kill, else v1 pids/freezer)?"""
    found = []
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if os.path.exists(os.path.join(base, "cgroup.procs")) and os.path.exists(
            os.path.join(base, "cgroup.controllers")
        ) and _cgroup_probe(base):
            found.append(f"v2 at {base}")
            break
    for controller in ("pids", "freezer"):
        base = os.path.join("/sys/fs/cgroup", controller)
        if os.path.exists(os.path.join(base, "tasks")) and _cgroup_probe(base):
            found.append(f"v1 {controller}")
    if found:
        return Check("cgroups", True, False, "per-run cgroups: " + ", ".join(found))
    remedy = "run serve with a delegated cgroup (systemd Delegate=yes) or as root"
    try:  # what the job wrapper needs to be a child subreaper (process/wrapper.py)
        import _ctypes  # noqa: F401
    except ImportError:
        return Check(
            "cgroups", False, False,
            "no writable cgroup hierarchy: no per-Run cgroup (no maxRunPids cap), and without ctypes "
            "(python3-ctypes) the job wrapper is no child subreaper: processes that leave a Run's process "
            "group (setsid, a double fork) outlive the Run's stop",
            "install python3-ctypes; " + remedy,
        )
    return Check(
        "cgroups", False, False,
        "no writable cgroup hierarchy: no per-Run cgroup (no maxRunPids cap); processes that leave a Run's "
        "process group (setsid, a double fork) are still ended by the job wrapper (a child subreaper)",
        remedy,
    )


def check_memory(config: EdgeConfig) -> Check:
    """Whether jobs run in a memory leaf of their own (issue 24: ``execution.maxRunMemoryBytes``),
    found as the launch finds it (:class:`~qinglong_edge.process.cgroups.CgroupManager`).

    Not required: without one a job's memory is bounded only by the service's (systemd
    ``MemoryMax=``) or the device's; jobs still get ``oom_score_adj`` 1000, so the kernel's
    OOM killer takes a job before the agent.
    """
    from qinglong_edge.process.cgroups import CgroupManager
    from qinglong_edge.worker.remote.job_files import remote_limits

    execution = config.execution
    if execution is not None:
        mode, limit = execution.cgroups, execution.max_run_memory_bytes
    else:
        limits = remote_limits(config)
        mode, limit = limits.cgroups, limits.max_run_memory_bytes
    manager = CgroupManager.detect(mode, memory_max=limit)
    mib = f"{(limit or 0) / (1024 * 1024):g} MiB"
    if manager.memory_available:
        where = "cgroup v2" if manager.v2_memory else "cgroup v1 memory"
        return Check("memory", True, False, f"each job runs in a memory leaf of its own ({where}): {mib}, no swap; "
                     "an OOM kill there is reported as the job's outcome (out_of_memory)")
    why = manager.memory_reason or manager.reason or "cgroups are off"
    return Check("memory", False, False,
                 f"no memory limit for jobs ({why}); they still get oom_score_adj 1000: the kernel's OOM killer "
                 "takes a job before the agent",
                 "systemd: Delegate=yes with DelegateSubgroup=agent (systemd >= 254), as the shipped units do; "
                 "elsewhere run the agent as root or in a delegated cgroup leaf")


def check_isolation(config: EdgeConfig) -> Check:
    """Which isolation a remote job gets, by running one (spec README, "Isolation").

    Not required: without it the device still works, and the detail says plainly what a
    remote job can then read and change. With it, the detail names the PID level (none,
    PID namespace, PID namespace with private /proc) and, below the highest, why.
    """
    from qinglong_edge.process.isolation import probe_isolation
    from qinglong_edge.worker.remote.isolation import remote_hidden_paths, remote_readonly_paths

    paths = ", ".join(remote_hidden_paths(config))
    readonly = ", ".join(remote_readonly_paths(config)) or "none"
    base = config.state_directory if _exists(config.state_directory) else None
    probe = probe_isolation(base)
    if probe.available:
        level = probe.level
        pid = {"none": "no PID namespace: they see every process and may signal the agent's",
               "PID namespace": "a PID namespace: they cannot signal or trace the agent, but see the host's "
                                "/proc (no private /proc: " + probe.pid_reason + ")",
               }.get(level, "a PID namespace with a private /proc: they see and reach only their own processes")
        if level == "none":
            pid += f" ({probe.pid_reason})"
        return Check("isolation", True, False,
                     f"remote jobs run in a private user+mount namespace ({probe.via}), level: {level} ({pid}); "
                     f"hidden from them: {paths}; read-only for them: {readonly} (they share the network)",
                     "" if level == "PID namespace with private /proc" else
                     "allow the PID namespace and a fresh /proc: systemd RestrictNamespaces=user mnt pid without "
                     "ProtectKernelTunables= and ProtectKernelLogs= (as the shipped pull unit does)")
    user = f"uid {os.geteuid()}"
    return Check(
        "isolation", False, False,
        f"no isolation for remote jobs ({probe.reason}), level: none; a remote job runs as {user}, the agent's "
        f"user, and can read everything it can: {paths}, change what it can (the agent's runtime directory, "
        "journal and state included), and signal and trace the agent",
        probe.remedy or "see the README, Security model",
    )


def check_pepper_keyring(directory: str, *, creator: str, database_file: str = "") -> Check:
    """The pepper keyring exactly as ``serve`` checks it before it serves
    (:func:`qinglong_edge.local.guards.check_keyring`: one source of truth, issue 17 item 2):
    a real directory, mode 0700, ours; every key file (``*.pepper``) a regular file, mode
    0600, ours. A keyring ``serve`` would refuse to start with (exit 73 ``unsafe_pepper``)
    fails here, required, with ``serve``'s own line; the first problem is the one reported,
    the directory before its files (one root cause, once).

    ``creator``: the remedy when the directory is missing and ``database_file`` names no
    pepper key; when it does (:func:`qinglong_edge.local.guards.check_keyring_present`, as
    ``serve`` and ``admin init`` refuse), the remedy is to restore the keyring.
    """
    from qinglong_edge.filecheck import ownership_remedy
    from qinglong_edge.local.guards import KEYRING_LOST_REMEDY, check_keyring, check_keyring_present
    from qinglong_edge.local.pepper import PEPPER_SUFFIX, PepperError

    name = "pepper_dir"
    if database_file:
        try:
            check_keyring_present(database_file, directory)
        except PepperError as exc:
            return Check(name, False, True, f"{exc.code}: {exc.message.split(': restore ', 1)[0]}",
                         KEYRING_LOST_REMEDY)
    if not os.path.lexists(directory):
        return Check(name, False, True, f"{directory}: missing", creator)
    try:
        check_keyring(directory)
        keys = sum(1 for entry in os.listdir(directory) if entry.endswith(PEPPER_SUFFIX))
    except PepperError as exc:
        culprit = exc.message.split(": ", 1)[0] if exc.message.startswith("/") else ""
        if exc.code != "unsafe_pepper" or not culprit:
            remedy = "run doctor as the user serve runs as (the keyring must be that user's own)"
        elif "not a regular file" in exc.message or "not a real directory" in exc.message:
            what = "directory" if culprit == directory else "file"
            remedy = (f"replace {shlex.quote(culprit)} with a real {what} of uid {os.geteuid()}, mode "
                      f"{'0700' if what == 'directory' else '0600'} (serve refuses to start until then)")
        else:
            remedy = ownership_remedy(culprit, directory=culprit == directory) + " (serve refuses to start until then)"
        return Check(name, False, True, f"{exc.code}: {exc.message}", remedy)
    except OSError as exc:
        return Check(name, False, True, f"{directory}: {exc.strerror}", "check the keyring directory's permissions")
    return Check(name, True, True, f"{directory}: mode 0700, owner ok; {keys} key file{'s' if keys != 1 else ''}, "
                                   "each a regular file, mode 0600, owner ok (as serve checks them)")


def check_clock() -> Check:
    """The wall clock is set: not before this package's date (``clock.CLOCK_FLOOR_MS``;
    before it ``pull`` claims nothing: ``clock_not_set``)."""
    from qinglong_edge.clock import CLOCK_FLOOR_MS, wall_ms

    now = wall_ms()
    ok = now >= CLOCK_FLOOR_MS
    remedy = "" if ok else ("set the clock (NTP): before this package's build date pull claims nothing "
                            "(TLS cannot judge a certificate's validity)")
    return Check("clock", ok, True, time.strftime("UTC %Y-%m-%d %H:%M", time.gmtime(now / 1000)), remedy)


def check_clock_skew(worker: WorkerConfig) -> Check | None:
    """How far the device's wall clock is from the cluster's, as the last ``pull`` of this
    boot measured it (the sample in the runtime directory, worker/delivery/cluster_clock.py); None
    before any. A skew over 60 s is a warning, not a failure: leases run on the boot clock
    and the times sent are translated (spec README "Decisions for clocks")."""
    from qinglong_edge.clock import boot_ms, wall_ms
    from qinglong_edge.contracts.clocks import SKEW_NOTICE_MS
    from qinglong_edge.worker.delivery.cluster_clock import skew_message, stored_sample

    found = stored_sample(worker.runtime_directory, worker.journal_directory)
    if found is None:
        return None
    skew = found[0].skew_ms(boot_ms(), wall_ms())
    if abs(skew) <= SKEW_NOTICE_MS:
        return Check("clock_skew", True, False, f"within {abs(skew) / 1000:.0f} s of the cluster's clock "
                                                f"(measured by pull, {found[1]})")
    return Check("clock_skew", False, False, skew_message(skew), "enable NTP on the device (OpenWrt: "
                 "uci set system.ntp.enabled=1; systemd: timedatectl set-ntp true)")


def _worker_file_remedy(path: str, forbidden: int) -> str:
    directory = os.path.dirname(path) or "/"
    quoted, parent = shlex.quote(path), shlex.quote(directory)
    if forbidden == 0o077:
        return (f"chown {os.geteuid()} {parent} {quoted} && chmod 0700 {parent} && chmod 0600 {quoted} "
                "(a regular file of the agent's user in a directory only it can enter)")
    return f"chmod go-w {parent} {quoted} (readable by all is fine; writable by others is not)"


def check_worker_file(path: str, name: str, what: str, *, forbidden: int, credential: bool = False) -> Check:
    """Read the file exactly as ``pull`` does before every request
    (:func:`qinglong_edge.worker.ingress.material.read_guarded_file`: the file *and its
    directory* with no ``forbidden`` bits, not a symlink, 1 byte - its limit; the
    credential also parsed as a ``ql3w`` token). Nothing read is shown."""
    from qinglong_edge.errors import TransportError
    from qinglong_edge.worker.ingress.material import (
        MAX_CREDENTIAL_BYTES,
        MAX_TLS_MATERIAL_BYTES,
        read_authorization,
        read_guarded_file,
    )

    limit = MAX_CREDENTIAL_BYTES if credential else MAX_TLS_MATERIAL_BYTES
    content = (f"write the ql3w_<credentialId>_<secret> token the cluster issued for this worker into "
               f"{shlex.quote(path)} as its only line (at most {limit} bytes)") if credential else (
               f"{shlex.quote(path)} must be a PEM file of 1 byte - {limit} bytes")
    try:
        size = len(read_guarded_file(path, limit, forbidden, what))  # the file rules
    except TransportError as exc:
        missing = not os.path.lexists(path)
        remedy = f"install the file at {shlex.quote(path)}" if missing else (
            content if f"{path}: size " in exc.message else _worker_file_remedy(path, forbidden))
        return Check(name, False, True, exc.message, remedy)
    if credential:
        try:
            read_authorization(path)  # its content: one ql3w token line
        except TransportError as exc:
            return Check(name, False, True, exc.message, content)
    kind = "a ql3w token" if credential else f"{size} bytes (limit {limit})"
    rule = "private" if forbidden == 0o077 else "not writable by others"
    return Check(name, True, True, f"{path}: {rule}, {kind}")


def _one_root_cause(file_checks: list[Check],
                    files: dict[str, tuple[str, str, int]]) -> tuple[list[Check], dict[str, str]]:
    """Worker file checks that failed because of the same *directory* (``pull``'s rule
    for the parent: ``...: parent directory ...`` in :func:`check_worker_file`'s detail)
    are one root cause, reported once (issue 18 item 5): the first such check fails with
    the directory's detail and ONE remedy (the directory, plus any of its files that
    would fail next); the others say ``same cause as NAME`` (a warning: not required).

    ``files``: check name -> (path, what, forbidden bits), as given to the checks.
    Returns the checks and, for each one that failed, the check that names its cause
    (itself, or the root it shares).
    """
    groups: dict[str, list[Check]] = {}
    for check in file_checks:
        path, what, _ = files[check.name]
        if not check.ok and check.detail.startswith(f"{what} {path}: parent "):
            groups.setdefault(os.path.dirname(path) or "/", []).append(check)
    replaced: dict[str, Check] = {}
    roots = {check.name: check.name for check in file_checks if not check.ok}
    for parent, members in groups.items():
        if len(members) < 2:
            continue
        root = members[0]
        first_path, first_what, forbidden = files[root.name]
        cause = root.detail[len(f"{first_what} {first_path}: parent directory "):]
        whats = [files[member.name][1] for member in members]
        named = ", ".join(f"the {what}" for what in whats[:-1]) + f" and the {whats[-1]}"
        replaced[root.name] = Check(root.name, False, True, f"{parent}: the directory of {named}: {cause}",
                                    _directory_remedy(parent, [files[m.name][0] for m in members], forbidden))
        for member in members[1:]:
            replaced[member.name] = Check(member.name, False, False,
                                          f"same cause as {root.name} (its directory {parent})",
                                          f"fix {root.name} first")
            roots[member.name] = root.name
    return [replaced.get(check.name, check) for check in file_checks], roots


def _directory_remedy(directory: str, paths: list[str], forbidden: int) -> str:
    """One command line for a worker files' directory and those of its files that break
    the same rule (their modes are checked next, once the directory passes)."""
    quoted = shlex.quote(directory)
    if forbidden != 0o077:
        return f"chmod go-w {quoted} (readable by all is fine; writable by others is not)"
    steps = [f"chmod 0700 {quoted}"]
    loose = []
    for path in paths:
        try:
            if os.lstat(path).st_mode & forbidden:
                loose.append(shlex.quote(path))
        except OSError:
            continue
    if loose:
        steps.append(f"chmod 0600 {' '.join(loose)}")
    return " && ".join(steps) + " (a directory only the agent's user can enter, for its private files)"


def check_architecture(worker: WorkerConfig | None, machine: str | None = None) -> Check:
    """The machine, its QingLong architecture and support tier (offer-delivery.md 5.1).

    With the worker role: required, failing when QingLong has no worker architecture
    for this machine (mips...: the cluster can never place work here); a warning when
    the tier is not ``tier1`` (placement requires tier1 unless a task lists the tier).
    """
    from qinglong_edge.worker.delivery.session import platform_architecture, unsupported_architecture_message

    machine, architecture, tier = platform_architecture(machine)
    if architecture is None:
        detail = f"{machine!r}: no QingLong worker architecture"
        if worker is None:
            return Check("architecture", True, False, detail + " (only the Local API is configured)")
        return Check("architecture", False, True, unsupported_architecture_message(machine),
                     "use this device for the Local run API only (remove the worker section), or a device "
                     "with a supported architecture for the Remote Worker")
    from qinglong_edge.contracts.session import architecture_for_machine

    # uname names the kernel; a 32-bit OS on a 64-bit kernel runs 32-bit programs.
    user_space = " (32-bit user space)" if architecture != architecture_for_machine(machine, 64) else ""
    detail = f"{machine}{user_space}: {architecture}, support tier {tier}"
    if worker is None or tier == "tier1":
        return Check("architecture", True, False, detail)
    return Check("architecture", False, False,
                 detail + f": only tasks whose placement lists {tier} in supportTiers get offers (the default "
                 "placement requires tier1)",
                 f"add \"{tier}\" to the placement's supportTiers of the tasks this device should run")


def check_capabilities(worker: WorkerConfig) -> tuple[Check, Any]:
    """What the device advertises (the capabilities file, or the probes): required; a bad
    file fails it with the line ``pull`` would exit 78 with. Also returns the
    :class:`~qinglong_edge.worker.delivery.capabilities.Advertisement` (None when it failed)."""
    from qinglong_edge.errors import EdgeError
    from qinglong_edge.worker.delivery.capabilities import advertisement, describe, probe
    from qinglong_edge.worker.delivery.session import local_capabilities

    try:
        base = local_capabilities()
        found = None if worker.capabilities_file is not None else probe(worker)
        advert = advertisement(worker, base, found=found)
    except EdgeError as exc:
        return Check("capabilities", False, True, exc.message,
                     "fix the capabilities file (README: Remote Worker setup), or remove worker.capabilitiesFile "
                     "to advertise what the device probes"), None
    return Check("capabilities", True, True, describe(advert, found)), advert


def check_runtime_directory(worker: WorkerConfig) -> Check:
    """``worker.runtimeDirectory``: usable, and in RAM (an idle pull writes there only).

    A warning when ``pull`` would fall back to ``<journal>/run`` (the directory, or the
    subdirectory of this journal, cannot be used) or when it is not on a RAM file system.
    Nothing is created.
    """
    from qinglong_edge.worker.journal.runtime import FALLBACK_NAME, journal_key

    base = worker.runtime_directory
    fallback = os.path.join(worker.journal_directory, FALLBACK_NAME)
    remedy = (f"install -d -m 0700 -o {os.geteuid()} {shlex.quote(base)} (systemd: RuntimeDirectory= in the pull "
              "unit; OpenWrt: the init script makes it), or set worker.runtimeDirectory to a tmpfs directory of "
              "the agent's user")
    problem = directory_problem(base)
    if problem is None or problem.kind == "foreign_owner":
        own = os.path.join(base, journal_key(worker.journal_directory))
        inner = directory_problem(own)
        if inner is not None and inner.kind != "missing":
            problem = inner
        elif problem is not None and not os.access(base, os.W_OK | os.X_OK):
            problem = Problem("unwritable", f"{base}: not writable by uid {os.geteuid()}", remedy)
        else:
            problem = None
    if problem is not None:
        return Check("runtime_dir", False, False,
                     f"{problem.message}: pull keeps its session and owner records in {fallback} instead, so idle "
                     "cycles write to the state's file system", remedy if problem.kind != "foreign_owner" else
                     problem.remedy)
    fstype = _file_system_type(base)
    detail = f"{base}: {fstype or 'unknown file system'}"
    if fstype not in ("tmpfs", "ramfs"):
        return Check("runtime_dir", False, False, detail + ": not in RAM, idle cycles write to it",
                     "set worker.runtimeDirectory to a directory on tmpfs (/run, /var/run, /tmp)")
    return Check("runtime_dir", True, False, detail + " (RAM: an idle pull writes nothing to persistent storage)")


def _runtime_paths(worker: WorkerConfig) -> list[str]:
    """This journal's runtime directories that exist: the configured one, the fallback."""
    from qinglong_edge.worker.journal.runtime import FALLBACK_NAME, journal_key

    return [path for path in (os.path.join(worker.runtime_directory, journal_key(worker.journal_directory)),
                              os.path.join(worker.journal_directory, FALLBACK_NAME)) if os.path.isdir(path)]


def check_runtime_files(worker: WorkerConfig) -> Check:
    """Damaged files in the runtime directory (issue 23): each is named with what the agent
    does about it (never a permanent error; read-only here, nothing is repaired)."""
    from qinglong_edge.worker.runtime_files import damaged_files

    found: list[str] = []
    for path in _runtime_paths(worker):
        try:
            found += [f"{os.path.join(path, name)}: {problem}: {meaning}"
                      for name, problem, meaning in damaged_files(path)]
        except OSError as exc:
            found.append(f"{path}: cannot be listed ({exc.strerror})")
    if not found:
        return Check("runtime_files", True, False, "no damaged file in the runtime directory")
    return Check("runtime_files", False, False, "; ".join(found),
                 "nothing to do: the next pull treats each as said (or remove the file)")


def check_identity(worker: WorkerConfig) -> Check | None:
    """Another device uses this worker id (issue 23 item 6): the quiet window, if any."""
    from qinglong_edge.worker.delivery.identity_guard import THRESHOLD, WINDOW_MS, IdentityGuard, conflict_message
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

    for path in _runtime_paths(worker):
        try:
            store = RuntimeDirectory.existing(path)  # nothing is created
        except OSError:
            continue
        try:
            state = IdentityGuard(store, worker.worker_id).describe()
        finally:
            store.close()
        if state["quietMs"] > 0:
            return Check("worker_identity", False, False,
                         conflict_message(worker.worker_id, -(-state["quietMs"] // 60_000)),
                         "give each device its own worker id and credential (the cluster issues them)")
        if state["foreignReplacements"]:
            return Check("worker_identity", False, False,
                         f"a session this device did not register replaced its session {state['foreignReplacements']}"
                         f" times in the last {WINDOW_MS // 60_000} minutes (at {THRESHOLD} it stops claiming for "
                         f"{WINDOW_MS // 60_000} minutes): another device may use worker id {worker.worker_id}",
                         "give each device its own worker id and credential (the cluster issues them)")
    return None


def _file_system_type(path: str) -> str | None:
    """The type of the mount holding ``path`` (``/proc/self/mountinfo``), or None."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    path = os.path.realpath(path)
    best, best_len = None, -1
    for line in lines:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        mount = fields[4].replace("\\040", " ")
        if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) > best_len:
            best, best_len = line.split(" - ", 1)[1].split()[0], len(mount)
    return best


def _skipped(name: str, because: str) -> Check:
    """A check that could not run because another one failed (reported once, there)."""
    return Check(name, False, False, f"not checked: {because} failed", f"fix {because} first")


def check_certificate_validity(path: str, name: str, *, role: str, private: bool, now_ms: int) -> Check:
    """Every certificate's validity window in one file (issue 18 item 7).

    Fails (required) when one is expired or not yet valid, warns when one ends within
    30 days (:data:`qinglong_edge.worker.ingress.certificates.DOCTOR_WARN_MS`), else passes;
    the detail lists each window. Unreadable dates are a warning: the transport's own
    reading decides whether the file works at all.
    """
    from qinglong_edge.contracts.x509 import iso_utc
    from qinglong_edge.errors import TransportError
    from qinglong_edge.worker.ingress.certificates import DOCTOR_WARN_MS, file_windows

    try:
        windows = file_windows(path, role, private=private)
    except TransportError as exc:
        return Check(name, False, False, exc.message, "install a PEM certificate file that OpenSSL and doctor can read")
    detail = f"{path}: " + "; ".join(f"[{w.index}] {w.validity.describe(now_ms)}" for w in windows)
    states = [w.state(now_ms, DOCTOR_WARN_MS) for w in windows]
    which = "worker.certificateFile" if private else "worker.trustAnchorFiles"
    if "expired" in states or "not_yet_valid" in states:
        if "not_yet_valid" in states:
            remedy = "check the device clock (NTP); else install a certificate that is valid now"
        elif private:
            remedy = f"renew the client certificate and install it at {which} (with its key)"
        else:
            remedy = f"replace the expired trust anchor in {which} with the cluster's current CA"
        return Check(name, False, True, detail, remedy)
    if "expiring" in states:
        end = min(w.validity.not_after_ms for w, state in zip(windows, states, strict=True) if state == "expiring")
        return Check(name, False, False, detail, f"renew it before {iso_utc(end)} ({which})")
    return Check(name, True, True, detail)


def check_worker_tls(worker: WorkerConfig, now_ms: int) -> Check:
    """A real TLS 1.3 handshake with the origin and the client certificate, no request
    sent (:meth:`~qinglong_edge.worker.ingress.transport.IngressTransport.probe_handshake`);
    a failure reports the transport's reason and remedy."""
    from qinglong_edge.errors import TransportError
    from qinglong_edge.worker.ingress.transport import IngressTransport

    name = "worker_tls_handshake"
    target = worker.origin.host_header
    try:
        with IngressTransport.from_config(worker) as transport:
            report = transport.probe_handshake()
    except TransportError as exc:
        return Check(name, False, True, f"{target}: {exc.reason}: {exc.message}", exc.remedy)
    server = report.server_certificate
    parts = [f"{target}: {report.tls_version} {report.cipher}"]
    if server is not None:
        parts.append(f"server certificate {server.describe(now_ms)}")
    if report.client_certificate_accepted:
        parts.append("client certificate accepted (session ticket received)")
    else:
        parts.append("client certificate acceptance unconfirmed (the server sent no session ticket)")
    return Check(name, True, True, "; ".join(parts))


def _worker_checks(worker: WorkerConfig, failed: dict[str, str]) -> Iterator[Check]:
    """The checks that need the worker files: ``failed`` maps each file check that failed
    to the check naming its cause (:func:`_one_root_cause`), which the skips name."""
    now_ms = time.time_ns() // 1_000_000
    if "worker_certificate" in failed:
        yield _skipped("worker_certificate_validity", failed["worker_certificate"])
    else:
        yield check_certificate_validity(worker.certificate_file, "worker_certificate_validity",
                                         role="client certificate", private=True, now_ms=now_ms)
    for index, anchor in enumerate(worker.trust_anchor_files):
        name = f"trust_anchor_validity_{index}"
        if f"trust_anchor_{index}" in failed:
            yield _skipped(name, failed[f"trust_anchor_{index}"])
        else:
            yield check_certificate_validity(anchor, name, role="trust anchor", private=False, now_ms=now_ms)
    if failed:
        yield _skipped("worker_tls_handshake", ", ".join(sorted(set(failed.values()))))
    else:
        yield check_worker_tls(worker, now_ms)


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def _days(ms: int) -> str:
    return f"{ms / 86_400_000:.1f} days"


def _cap(name: str, ok: bool, detail: str) -> Check:
    remedy = "" if ok else "serve prunes to the caps as it runs; `qinglong-edge admin prune` does it now"
    return Check(name, ok, False, detail, remedy)


def check_local_store_caps(config: EdgeConfig) -> list[Check]:
    """Each Local store's size against its cap (issue 16): database, audit, Runs, logs.

    Read-only: the database is opened ``mode=ro`` (never created, migrated or probed;
    in WAL mode SQLite may create the ``-wal``/``-shm`` files any reader needs), the log
    directory only listed. Over a cap is a warning (``serve`` prunes to it). Required
    only where ``serve`` and ``admin`` refuse the database
    (:func:`qinglong_edge.local.guards.check_database_present`: missing or emptied
    while the keyring holds keys, ``database_missing``; a file SQLite calls damaged or not
    a database, ``database_corrupt``).
    """
    local = config.local_api
    if local is None:
        return []
    from qinglong_edge.errors import StoreError
    from qinglong_edge.local.guards import check_database_present

    try:  # the rule serve and admin apply before they open the store
        check_database_present(local.database_file, local.pepper_keyring_directory)
    except StoreError as exc:
        return [Check("store_database", False, True, f"{exc.code}: {exc.message}",
                      "restore the database file from a backup; to start afresh instead, move the pepper keyring "
                      f"aside and run '{_ADMIN_INIT}'")]
    if not os.path.exists(local.database_file):
        return [Check("store_database", True, False, f"{local.database_file}: no database yet")]
    try:
        import sqlite3
        import urllib.parse

        from qinglong_edge.local.retention import measure_store

        uri = "file:" + urllib.parse.quote(local.database_file) + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=local.busy_timeout_ms / 1000)
        try:
            usage = measure_store(conn)
        finally:
            conn.close()
    except Exception as exc:  # noqa: BLE001 - a diagnosis (sqlite3.Error, OSError...), never a traceback
        name = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF in (11, 26):  # SQLITE_CORRUPT, SQLITE_NOTADB
            # serve and admin refuse it (74 database_corrupt): a required check, as database_missing
            return [Check("store_database", False, True,
                          f"database_corrupt: {local.database_file}: damaged or not a SQLite database ({name})",
                          "restore the database file from a backup, or move it aside (serve and admin refuse it)")]
        return [Check("store_database", False, False, f"{local.database_file}: cannot be read ({name})",
                      "check the file (admin init creates it; serve must be able to open it)")]
    now = int(time.time() * 1000)
    checks = [
        _cap("store_database", usage.used_bytes <= local.database_maximum_bytes,
             f"{_mib(usage.used_bytes)} used of {_mib(local.database_maximum_bytes)} (file {_mib(usage.file_bytes)},"
             f" auto_vacuum {usage.to_json()['autoVacuum']})"),
    ]
    audit_age = None if usage.audit_oldest_ms is None else max(0, now - usage.audit_oldest_ms)
    audit_ok = usage.audit_rows <= local.audit_maximum_entries and (
        audit_age is None or audit_age <= local.audit_retention_ms)
    checks.append(_cap(
        "store_audit", audit_ok,
        f"{usage.audit_rows} rows of {local.audit_maximum_entries}"
        + ("" if audit_age is None else f", oldest {_days(audit_age)} of {_days(local.audit_retention_ms)}"),
    ))
    run_age = None if usage.oldest_terminal_ended_ms is None else max(0, now - usage.oldest_terminal_ended_ms)
    checks.append(_cap(
        "store_runs",
        usage.terminal_runs <= local.run_maximum_entries and (run_age is None or run_age <= local.run_retention_ms),
        f"{usage.terminal_runs} terminal Runs of {local.run_maximum_entries} ({usage.runs - usage.terminal_runs}"
        " not terminal, never pruned)"
        + ("" if run_age is None else f", oldest ended {_days(run_age)} ago of {_days(local.run_retention_ms)}"),
    ))
    execution = config.execution
    if execution is not None:
        from qinglong_edge.local.run_logs import scan_logs

        try:
            scan = scan_logs(execution.log_directory)
        except OSError as exc:
            checks.append(Check("store_logs", False, False, f"{execution.log_directory}: {exc.strerror}",
                                "check the log directory"))
        else:
            checks.append(_cap(
                "store_logs", scan.total_bytes <= execution.max_total_log_bytes,
                f"{_mib(scan.total_bytes)} of {_mib(execution.max_total_log_bytes)} in {scan.logs} log files"
                f" ({execution.log_directory})",
            ))
    return checks


def check_journal_caps(config: EdgeConfig) -> list[Check]:
    """The worker journal's inbox and ``abandoned/`` against their caps (read-only).

    Issue 23: only records that still need this device hold inbox entries; finished ones
    make room (the oldest first) and go after ``inboxRetentionMs``. A warning when records
    in flight fill the inbox (no claim is made) or finished ones are past retention.
    """
    worker = config.worker
    if worker is None or not _exists(worker.journal_directory):
        return []
    from qinglong_edge.errors import EdgeError
    from qinglong_edge.worker.journal.view import JournalReader

    now = int(time.time() * 1000)
    try:
        with JournalReader.open(worker.journal_directory) as reader:
            ids = reader.list_offers()
            finished_times = []
            busy = 0
            if ids:
                from qinglong_edge.worker.remote.job_files import in_flight
            for offer_id in ids:
                record = reader.read_offer(offer_id)
                if record is None:
                    continue
                if in_flight(record, now):
                    busy += 1
                else:
                    finished_times.append(int(record["updatedAtMs"]))
            abandoned = reader.count_abandoned()
    except EdgeError as exc:
        return [Check("store_inbox", False, False, f"{worker.journal_directory}: {exc.code}",
                      "run `qinglong-edge inbox list` for the details")]
    cap = worker.inbox_maximum_entries
    oldest = max((now - t for t in finished_times), default=None)
    due = oldest is not None and oldest > worker.inbox_retention_ms
    detail = (f"{busy} of {cap} entries held by records that need this device; {len(finished_times)} finished"
              + ("" if oldest is None else f" (oldest {_days(max(0, oldest))} of {_days(worker.inbox_retention_ms)};"
                 " the oldest goes when room is needed)"))
    if busy >= cap:
        remedy = ("no claim is made until one of them ends: `qinglong-edge inbox list` shows them (the resident "
                  "pull drives each to its end); `qinglong-edge inbox discard OFFER_ID --yes --force` gives one up")
    elif due:
        remedy = "every pull cycle prunes them; `qinglong-edge admin prune` does it now"
    else:
        remedy = ""
    return [
        Check("store_inbox", busy < cap and not due, False, detail, remedy),
        _cap("store_abandoned", abandoned <= worker.abandoned_maximum_entries,
             f"{abandoned} abandoned claims of {worker.abandoned_maximum_entries}"),
    ]


def _storage_checks(directory: str, label: str, required: bool, creator: str = "") -> tuple[list[Check], bool]:
    """The directory check and the probes inside it; the bool says whether it is usable."""
    check, problem = _directory_check(directory, f"{label}_dir", required, creator=creator)
    if problem is not None and (problem.root_cause or problem.kind == "missing"):
        return [check], False
    results = [check]
    probes: list[Callable[[str, bool], Check]] = [
        check_hard_links, check_exclusive_create, check_fsync, check_flock, check_free_space,
    ]
    for probe in probes:
        result = probe(directory, required)
        results.append(Check(f"{label}_{result.name}" if label != "state" else result.name,
                             result.ok, result.required, result.detail, result.remedy))
    return results, True


def run_checks(config: EdgeConfig) -> list[Check]:
    """Run every check that applies to ``config``'s roles, in a stable order."""
    worker, local = config.worker, config.local_api
    checks = [check_python(), check_tls13(worker is not None), check_sqlite(local is not None),
              check_architecture(worker)]
    if worker is not None:
        from qinglong_edge.worker.delivery.session import platform_architecture

        if platform_architecture()[1] is not None:  # else the architecture check says why nothing is advertised
            checks.append(check_capabilities(worker)[0])
    # `admin init` opens the database first, which creates its directory 0700.
    made_by_init = local is not None and os.path.dirname(local.database_file) == config.state_directory
    state_creator = f"mkdir -p -m 0700 {shlex.quote(config.state_directory)}" + (
        f" (or run '{_ADMIN_INIT}', which creates it)" if made_by_init else ""
    )
    state, usable = _storage_checks(config.state_directory, "state", True, state_creator)
    checks.extend(state)
    # Directories whose root cause was already reported: nothing inside them is probed.
    broken = [] if usable or not os.path.lexists(config.state_directory) else [config.state_directory]
    if worker is not None:
        journal = worker.journal_directory
        if journal != config.state_directory and _exists(journal) and not _inside(journal, broken):
            found, ok = _storage_checks(journal, "journal", True)
            checks.extend(found)
            if not ok:
                broken.append(journal)
        checks.append(check_runtime_directory(worker))
        checks.append(check_runtime_files(worker))
        identity = check_identity(worker)
        if identity is not None:
            checks.append(identity)
        files = {
            "worker_credential": (worker.credential_file, "credential file", 0o077),
            "worker_private_key": (worker.private_key_file, "private key file", 0o077),
            "worker_certificate": (worker.certificate_file, "certificate file", 0o077),
        }
        files |= {f"trust_anchor_{index}": (anchor, "trust anchor file", 0o022)
                  for index, anchor in enumerate(worker.trust_anchor_files)}
        file_checks = [check_worker_file(path, name, what, forbidden=forbidden, credential=name == "worker_credential")
                       for name, (path, what, forbidden) in files.items()]
        file_checks, failed = _one_root_cause(file_checks, files)
        checks.extend(file_checks)
        checks.extend(_worker_checks(worker, failed))
    if local is not None:
        db_dir = os.path.dirname(local.database_file)
        if _inside(db_dir, broken):
            pass  # its directory's problem is the one to fix first
        elif _exists(db_dir):
            checks.extend(check_sqlite_journal(db_dir, config.profile, True))
        else:
            checks.append(Check(
                "sqlite_write", False, True, f"{db_dir}: missing",
                f"mkdir -p -m 0700 {shlex.quote(db_dir)} (or run '{_ADMIN_INIT}', which creates it)",
            ))
        if not _inside(local.pepper_keyring_directory, broken):
            checks.append(check_pepper_keyring(
                local.pepper_keyring_directory,
                creator=f"run '{_ADMIN_INIT}' as the agent's user (it creates the keyring 0700 and its first key)",
                database_file=local.database_file,
            ))
    if config.execution is not None:
        checks.append(check_cgroups())
    if config.execution is not None or worker is not None:
        checks.append(check_memory(config))
    if worker is not None:
        checks.append(check_isolation(config))
    checks.append(check_clock())
    skew = check_clock_skew(worker) if worker is not None else None
    if skew is not None:
        checks.append(skew)
    checks.extend(check_local_store_caps(config))
    checks.extend(check_journal_caps(config))
    return checks
