"""The job's memory leaf: where it lives per cgroup layout, its limit, its OOM kills.

Issue 24 item 3. The job (not its wrapper) runs in a cgroup of its own with
``memory.max`` (``execution.maxRunMemoryBytes``) and no swap, so a job at its limit is
OOM-killed there while the wrapper lives on to publish the receipt, and the agent is
never the kernel's choice (jobs also get ``oom_score_adj`` 1000, see the wrapper). The
layout per system (docs/process.md, "Memory"):

* **cgroup v1 memory hierarchy** (hybrid systems such as this project's CI machines):
  ``<memory mount>/<agent's memory cgroup>/qinglong-edge/<name>`` holds the job alone
  (``memory.limit_in_bytes``; ``memory.memsw.limit_in_bytes`` the same, so no swap, where
  swap accounting exists). v1 has no "no internal processes" rule: the wrapper stays in
  the agent's memory cgroup. OOM kills: ``oom_kill N`` in ``memory.oom_control``
  (Linux >= 4.13).
* **cgroup v2** (the unified hierarchy with the ``memory`` controller): a cgroup with
  enabled controllers may hold no process, so the agent must run in a leaf of a parent it
  may write (systemd: ``Delegate=yes`` with ``DelegateSubgroup=agent``, systemd >= 254),
  or be root in the root cgroup. Then, below that parent::

      <parent>/               subtree_control += memory (pids)        (systemd's unit cgroup)
        agent/                the agent (systemd put it there)
        qinglong-edge/        subtree_control memory (pids)
          <name>/             cgroup.kill, pids.max; subtree_control memory
            wrapper/          the job wrapper
            job/              the job: memory.max, memory.swap.max 0, memory.events

  The agent never moves itself and never writes a cgroup systemd made for it other than
  enabling controllers for the subtree it was delegated (systemd's CGROUP_DELEGATION.md):
  with the agent in the unit's own cgroup (systemd < 254 ignores ``DelegateSubgroup=``),
  enabling a controller there would make the next start of the unit fail with EBUSY, so
  no memory leaf is made and :func:`v2_memory_base` says why.
* **Nowhere else**: no memory leaf; ``doctor`` says so (``cgroups``), the job still gets
  ``oom_score_adj`` 1000.

No kernel object is touched at import; every function takes the paths it works on.
"""

from __future__ import annotations

import os

__all__ = [
    "JOB_LEAF",
    "WRAPPER_LEAF",
    "create_v1_leaf",
    "create_v2_leaves",
    "oom_kills",
    "read_control",
    "v2_memory_base",
    "write_control",
]

#: The v2 run cgroup's leaves (see the module docstring).
WRAPPER_LEAF = "wrapper"
JOB_LEAF = "job"


def read_control(path: str) -> str:
    """A cgroup control file's text (ASCII)."""
    with open(path, encoding="ascii") as handle:
        return handle.read()


def write_control(path: str, text: str) -> None:
    """Write ``text`` to a cgroup control file in one ``write`` (the kernel takes a
    control file's value whole; no create, no truncate)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)


def _enable(cgroup: str, controllers: tuple[str, ...]) -> None:
    """Enable ``controllers`` (those available there) for the children of ``cgroup``.

    Raises:
        OSError: the kernel refused (EBUSY: the cgroup holds processes; EACCES: not ours).
    """
    available = set(read_control(os.path.join(cgroup, "cgroup.controllers")).split())
    enabled = set(read_control(os.path.join(cgroup, "cgroup.subtree_control")).split())
    wanted = [c for c in controllers if c in available and c not in enabled]
    if wanted:
        write_control(os.path.join(cgroup, "cgroup.subtree_control"), " ".join(f"+{c}" for c in wanted))


def v2_memory_base(mount: str, own: str) -> tuple[str | None, str]:
    """``(base, reason)``: the v2 cgroup that holds our ``qinglong-edge`` directory when
    jobs get memory leaves, with ``memory`` (and ``pids``) enabled for its children, or
    ``(None, why not)``.

    ``own`` is the agent's cgroup path (``/proc/self/cgroup``, v2 line). The root cgroup
    may hold processes and enable controllers at once (root only); elsewhere the agent's
    cgroup is a leaf and its parent must be writable and hold no process itself.
    """
    relative = own.strip("/")
    if ".." in relative.split("/"):
        return None, f"the agent's cgroup {own} is not a plain path"
    here = os.path.join(mount, relative) if relative else mount
    try:
        if "memory" not in read_control(os.path.join(mount, "cgroup.controllers")).split():
            return None, "the memory controller is not available in cgroup v2 (bound to cgroup v1 here)"
        if not relative:
            base = mount
        else:
            base = os.path.dirname(here)
            if not os.access(os.path.join(base, "cgroup.subtree_control"), os.W_OK):
                return None, (f"the agent's cgroup {own} holds the agent and its parent is not the agent's to "
                              "write: start it in a leaf of a delegated cgroup (systemd: Delegate=yes with "
                              "DelegateSubgroup=agent, systemd >= 254)")
            if read_control(os.path.join(base, "cgroup.procs")).split():
                return None, f"{base} holds processes itself: no controller can be enabled below it"
        if "memory" not in read_control(os.path.join(base, "cgroup.controllers")).split():
            return None, f"the memory controller is not delegated to {base}"
        _enable(base, ("memory", "pids"))
        parent = os.path.join(base, "qinglong-edge")
        os.makedirs(parent, 0o755, exist_ok=True)
        _enable(parent, ("memory", "pids"))
    except OSError as exc:
        return None, f"cgroup v2 memory below {here}: {exc.strerror}"
    return base, ""


def create_v1_leaf(path: str, limit: int) -> None:
    """Make the job's v1 memory cgroup ``path`` with ``limit`` bytes and no swap.

    Raises:
        OSError: the directory or a limit could not be written.
    """
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    write_control(os.path.join(path, "memory.limit_in_bytes"), str(limit))
    memsw = os.path.join(path, "memory.memsw.limit_in_bytes")
    if os.path.exists(memsw):  # swap accounting: memory + swap = memory, i.e. no swap
        write_control(memsw, str(limit))


def create_v2_leaves(run: str, limit: int, pids_max: int | None) -> None:
    """Below the v2 run cgroup ``run``: the ``wrapper`` and ``job`` leaves, the job's
    ``memory.max`` = ``limit`` and ``memory.swap.max`` 0, and ``pids.max`` on ``run``.

    Raises:
        OSError: a directory, a controller or a limit could not be written.
    """
    if pids_max is not None and os.path.exists(os.path.join(run, "pids.max")):
        write_control(os.path.join(run, "pids.max"), str(pids_max))
    _enable(run, ("memory",))
    for leaf in (WRAPPER_LEAF, JOB_LEAF):
        try:
            os.mkdir(os.path.join(run, leaf), 0o755)
        except FileExistsError:
            pass
    job = os.path.join(run, JOB_LEAF)
    write_control(os.path.join(job, "memory.max"), str(limit))
    swap = os.path.join(job, "memory.swap.max")
    if os.path.exists(swap):
        write_control(swap, "0")


def oom_kills(path: str, v2: bool) -> int | None:
    """Processes the kernel's OOM killer ended in the memory cgroup ``path`` (its
    ``memory.events`` on v2, ``memory.oom_control`` on v1: the ``oom_kill`` line), or
    None when the kernel does not count them or the cgroup is gone."""
    try:
        text = read_control(os.path.join(path, "memory.events" if v2 else "memory.oom_control"))
    except (OSError, ValueError):
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None
