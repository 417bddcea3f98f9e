"""Local profile (ADR-0372): SQLite store, identity, policy, audit, HTTP API."""

from __future__ import annotations
