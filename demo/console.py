"""How the demo talks to the person watching: sections, the commands it runs, what came back.

Plain ASCII, 88 columns for prose. Colour only when stdout is a terminal and
``NO_COLOR`` is unset (https://no-color.org); the text is the same either way, so a
test can read it.
"""

from __future__ import annotations

import os
import sys
import textwrap
from typing import TextIO

WIDTH = 88


class Console:
    """Writes the demo's narrative to ``stream`` (stdout by default)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.color = self.stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"

    def _paint(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def _write(self, text: str = "") -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def banner(self, title: str, lines: list[str]) -> None:
        rule = "=" * WIDTH
        self._write(self._paint(rule, "1"))
        self._write(self._paint(title, "1"))
        for line in lines:
            self._write(line)
        self._write(self._paint(rule, "1"))

    def section(self, number: int, title: str, why: str) -> None:
        """A numbered section: its title, then why it matters (wrapped prose)."""
        self._write()
        heading = f"-- {number}. {title} "
        self._write(self._paint(heading + "-" * max(4, WIDTH - len(heading)), "1;36"))
        self.prose(why)

    def prose(self, text: str) -> None:
        for paragraph in text.strip().split("\n\n"):
            self._write(textwrap.fill(" ".join(paragraph.split()), WIDTH))

    def command(self, text: str) -> None:
        """The exact command line about to run."""
        self._write(self._paint(f"$ {text}", "1;33"))

    def output(self, text: str, limit: int = 14) -> None:
        """What a command printed, indented; at most ``limit`` lines (the rest counted)."""
        lines = text.rstrip("\n").splitlines()
        shown = lines if len(lines) <= limit else lines[: limit - 1]
        for line in shown:
            self._write("    " + line)
        if len(shown) < len(lines):
            self._write(f"    ... ({len(lines) - len(shown)} more lines)")

    def result(self, text: str) -> None:
        """The demo's one-line reading of what came back."""
        self._write(self._paint(f"  -> {text}", "32"))

    def info(self, text: str) -> None:
        self._write(self._paint(f"  {text}", "2"))

    def failure(self, text: str) -> None:
        self._write(self._paint(f"!! {text}", "1;31"))
