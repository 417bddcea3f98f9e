"""The cluster's clock as this device knows it: the kept offset sample in the runtime
directory (RAM), and the translations every local timer and wire timestamp needs.

Spec README "Decisions for clocks"; the rules are pure in
:mod:`qinglong_edge.contracts.clocks`. The sample lives in ``clock.json`` of the journal's
runtime directory, so every cron ``pull`` of this boot starts from the best sample the last
one had::

    {"schemaVersion":1,"bootId":<boot id>,"offsetMs":<cluster - boot>,"errorMs":<int>,
     "atBootMs":<boot ms>,"source":"register"|"heartbeat"|"lease_control"}

Written only when the kept sample changes (a better one, or the cluster's clock moved),
never fsynced (RAM; a damaged or foreign-boot copy is ignored: the next answer with a
fresh cluster time makes a new one). A skew (cluster minus wall) over
:data:`~qinglong_edge.contracts.clocks.SKEW_NOTICE_MS` is reported once per boot
(:meth:`ClusterClock.skew_notice`); nothing is refused for it.

Without any sample (no session answer yet in this boot) the cluster's clock is taken to be
the wall clock with an unknown error: :meth:`ClusterClock.known` is False, and the lease
rules then use the send instant alone.
"""

from __future__ import annotations

from collections.abc import Callable

import qinglong_edge.clock as _clock
from qinglong_edge.contracts.clocks import SKEW_NOTICE_MS, ClockSample, better_sample, sample_from
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.fields import exact_keys, safe_int
from qinglong_edge.contracts.strictjson import dumps_bytes, loads
from qinglong_edge.errors import JournalError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see contracts/_shape.py)
if TYPE_CHECKING:
    from qinglong_edge.worker.journal.runtime import RuntimeDirectory

__all__ = ["CLOCK_NAME", "SOURCES", "ClusterClock", "estimated_cluster_now", "read_sample", "skew_message",
           "stored_sample"]

#: The sample's name in the runtime directory.
CLOCK_NAME = "clock.json"
#: Where a sample may come from (spec README: answers with a fresh cluster time only).
SOURCES = ("register", "heartbeat", "lease_control")
_KEYS = ("schemaVersion", "bootId", "offsetMs", "errorMs", "atBootMs", "source")


def read_sample(data: bytes | None, boot_id: str | None) -> tuple[ClockSample, str] | None:
    """``(sample, source)`` of a ``clock.json``, or None when absent, damaged or of another
    boot (a boot offset is void after a reboot)."""
    if data is None or boot_id is None:
        return None
    try:
        value = loads(data, max_bytes=1024, min_bytes=2)
        if not isinstance(value, dict):
            return None
        exact_keys(value, _KEYS, "$")
        if value["schemaVersion"] != 1 or value["bootId"] != boot_id or value["source"] not in SOURCES:
            return None
        offset = value["offsetMs"]
        if type(offset) is not int:
            return None
        sample = ClockSample(offset, safe_int(value["errorMs"], "$.errorMs"), safe_int(value["atBootMs"], "$.atBootMs"))
    except ContractError:
        return None
    return sample, str(value["source"])


