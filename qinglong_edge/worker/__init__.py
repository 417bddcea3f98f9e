"""Remote Worker role (ADR-0110): journal, owner lock, transport, session and pull."""

from __future__ import annotations
