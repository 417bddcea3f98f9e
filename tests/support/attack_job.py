"""A hostile job: tries every cell of the attack matrix and prints one JSON line per cell.

Run as the job's command by :mod:`tests.support.attack_driver` (``python3 -I -S
attack_job.py PLAN``; the plan is a JSON file the driver wrote). It imports only the
standard library (``ctypes`` for ``ptrace``) and never harms anything outside the
disposable tree it is given: signals are signal 0, ``ptrace`` attaches from a child that
exits at once (the kernel detaches it then), the fork bomb and the allocation run in
children that are ended before it reports.

Each line: ``{"cell": NAME, "path": KEY or null, "result": R, "detail": TEXT}`` where
``R`` is ``empty`` (a read found nothing: an empty directory, a zero-byte file),
``read`` (a read found the real thing: the driver compares its digest), ``done`` (the
operation succeeded), ``refused`` (it failed; ``detail`` is the errno name) or
``skipped``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


def _out(cell: str, path: str | None, result: str, detail: str = "") -> None:
    print(json.dumps({"cell": cell, "path": path, "result": result, "detail": detail}), flush=True)


def _try(cell: str, key: str | None, action: Callable[[], object]) -> None:
    try:
        value = action()
    except OSError as exc:
        _out(cell, key, "refused", errno.errorcode.get(exc.errno or 0, str(exc.errno)))
        return
    except Exception as exc:
        _out(cell, key, "refused", f"{type(exc).__name__}: {exc}")
        return
    if isinstance(value, tuple):
        _out(cell, key, *value)
    else:
        _out(cell, key, "done", str(value or ""))


def _digest_tree(path: str) -> str:
    return hashlib.sha256("\n".join(sorted(os.listdir(path))).encode()).hexdigest()[:16]


def _read(path: str) -> tuple[str, str]:
    if not os.path.lexists(path):
        return ("empty", "absent")  # under a hidden directory: not there at all
    if os.path.isdir(path):
        return ("empty", "") if not os.listdir(path) else ("read", _digest_tree(path))
    with open(path, "rb") as handle:
        data = handle.read()
    return ("empty", "") if not data else ("read", hashlib.sha256(data).hexdigest()[:16])


def _file_cells(key: str, path: str, cwd: str) -> None:
    directory = os.path.dirname(path)

    def write() -> None:
        with open(path, "ab") as handle:
            handle.write(b"planted\n")

    def create() -> None:
        os.unlink(path)
        with open(path, "xb") as handle:
            handle.write(b"planted\n")

    def replace() -> None:
        temp = os.path.join(directory, ".planted-replace")
        with open(temp, "wb") as handle:
            handle.write(b"planted\n")
        try:
            os.rename(temp, path)
        finally:
            if os.path.lexists(temp):
                os.unlink(temp)

    def symlink() -> None:
        temp = os.path.join(directory, ".planted-symlink")
        os.symlink("/etc/hostname", temp)
        try:
            os.rename(temp, path)
        finally:
            if os.path.lexists(temp):
                os.unlink(temp)

    def hardlink() -> None:
        alias = os.path.join(cwd, "alias-" + key)
        os.link(path, alias)
        with open(alias, "ab") as handle:  # write through the alias
            handle.write(b"planted\n")

    _try("read", key, lambda: _read(path))
    _try("write", key, write)
    _try("hardlink", key, hardlink)
    _try("create", key, create)
    _try("replace", key, replace)
    _try("symlink", key, symlink)  # last: it leaves a symlink where the file was


def _directory_cells(key: str, path: str, cwd: str) -> None:
    mine = os.path.join(cwd, "mine-" + key)
    with open(mine, "wb") as handle:
        handle.write(b"planted\n")

    def write() -> None:
        with open(os.path.join(path, "planted-write"), "xb") as handle:
            handle.write(b"planted\n")

    def replace() -> None:
        os.rename(path, path + ".moved")  # the agent would find what the job puts there next
        os.rename(path + ".moved", path)  # (and back, so that the cells below find it)

    _try("read", key, lambda: _read(path))
    _try("write", key, write)
    _try("create", key, lambda: os.mkdir(os.path.join(path, "planted-dir")))
    _try("symlink", key, lambda: os.symlink("/etc/hostname", os.path.join(path, "planted-symlink")))
    _try("hardlink", key, lambda: os.link(mine, os.path.join(path, "planted-hardlink")))
    _try("replace", key, replace)


def _proc_cells(who: str, pid: int) -> None:
    def ptrace() -> str:
        import ctypes

        child = os.fork()
        if child == 0:  # the tracer exits at once: the kernel detaches its tracee then
            libc = ctypes.CDLL(None, use_errno=True)
            libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
            result = libc.ptrace(0x4206, pid, None, None)  # PTRACE_SEIZE: no stop
            os._exit(0 if result == 0 else min(ctypes.get_errno(), 255))
        _, status = os.waitpid(child, 0)
        code = os.waitstatus_to_exitcode(status)
        if code:
            raise OSError(code, os.strerror(code))
        return ""

    def read_all(name: str) -> str:
        with open(f"/proc/{pid}/{name}", "rb") as handle:
            return str(len(handle.read(64)))

    _try(f"signal the {who}", None, lambda: os.kill(pid, 0))
    _try(f"ptrace the {who}", None, ptrace)
    _try(f"read /proc/<{who}>/environ", None, lambda: read_all("environ"))
    _try(f"read /proc/<{who}>/mem", None, lambda: os.close(os.open(f"/proc/{pid}/mem", os.O_RDONLY)))
    def read_fds() -> str:
        names = os.listdir(f"/proc/{pid}/fd")  # the numbers; what they are is the secret
        return ",".join(os.readlink(f"/proc/{pid}/fd/{name}") for name in names)[:200]

    _try(f"read /proc/<{who}>/fd", None, read_fds)


def _leave_cgroup(targets: list[str]) -> None:
    """From a child (so this process stays where it is for the later cells)."""
    if not targets:
        _out("leave its cgroup", None, "skipped", "no cgroup")
        return
    child = os.fork()
    if child == 0:
        code = 0
        for procs in targets:
            try:
                fd = os.open(procs, os.O_WRONLY)
                try:
                    os.write(fd, str(os.getpid()).encode())
                finally:
                    os.close(fd)
            except OSError as exc:
                code = exc.errno or 1
        os._exit(min(code, 255))
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    if code:
        _out("leave its cgroup", None, "refused", errno.errorcode.get(code, str(code)))
    else:
        _out("leave its cgroup", None, "done", "")


def _fork_bomb(limit: int) -> None:
    """Fork (children that sleep) until refused, up to 4 x ``limit``; then end them."""
    if limit <= 0:
        _out("fork past pids.max", None, "skipped", "no pids cap")
        return
    children = []
    refused = ""
    try:
        for _ in range(4 * limit):
            try:
                pid = os.fork()
            except OSError as exc:
                refused = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                break
            if pid == 0:
                time.sleep(30)  # the scenario: each forked child holds its slot
                os._exit(0)
            children.append(pid)
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        for pid in children:
            os.waitpid(pid, 0)
    _out("fork past pids.max", None, "refused" if refused else "done", f"{refused} after {len(children)} children")


def _allocate(limit: int) -> None:
    """A child allocates (and touches) twice ``limit``; the kernel should kill it."""
    if limit <= 0:
        _out("allocate past its memory limit", None, "skipped", "no memory limit")
        return
    child = os.fork()
    if child == 0:
        blocks = []
        for _ in range(2 * limit // (1 << 20) + 1):
            blocks.append(bytearray(1 << 20))  # zero-filled: every page touched
        os._exit(0)
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        _out("allocate past its memory limit", None, "refused", f"killed by signal {os.WTERMSIG(status)}")
    else:
        _out("allocate past its memory limit", None, "done", f"exit {os.WEXITSTATUS(status)}")


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as handle:
        plan = json.load(handle)
    cwd = "."  # relative: a job without isolation may move a directory above its cwd
    for key, path in sorted(plan["paths"].items()):
        if os.path.isdir(path):
            _directory_cells(key, path, cwd)
        else:
            _file_cells(key, path, cwd)
    with open(os.path.join(cwd, "wrapper.pid"), encoding="ascii") as handle:
        wrapper = int(handle.read())
    _proc_cells("agent", int(plan["agent_pid"]))
    _proc_cells("wrapper", wrapper)
    try:
        shares = os.getpgid(wrapper) == os.getpgrp()
    except OSError:
        shares = False
    _out("reach the wrapper through its process group", None, "done" if shares else "refused",
         "kill(0) reaches it" if shares else "its own session")
    _leave_cgroup(plan["escape_to"])
    _allocate(int(plan["memory_limit"]))
    _fork_bomb(int(plan["pids_limit"]))
    _out("end", None, "done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
