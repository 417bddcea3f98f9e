"""A cgroup per Run, so that processes which leave the process group still die with it.

``setsid`` and double-fork escape ``kill(-pgid)`` (field-lessons.md 3); a cgroup does
not: every descendant of a process inside it stays inside. (Without a cgroup the job
wrapper, a child subreaper, still finds and ends them: :mod:`.wrapper`; a cgroup also
covers a wrapper killed alone, and carries the PID cap.) Where the agent can create
cgroups, each attempt gets ``<base>/qinglong-edge/<attemptId>`` in every usable hierarchy,
where ``<base>`` is the agent's own cgroup when it may create children there (systemd
``Delegate=yes``: the Runs then stay inside the service's ``TasksMax``/``MemoryMax``
budget and its subtree), else the hierarchy's root (root on a router without systemd):

* cgroup v2 (the unified hierarchy, ``/sys/fs/cgroup`` or ``/sys/fs/cgroup/unified`` in
  hybrid mode): membership, ``cgroup.kill`` (Linux >= 5.14, atomic, catches a process that
  is forking) or, before 5.14, ``cgroup.freeze``. No controller is needed or enabled.
* cgroup v1 ``freezer``: freeze, SIGKILL every member, thaw (members cannot fork or
  exit while frozen, so the pid list is stable while we signal it).
* cgroup v1 ``pids``: membership and an optional ``pids.max`` cap for the Run.
* the job's memory leaf (``memory_max``, :mod:`qinglong_edge.process.cgroup_memory`): the
  v1 ``memory`` hierarchy's ``qinglong-edge/<name>`` or, on v2 with the agent in a leaf of
  a delegated cgroup, ``<name>/job`` beside ``<name>/wrapper``. The job enters it itself
  (:meth:`RunCgroup.job_procs_files`); the wrapper never does.

How a process gets in: the launcher starts the job through a tiny ``/bin/sh`` wrapper
that writes its own pid (``$$``) into every ``cgroup.procs`` of :meth:`RunCgroup.procs_files`
and only then ``exec``\\ s the command, so the job cannot fork before it is inside (see
:mod:`qinglong_edge.process.spawn`). We do not use ``preexec_fn``: it is not safe
in a process that has threads (the HTTP pool, the store thread).

We never touch a cgroup we did not create: every path is ``<base>/qinglong-edge/<name>``
with ``name`` matching the Local API id grammar, and :meth:`CgroupManager.owned_names`
lists only that directory. No controller is enabled (``cgroup.subtree_control`` is not
written) but for the v2 memory leaves, and only below a cgroup that holds no process
(:func:`qinglong_edge.process.cgroup_memory.v2_memory_base`), so cgroup v2's "no internal
processes" rule never applies to the agent's own cgroup.
Detection (``execution.cgroups``: ``auto`` | ``off``) happens once, at controller start,
by creating and removing a probe cgroup.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable, Iterable

from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.digest import random_hex
from qinglong_edge.errors import ExecutionError
from qinglong_edge.process.cgroup_memory import (
    JOB_LEAF,
    WRAPPER_LEAF,
    create_v1_leaf,
    create_v2_leaves,
    oom_kills,
    read_control,
    v2_memory_base,
    write_control,
)
from qinglong_edge.process.identity import read_proc_stat

__all__ = [
    "OUT_OF_MEMORY",
    "PARENT",
    "CgroupManager",
    "Hierarchy",
    "RunCgroup",
    "find_hierarchies",
    "out_of_memory",
    "own_cgroups",
    "signal_pids",
]

#: Every cgroup we create lives under this directory of each hierarchy.
PARENT = "qinglong-edge"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
#: How long to wait for a freezer to report frozen before killing anyway (ms).
_FREEZE_WAIT_MS = 1000
_POLL_S = 0.005


class Hierarchy(Frozen):
    """One mounted cgroup hierarchy we may use.

    Attributes:
        kind: ``v2``, ``freezer`` (v1) or ``pids`` (v1).
        mount: its mount point, e.g. ``/sys/fs/cgroup/unified``.
        base: the cgroup directory that holds our ``qinglong-edge`` directory (the
            mount point itself when empty).
    """

    __slots__ = ("kind", "mount", "base")  # noqa: RUF023 (field order)

    kind: str
    mount: str
    base: str

    def __init__(self, kind: str, mount: str, base: str = "") -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "mount", mount)
        object.__setattr__(self, "base", base)

    @property
    def parent(self) -> str:
        return os.path.join(self.base or self.mount, PARENT)


def _unescape_mount(text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def find_hierarchies(mountinfo: str) -> list[Hierarchy]:
    """The v2, v1 freezer, v1 pids and v1 memory mounts in a ``/proc/self/mountinfo`` text.

    Only mounts of the hierarchy root (mountinfo field 4 is ``/``) are used: below a
    bind-mounted sub-tree the paths in ``/proc/<pid>/cgroup`` would not line up.
    The first mount of each kind wins.
    """
    found: dict[str, Hierarchy] = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        tail = right.split()
        if len(fields) < 5 or len(tail) < 3 or fields[3] != "/":
            continue
        mount = _unescape_mount(fields[4])
        fstype, options = tail[0], set(tail[2].split(","))
        if fstype == "cgroup2":
            found.setdefault("v2", Hierarchy("v2", mount))
        elif fstype == "cgroup":
            for kind in ("freezer", "pids", "memory"):
                if kind in options:
                    found.setdefault(kind, Hierarchy(kind, mount))
    return [found[k] for k in ("v2", "freezer", "pids", "memory") if k in found]


def own_cgroups(text: str) -> dict[str, str]:
    """The agent's cgroup path per hierarchy kind, from a ``/proc/self/cgroup`` text.

    Lines are ``id:controllers:path``; v2 is ``0::/path``. Unparsable lines are skipped.
    """
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        controllers = set(parts[1].split(",")) if parts[1] else set()
        if parts[0] == "0" and not controllers:
            found.setdefault("v2", parts[2])
        for kind in ("freezer", "pids", "memory"):
            if kind in controllers:
                found.setdefault(kind, parts[2])
    return found


def _read_pids(path: str) -> set[int]:
    try:
        return {int(line) for line in read_control(path).split()}
    except FileNotFoundError:
        return set()


def _pidfd_open(pid: int) -> int | None:
    """A pidfd for ``pid``; ``None`` if it is gone; -1 if pidfds are unsupported."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except (AttributeError, OSError):
        return -1


