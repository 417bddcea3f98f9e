"""Every file of the runtime directory: how a copy is checked and what a damaged one means.

Issue 23: no damaged runtime file (empty, truncated, garbage, a loose mode) is a permanent
error. Each reader in the agent already treats a damaged copy as this table says; this
module lets ``doctor`` find them (read-only: nothing is created, repaired or removed) and
is the list docs/worker/journal.md "Runtime files" mirrors.

:func:`damaged_files` returns ``(name, problem, meaning)`` for each file that a reader would
take as damaged. ``problem`` is one short phrase (``0 bytes``, ``not a session record``,
``mode 0644``); ``meaning`` is what the agent does about it.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.strictjson import loads

__all__ = ["KINDS", "RuntimeFile", "damaged_files", "kind_of"]
from qinglong_edge.filecheck import stat_problem

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any


class RuntimeFile:
    """One kind of runtime file: its name pattern, what it holds, how a copy is checked
    (raises ``ValueError``/``ContractError``), and what a damaged copy means."""

    __slots__ = ("check", "damaged", "holds", "max_bytes", "pattern")

    def __init__(self, pattern: str, holds: str, check: Callable[[bytes], object], damaged: str,
                 max_bytes: int = 16_384) -> None:
        self.pattern = re.compile(pattern)
        self.holds = holds
        self.check = check
        self.damaged = damaged
        self.max_bytes = max_bytes


def _json_object(data: bytes, *required: str) -> dict[str, Any]:
    value = loads(data, max_bytes=16_384, min_bytes=2)
    if not isinstance(value, dict) or any(key not in value for key in required):
        raise ValueError("not the expected object")
    return value


def _owner(data: bytes) -> object:
    from qinglong_edge.worker.journal.ownerlock import parse_owner_record

    return parse_owner_record(data)


def _session(data: bytes) -> object:
    from qinglong_edge.worker.delivery.session import parse_session_state

    return parse_session_state(data)


def _marker(data: bytes) -> object:
    from qinglong_edge.worker.delivery.pull import parse_marker

    return parse_marker(data)


def _identity(data: bytes) -> object:
    from qinglong_edge.worker.delivery.identity_guard import parse_identity

    return parse_identity(data)


def _notice(data: bytes) -> object:
    if re.fullmatch(rb"(boot [!-~]{1,64}|day [0-9]{1,12})\n", data) is None:
        raise ValueError("not a notice stamp")
    return data


def _wrapper(data: bytes) -> object:
    import importlib.util
    import marshal

    if not data.startswith(importlib.util.MAGIC_NUMBER):
        raise ValueError("not a compiled wrapper of this interpreter")
    if type(marshal.loads(memoryview(data)[16:])).__name__ != "code":  # noqa: S302 (our own private cache)
        raise ValueError("not a code object")
    return data


def _clock_sample(data: bytes) -> object:
    from qinglong_edge.worker.delivery.cluster_clock import read_sample

    value = _json_object(data, "bootId")
    if read_sample(data, str(value["bootId"])) is None:
        raise ValueError("not a clock sample")
    return value


def _job_lease(data: bytes) -> object:
    from qinglong_edge.worker.remote.lease import parse_job_lease

    return parse_job_lease(data)


#: Every kind, in the order of docs/worker/journal.md "Runtime files" (the last four: docs/clocks.md "Runtime files").
KINDS: tuple[RuntimeFile, ...] = (
    RuntimeFile(r"owner\.json", "the owner lock's diagnostic record (pid, start time, boot id)", _owner,
                "unknown owner: the lock itself is the flock; rewritten at the next acquisition"),
    RuntimeFile(r"session\.json", "the Worker Session and its Retry-After window", _session,
                "absent: with records in flight the newest one's session is registered again (a register "
                "replay: the cluster's row unchanged, nothing fenced), never a blind new session; with none "
                "in flight a new session"),
    RuntimeFile(r"attempt\.json", "the attempt-in-flight marker of the pending claim", _marker,
                "present: an attempt of unknown outcome; the next pull counts it for the pending claim "
                "(attemptCount + 1) and removes it"),
    RuntimeFile(r"handover\.json", "a stopped resident pull left jobs in flight", _json_object,
                "present (only its name is looked at): the next pull skips its splay once, then removes it"),
    RuntimeFile(r"identity\.json", "the last generation this device registered; replacements by another device",
                _identity, "absent: nothing is compared, no quiet window (rewritten at the next registration)"),
    RuntimeFile(r"resident\.json", "a resident pull serves forced discards", _owner,
                "no resident pull: `inbox discard --force` says a pull holds the journal (rewritten by the next "
                "resident pull)"),
    RuntimeFile(r"capabilities\.probe", "the capability probes' per-boot facts (memory, cgroup limits)",
                lambda d: _json_object(d, "schemaVersion", "bootId"), "probed again (and cached) at the next pull"),
    RuntimeFile(r"isolation\.json", "whether an isolated job works here (once per boot)",
                lambda d: _json_object(d, "bootId", "available"), "probed again at the next launch"),
    RuntimeFile(r"wrapper-[0-9a-f]{16}\.pyc", "the compiled job wrapper", _wrapper,
                "refused: compiled again at the next launch", max_bytes=1 << 20),
    RuntimeFile(r"outcome\.[0-9a-f]{16}", "how a finished record's job ended (for `inbox list`)",
                lambda d: _json_object(d, "offerId"), "`inbox list` shows no exit code for that record"),
    RuntimeFile(r"notice\.[a-z0-9._-]+", "a once-per-boot or once-per-day notice", _notice,
                "the notice is shown again"),
    RuntimeFile(r"failure\.[0-9a-f]{16}", "a failure of a pull said to the system log this hour",
                lambda d: _json_object(d, "atMs", "key"), "said to the system log again"),
    RuntimeFile(r"discard\.[0-9a-f]{16}\.(request|result)", "a forced `inbox discard` and its answer",
                lambda d: _json_object(d, "offerId"),
                "a request is dropped by the resident pull; a result is not taken (the command times out)"),
    RuntimeFile(r"clock\.json", "the kept sample of the cluster's clock (boot clock, boot id)", _clock_sample,
                "absent: the next answer with a fresh cluster time makes one; meanwhile leases use the send "
                "instant alone"),
    RuntimeFile(r"job\.[0-9a-f]{16}\.json", "a record's current lease, its local expiry and the wrapper's stop time",
                _job_lease, "to the agent absent (the lease judged from the journal and the cluster's clock, "
                "renewed at once); to the job's wrapper the last good copy stays in force"),
    RuntimeFile(r"job\.[0-9a-f]{16}\.stopped", "the job's wrapper stopped it for its lease", lambda d: d,
                "any file of that name is the mark: the record ends recovery_required (lease lost)"),
    RuntimeFile(r"backoff\.json", "the pending claim's backoff on the boot clock",
                lambda d: _json_object(d, "bootId", "offerId", "revision", "dueBootMs"),
                "absent: the claim's nextAttemptAtMs (wall clock) decides"),
)


def kind_of(name: str) -> RuntimeFile | None:
    return next((kind for kind in KINDS if kind.pattern.fullmatch(name)), None)


def damaged_files(directory: str) -> list[tuple[str, str, str]]:
    """``(name, problem, meaning)`` of each damaged file of ours in ``directory`` (the
    runtime directory of one journal). The reader rules are the agent's
    (:meth:`qinglong_edge.worker.journal.runtime.RuntimeDirectory.read`): a regular file, not a
    symlink, of this user, no group/other bits, 2 bytes up to the kind's limit, and a
    content its parser takes. Names that are none of ours and temp files are skipped.

    Raises:
        OSError: the directory cannot be listed.
    """
    found = []
    with os.scandir(directory) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        kind = kind_of(name)
        if kind is None:
            continue
        problem = _problem(os.path.join(directory, name), kind)
        if problem is not None:
            found.append((name, problem, kind.damaged))
    return found


def _problem(path: str, kind: RuntimeFile) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        return "a symlink" if os.path.islink(path) else (exc.strerror or "unreadable").lower()
    try:
        st = os.fstat(fd)
        problem = stat_problem(st, path, directory=False)
        if problem is not None:
            return {"not_file": "not a regular file", "foreign_owner": f"owned by uid {st.st_uid}"}.get(
                problem.kind, f"mode {stat.S_IMODE(st.st_mode):04o}")
        if not 2 <= st.st_size <= kind.max_bytes:
            return f"{st.st_size} bytes"
        data = os.read(fd, kind.max_bytes + 1)
    except OSError as exc:
        return (exc.strerror or "unreadable").lower()
    finally:
        os.close(fd)
    try:
        kind.check(data)
    except (ContractError, ValueError, TypeError, EOFError, UnicodeDecodeError):
        return "garbage (does not parse)"
    return None
