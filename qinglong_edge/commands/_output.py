"""Printing helpers shared by the commands: one human line, or one JSON line."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping

__all__ = ["emit", "print_json"]


def print_json(payload: Mapping[str, object]) -> None:
    """Print ``payload`` as one compact JSON line on stdout."""
    sys.stdout.write(json.dumps(payload, separators=(",", ":"), ensure_ascii=False) + "\n")
    sys.stdout.flush()


def emit(json_mode: bool, text: str, payload: Mapping[str, object]) -> None:
    """Print ``text`` for people, or ``payload`` as JSON with ``--json``."""
    if json_mode:
        print_json(payload)
    else:
        sys.stdout.write(text + ("\n" if not text.endswith("\n") else ""))
        sys.stdout.flush()
