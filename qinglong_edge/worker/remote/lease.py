"""The per-job lease file in the runtime directory (RAM): the current lease of a record in
flight, its local expiry on the boot clock, and when the job wrapper must stop the job.

Issue 23 items 4 and 7 (spec README "Decisions for clocks" and "Decisions for storage on
flash"): a renewal is not a state change, so it goes here, not into the journal (no
fsync, no flash wear); and a frozen or killed agent never leaves a job running past its
lease, because the job wrapper reads this file and stops the job itself (TERM, grace,
KILL) at ``stopAtBootMs`` unless the agent moved it later meanwhile. ``job.<16 hex of
sha256(offerId)>.json``, compact JSON, one flat object of strings (no escapes), integers
and nulls, padded with spaces to :data:`FILE_BYTES`; created with a temp file and a
rename, then updated in place (one ``pwrite`` of the same size: no new block, so a full
tmpfs does not keep a renewal from the wrapper; a reader may see a torn copy, which counts
as damaged, below)::

    {"schemaVersion":1,"offerId":..,"attemptId":..,"leaseGeneration":N,"leaseVersion":N,
     "renewedAtMs":N,"expiresAtMs":N,              the lease as the cluster last granted it
     "bootId":"<boot id>",                          the boot every *BootMs below belongs to
     "sentBootMs":N|null,                           the grant's send instant
     "durationMs":N,                                expiresAtMs - renewedAtMs of the grant
     "expiresBootMs":N,                             the local lease expiry (boot clock)
     "stopAtBootMs":N,"terminateGraceMs":N,"killGraceMs":N,   the lease stop (wrapper)
     "startingBootMs":N|null,"startedBootMs":N|null}          the timeout's base, the launch

Who writes what: the agent writes it when it starts tracking a record, before it starts a
job's wrapper (the wrapper refuses to start the command without a good copy: the command
never runs unprotected), after every renewal, and removes it (with the marker below) once
the record needs nothing more. The wrapper only reads it and, when it starts a lease stop,
creates ``job.<16 hex>.stopped`` (``O_EXCL``, 0600): the agent then ends the record
``recovery_required(lease_lost_local_execution_stopped)``, never a completion.

What a damaged copy (empty, truncated, garbage, another boot's, another record's) means:
to the agent, absent: the lease is then judged from the journal's record and the cluster's
clock, and renewed at once; to the wrapper, the copy it read last stays in force (it stops
the job at that copy's ``stopAtBootMs``; at its start, a bad copy keeps the command from
ever starting: exit 125, a start failure). A reboot loses the file and every job with it.
"""

from __future__ import annotations

from qinglong_edge.contracts._shape import Frozen
from qinglong_edge.contracts.digest import sha256_hex
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import exact_keys, safe_int
from qinglong_edge.contracts.strictjson import dumps_bytes, loads
from qinglong_edge.errors import JournalError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.contracts.records import InboxRecord
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

__all__ = ["JobLease", "lease_name", "read_job_lease", "remove_job_lease", "stopped_by_wrapper", "stopped_name",
           "write_job_lease"]

_KEYS = ("schemaVersion", "offerId", "attemptId", "leaseGeneration", "leaseVersion", "renewedAtMs", "expiresAtMs",
         "bootId", "sentBootMs", "durationMs", "expiresBootMs", "stopAtBootMs", "terminateGraceMs", "killGraceMs",
         "startingBootMs", "startedBootMs")
_OPTIONAL_INTS = ("sentBootMs", "startingBootMs", "startedBootMs")
#: Every lease file is this long (JSON padded with spaces, then a newline).
FILE_BYTES = 1024
_TEXT = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")


def _key(offer_id: str) -> str:
    return sha256_hex(offer_id.encode("utf-8"))[:16]


def lease_name(offer_id: str) -> str:
    """``job.<16 hex>.json``: the record's lease file."""
    return f"job.{_key(offer_id)}.json"


def stopped_name(offer_id: str) -> str:
    """``job.<16 hex>.stopped``: the wrapper's mark that it stopped the job for its lease."""
    return f"job.{_key(offer_id)}.stopped"


