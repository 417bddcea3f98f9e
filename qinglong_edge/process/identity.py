"""Linux process identity and the durable ``ql3lp1.`` executor handle (local-api.md 7.3).

A Run's process is known by four facts read right after launch: the boot id, the pid,
the process group id and the start time (clock ticks since boot, field 22 of
``/proc/<pid>/stat``). Together they name one process for the life of the machine: a
recycled pid has another start time, and a reboot another boot id. Stop authority is
tied to all four and re-checked before every signal (field-lessons.md 4).

``/proc/<pid>/stat`` is ``pid (comm) state ppid pgrp session ...``. ``comm`` is up to 15
arbitrary bytes chosen by the process and may itself hold ``)``, ``(``, spaces or
newlines, so the fields are split only after the *last* ``)``. The line's parser and the
boot id's reader are :mod:`qinglong_edge.clock`'s (one of each for the whole agent, the
journal's owner lock uses them too); this module adapts their errors to
:class:`~qinglong_edge.errors.ExecutionError`.

The durable handle (stored in ``RunAttempts.executor_handle``, at most 512 bytes) is
``ql3lp1.`` + unpadded base64url of the compact JSON
``{"v":1,"h":"<handle uuid>","b":"<boot id>","p":<pid>,"g":<pgid>,"s":"<starttime>"}``
in exactly that key order.

Everything here is sans-IO except :func:`read_boot_id`, :func:`read_proc_stat`,
:func:`capture`, :func:`probe`, :func:`inspect` and :func:`scan_processes`, which read
``/proc``.
"""

from __future__ import annotations

import base64
import enum
import os
import re
import sys

from qinglong_edge import clock as _clock
from qinglong_edge.clock import BOOT_ID_PATH
from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.strictjson import StrictJsonError, dumps, loads
from qinglong_edge.errors import ExecutionError

__all__ = [
    "BOOT_ID_PATH",
    "HANDLE_PREFIX",
    "MAX_HANDLE_BYTES",
    "DurableHandle",
    "Inspection",
    "Liveness",
    "ProcStat",
    "ProcessIdentity",
    "capture",
    "decode_handle",
    "encode_handle",
    "inspect",
    "parse_boot_id",
    "parse_proc_stat",
    "probe",
    "read_boot_id",
    "read_proc_stat",
    "scan_processes",
]

HANDLE_PREFIX = "ql3lp1."
MAX_HANDLE_BYTES = 512
#: /proc/<pid>/stat is one line of well under 1 KiB; read a bounded amount.
_STAT_READ_BYTES = 4096
_DECIMAL = re.compile(r"[0-9]{1,32}")
_HANDLE_BODY = re.compile(r"[A-Za-z0-9_-]+")
_HANDLE_KEYS = ("v", "h", "b", "p", "g", "s")
_MAX_SAFE_INTEGER = 2**53 - 1
#: Zombie (Z) and dead (X, and the old lowercase x) processes are not running.
_NOT_RUNNING_STATES = frozenset({"Z", "X", "x"})


class ProcStat(Frozen):
    """The identity-relevant fields of one ``/proc/<pid>/stat`` line.

    Attributes:
        pid: field 1.
        comm: field 2 without the parentheses, decoded with ``surrogateescape``
            (diagnostics only; never compared).
        state: field 3, one character (``R``, ``S``, ``Z`` ...).
        ppid, pgrp, session: fields 4, 5, 6 (0 for kernel threads).
        start_time: field 22, clock ticks since boot, as the decimal text the kernel
            wrote (compared as text, like the reference).

    Frozen value classes without :mod:`dataclasses` (its import costs a resident
    ``pull`` ~1.4 MiB: :class:`~qinglong_edge.contracts._shape.Frozen`).
    """

    __slots__ = ("pid", "comm", "state", "ppid", "pgrp", "session", "start_time")  # noqa: RUF023 (field order)

    pid: int
    comm: str
    state: str
    ppid: int
    pgrp: int
    session: int
    start_time: str

    def __init__(self, pid: int, comm: str, state: str, ppid: int, pgrp: int, session: int,  # noqa: PLR0917
                 start_time: str) -> None:
        _set = object.__setattr__
        _set(self, "pid", pid)
        _set(self, "comm", comm)
        _set(self, "state", state)
        _set(self, "ppid", ppid)
        _set(self, "pgrp", pgrp)
        _set(self, "session", session)
        _set(self, "start_time", start_time)

    @property
    def exited(self) -> bool:
        """True for a zombie or dead entry (state ``Z``/``X``/``x``)."""
        return self.state in _NOT_RUNNING_STATES


