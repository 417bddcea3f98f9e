"""``inbox discard --force`` while a ``pull`` owns the journal (spec README "Operator
commands while resident").

The resident ``pull`` holds the owner lock, so an operator's command cannot write the
journal itself. It asks instead: a request file in the journal's runtime directory
(RAM), then ``SIGUSR1`` to the owner (its pid bound with a pidfd and checked against the
owner record's start time first, so a recycled pid is never signalled). The owner, woken
from its wait, stops the record's job (verified stop), reports the outcome to the
cluster as it would any other (completion, or a start failure before the launch), then
removes the record with its files and writes the result, which the command prints::

    discard.<16 hex>.request   {"schemaVersion":1,"offerId":..,"requestId":..,"requestedAtMs":..}
    discard.<16 hex>.result    {"schemaVersion":1,"offerId":..,"requestId":..,"state":..,
                                "exitCode":..|null,"discarded":true,"finishedAtMs":..}

``<16 hex>`` is the start of ``sha256(offerId)`` (runtime file names are lower case).
A request left by a command that gave up waiting is still served by the next owner.
"""

from __future__ import annotations

import contextlib
import os
import signal

from qinglong_edge.contracts.digest import sha256_hex
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.strictjson import dumps_bytes, loads
from qinglong_edge.errors import JournalError
from qinglong_edge.worker.journal.ownerlock import RECORD_NAME as OWNER_RECORD_NAME
from qinglong_edge.worker.journal.ownerlock import OwnerRecord, parse_owner_record, process_start_ticks

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

__all__ = [
    "DISCARD_SIGNAL",
    "RESIDENT_NAME",
    "advertise",
    "peek_owner",
    "pending_requests",
    "read_result",
    "remove_request",
    "resident_owner",
    "retract",
    "signal_owner",
    "write_request",
    "write_result",
]

#: What the command sends the owner after writing its request.
DISCARD_SIGNAL = signal.SIGUSR1
#: Written by a resident pull while it serves requests (its owner record), removed at exit.
RESIDENT_NAME = "resident.json"
_PREFIX = "discard."


def advertise(runtime: RuntimeDirectory, record: OwnerRecord) -> None:
    """A resident pull says it serves discard requests (only such an owner is signalled)."""
    with contextlib.suppress(JournalError):
        runtime.write(RESIDENT_NAME, record.to_bytes())


def retract(runtime: RuntimeDirectory) -> None:
    with contextlib.suppress(JournalError):
        runtime.remove(RESIDENT_NAME)


def peek_owner(runtime_directory: str, journal_root: str) -> OwnerRecord | None:
    """The owner record a journal's holder keeps in its runtime directory (or, without one,
    in the lock file), read without creating or writing anything and whoever owns the
    files: how root (a package's ``prerm``) finds the pull of the agent's own user.
    None when there is none or it does not parse."""
    from qinglong_edge.worker.journal.ownerlock import read_owner_record
    from qinglong_edge.worker.journal.runtime import FALLBACK_NAME, journal_key

    for directory in (os.path.join(os.path.normpath(runtime_directory), journal_key(journal_root)),
                      os.path.join(os.path.normpath(journal_root), FALLBACK_NAME)):
        try:
            fd = os.open(os.path.join(directory, OWNER_RECORD_NAME), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            return parse_owner_record(os.read(fd, 16_384))
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        finally:
            os.close(fd)
    return read_owner_record(journal_root, None)


def resident_owner(runtime: RuntimeDirectory, holder: OwnerRecord | None) -> OwnerRecord | None:
    """The resident pull serving requests, when it is the live holder of the lock."""
    try:
        data = runtime.read(RESIDENT_NAME)
        resident = None if data is None else parse_owner_record(data)
    except (JournalError, ValueError, UnicodeDecodeError):
        return None
    if resident is None or holder is None or resident.pid != holder.pid or not resident.is_alive():
        return None
    return resident


def _key(offer_id: str) -> str:
    return _PREFIX + sha256_hex(offer_id.encode("utf-8"))[:16]


def write_request(runtime: RuntimeDirectory, offer_id: str, now_ms: int) -> str:
    """Write the request for ``offer_id``; returns its request id."""
    request_id = os.urandom(8).hex()
    runtime.remove(_key(offer_id) + ".result")
    runtime.write(_key(offer_id) + ".request", dumps_bytes({"schemaVersion": 1, "offerId": offer_id,
                                                            "requestId": request_id, "requestedAtMs": now_ms}) + b"\n")
    return request_id


def _read(runtime: RuntimeDirectory, name: str) -> dict[str, Any] | None:
    try:
        data = runtime.read(name)
        value = None if data is None else loads(data, max_bytes=4096, min_bytes=2)
    except (JournalError, ContractError):
        return None
    return value if isinstance(value, dict) and isinstance(value.get("offerId"), str) else None


def pending_requests(runtime: RuntimeDirectory) -> list[tuple[str, str]]:
    """``[(offerId, requestId), ...]`` of the requests waiting (the owner's side)."""
    found = []
    with contextlib.suppress(JournalError):
        for name in runtime.names():
            if name.startswith(_PREFIX) and name.endswith(".request"):
                value = _read(runtime, name)
                if value is not None and name == _key(value["offerId"]) + ".request":
                    found.append((str(value["offerId"]), str(value.get("requestId", ""))))
                else:
                    runtime.remove(name)  # damaged (issue 23): dropped, never asked for again
    return found


def remove_request(runtime: RuntimeDirectory, offer_id: str) -> None:
    with contextlib.suppress(JournalError):
        runtime.remove(_key(offer_id) + ".request")


def write_result(runtime: RuntimeDirectory, offer_id: str, request_id: str, result: dict[str, Any]) -> None:
    """The owner's answer (then the request is removed)."""
    with contextlib.suppress(JournalError):
        runtime.write(_key(offer_id) + ".result", dumps_bytes({"schemaVersion": 1, "offerId": offer_id,
                                                               "requestId": request_id, **result}) + b"\n")
    remove_request(runtime, offer_id)


def read_result(runtime: RuntimeDirectory, offer_id: str, request_id: str) -> dict[str, Any] | None:
    """The owner's answer to this request, or None (not yet).

    Requests share one name per offer, so a second command's request replaces the first
    one's (and removes an answer the first one had not read yet): once the file holds
    another command's request (or none), the answer for the offer is this request's too
    (``discarded``, or ``not_found`` when the other request was served after this one's);
    otherwise the first command would wait out its budget for an answer that never
    comes. A stale answer cannot be taken: :func:`write_request` removes it first."""
    value = _read(runtime, _key(offer_id) + ".result")
    if value is None or value.get("offerId") != offer_id:
        return None
    if value.get("requestId") == request_id:
        return value
    pending = _read(runtime, _key(offer_id) + ".request")
    replaced = pending is None or pending.get("requestId") != request_id
    return value if replaced else None


def signal_owner(owner: OwnerRecord, signum: int = DISCARD_SIGNAL) -> bool:
    """``signum`` (default ``SIGUSR1``) to the journal's owner, through a pidfd checked
    against its start time (False when it is gone or not the recorded process any more)."""
    if not owner.is_alive():
        return False
    try:
        fd = os.pidfd_open(owner.pid)
    except (AttributeError, OSError):
        fd = -1
    try:
        if process_start_ticks(owner.pid) != owner.process_start_ticks:
            return False  # recycled between the check and the open
        if fd >= 0:
            signal.pidfd_send_signal(fd, signum)
        else:
            os.kill(owner.pid, signum)
    except OSError:
        return False
    finally:
        if fd >= 0:
            os.close(fd)
    return True