def signal_pids(
    pids: Iterable[int], sig: int, still_member: Callable[[], set[int]]
) -> int:
    """Send ``sig`` to each pid that is still a member after a pidfd was opened for it.

    A pid read from a membership list may exit and be recycled before we signal it.
    So: open a pidfd for every listed pid first, re-read the membership, and signal
    through the pidfd only the pids still listed. A pidfd names the process that held
    the pid when it was opened; if that process is still alive and the pid is still a
    member, it is that process; if it died, the signal fails with ESRCH (tolerated).
    Without pidfd support (Linux < 5.3) plain ``kill`` is used after the re-read.

    Returns:
        the number of signals delivered.

    Raises:
        ExecutionError: ``signal_failed`` for an error other than ESRCH.
    """
    opened: dict[int, int] = {}
    try:
        for pid in pids:
            fd = _pidfd_open(pid)
            if fd is not None:
                opened[pid] = fd
        current = still_member()
        sent = 0
        for pid, fd in opened.items():
            if pid not in current:
                continue
            try:
                if fd >= 0:
                    signal.pidfd_send_signal(fd, sig)
                else:
                    os.kill(pid, sig)
                sent += 1
            except ProcessLookupError:
                continue
            except OSError as exc:
                raise ExecutionError(f"signal to a Run process failed: {exc.strerror}", code="signal_failed") from None
        return sent
    finally:
        for fd in opened.values():
            if fd >= 0:
                os.close(fd)