class ProcessIdentity(Frozen):
    """Boot id, pid, process group id and start time of one process (local-api.md 7.3)."""

    __slots__ = ("boot_id", "pid", "pgid", "start_time")  # noqa: RUF023 (field order)

    boot_id: str
    pid: int
    pgid: int
    start_time: str

    def __init__(self, boot_id: str, pid: int, pgid: int, start_time: str) -> None:
        _set = object.__setattr__
        _set(self, "boot_id", boot_id)
        _set(self, "pid", pid)
        _set(self, "pgid", pgid)
        _set(self, "start_time", start_time)

    def matches(self, stat: ProcStat) -> bool:
        """True if ``stat`` (read on this boot) is this very process."""
        return stat.pid == self.pid and stat.pgrp == self.pgid and stat.start_time == self.start_time


class DurableHandle(Frozen):
    """A decoded ``ql3lp1.`` handle: the handle id (a UUID we generate) and the identity."""

    __slots__ = ("handle_id", "identity")

    handle_id: str
    identity: ProcessIdentity

    def __init__(self, handle_id: str, identity: ProcessIdentity) -> None:
        object.__setattr__(self, "handle_id", handle_id)
        object.__setattr__(self, "identity", identity)


class Liveness(enum.Enum):
    """What ``/proc`` says about a recorded identity right now.

    ``RUNNING``: the same process, alive. ``EXITED``: the same process, a zombie not yet
    reaped (its pid and process group number are still pinned, so the group cannot have
    been recycled). ``GONE``: no such pid, or another boot. ``REUSED``: the pid now
    belongs to another process (other start time or group); it never inherits authority.
    """

    RUNNING = "running"
    EXITED = "exited"
    GONE = "gone"
    REUSED = "reused"


class Inspection(Frozen):
    """Result of :func:`inspect` (local-api.md 7.3).

    Attributes:
        status: ``running``, ``not_running`` or ``unknown``.
        reason: for ``unknown``: ``invalid_handle``, ``unsupported_platform`` or
            ``provider_unavailable``; else ``None``.
        liveness: the finer :class:`Liveness` when status is not ``unknown``.
    """

    __slots__ = ("status", "reason", "liveness")  # noqa: RUF023 (field order)

    status: str
    reason: str | None
    liveness: Liveness | None

    def __init__(self, status: str, reason: str | None = None, liveness: Liveness | None = None) -> None:
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "liveness", liveness)


def parse_proc_stat(pid: int, data: bytes) -> ProcStat:
    """Parse one ``/proc/<pid>/stat`` line (bytes in, :class:`ProcStat` out) with
    :func:`qinglong_edge.clock.parse_proc_stat` (the one parser of the line).

    The fields are taken after the **last** ``)``; the text before the first ``(``
    must be exactly ``pid``. ``pgrp``/``session`` may be 0 (kernel threads); callers
    that need a real group check for >= 1 themselves.

    Raises:
        ExecutionError: code ``invalid_proc_stat`` when the line is malformed.
    """
    try:
        _, comm, state, ppid, pgrp, session, start_time = _clock.parse_proc_stat(data, pid)
    except ValueError as exc:
        raise ExecutionError(f"/proc/{pid}/stat: {exc}", code="invalid_proc_stat") from None
    return ProcStat(pid=pid, comm=comm, state=state, ppid=ppid, pgrp=pgrp, session=session, start_time=start_time)