class ClusterClock:
    """The kept sample of one journal's runtime directory (module docstring).

    Args:
        store: the runtime directory (None: kept in memory only).
        boot_ms / wall_ms: the two clocks (:mod:`qinglong_edge.clock`; tests pass their own).
        boot_id: this boot's id (default :func:`qinglong_edge.clock.boot_id`).
    """

    def __init__(self, store: RuntimeDirectory | None, *, boot_ms: Callable[[], int] = _clock.boot_ms,
                 wall_ms: Callable[[], int] = _clock.wall_ms, boot_id: str | None = None) -> None:
        self._store = store
        self.boot_ms = boot_ms
        self.wall_ms = wall_ms
        self.boot_id = boot_id if boot_id is not None else (_clock.boot_id() or "unknown")
        self._sample: ClockSample | None = None
        self._loaded = False

    @property
    def sample(self) -> ClockSample | None:
        """The kept sample (read from the runtime directory once), or None."""
        if not self._loaded:
            self._loaded = True
            data = None
            if self._store is not None:
                try:
                    data = self._store.read(CLOCK_NAME)
                except JournalError:
                    data = None  # unreadable: as absent (the next fresh answer makes one)
            found = read_sample(data, self.boot_id)
            if found is not None and (self._sample is None or found[0] != self._sample):
                self._sample = better_sample(found[0], self._sample) if self._sample else found[0]
        return self._sample

    def known(self) -> bool:
        return self.sample is not None

    def observe(self, cluster_ms: int, sent_boot_ms: int, received_boot_ms: int, source: str) -> None:
        """An answer that carried the fresh cluster time ``cluster_ms`` (module docstring);
        the sample is stored when it is the one kept now. A storage failure keeps it in
        memory (RAM full: the next write tries again)."""
        try:
            new = sample_from(cluster_ms, sent_boot_ms, received_boot_ms)
        except ContractError:
            return  # a time no sample can come from (the contracts bound it already)
        kept = self.sample
        chosen = better_sample(kept, new)
        if chosen == kept:
            return
        self._sample = chosen
        if self._store is not None:
            try:
                self._store.write(CLOCK_NAME, dumps_bytes({
                    "schemaVersion": 1, "bootId": self.boot_id, "offsetMs": chosen.offset_ms,
                    "errorMs": chosen.error_ms, "atBootMs": chosen.at_boot_ms, "source": source}) + b"\n")
            except JournalError:
                pass

    # -- translations ---------------------------------------------------------------------------

    def error_ms(self, now_boot_ms: int | None = None) -> int | None:
        """The kept sample's effective error now, or None without a sample."""
        sample = self.sample
        if sample is None:
            return None
        return sample.effective_error_ms(self.boot_ms() if now_boot_ms is None else now_boot_ms)

    def cluster_now(self) -> int:
        """The cluster's time now (the wall clock without a sample)."""
        sample = self.sample
        return self.wall_ms() if sample is None else sample.to_cluster(self.boot_ms())

    def boot_to_cluster(self, boot_ms: int) -> int:
        """The cluster time of a boot instant of this boot."""
        sample = self.sample
        if sample is None:
            return boot_ms + self.wall_ms() - self.boot_ms()
        return sample.to_cluster(boot_ms)

    def wall_to_cluster(self, wall_ms: int) -> int:
        """The cluster time of a wall-clock reading, mapped through the wall clock as it is
        now (a step of the wall clock between that reading and now shifts it by the step;
        the wire clamps of :func:`~qinglong_edge.contracts.clocks.result_times` bound it)."""
        return self.boot_to_cluster(wall_ms - self.wall_ms() + self.boot_ms())

    def cluster_to_boot(self, cluster_ms: int) -> int | None:
        """The boot instant of a cluster time, or None without a sample."""
        sample = self.sample
        return None if sample is None else sample.to_boot(cluster_ms)

    def skew_ms(self) -> int | None:
        """Cluster minus wall clock now (positive: the device is behind), or None."""
        sample = self.sample
        return None if sample is None else sample.skew_ms(self.boot_ms(), self.wall_ms())

    def skew_notice(self) -> str | None:
        """The one line about a skew over 60 s, the first time in this boot; else None."""
        skew = self.skew_ms()
        if skew is None or abs(skew) <= SKEW_NOTICE_MS:
            return None
        if self._store is not None and not self._store.once_per_boot("clock-skew"):
            return None
        return skew_message(skew)


def stored_sample(runtime_base: str, journal_root: str) -> tuple[ClockSample, str] | None:
    """The sample a ``pull`` of this boot kept for ``journal_root`` (its runtime directory
    under ``runtime_base``, else the fallback ``<journal root>/run``), read without creating
    or locking anything (``doctor``, ``inbox``); None without one."""
    import os

    from qinglong_edge.worker.journal.runtime import FALLBACK_NAME, journal_key

    boot = _clock.boot_id()
    for directory in (os.path.join(runtime_base, journal_key(journal_root)), os.path.join(journal_root, FALLBACK_NAME)):
        try:
            with open(os.path.join(directory, CLOCK_NAME), "rb") as handle:
                data = handle.read(1024)
        except OSError:
            continue
        found = read_sample(data, boot)
        if found is not None:
            return found
    return None


def estimated_cluster_now(runtime_base: str, journal_root: str) -> int:
    """The cluster's time now by the stored sample, else the wall clock (see :func:`stored_sample`)."""
    found = stored_sample(runtime_base, journal_root)
    return _clock.wall_ms() if found is None else found[0].to_cluster(_clock.boot_ms())


def skew_message(skew_ms: int) -> str:
    """``the device's wall clock is N s behind|ahead of the cluster's ...`` (pull, doctor)."""
    way = "behind" if skew_ms > 0 else "ahead of"
    return (f"this device's wall clock is {abs(skew_ms) / 1000:.0f} s {way} the cluster's: work goes on (lease timers "
            "run on the boot clock, the times sent are translated into the cluster's clock); set the clock (NTP) "
            "for readable times")