class JobLease(Frozen):
    """One lease file's content (module docstring); times in ms."""

    __slots__ = ("offer_id", "attempt_id", "lease_generation", "lease_version", "renewed_at_ms",  # noqa: RUF023
                 "expires_at_ms", "boot_id", "sent_boot_ms", "duration_ms", "expires_boot_ms", "stop_at_boot_ms",
                 "terminate_grace_ms", "kill_grace_ms", "starting_boot_ms", "started_boot_ms")

    offer_id: str
    attempt_id: str
    lease_generation: int
    lease_version: int
    renewed_at_ms: int
    expires_at_ms: int
    boot_id: str
    sent_boot_ms: int | None
    duration_ms: int
    expires_boot_ms: int
    stop_at_boot_ms: int
    terminate_grace_ms: int
    kill_grace_ms: int
    starting_boot_ms: int | None
    started_boot_ms: int | None

    def __init__(self, **values: Any) -> None:
        for name in self.__slots__:
            object.__setattr__(self, name, values[name])

    def to_bytes(self) -> bytes:
        for text in (self.offer_id, self.attempt_id, self.boot_id):
            if not text or not set(text) <= _TEXT:  # the wrapper's reader takes no escapes
                raise ContractError("pattern", "$", "a lease file holds plain ids only")
        body = dumps_bytes({
            "schemaVersion": 1, "offerId": self.offer_id, "attemptId": self.attempt_id,
            "leaseGeneration": self.lease_generation, "leaseVersion": self.lease_version,
            "renewedAtMs": self.renewed_at_ms, "expiresAtMs": self.expires_at_ms, "bootId": self.boot_id,
            "sentBootMs": self.sent_boot_ms, "durationMs": self.duration_ms, "expiresBootMs": self.expires_boot_ms,
            "stopAtBootMs": self.stop_at_boot_ms, "terminateGraceMs": self.terminate_grace_ms,
            "killGraceMs": self.kill_grace_ms, "startingBootMs": self.starting_boot_ms,
            "startedBootMs": self.started_boot_ms})
        if len(body) >= FILE_BYTES:
            raise ContractError("length", "$", f"a lease file holds at most {FILE_BYTES - 1} bytes")
        return body + b" " * (FILE_BYTES - 1 - len(body)) + b"\n"  # a fixed size: updated in place


def parse_job_lease(data: bytes) -> JobLease:
    """Parse a lease file. Raises ContractError (strict JSON, ``key_set``, field codes)."""
    value = loads(data, max_bytes=2048, min_bytes=2)
    if not isinstance(value, dict):
        raise ContractError("not_object", "$", "a lease file is an object")
    exact_keys(value, _KEYS, "$")
    if value["schemaVersion"] != 1:
        raise ContractError("schema", "$.schemaVersion", "must be 1")
    texts = {}
    for key in ("offerId", "attemptId", "bootId"):
        text = value[key]
        if not isinstance(text, str) or not text or not set(text) <= _TEXT:
            raise ContractError("pattern", f"$.{key}", "plain text expected")
        texts[key] = text
    numbers = {key: safe_int(value[key], f"$.{key}") for key in _KEYS
               if key not in ("schemaVersion", "offerId", "attemptId", "bootId", *_OPTIONAL_INTS)}
    optional = {key: None if value[key] is None else safe_int(value[key], f"$.{key}") for key in _OPTIONAL_INTS}
    return JobLease(offer_id=texts["offerId"], attempt_id=texts["attemptId"], boot_id=texts["bootId"],
                    lease_generation=numbers["leaseGeneration"], lease_version=numbers["leaseVersion"],
                    renewed_at_ms=numbers["renewedAtMs"], expires_at_ms=numbers["expiresAtMs"],
                    sent_boot_ms=optional["sentBootMs"], duration_ms=numbers["durationMs"],
                    expires_boot_ms=numbers["expiresBootMs"], stop_at_boot_ms=numbers["stopAtBootMs"],
                    terminate_grace_ms=numbers["terminateGraceMs"], kill_grace_ms=numbers["killGraceMs"],
                    starting_boot_ms=optional["startingBootMs"], started_boot_ms=optional["startedBootMs"])


def read_job_lease(store: RuntimeDirectory, record: InboxRecord, boot_id: str) -> JobLease | None:
    """The lease file of ``record``, or None when absent or damaged (module docstring):
    unreadable, another boot's, another offer's, attempt's or lease generation's."""
    offer = record["offer"]
    try:
        data = store.read(lease_name(offer["offerId"]))
        if data is None:
            return None
        lease = parse_job_lease(data)
    except (ContractError, JournalError):
        return None
    if (lease.boot_id, lease.offer_id, lease.attempt_id, lease.lease_generation) != (
            boot_id, offer["offerId"], offer["candidate"]["attemptId"], offer["lease"]["leaseGeneration"]):
        return None
    return lease


def write_job_lease(store: RuntimeDirectory, lease: JobLease) -> None:
    """Write the lease file: in place when it exists (always :data:`FILE_BYTES` long, so an
    update needs no new block: a full RAM file system does not stop the renewals from
    reaching the wrapper), else a new file (temp + rename). No fsync (RAM).

    Raises:
        JournalError: the file could not be written either way (ENOSPC for a new one...).
    """
    name, data = lease_name(lease.offer_id), lease.to_bytes()
    try:
        store.overwrite(name, data)
    except JournalError:
        store.write(name, data)


def stopped_by_wrapper(store: RuntimeDirectory, offer_id: str) -> bool:
    """Whether the job wrapper stopped this record's job for its lease (its mark exists)."""
    try:
        return store.read(stopped_name(offer_id)) is not None
    except JournalError:
        return True  # a mark we cannot read is still a mark (a foreign or odd file there)


def remove_job_lease(store: RuntimeDirectory, offer_id: str) -> None:
    """Remove the lease file and the wrapper's mark (absent ones are fine; errors ignored:
    a file left here is RAM, pruned with its record)."""
    for name in (lease_name(offer_id), stopped_name(offer_id)):
        try:
            store.remove(name)
        except JournalError:
            pass
