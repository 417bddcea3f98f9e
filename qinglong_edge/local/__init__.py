"""The Local SQLite store and the Local /api/v3 server (ADR-0372); docs/local.md."""

from __future__ import annotations
