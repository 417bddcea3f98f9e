"""One identity, one device (issue 23 item 6): notice another device using our worker id.

A cloned SD card (or copied state, or one credential on two devices) makes two devices
register the same workerId: the cluster keeps one session row per worker, so each
registration replaces the other's session, every lease of the replaced session is fenced,
and the two take the session from each other every few heartbeats.

How a replacement by *another* device is told from our own re-registrations: the cluster
assigns ``generation`` (previous + 1 at every registration, offer-delivery.md 5.1). This
module remembers the generation of the last session this device registered (in this boot);
a registration of ours that gets a generation more than one above it proves that someone
else registered in between: our session was replaced by one this device did not register.
Our own re-registrations never count: after a fence, a capability change or a lost answer
the next generation is ours (+1; a lost register answer costs one miscount, which the
threshold absorbs), and after a reboot nothing is remembered (RAM), so nothing is compared.

At :data:`THRESHOLD` (3) such replacements within :data:`WINDOW_MS` (10 minutes, boot
clock), the device goes quiet for :data:`WINDOW_MS`: no session call, no claim (the other
device keeps the session meanwhile, so neither keeps fencing the other). The third is
usually seen as a heartbeat of our live session fenced (:meth:`IdentityGuard.fenced`):
then the window starts before we register again, so the other device's session stays
current and it is not pushed to its own third replacement (were both to go quiet, the
first to come back would work alone). ``pull`` says
"another device uses worker id X" and exits 78 (``identity_conflict``), ``doctor`` reports
it. The window is a file in the runtime directory (RAM), not a latch: it ends by itself,
and a reboot forgets it.

``identity.json`` in the runtime directory (written only when a registration changes it;
an idle cycle reads it at most)::

    {"schemaVersion":1,"bootId":..,"workerId":..,"generation":<last own>,
     "foreignAtMs":[<boot ms>...],"quietUntilMs":<boot ms>|null,"quietSinceWallMs":<wall ms>|null}

A damaged or foreign copy (another boot, another worker id, garbage) counts as absent:
nothing is compared and no window holds (docs/worker/journal.md, "Runtime files").
"""

from __future__ import annotations

from collections.abc import Callable

from qinglong_edge.clock import boot_id, boot_ms, wall_ms
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.strictjson import dumps_bytes, loads
from qinglong_edge.errors import JournalError, SessionError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from typing import Any

    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

__all__ = ["IDENTITY_NAME", "THRESHOLD", "WINDOW_MS", "IdentityGuard", "IdentityState", "conflict_message",
           "parse_identity"]

#: The file in the runtime directory.
IDENTITY_NAME = "identity.json"
#: Replacements by another device that start a quiet window...
THRESHOLD = 3
#: ... when they fall within this much boot-clock time; the window lasts as long.
WINDOW_MS = 600_000
_KEYS = ("schemaVersion", "bootId", "workerId", "generation", "foreignAtMs", "quietUntilMs", "quietSinceWallMs")


class IdentityState:
    """The decoded ``identity.json`` (see the module docstring). Times: boot ms, except
    ``quiet_since_wall_ms`` (for a person)."""

    __slots__ = ("boot_id", "foreign_at_ms", "generation", "quiet_since_wall_ms", "quiet_until_ms", "worker_id")

    def __init__(  # noqa: PLR0917 (the record's fields, in order)
        self, boot_id: str, worker_id: str, generation: int | None, foreign_at_ms: list[int],
        quiet_until_ms: int | None, quiet_since_wall_ms: int | None,
    ) -> None:
        self.boot_id = boot_id
        self.worker_id = worker_id
        self.generation = generation
        self.foreign_at_ms = foreign_at_ms
        self.quiet_until_ms = quiet_until_ms
        self.quiet_since_wall_ms = quiet_since_wall_ms

    def to_bytes(self) -> bytes:
        return dumps_bytes({"schemaVersion": 1, "bootId": self.boot_id, "workerId": self.worker_id,
                            "generation": self.generation, "foreignAtMs": self.foreign_at_ms,
                            "quietUntilMs": self.quiet_until_ms,
                            "quietSinceWallMs": self.quiet_since_wall_ms}) + b"\n"


def parse_identity(data: bytes) -> IdentityState:
    """Decode ``identity.json``. Raises ContractError for anything but the exact shape."""
    value = loads(data, max_bytes=4096, min_bytes=2)
    if not isinstance(value, dict) or sorted(value) != sorted(_KEYS) or value["schemaVersion"] != 1:
        raise ContractError("schema", "$", "not an identity record")
    foreign = value["foreignAtMs"]

    def whole(item: object, *, optional: bool = False) -> bool:
        return (optional and item is None) or (isinstance(item, int) and not isinstance(item, bool) and item >= 0)

    if (not isinstance(value["bootId"], str) or not isinstance(value["workerId"], str)
            or not whole(value["generation"], optional=True) or not isinstance(foreign, list)
            or len(foreign) > 64 or not all(whole(item) for item in foreign)
            or not whole(value["quietUntilMs"], optional=True) or not whole(value["quietSinceWallMs"], optional=True)):
        raise ContractError("schema", "$", "not an identity record")
    return IdentityState(value["bootId"], value["workerId"], value["generation"], list(foreign),
                         value["quietUntilMs"], value["quietSinceWallMs"])