class RunCgroup:
    """The cgroup directories of one Run attempt, one per usable hierarchy.

    Attributes:
        name: the attempt id (the directory name under ``qinglong-edge/``).
        paths: hierarchy kind -> directory.
    """

    __slots__ = ("leaves", "name", "paths")

    def __init__(self, name: str, paths: dict[str, str] | None = None, *, leaves: bool = False) -> None:
        self.name = name
        self.paths: dict[str, str] = {} if paths is None else paths
        #: v2 with a memory leaf: the wrapper in ``<v2>/wrapper``, the job in ``<v2>/job``
        #: (:mod:`qinglong_edge.process.cgroup_memory`).
        self.leaves = leaves

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, RunCgroup)
        return (self.name, self.paths) == (other.name, other.paths)

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass was

    def __repr__(self) -> str:
        return f"RunCgroup(name={self.name!r}, paths={self.paths!r})"

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files the job wrapper writes its pid into (not the memory
        leaf: that one is the job's, :meth:`job_procs_files`)."""
        return [os.path.join(self._wrapper_dir(kind, path), "cgroup.procs")
                for kind, path in self.paths.items() if kind != "memory"]

    def _wrapper_dir(self, kind: str, path: str) -> str:
        return os.path.join(path, WRAPPER_LEAF) if kind == "v2" and self.leaves else path

    def job_procs_files(self) -> list[str]:
        """The ``cgroup.procs`` of the job's memory leaf, entered by the job itself (the
        wrapper's forked child) before anything else: empty without one."""
        leaf = self.memory_leaf()
        return [] if leaf is None else [os.path.join(leaf, "cgroup.procs")]

    def memory_leaf(self) -> str | None:
        """The job's memory cgroup (v2 ``<run>/job``, v1 the memory hierarchy's), or None."""
        if self.leaves and "v2" in self.paths:
            return os.path.join(self.paths["v2"], JOB_LEAF)
        return self.paths.get("memory")

    def oom_kills(self) -> int | None:
        """Processes of the job the kernel's OOM killer ended in its memory leaf (its
        ``oom_kill`` counter), or None without a leaf or a counter."""
        leaf = self.memory_leaf()
        return None if leaf is None else oom_kills(leaf, v2=self.leaves and "v2" in self.paths)

    def _membership_paths(self) -> list[str]:
        for kind in ("v2", "freezer", "pids", "memory"):
            if kind in self.paths:
                base = self.paths[kind]
                if kind == "v2" and self.leaves:
                    return [os.path.join(base, leaf, "cgroup.procs") for leaf in (WRAPPER_LEAF, JOB_LEAF)]
                return [os.path.join(base, "cgroup.procs")]
        raise ExecutionError("cgroup has no hierarchy", code="provider_unavailable")

    def members(self) -> set[int]:
        """Pids of the processes in the Run's cgroup (v2 if present, else v1)."""
        try:
            found: set[int] = set()
            for path in self._membership_paths():
                found |= _read_pids(path)
            return found
        except OSError as exc:
            raise ExecutionError(f"cgroup {self.name}: {exc.strerror}", code="provider_unavailable") from None

    def signal_members(self, sig: int) -> int:
        """Send ``sig`` to every member, race-free (see :func:`signal_pids`)."""
        return signal_pids(self.members(), sig, self.members)

    def kill(self) -> None:
        """SIGKILL everything in the cgroup, including processes that are forking.

        v2 ``cgroup.kill`` when present; else freeze (v2 ``cgroup.freeze`` or v1
        freezer), SIGKILL every member, thaw; else SIGKILL each member (bounded by the
        pids cap where there is one).

        Raises:
            ExecutionError: ``provider_unavailable`` / ``signal_failed``.
        """
        try:
            v2 = self.paths.get("v2")
            if v2 is not None and os.path.exists(os.path.join(v2, "cgroup.kill")):
                write_control(os.path.join(v2, "cgroup.kill"), "1")
                return
            if "freezer" in self.paths:
                self._frozen_kill(
                    os.path.join(self.paths["freezer"], "freezer.state"), "FROZEN", "THAWED",
                    lambda: read_control(os.path.join(self.paths["freezer"], "freezer.state")).strip() == "FROZEN",
                )
                return
            if v2 is not None and os.path.exists(os.path.join(v2, "cgroup.freeze")):
                self._frozen_kill(
                    os.path.join(v2, "cgroup.freeze"), "1", "0",
                    lambda: "frozen 1" in read_control(os.path.join(v2, "cgroup.events")),
                )
                return
            self.signal_members(signal.SIGKILL)
        except OSError as exc:
            raise ExecutionError(
                f"cgroup {self.name}: kill failed: {exc.strerror}", code="provider_unavailable"
            ) from None

    def _frozen_kill(self, control: str, frozen: str, thawed: str, is_frozen: Callable[[], bool]) -> None:
        write_control(control, frozen)
        try:
            deadline = time.monotonic() + _FREEZE_WAIT_MS / 1000
            while not is_frozen() and time.monotonic() < deadline:
                time.sleep(_POLL_S)
            # Frozen members can neither fork nor exit, so the list cannot change under us.
            for pid in self.members():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            write_control(control, thawed)  # SIGKILL takes effect as the tasks thaw

    def live_members(self) -> set[int]:
        """Members that are not zombies (a zombie holds no resources but its pid)."""
        alive = set()
        for pid in self.members():
            try:
                stat = read_proc_stat(pid)
            except ExecutionError:
                alive.add(pid)
                continue
            if stat is not None and not stat.exited:
                alive.add(pid)
        return alive

    def remove(self) -> bool:
        """Remove the (empty) directories; True when none is left.

        A directory that still holds processes (EBUSY) is kept; it is swept later.
        """
        left = False
        leaves = [os.path.join(self.paths["v2"], leaf) for leaf in (WRAPPER_LEAF, JOB_LEAF)
                  ] if self.leaves and "v2" in self.paths else []
        for path in [*leaves, *self.paths.values()]:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                continue
            except OSError:
                left = True
        return not left


#: The outcome's reason when the kernel's OOM killer ended a process in the job's memory leaf.
OUT_OF_MEMORY = "out_of_memory"


def out_of_memory(cgroup: RunCgroup | None) -> str | None:
    """:data:`OUT_OF_MEMORY` when the job's memory leaf counted an OOM kill (read before
    the cgroup is removed), else None (no leaf, no counter, no kill)."""
    kills = cgroup.oom_kills() if cgroup is not None else None
    return OUT_OF_MEMORY if kills else None


def _probe(parent: str) -> bool:
    """Can we create (and remove) a cgroup in ``parent``, creating ``parent`` if needed?"""
    probe = os.path.join(parent, f".probe-{random_hex(4)}")
    try:
        os.makedirs(parent, mode=0o755, exist_ok=True)
        os.mkdir(probe)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.rmdir(probe)
    return True


class CgroupManager:
    """Creates and finds the per-Run cgroups (see the module docstring).

    Build it with :meth:`detect`; :attr:`available` is False when ``mode`` is ``off``
    or no hierarchy is writable, and then :meth:`create` returns ``None``.

    Attributes:
        hierarchies: the usable hierarchies, v2 first.
        reason: why cgroups are not used, when they are not.
        pids_max: per-Run ``pids.max`` on the v1 pids hierarchy (``None``: no cap).
        memory_max: the job's memory limit in bytes (``None``: no memory leaf asked for).
        v2_memory: the v2 hierarchy's run cgroups get ``wrapper``/``job`` leaves, the
            job's with ``memory.max`` (:mod:`qinglong_edge.process.cgroup_memory`).
        memory_reason: why jobs get no memory leaf although ``memory_max`` asks for one.
    """

    def __init__(self, hierarchies: list[Hierarchy], *, reason: str = "", pids_max: int | None = None,
                 memory_max: int | None = None, v2_memory: bool = False, memory_reason: str = "") -> None:
        self.hierarchies = hierarchies
        self.reason = reason
        self.pids_max = pids_max
        self.memory_max = memory_max
        self.v2_memory = v2_memory
        self.memory_reason = memory_reason

    @property
    def available(self) -> bool:
        return bool(self.hierarchies)

    @property
    def memory_available(self) -> bool:
        """Jobs run in a memory leaf with ``memory_max`` (v2 or the v1 memory hierarchy)."""
        return self.memory_max is not None and (self.v2_memory or any(h.kind == "memory" for h in self.hierarchies))

    @classmethod
    def detect(
        cls,
        mode: str = "auto",
        *,
        mountinfo_path: str = "/proc/self/mountinfo",
        self_cgroup_path: str = "/proc/self/cgroup",
        pids_max: int | None = None,
        memory_max: int | None = None,
    ) -> CgroupManager:
        """Find the hierarchies where we can create and remove a probe cgroup.

        Per hierarchy the agent's own cgroup is tried first, then the hierarchy root.
        With ``memory_max``, the v1 memory hierarchy is used too, or, on v2, the layout of
        :mod:`qinglong_edge.process.cgroup_memory` where the agent's cgroup allows it
        (else ``memory_reason`` says why not). Never raises: any failure leaves that
        hierarchy out (and all out for ``off``).
        """
        if mode == "off":
            return cls([], reason="disabled by configuration (execution.cgroups=off)")
        try:
            mountinfo = read_control(mountinfo_path)
        except OSError:
            return cls([], reason="mountinfo is unreadable")
        try:
            own = own_cgroups(read_control(self_cgroup_path))
        except OSError:
            own = {}
        usable = []
        v2_memory, memory_reason = False, ""
        for hierarchy in find_hierarchies(mountinfo):
            if hierarchy.kind == "memory" and memory_max is None:
                continue
            if hierarchy.kind == "v2" and memory_max is not None:
                base, memory_reason = v2_memory_base(hierarchy.mount, own.get("v2", "/"))
                if base is not None and _probe(Hierarchy("v2", hierarchy.mount, base).parent):
                    usable.append(Hierarchy("v2", hierarchy.mount, base))
                    v2_memory = True
                    continue
            bases = []
            relative = own.get(hierarchy.kind, "/").strip("/")
            if relative and ".." not in relative.split("/"):
                bases.append(os.path.join(hierarchy.mount, relative))
            bases.append(hierarchy.mount)
            for base in bases:
                candidate = Hierarchy(hierarchy.kind, hierarchy.mount, base)
                if _probe(candidate.parent):
                    usable.append(candidate)
                    break
        if not usable:
            return cls([], reason="no writable cgroup hierarchy", memory_max=memory_max,
                       memory_reason="no writable cgroup hierarchy")
        if memory_max is None or v2_memory or any(h.kind == "memory" for h in usable):
            memory_reason = ""
        else:
            memory_reason = memory_reason or "no writable memory cgroup hierarchy (v1 memory or v2 with memory)"
        return cls(usable, pids_max=pids_max, memory_max=memory_max, v2_memory=v2_memory,
                   memory_reason=memory_reason)

    def _check_name(self, name: str) -> None:
        if not _NAME.fullmatch(name):
            raise ExecutionError("cgroup name is not a valid id", code="invalid_input")

    def create(self, name: str) -> RunCgroup | None:
        """Create ``qinglong-edge/<name>`` in every usable hierarchy.

        An existing *empty* directory of that name (left by a launch that crashed before
        starting the process) is reused.

        Raises:
            ExecutionError: ``cgroup_unavailable`` when a directory cannot be created or
                already holds processes (nothing created is left behind).
        """
        if not self.available:
            return None
        self._check_name(name)
        group = RunCgroup(name)
        try:
            for hierarchy in self.hierarchies:
                path = os.path.join(hierarchy.parent, name)
                try:
                    os.mkdir(path, 0o755)
                except FileExistsError:
                    if _read_pids(os.path.join(path, "cgroup.procs")):
                        raise ExecutionError(
                            f"cgroup {name} already holds processes", code="cgroup_unavailable"
                        ) from None
                group.paths[hierarchy.kind] = path
                if hierarchy.kind == "pids" and self.pids_max is not None:
                    write_control(os.path.join(path, "pids.max"), str(self.pids_max))
                elif hierarchy.kind == "memory" and self.memory_max is not None:
                    create_v1_leaf(path, self.memory_max)
                elif hierarchy.kind == "v2" and self.v2_memory and self.memory_max is not None:
                    group.leaves = True
                    if group.members():
                        raise ExecutionError(f"cgroup {name} already holds processes", code="cgroup_unavailable")
                    create_v2_leaves(path, self.memory_max, self.pids_max)
        except OSError as exc:
            group.remove()
            raise ExecutionError(f"cgroup {name}: {exc.strerror}", code="cgroup_unavailable") from None
        except ExecutionError:
            group.remove()
            raise
        return group

    def open(self, name: str) -> RunCgroup | None:
        """The existing cgroup of ``name`` (after a restart), or ``None`` if it has none."""
        if not self.available or not _NAME.fullmatch(name):
            return None
        group = RunCgroup(name)
        for hierarchy in self.hierarchies:
            path = os.path.join(hierarchy.parent, name)
            if os.path.isdir(path):
                group.paths[hierarchy.kind] = path
                if hierarchy.kind == "v2" and os.path.isdir(os.path.join(path, JOB_LEAF)):
                    group.leaves = True
        return group if group.paths else None

    def owned_names(self) -> set[str]:
        """Names of the cgroups under ``qinglong-edge/`` in any usable hierarchy."""
        names: set[str] = set()
        for hierarchy in self.hierarchies:
            try:
                entries = os.listdir(hierarchy.parent)
            except OSError:
                continue
            names.update(
                e for e in entries if _NAME.fullmatch(e) and os.path.isdir(os.path.join(hierarchy.parent, e))
            )
        return names
