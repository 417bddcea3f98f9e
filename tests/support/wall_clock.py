"""Step a child agent's wall clock from a test, without sleeping (issue 23).

:class:`WallClock` owns the offset file of the test-only shim in
``tests/support/wallclock/sitecustomize.py``; :meth:`WallClock.env` is the environment that
loads the shim into a child ``python`` (the checkout stays first on ``PYTHONPATH`` after it).
:meth:`WallClock.step` moves the child's wall clock by a number of ms *now*, while it runs
(an NTP step); :meth:`WallClock.set` sets the whole offset. The boot clock is never shifted.
"""

from __future__ import annotations

import os
import pathlib

from tests.support.cli import repo_entry

__all__ = ["SHIM_DIRECTORY", "WallClock"]

SHIM_DIRECTORY = pathlib.Path(__file__).resolve().parent / "wallclock"


class WallClock:
    """One shimmed wall clock (an offset file under ``root``), offset 0 at first."""

    def __init__(self, root: pathlib.Path, offset_ms: int = 0) -> None:
        self.path = root / "wall-offset"
        self.offset_ms = 0
        self.set(offset_ms)

    def set(self, offset_ms: int) -> None:
        """The child's wall clock reads real time + ``offset_ms`` from now on."""
        temp = self.path.with_name(self.path.name + ".tmp")
        temp.write_text(f"{int(offset_ms)}\n", encoding="ascii")
        os.replace(temp, self.path)  # a new inode: the shim re-reads it at its next clock call
        self.offset_ms = int(offset_ms)

    def step(self, ms: int) -> None:
        """Step the child's wall clock by ``ms`` (negative: back), as NTP would."""
        self.set(self.offset_ms + ms)

    def env(self) -> dict[str, str]:
        """What a child needs to run with this clock (merge into its environment)."""
        base = repo_entry().env.get("PYTHONPATH", "")
        return {"PYTHONPATH": str(SHIM_DIRECTORY) + os.pathsep + base, "QLE_TEST_WALL_OFFSET_FILE": str(self.path)}