def conflict_message(worker_id: str, minutes_left: int) -> str:
    """The one line ``pull`` and ``doctor`` say (issue 23: "another device uses worker id X")."""
    return (f"another device uses worker id {worker_id}: sessions this device did not register replaced its "
            f"session {THRESHOLD} times within {WINDOW_MS // 60_000} minutes (a cloned SD card or copied state: "
            f"one credential on two devices); no claim for {minutes_left} more minutes")


class IdentityGuard:
    """Counts replacements of our session by another device; holds the quiet window.

    Args:
        store: the runtime directory.
        worker_id: the configured workerId.
        boot_clock: boot-clock ms (:func:`qinglong_edge.boot_ms`; a test passes its own).
        wall_clock: wall ms, only for display.
        boot: this boot's id (default :func:`qinglong_edge.boot_id`).
    """

    def __init__(self, store: RuntimeDirectory, worker_id: str, *, boot_clock: Callable[[], int] = boot_ms,
                 wall_clock: Callable[[], int] = wall_ms, boot: str | None = None) -> None:
        self._store = store
        self._worker_id = worker_id
        self._boot_clock = boot_clock
        self._wall_clock = wall_clock
        self._boot = boot if boot is not None else (boot_id() or "unknown")

    def load(self) -> IdentityState | None:
        """This boot's and worker's state, or None (absent, damaged, another boot or worker)."""
        try:
            data = self._store.read(IDENTITY_NAME)
            state = None if data is None else parse_identity(data)
        except (JournalError, ContractError, OSError):
            return None
        if state is None or state.boot_id != self._boot or state.worker_id != self._worker_id:
            return None
        return state

    def quiet_ms(self) -> int:
        """How long the quiet window still runs (ms; 0 when none)."""
        state = self.load()
        if state is None or state.quiet_until_ms is None:
            return 0
        return max(0, state.quiet_until_ms - self._boot_clock())

    def check(self) -> None:
        """Raise ``identity_conflict`` while the quiet window runs (no session call, no claim).

        Raises:
            SessionError: ``identity_conflict`` (the CLI exits 78).
        """
        left = self.quiet_ms()
        if left > 0:
            error = SessionError(conflict_message(self._worker_id, -(-left // 60_000)), code="identity_conflict")
            error.remedy = ("give each device its own worker id and credential (the cluster issues them); a cloned "
                            "device must not keep the original's worker section")
            raise error

    def fenced(self) -> bool:
        """Our live session was fenced (its heartbeat refused twice, the ``expectedVersion
        + 1`` retry included): replaced by a session this device did not register. With
        :data:`THRESHOLD` - 1 replacements already proved within the window, this is the
        last one: the quiet window starts *before* we register again (True), so the other
        device keeps its session instead of both taking it from each other until both go
        quiet. Otherwise False: the caller registers, and :meth:`registered` proves it."""
        now = self._boot_clock()
        state = self.load()
        if state is None or len([t for t in state.foreign_at_ms if now - t < WINDOW_MS]) < THRESHOLD - 1:
            return False
        state.foreign_at_ms = []
        state.quiet_until_ms = now + WINDOW_MS
        state.quiet_since_wall_ms = self._wall_clock()
        try:
            self._store.write(IDENTITY_NAME, state.to_bytes())
        except JournalError:
            return False  # a window we cannot keep is not started: register as before
        return True

    def registered(self, generation: int) -> bool:
        """Record a registration of ours answered with ``generation``. Returns whether it
        proved a replacement by another device (a gap above our last generation)."""
        now = self._boot_clock()
        state = self.load()
        foreign = False
        if state is None:
            state = IdentityState(self._boot, self._worker_id, None, [], None, None)
        elif state.generation is not None and generation > state.generation + 1:
            foreign = True
            recent = [t for t in state.foreign_at_ms if now - t < WINDOW_MS]
            state.foreign_at_ms = [*recent[-(THRESHOLD - 1):], now]
            if len(state.foreign_at_ms) >= THRESHOLD:
                state.quiet_until_ms = now + WINDOW_MS
                state.quiet_since_wall_ms = self._wall_clock()
                state.foreign_at_ms = []
        if state.generation == generation and not foreign:
            return False  # a register replay (the same session): nothing changed
        state.generation = generation
        try:
            self._store.write(IDENTITY_NAME, state.to_bytes())
        except JournalError:
            pass  # not remembered: the next replacement is not compared (never a false alarm)
        return foreign

    def describe(self) -> dict[str, Any]:
        """For ``doctor``: ``{"quietMs", "foreignReplacements"}`` of this boot (0, 0 without state)."""
        state = self.load()
        now = self._boot_clock()
        if state is None:
            return {"quietMs": 0, "foreignReplacements": 0}
        recent = [t for t in state.foreign_at_ms if now - t < WINDOW_MS]
        left = 0 if state.quiet_until_ms is None else max(0, state.quiet_until_ms - now)
        return {"quietMs": left, "foreignReplacements": len(recent)}