def parse_boot_id(data: bytes) -> str:
    """Trim and validate a boot id (``^[A-Za-z0-9-]{1,64}$``) with
    :func:`qinglong_edge.clock.parse_boot_id`.

    Raises:
        ExecutionError: code ``invalid_boot_id``.
    """
    text = _clock.parse_boot_id(data)
    if text is None:
        raise ExecutionError("boot id has an invalid format", code="invalid_boot_id")
    return text


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """Read and validate the kernel boot id (:func:`qinglong_edge.clock.boot_id`).

    Raises:
        ExecutionError: code ``provider_unavailable`` when unreadable or invalid.
    """
    text = _clock.boot_id(path)
    if text is None:
        raise ExecutionError("boot id is unavailable", code="provider_unavailable")
    return text


def read_proc_stat(pid: int, proc: str = "/proc") -> ProcStat | None:
    """Read ``/proc/<pid>/stat``; ``None`` when the process does not exist.

    Raises:
        ExecutionError: ``invalid_proc_stat`` (malformed) or ``provider_unavailable``
            (an I/O error other than ENOENT/ESRCH).
    """
    try:
        fd = os.open(f"{proc}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as exc:
        raise ExecutionError(f"/proc/{pid}/stat: {exc.strerror}", code="provider_unavailable") from None
    try:
        data = os.read(fd, _STAT_READ_BYTES)
    except ProcessLookupError:
        return None  # the process was reaped between open and read
    except OSError as exc:
        raise ExecutionError(f"/proc/{pid}/stat: {exc.strerror}", code="provider_unavailable") from None
    finally:
        os.close(fd)
    if not data:
        return None
    return parse_proc_stat(pid, data)


def scan_processes(proc: str = "/proc") -> list[ProcStat]:
    """Every process visible in ``/proc`` (skipping ones that vanish or do not parse)."""
    found = []
    try:
        names = os.listdir(proc)
    except OSError as exc:
        raise ExecutionError(f"{proc}: {exc.strerror}", code="provider_unavailable") from None
    for name in names:
        if not name.isdigit():
            continue
        try:
            stat = read_proc_stat(int(name), proc)
        except ExecutionError:
            continue
        if stat is not None:
            found.append(stat)
    return found


def capture(pid: int, *, boot_id: str | None = None) -> ProcessIdentity | None:
    """The identity of ``pid`` now, or ``None`` if it no longer exists.

    Call it right after launching, before the child can be reaped: a child that already
    exited is a zombie whose identity is still readable.

    Raises:
        ExecutionError: ``provider_unavailable`` (no boot id, /proc unreadable) or
            ``invalid_proc_stat`` (including a group id or start time below 1).
    """
    boot = boot_id if boot_id is not None else read_boot_id()
    stat = read_proc_stat(pid)
    if stat is None:
        return None
    if stat.pgrp < 1 or int(stat.start_time) < 1:
        raise ExecutionError(f"/proc/{pid}/stat: no process group or start time", code="invalid_proc_stat")
    return ProcessIdentity(boot_id=boot, pid=pid, pgid=stat.pgrp, start_time=stat.start_time)


def probe(identity: ProcessIdentity) -> tuple[Liveness, ProcStat | None]:
    """Classify ``identity`` against ``/proc`` (see :class:`Liveness`).

    Raises:
        ExecutionError: ``provider_unavailable`` when the boot id or ``/proc`` cannot be
            read, ``invalid_proc_stat`` when the kernel line does not parse.
    """
    if read_boot_id() != identity.boot_id:
        return Liveness.GONE, None
    stat = read_proc_stat(identity.pid)
    if stat is None:
        return Liveness.GONE, None
    if not identity.matches(stat):
        return Liveness.REUSED, stat
    if stat.exited:
        return Liveness.EXITED, stat
    return Liveness.RUNNING, stat


def inspect(handle: str | DurableHandle | ProcessIdentity) -> Inspection:
    """Inspect a durable handle with the rules of local-api.md 7.3.

    Other boot, missing pid, other group or start time, and zombie/dead states are all
    ``not_running``: a recycled pid never inherits stop authority. A handle that does not
    decode is ``unknown(invalid_handle)``; a non-Linux platform is
    ``unknown(unsupported_platform)``; an unreadable boot id or ``/proc`` is
    ``unknown(provider_unavailable)``. Never raises.
    """
    if isinstance(handle, str):
        try:
            handle = decode_handle(handle)
        except ExecutionError:
            return Inspection("unknown", "invalid_handle")
    identity = handle.identity if isinstance(handle, DurableHandle) else handle
    if not sys.platform.startswith("linux"):
        return Inspection("unknown", "unsupported_platform")
    try:
        liveness, _ = probe(identity)
    except ExecutionError:
        return Inspection("unknown", "provider_unavailable")
    status = "running" if liveness is Liveness.RUNNING else "not_running"
    return Inspection(status, None, liveness)


def _validate_identity(identity: ProcessIdentity) -> None:
    if not _clock.is_boot_id(identity.boot_id):
        raise ExecutionError("handle boot id is invalid", code="invalid_handle")
    for value in (identity.pid, identity.pgid):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_SAFE_INTEGER:
            raise ExecutionError("handle pid or group is invalid", code="invalid_handle")
    if not isinstance(identity.start_time, str) or not _DECIMAL.fullmatch(identity.start_time):
        raise ExecutionError("handle start time is invalid", code="invalid_handle")
    if int(identity.start_time) < 1:
        raise ExecutionError("handle start time is invalid", code="invalid_handle")


def _valid_handle_id(value: object) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= 255 and "\0" not in value


def encode_handle(handle_id: str, identity: ProcessIdentity) -> str:
    """Build the durable ``ql3lp1.`` handle text.

    Raises:
        ExecutionError: ``invalid_handle`` for an invalid id or identity, or a handle
            longer than 512 bytes.
    """
    if not _valid_handle_id(handle_id):
        raise ExecutionError("handle id is invalid", code="invalid_handle")
    _validate_identity(identity)
    payload = {
        "v": 1,
        "h": handle_id,
        "b": identity.boot_id,
        "p": identity.pid,
        "g": identity.pgid,
        "s": identity.start_time,
    }
    body = base64.urlsafe_b64encode(dumps(payload).encode("utf-8")).rstrip(b"=").decode("ascii")
    text = HANDLE_PREFIX + body
    if len(text.encode("utf-8")) > MAX_HANDLE_BYTES:
        raise ExecutionError("handle exceeds 512 bytes", code="invalid_handle")
    return text


def decode_handle(text: str) -> DurableHandle:
    """Parse a durable handle.

    Stricter than the reference: the JSON must be strict and hold exactly the keys
    ``v h b p g s`` (we are the only writer of these handles).

    Raises:
        ExecutionError: code ``invalid_handle``.
    """
    if (
        not isinstance(text, str)
        or not text.startswith(HANDLE_PREFIX)
        or len(text.encode("utf-8", "surrogatepass")) > MAX_HANDLE_BYTES
    ):
        raise ExecutionError("not a ql3lp1 handle", code="invalid_handle")
    body = text[len(HANDLE_PREFIX) :]
    if not _HANDLE_BODY.fullmatch(body) or len(body) % 4 == 1:
        raise ExecutionError("handle is not base64url", code="invalid_handle")
    raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    try:
        payload = loads(raw, max_bytes=MAX_HANDLE_BYTES, min_bytes=2, max_depth=1)
    except StrictJsonError:
        raise ExecutionError("handle payload is not strict JSON", code="invalid_handle") from None
    if not isinstance(payload, dict) or tuple(sorted(payload)) != tuple(sorted(_HANDLE_KEYS)):
        raise ExecutionError("handle payload has the wrong keys", code="invalid_handle")
    if payload["v"] != 1 or isinstance(payload["v"], bool) or not _valid_handle_id(payload["h"]):
        raise ExecutionError("handle version or id is invalid", code="invalid_handle")
    if not isinstance(payload["b"], str):
        raise ExecutionError("handle boot id is invalid", code="invalid_handle")
    identity = ProcessIdentity(
        boot_id=payload["b"], pid=payload["p"], pgid=payload["g"], start_time=payload["s"]
    )
    _validate_identity(identity)
    return DurableHandle(handle_id=payload["h"], identity=identity)
