"""Layer 3: the Local SQLite store and the Local /api/v3 server (ADR-0372)."""

from __future__ import annotations
