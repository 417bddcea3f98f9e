"""A resource envelope on real kernel limits: a fresh cgroup with ``memory`` and ``pids``
limits (the edge promise: 128 MiB, 64 tasks), children to run processes in, and the
kernel's own counters read back.

Two backends, chosen by :func:`probe`:

* ``v2``: a unified hierarchy whose root already delegates ``memory`` and ``pids``
  (``cgroup.subtree_control``, as systemd sets it up). The envelope is a child of the
  root with ``memory.max``, ``memory.swap.max`` = 0 and ``pids.max``; it enables the two
  controllers for its own children (it holds no process itself: cgroup v2's "no internal
  processes" rule).
* ``v1``: the ``memory`` and ``pids`` hierarchies (``memory.limit_in_bytes``,
  ``memory.memsw.limit_in_bytes`` where swap is accounted, ``memory.swappiness`` 0,
  ``pids.max``). The envelope is also created, without limits, in the v1 ``freezer`` and
  the (hybrid) unified hierarchy when they are mounted, so a child delegated to the agent
  sits in the agent's *own* cgroup there too and the agent's per-Run cgroups nest inside
  the envelope (``qinglong_edge.process.cgroups`` tries the agent's own cgroup first).

Each envelope lives under the caller's own cgroup when it may create one there (a
delegated subtree: the machine's accounting of the caller still covers it), else under
the hierarchy root, and is named ``qinglong-envelope-<uuid>``; nothing else is touched.

Limits sit on the envelope; processes run in children (:meth:`Envelope.child`), so the
enforcement proof and the agent share one limit while each child has fresh counters
(peaks cannot be reset in every version). Delegating a child to a user chowns only the
directory and its membership files (``cgroup.procs``, ``tasks``, ``cgroup.threads``,
``cgroup.subtree_control``), never a limit file: the agent may create cgroups below it
but cannot raise its own budget.

Processes enter a child before they run a line of their own code: :meth:`Cgroup.spawn`
starts ``/bin/sh`` at a gate (``read go``) as the target user, root writes its pid into
every ``cgroup.procs``, then opens the gate and the shell ``exec``\\ s the command.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from tests.support.wait import wait_until

MIB = 1024 * 1024
PREFIX = "qinglong-envelope-"
_GATE = 'IFS= read -r go || exit 125; [ "$go" = go ] || exit 125; exec "$@" </dev/null'
#: Membership files a delegated user may write (cgroup v1 and v2).
_DELEGATED = ("cgroup.procs", "tasks", "cgroup.threads", "cgroup.subtree_control")
_PR_SET_CHILD_SUBREAPER = 36
#: Pids started by :meth:`Cgroup.spawn` (their Popen reaps them, never the reaper).
_spawned: set[int] = set()
_spawn_lock = threading.Lock()


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read()
    except OSError:
        return None


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)


def _keyed(text: str | None) -> dict[str, int]:
    """``key value`` lines (``memory.events``, ``pids.events``, ``memory.oom_control``)."""
    found: dict[str, int] = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            found[key] = int(value)
    return found


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    return None if text in ("", "max") else int(text)


def hierarchies(mountinfo: str | None = None) -> dict[str, str]:
    """Mount points of the hierarchy roots: ``v2``, ``memory``, ``pids``, ``freezer``."""
    found: dict[str, str] = {}
    for line in (mountinfo if mountinfo is not None else _read("/proc/self/mountinfo") or "").splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or fields[3] != "/":
            continue
        if tail[0] == "cgroup2":
            found.setdefault("v2", fields[4])
        elif tail[0] == "cgroup":
            for kind in ("memory", "pids", "freezer"):
                if kind in tail[2].split(","):
                    found.setdefault(kind, fields[4])
    return found


def _own(kind: str) -> str:
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        number, controllers, path = [*line.split(":", 2), "", ""][:3]
        if (kind == "v2" and number == "0" and not controllers) or kind in controllers.split(","):
            return path.strip("/")
    return ""


def _creatable(parent: str) -> bool:
    probe = os.path.join(parent, f".{PREFIX}probe-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(probe)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.rmdir(probe)
    return True


def _base(kind: str, mount: str) -> str | None:
    """The caller's own cgroup if a child can be made there, else the root, else None."""
    own = _own(kind)
    candidates = ([os.path.join(mount, own)] if own and ".." not in own.split("/") else []) + [mount]
    return next((c for c in candidates if _creatable(c)), None)


def probe() -> tuple[str, str]:
    """``("v2" | "v1", "")`` when an envelope can be made here, else ``("", reason)``."""
    if os.geteuid() != 0:
        return "", "creating cgroups with limits needs root (CI runs as root)"
    mounts = hierarchies()
    v2 = mounts.get("v2")
    if v2 is not None:
        delegated = set((_read(os.path.join(v2, "cgroup.subtree_control")) or "").split())
        if {"memory", "pids"} <= delegated and _creatable(v2):
            return "v2", ""
    if "memory" in mounts and "pids" in mounts:
        if _base("memory", mounts["memory"]) and _base("pids", mounts["pids"]):
            return "v1", ""
        return "", "the cgroup v1 memory/pids hierarchies are not writable"
    return "", ("neither cgroup v2 with memory+pids delegated at its root nor the cgroup v1 memory and "
                f"pids hierarchies are available (mounted: {sorted(mounts) or 'none'})")


@dataclass
class Cgroup:
    """One cgroup, as a directory per hierarchy kind (``memory``, ``pids``, ``freezer``,
    ``v2``). ``backend`` says which kinds hold memory and pids: ``v1`` or ``v2``."""

    backend: str
    paths: dict[str, str] = field(default_factory=dict)

    @property
    def memory(self) -> str:
        return self.paths["v2" if self.backend == "v2" else "memory"]

    @property
    def pids(self) -> str:
        return self.paths["v2" if self.backend == "v2" else "pids"]

    def procs_files(self) -> list[str]:
        return [os.path.join(path, "cgroup.procs") for path in self.paths.values()]

    def subtree(self) -> Iterator[str]:
        """Every directory of this cgroup and its descendants, deepest first."""
        for top in self.paths.values():
            for directory, _, _ in sorted(os.walk(top), key=lambda item: -item[0].count("/")):
                yield directory

    def members(self) -> set[int]:
        """Pids in this cgroup or any descendant, in any hierarchy."""
        pids: set[int] = set()
        for directory in self.subtree():
            pids.update(int(p) for p in (_read(os.path.join(directory, "cgroup.procs")) or "").split())
        return pids

    def descendants(self) -> list[str]:
        """Relative paths of the cgroups below this one (in any hierarchy)."""
        found = set()
        for top in self.paths.values():
            for directory, _, _ in os.walk(top):
                if directory != top:
                    found.add(os.path.relpath(directory, top))
        return sorted(found)

    def stats(self) -> dict[str, int | None]:
        """The kernel's counters for memory (bytes) and pids (tasks: processes + threads).

        ``memory_peak``: v1 ``memory.max_usage_in_bytes`` / v2 ``memory.peak`` (both count
        page cache and tmpfs pages charged to the cgroup, not only process memory);
        ``memory_anon``/``memory_file``/``memory_shmem``: now, from ``memory.stat``;
        ``memory_limit_hits``: v1 ``memory.failcnt`` (+ ``memsw``) / v2 ``memory.events max``;
        ``oom_kills``: v1 ``memory.oom_control oom_kill`` / v2 ``memory.events oom_kill``;
        ``pids_peak``: ``pids.peak`` where the kernel has it (else None: sample instead);
        ``fork_failures``: ``pids.events max`` (v1: forks refused to processes of this
        cgroup; v2: refusals at this cgroup's limit or below, hierarchical).
        """
        m, p = self.memory, self.pids
        if self.backend == "v2":
            events = _keyed(_read(os.path.join(m, "memory.events")))
            memory = {
                "memory_current": _int(_read(os.path.join(m, "memory.current"))),
                "memory_peak": _int(_read(os.path.join(m, "memory.peak"))),
                "memory_limit": _int(_read(os.path.join(m, "memory.max"))),
                "memory_limit_hits": events.get("max"),
                "oom_events": events.get("oom"),
                "oom_kills": events.get("oom_kill"),
            }
        else:
            oom = _keyed(_read(os.path.join(m, "memory.oom_control")))
            hits = _int(_read(os.path.join(m, "memory.failcnt")))
            memsw = _int(_read(os.path.join(m, "memory.memsw.failcnt")))
            memory = {
                "memory_current": _int(_read(os.path.join(m, "memory.usage_in_bytes"))),
                "memory_peak": _int(_read(os.path.join(m, "memory.max_usage_in_bytes"))),
                "memory_limit": _int(_read(os.path.join(m, "memory.limit_in_bytes"))),
                "memory_limit_hits": None if hits is None else hits + (memsw or 0),
                "oom_events": oom.get("under_oom"),
                "oom_kills": oom.get("oom_kill"),
            }
        stat = _keyed(_read(os.path.join(m, "memory.stat")))
        names = (("anon", "file", "shmem") if self.backend == "v2" else ("total_rss", "total_cache", "total_shmem"))
        memory |= {f"memory_{key}": stat.get(name) for key, name in zip(("anon", "file", "shmem"), names, strict=True)}
        limit = memory["memory_limit"]
        if limit is not None and limit >= 1 << 62:  # v1 "unlimited" is a huge number
            memory["memory_limit"] = None
        return memory | {
            "pids_current": _int(_read(os.path.join(p, "pids.current"))),
            "pids_peak": _int(_read(os.path.join(p, "pids.peak"))),
            "pids_limit": _int(_read(os.path.join(p, "pids.max"))),
            "fork_failures": _keyed(_read(os.path.join(p, "pids.events"))).get("max"),
        }

    def reset_memory_peak(self) -> bool:
        """v1: restart ``max_usage_in_bytes`` and ``failcnt`` from now (v2 cannot, portably)."""
        if self.backend != "v1":
            return False
        for name in ("memory.max_usage_in_bytes", "memory.failcnt", "memory.memsw.max_usage_in_bytes",
                     "memory.memsw.failcnt"):
            with contextlib.suppress(FileNotFoundError):
                _write(os.path.join(self.memory, name), "0")
        return True

    def spawn(self, argv: Sequence[str], *, user: int, group: int, env: Mapping[str, str], cwd: str = "/",
              stdout: int | IO[Any] | None = subprocess.DEVNULL,
              stderr: int | IO[Any] | None = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
        """Start ``argv`` as ``user``:``group`` (no supplementary groups) inside this cgroup
        in every hierarchy, before it runs (see the module docstring)."""
        with _spawn_lock:
            proc = subprocess.Popen(["/bin/sh", "-c", _GATE, "envelope-enter", *argv], stdin=subprocess.PIPE,
                                    stdout=stdout, stderr=stderr, env=dict(env), cwd=cwd, user=user, group=group,
                                    extra_groups=[], start_new_session=True)
            _spawned.add(proc.pid)
        assert proc.stdin is not None
        try:
            for procs in self.procs_files():
                _write(procs, str(proc.pid))
            proc.stdin.write(b"go\n")
            proc.stdin.close()
            proc.stdin = None  # communicate() must not flush it again
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        return proc

    def kill(self, timeout: float = 10.0) -> bool:
        """SIGKILL every process in the subtree until it is empty; True when it is."""

        def emptied() -> bool:
            members = self.members()
            if not members:
                return True
            kill_file = os.path.join(self.paths.get("v2", ""), "cgroup.kill")
            if "v2" in self.paths and os.path.exists(kill_file):
                with contextlib.suppress(OSError):
                    _write(kill_file, "1")
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return False

        return wait_until(emptied, timeout, interval=0.02)

    def remove(self, timeout: float = 10.0) -> list[str]:
        """Kill what is left, remove the subtree; returns the directories that stayed."""
        self.kill(timeout)
        return [directory for directory in self.subtree()
                if not wait_until(functools.partial(_rmdir, directory), timeout, interval=0.02)]


def _rmdir(directory: str) -> bool:
    """Remove an empty cgroup directory: True when it is gone, False while the kernel refuses."""
    try:
        os.rmdir(directory)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


@dataclass
class Envelope(Cgroup):
    """The limit holder (see the module docstring); make one with :meth:`create`."""

    name: str = ""

    @classmethod
    def create(cls, backend: str, *, memory_bytes: int, pids_max: int, name: str | None = None) -> Envelope:
        """A fresh envelope; raises OSError if a directory or limit cannot be written
        (whatever was created is removed first)."""
        envelope = cls(backend, name=name or PREFIX + uuid.uuid4().hex)
        mounts = hierarchies()
        kinds = ["v2"] if backend == "v2" else [k for k in ("memory", "pids", "freezer", "v2") if k in mounts]
        try:
            for kind in kinds:
                base = _base(kind, mounts[kind])
                if base is None:
                    if kind in ("freezer", "v2") and backend == "v1":
                        continue  # only for the agent's per-Run cgroups; it copes without
                    raise PermissionError(f"cannot create a cgroup in the {kind} hierarchy")
                path = os.path.join(base, envelope.name)
                os.mkdir(path)
                envelope.paths[kind] = path
            envelope._limit(memory_bytes, pids_max)
        except BaseException:
            envelope.remove()
            raise
        return envelope

    @classmethod
    def attach(cls, backend: str, name: str) -> Envelope:
        """The existing envelope ``name`` (for cleanup by another process)."""
        envelope = cls(backend, name=name)
        for kind, mount in hierarchies().items():
            for base in {os.path.join(mount, _own(kind)), mount}:
                if os.path.isdir(os.path.join(base, name)):
                    envelope.paths[kind] = os.path.join(base, name)
        return envelope

    def _limit(self, memory_bytes: int, pids_max: int) -> None:
        if self.backend == "v2":
            _write(os.path.join(self.memory, "memory.max"), str(memory_bytes))
            with contextlib.suppress(FileNotFoundError):
                _write(os.path.join(self.memory, "memory.swap.max"), "0")
            _write(os.path.join(self.pids, "pids.max"), str(pids_max))
            _write(os.path.join(self.memory, "cgroup.subtree_control"), "+memory +pids")
            return
        _write(os.path.join(self.memory, "memory.limit_in_bytes"), str(memory_bytes))
        # Without swap accounting the limit would only bound RAM and the excess would be
        # swapped out instead of killed: cap memory+swap too where the kernel accounts
        # it, and never swap this cgroup's pages.
        with contextlib.suppress(FileNotFoundError):
            _write(os.path.join(self.memory, "memory.memsw.limit_in_bytes"), str(memory_bytes))
        with contextlib.suppress(OSError):
            _write(os.path.join(self.memory, "memory.swappiness"), "0")
        _write(os.path.join(self.pids, "pids.max"), str(pids_max))

    def child(self, name: str, *, owner: tuple[int, int] | None = None) -> Cgroup:
        """A child cgroup in every hierarchy of the envelope, delegated to ``owner``
        (uid, gid) when given (directory and membership files only)."""
        group = Cgroup(self.backend)
        for kind, parent in self.paths.items():
            path = os.path.join(parent, name)
            os.mkdir(path)
            group.paths[kind] = path
            if owner is not None:
                os.chown(path, *owner)
                for entry in _DELEGATED:
                    with contextlib.suppress(FileNotFoundError):
                        os.chown(os.path.join(path, entry), *owner)
        return group


class OrphanReaper:
    """Makes this process the child subreaper of everything it starts and reaps the
    orphans (processes whose parent died: a job's children after a stop, a fork bomb's
    generations) at once, as procd or systemd do as PID 1.

    Why: a pid stays charged to its cgroup's ``pids.current`` until it is reaped, and an
    init that reaps late (this build machine's PID 1 reaps about every 2 s) would count
    its zombies against the agent's 64-task budget. Children started by
    :meth:`Cgroup.spawn` are left to their ``Popen``. Linux only (``prctl`` via ctypes;
    test code, not the agent).
    """

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.reaped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="envelope-reaper", daemon=True)

    def start(self) -> bool:
        """Become the subreaper and start reaping; False if ``prctl`` refused."""
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return False
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with _spawn_lock:
                try:
                    info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                except ChildProcessError:
                    info = None
                if info is not None and info.si_pid not in _spawned:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(info.si_pid, os.WNOHANG)
                    self.reaped += 1
                    continue
            self._stop.wait(self.interval_s)
